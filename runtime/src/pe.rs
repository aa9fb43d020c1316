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
use std::sync::atomic::AtomicU64;

use cpnet_device::cpu::{CpuCtx, HeapView, HostHeap, PeInfo, SymAddr};
use cpnet_device::layout::ErrorCode;
use cpnet_device::ring::{QueueGeometry, QueuePool};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::CommandError;
use cpnet_proxy::transport::{EndpointFacts, FabricConfig, region_len};

use std::os::fd::OwnedFd;

use cpnet_device::sync::Words;

use crate::bootstrap::Bootstrap;
use crate::core::PeCore;
use crate::daemon::{self, DaemonLink, DaemonPaths, shm::SharedMem, wire::Attach};
use crate::env::{JobKey, Launch, ProxyMode, Tuning};
use crate::host_backend::HostBackend;
use crate::proxy_link::ProxyLink;
use crate::proxy_threads::Proxies;
use crate::startup::{self, PeKind, Traffic};
use crate::team::{self, Team, TeamHost, Teams};
use crate::transport_map::{self, Route};

pub use crate::core::SHMALLOC_ALIGN;
pub use crate::error::{Error, Result};

/// A CPU work-group's context: the same device API as a GPU work-group
/// (`cpnet_ctx_t`), in Rust. See [`CpuCtx`].
pub type WorkGroup = CpuCtx;


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
    /// Last: the memory of the pool and the heap.
    _mem: CpuMem,
}


impl std::fmt::Debug for Pe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pe")
            .field("my_pe", &self.core.launch.pe)
            .field("n_pes", &self.core.launch.n_pes)
            .field("provider", &self.core.provider())
            .field("heap_size", &self.heap.size())
            .finish_non_exhaustive()
    }
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
        let (core, parts) = startup::start(launch, tuning, CpuKind)?;
        let CpuParts { pool, heap, mem, .. } = parts;
        let me = core.my_pe();
        let pe = Pe { core, pool, heap, _mem: mem };
        tracing::debug!(pe = me, n_pes = pe.n_pes(), provider = %pe.core.provider(), threads = pe.core.endpoint_facts().len(), "cpnet PE up");
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
                    provider: self.core.provider().to_owned(),
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
        self.core.provider()
    }

    /// The provider and bind address this PE's proxy threads opened (what
    /// `CPNET_PROVIDER` and `CPNET_FABRIC_NODE` chose), for tools that open
    /// their own endpoint beside cpnet's, such as `cpnet-bench`'s raw
    /// libfabric floor. Local.
    pub fn fabric_config(&self) -> FabricConfig {
        self.core.fabric_config()
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

    /// The team of every PE (`SHMEM_TEAM_WORLD`, OpenSHMEM 1.5 §9.4; handle
    /// `CPNET_TEAM_WORLD`). Local.
    pub fn team_world(&self) -> Team {
        self.core.teams.team(cpnet_device::layout::CPNET_TEAM_WORLD)
    }

    /// The PEs of this host (`SHMEM_TEAM_SHARED`; handle `CPNET_TEAM_NODE`):
    /// strided as launchers place ranks, else this PE alone. Local.
    pub fn team_node(&self) -> Team {
        self.core.teams.team(cpnet_device::layout::CPNET_TEAM_NODE)
    }

    /// A new team of the parent's PEs `start + i * stride`, `i` in
    /// `0..size` (parent numbering): `Some` on its members, `None` on the
    /// other parent PEs (`shmem_team_split_strided`, §9.4.3). **Collective**
    /// over `parent`, with the same arguments on every parent PE.
    ///
    /// # Errors
    /// [`Error::Team`] for PEs outside the parent, or no table entry free
    /// on every parent PE (`CPNET_TEAMS`); work-group errors of the
    /// agreement (a parent PE that never calls it: a wait timeout).
    pub fn team_split_strided(&self, parent: &Team, start: i32, stride: i32, size: i32) -> Result<Option<Team>> {
        team::split_strided(self, parent, start, stride, size)
    }

    /// The parent as a grid of `xrange` columns: this PE's row team and
    /// column team (`shmem_team_split_2d`, §9.4.4). **Collective** over
    /// `parent`.
    ///
    /// # Errors
    /// As [`Pe::team_split_strided`]; `xrange < 1`.
    pub fn team_split_2d(&self, parent: &Team, xrange: i32) -> Result<(Team, Team)> {
        team::split_2d(self, parent, xrange)
    }

    /// Destroy a team made by a split (`shmem_team_destroy`, §9.4.10).
    /// **Collective** over the team.
    ///
    /// # Errors
    /// [`Error::Team`] for the world and node teams; the team sync's errors.
    pub fn team_destroy(&self, team: Team) -> Result<()> {
        team::destroy(self, team)
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


/// A CPU PE's steps 3 and 4 of the start-up ([`crate::startup`]): the heap
/// and queues in host memory (shared memory with `CPNET_PROXY=daemon`), the
/// proxy threads in this process or in the daemon.
struct CpuKind;

/// Where a CPU PE's queues and heap live.
enum CpuMem {
    /// Private memory of this process (in-process proxy).
    Private { _region: Arc<HostHeap> },
    /// memfds shared with the proxy daemon; the fds until they are passed.
    Shared { _queues: SharedMem, _region: SharedMem, fds: Option<[OwnedFd; 2]> },
}

/// A CPU PE's heap and queues.
struct CpuParts {
    pool: QueuePool,
    /// The user heap: the first `heap_size` bytes of the region.
    heap: HeapView,
    /// The whole region (`region_len(heap_size)` bytes), registered with
    /// libfabric.
    region: HeapView,
    mem: CpuMem,
}

/// Work-group id of the contexts team creation borrows (for error reports).
const TEAM_WG: u32 = u32::MAX;

impl TeamHost for Pe {
    fn teams(&self) -> &Teams {
        &self.core.teams
    }
    fn agree(&self, parent: &Team, mask: u64) -> Result<u64> {
        self.with_ctx(TEAM_WG, |wg| wg.team_agree(parent, mask))
    }
    fn sync(&self, team: &Team) -> Result<()> {
        self.with_ctx(TEAM_WG, |wg| wg.team_sync(team))
    }
    fn clear(&self, desc: &cpnet_device::layout::TeamDesc, bytes: u64) -> Result<()> {
        let a = SymAddr(desc.scratch);
        self.heap.write_bytes(a, &vec![0u8; bytes as usize]).map_err(|_| Error::OutsideHeap {
            pe: self.my_pe(),
            addr: a.0,
            size: bytes,
            heap: self.heap.size(),
        })
    }
    fn publish(&self, _id: i32, _desc: &cpnet_device::layout::TeamDesc) -> Result<()> {
        // CPU work-groups take the entry from the `Team` itself.
        Ok(())
    }
}

impl PeKind for CpuKind {
    type Parts = CpuParts;
    const TRAFFIC: Traffic = Traffic::RmaAtomics;

    fn heap(&mut self, launch: &Launch, tuning: &Tuning, _boot: &Bootstrap, _fabric: &FabricConfig, heap_size: u64) -> Result<CpuParts> {
        let me = launch.pe;
        let geom = QueueGeometry::new(tuning.queue_depth).map_err(|cause| Error::Queue { pe: me, cause })?;
        let rlen = region_len(heap_size);
        let (pool, region, mem) = match tuning.proxy.unwrap_or(ProxyMode::InProcess) {
            ProxyMode::InProcess => {
                let region = Arc::new(HostHeap::new(rlen));
                (QueuePool::new_host(tuning.queues, geom), region.view(), CpuMem::Private { _region: region })
            }
            ProxyMode::Daemon => {
                let n = tuning.queues;
                let shm_err = |e: std::io::Error| Error::Daemon { pe: me, why: format!("shared memory for the daemon: {e}") };
                let (qmem, qfd) = SharedMem::create(&format!("cpnet-queues-pe{me}"), n * geom.bytes()).map_err(shm_err)?;
                let (rmem, rfd) = SharedMem::create(&format!("cpnet-heap-pe{me}"), rlen as usize).map_err(shm_err)?;
                // SAFETY: a fresh zeroed mapping of exactly n * geom.bytes()
                // bytes, page-aligned, kept by `mem` (dropped after the pool,
                // and after the daemon link detached); the daemon's accesses
                // to it are atomic, as the PE's.
                let words = unsafe { Words::from_raw(qmem.base().cast::<u64>(), n * geom.words()) };
                // SAFETY: the region mapping is `rlen` bytes, kept by `mem` as above.
                let region = unsafe { HeapView::from_raw(rmem.base(), rlen) };
                (QueuePool::from_words(words, geom, n), region, CpuMem::Shared { _queues: qmem, _region: rmem, fds: Some([qfd, rfd]) })
            }
        };
        // SAFETY: the user heap is the first `heap_size` bytes of the region,
        // which `mem` keeps as long as the `Pe` (and the service threads,
        // joined or detached before it is freed).
        let heap = unsafe { HeapView::from_raw(region.base(), heap_size) };
        Ok(CpuParts { pool, heap, region, mem })
    }

    fn proxy(&mut self, parts: &mut CpuParts, launch: &Launch, tuning: &Tuning, boot: &Bootstrap, fabric: &FabricConfig) -> Result<ProxyLink> {
        let me = launch.pe;
        let heap_size = parts.heap.size();
        let threads = tuning.proxy_threads.min(tuning.queues).max(1);
        if let CpuMem::Shared { fds, .. } = &mut parts.mem {
            let fds = fds.take().expect("the memfds are passed once");
            let att = attach_message(me, launch.n_pes, heap_size, region_len(heap_size), tuning.queues, parts.pool.geometry(), threads, tuning, fabric);
            return attach_to_daemon(tuning, boot, &DaemonPaths::in_dir(&tuning.proxyd_dir), att, fds.into());
        }
        let limits = Limits { n_pes: launch.n_pes, heap_size };
        let queues = (0..threads).map(|t| (t..tuning.queues).step_by(threads).map(|q| parts.pool.queue(q)).collect()).collect();
        let backend = Arc::new(HostBackend {
            fabric: fabric.clone(),
            me,
            region: parts.region,
            heap_size,
            epoch: Arc::new(AtomicU64::new(0)),
        });
        Proxies::spawn(backend, me, queues, limits, &fabric.provider, tuning).map(ProxyLink::from)
    }

    fn abort(parts: &CpuParts) -> Box<dyn Fn(ErrorCode) + Send + Sync> {
        let queues: Vec<_> = (0..parts.pool.len()).map(|q| parts.pool.queue(q)).collect();
        Box::new(move |code| {
            for q in &queues {
                q.set_abort(code);
            }
        })
    }
}

/// Step 4 with the proxy daemon: reach the daemon of `paths` (starting it
/// if none runs), and attach this PE with `att` (everything but the job's
/// key) and its memfds `fds` under the job's key
/// (`CPNET_JOB_ID`/`CPNET_JOB_TOKEN`; without them, PE 0 draws one and the
/// rendezvous shares it: collective then). CPU PEs here, GPU PEs from
/// [`crate::gpu`].
pub(crate) fn attach_to_daemon(tuning: &Tuning, boot: &Bootstrap, paths: &DaemonPaths, mut att: Attach, fds: Vec<OwnedFd>) -> Result<ProxyLink> {
    let me = att.pe;
    let err = |why: String| Error::Daemon { pe: me, why };
    let key = match &tuning.job {
        Some(k) => k.clone(),
        None => {
            let mine = if me == 0 { daemon::new_job_key().map_err(|e| err(format!("drawing a job token: {e}")))? } else { JobKey { id: 0, token: [0; 16] } };
            let mut blob = mine.id.to_le_bytes().to_vec();
            blob.extend_from_slice(&mine.token);
            let all = boot.allgather(&blob).map_err(|cause| Error::Bootstrap { pe: me, cause })?;
            let b = all.first().filter(|b| b.len() == 24).ok_or_else(|| err("PE 0 shared a malformed job key".into()))?;
            JobKey { id: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")), token: b[8..].try_into().expect("16 bytes") }
        }
    };
    (att.job, att.token) = (key.id, key.token);
    let stream = daemon::ensure_running(paths, tuning.proxyd_bin.as_deref(), tuning.proxyd_linger, tuning.connect_timeout).map_err(err)?;
    let link = DaemonLink::attach(stream, &paths.socket, &att, fds, tuning.connect_timeout)?;
    Ok(ProxyLink::Daemon(link, tuning.connect_timeout))
}

/// The fields of an [`Attach`] every PE fills the same way (the job's key is
/// filled in by [`attach_to_daemon`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attach_message(me: i32, n_pes: i32, heap_size: u64, region_len: u64, queues: usize, geom: QueueGeometry, threads: usize, tuning: &Tuning, fabric: &FabricConfig) -> Attach {
    Attach {
        job: 0,
        token: [0; 16],
        pe: me,
        n_pes,
        heap_size,
        region_len,
        queues: queues as u32,
        depth: geom.depth(),
        threads: threads as u32,
        idle_sleep_us: tuning.proxy_idle_sleep.map_or(0, |d| d.as_micros().max(1) as u64),
        stall_ms: tuning.proxy_stall_timeout.map_or(0, |d| d.as_millis().max(1) as u64),
        provider: fabric.provider.clone(),
        src_node: fabric.src_node.clone().unwrap_or_default(),
        gpu: None,
    }
}
