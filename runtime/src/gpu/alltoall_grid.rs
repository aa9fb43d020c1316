//! The on-stream alltoall of large blocks by a grid (issue 22): where
//! every other member of the team maps this PE's heap (peer-to-peer stores
//! on), [`GpuPe::team_alltoall_on_stream`] of at least [`GRID_MIN_BYTES`]
//! per pair launches up to [`GRID_MAX_BLOCKS`] blocks of
//! `CPNET_GRID_THREADS` threads that store the pairs' blocks straight
//! into the peers' heaps, [`GRID_PIECE_BYTES`] at a time. One block (the
//! other forms') is bounded by what one SM stores: 43 GB/s at 4 MiB per
//! pair on two H200s against NCCL's 99 GB/s (docs/results.md, "Session
//! 19"); the grid with pieces, 298-306 GB/s at 64 MiB against NCCL's
//! 256-260 ("Session 22").
//!
//! The protocol is `cpnet_alltoallmem`'s (team.cuh, `team_blocks_to_all`),
//! with the data stores spread over the grid and the grid's opening and
//! closing of `cpnet/grid.cuh` (one epoch `e`, no entry: only stores):
//!
//! 1. block 0 opens a context and takes the team's next epoch `e`;
//! 2. the blocks take pieces of [`GRID_PIECE_BYTES`] from a counter of the
//!    launch (the third of its words) until none is left, piece `k` being
//!    pair `(my_idx + k) mod size` at `k / size` pieces into it, and copy
//!    each into member `j`'s `dest` at `my_idx x nbytes`, the own pair by
//!    a local copy (so the local copy and the stores to each member
//!    interleave, and a block whose stores go slower takes fewer pieces);
//!    then `fence.sc.sys` and a count in `done`;
//! 3. block 0 waits for the count, SETs `SIG[my_idx] = e` at every other
//!    member (after every block's fence: the data is visible first), waits
//!    for every member's `SIG[j] >= e`, and closes its context (a quiet).
//!
//! A member on the grid form and one on the one-block form (which puts
//! with the same signal) pair up.

use cpnet_device::cpu::SymAddr;
use cudarc::driver::{CudaStream, DeviceRepr};

use super::GpuPe;
use super::grid::GRID_MAX_MEMBERS;
use crate::error::Result;
use crate::team::Team;

/// Bytes per pair from which the alltoall runs on a grid (where it can).
pub const GRID_MIN_BYTES: u64 = 512 << 10;
/// Most blocks of the grid. 128 against 64 on two H200s (e7, same call):
/// 16 MiB per pair 108 / 98 µs against 111 / 106, 64 MiB 363 / 369 against
/// 380 / 390.
pub const GRID_MAX_BLOCKS: u32 = 128;
/// Bytes per pair per grid block: `ceil(nbytes / this)` blocks, at most
/// [`GRID_MAX_BLOCKS`] (they share the pieces of every pair).
pub const GRID_BYTES_PER_BLOCK: u64 = 64 << 10;
/// Bytes a grid block takes at a time: blocks take the next piece of the
/// pairs (in the order own pair, the next member's, ...) from a counter of
/// the launch until none is left, so that a block slowed by its links
/// leaves its share to the others.
pub const GRID_PIECE_BYTES: u64 = 32 << 10;

/// `a2a_grid_args` of the kernel, field for field (no padding: eight-byte
/// fields, then two four-byte ones).
#[repr(C)]
#[derive(Clone, Copy)]
struct GridArgs {
    dest: u64,
    source: u64,
    nbytes: u64,
    /// The launch's words (cpnet/grid.cuh: `go`, `done`; then the pieces'
    /// counter).
    words: u64,
    /// Member j's `dest` as mapped in this process (this PE's own: `dest`).
    dst: [u64; GRID_MAX_MEMBERS],
    my_idx: i32,
    size: i32,
}

// SAFETY: repr(C), plain integers laid out as `struct a2a_grid_args` of
// kernel() (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for GridArgs {}

const _: () = assert!(size_of::<GridArgs>() == 8 * (4 + GRID_MAX_MEMBERS) + 8);

/// The kernel (compiled once per PE, on first use).
pub(super) fn kernel() -> String {
    format!(
        r#"#include <cpnet/grid.cuh>
#define A2A_GRID_MEMBERS {GRID_MAX_MEMBERS}
struct a2a_grid_args {{
    uint64_t dest, source, nbytes, words;
    uint64_t dst[A2A_GRID_MEMBERS];
    int32_t my_idx, size;
}};
static_assert(sizeof(a2a_grid_args) == 8 * (4 + A2A_GRID_MEMBERS) + 8, "a2a_grid_args: as GridArgs in alltoall_grid.rs");

__device__ __forceinline__ void a2a_grid_body(cpnet_handle_t& h, int team, const a2a_grid_args& a)
{{
    using namespace cpnet_detail;
    __shared__ grid_state st;
    unsigned long long* words = (unsigned long long*)a.words;
    /* Stores only: one epoch, no entry (grid.cuh). Loading part of each
     * pair from its sender instead (an entry epoch first) was slower on two
     * H200s (session 21: 16 MiB per pair 99-108 µs against 88-91). */
    if (!grid_open(&h, team, a.my_idx, a.size, words, 1, false, &st)) return;
    /* Pieces of {GRID_PIECE_BYTES} bytes (a 16-byte multiple), taken from
     * the launch's counter words[2] until none is left: piece k is pair
     * (my_idx + k) mod size, at (k / size) pieces into it, so that the own
     * pair's local copy and the stores to every member interleave, and a
     * block whose stores go slower takes fewer pieces. */
    __shared__ unsigned long long piece;
    const uint64_t P = {GRID_PIECE_BYTES}ull;
    const uint64_t per_pair = (a.nbytes + P - 1) / P;
    const uint64_t pieces = per_pair * (uint64_t)a.size;
    const uint64_t me = (uint64_t)a.my_idx * a.nbytes;
    for (;;) {{
        /* Relaxed: the counter only deals out the pieces (no data is
         * published through it; grid_close's fence and count order the
         * stores). */
        if (threadIdx.x == 0) piece = atomicAdd(&words[2], 1ull);
        __syncthreads();
        const uint64_t k = piece;
        __syncthreads(); /* every thread read it before the next take */
        if (k >= pieces) break;
        const int j = (int)((a.my_idx + k % (uint64_t)a.size) % (uint64_t)a.size);
        const uint64_t lo = (k / (uint64_t)a.size) * P;
        const uint64_t hi = lo + P < a.nbytes ? lo + P : a.nbytes;
        block_copy((uint8_t*)a.dst[j] + me + lo, (const uint8_t*)a.source + (uint64_t)j * a.nbytes + lo, hi - lo);
    }}
    grid_close(&h, words, st.epoch, &st);
}}

extern "C" __global__ void __launch_bounds__(CPNET_GRID_THREADS)
cpnet_alltoall_grid(cpnet_handle_t h, int team, a2a_grid_args a)
{{
    a2a_grid_body(h, team, a);
    cpnet_detail::grid_exit((unsigned long long*)a.words);
}}
"#
    )
}

impl GpuPe {
    /// The alltoall on a grid, if it can run there (at least
    /// [`GRID_MIN_BYTES`] per pair, [`GpuPe::member_ptrs`]): `Ok(true)`
    /// once launched, `Ok(false)` for the one-block form.
    pub(super) fn alltoall_grid(&self, team: &Team, dest: SymAddr, source: SymAddr, nbytes: u64, stream: &CudaStream) -> Result<bool> {
        if nbytes < GRID_MIN_BYTES {
            return Ok(false);
        }
        let Some(dst) = self.member_ptrs(team, dest) else { return Ok(false) };
        let f = self.on_stream_built("cpnet_alltoall_grid", "cpnet_alltoall_grid", kernel)?;
        let blocks = nbytes.div_ceil(GRID_BYTES_PER_BLOCK).clamp(1, u64::from(GRID_MAX_BLOCKS)) as u32;
        let d = team.desc();
        // SAFETY: kernel() declares cpnet_alltoall_grid(cpnet_handle_t,
        // int, a2a_grid_args), which GridArgs mirrors (asserted on both
        // sides); `dest` and `source` were checked inside the heap by the
        // caller for n_pes x nbytes; the members' addresses are their heaps'
        // IPC mappings in this context (member_ptrs) plus the same offset,
        // inside their heaps since every member's heap has this PE's size.
        unsafe {
            self.launch_grid(stream, &f, team, blocks, "cuLaunchKernel (grid alltoall)", |words| GridArgs {
                dest: self.dev_ptr(dest),
                source: self.dev_ptr(source),
                nbytes,
                words,
                dst,
                my_idx: d.my_idx,
                size: d.size,
            })
        }?;
        Ok(true)
    }
}
