//! The host API's errors: [`Error`] (every call of [`Pe`](crate::Pe) and
//! [`GpuPe`](crate::GpuPe)), [`GpuError`] (the GPU path), and the [`Result`] alias.

use cudarc::driver::DriverError;
use cpnet_device::nvrtc;
use cpnet_device::ring::RingError;

use crate::bootstrap::BootstrapError;
use crate::env::EnvError;

/// Errors of the host API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `CPNET_*` (or launcher) variable is malformed.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The rendezvous failed, or a peer failed during a collective.
    // The cause is in the message and deliberately not a `source()`, so a
    // printed error chain does not repeat it (likewise for Queue).
    #[error("PE {pe}: bootstrap: {cause}")]
    Bootstrap {
        /// This PE.
        pe: i32,
        /// What failed.
        cause: BootstrapError,
    },
    /// The fabric could not be opened or connected.
    #[error(transparent)]
    Transport(#[from] cpnet_proxy::transport::TransportError),
    /// A queue pool geometry is invalid (`CPNET_QUEUE_DEPTH`).
    #[error("PE {pe}: queue geometry: {cause}")]
    Queue {
        /// This PE.
        pe: i32,
        /// Why.
        cause: RingError,
    },
    /// A work-group's operation failed; names PE, work-group, op, address.
    #[error(transparent)]
    WorkGroup(#[from] cpnet_device::cpu::Error),
    /// `shmalloc` could not fit the request.
    #[error(
        "PE {pe}: shmalloc({requested} bytes): the symmetric heap has no free block that large \
         ({free} bytes free of {heap} in total; raise CPNET_HEAP_SIZE)"
    )]
    OutOfHeap {
        /// This PE.
        pe: i32,
        /// Bytes asked for.
        requested: u64,
        /// Bytes free (maybe fragmented).
        free: u64,
        /// Heap size.
        heap: u64,
    },
    /// PEs called a collective with different arguments.
    #[error("PE {pe}: {call} is collective and must get the same arguments on every PE: {detail}")]
    NotSymmetric {
        /// This PE.
        pe: i32,
        /// The call.
        call: &'static str,
        /// What differed.
        detail: String,
    },
    /// `shfree` of an address `shmalloc` did not return.
    #[error("PE {pe}: shfree(heap+{addr:#x}): not a block returned by shmalloc")]
    BadFree {
        /// This PE.
        pe: i32,
        /// The address.
        addr: u64,
    },
    /// A host access to the heap falls outside it.
    #[error("PE {pe}: heap+{addr:#x} ({size} bytes) is outside the symmetric heap ({heap} bytes)")]
    OutsideHeap {
        /// This PE.
        pe: i32,
        /// Heap offset.
        addr: u64,
        /// Bytes.
        size: u64,
        /// Heap size.
        heap: u64,
    },
    /// No usable GPU, or a CUDA call of the GPU backend failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// A kernel reported a device-side error in the PE's status block (a
    /// wait that timed out, an operation that failed inside a kernel).
    #[error("PE {pe}: device-side error: {report}")]
    Device {
        /// This PE.
        pe: i32,
        /// What the status block says: code, work-group, PE, address,
        /// expected and found values.
        report: String,
    },
    /// A team could not be made or used (OpenSHMEM 1.5 §9.4).
    #[error("PE {pe}: {why}")]
    Team {
        /// This PE.
        pe: i32,
        /// What was asked and why it failed.
        why: String,
    },
    /// The proxy daemon (`CPNET_PROXY=daemon`) could not be reached, refused
    /// this PE, or failed it.
    #[error("PE {pe}: proxy daemon: {why}")]
    Daemon {
        /// This PE.
        pe: i32,
        /// What happened, naming the daemon's socket (and pid once known).
        why: String,
    },
    /// A service thread died or could not start.
    #[error("PE {pe}: proxy service thread {thread}: {why}")]
    Proxy {
        /// This PE.
        pe: i32,
        /// Thread index.
        thread: usize,
        /// Why.
        why: String,
    },
}

/// The host API's result type.
pub type Result<T> = std::result::Result<T, Error>;

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
    /// A persistent kernel's blocks and this PE's landing agents do not fit
    /// on its share of the GPU at once ([`crate::GpuPe::max_persistent_blocks`]).
    #[error(
        "no room for a persistent kernel: {coresident} blocks of {threads} threads fit on this PE's share of the GPU, \
         and its {agents} landing agents need the room of {room} of them (fewer threads or registers per block, \
         fewer PEs per GPU, or CPNET_AGENT_LANES / CPNET_PROXY_THREADS lower)"
    )]
    NoRoom {
        /// Blocks of the kernel that fit at once on this PE's share.
        coresident: u32,
        /// Threads per block.
        threads: u32,
        /// Landing agents of this PE.
        agents: u32,
        /// Blocks' worth of room they need.
        room: u32,
    },
    /// Memory shared with the proxy daemon (a memfd) could not be made,
    /// mapped or checked.
    #[error("shared memory for the proxy daemon: {0}")]
    Shared(String),
}
