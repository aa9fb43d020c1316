//! The proxy service loop: the part of cpnet that plays the GPU's command
//! processor (ComP-Net paper §4.2). A [`Service`] owns a fixed set of queues,
//! polls each with acquire (C1 in `cmd.h`), decodes and validates every
//! command, hands it to a [`Transport`] without ever blocking on it, and
//! completes it (C4) when the transport reports it complete.
//!
//! Ordering the service enforces itself, whatever the transport does:
//! after a FENCE, QUIET or BARRIER_ALL of a queue, no later command of that
//! queue is taken until every earlier one is complete. That is stronger than
//! OpenSHMEM's fence (per-PE ordering) and makes put-then-fence-then-put hold
//! on providers without write-after-write ordering (rxm with atomics).
//!
//! Queues in GPU memory (`CPNET_QUEUE_MEM=device`) are served the same way
//! on host shadows, with a [`QueueMirror`] copying around each pass
//! ([`Service::with_mirror`]; the protocol is in [`crate::mirror`]). Without
//! a mirror nothing of it runs.

use cpnet_device::layout::{CPNET_F_BLOCKING, CPNET_STATUS_BYTES, CPNET_STATUS_OFF_CLAIM_GEN, Cmd, ErrorCode};
use cpnet_device::ring::{Consumer, Outcome, QueueMem};
use cpnet_device::sync::{Ordering, Spin, Words};

use crate::decode::{Limits, Op, PutSrc, decode};
use crate::mirror::{MirrorError, QueueMirror};

/// Passes between two refreshes of the list of queues a service polls
/// (claimed ones, and any with work in flight): a newly claimed queue waits
/// at most this many passes for its first poll.
pub const ACTIVE_REFRESH_PASSES: u32 = 64;

/// Commands a pass takes from one queue at most, so that one busy queue
/// cannot starve the others: a default-depth ring's worth (a transport
/// that batches sends what a pass took together, [`Transport::end_pass`]).
pub const TAKE_PER_PASS: u32 = 64;

/// With a claim signal ([`Service::set_claim_signal`]): the least time
/// between two rebuilds of the active-queue list that no claim asked for
/// (they drop released queues from it).
pub const CLAIM_SIGNAL_REFRESH: std::time::Duration = std::time::Duration::from_millis(1);

/// With queues in GPU memory ([`Service::with_mirror`]): the least time
/// between two pulls of every producer block (the claims the active-list
/// refresh reads), on top of [`ACTIVE_REFRESH_PASSES`]. Each pull is one
/// copy per queue of the thread plus a wait; an idle thread passes fast, so
/// counting passes alone made the idle threads of a GPU PE copy without
/// pause and slow the busy thread's copies (a blocking put 150 µs with 4
/// threads, 51 µs with 1, on an H200). A newly claimed queue waits at most
/// this long for its first poll.
pub const MIRROR_REFRESH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

/// For a service with an idle spin ([`Service::set_idle_spin`], GPU PEs):
/// the idle time during which [`Service::run_with`] polls without giving
/// up its CPU, one spin-loop hint per pass. It is far longer than the gap
/// between two commands of a busy work-group (a few microseconds): a GPU
/// PE's proxy thread is meant to own its core while commands flow.
pub const IDLE_SPIN_FOR: std::time::Duration = std::time::Duration::from_micros(50);

/// How a service paces its polls of queues that a GPU writes over PCIe
/// ([`Service::set_pacing`]; GPU PEs with queues in mapped host memory).
///
/// Two effects measured on an H200 host (`cpnet-gpu-bench`, docs/results.md
/// "Session 8"): a CPU thread that reads a slot line while the GPU is
/// writing it slows that write, so threads with few queues each, which poll
/// each line every few hundred nanoseconds, served fewer commands with more
/// threads (8 threads over 132 work-groups: ~10 M/s, 2 threads: ~20 M/s);
/// and a thread whose every queue holds a command waits on one cache miss
/// per slot and one per control block, one after the other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pacing {
    /// Spin-loop hints (`pause`) after polling a queue that had nothing new,
    /// so each line is polled less often (0: none).
    pub empty_poll_pauses: u32,
    /// While the last pass took a command from at least 3/4 of the active
    /// queues (their next slots are likely written), prefetch the next slot
    /// and the control block of the queue this many places ahead in the
    /// pass (0: never). Not when the queues are mostly idle: reading lines
    /// the GPU is about to write is what the pauses avoid.
    pub prefetch_ahead: usize,
}

/// The pacing of a GPU PE's proxy threads: 3 pauses after an empty poll,
/// prefetch 16 queues ahead. Measured on an H200 host against the same
/// loop without pacing, three sweeps each in one batch (docs/results.md,
/// "Session 8"): 8 threads over 132 work-groups 9.7-10.5 -> 21.4-22.2 M/s,
/// over 1024 37-39 -> 94-95 M/s; 1 thread over 1024 work-groups 20-24 ->
/// 44-47 M/s; one work-group's round trip unchanged within noise.
pub const GPU_PACING: Pacing = Pacing { empty_poll_pauses: 3, prefetch_ahead: 16 };

/// Idle time after which [`Service::run_with`] starts sleeping between
/// passes (when it is given a sleep).
pub const IDLE_SLEEP_AFTER: std::time::Duration = std::time::Duration::from_millis(5);

/// Which command an outcome belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    /// Index of the queue in its service.
    pub queue: u32,
    /// The command's seq in that queue.
    pub seq: u64,
}

/// What a transport did with a submitted operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submit {
    /// Finished already (local target, or an error found at posting).
    Done(Outcome),
    /// Posted; [`Transport::progress`] reports it later.
    Pending,
    /// The transport has no room now (FI_EAGAIN): submit again later.
    Busy,
}

/// An operation a transport finished after posting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    /// Which command.
    pub tag: Tag,
    /// How it ended.
    pub outcome: Outcome,
    /// The operation, so a failure report can name it, its PE and address.
    pub op: Op,
}

/// Carries validated operations to their target PEs. Implementations never
/// block: an operation either finishes at once, is posted, or is refused
/// for now.
///
/// A transport lives on the service thread that created it (libfabric
/// objects opened with `FI_THREAD_DOMAIN` are used from one thread), so the
/// trait does not require `Send`: build the transport inside the thread.
pub trait Transport {
    /// Start `op` (already validated) for `tag`.
    fn submit(&mut self, tag: Tag, op: &Op) -> Submit;
    /// Drive progress (manual-progress providers need it, also for the
    /// operations other PEs target at us); append finished operations to `done`.
    fn progress(&mut self, done: &mut Vec<Finished>);
    /// The pass over the queues is over: send what was gathered during it
    /// (a transport that batches operations sends its batches here; by
    /// default nothing). `waits`: the pass took a command whose work-group
    /// waits for completions (a blocking command, or a fence, quiet or
    /// barrier that drains its queue), so nothing should be held back.
    /// Finished operations go to `done`.
    fn end_pass(&mut self, waits: bool, done: &mut Vec<Finished>) {
        let _ = (waits, done);
    }
    /// Whether a barrier across all PEs has completed, starting it if
    /// `start` (called repeatedly until it returns true).
    fn barrier(&mut self, start: bool) -> Result<bool, ErrorCode>;
    /// A failure that ends this PE, once: a peer the fabric cannot reach
    /// ([`crate::reach`]), as a report naming the peer, an operation, the
    /// provider and the endpoints. Called every [`ACTIVE_REFRESH_PASSES`]
    /// passes; the service publishes the report in its [`Heartbeat`], on
    /// which the runtime's watchdog aborts the PE. By default none.
    fn fatal(&mut self) -> Option<String> {
        None
    }
}

/// A rejected or failed command, as the proxy reports it to the host.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("PE {my_pe} work-group {wg} (queue {queue}, seq {seq}): {op} to PE {pe} at heap+{addr:#x} ({size} bytes): {code}")]
pub struct CommandError {
    /// The PE whose proxy saw it.
    pub my_pe: i32,
    /// The work-group that issued it (the queue's owner).
    pub wg: u32,
    /// Queue index in the service.
    pub queue: u32,
    /// The command's seq.
    pub seq: u64,
    /// The opcode's name.
    pub op: &'static str,
    /// Target PE as sent.
    pub pe: i32,
    /// The address concerned (dst, or src for gets).
    pub addr: u64,
    /// Size as sent.
    pub size: u64,
    /// Why.
    pub code: ErrorCode,
}

/// What a service thread is doing, published for the PE's watchdog
/// (`CPNET_PROXY_STALL_TIMEOUT`, runtime/src/watchdog.rs): a pass counter
/// that moves while the thread makes progress, and the step it is in (which
/// transport call, for which queue, command, PE and address).
///
/// Every access is relaxed: the watchdog only compares the counter between
/// two looks and prints the rest, it orders nothing by them. While the
/// thread runs, a look at the step words may mix two steps; once it is
/// stuck (the only time the watchdog prints them) they are stable.
///
/// Aligned to 128 bytes (two cache lines, the unit of the spatial
/// prefetcher) so that the heartbeats of a PE's threads, allocated one after
/// the other, never share a line: each thread writes its own every pass.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Heartbeat {
    passes: std::sync::atomic::AtomicU64,
    taken: std::sync::atomic::AtomicU64,
    /// `phase | queue << 8 | opcode << 32 | subop << 40`.
    step: std::sync::atomic::AtomicU64,
    /// `pe as u32 | (seq as u32) << 32`.
    step_pe_seq: std::sync::atomic::AtomicU64,
    /// Target heap offset of the command in `step`.
    step_addr: std::sync::atomic::AtomicU64,
    /// The transport's fatal report ([`Transport::fatal`]), set once.
    fatal: std::sync::OnceLock<String>,
}

/// Where a service thread is, as [`Heartbeat::step`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not started yet (connecting), or between transport calls.
    Polling,
    /// Inside [`Transport::progress`].
    Progress,
    /// Inside [`Transport::submit`] of the command in [`Step`].
    Submit,
    /// Inside [`Transport::barrier`] for the queue in [`Step`].
    Barrier,
    /// Inside a copy or wait of the [`QueueMirror`] (queues in GPU memory),
    /// or stopped there for good after one failed (logged).
    Mirror,
    /// Out of its loop (stopped or draining is over).
    Stopped,
}

/// A snapshot of a [`Heartbeat`]'s step, for a stall report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The transport call the thread is in.
    pub phase: Phase,
    /// Queue index in the service (Submit, Barrier).
    pub queue: u32,
    /// The command, rebuilt from its opcode and sub-operation (Submit).
    pub op: &'static str,
    /// Its target PE (Submit).
    pub pe: i32,
    /// Low 32 bits of its seq (Submit, Barrier).
    pub seq: u32,
    /// Its target heap offset (Submit).
    pub addr: u64,
}

impl Heartbeat {
    /// Poll passes completed so far (moves every pass, idle or not).
    pub fn passes(&self) -> u64 {
        self.passes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Commands taken from the queues so far.
    pub fn taken(&self) -> u64 {
        self.taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The transport's fatal report, once it made one ([`Transport::fatal`]:
    /// a peer the fabric cannot reach). The watchdog aborts the PE with it.
    pub fn fatal(&self) -> Option<&str> {
        self.fatal.get().map(String::as_str)
    }

    /// What the thread was last doing.
    pub fn step(&self) -> Step {
        use std::sync::atomic::Ordering::Relaxed;
        let w = self.step.load(Relaxed);
        let ps = self.step_pe_seq.load(Relaxed);
        let phase = match w & 0xff {
            1 => Phase::Progress,
            2 => Phase::Submit,
            3 => Phase::Barrier,
            4 => Phase::Stopped,
            5 => Phase::Mirror,
            _ => Phase::Polling,
        };
        let probe = Cmd { opcode: (w >> 32) as u8, subop: (w >> 40) as u8, ..Cmd::nop() };
        Step {
            phase,
            queue: ((w >> 8) & 0xff_ffff) as u32,
            op: probe.op_name(),
            pe: ps as u32 as i32,
            seq: (ps >> 32) as u32,
            addr: self.step_addr.load(Relaxed),
        }
    }

    #[inline]
    fn set_phase(&self, phase: Phase, queue: usize) {
        let code = match phase {
            Phase::Polling => 0,
            Phase::Progress => 1,
            Phase::Submit => 2,
            Phase::Barrier => 3,
            Phase::Stopped => 4,
            Phase::Mirror => 5,
        };
        self.step.store(code | ((queue as u64 & 0xff_ffff) << 8), std::sync::atomic::Ordering::Relaxed);
    }

    #[inline]
    fn set_submit(&self, queue: usize, seq: u64, cmd: &Cmd) {
        use std::sync::atomic::Ordering::Relaxed;
        self.step_pe_seq.store(cmd.pe as u32 as u64 | (seq << 32), Relaxed);
        self.step_addr.store(cmd.target_addr(), Relaxed);
        self.step.store(2 | ((queue as u64 & 0xff_ffff) << 8) | (u64::from(cmd.opcode) << 32) | (u64::from(cmd.subop) << 40), Relaxed);
    }
}

/// A fault injected for the reliability tests (docs/reliability.md): the
/// thread blocks inside the submit of its `after`-th command, as if a
/// transport call hung, until `release()` returns true.
struct InjectedStall {
    after: u64,
    release: Box<dyn FnMut() -> bool + Send>,
}

struct QueueState {
    consumer: Consumer,
    /// A FENCE/QUIET/BARRIER was taken: take nothing more until every
    /// earlier command is complete (and the barrier, if any, is done).
    drain: Option<Drain>,
    /// A command refused with Busy, to submit again first (boxed: rare,
    /// and it would triple the size of the state a pass walks through).
    retry: Option<Box<(u64, Op, Cmd)>>,
    /// The queue's payload slots (`cmd.h` P0), if its producers have them.
    payload: Option<PayloadSlots>,
}

/// Where one queue's payload slots are (`cmd.h` P0): slot `i` (of the
/// queue's depth) is `slot_bytes` at `host + i * slot_bytes` in this
/// process, `dev + i * slot_bytes` for the GPU (where mapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadSlots {
    /// Address of slot 0 in this process.
    pub host: usize,
    /// Address of slot 0 as the GPU sees it; `None` where this process has
    /// no GPU mapping of the slots (the proxy daemon).
    pub dev: Option<u64>,
    /// Bytes per slot.
    pub slot_bytes: u64,
}

#[derive(Clone, Copy)]
enum Drain {
    Fence,
    Barrier { seq: u64, started: bool },
}

/// One proxy service thread's state: its queues and its transport.
pub struct Service<T: Transport> {
    queues: Vec<QueueState>,
    transport: T,
    limits: Limits,
    my_pe: i32,
    done: Vec<Finished>,
    errors: Vec<CommandError>,
    /// Where errors go as they happen, when set (the host API reads it
    /// while the PE runs); otherwise they wait in `errors`.
    sink: Option<std::sync::Arc<std::sync::Mutex<Vec<CommandError>>>>,
    /// Queues polled each pass: claimed, or with work in flight; refreshed
    /// every [`ACTIVE_REFRESH_PASSES`] passes, or with a claim signal when
    /// a queue is claimed, so a pool of 1024 queues with a few claimed
    /// costs a few polls per pass, not 1024.
    active: Vec<usize>,
    /// The status block's claim generation, when the queues' producers
    /// signal their claims (`cpnet_status_t.claim_gen`), and its last value.
    claim_signal: Option<(Words, u32)>,
    /// When `active` was last rebuilt.
    refreshed: Option<std::time::Instant>,
    /// Spin this long when idle before backing off ([`Service::set_idle_spin`]).
    idle_spin: Option<std::time::Duration>,
    /// Poll pacing ([`Service::set_pacing`]; none by default).
    pacing: Pacing,
    /// The last pass took a command from at least 3/4 of the active queues.
    saturated: bool,
    /// This pass took a command whose work-group waits for completions
    /// ([`Transport::end_pass`]).
    waits: bool,
    /// Published progress, for the watchdog.
    heartbeat: std::sync::Arc<Heartbeat>,
    /// Passes over the service's life (the heartbeat's counter, and the
    /// clock of the active-queue refresh).
    passes: u64,
    /// Commands taken over the service's life.
    taken: u64,
    stall: Option<InjectedStall>,
    /// The queues live in GPU memory and `queues` are their host shadows;
    /// `None` for queues the service reads directly (nothing extra runs).
    mirror: Option<QueueMirror>,
    /// The mirror failed: the service takes and completes nothing more.
    broken: Option<MirrorError>,
    /// When the mirror last pulled every producer block.
    producers_pulled: Option<std::time::Instant>,
}

impl<T: Transport> Service<T> {
    /// A service over `queues` (each attached as its consumer).
    pub fn new(queues: Vec<QueueMem>, transport: T, limits: Limits, my_pe: i32) -> Service<T> {
        let queues = queues
            .into_iter()
            .map(|q| QueueState { consumer: Consumer::new(q), drain: None, retry: None, payload: None })
            .collect();
        Service {
            queues,
            transport,
            limits,
            my_pe,
            done: Vec::new(),
            errors: Vec::new(),
            sink: None,
            active: Vec::new(),
            claim_signal: None,
            refreshed: None,
            idle_spin: None,
            pacing: Pacing::default(),
            saturated: false,
            waits: false,
            heartbeat: std::sync::Arc::default(),
            passes: 0,
            taken: 0,
            stall: None,
            mirror: None,
            broken: None,
            producers_pulled: None,
        }
    }

    /// A service over queues in GPU memory: its consumers work on the
    /// mirror's host shadows, and each pass copies slots in and control
    /// blocks out around the polling ([`crate::mirror`]). If a copy fails
    /// the error is logged and the service stops taking and completing
    /// commands and stops counting passes, with [`Phase::Mirror`] in its
    /// heartbeat, so the PE's watchdog reports it (and the work-groups' waits
    /// time out, `CPNET_WAIT_TIMEOUT`).
    pub fn with_mirror(mirror: QueueMirror, transport: T, limits: Limits, my_pe: i32) -> Service<T> {
        let mut s = Service::new(mirror.shadows(), transport, limits, my_pe);
        s.mirror = Some(mirror);
        s
    }

    /// Give the queues their payload slots (`slots[i]` for queue `i`, as
    /// passed to [`Service::new`]): commands flagged `CPNET_F_PAYLOAD` then
    /// reach the transport as [`PutSrc::Host`] pointing at their slot, and
    /// are rejected with `CPNET_E_BAD_SIZE` when larger than a slot (with
    /// `CPNET_E_BAD_OP` on a queue without slots, as before this call).
    ///
    /// # Safety
    /// Each `Some` describes `depth * slot_bytes` bytes of memory (depth of
    /// that queue) readable from this thread at `host` and from the GPU at
    /// `dev`, alive as long as the service and its transport, and written
    /// by the queue's producers only as `cmd.h` P0 allows.
    ///
    /// # Panics
    /// If `slots.len()` differs from the number of queues.
    pub unsafe fn set_payload(&mut self, slots: Vec<Option<PayloadSlots>>) {
        assert_eq!(slots.len(), self.queues.len(), "payload slots per queue");
        for (q, p) in self.queues.iter_mut().zip(slots) {
            q.payload = p;
        }
    }

    /// Turn a decoded put's [`PutSrc::Payload`] into the [`PutSrc::Host`] of
    /// command `seq`'s slot of queue `qi`; other operations pass through.
    fn locate_payload(&self, qi: usize, seq: u64, op: Op) -> Result<Op, ErrorCode> {
        let locate = |size: u64| -> Result<PutSrc, ErrorCode> {
            let Some(p) = self.queues[qi].payload else { return Err(ErrorCode::BadOp) };
            if size > p.slot_bytes {
                return Err(ErrorCode::BadSize);
            }
            let off = (seq & self.queues[qi].consumer.mem().geometry().mask()) * p.slot_bytes;
            Ok(PutSrc::Host { host: p.host + off as usize, dev: p.dev.map(|d| d + off) })
        };
        Ok(match op {
            Op::Put { pe, dst, src: PutSrc::Payload, size } => Op::Put { pe, dst, src: locate(size)?, size },
            Op::PutSignal { pe, dst, src: PutSrc::Payload, size, sig, signal, op } => {
                Op::PutSignal { pe, dst, src: locate(size)?, size, sig, signal, op }
            }
            op => op,
        })
    }

    /// The mirror, for a service over queues in GPU memory.
    pub fn mirror(&self) -> Option<&QueueMirror> {
        self.mirror.as_ref()
    }

    /// Why the mirror stopped this service, if it did.
    pub fn mirror_failure(&self) -> Option<&MirrorError> {
        self.broken.as_ref()
    }

    /// Run one mirror step over `queues` (the active list when `None`),
    /// under [`Phase::Mirror`]; a failure breaks the service (logged once).
    /// False if the service is (now) broken.
    fn mirror_step(
        &mut self,
        queues: Option<&[usize]>,
        step: impl FnOnce(&mut QueueMirror, &[usize]) -> Result<(), MirrorError>,
    ) -> bool {
        let Some(m) = self.mirror.as_mut() else { return true };
        if self.broken.is_some() {
            return false;
        }
        self.heartbeat.set_phase(Phase::Mirror, 0);
        let r = step(m, queues.unwrap_or(&self.active));
        match r {
            Ok(()) => {
                self.heartbeat.set_phase(Phase::Polling, 0);
                true
            }
            Err(e) => {
                tracing::error!(
                    "PE {}: {e}; this proxy thread takes and completes no more commands (its queues are in GPU memory, CPNET_QUEUE_MEM=device)",
                    self.my_pe
                );
                self.broken = Some(e);
                false
            }
        }
    }

    /// The work-group that owns queue `qi`, for an error report; with a
    /// mirror its producer block is pulled first (a claim since the last
    /// refresh may have changed it).
    fn owner(&mut self, qi: usize) -> u32 {
        self.mirror_step(Some(&[qi]), QueueMirror::pull_producers);
        self.queues[qi].consumer.mem().owner()
    }

    /// The heartbeat this service publishes its progress in (shared with a
    /// watchdog; replaces the service's own).
    pub fn set_heartbeat(&mut self, heartbeat: std::sync::Arc<Heartbeat>) {
        self.heartbeat = heartbeat;
    }

    /// Fault injection for the reliability tests: block inside the submit
    /// of the `after`-th command taken (1-based), as a hung transport call
    /// would, until `release()` returns true (polled every 10 ms).
    pub fn inject_stall(&mut self, after: u64, release: Box<dyn FnMut() -> bool + Send>) {
        self.stall = Some(InjectedStall { after, release });
    }

    /// Errors recorded since the last call (each also logged), when no
    /// sink is set.
    pub fn take_errors(&mut self) -> Vec<CommandError> {
        std::mem::take(&mut self.errors)
    }

    /// Publish every error into `sink` as soon as it is recorded (errors
    /// recorded before go there now).
    pub fn set_error_sink(&mut self, sink: std::sync::Arc<std::sync::Mutex<Vec<CommandError>>>) {
        sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner).append(&mut self.errors);
        self.sink = Some(sink);
    }

    fn push_error(&mut self, e: CommandError) {
        tracing::error!("{e}");
        match &self.sink {
            Some(s) => s.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(e),
            None => self.errors.push(e),
        }
    }

    /// Commands taken and not yet complete, over all queues.
    pub fn outstanding(&self) -> u64 {
        self.queues.iter().map(|q| q.consumer.outstanding()).sum()
    }

    /// The transport.
    pub fn transport(&mut self) -> &mut T {
        &mut self.transport
    }

    fn reject(&mut self, qi: usize, seq: u64, cmd: &Cmd, code: ErrorCode) {
        let (op, addr) = (cmd.op_name(), cmd.target_addr());
        let e = CommandError {
            my_pe: self.my_pe,
            wg: self.owner(qi),
            queue: qi as u32,
            seq,
            op,
            pe: cmd.pe,
            addr,
            size: cmd.size,
            code,
        };
        self.push_error(e);
        self.queues[qi].consumer.complete(seq, Outcome::Failed(code));
    }

    fn record_failure(&mut self, tag: Tag, op: &Op, code: ErrorCode) {
        let e = CommandError {
            my_pe: self.my_pe,
            wg: self.owner(tag.queue as usize),
            queue: tag.queue,
            seq: tag.seq,
            op: op.name(),
            pe: op.pe().unwrap_or(self.my_pe),
            addr: op.addr(),
            size: op.size(),
            code,
        };
        self.push_error(e);
    }

    fn finish(&mut self, tag: Tag, op: &Op, outcome: Outcome) {
        if let Outcome::Failed(code) = outcome {
            self.record_failure(tag, op, code);
        }
        self.queues[tag.queue as usize].consumer.complete(tag.seq, outcome);
    }

    /// Submit `op` (decoded from `cmd`); false if the transport was busy
    /// (kept for retry).
    fn submit(&mut self, qi: usize, seq: u64, op: Op, cmd: &Cmd) -> bool {
        // The taken count is published per pass, and here, where a hung
        // transport would leave it for the watchdog's report.
        self.heartbeat.taken.store(self.taken, std::sync::atomic::Ordering::Relaxed);
        self.heartbeat.set_submit(qi, seq, cmd);
        let tag = Tag { queue: qi as u32, seq };
        if let Some(stall) = &mut self.stall
            && self.taken >= stall.after
        {
            while !(stall.release)() {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            self.stall = None;
        }
        let outcome = self.transport.submit(tag, &op);
        self.heartbeat.set_phase(Phase::Polling, qi);
        match outcome {
            Submit::Done(o) => self.finish(tag, &op, o),
            Submit::Pending => {}
            Submit::Busy => {
                self.queues[qi].retry = Some(Box::new((seq, op, *cmd)));
                return false;
            }
        }
        true
    }

    /// One pass over every queue and the transport; the number of commands
    /// taken or completed (0: idle). With a mirror, the pass pulls the
    /// active queues' slots first and pushes their changed control blocks
    /// last ([`crate::mirror`]); once the mirror has failed it only sleeps
    /// 1 ms and returns 0 (the pass counter stands still).
    pub fn poll_once(&mut self) -> usize {
        if self.broken.is_some() {
            std::thread::sleep(std::time::Duration::from_millis(1));
            return 0;
        }
        let mut work = 0;
        let pass = self.passes;
        self.passes += 1;
        self.heartbeat.passes.store(self.passes, std::sync::atomic::Ordering::Relaxed);
        self.heartbeat.set_phase(Phase::Progress, 0);
        self.transport.progress(&mut self.done);
        self.heartbeat.set_phase(Phase::Polling, 0);
        let done = std::mem::take(&mut self.done);
        work += done.len();
        for f in &done {
            self.finish(f.tag, &f.op, f.outcome);
        }
        self.done = done;
        self.done.clear();
        if self.claims_moved() || (pass.is_multiple_of(u64::from(ACTIVE_REFRESH_PASSES)) && self.slow_refresh_due()) {
            self.refresh_active();
        }
        if pass.is_multiple_of(u64::from(ACTIVE_REFRESH_PASSES))
            && let Some(report) = self.transport.fatal()
        {
            // The watchdog prints it and aborts the PE.
            tracing::debug!("{report}");
            let _ = self.heartbeat.fatal.set(report);
        }
        if !self.mirror_step(None, QueueMirror::pull_slots) {
            return work;
        }
        let (n, taken_before) = (self.active.len(), self.taken);
        let ahead = if self.saturated { self.pacing.prefetch_ahead } else { 0 };
        for k in 0..n {
            if ahead > 0
                && let Some(&next) = self.active.get(k + ahead)
            {
                self.queues[next].consumer.prefetch_next();
            }
            let w = self.poll_queue(self.active[k]);
            if w == 0 {
                for _ in 0..self.pacing.empty_poll_pauses {
                    std::hint::spin_loop();
                }
            }
            work += w;
        }
        self.saturated = self.pacing.prefetch_ahead > 0
            && n > self.pacing.prefetch_ahead
            && (self.taken - taken_before) * 4 >= n as u64 * 3;
        self.heartbeat.taken.store(self.taken, std::sync::atomic::Ordering::Relaxed);
        self.heartbeat.set_phase(Phase::Progress, 0);
        self.transport.end_pass(std::mem::take(&mut self.waits), &mut self.done);
        self.heartbeat.set_phase(Phase::Polling, 0);
        // Completions of this pass (transport, rejects, no-ops, barriers)
        // and takes all concern active queues: push theirs.
        self.mirror_step(None, QueueMirror::push_ctl);
        work
    }

    /// Poll without backing off for `spin` after the last work (one
    /// spin-loop hint per idle pass; [`IDLE_SPIN_FOR`] for GPU PEs), before
    /// [`Service::run_with`]'s usual backoff (growing `pause` runs, then
    /// yields). For a thread that owns its core: on recent x86 CPUs one
    /// `pause` takes about 140 cycles, so the backoff alone added
    /// microseconds to a GPU work-group's round trip. Without it (the
    /// default, CPU PEs) an idle proxy gives its core back within a few
    /// microseconds, which CPU work-groups sharing the cores need: with a 50
    /// µs spin, a 2-PE CPU allreduce on two cores ran 15-50% slower.
    pub fn set_idle_spin(&mut self, spin: std::time::Duration) {
        self.idle_spin = Some(spin);
    }

    /// Pace the polls ([`Pacing`]; [`GPU_PACING`] for a GPU PE's queues in
    /// mapped host memory). Not for services with a mirror: their slots are
    /// host shadows that no device writes while they are polled.
    pub fn set_pacing(&mut self, pacing: Pacing) {
        assert!(self.mirror.is_none(), "pacing with a mirror");
        self.pacing = pacing;
    }

    /// Let the queues' producers tell this service when they claim a queue:
    /// `status` is the PE's status block (`cpnet_status_t`, at least
    /// `CPNET_STATUS_BYTES`), whose `claim_gen` every claim bumps (cmd.h,
    /// "Claim signal"). The service then rebuilds its list of queues to
    /// poll as soon as that word moves, and otherwise only every
    /// [`CLAIM_SIGNAL_REFRESH`] (to drop released queues), instead of every
    /// [`ACTIVE_REFRESH_PASSES`] passes: with a pool of 1024 queues that
    /// rebuild took ~4.5 µs, and an idle thread ran it every few
    /// microseconds, in the way of the next command. Not for services with
    /// a mirror (their claims are seen through the mirror's pulls).
    pub fn set_claim_signal(&mut self, status: Words) {
        assert!(status.len() * 8 >= CPNET_STATUS_BYTES, "a status block view");
        assert!(self.mirror.is_none(), "claim signal with a mirror");
        // Relaxed: the first pass refreshes anyway; later values are
        // compared with acquire loads.
        let generation = status.word32(CPNET_STATUS_OFF_CLAIM_GEN).load(Ordering::Relaxed);
        self.claim_signal = Some((status, generation));
    }

    /// Whether a queue was claimed since the last look (false without a
    /// claim signal).
    #[inline]
    fn claims_moved(&mut self) -> bool {
        let Some((status, seen)) = &mut self.claim_signal else { return false };
        // Acquire: pairs with the claimer's release add of claim_gen (cmd.h,
        // "Claim signal"), so the in_use reread by refresh_active sees 1.
        let generation = status.word32(CPNET_STATUS_OFF_CLAIM_GEN).load(Ordering::Acquire);
        if generation == *seen {
            return false;
        }
        *seen = generation;
        true
    }

    /// Whether the periodic rebuild of the active list is due: always
    /// without a claim signal, else every [`CLAIM_SIGNAL_REFRESH`].
    fn slow_refresh_due(&self) -> bool {
        self.claim_signal.is_none() || self.refreshed.is_none_or(|t| t.elapsed() >= CLAIM_SIGNAL_REFRESH)
    }

    fn refresh_active(&mut self) {
        self.refreshed = Some(std::time::Instant::now());
        if self.mirror.is_some() && self.producers_pulled.is_none_or(|t| t.elapsed() >= MIRROR_REFRESH_INTERVAL) {
            let all: Vec<usize> = (0..self.queues.len()).collect();
            // `in_use` below is the shadow's: pull the producer blocks (at
            // most once per MIRROR_REFRESH_INTERVAL; in between the shadows'
            // last copy stands).
            self.mirror_step(Some(&all), QueueMirror::pull_producers);
            self.producers_pulled = Some(std::time::Instant::now());
        }
        self.active.clear();
        for (qi, q) in self.queues.iter().enumerate() {
            if q.consumer.mem().in_use()
                || q.consumer.outstanding() > 0
                || q.drain.is_some()
                || q.retry.is_some()
                || self.mirror.as_ref().is_some_and(|m| m.unpushed(qi))
            {
                self.active.push(qi);
            }
        }
    }

    /// Complete the mirror's last pushes (the service is leaving its loop).
    fn flush_mirror(&mut self) {
        self.mirror_step(Some(&[]), |m, _| m.flush());
    }

    fn poll_queue(&mut self, qi: usize) -> usize {
        let mut work = 0;
        if self.queues[qi].retry.is_some() {
            let (seq, op, cmd) = *self.queues[qi].retry.take().expect("checked");
            if !self.submit(qi, seq, op, &cmd) {
                return 0;
            }
            work += 1;
        }
        // Bounded batch per queue per pass, so one busy queue cannot starve others.
        for _ in 0..TAKE_PER_PASS {
            if self.queues[qi].drain.is_some() && !self.drain_done(qi, &mut work) {
                return work;
            }
            let Some((seq, cmd)) = self.queues[qi].consumer.poll() else { break };
            work += 1;
            self.taken += 1;
            // A blocking command's producer waits for its reply before it
            // writes another: the next slot cannot be ready in this pass, so
            // leave it unread. With many queues, that read is a cache miss
            // per command (the line was last touched a ring ago).
            let last = cmd.flags & CPNET_F_BLOCKING != 0;
            self.waits |= last;
            match decode(&cmd, &self.limits) {
                // The common command that needs no transport: completed here
                // (Consumer::complete's in-order fast path).
                Ok(Op::Nop) => self.queues[qi].consumer.complete(seq, Outcome::Done),
                decoded => {
                    if !self.take(qi, seq, &cmd, decoded) {
                        break;
                    }
                }
            }
            if last {
                break;
            }
        }
        work
    }

    /// Serve a taken command other than a no-op; false if the transport
    /// was busy (the command waits in `retry`).
    #[inline(never)]
    fn take(&mut self, qi: usize, seq: u64, cmd: &Cmd, decoded: Result<Op, ErrorCode>) -> bool {
        match decoded {
            Err(code) => self.reject(qi, seq, cmd, code),
            Ok(Op::Nop) => self.queues[qi].consumer.complete(seq, Outcome::Done),
            Ok(Op::Fence) | Ok(Op::Quiet) => {
                self.queues[qi].consumer.complete(seq, Outcome::Done);
                self.queues[qi].drain = Some(Drain::Fence);
                self.waits = true;
            }
            Ok(Op::BarrierAll) => {
                self.queues[qi].drain = Some(Drain::Barrier { seq, started: false });
                self.waits = true;
            }
            Ok(op) => match self.locate_payload(qi, seq, op) {
                Ok(op) => return self.submit(qi, seq, op, cmd),
                Err(code) => self.reject(qi, seq, cmd, code),
            },
        }
        true
    }

    /// Move queue `qi`'s drain on (a FENCE / QUIET / BARRIER was taken):
    /// true once it is over and the queue's next command may be taken.
    #[inline(never)]
    fn drain_done(&mut self, qi: usize, work: &mut usize) -> bool {
        let Some(drain) = self.queues[qi].drain else { return true };
        let q = &mut self.queues[qi];
        match drain {
            Drain::Fence => {
                if q.consumer.outstanding() > 0 {
                    return false;
                }
            }
            Drain::Barrier { seq, started } => {
                // Every command before the barrier must be complete.
                if q.consumer.completed() < seq {
                    return false;
                }
                self.heartbeat.taken.store(self.taken, std::sync::atomic::Ordering::Relaxed);
                self.heartbeat.set_phase(Phase::Barrier, qi);
                let r = self.transport.barrier(!started);
                self.heartbeat.set_phase(Phase::Polling, qi);
                match r {
                    Ok(false) => {
                        self.queues[qi].drain = Some(Drain::Barrier { seq, started: true });
                        return false;
                    }
                    Ok(true) => self.queues[qi].consumer.complete(seq, Outcome::Done),
                    Err(code) => {
                        self.record_failure(Tag { queue: qi as u32, seq }, &Op::BarrierAll, code);
                        self.queues[qi].consumer.complete(seq, Outcome::Failed(code));
                    }
                }
                *work += 1;
            }
        }
        self.queues[qi].drain = None;
        true
    }

    /// Poll until `stop()` is true, spinning (then yielding) while idle.
    pub fn run(&mut self, stop: impl FnMut() -> bool) {
        self.run_with(None, stop)
    }

    /// [`Service::run`], but once no command has been taken or completed
    /// for [`IDLE_SLEEP_AFTER`], sleep `idle_sleep` per pass (when given).
    /// That saves the CPU of an idle proxy, at a price: providers with
    /// manual progress (rxm, and shm for atomics and delivery-complete
    /// writes) only serve operations that *target* this PE while the proxy
    /// polls, and those do not count as work here, so a target-side sleep
    /// adds up to one sleep (plus timer slack) to peers' latencies.
    ///
    /// Until then an idle pass is followed by a step of a growing backoff
    /// (spin-loop hints, then a yield), or, for the first
    /// [`Service::set_idle_spin`] of idleness, by one spin-loop hint.
    pub fn run_with(&mut self, idle_sleep: Option<std::time::Duration>, mut stop: impl FnMut() -> bool) {
        // Idle passes since the last work, and the idle time as of the last
        // look at the clock: read only every IDLE_CLOCK_EVERY idle passes,
        // so that an idle pass costs a poll of the queues and a pause, not a
        // clock read (a system call on hosts without a vDSO clock).
        const IDLE_CLOCK_EVERY: u32 = 64;
        let spin = Spin::new();
        let (mut idle_passes, mut idle_since, mut idle) = (0u32, None::<std::time::Instant>, std::time::Duration::ZERO);
        while !stop() {
            if self.poll_once() > 0 {
                (idle_passes, idle_since, idle) = (0, None, std::time::Duration::ZERO);
                spin.reset();
                continue;
            }
            if idle_passes.is_multiple_of(IDLE_CLOCK_EVERY) {
                idle = idle_since.get_or_insert_with(std::time::Instant::now).elapsed();
            }
            idle_passes = idle_passes.wrapping_add(1);
            match idle_sleep {
                Some(d) if idle > IDLE_SLEEP_AFTER => std::thread::sleep(d),
                _ if self.idle_spin.is_some_and(|s| idle <= s) => std::hint::spin_loop(),
                _ => spin.step(),
            }
        }
        self.flush_mirror();
        self.heartbeat.set_phase(Phase::Stopped, 0);
    }

    /// Drain at finalize: poll until nothing is outstanding or `stop()`.
    pub fn drain(&mut self, mut stop: impl FnMut() -> bool) {
        let spin = Spin::new();
        while self.outstanding() > 0 && !stop() {
            if self.poll_once() == 0 {
                spin.step();
            }
        }
        self.flush_mirror();
        self.heartbeat.set_phase(Phase::Stopped, 0);
    }
}

/// The transport of a single-PE job, and the local path of any job:
/// every operation targets this PE's host heap and finishes at once.
pub struct LoopbackTransport {
    heap: cpnet_device::cpu::HeapView,
}

impl LoopbackTransport {
    /// Loopback over `heap`.
    pub fn new(heap: cpnet_device::cpu::HeapView) -> LoopbackTransport {
        LoopbackTransport { heap }
    }
}

impl Transport for LoopbackTransport {
    fn submit(&mut self, _tag: Tag, op: &Op) -> Submit {
        Submit::Done(crate::local::apply_local(&self.heap, op))
    }

    fn progress(&mut self, _done: &mut Vec<Finished>) {}

    fn barrier(&mut self, _start: bool) -> Result<bool, ErrorCode> {
        Ok(true)
    }
}
