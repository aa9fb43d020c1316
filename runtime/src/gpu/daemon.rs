//! GPU PEs and the proxy daemon (DESIGN.md "The proxy daemon"; docs/runtime.md
//! "The proxy daemon, `cpnet-proxyd`").
//!
//! One daemon per GPU (`DIR/proxyd-<UUID>.sock`) serves every GPU PE on that
//! GPU, from one or several processes, each PE in a CUDA context of its own
//! in the daemon (so that one PE's set-up, which allocates, never waits for
//! another PE's landing agents: allocations synchronize a context). The
//! PE's queue pool, status block and payload slots live in sealed memfds
//! that both sides map; the PE registers them with CUDA
//! (`cuMemHostRegister(DEVICEMAP)`) for its kernels, the daemon reads them
//! with the CPU only ([`super::MappedHost::import`] says why) and copies
//! payloads from them as pageable memory. The symmetric heap is allocated by the daemon, in
//! the PE's context there, and reaches the PE (and its peers on the host)
//! as its CUDA IPC handle (Accepted's `gpu_heap`): a PE killed mid-run then
//! cannot free memory that the daemon's copies and agents still write (a
//! fault would, under MPS, tear down every process on the GPU); the daemon
//! frees it once the PE's services have stopped. The daemon runs the staged
//! transport and the landing agents on it exactly as the in-process proxy
//! does in the PE. The claim words stay the PE's own GPU memory.
//!
//! The landing agents are kernels of the daemon's context. Without MPS,
//! kernels of two processes do not run side by side on one GPU (they take
//! turns by time slice), so a PE's persistent kernel waiting for a signal
//! would wait for the daemon's turn: GPU PEs take the daemon by default
//! only where their GPU runs under MPS (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`),
//! and `CPNET_PROXY=daemon` without MPS is refused with that reason. Where
//! the default chose the daemon and none can be reached or started, the PE
//! keeps the in-process proxy (a warning); `CPNET_PROXY=daemon` makes that
//! an error.
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
use crate::env::{ProxyMode, QueuePlacement, Tuning};
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
/// otherwise (the module's note says why): [`choose_mode`] on this GPU.
///
/// # Errors
/// [`Error::Daemon`] for `CPNET_PROXY=daemon` on a GPU without MPS, or with
/// `CPNET_QUEUE_MEM=device` (the daemon maps host queues only).
pub(super) fn proxy_mode(cuda: &Arc<CudaContext>, tuning: &Tuning, me: i32) -> Result<ProxyMode> {
    choose_mode(tuning.proxy, mps_enabled(cuda), tuning.queue_mem).map_err(|why| Error::Daemon { pe: me, why: why.into() })
}

/// The choice of [`proxy_mode`]: `asked` (`CPNET_PROXY`, if set), whether
/// the GPU runs under MPS, and where the queues live.
///
/// # Errors
/// Why `CPNET_PROXY=daemon` cannot be served.
fn choose_mode(asked: Option<ProxyMode>, mps: bool, queue_mem: QueuePlacement) -> std::result::Result<ProxyMode, &'static str> {
    let mode = asked.unwrap_or(if mps && queue_mem == QueuePlacement::Host { ProxyMode::Daemon } else { ProxyMode::InProcess });
    if mode == ProxyMode::Daemon {
        if !mps {
            return Err("CPNET_PROXY=daemon for a GPU PE needs its GPU under MPS: the daemon's landing agents are kernels of \
                        another process, which without MPS take turns with this PE's kernels instead of running beside \
                        them (start MPS, ../shared/DEVICE.md or nvidia-cuda-mps-control -d; or CPNET_PROXY=inprocess)");
        }
        if queue_mem != QueuePlacement::Host {
            return Err("CPNET_QUEUE_MEM=device needs the in-process proxy (the daemon maps queues in host memory): set CPNET_PROXY=inprocess");
        }
    }
    Ok(mode)
}

/// The daemon's [`Tuning`] of this PE, as variables: first the values in
/// use for what the daemon's staged proxy reads (so that tuning a program
/// set in code, [`crate::GpuPe::init_with`], reaches it too; the Attach
/// carries queues, depth, threads, idle sleep and stall timeout itself),
/// then the PE's other `CPNET_*` variables (the daemon takes the first of a
/// name).
fn tuning_vars(t: &Tuning) -> Vec<(String, String)> {
    use crate::env::{AGENT_BYTES, AGENT_IDLE, AGENT_LANES, AGENT_SPLIT, STAGE_BUFS, STAGE_CHUNK, STAGE_CREDITS, STAGE_SHARED, STAGE_SLOT, STAGE_SLOTS};
    let mut v: Vec<(String, String)> = [
        (STAGE_CHUNK, t.stage_chunk.to_string()),
        (STAGE_CREDITS, t.stage_credits.to_string()),
        (STAGE_BUFS, t.stage_bufs.to_string()),
        (STAGE_SHARED, u8::from(t.stage_shared).to_string()),
        (STAGE_SLOT, t.stage_slot.to_string()),
        (STAGE_SLOTS, t.stage_slots.to_string()),
        (AGENT_BYTES, t.agent_bytes.to_string()),
        (AGENT_IDLE, t.agent_idle.as_micros().to_string()),
        (AGENT_LANES, t.agent_lanes.to_string()),
        (AGENT_SPLIT, u8::from(t.agent_split).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    v.extend(std::env::vars().filter(|(k, _)| k.starts_with("CPNET_") && !NOT_PASSED.contains(&k.as_str())));
    v.truncate(crate::daemon::wire::MAX_TUNING_VARS);
    v
}

/// The PE's side: attach to its GPU's daemon (starting it if none runs),
/// passing the queue memfds `fds` ([`GpuQueues::shared`]), and asking it
/// for a heap of `heap_size` bytes. Returns the link and the heap's IPC
/// handle (to open here, [`super::DeviceMem::open_ipc`], and to give to
/// the peers).
///
/// # Errors
/// [`Error::Gpu`] from the UUID query; [`Error::Daemon`] as
/// [`crate::pe`]'s attach, or an answer without a heap.
#[allow(clippy::too_many_arguments)]
pub(super) fn attach(
    cuda: &Arc<CudaContext>,
    queues: &GpuQueues,
    heap_size: u64,
    n_pes: i32,
    me: i32,
    tuning: &Tuning,
    boot: &Bootstrap,
    fabric: &FabricConfig,
    fds: Vec<OwnedFd>,
) -> Result<(ProxyLink, [u8; 64])> {
    let uuid = cuda.uuid().map_err(|source| Error::Gpu(GpuError::Cuda { what: "cuDeviceGetUuid (naming the GPU's daemon)", source }))?;
    let uuid: [u8; 16] = uuid.bytes.map(|b| b as u8);
    let threads = tuning.gpu_service_threads();
    let mut att = crate::pe::attach_message(me, n_pes, heap_size, 0, tuning.queues, queues.geometry(), threads, tuning, fabric);
    att.gpu = Some(GpuAttach { uuid, payload_bytes: queues.payload_slot_bytes(), tuning: tuning_vars(tuning) });
    let paths = DaemonPaths::for_gpu(&tuning.proxyd_dir, &uuid_string(&uuid));
    let link = crate::pe::attach_to_daemon(tuning, boot, &paths, att, fds)?;
    let handle: [u8; 64] = link.gpu_heap().and_then(|h| h.try_into().ok()).ok_or_else(|| Error::Daemon {
        pe: me,
        why: format!("{} accepted this GPU PE without a heap handle", paths.socket.display()),
    })?;
    Ok((link, handle))
}

/// The daemon's device: its ordinal among the visible devices, found at the
/// first GPU PE's attach.
static DEVICE: Mutex<Option<usize>> = Mutex::new(None);

/// A new context for one PE's session on the visible device of `uuid`.
fn session_context(uuid: &[u8; 16]) -> std::result::Result<Arc<CudaContext>, String> {
    let mut dev = DEVICE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let ordinal = match *dev {
        Some(o) => o,
        None => {
            if !super::driver_present() {
                return Err("no CUDA driver (libcuda) in the daemon's process".into());
            }
            let n = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
            let o = (0..n)
                .find(|&i| cu::device::get(i).is_ok_and(|d| cu::device::get_uuid(d).is_ok_and(|u| u.bytes.map(|b| b as u8) == *uuid)))
                .ok_or_else(|| format!("no visible CUDA device has UUID {} ({n} visible; CUDA_VISIBLE_DEVICES of the daemon?)", uuid_string(uuid)))?;
            *dev = Some(o as usize);
            o as usize
        }
    };
    CudaContext::new_non_primary(ordinal, 0).map_err(|e| format!("cuCtxCreate on device {ordinal}: {e:?}"))
}

/// A PE's heap, allocated by the daemon in the PE's context here; freed on
/// drop (after the PE's services stopped).
struct OwnedHeap {
    base: u64,
    handle: [u8; 64],
    cuda: Arc<CudaContext>,
}

impl OwnedHeap {
    fn new(cuda: &Arc<CudaContext>, size: u64) -> std::result::Result<OwnedHeap, String> {
        cuda.bind_to_thread().map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
        // SAFETY: the context is current; the allocation is owned by the
        // returned value (freed once, in Drop).
        let base = unsafe { cu::malloc_sync(size as usize) }.map_err(|e| format!("cuMemAlloc of the PE's heap ({size} bytes): {e:?}"))?;
        let mut heap = OwnedHeap { base, handle: [0; 64], cuda: Arc::clone(cuda) };
        // SAFETY: `base..base+size` is the allocation just made.
        unsafe { cu::memset_d8_sync(base, 0, size as usize) }.map_err(|e| format!("cuMemsetD8 of the PE's heap: {e:?}"))?;
        // The context is current (bound above); `base` starts an allocation of it.
        heap.handle = super::ipc_handle(base).map_err(|e| format!("cuIpcGetMemHandle of the PE's heap: {e:?}"))?;
        Ok(heap)
    }
}

impl Drop for OwnedHeap {
    fn drop(&mut self) {
        let _ = self.cuda.bind_to_thread();
        // SAFETY: allocated in `new`, freed once, after the session's service
        // threads (and their agents and copies) stopped: the session drops
        // its proxies before its memory.
        let _ = unsafe { cu::free_sync(self.base) };
    }
}

/// What a GPU PE's session in the daemon keeps until its threads are gone
/// (dropped in this order: the heap, the queues' registrations, then the
/// session's context).
pub(crate) struct GpuSessionMem {
    heap: OwnedHeap,
    _queues: Arc<GpuQueues>,
    _cuda: Arc<CudaContext>,
}

impl GpuSessionMem {
    /// The heap's IPC handle, for the PE.
    pub(crate) fn heap_handle(&self) -> &[u8; 64] {
        &self.heap.handle
    }
}

/// The daemon's side: serve GPU PE `a` (its GPU part `g`, its memfds
/// `fds`) on this daemon's GPU `daemon_gpu` (`GPU-…`): a context of its own
/// on that GPU, its queues mapped (CPU only), its heap allocated
/// there, and its service threads spawned (the in-process proxy's code,
/// [`gpu_backend`]). Returns them and the memory to keep until they are
/// stopped. Logs the time each step took (debug).
///
/// # Errors
/// Why the PE is refused: another GPU than the daemon's (or a daemon of CPU
/// PEs), its tuning variables, its memfds, the heap, the fabric.
pub(crate) fn serve_gpu_pe(a: &Attach, g: &GpuAttach, fds: &[OwnedFd], daemon_gpu: Option<&str>) -> std::result::Result<(Proxies, GpuSessionMem), String> {
    let theirs = uuid_string(&g.uuid);
    match daemon_gpu {
        Some(mine) if mine == theirs => {}
        Some(mine) => return Err(format!("this daemon serves {mine}; the PE's GPU is {theirs} (its daemon is proxyd-{theirs}.sock)")),
        None => return Err(format!("this daemon serves CPU PEs; a GPU PE attaches to its GPU's daemon (proxyd-{theirs}.sock)")),
    }
    let t = std::time::Instant::now();
    let step = |what: &str| tracing::debug!(pe = a.pe, "GPU session set-up: {what} at {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let lookup = |k: &str| g.tuning.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let mut tuning = Tuning::from_lookup(lookup).map_err(|e| format!("the PE's tuning: {e}"))?;
    tuning.in_daemon = true;
    tuning.queues = a.queues as usize;
    let geom = QueueGeometry::new(a.depth).map_err(|e| format!("queue depth {}: {e}", a.depth))?;
    let cuda = session_context(&g.uuid)?;
    step("context");
    let queues = Arc::new(GpuQueues::import(a.queues as usize, geom, g.payload_bytes, fds).map_err(|e| e.to_string())?);
    step("queues mapped");
    let heap = OwnedHeap::new(&cuda, a.heap_size)?;
    step("heap allocated");
    let fabric = FabricConfig {
        provider: a.provider.clone(),
        src_node: (!a.src_node.is_empty()).then(|| a.src_node.clone()),
        reach_timeout: Some(crate::env::DEFAULT_REACH_TIMEOUT),
    };
    let threads = (a.threads as usize).min(a.queues as usize).max(1);
    let gheap = GpuHeap { base: heap.base, size: a.heap_size };
    let (backend, per_thread, _agent) = gpu_backend(&cuda, &queues, gheap, vec![None; a.n_pes as usize], a.pe, a.n_pes, threads, &tuning, &fabric)
        .map_err(|e| e.to_string())?;
    step("landing agent loaded");
    let limits = Limits { n_pes: a.n_pes, heap_size: a.heap_size };
    let proxies = Proxies::spawn(backend, a.pe, per_thread, limits, &a.provider, &tuning).map_err(|e| e.to_string())?;
    step("service threads started");
    Ok((proxies, GpuSessionMem { heap, _queues: queues, _cuda: cuda }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_is_the_default_under_mps_and_refused_without() {
        use ProxyMode::{Daemon, InProcess};
        use QueuePlacement::{Device, Host};
        assert_eq!(choose_mode(None, true, Host), Ok(Daemon), "unset, MPS: the daemon");
        assert_eq!(choose_mode(None, false, Host), Ok(InProcess), "unset, no MPS: in process");
        assert_eq!(choose_mode(None, true, Device), Ok(InProcess), "queues in GPU memory: in process");
        assert_eq!(choose_mode(Some(InProcess), true, Host), Ok(InProcess), "asked for in process");
        assert_eq!(choose_mode(Some(Daemon), true, Host), Ok(Daemon));
        assert!(choose_mode(Some(Daemon), false, Host).unwrap_err().contains("needs its GPU under MPS"));
        assert!(choose_mode(Some(Daemon), true, Device).unwrap_err().contains("CPNET_QUEUE_MEM=device"));
    }

    #[test]
    fn the_daemon_reads_back_the_tuning_in_use() {
        let t = Tuning {
            stage_chunk: 128 << 10,
            stage_credits: 3,
            stage_bufs: 7,
            stage_shared: false,
            stage_slot: 64 << 10,
            stage_slots: 3,
            agent_bytes: 4096,
            agent_idle: std::time::Duration::from_micros(350),
            agent_lanes: 2,
            ..Tuning::default()
        };
        let vars = tuning_vars(&t);
        assert!(vars.iter().all(|(k, _)| k != crate::env::JOB_TOKEN), "the job's token is not passed");
        let back = Tuning::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())).unwrap();
        assert_eq!(
            (back.stage_chunk, back.stage_credits, back.stage_bufs, (back.stage_shared, back.stage_slot, back.stage_slots), back.agent_bytes, back.agent_idle, back.agent_lanes),
            (t.stage_chunk, t.stage_credits, t.stage_bufs, (t.stage_shared, t.stage_slot, t.stage_slots), t.agent_bytes, t.agent_idle, t.agent_lanes)
        );
    }
}
