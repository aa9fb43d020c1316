//! The rendezvous server: accepts one connection per PE, answers
//! allgathers, barriers and finalize, times collectives, and broadcasts
//! the first failure. See the [protocol](super).

use super::*;

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// How long a stopping server waits for the PEs to close their connections
/// after it shut down its side (so that a last Aborted is read, not reset).
const LINGER: Duration = Duration::from_secs(1);
/// How often the server polls its (non-blocking) listener.
const ACCEPT_TICK: Duration = Duration::from_millis(10);

/// The rendezvous server, bound but not yet running. See the
/// module docs (`bootstrap::server`) for the protocol.
///
/// ```no_run
/// # use std::time::Duration;
/// use cpnet::bootstrap::Server;
/// let server = Server::bind("127.0.0.1:0")?
///     .with_connect_timeout(Duration::from_secs(60))
///     .spawn(4)?;
/// println!("CPNET_BOOTSTRAP_ADDR={}", server.local_addr());
/// // ... start 4 PEs ...
/// let outcome = server.join(); // Ok(()) once all 4 finalized
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    connect_timeout: Duration,
    lost_peer_delay: Duration,
    repeated_init: bool,
}

impl Server {
    /// Binds the rendezvous to `addr` (`host:port`; port 0 picks a free one,
    /// see [`Server::local_addr`]). The error names the address.
    pub fn bind(addr: &str) -> io::Result<Server> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            io::Error::new(e.kind(), format!("binding the rendezvous to {addr}: {e}"))
        })?;
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            addr: local,
            connect_timeout: env::DEFAULT_CONNECT_TIMEOUT,
            lost_peer_delay: Duration::ZERO,
            repeated_init: false,
        })
    }

    /// The address the server listens on (with the real port if bound to 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How long, from [`Server::spawn`], every PE has to join before the
    /// server fails the job ("PE k never reached the rendezvous ..."); for
    /// the later cycles of [repeated init](Server::with_repeated_init), from
    /// the first PE's join of the cycle. Default: 60 s
    /// (`CPNET_CONNECT_TIMEOUT`'s default).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Server {
        self.connect_timeout = timeout;
        self
    }

    /// How long to hold back the "connection to PE k lost" notice, giving the
    /// owner time to send a better one with [`ServerHandle::notify_failure`]
    /// (cpnet-run uses 250 ms). Default: 0 (broadcast at once).
    pub fn with_lost_peer_delay(mut self, delay: Duration) -> Server {
        self.lost_peer_delay = delay;
        self
    }

    /// Whether to serve repeated init (`true`: cpnet-run's server): after
    /// every PE finalized, accept a new cycle of joins of the same PEs,
    /// again and again, until the owner stops the server (see "Repeated
    /// init" in the module docs). The owner should then tell it of
    /// every PE process that ends ([`ServerHandle::notify_exit`]), so that a
    /// cycle that can no longer complete fails at once. Default: `false`
    /// (the server ends once every PE finalized, as PE 0's in-process server
    /// does).
    pub fn with_repeated_init(mut self, repeated: bool) -> Server {
        self.repeated_init = repeated;
        self
    }

    /// Starts serving a job of `n_pes` PEs in a background thread.
    ///
    /// The thread ends when every PE has finalized (all sent Bye and got
    /// ByeAck), or after a failure once every joined PE has closed its
    /// connection, or on [`ServerHandle::shutdown`]; a server
    /// [`with_repeated_init`](Server::with_repeated_init) ends only on
    /// [`ServerHandle::shutdown`] (or the handle's drop).
    pub fn spawn(self, n_pes: i32) -> io::Result<ServerHandle> {
        if n_pes < 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a rendezvous needs at least 1 PE, not {n_pes}"),
            ));
        }
        let (tx, rx) = mpsc::channel();
        let n = n_pes as usize;
        let addr = self.addr;
        let state = ServerLoop {
            listener: self.listener,
            addr,
            n,
            repeated_init: self.repeated_init,
            cycle: 0,
            connect_deadline: Some(Instant::now() + self.connect_timeout),
            first_joined: None,
            connect_timeout: self.connect_timeout,
            lost_peer_delay: self.lost_peer_delay,
            tx: tx.clone(),
            rx,
            conns: HashMap::new(),
            next_id: 0,
            readers: HashMap::new(),
            joined: vec![false; n],
            n_joined: 0,
            round: 0,
            blobs: vec![None; n],
            n_gathered: 0,
            byes: vec![false; n],
            n_byes: 0,
            arrived: vec![None; n],
            all_joined_at: None,
            exited: vec![None; n],
            failure: None,
            lost: Vec::new(),
            done: false,
            stopping: None,
        };
        let thread = thread::Builder::new()
            .name("cpnet-rendezvous".into())
            .spawn(move || state.run())?;
        tracing::debug!(%addr, n_pes, "rendezvous server started");
        Ok(ServerHandle {
            addr,
            events: tx,
            thread: Some(thread),
        })
    }
}

/// A running [`Server`]. Dropping it stops the server (as
/// [`ServerHandle::shutdown`] does, without waiting).
pub struct ServerHandle {
    addr: SocketAddr,
    events: mpsc::Sender<Event>,
    thread: Option<JoinHandle<Result<(), PeerFailure>>>,
}

impl ServerHandle {
    /// The address the server listens on: what the PEs' `CPNET_BOOTSTRAP_ADDR` must be.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// One-sided: tells every joined PE that `pe` failed, for `reason`
    /// (e.g. "process (pid 123) killed by signal 9 (SIGKILL)"). Ignored if
    /// the job already failed (the first failure is the one reported) or the
    /// server has ended.
    pub fn notify_failure(&self, pe: i32, reason: impl Into<String>) {
        let _ = self.events.send(Event::Notify(pe, reason.into()));
    }

    /// One-sided: tells the server that PE `pe`'s process ended (`how`, e.g.
    /// "process (pid 123) exited with status 0"), whatever its status. If
    /// that PE never joined, the job cannot complete: the server fails it
    /// at once ("... without joining the rendezvous") instead of at the
    /// connect timeout. With [repeated init](Server::with_repeated_init),
    /// the same holds for every later cycle once another PE has joined it
    /// (a PE that ends after its last finalize is the normal end of a job).
    /// Ignored for a PE that joined the current cycle (its closed
    /// connection tells), and once the job finished or failed.
    pub fn notify_exit(&self, pe: i32, how: impl Into<String>) {
        let _ = self.events.send(Event::Exited(pe, how.into()));
    }

    /// Whether the server thread has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the server to end: `Ok` when every PE finalized, else the
    /// first failure it saw. A server
    /// [`with_repeated_init`](Server::with_repeated_init) ends only on
    /// [`ServerHandle::shutdown`]: use that instead.
    pub fn join(mut self) -> Result<(), PeerFailure> {
        self.join_thread()
    }

    /// Stops the server: shuts down every connection (PEs still connected
    /// see the rendezvous go away), waits up to 1 s for them to close, ends.
    /// Returns what [`ServerHandle::join`] would.
    pub fn shutdown(mut self) -> Result<(), PeerFailure> {
        let _ = self.events.send(Event::Stop(None));
        self.join_thread()
    }

    /// Like [`ServerHandle::shutdown`], but first fails the job with
    /// `Aborted{pe, reason}` unless it already failed or finished.
    pub(super) fn shutdown_failing(mut self, pe: i32, reason: String) -> Result<(), PeerFailure> {
        let _ = self.events.send(Event::Stop(Some((pe, reason))));
        self.join_thread()
    }

    fn join_thread(&mut self) -> Result<(), PeerFailure> {
        match self.thread.take() {
            None => Ok(()),
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(PeerFailure {
                    pe: -1,
                    reason: format!("the rendezvous server at {} panicked", self.addr),
                })
            }),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.events.send(Event::Stop(None));
        }
    }
}

/// What the server's loop reacts to.
enum Event {
    /// A message from connection `id`.
    Msg(u64, ToServer),
    /// Connection `id` ended (its reader thread is done).
    Closed(u64, CloseKind),
    /// The owner reports that a PE failed.
    Notify(i32, String),
    /// The owner reports that a PE's process ended.
    Exited(i32, String),
    /// The owner stops the server, failing the job first if `Some`.
    Stop(Option<(i32, String)>),
}

enum CloseKind {
    Eof,
    Error(io::Error),
    Protocol(String),
}

/// One accepted connection, seen from the server loop.
struct Conn {
    /// The write half (the reader thread owns a clone).
    stream: TcpStream,
    peer: SocketAddr,
    /// The PE, once its Hello was accepted.
    pe: Option<i32>,
    /// The init/finalize cycle its Hello was accepted in.
    cycle: u64,
    /// Its PE sent Bye on it (its closing is no failure).
    bye: bool,
    /// Rejected (or told the job failed) during its Hello: ignore the rest.
    rejected: bool,
}

/// A PE's arrival at the collective in progress.
#[derive(Clone, Copy)]
struct Arrival {
    at: Instant,
    /// Its wait timeout for this collective (`None`: forever).
    timeout: Option<Duration>,
}

impl Arrival {
    fn now(timeout_ms: u64) -> Arrival {
        Arrival {
            at: Instant::now(),
            timeout: wire::timeout_from_ms(timeout_ms),
        }
    }
}

struct ServerLoop {
    listener: TcpListener,
    addr: SocketAddr,
    n: usize,
    /// After a cycle completes, open the next one instead of ending.
    repeated_init: bool,
    /// The current init/finalize cycle.
    cycle: u64,
    /// Every PE must have joined the current cycle by then; `None` until
    /// the first PE joined a cycle after the first.
    connect_deadline: Option<Instant>,
    /// The first PE that joined the current cycle (for messages).
    first_joined: Option<i32>,
    connect_timeout: Duration,
    lost_peer_delay: Duration,
    tx: mpsc::Sender<Event>,
    rx: mpsc::Receiver<Event>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    /// Reader threads of open connections, joined when their `Closed` comes.
    readers: HashMap<u64, JoinHandle<()>>,
    /// PE k's Hello was accepted in this cycle (a second one is a duplicate).
    joined: Vec<bool>,
    n_joined: usize,
    /// The allgather round in progress and the blobs received for it.
    round: u64,
    blobs: Vec<Option<Vec<u8>>>,
    n_gathered: usize,
    byes: Vec<bool>,
    n_byes: usize,
    /// When PE k arrived at the collective in progress (its Gather of
    /// `round`, or its Bye) and its wait timeout for it.
    arrived: Vec<Option<Arrival>>,
    /// When the last PE joined the current cycle (`None` until all have):
    /// waiting for a PE that has not joined is the connect timeout's
    /// business, so no wait timeout runs before.
    all_joined_at: Option<Instant>,
    /// PE k's process ended (the owner's words), in whatever cycle.
    exited: Vec<Option<String>>,
    /// The first failure; once set, collectives are over and it is all the
    /// server still says.
    failure: Option<PeerFailure>,
    /// Connections lost before Bye whose notice is held back until the
    /// instant (see `lost_peer_delay`).
    lost: Vec<(i32, Instant, String)>,
    /// Every PE finalized; ByeAck sent; no further cycle (without
    /// repeated init).
    done: bool,
    /// Stopping: end when every connection is closed or at this instant.
    stopping: Option<Instant>,
}

impl ServerLoop {
    fn run(mut self) -> Result<(), PeerFailure> {
        loop {
            self.accept_pending();
            let now = Instant::now();
            let mut wait = ACCEPT_TICK;
            for &(_, at, _) in &self.lost {
                wait = wait.min(at.saturating_duration_since(now));
            }
            match self.rx.recv_timeout(wait) {
                Ok(ev) => self.handle(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Unreachable: `self.tx` keeps the channel open.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            // Handle whatever else queued up before looking at deadlines.
            while let Ok(ev) = self.rx.try_recv() {
                self.handle(ev);
            }
            self.check_deadlines(Instant::now());
            if self.finished(Instant::now()) {
                break;
            }
        }
        self.close_all();
        match self.failure.take() {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    fn accept_pending(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => self.add_conn(stream, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // E.g. EMFILE, or a connection reset before accept: keep serving.
                    tracing::warn!(addr = %self.addr, "rendezvous accept failed: {e}");
                    return;
                }
            }
        }
    }

    fn add_conn(&mut self, stream: TcpStream, peer: SocketAddr) {
        let id = self.next_id;
        self.next_id += 1;
        let setup = (|| {
            stream.set_nonblocking(false)?;
            stream.set_nodelay(true)?;
            let reader = stream.try_clone()?;
            let tx = self.tx.clone();
            thread::Builder::new()
                .name(format!("cpnet-rendezvous-conn{id}"))
                .spawn(move || conn_reader(id, reader, tx))
        })();
        match setup {
            Ok(handle) => {
                tracing::debug!(%peer, id, "rendezvous: connection accepted");
                self.readers.insert(id, handle);
                self.conns.insert(
                    id,
                    Conn {
                        stream,
                        peer,
                        pe: None,
                        cycle: self.cycle,
                        bye: false,
                        rejected: false,
                    },
                );
            }
            Err(e) => tracing::warn!(%peer, "rendezvous: dropping a connection: {e}"),
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Msg(id, msg) => self.on_msg(id, msg),
            Event::Closed(id, why) => self.on_closed(id, why),
            Event::Exited(pe, how) => self.on_exited(pe, how),
            Event::Notify(pe, reason) => {
                self.lost.retain(|(p, _, _)| *p != pe);
                self.fail(pe, reason);
            }
            Event::Stop(abort) => {
                if let Some((pe, reason)) = abort
                    && !self.done
                {
                    self.fail(pe, reason);
                }
                if self.stopping.is_none() {
                    tracing::debug!(addr = %self.addr, "rendezvous stopping");
                    for c in self.conns.values() {
                        let _ = c.stream.shutdown(Shutdown::Write);
                    }
                    self.stopping = Some(Instant::now() + LINGER);
                }
            }
        }
    }

    fn on_msg(&mut self, id: u64, msg: ToServer) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        if conn.rejected {
            return;
        }
        let Some(pe) = conn.pe else {
            return match msg {
                ToServer::Hello {
                    magic,
                    version,
                    pe,
                    n_pes,
                } => self.on_hello(id, magic, version, pe, n_pes),
                _ => self.reject(id, "the first message must be Hello".into()),
            };
        };
        if conn.cycle != self.cycle {
            // Its PE finalized that cycle (all did, or it would still be
            // current): nothing it says now belongs to this one.
            tracing::debug!(pe, cycle = conn.cycle, now = self.cycle, ?msg, "rendezvous: message of an earlier cycle ignored");
            return;
        }
        let p = pe as usize;
        match msg {
            ToServer::Hello { .. } => self.fail(pe, format!("PE {pe} sent a second Hello")),
            ToServer::Abort { reason } => self.fail(pe, reason),
            _ if self.failure.is_some() || self.done => {}
            ToServer::Gather {
                round,
                timeout_ms,
                data,
            } => {
                if self.byes[p] {
                    self.fail(
                        pe,
                        format!("PE {pe} called allgather/barrier after finalize"),
                    );
                } else if round != self.round {
                    self.fail(
                        pe,
                        format!(
                            "collective mismatch: PE {pe} entered allgather/barrier round \
                             {round} while the job is at round {}",
                            self.round
                        ),
                    );
                } else if let Some(q) = self.byes.iter().position(|&b| b) {
                    self.fail(
                        pe,
                        format!(
                            "collective mismatch: PE {pe} called allgather/barrier (round \
                             {round}) while PE {q} called finalize; every PE must make the \
                             same collective calls in the same order"
                        ),
                    );
                } else if self.blobs[p].is_some() {
                    self.fail(pe, format!("PE {pe} sent allgather round {round} twice"));
                } else {
                    self.blobs[p] = Some(data);
                    self.arrived[p] = Some(Arrival::now(timeout_ms));
                    self.n_gathered += 1;
                    if self.n_gathered == self.n {
                        self.complete_round();
                    }
                }
            }
            ToServer::Bye { timeout_ms } => {
                if self.byes[p] {
                    self.fail(pe, format!("PE {pe} called finalize twice"));
                } else if let Some(q) = self.blobs.iter().position(Option::is_some) {
                    self.fail(
                        pe,
                        format!(
                            "collective mismatch: PE {pe} called finalize while PE {q} is in \
                             allgather/barrier round {}; every PE must make the same \
                             collective calls in the same order",
                            self.round
                        ),
                    );
                } else {
                    self.byes[p] = true;
                    self.arrived[p] = Some(Arrival::now(timeout_ms));
                    self.n_byes += 1;
                    if let Some(c) = self.conns.get_mut(&id) {
                        c.bye = true;
                    }
                    tracing::debug!(pe, n_byes = self.n_byes, cycle = self.cycle, "rendezvous: Bye");
                    if self.n_byes == self.n {
                        self.complete_cycle();
                    }
                }
            }
        }
    }

    /// Every PE of the current cycle sent Bye: ByeAck to all of them; then
    /// the next cycle (repeated init) or the end.
    fn complete_cycle(&mut self) {
        self.broadcast(&wire::bye_ack());
        let cycle = self.cycle;
        for c in self.conns.values().filter(|c| c.cycle == cycle) {
            let _ = c.stream.shutdown(Shutdown::Write);
        }
        if !self.repeated_init {
            self.done = true;
            return;
        }
        self.cycle += 1;
        self.joined.fill(false);
        self.n_joined = 0;
        self.round = 0;
        self.blobs.fill(None);
        self.n_gathered = 0;
        self.byes.fill(false);
        self.n_byes = 0;
        self.arrived.fill(None);
        self.all_joined_at = None;
        self.connect_deadline = None;
        self.first_joined = None;
        tracing::debug!(addr = %self.addr, cycle = self.cycle, "rendezvous: every PE finalized; next init/finalize cycle open");
    }

    fn on_hello(&mut self, id: u64, magic: u32, version: u16, pe: i32, n_pes: i32) {
        let n = self.n;
        let addr = self.addr;
        let peer = self.conns[&id].peer;
        if self.done {
            // This server is ending (its one cycle is over): a PE that
            // re-initializes before PE 0 binds the next server. Close
            // unanswered; the PE reconnects (see `Bootstrap::connect`).
            tracing::debug!(%peer, pe, "rendezvous: Hello after the end; closing unanswered");
            if let Some(c) = self.conns.get_mut(&id) {
                let _ = c.stream.shutdown(Shutdown::Both);
                c.rejected = true;
            }
            return;
        }
        let refusal = if magic != wire::MAGIC || version != wire::VERSION {
            Some(format!(
                "protocol mismatch: the peer at {peer} speaks magic {magic:#x} version \
                 {version}, this rendezvous {:#x} version {} (are all PEs and cpnet-run \
                 built from the same cpnet?)",
                wire::MAGIC,
                wire::VERSION
            ))
        } else if n_pes as i64 != n as i64 {
            Some(format!(
                "this rendezvous at {addr} serves a job of {n} PEs, but PE {pe} (from {peer}) \
                 believes there are {n_pes} (check -n / CPNET_N_PES / the launcher's job size, \
                 and that CPNET_BOOTSTRAP_ADDR is not shared by two jobs)"
            ))
        } else if pe < 0 || pe as usize >= n {
            Some(format!(
                "PE number {pe} (from {peer}) is outside 0..{n} for the job at {addr}"
            ))
        } else if self.joined[pe as usize] {
            let other = self.conns.values().find(|c| c.pe == Some(pe)).map_or_else(
                || "a connection now closed".to_owned(),
                |c| c.peer.to_string(),
            );
            Some(format!(
                "PE {pe} has already joined the rendezvous at {addr} (from {other}); two \
                 processes with the same PE number, or a stale process of an earlier job using \
                 the same CPNET_BOOTSTRAP_ADDR?"
            ))
        } else {
            None
        };
        if let Some(reason) = refusal {
            tracing::warn!(%peer, "rendezvous: rejecting a PE: {reason}");
            return self.reject(id, reason);
        }
        // A PE whose process ended cannot join this cycle: it can never
        // complete.
        let gone = (0..n).find(|&q| q as i32 != pe && !self.joined[q] && self.exited[q].is_some());
        if let Some(q) = gone
            && self.failure.is_none()
        {
            let how = self.exited[q].clone().unwrap_or_default();
            let reason = self.gone_reason(&how, pe);
            self.fail(q as i32, reason);
        }
        if let Some(f) = &self.failure {
            // Too late: tell it why the job is over.
            let frame = wire::aborted(f.pe, &f.reason);
            if let Some(c) = self.conns.get_mut(&id) {
                let _ = send_frame(&mut c.stream, &frame);
                let _ = c.stream.shutdown(Shutdown::Write);
                c.rejected = true;
            }
            return;
        }
        self.joined[pe as usize] = true;
        self.n_joined += 1;
        if self.n_joined == n {
            self.all_joined_at = Some(Instant::now());
        }
        if self.first_joined.is_none() {
            self.first_joined = Some(pe);
        }
        if self.connect_deadline.is_none() {
            self.connect_deadline = Some(Instant::now() + self.connect_timeout);
        }
        let cycle = self.cycle;
        let c = self.conns.get_mut(&id).expect("conn looked up above");
        c.pe = Some(pe);
        c.cycle = cycle;
        if let Err(e) = send_frame(&mut c.stream, &wire::welcome(cycle)) {
            // Its reader will report the closed connection.
            tracing::debug!(pe, "rendezvous: Welcome not sent: {e}");
        }
        tracing::debug!(pe, %peer, n_joined = self.n_joined, cycle, "rendezvous: PE joined");
    }

    /// Why a cycle cannot complete: a PE whose process ended `how` has not
    /// joined it, and PE `other` has (or is joining).
    fn gone_reason(&self, how: &str, other: i32) -> String {
        if self.cycle == 0 {
            format!("{how} without joining the rendezvous")
        } else {
            format!(
                "{how} without joining the job's init #{} at the rendezvous, which PE {other} \
                 started (every PE must call init and finalize as often as the others)",
                self.cycle + 1
            )
        }
    }

    /// The owner says PE `pe`'s process ended.
    fn on_exited(&mut self, pe: i32, how: String) {
        let Some(p) = usize::try_from(pe).ok().filter(|&p| p < self.n) else {
            return;
        };
        self.exited[p] = Some(how.clone());
        if self.done || self.failure.is_some() || self.joined[p] {
            return;
        }
        // The first cycle cannot complete without it; a later one only
        // once another PE started it (else the job may just be over).
        let other = self.first_joined.filter(|_| self.n_joined > 0);
        if self.cycle == 0 || other.is_some() {
            let reason = self.gone_reason(&how, other.unwrap_or(-1));
            self.fail(pe, reason);
        }
    }

    fn reject(&mut self, id: u64, reason: String) {
        if let Some(c) = self.conns.get_mut(&id) {
            let _ = send_frame(&mut c.stream, &wire::reject(&reason));
            let _ = c.stream.shutdown(Shutdown::Write);
            c.rejected = true;
        }
    }

    fn complete_round(&mut self) {
        let blobs: Vec<Vec<u8>> = self
            .blobs
            .iter_mut()
            .map(|b| b.take().unwrap_or_default())
            .collect();
        self.n_gathered = 0;
        self.arrived.fill(None);
        let round = self.round;
        self.round += 1;
        match wire::gathered(round, &blobs) {
            Ok(frame) => {
                tracing::debug!(
                    round,
                    bytes = frame.len(),
                    "rendezvous: allgather round complete"
                );
                self.broadcast(&frame);
            }
            Err(e) => self.fail(-1, format!("allgather round {round}: {e}")),
        }
    }

    fn on_closed(&mut self, id: u64, why: CloseKind) {
        // `Closed` is the reader's last message: the join is immediate.
        if let Some(r) = self.readers.remove(&id) {
            let _ = r.join();
        }
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let Some(pe) = conn.pe.filter(|_| !conn.rejected) else {
            tracing::debug!(peer = %conn.peer, "rendezvous: unjoined connection closed");
            return;
        };
        if conn.bye || conn.cycle != self.cycle || self.failure.is_some() || self.done {
            tracing::debug!(pe, cycle = conn.cycle, "rendezvous: connection closed");
            return;
        }
        match why {
            CloseKind::Protocol(msg) => {
                self.fail(pe, format!("protocol error on PE {pe}'s connection: {msg}"));
            }
            CloseKind::Eof => self.lost.push((
                pe,
                Instant::now() + self.lost_peer_delay,
                format!("connection to PE {pe} lost (process died?)"),
            )),
            CloseKind::Error(e) => self.lost.push((
                pe,
                Instant::now() + self.lost_peer_delay,
                format!("connection to PE {pe} lost (process died?): {e}"),
            )),
        }
    }

    fn check_deadlines(&mut self, now: Instant) {
        if let Some(i) = self.lost.iter().position(|&(_, at, _)| at <= now) {
            let (pe, _, reason) = self.lost.remove(i);
            self.fail(pe, reason);
        }
        let overdue = self.connect_deadline.is_some_and(|d| now >= d);
        if self.n_joined < self.n && self.failure.is_none() && !self.done && overdue {
            let missing: Vec<usize> = (0..self.n).filter(|&k| !self.joined[k]).collect();
            let who = pe_list(&missing);
            let reason = match (self.cycle, self.first_joined) {
                (c, Some(first)) if c > 0 => format!(
                    "{who} never reached the rendezvous at {} for the job's init #{} within {}s \
                     of PE {first} (does every PE call init and finalize as often as the others? \
                     raise CPNET_CONNECT_TIMEOUT if a PE's work between finalize and init is \
                     slow)",
                    self.addr,
                    c + 1,
                    secs(self.connect_timeout)
                ),
                _ => format!(
                    "{who} never reached the rendezvous at {} within {}s (did it start? is \
                     CPNET_BOOTSTRAP_ADDR reachable from its host? raise CPNET_CONNECT_TIMEOUT \
                     if startup is slow)",
                    self.addr,
                    secs(self.connect_timeout)
                ),
            };
            self.fail(missing[0] as i32, reason);
        }
        self.check_wait_timeouts(now);
    }

    /// Fails the job when a PE has waited in the collective in progress
    /// for longer than its wait timeout, naming the PEs that have not
    /// arrived. A PE's clock starts at its arrival, or when the last PE
    /// joined the cycle if that was later; none runs while a lost
    /// connection's notice is held back (it says more).
    fn check_wait_timeouts(&mut self, now: Instant) {
        let Some(all_joined) = self.all_joined_at else {
            return;
        };
        if self.failure.is_some() || self.done || !self.lost.is_empty() {
            return;
        }
        let overdue = self
            .arrived
            .iter()
            .enumerate()
            .filter_map(|(p, a)| {
                let a = (*a)?;
                let deadline = a.at.max(all_joined).checked_add(a.timeout?)?;
                Some((deadline, p, a))
            })
            .filter(|&(deadline, _, _)| now >= deadline)
            .min_by_key(|&(deadline, p, _)| (deadline, p));
        let Some((_, p, a)) = overdue else {
            return;
        };
        let finalize = self.n_byes > 0;
        let missing: Vec<usize> = if finalize {
            (0..self.n).filter(|&k| !self.byes[k]).collect()
        } else {
            (0..self.n).filter(|&k| self.blobs[k].is_none()).collect()
        };
        if missing.is_empty() {
            // Unreachable: a complete collective clears `arrived`.
            return;
        }
        let what = if finalize {
            "finalize".to_owned()
        } else {
            format!("allgather/barrier round {}", self.round)
        };
        let init = if self.cycle > 0 {
            format!(" of the job's init #{}", self.cycle + 1)
        } else {
            String::new()
        };
        let waited = now.saturating_duration_since(a.at);
        let since = if all_joined > a.at {
            format!(
                ", {:.1}s since the last PE joined",
                now.saturating_duration_since(all_joined).as_secs_f64()
            )
        } else {
            String::new()
        };
        let timeout = a.timeout.map_or_else(String::new, secs);
        let who = pe_list(&missing);
        let (are_they, blame) = match missing.as_slice() {
            [only] => ("Is it", *only as i32),
            _ => ("Are they", -1),
        };
        let reason = format!(
            "collective timeout: PE {p} gave up on {what}{init} after waiting {:.1}s{since} (its \
             wait timeout: {timeout}s); not arrived: {who} ({} of {} PEs had). {are_they} \
             stuck in a long computation, deadlocked, or in a different collective call? Raise \
             CPNET_COLLECTIVE_TIMEOUT (seconds; 0 waits forever) if this wait is legitimate",
            waited.as_secs_f64(),
            self.n - missing.len(),
            self.n,
        );
        self.fail(blame, reason);
    }

    /// The first failure is broadcast to every joined PE, the blamed one
    /// included (it may be alive: a collective mismatch, or an owner's wrong
    /// guess; a PE that sent Abort keeps its own reason); later ones are only
    /// logged.
    fn fail(&mut self, pe: i32, reason: String) {
        if let Some(first) = &self.failure {
            tracing::debug!(pe, %reason, first = %first, "rendezvous: later failure not broadcast");
            return;
        }
        tracing::info!(addr = %self.addr, "rendezvous: {}", failure_text(pe, &reason));
        self.broadcast(&wire::aborted(pe, &reason));
        self.failure = Some(PeerFailure { pe, reason });
        self.lost.clear();
    }

    /// Sends `frame` to every connection joined in the current cycle.
    fn broadcast(&mut self, frame: &[u8]) {
        for c in self.conns.values_mut() {
            if c.rejected || c.pe.is_none() || c.cycle != self.cycle {
                continue;
            }
            if let Err(e) = send_frame(&mut c.stream, frame) {
                // Its reader thread reports the connection closed.
                tracing::debug!(pe = ?c.pe, "rendezvous: send failed: {e}");
            }
        }
    }

    fn finished(&self, now: Instant) -> bool {
        let joined_open = self
            .conns
            .values()
            .filter(|c| c.pe.is_some() && !c.rejected)
            .count();
        if self.done {
            return true;
        }
        if let Some(at) = self.stopping {
            return self.conns.is_empty() || now >= at;
        }
        // With repeated init, only the owner ends it (a PE may init again).
        // Otherwise after a failure, stay while a joined PE is connected,
        // and while a late PE could still come (to tell it the job is over).
        !self.repeated_init
            && self.failure.is_some()
            && joined_open == 0
            && (self.n_joined == self.n || self.connect_deadline.is_none_or(|d| now >= d))
    }

    fn close_all(&mut self) {
        for (_, c) in self.conns.drain() {
            // Wakes the reader thread (its read returns 0).
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        for (_, r) in self.readers.drain() {
            let _ = r.join();
        }
        tracing::debug!(addr = %self.addr, "rendezvous server ended");
    }
}

/// "PE 3", or "3 PEs (1, 4, 7)" (at most 16 named).
fn pe_list(pes: &[usize]) -> String {
    if let [only] = pes {
        return format!("PE {only}");
    }
    let list: Vec<String> = pes.iter().take(16).map(|k| k.to_string()).collect();
    let more = if pes.len() > 16 { ", ..." } else { "" };
    format!("{} PEs ({}{more})", pes.len(), list.join(", "))
}

/// A server-side connection's reader: forwards every message, then exactly
/// one `Closed`.
fn conn_reader(id: u64, mut stream: TcpStream, tx: mpsc::Sender<Event>) {
    let mut max = wire::HANDSHAKE_MAX;
    let why = loop {
        match wire::read_frame(&mut stream, max) {
            Ok(Some((kind, body))) => match wire::decode_to_server(kind, body) {
                Ok(msg) => {
                    max = wire::MAX_FRAME;
                    if tx.send(Event::Msg(id, msg)).is_err() {
                        return;
                    }
                }
                Err(e) => break CloseKind::Protocol(e),
            },
            Ok(None) => break CloseKind::Eof,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                break CloseKind::Protocol(e.to_string());
            }
            Err(e) => break CloseKind::Error(e),
        }
    };
    let _ = tx.send(Event::Closed(id, why));
}
