//! The rendezvous client: a PE's [`Bootstrap`] (join, allgather, barrier,
//! finalize, abort) and its reader thread, which records failure notices.
//! See the [protocol](super).

use super::*;

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// A reply to a collective, as the reader thread received it.
enum Reply {
    Gathered { round: u64, blobs: Vec<Vec<u8>> },
    ByeAck,
}

/// What the reader thread and the callers share.
struct Shared {
    state: Mutex<State>,
    /// Signalled on every change of `state`.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    replies: VecDeque<Reply>,
    /// The first failure (from the server, a lost connection, or `abort`).
    failure: Option<PeerFailure>,
    handler: Option<Arc<FailureHandler>>,
    /// The handler was called (or must not be: the failure is our own abort).
    handler_done: bool,
    /// The reader thread has ended.
    reader_done: bool,
    /// We are closing the connection ourselves: EOF is not a failure.
    closing: bool,
}

impl Shared {
    fn new() -> Arc<Shared> {
        Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        })
    }

    fn failure(&self) -> Option<PeerFailure> {
        self.state.lock().failure.clone()
    }

    /// Records `f` unless a failure is already recorded, wakes the waiters,
    /// and calls the handler (once, outside the lock) if `call_handler`.
    fn record_failure(&self, f: PeerFailure, call_handler: bool) {
        let call = {
            let mut st = self.state.lock();
            if st.failure.is_some() {
                tracing::debug!(later = %f, "bootstrap: later failure ignored");
                return;
            }
            tracing::debug!(failure = %f, "bootstrap: failure recorded");
            st.failure = Some(f.clone());
            self.changed.notify_all();
            if !call_handler {
                st.handler_done = true;
                None
            } else {
                Self::take_handler_call(&mut st)
            }
        };
        if let Some((h, f)) = call {
            call_handler_guarded(&*h, &f);
        }
    }

    fn take_handler_call(st: &mut State) -> Option<(Arc<FailureHandler>, PeerFailure)> {
        if st.handler_done {
            return None;
        }
        let (Some(h), Some(f)) = (&st.handler, &st.failure) else {
            return None;
        };
        st.handler_done = true;
        Some((h.clone(), f.clone()))
    }
}

/// Calls a user's handler; a panic in it is logged, not propagated into the
/// reader thread (which must go on to wake the waiters).
fn call_handler_guarded(h: &FailureHandler, f: &PeerFailure) {
    if catch_unwind(AssertUnwindSafe(|| h(f))).is_err() {
        tracing::error!(failure = %f, "bootstrap: the failure handler panicked");
    }
}

/// The connection to the server, for a job of more than one PE.
struct Remote {
    /// The rendezvous address, as given (for messages).
    addr: String,
    /// The connect timeout it was reached with (bounds how long the server
    /// may legitimately hold a collective back, see `Bootstrap::wait_reply`).
    connect_timeout: Duration,
    /// Write half; locked for the duration of one frame (shared with
    /// [`Bootstrap::aborter`]'s handles).
    writer: Arc<Mutex<TcpStream>>,
    /// The next allgather round; locked for the duration of one collective,
    /// so that collectives from several threads run one at a time.
    collective: Mutex<u64>,
    reader: Option<JoinHandle<()>>,
    /// The in-process server (PE 0 under mpirun/srun).
    server: Option<ServerHandle>,
}

/// A PE's handle on the rendezvous: allgather, barrier, finalize and failure
/// notices. One per PE process; `Send + Sync`, and collectives may be called
/// from any thread, one at a time (concurrent calls are serialised).
///
/// Collective calls ([`allgather`](Bootstrap::allgather),
/// [`barrier`](Bootstrap::barrier), [`finalize`](Bootstrap::finalize)) must
/// be made by every PE, in the same order. [`abort`](Bootstrap::abort) is
/// one-sided.
///
/// ```no_run
/// use cpnet::{bootstrap::Bootstrap, env::{Launch, Tuning}};
/// let launch = Launch::from_env()?;
/// let tuning = Tuning::from_env()?;
/// let boot = Bootstrap::connect(&launch, tuning.connect_timeout)?;
/// boot.set_failure_handler(Box::new(|f| eprintln!("{f}")));
/// let addrs = boot.allgather(b"my fabric address")?; // one blob per PE
/// boot.barrier()?;
/// boot.finalize()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Dropping a `Bootstrap` without [`finalize`](Bootstrap::finalize) closes
/// the connection, which the others see as this PE's failure.
pub struct Bootstrap {
    pe: i32,
    n_pes: i32,
    /// The init/finalize cycle the rendezvous put this connection in.
    pub(super) cycle: u64,
    /// How long each collective may wait; see [`Bootstrap::set_wait_timeout`].
    wait_timeout: Mutex<Option<Duration>>,
    shared: Arc<Shared>,
    /// `None` for a single PE, and once closed.
    remote: Option<Remote>,
}

/// How much longer than it should need a client waits for the rendezvous
/// to settle a collective before it gives up by itself (see
/// [`Bootstrap::set_wait_timeout`]).
pub(super) const SERVER_SLACK: Duration = Duration::from_secs(5);

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Bootstrap>();
    send_sync::<ServerHandle>();
};

impl Bootstrap {
    /// Joins the rendezvous described by `launch` (blocking).
    ///
    /// With one PE this is local and cannot fail. Otherwise: if the job was
    /// not started by cpnet-run and this is PE 0, binds
    /// `launch.bootstrap` and runs the [`Server`] in-process; then connects
    /// to `launch.bootstrap`, retrying with backoff (10 ms doubling to
    /// 500 ms) for up to `connect_timeout`, and sends Hello. Returns once the
    /// server accepted this PE; the others may not have joined yet.
    ///
    /// May be called again after [`finalize`](Bootstrap::finalize) (repeated
    /// init, a new cycle of the job): cpnet-run's server accepts every
    /// cycle; under mpirun/srun PE 0 binds a new server for each, and a PE
    /// whose connection that server's predecessor closed unanswered
    /// reconnects (until `connect_timeout`).
    ///
    /// # Errors
    /// [`BootstrapError::Config`] (invalid PE, no address),
    /// [`BootstrapError::Io`] (PE 0 cannot bind the address),
    /// [`BootstrapError::Timeout`] (no server reached),
    /// [`BootstrapError::Rejected`], [`BootstrapError::PeerFailed`] (the job
    /// failed already), [`BootstrapError::Protocol`].
    pub fn connect(
        launch: &Launch,
        connect_timeout: Duration,
    ) -> Result<Bootstrap, BootstrapError> {
        let (pe, n_pes) = (launch.pe, launch.n_pes);
        if n_pes < 1 || !(0..n_pes).contains(&pe) {
            return Err(BootstrapError::Config(format!(
                "PE {pe} of {n_pes} is not a valid place in a job"
            )));
        }
        let shared = Shared::new();
        if n_pes == 1 {
            return Ok(Bootstrap {
                pe,
                n_pes,
                cycle: 0,
                wait_timeout: Mutex::new(None),
                shared,
                remote: None,
            });
        }
        let addr = launch.bootstrap.clone().ok_or_else(|| {
            BootstrapError::Config(format!(
                "{} is not set, but the job has {n_pes} PEs (started by {})",
                env::BOOTSTRAP_ADDR,
                launch.launcher
            ))
        })?;

        let hosts_server = launch.launcher != Launcher::CpnetRun && pe == 0;
        let server = if hosts_server {
            let server = Server::bind(&addr)
                .and_then(|s| s.with_connect_timeout(connect_timeout).spawn(n_pes))
                .map_err(|e| BootstrapError::Io {
                    what: format!(
                        "PE 0 starting the rendezvous at {addr} ({}); is the port free, and is \
                         the address one of PE 0's host?",
                        env::BOOTSTRAP_ADDR
                    ),
                    source: e,
                })?;
            Some(server)
        } else {
            None
        };
        // On error from here, dropping `server` stops it.

        let deadline = Instant::now() + connect_timeout;
        let (stream, cycle) = loop {
            let mut stream =
                connect_with_retry(&addr, pe, launch.launcher, deadline, connect_timeout)?;
            match handshake(&mut stream, &addr, pe, n_pes, deadline) {
                Ok(cycle) => break (stream, cycle),
                // PE 0's server of the previous cycle was ending (this PE
                // re-initialized first): try again until PE 0's next one
                // answers. cpnet-run's server serves every cycle itself.
                Err(Handshake::Closed(e))
                    if launch.launcher != Launcher::CpnetRun && Instant::now() < deadline =>
                {
                    tracing::debug!(pe, %addr, "bootstrap: rendezvous closed during the handshake ({e}); reconnecting");
                    drop(stream);
                    thread::sleep(Duration::from_millis(10));
                }
                Err(Handshake::Closed(e) | Handshake::Failed(e)) => return Err(e),
            }
        };

        // Who is to blame if the server's connection goes away.
        let lost = if launch.launcher == Launcher::CpnetRun {
            PeerFailure {
                pe: -1,
                reason: format!(
                    "lost the connection to cpnet-run's rendezvous at {addr} (did cpnet-run die?)"
                ),
            }
        } else {
            PeerFailure {
                pe: 0,
                reason: format!(
                    "lost the connection to the rendezvous at {addr} that PE 0 hosts (PE 0 died?)"
                ),
            }
        };
        let io_err = |what: &str, e| BootstrapError::Io {
            what: format!("PE {pe} {what} for the rendezvous at {addr}"),
            source: e,
        };
        let read_half = stream
            .try_clone()
            .map_err(|e| io_err("cloning the socket", e))?;
        let reader_shared = shared.clone();
        let reader = thread::Builder::new()
            .name("cpnet-bootstrap-reader".into())
            .spawn(move || client_reader(read_half, reader_shared, lost))
            .map_err(|e| io_err("starting the reader thread", e))?;
        tracing::debug!(pe, n_pes, %addr, hosts_server, cycle, "bootstrap: joined");
        Ok(Bootstrap {
            pe,
            n_pes,
            cycle,
            wait_timeout: Mutex::new(None),
            shared,
            remote: Some(Remote {
                addr,
                connect_timeout,
                writer: Arc::new(Mutex::new(stream)),
                collective: Mutex::new(0),
                reader: Some(reader),
                server,
            }),
        })
    }

    /// This PE's number.
    pub fn my_pe(&self) -> i32 {
        self.pe
    }

    /// Number of PEs in the job.
    pub fn n_pes(&self) -> i32 {
        self.n_pes
    }

    /// The local IP address of this PE's connection to the rendezvous: the
    /// address from which this host reaches PE 0's (the kernel's choice of
    /// route and interface). `None` for a single PE (no connection), or if
    /// the socket cannot tell. The runtime binds the fabric to it on
    /// multi-host jobs ([`crate::pe`], `CPNET_FABRIC_NODE` unset).
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        let remote = self.remote.as_ref()?;
        let w = remote.writer.lock();
        w.local_addr().ok().map(|a| a.ip())
    }

    /// The first failure this PE heard of, if any (one-sided, non-blocking).
    pub fn failure(&self) -> Option<PeerFailure> {
        self.shared.failure()
    }

    /// Sets the function called once, from the bootstrap's reader thread,
    /// when the first failure of another PE (or of the rendezvous) is heard
    /// of; the runtime uses it to start its abort grace period. If a failure
    /// was heard of before, `handler` is called at once, on this thread.
    /// Replaces any previous handler; not called for this PE's own
    /// [`abort`](Bootstrap::abort). A panic in it is logged and swallowed.
    pub fn set_failure_handler(&self, handler: Box<FailureHandler>) {
        let call = {
            let mut st = self.shared.state.lock();
            st.handler = Some(Arc::from(handler));
            Shared::take_handler_call(&mut st)
        };
        if let Some((h, f)) = call {
            call_handler_guarded(&*h, &f);
        }
    }

    /// One-sided, local: how long each later collective of this PE
    /// ([`allgather`](Bootstrap::allgather), [`barrier`](Bootstrap::barrier),
    /// [`finalize`](Bootstrap::finalize)) may wait for the others; `None`
    /// (the default after [`connect`](Bootstrap::connect)) waits forever.
    /// Rounded up to whole milliseconds. A collective already waiting keeps
    /// the timeout it started with.
    ///
    /// The rendezvous enforces it: once this PE has waited `timeout` in a
    /// collective (counted from when the last PE joined the cycle, if that
    /// was later: a PE that has not joined is the connect timeout's
    /// business), the server fails the job for every PE, as a peer failure
    /// does, with a report naming this PE, the collective and its round, how
    /// long it waited and which PEs had not arrived; every PE's collective
    /// returns [`BootstrapError::PeerFailed`] with it (blaming the missing
    /// PE, or PE -1 when several are missing). PEs may use different
    /// timeouts: the first to run out decides.
    ///
    /// Should the rendezvous neither complete the collective nor report a
    /// failure within `timeout` + the connect timeout + 5 s (its host
    /// unreachable, say), this PE gives up by itself:
    /// [`BootstrapError::Timeout`], and it aborts the job
    /// ([`abort`](Bootstrap::abort)).
    pub fn set_wait_timeout(&self, timeout: Option<Duration>) {
        *self.wait_timeout.lock() = timeout;
    }

    /// The timeout set by [`set_wait_timeout`](Bootstrap::set_wait_timeout).
    pub fn wait_timeout(&self) -> Option<Duration> {
        *self.wait_timeout.lock()
    }

    /// Collective: every PE contributes `data` (any length, including 0) and
    /// gets every PE's contribution, indexed by PE. Blocks until all PEs have
    /// called it, or fails with [`BootstrapError::PeerFailed`] as soon as a
    /// PE is known to have failed, or a PE waited longer than its wait
    /// timeout ([`set_wait_timeout`](Bootstrap::set_wait_timeout)).
    pub fn allgather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        self.gather(data, "allgather")
    }

    /// Collective: returns once every PE has called it (an allgather of
    /// empty contributions); fails like [`allgather`](Bootstrap::allgather).
    pub fn barrier(&self) -> Result<(), BootstrapError> {
        self.gather(&[], "barrier").map(drop)
    }

    /// An allgather; `call` names it in messages.
    fn gather(&self, data: &[u8], call: &str) -> Result<Vec<Vec<u8>>, BootstrapError> {
        let Some(remote) = &self.remote else {
            return match self.failure() {
                Some(f) => Err(f.into()),
                None => Ok(vec![data.to_vec()]),
            };
        };
        let mut round = remote.collective.lock();
        if let Some(f) = self.failure() {
            return Err(f.into());
        }
        let r = *round;
        let timeout = self.wait_timeout();
        let frame = wire::gather(r, timeout, data).map_err(|e| {
            BootstrapError::Protocol(format!("PE {} {call} round {r}: {e}", self.pe))
        })?;
        let what = format!("{call} round {r}");
        self.send(remote, &frame, &what)?;
        match self.wait_reply(remote, timeout, &what)? {
            Reply::Gathered { round: got, blobs }
                if got == r && blobs.len() == self.n_pes as usize =>
            {
                *round += 1;
                Ok(blobs)
            }
            Reply::Gathered { round: got, blobs } => Err(BootstrapError::Protocol(format!(
                "PE {} expected allgather round {r} with {} blobs from {}, got round {got} \
                 with {}",
                self.pe,
                self.n_pes,
                remote.addr,
                blobs.len()
            ))),
            Reply::ByeAck => Err(BootstrapError::Protocol(format!(
                "PE {} got a finalize acknowledgement from {} during allgather round {r}",
                self.pe, remote.addr
            ))),
        }
    }

    /// One-sided: tells every other PE that this one is failing, for
    /// `reason`; they get [`BootstrapError::PeerFailed`] naming this PE. From
    /// then on this PE's own collectives fail too (with its own PE number).
    /// Does not block on the others; a send error is only logged (the
    /// connection closing tells them as well).
    pub fn abort(&self, reason: &str) {
        (self.aborter())(reason);
    }

    /// [`Bootstrap::abort`] as a handle for another thread (the proxy
    /// watchdog's, which must tell the other PEs at once: they stop polling
    /// their fabric before this PE's process, and its connections, go).
    pub fn aborter(&self) -> Arc<dyn Fn(&str) + Send + Sync> {
        let (shared, pe) = (Arc::clone(&self.shared), self.pe);
        let remote = self.remote.as_ref().map(|r| (Arc::clone(&r.writer), r.addr.clone()));
        Arc::new(move |reason: &str| {
            shared.record_failure(PeerFailure { pe, reason: reason.to_owned() }, false);
            if let Some((writer, addr)) = &remote {
                let mut w = writer.lock();
                if let Err(e) = send_frame(&mut w, &wire::abort(reason)) {
                    tracing::debug!(pe, "bootstrap: abort not sent to {addr}: {e}");
                }
            }
        })
    }

    /// Collective: waits until every PE has called `finalize`, then closes
    /// the connection and joins the bootstrap's threads (and, on the PE that
    /// hosts it, the server). Fails with [`BootstrapError::PeerFailed`] if a
    /// PE failed first, or a PE waited longer than its wait timeout
    /// ([`set_wait_timeout`](Bootstrap::set_wait_timeout)); the connection
    /// is closed in any case.
    pub fn finalize(mut self) -> Result<(), BootstrapError> {
        let result = match &self.remote {
            None => match self.failure() {
                Some(f) => Err(f.into()),
                None => Ok(()),
            },
            Some(remote) => self.bye(remote),
        };
        self.close(result.is_ok());
        result
    }

    fn bye(&self, remote: &Remote) -> Result<(), BootstrapError> {
        let _round = remote.collective.lock();
        if let Some(f) = self.failure() {
            return Err(f.into());
        }
        let timeout = self.wait_timeout();
        self.send(remote, &wire::bye(timeout), "finalize")?;
        match self.wait_reply(remote, timeout, "finalize")? {
            Reply::ByeAck => Ok(()),
            Reply::Gathered { round, .. } => Err(BootstrapError::Protocol(format!(
                "PE {} got allgather round {round} from {} while finalizing",
                self.pe, remote.addr
            ))),
        }
    }

    fn send(&self, remote: &Remote, frame: &[u8], what: &str) -> Result<(), BootstrapError> {
        let res = send_frame(&mut remote.writer.lock(), frame);
        res.map_err(|e| match self.failure() {
            // The connection broke because the job is failing: say why.
            Some(f) => f.into(),
            None => BootstrapError::Io {
                what: format!(
                    "PE {} sending {what} to the rendezvous at {}",
                    self.pe, remote.addr
                ),
                source: e,
            },
        })
    }

    /// Waits for the reader thread's next reply (a failure wins only when
    /// no reply is queued: a collective that completed did complete). The
    /// server enforces `timeout`; if it has said nothing by `timeout` + the
    /// connect timeout + [`SERVER_SLACK`], gives up (`what`: the collective,
    /// for the message) and aborts.
    fn wait_reply(
        &self,
        remote: &Remote,
        timeout: Option<Duration>,
        what: &str,
    ) -> Result<Reply, BootstrapError> {
        let start = Instant::now();
        // The server may hold a collective back for up to the connect
        // timeout (a PE that has not joined yet), then `timeout`.
        let give_up = timeout
            .and_then(|t| t.checked_add(remote.connect_timeout)?.checked_add(SERVER_SLACK))
            .and_then(|d| start.checked_add(d));
        let mut st = self.shared.state.lock();
        loop {
            if let Some(r) = st.replies.pop_front() {
                return Ok(r);
            }
            if let Some(f) = &st.failure {
                return Err(f.clone().into());
            }
            if st.reader_done {
                return Err(BootstrapError::Protocol(format!(
                    "PE {}: the connection to the rendezvous at {} closed without a reply",
                    self.pe, remote.addr
                )));
            }
            match give_up {
                None => self.shared.changed.wait(&mut st),
                Some(at) => {
                    if self.shared.changed.wait_until(&mut st, at).timed_out()
                        && st.replies.is_empty()
                        && st.failure.is_none()
                        && !st.reader_done
                    {
                        drop(st);
                        let reason = format!(
                            "PE {} gave up on {what} after {:.1}s: the rendezvous at {} neither \
                             completed it nor reported a failure within this PE's wait timeout \
                             ({}s) plus the connect timeout ({}s) plus {}s (is its host \
                             reachable? is cpnet-run, or PE 0 hosting it, still running?)",
                            self.pe,
                            start.elapsed().as_secs_f64(),
                            remote.addr,
                            timeout.map_or_else(String::new, secs),
                            secs(remote.connect_timeout),
                            secs(SERVER_SLACK)
                        );
                        self.abort(&reason);
                        return Err(BootstrapError::Timeout {
                            what: format!("waiting for the rendezvous: {reason}"),
                        });
                    }
                }
            }
        }
    }

    /// Closes the connection and joins the threads. `graceful`: finalize
    /// succeeded, so an in-process server is ending by itself.
    fn close(&mut self, graceful: bool) {
        let Some(mut remote) = self.remote.take() else {
            return;
        };
        self.shared.state.lock().closing = true;
        // Wakes the reader (its read returns 0) and tells the server.
        let _ = remote.writer.lock().shutdown(Shutdown::Both);
        if let Some(r) = remote.reader.take() {
            let _ = r.join();
        }
        if let Some(server) = remote.server.take() {
            let outcome = if graceful {
                server.join()
            } else {
                let reason = format!(
                    "PE {} (which hosts the rendezvous) ended without finalize",
                    self.pe
                );
                server.shutdown_failing(self.pe, reason)
            };
            if let Err(f) = outcome {
                tracing::debug!(failure = %f, "bootstrap: in-process rendezvous ended failing");
            }
        }
        tracing::debug!(pe = self.pe, graceful, "bootstrap: closed");
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.close(false);
    }
}

impl fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bootstrap")
            .field("pe", &self.pe)
            .field("n_pes", &self.n_pes)
            .field("cycle", &self.cycle)
            .field("addr", &self.remote.as_ref().map(|r| r.addr.as_str()))
            .field("failure", &self.failure())
            .finish()
    }
}

/// Connects to `addr`, retrying (the server may not be up yet) until `deadline`.
fn connect_with_retry(
    addr: &str,
    pe: i32,
    launcher: Launcher,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream, BootstrapError> {
    let mut backoff = Duration::from_millis(10);
    let mut last: Option<io::Error> = None;
    loop {
        match addr.to_socket_addrs() {
            Ok(candidates) => {
                for sa in candidates {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match TcpStream::connect_timeout(&sa, left.min(Duration::from_secs(5))) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = Some(e),
                    }
                }
            }
            // Name resolution can fail transiently (DNS not up yet): retry.
            Err(e) => last = Some(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let hint = match launcher {
                Launcher::CpnetRun => "is cpnet-run still running?".to_owned(),
                _ => format!(
                    "is PE 0 running, and is {}={addr} PE 0's host and reachable from here?",
                    env::BOOTSTRAP_ADDR
                ),
            };
            let last = last.map_or_else(|| "none".to_owned(), |e| e.to_string());
            return Err(BootstrapError::Timeout {
                what: format!(
                    "after {}s: PE {pe} could not reach the rendezvous at {addr} (last error: \
                     {last}); {hint}",
                    secs(timeout)
                ),
            });
        }
        thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
}

/// How a handshake failed.
enum Handshake {
    /// The server closed or reset the connection before answering: maybe a
    /// server that was ending (see `Bootstrap::connect`).
    Closed(BootstrapError),
    /// Anything else: final.
    Failed(BootstrapError),
}

impl From<BootstrapError> for Handshake {
    fn from(e: BootstrapError) -> Handshake {
        Handshake::Failed(e)
    }
}

/// Whether an I/O error means the peer closed or reset the connection.
fn closed_by_peer(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// Sends Hello and waits (until `deadline`) for Welcome; returns the
/// init/finalize cycle the server put this PE in.
fn handshake(
    stream: &mut TcpStream,
    addr: &str,
    pe: i32,
    n_pes: i32,
    deadline: Instant,
) -> Result<u64, Handshake> {
    let io_err = |what: &str, e: io::Error| {
        let closed = closed_by_peer(&e);
        let e = BootstrapError::Io {
            what: format!("PE {pe} {what} the rendezvous at {addr}"),
            source: e,
        };
        if closed {
            Handshake::Closed(e)
        } else {
            Handshake::Failed(e)
        }
    };
    stream
        .set_nodelay(true)
        .map_err(|e| io_err("configuring its socket to", e))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    stream
        .set_read_timeout(Some(left))
        .map_err(|e| io_err("configuring its socket to", e))?;
    send_frame(stream, &wire::hello(pe, n_pes)).map_err(|e| io_err("sending Hello to", e))?;
    let reply = match wire::read_frame(stream, wire::HANDSHAKE_MAX) {
        Ok(Some((kind, body))) => wire::decode_to_client(kind, &body).map_err(|e| {
            BootstrapError::Protocol(format!("answer of the rendezvous at {addr}: {e}"))
        })?,
        Ok(None) => {
            return Err(Handshake::Closed(BootstrapError::Protocol(format!(
                "the rendezvous at {addr} closed the connection during PE {pe}'s handshake (is \
                 that address really a cpnet rendezvous of this job?)"
            ))));
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            return Err(Handshake::Failed(BootstrapError::Timeout {
                what: format!(
                    "waiting for the rendezvous at {addr} to answer PE {pe}'s Hello (is that \
                     address really a cpnet rendezvous?)"
                ),
            }));
        }
        Err(e) => return Err(io_err("reading the answer of", e)),
    };
    let cycle = match reply {
        ToClient::Welcome { cycle } => cycle,
        ToClient::Reject { reason } => {
            return Err(Handshake::Failed(BootstrapError::Rejected {
                addr: addr.to_owned(),
                reason,
            }));
        }
        ToClient::Aborted { pe, reason } => {
            return Err(Handshake::Failed(BootstrapError::PeerFailed { pe, reason }));
        }
        other => {
            return Err(Handshake::Failed(BootstrapError::Protocol(format!(
                "the rendezvous at {addr} answered Hello with {other:?}"
            ))));
        }
    };
    stream
        .set_read_timeout(None)
        .map_err(|e| io_err("configuring its socket to", e))?;
    Ok(cycle)
}

/// The client's reader thread: queues replies, records failures.
fn client_reader(mut stream: TcpStream, shared: Arc<Shared>, lost: PeerFailure) {
    loop {
        let msg = match wire::read_frame(&mut stream, wire::MAX_FRAME) {
            Ok(Some((kind, body))) => wire::decode_to_client(kind, &body),
            Ok(None) => Err("connection closed".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        let reply = match msg {
            Ok(ToClient::Gathered { round, blobs }) => Reply::Gathered { round, blobs },
            Ok(ToClient::ByeAck) => Reply::ByeAck,
            Ok(ToClient::Aborted { pe, reason }) => {
                shared.record_failure(PeerFailure { pe, reason }, true);
                continue;
            }
            Ok(other) => {
                let reason = format!("{}: unexpected {other:?}", lost.reason);
                shared.record_failure(
                    PeerFailure {
                        pe: lost.pe,
                        reason,
                    },
                    true,
                );
                break;
            }
            Err(e) => {
                if !shared.state.lock().closing {
                    let reason = format!("{} ({e})", lost.reason);
                    shared.record_failure(
                        PeerFailure {
                            pe: lost.pe,
                            reason,
                        },
                        true,
                    );
                }
                break;
            }
        };
        let bye = matches!(reply, Reply::ByeAck);
        let mut st = shared.state.lock();
        st.replies.push_back(reply);
        shared.changed.notify_all();
        if bye {
            break;
        }
    }
    shared.state.lock().reader_done = true;
    shared.changed.notify_all();
}
