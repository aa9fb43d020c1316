//! The host API: one [`Pe`] per process (OpenSHMEM 1.5 §9.2 "Library
//! setup", §9.3 "Memory management"), with CPU work-groups that speak the
//! same command protocol as GPU work-groups.
//!
//! ```no_run
//! use cpnet::device::cpu::SymAddr;
//! # fn main() -> Result<(), cpnet::pe::Error> {
//! let pe = cpnet::Pe::init()?;                 // collective
//! let buf = pe.shmalloc(8 * 1024)?;            // collective, symmetric
//! let (me, n) = (pe.my_pe(), pe.n_pes());
//! pe.run_work_groups(4, |wg| {                 // 4 CPU work-groups on this PE
//!     let right = (me + 1) % n;
//!     wg.p::<u64>(SymAddr(buf.0 + 8 * u64::from(wg.wg())), me as u64, right)?;
//!     wg.quiet()
//! })?;
//! pe.barrier_all()?;                           // collective
//! pe.finalize()?;                              // collective
//! # Ok(()) }
//! ```
//!
//! # Threads of a PE
//!
//! * `CPNET_PROXY_THREADS` service threads (`cpnet-proxy-<t>`), each owning
//!   the queues `q` with `q % threads == t` and one libfabric endpoint
//!   ([`cpnet_proxy::transport`]); they poll from init to finalize.
//! * one thread per CPU work-group while [`Pe::run_work_groups`] runs;
//! * the bootstrap's reader thread, which learns of failed peers.
//!
//! # Failure
//!
//! When the bootstrap reports a failed peer (its process died, or it
//! aborted), the PE logs it, aborts every queue (waits in work-groups return
//! `PEER_DEAD` at once) and, if the program has not ended by itself within
//! `CPNET_ABORT_GRACE` seconds, exits the process with status 1.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use cpnet_device::cpu::{CpuCtx, HeapView, HostHeap, PeInfo, SymAddr};
use cpnet_device::layout::ErrorCode;
use cpnet_device::ring::{QueueGeometry, QueuePool, RingError};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::CommandError;
use cpnet_proxy::transport::{EndpointFacts, FabricConfig, FabricEndpoint, PeerCard, region_len};

use crate::proxy_threads::{Backend, Proxies};
use std::sync::Mutex;

use crate::bootstrap::{Bootstrap, BootstrapError, PeerFailure};
use crate::env::{EnvError, Launch, Tuning};
use crate::transport_map::{self, Route};

/// A CPU work-group's context: the same device API as a GPU work-group
/// (`cpnet_ctx_t`), in Rust. See [`CpuCtx`].
pub type WorkGroup = CpuCtx;

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
    Gpu(#[from] crate::gpu::GpuError),
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

/// First-fit allocator over the heap's offsets. Every PE performs the same
/// sequence of collective calls, so every PE gets the same offsets.
#[derive(Debug)]
pub(crate) struct SymAlloc {
    /// Free blocks (offset, bytes), sorted by offset, coalesced.
    free: Vec<(u64, u64)>,
    /// Live blocks: offset -> bytes.
    live: std::collections::BTreeMap<u64, u64>,
}

/// Alignment of every symmetric allocation (a cache line).
pub const SHMALLOC_ALIGN: u64 = 64;

impl SymAlloc {
    pub(crate) fn new(size: u64) -> SymAlloc {
        SymAlloc { free: vec![(0, size)], live: Default::default() }
    }
    pub(crate) fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let want = bytes.max(1).next_multiple_of(SHMALLOC_ALIGN);
        let i = self.free.iter().position(|&(_, len)| len >= want)?;
        let (off, len) = self.free[i];
        if len == want {
            self.free.remove(i);
        } else {
            self.free[i] = (off + want, len - want);
        }
        self.live.insert(off, want);
        Some(off)
    }
    pub(crate) fn release(&mut self, off: u64) -> bool {
        let Some(len) = self.live.remove(&off) else { return false };
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Coalesce with the next, then the previous block.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
        true
    }
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free.iter().map(|&(_, l)| l).sum()
    }
}

/// This process's PE: bootstrap, symmetric heap, queues and proxy threads.
/// Created by the collective [`Pe::init`], ended by the collective
/// [`Pe::finalize`] (dropping it without finalize stops the proxy but skips
/// the closing barrier).
pub struct Pe {
    // First: dropping it joins the service threads (without draining, if
    // not finalized) before the queues and the region are freed.
    core: PeCore,
    pool: QueuePool,
    heap: HeapView,
    _region: Arc<HostHeap>,
}

/// What every kind of PE has, CPU or GPU: launch facts, tuning, the
/// bootstrap, the symmetric allocator and the proxy threads, with the
/// collectives and the teardown they share. [`Pe`] and
/// [`GpuPe`](crate::gpu::GpuPe) wrap it with their own heap and queues.
pub(crate) struct PeCore {
    pub(crate) launch: Launch,
    pub(crate) tuning: Tuning,
    pub(crate) provider: String,
    /// `None` only after finalize has handed it back.
    boot: Option<Bootstrap>,
    alloc: Mutex<SymAlloc>,
    heap_size: u64,
    proxies: Proxies,
    /// The proxy threads were stopped (finalize, or abandon).
    stopped: bool,
}

impl PeCore {
    /// Bring up a PE whose proxy threads were spawned: install the failure
    /// handler (`abort` aborts the PE's queues), exchange the endpoints'
    /// cards and meet every PE at a barrier. **Collective.**
    ///
    /// # Errors
    /// [`Error::Bootstrap`], [`Error::Proxy`], [`Error::NotSymmetric`].
    pub(crate) fn start(
        launch: Launch,
        tuning: Tuning,
        provider: String,
        boot: Bootstrap,
        heap_size: u64,
        mut proxies: Proxies,
        abort: impl Fn(ErrorCode) + Send + Sync + 'static,
    ) -> Result<PeCore> {
        let me = launch.pe;
        boot.set_wait_timeout(setup_wait_timeout(&tuning));
        let abort: Arc<dyn Fn(ErrorCode) + Send + Sync> = Arc::new(abort);
        install_failure_handler(&boot, Arc::clone(&proxies.abandon), me, tuning.abort_grace, Arc::clone(&abort));
        let r = proxies.connect(&boot, me).and_then(|()| boot.barrier().map_err(|cause| Error::Bootstrap { pe: me, cause }));
        // Set up: from here on every host collective waits CPNET_COLLECTIVE_TIMEOUT.
        boot.set_wait_timeout(tuning.collective_timeout);
        // The watchdog runs also with stall detection off: it ends the PE
        // on a transport's fatal report (a peer the fabric cannot reach).
        let r = match r {
            Ok(()) => {
                let (abandon, grace) = (Arc::clone(&proxies.abandon), tuning.abort_grace);
                proxies.start_watchdog(
                    me,
                    tuning.proxy_stall_timeout,
                    Box::new(move |report: String| {
                        say(&report);
                        // Release: pairs with the service threads' Acquire in drain.
                        abandon.store(true, std::sync::atomic::Ordering::Release);
                        abort(ErrorCode::Aborted);
                        exit_after_grace(me, grace, "a proxy thread stalled, or a peer is unreachable".to_owned());
                    }),
                )
            }
            r => r,
        };
        let core = PeCore {
            launch,
            tuning,
            provider,
            boot: Some(boot),
            alloc: Mutex::new(SymAlloc::new(heap_size)),
            heap_size,
            proxies,
            stopped: false,
        };
        // On failure, dropping `core` stops the proxy threads.
        r.map(|()| core)
    }

    pub(crate) fn boot(&self) -> &Bootstrap {
        self.boot.as_ref().expect("the bootstrap lives until finalize")
    }

    pub(crate) fn my_pe(&self) -> i32 {
        self.launch.pe
    }

    pub(crate) fn n_pes(&self) -> i32 {
        self.launch.n_pes
    }

    /// The symmetric allocation of `bytes` (collective, checked alike on
    /// every PE): its heap offset.
    pub(crate) fn shmalloc(&self, bytes: u64) -> Result<u64> {
        check_symmetric(self.boot(), self.my_pe(), "shmalloc", bytes)?;
        let mut a = self.alloc.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        a.alloc(bytes).ok_or(Error::OutOfHeap {
            pe: self.my_pe(),
            requested: bytes,
            free: a.free_bytes(),
            heap: self.heap_size,
        })
    }

    pub(crate) fn shfree(&self, addr: SymAddr) -> Result<()> {
        check_symmetric(self.boot(), self.my_pe(), "shfree", addr.0)?;
        if self.alloc.lock().unwrap_or_else(std::sync::PoisonError::into_inner).release(addr.0) {
            Ok(())
        } else {
            Err(Error::BadFree { pe: self.my_pe(), addr: addr.0 })
        }
    }

    pub(crate) fn barrier_all(&self) -> Result<()> {
        self.boot().barrier().map_err(|cause| Error::Bootstrap { pe: self.my_pe(), cause })
    }

    pub(crate) fn allgather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.boot().allgather(data).map_err(|cause| Error::Bootstrap { pe: self.my_pe(), cause })
    }

    pub(crate) fn command_errors(&self) -> Vec<CommandError> {
        self.proxies.command_errors()
    }

    /// Per proxy thread, what its transport reports about itself (set at
    /// start: the threads are connected then).
    pub(crate) fn endpoint_facts(&self) -> &[EndpointFacts] {
        self.proxies.facts()
    }

    /// Barrier, stop the proxy after it has drained, leave the rendezvous.
    /// **Collective.**
    pub(crate) fn finalize(&mut self) -> Result<()> {
        let me = self.my_pe();
        self.barrier_all()?;
        self.proxies.stop(me)?;
        self.stopped = true;
        let n = self.proxies.command_errors().len();
        if n > 0 {
            tracing::warn!("PE {me}: {n} command(s) failed during the run (each reported to its work-group)");
        }
        match self.boot.take() {
            Some(b) => {
                // The PEs tear down their proxies (draining, closing
                // endpoints) at their own pace before they meet again.
                b.set_wait_timeout(setup_wait_timeout(&self.tuning));
                b.finalize().map_err(|cause| Error::Bootstrap { pe: me, cause })
            }
            None => Ok(()),
        }
    }

    /// Unless stopped already: stop the proxy threads without draining. Runs in
    /// `Drop`; owners call it earlier when something must happen between
    /// (a GPU PE aborts its queues first), and hold the core before their
    /// heap and queues so the threads end before those are freed.
    pub(crate) fn abandon(&mut self) {
        if !self.stopped {
            self.proxies.abandon();
            let _ = self.proxies.stop(self.launch.pe);
            self.stopped = true;
        }
    }

    /// Whether the proxy threads were stopped (finalize, or abandon).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }
}

impl std::fmt::Debug for Pe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pe")
            .field("my_pe", &self.core.launch.pe)
            .field("n_pes", &self.core.launch.n_pes)
            .field("provider", &self.core.provider)
            .field("heap_size", &self.heap.size())
            .finish_non_exhaustive()
    }
}

/// The wait timeout of the host collectives of init (after the PE joined the
/// rendezvous) and of finalize's last one: the larger of
/// `CPNET_COLLECTIVE_TIMEOUT` and `CPNET_CONNECT_TIMEOUT` (`None`, forever,
/// if the collective timeout is), since PEs set up and tear down their
/// fabric, heaps and GPU at their own pace, as they start at their own
/// pace; every other host collective waits `CPNET_COLLECTIVE_TIMEOUT`. See
/// [`Bootstrap::set_wait_timeout`].
pub(crate) fn setup_wait_timeout(tuning: &Tuning) -> Option<Duration> {
    tuning.collective_timeout.map(|t| t.max(tuning.connect_timeout))
}

/// Sets up `tracing` output on stderr once per process (`RUST_LOG`, default
/// `warn`), unless the program installed a subscriber already.
pub(crate) fn init_logging() {
    // Once, not at every init: each subscriber built only for `try_init`
    // to refuse it (one is set) left ~120 B allocated in tracing-core
    // (heaptrack: 4.7 KiB over 40 init/finalize cycles).
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    });
}

/// The provider and where it binds. The provider: `CPNET_PROVIDER`, else
/// `shm` when every PE is on this host, `tcp;ofi_rxm` otherwise. Where an IP
/// provider binds: `CPNET_FABRIC_NODE`; else `rendezvous_ip`, the local
/// address of this PE's connection to the rendezvous
/// ([`Bootstrap::local_ip`]), i.e. the interface this host reaches PE 0's
/// host through (`127.0.0.1` under cpnet-run, whose rendezvous is there);
/// else (a single PE) `127.0.0.1`. Left to itself, libfabric's tcp provider
/// takes the first interface it lists, which can be the loopback one: a PE
/// then publishes `127.0.0.1` and no other host reaches it (seen between two
/// network namespaces, scripts/twohost.sh). Nor is "every PE on this host"
/// a safe reason for `127.0.0.1`: it is only assumed where the launcher says
/// nothing of hosts (PMI without `MPI_LOCAL*`).
pub(crate) fn default_fabric(launch: &Launch, tuning: &Tuning, rendezvous_ip: Option<std::net::IpAddr>) -> FabricConfig {
    let all_local = launch.local_size == launch.n_pes;
    let provider = tuning
        .provider
        .clone()
        .unwrap_or_else(|| if all_local { "shm".to_owned() } else { "tcp;ofi_rxm".to_owned() });
    let ip = !provider.starts_with("shm");
    let src_node = tuning
        .fabric_node
        .clone()
        .or_else(|| rendezvous_ip.map(|a| a.to_string()))
        .or_else(|| all_local.then(|| "127.0.0.1".to_owned()));
    FabricConfig { provider, src_node: if ip { src_node } else { None }, reach_timeout: tuning.reach_timeout }
}

impl Pe {
    /// Start this PE (`shmem_init`, §9.2.1). **Collective**: every PE of the
    /// job calls it. Reads the launch environment and tuning variables
    /// ([`crate::env`]), meets the other PEs at the rendezvous, allocates and
    /// registers the symmetric heap, opens the fabric and starts the proxy.
    ///
    /// # Errors
    /// [`Error::Env`], [`Error::Bootstrap`] (rendezvous unreachable, a peer
    /// failed), [`Error::Transport`] (provider missing or lacking RMA and
    /// atomics), [`Error::Queue`].
    pub fn init() -> Result<Pe> {
        let launch = Launch::from_env()?;
        let tuning = Tuning::from_env()?;
        Pe::init_with(launch, tuning)
    }

    /// [`Pe::init`] with explicit launch facts and tuning. **Collective.**
    ///
    /// # Errors
    /// As [`Pe::init`].
    pub fn init_with(launch: Launch, tuning: Tuning) -> Result<Pe> {
        init_logging();
        let me = launch.pe;
        let boot_err = |source| Error::Bootstrap { pe: me, cause: source };
        let boot = Bootstrap::connect(&launch, tuning.connect_timeout).map_err(boot_err)?;
        let geom = QueueGeometry::new(tuning.queue_depth).map_err(|source| Error::Queue { pe: me, cause: source })?;
        let pool = QueuePool::new_host(tuning.queues, geom);
        let heap_size = tuning.heap_size.next_multiple_of(SHMALLOC_ALIGN);
        let region = Arc::new(HostHeap::new(region_len(heap_size)));
        let region_view = region.view();
        // SAFETY: the user heap is the first `heap_size` bytes of the region,
        // which `_region` keeps allocated as long as `self` (and the service
        // threads, joined before it is freed).
        let heap = unsafe { HeapView::from_raw(region_view.base(), heap_size) };
        let fabric = default_fabric(&launch, &tuning, boot.local_ip());
        let threads = tuning.proxy_threads.min(tuning.queues).max(1);
        let limits = Limits { n_pes: launch.n_pes, heap_size };
        let queues = (0..threads).map(|t| (t..tuning.queues).step_by(threads).map(|q| pool.queue(q)).collect()).collect();
        let backend = Arc::new(HostBackend {
            fabric: fabric.clone(),
            me,
            region: region_view,
            heap_size,
            epoch: Arc::new(AtomicU64::new(0)),
        });
        let proxies = Proxies::spawn(backend, me, queues, limits, &fabric.provider, &tuning)?;
        let aborted: Vec<_> = (0..pool.len()).map(|q| pool.queue(q)).collect();
        let core = PeCore::start(launch, tuning, fabric.provider, boot, heap_size, proxies, move |code| {
            for q in &aborted {
                q.set_abort(code);
            }
        })?;
        let pe = Pe { core, pool, heap, _region: region };
        tracing::debug!(pe = me, n_pes = pe.n_pes(), provider = %pe.core.provider, threads, "cpnet PE up");
        if pe.core.tuning.transport_map {
            transport_map::print(&pe.transport_map());
        }
        Ok(pe)
    }

    /// The path this PE's operations take to every PE, itself included (PE
    /// order), and the provider as libfabric granted it: what
    /// `CPNET_TRANSPORT_MAP=1` prints after init ([`crate::transport_map`]).
    /// Local.
    pub fn transport_map(&self) -> Vec<Route> {
        let facts = self.core.endpoint_facts();
        let fallback;
        let first = match facts.first() {
            Some(f) => f,
            None => {
                // Not reachable after init (every thread connected); say
                // what was asked for rather than nothing.
                fallback = EndpointFacts {
                    provider: self.core.provider.clone(),
                    fabric: String::new(),
                    domain: String::new(),
                    local_addr: String::new(),
                    peer_addrs: Vec::new(),
                };
                &fallback
            }
        };
        transport_map::cpu_routes(self.my_pe(), self.n_pes(), first, facts.len())
    }

    /// This PE's number, `0..n_pes` (`shmem_my_pe`, §9.2.3). Local.
    pub fn my_pe(&self) -> i32 {
        self.core.my_pe()
    }

    /// Number of PEs in the job (`shmem_n_pes`, §9.2.4). Local.
    pub fn n_pes(&self) -> i32 {
        self.core.n_pes()
    }

    /// The libfabric provider in use (`"shm"`, `"tcp;ofi_rxm"`, ...).
    pub fn provider(&self) -> &str {
        &self.core.provider
    }

    /// The provider and bind address this PE's proxy threads opened (what
    /// `CPNET_PROVIDER` and `CPNET_FABRIC_NODE` chose), for tools that open
    /// their own endpoint beside cpnet's, such as `cpnet-bench`'s raw
    /// libfabric floor. Local.
    pub fn fabric_config(&self) -> FabricConfig {
        // The same choice init made, from the same inputs.
        default_fabric(&self.core.launch, &self.core.tuning, self.core.boot.as_ref().and_then(Bootstrap::local_ip))
    }

    /// This PE's symmetric heap, for host reads and writes of local
    /// symmetric data (raw copies and atomics; remote PEs may write it at
    /// any time).
    pub fn heap(&self) -> &HeapView {
        &self.heap
    }

    /// What a work-group needs to know about this PE.
    pub fn pe_info(&self) -> PeInfo {
        PeInfo { my_pe: self.my_pe(), n_pes: self.n_pes(), heap: self.heap, wait_timeout: self.core.tuning.wait_timeout }
    }

    /// Allocate `bytes` of symmetric memory (`shmem_malloc`, §9.3.1):
    /// returns the same heap offset on every PE, aligned to
    /// [`SHMALLOC_ALIGN`]; the contents are not cleared. **Collective**
    /// (includes a barrier), with the same `bytes` on every PE.
    ///
    /// # Errors
    /// [`Error::NotSymmetric`] if PEs asked for different sizes,
    /// [`Error::OutOfHeap`], [`Error::Bootstrap`].
    pub fn shmalloc(&self, bytes: u64) -> Result<SymAddr> {
        self.core.shmalloc(bytes).map(SymAddr)
    }

    /// Free a block from [`Pe::shmalloc`] (`shmem_free`, §9.3.2).
    /// **Collective** (includes a barrier), with the same address on every PE.
    ///
    /// # Errors
    /// [`Error::NotSymmetric`], [`Error::BadFree`], [`Error::Bootstrap`].
    pub fn shfree(&self, addr: SymAddr) -> Result<()> {
        self.core.shfree(addr)
    }

    /// Run `n` CPU work-groups on this PE, each on its own thread with its
    /// own context (queue), `f(&mut ctx)` in each; returns when all have
    /// ended. Each context is quieted and released at the end. One-sided
    /// (other PEs need not call it at the same time).
    ///
    /// # Errors
    /// The first work-group error (naming PE, work-group, operation and
    /// address); [`cpnet_device::cpu::Error::NoQueue`] if `n` exceeds the
    /// free queues (`CPNET_QUEUES`).
    pub fn run_work_groups<F>(&self, n: u32, f: F) -> Result<()>
    where
        F: Fn(&mut WorkGroup) -> std::result::Result<(), cpnet_device::cpu::Error> + Sync,
    {
        let info = self.pe_info();
        let results: Vec<std::result::Result<(), cpnet_device::cpu::Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|wg| {
                    let (pool, f) = (&self.pool, &f);
                    std::thread::Builder::new()
                        .name(format!("cpnet-wg-{wg}"))
                        .spawn_scoped(s, move || {
                            let mut ctx = CpuCtx::create(pool, info, wg)?;
                            let r = f(&mut ctx);
                            let d = ctx.destroy();
                            r.and(d)
                        })
                        .expect("spawn a work-group thread")
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        for r in results {
            r?;
        }
        Ok(())
    }

    /// Run `f` with a context on the calling thread (work-group id `wg`),
    /// quieted and released afterwards: host-issued operations. One-sided.
    ///
    /// # Errors
    /// As [`Pe::run_work_groups`].
    pub fn with_ctx<R>(
        &self,
        wg: u32,
        f: impl FnOnce(&mut WorkGroup) -> std::result::Result<R, cpnet_device::cpu::Error>,
    ) -> Result<R> {
        let mut ctx = CpuCtx::create(&self.pool, self.pe_info(), wg)?;
        let r = f(&mut ctx);
        let d = ctx.destroy();
        let v = r?;
        d?;
        Ok(v)
    }

    /// A context on a queue of this PE's pool for work-group id `wg`, kept
    /// by the caller (`shmem_ctx_create`, OpenSHMEM 1.5 §9.4.1): what the C
    /// API (`libcpnet`) gives each thread or `shmem_ctx_t`. One-sided, local.
    /// Destroy it ([`WorkGroup::destroy`]) before [`Pe::finalize`]; the
    /// queue's memory outlives the PE (the pool is reference-counted), but
    /// operations issued after finalize fail (no proxy serves them).
    ///
    /// # Errors
    /// [`cpnet_device::cpu::Error::NoQueue`] when every queue
    /// (`CPNET_QUEUES`) is in use.
    pub fn ctx_create(&self, wg: u32) -> Result<WorkGroup> {
        Ok(CpuCtx::create(&self.pool, self.pe_info(), wg)?)
    }

    /// Wait until every PE has called it (`shmem_barrier_all`, §9.9.1, from
    /// the host). **Collective.** Work-group operations issued by
    /// [`Pe::run_work_groups`] are complete when it returns, so after this
    /// barrier every PE sees them.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] (`PeerFailed` when a peer died, or when a PE
    /// waited in it longer than `CPNET_COLLECTIVE_TIMEOUT`: the report names the
    /// PEs that had not arrived; so for every host collective).
    pub fn barrier_all(&self) -> Result<()> {
        self.core.barrier_all()
    }

    /// Exchange `data` with every PE and return all PEs' data, in PE order,
    /// through the bootstrap (host-side setup, not a fast path).
    /// **Collective.**
    ///
    /// # Errors
    /// [`Error::Bootstrap`].
    pub fn allgather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.core.allgather_bytes(data)
    }

    /// Tell every other PE that this PE is failing (`shmem_global_exit`
    /// without the exit): they abort with a message naming this PE and
    /// `reason`. One-sided.
    pub fn abort_job(&self, reason: &str) {
        self.core.boot().abort(reason);
    }

    /// Command errors the proxy recorded so far (each was also returned to
    /// the work-group that issued the command, or will be at its next quiet).
    pub fn command_errors(&self) -> Vec<CommandError> {
        self.core.command_errors()
    }

    /// End this PE (`shmem_finalize`, §9.2.2): barrier, stop the proxy
    /// after it has drained, leave the rendezvous. **Collective.**
    ///
    /// # Errors
    /// [`Error::Bootstrap`] (a peer failed), [`Error::Proxy`].
    pub fn finalize(mut self) -> Result<()> {
        self.core.finalize()
    }
}

/// Allgather `arg` and check every PE passed the same value (also the
/// collective's barrier). **Collective.**
pub(crate) fn check_symmetric(boot: &Bootstrap, me: i32, call: &'static str, arg: u64) -> Result<()> {
    let all = boot.allgather(&arg.to_le_bytes()).map_err(|source| Error::Bootstrap { pe: me, cause: source })?;
    for (peer, b) in all.iter().enumerate() {
        if b.as_slice() != arg.to_le_bytes() {
            return Err(Error::NotSymmetric { pe: me, call, detail: format!("this PE passed {arg}, PE {peer} passed {:?}", b) });
        }
    }
    Ok(())
}

/// On a peer failure reported by the bootstrap: log it, let the proxy stop
/// without draining, `abort` the PE's queues (waits return `PEER_DEAD` at
/// once), and exit the process with status 1 if the program has not ended
/// within `grace`.
fn install_failure_handler(
    boot: &Bootstrap,
    abandon: Arc<AtomicBool>,
    me: i32,
    grace: Duration,
    abort: Arc<dyn Fn(ErrorCode) + Send + Sync>,
) {
    let fired = AtomicBool::new(false);
    boot.set_failure_handler(Box::new(move |f: &PeerFailure| {
        if fired.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        say(&format!("cpnet: PE {me}: {f}; aborting this PE"));
        // Release: pairs with the service threads' Acquire in drain.
        abandon.store(true, std::sync::atomic::Ordering::Release);
        abort(ErrorCode::PeerDead);
        exit_after_grace(me, grace, f.to_string());
    }));
}

/// Exit the process with status 1 unless the program ends within `grace`
/// (a thread sleeps it out): the last step of aborting a PE, after a peer
/// failure or a stalled proxy thread (`why`).
fn exit_after_grace(me: i32, grace: Duration, why: String) {
    let _ = std::thread::Builder::new().name("cpnet-abort".into()).spawn(move || {
        std::thread::sleep(grace);
        say(&format!(
            "cpnet: PE {me}: the program did not end within {:.1} s of the failure ({why}); exiting with status 1",
            grace.as_secs_f64()
        ));
        // _exit, not exit: other threads may be inside libfabric
        // (holding its locks) or blocked on a dead peer; running
        // atexit handlers and library destructors under them can
        // hang the exit itself.
        // SAFETY: _exit(2) ends the process at once; nothing after
        // it runs, and stderr is unbuffered (the line above is out).
        unsafe { libc::_exit(1) };
    });
}

/// The CPU PE's transport: libfabric RMA and atomics on the host heap.
struct HostBackend {
    fabric: FabricConfig,
    me: i32,
    region: HeapView,
    heap_size: u64,
    epoch: Arc<AtomicU64>,
}

impl Backend for HostBackend {
    type Endpoint = FabricEndpoint;
    type Transport = cpnet_proxy::transport::FabricTransport;
    fn open(&self, _t: usize) -> std::result::Result<FabricEndpoint, String> {
        FabricEndpoint::open(&self.fabric, self.me, self.region, self.heap_size).map_err(|e| e.to_string())
    }
    fn card(ep: &FabricEndpoint) -> Vec<u8> {
        ep.card().to_bytes()
    }
    fn connect(&self, ep: FabricEndpoint, cards: Vec<Vec<u8>>) -> std::result::Result<Self::Transport, String> {
        let mut parsed = Vec::with_capacity(cards.len());
        for (peer, c) in cards.iter().enumerate() {
            parsed.push(PeerCard::from_bytes(c).ok_or_else(|| format!("PE {peer} sent a malformed fabric card"))?);
        }
        ep.connect(&parsed, Arc::clone(&self.epoch)).map_err(|e| e.to_string())
    }
    fn describe(tr: &Self::Transport) -> EndpointFacts {
        tr.describe()
    }
}

/// One line to stderr in a single write, so lines of several PEs sharing
/// the terminal do not interleave.
fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

impl Drop for PeCore {
    fn drop(&mut self) {
        self.abandon();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_binds_the_rendezvous_route_and_loopback_only_without_one() {
        use crate::env::Launcher;
        let ip: std::net::IpAddr = "10.213.7.2".parse().unwrap();
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let one_host = Launch { pe: 1, n_pes: 2, local_pe: 1, local_size: 2, bootstrap: Some("h:1".into()), launcher: Launcher::Mpi };
        let two_hosts = Launch { local_pe: 0, local_size: 1, ..one_host.clone() };
        let tcp = Tuning { provider: Some("tcp;ofi_rxm".into()), ..Tuning::default() };

        let f = default_fabric(&one_host, &Tuning::default(), Some(ip));
        assert_eq!((f.provider.as_str(), f.src_node), ("shm", None), "one host: shm, which binds nothing");
        let f = default_fabric(&one_host, &tcp, Some(lo));
        assert_eq!(f.src_node.as_deref(), Some("127.0.0.1"), "cpnet-run over tcp: its rendezvous is on loopback");
        let f = default_fabric(&one_host, &tcp, None);
        assert_eq!(f.src_node.as_deref(), Some("127.0.0.1"), "one host, no connection: loopback");
        // PMI without MPI_LOCAL*: "one host" is only assumed; the route decides.
        let f = default_fabric(&one_host, &tcp, Some(ip));
        assert_eq!(f.src_node.as_deref(), Some("10.213.7.2"), "assumed one host over tcp: the route to PE 0");

        let f = default_fabric(&two_hosts, &Tuning::default(), Some(ip));
        assert_eq!((f.provider.as_str(), f.src_node.as_deref()), ("tcp;ofi_rxm", Some("10.213.7.2")), "the route to PE 0");
        let f = default_fabric(&two_hosts, &Tuning::default(), None);
        assert_eq!(f.src_node, None, "no connection: the provider's choice");
        let node = Tuning { fabric_node: Some("10.9.9.9".into()), ..tcp.clone() };
        let f = default_fabric(&two_hosts, &node, Some(ip));
        assert_eq!(f.src_node.as_deref(), Some("10.9.9.9"), "CPNET_FABRIC_NODE wins");
        let shm = Tuning { provider: Some("shm".into()), ..Tuning::default() };
        assert_eq!(default_fabric(&two_hosts, &shm, Some(ip)).src_node, None, "shm binds no address");
    }

    #[test]
    fn symmetric_allocator_is_first_fit_and_coalesces() {
        let mut a = SymAlloc::new(1024);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(100).unwrap();
        let z = a.alloc(64).unwrap();
        assert_eq!((x, y, z), (0, 64, 192));
        assert!(a.alloc(1024).is_none());
        assert!(a.release(y));
        assert!(!a.release(y), "double free is refused");
        assert_eq!(a.alloc(128), Some(64), "the hole is reused");
        assert!(a.release(64) && a.release(x) && a.release(z));
        assert_eq!(a.free, vec![(0, 1024)], "everything coalesces back");
    }
}
