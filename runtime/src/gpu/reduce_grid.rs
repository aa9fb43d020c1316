//! The on-stream reduce to all of large arrays by a grid (issue 22): where
//! every other member of the team maps this PE's heap (peer-to-peer
//! stores on), [`GpuPe::team_reduce_on_stream`] of at least
//! [`GRID_MIN_BYTES`] launches up to [`GRID_MAX_BLOCKS`] blocks instead of
//! the one block of the other forms, which folds at what one SM loads.
//!
//! The algorithm is a reduce-scatter then an allgather, both in place over
//! NVLink or PCIe peer-to-peer, with no scratch: member `k` owns part `k`
//! of the array (`ceil(n / size)` elements rounded up to whole 16-byte
//! words, the last part shorter). Each of its blocks takes a run of that
//! part (whole words too), loads the run from every member's
//! `source` (its own locally, the others' through their mapped heaps),
//! folds them in team order (so every element has the bits the one-block
//! form gives it) and stores the result into every member's `dest`, in
//! 16-byte loads and stores where every buffer is 16-byte aligned (element
//! by element otherwise, and for the array's last partial word). Every
//! member's links then carry `2 (size - 1) / size` of the array each way,
//! a ring allreduce's traffic, without a ring's `2 (size - 1)` steps.
//!
//! Two team epochs order it, as `grid.rs` opens and closes a grid form:
//! an entry epoch (block 0 SETs and waits for every member's signal: every
//! member's `source` is written and its `dest` free; then it releases the
//! other blocks), the blocks' folds and stores, each block's fence and
//! count, and an exit epoch (no member still loads this PE's `source` or
//! stores into its `dest`).
//!
//! Every member takes the grid form or none: the choice depends on the
//! size, the team and the peer table, the same on every member (the heaps
//! are mapped both ways or not at all, as the device collectives assume).
//! A failure goes to the status block, as for the other forms:
//! [`GpuPe::synchronize`] reports it.

use cpnet_device::cpu::{ReduceOp, ReduceType, SymAddr};
use cudarc::driver::{CudaStream, DeviceRepr};

use super::GpuPe;
use super::grid::{GRID_MAX_MEMBERS, prelude};
use super::on_stream::ON_STREAM_THREADS;
use crate::error::Result;
use crate::team::Team;

/// Bytes of the array from which the reduce runs on a grid (where it can).
/// On two H200s (docs/results.md, "Session 21"), float sum on a stream:
/// the grid from 4 KiB took 28.0-28.5 µs at 4 KiB and 27.4-27.9 at 16 KiB
/// against the one block's 20.5-20.9 and 25.0-25.3; at 64 KiB both
/// 28.5-29.7.
pub const GRID_MIN_BYTES: u64 = 64 << 10;
/// Most blocks of the grid.
pub const GRID_MAX_BLOCKS: u32 = 128;
/// Bytes of this member's part per grid block: `ceil(part / this)` blocks,
/// at most [`GRID_MAX_BLOCKS`].
pub const GRID_BYTES_PER_BLOCK: u64 = 16 << 10;

/// `red_grid_args` of the kernel, field for field (no padding: eight-byte
/// fields, then two four-byte ones).
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

// SAFETY: repr(C), plain integers laid out as `struct red_grid_args` of
// kernel() (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for GridArgs {}

const _: () = assert!(size_of::<GridArgs>() == 8 * (4 + 2 * GRID_MAX_MEMBERS) + 8);

/// The kernel for the team.cuh reduction `cpnet_<name>_<op>_reduce` (its
/// element type is taken from that function's signature) and the
/// combiner's operator `red` (`RED_SUM`, ...): compiled once per PE, type
/// and operator, on first use.
pub(super) fn kernel(name: &str, op: &str, red: &str) -> String {
    format!(
        r#"#include <cpnet/device.cuh>
{prelude}
#define RED_GRID_MEMBERS {GRID_MAX_MEMBERS}
#define RED_GRID_UNROLL 8
#define RED_GRID_VEC_UNROLL 4
struct red_grid_args {{
    uint64_t dest, source, n, words;
    uint64_t src[RED_GRID_MEMBERS];
    uint64_t dst[RED_GRID_MEMBERS];
    int32_t my_idx, size;
}};
static_assert(sizeof(red_grid_args) == 8 * (4 + 2 * RED_GRID_MEMBERS) + 8, "red_grid_args: as GridArgs in reduce_grid.rs");

/* The element type of a team.cuh reduction. */
template <typename F> struct red_grid_elem;
template <typename T> struct red_grid_elem<int (*)(cpnet_ctx_t*, cpnet_team_t, T*, const T*, cpnet_size_t)> {{
    typedef T type;
}};
typedef red_grid_elem<decltype(&cpnet_{name}_{op}_reduce)>::type elem_t;

/* Words [0, nw) of type W (sizeof(W) / sizeof(elem_t) elements each) from
 * element `lo` on (whole block): each thread takes U words at a time
 * (w, w + nt, ...), loads them from every member's source together (U
 * loads in flight per member), folds in team order and stores the result
 * into every member's dest. */
template <typename W, int U>
__device__ __forceinline__ void red_grid_run(const red_grid_args& a, uint64_t lo, uint64_t nw)
{{
    constexpr int V = sizeof(W) / sizeof(elem_t);
    const uint64_t nt = blockDim.x;
    for (uint64_t w = threadIdx.x; w < nw; w += U * nt) {{
        elem_t acc[U][V];
        for (int j = 0; j < a.size; ++j) {{
            const W* sj = (const W*)((const elem_t*)a.src[j] + lo);
            W x[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (w + u * nt < nw) x[u] = sj[w + u * nt];
#pragma unroll
            for (int u = 0; u < U; ++u) {{
                if (w + u * nt >= nw) continue;
                elem_t e[V];
                memcpy(e, &x[u], sizeof(W));
#pragma unroll
                for (int k = 0; k < V; ++k)
                    acc[u][k] = j == 0 ? e[k] : cpnet_detail::combiner<elem_t, cpnet_detail::{red}>::apply(acc[u][k], e[k]);
            }}
        }}
        for (int k = 0; k < a.size; ++k) {{
            W* dj = (W*)((elem_t*)a.dst[(a.my_idx + k) % a.size] + lo);
#pragma unroll
            for (int u = 0; u < U; ++u) {{
                if (w + u * nt >= nw) continue;
                W v;
                memcpy(&v, acc[u], sizeof(W));
                dj[w + u * nt] = v;
            }}
        }}
    }}
}}

extern "C" __global__ void __launch_bounds__({ON_STREAM_THREADS})
cpnet_reduce_grid(cpnet_handle_t h, int team, red_grid_args a)
{{
    using namespace cpnet_detail;
    __shared__ grid_state st;
    unsigned long long* words = (unsigned long long*)a.words;
    /* Entry and exit epochs (grid.rs): loads of every member's source. */
    if (!grid_open(&h, team, a.my_idx, a.size, words, 2, true, &st)) return;
    /* This member's part, and this block's run of it: whole 16-byte words
     * (V elements) where every buffer is 16-byte aligned, so that a run
     * moves in uint4 loads and stores; only the array's last run ends in a
     * partial word. */
    constexpr uint64_t V = sizeof(elem_t) < 16 ? 16 / sizeof(elem_t) : 1;
    uint64_t any = a.dest | a.source;
    for (int j = 0; j < a.size; ++j) any |= a.src[j] | a.dst[j];
    const uint64_t q = (any & 15) == 0 ? V : 1;
    const uint64_t part = ((a.n + (uint64_t)a.size - 1) / (uint64_t)a.size + q - 1) / q * q;
    const uint64_t plo = (uint64_t)a.my_idx * part < a.n ? (uint64_t)a.my_idx * part : a.n;
    const uint64_t phi = plo + part < a.n ? plo + part : a.n;
    const uint64_t per = ((phi - plo + gridDim.x - 1) / gridDim.x + q - 1) / q * q;
    const uint64_t lo = plo + blockIdx.x * per < phi ? plo + blockIdx.x * per : phi;
    const uint64_t hi = lo + per < phi ? lo + per : phi;
    /* Whole 16-byte words, U of them per thread in flight from each
     * member; then element by element (the unaligned case, and the array's
     * last partial word). */
    const uint64_t nw = q == V && V > 1 ? (hi - lo) / V : 0;
    if (nw > 0) red_grid_run<uint4, RED_GRID_VEC_UNROLL>(a, lo, nw);
    red_grid_run<elem_t, RED_GRID_UNROLL>(a, lo + nw * V, hi - lo - nw * V);
    grid_close(&h, words, st.epoch + 1, &st);
}}
"#,
        prelude = prelude()
    )
}

/// The combiner's name of `op` in team.cuh (`enum reduce_op`).
fn red_name(op: ReduceOp) -> &'static str {
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
        // red_grid_args), which GridArgs mirrors (asserted on both sides);
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
