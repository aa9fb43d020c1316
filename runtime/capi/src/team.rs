//! Teams and team collectives (OpenSHMEM 1.5 §9.4 "Team management
//! routines", §9.9 "Collective routines") of the C API, on the library's
//! teams and collectives.
//!
//! A team is a strided set of world PEs (`start + i * stride`, `i` in
//! `0..size`) in one of [`TEAM_SLOTS`] slots of this PE; its handle is the
//! slot + 1 (`SHMEM_TEAM_WORLD` = 1, `SHMEM_TEAM_SHARED` = 2). Handles are
//! local: the same team may have different handles on different PEs.
//!
//! A team is the runtime's ([`rt::Team`]: `SHMEM_TEAM_WORLD` is
//! [`rt::Pe::team_world`], a split is [`rt::Pe::team_split_strided`], its
//! entry and scratch in the runtime's team table), and its collectives are
//! the library's CPU work-group collectives (`team_sync`, `broadcastmem`,
//! `fcollectmem`, `collectmem`, `alltoallmem`, `reduce`;
//! device-lib/src/cpu/team.rs, docs/collectives.md) on the default
//! context's work-group: the puts and signals of the same protocol a GPU
//! block runs, not a get per member. `SHMEM_TEAM_SHARED` is this PE alone
//! (CPU PEs are separate processes whose heaps only the fabric reaches, so
//! `shmem_ptr` reaches no other PE) and has no runtime team, nor have the
//! teams split from it: their collectives are local copies.
//! `shmem_alltoalls` (strided), which the library has no collective for, is
//! the library's sync, a get per element from each member, and a sync.
//!
//! One collective runs at a time per team and PE (the library's rule): each
//! holds the team's lock.

use std::ffi::{c_char, c_int, c_long, c_void};
use std::sync::{Arc, Mutex};

use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::TeamDesc;

use crate::state::{self, State, TEAM_SLOTS, fatal, lock};
use crate::{CpnetTeam, CpnetTeamConfig};

/// A team: a strided set of world PEs.
pub(crate) struct Team {
    /// World PE of team PE 0.
    pub(crate) start: i32,
    /// World-PE distance between consecutive team PEs (>= 1).
    pub(crate) stride: i32,
    /// Team PEs.
    pub(crate) size: i32,
    /// This PE's number in the team, `None` if not a member.
    pub(crate) my_idx: Option<i32>,
    /// Slot index (the handle is slot + 1).
    pub(crate) slot: usize,
    /// The `num_contexts` of the team's configuration.
    pub(crate) num_contexts: c_int,
    /// The runtime's team, `None` for a team of this PE alone (taken by
    /// destroy).
    rt: Mutex<Option<rt::Team>>,
    /// Its table entry, for the collectives (`None`: this PE alone).
    desc: Option<TeamDesc>,
    /// The team's own work-group for its collectives, made with the team;
    /// held through each, so one runs at a time per team and PE (the
    /// library's rule), and collectives on different teams from different
    /// threads never wait for each other's lock (`None` where no queue was
    /// free: the default context's is used then).
    wg: Mutex<Option<rt::WorkGroup>>,
}

impl Team {
    /// The team of `rt`'s PEs (world numbering) in `slot`, with a
    /// work-group of its own made on `pe` (made here, under the caller's
    /// lock of the PE, not at the first collective: a collective never
    /// waits for that lock, which a split holds while it waits for the
    /// other members).
    fn of_runtime(st: &State, pe: &rt::Pe, rt: rt::Team, slot: usize, num_contexts: c_int) -> Team {
        let d = *rt.desc();
        Team {
            start: d.start,
            stride: d.stride,
            size: d.size,
            my_idx: (d.my_idx >= 0).then_some(d.my_idx),
            slot,
            num_contexts,
            rt: Mutex::new(Some(rt)),
            desc: Some(d),
            wg: Mutex::new(pe.ctx_create(st.next_wg.fetch_add(1, std::sync::atomic::Ordering::Relaxed)).ok()),
        }
    }

    /// World PE `me` alone, in `slot`.
    fn alone(me: i32, slot: usize, num_contexts: c_int) -> Team {
        Team {
            start: me,
            stride: 1,
            size: 1,
            my_idx: Some(0),
            slot,
            num_contexts,
            rt: Mutex::new(None),
            desc: None,
            wg: Mutex::new(None),
        }
    }

    fn world(&self, idx: i32) -> i32 {
        self.start + idx * self.stride
    }
}

/// The team behind a handle; fatal for anything but a live team.
pub(crate) fn lookup(st: &State, routine: *const c_char, handle: *mut CpnetTeam) -> Arc<Team> {
    let h = handle as usize;
    if (1..=TEAM_SLOTS).contains(&h)
        && let Some(t) = lock(&st.teams)[h - 1].clone()
    {
        return t;
    }
    fatal(routine, &format!("{handle:p} is not a valid team (SHMEM_TEAM_INVALID, or destroyed)"))
}

fn member(routine: *const c_char, t: &Team) -> i32 {
    match t.my_idx {
        Some(i) => i,
        None => fatal(routine, "this PE is not a member of the team"),
    }
}

/// Run `f` on `t`'s work-group (the default context's where it has none),
/// holding it; fatal on its error.
fn on_team<R>(
    st: &State,
    routine: *const c_char,
    t: &Team,
    f: impl FnOnce(&mut rt::WorkGroup) -> Result<R, cpnet_device::cpu::Error>,
) -> R {
    let mut own = lock(&t.wg);
    let r = match own.as_mut() {
        Some(wg) => f(wg),
        None => {
            let mut inner = lock(&st.default_ctx.inner);
            f(inner.wg(routine))
        }
    };
    match r {
        Ok(v) => v,
        Err(e) => fatal(routine, &e.to_string()),
    }
}

/// Destroy the team work-groups (finalize, before the PE ends); their
/// failures are reported and make finalize fail.
pub(crate) fn close_all(st: &State, routine: *const c_char) {
    let teams: Vec<Arc<Team>> = lock(&st.teams).iter().flatten().cloned().collect();
    for t in teams {
        let taken = lock(&t.wg).take();
        if let Some(wg) = taken
            && let Err(e) = wg.destroy()
        {
            fatal(routine, &e.to_string());
        }
    }
}

/// Register the predefined teams (init, before the state is shared).
pub(crate) fn install_predefined(st: &State) {
    let world = {
        let pe = lock(&st.pe);
        let pe = pe.as_ref().expect("init holds the PE");
        Team::of_runtime(st, pe, pe.team_world(), 0, 0)
    };
    let mut teams = lock(&st.teams);
    teams[0] = Some(Arc::new(world));
    teams[1] = Some(Arc::new(Team::alone(st.me, 1, 0)));
}

/// A free slot of the table (from 2, after the predefined teams), or `None`.
fn free_slot(teams: &[Option<Arc<Team>>]) -> Option<usize> {
    (2..teams.len()).find(|&s| teams[s].is_none())
}

/// The fatal error of a split with no free slot.
fn no_free_handle(routine: *const c_char) -> ! {
    fatal(routine, &format!("no free team handle: this PE holds {TEAM_SLOTS} teams (destroy one first)"))
}

/// This PE's number in `team`, -1 if not a member or `team` is
/// `SHMEM_TEAM_INVALID` (§9.4.1 `shmem_team_my_pe`). Local.
///
/// Errors (fatal): before init; a handle that is no team.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_my_pe(team: *mut CpnetTeam, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    if team.is_null() {
        return -1;
    }
    lookup(st, routine, team).my_idx.unwrap_or(-1)
}

/// Number of PEs in `team`, -1 for `SHMEM_TEAM_INVALID` (§9.4.2
/// `shmem_team_n_pes`). Local.
///
/// Errors (fatal): before init; a handle that is no team.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_n_pes(team: *mut CpnetTeam, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    if team.is_null() {
        return -1;
    }
    lookup(st, routine, team).size
}

/// `team`'s configuration (§9.4.3 `shmem_team_get_config`): stores
/// `num_contexts` in `*config` when `config_mask` has
/// `SHMEM_TEAM_NUM_CONTEXTS` (1); returns 0, or nonzero for
/// `SHMEM_TEAM_INVALID`. Local.
///
/// # Safety
/// `config` is writable when non-null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_get_config(team: *mut CpnetTeam, config_mask: c_long, config: *mut CpnetTeamConfig, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    if team.is_null() {
        return 1;
    }
    let t = lookup(st, routine, team);
    if config.is_null() {
        fatal(routine, "config is a null pointer");
    }
    if config_mask & 1 != 0 {
        // SAFETY: writable (the contract), non-null.
        unsafe { (*config).num_contexts = t.num_contexts };
    }
    0
}

/// The number in `dest_team` of PE `src_pe` of `src_team`, -1 if it is not
/// a member of `dest_team` (or either handle is `SHMEM_TEAM_INVALID`, or
/// `src_pe` is outside `src_team`) (§9.4.4 `shmem_team_translate_pe`). Local.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_translate_pe(src_team: *mut CpnetTeam, src_pe: c_int, dest_team: *mut CpnetTeam, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    if src_team.is_null() || dest_team.is_null() {
        return -1;
    }
    let (s, d) = (lookup(st, routine, src_team), lookup(st, routine, dest_team));
    if src_pe < 0 || src_pe >= s.size {
        return -1;
    }
    let rel = s.world(src_pe) - d.start;
    if rel >= 0 && rel % d.stride == 0 && rel / d.stride < d.size { rel / d.stride } else { -1 }
}

/// Make a team of the `size` PEs `start, start + stride, ...` (numbers in
/// `parent`) (§9.4.5 `shmem_team_split_strided`). **Collective** over
/// `parent` (every member calls it with the same arguments): the runtime's
/// split ([`rt::Pe::team_split_strided`]: the members agree on a free entry
/// of the runtime's team table). Returns 0 and stores the new handle
/// (`SHMEM_TEAM_INVALID`, null, on PEs outside it) in `*new_team`; nonzero,
/// with `SHMEM_TEAM_INVALID`, when the triplet does not fit in `parent` or
/// no table entry is free on every member.
///
/// Errors (fatal): before init; a bad `parent`; this PE not in `parent`; no
/// free handle on this PE (64 teams held); a failed agreement (a member
/// that never calls it: a wait timeout).
///
/// # Safety
/// 1. `new_team` is writable; `config` readable when non-null.
/// 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cpnet_team_split_strided(
    parent: *mut CpnetTeam,
    start: c_int,
    stride: c_int,
    size: c_int,
    config: *const CpnetTeamConfig,
    config_mask: c_long,
    new_team: *mut *mut CpnetTeam,
    routine: *const c_char,
) -> c_int {
    let st = state::get(routine);
    if new_team.is_null() {
        fatal(routine, "new_team is a null pointer");
    }
    // SAFETY: writable (contract 1).
    unsafe { *new_team = std::ptr::null_mut() };
    let p = lookup(st, routine, parent);
    member(routine, &p);
    // The same verdict on every member: the same arguments.
    let fits = size >= 1
        && start >= 0
        && (stride >= 1 || size == 1)
        && i64::from(start) + i64::from(size - 1) * i64::from(stride.max(1)) < i64::from(p.size);
    if !fits {
        return 1;
    }
    // A handle for the team is checked first: refusing after the split
    // would leave the other members with a team this PE does not hold.
    if free_slot(&*lock(&st.teams)).is_none() {
        no_free_handle(routine);
    }
    let num_contexts = if !config.is_null() && config_mask & 1 != 0 {
        // SAFETY: readable when non-null (contract 1).
        unsafe { (*config).num_contexts }
    } else {
        0
    };
    // The parent's scratch carries the agreement: no collective of this PE
    // on the parent meanwhile.
    let _parent_wg = lock(&p.wg);
    let parent_rt = lock(&p.rt);
    let pe = lock(&st.pe);
    let Some(pe) = pe.as_ref() else { fatal(routine, "the PE was finalized") };
    let child = match parent_rt.as_ref() {
        // A team of this PE alone: its only split is itself.
        None => None,
        Some(prt) => match pe.team_split_strided(prt, start, stride.max(1), size) {
            Ok(Some(c)) => Some(c),
            Ok(None) => return 0,
            Err(rt::Error::Team { .. }) => return 1,
            Err(e) => fatal(routine, &e.to_string()),
        },
    };
    // The slot is taken under the table's lock (another thread may be
    // splitting another team meanwhile).
    let mut teams = lock(&st.teams);
    let Some(slot) = free_slot(&*teams) else { no_free_handle(routine) };
    let t = match child {
        Some(c) => Team::of_runtime(st, pe, c, slot, num_contexts),
        None => Team::alone(st.me, slot, num_contexts),
    };
    teams[slot] = Some(Arc::new(t));
    // SAFETY: writable (contract 1).
    unsafe { *new_team = (slot + 1) as *mut CpnetTeam };
    0
}

/// Free `team` (§9.4.7 `shmem_team_destroy`). **Collective** over the
/// team (the runtime's destroy: a sync, then the table entry is free).
/// `SHMEM_TEAM_INVALID` is ignored; the predefined teams are refused.
///
/// Errors (fatal): before init; a handle that is no team; a predefined
/// team; the sync's failure.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_destroy(team: *mut CpnetTeam, routine: *const c_char) {
    let st = state::get(routine);
    if team.is_null() {
        return;
    }
    let t = lookup(st, routine, team);
    if t.slot < 2 {
        fatal(routine, "SHMEM_TEAM_WORLD and SHMEM_TEAM_SHARED cannot be destroyed");
    }
    lock(&st.teams)[t.slot] = None;
    let own = lock(&t.wg).take();
    if let Some(wg) = own
        && let Err(e) = wg.destroy()
    {
        fatal(routine, &e.to_string());
    }
    let taken = lock(&t.rt).take();
    if let Some(r) = taken {
        let pe = lock(&st.pe);
        if let Some(pe) = pe.as_ref()
            && let Err(e) = pe.team_destroy(r)
        {
            fatal(routine, &e.to_string());
        }
    }
}

/// Wait until every member of `team` has called it (§9.9.3 `shmem_team_sync`;
/// `shmem_sync_all`, §9.9.4, on `SHMEM_TEAM_WORLD`). **Collective** over
/// the team. Does not complete outstanding puts (quiet does). Returns 0.
///
/// Errors (fatal): before init; a bad team or this PE not in it; a wait
/// past `CPNET_WAIT_TIMEOUT`.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_sync(team: *mut CpnetTeam, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    let t = lookup(st, routine, team);
    member(routine, &t);
    if let Some(d) = &t.desc {
        on_team(st, routine, &t, |wg| wg.team_sync(d));
    }
    0
}

/// Copy `nbytes` from world PE `pe`'s symmetric `src` into `dst`
/// (symmetric or private) through the default context; a local copy for
/// this PE.
fn fetch(st: &State, routine: *const c_char, dst: *mut u8, src: SymAddr, nbytes: u64, pe: i32) {
    if pe == st.me {
        // SAFETY: src is inside the heap (checked by the caller) and dst
        // writable for nbytes; the spec forbids overlapping them.
        unsafe { std::ptr::copy(st.addr(src.0), dst, nbytes as usize) };
        return;
    }
    let mut inner = lock(&st.default_ctx.inner);
    crate::rma::get(st, &mut inner, routine, dst, src, nbytes, pe, false);
}

/// A local copy of `n` heap bytes (a team of this PE alone).
fn local_copy(st: &State, dest: SymAddr, source: SymAddr, n: u64) {
    if n > 0 && dest != source {
        // SAFETY: both ranges are inside the heap (checked by the caller);
        // `copy` allows them to overlap.
        unsafe { std::ptr::copy(st.addr(source.0), st.addr(dest.0), n as usize) };
    }
}

/// Copy `nbytes` of `source` on team PE `root` to `dest` on every member,
/// root included (§9.9.7 `shmem_broadcast`, `shmem_broadcastmem`): the
/// library's `broadcastmem`. **Collective** over `team`. Returns 0.
///
/// Errors (fatal): before init; a bad team; `root` outside it; `dest` or
/// `source` outside the heap (`nbytes` that do not fit).
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_broadcast(team: *mut CpnetTeam, dest: *mut c_void, source: *const c_void, nbytes: usize, root: c_int, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    let t = lookup(st, routine, team);
    if root < 0 || root >= t.size {
        fatal(routine, &format!("PE_root {root} is not a PE of the team (0 to {})", t.size - 1));
    }
    let n = nbytes as u64;
    let d = st.sym(routine, "dest", dest.cast(), n);
    let s = st.sym(routine, "source", source.cast(), n);
    member(routine, &t);
    match &t.desc {
        Some(td) => on_team(st, routine, &t, |wg| wg.broadcastmem(td, d, s, n, root)),
        None => local_copy(st, d, s, n),
    }
    0
}

/// Concatenate every member's `nbytes` of `source` into `dest` in team PE
/// order (§9.9.8 `shmem_fcollect`, `shmem_fcollectmem`): the library's
/// `fcollectmem`. **Collective**. Returns 0.
///
/// Errors (fatal): as [`cpnet_team_broadcast`]; `dest` must hold
/// `nbytes * team size` bytes.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_fcollect(team: *mut CpnetTeam, dest: *mut c_void, source: *const c_void, nbytes: usize, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    let t = lookup(st, routine, team);
    let n = nbytes as u64;
    let d = st.sym(routine, "dest", dest.cast(), n * t.size as u64);
    let s = st.sym(routine, "source", source.cast(), n);
    member(routine, &t);
    match &t.desc {
        Some(td) => on_team(st, routine, &t, |wg| wg.fcollectmem(td, d, s, n)),
        None => local_copy(st, d, s, n),
    }
    0
}

/// Concatenate every member's `nbytes` (which may differ between members)
/// of `source` into `dest` in team PE order (§9.9.8 `shmem_collect`,
/// `shmem_collectmem`): the library's `collectmem` (the sizes, then the
/// blocks). **Collective**. Returns 0.
///
/// Errors (fatal): as [`cpnet_team_fcollect`]; a `dest` whose range for the
/// sum of the sizes leaves the heap (the library's error from the member
/// whose put would leave it).
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_collect(team: *mut CpnetTeam, dest: *mut c_void, source: *const c_void, nbytes: usize, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    let t = lookup(st, routine, team);
    let n = nbytes as u64;
    let s = st.sym(routine, "source", source.cast(), n);
    member(routine, &t);
    // At least this PE's own block must fit; the library checks the rest.
    let d = st.sym(routine, "dest", dest.cast(), n);
    match &t.desc {
        Some(td) => {
            on_team(st, routine, &t, |wg| wg.collectmem(td, d, s, n));
        }
        None => local_copy(st, d, s, n),
    }
    0
}

/// Exchange `nbytes` blocks: block `j` of every member's `source` goes to
/// block `i` of member `j`'s `dest`, `i` being the sender (§9.9.5
/// `shmem_alltoall`, `shmem_alltoallmem`): the library's `alltoallmem`.
/// **Collective**. Returns 0.
///
/// Errors (fatal): as [`cpnet_team_fcollect`]; both hold `nbytes * size` bytes.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_alltoall(team: *mut CpnetTeam, dest: *mut c_void, source: *const c_void, nbytes: usize, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    let t = lookup(st, routine, team);
    let n = nbytes as u64;
    let all = n * t.size as u64;
    let d = st.sym(routine, "dest", dest.cast(), all);
    let s = st.sym(routine, "source", source.cast(), all);
    member(routine, &t);
    match &t.desc {
        Some(td) => on_team(st, routine, &t, |wg| wg.alltoallmem(td, d, s, n)),
        None => local_copy(st, d, s, n),
    }
    0
}

/// Strided exchange (§9.9.6 `shmem_alltoalls`, `shmem_alltoallsmem`):
/// member `i` sends member `j` the `nelems` elements of `elem_size` bytes
/// at `source` elements `(j * nelems + k) * sst`, which land at `dest`
/// elements `(i * nelems + k) * dst` of member `j`, `k` in `0..nelems`.
/// **Collective**: the library's team sync, a get per element from each
/// member's `source`, and a sync (so no source changes before every member
/// read it). Returns 0.
///
/// Errors (fatal): as [`cpnet_team_alltoall`]; strides below 1.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cpnet_team_alltoalls(
    team: *mut CpnetTeam,
    dest: *mut c_void,
    source: *const c_void,
    dst: isize,
    sst: isize,
    nelems: usize,
    elem_size: usize,
    routine: *const c_char,
) -> c_int {
    let st = state::get(routine);
    let t = lookup(st, routine, team);
    if dst < 1 || sst < 1 {
        fatal(routine, &format!("the strides must be at least 1 (dst {dst}, sst {sst})"));
    }
    let (size, per) = (elem_size as u64, nelems as u64 * t.size as u64);
    // The last element either side touches, and the range that spans it.
    let span = |stride: isize| if per == 0 { 0 } else { ((per - 1) * stride as u64 + 1) * size };
    let d = st.sym(routine, "dest", dest.cast(), span(dst));
    let s = st.sym(routine, "source", source.cast(), span(sst));
    let me = member(routine, &t);
    if let Some(td) = &t.desc {
        on_team(st, routine, &t, |wg| wg.team_sync(td));
    }
    for j in 0..t.size {
        for k in 0..nelems as u64 {
            // Member j's elements for this PE (i = me) come from its source.
            let from = s.add((me as u64 * nelems as u64 + k) * sst as u64 * size);
            let to = d.0 + (j as u64 * nelems as u64 + k) * dst as u64 * size;
            fetch(st, routine, st.addr(to), from, size, t.world(j));
        }
    }
    if let Some(td) = &t.desc {
        on_team(st, routine, &t, |wg| wg.team_sync(td));
    }
    0
}

/// Combine `nreduce` elements of type `ty` (`CPNET_TYPE_*`) of every
/// member's `source` by `op` (`CPNET_OP_AND` ... `CPNET_OP_PROD`) into
/// `dest` on every member (§9.9.9 "Reduction routines":
/// `shmem_<TYPE>_<op>_reduce`): the library's `reduce` (every member gets
/// the same bits: the contributions are folded in team order).
/// **Collective**. `dest` may be `source`. Returns 0.
///
/// Errors (fatal): as [`cpnet_team_broadcast`]; an operation the type does
/// not have (bitwise ones on floating point).
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cpnet_team_reduce(
    team: *mut CpnetTeam,
    dest: *mut c_void,
    source: *const c_void,
    nreduce: usize,
    ty: c_int,
    op: c_int,
    routine: *const c_char,
) -> c_int {
    let st = state::get(routine);
    let t = lookup(st, routine, team);
    let size = crate::type_size(ty);
    if size == 0 {
        fatal(routine, &format!("type code {ty} is not a reduction type"));
    }
    let Some(rop) = crate::reduce::op_of(ty, op) else {
        fatal(routine, &format!("reduction operation {op} is not defined for type code {ty}"));
    };
    let n = (nreduce * size) as u64;
    let d = st.sym(routine, "dest", dest.cast(), n);
    let s = st.sym(routine, "source", source.cast(), n);
    member(routine, &t);
    let Some(td) = &t.desc else {
        local_copy(st, d, s, n);
        return 0;
    };
    let k = nreduce as u64;
    on_team(st, routine, &t, |wg| match ty {
        crate::CPNET_TYPE_INT8 => wg.reduce::<i8>(td, rop, d, s, k),
        crate::CPNET_TYPE_INT16 => wg.reduce::<i16>(td, rop, d, s, k),
        crate::CPNET_TYPE_INT32 => wg.reduce::<i32>(td, rop, d, s, k),
        crate::CPNET_TYPE_INT64 => wg.reduce::<i64>(td, rop, d, s, k),
        crate::CPNET_TYPE_UINT8 => wg.reduce::<u8>(td, rop, d, s, k),
        crate::CPNET_TYPE_UINT16 => wg.reduce::<u16>(td, rop, d, s, k),
        crate::CPNET_TYPE_UINT32 => wg.reduce::<u32>(td, rop, d, s, k),
        crate::CPNET_TYPE_UINT64 => wg.reduce::<u64>(td, rop, d, s, k),
        crate::CPNET_TYPE_FLOAT => wg.reduce::<f32>(td, rop, d, s, k),
        _ => wg.reduce::<f64>(td, rop, d, s, k),
    });
    0
}
