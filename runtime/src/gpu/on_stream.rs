//! Team collectives on a stream (NVSHMEM's `nvshmemx_*_on_stream`; issue
//! 22): the host enqueues one block of [`ON_STREAM_THREADS`] threads that
//! runs the work-group collective of `cpnet/team.cuh` on the caller's
//! stream, ordered after the kernels and copies before it. The call
//! returns once the kernel is launched; [`GpuPe::synchronize`] (or the
//! stream's own synchronize, then [`GpuPe::check_status`]) reports a
//! device-side failure through the status block, naming the work-group.
//!
//! Each form's kernel is compiled with NVRTC and loaded the first time the
//! form is called with a given element type and operator (about half a
//! second), then kept. Loading a kernel may wait for the context's running
//! kernels, with the proxy's driver calls waiting behind it, so the first
//! call compiles, then synchronizes the context (the proxy serves the
//! kernels in flight meanwhile), then loads ([`GpuPe::on_stream_built`]):
//! a first call waits for every kernel of this PE that runs, and one that
//! waits for something this thread does later never ends. Call each form
//! once before launching such a kernel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cpnet_device::cpu::SymAddr;
use cpnet_device::cpu::{ReduceOp, ReduceType};
use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};

use super::GpuPe;
use crate::error::{Error, GpuError, Result};
use crate::team::Team;

/// Threads of the one block each `_on_stream` collective runs.
pub const ON_STREAM_THREADS: u32 = 256;

/// The kernels built so far, by the call they make.
#[derive(Debug, Default)]
pub(super) struct OnStreamKernels {
    built: Mutex<HashMap<String, (Arc<CudaModule>, CudaFunction)>>,
}

/// The kernel's arguments after the handle and the team: heap offsets,
/// the count (`n`: elements or bytes, as the call takes) and the root.
#[derive(Clone, Copy)]
struct Args {
    dest: SymAddr,
    source: SymAddr,
    n: u64,
    root: i32,
}

/// The kernel's source for `call` (a `team.cuh` call with the arguments
/// `&ctx, team, dest, source, n, root` available).
fn source(call: &str) -> String {
    format!(
        r#"#include <cpnet/device.cuh>
/* A typed reduce of team.cuh on the kernel's untyped pointers. */
template <typename T>
__device__ __forceinline__ int reduce_as(int (*f)(cpnet_ctx_t*, cpnet_team_t, T*, const T*, cpnet_size_t),
                                         cpnet_ctx_t* c, cpnet_team_t t, void* d, const void* s, uint64_t n)
{{
    return f(c, t, (T*)d, (const T*)s, (cpnet_size_t)n);
}}
extern "C" __global__ void __launch_bounds__({ON_STREAM_THREADS})
cpnet_on_stream(cpnet_handle_t h, int team, void* dest, const void* source, uint64_t n, int root)
{{
    __shared__ cpnet_ctx_t ctx;
    int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) {{
        /* No context (no free queue before the wait timeout): report through
         * the status block alone, so that the host's synchronize says so. */
        if (threadIdx.x == 0) {{
            cpnet_ctx_t bare = {{}};
            bare.status = (cpnet_status_t*)h.status;
            cpnet_detail::report_dev_error(&bare, e, h.my_pe, 0, 0, 0, CPNET_CMP_EQ);
        }}
        return;
    }}
    (void)dest; (void)source; (void)n; (void)root;
    e = {call};
    if (e != CPNET_E_OK && threadIdx.x == 0)
        cpnet_detail::report_dev_error(&ctx, e, h.my_pe, 0, 0, 0, CPNET_CMP_EQ);
    cpnet_ctx_destroy(&ctx);
}}
"#
    )
}

impl GpuPe {
    /// The function for `call`, built on first use.
    ///
    /// # Errors
    /// NVRTC or the module load.
    fn on_stream_kernel(&self, call: &str) -> Result<CudaFunction> {
        self.on_stream_built(call, "cpnet_on_stream", || source(call))
    }

    /// Function `name` of the module built from `source()`, kept under
    /// `key`; `source` runs only on the first build (the grid forms,
    /// `alltoall_grid.rs` and `reduce_grid.rs`, one module per type and
    /// operator for the reduce).
    ///
    /// # Errors
    /// NVRTC or the module load.
    pub(super) fn on_stream_built(&self, key: &str, name: &str, source: impl FnOnce() -> String) -> Result<CudaFunction> {
        let mut built = self.on_stream.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, f)) = built.get(key) {
            return Ok(f.clone());
        }
        // Loading a kernel may wait for the whole context to go idle (CUDA
        // C++ Programming Guide, "Lazy Loading", concurrent execution), and
        // while it waits the proxy's own CUDA calls (the landing agent's
        // launches, its copies) wait behind it. A collective enqueued
        // earlier that spins on what the proxy lands would then never end:
        // tests/cuda/coll.cu at 2 and 3 PEs on the network path stalled 5
        // runs in 14 that way (the watchdog reported the proxy thread
        // stuck in its progress call). So compile first, let every kernel
        // of this context end (the proxy serves them meanwhile), then load
        // the module and its function at once, not at the first launch.
        let image = super::module::compile(&self.cuda, &format!("{name}.cu"), &source())?;
        self.bind()?;
        self.cuda.synchronize().map_err(|source| GpuError::Cuda { what: "cuCtxSynchronize (before loading an on-stream collective)", source })?;
        let module = self.cuda.load_module(image).map_err(|source| GpuError::Cuda { what: "cuModuleLoadData", source })?;
        let f = module
            .load_function(name)
            .map_err(|source| GpuError::Cuda { what: "cuModuleGetFunction (on-stream collective)", source })?;
        super::module::load_now(&f, "cuFuncLoad (on-stream collective)")?;
        built.insert(key.to_owned(), (module, f.clone()));
        Ok(f)
    }

    /// Launch `call` as one block on `stream` with these arguments.
    fn launch_on_stream(&self, call: &str, stream: &CudaStream, team: &Team, a: Args) -> Result<()> {
        let f = self.on_stream_kernel(call)?;
        let (h, t) = (self.handle(), team.id());
        let (d, s, n, root) = (self.dev_ptr(a.dest), self.dev_ptr(a.source), a.n, a.root);
        let mut b = stream.launch_builder(&f);
        b.arg(&h).arg(&t).arg(&d).arg(&s).arg(&n).arg(&root);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (ON_STREAM_THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match cpnet_on_stream's parameters (the
        // handle by value, an int, two device pointers into this PE's heap,
        // a u64, an int); `stream` belongs to this PE's context (the
        // caller's contract, as for any launch on it).
        unsafe { b.launch(cfg) }.map_err(|source| GpuError::Cuda { what: "cuLaunchKernel (on-stream collective)", source })?;
        Ok(())
    }

    /// Both ranges inside the heap, before anything is launched.
    fn on_stream_ranges(&self, dest: SymAddr, dest_bytes: u64, source: SymAddr, source_bytes: u64) -> Result<()> {
        let heap = self.heap_size();
        for (a, size) in [(dest, dest_bytes), (source, source_bytes)] {
            if a.0 > heap || size > heap - a.0 {
                return Err(Error::OutsideHeap { pe: self.my_pe(), addr: a.0, size, heap });
            }
        }
        Ok(())
    }

    /// The checks of a reduce on a stream: a bitwise `op` on a float type,
    /// `dest` or `source` (`nreduce` elements of `T`) outside the heap.
    pub(super) fn reduce_checks<T: ReduceType>(&self, op: ReduceOp, dest: SymAddr, source: SymAddr, nreduce: usize) -> Result<()> {
        if !T::INTEGER && matches!(op, ReduceOp::And | ReduceOp::Or | ReduceOp::Xor) {
            return Err(Error::Team {
                pe: self.my_pe(),
                why: format!("team_reduce_on_stream: {} of {} elements: the bitwise operators take integer types", op.name(), T::NAME),
            });
        }
        let bytes = (nreduce as u64).saturating_mul(T::SIZE as u64);
        self.on_stream_ranges(dest, bytes, source, bytes)
    }

    /// Reduce to all on `stream` (`nvshmemx_TYPENAME_OP_reduce_on_stream`;
    /// OpenSHMEM 1.5 §9.9.12): `nreduce` elements of type `T` at `source`
    /// of every member of `team`, combined with `op` in team order, into
    /// `dest` of every member (every member gets the same bits; `dest ==
    /// source` allowed). **Collective** over `team`: every member enqueues
    /// it; returns once launched. From 64 KiB
    /// (`cpnet::gpu::REDUCE_GRID_MIN_BYTES`) on a team whose members all
    /// map each other's heaps it runs on a grid of up to 128 blocks
    /// (`reduce_grid.rs`: a reduce-scatter and an allgather by the blocks'
    /// loads and stores); from 64 KiB on any other team of 2-32 members,
    /// by puts into the members' `dest` and back with the fold on a grid
    /// (`reduce_net.rs`: the network path; a team of two through staging
    /// zones, up to 4 MiB, exchanges the whole array in one put each way
    /// instead, the world team's into the peer's landing halves of its
    /// reduce scratch, `CPNET_REDUCE_SCRATCH`; in place, `dest == source`,
    /// through a copy in this PE's reduce scratch, in chunks of its size);
    /// else on one block. [`GpuPe::team_reduce_on_stream_form`] names the
    /// form. Reduces that use the reduce scratch on different streams take
    /// it in the order this PE enqueued them: every member must enqueue
    /// them in the same order (as NCCL asks of operations on one
    /// communicator). Not for CUDA graph capture: the landing half a call
    /// uses is chosen when it is enqueued, so a graph's replays would all
    /// use one half (and a form's first call synchronizes the context,
    /// which capture refuses).
    ///
    /// # Errors
    /// [`Error::Team`]: a bitwise `op` on a float type; [`Error::OutsideHeap`]:
    /// a range outside the heap; [`GpuError`] from building or launching the kernel. A failure
    /// inside it (a team this PE is not in) comes from
    /// [`GpuPe::synchronize`].
    pub fn team_reduce_on_stream<T: ReduceType>(
        &self,
        team: &Team,
        op: ReduceOp,
        dest: SymAddr,
        source: SymAddr,
        nreduce: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        self.reduce_checks::<T>(op, dest, source, nreduce)?;
        if self.reduce_grid::<T>(team, op, dest, source, nreduce as u64, stream)? {
            return Ok(());
        }
        // The network path's form takes the first size x floor(n / size)
        // elements; the rest (fewer than the members) go by one block.
        let done = self.reduce_net::<T>(team, op, dest, source, nreduce as u64, stream)?.unwrap_or(0);
        if done == nreduce as u64 {
            return Ok(());
        }
        let skip = done * T::SIZE as u64;
        let (dest, source) = (SymAddr(dest.0 + skip), SymAddr(source.0 + skip));
        let call = format!("reduce_as(cpnet_{}_{}_reduce, &ctx, team, dest, source, n)", T::NAME, op.name());
        self.launch_on_stream(&call, stream, team, Args { dest, source, n: nreduce as u64 - done, root: 0 })
    }

    /// Broadcast on `stream` (`nvshmemx_broadcastmem_on_stream`, §9.9.7):
    /// `nbytes` at `source` of member `root` into `dest` of every member,
    /// the root's too. **Collective** over `team`.
    ///
    /// # Errors
    /// As [`GpuPe::team_reduce_on_stream`]; a root outside the team is
    /// reported by [`GpuPe::synchronize`].
    pub fn team_broadcast_on_stream(&self, team: &Team, dest: SymAddr, source: SymAddr, nbytes: usize, root: i32, stream: &CudaStream) -> Result<()> {
        self.on_stream_ranges(dest, nbytes as u64, source, nbytes as u64)?;
        self.launch_on_stream("cpnet_broadcastmem(&ctx, team, dest, source, n, root)", stream, team, Args { dest, source, n: nbytes as u64, root })
    }

    /// Concatenate on `stream` (`nvshmemx_fcollectmem_on_stream`, §9.9.8):
    /// `nbytes` at `source` of every member into `dest` of every member, at
    /// offset `member index x nbytes`. **Collective** over `team`.
    ///
    /// # Errors
    /// As [`GpuPe::team_reduce_on_stream`].
    pub fn team_fcollect_on_stream(&self, team: &Team, dest: SymAddr, source: SymAddr, nbytes: usize, stream: &CudaStream) -> Result<()> {
        let total = (nbytes as u64).saturating_mul(team.n_pes().max(0) as u64);
        self.on_stream_ranges(dest, total, source, nbytes as u64)?;
        self.launch_on_stream("cpnet_fcollectmem(&ctx, team, dest, source, n)", stream, team, Args { dest, source, n: nbytes as u64, root: 0 })
    }

    /// Exchange on `stream` (`nvshmemx_alltoallmem_on_stream`, §9.9.10):
    /// block `j` (`nbytes` at `source + j x nbytes`) of every member `i` into
    /// block `i` of member `j`'s `dest`. **Collective** over `team`. From
    /// 512 KiB per pair on a team whose members all map each other's heaps
    /// it runs on a grid of up to 128 blocks (`alltoall_grid.rs`); from
    /// 128 KiB per pair on any other team of two or more, on one block per
    /// proxy thread, each with its own context (`alltoall_net.rs`), unless
    /// the shm provider's staging zones carry the puts; else on one block.
    ///
    /// # Errors
    /// As [`GpuPe::team_reduce_on_stream`].
    pub fn team_alltoall_on_stream(&self, team: &Team, dest: SymAddr, source: SymAddr, nbytes: usize, stream: &CudaStream) -> Result<()> {
        if self.team_alltoall_on_stream_large(team, dest, source, nbytes, stream)? {
            return Ok(());
        }
        self.launch_on_stream("cpnet_alltoallmem(&ctx, team, dest, source, n)", stream, team, Args { dest, source, n: nbytes as u64, root: 0 })
    }

    /// The forms of [`GpuPe::team_alltoall_on_stream`] for large blocks
    /// alone (OpenSHMEM 1.5 §9.9.10, on a stream), for a caller with a
    /// one-block kernel of its own: `nvshmem.h`'s
    /// `nvshmemx_TYPENAME_alltoall_on_stream`, through libcpnet's
    /// `cpnet_gpu_alltoall_on_stream_large`. The grid where every member's
    /// heap is mapped (from 512 KiB per pair, `alltoall_grid.rs`); the world
    /// team of a job of two through the pair zone (64 KiB-4 MiB per pair,
    /// not under graph capture, `CPNET_PAIR_STAGE`; `alltoall_net.rs`'s
    /// `alltoall_pair`); one block per proxy thread on the network path
    /// without staging zones (from 128 KiB, `alltoall_net.rs`):
    /// `Ok(true)` once launched on `stream`;
    /// `Ok(false)` where neither runs, with nothing launched. The same
    /// answer on every member. **Collective** over `team`.
    ///
    /// # Errors
    /// As [`GpuPe::team_alltoall_on_stream`].
    pub fn team_alltoall_on_stream_large(&self, team: &Team, dest: SymAddr, source: SymAddr, nbytes: usize, stream: &CudaStream) -> Result<bool> {
        let total = (nbytes as u64).saturating_mul(team.n_pes().max(0) as u64);
        self.on_stream_ranges(dest, total, source, total)?;
        Ok(self.alltoall_grid(team, dest, source, nbytes as u64, stream)?
            || self.alltoall_pair(team, dest, source, nbytes as u64, stream)?
            || self.alltoall_net(team, dest, source, nbytes as u64, stream)?)
    }

    /// Sync `team` on `stream` (`nvshmemx_team_sync_on_stream`, §9.9.2):
    /// every member arrived; with `quiet` first, the barrier
    /// (`nvshmemx_barrier_on_stream`, §9.9.1). **Collective** over `team`.
    ///
    /// # Errors
    /// [`GpuError`] from building or launching the kernel.
    pub fn team_sync_on_stream(&self, team: &Team, quiet: bool, stream: &CudaStream) -> Result<()> {
        let call = if quiet { "cpnet_team_barrier(&ctx, team)" } else { "cpnet_team_sync(&ctx, team)" };
        self.launch_on_stream(call, stream, team, Args { dest: SymAddr(0), source: SymAddr(0), n: 0, root: 0 })
    }
}

#[cfg(test)]
mod tests {
    use cpnet_device::nvrtc::{self, BuildOptions};

    /// Every form's kernel (the grid forms' too) compiles with NVRTC for sm_90, warning-free
    /// (a typo in a call would otherwise only show on a GPU, at first use).
    /// Needs libnvrtc; `CPNET_REQUIRE_NVRTC=1` makes its absence a failure.
    #[test]
    fn every_on_stream_kernel_compiles() {
        if !nvrtc::is_available() {
            assert_ne!(std::env::var("CPNET_REQUIRE_NVRTC").as_deref(), Ok("1"), "CPNET_REQUIRE_NVRTC=1 but libnvrtc was not found");
            eprintln!("SKIPPED every_on_stream_kernel_compiles: libnvrtc not found (source scripts/nvrtc-env.sh)");
            return;
        }
        let calls = [
            "reduce_as(cpnet_int32_sum_reduce, &ctx, team, dest, source, n)",
            "reduce_as(cpnet_uint64_xor_reduce, &ctx, team, dest, source, n)",
            "reduce_as(cpnet_double_min_reduce, &ctx, team, dest, source, n)",
            "reduce_as(cpnet_half_sum_reduce, &ctx, team, dest, source, n)",
            "reduce_as(cpnet_bfloat16_max_reduce, &ctx, team, dest, source, n)",
            "cpnet_broadcastmem(&ctx, team, dest, source, n, root)",
            "cpnet_fcollectmem(&ctx, team, dest, source, n)",
            "cpnet_alltoallmem(&ctx, team, dest, source, n)",
            "cpnet_team_sync(&ctx, team)",
            "cpnet_team_barrier(&ctx, team)",
        ];
        for call in calls {
            let opts = BuildOptions { name: "cpnet_on_stream.cu".into(), ..BuildOptions::default() };
            let out = nvrtc::compile(&super::source(call), &opts).unwrap_or_else(|e| panic!("{call}: {e}\n{}", e.log().unwrap_or_default()));
            assert!(out.log.trim().is_empty(), "{call}: NVRTC warnings:\n{}", out.log);
            assert!(out.ptx.contains(".entry cpnet_on_stream("), "{call}: no entry in the PTX");
        }
        // The grid forms, modules of their own: the alltoall
        // (alltoall_grid.rs), and the reduce (reduce_grid.rs) for every kind
        // of element (integer, float, double, half, bfloat16) and a bitwise,
        // an ordering and an arithmetic operator.
        let reduce = |name: &str, op: &str, red: &str| super::super::reduce_grid::kernel(name, op, red);
        let grids = [
            ("grid alltoall", "cpnet_alltoall_grid", super::super::alltoall_grid::kernel()),
            ("network-path alltoall", "cpnet_alltoall_net", super::super::alltoall_net::kernel()),
            ("pair-zone alltoall", "cpnet_alltoall_pair", super::super::alltoall_net::pair_kernel()),
            ("grid reduce float sum", "cpnet_reduce_grid", reduce("float", "sum", "RED_SUM")),
            ("network-path reduce float sum", "cpnet_reduce_net", super::super::reduce_net::kernel("float", "sum", "RED_SUM")),
            ("network-path reduce half max", "cpnet_reduce_net", super::super::reduce_net::kernel("half", "max", "RED_MAX")),
            ("network-path reduce int64 xor", "cpnet_reduce_net", super::super::reduce_net::kernel("int64", "xor", "RED_XOR")),
            ("grid reduce double min", "cpnet_reduce_grid", reduce("double", "min", "RED_MIN")),
            ("grid reduce int32 xor", "cpnet_reduce_grid", reduce("int32", "xor", "RED_XOR")),
            ("grid reduce uint64 prod", "cpnet_reduce_grid", reduce("uint64", "prod", "RED_PROD")),
            ("grid reduce half max", "cpnet_reduce_grid", reduce("half", "max", "RED_MAX")),
            ("grid reduce bfloat16 sum", "cpnet_reduce_grid", reduce("bfloat16", "sum", "RED_SUM")),
        ];
        for (what, entry, src) in grids {
            let opts = BuildOptions { name: format!("{entry}.cu"), ..BuildOptions::default() };
            let out = nvrtc::compile(&src, &opts).unwrap_or_else(|e| panic!("{what}: {e}\n{}", e.log().unwrap_or_default()));
            assert!(out.log.trim().is_empty(), "{what}: NVRTC warnings:\n{}", out.log);
            assert!(out.ptx.contains(&format!(".entry {entry}(")), "{what}: no entry in the PTX");
        }
    }
}
