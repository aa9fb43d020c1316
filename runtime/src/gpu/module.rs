//! Compiling and loading the runtime's kernels: NVRTC for this PE's GPU,
//! and the landing agent loaded into its context at init, before any
//! application kernel runs (lazy loading would otherwise load it at a first
//! launch that may wait for that kernel).

use std::sync::Arc;

use cpnet_device::layout::CPNET_AGENT_THREADS;
use cpnet_device::nvrtc::{self, BuildOptions};
use cpnet_proxy::agent::AgentKernel;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};

use super::GpuError;
use crate::env::Tuning;

/// Compile `source` (which may `#include <cpnet/device.cuh>`) for `ctx`'s
/// GPU with the NVRTC helper and load it.
///
/// # Errors
/// [`GpuError::Nvrtc`] with the compiler log; [`GpuError::Cuda`] when the
/// module does not load.
pub fn build_module(ctx: &Arc<CudaContext>, name: &str, source: &str) -> std::result::Result<Arc<CudaModule>, GpuError> {
    let image = compile(ctx, name, source)?;
    ctx.load_module(image).map_err(|source| GpuError::Cuda { what: "cuModuleLoadData", source })
}

/// Compile `source` for `ctx`'s GPU with the NVRTC helper, without loading
/// it (no call into the context but the capability query).
///
/// # Errors
/// [`GpuError::Nvrtc`] with the compiler log.
pub(super) fn compile(ctx: &Arc<CudaContext>, name: &str, source: &str) -> std::result::Result<cudarc::nvrtc::Ptx, GpuError> {
    let (major, minor) =
        ctx.compute_capability().map_err(|source| GpuError::Cuda { what: "cuDeviceGetAttribute (capability)", source })?;
    let opts = BuildOptions { name: name.into(), ..BuildOptions::for_compute_capability(major as u32, minor as u32) };
    Ok(nvrtc::compile_kernel(source, &opts)?)
}

/// The landing agent (`cpnet/agent.cuh`), compiled with NVRTC for this
/// PE's GPU and loaded in its context once; every proxy thread launches it
/// on its own landing ring (cmd.h, THE LANDING AGENT).
pub(super) fn landing_agent(cuda: &Arc<CudaContext>, tuning: &Tuning) -> std::result::Result<AgentKernel, GpuError> {
    let module = build_module(cuda, "cpnet_agent.cu", nvrtc::AGENT_SOURCE)?;
    let function = module
        .load_function(nvrtc::AGENT_KERNEL)
        .map_err(|source| GpuError::Cuda { what: "cuModuleGetFunction (landing agent)", source })?;
    load_now(&function, "cuFuncLoad (landing agent)")?;
    Ok(AgentKernel {
        function,
        idle_ns: tuning.agent_idle.as_nanos().min(u128::from(u64::MAX)) as u64,
        max_bytes: tuning.agent_bytes,
        lanes: tuning.agent_lanes,
        split: tuning.agent_split,
    })
}

/// Blocks of the landing agent that fit on one SM by its launch bounds
/// (`__launch_bounds__(CPNET_AGENT_THREADS, 8)` in `AGENT_SOURCE`): the
/// compiler keeps it to [`AGENT_MAX_REGS`] registers per thread.
pub const AGENT_MIN_BLOCKS_PER_SM: u32 = 8;

/// Registers per thread the landing agent uses at most: the 64 K registers
/// of an SM over [`AGENT_MIN_BLOCKS_PER_SM`] blocks of `CPNET_AGENT_THREADS`.
pub const AGENT_MAX_REGS: u32 = 65536 / (AGENT_MIN_BLOCKS_PER_SM * CPNET_AGENT_THREADS as u32);

/// Blocks of a persistent kernel that may run beside `agents` landing
/// agents: `coresident` (the blocks of `threads` threads and `regs`
/// registers per thread that fit on this PE's share of the GPU at once)
/// less the blocks' worth of room the agents take, counted by threads and
/// by registers (an agent: `CPNET_AGENT_THREADS` threads of at most
/// `AGENT_MAX_REGS` registers), whichever is more. One block of 1024
/// threads holds four agents; one agent needs one block of 256 threads,
/// or two of 128. [`crate::GpuPe::max_persistent_blocks`] with the
/// driver's figures; `cpnet_gpu_persistent_blocks` in C.
///
/// # Errors
/// [`GpuError::NoRoom`] when the room is every block.
pub fn persistent_blocks(coresident: u32, threads: u32, regs: u32, agents: u32) -> std::result::Result<u32, GpuError> {
    if agents == 0 {
        return Ok(coresident);
    }
    let agent_threads = u64::from(CPNET_AGENT_THREADS as u32);
    let (t, r) = (u64::from(threads.max(1)), u64::from(regs.max(1)));
    // Room in blocks = ceil(agents x max(agent threads / t, agent registers
    // / (t x r))), in integers: the larger numerator over its denominator.
    let by_threads = (u64::from(agents) * agent_threads).div_ceil(t);
    let by_regs = (u64::from(agents) * agent_threads * u64::from(AGENT_MAX_REGS)).div_ceil(t * r);
    let room = by_threads.max(by_regs).min(u64::from(u32::MAX)) as u32;
    if room >= coresident {
        return Err(GpuError::NoRoom { coresident, threads, agents, room });
    }
    Ok(coresident - room)
}

/// The preferred shared-memory carveout, in percent of an SM's shared
/// memory (`max_per_sm` bytes), that holds `per_sm` blocks of
/// `smem_per_block` bytes each (static, dynamic and the driver's reserve per
/// block): what [`set_carveout`] gives a persistent kernel and the landing
/// agents alike. 0..=100.
pub fn carveout_percent(per_sm: u32, smem_per_block: u64, max_per_sm: u64) -> i32 {
    let need = u64::from(per_sm) * smem_per_block * 100;
    need.div_ceil(max_per_sm.max(1)).min(100) as i32
}

/// Set `function`'s preferred shared-memory carveout to `percent`
/// (`CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`, driver API
/// "Execution Control"; the driver rounds it up to a split the GPU has).
///
/// An SM runs blocks of one L1/shared split at a time, and the driver picks
/// a kernel's split from its preference and its needs. Measured on an H100
/// with 2 PEs under MPS on the network path (docs/results.md, "The landing
/// agent beside persistent kernels"): with no preference the agent got a
/// split that the SMs running sssp's persistent grid did not have, and an
/// agent launched while that grid covered every SM never started (sssp
/// hung at 67 blocks per PE and more, passed at 65); with the agent at 0 %
/// sssp passed at 182 blocks and bfs, whose split differs, hung. So the
/// split is matched, not guessed: [`crate::GpuPe::max_persistent_blocks`]
/// gives the persistent kernel and the agent the same preference.
///
/// # Errors
/// [`GpuError::Cuda`] naming `what`.
pub fn set_carveout(function: &CudaFunction, percent: i32, what: &'static str) -> std::result::Result<(), GpuError> {
    // SAFETY: a live function handle of a loaded module (the CudaFunction
    // keeps its module); the attribute takes a percentage in 0..=100.
    unsafe {
        cudarc::driver::sys::cuFuncSetAttribute(
            function.cu_function(),
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            percent.clamp(0, 100),
        )
    }
    .result()
    .map_err(|source| GpuError::Cuda { what, source })
}

/// First CUDA driver with `cuFuncLoad` (12.4), as `cuDriverGetVersion` gives it.
const CU_FUNC_LOAD_DRIVER: i32 = 12040;

/// Load `function`'s code into the context now, not at its first launch.
///
/// Under lazy loading (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA
/// 12.2) the first launch of a kernel loads it, and that load may wait for
/// the whole context to go idle (CUDA C++ Programming Guide, "Lazy Loading",
/// "Possible issues when adopting lazy loading": concurrent execution). The
/// proxy launches the landing agent while an application kernel runs and
/// waits for what the agent lands: a first launch that waited for that
/// kernel would never start, and the kernel's put-with-signal would never
/// be answered (issue 21's network-path timeout). `cuFuncLoad` (driver API
/// 12.4, "Module Management") loads it now, at init, when nothing runs.
/// Older drivers have no such call; they get the same effect only with
/// `CUDA_MODULE_LOADING=EAGER` in the environment, which this says once.
///
/// # Errors
/// [`GpuError::Cuda`] naming `what` when the driver refuses the load.
pub fn load_now(function: &CudaFunction, what: &'static str) -> std::result::Result<(), GpuError> {
    let mut version = 0i32;
    // SAFETY: `version` is a valid out-pointer; the call only writes it.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|source| GpuError::Cuda { what: "cuDriverGetVersion", source })?;
    if version < CU_FUNC_LOAD_DRIVER {
        if std::env::var("CUDA_MODULE_LOADING").map_or(true, |v| !v.eq_ignore_ascii_case("EAGER")) {
            tracing::warn!(
                "CUDA driver {version} has no cuFuncLoad: set CUDA_MODULE_LOADING=EAGER, or the landing agent's \
                 first launch may wait for a running kernel that waits for it"
            );
        }
        return Ok(());
    }
    // SAFETY: the function handle belongs to a module that `function` keeps
    // loaded; the caller made its context current (build_module binds it);
    // the symbol exists in drivers >= 12.4, checked above.
    unsafe { cudarc::driver::sys::cuFuncLoad(function.cu_function()) }.result().map_err(|source| GpuError::Cuda { what, source })
}

/// Whether `function`'s code is loaded in its context (`cuFuncIsLoaded`);
/// `None` on drivers before 12.4, which cannot say.
///
/// # Errors
/// [`GpuError::Cuda`] when the driver refuses the query.
pub fn is_loaded(function: &CudaFunction) -> std::result::Result<Option<bool>, GpuError> {
    let mut version = 0i32;
    // SAFETY: as in `load_now`.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|source| GpuError::Cuda { what: "cuDriverGetVersion", source })?;
    if version < CU_FUNC_LOAD_DRIVER {
        return Ok(None);
    }
    let mut state = cudarc::driver::sys::CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_UNLOADED;
    // SAFETY: `state` is a valid out-pointer and the handle is live (see
    // `load_now`); the symbol exists in drivers >= 12.4.
    unsafe { cudarc::driver::sys::cuFuncIsLoaded(&mut state, function.cu_function()) }
        .result()
        .map_err(|source| GpuError::Cuda { what: "cuFuncIsLoaded", source })?;
    Ok(Some(state == cudarc::driver::sys::CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_LOADED))
}


#[cfg(test)]
mod tests {
    use super::*;

    /// The room the agents take, in blocks of the kernel: by threads for
    /// small blocks, by registers for register-heavy ones, none without
    /// agents, and a clear refusal when nothing is left.
    #[test]
    fn persistent_blocks_leave_the_agents_room() {
        // Jacobi on one H100 shared by 2 PEs: 66 blocks of 1024 threads, 64
        // registers; 16 agents take 4 such blocks.
        assert_eq!(persistent_blocks(66, 1024, 64, 16).unwrap(), 62);
        // sssp: 198 blocks of 256 threads, 80 registers: one block per agent.
        assert_eq!(persistent_blocks(198, 256, 80, 16).unwrap(), 182);
        // 128-thread blocks: two per agent.
        assert_eq!(persistent_blocks(400, 128, 32, 16).unwrap(), 368);
        // 256 threads of 16 registers: the agent's 32 registers need two.
        assert_eq!(persistent_blocks(400, 256, 16, 16).unwrap(), 368);
        assert_eq!(persistent_blocks(66, 1024, 64, 0).unwrap(), 66);
        let e = persistent_blocks(8, 256, 32, 16).unwrap_err();
        assert!(matches!(e, GpuError::NoRoom { coresident: 8, room: 16, .. }), "{e}");
        assert!(e.to_string().contains("landing agents"), "{e}");
    }

    /// The landing agent is loaded when `landing_agent` returns, before its
    /// first launch: without `cuFuncLoad` a lazily loaded agent's first
    /// launch could wait for the application kernel it is meant to serve
    /// (the network-path hang this guards). Needs a GPU and libnvrtc; says
    /// SKIPPED without them unless `CPNET_REQUIRE_GPU=1`.
    #[test]
    fn landing_agent_is_loaded_before_its_first_launch() {
        let why = if !super::super::driver_present() {
            Some("no CUDA driver (libcuda) on this machine".to_string())
        } else {
            match CudaContext::device_count() {
                Ok(n) if n > 0 => None,
                Ok(_) => Some("the CUDA driver reports 0 devices".into()),
                Err(e) => Some(format!("cuDeviceGetCount failed: {e:?}")),
            }
        };
        if let Some(why) = why {
            assert_ne!(std::env::var("CPNET_REQUIRE_GPU").as_deref(), Ok("1"), "CPNET_REQUIRE_GPU=1 but {why}");
            eprintln!("SKIPPED landing_agent_is_loaded_before_its_first_launch: {why}");
            return;
        }
        let ctx = CudaContext::new(0).expect("a context on device 0");
        let agent = landing_agent(&ctx, &Tuning::default()).expect("the landing agent compiles and loads");
        match is_loaded(&agent.function).expect("cuFuncIsLoaded") {
            Some(loaded) => assert!(loaded, "the landing agent is still unloaded after init (lazy loading)"),
            None => eprintln!("driver before 12.4: cannot ask whether the agent is loaded"),
        }
    }
}
