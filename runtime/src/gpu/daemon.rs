//! GPU PEs and the proxy daemon (DESIGN.md "The proxy daemon"; docs/runtime.md
//! "The proxy daemon, `cpnet-proxyd`").
//!
//! One daemon per GPU (`DIR/proxyd-<UUID>.sock`) serves every GPU PE on that
//! GPU, from one or several processes. The PE keeps its symmetric heap in GPU
//! memory and its claim words there; its queue pool, status block and
//! payload slots live in sealed memfds that both sides map and register
//! with CUDA (`cuMemHostRegister(DEVICEMAP)`): the PE's kernels reach them
//! at the PE's device addresses, the daemon's copies DMA from them. The
//! heap travels as its CUDA IPC handle (`cuIpcGetMemHandle`, 64 bytes in the
//! Attach message); the daemon opens it in its own context on the same GPU
//! (`cuIpcOpenMemHandle`) and runs the staged transport and the landing
//! agents on it, exactly as the in-process proxy does in the PE.
//!
//! The landing agents are kernels of the daemon's context. Without MPS,
//! kernels of two processes do not run side by side on one GPU (they take
//! turns by time slice), so a PE's persistent kernel waiting for a signal
//! would wait for the daemon's turn: GPU PEs take the daemon by default
//! only where their GPU runs under MPS (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`),
//! and `CPNET_PROXY=daemon` without MPS is refused with that reason.
//!
//! This module has the PE's side ([`attach`]) and the daemon's
//! ([`serve_gpu_pe`]).

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use cpnet_device::ring::QueueGeometry;
use cpnet_proxy::decode::Limits;
use cpnet_proxy::staged::GpuHeap;
use cpnet_proxy::transport::FabricConfig;
use cudarc::driver::{CudaContext, result as cu, sys as cusys};

use super::{GpuError, GpuQueues, gpu_backend};
use crate::bootstrap::Bootstrap;
use crate::daemon::DaemonPaths;
use crate::daemon::wire::{Attach, GpuAttach, uuid_string};
use crate::env::{ProxyMode, Tuning};
use crate::error::{Error, Result};
use crate::proxy_link::ProxyLink;
use crate::proxy_threads::Proxies;

/// Environment variables a GPU PE does not pass to the daemon: the job's
/// secret travels in the Attach's own fields.
const NOT_PASSED: &[&str] = &[crate::env::JOB_TOKEN, crate::env::JOB_ID];

/// Whether `cuda`'s GPU runs under MPS.
pub(super) fn mps_enabled(cuda: &Arc<CudaContext>) -> bool {
    cuda.attribute(cusys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED).is_ok_and(|v| v != 0)
}

/// Who serves this GPU PE: `CPNET_PROXY` where set (`daemon` refused
/// without MPS), else the daemon under MPS and the in-process proxy
/// otherwise (the module's note says why).
///
/// # Errors
/// [`Error::Daemon`] for `CPNET_PROXY=daemon` on a GPU without MPS, or with
/// `CPNET_QUEUE_MEM=device` (the daemon maps host queues only).
pub(super) fn proxy_mode(cuda: &Arc<CudaContext>, tuning: &Tuning, me: i32) -> Result<ProxyMode> {
    let mps = mps_enabled(cuda);
    let mode = if tuning.proxy_set { tuning.proxy } else if mps && tuning.queue_mem == crate::env::QueuePlacement::Host { ProxyMode::Daemon } else { ProxyMode::InProcess };
    if mode == ProxyMode::Daemon {
        if !mps {
            return Err(Error::Daemon {
                pe: me,
                why: "CPNET_PROXY=daemon for a GPU PE needs its GPU under MPS: the daemon's landing agents are kernels of \
                      another process, which without MPS take turns with this PE's kernels instead of running beside \
                      them (start MPS, ../shared/DEVICE.md or nvidia-cuda-mps-control -d; or CPNET_PROXY=inprocess)"
                    .into(),
            });
        }
        if tuning.queue_mem != crate::env::QueuePlacement::Host {
            return Err(Error::Daemon {
                pe: me,
                why: "CPNET_QUEUE_MEM=device needs the in-process proxy (the daemon maps queues in host memory): set CPNET_PROXY=inprocess".into(),
            });
        }
    }
    Ok(mode)
}

/// The PE's CPNET_* variables for the daemon's [`Tuning`] of it.
fn tuning_vars() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("CPNET_") && !NOT_PASSED.contains(&k.as_str()))
        .take(crate::daemon::wire::MAX_TUNING_VARS)
        .collect()
}

/// The PE's side: attach to its GPU's daemon (starting it if none runs),
/// passing the queue memfds `fds` ([`GpuQueues::shared`]) and the heap at
/// `heap_base` (`heap_size` bytes, the start of a `cuMemAlloc` allocation
/// of `cuda`) as its IPC handle.
///
/// # Errors
/// [`Error::Gpu`] from `cuIpcGetMemHandle` or the UUID query;
/// [`Error::Daemon`] as [`crate::pe`]'s attach.
#[allow(clippy::too_many_arguments)]
pub(super) fn attach(
    cuda: &Arc<CudaContext>,
    queues: &GpuQueues,
    heap_base: u64,
    heap_size: u64,
    n_pes: i32,
    me: i32,
    tuning: &Tuning,
    boot: &Bootstrap,
    fabric: &FabricConfig,
    fds: Vec<OwnedFd>,
) -> Result<ProxyLink> {
    let gpu_err = |what: &'static str, source| Error::Gpu(GpuError::Cuda { what, source });
    let uuid = cuda.uuid().map_err(|e| gpu_err("cuDeviceGetUuid (naming the GPU's daemon)", e))?;
    let uuid: [u8; 16] = uuid.bytes.map(|b| b as u8);
    cuda.bind_to_thread().map_err(|e| gpu_err("cuCtxSetCurrent", e))?;
    let mut handle = cusys::CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: `heap_base` is the start of a cuMemAlloc allocation of the
    // current context (the caller's contract); `handle` is an out-parameter.
    unsafe { cusys::cuIpcGetMemHandle(&mut handle, heap_base) }
        .result()
        .map_err(|e| gpu_err("cuIpcGetMemHandle (the heap, for the proxy daemon)", e))?;
    let threads = tuning.gpu_proxy_threads.min(tuning.queues).max(1);
    let mut att = crate::pe::attach_message(me, n_pes, heap_size, 0, tuning.queues, queues.geometry(), threads, tuning, fabric);
    att.gpu = Some(GpuAttach {
        uuid,
        heap_ipc: handle.reserved.map(|c| c as u8),
        payload_bytes: queues.payload_slot_bytes(),
        tuning: tuning_vars(),
    });
    let paths = DaemonPaths::for_gpu(&tuning.proxyd_dir, &uuid_string(&uuid));
    crate::pe::attach_to_daemon(tuning, boot, &paths, att, fds)
}

/// The daemon's context on its GPU, made at the first GPU PE's attach.
static CONTEXT: Mutex<Option<Arc<CudaContext>>> = Mutex::new(None);

/// The daemon's context on the GPU of `uuid` (the primary context of the
/// visible device with that UUID).
fn daemon_context(uuid: &[u8; 16]) -> std::result::Result<Arc<CudaContext>, String> {
    let mut ctx = CONTEXT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(c) = ctx.as_ref() {
        return Ok(Arc::clone(c));
    }
    if !super::driver_present() {
        return Err("no CUDA driver (libcuda) in the daemon's process".into());
    }
    let n = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    for i in 0..n {
        let Ok(dev) = cu::device::get(i) else { continue };
        if cu::device::get_uuid(dev).is_ok_and(|u| u.bytes.map(|b| b as u8) == *uuid) {
            let c = CudaContext::new(i as usize).map_err(|e| format!("a context on device {i}: {e:?}"))?;
            *ctx = Some(Arc::clone(&c));
            return Ok(c);
        }
    }
    Err(format!("no visible CUDA device has UUID {} ({n} visible; CUDA_VISIBLE_DEVICES of the daemon?)", uuid_string(uuid)))
}

/// A PE's heap opened in the daemon's context; closed on drop.
struct ImportedHeap {
    base: u64,
    cuda: Arc<CudaContext>,
}

impl Drop for ImportedHeap {
    fn drop(&mut self) {
        let _ = self.cuda.bind_to_thread();
        // SAFETY: opened by cuIpcOpenMemHandle in `serve_gpu_pe`, closed once,
        // after the session's service threads (and their agents) stopped:
        // the session drops its proxies before its memory.
        let _ = unsafe { cusys::cuIpcCloseMemHandle(self.base) };
    }
}

/// What a GPU PE's session in the daemon keeps until its threads are gone.
pub(crate) struct GpuSessionMem {
    _heap: ImportedHeap,
    _queues: Arc<GpuQueues>,
}

/// The daemon's side: serve GPU PE `a` (its GPU part `g`, its memfds
/// `fds`) on this daemon's GPU `daemon_gpu` (`GPU-…`): map and register its
/// queues, open its heap, and spawn its service threads (the in-process
/// proxy's code, [`gpu_backend`]). Returns them and the memory to keep
/// until they are stopped.
///
/// # Errors
/// Why the PE is refused: another GPU than the daemon's (or a daemon of CPU
/// PEs), its tuning variables, its memfds, the IPC handle, the fabric.
pub(crate) fn serve_gpu_pe(a: &Attach, g: &GpuAttach, fds: &[OwnedFd], daemon_gpu: Option<&str>) -> std::result::Result<(Proxies, GpuSessionMem), String> {
    let theirs = uuid_string(&g.uuid);
    match daemon_gpu {
        Some(mine) if mine == theirs => {}
        Some(mine) => return Err(format!("this daemon serves {mine}; the PE's GPU is {theirs} (its daemon is proxyd-{theirs}.sock)")),
        None => return Err(format!("this daemon serves CPU PEs; a GPU PE attaches to its GPU's daemon (proxyd-{theirs}.sock)")),
    }
    let cuda = daemon_context(&g.uuid)?;
    cuda.bind_to_thread().map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
    let lookup = |k: &str| g.tuning.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let mut tuning = Tuning::from_lookup(lookup).map_err(|e| format!("the PE's tuning: {e}"))?;
    tuning.in_daemon = true;
    tuning.queues = a.queues as usize;
    let geom = QueueGeometry::new(a.depth).map_err(|e| format!("queue depth {}: {e}", a.depth))?;
    let queues = Arc::new(GpuQueues::import(a.queues as usize, geom, g.payload_bytes, fds).map_err(|e| e.to_string())?);
    let mut h = cusys::CUipcMemHandle_st { reserved: [0; 64] };
    for (d, &s) in h.reserved.iter_mut().zip(&g.heap_ipc) {
        *d = s as std::ffi::c_char;
    }
    let mut base: cusys::CUdeviceptr = 0;
    // SAFETY: `h` is 64 bytes the PE says came from cuIpcGetMemHandle; the
    // driver validates a handle (a bad one fails, it is not dereferenced by
    // us); the daemon's context is current; `base` is an out-parameter.
    let r = unsafe {
        cusys::cuIpcOpenMemHandle_v2(&mut base, h, cusys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint)
    };
    if r != cusys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuIpcOpenMemHandle of the PE's heap failed ({r:?})"));
    }
    let heap = ImportedHeap { base, cuda: Arc::clone(&cuda) };
    let fabric = FabricConfig {
        provider: a.provider.clone(),
        src_node: (!a.src_node.is_empty()).then(|| a.src_node.clone()),
        reach_timeout: Some(crate::env::DEFAULT_REACH_TIMEOUT),
    };
    let threads = (a.threads as usize).min(a.queues as usize).max(1);
    let gheap = GpuHeap { base, size: a.heap_size };
    let (backend, per_thread, _agent) = gpu_backend(&cuda, &queues, gheap, vec![None; a.n_pes as usize], a.pe, a.n_pes, threads, &tuning, &fabric)
        .map_err(|e| e.to_string())?;
    let limits = Limits { n_pes: a.n_pes, heap_size: a.heap_size };
    let proxies = Proxies::spawn(backend, a.pe, per_thread, limits, &a.provider, &tuning).map_err(|e| e.to_string())?;
    Ok((proxies, GpuSessionMem { _heap: heap, _queues: queues }))
}
