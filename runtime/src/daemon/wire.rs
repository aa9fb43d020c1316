//! The attach protocol's messages between a PE and `cpnet-proxyd`: a fixed,
//! versioned header, hand-written little-endian bodies, and file
//! descriptors passed with `SCM_RIGHTS` (only on Attach).
//!
//! ```text
//! frame  := magic:u32 = 0x44_4e_50_43 ("CPND") version:u16 = 2 kind:u16 len:u32 body[len]
//! str    := len:u32 utf8[len]          blob := len:u32 bytes[len]
//! ```
//!
//! | kind | name | direction | body | fds |
//! |---|---|---|---|---|
//! | `0x01` | Attach | PE → daemon | `job:u64 token:[16] pe:i32 n_pes:i32 heap_size:u64 region_len:u64 queues:u32 depth:u32 threads:u32 idle_sleep_us:u64 stall_ms:u64 provider:str src_node:str gpu:u8` and, where `gpu` is 1, `uuid:[16] payload_bytes:u32 n:u32 n × (name:str value:str)` | CPU PE: queue pool memfd, heap region memfd; GPU PE: queue pool, status block, and (payload_bytes > 0) payload slot memfds |
//! | `0x02` | Peers | PE → daemon | `n:u32 n × blob` (every PE's cards, PE order) | |
//! | `0x03` | Detach | PE → daemon | empty | |
//! | `0x04` | Abandon | PE → daemon | empty | |
//! | `0x05` | Errors | PE → daemon | empty | |
//! | `0x81` | Accepted | daemon → PE | `daemon_pid:u32 cards:blob gpu_heap:blob` (a GPU PE's heap: its CUDA IPC handle, 64 bytes; empty for a CPU PE) | |
//! | `0x82` | Refused | daemon → PE | `reason:str`; the daemon then closes | |
//! | `0x83` | Ready | daemon → PE | `n:u32 n × facts` (per thread: provider, fabric, domain, local_addr `str`, `m:u32 m × str`) | |
//! | `0x84` | Stalled | daemon → PE | `report:str` | |
//! | `0x85` | ErrorList | daemon → PE | `n:u32 n × error` | |
//! | `0x86` | Detached | daemon → PE | as ErrorList (the final list); the daemon then closes | |
//!
//! `error := my_pe:i32 wg:u32 queue:u32 seq:u64 op:str pe:i32 addr:u64 size:u64 code:i32`.
//! `idle_sleep_us` 0: spin; `stall_ms` 0: no watchdog; `src_node` empty: none.
//! A GPU PE's heap is GPU memory that the daemon allocates for it (so that
//! it outlives the PE for as long as the daemon's GPU work on it runs): the
//! PE opens it with the IPC handle of Accepted's `gpu_heap`; `region_len`
//! is 0; the (name, value) pairs are the PE's `CPNET_*` tuning variables,
//! which the daemon reads as the PE would ([`crate::env::Tuning::from_lookup`]).
//!
//! A frame whose magic, version or kind is unknown, whose body is longer
//! than [`MAX_BODY`], that ends early, or whose body has bytes left over or
//! too few for its fields, is refused with a message naming what was wrong.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use cpnet_device::layout::ErrorCode;
use cpnet_proxy::service::CommandError;
use cpnet_proxy::transport::EndpointFacts;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// "CPND", little-endian.
pub const MAGIC: u32 = 0x444e_5043;
/// The protocol version; peers of other versions refuse each other.
pub const VERSION: u16 = 2;
/// Bytes of the header.
pub const HEADER: usize = 12;
/// The longest body accepted (cards of up to 64 threads of thousands of PEs fit).
pub const MAX_BODY: usize = 16 << 20;
/// The most fds a frame may carry (a GPU PE's Attach: three).
pub const MAX_FDS: usize = 3;
/// The most tuning variables a GPU Attach may carry.
pub const MAX_TUNING_VARS: usize = 256;
/// Strings (reasons, reports) are cut to this many bytes.
pub const MAX_STR: usize = 64 << 10;

/// Message kinds.
pub mod kind {
    /// PE → daemon: attach, with the queue and heap memfds.
    pub const ATTACH: u16 = 0x01;
    /// PE → daemon: every PE's cards.
    pub const PEERS: u16 = 0x02;
    /// PE → daemon: drain and stop (finalize).
    pub const DETACH: u16 = 0x03;
    /// PE → daemon: the job is failing, stop without draining.
    pub const ABANDON: u16 = 0x04;
    /// PE → daemon: send the command errors so far.
    pub const ERRORS: u16 = 0x05;
    /// Daemon → PE: attached; this PE's cards.
    pub const ACCEPTED: u16 = 0x81;
    /// Daemon → PE: refused, with the reason.
    pub const REFUSED: u16 = 0x82;
    /// Daemon → PE: connected to every PE.
    pub const READY: u16 = 0x83;
    /// Daemon → PE: a service thread stalled (the watchdog's report).
    pub const STALLED: u16 = 0x84;
    /// Daemon → PE: the command errors so far.
    pub const ERROR_LIST: u16 = 0x85;
    /// Daemon → PE: detached, with the final command errors.
    pub const DETACHED: u16 = 0x86;
}

/// What a PE asks to be served with (the fds travel beside it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attach {
    /// The job's id ([`crate::env::JobKey`]).
    pub job: u64,
    /// The job's token.
    pub token: [u8; 16],
    /// This PE.
    pub pe: i32,
    /// PEs in the job.
    pub n_pes: i32,
    /// The user heap, bytes (a multiple of 64).
    pub heap_size: u64,
    /// The heap region's memfd, bytes (`region_len(heap_size)`).
    pub region_len: u64,
    /// Queues in the pool memfd.
    pub queues: u32,
    /// Slots per queue.
    pub depth: u32,
    /// Service threads to run for this PE.
    pub threads: u32,
    /// Park sleep of an idle service thread, µs; 0: spin.
    pub idle_sleep_us: u64,
    /// The stall watchdog's timeout, ms; 0: none.
    pub stall_ms: u64,
    /// The libfabric provider.
    pub provider: String,
    /// Where an IP provider binds; empty: the provider's choice.
    pub src_node: String,
    /// A GPU PE's device and GPU memory; `None` for a CPU PE.
    pub gpu: Option<GpuAttach>,
}

/// What a GPU PE adds to its [`Attach`] (its queues, status block and
/// payload slots travel as memfds; the daemon allocates its heap).
#[derive(Clone, PartialEq, Eq)]
pub struct GpuAttach {
    /// The GPU's UUID (`cuDeviceGetUuid`): the daemon must serve that GPU.
    pub uuid: [u8; 16],
    /// Bytes of a payload slot (`cmd.h` P0); 0: the queues have none.
    pub payload_bytes: u32,
    /// The PE's `CPNET_*` variables (name, value), for the daemon's
    /// [`crate::env::Tuning`] of this PE (staging, landing agents, idle).
    pub tuning: Vec<(String, String)>,
}

impl std::fmt::Debug for GpuAttach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuAttach")
            .field("uuid", &uuid_string(&self.uuid))
            .field("payload_bytes", &self.payload_bytes)
            .field("tuning", &self.tuning.len())
            .finish()
    }
}

/// A GPU's UUID as nvidia-smi prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// A message from a PE.
#[derive(Debug, PartialEq, Eq)]
pub enum ToDaemon {
    /// See [`Attach`].
    Attach(Attach),
    /// Every PE's blob of cards, PE order.
    Peers(Vec<Vec<u8>>),
    /// Drain, stop, and answer Detached.
    Detach,
    /// Stop without draining.
    Abandon,
    /// Answer ErrorList.
    Errors,
}

/// A message from the daemon.
#[derive(Debug, PartialEq, Eq)]
pub enum ToPe {
    /// Attached: the daemon's pid and this PE's blob of cards.
    Accepted {
        /// The daemon's pid (for messages).
        daemon_pid: u32,
        /// The cards of this PE's endpoints in the daemon.
        cards: Vec<u8>,
        /// A GPU PE's heap, allocated by the daemon: its CUDA IPC handle (64
        /// bytes); empty for a CPU PE.
        gpu_heap: Vec<u8>,
    },
    /// Refused; the daemon closes.
    Refused(String),
    /// Connected: per thread, what its transport reports.
    Ready(Vec<EndpointFacts>),
    /// A service thread of this PE stalled: the watchdog's report.
    Stalled(String),
    /// Command errors so far.
    ErrorList(Vec<CommandError>),
    /// Detached, with the final command errors.
    Detached(Vec<CommandError>),
}

/// A received frame.
#[derive(Debug)]
pub struct Frame {
    /// Its kind.
    pub kind: u16,
    /// Its body.
    pub body: Vec<u8>,
    /// The fds that came with it (close-on-exec).
    pub fds: Vec<OwnedFd>,
}

// ---------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------

#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u16(&mut self, v: u16) -> &mut W {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut W {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i32(&mut self, v: i32) -> &mut W {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut W {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut W {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut W {
        let mut end = s.len().min(MAX_STR);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&s.as_bytes()[..end])
    }
    fn errors(&mut self, errs: &[CommandError]) -> &mut W {
        self.u32(errs.len() as u32);
        for e in errs {
            self.i32(e.my_pe).u32(e.wg).u32(e.queue).u64(e.seq).str(e.op).i32(e.pe).u64(e.addr).u64(e.size).i32(e.code as i32);
        }
        self
    }
}

/// The frame of `kind` around `body`.
fn frame(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut w = W::default();
    w.u32(MAGIC).u16(VERSION).u16(kind).u32(body.len() as u32);
    w.0.extend_from_slice(body);
    w.0
}

impl ToDaemon {
    /// This message as a frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W::default();
        let k = match self {
            ToDaemon::Attach(a) => {
                w.u64(a.job);
                w.0.extend_from_slice(&a.token);
                w.i32(a.pe).i32(a.n_pes).u64(a.heap_size).u64(a.region_len).u32(a.queues).u32(a.depth).u32(a.threads);
                w.u64(a.idle_sleep_us).u64(a.stall_ms).str(&a.provider).str(&a.src_node);
                match &a.gpu {
                    None => w.0.push(0),
                    Some(g) => {
                        w.0.push(1);
                        w.0.extend_from_slice(&g.uuid);
                        w.u32(g.payload_bytes).u32(g.tuning.len() as u32);
                        for (k, v) in &g.tuning {
                            w.str(k).str(v);
                        }
                    }
                }
                kind::ATTACH
            }
            ToDaemon::Peers(blobs) => {
                w.u32(blobs.len() as u32);
                for b in blobs {
                    w.bytes(b);
                }
                kind::PEERS
            }
            ToDaemon::Detach => kind::DETACH,
            ToDaemon::Abandon => kind::ABANDON,
            ToDaemon::Errors => kind::ERRORS,
        };
        frame(k, &w.0)
    }

    /// Decodes a frame from a PE.
    ///
    /// # Errors
    /// What is wrong with it: unknown kind, a field cut short, bytes left over.
    pub fn decode(kind: u16, body: &[u8]) -> Result<ToDaemon, String> {
        let mut r = R { b: body, at: 0 };
        let m = match kind {
            kind::ATTACH => {
                let job = r.u64("job")?;
                let token = r.take(16, "token")?.try_into().expect("16 bytes");
                ToDaemon::Attach(Attach {
                    job,
                    token,
                    pe: r.i32("pe")?,
                    n_pes: r.i32("n_pes")?,
                    heap_size: r.u64("heap_size")?,
                    region_len: r.u64("region_len")?,
                    queues: r.u32("queues")?,
                    depth: r.u32("depth")?,
                    threads: r.u32("threads")?,
                    idle_sleep_us: r.u64("idle_sleep_us")?,
                    stall_ms: r.u64("stall_ms")?,
                    provider: r.str("provider")?,
                    src_node: r.str("src_node")?,
                    gpu: match r.take(1, "gpu")?[0] {
                        0 => None,
                        1 => {
                            let uuid = r.take(16, "uuid")?.try_into().expect("16 bytes");
                            let payload_bytes = r.u32("payload_bytes")?;
                            let n = r.u32("tuning variables")? as usize;
                            if n > MAX_TUNING_VARS {
                                return Err(format!("{n} tuning variables (at most {MAX_TUNING_VARS})"));
                            }
                            let mut tuning = Vec::with_capacity(n);
                            for _ in 0..n {
                                tuning.push((r.str("tuning variable")?, r.str("tuning value")?));
                            }
                            Some(GpuAttach { uuid, payload_bytes, tuning })
                        }
                        b => return Err(format!("gpu flag {b} (want 0 or 1)")),
                    },
                })
            }
            kind::PEERS => {
                let n = r.u32("n")? as usize;
                let mut blobs = Vec::with_capacity(n.min(1 << 16));
                for i in 0..n {
                    blobs.push(r.bytes(&format!("cards of PE {i}"))?.to_vec());
                }
                ToDaemon::Peers(blobs)
            }
            kind::DETACH => ToDaemon::Detach,
            kind::ABANDON => ToDaemon::Abandon,
            kind::ERRORS => ToDaemon::Errors,
            k => return Err(format!("unknown message kind {k:#x} from a PE")),
        };
        r.end()?;
        Ok(m)
    }
}

impl ToPe {
    /// This message as a frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W::default();
        let k = match self {
            ToPe::Accepted { daemon_pid, cards, gpu_heap } => {
                w.u32(*daemon_pid).bytes(cards).bytes(gpu_heap);
                kind::ACCEPTED
            }
            ToPe::Refused(reason) => {
                w.str(reason);
                kind::REFUSED
            }
            ToPe::Ready(facts) => {
                w.u32(facts.len() as u32);
                for f in facts {
                    w.str(&f.provider).str(&f.fabric).str(&f.domain).str(&f.local_addr).u32(f.peer_addrs.len() as u32);
                    for a in &f.peer_addrs {
                        w.str(a);
                    }
                }
                kind::READY
            }
            ToPe::Stalled(report) => {
                w.str(report);
                kind::STALLED
            }
            ToPe::ErrorList(errs) => {
                w.errors(errs);
                kind::ERROR_LIST
            }
            ToPe::Detached(errs) => {
                w.errors(errs);
                kind::DETACHED
            }
        };
        frame(k, &w.0)
    }

    /// Decodes a frame from the daemon.
    ///
    /// # Errors
    /// What is wrong with it.
    pub fn decode(kind: u16, body: &[u8]) -> Result<ToPe, String> {
        let mut r = R { b: body, at: 0 };
        let m = match kind {
            kind::ACCEPTED => ToPe::Accepted {
                daemon_pid: r.u32("daemon_pid")?,
                cards: r.bytes("cards")?.to_vec(),
                gpu_heap: r.bytes("gpu_heap")?.to_vec(),
            },
            kind::REFUSED => ToPe::Refused(r.str("reason")?),
            kind::READY => {
                let n = r.u32("threads")? as usize;
                let mut facts = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    let (provider, fabric, domain, local_addr) =
                        (r.str("provider")?, r.str("fabric")?, r.str("domain")?, r.str("local_addr")?);
                    let m = r.u32("peers")? as usize;
                    let mut peer_addrs = Vec::with_capacity(m.min(1 << 16));
                    for _ in 0..m {
                        peer_addrs.push(r.str("peer address")?);
                    }
                    facts.push(EndpointFacts { provider, fabric, domain, local_addr, peer_addrs });
                }
                ToPe::Ready(facts)
            }
            kind::STALLED => ToPe::Stalled(r.str("report")?),
            kind::ERROR_LIST => ToPe::ErrorList(r.errors()?),
            kind::DETACHED => ToPe::Detached(r.errors()?),
            k => return Err(format!("unknown message kind {k:#x} from the daemon")),
        };
        r.end()?;
        Ok(m)
    }
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

struct R<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> R<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| {
            format!("truncated: {what} needs {n} bytes at offset {}, the body has {}", self.at, self.b.len())
        })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn i32(&mut self, what: &str) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self, what: &str) -> Result<&'a [u8], String> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }
    fn str(&mut self, what: &str) -> Result<String, String> {
        let b = self.bytes(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }
    fn errors(&mut self) -> Result<Vec<CommandError>, String> {
        let n = self.u32("errors")? as usize;
        let mut out = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let (my_pe, wg, queue, seq) = (self.i32("my_pe")?, self.u32("wg")?, self.u32("queue")?, self.u64("seq")?);
            let op = intern(&self.str("op")?);
            let (pe, addr, size, code) = (self.i32("pe")?, self.u64("addr")?, self.u64("size")?, self.i32("code")?);
            let code = ErrorCode::from_i32(code).ok_or_else(|| format!("unknown error code {code}"))?;
            out.push(CommandError { my_pe, wg, queue, seq, op, pe, addr, size, code });
        }
        Ok(out)
    }
    fn end(&self) -> Result<(), String> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(format!("{} bytes left over after the last field", self.b.len() - self.at))
        }
    }
}

/// The `&'static str` of an operation's name (`CommandError::op`): names
/// are few (opcodes and AMO kinds), so each distinct one is leaked once; past
/// 256 distinct names, `"?"`.
fn intern(s: &str) -> &'static str {
    use std::sync::Mutex;
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = names.iter().find(|n| **n == s) {
        return n;
    }
    if names.len() >= 256 {
        return "?";
    }
    let n: &'static str = Box::leak(s.to_owned().into_boxed_str());
    names.push(n);
    n
}

// ---------------------------------------------------------------------------
// The socket
// ---------------------------------------------------------------------------

/// Sends one frame, with `fds` attached to its first byte.
///
/// # Errors
/// The socket's error.
pub fn send(stream: &UnixStream, frame: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.is_empty() {
        return (&*stream).write_all(frame);
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other(format!("more than {MAX_FDS} fds in one frame")));
    }
    let sent = rustix::net::sendmsg(stream, &[IoSlice::new(frame)], &mut control, SendFlags::NOSIGNAL)?;
    (&*stream).write_all(&frame[sent..])
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum RecvError {
    /// The socket failed (or its read timeout passed).
    Io(io::Error),
    /// The frame is malformed: bad magic, version, length, or it ends early.
    Malformed(String),
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::Io(e) => write!(f, "{e}"),
            RecvError::Malformed(m) => f.write_str(m),
        }
    }
}

/// Reads one frame and the fds that came with it; `Ok(None)` on a clean
/// end of stream before a frame began.
///
/// # Errors
/// [`RecvError::Malformed`] for a frame cut short (EOF or the socket's read
/// timeout inside it), a bad magic or version, or a body over [`MAX_BODY`];
/// [`RecvError::Io`] for other socket errors.
pub fn recv(stream: &UnixStream) -> Result<Option<Frame>, RecvError> {
    let mut hdr = [0u8; HEADER];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match rustix::net::recvmsg(stream, &mut [IoSliceMut::new(&mut hdr)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(m) => break m,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(RecvError::Io(e.into())),
        }
    };
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = msg {
            fds.extend(it);
        }
    }
    if got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(RecvError::Malformed(format!("more than {MAX_FDS} file descriptors attached")));
    }
    if got.bytes == 0 {
        return Ok(None);
    }
    let cut = |what: &str, e: io::Error| {
        RecvError::Malformed(format!("truncated message: {what} ended early ({e})"))
    };
    (&*stream).read_exact(&mut hdr[got.bytes..]).map_err(|e| cut("the header", e))?;
    let magic = u32::from_le_bytes(hdr[0..4].try_into().expect("4 bytes"));
    let version = u16::from_le_bytes(hdr[4..6].try_into().expect("2 bytes"));
    let kind = u16::from_le_bytes(hdr[6..8].try_into().expect("2 bytes"));
    let len = u32::from_le_bytes(hdr[8..12].try_into().expect("4 bytes")) as usize;
    if magic != MAGIC {
        return Err(RecvError::Malformed(format!("bad magic {magic:#010x} (want {MAGIC:#010x}): not a cpnet attach message")));
    }
    if version != VERSION {
        return Err(RecvError::Malformed(format!("protocol version {version}, this daemon speaks {VERSION}")));
    }
    if len > MAX_BODY {
        return Err(RecvError::Malformed(format!("a body of {len} bytes (at most {MAX_BODY})")));
    }
    let mut body = vec![0u8; len];
    (&*stream).read_exact(&mut body).map_err(|e| cut(&format!("the body ({len} bytes announced)"), e))?;
    Ok(Some(Frame { kind, body, fds }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attach() -> Attach {
        Attach {
            job: 7,
            token: [9; 16],
            pe: 1,
            n_pes: 2,
            heap_size: 1 << 20,
            region_len: (1 << 20) + 4096,
            queues: 64,
            depth: 64,
            threads: 1,
            idle_sleep_us: 0,
            stall_ms: 10_000,
            provider: "shm".into(),
            src_node: String::new(),
            gpu: None,
        }
    }

    fn gpu_attach() -> Attach {
        let mut a = attach();
        a.region_len = 0;
        a.gpu = Some(GpuAttach {
            uuid: [0xab; 16],
            payload_bytes: 1024,
            tuning: vec![("CPNET_AGENT_LANES".into(), "2".into())],
        });
        a
    }

    #[test]
    fn messages_round_trip() {
        for m in [ToDaemon::Attach(attach()), ToDaemon::Attach(gpu_attach()), ToDaemon::Peers(vec![vec![1, 2], vec![]]), ToDaemon::Detach, ToDaemon::Abandon, ToDaemon::Errors] {
            let f = m.encode();
            let kind = u16::from_le_bytes([f[6], f[7]]);
            assert_eq!(ToDaemon::decode(kind, &f[HEADER..]).unwrap(), m);
        }
        let e = CommandError { my_pe: 0, wg: 1, queue: 2, seq: 3, op: "CPNET_OP_PUT", pe: 5, addr: 6, size: 7, code: ErrorCode::BadPe };
        for m in [
            ToPe::Accepted { daemon_pid: 4, cards: vec![1], gpu_heap: vec![] },
            ToPe::Accepted { daemon_pid: 4, cards: vec![1], gpu_heap: vec![9; 64] },
            ToPe::Refused("no".into()),
            ToPe::Ready(vec![EndpointFacts { provider: "shm".into(), fabric: "f".into(), domain: "d".into(), local_addr: "a".into(), peer_addrs: vec!["x".into()] }]),
            ToPe::Stalled("r".into()),
            ToPe::ErrorList(vec![e.clone()]),
            ToPe::Detached(vec![e]),
        ] {
            let f = m.encode();
            let kind = u16::from_le_bytes([f[6], f[7]]);
            assert_eq!(ToPe::decode(kind, &f[HEADER..]).unwrap(), m);
        }
    }

    #[test]
    fn truncated_extra_and_unknown_bodies_are_refused() {
        let f = ToDaemon::Attach(attach()).encode();
        let body = &f[HEADER..];
        for cut in [0, 1, 8, 24, body.len() - 1] {
            let e = ToDaemon::decode(kind::ATTACH, &body[..cut]).unwrap_err();
            assert!(e.contains("truncated"), "{cut}: {e}");
        }
        let mut extra = body.to_vec();
        extra.push(0);
        assert!(ToDaemon::decode(kind::ATTACH, &extra).unwrap_err().contains("left over"));
        assert!(ToDaemon::decode(0x77, &[]).unwrap_err().contains("unknown message kind 0x77"));
        let g = ToDaemon::Attach(gpu_attach()).encode();
        let body = &g[HEADER..];
        let flag = f.len() - HEADER - 1;
        for cut in [flag + 1, flag + 17, flag + 21, body.len() - 1] {
            let e = ToDaemon::decode(kind::ATTACH, &body[..cut]).unwrap_err();
            assert!(e.contains("truncated"), "{cut}: {e}");
        }
        let mut bad = body.to_vec();
        bad[flag] = 2;
        assert!(ToDaemon::decode(kind::ATTACH, &bad).unwrap_err().contains("gpu flag 2"));
        let mut many = body[..flag + 1 + 16 + 4].to_vec();
        many.extend_from_slice(&100_000u32.to_le_bytes());
        assert!(ToDaemon::decode(kind::ATTACH, &many).unwrap_err().contains("100000 tuning variables"));
        assert_eq!(uuid_string(&[0xab; 16]), "GPU-abababab-abab-abab-abab-abababababab");
    }

    #[test]
    fn frames_with_fds_cross_a_socket_and_bad_headers_are_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let (_m, fd) = crate::daemon::shm::SharedMem::create("cpnet-wire-test", 4096).unwrap();
        use std::os::fd::AsFd;
        send(&a, &ToDaemon::Detach.encode(), &[fd.as_fd()]).unwrap();
        let f = recv(&b).unwrap().unwrap();
        assert_eq!((f.kind, f.body.len(), f.fds.len()), (kind::DETACH, 0, 1));
        (&a).write_all(b"GET / HTTP/1.1\r\n").unwrap();
        assert!(matches!(recv(&b), Err(RecvError::Malformed(m)) if m.contains("bad magic")));
        // (The daemon closes a connection after a bad frame; a fresh one.)
        let (a, b) = UnixStream::pair().unwrap();
        let mut hdr = ToDaemon::Errors.encode();
        hdr[8..12].copy_from_slice(&100u32.to_le_bytes());
        (&a).write_all(&hdr).unwrap();
        drop(a);
        assert!(matches!(recv(&b), Err(RecvError::Malformed(m)) if m.contains("truncated")));
    }
}
