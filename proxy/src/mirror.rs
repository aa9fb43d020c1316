//! Queue mirrors: how a service thread serves queues that live in GPU memory
//! (`CPNET_QUEUE_MEM=device`, the ComP-Net paper's Fig. 4a comparison),
//! where the proxy cannot load the queue's words itself and must copy them.
//!
//! # Shape
//!
//! Each mirrored queue exists twice, with the layout of `cmd.h`:
//!
//! - the *device* queue, in GPU memory: the work-group writes its slots and
//!   producer block there and reads the control block there;
//! - the *shadow*, in host memory: the service's [`Consumer`] works on it
//!   exactly as on a mapped queue (C1..C5), and the watchdog reads it.
//!
//! Only the proxy writes a device queue's control block, so the mirror
//! knows what the device holds there: its *image* of each control block is
//! what it last pushed. A [`QueueMirror`] runs the protocol below, once,
//! over a [`MirrorCopies`]: [`CudaCopies`] (one non-blocking stream per
//! service thread, pinned shadows) or [`HostCopies`] (a host buffer stands
//! in for GPU memory, for tests without a GPU).
//!
//! # One pass
//!
//! The service calls the mirror around its polling of its active queues:
//!
//! 1. **pull** ([`QueueMirror::pull_slots`]): one device-to-host copy of each
//!    active queue's slot array (depth x 64 bytes) into its shadow, then one
//!    wait for all of them (so the copies of all queues of a thread overlap).
//!    The stream is in order, so that wait also completes the pushes of the
//!    previous pass.
//! 2. **scan**: per queue, from `seen` (the first seq whose commit word no
//!    pull had shown yet), every slot whose shadow commit word is now
//!    `seq + 1` is newly published.
//! 3. **re-read**: those slots are copied again, then one wait. Only now may
//!    the consumer take them (see "Torn slots").
//! 4. the service polls the shadows (take, decode, submit, complete).
//! 5. **push** ([`QueueMirror::push_ctl`]): for each queue whose shadow
//!    control block differs from its image, up to three host-to-device
//!    copies, in this order, each only if its bytes changed: the payload
//!    `[16, 56)` (result, result_seq, error_seq, error, abort), the indices
//!    `[0, 16)` (consumed, completed), the reply word `[56, 64)`. Not waited
//!    for: the next pull's wait completes them.
//!
//! Every [`crate::service::ACTIVE_REFRESH_PASSES`] passes, and at most once
//! per [`crate::service::MIRROR_REFRESH_INTERVAL`], the service pulls
//! the producer block (bytes `[64, 128)`) of every queue it owns and waits
//! ([`QueueMirror::pull_producers`]): `in_use` chooses the queues to poll;
//! an error report pulls its queue's block again first, for `owner`.
//!
//! So a command's round trip costs at least three copies (the pull that
//! sees it, the re-read, the push that completes it) and two waits, against
//! none on mapped queues.
//!
//! # Torn slots
//!
//! The producer fills words 0..6 of a slot and then stores the commit word
//! with release (P2, P3 in `cmd.h`). A copy engine reading the slot gives no
//! order among the bytes it reads: one copy can return the new commit word
//! with old body bytes. So a slot whose commit word a pull shows for the
//! first time is never decoded from that pull: it is copied again, by a copy
//! queued after the wait that ended the first one. The producer's release
//! made the body visible before the commit word; the first copy saw the
//! commit word; the re-read starts after it, so it reads the body. This
//! stands in for C1's acquire: on the shadow the consumer's acquire load of
//! the commit word pairs with no release (a copy wrote it); the order comes
//! from copy 1 (saw the commit) -> wait -> copy 2 (the body) -> wait.
//!
//! Slots the consumer has already seen keep their bytes on the device (the
//! producer reuses a slot only after `consumed` passed it, P1, and the device
//! `consumed` is never ahead of the consumer), so later pulls copy the same
//! bytes over them. A slot beyond the first one still unpublished may hold
//! a torn body after a pull; the consumer stops at that first one (C1), and
//! the scan reaches the later slots in a later pass, where they are newly
//! seen and re-read.
//!
//! # Why three push copies, in that order
//!
//! A work-group reads the control block in two orders: after its acquire of
//! `reply` (P4, blocking calls) it reads `result_seq` and `result`; after its
//! acquire of `completed` (P4, quiet) it reads `error_seq` and `error`. One
//! copy of `[0, 56)` lands as two 32-byte sectors whose order a polling
//! kernel may observe either way, so `completed` could be seen before
//! `error_seq`. A copy on a stream starts after the previous one completed,
//! so payload, then indices, then reply gives C4's order (the payload before
//! `completed`) and C5's (everything before `reply`) on the device.
//!
//! # What others see of a shadow
//!
//! The watchdog reads the shadows: their control blocks are the consumer's
//! own (newer than the device's), their producer blocks are as of the last
//! pull (`owner` and `written` may lag up to one refresh), and their slots
//! as of the last pull (a slot beyond the consumer's next one may be torn:
//! [`QueueMem::peek`] is a report there, nothing is taken from it). The
//! host's abort sets the shadows' `ctl.abort`; a mirror pushes it with the
//! payload of every queue it polls, and a queue whose control block differs
//! from its image stays in the active list until it was pushed.

use std::any::Any;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cpnet_device::layout::{
    CPNET_CMD_COMMIT_WORD, CPNET_CTL_BYTES, CPNET_CTL_OFF_ABORT, CPNET_CTL_OFF_COMPLETED, CPNET_CTL_OFF_CONSUMED,
    CPNET_CTL_OFF_ERROR, CPNET_CTL_OFF_ERROR_SEQ, CPNET_CTL_OFF_REPLY, CPNET_CTL_OFF_RESULT, CPNET_CTL_OFF_RESULT_SEQ,
    CPNET_PROD_BYTES, CPNET_QUEUE_OFF_CTL, CPNET_QUEUE_OFF_PROD, CPNET_QUEUE_OFF_SLOTS, CPNET_SLOT_BYTES, SLOT_WORDS,
};
use cpnet_device::ring::{QueueGeometry, QueueMem, QueuePool};
use cpnet_device::sync::Ordering;
use cudarc::driver::CudaContext;

use crate::cuda::{CudaError, Pinned, Stream};

#[cfg(doc)]
use cpnet_device::ring::Consumer;

/// Words in a control block.
pub const CTL_WORDS: usize = CPNET_CTL_BYTES / 8;

/// Bytes of the control block pushed first: the completion's payload
/// (`result`, `result_seq`, `error_seq`, `error`) and `abort`.
pub const CTL_PAYLOAD: Range<usize> = CPNET_CTL_OFF_RESULT..CPNET_CTL_OFF_REPLY;
/// Bytes of the control block pushed second: `consumed` and `completed`.
pub const CTL_INDICES: Range<usize> = CPNET_CTL_OFF_CONSUMED..CPNET_CTL_OFF_RESULT;
/// Bytes of the control block pushed last: `reply` (C5).
pub const CTL_REPLY: Range<usize> = CPNET_CTL_OFF_REPLY..CPNET_CTL_BYTES;

// The three ranges tile the control block, with each field where the split
// above says it is.
const _: () = {
    assert!(CPNET_CTL_OFF_CONSUMED == 0 && CPNET_CTL_OFF_COMPLETED == 8 && CPNET_CTL_OFF_RESULT == 16);
    assert!(CPNET_CTL_OFF_RESULT < CPNET_CTL_OFF_RESULT_SEQ && CPNET_CTL_OFF_RESULT_SEQ < CPNET_CTL_OFF_ERROR_SEQ);
    assert!(CPNET_CTL_OFF_ERROR_SEQ < CPNET_CTL_OFF_ERROR && CPNET_CTL_OFF_ERROR < CPNET_CTL_OFF_ABORT);
    assert!(CPNET_CTL_OFF_ABORT < CPNET_CTL_OFF_REPLY && CPNET_CTL_OFF_REPLY + 8 == CPNET_CTL_BYTES);
    assert!(CPNET_QUEUE_OFF_CTL == 0 && CPNET_QUEUE_OFF_PROD == CPNET_CTL_BYTES);
    assert!(CPNET_QUEUE_OFF_SLOTS == CPNET_QUEUE_OFF_PROD + CPNET_PROD_BYTES);
};

/// Bytes of the producer block in a queue.
const PROD: Range<usize> = CPNET_QUEUE_OFF_PROD..CPNET_QUEUE_OFF_PROD + CPNET_PROD_BYTES;

/// A copy between a device queue and its shadow failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    /// A CUDA call failed (a copy, or the stream's synchronize; a failed
    /// copy leaves a sticky error in the context).
    #[error("queue mirror (queues in GPU memory): {0}")]
    Cuda(#[from] CudaError),
    /// A failure injected by [`HostCopies::fail_at_wait`] (tests): the wait
    /// number (1-based) that failed.
    #[error("queue mirror: injected failure at wait {0} (HostCopies::fail_at_wait)")]
    Injected(u64),
}

/// The copies a [`QueueMirror`] needs, between each device queue and its
/// shadow, on one ordered stream: a copy starts after every copy queued
/// before it has completed. Queues are numbered `0..queues()` (the
/// service's queue indices).
///
/// Implementations: [`CudaCopies`], [`HostCopies`]. `Send`, so a service
/// (which may be built on one thread and run on another) stays `Send`.
pub trait MirrorCopies: Send {
    /// Number of queues.
    fn queues(&self) -> usize;

    /// The geometry of every queue.
    fn geometry(&self) -> QueueGeometry;

    /// The shadow of queue `q`: host memory with the queue's layout, read
    /// and written through atomics by the consumer (and read by the
    /// watchdog); zeroed before first use.
    fn shadow(&self, q: usize) -> QueueMem;

    /// Queue a copy of bytes `bytes` of device queue `q` into the same bytes
    /// of its shadow (never the control block: `bytes.start >= 64`). Its
    /// result may be read only after the next [`MirrorCopies::wait`].
    ///
    /// # Errors
    /// [`MirrorError::Cuda`].
    fn pull(&mut self, q: usize, bytes: Range<usize>) -> Result<(), MirrorError>;

    /// Queue a copy of `words` into device queue `q`'s control block at
    /// byte `off` (a multiple of 8, `off + 8 * words.len() <= 64`). The
    /// words are taken now; the caller's slice may be reused at once.
    ///
    /// # Errors
    /// [`MirrorError::Cuda`].
    fn push(&mut self, q: usize, off: usize, words: &[u64]) -> Result<(), MirrorError>;

    /// Wait until every queued copy has completed.
    ///
    /// # Errors
    /// [`MirrorError::Cuda`] (a copy failed).
    fn wait(&mut self) -> Result<(), MirrorError>;
}

/// The contract of [`MirrorCopies::pull`], checked by every
/// implementation before it copies: inside the queue, never the control
/// block.
fn check_pull(geom: QueueGeometry, bytes: &Range<usize>) {
    assert!(bytes.start >= CPNET_QUEUE_OFF_PROD && bytes.end <= geom.bytes(), "pull of {bytes:?}");
}

/// The contract of [`MirrorCopies::push`], checked by every
/// implementation before it copies: whole words inside the control block.
fn check_push(off: usize, words: usize) {
    assert!(off.is_multiple_of(8) && off + 8 * words <= CPNET_CTL_BYTES, "push of {words} words at {off}");
}

/// What a mirror has done, for tests and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MirrorStats {
    /// Passes that pulled slot arrays.
    pub passes: u64,
    /// Slot-array pulls (one per active queue per pass).
    pub slot_pulls: u64,
    /// Slots copied a second time because the pull before had shown their
    /// commit word for the first time.
    pub rereads: u64,
    /// Of those, slots whose body the second copy changed: the first copy
    /// had read it torn (new commit word, old body).
    pub torn: u64,
    /// Producer-block pulls.
    pub producer_pulls: u64,
    /// Host-to-device copies of control-block ranges.
    pub pushes: u64,
    /// Waits for the stream.
    pub waits: u64,
}

/// The proxy side of queues in GPU memory: the protocol of the
/// [module docs](self) over a [`MirrorCopies`]. Used by one service thread
/// ([`crate::service::Service::with_mirror`]) at a time; the queue indices
/// of its methods are the service's.
pub struct QueueMirror {
    copies: Box<dyn MirrorCopies>,
    shadows: Vec<QueueMem>,
    geom: QueueGeometry,
    /// Per queue: the first seq whose commit word no pull has shown. Every
    /// slot from the consumer's next seq up to it was copied after its
    /// commit word had been seen (re-read), so the shadow holds its body.
    seen: Vec<u64>,
    /// Per queue: the device's control block, i.e. what was last pushed
    /// (only the proxy writes it; both start zeroed).
    image: Vec<[u64; CTL_WORDS]>,
    /// Copies were queued since the last wait.
    unwaited: bool,
    /// This pass's newly seen slots: (queue, first seq, end seq).
    fresh: Vec<(usize, u64, u64)>,
    /// Words 0..6 of those slots as the first pull left them.
    first: Vec<u64>,
    stats: MirrorStats,
}

impl std::fmt::Debug for QueueMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueMirror").field("queues", &self.shadows.len()).field("stats", &self.stats).finish_non_exhaustive()
    }
}

impl QueueMirror {
    /// A mirror over `copies`; every shadow must be quiescent (`consumed ==
    /// completed`, as [`Consumer::new`] requires), and every device control
    /// block must equal its shadow's (both zeroed at creation).
    pub fn new(copies: Box<dyn MirrorCopies>) -> QueueMirror {
        let shadows: Vec<QueueMem> = (0..copies.queues()).map(|q| copies.shadow(q)).collect();
        let geom = copies.geometry();
        let image: Vec<[u64; CTL_WORDS]> = shadows.iter().map(ctl_words).collect();
        let seen = image.iter().map(|ctl| ctl[CPNET_CTL_OFF_CONSUMED / 8]).collect();
        QueueMirror {
            copies,
            shadows,
            geom,
            seen,
            image,
            unwaited: false,
            fresh: Vec::new(),
            first: Vec::new(),
            stats: MirrorStats::default(),
        }
    }

    /// The shadows, in queue order: the views the service's consumers use.
    pub fn shadows(&self) -> Vec<QueueMem> {
        self.shadows.clone()
    }

    /// Number of queues.
    pub fn len(&self) -> usize {
        self.shadows.len()
    }

    /// Whether the mirror has no queues.
    pub fn is_empty(&self) -> bool {
        self.shadows.is_empty()
    }

    /// What the mirror has done so far.
    pub fn stats(&self) -> MirrorStats {
        self.stats
    }

    fn wait(&mut self) -> Result<(), MirrorError> {
        self.stats.waits += 1;
        self.unwaited = false;
        self.copies.wait()
    }

    /// Copy the producer blocks (`in_use`, `owner`, `write_idx`) of
    /// `queues` into their shadows and wait.
    ///
    /// # Errors
    /// [`MirrorError`] from the copies.
    pub fn pull_producers(&mut self, queues: &[usize]) -> Result<(), MirrorError> {
        for &q in queues {
            self.copies.pull(q, PROD)?;
            self.stats.producer_pulls += 1;
        }
        self.wait()
    }

    /// Steps 1..3 of a pass (module docs): bring every slot the consumers
    /// of `queues` may take next into their shadows, re-reading the newly
    /// published ones. On return the consumer of each of `queues` may poll
    /// its shadow: every slot it can take holds the body its producer
    /// published. With no queues, only completes earlier pushes.
    ///
    /// # Errors
    /// [`MirrorError`] from the copies.
    pub fn pull_slots(&mut self, queues: &[usize]) -> Result<(), MirrorError> {
        if queues.is_empty() {
            return if self.unwaited { self.wait() } else { Ok(()) };
        }
        self.stats.passes += 1;
        let slots = CPNET_QUEUE_OFF_SLOTS..CPNET_QUEUE_OFF_SLOTS + self.geom.depth() as usize * CPNET_SLOT_BYTES;
        for &q in queues {
            self.copies.pull(q, slots.clone())?;
        }
        self.stats.slot_pulls += queues.len() as u64;
        // Wait 1: the pulls (and every earlier push) are complete; the
        // shadows' slot bytes are the ones the copies read.
        self.wait()?;
        self.fresh.clear();
        self.first.clear();
        let depth = u64::from(self.geom.depth());
        for &q in queues {
            let from = self.seen[q];
            // The consumer's next seq is the shadow's `consumed` (it stores
            // it, on this thread, at C3); relaxed: our own store.
            let next = self.shadows[q].words().word((CPNET_QUEUE_OFF_CTL + CPNET_CTL_OFF_CONSUMED) / 8).load(Ordering::Relaxed);
            let mut end = from;
            // At most one lap ahead of the consumer (P1 keeps the producer
            // there): the bound only guards against a corrupted device queue.
            while end < next + depth && self.commit(q, end) == end + 1 {
                end += 1;
            }
            if end > from {
                for seq in from..end {
                    for w in 0..CPNET_CMD_COMMIT_WORD {
                        let v = self.slot_word(q, seq, w).load(Ordering::Relaxed);
                        self.first.push(v);
                    }
                }
                self.fresh.push((q, from, end));
            }
        }
        if self.fresh.is_empty() {
            return Ok(());
        }
        // Re-read: queued after wait 1, so after the copies that showed the
        // commit words; the slot ranges are contiguous except at the wrap.
        for &(q, from, end) in &self.fresh {
            let mask = self.geom.mask();
            let (a, n) = ((from & mask) as usize, (end - from) as usize);
            let depth = self.geom.depth() as usize;
            let first = a..(a + n).min(depth);
            let wrapped = 0..(a + n).saturating_sub(depth);
            for r in [first, wrapped] {
                if !r.is_empty() {
                    let at = |s: usize| CPNET_QUEUE_OFF_SLOTS + s * CPNET_SLOT_BYTES;
                    self.copies.pull(q, at(r.start)..at(r.end))?;
                }
            }
            self.stats.rereads += end - from;
        }
        // Wait 2: the re-read bodies are in the shadows.
        self.wait()?;
        let mut k = 0;
        for i in 0..self.fresh.len() {
            let (q, from, end) = self.fresh[i];
            let mut upto = end;
            for seq in from..end {
                let torn = (0..CPNET_CMD_COMMIT_WORD).any(|w| self.slot_word(q, seq, w).load(Ordering::Relaxed) != self.first[k + w]);
                self.stats.torn += u64::from(torn);
                k += CPNET_CMD_COMMIT_WORD;
                if upto == end && self.commit(q, seq) != seq + 1 {
                    // Impossible under P1..P3 (the producer cannot reuse a
                    // slot the consumer has not taken): take nothing from
                    // here on, and look again next pass.
                    tracing::warn!("queue mirror: queue {q}: the commit word of seq {seq} changed between two copies");
                    upto = seq;
                }
            }
            self.seen[q] = upto;
        }
        Ok(())
    }

    /// Step 5 of a pass (module docs): for each of `queues` whose shadow
    /// control block differs from the device's, queue the copies of the
    /// payload, the indices and the reply word (those that changed, in that
    /// order). Not waited for.
    ///
    /// # Errors
    /// [`MirrorError`] from the copies.
    pub fn push_ctl(&mut self, queues: &[usize]) -> Result<(), MirrorError> {
        for &q in queues {
            let now = ctl_words(&self.shadows[q]);
            let old = self.image[q];
            if now == old {
                continue;
            }
            for r in [CTL_PAYLOAD, CTL_INDICES, CTL_REPLY] {
                let w = r.start / 8..r.end / 8;
                if now[w.clone()] != old[w.clone()] {
                    self.copies.push(q, r.start, &now[w])?;
                    self.stats.pushes += 1;
                    self.unwaited = true;
                }
            }
            self.image[q] = now;
        }
        Ok(())
    }

    /// Whether queue `q`'s shadow control block differs from the device's
    /// (completions or an abort not pushed yet).
    pub fn unpushed(&self, q: usize) -> bool {
        ctl_words(&self.shadows[q]) != self.image[q]
    }

    /// Wait for every queued copy (the pushes of the last pass); call when
    /// the service stops.
    ///
    /// # Errors
    /// [`MirrorError`] from the copies.
    pub fn flush(&mut self) -> Result<(), MirrorError> {
        if self.unwaited { self.wait() } else { Ok(()) }
    }

    fn slot_word(&self, q: usize, seq: u64, w: usize) -> &cpnet_device::sync::AtomicU64 {
        let slot = (seq & self.geom.mask()) as usize;
        self.shadows[q].words().word(CPNET_QUEUE_OFF_SLOTS / 8 + slot * SLOT_WORDS + w)
    }

    /// The shadow commit word of slot `seq`. Relaxed: a copy wrote it, and
    /// the wait after that copy ordered its write before this load (the
    /// shadow's slots are written by nothing else).
    fn commit(&self, q: usize, seq: u64) -> u64 {
        self.slot_word(q, seq, CPNET_CMD_COMMIT_WORD).load(Ordering::Relaxed)
    }
}

/// The control block of `shadow`, word by word. Relaxed: every word but
/// `abort` is written by the consumer, on the thread that calls this; the
/// host's abort store carries nothing else (the kernel reads it as "stop").
fn ctl_words(shadow: &QueueMem) -> [u64; CTL_WORDS] {
    core::array::from_fn(|w| shadow.words().word(CPNET_QUEUE_OFF_CTL / 8 + w).load(Ordering::Relaxed))
}

// ---------------------------------------------------------------------------
// CUDA
// ---------------------------------------------------------------------------

/// The copies of a mirror over device queues in CUDA memory: one
/// `CU_STREAM_NON_BLOCKING` stream (created on, and used by, one service
/// thread; it runs beside the persistent kernels), shadows in pinned host
/// memory (so the copies are truly asynchronous), and a pinned outbox per
/// queue from which control-block ranges are pushed. Every copy of a pass
/// is queued before one `cuStreamSynchronize`, so the copies of all queues
/// of a thread overlap. It may move between threads; each call makes the
/// context current on the calling thread first if it is a new one.
pub struct CudaCopies {
    // Field order is drop order; Drop synchronizes the stream first.
    stream: Stream,
    /// 64 bytes per queue: the words of queued pushes.
    outbox: Pinned,
    /// Per queue: (device address, shadow address).
    queues: Vec<(u64, *mut u8)>,
    shadows: Vec<QueueMem>,
    geom: QueueGeometry,
    /// Per queue: the outbox words read by pushes not yet waited for (bit w:
    /// word w), which must not be rewritten before the copy has read them.
    in_flight: Vec<u8>,
    cuda: Arc<CudaContext>,
    /// The thread the context was last made current on by this value.
    bound: std::thread::ThreadId,
    /// Owns the device queues and the shadows.
    _keep: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the raw pointers point into memory that `_keep` (Send + Sync)
// owns, and no other value copies through them; the stream and the pinned
// outbox are driver handles that any thread may use once the context is
// current there, which `bind` ensures before every driver call.
unsafe impl Send for CudaCopies {}

impl std::fmt::Debug for CudaCopies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCopies").field("queues", &self.queues.len()).field("geom", &self.geom).finish_non_exhaustive()
    }
}

impl CudaCopies {
    /// Copies for `queues`, each `(device address, shadow address)` of one
    /// queue of `geom`, on a new non-blocking stream of `cuda` (bound to the
    /// calling thread, which must be the one that uses the result).
    ///
    /// # Safety
    /// 1. Each device address is the start of `geom.bytes()` bytes of device
    ///    memory of `cuda`; each shadow address is the start of
    ///    `geom.bytes()` bytes of pinned host memory (`cuMemHostAlloc`),
    ///    64-byte aligned and zeroed before first use; the device control
    ///    blocks are zeroed too.
    /// 2. Both stay allocated while `keep` lives (the result holds it).
    /// 3. No other agent writes a device queue's control block or a shadow's
    ///    slots and producer block; everything else touches the shadows only
    ///    through atomics ([`QueueMem`]), and the device queues only as
    ///    THE QUEUE PROTOCOL of `cmd.h` says (the work-group's side).
    ///
    /// # Errors
    /// [`CudaError`] from binding the context, creating the stream or
    /// allocating the outbox.
    pub unsafe fn new(
        cuda: &Arc<CudaContext>,
        geom: QueueGeometry,
        queues: Vec<(u64, *mut u8)>,
        keep: Arc<dyn Any + Send + Sync>,
    ) -> Result<CudaCopies, CudaError> {
        cuda.bind_to_thread().map_err(|source| CudaError { what: "cuCtxSetCurrent (queue mirror)", source })?;
        let stream = Stream::new()?;
        let outbox = Pinned::new(CPNET_CTL_BYTES * queues.len())?;
        let shadows = queues
            .iter()
            .map(|&(_, host)| {
                // SAFETY: clauses 1 and 2: 64-byte aligned, zeroed, valid for
                // geom.bytes() while `keep` lives, which this value holds (the
                // views go to the service that owns this value); clause 3:
                // everyone else uses atomics, and only this value copies.
                unsafe { QueueMem::from_raw(host, geom) }
            })
            .collect();
        let in_flight = vec![0; queues.len()];
        let bound = std::thread::current().id();
        Ok(CudaCopies { stream, outbox, queues, shadows, geom, in_flight, cuda: Arc::clone(cuda), bound, _keep: keep })
    }

    /// Make the context current if this thread is not the one it was made
    /// current on last.
    fn bind(&mut self) -> Result<(), MirrorError> {
        let me = std::thread::current().id();
        if me != self.bound {
            self.cuda.bind_to_thread().map_err(|source| CudaError { what: "cuCtxSetCurrent (queue mirror)", source })?;
            self.bound = me;
        }
        Ok(())
    }
}

impl MirrorCopies for CudaCopies {
    fn queues(&self) -> usize {
        self.queues.len()
    }

    fn geometry(&self) -> QueueGeometry {
        self.geom
    }

    fn shadow(&self, q: usize) -> QueueMem {
        self.shadows[q].clone()
    }

    fn pull(&mut self, q: usize, bytes: Range<usize>) -> Result<(), MirrorError> {
        check_pull(self.geom, &bytes);
        self.bind()?;
        let (dev, host) = self.queues[q];
        // SAFETY: both ranges lie inside queue q (check_pull), on the device
        // and in the pinned shadow (`new`, clauses 1, 2). Until the next wait
        // only the watchdog reads these shadow bytes, through atomics, for a
        // report (a half-done copy reads as a stale or torn slot, as a slot
        // a GPU is writing does on a mapped queue); the consumer reads them
        // after the wait.
        unsafe { self.stream.dtoh(host.add(bytes.start), dev + bytes.start as u64, bytes.len()) }?;
        Ok(())
    }

    fn push(&mut self, q: usize, off: usize, words: &[u64]) -> Result<(), MirrorError> {
        check_push(off, words.len());
        self.bind()?;
        let mask = (0..words.len()).fold(0u8, |m, i| m | 1 << (off / 8 + i));
        if self.in_flight[q] & mask != 0 {
            // An earlier push still reads these outbox words.
            self.wait()?;
        }
        // SAFETY: inside the outbox (64 bytes per queue, 8-aligned: the
        // allocation is page aligned); no queued copy reads these words
        // (in_flight, checked above), and nothing else touches the outbox.
        let src = unsafe { self.outbox.ptr().add(CPNET_CTL_BYTES * q + off) };
        // SAFETY: as above: `words.len()` words inside the outbox, ours now.
        unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), src.cast::<u64>(), words.len()) };
        let dev = self.queues[q].0 + (CPNET_QUEUE_OFF_CTL + off) as u64;
        // SAFETY: the source is pinned (the outbox) and stays unmodified
        // until a wait (in_flight); the destination is inside queue q's
        // control block on the device (`new`, clause 1).
        unsafe { self.stream.htod(dev, src, 8 * words.len()) }?;
        self.in_flight[q] |= mask;
        Ok(())
    }

    fn wait(&mut self) -> Result<(), MirrorError> {
        self.bind()?;
        self.stream.synchronize()?;
        self.in_flight.fill(0);
        Ok(())
    }
}

impl Drop for CudaCopies {
    fn drop(&mut self) {
        // Copies may still read the outbox or write the shadows: let them
        // finish before either is freed.
        let _ = self.cuda.bind_to_thread();
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!("queue mirror teardown: {e}");
        }
    }
}

// ---------------------------------------------------------------------------
// Host (tests)
// ---------------------------------------------------------------------------

/// One copy as [`HostCopies`] logs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CopyRecord {
    /// Device to shadow: queue, bytes.
    Pull(usize, Range<usize>),
    /// Outbox to device control block: queue, bytes of the control block.
    Push(usize, Range<usize>),
    /// A wait.
    Wait,
}

/// A copy queued on a [`HostCopies`] that runs at the next wait.
enum Pending {
    Pull(usize, Range<usize>),
    Push(usize, usize, Vec<u64>),
}

/// Called after a pull ran, with its queue and bytes.
type PullHook = Box<dyn FnMut(usize, &Range<usize>) + Send>;

/// The copies of a mirror whose "device" queues are another host pool, for
/// tests without a GPU: a CPU producer ([`cpnet_device::ring::Producer`],
/// [`cpnet_device::cpu::CpuCtx`]) writes the device pool as a work-group
/// writes GPU memory, and the service serves the shadows.
///
/// A copy runs word by word through atomics, in ascending order, like a
/// copy engine with no order among the bytes it reads: a pull can see a
/// slot's new commit word and its old body. Pulls load with acquire (pairs
/// with the producer's release stores, P3 and `release()`: a later copy
/// reads what preceded the word it saw) and pushes store with release
/// (pairs with the producer's acquire loads, P1 and P4: as the stream order
/// of CUDA copies does, an earlier copy is visible with the word a later
/// one wrote).
///
/// Immediate by default (a copy runs when queued); [`HostCopies::deferred`]
/// holds every copy until the next wait, as a stream may.
pub struct HostCopies {
    device: Vec<QueueMem>,
    shadows: Vec<QueueMem>,
    geom: QueueGeometry,
    deferred: bool,
    pending: Vec<Pending>,
    on_pull: Option<PullHook>,
    log: Option<Arc<Mutex<Vec<CopyRecord>>>>,
    /// Waits so far, and the first one that fails (fault injection).
    waits: u64,
    fail_at: Option<u64>,
}

impl std::fmt::Debug for HostCopies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCopies").field("queues", &self.device.len()).field("deferred", &self.deferred).finish_non_exhaustive()
    }
}

impl HostCopies {
    /// Copies between queue `i` of `device` and queue `i` of `shadows`.
    ///
    /// # Panics
    /// If the pools differ in size or geometry.
    pub fn new(device: &QueuePool, shadows: &QueuePool) -> HostCopies {
        assert_eq!((device.len(), device.geometry()), (shadows.len(), shadows.geometry()), "device and shadow pools");
        HostCopies {
            device: (0..device.len()).map(|q| device.queue(q)).collect(),
            shadows: (0..shadows.len()).map(|q| shadows.queue(q)).collect(),
            geom: device.geometry(),
            deferred: false,
            pending: Vec::new(),
            on_pull: None,
            log: None,
            waits: 0,
            fail_at: None,
        }
    }

    /// Fault injection: the `n`-th wait (1-based) and every later one fail
    /// with [`MirrorError::Injected`], as a failed CUDA copy would, running
    /// none of the copies queued before them.
    pub fn fail_at_wait(mut self, n: u64) -> HostCopies {
        self.fail_at = Some(n);
        self
    }

    /// Run copies at the next wait instead of when queued.
    pub fn deferred(mut self) -> HostCopies {
        self.deferred = true;
        self
    }

    /// Call `hook(queue, bytes)` after each pull ran (e.g. to finish writing
    /// a slot body after a copy read it torn).
    pub fn on_pull(mut self, hook: impl FnMut(usize, &Range<usize>) + Send + 'static) -> HostCopies {
        self.on_pull = Some(Box::new(hook));
        self
    }

    /// Log every copy and wait, in the order they ran, into the returned
    /// list.
    pub fn with_log(mut self) -> (HostCopies, Arc<Mutex<Vec<CopyRecord>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        self.log = Some(Arc::clone(&log));
        (self, log)
    }

    fn record(&self, r: CopyRecord) {
        if let Some(log) = &self.log {
            log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(r);
        }
    }

    fn run(&mut self, p: Pending) {
        match p {
            Pending::Pull(q, bytes) => {
                let (dev, sh) = (self.device[q].words(), self.shadows[q].words());
                for w in bytes.start / 8..bytes.end / 8 {
                    // Acquire / relaxed: see the type's docs.
                    sh.word(w).store(dev.word(w).load(Ordering::Acquire), Ordering::Relaxed);
                }
                self.record(CopyRecord::Pull(q, bytes.clone()));
                if let Some(hook) = &mut self.on_pull {
                    hook(q, &bytes);
                }
            }
            Pending::Push(q, off, words) => {
                let dev = self.device[q].words();
                for (i, &v) in words.iter().enumerate() {
                    // Release: see the type's docs.
                    dev.word((CPNET_QUEUE_OFF_CTL + off) / 8 + i).store(v, Ordering::Release);
                }
                self.record(CopyRecord::Push(q, off..off + 8 * words.len()));
            }
        }
    }

    fn queue_copy(&mut self, p: Pending) {
        if self.deferred { self.pending.push(p) } else { self.run(p) }
    }
}

impl MirrorCopies for HostCopies {
    fn queues(&self) -> usize {
        self.device.len()
    }

    fn geometry(&self) -> QueueGeometry {
        self.geom
    }

    fn shadow(&self, q: usize) -> QueueMem {
        self.shadows[q].clone()
    }

    fn pull(&mut self, q: usize, bytes: Range<usize>) -> Result<(), MirrorError> {
        check_pull(self.geom, &bytes);
        self.queue_copy(Pending::Pull(q, bytes));
        Ok(())
    }

    fn push(&mut self, q: usize, off: usize, words: &[u64]) -> Result<(), MirrorError> {
        check_push(off, words.len());
        self.queue_copy(Pending::Push(q, off, words.to_vec()));
        Ok(())
    }

    fn wait(&mut self) -> Result<(), MirrorError> {
        self.waits += 1;
        if self.fail_at.is_some_and(|n| self.waits >= n) {
            self.pending.clear();
            return Err(MirrorError::Injected(self.waits));
        }
        for p in std::mem::take(&mut self.pending) {
            self.run(p);
        }
        self.record(CopyRecord::Wait);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_ranges_tile_the_control_block_in_order() {
        assert_eq!((CTL_PAYLOAD.start, CTL_PAYLOAD.end), (16, 56));
        assert_eq!((CTL_INDICES.start, CTL_INDICES.end), (0, 16));
        assert_eq!((CTL_REPLY.start, CTL_REPLY.end), (56, 64));
        assert!(CTL_PAYLOAD.contains(&CPNET_CTL_OFF_ERROR_SEQ) && CTL_PAYLOAD.contains(&CPNET_CTL_OFF_ABORT));
        assert!(CTL_INDICES.contains(&CPNET_CTL_OFF_COMPLETED));
    }
}
