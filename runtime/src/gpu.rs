//! GPU pieces of a PE (issue 4, in progress): the CUDA device of a PE,
//! command queues in pinned host memory mapped into the GPU, the status
//! block, the kernel handle, and kernel builds through the NVRTC helper.
//!
//! Everything goes through cudarc with dynamic loading, so cpnet builds and
//! runs its CPU paths on machines without CUDA; [`open_device`] says clearly
//! why no GPU is usable.
//!
//! Not here yet: the GPU symmetric heap's data path to other PEs (the
//! staged transport of `docs/gpu-data-path-plan.md`).

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use cpnet_device::layout::{CPNET_STATUS_BYTES, CPNET_STATUS_OFF_ABORT, ErrorCode, Handle, Status};
use cpnet_device::nvrtc::{self, BuildOptions};
use cpnet_device::ring::{QueueGeometry, QueueMem};
use cpnet_device::sync::Ordering;
use cudarc::driver::{CudaContext, CudaModule, DeviceRepr, DriverError};
use cudarc::driver::{result as cu, sys as cusys};

/// Why the GPU path is unavailable or failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver library on this machine.
    #[error("no GPU: libcuda (the CUDA driver) was not found")]
    NoDriver,
    /// The driver is there but no device can be used.
    #[error("no GPU: {what}: {source:?}")]
    NoDevice {
        /// What was tried.
        what: String,
        /// The driver's answer.
        source: DriverError,
    },
    /// A CUDA call failed.
    #[error("{what}: {source:?}")]
    Cuda {
        /// The call and its purpose.
        what: &'static str,
        /// The driver's answer.
        source: DriverError,
    },
    /// Kernel compilation failed (the log is in the message).
    #[error(transparent)]
    Nvrtc(#[from] nvrtc::NvrtcError),
}

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
pub fn open_device(local_pe: i32) -> Result<Arc<CudaContext>, GpuError> {
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
    pub fn new(bytes: usize) -> Result<MappedHost, GpuError> {
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

/// A PE's command queues and status block in mapped pinned memory (the
/// default placement, DESIGN.md "The command queue").
#[derive(Debug)]
pub struct GpuQueues {
    queues: MappedHost,
    status: MappedHost,
    geom: QueueGeometry,
    n: usize,
}

impl GpuQueues {
    /// `n` queues of `geom`, zeroed, and a zeroed status block. A context
    /// must be current.
    ///
    /// # Errors
    /// As [`MappedHost::new`].
    pub fn new(n: usize, geom: QueueGeometry) -> Result<GpuQueues, GpuError> {
        Ok(GpuQueues {
            queues: MappedHost::new(n * geom.bytes())?,
            status: MappedHost::new(CPNET_STATUS_BYTES)?,
            geom,
            n,
        })
    }

    /// Number of queues.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether there are no queues.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Queue `i`, for a consumer (the proxy) or a CPU producer.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn queue(&self, i: usize) -> QueueMem {
        assert!(i < self.n, "queue {i} of {}", self.n);
        // SAFETY: inside the mapped allocation (page aligned, geom.bytes()
        // per queue), zeroed at creation, alive as long as `self`, which the
        // owner keeps past every kernel and proxy thread; the GPU follows
        // THE QUEUE PROTOCOL (queue.cuh).
        unsafe { QueueMem::from_raw(self.queues.host().add(i * self.geom.bytes()), self.geom) }
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
    /// waits too (the job is ending).
    pub fn abort(&self, code: ErrorCode) {
        // Release: pairs with the device's acquire of `abort` in its waits.
        self.status_word(CPNET_STATUS_OFF_ABORT).store(code as u32, Ordering::Release);
        for i in 0..self.n {
            self.queue(i).set_abort(code);
        }
    }

    /// The handle a kernel receives (`cpnet_handle_t`).
    pub fn handle(&self, my_pe: i32, n_pes: i32, heap_base: u64, heap_size: u64, wait_timeout_ns: u64) -> Handle {
        Handle {
            my_pe,
            n_pes,
            heap_base,
            heap_size,
            queues: self.queues.dev(),
            n_queues: self.n as u32,
            log2_depth: self.geom.log2_depth(),
            wait_timeout_ns,
            status: self.status.dev(),
            reserved: 0,
        }
    }
}

/// A [`Handle`] as a kernel argument, passed by value (64 bytes).
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct KernelHandle(pub Handle);

// SAFETY: Handle is repr(C) plain integers laid out as cpnet_handle_t
// (layout.rs asserts every offset against cmd.h).
unsafe impl DeviceRepr for KernelHandle {}

/// Compile `source` (which may `#include <cpnet/device.cuh>`) for `ctx`'s
/// GPU with the NVRTC helper and load it.
///
/// # Errors
/// [`GpuError::Nvrtc`] with the compiler log; [`GpuError::Cuda`] when the
/// module does not load.
pub fn build_module(ctx: &Arc<CudaContext>, name: &str, source: &str) -> Result<Arc<CudaModule>, GpuError> {
    let (major, minor) =
        ctx.compute_capability().map_err(|source| GpuError::Cuda { what: "cuDeviceGetAttribute (capability)", source })?;
    let opts = BuildOptions { name: name.into(), ..BuildOptions::for_compute_capability(major as u32, minor as u32) };
    let image = nvrtc::compile_kernel(source, &opts)?;
    ctx.load_module(image).map_err(|source| GpuError::Cuda { what: "cuModuleLoadData", source })
}
