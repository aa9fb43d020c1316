//! Teams and team collectives (OpenSHMEM 1.5 §9.4 "Team management
//! routines", §9.9 "Collective routines").
//!
//! A team is a strided set of world PEs (`start + i * stride`, `i` in
//! `0..size`) in one of [`TEAM_SLOTS`] slots; its handle is the slot + 1
//! (`SHMEM_TEAM_WORLD` = 1, `SHMEM_TEAM_SHARED` = 2: this PE alone, since
//! CPU PEs are separate processes whose heaps only the fabric reaches, so
//! `shmem_ptr` reaches no other PE). Each slot has [`TEAM_SCRATCH`] bytes at
//! the same heap offset on every PE: counters for the team's sync and one
//! exchange word.
//!
//! # Algorithms
//!
//! * sync: a dissemination barrier; in round `k` each member adds 1 to
//!   counter `k` of the member `2^k` further on (a non-blocking AMO) and
//!   waits until its own counter `k` reaches the number of syncs so far
//!   (counters only grow, so no reset is needed between syncs).
//! * broadcast, fcollect, collect, alltoall, reductions: sync; each member
//!   reads what it needs from the others' symmetric source with gets; sync
//!   (so no source is overwritten before every member has read it). A
//!   reduction stores `dest` only after the second sync, so `dest` may be
//!   `source`.

use std::ffi::{c_char, c_int, c_long, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cpnet_device::cpu::SymAddr;
use cpnet_device::sync::{Deadline, Spin};

use crate::state::{self, State, TEAM_SCRATCH, TEAM_SLOTS, fatal, lock};
use crate::{CpnetTeam, CpnetTeamConfig};

/// Sync counter words per team (rounds: enough for 2^16 PEs).
const SYNC_WORDS: u64 = 16;
/// The exchange word (collect's sizes, split's free-slot masks).
const XCHG_WORD: u64 = 16;

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
    /// Slot index.
    pub(crate) slot: usize,
    /// The `num_contexts` of the team's configuration.
    pub(crate) num_contexts: c_int,
    /// Syncs this PE has entered on the team; held through every
    /// collective, which also serializes the team's collectives.
    syncs: std::sync::Mutex<u64>,
}

impl Team {
    pub(crate) fn new(start: i32, stride: i32, size: i32, me: i32, slot: usize, num_contexts: c_int) -> Team {
        let rel = me - start;
        let my_idx = (rel >= 0 && rel % stride == 0 && rel / stride < size).then_some(rel / stride);
        Team { start, stride, size, my_idx, slot, num_contexts, syncs: std::sync::Mutex::new(0) }
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

/// The heap offset of word `w` of `slot`'s scratch.
fn scratch(st: &State, slot: usize, w: u64) -> SymAddr {
    SymAddr(st.team_base + slot as u64 * TEAM_SCRATCH + 8 * w)
}

/// The local scratch word as an atomic.
fn scratch_word(st: &State, slot: usize, w: u64) -> &AtomicU64 {
    // SAFETY: the scratch region is inside the heap (reserved at init),
    // 8-aligned, and only accessed atomically (AMOs of other PEs, these loads).
    unsafe { AtomicU64::from_ptr(st.addr(scratch(st, slot, w).0).cast()) }
}

fn member(routine: *const c_char, t: &Team) -> i32 {
    match t.my_idx {
        Some(i) => i,
        None => fatal(routine, "this PE is not a member of the team"),
    }
}

/// The team's sync, with the team's lock held (`syncs`).
fn sync_locked(st: &State, routine: *const c_char, t: &Team, syncs: &mut u64) {
    let me = member(routine, t);
    *syncs += 1;
    let epoch = *syncs;
    let n = t.size;
    let mut k = 0u64;
    while (1i64 << k) < i64::from(n) {
        let partner = t.world((me + (1 << k)) % n);
        {
            let mut inner = lock(&st.default_ctx.inner);
            if let Err(e) = inner.wg(routine).atomic_add::<u64>(scratch(st, t.slot, k), 1, partner) {
                fatal(routine, &e.to_string());
            }
        }
        let w = scratch_word(st, t.slot, k);
        let deadline = Deadline::after(st.wait_timeout);
        let spin = Spin::new();
        // Acquire: pairs with the provider's delivery of the partner's add,
        // which the partner issued after everything it did before the sync.
        while w.load(Ordering::Acquire) < epoch {
            if deadline.expired() {
                fatal(
                    routine,
                    &format!(
                        "timed out after {:?} (CPNET_WAIT_TIMEOUT) in the team's sync: round {k}, waiting for team PE {}",
                        st.wait_timeout.unwrap_or_default(),
                        (me - (1 << k)).rem_euclid(n)
                    ),
                );
            }
            spin.step();
        }
        k += 1;
    }
}

/// Register the predefined teams (init).
pub(crate) fn install_predefined(st: &State) {
    let mut teams = lock(&st.teams);
    teams[0] = Some(Arc::new(Team::new(0, 1, st.n_pes, st.me, 0, 0)));
    teams[1] = Some(Arc::new(Team::new(st.me, 1, 1, st.me, 1, 0)));
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
/// `parent` (every member calls it with the same arguments). Returns 0 and
/// stores the new handle (`SHMEM_TEAM_INVALID`, null, on PEs outside it)
/// in `*new_team`; nonzero, with `SHMEM_TEAM_INVALID`, when the triplet
/// does not fit in `parent` or no team slot (64 teams) is free on every
/// member.
///
/// Errors (fatal): before init; a bad `parent`; this PE not in `parent`.
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
    let me_p = member(routine, &p);
    let fits = size >= 1
        && start >= 0
        && (stride >= 1 || size == 1)
        && i64::from(start) + i64::from(size - 1) * i64::from(stride.max(1)) < i64::from(p.size);
    // Agree on a slot free on every parent member: AND of the free masks.
    let mut syncs = lock(&p.syncs);
    let free: u64 = {
        let teams = lock(&st.teams);
        (2..TEAM_SLOTS).filter(|&s| teams[s].is_none()).fold(0, |m, s| m | 1 << s)
    };
    // Release: read by the other members' gets after the sync below.
    scratch_word(st, p.slot, XCHG_WORD).store(free, Ordering::Release);
    sync_locked(st, routine, &p, &mut syncs);
    let mut all = free;
    for j in (0..p.size).filter(|&j| j != me_p) {
        let mut inner = lock(&st.default_ctx.inner);
        match inner.wg(routine).g::<u64>(scratch(st, p.slot, XCHG_WORD), p.world(j)) {
            Ok(m) => all &= m,
            Err(e) => fatal(routine, &e.to_string()),
        }
    }
    sync_locked(st, routine, &p, &mut syncs);
    if !fits || all == 0 {
        return 1;
    }
    let slot = all.trailing_zeros() as usize;
    let stride = stride.max(1);
    let num_contexts = if !config.is_null() && config_mask & 1 != 0 {
        // SAFETY: readable when non-null (contract 1).
        unsafe { (*config).num_contexts }
    } else {
        0
    };
    let t = Team::new(p.world(start), stride * p.stride, size, st.me, slot, num_contexts);
    let is_member = t.my_idx.is_some();
    if is_member {
        for w in 0..SYNC_WORDS + 1 {
            scratch_word(st, slot, w).store(0, Ordering::Relaxed);
        }
        lock(&st.teams)[slot] = Some(Arc::new(t));
    }
    // The zeroed counters are in place on every member before any member
    // syncs on the new team.
    sync_locked(st, routine, &p, &mut syncs);
    if is_member {
        // SAFETY: writable (contract 1).
        unsafe { *new_team = (slot + 1) as *mut CpnetTeam };
    }
    0
}

/// Free `team` (§9.4.7 `shmem_team_destroy`). **Collective** over the
/// team. `SHMEM_TEAM_INVALID` is ignored; the predefined teams are refused.
///
/// Errors (fatal): before init; a handle that is no team; a predefined team.
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
    let mut syncs = lock(&t.syncs);
    sync_locked(st, routine, &t, &mut syncs);
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

/// Check and enter a team collective: the team, this PE's number, and the
/// team's lock (already through the opening sync).
fn begin<'a>(st: &State, routine: *const c_char, t: &'a Team) -> (i32, std::sync::MutexGuard<'a, u64>) {
    let me = member(routine, t);
    let mut syncs = lock(&t.syncs);
    sync_locked(st, routine, t, &mut syncs);
    (me, syncs)
}

/// Copy `nbytes` of `source` on team PE `root` to `dest` on every member,
/// root included (§9.9.7 `shmem_broadcast`, `shmem_broadcastmem`).
/// **Collective** over `team`. Returns 0.
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
    let (_, mut syncs) = begin(st, routine, &t);
    if n > 0 && d != s {
        fetch(st, routine, st.addr(d.0), s, n, t.world(root));
    }
    sync_locked(st, routine, &t, &mut syncs);
    0
}

/// Concatenate every member's `nbytes` of `source` into `dest` in team PE
/// order (§9.9.8 `shmem_fcollect`, `shmem_fcollectmem`). **Collective**.
/// Returns 0.
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
    let (_, mut syncs) = begin(st, routine, &t);
    for j in 0..t.size {
        fetch(st, routine, st.addr(d.0 + j as u64 * n), s, n, t.world(j));
    }
    sync_locked(st, routine, &t, &mut syncs);
    0
}

/// Concatenate every member's `nbytes` (which may differ between members)
/// of `source` into `dest` in team PE order (§9.9.8 `shmem_collect`,
/// `shmem_collectmem`). **Collective**. Returns 0.
///
/// Errors (fatal): as [`cpnet_team_fcollect`], with the total size.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_team_collect(team: *mut CpnetTeam, dest: *mut c_void, source: *const c_void, nbytes: usize, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    let t = lookup(st, routine, team);
    let n = nbytes as u64;
    let s = st.sym(routine, "source", source.cast(), n);
    let me = member(routine, &t);
    // Release: the others read it with gets after the opening sync.
    scratch_word(st, t.slot, XCHG_WORD).store(n, Ordering::Release);
    let (_, mut syncs) = begin(st, routine, &t);
    let mut sizes = Vec::with_capacity(t.size as usize);
    for j in 0..t.size {
        if j == me {
            sizes.push(n);
        } else {
            let mut inner = lock(&st.default_ctx.inner);
            match inner.wg(routine).g::<u64>(scratch(st, t.slot, XCHG_WORD), t.world(j)) {
                Ok(v) => sizes.push(v),
                Err(e) => fatal(routine, &e.to_string()),
            }
        }
    }
    let total: u64 = sizes.iter().sum();
    let d = st.sym(routine, "dest", dest.cast(), total);
    let mut at = d.0;
    for (j, &len) in sizes.iter().enumerate() {
        if len > 0 {
            fetch(st, routine, st.addr(at), s, len, t.world(j as i32));
        }
        at += len;
    }
    sync_locked(st, routine, &t, &mut syncs);
    0
}

/// Exchange `nbytes` blocks: block `j` of every member's `source` goes to
/// block `i` of member `j`'s `dest`, `i` being the sender (§9.9.5
/// `shmem_alltoall`, `shmem_alltoallmem`). **Collective**. Returns 0.
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
    let (me, mut syncs) = begin(st, routine, &t);
    for j in 0..t.size {
        fetch(st, routine, st.addr(d.0 + j as u64 * n), s.add(me as u64 * n), n, t.world(j));
    }
    sync_locked(st, routine, &t, &mut syncs);
    0
}

/// Strided exchange (§9.9.6 `shmem_alltoalls`, `shmem_alltoallsmem`):
/// member `i` sends member `j` the `nelems` elements of `elem_size` bytes
/// at `source` elements `(j * nelems + k) * sst`, which land at `dest`
/// elements `(i * nelems + k) * dst` of member `j`, `k` in `0..nelems`.
/// **Collective**. Returns 0.
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
    let (me, mut syncs) = begin(st, routine, &t);
    for j in 0..t.size {
        for k in 0..nelems as u64 {
            let from = s.add((me as u64 * nelems as u64 + k) * sst as u64 * size);
            let to = d.0 + (j as u64 * nelems as u64 + k) * dst as u64 * size;
            fetch(st, routine, st.addr(to), from, size, t.world(j));
        }
    }
    sync_locked(st, routine, &t, &mut syncs);
    0
}

/// Combine `nreduce` elements of type `ty` (`CPNET_TYPE_*`) of every
/// member's `source` by `op` (`CPNET_OP_AND` ... `CPNET_OP_PROD`) into
/// `dest` on every member (§9.9.9 "Reduction routines":
/// `shmem_<TYPE>_<op>_reduce`). **Collective**. `dest` may be `source`.
/// Returns 0.
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
    if !crate::reduce::supports(ty, op) {
        fatal(routine, &format!("reduction operation {op} is not defined for type code {ty}"));
    }
    let n = (nreduce * size) as u64;
    let d = st.sym(routine, "dest", dest.cast(), n);
    let s = st.sym(routine, "source", source.cast(), n);
    let (_, mut syncs) = begin(st, routine, &t);
    let mut acc = vec![0u8; n as usize];
    let mut other = vec![0u8; n as usize];
    fetch(st, routine, acc.as_mut_ptr(), s, n, t.world(0));
    for j in 1..t.size {
        fetch(st, routine, other.as_mut_ptr(), s, n, t.world(j));
        crate::reduce::combine(ty, op, &mut acc, &other);
    }
    // Every member has read every source before any dest changes.
    sync_locked(st, routine, &t, &mut syncs);
    // SAFETY: dest is inside the heap for n bytes (checked).
    unsafe { std::ptr::copy_nonoverlapping(acc.as_ptr(), st.addr(d.0), n as usize) };
    0
}
