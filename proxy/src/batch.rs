//! Put batches: small puts to one PE travel together, as one message.
//!
//! A put of at most [`BATCH_PUT_MAX`] bytes to another PE does not become a
//! fabric operation of its own. The service thread appends it, as a record
//! (target offset, length, the bytes), to the *open batch* of its target PE,
//! a registered send buffer of [`BATCH_BYTES`]. At the end of every pass over
//! the queues ([`crate::service::Transport::end_pass`]), and whenever an open
//! batch is full, the batch goes out as one `fi_send` (fi_msg(3)). So the
//! puts a pass drains from every queue cost one send per target PE, not one
//! `fi_writemsg` each (what `FI_MORE` would ask of a provider; `shm` and
//! `tcp;ofi_rxm` 1.17 ignore that flag, docs/runtime.md "What the providers
//! offer").
//!
//! # The protocol
//!
//! | step | who | what |
//! |---|---|---|
//! | B1 | initiator | appends records to the open batch of PE `p`; the batch has the next sequence number `s` of the stream to `p` |
//! | B2 | initiator | `fi_send`s it to `p` when the pass ends or it is full, if fewer than `credits` batches to `p` are unacknowledged, and, at the end of a pass, only if it holds [`HOLD_BELOW`] bytes, no batch to `p` is unacknowledged or the pass took a command that waits (urgent); else the batch keeps filling (and goes out once an acknowledgement comes), and once full and out of credit, puts to `p` are refused (`Submit::Busy`) |
//! | B3 | target | the receive completes (its proxy polls its completion queue): it copies every record into its heap, in order, then reposts the buffer |
//! | B4 | target | writes `s`, the last batch applied from the initiator, into the initiator's *mailbox* word for it (`fi_inject_write` of 8 bytes): at the end of the pass if a batch applied asked for it (*urgent*: sent by a pass that took a blocking command or a fence, quiet or barrier, or sent for B6), else at the end of the first pass that brings no new batch from that initiator, or once `credits / 2` batches are unacknowledged |
//! | B5 | initiator | reads its mailbox word for `p` (acquire) each pass: every put of a batch `<= s` is complete, visible at `p` |
//!
//! | B6 | initiator | any other operation to `p` (a get, an AMO, a put-signal, a larger put) waits until every batch to `p` opened before it is acknowledged (`Submit::Busy` meanwhile) |
//!
//! Batches from one thread to one PE are applied in the order sent: both
//! providers grant `FI_ORDER_SAS` (asked for, fi_getinfo(3)), and the
//! receive buffers complete in the order the messages arrive. So a
//! mailbox value acknowledges every batch up to it.
//!
//! # What holds
//!
//! A batched put is complete only when its target has applied it, as a
//! delivery-complete write is: `quiet`, `fence` (the service drains the
//! queue), blocking puts and `barrier_all` keep their meaning. Operations
//! of one queue to one PE take effect in issue order, also between fences,
//! where OpenSHMEM would allow any order, as they did before batches (the
//! providers process one endpoint's operations to one peer in order):
//! batched puts among themselves (records in order, batches in order); an
//! operation that follows batched puts waits for their acknowledgement
//! (B6); one that precedes them is processed by the provider at the target
//! before the batch message that follows it is delivered.
//!
//! # Flow control
//!
//! Each thread posts `credits * (n_pes - 1)` receive buffers of
//! [`BATCH_BYTES`], `credits` per peer, and never has more than `credits`
//! batches unacknowledged toward one peer, so a batch always finds a
//! buffer. `credits` is [`CREDITS`], fewer for large jobs
//! ([`credits_for`]).

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use cpnet_device::cpu::{HeapView, SymAddr};
use cpnet_device::ring::Outcome;

use crate::decode::{Op, PutSrc};
use crate::fabric::{Domain, Endpoint, FabricError, FiAddr, MemoryRegion, Post, RemoteMemory};
use crate::reach::PeerWatch;
use crate::service::{Finished, Submit, Tag};

/// Largest put carried in a batch, in bytes; larger ones are one
/// delivery-complete write each.
pub const BATCH_PUT_MAX: u64 = 256;

/// Bytes of one batch message (header and records). 4 KiB: what `shm`
/// 1.17 copies through its inject buffers (larger messages take its
/// `process_vm_readv` path), and below `ofi_rxm`'s eager limit.
pub const BATCH_BYTES: usize = 4096;

/// An open batch smaller than this waits while an earlier batch to its PE
/// is unacknowledged (B2), so a stream of puts goes out in fuller batches:
/// fewer sends (each a `sendmsg` over tcp) and fewer acknowledgements.
pub const HOLD_BELOW: usize = BATCH_BYTES / 2;

/// Send buffers per thread: batches being filled or being sent.
pub const SEND_BUFFERS: usize = 64;

/// Batches one thread keeps unacknowledged toward one PE, at most
/// (jobs of more than 129 PEs use fewer: [`credits_for`]).
pub const CREDITS: u32 = 8;

/// PEs a mailbox has words for: jobs larger than this send every put on
/// its own (no batches).
pub const MAILBOX_PES: usize = 4096;

/// Receive buffers one thread posts at most (all peers together).
const MAX_RECV_BUFFERS: u32 = 1024;

/// Completion contexts of batch sends and receives: above every slot index
/// of the transport (those are below `MAX_INFLIGHT`).
pub(crate) const CTX_SEND: u64 = 1 << 32;
pub(crate) const CTX_RECV: u64 = 2 << 32;
const CTX_INDEX: u64 = (1 << 32) - 1;

/// Batch header: `MAGIC | records << 32`, `src_pe | bytes << 32`, `seq`.
const HDR_BYTES: usize = 24;
const MAGIC: u64 = 0x7462_7063; // "cpbt"
/// Batch header flag (in the `src_pe | bytes << 32` word): acknowledge at
/// once, someone waits (B4).
const URGENT: u64 = 1 << 63;
/// Record header: target offset in the low 48 bits, length in the top 16.
const OFF_BITS: u32 = 48;

// The largest record fits an empty batch, and its length fits its bits.
const _: () = assert!(HDR_BYTES + 8 + BATCH_PUT_MAX as usize <= BATCH_BYTES);
const _: () = assert!(BATCH_PUT_MAX < 1 << (64 - OFF_BITS));

/// Batches unacknowledged per peer for a job of `n_pes`: [`CREDITS`], fewer
/// when the receive buffers for every peer would pass 1024 (at least 1).
pub fn credits_for(n_pes: i32) -> u32 {
    let peers = (n_pes.max(2) - 1) as u32;
    (MAX_RECV_BUFFERS / peers).clamp(1, CREDITS)
}

/// Words of memory the fabric reads or writes behind Rust's back: touched
/// only through raw pointers and atomics.
pub(crate) struct Words {
    ptr: *mut u64,
    len: usize,
}

impl Words {
    pub(crate) fn new(len: usize) -> Words {
        let b: Box<[u64]> = vec![0u64; len].into_boxed_slice();
        Words { ptr: Box::into_raw(b).cast(), len }
    }

    fn bytes(&self) -> usize {
        self.len * 8
    }

    fn byte_ptr(&self, off: usize) -> *mut u8 {
        assert!(off <= self.bytes());
        // SAFETY: in bounds of the allocation (checked above).
        unsafe { self.ptr.cast::<u8>().add(off) }
    }

    fn atomic(&self, w: usize) -> &AtomicU64 {
        assert!(w < self.len);
        // SAFETY: in bounds and 8-aligned; the allocation lives as long as
        // `self`, and every access to it is atomic or a raw copy.
        unsafe { AtomicU64::from_ptr(self.ptr.add(w)) }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw of a boxed slice of this length; the
        // regions over it and the endpoint that could touch it are closed
        // first (field order of the owners).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// The registered memory of the batches: opened with the endpoint (send
/// buffers and the mailbox, whose address goes into the card), receive
/// buffers added at connect (their number depends on the job). Field order
/// is drop order: regions before memory.
pub(crate) struct BatchMem {
    send_mr: MemoryRegion,
    mailbox_mr: MemoryRegion,
    recv: Option<(MemoryRegion, Words)>,
    send: Words,
    mailbox: Words,
}

impl BatchMem {
    /// Send buffers and a mailbox of [`MAILBOX_PES`] words, registered in
    /// `domain`.
    pub(crate) fn open(domain: &Rc<Domain>, ep: &Rc<Endpoint>) -> Result<BatchMem, FabricError> {
        let send = Words::new(SEND_BUFFERS * BATCH_BYTES / 8);
        let mailbox = Words::new(MAILBOX_PES);
        // SAFETY: both allocations outlive their regions (field order) and
        // are touched only through raw pointers and atomics.
        let send_mr = unsafe { MemoryRegion::register(domain, send.ptr.cast(), send.bytes(), Some(ep)) }?;
        // SAFETY: as above.
        let mailbox_mr = unsafe { MemoryRegion::register(domain, mailbox.ptr.cast(), mailbox.bytes(), Some(ep)) }?;
        Ok(BatchMem { send_mr, mailbox_mr, recv: None, send, mailbox })
    }

    /// What peers need to acknowledge our batches.
    pub(crate) fn mailbox(&self) -> RemoteMemory {
        self.mailbox_mr.remote()
    }
}

/// An open batch: a send buffer being filled for one peer.
#[derive(Clone, Copy, Debug)]
struct Open {
    buf: u32,
    len: usize,
    records: u32,
    seq: u64,
}

/// What one thread knows of the batch streams with one peer.
#[derive(Debug, Default)]
struct Peer {
    /// Batches go to this peer (both ends have a mailbox).
    on: bool,
    /// Where to write our acknowledgements.
    mailbox: Option<RemoteMemory>,
    open: Option<Open>,
    /// Sequence of the next batch opened toward the peer (from 1).
    next_seq: u64,
    /// Last batch sent.
    sent: u64,
    /// Last batch the peer acknowledged (our mailbox word, as last read).
    acked: u64,
    /// Puts in batches not yet acknowledged: (batch, command, operation).
    pending: VecDeque<(u64, Tag, Op)>,
    /// Last batch applied from the peer, and the last acknowledged to it.
    applied: u64,
    ack_sent: u64,
    /// A batch from the peer was applied since the last look at `ack_due`.
    fresh: bool,
    /// A batch applied and not yet acknowledged asked for an
    /// acknowledgement at once.
    urgent: bool,
    /// On the `dirty`, `waiting`, `ack_due` lists.
    in_dirty: bool,
    in_waiting: bool,
    in_ack_due: bool,
}

/// The batch machinery of one transport.
pub(crate) struct Batcher {
    peers: Vec<Peer>,
    addrs: Vec<FiAddr>,
    my_pe: i32,
    credits: u32,
    /// The registered region (heap, then the proxy's internal area).
    region: HeapView,
    /// Bytes of it that puts may address.
    heap_size: u64,
    free_send: Vec<u32>,
    /// Peer of each send buffer in flight.
    send_peer: Vec<u32>,
    /// Peers with an open batch.
    dirty: Vec<u32>,
    /// Peers with batches unacknowledged (or puts in an open batch).
    waiting: Vec<u32>,
    /// Peers owed an acknowledgement.
    ack_due: Vec<u32>,
    /// Receive buffers to post again (the provider said -FI_EAGAIN).
    repost: Vec<u32>,
    /// Batches sent and not yet acknowledged, per peer
    /// ([`crate::reach`]; the transport sets the timeout).
    pub(crate) watch: PeerWatch,
}

impl Batcher {
    /// Batches between this PE and every peer whose card has a mailbox
    /// (`mailboxes[pe]`, `None` for us and for peers without batches).
    /// Registers and posts the receive buffers.
    pub(crate) fn connect(
        mem: &mut BatchMem,
        domain: &Rc<Domain>,
        ep: &Rc<Endpoint>,
        my_pe: i32,
        (region, heap_size): (HeapView, u64),
        addrs: Vec<FiAddr>,
        mailboxes: Vec<Option<RemoteMemory>>,
    ) -> Result<Batcher, FabricError> {
        let n_pes = addrs.len() as i32;
        let credits = credits_for(n_pes);
        let mut peers: Vec<Peer> = Vec::with_capacity(addrs.len());
        // Records carry heap offsets in 48 bits.
        let fits = heap_size < 1 << OFF_BITS && addrs.len() <= MAILBOX_PES;
        for (pe, mb) in mailboxes.into_iter().enumerate() {
            let on = fits && pe as i32 != my_pe && mb.is_some();
            peers.push(Peer { on, mailbox: mb, next_seq: 1, ..Peer::default() });
        }
        let senders = peers.iter().filter(|p| p.on).count() as u32;
        let recv_count = credits * senders;
        let recv = Words::new((recv_count as usize * BATCH_BYTES / 8).max(1));
        // SAFETY: the allocation outlives the region (BatchMem's field
        // order) and is touched only through raw pointers.
        let recv_mr = unsafe { MemoryRegion::register(domain, recv.ptr.cast(), recv.bytes(), Some(ep)) }?;
        mem.recv = Some((recv_mr, recv));
        let mut b = Batcher {
            peers,
            addrs,
            my_pe,
            credits,
            region,
            heap_size,
            free_send: (0..SEND_BUFFERS as u32).rev().collect(),
            send_peer: vec![u32::MAX; SEND_BUFFERS],
            dirty: Vec::new(),
            waiting: Vec::new(),
            ack_due: Vec::new(),
            repost: Vec::new(),
            watch: PeerWatch::new(n_pes.max(0) as usize, None),
        };
        for i in 0..recv_count {
            b.post_recv(mem, ep, i)?;
        }
        Ok(b)
    }

    /// Whether a put of `size` bytes to `pe` goes into a batch.
    #[inline]
    pub(crate) fn takes(&self, pe: i32, size: u64) -> bool {
        size <= BATCH_PUT_MAX && self.peers[pe as usize].on
    }

    fn post_recv(&mut self, mem: &BatchMem, ep: &Endpoint, i: u32) -> Result<(), FabricError> {
        let (mr, _) = mem.recv.as_ref().expect("receive buffers are registered at connect");
        let dst = mr.local_mut(i as usize * BATCH_BYTES);
        // SAFETY: buffer `i` lies in the registered receive area, which
        // outlives the endpoint's use of it (BatchMem is dropped after the
        // endpoint is closed); nothing else touches it until its completion.
        match unsafe { ep.recv(dst, BATCH_BYTES, CTX_RECV | u64::from(i)) }? {
            Post::Posted => {}
            Post::Again => self.repost.push(i),
        }
        Ok(())
    }

    /// The last batch toward `pe` that an operation issued now must wait
    /// for (B6): the open batch, which is sent now if it has credit, else the
    /// last one sent; `None` when every batch to `pe` is acknowledged (or
    /// none goes there).
    pub(crate) fn order_behind(&mut self, mem: &BatchMem, ep: &Endpoint, pe: i32, done: &mut Vec<Finished>) -> Option<u64> {
        let peer = &self.peers[pe as usize];
        if !peer.on {
            return None;
        }
        let last = match peer.open {
            Some(o) => {
                let seq = o.seq;
                self.send(mem, ep, pe, true, done);
                seq
            }
            None => peer.sent,
        };
        (self.peers[pe as usize].acked < last).then_some(last)
    }

    /// The last batch `pe` acknowledged, as last read.
    /// The oldest put to `pe` not yet acknowledged, and how many wait.
    pub(crate) fn oldest(&self, pe: i32) -> Option<(Op, usize)> {
        let p = self.peers.get(pe as usize)?;
        p.pending.front().map(|&(_, _, op)| (op, p.pending.len()))
    }

    pub(crate) fn acked(&self, pe: i32) -> u64 {
        self.peers[pe as usize].acked
    }

    /// B1: append the put `op` (`size` bytes from `src` to `dst` of `pe`,
    /// validated) to `pe`'s open batch. `Busy` when no send buffer is free,
    /// or the open batch is full and cannot be sent yet.
    pub(crate) fn put(
        &mut self,
        mem: &BatchMem,
        ep: &Endpoint,
        tag: Tag,
        op: &Op,
        (pe, dst, src, size): (i32, u64, PutSrc, u64),
        done: &mut Vec<Finished>,
    ) -> Submit {
        let p = pe as usize;
        let rec = 8 + size.next_multiple_of(8) as usize;
        if let Some(o) = self.peers[p].open
            && o.len + rec > BATCH_BYTES
            && !self.send(mem, ep, pe, false, done)
        {
            return Submit::Busy;
        }
        let o = match self.peers[p].open {
            Some(o) => o,
            None => {
                let Some(buf) = self.free_send.pop() else { return Submit::Busy };
                let peer = &mut self.peers[p];
                let o = Open { buf, len: HDR_BYTES, records: 0, seq: peer.next_seq };
                peer.next_seq += 1;
                if !peer.in_dirty {
                    peer.in_dirty = true;
                    self.dirty.push(pe as u32);
                }
                if !peer.in_waiting {
                    peer.in_waiting = true;
                    self.waiting.push(pe as u32);
                }
                o
            }
        };
        let at = o.buf as usize * BATCH_BYTES + o.len;
        let rec_ptr = mem.send.byte_ptr(at);
        let head = dst | (size << OFF_BITS);
        // SAFETY: the record (at most 8 + BATCH_PUT_MAX bytes) fits in the
        // open batch (checked above), which no posted operation reads: it is
        // sent only when closed.
        unsafe {
            rec_ptr.cast::<u64>().write_unaligned(head);
            let data = rec_ptr.add(8);
            match src {
                PutSrc::Inline(bits) => data.copy_from_nonoverlapping(bits.to_le_bytes().as_ptr(), size as usize),
                PutSrc::Heap(off) => {
                    self.region.check(SymAddr(off), size).expect("decoder-checked source range");
                    data.copy_from_nonoverlapping(self.region.base().add(off as usize), size as usize);
                }
                // FabricTransport::submit refuses payload slots (GPU PEs' queues) first.
                PutSrc::Payload | PutSrc::Host { .. } => unreachable!("refused before batching"),
            }
        }
        self.peers[p].open = Some(Open { len: o.len + rec, records: o.records + 1, ..o });
        self.peers[p].pending.push_back((o.seq, tag, *op));
        Submit::Pending
    }

    /// B2: send `pe`'s open batch if it has credit; false if it is still
    /// open (no credit, or the provider said -FI_EAGAIN).
    fn send(&mut self, mem: &BatchMem, ep: &Endpoint, pe: i32, urgent: bool, done: &mut Vec<Finished>) -> bool {
        let p = pe as usize;
        let Some(o) = self.peers[p].open else { return true };
        if self.peers[p].sent - self.peers[p].acked >= u64::from(self.credits) {
            return false;
        }
        let base = o.buf as usize * BATCH_BYTES;
        let hdr = mem.send.byte_ptr(base).cast::<u64>();
        // SAFETY: the header words of the open batch, which nothing else
        // reads or writes now.
        unsafe {
            hdr.write(MAGIC | (u64::from(o.records) << 32));
            hdr.add(1).write(u64::from(self.my_pe as u32) | ((o.len as u64) << 32) | if urgent { URGENT } else { 0 });
            hdr.add(2).write(o.seq);
        }
        let src = mem.send_mr.local(base);
        // SAFETY: the batch lies in the registered send area and is left
        // alone until the send's completion returns the buffer; the peer
        // came from our address vector.
        match unsafe { ep.send(src, o.len, self.addrs[p], CTX_SEND | u64::from(o.buf)) } {
            Ok(Post::Posted) => {
                self.send_peer[o.buf as usize] = pe as u32;
                self.watch.sent(pe);
                let peer = &mut self.peers[p];
                peer.open = None;
                peer.sent = o.seq;
                true
            }
            Ok(Post::Again) => {
                self.watch.blocked(pe);
                false
            }
            Err(e) => {
                self.peers[p].open = None;
                self.free_send.push(o.buf);
                self.fail_peer(pe, &e, done);
                true
            }
        }
    }

    /// Send the open batches (end of a pass, and after acknowledgements
    /// arrived): each one that has credit, unless it is small and an
    /// earlier batch to its PE is still unacknowledged (B2: it then keeps
    /// filling until that acknowledgement comes, and goes out with more).
    ///
    /// `urgent`: a work-group waits for a completion (a blocking command or
    /// a drain was taken this pass): nothing is held, and the batches sent
    /// ask to be acknowledged at once (B4).
    pub(crate) fn flush(&mut self, mem: &BatchMem, ep: &Endpoint, urgent: bool, done: &mut Vec<Finished>) {
        let mut i = 0;
        while i < self.dirty.len() {
            let pe = self.dirty[i];
            let p = &self.peers[pe as usize];
            if !urgent && p.sent > p.acked && p.open.is_some_and(|o| o.len < HOLD_BELOW) {
                i += 1;
                continue;
            }
            if self.send(mem, ep, pe as i32, urgent, done) {
                self.peers[pe as usize].in_dirty = false;
                self.dirty.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// A completion whose context is a batch's (`>= CTX_SEND`): a send
    /// (free its buffer) or a receive (B3: apply the batch, repost).
    pub(crate) fn completed(&mut self, mem: &BatchMem, ep: &Endpoint, ctx: u64) {
        let i = (ctx & CTX_INDEX) as u32;
        if ctx & !CTX_INDEX == CTX_SEND {
            self.send_peer[i as usize] = u32::MAX;
            self.free_send.push(i);
            return;
        }
        self.apply(mem, i);
        if let Err(e) = self.post_recv(mem, ep, i) {
            tracing::error!("PE {}: posting a batch receive buffer again failed: {e}", self.my_pe);
        }
    }

    /// A completion in error whose context is a batch's.
    pub(crate) fn failed(&mut self, mem: &BatchMem, ep: &Endpoint, ctx: u64, e: &FabricError, done: &mut Vec<Finished>) {
        let i = (ctx & CTX_INDEX) as u32;
        if ctx & !CTX_INDEX == CTX_SEND {
            let pe = self.send_peer[i as usize];
            self.send_peer[i as usize] = u32::MAX;
            self.free_send.push(i);
            if pe != u32::MAX {
                self.fail_peer(pe as i32, e, done);
            }
            return;
        }
        tracing::error!("PE {}: a batch receive failed: {e}", self.my_pe);
        if let Err(e) = self.post_recv(mem, ep, i) {
            tracing::error!("PE {}: posting a batch receive buffer again failed: {e}", self.my_pe);
        }
    }

    /// Every put in a batch to `pe` fails with `e`'s code (the stream to
    /// `pe` is broken: a send failed).
    fn fail_peer(&mut self, pe: i32, e: &FabricError, done: &mut Vec<Finished>) {
        let code = crate::transport::fabric_code(e);
        let peer = &mut self.peers[pe as usize];
        tracing::error!("PE {}: a batch of {} put(s) to PE {pe} failed in the fabric: {e}", self.my_pe, peer.pending.len());
        self.watch.answered_n(pe, self.watch.pending(pe));
        // Nothing more of this stream will be acknowledged: stop batching
        // to it, the later puts go on their own (and fail or succeed alone).
        peer.on = false;
        for (_, tag, op) in peer.pending.drain(..) {
            done.push(Finished { tag, outcome: Outcome::Failed(code), op });
        }
        if let Some(o) = peer.open.take() {
            self.free_send.push(o.buf);
        }
    }

    /// B3: copy the records of receive buffer `i` into the heap, in order.
    fn apply(&mut self, mem: &BatchMem, i: u32) {
        let (_, recv) = mem.recv.as_ref().expect("receive buffers are registered at connect");
        let base = recv.byte_ptr(i as usize * BATCH_BYTES);
        // SAFETY: the receive completed, so the provider no longer writes
        // the buffer; reads stay inside it (lengths checked below).
        let (h0, h1, seq) = unsafe {
            let h = base.cast::<u64>();
            (h.read(), h.add(1).read(), h.add(2).read())
        };
        let (records, src, bytes, urgent) = ((h0 >> 32) as u32, h1 as u32 as i32, ((h1 & !URGENT) >> 32) as usize, h1 & URGENT != 0);
        if h0 & 0xffff_ffff != MAGIC || bytes > BATCH_BYTES || src < 0 || src as usize >= self.peers.len() {
            tracing::error!("PE {}: dropped a malformed batch message (header {h0:#x} {h1:#x})", self.my_pe);
            return;
        }
        let mut at = HDR_BYTES;
        for _ in 0..records {
            if at + 8 > bytes {
                break;
            }
            // SAFETY: inside the received bytes (checked).
            let head = unsafe { base.add(at).cast::<u64>().read_unaligned() };
            let (dst, len) = (head & ((1 << OFF_BITS) - 1), head >> OFF_BITS);
            let end = at + 8 + len.next_multiple_of(8) as usize;
            if end > bytes || dst.checked_add(len).is_none_or(|e| e > self.heap_size) {
                tracing::error!(
                    "PE {}: a batched put from PE {src} to heap+{dst:#x} ({len} bytes) is outside the heap; dropped",
                    self.my_pe
                );
                break;
            }
            // SAFETY: source inside the received bytes, destination inside
            // the heap (both checked). Readers of the destination see
            // unspecified bytes until the put completes, as for any put.
            unsafe { self.region.base().add(dst as usize).copy_from_nonoverlapping(base.add(at + 8), len as usize) };
            at = end;
        }
        // Release: the copies above come before whatever later store of
        // this thread a reader acquires (a later batch's flag, an AMO).
        std::sync::atomic::fence(Ordering::Release);
        let peer = &mut self.peers[src as usize];
        if seq != peer.applied + 1 {
            tracing::error!("PE {}: batch {seq} from PE {src} after batch {}", self.my_pe, peer.applied);
        }
        peer.applied = peer.applied.max(seq);
        peer.fresh = true;
        peer.urgent |= urgent;
        if !peer.in_ack_due {
            peer.in_ack_due = true;
            self.ack_due.push(src as u32);
        }
    }

    /// B4 and B5, and reposts: acknowledge what was applied, complete what
    /// our peers acknowledged, send what that freed.
    pub(crate) fn progress(&mut self, mem: &BatchMem, ep: &Endpoint, done: &mut Vec<Finished>) {
        for k in (0..self.repost.len()).rev() {
            let i = self.repost.swap_remove(k);
            if let Err(e) = self.post_recv(mem, ep, i) {
                tracing::error!("PE {}: posting a batch receive buffer failed: {e}", self.my_pe);
            }
        }
        let mut k = 0;
        while k < self.ack_due.len() {
            let pe = self.ack_due[k] as usize;
            let peer = &mut self.peers[pe];
            // B4, delayed: while batches keep coming, one acknowledgement
            // per `credits / 2` of them; once a pass brings none, at once.
            let fresh = std::mem::take(&mut peer.fresh);
            if fresh && !peer.urgent && peer.applied - peer.ack_sent < u64::from(self.credits.div_ceil(2)) {
                k += 1;
                continue;
            }
            let seq = peer.applied;
            let Some(t) = peer.mailbox.and_then(|m| m.target(self.addrs[pe], 8 * self.my_pe as u64, 8)) else {
                self.peers[pe].in_ack_due = false;
                self.ack_due.swap_remove(k);
                continue;
            };
            // SAFETY: 8 bytes (every provider cpnet batches on injects at
            // least that: checked at connect); the target is the peer's
            // mailbox word for us, inside the region its card named.
            match unsafe { ep.inject_write(&seq.to_le_bytes(), t) } {
                Ok(Post::Posted) => {
                    let peer = &mut self.peers[pe];
                    peer.ack_sent = seq;
                    peer.urgent = false;
                    peer.in_ack_due = false;
                    self.ack_due.swap_remove(k);
                }
                Ok(Post::Again) => k += 1,
                Err(e) => {
                    tracing::error!("PE {}: acknowledging batch {seq} to PE {pe} failed: {e}", self.my_pe);
                    self.peers[pe].in_ack_due = false;
                    self.ack_due.swap_remove(k);
                }
            }
        }
        let mut k = 0;
        while k < self.waiting.len() {
            let pe = self.waiting[k] as usize;
            // Acquire: pairs with the peer's acknowledgement, written after
            // it applied the batches (B4), as far as the provider orders a
            // remote write; we report completion after this load.
            let acked = mem.mailbox.atomic(pe).load(Ordering::Acquire);
            let peer = &mut self.peers[pe];
            if acked > peer.acked {
                self.watch.answered_n(pe as i32, (acked - peer.acked).min(u64::from(u32::MAX)) as u32);
            }
            peer.acked = peer.acked.max(acked);
            while let Some(&(seq, tag, op)) = peer.pending.front() {
                if seq > peer.acked {
                    break;
                }
                peer.pending.pop_front();
                done.push(Finished { tag, outcome: Outcome::Done, op });
            }
            if peer.pending.is_empty() && peer.open.is_none() && peer.sent == peer.acked {
                peer.in_waiting = false;
                self.waiting.swap_remove(k);
            } else {
                k += 1;
            }
        }
        self.flush(mem, ep, false, done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_shrink_with_the_job_and_never_reach_zero() {
        assert_eq!(credits_for(1), CREDITS);
        assert_eq!(credits_for(2), CREDITS);
        assert_eq!(credits_for(129), CREDITS);
        assert_eq!(credits_for(257), 4);
        assert_eq!(credits_for(4096), 1);
        for n in 2..5000 {
            assert!(credits_for(n) * (n as u32 - 1) <= MAX_RECV_BUFFERS.max(n as u32 - 1), "{n} PEs");
        }
    }
}
