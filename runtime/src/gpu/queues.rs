//! A GPU PE's command queues and the memory the GPU and the proxy share
//! with them: [`MappedHost`] (pinned host memory mapped into the GPU),
//! [`GpuQueues`] (the queue pool, status block, payload slots and claim
//! words; DESIGN.md "The command queue").

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use cpnet_device::layout::{CPNET_STATUS_BYTES, CPNET_STATUS_OFF_ABORT, ErrorCode, Handle, Status, claim_abort, claim_words};
use cpnet_device::ring::{QueueGeometry, QueueMem};
use cpnet_device::sync::{Ordering, Words};
use cpnet_proxy::mirror::{CudaCopies, QueueMirror};
use cpnet_proxy::service::{GPU_PACING, IDLE_SPIN_FOR, PayloadSlots, Service, Transport};
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::driver::{result as cu, sys as cusys};

use super::{DeviceMem, GpuError};
use crate::daemon::shm::SharedMem;
use crate::env::QueuePlacement;

/// Zeroed host memory, pinned and mapped into the GPU's address space
/// (`cuMemHostAlloc(DEVICEMAP | PORTABLE)`): the CPU reaches it at `host`,
/// kernels at `dev`. Page aligned.
#[derive(Debug)]
pub struct MappedHost {
    host: *mut u8,
    dev: u64,
    bytes: usize,
    backing: Backing,
}

/// What a [`MappedHost`] is, and so what its drop undoes.
#[derive(Debug)]
enum Backing {
    /// `cuMemHostAlloc` memory ([`MappedHost::new`]).
    Allocated,
    /// A memfd mapping registered with CUDA ([`MappedHost::shared`], the PE).
    Registered { _mem: SharedMem },
    /// A memfd mapping for the CPU only ([`MappedHost::import`], the daemon).
    CpuOnly { _mem: SharedMem },
}

// SAFETY: the memory is only a region shared with the GPU; all access goes
// through atomics (`Words`, `AtomicU32::from_ptr`) per THE QUEUE PROTOCOL.
unsafe impl Send for MappedHost {}
// SAFETY: as above.
unsafe impl Sync for MappedHost {}

impl MappedHost {
    /// `bytes` of mapped pinned memory. A CUDA context must be current on
    /// this thread (it is after [`super::open_device`]).
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
        Ok(MappedHost { host, dev, bytes, backing: Backing::Allocated })
    }

    /// `bytes` of zeroed memory in a new sealed memfd (rounded up to whole
    /// pages), pinned and mapped into the GPU with `cuMemHostRegister(DEVICEMAP
    /// | PORTABLE)`, and the fd to pass to the proxy daemon, which maps the
    /// same pages ([`MappedHost::import`]). `name` shows in `/proc/<pid>/fd`.
    /// A CUDA context must be current on this thread.
    ///
    /// # Errors
    /// [`GpuError::Shared`] (memfd, seals, mmap), [`GpuError::Cuda`]
    /// (`cuMemHostRegister`, `cuMemHostGetDevicePointer`).
    pub fn shared(name: &str, bytes: usize) -> std::result::Result<(MappedHost, OwnedFd), GpuError> {
        let (mem, fd) = SharedMem::create(name, shared_len(bytes)).map_err(|e| GpuError::Shared(e.to_string()))?;
        Ok((MappedHost::register(mem)?, fd))
    }

    /// The proxy daemon's side of [`MappedHost::shared`]: maps the PE's memfd
    /// `fd` (checked: sealed, `bytes` rounded up to whole pages) for the
    /// CPU only: `dev` is 0. It is not registered with CUDA in the daemon:
    /// under MPS every client's registrations live in one server, and a
    /// second registration of the PE's pages did not survive the PE (a PE
    /// killed mid-run made the daemon's next access fault, and the fault
    /// took down every client of the GPU). The daemon copies from it as
    /// pageable memory.
    ///
    /// # Errors
    /// [`GpuError::Shared`] naming what is wrong with the fd.
    pub fn import(fd: &OwnedFd, bytes: usize) -> std::result::Result<MappedHost, GpuError> {
        let mem = SharedMem::map(fd, shared_len(bytes)).map_err(GpuError::Shared)?;
        Ok(MappedHost { host: mem.base(), dev: 0, bytes: mem.len(), backing: Backing::CpuOnly { _mem: mem } })
    }

    fn register(mem: SharedMem) -> std::result::Result<MappedHost, GpuError> {
        let (host, bytes) = (mem.base(), mem.len());
        // SAFETY: `host..host+bytes` is one live MAP_SHARED mapping owned by
        // `mem`, which the returned value keeps (and unregisters before
        // unmapping it, in Drop); a context is current (the caller's contract).
        unsafe {
            cusys::cuMemHostRegister_v2(
                host.cast(),
                bytes,
                cusys::CU_MEMHOSTREGISTER_DEVICEMAP | cusys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        }
        .result()
        .map_err(|source| GpuError::Cuda { what: "cuMemHostRegister (memory shared with the proxy daemon)", source })?;
        let mut dev: cusys::CUdeviceptr = 0;
        // SAFETY: `host` was registered with DEVICEMAP just above; flags must be 0.
        let r = unsafe { cusys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0) }.result();
        if let Err(source) = r {
            // SAFETY: registered above, not used by anyone yet.
            let _ = unsafe { cusys::cuMemHostUnregister(host.cast()) };
            return Err(GpuError::Cuda { what: "cuMemHostGetDevicePointer (shared memory)", source });
        }
        Ok(MappedHost { host, dev, bytes, backing: Backing::Registered { _mem: mem } })
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

/// Bytes of `n` queues' payload slots (`depth` slots of `slot_bytes` each).
fn payload_bytes(n: usize, geom: QueueGeometry, slot_bytes: u32) -> usize {
    n * geom.depth() as usize * slot_bytes as usize
}

/// A shared region's length: `bytes` rounded up to whole pages (4 KiB), at
/// least one page; the PE and the daemon compute the same.
pub fn shared_len(bytes: usize) -> usize {
    bytes.max(1).div_ceil(4096) * 4096
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        match self.backing {
            Backing::Allocated => {
                // SAFETY: allocated by cuMemHostAlloc and freed once; owners
                // keep it until every kernel and proxy thread using it has ended.
                let _ = unsafe { cu::free_host(self.host.cast()) };
            }
            Backing::Registered { .. } => {
                // SAFETY: registered in `register` and unregistered once,
                // here, before the mapping is unmapped (when `backing` drops,
                // after this); owners keep it until every kernel and proxy
                // thread using it has ended.
                let _ = unsafe { cusys::cuMemHostUnregister(self.host.cast()) };
            }
            // Unmapped when `backing` drops.
            Backing::CpuOnly { .. } => {}
        }
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
    /// `None` in the proxy daemon ([`GpuQueues::import`]): the PE owns them.
    claims: Option<ClaimWords>,
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
        Ok(GpuQueues { pool, claims: Some(claims), status: MappedHost::new(CPNET_STATUS_BYTES)?, geom, n, payload: None })
    }

    /// The queues of a GPU PE served by the proxy daemon: as
    /// [`GpuQueues::new`] with payload slots of `slot_bytes` (0: none), but
    /// the pool, the status block and the payload slots each in a sealed
    /// memfd ([`MappedHost::shared`]); returns the fds to pass in the Attach
    /// message, in that order (pool, status, payload if any). `pe` names
    /// them in `/proc/<pid>/fd`. Binds `cuda` to this thread.
    ///
    /// # Errors
    /// [`GpuError::Shared`], [`GpuError::Cuda`].
    pub fn shared(cuda: &Arc<CudaContext>, n: usize, geom: QueueGeometry, slot_bytes: u32, pe: i32) -> std::result::Result<(GpuQueues, Vec<OwnedFd>), GpuError> {
        let claims = ClaimWords::new(cuda, n)?;
        let (pool, pool_fd) = MappedHost::shared(&format!("cpnet-gpu-queues-pe{pe}"), n * geom.bytes())?;
        let (status, status_fd) = MappedHost::shared(&format!("cpnet-gpu-status-pe{pe}"), CPNET_STATUS_BYTES)?;
        let mut fds = vec![pool_fd, status_fd];
        let payload = if slot_bytes == 0 {
            None
        } else {
            let (m, fd) = MappedHost::shared(&format!("cpnet-gpu-payload-pe{pe}"), payload_bytes(n, geom, slot_bytes))?;
            fds.push(fd);
            Some((m, slot_bytes))
        };
        Ok((GpuQueues { pool: Pool::Mapped(pool), claims: Some(claims), status, geom, n, payload }, fds))
    }

    /// The proxy daemon's view of a PE's [`GpuQueues::shared`]: maps the fds
    /// (pool, status, payload if `slot_bytes` != 0) for the CPU
    /// ([`MappedHost::import`]: not registered with CUDA). No claim words (the PE's kernels use its own);
    /// [`GpuQueues::handle`] is the PE's business, not the daemon's.
    ///
    /// # Errors
    /// [`GpuError::Shared`] (an fd missing, unsealed or of another size).
    pub fn import(n: usize, geom: QueueGeometry, slot_bytes: u32, fds: &[OwnedFd]) -> std::result::Result<GpuQueues, GpuError> {
        let want = 2 + usize::from(slot_bytes != 0);
        if fds.len() != want {
            return Err(GpuError::Shared(format!("{} fds for GPU queues, want {want} (pool, status{})", fds.len(), if want == 3 { ", payload" } else { "" })));
        }
        let pool = MappedHost::import(&fds[0], n * geom.bytes()).map_err(|e| GpuError::Shared(format!("the queue pool: {e}")))?;
        let status = MappedHost::import(&fds[1], CPNET_STATUS_BYTES).map_err(|e| GpuError::Shared(format!("the status block: {e}")))?;
        let payload = if slot_bytes == 0 {
            None
        } else {
            let m = MappedHost::import(&fds[2], payload_bytes(n, geom, slot_bytes)).map_err(|e| GpuError::Shared(format!("the payload slots: {e}")))?;
            Some((m, slot_bytes))
        };
        Ok(GpuQueues { pool: Pool::Mapped(pool), claims: None, status, geom, n, payload })
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
            self.payload = Some((MappedHost::new(payload_bytes(self.n, self.geom, slot_bytes))?, slot_bytes));
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
        // No device address where the slots have no GPU mapping here (the daemon's view).
        let dev = (mem.dev() != 0).then(|| mem.dev() + off as u64);
        Some(PayloadSlots { host: mem.host() as usize + off, dev, slot_bytes: u64::from(*slot_bytes) })
    }

    /// Bytes of a payload slot; 0 where the queues have none.
    pub fn payload_slot_bytes(&self) -> u32 {
        self.payload.as_ref().map_or(0, |(_, b)| *b)
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
        if let Some(c) = &self.claims {
            c.mirror_abort(self.status_word(CPNET_STATUS_OFF_ABORT));
        }
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
            claims: self.claims.as_ref().map_or(0, |c| c.dev),
            peers: 0,
            payload: self.payload.as_ref().map_or(0, |(m, _)| m.dev()),
            payload_bytes: self.payload.as_ref().map_or(0, |(_, b)| *b),
            n_teams: 0,
            teams: 0,
        }
    }
}

