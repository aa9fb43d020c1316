//! Teams (OpenSHMEM 1.5 §9.4): the PE's team table and the collective
//! creation and destruction of teams, shared by CPU PEs ([`crate::Pe`]) and
//! GPU PEs ([`crate::GpuPe`]).
//!
//! A team is a strided set of world PEs ([`TeamDesc`], `cmd.h` "Teams").
//! Every PE keeps a table of `CPNET_TEAMS` entries; a team's handle is its
//! entry's index, the same on every member: [`CPNET_TEAM_WORLD`] (0),
//! [`CPNET_TEAM_NODE`] (1, the PEs of this host), then the teams made by
//! splits. Each entry owns `CPNET_TEAM_SCRATCH` bytes of symmetric memory
//! for its collectives, reserved past the end of the `CPNET_HEAP_SIZE` the
//! allocator hands out.
//!
//! # Creation (collective over the parent team)
//!
//! 1. Every parent member proposes the mask of its free entries; the
//!    parent's own reduction (AND) gives the entries free on all of them
//!    (`team_agree`: a CPU work-group, or a one-block kernel on a GPU PE).
//! 2. The new team takes the lowest (a 2D split: the two lowest), so its
//!    handle is the same on every member; its members clear its scratch
//!    (signals of an earlier team in that entry must not satisfy its waits)
//!    and install it (a GPU PE copies the entry into the kernels' table).
//! 3. A sync of the parent: nobody signals into the new scratch before
//!    every member cleared it.
//!
//! Destruction is a sync of the team (nobody is still sending into its
//! scratch), then the entry is freed.

use std::sync::Mutex;

use cpnet_device::layout::{CPNET_TEAM_NODE, CPNET_TEAM_WORLD, TeamDesc};

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};

/// A team this PE is a member of (OpenSHMEM `shmem_team_t`): its handle
/// ([`Team::id`], what a kernel takes as `cpnet_team_t`) and its entry.
/// It dereferences to its [`TeamDesc`], which the CPU work-group's
/// collectives take (`wg.team_sync(&team)`). Neither `Copy` nor `Clone`:
/// destroying a team consumes it, so a destroyed team cannot be used again
/// from Rust (a kernel holding its handle gets `CPNET_E_BAD_TEAM`, or the
/// team that reuses the entry later, as with NVSHMEM's handles).
#[derive(Debug, PartialEq, Eq)]
pub struct Team {
    id: i32,
    desc: TeamDesc,
}

impl Team {
    /// The handle: the `cpnet_team_t` kernels take, the same on every member.
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The table entry.
    pub fn desc(&self) -> &TeamDesc {
        &self.desc
    }

    /// This PE's number in the team (`shmem_team_my_pe`, §9.4.5). Local.
    pub fn my_pe(&self) -> i32 {
        self.desc.my_idx
    }

    /// Number of PEs in the team (`shmem_team_n_pes`, §9.4.6). Local.
    pub fn n_pes(&self) -> i32 {
        self.desc.size
    }

    /// The world PE of team PE `idx`, `None` outside `0..n_pes`.
    pub fn world_pe(&self, idx: i32) -> Option<i32> {
        (0..self.desc.size).contains(&idx).then(|| self.desc.world_pe(idx))
    }

    /// Team PE `pe` of this team as a PE number of `dest`, -1 where it is
    /// not a member of `dest` or `pe` is outside this team
    /// (`shmem_team_translate_pe`, §9.4.8). Local.
    pub fn translate_pe(&self, pe: i32, dest: &Team) -> i32 {
        self.world_pe(pe).and_then(|w| dest.desc.team_pe(w)).unwrap_or(-1)
    }
}

impl std::ops::Deref for Team {
    type Target = TeamDesc;
    fn deref(&self) -> &TeamDesc {
        &self.desc
    }
}

/// The PE's team table: which entries hold a team, and where the teams'
/// scratch is.
#[derive(Debug)]
pub(crate) struct Teams {
    me: i32,
    /// Entry `t` (size 0: free).
    entries: Mutex<Vec<TeamDesc>>,
    /// Heap offset of entry 0's scratch; entry `t`'s is `base + t * bytes`.
    base: u64,
    /// Scratch bytes per entry.
    bytes: u64,
}

/// This host's identity for "same host" (the kernel's boot id, else the
/// host name).
pub(crate) fn host_id() -> Vec<u8> {
    std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_else(|_| {
        let mut b = [0u8; 256];
        // SAFETY: gethostname writes at most `len` bytes into `b`.
        let r = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
        if r == 0 { b.split(|&c| c == 0).next().unwrap_or(&[]).to_vec() } else { Vec::new() }
    })
}

/// The node team as (start, stride, size) from every PE's host id: the PEs
/// sharing `me`'s, if they are strided; else `me` alone.
fn node_team(ids: &[Vec<u8>], me: i32) -> (i32, i32, i32) {
    let mine = &ids[me as usize];
    let local: Vec<i32> = (0..ids.len() as i32).filter(|&p| &ids[p as usize] == mine).collect();
    let stride = if local.len() > 1 { local[1] - local[0] } else { 1 };
    if local.windows(2).all(|w| w[1] - w[0] == stride) {
        (local[0], stride, local.len() as i32)
    } else {
        tracing::warn!("PE {me}: the PEs of this host ({local:?}) are not strided: CPNET_TEAM_NODE is this PE alone");
        (me, 1, 1)
    }
}

impl Teams {
    /// The table with the world and node teams, the scratch of `slots`
    /// entries of `bytes` each at heap offset `base`. **Collective** (an
    /// allgather of host ids).
    ///
    /// # Errors
    /// [`Error::Team`] when `bytes` is too small for a world team;
    /// [`Error::Bootstrap`].
    pub(crate) fn start(boot: &Bootstrap, me: i32, n_pes: i32, base: u64, bytes: u64, slots: usize) -> Result<Teams> {
        let ids = boot.allgather(&host_id()).map_err(|cause| Error::Bootstrap { pe: me, cause })?;
        let (ns, nst, nn) = node_team(&ids, me);
        let scratch = |t: i32| base + t as u64 * bytes;
        let too_small = || Error::Team {
            pe: me,
            why: format!(
                "CPNET_TEAM_SCRATCH = {bytes} bytes is too small for a team of {n_pes} PEs (it needs at least {})",
                (cpnet_device::layout::CPNET_TEAM_SCR_SIG as u64 + 8 * n_pes as u64).next_multiple_of(64) + 128 * n_pes as u64
            ),
        };
        let world = TeamDesc::new(0, 1, n_pes, me, scratch(CPNET_TEAM_WORLD), bytes).ok_or_else(too_small)?;
        let node = TeamDesc::new(ns, nst, nn, me, scratch(CPNET_TEAM_NODE), bytes).ok_or_else(too_small)?;
        let mut entries = vec![TeamDesc::default(); slots];
        entries[CPNET_TEAM_WORLD as usize] = world;
        entries[CPNET_TEAM_NODE as usize] = node;
        Ok(Teams { me, entries: Mutex::new(entries), base, bytes })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TeamDesc>> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The entries, for a GPU PE's table.
    pub(crate) fn snapshot(&self) -> Vec<TeamDesc> {
        self.lock().clone()
    }

    /// The team in entry `id`.
    pub(crate) fn team(&self, id: i32) -> Team {
        Team { id, desc: self.lock()[id as usize] }
    }

    /// Mask of the free entries.
    fn free_mask(&self) -> u64 {
        self.lock().iter().enumerate().filter(|(_, d)| d.size == 0).fold(0, |m, (i, _)| m | 1 << i)
    }

    /// The entry of team (`start`, `stride`, `size`) at index `id`, as this PE sees it.
    fn entry(&self, id: i32, start: i32, stride: i32, size: i32) -> Result<TeamDesc> {
        TeamDesc::new(start, stride, size, self.me, self.base + id as u64 * self.bytes, self.bytes).ok_or_else(|| Error::Team {
            pe: self.me,
            why: format!("CPNET_TEAM_SCRATCH = {} bytes is too small for a team of {size} PEs", self.bytes),
        })
    }
}

/// What creating and destroying teams needs of a PE kind.
pub(crate) trait TeamHost {
    /// The PE's table.
    fn teams(&self) -> &Teams;
    /// The AND of every `parent` member's `mask`. **Collective** over `parent`.
    fn agree(&self, parent: &Team, mask: u64) -> Result<u64>;
    /// The team's sync. **Collective** over `team`.
    fn sync(&self, team: &Team) -> Result<()>;
    /// Zero `desc`'s scratch (`bytes`) in the local heap.
    fn clear(&self, desc: &TeamDesc, bytes: u64) -> Result<()>;
    /// Entry `id` changed to `desc` (a GPU PE copies it to the kernels' table).
    fn publish(&self, id: i32, desc: &TeamDesc) -> Result<()>;
}

fn bad(me: i32, why: String) -> Error {
    Error::Team { pe: me, why }
}

/// Agree on `count` free entries over `parent`, then install `members[k]`
/// (start, stride, size, or `None` where this PE is not in the k-th new
/// team) in the k-th; sync the parent. **Collective** over `parent`.
fn create<H: TeamHost>(h: &H, parent: &Team, call: &str, members: &[Option<(i32, i32, i32)>]) -> Result<Vec<Option<Team>>> {
    let teams = h.teams();
    let me = teams.me;
    let agreed = h.agree(parent, teams.free_mask())?;
    let ids: Vec<i32> = (0..64).filter(|&i| agreed & (1u64 << i) != 0).take(members.len()).collect();
    if ids.len() < members.len() {
        // Every member saw the same mask, so every member fails here alike.
        return Err(bad(
            me,
            format!(
                "{call}: no free team entry common to every PE of the parent team (CPNET_TEAMS = {}; destroy teams no longer used)",
                teams.lock().len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(members.len());
    for (&id, m) in ids.iter().zip(members) {
        let Some((start, stride, size)) = *m else {
            out.push(None);
            continue;
        };
        let desc = teams.entry(id, start, stride, size)?;
        if desc.my_idx < 0 {
            out.push(None);
            continue;
        }
        h.clear(&desc, teams.bytes)?;
        teams.lock()[id as usize] = desc;
        h.publish(id, &desc)?;
        out.push(Some(Team { id, desc }));
    }
    h.sync(parent)?;
    Ok(out)
}

/// `shmem_team_split_strided` (§9.4.3): the parent PEs `start + i *
/// stride`, `i` in `0..size` (parent numbering), as a new team; `None` on
/// parent PEs outside it. **Collective** over `parent`, with the same
/// arguments on every parent PE.
///
/// # Errors
/// [`Error::Team`] for arguments that leave the parent (a negative or zero
/// `size` or `stride`, a last PE past the parent's end), or when no entry is
/// free on every parent PE; the collectives' errors.
pub(crate) fn split_strided<H: TeamHost>(h: &H, parent: &Team, start: i32, stride: i32, size: i32) -> Result<Option<Team>> {
    let me = h.teams().me;
    let last = i64::from(start) + i64::from(stride) * (i64::from(size) - 1);
    if size < 1 || stride < 1 || start < 0 || last >= i64::from(parent.n_pes()) {
        return Err(bad(
            me,
            format!(
                "team_split_strided(start {start}, stride {stride}, size {size}): not a set of PEs of the parent team (0..{})",
                parent.n_pes()
            ),
        ));
    }
    let w = (parent.desc.world_pe(start), stride * parent.desc.stride, size);
    Ok(create(h, parent, "team_split_strided", &[Some(w)])?.pop().flatten())
}

/// `shmem_team_split_2d` (§9.4.4): the parent seen as a grid of `xrange`
/// columns (parent PE `p` at column `p % xrange`, row `p / xrange`); returns
/// this PE's row team (the "x team") and column team (the "y team").
/// **Collective** over `parent`, with the same `xrange` everywhere.
///
/// # Errors
/// [`Error::Team`] for `xrange < 1`, or when two entries are not free on
/// every parent PE; the collectives' errors.
pub(crate) fn split_2d<H: TeamHost>(h: &H, parent: &Team, xrange: i32) -> Result<(Team, Team)> {
    let me = h.teams().me;
    if xrange < 1 {
        return Err(bad(me, format!("team_split_2d(xrange {xrange}): xrange must be at least 1")));
    }
    let (n, p) = (parent.n_pes(), parent.my_pe());
    let xr = xrange.min(n);
    let (x, y) = (p % xr, p / xr);
    let pd = &parent.desc;
    // Row y: parent PEs y*xr .. ; column x: parent PEs x, x + xr, ...
    let row = (pd.world_pe(y * xr), pd.stride, xr.min(n - y * xr));
    let col = (pd.world_pe(x), xr * pd.stride, (n - x + xr - 1) / xr);
    let mut made = create(h, parent, "team_split_2d", &[Some(row), Some(col)])?.into_iter();
    match (made.next().flatten(), made.next().flatten()) {
        (Some(r), Some(c)) => Ok((r, c)),
        _ => unreachable!("every parent PE is in its own row and column"),
    }
}

/// `shmem_team_destroy` (§9.4.10): a sync of the team, then its entry is
/// free. **Collective** over the team.
///
/// # Errors
/// [`Error::Team`] for the world and node teams; the sync's errors.
pub(crate) fn destroy<H: TeamHost>(h: &H, team: Team) -> Result<()> {
    let me = h.teams().me;
    if team.id == CPNET_TEAM_WORLD || team.id == CPNET_TEAM_NODE {
        return Err(bad(me, format!("team_destroy: team {} (world or node) cannot be destroyed", team.id)));
    }
    h.sync(&team)?;
    h.teams().lock()[team.id as usize] = TeamDesc::default();
    h.publish(team.id, &TeamDesc::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_team_is_the_strided_set_of_this_hosts_pes_or_this_pe_alone() {
        let ids = |s: &str| s.bytes().map(|b| vec![b]).collect::<Vec<_>>();
        assert_eq!(node_team(&ids("aaaa"), 2), (0, 1, 4), "one host");
        assert_eq!(node_team(&ids("aabb"), 3), (2, 1, 2), "blocks");
        assert_eq!(node_team(&ids("abab"), 1), (1, 2, 2), "round-robin");
        assert_eq!(node_team(&ids("aab"), 2), (2, 1, 1), "alone on its host");
        assert_eq!(node_team(&ids("abba"), 0), (0, 3, 2), "two PEs are always strided");
        assert_eq!(node_team(&ids("abbaa"), 3), (3, 1, 1), "not strided: this PE alone");
    }

    #[test]
    fn a_team_translates_pes_through_world_numbers() {
        let t = |id, start, stride, size, me| Team { id, desc: TeamDesc::new(start, stride, size, me, 0, 1 << 16).unwrap() };
        let world = t(0, 0, 1, 8, 4);
        let odd = t(2, 1, 2, 4, 5);
        assert_eq!(odd.my_pe(), 2);
        assert_eq!(odd.translate_pe(3, &world), 7);
        assert_eq!(world.translate_pe(7, &odd), 3);
        assert_eq!(world.translate_pe(4, &odd), -1, "an even PE is not in the odd team");
        assert_eq!(odd.translate_pe(4, &world), -1, "outside the team");
        assert_eq!(odd.world_pe(-1), None);
    }
}
