//! `cpnet-proxyd` itself: wins the election, binds the socket, accepts
//! connections, checks each one (credentials, attach message, job token),
//! and runs one [`Session`] per attached PE: the PE's memory mapped from its
//! memfds, its fabric endpoints and service threads ([`Proxies`], the same
//! code as the in-process proxy). A session ends when its PE detaches
//! (drained) or goes away (abandoned: threads stopped without draining,
//! endpoints closed, memory unmapped); the daemon goes on serving the
//! others, and exits once nothing has been attached for its linger time
//! (unless persistent) or on SIGINT/SIGTERM.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cpnet_device::cpu::HeapView;
use cpnet_device::ring::{QueueGeometry, QueuePool};
use cpnet_device::sync::Words;
use cpnet_proxy::decode::Limits;
use cpnet_proxy::transport::{FabricConfig, region_len};

use super::paths::DaemonPaths;
use super::shm::SharedMem;
use super::wire::{self, Attach, ToDaemon, ToPe};
use crate::env::{MAX_PROXY_THREADS, Tuning};
use crate::host_backend::HostBackend;
use crate::proxy_threads::Proxies;

/// How long a new connection has to send its Attach.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the accept loop looks at the stop flag and the linger clock.
const TICK: Duration = Duration::from_millis(20);
/// How long a detach waits for the PE's services to drain (theirs is bounded
/// at 5 s).
const DRAIN_WAIT: Duration = Duration::from_secs(10);
/// The largest heap a PE may ask the daemon to map, bytes.
const MAX_HEAP: u64 = 1 << 40;

/// How the daemon runs (`cpnet-proxyd`'s flags).
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    /// Its directory.
    pub paths: DaemonPaths,
    /// With nothing attached for this long, exit (unless `persistent`).
    pub linger: Duration,
    /// Never exit for lack of PEs.
    pub persistent: bool,
}

/// Set by SIGINT/SIGTERM.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Relaxed: a lone flag polled by the accept loop; nothing is published with it.
    STOP.store(true, Ordering::Relaxed);
}

/// A job as the daemon knows it: its token, size, and attached PEs.
struct Job {
    token: [u8; 16],
    n_pes: i32,
    attached: HashSet<i32>,
    /// Per PE, how many times it attached: its session's init cycle
    /// (repeated init: every PE inits as often as the others).
    cycles: HashMap<i32, u64>,
    /// Sessions of PEs that left (detached or went away), with their init
    /// cycle: their threads are out of their loops but hold their endpoints
    /// open (`Proxies::release`) until every PE of that cycle has left, or
    /// the job's last PE: a peer endpoint in this process may reach them
    /// until then.
    parked: Vec<(u64, Session)>,
}

/// What the accept loop and the sessions share.
struct State {
    jobs: Mutex<HashMap<u64, Job>>,
    /// Live connections (attached or still attaching).
    conns: AtomicUsize,
    uid: u32,
    pid: u32,
    /// The GPU this daemon serves (`--gpu`), if any.
    gpu: Option<String>,
    /// A clone of every live connection, to shut them down on SIGTERM.
    streams: Mutex<HashMap<u64, UnixStream>>,
}

/// How long a signalled daemon waits for its sessions to stop (their
/// threads joined, GPU work finished, memory released) before it exits.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Runs the daemon until it lingers out or is signalled. Returns at once,
/// `Ok`, when another daemon holds the lock (it serves).
///
/// # Errors
/// The directory is unsafe, or the socket cannot be bound.
pub fn serve(opts: DaemonOptions) -> Result<(), String> {
    let paths = &opts.paths;
    paths.ensure_dir()?;
    let _lock = match paths.try_lock() {
        Ok(Some(f)) => f,
        Ok(None) => {
            tracing::info!("another cpnet-proxyd holds {}; it serves, this one exits", paths.lock.display());
            return Ok(());
        }
        Err(e) => return Err(format!("cannot take the election lock {}: {e}", paths.lock.display())),
    };
    // We hold the lock: a socket file here is a dead daemon's.
    let _ = std::fs::remove_file(&paths.socket);
    let listener = UnixListener::bind(&paths.socket).map_err(|e| format!("cannot bind {}: {e}", paths.socket.display()))?;
    let _ = std::fs::set_permissions(&paths.socket, std::fs::Permissions::from_mode(0o600));
    listener.set_nonblocking(true).map_err(|e| format!("listener: {e}"))?;
    crate::signals::on_sigint_sigterm(on_signal).map_err(|e| format!("installing signal handlers: {e}"))?;
    // No endpoint is open yet, so regions named with our pid are a dead
    // predecessor's too.
    crate::proxy_threads::clean_stale_shm_regions();
    let state = Arc::new(State {
        jobs: Mutex::new(HashMap::new()),
        conns: AtomicUsize::new(0),
        uid: rustix::process::geteuid().as_raw(),
        pid: std::process::id(),
        gpu: paths.gpu.clone(),
        streams: Mutex::new(HashMap::new()),
    });
    tracing::info!(
        "cpnet-proxyd pid {} serving {}{} (uid {}, linger {:.1} s{})",
        state.pid,
        paths.socket.display(),
        paths.gpu.as_deref().map(|g| format!(" for {g}")).unwrap_or_default(),
        state.uid,
        opts.linger.as_secs_f64(),
        if opts.persistent { ", persistent" } else { "" }
    );
    let mut idle_since = Some(Instant::now());
    let mut next_conn = 0u64;
    loop {
        // Relaxed: see on_signal.
        if STOP.load(Ordering::Relaxed) {
            tracing::info!("signalled: stopping with {} connection(s) open", state.conns.load(Ordering::Acquire));
            break;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                // AcqRel: pairs with the decrement at the session's end.
                state.conns.fetch_add(1, Ordering::AcqRel);
                idle_since = None;
                let st = Arc::clone(&state);
                let id = next_conn;
                next_conn += 1;
                if let Ok(c) = stream.try_clone() {
                    state.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, c);
                }
                let spawned = std::thread::Builder::new().name("cpnet-proxyd-conn".into()).spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    serve_conn(&stream, &st);
                    st.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
                    // AcqRel: pairs with the increment above and the loop's Acquire load.
                    st.conns.fetch_sub(1, Ordering::AcqRel);
                });
                if let Err(e) = spawned {
                    tracing::error!("cannot start a connection thread: {e}");
                    state.conns.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(TICK),
            Err(e) => {
                tracing::warn!("accept: {e}");
                std::thread::sleep(TICK);
            }
        }
        // Acquire: pairs with the sessions' AcqRel updates.
        if state.conns.load(Ordering::Acquire) == 0 {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if !opts.persistent && since.elapsed() >= opts.linger {
                tracing::info!("nothing attached for {:.1} s: exiting", opts.linger.as_secs_f64());
                break;
            }
        } else {
            idle_since = None;
        }
    }
    // Signalled with PEs attached: end their connections (they abort, as
    // for a dead daemon) and let the sessions stop, so that no GPU work of
    // this process is in flight on memory it is about to give up.
    let open: Vec<UnixStream> = state.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).drain().map(|(_, s)| s).collect();
    for s in &open {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let t = Instant::now();
    // Acquire: pairs with the connection threads' AcqRel decrement.
    while state.conns.load(Ordering::Acquire) > 0 && t.elapsed() < STOP_WAIT {
        std::thread::sleep(TICK);
    }
    let _ = std::fs::remove_file(&paths.socket);
    Ok(())
}

/// Answers Refused (best effort) and logs why, naming the peer.
fn refuse(stream: &UnixStream, who: &str, reason: &str) {
    tracing::warn!("refused {who}: {reason}");
    let _ = wire::send(stream, &ToPe::Refused(reason.to_owned()).encode(), &[]);
}

/// One connection, from its credentials to its end.
fn serve_conn(stream: &UnixStream, st: &State) {
    let cred = match rustix::net::sockopt::socket_peercred(stream) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("refused a connection: SO_PEERCRED failed: {e}");
            return;
        }
    };
    let (pid, uid) = (cred.pid.as_raw_nonzero().get(), cred.uid.as_raw());
    let peer = format!("a connection from pid {pid} (uid {uid})");
    if uid != st.uid {
        refuse(stream, &peer, &format!("uid {uid} is not this daemon's user (uid {}); a daemon serves one user", st.uid));
        return;
    }
    let _ = stream.set_read_timeout(Some(ATTACH_TIMEOUT));
    let frame = match wire::recv(stream) {
        Ok(Some(f)) => f,
        Ok(None) => {
            tracing::debug!("{peer} closed without a message");
            return;
        }
        Err(wire::RecvError::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            refuse(stream, &peer, &format!("no attach message within {} s", ATTACH_TIMEOUT.as_secs()));
            return;
        }
        Err(e) => {
            refuse(stream, &peer, &format!("malformed attach message: {e}"));
            return;
        }
    };
    let att = match ToDaemon::decode(frame.kind, &frame.body) {
        Ok(ToDaemon::Attach(a)) => a,
        Ok(other) => {
            refuse(stream, &peer, &format!("the first message must be Attach, not {other:?}"));
            return;
        }
        Err(e) => {
            refuse(stream, &peer, &format!("malformed attach message: {e}"));
            return;
        }
    };
    let who = format!("PE {} of job {:#x} (pid {pid})", att.pe, att.job);
    if let Err(reason) = check_attach(&att, &frame.fds) {
        refuse(stream, &who, &reason);
        return;
    }
    if let Err(reason) = join_job(st, &att) {
        refuse(stream, &who, &reason);
        return;
    }
    let parked = match Session::start(&att, frame.fds, st.gpu.as_deref()) {
        Ok(session) => {
            let _ = stream.set_read_timeout(None);
            Some(run_session(stream, st, &att, &who, session))
        }
        Err(reason) => {
            refuse(stream, &who, &reason);
            None
        }
    };
    leave_job(st, &att, parked);
}

/// The attach message's own consistency.
fn check_attach(a: &Attach, fds: &[OwnedFd]) -> Result<(), String> {
    match &a.gpu {
        None if fds.len() != 2 => {
            return Err(format!("a CPU PE's Attach must carry 2 file descriptors (queues, heap), it carried {}", fds.len()));
        }
        None if a.region_len != region_len(a.heap_size) => {
            return Err(format!("region of {} bytes for a heap of {} (want {})", a.region_len, a.heap_size, region_len(a.heap_size)));
        }
        Some(g) => {
            let want = 2 + usize::from(g.payload_bytes != 0);
            if fds.len() != want {
                return Err(format!(
                    "a GPU PE's Attach with payload slots of {} bytes must carry {want} file descriptors (queues, status{}), it carried {}",
                    g.payload_bytes,
                    if want == 3 { ", payload" } else { "" },
                    fds.len()
                ));
            }
            if g.payload_bytes != 0 && !(g.payload_bytes >= 16 && g.payload_bytes <= 1 << 20 && g.payload_bytes.is_power_of_two()) {
                return Err(format!("payload slots of {} bytes (want 0, or a power of two in 16..=1 MiB)", g.payload_bytes));
            }
            if a.region_len != 0 {
                return Err(format!("a GPU PE's heap stays in GPU memory: region_len {} (want 0)", a.region_len));
            }
        }
        None => {}
    }
    if a.n_pes < 1 || !(0..a.n_pes).contains(&a.pe) {
        return Err(format!("PE {} of {} is not a place in a job", a.pe, a.n_pes));
    }
    if a.heap_size == 0 || !a.heap_size.is_multiple_of(64) || a.heap_size > MAX_HEAP {
        return Err(format!("heap size {} is not a multiple of 64 in 64..={MAX_HEAP}", a.heap_size));
    }
    QueueGeometry::new(a.depth).map_err(|e| format!("queue depth {}: {e}", a.depth))?;
    if a.queues == 0 || a.queues > 1 << 16 {
        return Err(format!("{} queues (want 1..=65536)", a.queues));
    }
    if a.threads == 0 || a.threads as usize > MAX_PROXY_THREADS {
        return Err(format!("{} service threads (want 1..={MAX_PROXY_THREADS})", a.threads));
    }
    if a.provider.is_empty() {
        return Err("no provider named".into());
    }
    Ok(())
}

/// Registers the PE with its job (creating the job at its first PE):
/// the token must match the job's, the size too, and the PE be free.
fn join_job(st: &State, a: &Attach) -> Result<(), String> {
    let mut jobs = st.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let job = jobs.entry(a.job).or_insert_with(|| Job { token: a.token, n_pes: a.n_pes, attached: HashSet::new(), cycles: HashMap::new(), parked: Vec::new() });
    if !same_token(&job.token, &a.token) {
        return Err(format!("wrong token for job {:#x}", a.job));
    }
    if job.n_pes != a.n_pes {
        return Err(format!("job {:#x} has {} PEs, this PE says {}", a.job, job.n_pes, a.n_pes));
    }
    if !job.attached.insert(a.pe) {
        return Err(format!("PE {} of job {:#x} is attached already", a.pe, a.job));
    }
    *job.cycles.entry(a.pe).or_insert(0) += 1;
    Ok(())
}

/// The PE leaves its job; its session (if it had one) is parked until every
/// PE of its init cycle, or the job's last PE, has left; then those parked
/// sessions are released and dropped (threads joined, endpoints closed,
/// memory unmapped).
fn leave_job(st: &State, a: &Attach, session: Option<Session>) {
    let done: Option<Vec<Session>> = {
        let mut jobs = st.jobs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match jobs.get_mut(&a.job) {
            Some(job) if same_token(&job.token, &a.token) => {
                job.attached.remove(&a.pe);
                let cycle = job.cycles.get(&a.pe).copied().unwrap_or(0);
                job.parked.extend(session.map(|s| (cycle, s)));
                if job.attached.is_empty() {
                    jobs.remove(&a.job).map(|j| j.parked.into_iter().map(|(_, s)| s).collect())
                } else if job.parked.iter().filter(|(c, _)| *c == cycle).count() == job.n_pes as usize {
                    let (done, keep) = std::mem::take(&mut job.parked).into_iter().partition(|(c, _)| *c == cycle);
                    job.parked = keep;
                    Some(done.into_iter().map(|(_, s): (u64, Session)| s).collect())
                } else {
                    None
                }
            }
            // Not registered (refused before): nothing is parked for it.
            _ => session.map(|s| vec![s]),
        }
    };
    // Outside the lock: joining threads takes a while.
    if let Some(sessions) = done {
        let n = sessions.len();
        for s in &sessions {
            s.proxies.release();
        }
        drop(sessions);
        if n > 0 {
            // A long-lived daemon frees a session's memory from its service
            // threads, each with a glibc arena of its own: give the free
            // pages back rather than let the resident set grow with the
            // arenas the sessions' threads went through.
            // SAFETY: malloc_trim only returns free memory of glibc's
            // arenas to the kernel; it touches no allocation in use.
            #[cfg(target_env = "gnu")]
            unsafe {
                libc::malloc_trim(0);
            }
            tracing::info!("job {:#x}: every PE of an init cycle, or its last PE, left: {n} PE(s)' endpoints closed, memory unmapped", a.job);
        }
    }
}

/// Token comparison that does not stop at the first differing byte.
fn same_token(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// An attached PE's memory and service threads in the daemon.
struct Session {
    // First: stopped and joined (Drop) before the memory below is unmapped.
    proxies: Proxies,
    pe: i32,
    _mem: SessionMem,
    /// A GPU PE's heap (allocated here): its IPC handle, for Accepted.
    gpu_heap: Vec<u8>,
}

/// The memory a session's threads use, kept until they are gone.
enum SessionMem {
    /// A CPU PE's queue pool and heap region (memfds).
    Cpu { _pool: QueuePool, _queues: SharedMem, _region: SharedMem },
    /// A GPU PE's queues (memfds, registered with CUDA) and its heap
    /// (opened through CUDA IPC).
    Gpu { _mem: crate::gpu::GpuSessionMem },
}

impl Session {
    /// Maps the PE's memfds (and for a GPU PE opens its heap on this
    /// daemon's GPU `gpu`), opens its endpoints and spawns its service
    /// threads (waiting for the peers' cards).
    fn start(a: &Attach, fds: Vec<OwnedFd>, gpu: Option<&str>) -> Result<Session, String> {
        if let Some(g) = &a.gpu {
            let (proxies, mem) = crate::gpu::serve_gpu_pe(a, g, &fds, gpu)?;
            let gpu_heap = mem.heap_handle().to_vec();
            return Ok(Session { proxies, pe: a.pe, _mem: SessionMem::Gpu { _mem: mem }, gpu_heap });
        }
        let fds: [OwnedFd; 2] = fds.try_into().map_err(|_| "a CPU PE's Attach carries 2 fds".to_owned())?;
        let geom = QueueGeometry::new(a.depth).map_err(|e| e.to_string())?;
        let n = a.queues as usize;
        let [qfd, rfd] = fds;
        let queues = SharedMem::map(&qfd, n * geom.bytes()).map_err(|e| format!("queue memory: {e}"))?;
        let region = SharedMem::map(&rfd, a.region_len as usize).map_err(|e| format!("heap memory: {e}"))?;
        drop((qfd, rfd));
        // SAFETY: the mapping is n * geom.bytes() bytes, page-aligned, and
        // outlives every view (`_queues` is dropped after `proxies` is
        // stopped); all accesses to queue words are atomic (the PE's too).
        let words = unsafe { Words::from_raw(queues.base().cast::<u64>(), n * geom.words()) };
        let pool = QueuePool::from_words(words, geom, n);
        // SAFETY: the region mapping is `region_len` bytes and outlives the
        // view (as above); heap accesses are atomics or racy-by-contract copies.
        let view = unsafe { HeapView::from_raw(region.base(), a.region_len) };
        let fabric = FabricConfig {
            provider: a.provider.clone(),
            src_node: (!a.src_node.is_empty()).then(|| a.src_node.clone()),
            reach_timeout: Some(crate::env::DEFAULT_REACH_TIMEOUT),
        };
        let tuning = Tuning {
            proxy_idle_sleep: (a.idle_sleep_us > 0).then(|| Duration::from_micros(a.idle_sleep_us)),
            in_daemon: true,
            ..Tuning::default()
        };
        let threads = (a.threads as usize).min(n).max(1);
        let per_thread = (0..threads).map(|t| (t..n).step_by(threads).map(|q| pool.queue(q)).collect()).collect();
        let backend = Arc::new(HostBackend {
            fabric,
            me: a.pe,
            region: view,
            heap_size: a.heap_size,
            epoch: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        });
        let limits = Limits { n_pes: a.n_pes, heap_size: a.heap_size };
        let proxies = Proxies::spawn(backend, a.pe, per_thread, limits, &a.provider, &tuning).map_err(|e| e.to_string())?;
        Ok(Session { proxies, pe: a.pe, _mem: SessionMem::Cpu { _pool: pool, _queues: queues, _region: region }, gpu_heap: Vec::new() })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Idempotent: after a drained stop the handles are gone already.
        self.proxies.abandon();
        let _ = self.proxies.stop(self.pe);
    }
}

/// An attached PE's conversation: cards, Ready, then requests until Detach
/// or the end of the connection. Returns the session, its threads stopped
/// (holding their endpoints), to be parked.
fn run_session(stream: &UnixStream, st: &State, a: &Attach, who: &str, mut session: Session) -> Session {
    let pe = a.pe;
    let writer = match stream.try_clone() {
        Ok(w) => Arc::new(Mutex::new(w)),
        Err(e) => {
            refuse(stream, who, &format!("cannot clone the socket: {e}"));
            return session;
        }
    };
    let send = |m: ToPe| -> std::io::Result<()> {
        let w = writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        wire::send(&w, &m.encode(), &[])
    };
    let cards = match session.proxies.local_cards(pe) {
        Ok(c) => c,
        Err(e) => {
            refuse(stream, who, &format!("fabric setup failed: {e}"));
            return session;
        }
    };
    if send(ToPe::Accepted { daemon_pid: st.pid, cards, gpu_heap: session.gpu_heap.clone() }).is_err() {
        tracing::warn!("{who} went away while attaching");
        return session;
    }
    tracing::info!("{who} attached: {} queue(s) x {} slots, heap {} bytes, {} thread(s) over {}", a.queues, a.depth, a.heap_size, a.threads, a.provider);
    let mut detached = false;
    let why = loop {
        let frame = match wire::recv(stream) {
            Ok(Some(f)) => f,
            Ok(None) => break "its connection closed".to_owned(),
            Err(e) => break format!("its connection failed: {e}"),
        };
        match ToDaemon::decode(frame.kind, &frame.body) {
            Ok(ToDaemon::Peers(all)) => match session.proxies.connect_peers(&all, pe) {
                Ok(()) => {
                    let _ = send(ToPe::Ready(session.proxies.facts().to_vec()));
                    // Also without stall detection: the watchdog passes a
                    // transport's fatal report (an unreachable peer) on.
                    {
                        let (w, abandon) = (Arc::clone(&writer), Arc::clone(&session.proxies.abandon));
                        let who2 = who.to_owned();
                        let r = session.proxies.start_watchdog(
                            pe,
                            (a.stall_ms > 0).then(|| Duration::from_millis(a.stall_ms)),
                            Box::new(move |report: String| {
                                tracing::error!("{who2}: {report}");
                                // Release: pairs with the service threads' Acquire in drain.
                                abandon.store(true, Ordering::Release);
                                let w = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                                let _ = wire::send(&w, &ToPe::Stalled(report).encode(), &[]);
                            }),
                        );
                        if let Err(e) = r {
                            tracing::warn!("{who}: no watchdog: {e}");
                        }
                    }
                }
                Err(e) => {
                    refuse(stream, who, &format!("connecting to the job's PEs failed: {e}"));
                    break "its connection to the job's PEs failed".to_owned();
                }
            },
            Ok(ToDaemon::Errors) => {
                let _ = send(ToPe::ErrorList(session.proxies.command_errors()));
            }
            Ok(ToDaemon::Abandon) => {
                tracing::info!("{who}: its job is failing: its services stop without draining");
                session.proxies.abandon();
            }
            Ok(ToDaemon::Detach) => {
                if !session.proxies.stop_without_join(DRAIN_WAIT) {
                    tracing::warn!("{who}: its services did not drain within {} s", DRAIN_WAIT.as_secs());
                }
                let _ = send(ToPe::Detached(session.proxies.command_errors()));
                detached = true;
                break String::new();
            }
            Ok(ToDaemon::Attach(_)) => {
                refuse(stream, who, "a second Attach on one connection");
                break "it sent a second Attach".to_owned();
            }
            Err(e) => {
                refuse(stream, who, &format!("malformed message: {e}"));
                break "it sent a malformed message".to_owned();
            }
        }
    };
    if detached {
        tracing::info!("{who} detached");
    } else {
        tracing::warn!("{who} went away without detaching ({why}): its services stop without draining; its endpoints close and its memory is unmapped when its job's last PE has left");
        session.proxies.abandon();
        session.proxies.stop_without_join(DRAIN_WAIT);
    }
    session
}
