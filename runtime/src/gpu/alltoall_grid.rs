//! The on-stream alltoall of large blocks by a grid (issue 22): where
//! every other member of the team maps this PE's heap (peer-to-peer stores
//! on), [`GpuPe::team_alltoall_on_stream`] of at least [`GRID_MIN_BYTES`]
//! per pair launches up to [`GRID_MAX_BLOCKS`] blocks that store the pairs'
//! blocks straight into the peers' heaps, each block its own slice of every
//! pair. One block of [`ON_STREAM_THREADS`] threads (the other forms') is
//! bounded by what one SM stores: 43 GB/s at 4 MiB per pair on two H200s
//! against NCCL's 99 GB/s (docs/results.md, "Session 19").
//!
//! The protocol is `cpnet_alltoallmem`'s (team.cuh, `team_blocks_to_all`),
//! with the data stores spread over the grid:
//!
//! 1. block 0 opens a context and takes the team's next epoch `e` (the
//!    same on every member: every member enters the team's collectives in
//!    the same order);
//! 2. every block copies its slice of every pair (`nbytes` cut into
//!    16-byte multiples, one run per block) into member `j`'s `dest` at
//!    `my_idx x nbytes`, its own pair by a local copy, block `b` starting
//!    with the pair `b mod size` places after its own (so the local copy
//!    and the stores to each member run at once); then `fence.sc.sys`
//!    and, except block 0, a count in `done` (device memory of this launch,
//!    zeroed before it);
//! 3. block 0 waits for the count to reach `blocks - 1` (acquire), then
//!    SETs `SIG[my_idx] = e` at every other member with a system-scope
//!    release store (after every block's fence: the data is visible first),
//!    waits for every member's `SIG[j] >= e`, and closes its context (a
//!    quiet).
//!
//! A failure (no queue for block 0's context, a wait past
//! `CPNET_WAIT_TIMEOUT`, the job aborting) goes to the status block, as for
//! the other forms: [`GpuPe::synchronize`] reports it.

use cpnet_device::cpu::SymAddr;
use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, result};

use super::GpuPe;
use super::on_stream::ON_STREAM_THREADS;
use crate::error::{GpuError, Result};
use crate::team::Team;

/// Bytes per pair from which the alltoall runs on a grid (where it can).
pub const GRID_MIN_BYTES: u64 = 512 << 10;
/// Most blocks of the grid. 128 against 64 on two H200s (e7, same call):
/// 16 MiB per pair 108 / 98 µs against 111 / 106, 64 MiB 363 / 369 against
/// 380 / 390.
pub const GRID_MAX_BLOCKS: u32 = 128;
/// Bytes of each pair's block per grid block: `ceil(nbytes / this)` blocks,
/// at most [`GRID_MAX_BLOCKS`].
pub const GRID_BYTES_PER_BLOCK: u64 = 64 << 10;
/// Most team members the grid form takes (its kernel argument holds one
/// peer address per member).
pub const GRID_MAX_MEMBERS: usize = 32;

/// `a2a_grid_args` of the kernel, field for field (no padding: eight-byte
/// fields, then two four-byte ones).
#[repr(C)]
#[derive(Clone, Copy)]
struct GridArgs {
    dest: u64,
    source: u64,
    nbytes: u64,
    done: u64,
    /// Member j's `dest` as mapped in this process (this PE's own: `dest`).
    peers: [u64; GRID_MAX_MEMBERS],
    my_idx: i32,
    size: i32,
}

// SAFETY: repr(C), plain integers laid out as `struct a2a_grid_args` of
// KERNEL (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for GridArgs {}

const _: () = assert!(size_of::<GridArgs>() == 8 * (4 + GRID_MAX_MEMBERS) + 8);

/// The kernel (compiled once per PE, on first use).
pub(super) fn kernel() -> String {
    format!(
        r#"#include <cpnet/device.cuh>
#define A2A_GRID_MEMBERS {GRID_MAX_MEMBERS}
struct a2a_grid_args {{
    uint64_t dest, source, nbytes, done;
    uint64_t peers[A2A_GRID_MEMBERS];
    int32_t my_idx, size;
}};
static_assert(sizeof(a2a_grid_args) == 8 * (4 + A2A_GRID_MEMBERS) + 8, "a2a_grid_args: as GridArgs in alltoall_grid.rs");

/* Report `e` through the status block (block 0's leader), with or without a context. */
__device__ void a2a_grid_fail(cpnet_handle_t* h, cpnet_ctx_t* ctx, int e)
{{
    if (threadIdx.x != 0) return;
    cpnet_ctx_t bare = {{}};
    bare.status = (cpnet_status_t*)h->status;
    cpnet_detail::report_dev_error(ctx != nullptr ? ctx : &bare, e, h->my_pe, 0, 0, 0, CPNET_CMP_EQ);
}}

extern "C" __global__ void __launch_bounds__({ON_STREAM_THREADS})
cpnet_alltoall_grid(cpnet_handle_t h, int team, a2a_grid_args a)
{{
    using namespace cpnet_detail;
    __shared__ cpnet_ctx_t ctx;
    __shared__ cpnet_team_desc_t d;
    __shared__ uint64_t epoch;
    const bool lead = blockIdx.x == 0;
    if (lead) {{
        int e = cpnet_ctx_create(&h, &ctx);
        if (e != CPNET_E_OK) {{
            a2a_grid_fail(&h, nullptr, e);
            return;
        }}
        if (threadIdx.x == 0) {{
            cpnet_team_desc_t t;
            e = team_get(&ctx, team, &t);
            if (e == CPNET_E_OK && (t.my_idx != a.my_idx || t.size != a.size)) e = CPNET_E_BAD_TEAM;
            d = t;
            ctx.ret = e;
            if (e == CPNET_E_OK) epoch = team_next_leader(&ctx, t, false) >> 1;
        }}
        __syncthreads();
        if (ctx.ret != CPNET_E_OK) {{
            a2a_grid_fail(&h, &ctx, ctx.ret);
            cpnet_ctx_destroy(&ctx);
            return;
        }}
    }}
    /* This block's run of every pair's nbytes: 16-byte multiples. */
    const uint64_t per = ((a.nbytes + gridDim.x - 1) / gridDim.x + 15) & ~(uint64_t)15;
    const uint64_t lo = blockIdx.x * per < a.nbytes ? blockIdx.x * per : a.nbytes;
    const uint64_t hi = lo + per < a.nbytes ? lo + per : a.nbytes;
    /* Block b starts at pair b mod size: at any moment the grid copies
     * its own pair and stores to every other member at once, instead of
     * every block copying the local pair first and then all storing to the
     * same member (session 21: 16 MiB per pair took local + remote time). */
    for (int k = 0; k < a.size && lo < hi; ++k) {{
        const int j = (a.my_idx + k + (int)(blockIdx.x % (unsigned)a.size)) % a.size;
        uint8_t* to = (uint8_t*)a.peers[j] + (uint64_t)a.my_idx * a.nbytes + lo;
        const uint8_t* from = (const uint8_t*)a.source + (uint64_t)j * a.nbytes + lo;
        block_copy(to, from, hi - lo);
    }}
    __syncthreads();
    unsigned long long* done = (unsigned long long*)a.done;
    if (threadIdx.x == 0) {{
        /* Every thread's stores of this block, then the count (block 0's
         * acquire below pairs with it) or, in block 0, the signals. */
        __threadfence_system();
        if (!lead) atomicAdd(done, 1ull);
    }}
    if (!lead) return;
    if (threadIdx.x == 0) {{
        unsigned polls = 0;
        unsigned long long v;
        while ((v = cpnet_ld_acquire_sys_u64((const uint64_t*)done)) < (unsigned long long)(gridDim.x - 1)) {{
            if ((++polls & 1023) == 0) {{
                const int ab = cpnet_abort_code(&h);
                if (ab != CPNET_E_OK) {{ ctx.ret = ab; break; }}
            }}
        }}
        if (v >= (unsigned long long)(gridDim.x - 1)) ctx.ret = CPNET_E_OK;
    }}
    __syncthreads();
    int r = ctx.ret;
    if (r == CPNET_E_OK)
        r = collective(&ctx, [&]() -> int {{
            for (int k = 1; k < d.size; ++k) {{
                const int j = (d.my_idx + k) % d.size;
                const int s = team_signal_leader(&ctx, team_sig(&ctx, d, d.my_idx), epoch, team_world_pe(d, j));
                if (s != CPNET_E_OK) return s;
            }}
            return CPNET_E_OK;
        }});
    if (r == CPNET_E_OK) r = team_wait_all(&ctx, d, epoch);
    if (r != CPNET_E_OK) a2a_grid_fail(&h, &ctx, r);
    cpnet_ctx_destroy(&ctx);
}}
"#
    )
}

impl GpuPe {
    /// `addr` as this process maps it in every member of `team` (its own:
    /// `dev_ptr(addr)`), where a grid form can run on `team`: peer-to-peer
    /// stores on, every other member's heap mapped here, at most
    /// [`GRID_MAX_MEMBERS`] members. Shared with the grid reduce
    /// (`reduce_grid.rs`).
    pub(super) fn member_ptrs(&self, team: &Team, addr: SymAddr) -> Option<[u64; GRID_MAX_MEMBERS]> {
        let d = team.desc();
        let size = usize::try_from(d.size).ok()?;
        if self.p2p.is_none() || size > GRID_MAX_MEMBERS || d.my_idx < 0 {
            return None;
        }
        let mut ptrs = [0u64; GRID_MAX_MEMBERS];
        for (j, p) in ptrs.iter_mut().enumerate().take(size) {
            *p = if j as i32 == d.my_idx {
                self.dev_ptr(addr)
            } else {
                self.peers.bases.get((d.start + j as i32 * d.stride) as usize).copied().flatten()? + addr.0
            };
        }
        Some(ptrs)
    }

    /// Launch a grid form: `words` 8-byte words of device memory for this
    /// launch alone, zeroed, are allocated on `stream` before `launch(ptr)`
    /// and freed after it in stream order (so launches on other streams
    /// never share them).
    ///
    /// # Errors
    /// The CUDA calls, and `launch`'s.
    pub(super) fn launch_with_words(
        &self,
        stream: &CudaStream,
        words: usize,
        launch: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        self.bind()?;
        let cu = stream.cu_stream();
        let cuda = |call: &'static str| move |source| GpuError::Cuda { what: call, source };
        let bytes = 8 * words.max(1);
        // SAFETY: `cu` is the caller's live stream of this PE's context
        // (bound above); `bytes` allocated here, zeroed and freed below.
        let mem = unsafe { result::malloc_async(cu, bytes) }.map_err(cuda("cuMemAllocAsync (a grid form's words)"))?;
        // SAFETY: `mem` is the allocation above, `bytes` long, ordered on `cu`.
        if let Err(e) = unsafe { result::memset_d8_async(mem, 0, bytes, cu) } {
            // SAFETY: `mem` came from malloc_async on `cu` and nothing uses it.
            let _ = unsafe { result::free_async(mem, cu) };
            return Err(cuda("cuMemsetD8Async (a grid form's words)")(e).into());
        }
        let launched = launch(mem);
        // SAFETY: `mem` came from malloc_async on `cu`; the free is ordered
        // after the kernel (or after the memset if the launch failed).
        unsafe { result::free_async(mem, cu) }.map_err(cuda("cuMemFreeAsync (a grid form's words)"))?;
        launched
    }

    /// The alltoall on a grid, if it can run there (at least
    /// [`GRID_MIN_BYTES`] per pair, [`GpuPe::member_ptrs`]): `Ok(true)`
    /// once launched, `Ok(false)` for the one-block form.
    pub(super) fn alltoall_grid(&self, team: &Team, dest: SymAddr, source: SymAddr, nbytes: u64, stream: &CudaStream) -> Result<bool> {
        if nbytes < GRID_MIN_BYTES {
            return Ok(false);
        }
        let Some(peers) = self.member_ptrs(team, dest) else { return Ok(false) };
        let f = self.on_stream_function("cpnet_alltoall_grid", &kernel())?;
        let blocks = nbytes.div_ceil(GRID_BYTES_PER_BLOCK).clamp(1, u64::from(GRID_MAX_BLOCKS)) as u32;
        let d = team.desc();
        let (h, t) = (self.handle(), team.id());
        self.launch_with_words(stream, 1, |done| {
            let args = GridArgs { dest: self.dev_ptr(dest), source: self.dev_ptr(source), nbytes, done, peers, my_idx: d.my_idx, size: d.size };
            let mut b = stream.launch_builder(&f);
            b.arg(&h).arg(&t).arg(&args);
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (ON_STREAM_THREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the arguments match cpnet_alltoall_grid(cpnet_handle_t,
            // int, a2a_grid_args) (GridArgs mirrors the struct, asserted on
            // both sides); `dest` and `source` were checked inside the heap
            // by the caller for n_pes x nbytes; the peers' addresses are
            // their heaps' IPC mappings in this context (member_ptrs) plus
            // the same offset, inside their heaps since every member's heap
            // has this PE's size; `done` lives until its stream-ordered free
            // after the kernel (launch_with_words).
            unsafe { b.launch(cfg) }.map_err(|source| GpuError::Cuda { what: "cuLaunchKernel (grid alltoall)", source })?;
            Ok(())
        })?;
        Ok(true)
    }
}
