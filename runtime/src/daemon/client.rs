//! A PE's side of the daemon ([`DaemonLink`]): attach with the PE's memfds,
//! exchange the daemon's cards for this PE with every PE through the
//! bootstrap, then a reader thread that hears the daemon's reports (a stalled
//! service thread) and notices the daemon's death; detach at finalize.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use cpnet_proxy::service::CommandError;
use cpnet_proxy::transport::EndpointFacts;

use super::wire::{self, Attach, ToDaemon, ToPe};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};

/// How long finalize waits for the daemon to drain this PE's services.
const DETACH_LIMIT: Duration = Duration::from_secs(15);
/// How long a request (errors) waits for its answer.
const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// The callback of a fatal report: a stalled service thread, or the daemon
/// gone. Called once, with the line to print.
type OnFatal = Box<dyn FnOnce(String) + Send>;

/// What the reader thread and the PE share.
#[derive(Default)]
struct Shared {
    /// Set before Detach: the end of the connection is expected then.
    detaching: AtomicBool,
    /// The PE's reaction to a fatal report; `None` before
    /// [`DaemonLink::start_watchdog`] and after it ran.
    on_fatal: Mutex<Option<OnFatal>>,
    /// A fatal report that came before a reaction was installed.
    early: Mutex<Option<String>>,
}

impl Shared {
    fn fatal(&self, line: String) {
        let cb = self.on_fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        match cb {
            Some(cb) => cb(line),
            None => {
                let mut early = self.early.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                early.get_or_insert(line);
            }
        }
    }
}

/// This PE's attachment to `cpnet-proxyd`.
pub(crate) struct DaemonLink {
    me: i32,
    writer: Arc<Mutex<UnixStream>>,
    replies: Mutex<mpsc::Receiver<ToPe>>,
    /// One request at a time.
    request: Mutex<()>,
    reader: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    /// This PE's cards, until [`DaemonLink::connect`] sends them round.
    cards: Option<Vec<u8>>,
    facts: Vec<EndpointFacts>,
    /// "cpnet-proxyd (pid P, socket S)".
    daemon: String,
    /// After detach: the final command errors.
    final_errors: Option<Vec<CommandError>>,
    /// A GPU PE's heap, allocated by the daemon: its IPC handle (else empty).
    gpu_heap: Vec<u8>,
}

impl DaemonLink {
    /// Attaches PE `att.pe` over `stream` (connected to the daemon at
    /// `socket`), passing `fds` (a CPU PE's queue pool and heap region
    /// memfds; a GPU PE's pool, status and payload memfds), and waits up to `timeout` for the daemon's answer.
    ///
    /// # Errors
    /// [`Error::Daemon`]: the daemon refused (its reason), or did not answer.
    pub(crate) fn attach(stream: UnixStream, socket: &std::path::Path, att: &Attach, fds: Vec<OwnedFd>, timeout: Duration) -> Result<DaemonLink> {
        let me = att.pe;
        let place = format!("cpnet-proxyd at {}", socket.display());
        let err = |why: String| Error::Daemon { pe: me, why };
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        wire::send(&stream, &ToDaemon::Attach(att.clone()).encode(), &borrowed)
            .map_err(|e| err(format!("sending the attach message to {place}: {e}")))?;
        drop(fds);
        let _ = stream.set_read_timeout(Some(timeout));
        let frame = wire::recv(&stream)
            .map_err(|e| err(format!("reading {place}'s answer: {e}")))?
            .ok_or_else(|| err(format!("{place} closed the connection without answering")))?;
        let _ = stream.set_read_timeout(None);
        let (daemon_pid, cards, gpu_heap) = match ToPe::decode(frame.kind, &frame.body) {
            Ok(ToPe::Accepted { daemon_pid, cards, gpu_heap }) => (daemon_pid, cards, gpu_heap),
            Ok(ToPe::Refused(reason)) => return Err(err(format!("{place} refused this PE: {reason}"))),
            Ok(other) => return Err(err(format!("{place} answered {other:?} to Attach"))),
            Err(e) => return Err(err(format!("{place} answered a malformed message: {e}"))),
        };
        let daemon = format!("cpnet-proxyd (pid {daemon_pid}, socket {})", socket.display());
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel();
        let read_half = stream.try_clone().map_err(|e| err(format!("cloning the socket: {e}")))?;
        let (sh, name) = (Arc::clone(&shared), daemon.clone());
        let reader = std::thread::Builder::new()
            .name("cpnet-daemon-link".into())
            .spawn(move || reader(read_half, tx, sh, me, name))
            .map_err(|e| err(format!("starting the reader thread: {e}")))?;
        tracing::debug!(pe = me, %daemon, "attached to the proxy daemon");
        Ok(DaemonLink {
            me,
            writer: Arc::new(Mutex::new(stream)),
            replies: Mutex::new(rx),
            request: Mutex::new(()),
            reader: Some(reader),
            shared,
            cards: Some(cards),
            facts: Vec::new(),
            daemon,
            final_errors: None,
            gpu_heap,
        })
    }

    fn send(&self, m: &ToDaemon) -> std::io::Result<()> {
        let w = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        wire::send(&w, &m.encode(), &[])
    }

    fn wait_reply(&self, limit: Duration) -> Option<ToPe> {
        self.replies.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv_timeout(limit).ok()
    }

    /// Exchanges this PE's cards (its endpoints in the daemon) with every
    /// PE and waits until the daemon connected them. **Collective** (an
    /// allgather).
    ///
    /// # Errors
    /// [`Error::Bootstrap`], [`Error::Daemon`].
    pub(crate) fn connect(&mut self, boot: &Bootstrap, me: i32, timeout: Duration) -> Result<()> {
        let Some(cards) = self.cards.take() else { return Ok(()) };
        let all = boot.allgather(&cards).map_err(|cause| Error::Bootstrap { pe: me, cause })?;
        let err = |why: String| Error::Daemon { pe: me, why };
        self.send(&ToDaemon::Peers(all)).map_err(|e| err(format!("sending the peers' cards to {}: {e}", self.daemon)))?;
        match self.wait_reply(timeout) {
            Some(ToPe::Ready(facts)) => {
                self.facts = facts;
                Ok(())
            }
            Some(ToPe::Refused(reason)) => {
                boot.abort(&format!("fabric connect failed in {}: {reason}", self.daemon));
                Err(err(format!("{}: {reason}", self.daemon)))
            }
            Some(other) => Err(err(format!("{} answered {other:?} to the peers' cards", self.daemon))),
            None => Err(err(format!("{} did not connect this PE within {:.0} s", self.daemon, timeout.as_secs_f64()))),
        }
    }

    /// Installs the PE's reaction to a fatal report (called once, on the
    /// reader thread): a service thread of this PE stalled in the daemon, or
    /// the daemon went away. Unlike the in-process watchdog it is always on:
    /// a PE must not outlive its daemon.
    pub(crate) fn start_watchdog(&mut self, on_fatal: OnFatal) {
        let early = self.shared.early.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        match early {
            Some(line) => on_fatal(line),
            None => *self.shared.on_fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(on_fatal),
        }
    }

    /// A GPU PE's heap, which the daemon allocated: its CUDA IPC handle (64
    /// bytes); empty for a CPU PE.
    pub(crate) fn gpu_heap(&self) -> &[u8] {
        &self.gpu_heap
    }

    /// Per service thread, what its transport reports.
    pub(crate) fn facts(&self) -> &[EndpointFacts] {
        &self.facts
    }

    /// The command errors the daemon's services recorded for this PE (empty
    /// if the daemon does not answer within 10 s).
    pub(crate) fn command_errors(&self) -> Vec<CommandError> {
        if let Some(e) = &self.final_errors {
            return e.clone();
        }
        let _one = self.request.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.send(&ToDaemon::Errors).is_err() {
            return Vec::new();
        }
        match self.wait_reply(REQUEST_LIMIT) {
            Some(ToPe::ErrorList(e)) => e,
            _ => Vec::new(),
        }
    }

    /// Detaches: the daemon drains this PE's services, stops them and
    /// answers with the final command errors; then the connection closes.
    ///
    /// # Errors
    /// [`Error::Daemon`] when the daemon does not answer within 15 s.
    pub(crate) fn stop(&mut self) -> Result<()> {
        if self.final_errors.is_some() || self.reader.is_none() {
            return Ok(());
        }
        // Release: pairs with the reader's Acquire load at the end of the stream.
        self.shared.detaching.store(true, Ordering::Release);
        let r = match self.send(&ToDaemon::Detach) {
            Err(e) => Err(format!("sending Detach to {}: {e}", self.daemon)),
            Ok(()) => match self.wait_reply(DETACH_LIMIT) {
                Some(ToPe::Detached(errs)) => {
                    self.final_errors = Some(errs);
                    Ok(())
                }
                _ => Err(format!("{} did not confirm the detach within {} s", self.daemon, DETACH_LIMIT.as_secs())),
            },
        };
        self.close();
        r.map_err(|why| Error::Daemon { pe: self.me, why })
    }

    /// The job is failing: tell the daemon to stop this PE's services
    /// without draining (best effort).
    pub(crate) fn abandon(&self) {
        let _ = self.send(&ToDaemon::Abandon);
    }

    /// A callable [`DaemonLink::abandon`] for the failure handler.
    pub(crate) fn abandoner(&self) -> Arc<dyn Fn() + Send + Sync> {
        let w = Arc::clone(&self.writer);
        Arc::new(move || {
            let w = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = wire::send(&w, &ToDaemon::Abandon.encode(), &[]);
        })
    }

    fn close(&mut self) {
        // Release: as in stop; a close is expected from here on.
        self.shared.detaching.store(true, Ordering::Release);
        {
            let w = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

impl Drop for DaemonLink {
    fn drop(&mut self) {
        // Without a detach the daemon abandons this PE's services when the
        // connection closes.
        self.close();
    }
}

/// The reader thread: forwards replies; a stall report or the end of the
/// connection (unless detaching) is fatal.
fn reader(stream: UnixStream, tx: mpsc::Sender<ToPe>, shared: Arc<Shared>, me: i32, daemon: String) {
    let why = loop {
        match wire::recv(&stream) {
            Ok(Some(f)) => match ToPe::decode(f.kind, &f.body) {
                Ok(ToPe::Stalled(report)) => shared.fatal(format!("cpnet: PE {me}: {daemon}: {report}")),
                Ok(m) => {
                    let _ = tx.send(m);
                }
                Err(e) => break format!("it sent a malformed message ({e})"),
            },
            Ok(None) => break "the connection closed".to_owned(),
            Err(e) => break format!("the connection failed ({e})"),
        }
    };
    // Acquire: pairs with the Release store before Detach.
    if !shared.detaching.load(Ordering::Acquire) {
        shared.fatal(format!("cpnet: PE {me}: lost the proxy daemon {daemon}: {why} (did it die?); aborting this PE"));
    }
}
