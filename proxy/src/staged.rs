//! The staged transport: GPU symmetric heaps over a provider that cannot
//! reach GPU memory (no `FI_HMEM` CUDA support, as in the libfabric that
//! Debian and Ubuntu ship). DESIGN.md "Data paths"; the plan and its
//! reasons are in `docs/gpu-data-paths.md`.
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
//! applies it on the GPU; the thread polls the ring's `done` word.
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
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cpnet_device::layout::{
    AgentRec, AmoOp, AmoType, CPNET_AGENT_DEFAULT_DEPTH, CPNET_AGENT_F_INLINE, CPNET_AGENT_F_SIGNAL, CPNET_AGENT_K_AMO,
    CPNET_AGENT_K_COPY_OUT, CPNET_AGENT_K_PUT, ErrorCode, SignalOp,
};
use cpnet_device::ring::Outcome;
use cpnet_fabric_sys as sys;
use cudarc::driver::CudaContext;

use crate::agent::{AgentKernel, Landing};
use crate::cuda::{CudaError, Event, EventPool, EventState, Pinned, Stream};
use crate::decode::{GetDst, Op, PutSrc};
use crate::fabric::{
    AddressVector, CompletionQueue, Domain, Endpoint, Fabric, FabricError, FiAddr, Info, InfoRequest, LocalBuf,
    LocalBufMut, MSG_CAPS, MemoryRegion, Post,
};
use crate::service::{Finished, Submit, Tag, Transport};
use crate::transport::{FabricConfig, TransportError, fabric_code};

/// Operations (commands) one staged transport keeps in flight at most.
pub const MAX_OPS: usize = 1024;

/// Receive buffers kept for `BARRIER` messages (beyond the credit-derived count).
pub const BARRIER_BUFS: usize = 16;

/// Small (header-only) send buffers per thread: answers and requests without data.
const SMALL_BUFS: usize = 2048;

/// Bytes of a message header.
pub const HDR_BYTES: usize = 64;

/// Where the staged transport's data lives on this PE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuHeap {
    /// Device address of heap offset 0 (`CUdeviceptr`).
    pub base: u64,
    /// Bytes (the same on every PE).
    pub size: u64,
}

/// Tuning of the staged transport (collective: the same on every PE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedConfig {
    /// Provider and address.
    pub fabric: FabricConfig,
    /// Bytes of data per message (`CPNET_STAGE_CHUNK`).
    pub chunk: usize,
    /// Requests in flight per target PE and thread (`CPNET_STAGE_CREDITS`).
    pub credits: u32,
    /// Send buffers of `64 + chunk` bytes per thread.
    pub send_bufs: usize,
}

impl StagedConfig {
    /// `fabric` with the defaults: 256 KiB chunks, 8 credits, 16 send buffers.
    pub fn new(fabric: FabricConfig) -> StagedConfig {
        StagedConfig { fabric, chunk: 256 << 10, credits: 8, send_bufs: 16 }
    }
}

/// State shared by every staged transport of one PE.
#[derive(Debug)]
pub struct PeShared {
    /// Highest barrier epoch that arrived, per dissemination round.
    arrived: [AtomicU64; 64],
    /// Barriers started by this PE.
    epoch: AtomicU64,
}

impl Default for PeShared {
    fn default() -> PeShared {
        PeShared { arrived: std::array::from_fn(|_| AtomicU64::new(0)), epoch: AtomicU64::new(0) }
    }
}

/// A message header (the first 64 bytes of every message). Little-endian,
/// the same on both ends (both are this code).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hdr {
    /// `K_*`.
    pub kind: u8,
    /// AMO: `AmoOp`; PUT with signal: `SignalOp`.
    pub sub: u8,
    /// AMO: `AmoType`.
    pub ty: u8,
    /// `F_*`.
    pub flags: u8,
    /// The sender's PE.
    pub src_pe: i32,
    /// The initiator's operation id, echoed by answers.
    pub tag: u64,
    /// PUT: destination offset; GET: source offset; AMO: word offset;
    /// BARRIER: round.
    pub dst: u64,
    /// Data bytes (PUT: following the header or inline; GET: to read).
    pub size: u64,
    /// Signal word offset (PUT with `F_SIGNAL`).
    pub sig: u64,
    /// Signal operand.
    pub signal: u64,
    /// Inline data; AMO operand; answers: the value; GET: offset of this chunk
    /// inside the operation; BARRIER: epoch.
    pub value: u64,
    /// AMO compare value; answers: the error code (0: none).
    pub cond: u64,
}

impl Hdr {
    /// A PUT header carries `op`'s signal, if `op` is a put-signal.
    fn add_signal(&mut self, op: &Op) {
        if let Op::PutSignal { sig, signal, op: sop, .. } = *op {
            self.flags |= F_SIGNAL;
            self.sig = sig;
            self.signal = signal;
            self.sub = sop as u8;
        }
    }
}

const _: () = assert!(std::mem::size_of::<Hdr>() == HDR_BYTES);
const _: () = assert!(std::mem::offset_of!(Hdr, signal) == 40 && std::mem::offset_of!(Hdr, value) == 48);

const K_PUT: u8 = 1;
const K_ACK: u8 = 2;
const K_GET: u8 = 3;
const K_GET_REPLY: u8 = 4;
const K_AMO: u8 = 5;
const K_AMO_REPLY: u8 = 6;
const K_BARRIER: u8 = 7;

const F_SIGNAL: u8 = 1;
const F_INLINE: u8 = 2;

/// Completion contexts: the buffer class in the top byte, the index below.
const CTX_RECV: u64 = 1 << 56;
const CTX_SEND_BIG: u64 = 2 << 56;
const CTX_SEND_SMALL: u64 = 3 << 56;
const CTX_MASK: u64 = (1 << 56) - 1;

/// The new value of a word after `op` (two's complement, masked to the type).
pub fn amo_apply(ty: AmoType, op: AmoOp, old: u64, value: u64, cond: u64) -> u64 {
    let m = if ty.size() == 8 { u64::MAX } else { (1u64 << (8 * ty.size())) - 1 };
    let (old, value, cond) = (old & m, value & m, cond & m);
    let new = match op {
        AmoOp::Fetch => old,
        AmoOp::Set | AmoOp::Swap => value,
        AmoOp::CompareSwap => {
            if old == cond {
                value
            } else {
                old
            }
        }
        AmoOp::FetchAdd | AmoOp::Add => old.wrapping_add(value),
        AmoOp::FetchAnd | AmoOp::And => old & value,
        AmoOp::FetchOr | AmoOp::Or => old | value,
        AmoOp::FetchXor | AmoOp::Xor => old ^ value,
    };
    new & m
}

/// A landing record that writes `size` bytes at heap offset `dst` from the
/// device-visible address `src` (`None`: the inline `bits`), then the signal
/// `(sig, value, op)` if any.
fn put_rec(dst: u64, size: u64, src: Option<u64>, bits: u64, signal: Option<(u64, u64, SignalOp)>) -> AgentRec {
    let mut r = AgentRec { kind: CPNET_AGENT_K_PUT as u8, dst, size, ..AgentRec::default() };
    match src {
        Some(a) => r.src = a,
        None => {
            r.flags |= CPNET_AGENT_F_INLINE as u8;
            r.value = bits;
        }
    }
    if let Some((sig, value, op)) = signal {
        r.flags |= CPNET_AGENT_F_SIGNAL as u8;
        r.sig = sig;
        r.signal = value;
        r.sub = op as u8;
    }
    r
}

/// A landing record that copies `size` bytes at heap offset `src` to the
/// device-visible host address `to`.
fn copy_out_rec(src: u64, size: u64, to: u64) -> AgentRec {
    AgentRec { kind: CPNET_AGENT_K_COPY_OUT as u8, dst: src, size, src: to, ..AgentRec::default() }
}

/// Thread-owned objects before the peers are known: open on the service
/// thread, send [`StagedEndpoint::card`] to the peers, then
/// [`StagedEndpoint::connect`].
pub struct StagedEndpoint {
    // Field order is drop order: regions and the endpoint close before the
    // staging memory they point into; the stream is synchronized in Drop of
    // the transport.
    mr: MemoryRegion,
    ep: Rc<Endpoint>,
    av: Rc<AddressVector>,
    cq: Rc<CompletionQueue>,
    _domain: Rc<Domain>,
    events: EventPool,
    stream: Stream,
    /// Before `mem`: it stops the agent (which reads and writes the staging
    /// memory) when dropped.
    landing: Landing,
    mem: Pinned,
    layout: Layout,
    provider: String,
    my_pe: i32,
    n_pes: i32,
    heap: GpuHeap,
    cfg: StagedConfig,
    shared: Arc<PeShared>,
    /// Per PE: the device address of its heap mapped into this process
    /// (CUDA IPC, same host), for the peer path; `None`: messages.
    peer_heaps: Vec<Option<u64>>,
    _cuda: Arc<CudaContext>,
}

/// Offsets in the pinned staging memory.
#[derive(Clone, Copy, Debug)]
struct Layout {
    buf: usize,
    recv: usize,
    n_recv: usize,
    big: usize,
    n_big: usize,
    small: usize,
    /// Per-op scratch words (4 per op): inline data, signal, result.
    scratch: usize,
    total: usize,
}

impl Layout {
    fn new(cfg: &StagedConfig, n_pes: i32) -> Layout {
        let buf = HDR_BYTES + cfg.chunk;
        let n_recv = 2 * cfg.credits as usize * (n_pes.max(1) as usize - 1) + BARRIER_BUFS;
        let recv = 0;
        let big = recv + n_recv * buf;
        let small = big + cfg.send_bufs * buf;
        let scratch = small + SMALL_BUFS * HDR_BYTES;
        let total = scratch + MAX_OPS * 32;
        Layout { buf, recv, n_recv, big, n_big: cfg.send_bufs, small, scratch, total }
    }
}

impl StagedEndpoint {
    /// Open provider `cfg.fabric` for messages, allocate and register the
    /// staging memory, and create the copy stream and the landing ring of
    /// `agent` (the PE's landing agent, [`crate::agent`]), binding `cuda` (the
    /// PE's GPU) to this thread. Call on the service thread that will use it.
    ///
    /// # Errors
    /// [`TransportError::Fabric`] naming the step; [`TransportError::Cuda`].
    #[allow(clippy::too_many_arguments, reason = "each is a distinct fact of the PE; the runtime passes them once per thread")]
    pub fn open(
        cfg: &StagedConfig,
        cuda: Arc<CudaContext>,
        my_pe: i32,
        n_pes: i32,
        heap: GpuHeap,
        shared: Arc<PeShared>,
        peer_heaps: Vec<Option<u64>>,
        agent: AgentKernel,
    ) -> Result<StagedEndpoint, TransportError> {
        let cuda_err = |e: CudaError| TransportError::Cuda { pe: my_pe, what: e.what, why: format!("{:?}", e.source) };
        cuda.bind_to_thread().map_err(|e| TransportError::Cuda { pe: my_pe, what: "cuCtxSetCurrent", why: format!("{e:?}") })?;
        if cfg.chunk == 0 || cfg.credits == 0 || cfg.send_bufs == 0 {
            return Err(TransportError::Config { pe: my_pe, why: "chunk, credits and send buffers must be at least 1".into() });
        }
        let err = |what: &'static str| {
            let provider = cfg.fabric.provider.clone();
            move |source| TransportError::Fabric { pe: my_pe, what, provider, source }
        };
        let mut req = InfoRequest::provider(&cfg.fabric.provider).with_caps(MSG_CAPS);
        if let Some(n) = &cfg.fabric.src_node {
            req = req.with_src_node(n);
        }
        let info = Info::get(&req).map_err(err("fi_getinfo (messages, RDM endpoint)"))?;
        if info.max_msg_size() < HDR_BYTES + cfg.chunk {
            return Err(TransportError::Config {
                pe: my_pe,
                why: format!(
                    "provider {} carries messages of at most {} bytes; CPNET_STAGE_CHUNK must be at most {}",
                    info.provider_name(),
                    info.max_msg_size(),
                    info.max_msg_size().saturating_sub(HDR_BYTES)
                ),
            });
        }
        let layout = Layout::new(cfg, n_pes);
        let fabric = Fabric::open(&info).map_err(err("fi_fabric"))?;
        let domain = Domain::open(&fabric).map_err(err("fi_domain"))?;
        let cq = CompletionQueue::open(&domain, 4 * (layout.n_recv + layout.n_big + SMALL_BUFS)).map_err(err("fi_cq_open"))?;
        let av = AddressVector::open(&domain, n_pes.max(1) as usize).map_err(err("fi_av_open"))?;
        let ep = Endpoint::open(&domain, &cq, &av).map_err(err("endpoint"))?;
        let mem = Pinned::new(layout.total).map_err(cuda_err)?;
        // SAFETY: `mem` is one live allocation owned by the endpoint and
        // dropped after the region (field order); it is touched only through
        // raw pointers (the fabric and the copy engines write it).
        let mr = unsafe { MemoryRegion::register(&domain, mem.ptr(), mem.len(), Some(&ep)) }
            .map_err(err("fi_mr_reg (staging buffers)"))?;
        let stream = Stream::new().map_err(cuda_err)?;
        let landing = Landing::new(agent, u64::from(CPNET_AGENT_DEFAULT_DEPTH), heap.base, heap.size).map_err(cuda_err)?;
        tracing::debug!(pe = my_pe, provider = %info.provider_name(), staging = layout.total, "staged endpoint open");
        Ok(StagedEndpoint {
            mr,
            ep,
            av,
            cq,
            _domain: domain,
            events: EventPool::default(),
            stream,
            landing,
            mem,
            layout,
            provider: info.provider_name(),
            my_pe,
            n_pes,
            heap,
            cfg: cfg.clone(),
            shared,
            peer_heaps,
            _cuda: cuda,
        })
    }

    /// What the peers need to reach us: the endpoint's address.
    pub fn card(&self) -> Vec<u8> {
        self.ep.name().to_vec()
    }

    /// Insert every PE's card (index = PE; ours included, unused), post the
    /// receive buffers and become a transport.
    ///
    /// # Errors
    /// `fi_av_insert` and `fi_recv` failures.
    pub fn connect(self, cards: &[Vec<u8>]) -> Result<StagedTransport, TransportError> {
        let my_pe = self.my_pe;
        let mut peers = Vec::with_capacity(cards.len());
        for (pe, card) in cards.iter().enumerate() {
            if pe as i32 == my_pe {
                peers.push(FiAddr(sys::FI_ADDR_NOTAVAIL));
            } else {
                peers.push(self.av.insert(card).map_err(|source| TransportError::Fabric {
                    pe: my_pe,
                    what: "fi_av_insert (peer address)",
                    provider: self.provider.clone(),
                    source,
                })?);
            }
        }
        let n = self.n_pes.max(1) as usize;
        let rounds = if self.n_pes <= 1 { 0 } else { 32 - ((self.n_pes - 1) as u32).leading_zeros() };
        let t = StagedTransport {
            timing: tracing::enabled!(tracing::Level::DEBUG),
            clock: StageClock::default(),
            recv_at: vec![None; self.layout.n_recv],
            op_at: vec![None; MAX_OPS],
            ops: vec![OpSlot::default(); MAX_OPS],
            free_ops: (0..MAX_OPS as u32).rev().collect(),
            free_big: (0..self.layout.n_big as u32).rev().collect(),
            big_owner: vec![None; self.layout.n_big],
            free_small: (0..SMALL_BUFS as u32).rev().collect(),
            small_owner: vec![None; SMALL_BUFS],
            credits: vec![self.cfg.credits; n],
            peers,
            to_stage: VecDeque::new(),
            copies: VecDeque::new(),
            to_send: VecDeque::new(),
            small_backlog: VecDeque::new(),
            get_wait: VecDeque::new(),
            recv_repost: Vec::new(),
            landed: VecDeque::new(),
            landing_backlog: VecDeque::new(),
            barrier: BarrierState { epoch: 0, round: 0, sent: false },
            rounds,
            poll_buf: vec![0; 64],
            broken: None,
            inner: self,
        };
        let mut t = t;
        for i in 0..t.inner.layout.n_recv {
            t.post_recv(i as u32).map_err(|source| TransportError::Fabric {
                pe: my_pe,
                what: "fi_recv (staging receive buffers)",
                provider: t.inner.provider.clone(),
                source,
            })?;
        }
        Ok(t)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Free,
    /// Data moving; `outstanding` answers or copies pending.
    Data,
    /// A multi-chunk put-signal's data is acknowledged; its signal message
    /// is out.
    Signal,
}

#[derive(Clone, Copy, Debug, Default)]
struct OpSlot {
    phase: Phase,
    tag: Option<Tag>,
    op: Option<Op>,
    generation: u32,
    /// Chunks (requests) in total and started so far.
    chunks: u32,
    started: u32,
    /// Requests, copies or executor items started and not yet finished.
    outstanding: u32,
    error: Option<ErrorCode>,
    value: u64,
    /// A put-signal whose signal goes as its own message once the data has
    /// landed (multi-chunk staged puts; ADD signals on the peer path).
    signal_msg: bool,
}

/// What to do when a copy's event has passed.
#[derive(Clone, Copy, Debug)]
enum After {
    /// Send the staged chunk in big buffer `buf` (`len` bytes with header) to `pe`.
    Send { buf: u32, len: usize, pe: i32 },
    /// A local copy of op `op` finished.
    LocalDone { op: u32 },
    /// A local `g` finished: the value is in the op's scratch word 2.
    LocalResult { op: u32 },
    /// A received PUT was applied: repost `recv`, then ACK (or run the ADD signal first).
    Applied { recv: u32, pe: i32, tag: u64, sig_add: Option<(u64, u64)> },
    /// A GET reply was copied into the heap: repost `recv`, one answer less for `op`.
    GetApplied { recv: u32, op: u32 },
    /// An AMO (or ADD signal) ran in the landing agent; the record's value
    /// is the old value.
    Amo(AmoDone),
    /// A local put-signal's data copy finished: now its ADD signal.
    LocalThenAdd { op: u32, sig: u64, value: u64 },
}

#[derive(Clone, Copy, Debug)]
enum AmoDone {
    Local { op: u32 },
    Reply { pe: i32, tag: u64 },
    Ack { pe: i32, tag: u64 },
}

#[derive(Clone, Copy, Debug)]
struct AmoItem {
    ty: AmoType,
    op: AmoOp,
    dst: u64,
    value: u64,
    cond: u64,
    done: AmoDone,
}

struct BarrierState {
    epoch: u64,
    round: u32,
    sent: bool,
}

/// Where a staged operation's time goes, for the debug report at teardown
/// (`RUST_LOG=cpnet_proxy::staged=debug`): sums in ns, counts, minima.
#[derive(Debug, Default)]
struct StageClock {
    /// Progress calls, and the time from the first to the last.
    passes: u64,
    first_pass: Option<std::time::Instant>,
    last_pass: Option<std::time::Instant>,
    /// A received PUT: its receive completion read, to the data landed.
    land: (u64, u64, u64),
    /// A remote op: submitted, to its request posted.
    post: (u64, u64, u64),
    /// A remote op: submitted, to its last answer.
    answer: (u64, u64, u64),
}

impl StageClock {
    fn add(acc: &mut (u64, u64, u64), since: std::time::Instant) {
        let ns = since.elapsed().as_nanos() as u64;
        acc.0 += 1;
        acc.1 += ns;
        acc.2 = if acc.0 == 1 { ns } else { acc.2.min(ns) };
    }
    fn show(acc: (u64, u64, u64)) -> String {
        if acc.0 == 0 { "-".into() } else { format!("n {} mean {:.2} us min {:.2} us", acc.0, acc.1 as f64 / acc.0 as f64 / 1e3, acc.2 as f64 / 1e3) }
    }
}

/// The staged [`Transport`] of one service thread.
pub struct StagedTransport {
    /// Whether to keep [`StageClock`] (debug logging on for this module at
    /// connect): a clock read per pass and per operation otherwise saved.
    timing: bool,
    clock: StageClock,
    recv_at: Vec<Option<std::time::Instant>>,
    op_at: Vec<Option<std::time::Instant>>,
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
    /// Copies in stream order, each with its event.
    copies: VecDeque<(Event, After)>,
    /// Sends that met `-FI_EAGAIN`: (context, length, peer).
    to_send: VecDeque<(u64, usize, i32)>,
    /// Header-only messages waiting for a small buffer: (peer, header, op).
    small_backlog: VecDeque<(i32, Hdr, Option<u32>)>,
    /// GET requests waiting for a send buffer.
    get_wait: VecDeque<Hdr>,
    /// Receive buffers to post again (`-FI_EAGAIN`).
    recv_repost: Vec<u32>,
    /// Landing records in flight, in seq order, with what to do once applied.
    landed: VecDeque<(u64, After)>,
    /// Records that found the landing ring full.
    landing_backlog: VecDeque<(AgentRec, After)>,
    barrier: BarrierState,
    rounds: u32,
    poll_buf: Vec<u64>,
    /// A CUDA failure: the context is unusable; every later op fails.
    broken: Option<String>,
    // Last: owns the regions, endpoint, stream and memory.
    inner: StagedEndpoint,
}

impl Drop for StagedTransport {
    fn drop(&mut self) {
        // Copies may still read or write the staging memory: let them finish
        // before it is freed (the heap outlives the transport; the runtime
        // frees it after joining the service threads).
        if let Err(e) = self.inner.stream.synchronize() {
            tracing::warn!("PE {}: staged transport teardown: {e}", self.inner.my_pe);
        }
        self.inner.landing.stop();
        let (n, tr, ta, tp) = self.inner.landing.times();
        let per = |t: u64| t as f64 / n.max(1) as f64 / 1e3;
        let c = &self.clock;
        if let (Some(a), Some(b)) = (c.first_pass, c.last_pass) {
            tracing::debug!(
                "PE {}: landing agent: {n} records; per record {:.2} us reading, {:.2} us applying, {:.2} us publishing",
                self.inner.my_pe,
                per(tr),
                per(ta),
                per(tp)
            );
            tracing::debug!(
                "PE {}: staged transport: {} passes, mean {:.3} us; received put landed: {}; request posted: {}; answered: {}; agent launches {}, refused {}",
                self.inner.my_pe,
                c.passes,
                (b - a).as_nanos() as f64 / c.passes.max(1) as f64 / 1e3,
                StageClock::show(c.land),
                StageClock::show(c.post),
                StageClock::show(c.answer),
                self.inner.landing.launches(),
                self.inner.landing.refused()
            );
        }
    }
}

impl StagedTransport {
    /// The provider in use.
    pub fn provider(&self) -> &str {
        &self.inner.provider
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

    /// Record an event for `after` on the copy stream.
    fn after(&mut self, after: After) -> Result<(), CudaError> {
        let ev = self.inner.events.record(&self.inner.stream)?;
        self.copies.push_back((ev, after));
        Ok(())
    }

    /// The address at which kernels (the landing agent) see `p`, a
    /// pointer into the staging memory.
    fn staging_dev(&self, p: *const u8) -> u64 {
        self.inner.mem.dev_ptr() + (p as usize - self.base() as usize) as u64
    }

    /// Whether `bytes` of data land (or leave the heap) through the agent.
    fn agent_sized(&self, bytes: u64) -> bool {
        bytes <= self.inner.landing.max_bytes()
    }

    /// Hand `rec` to the landing agent; `after` runs once it is applied
    /// (records are applied, and their `after`s run, in order).
    fn land(&mut self, rec: AgentRec, after: After) {
        if self.landing_backlog.is_empty()
            && let Some(seq) = self.inner.landing.push(&rec)
        {
            self.landed.push_back((seq, after));
            return;
        }
        self.landing_backlog.push_back((rec, after));
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
        self.land(rec, After::Amo(it.done));
    }

    /// Act on every applied landing record, in order; publish the backlog;
    /// start the agent if records wait.
    fn drain_landed(&mut self, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        while let Some(&(seq, after)) = self.landed.front() {
            if !self.inner.landing.is_done(seq) {
                break;
            }
            self.landed.pop_front();
            let value = self.inner.landing.value(seq);
            self.inner.landing.retire(seq);
            self.run_after(after, value, done)?;
        }
        while let Some(&(rec, after)) = self.landing_backlog.front() {
            let Some(seq) = self.inner.landing.push(&rec) else { break };
            self.landing_backlog.pop_front();
            self.landed.push_back((seq, after));
        }
        self.inner.landing.kick()
    }

    fn start_op(&mut self, tag: Tag, op: &Op) -> Submit {
        if matches!(op, Op::Put { src: PutSrc::Payload, .. } | Op::PutSignal { src: PutSrc::Payload, .. }) {
            // The service locates payload slots (Service::set_payload);
            // one it could not place never gets here.
            return Submit::Done(Outcome::Failed(ErrorCode::BadOp));
        }
        let Some(i) = self.free_ops.pop() else { return Submit::Busy };
        let s = &mut self.ops[i as usize];
        s.generation = s.generation.wrapping_add(1);
        s.phase = Phase::Data;
        s.tag = Some(tag);
        s.op = Some(*op);
        s.chunks = 0;
        s.started = 0;
        s.outstanding = 0;
        s.error = None;
        s.value = 0;
        s.signal_msg = false;
        let pe = op.pe().expect("data operation");
        self.op_at[i as usize] = self.timing.then(std::time::Instant::now);
        let r = if pe == self.inner.my_pe {
            self.start_local(i, op)
        } else if let (Some(Some(peer)), false) = (self.inner.peer_heaps.get(pe as usize), matches!(op, Op::Amo { .. })) {
            self.start_peer(i, op, *peer)
        } else {
            self.start_remote(i, op)
        };
        match r {
            Ok(()) => Submit::Pending,
            Err(e) => {
                self.cuda_failed(&e);
                self.release_op(i);
                Submit::Done(Outcome::Failed(ErrorCode::Fabric))
            }
        }
    }

    fn start_local(&mut self, i: u32, op: &Op) -> Result<(), CudaError> {
        let s = &mut self.ops[i as usize];
        s.outstanding = 1;
        match *op {
            Op::Put { dst, src, size, .. } | Op::PutSignal { dst, src, size, .. } => {
                let signal = match *op {
                    Op::PutSignal { sig, signal, op: sop, .. } => Some((sig, signal, sop)),
                    _ => None,
                };
                if self.agent_sized(size) {
                    let rec = match src {
                        PutSrc::Heap(src) => put_rec(dst, size, Some(self.dev(src)), 0, signal),
                        PutSrc::Inline(bits) => put_rec(dst, size, None, bits, signal),
                        // The agent reads the payload slot through its GPU mapping.
                        PutSrc::Host { dev, .. } => put_rec(dst, size, Some(dev), 0, signal),
                        PutSrc::Payload => unreachable!("refused in start_op"),
                    };
                    self.land(rec, After::LocalDone { op: i });
                    return Ok(());
                }
                self.local_put(i, dst, src, size)?;
                match signal {
                    Some((sig, signal, SignalOp::Set)) => {
                        // SAFETY: the op's own scratch word, not in any copy yet.
                        unsafe { self.scratch(i, 1).write(signal) };
                        // SAFETY: pinned scratch word kept until the event
                        // passes (the op holds it); sig is a decoder-checked
                        // heap offset.
                        unsafe { self.inner.stream.htod(self.dev(sig), self.scratch(i, 1).cast(), 8)? };
                    }
                    // The ADD runs in the agent after the data landed.
                    Some((sig, value, SignalOp::Add)) => return self.after(After::LocalThenAdd { op: i, sig, value }),
                    None => {}
                }
                self.after(After::LocalDone { op: i })
            }
            Op::Get { dst: GetDst::Heap(dst), src, size, .. } => {
                if self.agent_sized(size) {
                    self.land(put_rec(dst, size, Some(self.dev(src)), 0, None), After::LocalDone { op: i });
                    return Ok(());
                }
                // SAFETY: decoder-checked heap ranges of this PE's heap.
                unsafe { self.inner.stream.dtod(self.dev(dst), self.dev(src), size as usize)? };
                self.after(After::LocalDone { op: i })
            }
            Op::Get { dst: GetDst::Result, src, size, .. } => {
                // SAFETY: scratch word 2 is the op's; zeroed first so short
                // reads are zero-extended.
                unsafe { self.scratch(i, 2).write(0) };
                let to = self.staging_dev(self.scratch(i, 2).cast());
                self.land(copy_out_rec(src, size, to), After::LocalResult { op: i });
                Ok(())
            }
            Op::Amo { ty, op, dst, value, cond, .. } => {
                self.land_amo(AmoItem { ty, op, dst, value, cond, done: AmoDone::Local { op: i } });
                Ok(())
            }
            Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => unreachable!("no data"),
        }
    }

    fn local_put(&mut self, i: u32, dst: u64, src: PutSrc, size: u64) -> Result<(), CudaError> {
        if size == 0 {
            return Ok(());
        }
        match src {
            // SAFETY: decoder-checked heap ranges of this PE's heap.
            PutSrc::Heap(src) => unsafe { self.inner.stream.dtod(self.dev(dst), self.dev(src), size as usize) },
            PutSrc::Inline(bits) => {
                // SAFETY: the op's own scratch word.
                unsafe { self.scratch(i, 0).write(bits) };
                // SAFETY: pinned scratch word (size <= 8) kept until the event
                // passes; decoder-checked destination.
                unsafe { self.inner.stream.htod(self.dev(dst), self.scratch(i, 0).cast(), size as usize) }
            }
            // SAFETY: the command's payload slot, pinned and unchanged until
            // the command completes (cmd.h P0), which is after this copy's
            // event; decoder-checked destination.
            PutSrc::Host { host, .. } => unsafe { self.inner.stream.htod(self.dev(dst), host as *const u8, size as usize) },
            PutSrc::Payload => unreachable!("refused in start_op"),
        }
    }

    /// The peer path: `peer` is the target's heap mapped into this process.
    fn start_peer(&mut self, i: u32, op: &Op, peer: u64) -> Result<(), CudaError> {
        let s = &mut self.ops[i as usize];
        s.outstanding = 1;
        s.chunks = 1;
        s.started = 1;
        match *op {
            Op::Put { dst, src, size, .. } | Op::PutSignal { dst, src, size, .. } => {
                if size > 0 {
                    match src {
                        // SAFETY: decoder-checked ranges of our heap and of
                        // the peer's (same size), mapped by CUDA IPC.
                        PutSrc::Heap(src) => unsafe { self.inner.stream.dtod(peer + dst, self.dev(src), size as usize)? },
                        PutSrc::Inline(bits) => {
                            // SAFETY: the op's own scratch word.
                            unsafe { self.scratch(i, 0).write(bits) };
                            // SAFETY: pinned word kept until the event passes;
                            // checked range in the mapped peer heap.
                            unsafe { self.inner.stream.htod(peer + dst, self.scratch(i, 0).cast(), size as usize)? };
                        }
                        // SAFETY: the command's pinned payload slot, unchanged
                        // until the command completes (after this copy's event,
                        // cmd.h P0); checked range in the mapped peer heap.
                        PutSrc::Host { host, .. } => unsafe { self.inner.stream.htod(peer + dst, host as *const u8, size as usize)? },
                        PutSrc::Payload => unreachable!("refused in start_op"),
                    }
                }
                if let Op::PutSignal { sig, signal, op: sop, .. } = *op {
                    match sop {
                        SignalOp::Set => {
                            // SAFETY: the op's own scratch word.
                            unsafe { self.scratch(i, 1).write(signal) };
                            // SAFETY: as above; after the data on the same
                            // stream, so the signal never overtakes it.
                            unsafe { self.inner.stream.htod(peer + sig, self.scratch(i, 1).cast(), 8)? };
                        }
                        // Atomic at the target: its executor, by message,
                        // once the data has landed.
                        SignalOp::Add => self.ops[i as usize].signal_msg = true,
                    }
                }
                self.after(After::LocalDone { op: i })
            }
            Op::Get { dst: GetDst::Heap(dst), src, size, .. } => {
                // SAFETY: decoder-checked ranges (ours, and the mapped peer's).
                unsafe { self.inner.stream.dtod(self.dev(dst), peer + src, size as usize)? };
                self.after(After::LocalDone { op: i })
            }
            Op::Get { dst: GetDst::Result, src, size, .. } => {
                // SAFETY: the op's own scratch word, zeroed for short reads.
                unsafe { self.scratch(i, 2).write(0) };
                // SAFETY: pinned word (8 >= size) read after the event passes.
                unsafe { self.inner.stream.dtoh(self.scratch(i, 2).cast(), peer + src, size as usize)? };
                self.after(After::LocalResult { op: i })
            }
            Op::Amo { .. } | Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => unreachable!("not on the peer path"),
        }
    }

    fn start_remote(&mut self, i: u32, op: &Op) -> Result<(), CudaError> {
        let chunk = self.inner.cfg.chunk as u64;
        let s = &mut self.ops[i as usize];
        s.chunks = match *op {
            Op::Put { src: PutSrc::Heap(_), size, .. } | Op::PutSignal { src: PutSrc::Heap(_), size, .. } => {
                size.div_ceil(chunk).max(1) as u32
            }
            Op::Get { size, .. } => size.div_ceil(chunk).max(1) as u32,
            _ => 1,
        };
        s.signal_msg = s.chunks > 1 && matches!(op, Op::PutSignal { .. });
        self.to_stage.push_back(i);
        self.stage_all()
    }

    /// Start requests of the ops waiting in `to_stage`, in order, while
    /// credits and buffers last.
    fn stage_all(&mut self) -> Result<(), CudaError> {
        while let Some(&i) = self.to_stage.front() {
            if !self.stage_one(i)? {
                break;
            }
            let s = self.ops[i as usize];
            if s.started >= s.chunks {
                self.to_stage.pop_front();
            }
        }
        Ok(())
    }

    /// Start the next request of op `i`; false when out of credits or buffers.
    fn stage_one(&mut self, i: u32) -> Result<bool, CudaError> {
        let s = self.ops[i as usize];
        if s.started >= s.chunks {
            return Ok(true);
        }
        let op = s.op.expect("staged op");
        let pe = op.pe().expect("data op");
        if self.credits[pe as usize] == 0 {
            return Ok(false);
        }
        let chunk = self.inner.cfg.chunk as u64;
        let k = u64::from(s.started);
        let tag = self.tag_of(i);
        if s.phase == Phase::Signal {
            assert!(matches!(op, Op::PutSignal { .. }), "signal phase of a put-signal");
            let mut h = self.hdr(K_PUT);
            h.tag = tag;
            h.add_signal(&op);
            self.send_small(pe, h, Some(i));
            self.credits[pe as usize] -= 1;
            let s = &mut self.ops[i as usize];
            s.started += 1;
            s.outstanding += 1;
            return Ok(true);
        }
        match op {
            Op::Put { dst, src: PutSrc::Heap(src), size, .. } | Op::PutSignal { dst, src: PutSrc::Heap(src), size, .. } => {
                let Some(b) = self.free_big.pop() else { return Ok(false) };
                let off = k * chunk;
                let len = (size - off.min(size)).min(chunk);
                let last = s.started + 1 == s.chunks;
                let mut h = self.hdr(K_PUT);
                h.tag = tag;
                h.dst = dst + off;
                h.size = len;
                if last && s.chunks == 1 {
                    h.add_signal(&op);
                }
                Self::write_hdr(self.big_ptr(b), &h);
                self.big_owner[b as usize] = Some(i);
                let send = After::Send { buf: b, len: HDR_BYTES + len as usize, pe };
                if self.agent_sized(len) {
                    // SAFETY: the payload area of big buffer b, ours until its send completes.
                    let to = self.staging_dev(unsafe { self.big_ptr(b).add(HDR_BYTES) });
                    self.land(copy_out_rec(src + off, len, to), send);
                } else {
                    // SAFETY: the big buffer is ours (popped) until its send
                    // completes; the source range is decoder-checked.
                    unsafe { self.inner.stream.dtoh(self.big_ptr(b).add(HDR_BYTES), self.dev(src + off), len as usize)? };
                    self.after(send)?;
                }
            }
            Op::Put { dst, src: PutSrc::Host { host, .. }, size, .. }
            | Op::PutSignal { dst, src: PutSrc::Host { host, .. }, size, .. } => {
                // The work-group wrote the data into host memory (cmd.h P0):
                // no copy out of the GPU, sent at once, in one request
                // (Service::set_payload's slots are at most one chunk).
                let Some(b) = self.free_big.pop() else { return Ok(false) };
                let mut h = self.hdr(K_PUT);
                h.tag = tag;
                h.dst = dst;
                h.size = size;
                h.add_signal(&op);
                Self::write_hdr(self.big_ptr(b), &h);
                self.big_owner[b as usize] = Some(i);
                // SAFETY: the payload slot holds `size` bytes, unchanged until
                // the command completes (P0), which is after this; big buffer
                // b is ours (popped) and holds HDR_BYTES + one chunk >= size.
                unsafe { std::ptr::copy_nonoverlapping(host as *const u8, self.big_ptr(b).add(HDR_BYTES), size as usize) };
                self.post_send(CTX_SEND_BIG | u64::from(b), HDR_BYTES + size as usize, pe);
            }
            Op::Put { src: PutSrc::Payload, .. } | Op::PutSignal { src: PutSrc::Payload, .. } => {
                unreachable!("refused in start_op")
            }
            Op::Put { dst, src: PutSrc::Inline(bits), size, .. }
            | Op::PutSignal { dst, src: PutSrc::Inline(bits), size, .. } => {
                let mut h = self.hdr(K_PUT);
                h.tag = tag;
                h.dst = dst;
                h.size = size;
                h.flags = F_INLINE;
                h.value = bits;
                h.add_signal(&op);
                self.send_small(pe, h, Some(i));
            }
            Op::Get { src, size, .. } => {
                let off = k * chunk;
                let len = (size - off.min(size)).min(chunk);
                let mut h = self.hdr(K_GET);
                h.tag = tag;
                h.dst = src + off;
                h.size = len;
                h.value = off;
                self.send_small(pe, h, Some(i));
            }
            Op::Amo { ty, op: aop, dst, value, cond, .. } => {
                let mut h = self.hdr(K_AMO);
                h.tag = tag;
                h.dst = dst;
                h.ty = ty as u8;
                h.sub = aop as u8;
                h.value = value;
                h.cond = cond;
                self.send_small(pe, h, Some(i));
            }
            Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => unreachable!("no data"),
        }
        self.credits[pe as usize] -= 1;
        let s = &mut self.ops[i as usize];
        s.started += 1;
        s.outstanding += 1;
        if s.started == 1
            && let Some(t) = self.op_at[i as usize]
        {
            StageClock::add(&mut self.clock.post, t);
        }
        Ok(true)
    }

    /// An answer (or local step) of op `i` finished; complete it when all did.
    fn answered(&mut self, i: u32, done: &mut Vec<Finished>) {
        let s = &mut self.ops[i as usize];
        s.outstanding = s.outstanding.saturating_sub(1);
        self.maybe_finish(i, done);
    }

    fn maybe_finish(&mut self, i: u32, done: &mut Vec<Finished>) {
        let s = self.ops[i as usize];
        if s.phase == Phase::Free || s.outstanding > 0 || s.started < s.chunks {
            return;
        }
        let op = s.op.expect("live op");
        // A put-signal with `signal_msg` sends its signal after its data
        // landed, as one more request (stage_one builds it in phase Signal).
        if s.error.is_none() && s.phase == Phase::Data && s.signal_msg {
            let st = &mut self.ops[i as usize];
            st.phase = Phase::Signal;
            st.chunks += 1;
            self.to_stage.push_back(i);
            return;
        }
        let outcome = match s.error {
            Some(code) => Outcome::Failed(code),
            None => match op {
                Op::Get { dst: GetDst::Result, .. } => Outcome::Value(s.value),
                Op::Amo { op: aop, .. } if aop.fetches() => Outcome::Value(s.value),
                _ => Outcome::Done,
            },
        };
        if let Some(tag) = s.tag {
            done.push(Finished { tag, outcome, op });
        }
        if op.pe() != Some(self.inner.my_pe)
            && let Some(t) = self.op_at[i as usize].take()
        {
            StageClock::add(&mut self.clock.answer, t);
        }
        self.release_op(i);
    }

    fn release_op(&mut self, i: u32) {
        let s = &mut self.ops[i as usize];
        s.phase = Phase::Free;
        s.tag = None;
        s.op = None;
        self.free_ops.push(i);
    }

    /// A message arrived in receive buffer `r`.
    fn on_recv(&mut self, r: u32, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        let p = self.recv_ptr(r);
        let h = Self::read_hdr(p);
        if h.src_pe < 0 || h.src_pe >= self.inner.n_pes || h.src_pe == self.inner.my_pe {
            tracing::error!("PE {}: staged transport: message of kind {} from unknown PE {}", self.inner.my_pe, h.kind, h.src_pe);
            self.repost(r);
            return Ok(());
        }
        let heap = self.inner.heap.size;
        let in_heap = |off: u64, len: u64| off.checked_add(len).is_some_and(|e| e <= heap);
        match h.kind {
            K_PUT => {
                let pe = h.src_pe;
                self.recv_at[r as usize] = self.timing.then(std::time::Instant::now);
                let sig_ok = h.flags & F_SIGNAL == 0 || (in_heap(h.sig, 8) && h.sig.is_multiple_of(8));
                let len_ok = if h.flags & F_INLINE != 0 { h.size <= 8 } else { h.size <= self.inner.cfg.chunk as u64 };
                if !in_heap(h.dst, h.size) || !sig_ok || !len_ok {
                    self.repost(r);
                    let mut a = self.hdr(K_ACK);
                    a.tag = h.tag;
                    a.cond = ErrorCode::BadAddr as u64;
                    self.send_small(pe, a, None);
                    return Ok(());
                }
                let signal = (h.flags & F_SIGNAL != 0)
                    .then(|| (h.sig, h.signal, SignalOp::from_u8(h.sub).unwrap_or(SignalOp::Set)));
                if h.flags & F_INLINE != 0 || self.agent_sized(h.size) {
                    let rec = if h.flags & F_INLINE != 0 {
                        put_rec(h.dst, h.size, None, h.value, signal)
                    } else {
                        // SAFETY: the payload follows the header in the buffer.
                        put_rec(h.dst, h.size, Some(self.staging_dev(unsafe { p.add(HDR_BYTES) })), 0, signal)
                    };
                    self.land(rec, After::Applied { recv: r, pe, tag: h.tag, sig_add: None });
                    return Ok(());
                }
                if h.size > 0 {
                    let src = if h.flags & F_INLINE != 0 {
                        // SAFETY: the header's `value` field inside the buffer.
                        unsafe { p.add(std::mem::offset_of!(Hdr, value)) }
                    } else {
                        // SAFETY: the payload follows the header in the buffer.
                        unsafe { p.add(HDR_BYTES) }
                    };
                    // SAFETY: the receive buffer is pinned and not reposted until
                    // this copy's event passes; the range is checked above.
                    unsafe { self.inner.stream.htod(self.dev(h.dst), src, h.size as usize)? };
                }
                let mut sig_add = None;
                if h.flags & F_SIGNAL != 0 {
                    match SignalOp::from_u8(h.sub) {
                        Some(SignalOp::Add) => sig_add = Some((h.sig, h.signal)),
                        _ => {
                            // SAFETY: the header's `signal` field, pinned, kept
                            // until the event passes; the word is checked above.
                            unsafe {
                                self.inner.stream.htod(self.dev(h.sig), p.add(std::mem::offset_of!(Hdr, signal)), 8)?
                            };
                        }
                    }
                }
                self.after(After::Applied { recv: r, pe, tag: h.tag, sig_add })?;
            }
            K_GET => {
                self.repost(r);
                if !in_heap(h.dst, h.size) || h.size > self.inner.cfg.chunk as u64 {
                    let mut a = self.hdr(K_GET_REPLY);
                    a.tag = h.tag;
                    a.cond = ErrorCode::BadAddr as u64;
                    self.send_small(h.src_pe, a, None);
                } else {
                    self.get_wait.push_back(h);
                    self.serve_gets()?;
                }
            }
            K_AMO => {
                self.repost(r);
                let (ty, op) = (AmoType::from_u8(h.ty), AmoOp::from_u8(h.sub));
                match (ty, op) {
                    (Some(ty), Some(op)) if in_heap(h.dst, ty.size()) && h.dst.is_multiple_of(ty.size()) => {
                        self.land_amo(AmoItem {
                            ty,
                            op,
                            dst: h.dst,
                            value: h.value,
                            cond: h.cond,
                            done: AmoDone::Reply { pe: h.src_pe, tag: h.tag },
                        });
                    }
                    _ => {
                        let mut a = self.hdr(K_AMO_REPLY);
                        a.tag = h.tag;
                        a.cond = ErrorCode::BadAddr as u64;
                        self.send_small(h.src_pe, a, None);
                    }
                }
            }
            K_ACK | K_AMO_REPLY => {
                self.repost(r);
                self.credits[h.src_pe as usize] += 1;
                if let Some(i) = self.op_of(h.tag) {
                    if h.cond != 0 {
                        self.ops[i as usize].error.get_or_insert(ErrorCode::from_i32(h.cond as i32).unwrap_or(ErrorCode::Fabric));
                    }
                    if h.kind == K_AMO_REPLY {
                        self.ops[i as usize].value = h.value;
                    }
                    self.answered(i, done);
                }
            }
            K_GET_REPLY => {
                self.credits[h.src_pe as usize] += 1;
                let Some(i) = self.op_of(h.tag) else {
                    self.repost(r);
                    return Ok(());
                };
                if h.cond != 0 {
                    self.repost(r);
                    self.ops[i as usize].error.get_or_insert(ErrorCode::from_i32(h.cond as i32).unwrap_or(ErrorCode::Fabric));
                    self.answered(i, done);
                    return Ok(());
                }
                match self.ops[i as usize].op {
                    Some(Op::Get { dst: GetDst::Result, size, .. }) => {
                        let mut b = [0u8; 8];
                        let n = (size as usize).min(8);
                        // SAFETY: the reply's payload follows its header; at
                        // most 8 bytes, inside the buffer.
                        unsafe { std::ptr::copy_nonoverlapping(p.add(HDR_BYTES), b.as_mut_ptr(), n) };
                        self.ops[i as usize].value = u64::from_le_bytes(b);
                        self.repost(r);
                        self.answered(i, done);
                    }
                    Some(Op::Get { dst: GetDst::Heap(dst), .. }) if self.agent_sized(h.size) => {
                        // SAFETY: the payload follows the header in the buffer.
                        let from = self.staging_dev(unsafe { p.add(HDR_BYTES) });
                        self.land(put_rec(dst + h.value, h.size, Some(from), 0, None), After::GetApplied { recv: r, op: i });
                    }
                    Some(Op::Get { dst: GetDst::Heap(dst), .. }) => {
                        if h.size > 0 {
                            // SAFETY: pinned payload kept until the event
                            // passes (reposted then); the local range is inside
                            // the decoder-checked destination (offset h.value).
                            unsafe { self.inner.stream.htod(self.dev(dst + h.value), p.add(HDR_BYTES), h.size as usize)? };
                        }
                        self.after(After::GetApplied { recv: r, op: i })?;
                    }
                    _ => self.repost(r),
                }
            }
            K_BARRIER => {
                self.repost(r);
                if let Some(a) = self.inner.shared.arrived.get(h.dst as usize) {
                    // Release: pairs with the Acquire load in `barrier`, so the
                    // thread that sees the arrival sees this thread's earlier
                    // work (nothing more is needed: data completion is by ACK).
                    a.fetch_max(h.value, Ordering::AcqRel);
                }
            }
            other => {
                self.repost(r);
                tracing::error!("PE {}: staged transport: unknown message kind {other} from PE {}", self.inner.my_pe, h.src_pe);
            }
        }
        Ok(())
    }

    fn repost(&mut self, r: u32) {
        if let Err(e) = self.post_recv(r) {
            tracing::error!("PE {}: reposting a receive buffer: {e}", self.inner.my_pe);
        }
    }

    /// Serve waiting GET requests while send buffers last.
    fn serve_gets(&mut self) -> Result<(), CudaError> {
        while let Some(h) = self.get_wait.front().copied() {
            let Some(b) = self.free_big.pop() else { break };
            self.get_wait.pop_front();
            let mut a = self.hdr(K_GET_REPLY);
            a.tag = h.tag;
            a.size = h.size;
            a.value = h.value;
            Self::write_hdr(self.big_ptr(b), &a);
            self.big_owner[b as usize] = None;
            let send = After::Send { buf: b, len: HDR_BYTES + h.size as usize, pe: h.src_pe };
            if self.agent_sized(h.size) {
                // SAFETY: the payload area of big buffer b, ours until its send completes.
                let to = self.staging_dev(unsafe { self.big_ptr(b).add(HDR_BYTES) });
                self.land(copy_out_rec(h.dst, h.size, to), send);
            } else {
                // SAFETY: the big buffer is ours until its send completes; the
                // range was checked against the heap.
                unsafe { self.inner.stream.dtoh(self.big_ptr(b).add(HDR_BYTES), self.dev(h.dst), h.size as usize)? };
                self.after(send)?;
            }
        }
        Ok(())
    }

    /// Act on every copy whose event has passed, in stream order.
    fn drain_copies(&mut self, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        while let Some(&(ev, after)) = self.copies.front() {
            if self.inner.events.query(ev)? == EventState::Pending {
                break;
            }
            self.copies.pop_front();
            self.inner.events.release(ev);
            self.run_after(after, 0, done)?;
        }
        Ok(())
    }

    /// A copy or landing record finished; `value` is a landed AMO's old value.
    fn run_after(&mut self, after: After, value: u64, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        match after {
            After::Send { buf, len, pe } => self.post_send(CTX_SEND_BIG | u64::from(buf), len, pe),
            After::LocalDone { op } => self.answered(op, done),
            After::LocalResult { op } => {
                // SAFETY: the copy into scratch word 2 has completed.
                let v = unsafe { self.scratch(op, 2).read() };
                self.ops[op as usize].value = v;
                self.answered(op, done);
            }
            After::Applied { recv, pe, tag, sig_add } => {
                if let Some(t) = self.recv_at[recv as usize].take() {
                    StageClock::add(&mut self.clock.land, t);
                }
                self.repost(recv);
                match sig_add {
                    Some((sig, value)) => self.land_amo(AmoItem {
                        ty: AmoType::Uint64,
                        op: AmoOp::Add,
                        dst: sig,
                        value,
                        cond: 0,
                        done: AmoDone::Ack { pe, tag },
                    }),
                    None => {
                        let mut a = self.hdr(K_ACK);
                        a.tag = tag;
                        self.send_small(pe, a, None);
                    }
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
            After::Amo(AmoDone::Ack { pe, tag }) => {
                let mut a = self.hdr(K_ACK);
                a.tag = tag;
                self.send_small(pe, a, None);
            }
        }
        Ok(())
    }

    fn fail_all_broken(&mut self, done: &mut Vec<Finished>) {
        // The context is unusable: fail every op in flight so no work-group
        // waits forever, and drop queued copies (their events never pass).
        self.copies.clear();
        self.to_stage.clear();
        self.landed.clear();
        self.landing_backlog.clear();
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
                        self.big_owner[i as usize] = None;
                        self.free_big.push(i);
                    }
                    CTX_SEND_SMALL => {
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
    fn header_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Hdr>(), 64);
        let l = Layout::new(&StagedConfig::new(FabricConfig { provider: "shm".into(), src_node: None }), 4);
        assert_eq!(l.n_recv, 2 * 8 * 3 + BARRIER_BUFS);
        assert!(l.total >= l.scratch + MAX_OPS * 32);
        assert_eq!(l.scratch % 8, 0);
    }
}
