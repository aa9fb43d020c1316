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
//! Two team epochs order it (team.cuh's signals, SET with st.release.sys):
//!
//! 1. entry: block 0 opens a context, takes epochs `e` and `e + 1`, SETs
//!    `SIG[my_idx] = e` at every other member and waits for every member's
//!    `SIG[j] >= e`: every member's `source` is written (stream order on
//!    its side) and its `dest` is free. It then releases the grid's other
//!    blocks through `go` (device memory of this launch, zeroed before it;
//!    `2`: block 0 failed, leave);
//! 2. the blocks fold and store their runs, `fence.sc.sys`, and count
//!    themselves in `done`;
//! 3. exit: block 0 waits for the count, SETs `SIG[my_idx] = e + 1` at
//!    every other member (after every block's fence: the stores are seen
//!    first) and waits for every member's `SIG[j] >= e + 1`: no member
//!    still loads this PE's `source` or stores into its `dest`. Then it
//!    closes its context (a quiet).
//!
//! Every member takes the grid form or none: the choice depends on the
//! size, the team and the peer table, the same on every member (the heaps
//! are mapped both ways or not at all, as the device collectives assume).
//! A failure goes to the status block, as for the other forms:
//! [`GpuPe::synchronize`] reports it.

use cpnet_device::cpu::{ReduceOp, ReduceType, SymAddr};
use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};

use super::GpuPe;
use super::alltoall_grid::GRID_MAX_MEMBERS;
use super::on_stream::ON_STREAM_THREADS;
use crate::error::{GpuError, Result};
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
fn kernel(name: &str, op: &str, red: &str) -> String {
    format!(
        r#"#include <cpnet/device.cuh>
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

/* Report `e` through the status block (thread 0), with or without a context. */
__device__ void red_grid_fail(cpnet_handle_t* h, cpnet_ctx_t* ctx, int e)
{{
    if (threadIdx.x != 0) return;
    cpnet_ctx_t bare = {{}};
    bare.status = (cpnet_status_t*)h->status;
    cpnet_detail::report_dev_error(ctx != nullptr ? ctx : &bare, e, h->my_pe, 0, 0, 0, CPNET_CMP_EQ);
}}

/* Block 0, whole block: SIG[my_idx] = e at every other member, then wait
 * for every member's SIG[j] >= e (team_wait_all). */
__device__ int red_grid_epoch(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t e)
{{
    using namespace cpnet_detail;
    const int r = collective(ctx, [&]() -> int {{
        for (int k = 1; k < d.size; ++k) {{
            const int j = (d.my_idx + k) % d.size;
            const int s = team_signal_leader(ctx, team_sig(ctx, d, d.my_idx), e, team_world_pe(d, j));
            if (s != CPNET_E_OK) return s;
        }}
        return CPNET_E_OK;
    }});
    return r != CPNET_E_OK ? r : team_wait_all(ctx, d, e);
}}

extern "C" __global__ void __launch_bounds__({ON_STREAM_THREADS})
cpnet_reduce_grid(cpnet_handle_t h, int team, red_grid_args a)
{{
    using namespace cpnet_detail;
    __shared__ cpnet_ctx_t ctx;
    __shared__ cpnet_team_desc_t d;
    __shared__ uint64_t epoch;
    __shared__ int go_seen;
    unsigned long long* go = (unsigned long long*)a.words;
    unsigned long long* done = go + 1;
    const bool lead = blockIdx.x == 0;
    if (lead) {{
        int e = cpnet_ctx_create(&h, &ctx);
        if (e != CPNET_E_OK) {{
            red_grid_fail(&h, nullptr, e);
            if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)go, 2);
            return;
        }}
        if (threadIdx.x == 0) {{
            cpnet_team_desc_t t;
            e = team_get(&ctx, team, &t);
            if (e == CPNET_E_OK && (t.my_idx != a.my_idx || t.size != a.size)) e = CPNET_E_BAD_TEAM;
            d = t;
            ctx.ret = e;
            if (e == CPNET_E_OK) {{
                epoch = team_next_leader(&ctx, t, false) >> 1;
                (void)team_next_leader(&ctx, t, false); /* epoch + 1: the exit */
            }}
        }}
        __syncthreads();
        e = ctx.ret;
        if (e == CPNET_E_OK) e = red_grid_epoch(&ctx, d, epoch);
        /* Release: what block 0 acquired from the members' signals, before
         * the others' loads of their sources; pairs with the acquire below. */
        if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)go, e == CPNET_E_OK ? 1 : 2);
        if (e != CPNET_E_OK) {{
            red_grid_fail(&h, &ctx, e);
            cpnet_ctx_destroy(&ctx);
            return;
        }}
    }} else {{
        if (threadIdx.x == 0) {{
            unsigned polls = 0;
            unsigned long long v;
            while ((v = cpnet_ld_acquire_sys_u64((const uint64_t*)go)) == 0) {{
                if ((++polls & 1023) == 0 && cpnet_abort_code(&h) != CPNET_E_OK) break;
            }}
            go_seen = (int)v;
        }}
        __syncthreads();
        if (go_seen != 1) return;
    }}
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
    const uint64_t nt = blockDim.x;
    uint64_t i0 = lo;
    if (q == V && V > 1) {{
        /* Whole words: U of them per thread in flight from each member. */
        const int U = RED_GRID_VEC_UNROLL;
        const uint64_t words = (hi - lo) / V;
        for (uint64_t w = threadIdx.x; w < words; w += U * nt) {{
            elem_t acc[U][V];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (w + u * nt < words) {{
                    const uint4 v = ((const uint4*)((const elem_t*)a.src[0] + lo))[w + u * nt];
                    memcpy(acc[u], &v, 16);
                }}
            for (int j = 1; j < a.size; ++j) {{
                const uint4* sj = (const uint4*)((const elem_t*)a.src[j] + lo);
                uint4 x[U];
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (w + u * nt < words) x[u] = sj[w + u * nt];
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (w + u * nt < words) {{
                        elem_t e[V];
                        memcpy(e, &x[u], 16);
#pragma unroll
                        for (uint64_t k = 0; k < V; ++k) acc[u][k] = combiner<elem_t, {red}>::apply(acc[u][k], e[k]);
                    }}
            }}
            for (int k = 0; k < a.size; ++k) {{
                uint4* dj = (uint4*)((elem_t*)a.dst[(a.my_idx + k) % a.size] + lo);
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (w + u * nt < words) {{
                        uint4 v;
                        memcpy(&v, acc[u], 16);
                        dj[w + u * nt] = v;
                    }}
            }}
        }}
        i0 = lo + words * V;
    }}
    /* Element by element: the unaligned case, and the array's last partial word. */
    const int U = RED_GRID_UNROLL;
    for (uint64_t i = i0 + threadIdx.x; i < hi; i += U * nt) {{
        elem_t acc[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * nt < hi) acc[u] = ((const elem_t*)a.src[0])[i + u * nt];
        for (int j = 1; j < a.size; ++j) {{
            const elem_t* sj = (const elem_t*)a.src[j];
            elem_t x[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i + u * nt < hi) x[u] = sj[i + u * nt];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i + u * nt < hi) acc[u] = combiner<elem_t, {red}>::apply(acc[u], x[u]);
        }}
        for (int k = 0; k < a.size; ++k) {{
            elem_t* dj = (elem_t*)a.dst[(a.my_idx + k) % a.size];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i + u * nt < hi) dj[i + u * nt] = acc[u];
        }}
    }}
    __syncthreads();
    if (threadIdx.x == 0) {{
        /* Every thread's stores of this block, then the count (block 0's
         * acquire below pairs with it). */
        __threadfence_system();
        if (!lead) atomicAdd(done, 1ull);
    }}
    if (!lead) return;
    if (threadIdx.x == 0) {{
        unsigned polls = 0;
        ctx.ret = CPNET_E_OK;
        while (cpnet_ld_acquire_sys_u64((const uint64_t*)done) < (unsigned long long)(gridDim.x - 1)) {{
            if ((++polls & 1023) == 0) {{
                const int ab = cpnet_abort_code(&h);
                if (ab != CPNET_E_OK) {{ ctx.ret = ab; break; }}
            }}
        }}
    }}
    __syncthreads();
    int r = ctx.ret;
    if (r == CPNET_E_OK) r = red_grid_epoch(&ctx, d, epoch + 1);
    if (r != CPNET_E_OK) red_grid_fail(&h, &ctx, r);
    cpnet_ctx_destroy(&ctx);
}}
"#
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
    /// The reduce to all on a grid, if it can run there (at least
    /// [`GRID_MIN_BYTES`], [`GpuPe::member_ptrs`] for both buffers):
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
        if bytes < GRID_MIN_BYTES {
            return Ok(false);
        }
        let (Some(src), Some(dst)) = (self.member_ptrs(team, source), self.member_ptrs(team, dest)) else { return Ok(false) };
        let d = team.desc();
        let key = format!("cpnet_reduce_grid:{}:{}", T::NAME, op.name());
        let f = self.on_stream_built_fn(&key, "cpnet_reduce_grid", || kernel(T::NAME, op.name(), red_name(op)))?;
        let part = bytes.div_ceil(d.size.max(1) as u64);
        let blocks = part.div_ceil(GRID_BYTES_PER_BLOCK).clamp(1, u64::from(GRID_MAX_BLOCKS)) as u32;
        let (h, t) = (self.handle(), team.id());
        self.launch_with_words(stream, 2, |words| {
            let args = GridArgs { dest: self.dev_ptr(dest), source: self.dev_ptr(source), n: nreduce, words, src, dst, my_idx: d.my_idx, size: d.size };
            let mut b = stream.launch_builder(&f);
            b.arg(&h).arg(&t).arg(&args);
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (ON_STREAM_THREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the arguments match cpnet_reduce_grid(cpnet_handle_t,
            // int, red_grid_args) (GridArgs mirrors the struct, asserted on
            // both sides); `dest` and `source` were checked inside the heap
            // by the caller for nreduce elements; the members' addresses are
            // their heaps' IPC mappings in this context (member_ptrs) plus
            // the same offsets, inside their heaps since every member's heap
            // has this PE's size; `words` lives until its stream-ordered free
            // after the kernel (launch_with_words).
            unsafe { b.launch(cfg) }.map_err(|source| GpuError::Cuda { what: "cuLaunchKernel (grid reduce)", source })?;
            Ok(())
        })?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use cpnet_device::nvrtc::{self, BuildOptions};

    /// The grid reduce's kernel compiles warning-free for every kind of
    /// element (integer, float, double, half, bfloat16) and a bitwise,
    /// an ordering and an arithmetic operator.
    #[test]
    fn reduce_grid_kernels_compile() {
        if !nvrtc::is_available() {
            assert_ne!(std::env::var("CPNET_REQUIRE_NVRTC").as_deref(), Ok("1"), "CPNET_REQUIRE_NVRTC=1 but libnvrtc was not found");
            eprintln!("SKIPPED reduce_grid_kernels_compile: libnvrtc not found (source scripts/nvrtc-env.sh)");
            return;
        }
        for (name, op, red) in [
            ("float", "sum", "RED_SUM"),
            ("double", "min", "RED_MIN"),
            ("int32", "xor", "RED_XOR"),
            ("uint64", "prod", "RED_PROD"),
            ("half", "max", "RED_MAX"),
            ("bfloat16", "sum", "RED_SUM"),
        ] {
            let opts = BuildOptions { name: "cpnet_reduce_grid.cu".into(), ..BuildOptions::default() };
            let out = nvrtc::compile(&super::kernel(name, op, red), &opts)
                .unwrap_or_else(|e| panic!("{name} {op}: {e}\n{}", e.log().unwrap_or_default()));
            assert!(out.log.trim().is_empty(), "{name} {op}: NVRTC warnings:\n{}", out.log);
            assert!(out.ptx.contains(".entry cpnet_reduce_grid("), "{name} {op}: no entry in the PTX");
        }
    }
}
