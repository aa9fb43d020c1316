//! The command ring: one single-producer single-consumer queue per
//! work-group context (ComP-Net paper §4.2.1, Fig. 6).
//!
//! The protocol is written once, in the block comment "THE QUEUE PROTOCOL" of
//! `include/cpnet/cmd.h`; the steps P1..P4 (producer) and C1..C4 (consumer)
//! named in the comments below are defined there. The GPU producer
//! (`include/cpnet/queue.cuh`) and the CPU producer here follow the same
//! steps on the same memory, so the consumer cannot tell them apart.
//!
//! Memory of one queue (see [`QueueGeometry::bytes`]):
//!
//! ```text
//! +0    QueueCtl   (consumer writes)  consumed, completed, result, result_seq, error_seq, error, abort
//! +64   QueueProd  (producer writes)  write_idx, cached_consumed, in_use, owner
//! +128  depth x 64-byte Cmd slots     commit word (seq + 1) last
//! ```

use crate::layout::*;
use crate::sync::{Deadline, Ordering, Spin, Words};

/// Errors of the ring itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The depth is not a power of two in `CPNET_MIN_DEPTH..=CPNET_MAX_DEPTH`.
    #[error("queue depth {0} is invalid: it must be a power of two from {CPNET_MIN_DEPTH} to {CPNET_MAX_DEPTH}")]
    BadDepth(u32),
    /// A wait on the consumer passed its deadline.
    #[error(
        "timed out waiting for {what} of command seq {seq} (queue: consumed {consumed}, completed {completed}, written {written}): the proxy is not making progress"
    )]
    Timeout {
        /// What was awaited: "a free slot", "completion", "quiet".
        what: &'static str,
        /// The command (or, for a free slot, the one to be written).
        seq: u64,
        /// `ctl.consumed` when the wait gave up.
        consumed: u64,
        /// `ctl.completed` when the wait gave up.
        completed: u64,
        /// The producer's write index.
        written: u64,
    },
    /// The proxy rejected a command of this queue.
    #[error("command seq {seq} was rejected by the proxy: {code}")]
    Rejected {
        /// Seq of the rejected command.
        seq: u64,
        /// Why.
        code: ErrorCode,
    },
    /// The job is ending; the host set the queue's abort word.
    #[error("queue aborted: {0}")]
    Aborted(ErrorCode),
    /// The consumer's answer does not belong to the awaited command.
    #[error("protocol violation: result for seq {found} while waiting for seq {expected}")]
    Protocol {
        /// Seq awaited.
        expected: u64,
        /// `result_seq - 1` found.
        found: u64,
    },
}

/// The depth of a queue and the sizes that follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueGeometry {
    log2_depth: u32,
}

impl Default for QueueGeometry {
    fn default() -> Self {
        QueueGeometry::new(CPNET_DEFAULT_DEPTH).expect("default depth is valid")
    }
}

impl QueueGeometry {
    /// A queue of `depth` slots.
    ///
    /// # Errors
    /// [`RingError::BadDepth`] unless `depth` is a power of two in
    /// `CPNET_MIN_DEPTH..=CPNET_MAX_DEPTH` (2 to 65536).
    pub fn new(depth: u32) -> Result<QueueGeometry, RingError> {
        if !depth.is_power_of_two() || !(CPNET_MIN_DEPTH..=CPNET_MAX_DEPTH).contains(&depth) {
            return Err(RingError::BadDepth(depth));
        }
        Ok(QueueGeometry { log2_depth: depth.trailing_zeros() })
    }

    /// Slots in the ring.
    pub fn depth(&self) -> u32 {
        1 << self.log2_depth
    }

    /// `log2(depth)`, as the kernel handle carries it.
    pub fn log2_depth(&self) -> u32 {
        self.log2_depth
    }

    /// `depth - 1`: slot index of seq is `seq & mask`.
    pub fn mask(&self) -> u64 {
        u64::from(self.depth()) - 1
    }

    /// Bytes of one queue: the 128-byte header and the slots.
    pub fn bytes(&self) -> usize {
        CPNET_QUEUE_HEADER_BYTES + self.depth() as usize * CPNET_SLOT_BYTES
    }

    /// Bytes of one queue in 64-bit words.
    pub fn words(&self) -> usize {
        self.bytes() / 8
    }
}

// Word indices inside one queue, derived from the cmd.h offsets.
const CONSUMED: usize = (CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_CONSUMED) / 8;
const COMPLETED: usize = (CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_COMPLETED) / 8;
const RESULT: usize = (CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_RESULT) / 8;
const RESULT_SEQ: usize = (CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_RESULT_SEQ) / 8;
const ERROR_SEQ: usize = (CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_ERROR_SEQ) / 8;
const ERROR: usize = (CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_ERROR) / 8;
const ABORT: usize = (CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_ABORT) / 8;
const REPLY: usize = (CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_REPLY) / 8;
const WRITE_IDX: usize = (CPNET_QUEUE_OFF_PROD + CPNET_PROD_OFF_WRITE_IDX) / 8;
const CACHED_CONSUMED: usize = (CPNET_QUEUE_OFF_PROD + CPNET_PROD_OFF_CACHED_CONSUMED) / 8;
const SLOTS: usize = CPNET_QUEUE_OFF_SLOTS / 8;
const _: () = assert!(CPNET_CTL_OFF_ERROR.is_multiple_of(8) && CPNET_CTL_OFF_ABORT.is_multiple_of(8));

/// The first word of the slot of `seq` in a queue's words, for the slot
/// index mask `mask` (`depth - 1`).
#[inline(always)]
fn slot_start(seq: u64, mask: u64) -> usize {
    SLOTS + (seq & mask) as usize * SLOT_WORDS
}

/// A slot's words from a copy of its first `CPNET_CMD_COMMIT_WORD` words
/// and its commit word (read apart: the commit word with acquire first).
#[inline(always)]
fn slot_words(head: [u64; CPNET_CMD_COMMIT_WORD], commit: u64) -> [u64; SLOT_WORDS] {
    let mut words = [0u64; SLOT_WORDS];
    words[..CPNET_CMD_COMMIT_WORD].copy_from_slice(&head);
    words[CPNET_CMD_COMMIT_WORD] = commit;
    words
}

/// One queue's memory: a view shared by its producer and its consumer.
#[derive(Clone, Debug)]
pub struct QueueMem {
    words: Words,
    geom: QueueGeometry,
    /// Keeps owned memory (a host pool) alive while this view lives.
    _keep: Keep,
}

/// Something that owns the memory a view points into.
type Keep = Option<std::sync::Arc<dyn core::fmt::Debug + Send + Sync>>;

impl QueueMem {
    /// The queue at `base`.
    ///
    /// # Safety
    /// 1. `base` is 64-byte aligned (8 at least) and valid for reads and
    ///    writes of `geom.bytes()` bytes for as long as this view, or any
    ///    producer or consumer made from it, lives.
    /// 2. The memory was zeroed before the queue's first use, and every other
    ///    access to it follows THE QUEUE PROTOCOL of `cmd.h` (atomics on the
    ///    CPU, the `queue.cuh` accesses on the GPU).
    #[cfg(not(loom))]
    pub unsafe fn from_raw(base: *mut u8, geom: QueueGeometry) -> QueueMem {
        // SAFETY: forwarded from this function's contract (clauses 1, 2).
        let words = unsafe { Words::from_raw(base.cast::<u64>(), geom.words()) };
        QueueMem { words, geom, _keep: None }
    }

    /// A queue over existing shared words (exactly `geom.words()` of them).
    pub fn from_words(words: Words, geom: QueueGeometry) -> QueueMem {
        assert_eq!(words.len(), geom.words(), "queue memory size");
        QueueMem { words, geom, _keep: None }
    }

    /// A zeroed queue in fresh memory shared between loom threads.
    #[cfg(loom)]
    pub fn new_loom(geom: QueueGeometry) -> QueueMem {
        QueueMem { words: Words::new(geom.words()), geom, _keep: None }
    }

    /// The queue's geometry.
    pub fn geometry(&self) -> QueueGeometry {
        self.geom
    }

    /// The underlying words.
    pub fn words(&self) -> &Words {
        &self.words
    }

    /// The words of the slot of `seq` (one bounds check for all of them).
    #[inline]
    fn slot(&self, seq: u64) -> Words {
        self.words.slice(slot_start(seq, self.geom.mask()), SLOT_WORDS)
    }

    /// Tell the producer to stop waiting: every wait on this queue returns
    /// [`RingError::Aborted`] from now on. Release; pairs with the acquire
    /// loads of `abort` in the producer's waits (and `queue.cuh`'s).
    pub fn set_abort(&self, code: ErrorCode) {
        self.words.word(ABORT).store(code as i32 as u32 as u64, Ordering::Release);
    }

    /// The abort word, if set (acquire; pairs with [`QueueMem::set_abort`]).
    pub fn abort_code(&self) -> Option<ErrorCode> {
        match self.words.word(ABORT).load(Ordering::Acquire) {
            0 => None,
            v => Some(ErrorCode::from_i32(v as i32).unwrap_or(ErrorCode::Aborted)),
        }
    }

    /// A relaxed snapshot of the control block, for reports and tests.
    pub fn ctl_snapshot(&self) -> QueueCtl {
        let w = |i| self.words.word(i).load(Ordering::Relaxed);
        QueueCtl {
            consumed: w(CONSUMED),
            completed: w(COMPLETED),
            result: w(RESULT),
            result_seq: w(RESULT_SEQ),
            error_seq: w(ERROR_SEQ),
            error: w(ERROR) as u32 as i32,
            error_pad: 0,
            abort: w(ABORT),
            reply: w(REPLY),
        }
    }

    /// Claim the queue for a context (`ctx_create`): CAS `prod.in_use` 0 -> 1
    /// with acquire (pairs with the release store in [`QueueMem::release`]
    /// by the previous owner, so its stored-back indices are visible), then
    /// record `owner` (the work-group id) for error reports.
    #[cfg(not(loom))]
    pub fn try_claim(&self, owner: u32) -> bool {
        let claimed = self
            .words
            .word32(CPNET_QUEUE_OFF_PROD + CPNET_PROD_OFF_IN_USE)
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if claimed {
            self.words.word32(CPNET_QUEUE_OFF_PROD + CPNET_PROD_OFF_OWNER).store(owner, Ordering::Relaxed);
        }
        claimed
    }

    /// Give the queue back (`ctx_destroy`, after quiet and
    /// [`Producer::detach`]): release store of `prod.in_use` = 0, pairs with
    /// the acquire CAS in [`QueueMem::try_claim`].
    #[cfg(not(loom))]
    pub fn release(&self) {
        self.words.word32(CPNET_QUEUE_OFF_PROD + CPNET_PROD_OFF_IN_USE).store(0, Ordering::Release);
    }

    /// Whether a context holds the queue (relaxed: a hint for the proxy's
    /// choice of queues to poll, never for ordering).
    #[cfg(not(loom))]
    pub fn in_use(&self) -> bool {
        self.words.word32(CPNET_QUEUE_OFF_PROD + CPNET_PROD_OFF_IN_USE).load(Ordering::Relaxed) != 0
    }

    /// The work-group id recorded by the last claim (relaxed; for reports).
    #[cfg(not(loom))]
    pub fn owner(&self) -> u32 {
        self.words.word32(CPNET_QUEUE_OFF_PROD + CPNET_PROD_OFF_OWNER).load(Ordering::Relaxed)
    }

    /// The command published in slot `seq`, if that slot holds it now (its
    /// commit word is `seq + 1`), for reports made by a thread that is not
    /// the consumer (the proxy watchdog); it does not take the command.
    ///
    /// The commit word is read with acquire (pairs with the producer's
    /// release store, P3), then the other words relaxed, then the commit
    /// word again. This is exact while the consumer does not take `seq`
    /// (the producer reuses a slot only after that, P1), which is the case
    /// the watchdog reports: a stuck consumer. On a live queue it is a best
    /// effort: a slot reused during the read usually reads as `None`.
    pub fn peek(&self, seq: u64) -> Option<Cmd> {
        let slot = self.slot(seq);
        let commit = slot.word(CPNET_CMD_COMMIT_WORD).load(Ordering::Acquire);
        if commit != seq + 1 {
            return None;
        }
        let words = slot_words(slot.load_relaxed(0), commit);
        // Acquire: pairs with a reusing producer's release of the new commit.
        (slot.word(CPNET_CMD_COMMIT_WORD).load(Ordering::Acquire) == commit).then(|| Cmd::from_words(words))
    }

    /// The producer block's write index (relaxed; informative while a
    /// producer is attached, exact after it detached).
    pub fn written(&self) -> u64 {
        self.words.word(WRITE_IDX).load(Ordering::Relaxed)
    }
}

/// The producer side of one queue: a work-group context.
///
/// Keeps the write index and the cached read index privately (P1) and
/// stores them back into the queue's producer block on [`Producer::detach`],
/// so a later context on the same queue continues the sequence.
#[derive(Debug)]
pub struct Producer {
    mem: QueueMem,
    write_idx: u64,
    cached_consumed: u64,
    errors_seen: u64,
}

impl Producer {
    /// Attach to `mem`, continuing from the sequence its producer block holds.
    pub fn new(mem: QueueMem) -> Producer {
        // Relaxed: the producer block is ours; the claim of the queue (an
        // acquire CAS of in_use, or the thread start) ordered us after the
        // previous owner's detach.
        let write_idx = mem.words.word(WRITE_IDX).load(Ordering::Relaxed);
        let cached_consumed = mem.words.word(CACHED_CONSUMED).load(Ordering::Relaxed);
        let errors_seen = mem.words.word(ERROR_SEQ).load(Ordering::Relaxed);
        Producer { mem, write_idx, cached_consumed, errors_seen }
    }

    /// Store the private indices back into the producer block and give the
    /// memory view back. Call after [`Producer::quiet`].
    pub fn detach(self) -> QueueMem {
        self.mem.words.word(WRITE_IDX).store(self.write_idx, Ordering::Relaxed);
        self.mem.words.word(CACHED_CONSUMED).store(self.cached_consumed, Ordering::Relaxed);
        self.mem
    }

    /// The queue this producer writes.
    pub fn mem(&self) -> &QueueMem {
        &self.mem
    }

    /// Seq the next command will get.
    pub fn write_idx(&self) -> u64 {
        self.write_idx
    }

    fn check_abort(&self) -> Result<(), RingError> {
        match self.mem.abort_code() {
            None => Ok(()),
            Some(code) => Err(RingError::Aborted(code)),
        }
    }

    /// Publish `cmd` if there is a free slot; `None` if the ring is full.
    /// Its `commit` field is ignored. Returns the command's seq.
    #[inline]
    pub fn try_push(&mut self, cmd: &Cmd) -> Option<u64> {
        let seq = self.write_idx;
        let depth = u64::from(self.mem.geom.depth());
        if seq - self.cached_consumed >= depth {
            // P1: re-read consumed. Acquire pairs with the consumer's
            // release store of `consumed` (C3): its reads of the slot we are
            // about to overwrite happened before.
            self.cached_consumed = self.mem.words.word(CONSUMED).load(Ordering::Acquire);
            if seq - self.cached_consumed >= depth {
                return None;
            }
        }
        let words = cmd.to_words();
        let slot = self.mem.slot(seq);
        // P2: fill words 0..6; relaxed, ordered by the release below.
        for (w, &v) in words.iter().enumerate().take(CPNET_CMD_COMMIT_WORD) {
            slot.word(w).store(v, Ordering::Relaxed);
        }
        // P3: publish. Release pairs with the consumer's acquire load of the
        // commit word (C1): the words of P2 are visible before it.
        slot.word(CPNET_CMD_COMMIT_WORD).store(seq + 1, Ordering::Release);
        self.write_idx = seq + 1;
        Some(seq)
    }

    /// Publish `cmd`, waiting with backoff while the ring is full (flow
    /// control). Returns the command's seq.
    ///
    /// # Errors
    /// [`RingError::Timeout`] when `deadline` passes with the ring still
    /// full; [`RingError::Aborted`] when the queue is aborted.
    pub fn push(&mut self, cmd: &Cmd, deadline: &Deadline) -> Result<u64, RingError> {
        if let Some(seq) = self.try_push(cmd) {
            return Ok(seq);
        }
        let spin = Spin::new();
        loop {
            self.check_abort()?;
            if let Some(seq) = self.try_push(cmd) {
                return Ok(seq);
            }
            if deadline.expired() {
                return Err(self.timeout("a free slot", self.write_idx));
            }
            spin.step();
        }
    }

    fn timeout(&self, what: &'static str, seq: u64) -> RingError {
        let ctl = self.mem.ctl_snapshot();
        RingError::Timeout {
            what,
            seq,
            consumed: ctl.consumed,
            completed: ctl.completed,
            written: self.write_idx,
        }
    }

    /// `ctl.completed`, with acquire (P4; pairs with the consumer's release
    /// store in C4).
    #[inline]
    pub fn completed(&self) -> u64 {
        self.mem.words.word(COMPLETED).load(Ordering::Acquire)
    }

    /// After an acquire of `completed` (P4): report a rejection recorded since
    /// the last check. The relaxed loads are ordered by that acquire.
    fn check_errors(&mut self) -> Result<(), RingError> {
        let error_seq = self.mem.words.word(ERROR_SEQ).load(Ordering::Relaxed);
        if error_seq > self.errors_seen {
            self.errors_seen = error_seq;
            let raw = self.mem.words.word(ERROR).load(Ordering::Relaxed) as u32 as i32;
            let code = ErrorCode::from_i32(raw).unwrap_or(ErrorCode::BadOp);
            return Err(RingError::Rejected { seq: error_seq - 1, code });
        }
        Ok(())
    }

    fn wait_completed(&mut self, target: u64, what: &'static str, deadline: &Deadline) -> Result<(), RingError> {
        let spin = Spin::new();
        // P4: acquire of completed, pairs with C4.
        while self.completed() < target {
            self.check_abort()?;
            if deadline.expired() {
                return Err(self.timeout(what, target.saturating_sub(1)));
            }
            spin.step();
        }
        self.check_errors()
    }

    /// Wait until command `seq` is complete (P4). With `want_result`, return
    /// the value the consumer delivered for it (`ctl.result`), else 0.
    ///
    /// # Errors
    /// [`RingError::Rejected`] if this command, or an earlier one not yet
    /// reported, was rejected; [`RingError::Timeout`], [`RingError::Aborted`];
    /// [`RingError::Protocol`] if the result belongs to another command.
    pub fn wait_complete(&mut self, seq: u64, want_result: bool, deadline: &Deadline) -> Result<u64, RingError> {
        self.wait_completed(seq + 1, "completion", deadline)?;
        if !want_result {
            return Ok(0);
        }
        // Ordered by the acquire of `completed` above (P4).
        self.result_of(seq)
    }

    /// `ctl.result` if it belongs to command `seq`. Relaxed loads: call only
    /// after an acquire (of `completed` or `reply`) that the consumer's
    /// release followed its result stores.
    fn result_of(&self, seq: u64) -> Result<u64, RingError> {
        let result_seq = self.mem.words.word(RESULT_SEQ).load(Ordering::Relaxed);
        if result_seq != seq + 1 {
            return Err(RingError::Protocol { expected: seq, found: result_seq.wrapping_sub(1) });
        }
        Ok(self.mem.words.word(RESULT).load(Ordering::Relaxed))
    }

    /// Wait for blocking command `seq` through `ctl.reply` (P4's reply
    /// variant, the one the GPU producer in queue.cuh uses): one acquire per
    /// poll says both "complete" and the command's own `CPNET_E_*`. With
    /// `want_result`, return its value (`ctl.result`), else 0. Unlike
    /// [`Producer::wait_complete`] it reports only this command's rejection;
    /// earlier nbi rejections surface at quiet.
    ///
    /// # Errors
    /// [`RingError::Rejected`] (this command), [`RingError::Timeout`],
    /// [`RingError::Aborted`]; [`RingError::Protocol`] if the result belongs
    /// to another command.
    pub fn wait_reply(&mut self, seq: u64, want_result: bool, deadline: &Deadline) -> Result<u64, RingError> {
        let spin = Spin::new();
        loop {
            // P4 (reply): acquire pairs with C5's release store of `reply`.
            let r = self.mem.words.word(REPLY).load(Ordering::Acquire);
            if r >> 8 == seq + 1 {
                let code = (r & 0xff) as i32;
                if code != 0 {
                    return Err(RingError::Rejected {
                        seq,
                        code: ErrorCode::from_i32(code).unwrap_or(ErrorCode::BadOp),
                    });
                }
                break;
            }
            self.check_abort()?;
            if deadline.expired() {
                return Err(self.timeout("reply", seq));
            }
            spin.step();
        }
        if !want_result {
            return Ok(0);
        }
        // Ordered by the acquire of `reply` above (C4 before C5).
        self.result_of(seq)
    }

    /// Wait until every command written so far is complete (per-context
    /// quiet, OpenSHMEM 1.5 §9.9.2).
    ///
    /// # Errors
    /// As [`Producer::wait_complete`].
    pub fn quiet(&mut self, deadline: &Deadline) -> Result<(), RingError> {
        self.wait_completed(self.write_idx, "quiet", deadline)
    }
}

/// How a command ended, as the consumer reports it (C4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Complete, nothing to return.
    Done,
    /// Complete, with a fetched value (GET inline, fetching AMO).
    Value(u64),
    /// Rejected or failed; still complete, so no producer waits forever.
    Failed(ErrorCode),
}

/// [`Consumer`]'s flag for a taken command that is complete.
const PENDING_DONE: u8 = 1;
/// [`Consumer`]'s flag for a taken command flagged `CPNET_F_BLOCKING`.
const PENDING_BLOCKING: u8 = 2;

/// The consumer side of one queue: what the proxy's service thread holds.
///
/// [`Consumer::poll`] takes commands in order; [`Consumer::complete`] may be
/// called in any order, and the consumer advances the `completed` watermark
/// over the longest completed prefix.
#[derive(Debug)]
pub struct Consumer {
    mem: QueueMem,
    next: u64,
    completed: u64,
    /// Per taken command `seq` in `completed..next`, at `seq & (len - 1)`:
    /// [`PENDING_DONE`] once complete, [`PENDING_BLOCKING`] if flagged
    /// BLOCKING (C5); 0 elsewhere. A power-of-two ring of flag bytes that
    /// doubles when `next - completed` reaches its length (commands can be
    /// taken past the queue's depth while earlier ones are in flight): the
    /// service's per-command bookkeeping is an index and a mask.
    pending: Vec<u8>,
    /// The queue's slot index mask (`depth - 1`), kept here so a poll is an
    /// and, not a shift.
    mask: u64,
}

impl Consumer {
    /// Attach to `mem`, continuing from its control block.
    pub fn new(mem: QueueMem) -> Consumer {
        // Relaxed: the control block is ours (only the consumer writes it).
        let next = mem.words.word(CONSUMED).load(Ordering::Relaxed);
        let completed = mem.words.word(COMPLETED).load(Ordering::Relaxed);
        assert_eq!(next, completed, "a consumer attaches to a quiescent queue");
        let pending = vec![0; mem.geom.depth() as usize];
        let mask = mem.geom.mask();
        Consumer { mem, next, completed, pending, mask }
    }

    /// The queue this consumer reads.
    pub fn mem(&self) -> &QueueMem {
        &self.mem
    }

    /// Seq of the next command to take.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Hint the CPU to bring this queue's next slot (for reading) and its
    /// control block (for writing) into cache: what the next [`Consumer::poll`]
    /// and [`Consumer::complete`] touch. Only a hint: no effect on the
    /// queue's contents or on ordering. Worth it only when the slot is
    /// likely written already (a service that finds most of its queues busy,
    /// the caller decides); reading a line the producer is
    /// about to write gets in the way of its write.
    #[cfg(not(loom))]
    #[inline]
    pub fn prefetch_next(&self) {
        let p = self.mem.words.as_ptr();
        prefetch::<false>(p.wrapping_add(slot_start(self.next, self.mask)).cast());
        prefetch::<true>(p.cast());
    }

    /// The published watermark: every seq below it is complete.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Commands taken but not yet complete.
    pub fn outstanding(&self) -> u64 {
        self.next - self.completed
    }

    /// Take the next command if one is published (C1..C3).
    #[inline]
    pub fn poll(&mut self) -> Option<(u64, Cmd)> {
        let seq = self.next;
        // C1: acquire pairs with the producer's release store of the commit
        // word (P3).
        let base = slot_start(seq, self.mask);
        let commit = self.mem.words.word(base + CPNET_CMD_COMMIT_WORD).load(Ordering::Acquire);
        if commit != seq + 1 {
            return None;
        }
        // C2: copy the slot out; relaxed loads ordered by the acquire above.
        let words = slot_words(self.mem.words.load_relaxed(base), commit);
        // C3: free the slot. Release pairs with the producer's acquire load
        // of `consumed` (P1): our reads above happen before its overwrite.
        self.next = seq + 1;
        self.mem.words.word(CONSUMED).store(self.next, Ordering::Release);
        let cmd = Cmd::from_words(words);
        if seq - self.completed == self.pending.len() as u64 {
            self.grow_pending();
        }
        let m = self.pending.len() - 1;
        self.pending[seq as usize & m] = if cmd.flags & CPNET_F_BLOCKING != 0 { PENDING_BLOCKING } else { 0 };
        Some((seq, cmd))
    }

    /// Double `pending`, moving the flags of `completed..next` to their
    /// places under the new mask.
    #[cold]
    fn grow_pending(&mut self) {
        let (old_m, mut grown) = (self.pending.len() - 1, vec![0; self.pending.len() * 2]);
        let new_m = grown.len() - 1;
        for seq in self.completed..self.next {
            grown[seq as usize & new_m] = self.pending[seq as usize & old_m];
        }
        self.pending = grown;
    }

    /// Report the outcome of command `seq` (C4). Completions may come in
    /// any order; `completed` advances over the completed prefix.
    ///
    /// # Panics
    /// If `seq` was not taken or was already completed (a proxy bug).
    #[inline(always)]
    pub fn complete(&mut self, seq: u64, outcome: Outcome) {
        if matches!(outcome, Outcome::Done) && seq == self.completed && seq + 1 == self.next {
            // The only command outstanding, done without a value (a no-op,
            // a put): no payload, and the watermark moves past it alone.
            let idx = seq as usize & (self.pending.len() - 1);
            let flags = core::mem::take(&mut self.pending[idx]);
            assert!(flags & PENDING_DONE == 0, "complete({seq}) twice");
            self.completed = seq + 1;
            if flags & PENDING_BLOCKING != 0 {
                // C5: release pairs with a blocking producer's acquire of
                // `reply` (P4).
                self.mem.words.word(REPLY).store((seq + 1) << 8, Ordering::Release);
            }
            // C4: release pairs with the producer's acquire of `completed` (P4).
            self.mem.words.word(COMPLETED).store(self.completed, Ordering::Release);
            return;
        }
        self.complete_any(seq, outcome);
    }

    /// [`Consumer::complete`]'s general case: any outcome, any order.
    #[inline(never)]
    fn complete_any(&mut self, seq: u64, outcome: Outcome) {
        assert!(seq >= self.completed && seq < self.next, "complete({seq}): not outstanding");
        let m = self.pending.len() - 1;
        let idx = seq as usize & m;
        let flags = self.pending[idx];
        assert!(flags & PENDING_DONE == 0, "complete({seq}) twice");
        // C4: the payload of the completion, relaxed, published by the
        // release store of `completed` below (now or at a later advance).
        match outcome {
            Outcome::Done => {}
            Outcome::Value(v) => {
                self.mem.words.word(RESULT).store(v, Ordering::Relaxed);
                self.mem.words.word(RESULT_SEQ).store(seq + 1, Ordering::Release);
            }
            Outcome::Failed(code) => {
                self.mem.words.word(ERROR).store(code as i32 as u32 as u64, Ordering::Relaxed);
                self.mem.words.word(ERROR_SEQ).store(seq + 1, Ordering::Release);
            }
        }
        if flags & PENDING_BLOCKING != 0 {
            // C5: release pairs with a blocking producer's acquire of
            // `reply` (P4); the result / error stores above precede it.
            let code = match outcome {
                Outcome::Failed(code) => code as u64 & 0xff,
                Outcome::Done | Outcome::Value(_) => 0,
            };
            self.mem.words.word(REPLY).store(((seq + 1) << 8) | code, Ordering::Release);
        }
        if seq != self.completed {
            // Out of order: the watermark waits for the commands before it.
            self.pending[idx] = flags | PENDING_DONE;
            return;
        }
        // In order (the usual case): advance over this one and any already
        // completed after it.
        self.pending[idx] = 0;
        self.completed = seq + 1;
        while self.completed < self.next && self.pending[self.completed as usize & m] & PENDING_DONE != 0 {
            self.pending[self.completed as usize & m] = 0;
            self.completed += 1;
        }
        // C4: release pairs with the producer's acquire of `completed` (P4).
        self.mem.words.word(COMPLETED).store(self.completed, Ordering::Release);
    }
}

/// Prefetch the cache line at `p`: for reading (`prefetcht0`; `prfm
/// pldl1keep` on aarch64), or with `WRITE` for writing, so a later store
/// does not wait for the line's ownership (`prefetchw`, which x86 CPUs
/// without it decode as a no-op; `prfm pstl1keep`). Nothing on other
/// architectures. Written as assembly: `_mm_prefetch` with `_MM_HINT_ET0`
/// compiles to a plain read prefetch unless the crate is built with
/// `prfchw`.
#[cfg(not(loom))]
#[inline(always)]
fn prefetch<const WRITE: bool>(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, whatever the address,
    // and neither reads nor writes memory as the program sees it.
    unsafe {
        if WRITE {
            core::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
        } else {
            core::arch::asm!("prefetcht0 [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
        }
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as for x86-64: a hint that never faults or accesses memory.
    unsafe {
        if WRITE {
            core::arch::asm!("prfm pstl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
        } else {
            core::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

/// A pool of queues in one contiguous region (`n` queues of one geometry),
/// as a kernel handle describes it (`queues`, `n_queues`, `log2_depth`).
#[derive(Clone, Debug)]
pub struct QueuePool {
    words: Words,
    geom: QueueGeometry,
    n: usize,
    keep: Keep,
}

impl QueuePool {
    /// A pool over `words`, which must hold exactly `n * geom.words()` words.
    pub fn from_words(words: Words, geom: QueueGeometry, n: usize) -> QueuePool {
        assert_eq!(words.len(), n * geom.words(), "queue pool size");
        QueuePool { words, geom, n, keep: None }
    }

    /// Queues in the pool.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the pool has no queues.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The geometry of every queue.
    pub fn geometry(&self) -> QueueGeometry {
        self.geom
    }

    /// Queue `i`.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn queue(&self, i: usize) -> QueueMem {
        assert!(i < self.n, "queue {i} out of range ({} queues)", self.n);
        let w = self.geom.words();
        QueueMem { words: self.words.slice(i * w, w), geom: self.geom, _keep: self.keep.clone() }
    }

    /// The pool's words.
    pub fn words(&self) -> &Words {
        &self.words
    }
}

/// Zeroed, 64-byte-aligned host memory holding a pool.
#[cfg(not(loom))]
#[derive(Debug)]
struct HostAlloc {
    ptr: core::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

#[cfg(not(loom))]
impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `QueuePool::new_host` with this layout, freed
        // once, when the last view holding it (via `keep`) is gone.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

// SAFETY: the memory is only accessed through atomics (Words).
#[cfg(not(loom))]
unsafe impl Send for HostAlloc {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl Sync for HostAlloc {}

#[cfg(not(loom))]
impl QueuePool {
    /// `n` zeroed queues of geometry `geom` in host memory (the pool of CPU
    /// work-groups; GPU pools live in pinned memory the runtime allocates).
    /// The memory lives as long as the pool or any queue view taken from it.
    ///
    /// # Panics
    /// If `n` is 0 or the allocation fails.
    pub fn new_host(n: usize, geom: QueueGeometry) -> QueuePool {
        assert!(n > 0, "a queue pool needs at least one queue");
        let layout = std::alloc::Layout::from_size_align(n * geom.bytes(), 64).expect("queue pool layout");
        // SAFETY: layout has a nonzero size (n > 0, bytes() >= 256).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = core::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        let alloc = std::sync::Arc::new(HostAlloc { ptr, layout });
        // SAFETY: fresh, zeroed, 64-byte aligned, exactly n * geom.words()
        // words; every view made from it holds `alloc` (keep), so it outlives them.
        let words = unsafe { Words::from_raw(ptr.as_ptr().cast::<u64>(), n * geom.words()) };
        QueuePool { words, geom, n, keep: Some(alloc) }
    }
}
