//! What the grid forms of the on-stream collectives share (issue 22;
//! `alltoall_grid.rs`, `reduce_grid.rs`): the members' mapped addresses,
//! a launch with words of device memory of its own, and the device code
//! that opens and closes a grid collective.
//!
//! # The protocol (device side, [`prelude`])
//!
//! A grid form runs one collective of `team` on many blocks of one launch.
//! Block 0 speaks for the PE: it opens a context, checks the team and
//! takes the team's next epochs (the same on every member: every member
//! enters the team's collectives in the same order). The other blocks only
//! move data. Two words of device memory of this launch, zeroed before it,
//! join them:
//!
//! - `words[0]`, `go`: with an entry epoch (a form that loads the other
//!   members' buffers), block 0 SETs `SIG[my_idx] = e` at every other
//!   member, waits for every member's `SIG[j] >= e` (their sources are
//!   written, their destinations free), then stores `1` with a release the
//!   other blocks acquire before they start; `2` if it failed, and they
//!   leave. Without one, the blocks start at once.
//! - `words[1]`, `done`: each block fences its stores (`fence.sc.sys`) and
//!   counts itself; block 0 waits for the count, then runs the exit epoch
//!   (SET and wait, as above): the data is visible before the signals,
//!   and after it no member still touches this PE's buffers. It closes its
//!   context (a quiet).
//!
//! Signals are SET with `st.release.sys` on the peer path (team.cuh's
//! team_signal_leader) and polled with acquire loads (team_wait_all). A
//! failure goes to the status block: [`GpuPe::synchronize`] reports it.

use cpnet_device::cpu::SymAddr;
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, result};

use super::GpuPe;
use super::on_stream::ON_STREAM_THREADS;
use crate::error::{GpuError, Result};
use crate::team::Team;

/// Most team members a grid form takes (its kernel argument holds one
/// address per member).
pub const GRID_MAX_MEMBERS: usize = 32;

/// The device functions every grid kernel includes after `cpnet/device.cuh`:
/// `grid_open`, `grid_close` and what they use (the protocol above).
pub(super) fn prelude() -> &'static str {
    r#"
/* A grid collective's state, in block shared memory. */
struct grid_state {
    cpnet_ctx_t ctx;
    cpnet_team_desc_t d;
    uint64_t epoch; /* the first epoch taken */
    int go;         /* words[0] as this block saw it */
};

/* Report `e` through the status block (thread 0), with or without a context. */
__device__ void grid_fail(cpnet_handle_t* h, cpnet_ctx_t* ctx, int e)
{
    if (threadIdx.x != 0) return;
    cpnet_ctx_t bare = {};
    bare.status = (cpnet_status_t*)h->status;
    cpnet_detail::report_dev_error(ctx != nullptr ? ctx : &bare, e, h->my_pe, 0, 0, 0, CPNET_CMP_EQ);
}

/* Block 0, whole block: SIG[my_idx] = e at every other member, then wait
 * for every member's SIG[j] >= e. */
__device__ int grid_epoch(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t e)
{
    using namespace cpnet_detail;
    const int r = collective(ctx, [&]() -> int {
        for (int k = 1; k < d.size; ++k) {
            const int j = (d.my_idx + k) % d.size;
            const int s = team_signal_leader(ctx, team_sig(ctx, d, d.my_idx), e, team_world_pe(d, j));
            if (s != CPNET_E_OK) return s;
        }
        return CPNET_E_OK;
    });
    return r != CPNET_E_OK ? r : team_wait_all(ctx, d, e);
}

/* Every block, whole block: block 0 opens its context, checks `team`
 * against (my_idx, size) and takes `epochs` epochs (the first in
 * st->epoch); with `entry` it runs the first as the entry epoch and then
 * releases the other blocks through words[0], which they wait for.
 * Returns whether this block goes on (the same in all its threads). */
__device__ bool grid_open(cpnet_handle_t* h, int team, int my_idx, int size, unsigned long long* words,
                          int epochs, bool entry, grid_state* st)
{
    using namespace cpnet_detail;
    if (blockIdx.x != 0) {
        if (!entry) return true;
        if (threadIdx.x == 0) {
            unsigned polls = 0;
            unsigned long long v;
            /* Acquire: pairs with block 0's release of words[0]. */
            while ((v = cpnet_ld_acquire_sys_u64((const uint64_t*)&words[0])) == 0)
                if ((++polls & 1023) == 0 && cpnet_abort_code(h) != CPNET_E_OK) break;
            st->go = (int)v;
        }
        __syncthreads();
        return st->go == 1;
    }
    int e = cpnet_ctx_create(h, &st->ctx);
    if (e != CPNET_E_OK) {
        grid_fail(h, nullptr, e);
        if (threadIdx.x == 0 && entry) cpnet_st_release_gpu_u64((uint64_t*)&words[0], 2);
        return false;
    }
    if (threadIdx.x == 0) {
        cpnet_team_desc_t t;
        e = team_get(&st->ctx, team, &t);
        if (e == CPNET_E_OK && (t.my_idx != my_idx || t.size != size)) e = CPNET_E_BAD_TEAM;
        st->d = t;
        st->ctx.ret = e;
        if (e == CPNET_E_OK) {
            st->epoch = team_next_leader(&st->ctx, t, false) >> 1;
            for (int k = 1; k < epochs; ++k) (void)team_next_leader(&st->ctx, t, false);
        }
    }
    __syncthreads();
    e = st->ctx.ret;
    if (e == CPNET_E_OK && entry) e = grid_epoch(&st->ctx, st->d, st->epoch);
    /* Release: what block 0 acquired from the members' signals, before the
     * other blocks' loads of their buffers. */
    if (threadIdx.x == 0 && entry) cpnet_st_release_gpu_u64((uint64_t*)&words[0], e == CPNET_E_OK ? 1 : 2);
    if (e != CPNET_E_OK) {
        grid_fail(h, &st->ctx, e);
        cpnet_ctx_destroy(&st->ctx);
        return false;
    }
    return true;
}

/* Every block that went on, whole block: fence this block's stores and
 * count it in words[1]; block 0 waits for the count, runs exit epoch `e`
 * and closes its context. */
__device__ void grid_close(cpnet_handle_t* h, unsigned long long* words, uint64_t e, grid_state* st)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        /* Every thread's stores of this block (ordered by the barrier),
         * then the count; block 0's acquire below pairs with it. */
        __threadfence_system();
        if (blockIdx.x != 0) atomicAdd(&words[1], 1ull);
    }
    if (blockIdx.x != 0) return;
    if (threadIdx.x == 0) {
        unsigned polls = 0;
        st->ctx.ret = CPNET_E_OK;
        while (cpnet_ld_acquire_sys_u64((const uint64_t*)&words[1]) < (unsigned long long)(gridDim.x - 1)) {
            if ((++polls & 1023) == 0) {
                const int ab = cpnet_abort_code(h);
                if (ab != CPNET_E_OK) { st->ctx.ret = ab; break; }
            }
        }
    }
    __syncthreads();
    int r = st->ctx.ret;
    if (r == CPNET_E_OK) r = grid_epoch(&st->ctx, st->d, e);
    if (r != CPNET_E_OK) grid_fail(h, &st->ctx, r);
    cpnet_ctx_destroy(&st->ctx);
}
"#
}

impl GpuPe {
    /// `addr` as this process maps it in every member of `team` (its own:
    /// `dev_ptr(addr)`), where a grid form can run on `team`: peer-to-peer
    /// stores on, every other member's heap mapped here, at most
    /// [`GRID_MAX_MEMBERS`] members.
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

    /// Launch grid form `f` on `stream`: `blocks` blocks of
    /// [`ON_STREAM_THREADS`] threads, with the handle, `team`'s id and the
    /// argument struct `args(words)`, where `words` are two 8-byte words of
    /// device memory for this launch alone (`go`, `done`), zeroed,
    /// allocated on `stream` before the launch and freed after it in
    /// stream order (so launches on other streams never share them).
    /// `what` names the launch in its error.
    ///
    /// # Safety
    /// `f`'s parameters are `(cpnet_handle_t, int, A)`, `A` laid out as the
    /// kernel's argument struct, and every device address in the struct
    /// `args` builds is valid for what the kernel does with it until the
    /// kernel ends (the launch's own words are: freed after it).
    ///
    /// # Errors
    /// The CUDA calls.
    pub(super) unsafe fn launch_grid<A: DeviceRepr>(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        team: &Team,
        blocks: u32,
        what: &'static str,
        args: impl FnOnce(u64) -> A,
    ) -> Result<()> {
        self.bind()?;
        let cu = stream.cu_stream();
        let cuda = |call: &'static str| move |source| GpuError::Cuda { what: call, source };
        const BYTES: usize = 16;
        // SAFETY: `cu` is the caller's live stream of this PE's context
        // (bound above); BYTES allocated here, zeroed and freed below.
        let mem = unsafe { result::malloc_async(cu, BYTES) }.map_err(cuda("cuMemAllocAsync (a grid form's words)"))?;
        // SAFETY: `mem` is the allocation above, BYTES long, ordered on `cu`.
        if let Err(e) = unsafe { result::memset_d8_async(mem, 0, BYTES, cu) } {
            // SAFETY: `mem` came from malloc_async on `cu` and nothing uses it.
            let _ = unsafe { result::free_async(mem, cu) };
            return Err(cuda("cuMemsetD8Async (a grid form's words)")(e).into());
        }
        let (h, t, a) = (self.handle(), team.id(), args(mem));
        let mut b = stream.launch_builder(f);
        b.arg(&h).arg(&t).arg(&a);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (ON_STREAM_THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match `f`'s parameters and its struct's
        // addresses are valid (the caller's contract); `mem` lives until its
        // stream-ordered free below, after the kernel.
        let launched = unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda(what));
        // SAFETY: `mem` came from malloc_async on `cu`; the free is ordered
        // after the kernel (or after the memset if the launch failed).
        unsafe { result::free_async(mem, cu) }.map_err(cuda("cuMemFreeAsync (a grid form's words)"))?;
        Ok(launched?)
    }
}
