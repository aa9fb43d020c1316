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

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use cpnet_device::layout::{
    CPNET_STATUS_BYTES, CPNET_STATUS_OFF_ABORT, ErrorCode, Handle, Status, claim_abort, claim_words,
};
use cpnet_device::ring::{QueueGeometry, QueueMem};
use cpnet_device::sync::{Ordering, Words};
use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::Cmp;
use cpnet_proxy::decode::Limits;
use cpnet_proxy::mirror::{CudaCopies, QueueMirror};
use cpnet_proxy::service::{CommandError, GPU_PACING, IDLE_SPIN_FOR, PayloadSlots, Service, Transport};
use cpnet_proxy::agent::AgentKernel;
use cpnet_proxy::staged::{GpuHeap, PeShared, StagedConfig, StagedEndpoint, StagedTransport};
use cpnet_proxy::transport::EndpointFacts;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError};

use crate::bootstrap::Bootstrap;
use crate::env::{Launch, QueuePlacement, Tuning};
use crate::core::{PeCore, SHMALLOC_ALIGN};
use crate::error::{Error, Result};
pub use crate::error::GpuError;
use crate::startup::{self, PeKind};
use cpnet_proxy::transport::FabricConfig;
use crate::proxy_link::ProxyLink;
use crate::proxy_threads::{Backend, Proxies};
use cudarc::driver::{result as cu, sys as cusys};

mod module;
mod on_stream;
mod team;

pub use module::{build_module, is_loaded, persistent_blocks};
pub use on_stream::ON_STREAM_THREADS;
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

/// Zeroed host memory, pinned and mapped into the GPU's address space
/// (`cuMemHostAlloc(DEVICEMAP | PORTABLE)`): the CPU reaches it at `host`,
/// kernels at `dev`. Page aligned.
#[derive(Debug)]
pub struct MappedHost {
    host: *mut u8,
    dev: u64,
    bytes: usize,
}

// SAFETY: the memory is only a region shared with the GPU; all access goes
// through atomics (`Words`, `AtomicU32::from_ptr`) per THE QUEUE PROTOCOL.
unsafe impl Send for MappedHost {}
// SAFETY: as above.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    /// `bytes` of mapped pinned memory. A CUDA context must be current on
    /// this thread (it is after [`open_device`]).
    ///
    /// # Errors
    /// [`GpuError::Cuda`] from `cuMemHostAlloc` / `cuMemHostGetDevicePointer`.
    pub fn new(bytes: usize) -> std::result::Result<MappedHost, GpuError> {
        let bytes = bytes.max(64);
        // SAFETY: a context is current (caller); the memory is zeroed below
        // before anyone reads it.
        let host = unsafe {
            cu::malloc_host(bytes, cusys::CU_MEMHOSTALLOC_DEVICEMAP | cusys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .map_err(|source| GpuError::Cuda { what: "cuMemHostAlloc (mapped queues)", source })?
        .cast::<u8>();
        // SAFETY: a fresh allocation of `bytes` bytes.
        unsafe { std::ptr::write_bytes(host, 0, bytes) };
        let mut dev: cusys::CUdeviceptr = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        let r = unsafe { cusys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0) }.result();
        if let Err(source) = r {
            // SAFETY: allocated above, not shared with anyone yet.
            let _ = unsafe { cu::free_host(host.cast()) };
            return Err(GpuError::Cuda { what: "cuMemHostGetDevicePointer", source });
        }
        Ok(MappedHost { host, dev, bytes })
    }

    /// The CPU address.
    pub fn host(&self) -> *mut u8 {
        self.host
    }

    /// The GPU address.
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Never empty (at least 64 bytes); for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc and freed once; owners keep it
        // until every kernel and proxy thread using it has ended.
        let _ = unsafe { cu::free_host(self.host.cast()) };
    }
}

/// A PE's command queues, its status block and its claim words
/// (DESIGN.md "The command queue").
///
/// The queues are placed by [`QueuePlacement`] (`CPNET_QUEUE_MEM`):
///
/// - [`QueuePlacement::Host`] (the default): one pool in pinned host memory
///   mapped into the GPU; kernels and the proxy share its words.
/// - [`QueuePlacement::Device`] (the ComP-Net paper's Fig. 4a comparison):
///   the pool in GPU memory (`cuMemAlloc`, zeroed, the same layout: per
///   queue the 128-byte header and `depth` 64-byte slots), which kernels
///   use, and a host shadow of it in pinned memory, which the proxy's
///   consumers, the watchdog and [`GpuQueues::abort`] use. Each service
///   thread copies between the two through a [`QueueMirror`]
///   ([`GpuQueues::mirror`]).
///
/// Either way the status block is mapped pinned memory and the claim words
/// (with the abort mirror) are GPU memory.
#[derive(Debug)]
pub struct GpuQueues {
    pool: Pool,
    status: MappedHost,
    claims: ClaimWords,
    geom: QueueGeometry,
    n: usize,
    /// The queues' payload slots (`cmd.h` P0) and their size in bytes.
    payload: Option<(MappedHost, u32)>,
}

/// Where a [`GpuQueues`] pool lives.
#[derive(Debug)]
enum Pool {
    /// Mapped pinned memory, shared by kernels and the proxy.
    Mapped(MappedHost),
    /// GPU memory for kernels; a pinned host shadow for the proxy (the GPU
    /// never touches the shadow; it is mapped only because that is the
    /// pinned allocation this module has).
    Device { dev: DeviceMem, shadow: MappedHost },
}

/// [`claim_words`]`(n)` zeroed `u32` words in GPU memory
/// (`cpnet_handle_t.claims`): the queues' claim words, the status report's,
/// and the abort mirror. Device-side CAS needs device memory: system-scope
/// atomics on mapped host memory are not supported by GPUs on PCIe without
/// host-native atomics (compute-sanitizer flags them). The mirror lets device
/// waits check for an abort in GPU memory instead of all polling one host
/// cache line over PCIe.
#[derive(Debug)]
struct ClaimWords {
    dev: u64,
    n_queues: usize,
    /// A non-blocking stream of the owning context, for the abort mirror's
    /// copy: a copy engine runs it while a kernel holds every SM (a memset
    /// would be a kernel).
    stream: Arc<CudaStream>,
}

impl ClaimWords {
    fn new(cuda: &Arc<CudaContext>, n: usize) -> std::result::Result<ClaimWords, GpuError> {
        let stream = cuda
            .new_stream()
            .map_err(|source| GpuError::Cuda { what: "cuStreamCreate (abort mirror)", source })?;
        let bytes = 4 * claim_words(n);
        // SAFETY: new_stream bound `cuda` to this thread; the memory is zeroed
        // below and owned by the returned value.
        let dev = unsafe { cu::malloc_sync(bytes) }
            .map_err(|source| GpuError::Cuda { what: "cuMemAlloc (queue claim words)", source })?;
        let words = ClaimWords { dev, n_queues: n, stream };
        // SAFETY: the allocation just made (freed by `words`' Drop on error).
        unsafe { cu::memset_d8_sync(dev, 0, bytes) }
            .map_err(|source| GpuError::Cuda { what: "cuMemsetD8 (queue claim words)", source })?;
        Ok(words)
    }

    /// Copy the host abort word `*src` into the mirror and wait for the copy
    /// (a copy engine's, so it completes while kernels run). Errors are
    /// ignored: the job is ending, and device waits still read the host word
    /// every `CPNET_ABORT_HOST_EVERY` checks.
    fn mirror_abort(&self, src: &AtomicU32) {
        if self.stream.context().bind_to_thread().is_err() {
            return;
        }
        let dst = self.dev + 4 * claim_abort(self.n_queues) as u64;
        // SAFETY: `src` is a u32 in pinned host memory (the status block)
        // that lives as long as the queues; `dst` is inside this allocation;
        // the copy is waited for before returning, so `src` outlives it.
        unsafe {
            let word = core::slice::from_raw_parts(src.as_ptr().cast_const(), 1);
            if cu::memcpy_htod_async(dst, word, self.stream.cu_stream()).is_ok() {
                let _ = self.stream.synchronize();
            }
        }
    }
}

impl Drop for ClaimWords {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: allocated by cuMemAlloc in `new`, freed once, after every
        // kernel using the handle has ended (the owner's contract); the
        // mirror's only copy was waited for in `mirror_abort`.
        let _ = unsafe { cu::free_sync(self.dev) };
    }
}

impl GpuQueues {
    /// `n` queues of `geom` in mapped pinned memory, zeroed, a zeroed status
    /// block, and the claim words in `cuda`'s GPU memory (binds `cuda` to
    /// this thread): [`GpuQueues::with_placement`] with
    /// [`QueuePlacement::Host`].
    ///
    /// # Errors
    /// As [`MappedHost::new`]; `cuMemAlloc` of the claim words.
    pub fn new(cuda: &Arc<CudaContext>, n: usize, geom: QueueGeometry) -> std::result::Result<GpuQueues, GpuError> {
        GpuQueues::with_placement(cuda, n, geom, QueuePlacement::Host)
    }

    /// `n` queues of `geom` placed as `placement` says (for
    /// [`QueuePlacement::Device`]: `n * geom.bytes()` bytes of GPU memory
    /// and as many of pinned host memory for the shadow), all zeroed, a
    /// zeroed status block, and the claim words in `cuda`'s GPU memory
    /// (binds `cuda` to this thread).
    ///
    /// # Errors
    /// [`GpuError::Cuda`] from `cuMemHostAlloc`, `cuMemAlloc` or
    /// `cuMemsetD8`.
    pub fn with_placement(
        cuda: &Arc<CudaContext>,
        n: usize,
        geom: QueueGeometry,
        placement: QueuePlacement,
    ) -> std::result::Result<GpuQueues, GpuError> {
        let claims = ClaimWords::new(cuda, n)?;
        let pool = match placement {
            QueuePlacement::Host => Pool::Mapped(MappedHost::new(n * geom.bytes())?),
            QueuePlacement::Device => Pool::Device {
                dev: DeviceMem::new(
                    cuda,
                    (n * geom.bytes()) as u64,
                    "cuMemAlloc (command queues in GPU memory, CPNET_QUEUE_MEM=device)",
                    "cuMemsetD8 (zero the command queues)",
                )?,
                shadow: MappedHost::new(n * geom.bytes())?,
            },
        };
        Ok(GpuQueues { pool, claims, status: MappedHost::new(CPNET_STATUS_BYTES)?, geom, n, payload: None })
    }

    /// Give every queue `depth` payload slots of `slot_bytes` bytes (`cmd.h`
    /// P0) in zeroed mapped pinned memory (`n * depth * slot_bytes` bytes),
    /// so that kernels copy puts of up to `slot_bytes` into host memory
    /// themselves. Only for [`QueuePlacement::Host`]: queues in GPU memory
    /// reach the proxy through a mirror that copies slots, not payloads,
    /// and get none (nor does `slot_bytes` 0).
    ///
    /// # Errors
    /// [`GpuError::Cuda`] from `cuMemHostAlloc`.
    ///
    /// # Panics
    /// If `slot_bytes` is not 0 or a power of two of at least 16.
    pub fn set_payload(&mut self, slot_bytes: u32) -> std::result::Result<(), GpuError> {
        assert!(slot_bytes == 0 || (slot_bytes >= 16 && slot_bytes.is_power_of_two()), "payload slot size {slot_bytes}");
        self.payload = None;
        if slot_bytes != 0 && matches!(self.pool, Pool::Mapped(_)) {
            let bytes = self.n * self.geom.depth() as usize * slot_bytes as usize;
            self.payload = Some((MappedHost::new(bytes)?, slot_bytes));
        }
        Ok(())
    }

    /// Queue `i`'s payload slots, if the queues have them
    /// ([`GpuQueues::set_payload`]).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn payload_slots(&self, i: usize) -> Option<PayloadSlots> {
        assert!(i < self.n, "queue {i} of {}", self.n);
        let (mem, slot_bytes) = self.payload.as_ref()?;
        let off = i * self.geom.depth() as usize * *slot_bytes as usize;
        Some(PayloadSlots { host: mem.host() as usize + off, dev: mem.dev() + off as u64, slot_bytes: u64::from(*slot_bytes) })
    }

    /// Where the queues live.
    pub fn placement(&self) -> QueuePlacement {
        match self.pool {
            Pool::Mapped(_) => QueuePlacement::Host,
            Pool::Device { .. } => QueuePlacement::Device,
        }
    }

    /// The geometry of every queue.
    pub fn geometry(&self) -> QueueGeometry {
        self.geom
    }

    /// The host memory the proxy reads the queues in: the mapped pool, or
    /// the shadow of the device pool.
    fn host_pool(&self) -> &MappedHost {
        match &self.pool {
            Pool::Mapped(m) => m,
            Pool::Device { shadow, .. } => shadow,
        }
    }

    /// For [`QueuePlacement::Device`]: the mirror through which one proxy
    /// service thread serves queues `indices` of the pool (its queue `i` is
    /// pool queue `indices[i]`), on a new non-blocking stream of `cuda`.
    /// Call it on that thread (it binds `cuda` there; the mirror is used
    /// there only). `None` for mapped queues, which need no mirror.
    ///
    /// # Errors
    /// [`GpuError::Cuda`] from binding the context, creating the stream or
    /// allocating the pinned outbox.
    ///
    /// # Panics
    /// If an index is out of range.
    pub fn mirror(self: &Arc<Self>, cuda: &Arc<CudaContext>, indices: &[usize]) -> std::result::Result<Option<QueueMirror>, GpuError> {
        let Pool::Device { dev, shadow } = &self.pool else { return Ok(None) };
        let bytes = self.geom.bytes();
        let queues = indices
            .iter()
            .map(|&q| {
                assert!(q < self.n, "queue {q} of {}", self.n);
                // SAFETY: q < n: inside the shadow allocation of n * bytes.
                (dev.base + (q * bytes) as u64, unsafe { shadow.host().add(q * bytes) })
            })
            .collect();
        let keep: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(self) as _;
        // SAFETY: (1) each pair is queue q of the device pool (cuMemAlloc of
        // `cuda`, zeroed) and of the shadow (pinned by cuMemHostAlloc, page
        // aligned, zeroed), geom.bytes() each; (2) `keep` owns both; (3) only
        // this thread's mirror copies into these queues' shadows (each queue
        // belongs to one service thread), everyone else uses QueueMem atomics
        // on the shadow, and kernels follow queue.cuh on the device pool.
        let copies = unsafe { CudaCopies::new(cuda, self.geom, queues, keep) }
            .map_err(|e| GpuError::Cuda { what: e.what, source: e.source })?;
        Ok(Some(QueueMirror::new(Box::new(copies))))
    }

    /// Number of queues.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are no queues.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Queue `i` as the proxy sees it: for mapped queues the queue itself
    /// (for a consumer, or a CPU producer); for queues in GPU memory its host
    /// shadow (for the consumer of a mirrored service and for reports only:
    /// commands a CPU producer wrote there would never reach the GPU's copy).
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn queue(&self, i: usize) -> QueueMem {
        assert!(i < self.n, "queue {i} of {}", self.n);
        // SAFETY: inside the mapped pool or the shadow (page aligned,
        // geom.bytes() per queue), zeroed at creation, alive as long as
        // `self`, which the owner keeps past every kernel and proxy thread;
        // the GPU follows THE QUEUE PROTOCOL (queue.cuh) on the mapped pool,
        // and only the queue's mirror copies into a shadow.
        unsafe { QueueMem::from_raw(self.host_pool().host().add(i * self.geom.bytes()), self.geom) }
    }

    /// Set up a proxy service over these queues as a GPU PE's are: it
    /// spins when idle before backing off
    /// ([`cpnet_proxy::service::Service::set_idle_spin`] with
    /// [`cpnet_proxy::service::IDLE_SPIN_FOR`]: the PE's work-groups run on
    /// the GPU, not on the proxy's cores), and for mapped queues it paces
    /// its polls ([`cpnet_proxy::service::GPU_PACING`]: the GPU writes those
    /// lines over PCIe) and takes the status block as its claim signal
    /// ([`cpnet_proxy::service::Service::set_claim_signal`]: kernels bump
    /// `claim_gen` when they claim a queue). Services over queues in GPU
    /// memory see claims through their mirrors instead.
    ///
    /// `indices` are the pool queues the service serves, in its order; their
    /// payload slots, if any, go to it ([`Service::set_payload`]).
    ///
    /// # Panics
    /// If `indices` does not match the service's queues.
    pub fn configure_service<T: Transport>(&self, service: &mut Service<T>, indices: &[usize]) {
        // SAFETY: each area is queue q's part of the payload allocation
        // (depth * slot_bytes bytes, mapped pinned memory) that `self` owns
        // and its owner keeps past every proxy thread; kernels write it as
        // P0 allows (queue.cuh reserve_payload).
        unsafe { service.set_payload(indices.iter().map(|&q| self.payload_slots(q)).collect()) };
        service.set_idle_spin(IDLE_SPIN_FOR);
        if matches!(self.pool, Pool::Mapped(_)) {
            service.set_pacing(GPU_PACING);
            // SAFETY: the status allocation is CPNET_STATUS_BYTES, page
            // aligned, and lives as long as `self`, which the owner keeps
            // past every proxy thread; the GPU writes it only with atomics.
            service.set_claim_signal(unsafe { Words::from_raw(self.status.host().cast::<u64>(), CPNET_STATUS_BYTES / 8) });
        }
    }

    fn status_word(&self, byte: usize) -> &AtomicU32 {
        assert!(byte.is_multiple_of(4) && byte + 4 <= CPNET_STATUS_BYTES);
        // SAFETY: 4-aligned, inside the status allocation that lives as long
        // as &self; the GPU writes it with atomics.
        unsafe { AtomicU32::from_ptr(self.status.host().add(byte).cast::<u32>()) }
    }

    /// A snapshot of the status block (the first device-side error and the
    /// wait that timed out, if any).
    pub fn status(&self) -> Status {
        // Acquire: pairs with the device's release of the status fields.
        Status::from_words(|off| self.status_word(off).load(Ordering::Acquire))
    }

    /// Make every device wait return `code` at once, and every queue's
    /// waits too (the job is ending). For queues in GPU memory the queues'
    /// abort words are set in the shadows and reach the GPU with the
    /// services' next pushes; kernels read the abort mirror in the claim
    /// words first, which this copies at once (so an abort reaches them even
    /// when a service thread is stuck).
    pub fn abort(&self, code: ErrorCode) {
        // Release: pairs with the device's acquire of `abort` in its waits.
        self.status_word(CPNET_STATUS_OFF_ABORT).store(code as u32, Ordering::Release);
        for i in 0..self.n {
            self.queue(i).set_abort(code);
        }
        // After the host words: a wait that sees the mirror may look at them.
        self.claims.mirror_abort(self.status_word(CPNET_STATUS_OFF_ABORT));
    }

    /// The handle a kernel receives (`cpnet_handle_t`): `queues` is the
    /// pool's GPU address (the mapped pool's, or the device pool's).
    pub fn handle(&self, my_pe: i32, n_pes: i32, heap_base: u64, heap_size: u64, wait_timeout_ns: u64) -> Handle {
        Handle {
            my_pe,
            n_pes,
            heap_base,
            heap_size,
            queues: match &self.pool {
                Pool::Mapped(m) => m.dev(),
                Pool::Device { dev, .. } => dev.base,
            },
            n_queues: self.n as u32,
            log2_depth: self.geom.log2_depth(),
            wait_timeout_ns,
            status: self.status.dev(),
            claims: self.claims.dev,
            peers: 0,
            payload: self.payload.as_ref().map_or(0, |(m, _)| m.dev()),
            payload_bytes: self.payload.as_ref().map_or(0, |(_, b)| *b),
            n_teams: 0,
            teams: 0,
        }
    }
}

/// A [`Handle`] as a kernel argument, passed by value (`CPNET_HANDLE_BYTES`, 88 bytes).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct KernelHandle(pub Handle);

// SAFETY: Handle is repr(C) plain integers laid out as cpnet_handle_t
// (layout.rs asserts every offset against cmd.h).
unsafe impl DeviceRepr for KernelHandle {}

/// GPU memory (`cuMemAlloc`), zeroed, freed on drop: the symmetric heap,
/// and the queue pool of [`QueuePlacement::Device`].
#[derive(Debug)]
struct DeviceMem {
    base: u64,
    size: u64,
    cuda: Arc<CudaContext>,
}

impl DeviceMem {
    /// `size` zeroed bytes of `cuda`'s memory; `alloc` and `zero` name the
    /// two calls in errors.
    fn new(cuda: &Arc<CudaContext>, size: u64, alloc: &'static str, zero: &'static str) -> std::result::Result<DeviceMem, GpuError> {
        cuda.bind_to_thread().map_err(|source| GpuError::Cuda { what: "cuCtxSetCurrent", source })?;
        // SAFETY: the context is current; the allocation is owned by the
        // returned value and freed once, in Drop.
        let base = unsafe { cu::malloc_sync(size as usize) }.map_err(|source| GpuError::Cuda { what: alloc, source })?;
        let mem = DeviceMem { base, size, cuda: Arc::clone(cuda) };
        // SAFETY: `base..base+size` is the allocation just made.
        unsafe { cu::memset_d8_sync(base, 0, size as usize) }.map_err(|source| GpuError::Cuda { what: zero, source })?;
        Ok(mem)
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        let _ = self.cuda.bind_to_thread();
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
    fn exchange(boot: &Bootstrap, me: i32, heap: &DeviceMem, enabled: bool) -> Result<PeerHeaps> {
        let mut card = Vec::new();
        let id = crate::team::host_id();
        let mut handle = cusys::CUipcMemHandle_st { reserved: [0; 64] };
        let ok = enabled && !id.is_empty() && {
            // SAFETY: `heap.base` is the start of a cuMemAlloc allocation of
            // the current context; `handle` is a valid out-parameter.
            let r = unsafe { cusys::cuIpcGetMemHandle(&mut handle, heap.base) };
            if r != cusys::CUresult::CUDA_SUCCESS {
                tracing::warn!("PE {me}: cuIpcGetMemHandle failed ({r:?}): peers on this host use the staged path");
            }
            r == cusys::CUresult::CUDA_SUCCESS
        };
        if ok {
            card.extend_from_slice(&(id.len() as u32).to_le_bytes());
            card.extend_from_slice(&id);
            card.extend(handle.reserved.iter().map(|&c| c as u8));
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
            let mut h = cusys::CUipcMemHandle_st { reserved: [0; 64] };
            for (d, &s) in h.reserved.iter_mut().zip(&c[4 + n..]) {
                *d = s as std::ffi::c_char;
            }
            let mut base: cusys::CUdeviceptr = 0;
            // SAFETY: `h` is the handle PE `peer` got from cuIpcGetMemHandle
            // on its heap; a context is current; `base` is a valid out-param.
            let r = unsafe {
                cusys::cuIpcOpenMemHandle_v2(
                    &mut base,
                    h,
                    cusys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint,
                )
            };
            if r == cusys::CUresult::CUDA_SUCCESS {
                bases[peer] = Some(base);
            } else {
                tracing::warn!("PE {me}: cuIpcOpenMemHandle for PE {peer}'s heap failed ({r:?}): staged path to it");
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
}

impl PeKind for GpuKind {
    type Parts = GpuParts;

    fn heap(&mut self, launch: &Launch, tuning: &Tuning, boot: &Bootstrap, heap_size: u64) -> Result<GpuParts> {
        let (cuda, me) = (&self.cuda, launch.pe);
        let geom = QueueGeometry::new(tuning.queue_depth).map_err(|cause| Error::Queue { pe: me, cause })?;
        let heap = DeviceMem::new(
            cuda,
            heap_size,
            "cuMemAlloc (symmetric heap; lower CPNET_HEAP_SIZE?)",
            "cuMemsetD8 (zero the symmetric heap)",
        )?;
        let mut queues = GpuQueues::with_placement(cuda, tuning.queues, geom, tuning.queue_mem)?;
        queues.set_payload(tuning.payload_slot_bytes())?;
        let queues = Arc::new(queues);
        let peers = PeerHeaps::exchange(boot, me, &heap, tuning.gpu_ipc)?;
        let p2p = if tuning.gpu_p2p { Some(p2p_table(cuda, me, &heap, &peers)?) } else { None };
        let stream = cuda.new_stream().map_err(|source| GpuError::Cuda { what: "cuStreamCreate (application stream)", source })?;
        Ok(GpuParts { stream, peers, p2p, queues, heap })
    }

    fn proxy(&mut self, parts: &mut GpuParts, launch: &Launch, tuning: &Tuning, _boot: &Bootstrap, fabric: &FabricConfig) -> Result<ProxyLink> {
        let me = launch.pe;
        let heap_size = parts.heap.size;
        if tuning.proxy == crate::env::ProxyMode::Daemon {
            tracing::warn!("PE {me}: CPNET_PROXY=daemon: GPU PEs use the in-process proxy in this version");
        }
        let cfg = StagedConfig {
            fabric: fabric.clone(),
            chunk: tuning.stage_chunk as usize,
            credits: tuning.stage_credits,
            send_bufs: tuning.stage_bufs,
        };
        let threads = tuning.gpu_proxy_threads.min(tuning.queues).max(1);
        let limits = Limits { n_pes: launch.n_pes, heap_size };
        let agent = landing_agent(&self.cuda, tuning)?;
        let _ = self.agent.set(agent.function.clone());
        let indices: Vec<Vec<usize>> = (0..threads).map(|t| (t..tuning.queues).step_by(threads).collect()).collect();
        // The proxy's views: the queues, or (CPNET_QUEUE_MEM=device) the host
        // shadows that the threads' mirrors keep. The watchdog reads them.
        let per_thread: Vec<Vec<QueueMem>> = indices.iter().map(|qs| qs.iter().map(|&q| parts.queues.queue(q)).collect()).collect();
        let backend = Arc::new(GpuBackend {
            cfg,
            cuda: Arc::clone(&self.cuda),
            me,
            n_pes: launch.n_pes,
            heap: GpuHeap { base: parts.heap.base, size: heap_size },
            shared: Arc::new(PeShared::default()),
            peer_heaps: parts.peers.bases.clone(),
            agent,
            queues: Arc::clone(&parts.queues),
            per_thread: indices,
        });
        Proxies::spawn(backend, me, per_thread, limits, &fabric.provider, tuning).map(ProxyLink::from)
    }

    fn abort(parts: &GpuParts) -> Box<dyn Fn(ErrorCode) + Send + Sync> {
        let q = Arc::clone(&parts.queues);
        Box::new(move |code| q.abort(code))
    }
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
        // The staged transport reports its granted provider only.
        EndpointFacts {
            provider: tr.provider().to_owned(),
            fabric: String::new(),
            domain: String::new(),
            local_addr: String::new(),
            peer_addrs: Vec::new(),
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
    heap: DeviceMem,
    cuda: Arc<CudaContext>,
}

impl std::fmt::Debug for GpuPe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPe")
            .field("my_pe", &self.core.launch.pe)
            .field("n_pes", &self.core.launch.n_pes)
            .field("device", &self.cuda.ordinal())
            .field("provider", &self.core.provider)
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
        let threads = tuning.gpu_proxy_threads.min(tuning.queues).max(1);
        let agent = Arc::new(std::sync::OnceLock::new());
        let (core, parts) = startup::start(launch, tuning, GpuKind { cuda: Arc::clone(&cuda), agent: Arc::clone(&agent) })?;
        let GpuParts { stream, peers, p2p, queues, heap } = parts;
        let me = core.my_pe();
        let teams = team::TeamTable::new(&cuda, &core.teams)?;
        let pe = GpuPe { core, stream, peers, p2p, queues, teams, agent, on_stream: Default::default(), heap, cuda };
        tracing::debug!(pe = me, n_pes = pe.n_pes(), device = pe.cuda.ordinal(), provider = %pe.core.provider, threads, queue_mem = %pe.queues.placement(), "cpnet GPU PE up");
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
        let count = CudaContext::device_count().map_or(1, |c| c.max(1));
        let (lp, ls) = (self.core.launch.local_pe, self.core.launch.local_size.max(1));
        let mine = lp.rem_euclid(count);
        ((0..ls).filter(|p| p.rem_euclid(count) == mine).count() as u32).max(1)
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
        (t.gpu_proxy_threads.min(t.queues).max(1) * t.agent_lanes.max(1)) as u32
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
        let provider = self.core.endpoint_facts().first().map_or(self.core.provider.as_str(), |f| f.provider.as_str());
        crate::transport_map::gpu_routes(self.my_pe(), &self.peer_path(), self.p2p.is_some(), provider)
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
        &self.core.provider
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
