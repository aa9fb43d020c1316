//! The proxy service threads of a PE, whatever their transport: spawn them
//! (each opens its own endpoint on its own thread, and its queue mirror
//! where its queues are in GPU memory), exchange the endpoints' cards with
//! every PE through the bootstrap, run the service loops, and stop them
//! (draining, or abandoning when the job is failing).

use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cpnet_device::ring::QueueMem;
use cpnet_proxy::decode::Limits;
use cpnet_proxy::mirror::QueueMirror;
use cpnet_proxy::service::{CommandError, Heartbeat, Service, Transport};
use cpnet_proxy::transport::EndpointFacts;

use crate::bootstrap::Bootstrap;
use crate::env::Tuning;
use crate::error::{Error, Result};
use crate::watchdog::{Watched, Watchdog};

/// How long finalize lets the proxy finish operations in flight.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

type CardResult = (usize, std::result::Result<Vec<u8>, String>);
type ReadyResult = (usize, std::result::Result<EndpointFacts, String>);

/// The running service threads of a PE.
pub(crate) struct Proxies {
    handles: Vec<JoinHandle<()>>,
    /// Set by `stop`: the services leave their loops.
    stop: Arc<AtomicBool>,
    /// Set when the job is failing (or the PE is dropped without
    /// finalize): the services stop without draining.
    pub(crate) abandon: Arc<AtomicBool>,
    /// Command errors the services recorded.
    pub(crate) errors: Arc<Mutex<Vec<CommandError>>>,
    card_rx: Option<mpsc::Receiver<CardResult>>,
    ready_rx: Option<mpsc::Receiver<ReadyResult>>,
    peer_txs: Vec<mpsc::Sender<Vec<Vec<u8>>>>,
    /// What the watchdog watches, until [`Proxies::start_watchdog`] takes it.
    watched: Vec<Watched>,
    watchdog: Option<Watchdog>,
    /// Per thread, once connected: what its transport reports about itself.
    facts: Vec<EndpointFacts>,
    /// In the daemon (`Tuning::in_daemon`): the threads, once out of their
    /// loops and drained, hold their endpoints open until this is set
    /// ([`Proxies::release`]): the daemon closes a job's endpoints only
    /// when none of the job's threads polls any more, since libfabric's shm
    /// provider maps an endpoint's region once per process, and closing one
    /// while a peer endpoint of the same process still reaches it crashes
    /// the daemon (seen with a PE killed mid-run).
    hold: Option<Arc<(Mutex<bool>, std::sync::Condvar)>>,
    /// One message per thread once it drained (or gave up draining).
    drained_rx: Option<mpsc::Receiver<usize>>,
}

/// What a transport needs from the runtime to start: opened on the service
/// thread (`open`), described to peers (`card`), connected to them
/// (`connect`, with every PE's card of the same thread index, PE order).
pub(crate) trait Backend: Send + Sync + 'static {
    /// The endpoint before the peers are known.
    type Endpoint;
    /// The connected transport.
    type Transport: Transport;
    /// Open thread `t`'s endpoint.
    fn open(&self, t: usize) -> std::result::Result<Self::Endpoint, String>;
    /// Its card.
    fn card(ep: &Self::Endpoint) -> Vec<u8>;
    /// Connect it.
    fn connect(&self, ep: Self::Endpoint, cards: Vec<Vec<u8>>) -> std::result::Result<Self::Transport, String>;
    /// What the connected transport reports about itself: its provider as
    /// libfabric granted it, and where it can say, the endpoints' addresses
    /// (the transport map, [`crate::transport_map`]).
    fn describe(tr: &Self::Transport) -> EndpointFacts;
    /// Thread `t`'s queue mirror, when its queues are in GPU memory (built
    /// on the thread, after `open`); its shadows must be the views
    /// [`Proxies::spawn`] got for the thread, in the same order. `None` (the
    /// default): the service reads its queues directly.
    fn mirror(&self, _t: usize) -> Option<std::result::Result<QueueMirror, String>> {
        None
    }
    /// Settings of thread `t`'s service beyond its queues and transport
    /// (GPU PEs: an idle spin, and for mapped queues poll pacing and a
    /// claim signal, and the queues' payload slots, `GpuQueues::configure_service`). The default (CPU PEs) sets
    /// nothing: the service backs off at once when idle, since the PE's
    /// work-groups share its cores, and finds claims by rereading every
    /// queue periodically.
    fn configure(&self, _t: usize, _service: &mut Service<Self::Transport>) {}
}

impl Proxies {
    /// Spawn `threads` service threads; thread `t` serves `queues[t]` (the
    /// queues themselves, or the host shadows of its [`Backend::mirror`],
    /// which the watchdog reads too). They open their endpoints over
    /// `provider` (first removing what dead processes left of the shm
    /// provider's regions), build their mirrors, and wait for
    /// [`Proxies::connect`]. From `tuning`: the idle sleep
    /// (`CPNET_PROXY_IDLE_SLEEP`) and `CPNET_INJECT_PROXY_STALL` (thread,
    /// nth command, PE), which hangs one thread for the reliability tests
    /// until the PE is abandoned.
    pub(crate) fn spawn<B: Backend>(
        backend: Arc<B>,
        me: i32,
        queues: Vec<Vec<QueueMem>>,
        limits: Limits,
        provider: &str,
        tuning: &Tuning,
    ) -> Result<Proxies> {
        // Not in the daemon: its own pid's regions belong to the endpoints it
        // serves for other PEs (it cleans once, at its start).
        if provider.starts_with("shm") && !tuning.in_daemon {
            clean_stale_shm_regions();
        }
        let (idle_sleep, inject_stall) = (tuning.proxy_idle_sleep, tuning.inject_proxy_stall);
        let stop = Arc::new(AtomicBool::new(false));
        let abandon = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let (card_tx, card_rx) = mpsc::channel::<CardResult>();
        let (ready_tx, ready_rx) = mpsc::channel::<ReadyResult>();
        let mut peer_txs = Vec::new();
        let mut handles = Vec::new();
        let hold = tuning.in_daemon.then(|| Arc::new((Mutex::new(false), std::sync::Condvar::new())));
        let (drained_tx, drained_rx) = mpsc::channel::<usize>();
        let mut watched = Vec::new();
        let n_threads = queues.len();
        for (t, queues) in queues.into_iter().enumerate() {
            let cpu = tuning.proxy_cpu(me, n_threads, t);
            let heartbeat = Arc::new(Heartbeat::default());
            watched.push(Watched { thread: t, heartbeat: Arc::clone(&heartbeat), queues: queues.clone() });
            let stall = inject_stall.filter(|&(thread, _, pe)| thread == t && pe.is_none_or(|p| p == me)).map(|(_, n, _)| n);
            let (peer_tx, peer_rx) = mpsc::channel::<Vec<Vec<u8>>>();
            peer_txs.push(peer_tx);
            let (hold, drained_tx) = (hold.clone(), drained_tx.clone());
            let (card_tx, ready_tx, stop, abandon, errors, backend) = (
                card_tx.clone(),
                ready_tx.clone(),
                Arc::clone(&stop),
                Arc::clone(&abandon),
                Arc::clone(&errors),
                Arc::clone(&backend),
            );
            let handle = std::thread::Builder::new()
                .name(format!("cpnet-proxy-{t}"))
                .spawn(move || {
                    if let Some(cpu) = cpu
                        && let Err(e) = pin_to(cpu)
                    {
                        let _ = card_tx.send((t, Err(format!("CPNET_PROXY_CPUS: proxy thread {t} of PE {me} cannot run on CPU {cpu}: {e}"))));
                        return;
                    }
                    let ep = match backend.open(t) {
                        Ok(ep) => ep,
                        Err(e) => {
                            let _ = card_tx.send((t, Err(e)));
                            return;
                        }
                    };
                    let mirror = match backend.mirror(t).transpose() {
                        Ok(m) => m,
                        Err(e) => {
                            let _ = card_tx.send((t, Err(format!("queue mirror: {e}"))));
                            return;
                        }
                    };
                    let _ = card_tx.send((t, Ok(B::card(&ep))));
                    let Ok(cards) = peer_rx.recv() else { return };
                    let transport = match backend.connect(ep, cards) {
                        Ok(tr) => tr,
                        Err(e) => {
                            let _ = ready_tx.send((t, Err(e)));
                            return;
                        }
                    };
                    let _ = ready_tx.send((t, Ok(B::describe(&transport))));
                    let mut service = match mirror {
                        Some(m) => {
                            debug_assert_eq!(m.len(), queues.len(), "thread {t}: mirror and queue views");
                            Service::with_mirror(m, transport, limits, me)
                        }
                        None => Service::new(queues, transport, limits, me),
                    };
                    backend.configure(t, &mut service);
                    service.set_error_sink(Arc::clone(&errors));
                    service.set_heartbeat(heartbeat);
                    if let Some(n) = stall {
                        tracing::warn!("PE {me}: proxy thread {t} will hang at its command {n} (CPNET_INJECT_PROXY_STALL)");
                        let abandoned = Arc::clone(&abandon);
                        // Acquire: pairs with the Release stores of `abandon`.
                        service.inject_stall(n, Box::new(move || abandoned.load(std::sync::atomic::Ordering::Acquire)));
                    }
                    // Leave the loop when stopped, and also as soon as the job
                    // is failing (abandoned): its queues are aborted, and a
                    // failing peer's connections may close under a live poll
                    // (libfabric 1.17's tcp;ofi_rxm crashed in fi_cq_read
                    // there, tests/tests/reliability.rs).
                    service.run_with(idle_sleep, || {
                        // Acquire: pairs with the Release stores in `stop` and `abandon`.
                        stop.load(std::sync::atomic::Ordering::Acquire) || abandon.load(std::sync::atomic::Ordering::Acquire)
                    });
                    // Finish what is in flight; bounded so a dead peer cannot
                    // hang finalize, and skipped when the job is failing.
                    let until = Instant::now() + DRAIN_LIMIT;
                    // Acquire: pairs with the Release stores of `abandon`.
                    service.drain(|| abandon.load(std::sync::atomic::Ordering::Acquire) || Instant::now() > until);
                    if let Some(m) = service.mirror() {
                        let st = m.stats();
                        tracing::debug!(
                            "PE {me}: proxy thread {t}: queue mirror: {} passes, {} slot pulls, {} re-read slots ({} torn), {} producer pulls, {} pushes, {} waits",
                            st.passes, st.slot_pulls, st.rereads, st.torn, st.producer_pulls, st.pushes, st.waits
                        );
                    }
                    let _ = drained_tx.send(t);
                    if let Some(h) = hold {
                        let mut released = h.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        while !*released {
                            released = h.1.wait(released).unwrap_or_else(std::sync::PoisonError::into_inner);
                        }
                    }
                    // Only now the service and its transport (the endpoint) are dropped.
                })
                .map_err(|e| Error::Proxy { pe: me, thread: t, why: format!("spawn: {e}") })?;
            handles.push(handle);
        }
        Ok(Proxies {
            handles,
            stop,
            abandon,
            errors,
            card_rx: Some(card_rx),
            ready_rx: Some(ready_rx),
            peer_txs,
            watched,
            watchdog: None,
            facts: Vec::new(),
            hold,
            drained_rx: Some(drained_rx),
        })
    }

    /// Start the watchdog over the service threads (once; see
    /// [`crate::watchdog`]): `on_stall` gets the report of the first thread
    /// still for `timeout`.
    pub(crate) fn start_watchdog(&mut self, me: i32, timeout: Option<Duration>, on_stall: Box<dyn FnOnce(String) + Send>) -> Result<()> {
        let watched = std::mem::take(&mut self.watched);
        if watched.is_empty() || self.watchdog.is_some() {
            return Ok(());
        }
        let dog = Watchdog::spawn(me, watched, timeout, on_stall)
            .map_err(|e| Error::Proxy { pe: me, thread: 0, why: format!("spawning the watchdog: {e}") })?;
        self.watchdog = Some(dog);
        Ok(())
    }

    /// Collect our threads' cards, exchange them with every PE, hand every
    /// thread the cards of its counterparts and wait until all connected.
    /// **Collective** (an allgather).
    pub(crate) fn connect(&mut self, boot: &Bootstrap, me: i32) -> Result<()> {
        let blob = match self.local_cards(me) {
            Ok(b) => b,
            Err(e) => {
                boot.abort(&format!("fabric setup failed: {e}"));
                return Err(e);
            }
        };
        let all = boot.allgather(&blob).map_err(|cause| Error::Bootstrap { pe: me, cause })?;
        self.connect_peers(&all, me).inspect_err(|e| {
            if matches!(e, Error::Proxy { .. }) {
                boot.abort(&format!("fabric connect failed: {e}"));
            }
        })
    }

    /// The first half of [`Proxies::connect`]: this PE's blob of cards (every
    /// thread's, in thread order: `threads:u32` then per thread `len:u32
    /// card`), once every thread opened its endpoint. Local. Empty after the
    /// first call.
    ///
    /// # Errors
    /// [`Error::Proxy`] naming the thread whose endpoint did not open.
    pub(crate) fn local_cards(&mut self, me: i32) -> Result<Vec<u8>> {
        let threads = self.handles.len();
        let Some(card_rx) = self.card_rx.take() else { return Ok(Vec::new()) };
        let mut mine = vec![Vec::new(); threads];
        for _ in 0..threads {
            let (t, card) =
                card_rx.recv().map_err(|_| Error::Proxy { pe: me, thread: 0, why: "exited during start-up".into() })?;
            match card {
                Ok(c) => mine[t] = c,
                Err(why) => return Err(Error::Proxy { pe: me, thread: t, why }),
            }
        }
        let mut blob = Vec::new();
        blob.extend_from_slice(&(threads as u32).to_le_bytes());
        for c in &mine {
            blob.extend_from_slice(&(c.len() as u32).to_le_bytes());
            blob.extend_from_slice(c);
        }
        Ok(blob)
    }

    /// The second half of [`Proxies::connect`]: given every PE's blob of
    /// cards (PE order, as [`Proxies::local_cards`] made them), connect every
    /// thread and wait until all are. Local.
    ///
    /// # Errors
    /// [`Error::NotSymmetric`] (a malformed blob, another thread count),
    /// [`Error::Proxy`] (a thread failed to connect).
    pub(crate) fn connect_peers(&mut self, all: &[Vec<u8>], me: i32) -> Result<()> {
        let threads = self.handles.len();
        let Some(ready_rx) = self.ready_rx.take() else { return Ok(()) };
        let mut per_thread: Vec<Vec<Vec<u8>>> = vec![Vec::new(); threads];
        for (peer, b) in all.iter().enumerate() {
            let cards = parse_cards(b).ok_or_else(|| Error::NotSymmetric {
                pe: me,
                call: "init",
                detail: format!("PE {peer} sent a malformed fabric card"),
            })?;
            if cards.len() != threads {
                return Err(Error::NotSymmetric {
                    pe: me,
                    call: "init",
                    detail: format!(
                        "PE {peer} runs {} proxy threads, this PE {threads} (set CPNET_PROXY_THREADS alike)",
                        cards.len()
                    ),
                });
            }
            for (t, c) in cards.into_iter().enumerate() {
                per_thread[t].push(c);
            }
        }
        for (tx, cards) in self.peer_txs.drain(..).zip(per_thread) {
            let _ = tx.send(cards);
        }
        let mut facts = vec![None; threads];
        for _ in 0..threads {
            let (t, r) =
                ready_rx.recv().map_err(|_| Error::Proxy { pe: me, thread: 0, why: "exited during start-up".into() })?;
            match r {
                Ok(f) => facts[t] = Some(f),
                Err(why) => return Err(Error::Proxy { pe: me, thread: t, why }),
            }
        }
        self.facts = facts.into_iter().flatten().collect();
        Ok(())
    }

    /// Per service thread, what its connected transport reports about
    /// itself; empty before [`Proxies::connect`] succeeded.
    pub(crate) fn facts(&self) -> &[EndpointFacts] {
        &self.facts
    }

    /// Command errors recorded so far.
    pub(crate) fn command_errors(&self) -> Vec<CommandError> {
        self.errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Make the services leave their loops (they drain unless abandoned)
    /// and wait up to `limit` until every thread drained, without joining
    /// them: in the daemon they hold their endpoints open until
    /// [`Proxies::release`]. Returns whether all drained in time.
    pub(crate) fn stop_without_join(&mut self, limit: Duration) -> bool {
        // Release: pairs with the service threads' Acquire load of `stop`.
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        // Unblock threads still waiting for cards (start-up failed).
        self.peer_txs.clear();
        let Some(rx) = self.drained_rx.take() else { return true };
        let until = Instant::now() + limit;
        let drained = (0..self.handles.len()).all(|_| rx.recv_timeout(until.saturating_duration_since(Instant::now())).is_ok());
        // Held threads stand still by design: nothing more to watch.
        if let Some(mut dog) = self.watchdog.take() {
            dog.stop();
        }
        drained
    }

    /// Let threads that hold their endpoints ([`Proxies::stop_without_join`]
    /// in the daemon) close them and end.
    pub(crate) fn release(&self) {
        if let Some(h) = &self.hold {
            *h.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
            h.1.notify_all();
        }
    }

    /// Stop the services (they drain unless abandoned), release them, and
    /// join them.
    pub(crate) fn stop(&mut self, me: i32) -> Result<()> {
        // Release: pairs with the service threads' Acquire load of `stop`.
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        // Unblock threads still waiting for cards (start-up failed).
        self.peer_txs.clear();
        self.release();
        let mut first = Ok(());
        for (t, h) in self.handles.drain(..).enumerate() {
            if h.join().is_err() && first.is_ok() {
                first = Err(Error::Proxy { pe: me, thread: t, why: "panicked".into() });
            }
        }
        // Only now: a thread that hangs in the joins above is still watched.
        if let Some(mut dog) = self.watchdog.take() {
            dog.stop();
        }
        first
    }

    /// Mark the job as failing: services stop without draining.
    pub(crate) fn abandon(&self) {
        // Release: pairs with the service threads' Acquire in drain.
        self.abandon.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Remove shared-memory regions that libfabric's shm provider left behind
/// in `/dev/shm` (named `<pid>:<n>:<m>` by libfabric 1.17) for processes
/// that no longer exist, or for this process's pid (no endpoint of this
/// process is open: the PE is not up yet, and an earlier init of this
/// process has finalized and closed its endpoints, which unlinks their
/// regions; so those are a dead predecessor's). A process
/// that ends without closing its endpoints (killed, or `_exit` on a failed
/// job) leaves its regions there; a later process that gets the same pid
/// then fails in `fi_enable` with `-EBUSY`, and the 16 MiB files pile up.
/// Call before opening shm endpoints. Returns how many were removed.
pub fn clean_stale_shm_regions() -> usize {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return 0 };
    let mut removed = 0;
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let parts: Vec<&str> = name.split(':').collect();
        if parts.len() != 3 || !parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let Ok(pid) = parts[0].parse::<u32>() else { continue };
        let stale = pid == me || {
            // SAFETY: kill(2) with signal 0 only checks whether the process
            // exists; it sends nothing.
            let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
            r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        };
        if stale && std::fs::remove_file(e.path()).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::debug!("removed {removed} stale shm region(s) of dead processes from /dev/shm");
    }
    removed
}

fn parse_cards(b: &[u8]) -> Option<Vec<Vec<u8>>> {
    let n = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize;
    let mut at = 4;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let len = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?) as usize;
        at += 4;
        out.push(b.get(at..at + len)?.to_vec());
        at += len;
    }
    (at == b.len()).then_some(out)
}

/// Pin the calling thread to `cpu` (`CPNET_PROXY_CPUS`), and check that it
/// took: the affinity read back is that CPU alone.
fn pin_to(cpu: usize) -> std::io::Result<()> {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set)?;
    let now = sched_getaffinity(None)?;
    if now.count() != 1 || !now.is_set(cpu) {
        return Err(std::io::Error::other(format!("the affinity read back is {now:?}")));
    }
    tracing::debug!("proxy thread pinned to CPU {cpu}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_cards;

    #[test]
    fn cards_round_trip_and_reject_garbage() {
        let mut blob = 2u32.to_le_bytes().to_vec();
        for c in [&b"ab"[..], &b""[..]] {
            blob.extend_from_slice(&(c.len() as u32).to_le_bytes());
            blob.extend_from_slice(c);
        }
        assert_eq!(parse_cards(&blob), Some(vec![b"ab".to_vec(), Vec::new()]));
        assert_eq!(parse_cards(&blob[..blob.len() - 1]), None, "truncated");
        let mut extra = blob.clone();
        extra.push(0);
        assert_eq!(parse_cards(&extra), None, "trailing bytes");
    }

    #[test]
    fn stale_shm_regions_of_dead_and_own_pids_are_removed() {
        if !std::path::Path::new("/dev/shm").is_dir() {
            eprintln!("SKIP: no /dev/shm");
            return;
        }
        let me = std::process::id();
        // A pid that does not exist: above the kernel's pid_max.
        let dead = 4_194_305u32;
        let own = format!("/dev/shm/{me}:77:0");
        let gone = format!("/dev/shm/{dead}:0:0");
        let live = "/dev/shm/1:78:0".to_owned(); // pid 1 always exists
        let other = format!("/dev/shm/cpnet-test-{me}"); // not a libfabric name
        for f in [&own, &gone, &live, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        let n = super::clean_stale_shm_regions();
        assert!(n >= 2, "removed {n}");
        assert!(!std::path::Path::new(&own).exists() && !std::path::Path::new(&gone).exists());
        assert!(std::path::Path::new(&live).exists() && std::path::Path::new(&other).exists());
        let _ = std::fs::remove_file(&live);
        let _ = std::fs::remove_file(&other);
    }
}
