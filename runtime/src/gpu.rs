//! GPU PEs: [`GpuPe`] (one PE per GPU, the symmetric heap in GPU memory),
//! and its pieces: the CUDA device of a PE, command queues in pinned host
//! memory mapped into the GPU or in GPU memory (`CPNET_QUEUE_MEM`,
//! [`GpuQueues`]), the status block, the kernel handle, and kernel builds
//! through the NVRTC helper.
//!
//! Everything goes through cudarc with dynamic loading, so cpnet builds and
//! runs its CPU paths on machines without CUDA; [`open_device`] says clearly
//! why no GPU is usable.
//!
//! The data path to other PEs is the staged transport
//! ([`cpnet_proxy::staged`]): the libfabric that Debian and Ubuntu ship
//! cannot reach GPU memory, so proxies move data through pinned host
//! buffers and apply it to the target's GPU heap with asynchronous copies.

use std::sync::Arc;

use cpnet_device::layout::{
    ErrorCode, Handle, Status,
};
use cpnet_device::ring::{QueueGeometry, QueueMem};
use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::Cmp;
use cpnet_proxy::decode::Limits;
use cpnet_proxy::mirror::QueueMirror;
use cpnet_proxy::service::{CommandError, Service};
use cpnet_proxy::agent::AgentKernel;
use cpnet_proxy::staged::{GpuHeap, PeShared, StagedConfig, StagedEndpoint, StagedTransport};
use cpnet_proxy::transport::EndpointFacts;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError};

use crate::bootstrap::Bootstrap;
use crate::env::{Launch, Tuning};
use crate::core::{PeCore, SHMALLOC_ALIGN};
use crate::error::{Error, Result};
pub use crate::error::GpuError;
use crate::startup::{self, PeKind, Traffic};
use cpnet_proxy::transport::FabricConfig;
use crate::proxy_link::ProxyLink;
use crate::proxy_threads::{Backend, Proxies};
use cudarc::driver::{result as cu, sys as cusys};

mod daemon;
pub(crate) use daemon::{GpuSessionMem, serve_gpu_pe};
mod queues;
pub use queues::{GpuQueues, MappedHost};
mod module;
mod alltoall_grid;
mod alltoall_net;
mod reduce_net;
mod grid;
mod pair_stage;
mod on_stream;
mod reduce_grid;
mod team;

pub use module::{build_module, is_loaded, persistent_blocks};
pub use on_stream::ON_STREAM_THREADS;
pub use alltoall_grid::GRID_MIN_BYTES as ALLTOALL_GRID_MIN_BYTES;
pub use alltoall_net::NET_MIN_BYTES as ALLTOALL_NET_MIN_BYTES;
pub use reduce_grid::GRID_MIN_BYTES as REDUCE_GRID_MIN_BYTES;
use module::landing_agent;

/// Whether the CUDA driver library can be loaded (without loading CUDA).
pub fn driver_present() -> bool {
    // SAFETY: only dlopens the candidate library names and closes them.
    unsafe { cusys::is_culib_present() }
}

/// The CUDA device of the PE with local rank `local_pe`: device
/// `local_pe % device_count` (one PE per GPU when a host runs as many PEs as
/// it has GPUs), with its primary context bound to the calling thread.
///
/// # Errors
/// [`GpuError::NoDriver`], [`GpuError::NoDevice`].
pub fn open_device(local_pe: i32) -> std::result::Result<Arc<CudaContext>, GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    let count = CudaContext::device_count()
        .map_err(|source| GpuError::NoDevice { what: "cuDeviceGetCount".into(), source })?;
    if count <= 0 {
        return Err(GpuError::NoDevice {
            what: "the driver reports 0 devices".into(),
            source: DriverError(cusys::cudaError_enum::CUDA_ERROR_NO_DEVICE),
        });
    }
    let ordinal = local_pe.rem_euclid(count) as usize;
    CudaContext::new(ordinal)
        .map_err(|source| GpuError::NoDevice { what: format!("cuCtxCreate on device {ordinal} of {count}"), source })
}

/// A [`Handle`] as a kernel argument, passed by value (`CPNET_HANDLE_BYTES`, 88 bytes).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct KernelHandle(pub Handle);

// SAFETY: Handle is repr(C) plain integers laid out as cpnet_handle_t
// (layout.rs asserts every offset against cmd.h).
unsafe impl DeviceRepr for KernelHandle {}

/// GPU memory (`cuMemAlloc`), zeroed, freed on drop: the symmetric heap,
/// and the queue pool of [`crate::env::QueuePlacement::Device`].
#[derive(Debug)]
struct DeviceMem {
    base: u64,
    size: u64,
    cuda: Arc<CudaContext>,
    /// Opened from another process's IPC handle ([`DeviceMem::open_ipc`]):
    /// closed, not freed, on drop.
    imported: bool,
}

impl DeviceMem {
    /// `size` zeroed bytes of `cuda`'s memory; `alloc` and `zero` name the
    /// two calls in errors.
    fn new(cuda: &Arc<CudaContext>, size: u64, alloc: &'static str, zero: &'static str) -> std::result::Result<DeviceMem, GpuError> {
        cuda.bind_to_thread().map_err(|source| GpuError::Cuda { what: "cuCtxSetCurrent", source })?;
        // SAFETY: the context is current; the allocation is owned by the
        // returned value and freed once, in Drop.
        let base = unsafe { cu::malloc_sync(size as usize) }.map_err(|source| GpuError::Cuda { what: alloc, source })?;
        let mem = DeviceMem { base, size, cuda: Arc::clone(cuda), imported: false };
        // SAFETY: `base..base+size` is the allocation just made.
        unsafe { cu::memset_d8_sync(base, 0, size as usize) }.map_err(|source| GpuError::Cuda { what: zero, source })?;
        Ok(mem)
    }
}

/// The CUDA IPC handle (64 bytes) of the allocation that starts at `base`
/// (`cuIpcGetMemHandle`). The allocation's context must be current.
fn ipc_handle(base: u64) -> std::result::Result<[u8; 64], DriverError> {
    let mut h = cusys::CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: `h` is an out-parameter; the driver checks that `base` starts
    // an allocation of the current context (an error otherwise).
    unsafe { cusys::cuIpcGetMemHandle(&mut h, base) }.result()?;
    Ok(h.reserved.map(|c| c as u8))
}

/// Maps another process's allocation from its IPC `handle` into the
/// current context (`cuIpcOpenMemHandle`, peer access enabled lazily); the
/// caller closes it with `cuIpcCloseMemHandle`.
fn ipc_open(handle: &[u8; 64]) -> std::result::Result<u64, DriverError> {
    let h = cusys::CUipcMemHandle_st { reserved: handle.map(|b| b as std::ffi::c_char) };
    let mut base: cusys::CUdeviceptr = 0;
    // SAFETY: `h` is 64 bytes that another process got from
    // cuIpcGetMemHandle (the driver validates it; a bad one fails); a
    // context is current (the caller's contract); `base` is an out-parameter.
    unsafe { cusys::cuIpcOpenMemHandle_v2(&mut base, h, cusys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint) }
        .result()?;
    Ok(base)
}

impl DeviceMem {
    /// `size` bytes of GPU memory another process allocated and exported
    /// (`handle`, from `cuIpcGetMemHandle`): a GPU PE's heap that its daemon
    /// allocated ([`daemon::attach`]), mapped into `cuda`; closed, not
    /// freed, on drop.
    fn open_ipc(cuda: &Arc<CudaContext>, handle: &[u8; 64], size: u64) -> std::result::Result<DeviceMem, GpuError> {
        cuda.bind_to_thread().map_err(|source| GpuError::Cuda { what: "cuCtxSetCurrent", source })?;
        let base = ipc_open(handle).map_err(|source| GpuError::Cuda { what: "cuIpcOpenMemHandle (the heap the proxy daemon allocated)", source })?;
        Ok(DeviceMem { base, size, cuda: Arc::clone(cuda), imported: true })
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        let _ = self.cuda.bind_to_thread();
        if self.imported {
            // SAFETY: opened in `open_ipc`, closed once; the owner drops it
            // after every kernel using it has ended.
            let _ = unsafe { cusys::cuIpcCloseMemHandle(self.base) };
            return;
        }
        // SAFETY: allocated by cuMemAlloc in `new`, freed once; the owner
        // drops it after every kernel and proxy thread using it has ended.
        let _ = unsafe { cu::free_sync(self.base) };
    }
}

/// The heaps of the other GPU PEs of this host, mapped into this process
/// with CUDA IPC (`cuIpcOpenMemHandle`), closed on drop.
#[derive(Debug)]
struct PeerHeaps {
    /// Per PE: the mapped base, where mapped.
    bases: Vec<Option<u64>>,
    cuda: Arc<CudaContext>,
}

impl PeerHeaps {
    /// Exchange IPC handles of every PE's heap (**collective**, an
    /// allgather) and open those of the other PEs on this host. A handle
    /// that does not open leaves that PE on the staged path (logged).
    /// `exported`: the heap's IPC handle where another process exported it
    /// (the daemon's heap of a GPU PE); else this PE exports its own.
    fn exchange(boot: &Bootstrap, me: i32, heap: &DeviceMem, enabled: bool, exported: Option<&[u8; 64]>) -> Result<PeerHeaps> {
        let mut card = Vec::new();
        let id = crate::team::host_id();
        let handle = match exported {
            _ if !enabled || id.is_empty() => None,
            Some(h) => Some(*h),
            None => ipc_handle(heap.base)
                .inspect_err(|e| tracing::warn!("PE {me}: cuIpcGetMemHandle failed ({e:?}): peers on this host use the staged path"))
                .ok(),
        };
        let ok = handle.is_some();
        if let Some(h) = handle {
            card.extend_from_slice(&(id.len() as u32).to_le_bytes());
            card.extend_from_slice(&id);
            card.extend_from_slice(&h);
        }
        let all = boot.allgather(&card).map_err(|cause| Error::Bootstrap { pe: me, cause })?;
        let mut bases = vec![None; all.len()];
        for (peer, c) in all.iter().enumerate() {
            if peer as i32 == me || !ok || c.len() < 4 {
                continue;
            }
            let n = u32::from_le_bytes(c[..4].try_into().expect("4 bytes")) as usize;
            if c.len() != 4 + n + 64 || c[4..4 + n] != id[..] {
                continue; // another host, or IPC off there
            }
            let h: &[u8; 64] = c[4 + n..].try_into().expect("64 bytes: the length was checked");
            // The heap's context is current (DeviceMem::new or open_ipc bound it).
            match ipc_open(h) {
                Ok(base) => bases[peer] = Some(base),
                Err(e) => tracing::warn!("PE {me}: cuIpcOpenMemHandle for PE {peer}'s heap failed ({e:?}): staged path to it"),
            }
        }
        Ok(PeerHeaps { bases, cuda: Arc::clone(&heap.cuda) })
    }
}

/// The peer-to-peer table of the handle (`cpnet_handle_t.peers`): `n_pes`
/// `u64` words in GPU memory, word `i` the address at which this PE's
/// kernels reach PE `i`'s heap with their own loads and stores (the own
/// heap, or a [`PeerHeaps`] mapping), 0 where they cannot.
fn p2p_table(cuda: &Arc<CudaContext>, me: i32, heap: &DeviceMem, peers: &PeerHeaps) -> std::result::Result<DeviceMem, GpuError> {
    let words: Vec<u64> =
        peers.bases.iter().enumerate().map(|(i, b)| if i as i32 == me { heap.base } else { b.unwrap_or(0) }).collect();
    let table = DeviceMem::new(
        cuda,
        8 * words.len().max(1) as u64,
        "cuMemAlloc (peer-to-peer table)",
        "cuMemsetD8 (peer-to-peer table)",
    )?;
    // SAFETY: `words` fits the allocation just made (8 bytes per PE); the
    // copy is synchronous.
    unsafe { cu::memcpy_htod_sync(table.base, &words) }
        .map_err(|source| GpuError::Cuda { what: "cuMemcpyHtoD (peer-to-peer table)", source })?;
    Ok(table)
}

impl Drop for PeerHeaps {
    fn drop(&mut self) {
        let _ = self.cuda.bind_to_thread();
        for b in self.bases.iter().flatten() {
            // SAFETY: opened by cuIpcOpenMemHandle in `exchange`, closed once,
            // after the proxy threads that copy through it were joined.
            let _ = unsafe { cusys::cuIpcCloseMemHandle(*b) };
        }
    }
}

/// The GPU PE's transport: the staged path (DESIGN.md "Data paths"); and,
/// for queues in GPU memory, each thread's queue mirror.
/// A GPU PE's steps 3 and 4 of the start-up ([`crate::startup`]): the heap
/// in GPU memory, the queues, the CUDA IPC exchange; the staged proxy threads.
struct GpuKind {
    cuda: Arc<CudaContext>,
    /// The landing agent's function once the proxy loaded it (for
    /// [`GpuPe::max_persistent_blocks`], which sets its carveout).
    agent: Arc<std::sync::OnceLock<CudaFunction>>,
}

/// A GPU PE's heap, queues and peer mappings.
struct GpuParts {
    stream: Arc<CudaStream>,
    peers: PeerHeaps,
    p2p: Option<DeviceMem>,
    queues: Arc<GpuQueues>,
    heap: DeviceMem,
    /// With the daemon: the link made at the heap's step (the daemon
    /// allocates the heap), until step 4 hands it on.
    daemon_link: Option<ProxyLink>,
}

impl PeKind for GpuKind {
    type Parts = GpuParts;
    const TRAFFIC: Traffic = Traffic::Messages;

    fn heap(&mut self, launch: &Launch, tuning: &Tuning, boot: &Bootstrap, fabric: &FabricConfig, heap_size: u64) -> Result<GpuParts> {
        let (cuda, me) = (&self.cuda, launch.pe);
        let geom = QueueGeometry::new(tuning.queue_depth).map_err(|cause| Error::Queue { pe: me, cause })?;
        let mut served = None;
        if daemon::proxy_mode(cuda, tuning, me)? == crate::env::ProxyMode::Daemon {
            // The daemon allocates the heap (gpu/daemon.rs says why): attach
            // now, with the fabric step 4 would use.
            let attach = || -> Result<_> {
                let (q, fds) = GpuQueues::shared(cuda, tuning.queues, geom, tuning.payload_slot_bytes(), me)?;
                let (link, handle) = daemon::attach(cuda, &q, heap_size, launch.n_pes, me, tuning, boot, fabric, fds)?;
                Ok((DeviceMem::open_ipc(cuda, &handle, heap_size)?, q, Some(link), Some(handle)))
            };
            match attach() {
                Ok(s) => served = Some(s),
                // The default, not the user's choice: serve this PE in
                // process. Only for the daemon's own errors (not reached, not
                // started, refused): they come after the job-key exchange, so
                // every PE has made the same collective calls either way.
                Err(e @ Error::Daemon { .. }) if tuning.proxy.is_none() => {
                    tracing::warn!(
                        "PE {me}: no proxy daemon for this GPU ({e}); this PE keeps the in-process proxy \
                         (CPNET_PROXY=inprocess chooses it, CPNET_PROXY=daemon requires the daemon)"
                    );
                }
                Err(e) => return Err(e),
            }
        }
        let (heap, queues, daemon_link, exported) = match served {
            Some(s) => s,
            None => {
                let heap = DeviceMem::new(
                    cuda,
                    heap_size,
                    "cuMemAlloc (symmetric heap; lower CPNET_HEAP_SIZE?)",
                    "cuMemsetD8 (zero the symmetric heap)",
                )?;
                let mut q = GpuQueues::with_placement(cuda, tuning.queues, geom, tuning.queue_mem)?;
                q.set_payload(tuning.payload_slot_bytes())?;
                (heap, q, None, None)
            }
        };
        let queues = Arc::new(queues);
        let peers = PeerHeaps::exchange(boot, me, &heap, tuning.gpu_ipc, exported.as_ref())?;
        let p2p = if tuning.gpu_p2p { Some(p2p_table(cuda, me, &heap, &peers)?) } else { None };
        let stream = cuda.new_stream().map_err(|source| GpuError::Cuda { what: "cuStreamCreate (application stream)", source })?;
        Ok(GpuParts { stream, peers, p2p, queues, heap, daemon_link })
    }

    fn reserve(tuning: &Tuning) -> u64 {
        tuning.reduce_scratch
    }

    fn proxy(&mut self, parts: &mut GpuParts, launch: &Launch, tuning: &Tuning, _boot: &Bootstrap, fabric: &FabricConfig) -> Result<ProxyLink> {
        let me = launch.pe;
        let heap_size = parts.heap.size;
        let threads = tuning.gpu_service_threads();
        if let Some(link) = parts.daemon_link.take() {
            // The agent is loaded here too: GpuPe::max_persistent_blocks
            // reads its attributes to leave room for the daemon's agents.
            let agent = landing_agent(&self.cuda, tuning)?;
            let _ = self.agent.set(agent.function);
            return Ok(link);
        }
        let heap = GpuHeap { base: parts.heap.base, size: heap_size };
        // PEs that share this GPU without MPS take turns on it, and a
        // landing agent with them: copies stay on the copy engines there.
        let mut tuning = tuning.clone();
        if tuning.agent_split && pes_on_device(launch) > 1 && !daemon::mps_enabled(&self.cuda) {
            tuning.agent_split = false;
        }
        let (backend, per_thread, agent) =
            gpu_backend(&self.cuda, &parts.queues, heap, parts.peers.bases.clone(), me, launch.n_pes, threads, &tuning, fabric)?;
        let _ = self.agent.set(agent);
        let limits = Limits { n_pes: launch.n_pes, heap_size };
        Proxies::spawn(backend, me, per_thread, limits, &fabric.provider, &tuning).map(ProxyLink::from)
    }

    fn abort(parts: &GpuParts) -> Box<dyn Fn(ErrorCode) + Send + Sync> {
        let q = Arc::clone(&parts.queues);
        Box::new(move |code| q.abort(code))
    }
}

/// [`GpuPe::pes_on_device`] of the PE that `launch` describes.
fn pes_on_device(launch: &Launch) -> u32 {
    let count = CudaContext::device_count().map_or(1, |c| c.max(1));
    let (lp, ls) = (launch.local_pe, launch.local_size.max(1));
    let mine = lp.rem_euclid(count);
    ((0..ls).filter(|p| p.rem_euclid(count) == mine).count() as u32).max(1)
}

/// What [`gpu_backend`] builds: the backend, each service thread's queue
/// views, and the landing agent's function.
type StagedProxy = (Arc<GpuBackend>, Vec<Vec<QueueMem>>, CudaFunction);

/// The staged proxy of GPU PE `me` (of `n_pes`) over `queues` and `heap`
/// (device addresses in `cuda`'s context; `peer_heaps`: the other PEs'
/// heaps mapped there, for IPC copies), served by `threads` service
/// threads: the backend, each thread's queue views, and the landing agent's
/// function. The same in the PE (in-process proxy) and in the daemon.
///
/// # Errors
/// [`GpuError`] loading the landing agent.
#[allow(clippy::too_many_arguments)]
fn gpu_backend(
    cuda: &Arc<CudaContext>,
    queues: &Arc<GpuQueues>,
    heap: GpuHeap,
    peer_heaps: Vec<Option<u64>>,
    me: i32,
    n_pes: i32,
    threads: usize,
    tuning: &Tuning,
    fabric: &FabricConfig,
) -> std::result::Result<StagedProxy, GpuError> {
    let cfg = StagedConfig {
        fabric: fabric.clone(),
        chunk: tuning.stage_chunk as usize,
        credits: tuning.stage_credits,
        send_bufs: tuning.stage_bufs,
        shared: tuning.stage_shared,
        slot: tuning.stage_slot as usize,
        slots: tuning.stage_slots,
    };
    let agent = landing_agent(cuda, tuning)?;
    let function = agent.function.clone();
    let n = queues.len();
    let indices: Vec<Vec<usize>> = (0..threads).map(|t| (t..n).step_by(threads).collect()).collect();
    // The proxy's views: the queues, or (CPNET_QUEUE_MEM=device) the host
    // shadows that the threads' mirrors keep. The watchdog reads them.
    let per_thread: Vec<Vec<QueueMem>> = indices.iter().map(|qs| qs.iter().map(|&q| queues.queue(q)).collect()).collect();
    let backend = Arc::new(GpuBackend {
        cfg,
        cuda: Arc::clone(cuda),
        me,
        n_pes,
        heap,
        shared: Arc::new(PeShared::default()),
        peer_heaps,
        agent,
        queues: Arc::clone(queues),
        per_thread: indices,
    });
    Ok((backend, per_thread, function))
}

struct GpuBackend {
    cfg: StagedConfig,
    cuda: Arc<CudaContext>,
    me: i32,
    n_pes: i32,
    heap: GpuHeap,
    shared: Arc<PeShared>,
    peer_heaps: Vec<Option<u64>>,
    agent: AgentKernel,
    queues: Arc<GpuQueues>,
    /// Per thread: the pool indices of its queues, in its order.
    per_thread: Vec<Vec<usize>>,
}

impl Backend for GpuBackend {
    type Endpoint = StagedEndpoint;
    type Transport = StagedTransport;
    fn open(&self, _t: usize) -> std::result::Result<StagedEndpoint, String> {
        StagedEndpoint::open(
            &self.cfg,
            Arc::clone(&self.cuda),
            self.me,
            self.n_pes,
            self.heap,
            Arc::clone(&self.shared),
            self.peer_heaps.clone(),
            self.agent.clone(),
        )
            .map_err(|e| e.to_string())
    }
    fn card(ep: &StagedEndpoint) -> Vec<u8> {
        ep.card()
    }
    fn connect(&self, ep: StagedEndpoint, cards: Vec<Vec<u8>>) -> std::result::Result<StagedTransport, String> {
        ep.connect(&cards).map_err(|e| e.to_string())
    }
    fn describe(tr: &StagedTransport) -> EndpointFacts {
        let (fabric, domain, addrs) = tr.addresses();
        EndpointFacts {
            provider: tr.provider().to_owned(),
            fabric: fabric.to_owned(),
            domain: domain.to_owned(),
            local_addr: addrs.get(tr.my_pe() as usize).cloned().unwrap_or_default(),
            peer_addrs: addrs.to_vec(),
        }
    }
    fn mirror(&self, t: usize) -> Option<std::result::Result<QueueMirror, String>> {
        self.queues.mirror(&self.cuda, &self.per_thread[t]).map_err(|e| e.to_string()).transpose()
    }
    fn configure(&self, t: usize, service: &mut Service<StagedTransport>) {
        self.queues.configure_service(service, &self.per_thread[t]);
    }
}

/// This process's PE on a GPU: one PE per GPU (device = local rank % GPU
/// count), the symmetric heap in GPU memory, the command queues in pinned
/// host memory mapped into the GPU (default) or in GPU memory
/// (`CPNET_QUEUE_MEM=device`, [`GpuQueues`]), the status block in mapped
/// memory, and proxy service threads that carry kernels' commands over the
/// staged transport.
///
/// ```no_run
/// # fn main() -> std::result::Result<(), cpnet::pe::Error> {
/// use cudarc::driver::{LaunchConfig, PushKernelArg};
/// let pe = cpnet::GpuPe::init()?;                       // collective
/// let buf = pe.shmalloc(4096)?;                         // collective
/// let m = pe.build_module("ring", r#"
///   #include <cpnet/device.cuh>
///   extern "C" __global__ void ring(cpnet_handle_t h, int* buf) {
///     __shared__ cpnet_ctx_t ctx;
///     if (cpnet_ctx_create(&h, &ctx) != CPNET_E_OK) return;
///     cpnet_int_p(&ctx, buf, h.my_pe, (h.my_pe + 1) % h.n_pes);
///     cpnet_ctx_destroy(&ctx);
///   }"#)?;
/// let f = m.load_function("ring").expect("kernel");
/// let (h, p) = (pe.handle(), pe.dev_ptr(buf));
/// let mut b = pe.stream().launch_builder(&f);
/// b.arg(&h).arg(&p);
/// unsafe { b.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 }) }
///     .expect("launch");
/// pe.synchronize()?;
/// pe.barrier_all()?;                                    // collective
/// pe.finalize()?;                                       // collective
/// # Ok(()) }
/// ```
pub struct GpuPe {
    // First: its threads end before the heap and queues below are freed.
    core: PeCore,
    stream: Arc<CudaStream>,
    peers: PeerHeaps,
    /// `None`: `CPNET_GPU_P2P=0`, every operation goes through the queues.
    p2p: Option<DeviceMem>,
    queues: Arc<GpuQueues>,
    /// The kernels' team table (`cpnet_handle_t.teams`).
    teams: team::TeamTable,
    /// The landing agent's function (its carveout follows the persistent
    /// kernels', [`GpuPe::max_persistent_blocks`]).
    agent: Arc<std::sync::OnceLock<CudaFunction>>,
    /// The `_on_stream` collectives' kernels built so far.
    on_stream: on_stream::OnStreamKernels,
    /// The network path's in-place reduce scratch (`CPNET_REDUCE_SCRATCH`).
    reduce_scratch: reduce_net::Scratch,
    /// The grid launches' words.
    grid_words: grid::GridWords,
    /// The world team of two's halves in host memory (a job of two).
    pair_stage: Option<pair_stage::PairStage>,
    heap: DeviceMem,
    cuda: Arc<CudaContext>,
}

impl std::fmt::Debug for GpuPe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPe")
            .field("my_pe", &self.core.launch.pe)
            .field("n_pes", &self.core.launch.n_pes)
            .field("device", &self.cuda.ordinal())
            .field("provider", &self.core.provider())
            .field("heap_size", &self.heap.size)
            .finish_non_exhaustive()
    }
}

impl GpuPe {
    /// Start this PE on its GPU (`shmem_init`, OpenSHMEM 1.5 §9.2.1).
    /// **Collective.** Reads the launch and tuning environment
    /// ([`crate::env`]), opens device `local rank % device count`, allocates
    /// `CPNET_HEAP_SIZE` bytes of GPU memory for the symmetric heap (zeroed),
    /// `CPNET_QUEUES` queues placed as `CPNET_QUEUE_MEM` says (mapped pinned
    /// memory, or GPU memory served through copies), and starts
    /// `CPNET_PROXY_THREADS` (default 4 for GPU PEs) proxy threads on the
    /// staged transport (with a queue mirror each for GPU-memory queues).
    ///
    /// # Errors
    /// [`Error::Gpu`] (no driver, no device, allocation failed),
    /// [`Error::Env`], [`Error::Bootstrap`], [`Error::Proxy`] (provider
    /// missing or lacking messages), [`Error::Queue`].
    pub fn init() -> Result<GpuPe> {
        let launch = Launch::from_env()?;
        let tuning = Tuning::from_env()?;
        GpuPe::init_with(launch, tuning)
    }

    /// [`GpuPe::init`] with explicit launch facts and tuning. **Collective.**
    ///
    /// # Errors
    /// As [`GpuPe::init`].
    pub fn init_with(launch: Launch, tuning: Tuning) -> Result<GpuPe> {
        // Step 1 of the start-up (crate::startup): the device first, so that a
        // machine without a GPU says so before any rendezvous is attempted.
        startup::init_logging();
        let cuda = open_device(launch.local_pe)?;
        let threads = tuning.gpu_service_threads();
        let agent = Arc::new(std::sync::OnceLock::new());
        let (core, parts) = startup::start(launch, tuning, GpuKind { cuda: Arc::clone(&cuda), agent: Arc::clone(&agent) })?;
        let GpuParts { stream, peers, p2p, queues, heap, daemon_link: _ } = parts;
        let me = core.my_pe();
        let teams = team::TeamTable::new(&cuda, &core.teams)?;
        // PeKind::reserve's bytes: past the heap and the teams' scratch.
        let scratch_at = SymAddr(core.heap_size + core.tuning.team_scratch * core.tuning.teams as u64);
        let reduce_scratch = reduce_net::Scratch::new(scratch_at, core.tuning.reduce_scratch);
        let grid_words = grid::GridWords::new(&cuda)?;
        let mut pe = GpuPe {
            core,
            stream,
            peers,
            p2p,
            queues,
            teams,
            agent,
            on_stream: Default::default(),
            reduce_scratch,
            grid_words,
            pair_stage: None,
            heap,
            cuda,
        };
        pe.pair_stage = pe.open_pair_stage()?;
        tracing::debug!(pe = me, n_pes = pe.n_pes(), device = pe.cuda.ordinal(), provider = %pe.core.provider(), threads, queue_mem = %pe.queues.placement(), "cpnet GPU PE up");
        if pe.core.tuning.transport_map {
            crate::transport_map::print(&pe.transport_map());
        }
        Ok(pe)
    }

    /// How many PEs of this host share this PE's GPU (PEs take device
    /// `local_pe % device_count`, [`open_device`]): 1 with one PE per GPU,
    /// 2 or more when PEs share a GPU under MPS. A persistent kernel that
    /// sizes its grid to fill the GPU must take only this share of it, or
    /// the PEs' cooperative grids cannot all be resident at once. Local.
    pub fn pes_on_device(&self) -> u32 {
        pes_on_device(&self.core.launch)
    }

    /// Landing agents (one block of `CPNET_AGENT_THREADS` threads each,
    /// `cpnet/agent.cuh`) this PE's proxy may run on its GPU at once: one
    /// per landing lane of every proxy thread (`CPNET_PROXY_THREADS` x
    /// `CPNET_AGENT_LANES`). Any operation a kernel hands to the proxy may
    /// need one: on the staged path every small put, signal and AMO lands
    /// through it, and on the others the ADD signal of a put the copy engine
    /// moves (a put larger than the peer-store threshold, a put to itself).
    /// Local.
    pub fn landing_agents(&self) -> u32 {
        let t = &self.core.tuning;
        (t.gpu_service_threads() * t.agent_lanes.max(1)) as u32
    }

    /// The most blocks of `threads` threads (with `dynamic_smem` bytes of
    /// dynamic shared memory each) of `func` that a persistent kernel of
    /// this PE may launch so that all of them are resident at once **and**
    /// its landing agents still find room beside them; sets `func`'s and
    /// the agents' preferred shared-memory carveout to the same value. Call
    /// it before launching the kernel. Local.
    ///
    /// The count is this PE's share of the blocks that fit on the GPU at once
    /// (occupancy x SMs / [`GpuPe::pes_on_device`]: under MPS every PE's
    /// grid must be resident together) less the room of
    /// [`GpuPe::landing_agents`] agents, counted in blocks of this kernel
    /// (an agent takes 256 threads and at most 32 registers, so one block of
    /// 1024 threads holds four, and one agent needs one block of 256
    /// threads). The carveout: an SM runs blocks of one L1/shared split at a
    /// time, so an agent whose split differs from the kernel's cannot start
    /// beside it (`module::set_carveout`); both get the smallest split
    /// that holds the kernel's blocks. A kernel that waits on the network
    /// and leaves no room never sees its first message land: the agent that
    /// would apply it cannot start. With several persistent kernels at once,
    /// the agents follow the last one sized.
    ///
    /// # Errors
    /// [`GpuError::Cuda`] from the occupancy, attribute and carveout calls;
    /// [`GpuError::NoRoom`] when the agents need every block.
    pub fn max_persistent_blocks(&self, func: &CudaFunction, threads: u32, dynamic_smem: usize) -> Result<u32> {
        use cudarc::driver::sys::CUfunction_attribute as A;
        let attr = |a: A, what: &'static str| {
            func.get_attribute(a).map(|v| v.max(0) as u32).map_err(|source| GpuError::Cuda { what, source })
        };
        let regs = attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS, "cuFuncGetAttribute (registers)")?;
        let static_smem = attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "cuFuncGetAttribute (static shared memory)")?;
        let occupancy = || {
            func.occupancy_max_active_blocks_per_multiprocessor(threads, dynamic_smem, None)
                .map_err(|source| GpuError::Cuda { what: "cuOccupancyMaxActiveBlocksPerMultiprocessor", source })
        };
        let per_sm = occupancy()?;
        let percent = self.carveout_percent(per_sm, u64::from(static_smem) + dynamic_smem as u64)?;
        module::set_carveout(func, percent, "cuFuncSetAttribute (persistent kernel carveout)")?;
        let per_sm = occupancy()?.min(per_sm);
        self.persistent_blocks_of(per_sm, threads, regs, percent)
    }

    /// [`GpuPe::max_persistent_blocks`] from the kernel's figures, for
    /// callers that ask the CUDA runtime (the C API): `per_sm` blocks of
    /// `threads` threads and `regs` registers per thread fit on one SM, and
    /// the kernel has been given the preferred carveout `percent`
    /// ([`GpuPe::carveout_percent`]), which the agents now get too. Local.
    ///
    /// # Errors
    /// As [`GpuPe::max_persistent_blocks`].
    pub fn persistent_blocks_of(&self, per_sm: u32, threads: u32, regs: u32, percent: i32) -> Result<u32> {
        use cudarc::driver::sys::CUdevice_attribute;
        if let Some(agent) = self.agent.get() {
            self.cuda.bind_to_thread().map_err(|source| GpuError::Cuda { what: "cuCtxSetCurrent", source })?;
            module::set_carveout(agent, percent, "cuFuncSetAttribute (landing agent carveout)")?;
        }
        let sms = self
            .cuda
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|source| GpuError::Cuda { what: "cuDeviceGetAttribute (SM count)", source })?;
        let coresident = (per_sm * sms.max(1) as u32 / self.pes_on_device()).max(1);
        Ok(module::persistent_blocks(coresident, threads, regs, self.landing_agents())?)
    }

    /// The preferred shared-memory carveout (percent) for a persistent
    /// kernel of which `per_sm` blocks with `smem` bytes of shared memory
    /// each (static and dynamic) fit on an SM: give it to the kernel
    /// (`cudaFuncSetAttribute(.., cudaFuncAttributePreferredSharedMemoryCarveout, ..)`)
    /// and to [`GpuPe::persistent_blocks_of`]. Local.
    ///
    /// # Errors
    /// [`GpuError::Cuda`] from the device queries.
    pub fn carveout_percent(&self, per_sm: u32, smem: u64) -> Result<i32> {
        use cudarc::driver::sys::CUdevice_attribute as D;
        let dev = |a: D, what: &'static str| {
            self.cuda.attribute(a).map(|v| v.max(0) as u64).map_err(|source| GpuError::Cuda { what, source })
        };
        let reserved = dev(D::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, "cuDeviceGetAttribute (reserved shared memory)")?;
        let max = dev(D::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, "cuDeviceGetAttribute (shared memory per SM)")?;
        Ok(module::carveout_percent(per_sm, smem + reserved, max))
    }


    /// The path this PE's operations take to every PE, itself included (PE
    /// order): from the CUDA IPC mappings that opened ([`GpuPe::peer_path`])
    /// and whether the kernels' peer table is installed (`CPNET_GPU_P2P`),
    /// with the provider the staged transport opened, as libfabric reports
    /// it. What `CPNET_TRANSPORT_MAP=1` prints after init
    /// ([`crate::transport_map`]). Local.
    pub fn transport_map(&self) -> Vec<crate::transport_map::Route> {
        let facts = self.core.endpoint_facts().first();
        let provider = facts.map_or(self.core.provider(), |f| f.provider.as_str());
        crate::transport_map::gpu_routes(self.my_pe(), &self.peer_path(), self.p2p.is_some(), provider, facts)
    }

    /// This PE's number (`shmem_my_pe`, §9.2.3). Local.
    pub fn my_pe(&self) -> i32 {
        self.core.my_pe()
    }

    /// Number of PEs (`shmem_n_pes`, §9.2.4). Local.
    pub fn n_pes(&self) -> i32 {
        self.core.n_pes()
    }

    /// The libfabric provider the staged transport uses.
    pub fn provider(&self) -> &str {
        self.core.provider()
    }

    /// The provider and bind address this PE's proxy threads opened (or
    /// the daemon opened for it), for tools that open their own endpoint
    /// beside cpnet's, such as the raw libfabric floors of
    /// `cpnet-gpu-p2p --pingpong`. Local.
    pub fn fabric_config(&self) -> FabricConfig {
        self.core.fabric_config()
    }

    /// Which PEs this PE reaches by CUDA IPC peer copies (same host,
    /// `CPNET_GPU_IPC=1`), per PE; the others (and AMOs always) go through
    /// the staged path.
    pub fn peer_path(&self) -> Vec<bool> {
        self.peers.bases.iter().map(Option::is_some).collect()
    }

    /// The PE's CUDA context (its GPU).
    pub fn cuda(&self) -> &Arc<CudaContext> {
        &self.cuda
    }

    /// A non-blocking stream for the application's kernels and copies (it
    /// never waits for the legacy default stream).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Compile `source` (which may `#include <cpnet/device.cuh>`) for this
    /// GPU with NVRTC and load it.
    ///
    /// # Errors
    /// [`Error::Gpu`] with the compiler log, or the load failure.
    pub fn build_module(&self, name: &str, source: &str) -> Result<Arc<CudaModule>> {
        Ok(build_module(&self.cuda, name, source)?)
    }

    /// The kernel argument `cpnet_handle_t` (pass it by value:
    /// `launch.arg(&handle)`).
    pub fn handle(&self) -> KernelHandle {
        let timeout = self.core.tuning.wait_timeout.map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64);
        let mut h = self.queues.handle(self.my_pe(), self.n_pes(), self.heap.base, self.heap.size, timeout);
        h.peers = self.p2p.as_ref().map_or(0, |t| t.base);
        (h.n_teams, h.teams) = self.teams.handle_fields();
        KernelHandle(h)
    }

    /// Allocate `bytes` of symmetric GPU memory (`shmem_malloc`, §9.3.1):
    /// the same heap offset on every PE, 64-byte aligned, zeroed.
    /// **Collective** (includes a barrier), with the same `bytes` on every PE.
    ///
    /// # Errors
    /// [`Error::NotSymmetric`], [`Error::OutOfHeap`], [`Error::Bootstrap`],
    /// [`Error::Gpu`] (the clearing copy failed).
    pub fn shmalloc(&self, bytes: u64) -> Result<SymAddr> {
        let off = self.core.shmalloc(bytes)?;
        let len = bytes.max(1).next_multiple_of(SHMALLOC_ALIGN);
        self.bind()?;
        // SAFETY: `off..off+len` is the block just allocated inside the heap.
        unsafe { cu::memset_d8_async(self.heap.base + off, 0, len as usize, self.stream.cu_stream()) }
            .map_err(|source| GpuError::Cuda { what: "cuMemsetD8Async (clear a symmetric block)", source })?;
        self.stream.synchronize().map_err(|source| GpuError::Cuda { what: "cuStreamSynchronize", source })?;
        Ok(SymAddr(off))
    }

    /// Free a block from [`GpuPe::shmalloc`] (`shmem_free`, §9.3.2).
    /// **Collective**, with the same address on every PE.
    ///
    /// # Errors
    /// [`Error::NotSymmetric`], [`Error::BadFree`], [`Error::Bootstrap`].
    pub fn shfree(&self, addr: SymAddr) -> Result<()> {
        self.core.shfree(addr)
    }

    /// Bytes of the symmetric heap (the same on every PE).
    pub fn heap_size(&self) -> u64 {
        self.heap.size
    }

    /// The device address of heap offset `a` (a kernel's `T*` argument).
    pub fn dev_ptr(&self, a: SymAddr) -> u64 {
        self.heap.base + a.0
    }

    /// Make this PE's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        self.cuda.bind_to_thread().map_err(|source| GpuError::Cuda { what: "cuCtxSetCurrent", source })?;
        Ok(())
    }

    fn check_range(&self, a: SymAddr, len: usize) -> Result<()> {
        if a.0.checked_add(len as u64).is_some_and(|e| e <= self.heap.size) {
            Ok(())
        } else {
            Err(Error::OutsideHeap { pe: self.my_pe(), addr: a.0, size: len as u64, heap: self.heap.size })
        }
    }

    /// Copy `data` into the local GPU heap at `a` (on [`GpuPe::stream`],
    /// synchronized). Local.
    ///
    /// # Errors
    /// A range outside the heap; [`Error::Gpu`].
    pub fn write_heap(&self, a: SymAddr, data: &[u8]) -> Result<()> {
        self.check_range(a, data.len())?;
        self.bind()?;
        // SAFETY: the destination range is inside the heap (checked); the
        // source slice outlives the copy (synchronized below).
        unsafe { cu::memcpy_htod_async(self.heap.base + a.0, data, self.stream.cu_stream()) }
            .map_err(|source| GpuError::Cuda { what: "cuMemcpyHtoDAsync (write_heap)", source })?;
        self.stream.synchronize().map_err(|source| GpuError::Cuda { what: "cuStreamSynchronize (write_heap)", source })?;
        Ok(())
    }

    /// Copy `out.len()` bytes of the local GPU heap at `a` into `out` (on
    /// [`GpuPe::stream`], synchronized). Local.
    ///
    /// # Errors
    /// A range outside the heap; [`Error::Gpu`].
    pub fn read_heap(&self, a: SymAddr, out: &mut [u8]) -> Result<()> {
        self.check_range(a, out.len())?;
        self.bind()?;
        // SAFETY: the source range is inside the heap (checked); `out`
        // outlives the copy (synchronized below).
        unsafe { cu::memcpy_dtoh_async(out, self.heap.base + a.0, self.stream.cu_stream()) }
            .map_err(|source| GpuError::Cuda { what: "cuMemcpyDtoHAsync (read_heap)", source })?;
        self.stream.synchronize().map_err(|source| GpuError::Cuda { what: "cuStreamSynchronize (read_heap)", source })?;
        Ok(())
    }

    /// Wait for everything queued on [`GpuPe::stream`] (kernels, copies),
    /// then check the status block. Local.
    ///
    /// # Errors
    /// [`Error::Gpu`] (a kernel faulted); [`Error::Device`] when a kernel
    /// reported a device-side error (a wait that timed out, an abort),
    /// naming the work-group, PE, heap address, expected and found values.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|source| GpuError::Cuda { what: "cuStreamSynchronize (kernel)", source })?;
        self.check_status()
    }

    /// [`Error::Device`] if the status block holds a device-side error.
    ///
    /// # Errors
    /// As said.
    pub fn check_status(&self) -> Result<()> {
        let s = self.queues.status();
        match ErrorCode::from_i32(s.dev_error as i32) {
            None => Ok(()),
            Some(code) => {
                let cmp = Cmp::from_u8(s.dev_cmp as u8).map_or("?", Cmp::name);
                Err(Error::Device {
                    pe: self.my_pe(),
                    report: format!(
                        "work-group {}: wait on PE {} heap+{:#x} for {cmp} {} (found {}): {code}",
                        s.dev_wg, s.dev_pe, s.dev_addr, s.dev_expected as i64, s.dev_found as i64
                    ),
                })
            }
        }
    }

    /// A snapshot of the status block.
    pub fn status(&self) -> Status {
        self.queues.status()
    }

    /// Wait until every PE has called it (`shmem_barrier_all` from the host,
    /// through the bootstrap; kernels use `cpnet_barrier_all`). **Collective.**
    ///
    /// # Errors
    /// [`Error::Bootstrap`].
    pub fn barrier_all(&self) -> Result<()> {
        self.core.barrier_all()
    }

    /// Exchange `data` with every PE (host-side setup). **Collective.**
    ///
    /// # Errors
    /// [`Error::Bootstrap`].
    pub fn allgather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.core.allgather_bytes(data)
    }

    /// Tell every other PE that this PE is failing. One-sided.
    pub fn abort_job(&self, reason: &str) {
        self.core.boot().abort(reason);
    }

    /// Commands the proxy rejected or that failed, so far (each was also
    /// returned to the work-group that issued it).
    pub fn command_errors(&self) -> Vec<CommandError> {
        self.core.command_errors()
    }

    /// End this PE (`shmem_finalize`, §9.2.2): synchronize the stream,
    /// barrier, stop the proxy after it has drained, leave the rendezvous.
    /// **Collective.**
    ///
    /// # Errors
    /// [`Error::Gpu`], [`Error::Bootstrap`], [`Error::Proxy`].
    pub fn finalize(mut self) -> Result<()> {
        self.stream.synchronize().map_err(|source| GpuError::Cuda { what: "cuStreamSynchronize (finalize)", source })?;
        self.core.finalize()
    }
}

impl Drop for GpuPe {
    fn drop(&mut self) {
        if !self.core.stopped() {
            // A kernel may still be running and waiting on the queues: abort
            // them so it ends, then stop the proxy without draining.
            self.queues.abort(ErrorCode::Aborted);
            let _ = self.stream.synchronize();
            self.core.abandon();
        }
    }
}
