//! The few CUDA driver objects the staged transport needs, through cudarc's
//! raw driver API (dynamically loaded, so the proxy builds and runs its CPU
//! paths without CUDA): pinned host memory, a non-blocking stream, and a
//! pool of timing-free events that are *queried*, never waited on.
//!
//! Every function here must run on a thread where the PE's CUDA context is
//! current (`CudaContext::bind_to_thread`); the staged transport binds it
//! when it opens.

use cudarc::driver::sys as cusys;
use cudarc::driver::{DriverError, result as cu};

/// A CUDA driver failure: the call and the driver's answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {source:?}")]
pub struct CudaError {
    /// The call and its purpose.
    pub what: &'static str,
    /// The driver's answer.
    pub source: DriverError,
}

/// `Result` of this module.
pub type Result<T> = std::result::Result<T, CudaError>;

fn check(what: &'static str, r: cusys::CUresult) -> Result<()> {
    r.result().map_err(|source| CudaError { what, source })
}

/// Page-locked host memory (`cuMemHostAlloc(PORTABLE | DEVICEMAP)`), zeroed:
/// the copy engines reach it by DMA, so asynchronous copies from and to it
/// really are asynchronous; libfabric may register it like any host memory;
/// and kernels of the context (the landing agent, `cpnet/agent.cuh`) reach
/// it at [`Pinned::dev_ptr`].
#[derive(Debug)]
pub struct Pinned {
    ptr: *mut u8,
    dev: u64,
    len: usize,
}

impl Pinned {
    /// `len` bytes (at least 64), page aligned, zeroed.
    ///
    /// # Errors
    /// `cuMemHostAlloc` and `cuMemHostGetDevicePointer` failures.
    pub fn new(len: usize) -> Result<Pinned> {
        let len = len.max(64);
        // SAFETY: a context is current (module contract); the memory is zeroed
        // below before anyone reads it.
        let ptr = unsafe { cu::malloc_host(len, cusys::CU_MEMHOSTALLOC_PORTABLE | cusys::CU_MEMHOSTALLOC_DEVICEMAP) }
            .map_err(|source| CudaError { what: "cuMemHostAlloc (staging buffers)", source })?
            .cast::<u8>();
        // SAFETY: a fresh allocation of `len` bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        let mut p = Pinned { ptr, dev: 0, len };
        let mut dev: cusys::CUdeviceptr = 0;
        // SAFETY: `ptr` was allocated with DEVICEMAP in the current context;
        // `dev` is a valid out-pointer.
        check("cuMemHostGetDevicePointer (staging buffers)", unsafe {
            cusys::cuMemHostGetDevicePointer_v2(&mut dev, ptr.cast(), 0)
        })?;
        p.dev = dev;
        Ok(p)
    }

    /// First byte. The memory is shared with the copy engines and the
    /// fabric: touch it through raw pointers only.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The address of [`Pinned::ptr`] as kernels of the context see it.
    pub fn dev_ptr(&self) -> u64 {
        self.dev
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty; for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once; the owner drops it
        // only after its stream is synchronized and its memory region closed.
        let _ = unsafe { cu::free_host(self.ptr.cast()) };
    }
}

/// Host memory that this process mapped itself (a shared mapping of
/// another process's staging zone, `staged::zone`), page-locked and mapped
/// into the context with `cuMemHostRegister(PORTABLE | DEVICEMAP)`: copy
/// engines reach it by DMA and kernels at [`Registered::dev_ptr`], as with
/// [`Pinned`]. Unregistered on drop; the mapping itself belongs to the owner.
#[derive(Debug)]
pub struct Registered {
    ptr: *mut u8,
    dev: u64,
}

impl Registered {
    /// Register `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr+len` is a live, page-aligned mapping of this process that
    /// stays mapped until this value is dropped.
    ///
    /// # Errors
    /// `cuMemHostRegister` and `cuMemHostGetDevicePointer` failures.
    pub unsafe fn new(ptr: *mut u8, len: usize, what: &'static str) -> Result<Registered> {
        let flags = cusys::CU_MEMHOSTREGISTER_PORTABLE | cusys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller's contract; a context is current (module contract).
        check(what, unsafe { cusys::cuMemHostRegister_v2(ptr.cast(), len, flags) })?;
        // Unregistered by Drop if the next call fails.
        let mut r = Registered { ptr, dev: 0 };
        let mut dev: cusys::CUdeviceptr = 0;
        // SAFETY: `ptr` was just registered with DEVICEMAP; `dev` is a valid
        // out-pointer.
        check(what, unsafe { cusys::cuMemHostGetDevicePointer_v2(&mut dev, ptr.cast(), 0) })?;
        r.dev = dev;
        Ok(r)
    }

    /// The address of the first byte as kernels of the context see it.
    pub fn dev_ptr(&self) -> u64 {
        self.dev
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        // SAFETY: registered by `new`, unregistered once, while the mapping
        // is still live (the owner unmaps after dropping this).
        let _ = unsafe { cusys::cuMemHostUnregister(self.ptr.cast()) };
    }
}

/// A `CU_STREAM_NON_BLOCKING` stream: it runs beside kernels on other
/// streams (the persistent kernels cpnet serves) and never waits for the
/// legacy default stream.
#[derive(Debug)]
pub struct Stream {
    raw: cusys::CUstream,
}

impl Stream {
    /// A new non-blocking stream.
    ///
    /// # Errors
    /// `cuStreamCreate` failures.
    pub fn new() -> Result<Stream> {
        let raw = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(|source| CudaError { what: "cuStreamCreate (proxy copy stream)", source })?;
        Ok(Stream { raw })
    }

    /// The raw handle.
    pub fn raw(&self) -> cusys::CUstream {
        self.raw
    }

    /// `cuMemcpyHtoDAsync`.
    ///
    /// # Safety
    /// 1. `src..src+len` is pinned host memory that stays allocated and
    ///    unmodified until a later event on this stream has completed.
    /// 2. `dst..dst+len` is device memory of the current context.
    pub unsafe fn htod(&self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuMemcpyHtoDAsync", unsafe { cusys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.raw) })
    }

    /// `cuMemcpyDtoHAsync`.
    ///
    /// # Safety
    /// 1. `dst..dst+len` is pinned host memory nobody reads or writes until a
    ///    later event on this stream has completed.
    /// 2. `src..src+len` is device memory of the current context.
    pub unsafe fn dtoh(&self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuMemcpyDtoHAsync", unsafe { cusys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, self.raw) })
    }

    /// `cuMemcpyDtoDAsync` (the ranges may overlap only if equal).
    ///
    /// # Safety
    /// 1. Both ranges are device memory of the current context.
    pub unsafe fn dtod(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuMemcpyDtoDAsync", unsafe { cusys::cuMemcpyDtoDAsync_v2(dst, src, len, self.raw) })
    }

    /// `cuStreamWriteValue64`: write `value` to the 8-byte device word
    /// `dst` once the work queued so far on this stream has run, preceded
    /// by a memory barrier (default flags: the earlier copies' data is
    /// visible before the word). A stream memory operation, run by the
    /// GPU's front end: no copy engine, so no copy's fixed cost
    /// (`cpnet-gpu-check copy-floor`). Needs
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1`, which CUDA 12 and
    /// later set on every device; an error where it is off.
    ///
    /// # Safety
    /// 1. `dst` is an 8-byte-aligned word of device memory of the current
    ///    context that stays allocated until a later event on this stream
    ///    has completed.
    pub unsafe fn write_u64(&self, dst: u64, value: u64) -> Result<()> {
        // SAFETY: the caller's contract.
        check("cuStreamWriteValue64", unsafe { cusys::cuStreamWriteValue64_v2(self.raw, dst, value, 0) })
    }

    /// Wait until everything queued on the stream has run (teardown only).
    ///
    /// # Errors
    /// `cuStreamSynchronize` failures (a sticky context error).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is alive.
        check("cuStreamSynchronize", unsafe { cusys::cuStreamSynchronize(self.raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by cuStreamCreate and destroyed once; work still
        // queued completes first (the driver defers the release).
        let _ = unsafe { cu::stream::destroy(self.raw) };
    }
}

/// An event of an [`EventPool`], recorded on a stream (only the pool makes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event(cusys::CUevent);

/// Events (`CU_EVENT_DISABLE_TIMING`) recorded after copies and polled with
/// `cuEventQuery`; reused through a free list.
#[derive(Debug, Default)]
pub struct EventPool {
    free: Vec<cusys::CUevent>,
    all: Vec<cusys::CUevent>,
}

/// Whether a recorded event has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventState {
    /// Everything before it on its stream has completed.
    Done,
    /// Not yet.
    Pending,
}

impl EventPool {
    /// Record an event on `stream` (after the work queued so far) and return it.
    ///
    /// # Errors
    /// `cuEventCreate` / `cuEventRecord` failures.
    pub fn record(&mut self, stream: &Stream) -> Result<Event> {
        let ev = match self.free.pop() {
            Some(e) => e,
            None => {
                let e = cu::event::create(cusys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(|source| CudaError { what: "cuEventCreate", source })?;
                self.all.push(e);
                e
            }
        };
        // SAFETY: `ev` is a live event of this pool and `stream` a live stream
        // of the same context.
        if let Err(source) = unsafe { cu::event::record(ev, stream.raw()) } {
            self.free.push(ev);
            return Err(CudaError { what: "cuEventRecord", source });
        }
        Ok(Event(ev))
    }

    /// Query `ev` (from [`EventPool::record`]) without blocking.
    ///
    /// # Errors
    /// Any answer other than success and `CUDA_ERROR_NOT_READY` (a failed copy
    /// leaves a sticky error in the context).
    pub fn query(&self, ev: Event) -> Result<EventState> {
        // SAFETY: `ev` is a live event made by a pool (events are destroyed
        // only when their pool drops, and an Event never outlives its use).
        match unsafe { cusys::cuEventQuery(ev.0) } {
            cusys::CUresult::CUDA_SUCCESS => Ok(EventState::Done),
            cusys::CUresult::CUDA_ERROR_NOT_READY => Ok(EventState::Pending),
            e => Err(CudaError { what: "cuEventQuery", source: DriverError(e) }),
        }
    }

    /// Give `ev` back for reuse (after it passed, or when abandoning it).
    pub fn release(&mut self, ev: Event) {
        self.free.push(ev.0);
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        for &e in &self.all {
            // SAFETY: created by this pool, destroyed once; the driver defers
            // the release of an event still pending.
            let _ = unsafe { cu::event::destroy(e) };
        }
    }
}
