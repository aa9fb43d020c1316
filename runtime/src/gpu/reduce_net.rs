//! The on-stream reduce to all of large arrays over the network path
//! (issue 22): where the grid form of `reduce_grid.rs` cannot run (some
//! member's heap is not mapped here), [`GpuPe::team_reduce_on_stream`] of
//! at least [`NET_MIN_BYTES`] runs a reduce-scatter by puts into the
//! members' `dest` and an allgather of the folded parts, with the fold on
//! a grid (`cpnet/grid.cuh`'s `reduce_net`, whose comment gives the
//! protocol). The data moves through one block's context with the shm
//! provider's staging zones (one proxy thread fills the copy engines
//! there), else through one block per proxy thread, each with a context of
//! its own, as the network path's alltoall (`alltoall_net.rs`). The
//! one-block form it replaces there sends every member's whole array to
//! every other through the team scratch, one scratch chunk per signal
//! round, and folds on one SM. On two H200s (docs/results.md, "Session
//! 23"), 16 MiB of floats: over shm 594-602 µs against NCCL's 633 through
//! host memory (the one block: 21.9 ms, two H100s); over `net` 3361 µs
//! against the one mover's 8258 and NCCL's 5689 over sockets.
//!
//! A team of two through staging zones, up to [`NET_PAIR_MAX_BYTES`],
//! takes the pair exchange instead (`reduce_pair` in `cpnet/grid.cuh`): an
//! entry epoch, the whole array into the peer's `dest` by one put with its
//! signal, and a fold of the whole array on every block of both members:
//! two signal rounds through the proxies where the reduce-scatter, its
//! sync and the allgather take three. The world team of two puts into the
//! peer's *landing half* of its reduce scratch instead, two halves taken in
//! turn call by call ([`Scratch`]), so it needs no entry epoch: one signal
//! round. On two H200s (docs/results.md, "Session 26") that took 44 / 53 /
//! 85 / 173 µs for 64 KiB / 256 KiB / 1 MiB / 4 MiB of floats against 52-55
//! / 61-64 / 94-99 / 186-196 with the entry epoch (NCCL through host
//! memory: 38-42 / 38-39 / 63 / 171-173); with the close's quiet posted
//! right after the put and the launch words' ring (session 27, j33) 42 /
//! 49 / 83 / 182 against session 26's code's 46 / 55 / 92 / 188 in the same
//! call (NCCL: 33 / 36 / 62 / 191).
//!
//! A job of two whose GPU PEs share host memory takes the pair staging
//! for the world team instead (`pair_stage.rs`, `cpnet/pair.cuh`'s
//! `reduce_staged`), up to [`PAIR_STAGE_MAX_BYTES`]: the blocks write the
//! array into the peer's half in host memory and fold the peer's from
//! this PE's, in chunks signalled through the proxy.
//!
//! It takes `size x floor(n / size)` elements (the pair exchange: all of
//! them); the last `n mod size` (fewer than the members) go by the
//! one-block form after it, on the same stream.
//!
//! Members put into each other's `dest` while they still read their
//! `source`, so these forms need the two apart. An in-place reduce (`dest
//! == source`) goes through the PE's reduce scratch (`CPNET_REDUCE_SCRATCH`,
//! heap of its own past the teams' scratch, [`Scratch`]): in chunks of the
//! scratch's size, the kernel's blocks first copy the member's chunk of
//! `dest` there (`grid_copy_in`), and the reduce runs from that copy into
//! `dest` after an entry epoch that follows the copy, so no member puts
//! into a chunk its owner has not copied out yet (the pair exchange has
//! that epoch anyway; the landing halves need none: no member puts into
//! `dest`). Without scratch, or with
//! a partial overlap (undefined in OpenSHMEM 1.5 §9.9.12), it takes the
//! one-block form through the team scratch: 21.6 ms for 16 MiB of floats
//! over shm on two H100s.

use cpnet_device::cpu::{ReduceOp, ReduceType, SymAddr};
use cpnet_device::layout::CPNET_TEAM_WORLD;
use cudarc::driver::{CudaStream, DeviceRepr};
use parking_lot::Mutex;

use super::GpuPe;
use super::grid::{GRID_MAX_MEMBERS, LastUse};
use super::reduce_grid::red_name;
use crate::error::Result;
use crate::team::Team;

/// Bytes of the array from which the reduce runs this way over the
/// network path.
pub const NET_MIN_BYTES: u64 = 64 << 10;
/// Most bytes of the array for the pair exchange (a team of two through
/// staging zones); above, the reduce-scatter and allgather. On two H100s
/// (docs/results.md, "Session 24") the pair exchange took 63 / 83 / 120 /
/// 211 µs for 64 KiB / 256 KiB / 1 MiB / 4 MiB against 72 / 97 / 146 / 253,
/// and 630-641 against 597-608 for 16 MiB, where folding the whole array
/// on both members and one mover cost more than the round saved.
pub const NET_PAIR_MAX_BYTES: u64 = 4 << 20;
/// Most bytes of the array for the pair staging (`pair_stage.rs`): the
/// size of its halves; above, the reduce-scatter and allgather (and an
/// in-place reduce's chunks take the landing halves). Session 28's
/// staging, which stored the whole array and then loaded it, took 191 µs
/// for 4 MiB against the landing halves' 170, so it stopped at 2 MiB; in
/// signalled chunks (session 29, docs/results.md) 4 MiB took 164 against
/// 168-179, and 1 MiB 63 against 81.
pub const PAIR_STAGE_MAX_BYTES: u64 = NET_PAIR_MAX_BYTES;
/// Most blocks of the fold.
pub const NET_MAX_BLOCKS: u64 = 64;
/// Bytes of this member's part (the pair exchange: of the array) per fold
/// block. The fold runs after the data landed, on the critical path: one
/// block folds about 57 GB/s. On two H200s (docs/results.md, "Session 26"),
/// the pair exchange with 16 KiB per block took 54 / 63 / 97 / 188 µs for 64
/// KiB / 256 KiB / 1 MiB / 4 MiB against 59 / 78 / 113 / 206 with 256 KiB
/// (its fold alone: 1.5 µs against 14 at 256 KiB and 1 MiB); 32 KiB was
/// within the noise of 16.
pub const NET_BYTES_PER_BLOCK: u64 = 16 << 10;
/// Bytes of this member's part per mover block (one per proxy thread at
/// most). Over `net` on two H200s (docs/results.md, "Session 23"), four
/// movers took 191 µs for 64 KiB (16 KiB parts) against one's 131, and
/// 217 for 256 KiB against 252.
pub const NET_BYTES_PER_MOVER: u64 = 32 << 10;

/// `red_net_args` of the kernel, field for field.
#[repr(C)]
#[derive(Clone, Copy)]
struct NetArgs {
    dest: u64,
    source: u64,
    /// Elements: size x m.
    n: u64,
    /// The launch's words (grid.cuh's reduce_net).
    words: u64,
    my_idx: i32,
    size: i32,
    /// Blocks that move data, each with its own context.
    comm: i32,
    /// 0: the reduce-scatter and allgather (`reduce_net`); 1: the pair
    /// exchange of a team of two (`reduce_pair`); 2 and 3: those of an
    /// in-place reduce's chunk, which first copy `dest` into `source` (the
    /// reduce scratch) on the grid, the reduce-scatter then with an entry
    /// epoch; 4: the pair staging (`cpnet/pair.cuh`'s `reduce_staged`).
    form: i32,
    /// The pair exchange's landing half of this call (device address, the
    /// same heap offset on the peer), 0: none (it puts into the peer's
    /// `dest` after an entry epoch). With the pair staging, this PE's half
    /// of its pair zone (host memory).
    land: u64,
    /// The pair staging's half of the peer's pair zone that this call's
    /// blocks write into (device address of host memory; `pair_stage.rs`),
    /// 0: none (the put through the proxy).
    out: u64,
    /// The pair staging's plan ([`super::pair_stage::PairPlan`]): chunks
    /// and producer blocks (0 in the other forms).
    chunks: i32,
    producers: i32,
    /// The pair staging's chunk signals (this PE's device address of the
    /// words at [`Scratch::pair_sigs_at`]; 0 in the other forms).
    sigs: u64,
}

// SAFETY: repr(C), plain integers laid out as `struct red_net_args` of
// kernel() (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for NetArgs {}

const _: () = assert!(size_of::<NetArgs>() == 80);

/// The kernel for the team.cuh reduction `cpnet_<name>_<op>_reduce` (its
/// element type) and the combiner's operator `red`: `cpnet/grid.cuh`'s
/// `reduce_net`, compiled once per PE, type and operator, on first use.
pub(super) fn kernel(name: &str, op: &str, red: &str) -> String {
    format!(
        r#"#include <cpnet/pair.cuh>
typedef cpnet_detail::reduce_elem<decltype(&cpnet_{name}_{op}_reduce)>::type elem_t;
struct red_net_args {{
    uint64_t dest, source, n, words;
    int32_t my_idx, size, comm, form;
    uint64_t land, out;
    int32_t chunks, producers;
    uint64_t sigs;
}};
static_assert(sizeof(red_net_args) == 80, "red_net_args: as NetArgs in reduce_net.rs");

extern "C" __global__ void __launch_bounds__(CPNET_GRID_THREADS)
cpnet_reduce_net(cpnet_handle_t h, int team, red_net_args a)
{{
    if (a.form == 4) {{
        const cpnet_detail::pair_plan p = {{a.n * sizeof(elem_t), (uint32_t)a.chunks, (uint32_t)a.producers}};
        cpnet_detail::reduce_staged<elem_t, cpnet_detail::{red}>(&h, team, a.dest, a.source, a.n,
            (unsigned long long*)a.words, a.my_idx, a.land, a.out, (uint64_t*)a.sigs, p);
    }} else if (a.form == 1 || a.form == 3)
        cpnet_detail::reduce_pair<elem_t, cpnet_detail::{red}>(&h, team, a.dest, a.source, a.n,
            (unsigned long long*)a.words, a.my_idx, a.form == 3, a.land);
    else
        cpnet_detail::reduce_net<elem_t, cpnet_detail::{red}>(&h, team, a.dest, a.source, a.n,
            (unsigned long long*)a.words, a.my_idx, a.size, a.comm, a.form == 2);
    cpnet_detail::grid_exit((unsigned long long*)a.words);
}}
"#
    )
}

/// A GPU PE's reduce scratch (`CPNET_REDUCE_SCRATCH`): heap of its own
/// past the teams' scratch (`startup::PeKind::reserve`), at the same offset
/// on every GPU PE. Where it holds at least [`LANDING_BYTES`] +
/// [`PAIR_SIG_BYTES`] + [`NET_MIN_BYTES`], its first [`LANDING_BYTES`] are
/// two landing halves of [`NET_PAIR_MAX_BYTES`], into which the peer of a
/// world team of two puts its array for the pair exchange (call k into half
/// k mod 2), the next [`PAIR_SIG_BYTES`] the pair staging's chunk signals
/// (`cpnet/pair.cuh`: word c is SET to the call's epoch once chunk c is in
/// this PE's half; nothing else writes them), and the rest is the in-place
/// copy: an in-place reduce copies its array there and
/// puts from it; only this PE reads and writes it. Else all of it is the
/// copy and the pair exchange puts into the peer's `dest` after an entry
/// epoch.
///
/// Two landing halves suffice: the peer puts call k + 2 into half k mod 2
/// only after this member's call k + 1 put reached it, which this member
/// issued after call k's fold (the calls that use the scratch run one at a
/// time on each PE, in the order enqueued: [`Turn`]). Only the world team
/// takes them, so that both members count the same calls (members order
/// one team's collectives alike, not different teams'). The kernel still
/// quiets at its end: a later collective's signal to the peer, through
/// another queue, must not land before this put's.
#[derive(Debug)]
pub(super) struct Scratch {
    /// Heap offset.
    at: SymAddr,
    /// Bytes (0: none).
    bytes: u64,
    /// Bytes of the landing halves at `at` (0 or [`LANDING_BYTES`]); the
    /// pair staging's chunk signals follow them where there are any
    /// ([`Scratch::sig_bytes`]).
    land: u64,
    /// Its turns, one launch sequence at a time (`GpuPe::scratch_turn`).
    turn: Mutex<Turn>,
}

/// The reduce scratch's turns on this PE.
#[derive(Debug, Default)]
struct Turn {
    /// The last reduce that used the scratch, on its stream: the next one's
    /// stream waits for it before its first launch, so reduces on different
    /// streams take the scratch in the order they were enqueued here.
    last: LastUse,
    /// Pair exchanges through the landing halves so far: the next lands in
    /// half `pairs mod 2`. The same count on both members, which enqueue
    /// the world team's reduces in the same order.
    pairs: Pairs,
}

/// [`Turn::pairs`]: what a launch in the scratch's turn may change.
/// The alltoall through the pair zone (`alltoall_net.rs`) counts its calls
/// here too: both members take the same halves in the same order.
#[derive(Debug, Default)]
pub(super) struct Pairs(u64);

impl Pairs {
    /// This call's index (`k`: half `k mod 2` of the landing halves or the
    /// pair zone), counting it.
    pub(super) fn next(&mut self) -> u64 {
        let k = self.0;
        self.0 += 1;
        k
    }
}

/// Bytes of the two landing halves of the pair exchange in the reduce
/// scratch.
pub const LANDING_BYTES: u64 = 2 * NET_PAIR_MAX_BYTES;
/// Bytes of the pair staging's chunk signals in the reduce scratch: one
/// 8-byte word per chunk (cmd.h's `CPNET_PAIR_MAX_CHUNKS`), kept to a
/// 256-byte multiple so that the in-place copy after them stays aligned.
pub const PAIR_SIG_BYTES: u64 = 256;
const _: () = assert!(8 * cpnet_device::layout::CPNET_PAIR_MAX_CHUNKS as u64 <= PAIR_SIG_BYTES);

impl Scratch {
    /// `bytes` at heap offset `at` (zeroed with the heap).
    pub(super) fn new(at: SymAddr, bytes: u64) -> Scratch {
        let land = if bytes >= LANDING_BYTES + PAIR_SIG_BYTES + NET_MIN_BYTES { LANDING_BYTES } else { 0 };
        Scratch { at, bytes, land, turn: Mutex::new(Turn::default()) }
    }

    /// Bytes of the chunk signals after the landing halves: [`PAIR_SIG_BYTES`]
    /// where the scratch has landing halves, else 0.
    fn sig_bytes(&self) -> u64 {
        if self.has_landing() { PAIR_SIG_BYTES } else { 0 }
    }

    /// Whether it holds the landing halves (and the chunk signals).
    pub(super) fn has_landing(&self) -> bool {
        self.land > 0
    }

    /// Heap offset of the pair staging's chunk signals (where
    /// [`Scratch::has_landing`]).
    pub(super) fn pair_sigs_at(&self) -> SymAddr {
        SymAddr(self.at.0 + self.land)
    }

    /// Heap offset of the in-place copy.
    fn copy_at(&self) -> SymAddr {
        SymAddr(self.at.0 + self.land + self.sig_bytes())
    }

    /// Bytes of the in-place copy.
    fn copy_bytes(&self) -> u64 {
        self.bytes - self.land - self.sig_bytes()
    }
}

/// The chunks of an in-place reduce of `n` elements on a team of `size`
/// through a scratch of `per` elements (a positive multiple of `size`):
/// `(first element, elements)` in order, each a multiple of `size` and at
/// most `per`, covering `[0, n - n mod size)` once; the last `n mod size`
/// elements are the caller's.
fn in_place_chunks(n: u64, size: u64, per: u64) -> impl Iterator<Item = (u64, u64)> {
    let whole = n.checked_div(size).map_or(0, |q| q * size);
    (0..whole.div_ceil(per.max(1))).map(move |k| (k * per, per.min(whole - k * per)))
}

/// Which network-path form a reduce takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Reduce-scatter and allgather; `true`: in place (a copy into the
    /// scratch, then an entry epoch).
    Scatter(bool),
    /// The pair exchange into the peer's `dest`, after an entry epoch.
    Pair,
    /// The pair exchange into the peer's landing half of the reduce
    /// scratch: no entry epoch (the world team of two; [`Scratch`]).
    Landing,
    /// The pair exchange through the pair staging's halves in host memory
    /// (`pair_stage.rs`): the world team of a job of two whose PEs both
    /// have it; in place too, with no copy.
    Staged,
}

impl GpuPe {
    /// Elements per chunk of an in-place reduce of `T` through the reduce
    /// scratch on a team of `size`: a multiple of `size`, 0 where the
    /// scratch cannot take one chunk of at least [`NET_MIN_BYTES`].
    fn scratch_chunk(&self, elem: u64, size: u64) -> u64 {
        let per = self.reduce_scratch.copy_bytes() / elem / size * size;
        if per * elem < NET_MIN_BYTES { 0 } else { per }
    }

    /// Whether the network path's forms take a reduce of `nreduce` elements
    /// of `elem` bytes on `team` from `source` into `dest`, and whether
    /// through the reduce scratch (in place): the same answer on every
    /// member (the size, the team, the peer table, the tuning).
    fn net_takes(&self, team: &Team, dest: SymAddr, source: SymAddr, nreduce: u64, elem: u64) -> Option<bool> {
        let size = team.desc().size.max(0) as u64;
        let bytes = nreduce.saturating_mul(elem);
        if bytes < NET_MIN_BYTES || size < 2 || size > GRID_MAX_MEMBERS as u64 || nreduce < size || self.member_ptrs(team, SymAddr(0)).is_some() {
            return None;
        }
        let overlap = dest.0 < source.0 + bytes && source.0 < dest.0 + bytes;
        match (overlap, dest == source && self.scratch_chunk(elem, size) > 0) {
            (false, _) => Some(false),
            (true, true) => Some(true),
            (true, false) => None,
        }
    }

    /// The form of one launch of `bytes` on `team`, `in_place` meaning a
    /// chunk of an in-place reduce through the reduce scratch, which the
    /// kernel first copies into the scratch: the same on every member (the
    /// team, the size, the provider, the tuning). Such a chunk never takes
    /// the pair zone, whose kernel has no copy-in (`cpnet/pair.cuh`'s
    /// reduce_staged): an in-place call takes the pair zone whole instead
    /// ([`GpuPe::reduce_net`] asks with `in_place` false), so only the
    /// chunks of a call above [`PAIR_STAGE_MAX_BYTES`] come here with it.
    fn net_form(&self, team: &Team, bytes: u64, in_place: bool) -> Form {
        let size = team.desc().size;
        if size != 2 || !self.staging_zones() || bytes > NET_PAIR_MAX_BYTES {
            Form::Scatter(in_place)
        } else if team.id() == CPNET_TEAM_WORLD && self.reduce_scratch.land > 0 {
            if self.pair_stage.is_some() && bytes <= PAIR_STAGE_MAX_BYTES && !in_place { Form::Staged } else { Form::Landing }
        } else {
            Form::Pair
        }
    }

    /// What [`GpuPe::team_reduce_on_stream`] of `bytes` (elements x their
    /// size, `elem` bytes each) on `team` runs, `in_place` meaning `dest ==
    /// source`: `"grid"` (the peer grid, `reduce_grid.rs`), `"pair"` (the
    /// network path's pair exchange), `"landing"` (the pair exchange
    /// through the landing halves), `"scatter"` (its reduce-scatter and
    /// allgather), each with `"+scratch"` when in place through the reduce
    /// scratch (`CPNET_REDUCE_SCRATCH`, chunks of its size; the form named
    /// is the first chunk's), or `"block"` (one block through the team
    /// scratch). The same answer on every member. Local; for benchmarks
    /// and logs.
    pub fn team_reduce_on_stream_form(&self, team: &Team, bytes: u64, elem: u64, in_place: bool) -> &'static str {
        if self.team_reduce_on_stream_is_grid(team, bytes) {
            return "grid";
        }
        let elem = elem.max(1);
        let source = SymAddr(0);
        let dest = if in_place { source } else { SymAddr(bytes) };
        let Some(scratch) = self.net_takes(team, dest, source, bytes / elem, elem) else { return "block" };
        if self.net_form(team, bytes, false) == Form::Staged {
            return "staged";
        }
        let size = team.desc().size.max(0) as u64;
        let first = if scratch { bytes.min(self.scratch_chunk(elem, size) * elem) } else { bytes };
        match (self.net_form(team, first, scratch), scratch) {
            (Form::Pair, false) => "pair",
            (Form::Pair, true) => "pair+scratch",
            (Form::Landing, false) => "landing",
            (Form::Landing, true) => "landing+scratch",
            (Form::Scatter(_), false) => "scatter",
            (Form::Scatter(_), true) => "scatter+scratch",
            (Form::Staged, _) => "staged",
        }
    }

    /// The network path's forms of [`GpuPe::team_reduce_on_stream`] alone
    /// (OpenSHMEM 1.5 §9.9.12, on a stream), for a caller with kernels of
    /// its own for every other case: `nvshmem.h`'s
    /// `nvshmemx_TYPENAME_OP_reduce_on_stream`, through libcpnet's
    /// `cpnet_gpu_reduce_on_stream_net`. Where they take the call (at least
    /// 64 KiB on a team of 2-32 members some of whose heaps are not mapped
    /// here, `dest` and `source` apart or equal: in place through the reduce
    /// scratch), launches them on `stream` for the first `k` elements and
    /// returns `k`, a multiple of the team's size; the caller then reduces
    /// the last `nreduce - k` elements (fewer than the members) after them
    /// on the same stream. Else returns 0 and launches nothing. The same
    /// answer on every member. **Collective** over `team`.
    ///
    /// # Errors
    /// As [`GpuPe::team_reduce_on_stream`].
    pub fn team_reduce_on_stream_net<T: ReduceType>(
        &self,
        team: &Team,
        op: ReduceOp,
        dest: SymAddr,
        source: SymAddr,
        nreduce: usize,
        stream: &CudaStream,
    ) -> Result<u64> {
        self.reduce_checks::<T>(op, dest, source, nreduce)?;
        Ok(self.reduce_net::<T>(team, op, dest, source, nreduce as u64, stream)?.unwrap_or(0))
    }

    /// The reduce to all over the network path, if it runs that way (see
    /// the module; the same answer on every member: the size, the team and
    /// the peer table): `Ok(Some(k))` once launched for the first `k`
    /// elements (the caller reduces the rest), `Ok(None)` for another form.
    /// The caller checked the ranges and the operator.
    pub(super) fn reduce_net<T: ReduceType>(
        &self,
        team: &Team,
        op: ReduceOp,
        dest: SymAddr,
        source: SymAddr,
        nreduce: u64,
        stream: &CudaStream,
    ) -> Result<Option<u64>> {
        let Some(in_place) = self.net_takes(team, dest, source, nreduce, T::SIZE as u64) else { return Ok(None) };
        let form = self.net_form(team, nreduce * T::SIZE as u64, false);
        // The landing halves and the pair zone, in the scratch's turn. The
        // pair zone takes an in-place call too: every chunk goes out before it
        // is folded into (`cpnet/pair.cuh`'s reduce_staged), so no copy
        // into the scratch.
        if form == Form::Staged || (form == Form::Landing && !in_place) {
            return self.scratch_turn(stream, |turn| self.reduce_net_launch::<T>(team, op, dest, source, nreduce, false, Some(turn), stream)).map(Some);
        }
        if in_place {
            return self.reduce_in_place::<T>(team, op, dest, nreduce, stream).map(Some);
        }
        self.reduce_net_launch::<T>(team, op, dest, source, nreduce, false, None, stream).map(Some)
    }

    /// `launch` (the launches of one reduce through the reduce scratch, on
    /// `stream`) in the scratch's turn: after the last user's event, the
    /// turn's state locked for it, and a new event recorded after it, even
    /// where it failed (what it enqueued uses the scratch).
    pub(super) fn scratch_turn<R>(&self, stream: &CudaStream, launch: impl FnOnce(&mut Pairs) -> Result<R>) -> Result<R> {
        self.bind()?;
        let mut turn = self.reduce_scratch.turn.lock();
        let Turn { last, pairs } = &mut *turn;
        last.after(stream, "cuStreamWaitEvent (the reduce scratch's last use)", "cuEventRecord (the reduce scratch's last use)", || launch(pairs))
    }

    /// The in-place reduce through the reduce scratch (the module): per
    /// chunk a launch that copies `dest`'s chunk into the scratch's copy and
    /// reduces from there into the chunk, in the scratch's turn. Returns
    /// the elements taken (a multiple of the team's size).
    fn reduce_in_place<T: ReduceType>(&self, team: &Team, op: ReduceOp, dest: SymAddr, nreduce: u64, stream: &CudaStream) -> Result<u64> {
        let size = team.desc().size.max(0) as u64;
        let elem = T::SIZE as u64;
        let per = self.scratch_chunk(elem, size);
        let copy = self.reduce_scratch.copy_at();
        self.scratch_turn(stream, |turn| {
            let mut done = 0u64;
            for (first, len) in in_place_chunks(nreduce, size, per) {
                // The chunk, inside `dest`'s range (checked by the caller);
                // the copy holds `per` >= len elements, and the launch is
                // ordered on `stream` after the scratch's last use (the
                // turn).
                let at = SymAddr(dest.0 + first * elem);
                done += self.reduce_net_launch::<T>(team, op, at, copy, len, true, Some(&mut *turn), stream)?;
            }
            Ok(done)
        })
    }

    /// One launch of the network path's forms from `source` into `dest`
    /// (apart), `in_place` asking it to copy `dest` into `source` (the
    /// reduce scratch's copy) first: returns the elements it takes. With the
    /// scratch's `turn` (the caller holds it), a pair exchange of the world
    /// team lands in the next landing half; without, it puts into the
    /// peer's `dest` after an entry epoch.
    #[allow(clippy::too_many_arguments)]
    fn reduce_net_launch<T: ReduceType>(
        &self,
        team: &Team,
        op: ReduceOp,
        dest: SymAddr,
        source: SymAddr,
        nreduce: u64,
        in_place: bool,
        turn: Option<&mut Pairs>,
        stream: &CudaStream,
    ) -> Result<u64> {
        let d = team.desc();
        let size = d.size.max(0) as u64;
        let key = format!("cpnet_reduce_net:{}:{}", T::NAME, op.name());
        let f = self.on_stream_built(&key, "cpnet_reduce_net", || kernel(T::NAME, op.name(), red_name(op)))?;
        let bytes = nreduce * T::SIZE as u64;
        // A team of two through staging zones: the pair exchange of the
        // whole array, folded on every block; into the peer's landing half
        // in the scratch's turn.
        let (form, land, out) = match (self.net_form(team, bytes, in_place), turn, self.pair_stage.as_ref()) {
            (Form::Landing, Some(turn), _) => {
                let half = turn.next() % 2;
                (Form::Landing, self.dev_ptr(SymAddr(self.reduce_scratch.at.0 + half * NET_PAIR_MAX_BYTES)), 0)
            }
            (Form::Staged, Some(turn), Some(stage)) => {
                let k = turn.next();
                (Form::Staged, stage.in_half(k), stage.out_half(k))
            }
            (Form::Landing | Form::Staged, _, _) => (Form::Pair, 0, 0),
            (form, _, _) => (form, 0, 0),
        };
        let pair = matches!(form, Form::Pair | Form::Landing | Form::Staged);
        // Else movers: one per proxy thread and NET_BYTES_PER_MOVER of the
        // part, except through staging zones.
        let m = if pair { nreduce } else { nreduce / size };
        let threads = self.core.tuning.gpu_service_threads() as u64;
        let part = m * T::SIZE as u64;
        let comm = if self.staging_zones() { 1 } else { threads.min(part.div_ceil(NET_BYTES_PER_MOVER)).clamp(1, NET_MAX_BLOCKS) };
        let mut blocks = part.div_ceil(NET_BYTES_PER_BLOCK).clamp(comm, NET_MAX_BLOCKS) as u32;
        let n = if pair { nreduce } else { m * size };
        // The pair staging's blocks: its plan's roles.
        let plan = (form == Form::Staged).then(|| self.pair_plan(bytes));
        let form = match (pair, in_place, plan) {
            (_, _, Some(p)) => {
                blocks = p.blocks;
                4
            }
            (false, false, None) => 0,
            (true, false, None) => 1,
            (false, true, None) => 2,
            (true, true, None) => 3,
        };
        // SAFETY: kernel() declares cpnet_reduce_net(cpnet_handle_t, int,
        // red_net_args), which NetArgs mirrors (asserted on both sides);
        // `dest` and `source` are inside the heap for nreduce >= size x m
        // elements (the caller's ranges, or the reduce scratch's copy), so is
        // `land` for nreduce elements (a landing half, NET_PAIR_MAX_BYTES >=
        // bytes, at the same offset on the peer; or with `out` this PE's
        // half of its pair zone, and `out` the peer's, both registered host
        // memory of NET_PAIR_MAX_BYTES that live as long as the PE; then
        // `sigs` is the reduce scratch's PAIR_SIG_BYTES of chunk signals, in
        // the heap at the same offset on the peer, of which the kernel uses
        // at most CPNET_PAIR_MAX_CHUNKS words), and the kernel touches only
        // those (its loads and stores, and puts and signals whose targets
        // the proxy checks).
        unsafe {
            self.launch_grid(stream, &f, team, blocks, "cuLaunchKernel (network-path reduce)", |words| NetArgs {
                dest: self.dev_ptr(dest),
                source: self.dev_ptr(source),
                n,
                words,
                my_idx: d.my_idx,
                size: d.size,
                comm: comm as i32,
                form,
                land,
                out,
                chunks: plan.map_or(0, |p| p.chunks as i32),
                producers: plan.map_or(0, |p| p.producers as i32),
                sigs: if plan.is_some() { self.dev_ptr(self.reduce_scratch.pair_sigs_at()) } else { 0 },
            })
        }?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::{LANDING_BYTES, NET_MIN_BYTES, PAIR_SIG_BYTES, Scratch, in_place_chunks};
    use cpnet_device::cpu::SymAddr;

    /// The landing halves, then the chunk signals, then the in-place copy,
    /// 256-byte aligned and inside the scratch; none of the first two
    /// where the scratch cannot hold them and a chunk of the copy.
    #[test]
    fn the_scratch_holds_landing_halves_then_chunk_signals_then_the_copy() {
        let at = SymAddr(1 << 30);
        let s = Scratch::new(at, 24 << 20);
        assert!(s.has_landing());
        assert_eq!(s.pair_sigs_at().0, at.0 + LANDING_BYTES);
        assert_eq!(s.copy_at().0, at.0 + LANDING_BYTES + PAIR_SIG_BYTES);
        assert_eq!(s.copy_at().0 % 256, 0);
        assert_eq!(s.copy_at().0 + s.copy_bytes(), at.0 + (24 << 20));
        let edge = LANDING_BYTES + PAIR_SIG_BYTES + NET_MIN_BYTES;
        assert!(Scratch::new(at, edge).has_landing());
        let s = Scratch::new(at, edge - 256);
        assert!(!s.has_landing());
        assert_eq!((s.copy_at(), s.copy_bytes()), (at, edge - 256));
    }

    /// The chunks cover the whole multiple of the team's size once, in
    /// order, each a multiple of the size and at most the scratch.
    #[test]
    fn in_place_chunks_cover_the_array_once() {
        for (n, size, per) in [(1_048_577, 3, 131_070), (1_048_577, 2, 2_097_152), (12_289, 2, 4096), (7, 3, 3), (5, 3, 3), (2, 3, 3), (0, 2, 2)] {
            let chunks: Vec<(u64, u64)> = in_place_chunks(n, size, per).collect();
            let mut next = 0;
            for &(first, len) in &chunks {
                assert_eq!(first, next, "n {n} size {size} per {per}: {chunks:?}");
                assert!(len > 0 && len <= per && len % size == 0, "n {n} size {size} per {per}: {chunks:?}");
                next += len;
            }
            assert_eq!(next, n / size * size, "n {n} size {size} per {per}: {chunks:?}");
        }
        assert_eq!(in_place_chunks(1_048_577, 3, 131_070).count(), 9, "the 3-PE test's 9 chunks of a 1 MiB scratch");
    }
}
