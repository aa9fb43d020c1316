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
//! sync and the allgather take three.
//!
//! It takes `size x floor(n / size)` elements (the pair exchange: all of
//! them); the last `n mod size` (fewer than the members) go by the
//! one-block form after it, on the same stream. `dest` and `source` must not overlap (members put into each
//! other's `dest` while they still read their `source`): an in-place reduce
//! takes the one-block form.

use cpnet_device::cpu::{ReduceOp, ReduceType, SymAddr};
use cudarc::driver::{CudaStream, DeviceRepr};

use super::GpuPe;
use super::grid::GRID_MAX_MEMBERS;
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
/// Most blocks of the fold.
pub const NET_MAX_BLOCKS: u64 = 64;
/// Bytes of this member's part per fold block.
pub const NET_BYTES_PER_BLOCK: u64 = 256 << 10;
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
    /// exchange of a team of two (`reduce_pair`).
    form: i32,
}

// SAFETY: repr(C), plain integers laid out as `struct red_net_args` of
// kernel() (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for NetArgs {}

const _: () = assert!(size_of::<NetArgs>() == 48);

/// The kernel for the team.cuh reduction `cpnet_<name>_<op>_reduce` (its
/// element type) and the combiner's operator `red`: `cpnet/grid.cuh`'s
/// `reduce_net`, compiled once per PE, type and operator, on first use.
pub(super) fn kernel(name: &str, op: &str, red: &str) -> String {
    format!(
        r#"#include <cpnet/grid.cuh>
typedef cpnet_detail::reduce_elem<decltype(&cpnet_{name}_{op}_reduce)>::type elem_t;
struct red_net_args {{
    uint64_t dest, source, n, words;
    int32_t my_idx, size, comm, form;
}};
static_assert(sizeof(red_net_args) == 48, "red_net_args: as NetArgs in reduce_net.rs");

extern "C" __global__ void __launch_bounds__(CPNET_GRID_THREADS)
cpnet_reduce_net(cpnet_handle_t h, int team, red_net_args a)
{{
    if (a.form == 1)
        cpnet_detail::reduce_pair<elem_t, cpnet_detail::{red}>(&h, team, a.dest, a.source, a.n,
            (unsigned long long*)a.words, a.my_idx);
    else
        cpnet_detail::reduce_net<elem_t, cpnet_detail::{red}>(&h, team, a.dest, a.source, a.n,
            (unsigned long long*)a.words, a.my_idx, a.size, a.comm);
}}
"#
    )
}

impl GpuPe {
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
        let d = team.desc();
        let size = d.size.max(0) as u64;
        let bytes = nreduce.saturating_mul(T::SIZE as u64);
        let overlap = dest.0 < source.0 + bytes && source.0 < dest.0 + bytes;
        if bytes < NET_MIN_BYTES || size < 2 || size > GRID_MAX_MEMBERS as u64 || overlap || nreduce < size || self.member_ptrs(team, SymAddr(0)).is_some() {
            return Ok(None);
        }
        let key = format!("cpnet_reduce_net:{}:{}", T::NAME, op.name());
        let f = self.on_stream_built(&key, "cpnet_reduce_net", || kernel(T::NAME, op.name(), red_name(op)))?;
        // A team of two through staging zones: the pair exchange of the
        // whole array, folded on every block.
        let pair = size == 2 && self.staging_zones() && bytes <= NET_PAIR_MAX_BYTES;
        // Else movers: one per proxy thread and NET_BYTES_PER_MOVER of the
        // part, except through staging zones.
        let (m, form) = if pair { (nreduce, 1) } else { (nreduce / size, 0) };
        let threads = self.core.tuning.gpu_service_threads() as u64;
        let part = m * T::SIZE as u64;
        let comm = if self.staging_zones() { 1 } else { threads.min(part.div_ceil(NET_BYTES_PER_MOVER)).clamp(1, NET_MAX_BLOCKS) };
        let blocks = part.div_ceil(NET_BYTES_PER_BLOCK).clamp(comm, NET_MAX_BLOCKS) as u32;
        let n = if pair { nreduce } else { m * size };
        // SAFETY: kernel() declares cpnet_reduce_net(cpnet_handle_t, int,
        // red_net_args), which NetArgs mirrors (asserted on both sides);
        // `dest` and `source` were checked inside the heap by the caller for
        // nreduce >= size x m elements, and the kernel touches only those
        // (its loads and stores, and puts whose targets the proxy checks).
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
            })
        }?;
        Ok(Some(n))
    }
}
