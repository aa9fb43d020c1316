//! The on-stream reduce to all of large arrays by a grid (issue 22): where
//! every other member of the team maps this PE's heap (peer-to-peer
//! stores on), [`GpuPe::team_reduce_on_stream`] of at least
//! [`GRID_MIN_BYTES`] launches up to [`GRID_MAX_BLOCKS`] blocks instead of
//! the one block of the other forms, which folds at what one SM loads.
//!
//! The device code is `cpnet/grid.cuh`'s `reduce_grid` (a reduce-scatter
//! then an allgather in place over the peer mappings, between an entry
//! and an exit epoch; its comment gives the algorithm and the protocol),
//! which nvshmem.h's `nvshmemx_TYPENAME_OP_reduce_on_stream` runs too.
//! Every member takes the grid form or none: the choice depends on the
//! size, the team and the peer table, the same on every member (the heaps
//! are mapped both ways or not at all, as the device collectives assume).
//! A failure goes to the status block, as for the other forms:
//! [`GpuPe::synchronize`] reports it.

use cpnet_device::cpu::{ReduceOp, ReduceType, SymAddr};
use cpnet_device::layout::{
    CPNET_REDUCE_GRID_ARGS_BYTES, CPNET_REDUCE_GRID_ARGS_OFF_DEST, CPNET_REDUCE_GRID_ARGS_OFF_DST,
    CPNET_REDUCE_GRID_ARGS_OFF_MY_IDX, CPNET_REDUCE_GRID_ARGS_OFF_N, CPNET_REDUCE_GRID_ARGS_OFF_SIZE,
    CPNET_REDUCE_GRID_ARGS_OFF_SOURCE, CPNET_REDUCE_GRID_ARGS_OFF_SRC, CPNET_REDUCE_GRID_ARGS_OFF_WORDS,
    CPNET_REDUCE_GRID_BYTES_PER_BLOCK, CPNET_REDUCE_GRID_MAX_BLOCKS, CPNET_REDUCE_GRID_MIN_BYTES,
};
use cudarc::driver::{CudaStream, DeviceRepr};
use std::mem::offset_of;

use super::GpuPe;
use super::grid::GRID_MAX_MEMBERS;
use crate::error::Result;
use crate::team::Team;

/// Bytes of the array from which the reduce runs on a grid (where it can):
/// `CPNET_REDUCE_GRID_MIN_BYTES` of cmd.h, which nvshmem.h's form uses too.
/// On two H200s (docs/results.md, "Session 21"), float sum on a stream:
/// the grid from 4 KiB took 28.0-28.5 µs at 4 KiB and 27.4-27.9 at 16 KiB
/// against the one block's 20.5-20.9 and 25.0-25.3; at 64 KiB both
/// 28.5-29.7.
pub const GRID_MIN_BYTES: u64 = CPNET_REDUCE_GRID_MIN_BYTES as u64;
/// Most blocks of the grid (`CPNET_REDUCE_GRID_MAX_BLOCKS`).
pub const GRID_MAX_BLOCKS: u32 = CPNET_REDUCE_GRID_MAX_BLOCKS as u32;
/// Bytes of this member's part per grid block: `ceil(part / this)` blocks,
/// at most [`GRID_MAX_BLOCKS`] (`CPNET_REDUCE_GRID_BYTES_PER_BLOCK`).
pub const GRID_BYTES_PER_BLOCK: u64 = CPNET_REDUCE_GRID_BYTES_PER_BLOCK as u64;

/// `cpnet_reduce_grid_args_t` of cmd.h, field for field (asserted below
/// against its offsets, and there by `static_assert`).
#[repr(C)]
#[derive(Clone, Copy)]
struct GridArgs {
    dest: u64,
    source: u64,
    /// Elements.
    n: u64,
    /// Two words of this launch, zeroed: `go` (block 0 to the others) and
    /// `done` (the others' count).
    words: u64,
    /// Member j's `source` as mapped in this process.
    src: [u64; GRID_MAX_MEMBERS],
    /// Member j's `dest` as mapped in this process.
    dst: [u64; GRID_MAX_MEMBERS],
    my_idx: i32,
    size: i32,
}

// SAFETY: repr(C), plain integers laid out as cpnet_reduce_grid_args_t
// (same fields, same order, the offsets asserted below).
unsafe impl DeviceRepr for GridArgs {}

const _: () = {
    assert!(size_of::<GridArgs>() == CPNET_REDUCE_GRID_ARGS_BYTES);
    assert!(offset_of!(GridArgs, dest) == CPNET_REDUCE_GRID_ARGS_OFF_DEST);
    assert!(offset_of!(GridArgs, source) == CPNET_REDUCE_GRID_ARGS_OFF_SOURCE);
    assert!(offset_of!(GridArgs, n) == CPNET_REDUCE_GRID_ARGS_OFF_N);
    assert!(offset_of!(GridArgs, words) == CPNET_REDUCE_GRID_ARGS_OFF_WORDS);
    assert!(offset_of!(GridArgs, src) == CPNET_REDUCE_GRID_ARGS_OFF_SRC);
    assert!(offset_of!(GridArgs, dst) == CPNET_REDUCE_GRID_ARGS_OFF_DST);
    assert!(offset_of!(GridArgs, my_idx) == CPNET_REDUCE_GRID_ARGS_OFF_MY_IDX);
    assert!(offset_of!(GridArgs, size) == CPNET_REDUCE_GRID_ARGS_OFF_SIZE);
};

/// The kernel for the team.cuh reduction `cpnet_<name>_<op>_reduce` (its
/// element type is taken from that function's signature) and the
/// combiner's operator `red` (`RED_SUM`, ...): `cpnet/grid.cuh`'s
/// `reduce_grid`, compiled once per PE, type and operator, on first use.
pub(super) fn kernel(name: &str, op: &str, red: &str) -> String {
    format!(
        r#"#include <cpnet/grid.cuh>
typedef cpnet_detail::reduce_elem<decltype(&cpnet_{name}_{op}_reduce)>::type elem_t;

extern "C" __global__ void __launch_bounds__(CPNET_GRID_THREADS)
cpnet_reduce_grid(cpnet_handle_t h, int team, cpnet_reduce_grid_args_t a)
{{
    cpnet_detail::reduce_grid<elem_t, cpnet_detail::{red}>(&h, team, a);
    cpnet_detail::grid_exit((unsigned long long*)a.words);
}}
"#
    )
}

/// The combiner's name of `op` in team.cuh (`enum reduce_op`).
pub(super) fn red_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::And => "RED_AND",
        ReduceOp::Or => "RED_OR",
        ReduceOp::Xor => "RED_XOR",
        ReduceOp::Min => "RED_MIN",
        ReduceOp::Max => "RED_MAX",
        ReduceOp::Sum => "RED_SUM",
        ReduceOp::Prod => "RED_PROD",
    }
}

impl GpuPe {
    /// Whether [`GpuPe::team_reduce_on_stream`] of `bytes` (elements x
    /// their size) on `team` runs on a grid: at least [`GRID_MIN_BYTES`],
    /// peer-to-peer stores on and every other member's heap mapped here
    /// (else one block). The same answer on every member of a team whose
    /// members all run on one host with CUDA IPC. Local.
    pub fn team_reduce_on_stream_is_grid(&self, team: &Team, bytes: u64) -> bool {
        bytes >= GRID_MIN_BYTES && self.member_ptrs(team, SymAddr(0)).is_some()
    }

    /// The reduce to all on a grid, if it can run there
    /// ([`GpuPe::team_reduce_on_stream_is_grid`]):
    /// `Ok(true)` once launched, `Ok(false)` for the one-block form. The
    /// caller checked the ranges and the operator.
    pub(super) fn reduce_grid<T: ReduceType>(
        &self,
        team: &Team,
        op: ReduceOp,
        dest: SymAddr,
        source: SymAddr,
        nreduce: u64,
        stream: &CudaStream,
    ) -> Result<bool> {
        let bytes = nreduce.saturating_mul(T::SIZE as u64);
        if !self.team_reduce_on_stream_is_grid(team, bytes) {
            return Ok(false);
        }
        let (Some(src), Some(dst)) = (self.member_ptrs(team, source), self.member_ptrs(team, dest)) else { return Ok(false) };
        let d = team.desc();
        let key = format!("cpnet_reduce_grid:{}:{}", T::NAME, op.name());
        let f = self.on_stream_built(&key, "cpnet_reduce_grid", || kernel(T::NAME, op.name(), red_name(op)))?;
        let part = bytes.div_ceil(d.size.max(1) as u64);
        let blocks = part.div_ceil(GRID_BYTES_PER_BLOCK).clamp(1, u64::from(GRID_MAX_BLOCKS)) as u32;
        // SAFETY: kernel() declares cpnet_reduce_grid(cpnet_handle_t, int,
        // cpnet_reduce_grid_args_t), which GridArgs mirrors (asserted);
        // `dest` and `source` were checked inside the heap by the caller for
        // nreduce elements; the members' addresses are their heaps' IPC
        // mappings in this context (member_ptrs) plus the same offsets,
        // inside their heaps since every member's heap has this PE's size.
        unsafe {
            self.launch_grid(stream, &f, team, blocks, "cuLaunchKernel (grid reduce)", |words| GridArgs {
                dest: self.dev_ptr(dest),
                source: self.dev_ptr(source),
                n: nreduce,
                words,
                src,
                dst,
                my_idx: d.my_idx,
                size: d.size,
            })
        }?;
        Ok(true)
    }
}
