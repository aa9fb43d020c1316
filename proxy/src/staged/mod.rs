//! The staged transport: GPU symmetric heaps over a provider that cannot
//! reach GPU memory (no `FI_HMEM` CUDA support, as in the libfabric that
//! Debian and Ubuntu ship). DESIGN.md "Data paths"; the plan and its
//! reasons are in `docs/gpu-data-paths.md`.
//!
//! This file opens and connects the endpoint, owns the staging memory and
//! the per-thread state, and runs `progress`; `wire.rs` is the message
//! format and the landing records, `initiator.rs` the side that starts
//! operations, `target.rs` the side that receives messages.
//!
//! # Shape
//!
//! Commands become *active messages* between proxies: service thread `t` of
//! every PE opens one RDM endpoint with `FI_MSG` (fi_msg(3)) and talks to
//! thread `t` of the other PEs. Every message starts with a 64-byte
//! [`Hdr`]; data follows it in the same message, at most `chunk` bytes.
//!
//! | kind | from → to | carries | answer |
//! |---|---|---|---|
//! | `PUT` | initiator → target | data chunk (or inline value), maybe a signal | `ACK` once applied |
//! | `GET` | initiator → target | source offset, length | `GET_REPLY` with the data |
//! | `AMO` | initiator → target | op, type, operands | `AMO_REPLY` with the old value |
//! | `BARRIER` | PE → PE + 2^r | round, epoch | none |
//!
//! All copies between the GPU heap and the staging buffers (pinned host
//! memory, registered with the provider) are asynchronous, on one
//! non-blocking stream per service thread, each followed by an event that is
//! *queried*, never waited on: the proxy never blocks (DESIGN.md "The
//! command queue").
//!
//! Small transfers (at most `CPNET_AGENT_BYTES`), signals and every AMO
//! need no driver call at all: the thread writes a record into its landing
//! ring and the PE's landing agent (`cpnet/agent.cuh`, [`crate::agent`])
//! applies it on the GPU; the thread polls the ring's `done` word. A copy
//! of up to `CPNET_AGENT_LANES` records' bytes moves as one record per lane
//! (`CPNET_AGENT_SPLIT`, `StagedTransport::agent_parts`): the lanes'
//! agents copy their parts at once, and what follows the copy (the send,
//! the signal, the ACK) waits for the last part.
//!
//! * **put**: the heap range goes into a send buffer (the agent's
//!   `COPY_OUT`; above the threshold `cuMemcpyDtoHAsync` and an event), then
//!   `fi_send` once it is there. Inline puts (8 bytes or less) carry their
//!   value in the header.
//! * **at the target**: the agent copies the payload from the receive
//!   buffer into the heap and then updates the signal (SET: a release store;
//!   ADD: a device atomic), so the signal can never overtake its data; above
//!   the threshold a `cuMemcpyHtoDAsync` on the copy stream, the SET signal
//!   after it on the same stream, an ADD through the agent once the copy's
//!   event passed. The `ACK` goes back when the data has landed. A command
//!   completes on its last `ACK`: `quiet` means "in the target's GPU
//!   memory", as on the CPU path.
//! * **get**: a `GET` request; the target copies the range into a send
//!   buffer and replies; the initiator copies the reply into its heap (or
//!   returns the value for a `g`).
//! * **AMOs and ADD signals**: always a landing agent of the target PE,
//!   with device atomics on the heap word. So AMOs are atomic with respect to
//!   each other on every word, local and remote alike (OpenSHMEM 1.5 §9.7),
//!   and with respect to atomics kernels of that GPU make on the word; not
//!   with respect to plain stores or puts.
//! * **local target** (`pe == me`): the same engine without messages: the
//!   agent (small) or device-to-device copies (large).
//! * **fence, quiet, barrier_all**: the service drains the queue, and since
//!   completion means "applied at the target", ordering holds with any
//!   provider message ordering. The barrier is a dissemination barrier over
//!   `BARRIER` messages whose arrivals every service thread of the PE
//!   records in one shared table.
//!
//! # Flow control
//!
//! Every request (`PUT`, `GET`, `AMO`) takes one of `credits` credits of its
//! target, returned by its answer. Each thread posts
//! `2 * credits * (n_pes - 1) + BARRIER_BUFS` receive buffers of
//! `64 + chunk` bytes: enough for every request the peers may have in flight
//! toward it and every answer to its own requests, so no message ever finds
//! no buffer.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use cpnet_device::layout::{AgentRec, AmoOp, AmoType, CPNET_AGENT_K_AMO, ErrorCode, SignalOp};
use cpnet_device::ring::Outcome;

use crate::cuda::{CudaError, Event, EventState};
use zone::PeerZone;
use crate::decode::{GetDst, Op, PutSrc};
use crate::fabric::{FabricError, FiAddr, LocalBuf, LocalBufMut, Post};
use crate::service::{Finished, Submit, Tag, Transport};
use crate::reach::{PeerWatch, unreachable_report};
use crate::transport::fabric_code;

mod clock;
mod endpoint;
mod initiator;
mod state;
mod target;
mod wire;
pub mod zone;

use clock::{StageClock, mono_ns};
use state::*;

pub use endpoint::{GpuHeap, PeShared, StagedConfig, StagedEndpoint};
pub use wire::{Hdr, amo_apply};
use wire::*;

/// Operations (commands) one staged transport keeps in flight at most.
pub const MAX_OPS: usize = 1024;

/// Receive buffers kept for `BARRIER` messages (beyond the credit-derived count).
pub const BARRIER_BUFS: usize = 16;

/// Small (header-only) send buffers per thread: answers and requests without data.
const SMALL_BUFS: usize = 2048;

/// Bytes of a message header.
pub const HDR_BYTES: usize = 64;

/// The staged [`Transport`] of one service thread.
pub struct StagedTransport {
    /// Whether to keep [`StageClock`] (debug logging on for this module at
    /// connect): a clock read per pass and per operation otherwise saved.
    timing: bool,
    clock: StageClock,
    recv_at: Vec<Option<std::time::Instant>>,
    op_at: Vec<Option<std::time::Instant>>,
    /// `fi_send` of each big / small send buffer in flight (timing only).
    big_sent_at: Vec<Option<std::time::Instant>>,
    small_sent_at: Vec<Option<std::time::Instant>>,
    ops: Vec<OpSlot>,
    free_ops: Vec<u32>,
    free_big: Vec<u32>,
    big_owner: Vec<Option<u32>>,
    free_small: Vec<u32>,
    small_owner: Vec<Option<u32>>,
    credits: Vec<u32>,
    peers: Vec<FiAddr>,
    /// Ops with requests still to start.
    to_stage: VecDeque<u32>,
    /// Copies on the landing stream, in stream order, each with its event.
    copies: VecDeque<(Event, After)>,
    /// The same for the copy-out stream (`StagedEndpoint::out`).
    out_copies: VecDeque<(Event, After)>,
    /// Per target PE: our free slots in its staging zone.
    free_slots: Vec<Vec<u32>>,
    /// Per PE: our section of its staging zone, mapped (`zone.rs`).
    peer_zones: Vec<Option<PeerZone>>,
    /// Sends that met `-FI_EAGAIN`: (context, length, peer).
    to_send: VecDeque<(u64, usize, i32)>,
    /// Header-only messages waiting for a small buffer: (peer, header, op).
    small_backlog: VecDeque<(i32, Hdr, Option<u32>)>,
    /// GET requests waiting for a send buffer.
    get_wait: VecDeque<Hdr>,
    /// Receive buffers to post again (`-FI_EAGAIN`).
    recv_repost: Vec<u32>,
    /// Per landing lane: records in flight, in seq order, with what to do
    /// once applied.
    landed: Vec<VecDeque<(u64, After)>>,
    /// Per landing lane: records that found the lane's ring full.
    landing_backlog: Vec<VecDeque<(AgentRec, After)>>,
    /// Copies split over the lanes ([`Self::land_split`]): parts still to
    /// apply and what runs after the last; reused through `free_joins`.
    joins: Vec<(u32, After)>,
    free_joins: Vec<u32>,
    barrier: BarrierState,
    rounds: u32,
    poll_buf: Vec<u64>,
    /// A CUDA failure: the context is unusable; every later op fails.
    broken: Option<String>,
    /// Whether a SET signal after a landing copy goes by
    /// `cuStreamWriteValue64` ([`Stream::write_u64`]); off for good after
    /// the first refusal (stream memory operations off on the device),
    /// then by an 8-byte copy.
    stream_writes: bool,
    /// Requests sent per peer and not yet answered ([`crate::reach`]).
    watch: PeerWatch,
    /// Per PE: its endpoint's printable address (index = PE, ours too).
    peer_addrs: Vec<String>,
    // Last: owns the regions, endpoint, stream and memory.
    inner: StagedEndpoint,
}

impl Drop for StagedTransport {
    fn drop(&mut self) {
        // Copies may still read or write the staging memory: let them finish
        // before it is freed (the heap outlives the transport; the runtime
        // frees it after joining the service threads).
        for s in [&self.inner.stream, &self.inner.out] {
            if let Err(e) = s.synchronize() {
                tracing::warn!("PE {}: staged transport teardown: {e}", self.inner.my_pe);
            }
        }
        let (mut n, mut tr, mut ta, mut tp, mut launches, mut refused) = (0, 0, 0, 0, 0, 0);
        for l in &mut self.inner.lanes {
            l.stop();
            let (a, b, c, d) = l.times();
            (n, tr, ta, tp) = (n + a, tr + b, ta + c, tp + d);
            (launches, refused) = (launches + l.launches(), refused + l.refused());
        }
        self.clock.report(self.inner.my_pe, self.inner.lanes.len(), (n, tr, ta, tp), (launches, refused));
    }
}

impl StagedTransport {
    /// The provider in use.
    pub fn provider(&self) -> &str {
        &self.inner.provider
    }

    /// This PE.
    pub fn my_pe(&self) -> i32 {
        self.inner.my_pe
    }

    /// The granted fabric and domain names, and every PE's endpoint address
    /// in the provider's printable form (index = PE, this PE's own too),
    /// for the transport map.
    pub fn addresses(&self) -> (&str, &str, &[String]) {
        (&self.inner.names.0, &self.inner.names.1, &self.peer_addrs)
    }

    fn base(&self) -> *mut u8 {
        self.inner.mem.ptr()
    }

    fn recv_ptr(&self, i: u32) -> *mut u8 {
        // SAFETY: inside the staging allocation (Layout).
        unsafe { self.base().add(self.inner.layout.recv + i as usize * self.inner.layout.buf) }
    }

    fn big_ptr(&self, i: u32) -> *mut u8 {
        // SAFETY: inside the staging allocation (Layout).
        unsafe { self.base().add(self.inner.layout.big + i as usize * self.inner.layout.buf) }
    }

    fn small_ptr(&self, i: u32) -> *mut u8 {
        // SAFETY: inside the staging allocation (Layout).
        unsafe { self.base().add(self.inner.layout.small + i as usize * HDR_BYTES) }
    }

    fn scratch(&self, op: u32, w: usize) -> *mut u64 {
        assert!((op as usize) < MAX_OPS && w < 4);
        // SAFETY: inside the staging allocation (Layout), 8-aligned.
        unsafe { self.base().add(self.inner.layout.scratch + op as usize * 32 + w * 8).cast() }
    }

    fn dev(&self, off: u64) -> u64 {
        self.inner.heap.base + off
    }

    fn read_hdr(p: *const u8) -> Hdr {
        // SAFETY: `p` is a staging buffer of at least 64 bytes whose message
        // (or our own write) is complete; read_unaligned copies it out.
        unsafe { p.cast::<Hdr>().read_unaligned() }
    }

    fn write_hdr(p: *mut u8, h: &Hdr) {
        // SAFETY: `p` is a staging buffer of at least 64 bytes owned by us
        // (not posted, no copy in flight on it).
        unsafe { p.cast::<Hdr>().write_unaligned(*h) }
    }

    fn post_recv(&mut self, i: u32) -> Result<(), FabricError> {
        let buf = LocalBufMut { ptr: self.recv_ptr(i), desc: self.inner.mr.desc() };
        // SAFETY: the buffer is inside the registered staging memory, ours
        // until its completion (it is out of every other list).
        match unsafe { self.inner.ep.recv(buf, self.inner.layout.buf, CTX_RECV | u64::from(i)) }? {
            Post::Posted => {}
            Post::Again => self.recv_repost.push(i),
        }
        Ok(())
    }

    fn hdr(&self, kind: u8) -> Hdr {
        Hdr { kind, src_pe: self.inner.my_pe, ..Hdr::default() }
    }

    fn tag_of(&self, op: u32) -> u64 {
        (u64::from(self.ops[op as usize].generation) << 32) | u64::from(op)
    }

    /// The op an answer with `tag` belongs to, if it is still that op.
    fn op_of(&self, tag: u64) -> Option<u32> {
        let op = (tag & 0xffff_ffff) as u32;
        let s = self.ops.get(op as usize)?;
        (s.phase != Phase::Free && u64::from(s.generation) == tag >> 32).then_some(op)
    }

    /// Send the header-only message `h` to `pe` (for `op`, if a request).
    fn send_small(&mut self, pe: i32, h: Hdr, op: Option<u32>) {
        let Some(i) = self.free_small.pop() else {
            self.small_backlog.push_back((pe, h, op));
            return;
        };
        Self::write_hdr(self.small_ptr(i), &h);
        self.small_owner[i as usize] = op;
        self.post_send(CTX_SEND_SMALL | u64::from(i), HDR_BYTES, pe);
    }

    fn post_send(&mut self, ctx: u64, len: usize, pe: i32) {
        let ptr = match ctx & !CTX_MASK {
            CTX_SEND_BIG => self.big_ptr((ctx & CTX_MASK) as u32),
            _ => self.small_ptr((ctx & CTX_MASK) as u32),
        };
        if self.timing {
            let i = (ctx & CTX_MASK) as usize;
            let at = if ctx & !CTX_MASK == CTX_SEND_BIG { &mut self.big_sent_at[i] } else { &mut self.small_sent_at[i] };
            *at = Some(std::time::Instant::now());
            // The send stamp of the timing report: a PUT's `cond`, an ACK's
            // `value` (fields those kinds do not use otherwise).
            let at = match Self::read_hdr(ptr).kind {
                K_PUT => Some(std::mem::offset_of!(Hdr, cond)),
                K_ACK => Some(std::mem::offset_of!(Hdr, value)),
                _ => None,
            };
            if let Some(off) = at {
                // SAFETY: inside the 64-byte header of a buffer we own until
                // its completion (not posted yet).
                unsafe { ptr.add(off).cast::<u64>().write_unaligned(mono_ns()) };
            }
        }
        let buf = LocalBuf { ptr, desc: self.inner.mr.desc() };
        // SAFETY: the buffer is inside the registered staging memory and ours
        // until its completion; the peer came from our AV.
        match unsafe { self.inner.ep.send(buf, len, self.peers[pe as usize], ctx) } {
            Ok(Post::Posted) => {}
            Ok(Post::Again) => self.to_send.push_back((ctx, len, pe)),
            Err(e) => self.send_failed(ctx, &e),
        }
    }

    fn send_failed(&mut self, ctx: u64, e: &FabricError) {
        let i = (ctx & CTX_MASK) as usize;
        let owner = match ctx & !CTX_MASK {
            CTX_SEND_BIG => {
                self.free_big.push(i as u32);
                self.big_owner[i].take()
            }
            _ => {
                self.free_small.push(i as u32);
                self.small_owner[i].take()
            }
        };
        tracing::error!("PE {}: fi_send failed ({}): {e}", self.inner.my_pe, self.inner.provider);
        if let Some(op) = owner {
            if let Some(pe) = self.ops[op as usize].op.and_then(|o| o.pe()) {
                self.watch.answered(pe);
            }
            self.fail_op(op, fabric_code(e));
        }
    }

    /// Record that one request of `op` ended with `code` and count it done.
    fn fail_op(&mut self, op: u32, code: ErrorCode) {
        let s = &mut self.ops[op as usize];
        s.error.get_or_insert(code);
        s.outstanding = s.outstanding.saturating_sub(1);
        // Chunks not started yet will not start.
        s.started = s.chunks;
    }

    fn cuda_failed(&mut self, e: &CudaError) {
        tracing::error!("PE {}: CUDA failure in the staged transport: {e}", self.inner.my_pe);
        self.broken.get_or_insert_with(|| e.to_string());
    }

    /// Record an event for `after` on the landing stream.
    fn after(&mut self, after: After) -> Result<(), CudaError> {
        let ev = self.inner.events.record(&self.inner.stream)?;
        self.copies.push_back((ev, after));
        Ok(())
    }

    /// Record an event for `after` on the copy-out stream.
    fn after_out(&mut self, after: After) -> Result<(), CudaError> {
        let ev = self.inner.events.record(&self.inner.out)?;
        self.out_copies.push_back((ev, after));
        Ok(())
    }

    /// A SET signal on the landing stream, after the copies queued on it:
    /// `value` into heap word `sig` (decoder- or header-checked, 8-byte
    /// aligned). A `cuStreamWriteValue64` (no copy engine: on an H100 a
    /// 64-256 KiB copy and its signal took 6-8 µs less than with an 8-byte
    /// copy for the signal, `cpnet-gpu-check copy-floor`); where the device refuses stream
    /// memory operations, from then on an 8-byte copy of `host`, a pinned
    /// word holding `value` that stays unchanged until the next event on
    /// the landing stream passes.
    ///
    /// # Safety
    /// `host` as above; `sig` inside this PE's heap.
    unsafe fn signal_set(&mut self, sig: u64, value: u64, host: *const u8) -> Result<(), CudaError> {
        if self.stream_writes {
            // SAFETY: `sig` is an aligned word of this PE's heap (the caller's
            // contract), which outlives the stream.
            match unsafe { self.inner.stream.write_u64(self.dev(sig), value) } {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!("PE {}: {e}: signals after landing copies go by 8-byte copies from now on", self.inner.my_pe);
                    self.stream_writes = false;
                }
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.inner.stream.htod(self.dev(sig), host, 8) }
    }

    /// The address at which kernels (the landing agent) see `p`, a
    /// pointer into the staging memory.
    fn staging_dev(&self, p: *const u8) -> u64 {
        self.inner.mem.dev_ptr() + (p as usize - self.base() as usize) as u64
    }

    /// Copy `len` bytes at heap offset `src` out to host memory at `host`
    /// (kernels see it at `dev`), then run `after`: through the landing
    /// agent (lane key `lane`) when agent-sized, else by a copy on the
    /// copy-out stream and its event.
    ///
    /// # Safety
    /// `host..host+len` is pinned or CUDA-registered host memory (a big
    /// buffer's payload area, or our slot of a peer's zone) that nothing
    /// else reads or writes until `after` runs; `src..src+len` is a
    /// checked range of this PE's heap.
    unsafe fn copy_out(&mut self, src: u64, len: u64, host: *mut u8, dev: u64, after: After, lane: u32) -> Result<(), CudaError> {
        if self.agent_moves(len) {
            self.land_split(len, lane, after, |lo, n| copy_out_rec(src + lo, n, dev + lo));
            return Ok(());
        }
        // SAFETY: the caller's contract.
        unsafe { self.inner.out.dtoh(host, self.dev(src), len as usize)? };
        self.after_out(after)
    }

    /// Parts into which a copy of `len` bytes between the heap and host
    /// staging splits over the landing lanes ([`split_count`] with this
    /// thread's agent record size, lanes and `CPNET_AGENT_SPLIT`).
    fn agent_parts(&self, len: u64) -> u64 {
        let l = &self.inner.lanes[0];
        split_count(len, l.max_bytes(), self.inner.lanes.len() as u64, l.split())
    }

    /// Whether the landing agents move a copy of `len` bytes: one record,
    /// or one per lane ([`Self::agent_parts`]); else a copy engine.
    fn agent_moves(&self, len: u64) -> bool {
        self.agent_sized(len) || self.agent_parts(len) > 1
    }

    /// Land `len` bytes as [`Self::agent_parts`] records (`rec(lo, n)`:
    /// bytes `lo .. lo + n` of the copy, [`split_ranges`], on lane keys
    /// `lane`, `lane + 1`, ...); `after` runs once every part is applied.
    fn land_split(&mut self, len: u64, lane: u32, after: After, rec: impl Fn(u64, u64) -> AgentRec) {
        let k = self.agent_parts(len);
        if k <= 1 {
            self.land(rec(0, len), after, lane);
            return;
        }
        let parts = split_ranges(len, k).count() as u32;
        let join = match self.free_joins.pop() {
            Some(j) => {
                self.joins[j as usize] = (parts, after);
                j
            }
            None => {
                self.joins.push((parts, after));
                self.joins.len() as u32 - 1
            }
        };
        for (p, (lo, n)) in split_ranges(len, k).enumerate() {
            self.land(rec(lo, n), After::Part { join }, lane.wrapping_add(p as u32));
        }
    }

    /// The payload area of big buffer `b` and its device address.
    fn big_payload(&self, b: u32) -> (*mut u8, u64) {
        // SAFETY: inside the staging allocation (Layout: HDR_BYTES + chunk per buffer).
        let p = unsafe { self.big_ptr(b).add(HDR_BYTES) };
        (p, self.staging_dev(p))
    }

    /// Whether `bytes` of data land (or leave the heap) through the agent.
    fn agent_sized(&self, bytes: u64) -> bool {
        bytes <= self.inner.lanes[0].max_bytes()
    }

    /// Hand `rec` to the landing agent of lane key `lane`; `after` runs
    /// once it is applied. Records of one key are applied, and their
    /// `after`s run, in order; different keys may take different lanes,
    /// applied in parallel. The key is the queue a record comes from: the
    /// local queue ([`Self::op_lane`]) or, for a received message, the
    /// sender's PE and queue hint ([`msg_lane`]).
    fn land(&mut self, rec: AgentRec, after: After, lane: u32) {
        let l = lane as usize % self.inner.lanes.len();
        if self.landing_backlog[l].is_empty()
            && let Some(seq) = self.inner.lanes[l].push(&rec)
        {
            self.landed[l].push_back((seq, after));
            return;
        }
        self.landing_backlog[l].push_back((rec, after));
    }

    /// The landing lane key of op `i`: its local queue.
    fn op_lane(&self, i: u32) -> u32 {
        self.ops[i as usize].tag.map_or(0, |t| t.queue)
    }

    /// An AMO (or ADD signal) on this PE's heap: always the landing agent.
    fn land_amo(&mut self, it: AmoItem) {
        let rec = AgentRec {
            kind: CPNET_AGENT_K_AMO as u8,
            sub: it.op as u8,
            ty: it.ty as u8,
            dst: it.dst,
            signal: it.cond,
            value: it.value,
            ..AgentRec::default()
        };
        self.land(rec, After::Amo(it.done), it.lane);
    }

    /// Act on every applied landing record, in order; publish the backlog;
    /// start the agent if records wait.
    fn drain_landed(&mut self, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        for l in 0..self.inner.lanes.len() {
            while let Some(&(seq, after)) = self.landed[l].front() {
                if !self.inner.lanes[l].is_done(seq) {
                    break;
                }
                self.landed[l].pop_front();
                let value = self.inner.lanes[l].value(seq);
                self.inner.lanes[l].retire(seq);
                self.run_after(after, value, done)?;
            }
        }
        // After every lane's `after`s ran (they may land more records).
        for l in 0..self.inner.lanes.len() {
            while let Some(&(rec, after)) = self.landing_backlog[l].front() {
                let Some(seq) = self.inner.lanes[l].push(&rec) else { break };
                self.landing_backlog[l].pop_front();
                self.landed[l].push_back((seq, after));
            }
            self.inner.lanes[l].kick()?;
        }
        Ok(())
    }

    /// Act on every copy whose event has passed, in stream order (each stream).
    fn drain_copies(&mut self, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        for out in [false, true] {
            loop {
                let q = if out { &mut self.out_copies } else { &mut self.copies };
                let Some(&(ev, after)) = q.front() else { break };
                if self.inner.events.query(ev)? == EventState::Pending {
                    break;
                }
                q.pop_front();
                self.inner.events.release(ev);
                self.run_after(after, 0, done)?;
            }
        }
        Ok(())
    }

    /// A copy or landing record finished; `value` is a landed AMO's old value.
    fn run_after(&mut self, after: After, value: u64, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        match after {
            After::Send { buf, len, pe } => self.post_send(CTX_SEND_BIG | u64::from(buf), len, pe),
            After::SendSmall { buf, pe } => self.post_send(CTX_SEND_SMALL | u64::from(buf), HDR_BYTES, pe),
            After::LocalDone { op } => self.answered(op, done),
            After::LocalResult { op } => {
                // SAFETY: the copy into scratch word 2 has completed.
                let v = unsafe { self.scratch(op, 2).read() };
                self.ops[op as usize].value = v;
                self.answered(op, done);
            }
            After::Part { join } => {
                let j = &mut self.joins[join as usize];
                j.0 -= 1;
                if j.0 == 0 {
                    let after = j.1;
                    self.free_joins.push(join);
                    self.run_after(after, value, done)?;
                }
            }
            After::Applied { recv, pe, tag, sig, lane, slot } => {
                if let Some(t) = self.recv_at[recv as usize].take() {
                    StageClock::add(&mut self.clock.land, t);
                }
                self.repost(recv);
                match sig {
                    // After a split copy's parts (different lanes, each
                    // published with a system-scope release before the
                    // proxy saw it): the SET as a record of its own, the
                    // agent's release store of the word.
                    Some((sig, value, SignalOp::Set)) => {
                        let rec = put_rec(sig, 0, None, 0, Some((sig, value, SignalOp::Set)));
                        self.land(rec, After::Amo(AmoDone::Ack { pe, tag, slot }), lane);
                    }
                    Some((sig, value, SignalOp::Add)) => self.land_amo(AmoItem {
                        ty: AmoType::Uint64,
                        op: AmoOp::Add,
                        dst: sig,
                        value,
                        cond: 0,
                        done: AmoDone::Ack { pe, tag, slot },
                        lane,
                    }),
                    None => self.send_ack(pe, tag, slot, 0),
                }
            }
            After::GetApplied { recv, op } => {
                self.repost(recv);
                self.answered(op, done);
            }
            After::LocalThenAdd { op, sig, value } => self.land_amo(AmoItem {
                ty: AmoType::Uint64,
                op: AmoOp::Add,
                dst: sig,
                value,
                cond: 0,
                done: AmoDone::Local { op },
                lane: self.op_lane(op),
            }),
            After::Amo(AmoDone::Local { op }) => {
                if let Some(Op::Amo { ty, .. }) = self.ops[op as usize].op {
                    self.ops[op as usize].value = amo_apply(ty, AmoOp::Fetch, value, 0, 0);
                }
                self.answered(op, done);
            }
            After::Amo(AmoDone::Reply { pe, tag }) => {
                let mut a = self.hdr(K_AMO_REPLY);
                a.tag = tag;
                a.value = value;
                self.send_small(pe, a, None);
            }
            After::Amo(AmoDone::Ack { pe, tag, slot }) => self.send_ack(pe, tag, slot, 0),
        }
        Ok(())
    }

    fn fail_all_broken(&mut self, done: &mut Vec<Finished>) {
        // The context is unusable: fail every op in flight so no work-group
        // waits forever, and drop queued copies (their events never pass).
        self.copies.clear();
        self.out_copies.clear();
        self.to_stage.clear();
        self.landed.iter_mut().for_each(VecDeque::clear);
        self.landing_backlog.iter_mut().for_each(VecDeque::clear);
        self.joins.clear();
        self.free_joins.clear();
        for i in 0..MAX_OPS as u32 {
            let s = self.ops[i as usize];
            if s.phase != Phase::Free {
                if let (Some(tag), Some(op)) = (s.tag, s.op) {
                    done.push(Finished { tag, outcome: Outcome::Failed(ErrorCode::Fabric), op });
                }
                self.release_op(i);
            }
        }
    }

    fn progress_inner(&mut self, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        for _ in 0..4 {
            let mut buf = std::mem::take(&mut self.poll_buf);
            let r = self.inner.cq.poll(&mut buf);
            let n = match r {
                Ok(n) => n,
                Err(e) => {
                    self.poll_buf = buf;
                    match e.op_context() {
                        Some(ctx) if ctx & !CTX_MASK == CTX_RECV => {
                            tracing::error!("PE {}: receive failed ({}): {e}", self.inner.my_pe, self.inner.provider);
                            self.repost((ctx & CTX_MASK) as u32);
                        }
                        Some(ctx) if ctx & !CTX_MASK == CTX_SEND_BIG || ctx & !CTX_MASK == CTX_SEND_SMALL => {
                            self.send_failed(ctx, &e);
                            // Ops that failed may be complete now.
                            for i in 0..MAX_OPS as u32 {
                                if self.ops[i as usize].error.is_some() {
                                    self.maybe_finish(i, done);
                                }
                            }
                        }
                        _ => tracing::error!("PE {}: completion queue: {e}", self.inner.my_pe),
                    }
                    continue;
                }
            };
            for &ctx in &buf[..n] {
                let i = (ctx & CTX_MASK) as u32;
                match ctx & !CTX_MASK {
                    CTX_RECV => self.on_recv(i, done)?,
                    CTX_SEND_BIG => {
                        if let Some(t) = self.big_sent_at[i as usize].take() {
                            StageClock::add(&mut self.clock.send_big, t);
                        }
                        self.big_owner[i as usize] = None;
                        self.free_big.push(i);
                    }
                    CTX_SEND_SMALL => {
                        if let Some(t) = self.small_sent_at[i as usize].take() {
                            StageClock::add(&mut self.clock.send_small, t);
                        }
                        self.small_owner[i as usize] = None;
                        self.free_small.push(i);
                    }
                    _ => tracing::error!("PE {}: completion with unknown context {ctx:#x}", self.inner.my_pe),
                }
            }
            self.poll_buf = buf;
            if n < 64 {
                break;
            }
        }
        self.drain_copies(done)?;
        for _ in 0..self.to_send.len() {
            let Some((ctx, len, pe)) = self.to_send.pop_front() else { break };
            self.post_send(ctx, len, pe);
        }
        for r in std::mem::take(&mut self.recv_repost) {
            self.repost(r);
        }
        while !self.free_small.is_empty() {
            let Some((pe, h, op)) = self.small_backlog.pop_front() else { break };
            self.send_small(pe, h, op);
        }
        self.serve_gets()?;
        self.stage_all()?;
        self.drain_landed(done)
    }
}

/// Parts into which a copy of `len` bytes splits over `lanes` landing
/// lanes, one agent block each, with agent records of at most `max` bytes
/// (`CPNET_AGENT_BYTES`) and the split on (`on`, `CPNET_AGENT_SPLIT`):
/// `ceil(len / max)` when the copy is larger than one record and fits one
/// per lane; else 1 (one record, or a copy-engine copy). A copy-engine copy
/// and its polled event cost about 8.5 µs beyond their bytes on an H100
/// (`cpnet-gpu-check copy-floor`) and one agent block moves 64 KiB in about
/// 7 µs, so four of them take 256 KiB in about half a copy engine's time
/// (docs/results.md, "Session 24").
pub(super) fn split_count(len: u64, max: u64, lanes: u64, on: bool) -> u64 {
    if !on || max == 0 || lanes < 2 || len <= max || len > max.saturating_mul(lanes) { 1 } else { len.div_ceil(max) }
}

/// The parts (offset, bytes) of a copy of `len` bytes split `k` ways: in
/// order, covering it once, each a multiple of 256 bytes but the last
/// (the agent's vector copies keep the copy's alignment), at most `k`.
pub(super) fn split_ranges(len: u64, k: u64) -> impl Iterator<Item = (u64, u64)> {
    let part = len.div_ceil(k.max(1)).next_multiple_of(256).max(1);
    (0..len.div_ceil(part)).map(move |p| (p * part, part.min(len - p * part)))
}

impl Transport for StagedTransport {
    fn submit(&mut self, tag: Tag, op: &Op) -> Submit {
        let Some(_pe) = op.pe() else { return Submit::Done(Outcome::Done) };
        if let Some(why) = &self.broken {
            tracing::error!("PE {}: {} refused: the GPU context failed earlier ({why})", self.inner.my_pe, op.name());
            return Submit::Done(Outcome::Failed(ErrorCode::Fabric));
        }
        if op.size() == 0 && !matches!(op, Op::PutSignal { .. } | Op::Amo { .. }) {
            return Submit::Done(Outcome::Done);
        }
        self.start_op(tag, op)
    }

    fn progress(&mut self, done: &mut Vec<Finished>) {
        if self.timing {
            let now = std::time::Instant::now();
            self.clock.first_pass.get_or_insert(now);
            self.clock.last_pass = Some(now);
            self.clock.passes += 1;
        }
        if self.broken.is_some() {
            self.fail_all_broken(done);
            return;
        }
        if let Err(e) = self.progress_inner(done) {
            self.cuda_failed(&e);
            self.fail_all_broken(done);
        }
    }

    fn barrier(&mut self, start: bool) -> Result<bool, ErrorCode> {
        let n = self.inner.n_pes;
        if n <= 1 {
            return Ok(true);
        }
        if start {
            // Relaxed: barriers of one PE are sequential; the counter only
            // needs atomicity across this PE's service threads.
            self.barrier.epoch = self.inner.shared.epoch.fetch_add(1, Ordering::Relaxed) + 1;
            self.barrier.round = 0;
            self.barrier.sent = false;
        }
        loop {
            if self.barrier.round == self.rounds {
                return Ok(true);
            }
            if !self.barrier.sent {
                let peer = (self.inner.my_pe + (1 << self.barrier.round)) % n;
                let mut h = self.hdr(K_BARRIER);
                h.dst = u64::from(self.barrier.round);
                h.value = self.barrier.epoch;
                self.send_small(peer, h, None);
                self.barrier.sent = true;
            }
            // Dissemination (Hensgen, Finkel, Manber 1988): in round r we
            // signal PE + 2^r and wait for PE - 2^r. Arrivals only grow.
            // Acquire: pairs with the AcqRel fetch_max of the receiving thread.
            if self.inner.shared.arrived[self.barrier.round as usize].load(Ordering::Acquire) >= self.barrier.epoch {
                self.barrier.round += 1;
                self.barrier.sent = false;
            } else {
                return Ok(false);
            }
        }
    }

    fn fatal(&mut self) -> Option<String> {
        let o = self.watch.overdue()?;
        let oldest = self
            .ops
            .iter()
            .filter(|s| s.phase != Phase::Free)
            .filter_map(|s| s.op.as_ref())
            .find(|op| op.pe() == Some(o.pe))
            .map(|op| (op, String::new()));
        Some(unreachable_report(self.inner.my_pe, &o, &self.inner.provider, oldest, &self.peer_addrs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amo_apply_matches_openshmem_semantics() {
        use AmoOp::*;
        use AmoType::*;
        assert_eq!(amo_apply(Int32, FetchAdd, 0xffff_ffff, 1, 0), 0, "32-bit add wraps");
        assert_eq!(amo_apply(Uint64, Add, u64::MAX, 2, 0), 1);
        assert_eq!(amo_apply(Int64, CompareSwap, 5, 9, 5), 9);
        assert_eq!(amo_apply(Int64, CompareSwap, 5, 9, 4), 5);
        assert_eq!(amo_apply(Uint32, And, 0b1100, 0b1010, 0), 0b1000);
        assert_eq!(amo_apply(Uint32, Or, 0b1100, 0b1010, 0), 0b1110);
        assert_eq!(amo_apply(Uint32, Xor, 0b1100, 0b1010, 0), 0b0110);
        assert_eq!(amo_apply(Int32, Swap, 7, 0x1_0000_0003, 0), 3, "operands are masked to the type");
        assert_eq!(amo_apply(Uint64, Fetch, 42, 1, 0), 42);
        assert_eq!(amo_apply(Uint64, Set, 42, 1, 0), 1);
    }

    #[test]
    fn amo_apply_min_compares_by_the_type() {
        use AmoOp::*;
        use AmoType::*;
        let m1_32 = u64::from(-1i32 as u32);
        assert_eq!(amo_apply(Int32, Min, 5, m1_32, 0), m1_32, "-1 < 5 signed");
        assert_eq!(amo_apply(Uint32, Min, 5, m1_32, 0), 5, "0xffffffff > 5 unsigned");
        assert_eq!(amo_apply(Int64, FetchMin, 3, (-7i64) as u64, 0), (-7i64) as u64);
        assert_eq!(amo_apply(Uint64, FetchMin, 3, (-7i64) as u64, 0), 3);
        assert_eq!(amo_apply(Int32, Min, 0x8000_0000, 0x7fff_ffff, 0), 0x8000_0000, "i32::MIN stays");
        assert_eq!(amo_apply(Uint32, Min, 9, 0x1_0000_0004, 0), 4, "operands are masked to the type");
        assert_eq!(amo_apply(Int64, Min, 2, 2, 0), 2);
        use cpnet_device::ordered::{f64_from_ord, f64_ord};
        let d = amo_apply(Uint64, Min, f64_ord(0.75), f64_ord(-0.5), 0);
        assert_eq!(f64_from_ord(d), -0.5, "floats as ordered integers");
    }

    #[test]
    fn split_copies_cover_the_copy_once_in_at_most_one_part_per_lane() {
        let k = 64 << 10;
        assert_eq!(split_count(k, k, 4, true), 1, "one record");
        assert_eq!(split_count(k + 1, k, 4, true), 2);
        assert_eq!(split_count(4 * k, k, 4, true), 4);
        assert_eq!(split_count(4 * k + 1, k, 4, true), 1, "past one per lane: a copy engine");
        assert_eq!(split_count(4 * k, k, 4, false), 1, "CPNET_AGENT_SPLIT=0");
        assert_eq!(split_count(4 * k, k, 1, true), 1, "one lane");
        assert_eq!(split_count(4 * k, 0, 4, true), 1, "no agent data");
        for len in [k + 1, 3 * k - 7, 4 * k, 186_624, 2 * k + 255] {
            let n = split_count(len, k, 4, true);
            let parts: Vec<(u64, u64)> = split_ranges(len, n).collect();
            assert!(parts.len() as u64 <= n && parts.len() >= 2, "{len}: {parts:?}");
            let mut at = 0;
            for (i, &(lo, b)) in parts.iter().enumerate() {
                assert_eq!(lo, at, "{len}: parts in order, no gap");
                assert!(b > 0 && b <= k, "{len}: part {i} of {b} bytes fits one record");
                if i + 1 < parts.len() {
                    assert_eq!(b % 256, 0, "{len}: a part but the last is whole 256-byte words");
                }
                at += b;
            }
            assert_eq!(at, len, "{len}: the parts cover the copy");
        }
    }

    #[test]
    fn header_is_one_cache_line() {
        use super::endpoint::Layout;
        use crate::transport::FabricConfig;
        assert_eq!(std::mem::size_of::<Hdr>(), 64);
        let l = Layout::new(&StagedConfig::new(FabricConfig { provider: "shm".into(), src_node: None, reach_timeout: None }), 4);
        assert_eq!(l.n_recv, 2 * 8 * 3 + BARRIER_BUFS);
        assert!(l.total >= l.scratch + MAX_OPS * 32);
        assert_eq!(l.scratch % 8, 0);
    }
}
