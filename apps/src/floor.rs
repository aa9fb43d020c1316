//! The provider's own floor, measured inside a benchmark beside cpnet's
//! numbers: a raw libfabric 8-byte write ping-pong and 8-byte write rates
//! ([`measure`]), and message ping-pongs and two-way exchanges at each
//! size ([`messages`]), between PE 0 and PE 1, on an endpoint opened from
//! the same `fi_getinfo` request as cpnet's transport
//! ([`cpnet_proxy::transport::fabric_info`]), through the crate's safe
//! libfabric layer ([`cpnet_proxy::fabric`]).
//!
//! Each PE opens a fresh fabric, domain, completion queue, address vector
//! and endpoint and registers a small buffer; the endpoints' addresses and
//! keys go round through the bootstrap ([`Pe::allgather_bytes`]). PE 1 only
//! serves: it polls its completion queue (the target's progress, which
//! manual-progress providers need) and answers pings. PEs above 1 take part
//! in the exchange and the closing barrier only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use cpnet::{GpuPe, Pe};
use cpnet_proxy::fabric::{
    AddressVector, CompletionQueue, Domain, Endpoint, Fabric, FabricError, FiAddr, Info, MemoryRegion, Post,
    RemoteMemory,
};
use cpnet_proxy::transport::{FabricConfig, PeerCard, fabric_info};

/// What the floors need of a PE, CPU or GPU: its number, the provider and
/// address its proxies opened, and the bootstrap's collectives.
pub trait FloorPe {
    /// This PE's number.
    fn my_pe(&self) -> i32;
    /// The provider and bind address of this PE's transport.
    fn fabric_config(&self) -> FabricConfig;
    /// Exchange bytes with every PE. **Collective.**
    fn allgather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Wait for every PE. **Collective.**
    fn barrier_all(&self) -> Result<()>;
}

impl FloorPe for Pe {
    fn my_pe(&self) -> i32 {
        Pe::my_pe(self)
    }
    fn fabric_config(&self) -> FabricConfig {
        Pe::fabric_config(self)
    }
    fn allgather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(Pe::allgather_bytes(self, data)?)
    }
    fn barrier_all(&self) -> Result<()> {
        Ok(Pe::barrier_all(self)?)
    }
}

impl FloorPe for GpuPe {
    fn my_pe(&self) -> i32 {
        GpuPe::my_pe(self)
    }
    fn fabric_config(&self) -> FabricConfig {
        GpuPe::fabric_config(self)
    }
    fn allgather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(GpuPe::allgather_bytes(self, data)?)
    }
    fn barrier_all(&self) -> Result<()> {
        Ok(GpuPe::barrier_all(self)?)
    }
}

/// How long any one wait of the floor may take before it fails.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Words of the registered buffer.
const WORDS: usize = 512;
/// PE 0 writes pings here (PE 1's buffer).
const PING: usize = 0;
/// PE 1 writes pongs here (PE 0's buffer).
const PONG: usize = 1;
/// Phase word: PE 0 writes a phase number to tell PE 1 what to do.
const PHASE: usize = 2;
/// PE 1 acknowledges a phase here (PE 0's buffer).
const ACK: usize = 3;
/// The rate tests' targets: 64 words.
const RATE: usize = 64;
/// The word a flush read reads (peer) and the word it lands in (local).
const FLUSH_SRC: usize = 256;
const FLUSH_DST: usize = 257;
/// Source words of writes.
const SRC: usize = 384;

/// Writes kept in flight by the windowed rate loops.
pub const WINDOW: u64 = 64;

/// What the floor measured (PE 0 only).
#[derive(Clone, Debug)]
pub struct Floor {
    /// The provider, as `fi_getinfo` named it.
    pub provider: String,
    /// Whether the endpoint has `FI_ORDER_RMA_RAW` (what cpnet's injected
    /// puts need).
    pub rma_raw: bool,
    /// One-way latency of an 8-byte write ping-pong, microseconds (half
    /// the median round trip).
    pub pingpong_us: f64,
    /// 8-byte `fi_inject_write`s, then one 8-byte `fi_read` that completes
    /// behind them: M writes/s (`None` if the provider injects nothing).
    pub inject_rate: Option<f64>,
    /// 8-byte `fi_write`s, [`WINDOW`] in flight, each with its completion:
    /// M writes/s.
    pub write_rate: f64,
    /// As `write_rate` with `FI_DELIVERY_COMPLETE` (complete = visible at
    /// the target): M writes/s.
    pub write_dc_rate: f64,
}

/// A fresh fabric, domain, completion queue, address vector and endpoint
/// of `info`, what both floors open before registering their buffers.
struct Opened {
    domain: std::rc::Rc<Domain>,
    cq: std::rc::Rc<CompletionQueue>,
    av: std::rc::Rc<AddressVector>,
    ep: std::rc::Rc<Endpoint>,
}

impl Opened {
    /// `what` prefixes the errors ("floor", "message floor").
    fn new(info: &Info, what: &str) -> Result<Opened> {
        let fabric = Fabric::open(info).with_context(|| format!("{what}: fi_fabric"))?;
        let domain = Domain::open(&fabric).with_context(|| format!("{what}: fi_domain"))?;
        let cq = CompletionQueue::open(&domain, 4096).with_context(|| format!("{what}: fi_cq_open"))?;
        let av = AddressVector::open(&domain, 8).with_context(|| format!("{what}: fi_av_open"))?;
        let ep = Endpoint::open(&domain, &cq, &av).with_context(|| format!("{what}: endpoint"))?;
        Ok(Opened { domain, cq, av, ep })
    }
}

/// The registered buffer: written by the fabric behind Rust's back, so only
/// touched through atomics.
struct Buf {
    words: Box<[AtomicU64]>,
}

impl Buf {
    fn new() -> Buf {
        Buf { words: (0..WORDS).map(|_| AtomicU64::new(0)).collect() }
    }
    fn ptr(&self) -> *mut u8 {
        self.words.as_ptr().cast_mut().cast()
    }
    fn get(&self, w: usize) -> u64 {
        // Acquire: a peer's write landed through the provider (another
        // process's copy, or our own progress); what we do after reading it
        // comes after.
        self.words[w].load(Ordering::Acquire)
    }
    fn set(&self, w: usize, v: u64) {
        self.words[w].store(v, Ordering::Release);
    }
}

/// One side's endpoint. Field order is drop order: the region and the
/// endpoint close before the buffer.
struct Side {
    mr: MemoryRegion,
    ep: std::rc::Rc<Endpoint>,
    cq: std::rc::Rc<CompletionQueue>,
    av: std::rc::Rc<AddressVector>,
    info: Info,
    buf: Buf,
    peer: FiAddr,
    peer_mem: RemoteMemory,
    poll: Vec<u64>,
}

impl Side {
    fn open(cfg: &FabricConfig) -> Result<Side> {
        let info = fabric_info(cfg).context("floor: fi_getinfo")?;
        let Opened { domain, cq, av, ep } = Opened::new(&info, "floor")?;
        let buf = Buf::new();
        // SAFETY: the buffer outlives the region (field order) and is only
        // accessed through atomics.
        let mr = unsafe { MemoryRegion::register(&domain, buf.ptr(), WORDS * 8, Some(&ep)) }
            .context("floor: fi_mr_reg")?;
        let peer_mem = RemoteMemory { base: 0, len: 0, key: cpnet_proxy::fabric::MrKey(0) };
        Ok(Side { mr, ep, cq, av, info, buf, peer: FiAddr(u64::MAX), peer_mem, poll: vec![0; 64] })
    }

    fn card(&self) -> PeerCard {
        PeerCard { name: self.ep.name().to_vec(), mem: self.mr.remote(), mailbox: None, provider: self.info.provider_name() }
    }

    /// Poll the completion queue once (progress); completions read.
    fn progress(&mut self) -> Result<usize> {
        let n = self.cq.poll(&mut self.poll)?;
        Ok(n)
    }

    fn target(&self, word: usize) -> cpnet_proxy::fabric::RemoteTarget {
        self.peer_mem.target(self.peer, (word * 8) as u64, 8).expect("inside the peer's buffer")
    }

    /// Post with `post` until it is taken, progressing meanwhile; the
    /// completions read while retrying.
    fn post(&mut self, what: &str, mut post: impl FnMut(&Side) -> Result<Post, FabricError>) -> Result<usize> {
        let deadline = Instant::now() + TIMEOUT;
        let mut reaped = 0;
        loop {
            match post(self)? {
                Post::Posted => return Ok(reaped),
                Post::Again => reaped += self.progress()?,
            }
            if Instant::now() > deadline {
                bail!("floor: {what} stayed -FI_EAGAIN for {TIMEOUT:?}");
            }
        }
    }

    /// Write 8 bytes (`v`) to the peer's `word`: injected where the
    /// provider injects, else a write whose completion is awaited.
    fn put_word(&mut self, word: usize, v: u64) -> Result<()> {
        let t = self.target(word);
        if self.info.inject_size() >= 8 {
            let bytes = v.to_le_bytes();
            // SAFETY: 8 bytes fit the inject size; the target lies in the
            // peer's registered buffer (RemoteMemory::target), the peer in our AV.
            self.post("fi_inject_write", |s| unsafe { s.ep.inject_write(&bytes, t) })?;
            return Ok(());
        }
        self.buf.set(SRC, v);
        let src = self.mr.local(SRC * 8);
        // SAFETY: the source word is registered and left alone until the
        // completion below; target as above.
        let reaped = self.post("fi_write", |s| unsafe { s.ep.write(src, 8, t, 1) })?;
        if reaped == 0 {
            self.wait("the write's completion", |s| Ok(s.progress()? > 0))?;
        }
        Ok(())
    }

    /// Progress until `done` says so, at most [`TIMEOUT`].
    fn wait(&mut self, what: &str, mut done: impl FnMut(&mut Side) -> Result<bool>) -> Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        let mut n = 0u32;
        while !done(self)? {
            n = n.wrapping_add(1);
            if n.is_multiple_of(1024) && Instant::now() > deadline {
                bail!("floor: waited {TIMEOUT:?} for {what}");
            }
        }
        Ok(())
    }

    fn wait_word(&mut self, word: usize, at_least: u64, what: &str) -> Result<()> {
        self.wait(what, |s| {
            s.progress()?;
            Ok(s.buf.get(word) >= at_least)
        })
    }

    /// An 8-byte read from the peer, awaited: with `FI_ORDER_RMA_RAW` it
    /// completes after every earlier write to that peer was processed.
    fn flush(&mut self) -> Result<()> {
        let t = self.target(FLUSH_SRC);
        let dst = self.mr.local_mut(FLUSH_DST * 8);
        // SAFETY: the destination word is registered and nobody touches it
        // until the completion; the target as in put_word.
        let reaped = self.post("fi_read", |s| unsafe { s.ep.read(dst, 8, t, 2) })?;
        if reaped == 0 {
            self.wait("the flush read", |s| Ok(s.progress()? > 0))?;
        }
        Ok(())
    }
}

/// Measure the floor between PE 0 and PE 1. **Collective** (every PE calls
/// it); PE 0 gets `Some`.
///
/// # Errors
/// Fabric failures, bootstrap failures, a wait past 30 s.
pub fn measure(pe: &impl FloorPe, iters: u64, msgs: u64) -> Result<Option<Floor>> {
    let me = pe.my_pe();
    let mut side = Side::open(&pe.fabric_config())?;
    let cards = pe.allgather_bytes(&side.card().to_bytes())?;
    if me > 1 {
        pe.barrier_all()?;
        return Ok(None);
    }
    let peer = 1 - me as usize;
    let card = PeerCard::from_bytes(&cards[peer]).context("floor: the peer's card")?;
    side.peer = side.av.insert(&card.name).context("floor: fi_av_insert")?;
    side.peer_mem = card.mem;
    let r = if me == 0 { lead(&mut side, iters, msgs).map(Some) } else { serve(&mut side, iters).map(|()| None) };
    // Meet before closing the endpoints: the peer may still be progressing
    // operations of ours.
    pe.barrier_all()?;
    r
}

/// PE 1: answer pings, then progress through each rate phase until PE 0
/// moves the phase on, acknowledging each.
fn serve(s: &mut Side, iters: u64) -> Result<()> {
    for i in 1..=iters {
        s.wait_word(PING, i, "a ping")?;
        s.put_word(PONG, i)?;
    }
    for phase in 1..=3 {
        s.wait_word(PHASE, phase, "the next phase")?;
        s.put_word(ACK, phase)?;
    }
    Ok(())
}

fn lead(s: &mut Side, iters: u64, msgs: u64) -> Result<Floor> {
    ensure!(iters >= 2, "floor: at least 2 ping-pongs");
    let mut rtt = Vec::with_capacity(iters as usize);
    for i in 1..=iters {
        let t = Instant::now();
        s.put_word(PING, i)?;
        s.wait_word(PONG, i, "a pong")?;
        rtt.push(t.elapsed());
    }
    let warm = (iters / 10) as usize;
    let mut rtt = rtt.split_off(warm);
    rtt.sort();
    let pingpong_us = rtt[rtt.len() / 2].as_secs_f64() * 1e6 / 2.0;

    let inject_rate = if s.info.inject_size() >= 8 {
        let t = Instant::now();
        for i in 0..msgs {
            let tgt = s.target(RATE + (i % 64) as usize);
            let bytes = i.to_le_bytes();
            // SAFETY: 8 bytes fit the inject size; the target is in the peer's buffer.
            s.post("fi_inject_write", |s| unsafe { s.ep.inject_write(&bytes, tgt) })?;
        }
        s.flush()?;
        Some(msgs as f64 / t.elapsed().as_secs_f64() / 1e6)
    } else {
        None
    };
    phase(s, 1)?;
    let write_rate = windowed(s, msgs, 0)?;
    phase(s, 2)?;
    let write_dc_rate = windowed(s, msgs, cpnet_proxy::fabric::DELIVERY_COMPLETE)?;
    phase(s, 3)?;
    let rma_raw = s.info.msg_order() & cpnet_proxy::fabric::ORDER_RMA_RAW != 0;
    Ok(Floor { provider: s.info.provider_name(), rma_raw, pingpong_us, inject_rate, write_rate, write_dc_rate })
}

/// Move PE 1 on to `n` and wait for its acknowledgement.
fn phase(s: &mut Side, n: u64) -> Result<()> {
    s.put_word(PHASE, n)?;
    s.wait_word(ACK, n, "the server's acknowledgement")
}

/// `msgs` 8-byte writes with `flags`, [`WINDOW`] in flight; M writes/s.
fn windowed(s: &mut Side, msgs: u64, flags: u64) -> Result<f64> {
    let t = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let src = s.mr.local(SRC * 8);
    let deadline = Instant::now() + TIMEOUT;
    while done < msgs {
        while posted < msgs && posted - done < WINDOW {
            let tgt = s.target(RATE + (posted % 64) as usize);
            // SAFETY: the source word is registered and never changed while
            // writes from it are in flight; the target is in the peer's buffer.
            match unsafe { s.ep.writemsg(src, 8, tgt, posted, flags) }? {
                Post::Posted => posted += 1,
                Post::Again => break,
            }
        }
        let n = s.progress()? as u64;
        done += n;
        if n == 0 && Instant::now() > deadline {
            bail!("floor: {done} of {msgs} windowed writes complete after {TIMEOUT:?}");
        }
    }
    Ok(msgs as f64 / t.elapsed().as_secs_f64() / 1e6)
}

/// Receive buffers each side of [`messages`] keeps posted.
const RECVS: usize = 8;
/// Completion contexts of [`messages`]' sends; receives use their slot.
const SEND_CTX: u64 = 1 << 32;

/// The provider's own message floor at one size: `fi_send` into
/// pre-posted `fi_recv`s (fi_msg(3)), the operations cpnet's staged path
/// carries puts and signals with.
#[derive(Clone, Debug)]
pub struct MsgFloor {
    /// Message size, bytes.
    pub size: u64,
    /// Ping-pong: half the mean round trip (PE 0 sends, PE 1 answers when
    /// its receive completes), µs.
    pub one_way_us: f64,
    /// Exchange: both PEs send at once and wait for the other's message,
    /// round after round; the mean round, µs. A round of cpnet's
    /// `cpnet-gpu-p2p --pingpong` exchange, or of a halo exchange such as
    /// Jacobi's, cannot be shorter.
    pub exchange_us: f64,
}

/// One side of [`messages`]: an endpoint with [`RECVS`] receive slots of
/// `max` bytes and a send buffer. Field order is drop order: the region
/// and the endpoint close before the buffer.
struct MsgSide {
    mr: MemoryRegion,
    ep: std::rc::Rc<Endpoint>,
    cq: std::rc::Rc<CompletionQueue>,
    av: std::rc::Rc<AddressVector>,
    /// Send buffer (slot 0) and receive slots 1..=RECVS, `max` bytes each:
    /// written by the provider behind Rust's back, never read here.
    _buf: Box<[AtomicU64]>,
    max: usize,
    peer: FiAddr,
    poll: Vec<u64>,
    /// Receives completed, sends completed, sends posted.
    received: u64,
    sent: u64,
    posted: u64,
}

impl MsgSide {
    fn open(cfg: &FabricConfig, max: usize) -> Result<MsgSide> {
        let info = fabric_info(cfg).context("message floor: fi_getinfo")?;
        ensure!(
            info.caps() & cpnet_proxy::fabric::MSG_CAPS == cpnet_proxy::fabric::MSG_CAPS,
            "message floor: provider {} offers no FI_MSG",
            info.provider_name()
        );
        let Opened { domain, cq, av, ep } = Opened::new(&info, "message floor")?;
        let max = max.next_multiple_of(8).max(8);
        let buf: Box<[AtomicU64]> = (0..(RECVS + 1) * max / 8).map(|_| AtomicU64::new(0)).collect();
        // SAFETY: the buffer outlives the region (field order); nothing here
        // reads or writes it (only the provider does).
        let mr = unsafe { MemoryRegion::register(&domain, buf.as_ptr().cast_mut().cast(), buf.len() * 8, Some(&ep)) }
            .context("message floor: fi_mr_reg")?;
        let mut s = MsgSide { mr, ep, cq, av, _buf: buf, max, peer: FiAddr(u64::MAX), poll: vec![0; 64], received: 0, sent: 0, posted: 0 };
        for k in 0..RECVS {
            s.post_recv(k)?;
        }
        Ok(s)
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        let dst = self.mr.local_mut((1 + slot) * self.max);
        let max = self.max;
        let deadline = Instant::now() + TIMEOUT;
        loop {
            // SAFETY: slot `slot` lies in the registered buffer and nobody
            // touches it until its completion (slot number as the context).
            match unsafe { self.ep.recv(dst, max, slot as u64) }? {
                Post::Posted => return Ok(()),
                Post::Again => self.progress()?,
            }
            ensure!(Instant::now() < deadline, "message floor: fi_recv stayed -FI_EAGAIN for {TIMEOUT:?}");
        }
    }

    /// Read completions: count sends, count and repost receives.
    fn progress(&mut self) -> Result<()> {
        let n = self.cq.poll(&mut self.poll)?;
        for k in 0..n {
            let c = self.poll[k];
            if c >= SEND_CTX {
                self.sent += 1;
            } else {
                self.received += 1;
                self.post_recv(c as usize)?;
            }
        }
        Ok(())
    }

    /// Send `size` bytes from the send buffer; at most [`RECVS`] / 2 sends
    /// in flight (the buffer is only read while they are).
    fn send(&mut self, size: usize) -> Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        while self.posted - self.sent >= (RECVS / 2) as u64 {
            self.progress()?;
            ensure!(Instant::now() < deadline, "message floor: sends not completing after {TIMEOUT:?}");
        }
        let src = self.mr.local(0);
        loop {
            // SAFETY: the send buffer is registered and never written; the
            // peer is in our AV.
            match unsafe { self.ep.send(src, size, self.peer, SEND_CTX + self.posted) }? {
                Post::Posted => break,
                Post::Again => self.progress()?,
            }
            ensure!(Instant::now() < deadline, "message floor: fi_send stayed -FI_EAGAIN for {TIMEOUT:?}");
        }
        self.posted += 1;
        Ok(())
    }

    /// Progress until `received` reaches `n`.
    fn wait_received(&mut self, n: u64) -> Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        let mut k = 0u32;
        while self.received < n {
            self.progress()?;
            k = k.wrapping_add(1);
            if k.is_multiple_of(1024) && Instant::now() > deadline {
                bail!("message floor: waited {TIMEOUT:?} for message {n} (have {})", self.received);
            }
        }
        Ok(())
    }

    /// Progress until every posted send completed.
    fn drain(&mut self) -> Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        while self.sent < self.posted {
            self.progress()?;
            ensure!(Instant::now() < deadline, "message floor: sends not completing after {TIMEOUT:?}");
        }
        Ok(())
    }
}

/// Measure the provider's message ping-pong and two-way exchange between
/// PE 0 and PE 1 at each of `sizes` (bytes), `iters` timed rounds each
/// after `iters / 10` warm-up rounds. **Collective** (every PE calls it;
/// PEs above 1 only meet the barriers); PE 0 gets `Some`.
///
/// # Errors
/// A provider without `FI_MSG`, fabric or bootstrap failures, a wait past
/// 30 s, an empty `sizes` or `iters` below 1.
pub fn messages(pe: &impl FloorPe, sizes: &[u64], iters: u64) -> Result<Option<Vec<MsgFloor>>> {
    ensure!(iters >= 1 && !sizes.is_empty(), "message floor: at least one size and one round");
    let me = pe.my_pe();
    let max = *sizes.iter().max().unwrap_or(&8) as usize;
    let side = if me <= 1 { Some(MsgSide::open(&pe.fabric_config(), max)?) } else { None };
    let card = side.as_ref().map(|s| s.ep.name().to_vec()).unwrap_or_default();
    let cards = pe.allgather_bytes(&card)?;
    let Some(mut s) = side else {
        for _ in sizes {
            pe.barrier_all()?;
            pe.barrier_all()?;
        }
        pe.barrier_all()?;
        return Ok(None);
    };
    s.peer = s.av.insert(&cards[1 - me as usize]).context("message floor: fi_av_insert")?;
    let warm = (iters / 10).max(1);
    let mut out = Vec::with_capacity(sizes.len());
    for &size in sizes {
        let size = size as usize;
        // Ping-pong: PE 0 sends, PE 1 answers each message.
        pe.barrier_all()?;
        let mut t = Instant::now();
        for i in 1..=warm + iters {
            if i == warm + 1 {
                t = Instant::now();
            }
            if me == 0 {
                s.send(size)?;
                s.wait_received(s.received + 1)?;
            } else {
                s.wait_received(s.received + 1)?;
                s.send(size)?;
            }
        }
        let one_way_us = t.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64;
        s.drain()?;
        // Exchange: both send, then wait for the other's.
        pe.barrier_all()?;
        let base = s.received;
        let mut t = Instant::now();
        for i in 1..=warm + iters {
            if i == warm + 1 {
                t = Instant::now();
            }
            s.send(size)?;
            s.wait_received(base + i)?;
        }
        let exchange_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        s.drain()?;
        out.push(MsgFloor { size: size as u64, one_way_us, exchange_us });
    }
    // Meet before closing the endpoints: the peer may still be progressing.
    pe.barrier_all()?;
    Ok(if me == 0 { Some(out) } else { None })
}
