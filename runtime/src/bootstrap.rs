//! The TCP rendezvous: how the PEs of a job find each other, exchange their
//! fabric addresses (allgather), synchronise (barrier), finalize together,
//! and learn that one of them died.
//!
//! One [`Server`] per job accepts one TCP connection from every PE. The
//! `cpnet-run` launcher runs it (and knows the exit status of every PE);
//! under `mpirun`/`srun` PE 0 runs it in-process on `CPNET_BOOTSTRAP_ADDR`.
//! Each PE process holds one [`Bootstrap`], the client.
//!
//! Everything here is plain `std::net`: blocking sockets, one thread per
//! connection on the server, one reader thread per client. The rendezvous
//! carries only setup-time traffic (a few small allgathers, barriers, the
//! finalize handshake and failure notices); data moves over libfabric.
//!
//! # Wire format
//!
//! Every message is one frame:
//!
//! ```text
//! frame := len:u32 kind:u8 body        len = 1 + body length (>= 1, < 2^32)
//! ```
//!
//! All integers are little-endian; strings are UTF-8 without terminator and
//! run to the end of the frame; reasons are cut to 4 KiB. `timeout_ms` is
//! the PE's wait timeout for that collective in milliseconds (rounded up),
//! 0 for none (see "Wait timeout" below).
//!
//! Versions: 1, the first; 2, Welcome carries the cycle; 3, Gather and Bye
//! carry `timeout_ms`. Peers of different versions refuse each other at
//! Hello.
//!
//! | kind | name | direction | body |
//! |---|---|---|---|
//! | `0x01` | Hello | PE → server | `magic:u32 = 0x43504e42 ("CPNB") version:u16 = 3 pe:i32 n_pes:i32` |
//! | `0x02` | Gather | PE → server | `round:u64 timeout_ms:u64 data:bytes` |
//! | `0x03` | Bye | PE → server | `timeout_ms:u64` |
//! | `0x04` | Abort | PE → server | `reason:str` |
//! | `0x81` | Welcome | server → PE | `cycle:u64`, the init/finalize cycle this connection belongs to (0, 1, ...) |
//! | `0x82` | Reject | server → PE | `reason:str`; the server then closes |
//! | `0x83` | Gathered | server → PE | `round:u64 n:u32 n × (len:u32 data:bytes)`, PEs in order 0..n |
//! | `0x84` | ByeAck | server → PE | empty; the server then closes |
//! | `0x85` | Aborted | server → PE | `pe:i32 reason:str` (`pe` = -1: no single PE is to blame) |
//!
//! # Protocol
//!
//! 1. **Join.** A PE connects (retrying with backoff until its connect
//!    timeout: the server may not be up yet) and sends Hello. The server
//!    checks magic and version, that `n_pes` is the job's, that `pe` is in
//!    `0..n_pes` and that no other connection has claimed it; it answers
//!    Welcome, or Reject with the reason and closes. If not every PE has
//!    joined within the server's connect timeout, the server fails the job:
//!    "PE k never reached the rendezvous at ADDR within Ns".
//! 2. **Allgather round r** (collective). Every PE sends `Gather{r, data}`;
//!    when all `n_pes` have, the server sends every PE `Gathered{r, all n
//!    blobs in PE order}`. Rounds are numbered from 0 by each client; a PE
//!    sends round `r + 1` only after it received round `r`, so the server
//!    holds at most one round. A barrier is an allgather of empty blobs.
//! 3. **Finalize** (collective). Every PE sends Bye; when all have, the
//!    server sends ByeAck to all and, unless it serves repeated init (below),
//!    ends. A Gather and a Bye in the same phase mean the PEs' collective
//!    calls do not match: the server fails the job saying which PE called
//!    what.
//! 4. **Wait timeout.** A PE's Gather or Bye says how long it may wait for
//!    that collective ([`Bootstrap::set_wait_timeout`]; `Pe` uses
//!    `CPNET_COLLECTIVE_TIMEOUT`). The server times the collective in progress
//!    per PE, from its arrival, or from the last PE's join of the cycle if
//!    that was later (a PE that has not joined is the connect timeout's
//!    business): once one PE has waited longer than its timeout, the
//!    server fails the job (step 5) with `Aborted{pe, reason}`, `pe` the
//!    one PE that had not arrived (-1 if several had not), the reason
//!    "collective timeout: PE j gave up on allgather/barrier round r [of
//!    the job's init #c] after waiting Ws (its wait timeout: Ts); not
//!    arrived: PE k (m of n PEs had). ...". PEs may send different
//!    timeouts (each its own, per collective): the earliest deadline
//!    decides; none runs between collectives, or while a lost
//!    connection's notice is held back. The server is the only judge (a
//!    completing round and a deadline cannot race); a client whose server
//!    says nothing for its timeout + its connect timeout + 5 s gives up by
//!    itself and aborts.
//! 5. **Failure** (one-sided). When a PE's connection ends (EOF or error)
//!    before its Bye, when a PE sends Abort, or when the owner of the server
//!    calls [`ServerHandle::notify_failure`] (cpnet-run does, with the exit
//!    status), the server sends `Aborted{pe, reason}` to every joined PE
//!    (the blamed one too: after a collective mismatch it is alive and
//!    waiting). Only the first failure is broadcast; later ones are logged.
//!    The server stays up until every joined PE has closed its connection
//!    (late joiners are answered with the same Aborted meanwhile), then
//!    ends (a server that serves repeated init stays up until its owner
//!    shuts it down). A client that gets Aborted, or loses its connection
//!    to the server, fails every pending and future collective with
//!    [`BootstrapError::PeerFailed`] and calls its failure handler once.
//! 6. **Repeated init.** `init` ... `finalize` of a PE is one connection,
//!    and one *cycle* of the job (Welcome says which: 0, 1, ...). A server
//!    started [`with_repeated_init`](Server::with_repeated_init), as
//!    cpnet-run's is, opens cycle `c + 1` as soon as every PE of cycle `c`
//!    has finalized (right after the ByeAcks): a new round of joins of the
//!    same `n_pes` PEs, allgather rounds numbered from 0 again.
//!    - Every connection belongs to the cycle that was current when its
//!      Hello arrived. What an earlier cycle's connection sends, and its
//!      closing, are never counted in a later cycle (its PE finalized; only
//!      its EOF is still to come).
//!    - A new cycle has no deadline until its first PE joins; from then on
//!      the others have the connect timeout to follow: "PE k never reached
//!      the rendezvous at ADDR for the job's init #(c+1) within Ns of PE
//!      j" (messages count inits from 1, Welcome counts cycles from 0).
//!    - A PE whose process ended ([`ServerHandle::notify_exit`]) cannot
//!      join again: once another PE has started a new cycle, the job fails
//!      naming the PE that is gone.
//!    - The server runs until its owner shuts it down (cpnet-run does when
//!      every PE process has ended); a failure is final: every later Hello
//!      is answered with the same Aborted.
//!
//!    Without it (PE 0 hosting the server under mpirun/srun), the server
//!    ends after its one cycle; PE 0 binds a new one at its next init. A
//!    Hello that reaches the ending server (a PE re-initializing before PE 0
//!    does) is closed unanswered (or reset with the listener), and a PE not
//!    started by cpnet-run reconnects after such a close, until its connect
//!    timeout.
//!
//! A server with an owner that knows better ([`Server::with_lost_peer_delay`])
//! holds an EOF-based notice back briefly, so that the owner's "killed by
//! signal 9" wins over "connection lost"; clients keep the first notice they
//! get in any case.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::env::{self, Launch, Launcher};

/// Why a job is failing: which PE, and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFailure {
    /// The PE that failed; -1 when no single PE is to blame (e.g. the
    /// launcher's rendezvous went away).
    pub pe: i32,
    /// What happened, in words ("killed by signal 9 (SIGKILL)", "connection
    /// to PE 3 lost (process died?)", or the reason a PE gave to
    /// [`Bootstrap::abort`]).
    pub reason: String,
}

impl fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&failure_text(self.pe, &self.reason))
    }
}

fn failure_text(pe: i32, reason: &str) -> String {
    if pe >= 0 {
        format!("PE {pe} failed: {reason}")
    } else {
        format!("the job failed: {reason}")
    }
}

/// What can go wrong in the bootstrap. Every message names the address or
/// the PE involved and, where there is one, what to check.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The [`Launch`] cannot be bootstrapped (e.g. no rendezvous address).
    #[error("bootstrap configuration: {0}")]
    Config(String),
    /// A socket operation failed; `what` says which, with the address.
    #[error("{what}: {source}")]
    Io {
        /// The operation and the address, e.g. "PE 2 sending allgather round
        /// 3 to the rendezvous at 127.0.0.1:4000".
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A peer sent something this version of cpnet does not understand.
    #[error("bootstrap protocol error: {0}")]
    Protocol(String),
    /// The server refused this PE's Hello (duplicate PE, wrong job size, ...).
    #[error("the rendezvous at {addr} rejected this PE: {reason}")]
    Rejected {
        /// The rendezvous address.
        addr: String,
        /// The server's reason.
        reason: String,
    },
    /// Another PE (or this one, after [`Bootstrap::abort`]) failed; the job
    /// cannot continue.
    #[error("{}", failure_text(*pe, reason))]
    PeerFailed {
        /// The failed PE (-1: none in particular, see [`PeerFailure::pe`]).
        pe: i32,
        /// What happened to it.
        reason: String,
    },
    /// Something took longer than its timeout; `what` says what and what
    /// to check.
    #[error("timed out {what}")]
    Timeout {
        /// What timed out, e.g. "after 60s reaching the rendezvous at ...".
        what: String,
    },
}

impl From<PeerFailure> for BootstrapError {
    fn from(f: PeerFailure) -> BootstrapError {
        BootstrapError::PeerFailed {
            pe: f.pe,
            reason: f.reason,
        }
    }
}

/// The failure handler's type; see [`Bootstrap::set_failure_handler`].
pub type FailureHandler = dyn Fn(&PeerFailure) + Send + Sync;

// ---------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------

mod wire {
    //! Frames and messages; see the module docs of `bootstrap` for the table.

    use std::io::{self, Read};
    use std::time::Duration;

    pub const MAGIC: u32 = 0x4350_4e42; // "CPNB"
    /// 2: Welcome carries the init/finalize cycle (repeated init).
    /// 3: Gather and Bye carry the PE's wait timeout.
    pub const VERSION: u16 = 3;
    /// Largest frame (`len` field), the `u32` limit.
    pub const MAX_FRAME: usize = u32::MAX as usize;
    /// Largest frame accepted before the handshake is done (Hello, Welcome,
    /// Reject, Aborted); a stray client cannot make the server allocate much.
    pub const HANDSHAKE_MAX: usize = 8 << 10;
    /// Reasons are cut to this many bytes.
    pub const MAX_REASON: usize = 4 << 10;

    pub const HELLO: u8 = 0x01;
    pub const GATHER: u8 = 0x02;
    pub const BYE: u8 = 0x03;
    pub const ABORT: u8 = 0x04;
    pub const WELCOME: u8 = 0x81;
    pub const REJECT: u8 = 0x82;
    pub const GATHERED: u8 = 0x83;
    pub const BYE_ACK: u8 = 0x84;
    pub const ABORTED: u8 = 0x85;

    /// A message from a PE to the server.
    #[derive(Debug)]
    pub enum ToServer {
        Hello {
            magic: u32,
            version: u16,
            pe: i32,
            n_pes: i32,
        },
        Gather {
            round: u64,
            /// The PE's wait timeout for this round, see [`timeout_ms`].
            timeout_ms: u64,
            data: Vec<u8>,
        },
        Bye {
            /// The PE's wait timeout for finalize, see [`timeout_ms`].
            timeout_ms: u64,
        },
        Abort {
            reason: String,
        },
    }

    /// A message from the server to a PE.
    #[derive(Debug)]
    pub enum ToClient {
        Welcome { cycle: u64 },
        Reject { reason: String },
        Gathered { round: u64, blobs: Vec<Vec<u8>> },
        ByeAck,
        Aborted { pe: i32, reason: String },
    }

    /// A wait timeout on the wire: whole milliseconds, rounded up (at least
    /// 1); 0 means none (wait forever).
    pub fn timeout_ms(t: Option<Duration>) -> u64 {
        t.map_or(0, |d| {
            let ms = d.as_nanos().div_ceil(1_000_000);
            u64::try_from(ms).unwrap_or(u64::MAX).max(1)
        })
    }

    /// The inverse of [`timeout_ms`].
    pub fn timeout_from_ms(ms: u64) -> Option<Duration> {
        (ms != 0).then(|| Duration::from_millis(ms))
    }

    /// A frame with room for `body_len` bytes of body, header filled in.
    fn frame(kind: u8, body_len: usize) -> io::Result<Vec<u8>> {
        let len = body_len
            .checked_add(1)
            .filter(|&l| l <= MAX_FRAME)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "message of {body_len} bytes exceeds the rendezvous frame limit of {MAX_FRAME} bytes"
                    ),
                )
            })?;
        let mut f = Vec::with_capacity(4 + len);
        f.extend_from_slice(&(len as u32).to_le_bytes());
        f.push(kind);
        Ok(f)
    }

    fn cut(reason: &str) -> &str {
        if reason.len() <= MAX_REASON {
            return reason;
        }
        let mut end = MAX_REASON;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        &reason[..end]
    }

    fn fixed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut f = Vec::with_capacity(5 + body.len());
        f.extend_from_slice(&(1 + body.len() as u32).to_le_bytes());
        f.push(kind);
        f.extend_from_slice(body);
        f
    }

    pub fn hello(pe: i32, n_pes: i32) -> Vec<u8> {
        let mut b = Vec::with_capacity(14);
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&pe.to_le_bytes());
        b.extend_from_slice(&n_pes.to_le_bytes());
        fixed(HELLO, &b)
    }

    pub fn gather(round: u64, timeout: Option<Duration>, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut f = frame(GATHER, 16 + data.len())?;
        f.extend_from_slice(&round.to_le_bytes());
        f.extend_from_slice(&timeout_ms(timeout).to_le_bytes());
        f.extend_from_slice(data);
        Ok(f)
    }

    pub fn bye(timeout: Option<Duration>) -> Vec<u8> {
        fixed(BYE, &timeout_ms(timeout).to_le_bytes())
    }

    pub fn abort(reason: &str) -> Vec<u8> {
        fixed(ABORT, cut(reason).as_bytes())
    }

    pub fn welcome(cycle: u64) -> Vec<u8> {
        fixed(WELCOME, &cycle.to_le_bytes())
    }

    pub fn reject(reason: &str) -> Vec<u8> {
        fixed(REJECT, cut(reason).as_bytes())
    }

    pub fn gathered(round: u64, blobs: &[Vec<u8>]) -> io::Result<Vec<u8>> {
        let body = blobs
            .iter()
            .try_fold(12usize, |acc, b| acc.checked_add(4 + b.len()))
            .unwrap_or(usize::MAX);
        let mut f = frame(GATHERED, body)?;
        f.extend_from_slice(&round.to_le_bytes());
        f.extend_from_slice(&(blobs.len() as u32).to_le_bytes());
        for b in blobs {
            // Each blob fits: the whole frame does.
            f.extend_from_slice(&(b.len() as u32).to_le_bytes());
            f.extend_from_slice(b);
        }
        Ok(f)
    }

    pub fn bye_ack() -> Vec<u8> {
        fixed(BYE_ACK, &[])
    }

    pub fn aborted(pe: i32, reason: &str) -> Vec<u8> {
        let reason = cut(reason).as_bytes();
        let mut b = Vec::with_capacity(4 + reason.len());
        b.extend_from_slice(&pe.to_le_bytes());
        b.extend_from_slice(reason);
        fixed(ABORTED, &b)
    }

    /// Reads one frame of at most `max` bytes (`len` field). `Ok(None)` on a
    /// clean EOF at a frame boundary; `UnexpectedEof` inside a frame;
    /// `InvalidData` for a `len` of 0 or over `max`.
    pub fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Option<(u8, Vec<u8>)>> {
        let mut len = [0u8; 4];
        let mut got = 0;
        while got < len.len() {
            match r.read(&mut len[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 || len > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame length {len} outside 1..={max} (not a cpnet rendezvous peer?)"),
            ));
        }
        let mut kind = [0u8; 1];
        r.read_exact(&mut kind)?;
        let mut body = vec![0u8; len - 1];
        r.read_exact(&mut body)?;
        Ok(Some((kind[0], body)))
    }

    /// A cursor over a body; every take is bounds-checked.
    struct Body<'a>(&'a [u8]);

    impl<'a> Body<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
            if self.0.len() < n {
                return Err(format!(
                    "truncated message: needed {n} more bytes, {} left",
                    self.0.len()
                ));
            }
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            Ok(head)
        }
        fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
            let mut a = [0u8; N];
            a.copy_from_slice(self.take(N)?);
            Ok(a)
        }
        fn u16(&mut self) -> Result<u16, String> {
            Ok(u16::from_le_bytes(self.array()?))
        }
        fn u32(&mut self) -> Result<u32, String> {
            Ok(u32::from_le_bytes(self.array()?))
        }
        fn i32(&mut self) -> Result<i32, String> {
            Ok(i32::from_le_bytes(self.array()?))
        }
        fn u64(&mut self) -> Result<u64, String> {
            Ok(u64::from_le_bytes(self.array()?))
        }
        fn text(self) -> String {
            String::from_utf8_lossy(self.0).into_owned()
        }
        fn end(self, what: &str) -> Result<(), String> {
            if self.0.is_empty() {
                Ok(())
            } else {
                Err(format!("{} trailing bytes after {what}", self.0.len()))
            }
        }
    }

    pub fn decode_to_server(kind: u8, body: Vec<u8>) -> Result<ToServer, String> {
        let mut b = Body(&body);
        Ok(match kind {
            HELLO => {
                let m = ToServer::Hello {
                    magic: b.u32()?,
                    version: b.u16()?,
                    pe: b.i32()?,
                    n_pes: b.i32()?,
                };
                b.end("Hello")?;
                m
            }
            GATHER => {
                let round = b.u64()?;
                let timeout_ms = b.u64()?;
                let mut data = body;
                data.drain(..16);
                ToServer::Gather {
                    round,
                    timeout_ms,
                    data,
                }
            }
            BYE => {
                let timeout_ms = b.u64()?;
                b.end("Bye")?;
                ToServer::Bye { timeout_ms }
            }
            ABORT => ToServer::Abort { reason: b.text() },
            other => return Err(format!("unknown message kind {other:#04x} from a PE")),
        })
    }

    pub fn decode_to_client(kind: u8, body: &[u8]) -> Result<ToClient, String> {
        let mut b = Body(body);
        Ok(match kind {
            WELCOME => {
                let cycle = b.u64()?;
                b.end("Welcome")?;
                ToClient::Welcome { cycle }
            }
            REJECT => ToClient::Reject { reason: b.text() },
            GATHERED => {
                let round = b.u64()?;
                let n = b.u32()? as usize;
                // Each blob takes at least 4 bytes: bound `n` before allocating.
                if n > b.0.len() / 4 {
                    return Err(format!("Gathered claims {n} blobs in {} bytes", b.0.len()));
                }
                let mut blobs = Vec::with_capacity(n);
                for _ in 0..n {
                    let len = b.u32()? as usize;
                    blobs.push(b.take(len)?.to_vec());
                }
                b.end("Gathered")?;
                ToClient::Gathered { round, blobs }
            }
            BYE_ACK => {
                b.end("ByeAck")?;
                ToClient::ByeAck
            }
            ABORTED => ToClient::Aborted {
                pe: b.i32()?,
                reason: b.text(),
            },
            other => return Err(format!("unknown message kind {other:#04x} from the server")),
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn roundtrip_client(frame: Vec<u8>) -> ToClient {
            let (kind, body) = read_frame(&mut frame.as_slice(), MAX_FRAME)
                .unwrap()
                .unwrap();
            decode_to_client(kind, &body).unwrap()
        }

        fn roundtrip_server(frame: Vec<u8>) -> ToServer {
            let (kind, body) = read_frame(&mut frame.as_slice(), MAX_FRAME)
                .unwrap()
                .unwrap();
            decode_to_server(kind, body).unwrap()
        }

        #[test]
        fn hello_layout_is_fixed() {
            let f = hello(3, 8);
            assert_eq!(f.len(), 4 + 1 + 14);
            assert_eq!(&f[..5], &[15, 0, 0, 0, HELLO]);
            assert_eq!(&f[5..9], b"BNPC"); // MAGIC little-endian
            match roundtrip_server(f) {
                ToServer::Hello {
                    magic,
                    version,
                    pe,
                    n_pes,
                } => assert_eq!((magic, version, pe, n_pes), (MAGIC, VERSION, 3, 8)),
                m => panic!("{m:?}"),
            }
        }

        #[test]
        fn welcome_carries_the_cycle() {
            let f = welcome(5);
            assert_eq!(&f[..5], &[9, 0, 0, 0, WELCOME]);
            match roundtrip_client(f) {
                ToClient::Welcome { cycle } => assert_eq!(cycle, 5),
                m => panic!("{m:?}"),
            }
            // Version 1's empty Welcome is refused, not misread.
            assert!(decode_to_client(WELCOME, &[]).is_err());
        }

        #[test]
        fn gather_zero_length_and_data() {
            let t = Some(Duration::from_millis(1500));
            for data in [&b""[..], b"abc"] {
                match roundtrip_server(gather(7, t, data).unwrap()) {
                    ToServer::Gather {
                        round,
                        timeout_ms,
                        data: d,
                    } => {
                        assert_eq!((round, timeout_ms, d.as_slice()), (7, 1500, data));
                    }
                    m => panic!("{m:?}"),
                }
            }
            // Version 2's Gather (no timeout) is refused, not misread.
            assert!(decode_to_server(GATHER, vec![0; 8]).is_err());
        }

        #[test]
        fn bye_carries_the_timeout() {
            let f = bye(None);
            assert_eq!(&f[..5], &[9, 0, 0, 0, BYE]);
            match roundtrip_server(f) {
                ToServer::Bye { timeout_ms } => assert_eq!(timeout_ms, 0),
                m => panic!("{m:?}"),
            }
            assert!(decode_to_server(BYE, vec![]).is_err(), "version 2's empty Bye");
        }

        #[test]
        fn timeouts_round_up_to_milliseconds_and_zero_is_none() {
            assert_eq!(timeout_ms(None), 0);
            assert_eq!(timeout_ms(Some(Duration::ZERO)), 1);
            assert_eq!(timeout_ms(Some(Duration::from_nanos(1))), 1);
            assert_eq!(timeout_ms(Some(Duration::from_micros(1500))), 2);
            assert_eq!(timeout_ms(Some(Duration::from_secs(60))), 60_000);
            assert_eq!(timeout_ms(Some(Duration::MAX)), u64::MAX);
            assert_eq!(timeout_from_ms(0), None);
            assert_eq!(timeout_from_ms(60_000), Some(Duration::from_secs(60)));
        }

        #[test]
        fn gathered_keeps_order_and_empty_blobs() {
            let blobs = vec![b"x".to_vec(), vec![], vec![9; 1000]];
            match roundtrip_client(gathered(2, &blobs).unwrap()) {
                ToClient::Gathered { round, blobs: b } => assert_eq!((round, b), (2, blobs)),
                m => panic!("{m:?}"),
            }
        }

        #[test]
        fn aborted_and_reasons_are_cut() {
            let long = "é".repeat(MAX_REASON); // 2 bytes per char
            match roundtrip_client(aborted(-1, &long)) {
                ToClient::Aborted { pe, reason } => {
                    assert_eq!(pe, -1);
                    assert_eq!(reason.len(), MAX_REASON);
                }
                m => panic!("{m:?}"),
            }
        }

        #[test]
        fn eof_at_boundary_vs_inside_frame() {
            assert!(read_frame(&mut &[][..], 16).unwrap().is_none());
            let e = read_frame(&mut &[5u8, 0][..], 16).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            let e = read_frame(&mut &[5u8, 0, 0, 0, BYE][..], 16).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        }

        #[test]
        fn bad_lengths_are_refused_before_allocating() {
            let e = read_frame(&mut &[0u8, 0, 0, 0][..], 16).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            let e = read_frame(&mut &[17u8, 0, 0, 0][..], 16).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            // A Gathered that claims more blobs than it can hold.
            let mut body = 0u64.to_le_bytes().to_vec();
            body.extend_from_slice(&u32::MAX.to_le_bytes());
            assert!(decode_to_client(GATHERED, &body).is_err());
        }

        #[test]
        fn unknown_kind_and_trailing_bytes() {
            assert!(decode_to_server(0x7f, vec![]).is_err());
            assert!(decode_to_server(BYE, vec![1; 9]).is_err());
            assert!(decode_to_client(0x01, &[]).is_err());
            assert!(decode_to_client(BYE_ACK, &[0]).is_err());
        }
    }
}

use wire::{ToClient, ToServer};

/// Writes a whole frame; `Interrupted` is retried by `write_all`.
fn send_frame(stream: &mut TcpStream, frame: &[u8]) -> io::Result<()> {
    stream.write_all(frame)
}

fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// How long a stopping server waits for the PEs to close their connections
/// after it shut down its side (so that a last Aborted is read, not reset).
const LINGER: Duration = Duration::from_secs(1);
/// How often the server polls its (non-blocking) listener.
const ACCEPT_TICK: Duration = Duration::from_millis(10);

/// The rendezvous server, bound but not yet running. See the
/// [module docs](self) for the protocol.
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
    /// init" in the [module docs](self)). The owner should then tell it of
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
    fn shutdown_failing(mut self, pe: i32, reason: String) -> Result<(), PeerFailure> {
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
    /// Write half; locked for the duration of one frame.
    writer: Mutex<TcpStream>,
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
    cycle: u64,
    /// How long each collective may wait; see [`Bootstrap::set_wait_timeout`].
    wait_timeout: Mutex<Option<Duration>>,
    shared: Arc<Shared>,
    /// `None` for a single PE, and once closed.
    remote: Option<Remote>,
}

/// How much longer than it should need a client waits for the rendezvous
/// to settle a collective before it gives up by itself (see
/// [`Bootstrap::set_wait_timeout`]).
const SERVER_SLACK: Duration = Duration::from_secs(5);

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
                writer: Mutex::new(stream),
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
        self.shared.record_failure(
            PeerFailure {
                pe: self.pe,
                reason: reason.to_owned(),
            },
            false,
        );
        if let Some(remote) = &self.remote {
            let mut w = remote.writer.lock();
            if let Err(e) = send_frame(&mut w, &wire::abort(reason)) {
                tracing::debug!(
                    pe = self.pe,
                    "bootstrap: abort not sent to {}: {e}",
                    remote.addr
                );
            }
        }
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

#[cfg(test)]
mod cycle_tests {
    //! Repeated init (module docs, "Repeated init"): one process, a thread
    //! per PE. The rest of the protocol is tested in `tests/bootstrap.rs`.

    use super::*;
    use std::io::Read;

    pub(super) const CONNECT: Duration = Duration::from_secs(10);

    /// Runs `f` on a thread; fails the test if it takes longer than `limit`.
    pub(super) fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(limit) {
            Ok(v) => v,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("test body took longer than {limit:?}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("test body panicked"),
        }
    }

    pub(super) fn launch(pe: i32, n_pes: i32, addr: &str, launcher: Launcher) -> Launch {
        Launch {
            pe,
            n_pes,
            local_pe: pe,
            local_size: n_pes,
            bootstrap: Some(addr.to_owned()),
            launcher,
        }
    }

    /// A server like cpnet-run's: repeated init.
    pub(super) fn repeating(n: i32, connect_timeout: Duration) -> (ServerHandle, String) {
        let s = Server::bind("127.0.0.1:0")
            .unwrap()
            .with_connect_timeout(connect_timeout)
            .with_repeated_init(true)
            .spawn(n)
            .unwrap();
        let addr = s.local_addr().to_string();
        (s, addr)
    }

    pub(super) fn join(pe: i32, n: i32, addr: &str) -> Bootstrap {
        Bootstrap::connect(&launch(pe, n, addr, Launcher::CpnetRun), CONNECT).unwrap()
    }

    pub(super) fn peer_failed<T: fmt::Debug>(r: Result<T, BootstrapError>) -> (i32, String) {
        match r {
            Err(BootstrapError::PeerFailed { pe, reason }) => (pe, reason),
            other => panic!("expected PeerFailed, got {other:?}"),
        }
    }

    /// Init/allgather/barrier/finalize cycles `cycles` on each of `n`
    /// threads, back to back (a PE re-joins while the server may not have
    /// seen the others' previous connections close).
    fn cycle_threads(n: i32, cycles: std::ops::Range<u64>, addr: &str, launcher: Launcher) {
        let threads: Vec<_> = (0..n)
            .map(|pe| {
                let (addr, cycles) = (addr.to_owned(), cycles.clone());
                thread::spawn(move || {
                    for c in cycles {
                        let boot = Bootstrap::connect(&launch(pe, n, &addr, launcher), CONNECT)
                            .unwrap_or_else(|e| panic!("PE {pe} cycle {c}: {e}"));
                        if launcher == Launcher::CpnetRun {
                            assert_eq!(boot.cycle, c, "PE {pe}");
                        }
                        let mine = [pe as u8, c as u8];
                        let all = boot.allgather(&mine).unwrap();
                        let want: Vec<Vec<u8>> = (0..n).map(|q| vec![q as u8, c as u8]).collect();
                        assert_eq!(all, want, "PE {pe} cycle {c}");
                        boot.barrier().unwrap();
                        boot.finalize().unwrap_or_else(|e| panic!("PE {pe} cycle {c}: {e}"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn repeating_server_serves_cycle_after_cycle() {
        within(Duration::from_secs(60), || {
            let (srv, addr) = repeating(3, CONNECT);
            cycle_threads(3, 0..30, &addr, Launcher::CpnetRun);
            assert!(!srv.is_finished(), "a repeating server waits for the next cycle");
            for pe in 0..3 {
                srv.notify_exit(pe, "process (pid 1) exited with status 0");
            }
            // Every PE ended after its last finalize: the job is just over.
            assert_eq!(srv.shutdown(), Ok(()));
        });
    }

    #[test]
    fn pe0_hosted_rendezvous_serves_repeated_init() {
        within(Duration::from_secs(60), || {
            let addr = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .to_string();
            cycle_threads(3, 0..30, &addr, Launcher::Mpi);
            // PE 0 joined its last server in finalize: the port is free.
            TcpListener::bind(&addr).unwrap();
        });
    }

    #[test]
    fn pe_that_ended_fails_the_next_cycle_whoever_comes_first() {
        within(Duration::from_secs(30), || {
            // The exit is known before PE 0 starts the next cycle.
            let (srv, addr) = repeating(2, CONNECT);
            cycle_threads(2, 0..1, &addr, Launcher::CpnetRun);
            srv.notify_exit(1, "process (pid 9) exited with status 0");
            thread::sleep(Duration::from_millis(50));
            let late = Bootstrap::connect(&launch(0, 2, &addr, Launcher::CpnetRun), CONNECT);
            let (pe, reason) = peer_failed(late);
            assert_eq!(pe, 1, "{reason}");
            assert!(
                reason.contains("exited with status 0 without joining the job's init #2")
                    && reason.contains("which PE 0 started"),
                "{reason}"
            );
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);

            // PE 0 starts the next cycle first; the exit comes while it waits.
            let (srv, addr) = repeating(2, CONNECT);
            cycle_threads(2, 0..2, &addr, Launcher::CpnetRun);
            let pe0 = join(0, 2, &addr);
            let waiting = thread::spawn(move || peer_failed(pe0.barrier()));
            thread::sleep(Duration::from_millis(100));
            srv.notify_exit(1, "process (pid 9) exited with status 0");
            let (pe, reason) = waiting.join().unwrap();
            assert_eq!(pe, 1, "{reason}");
            assert!(reason.contains("without joining the job's init #3"), "{reason}");
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn cycle_that_never_completes_fails_after_the_connect_timeout() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = repeating(2, Duration::from_secs(1));
            cycle_threads(2, 0..1, &addr, Launcher::CpnetRun);
            // Time between cycles is the program's: no deadline runs then.
            thread::sleep(Duration::from_millis(1500));
            cycle_threads(2, 1..2, &addr, Launcher::CpnetRun);
            let t0 = Instant::now();
            let pe0 = join(0, 2, &addr);
            let (pe, reason) = peer_failed(pe0.barrier());
            let elapsed = t0.elapsed();
            assert_eq!(pe, 1, "{reason}");
            assert!(
                reason.contains(&format!(
                    "PE 1 never reached the rendezvous at {addr} for the job's init #3 \
                     within 1s of PE 0"
                )),
                "{reason}"
            );
            assert!(
                elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(5),
                "{elapsed:?}"
            );
            drop(pe0);
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn failure_between_cycles_is_final() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = repeating(2, CONNECT);
            cycle_threads(2, 0..1, &addr, Launcher::CpnetRun);
            srv.notify_failure(1, "process (pid 9) killed by signal 9 (SIGKILL)");
            thread::sleep(Duration::from_millis(50));
            for _ in 0..2 {
                let late = Bootstrap::connect(&launch(0, 2, &addr, Launcher::CpnetRun), CONNECT);
                assert_eq!(
                    peer_failed(late),
                    (1, "process (pid 9) killed by signal 9 (SIGKILL)".to_owned())
                );
            }
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);
        });
    }

    /// Hello and Welcome on a raw socket; returns it and the cycle.
    pub(super) fn raw_join(pe: i32, n: i32, addr: &str) -> (TcpStream, u64) {
        let mut s = TcpStream::connect(addr).unwrap();
        send_frame(&mut s, &wire::hello(pe, n)).unwrap();
        (s.try_clone().unwrap(), expect_cycle(&mut s))
    }

    pub(super) fn expect_cycle(s: &mut TcpStream) -> u64 {
        let (kind, body) = wire::read_frame(s, wire::MAX_FRAME).unwrap().unwrap();
        match wire::decode_to_client(kind, &body).unwrap() {
            ToClient::Welcome { cycle } => cycle,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn an_earlier_cycles_connection_never_counts_in_a_later_one() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = repeating(2, CONNECT);
            let (mut a, ca) = raw_join(0, 2, &addr);
            let (mut b, cb) = raw_join(1, 2, &addr);
            assert_eq!((ca, cb), (0, 0));
            for s in [&mut a, &mut b] {
                send_frame(s, &wire::bye(None)).unwrap();
            }
            for s in [&mut a, &mut b] {
                let (kind, _) = wire::read_frame(s, wire::MAX_FRAME).unwrap().unwrap();
                assert_eq!(kind, wire::BYE_ACK);
                // The server closed its side after ByeAck.
                assert!(wire::read_frame(s, wire::MAX_FRAME).unwrap().is_none());
            }
            // Cycle 1 starts while cycle 0's connections are still open; a
            // late Gather of round 0 on one of them must not be counted (it
            // would make PE 0 "send round 0 twice" below).
            let pe0 = join(0, 2, &addr);
            assert_eq!(pe0.cycle, 1);
            send_frame(&mut a, &wire::gather(0, None, b"stale").unwrap()).unwrap();
            let a2 = addr.clone();
            let pe1 = thread::spawn(move || {
                let b = join(1, 2, &a2);
                let all = b.allgather(b"new1").unwrap();
                b.finalize().unwrap();
                all
            });
            assert_eq!(pe0.allgather(b"new0").unwrap(), vec![b"new0".to_vec(), b"new1".to_vec()]);
            // Cycle 0's connections closing now is no failure either.
            drop(a);
            let mut rest = Vec::new();
            let _ = b.read_to_end(&mut rest);
            drop(b);
            thread::sleep(Duration::from_millis(50));
            assert!(pe0.failure().is_none(), "{:?}", pe0.failure());
            pe0.finalize().unwrap();
            assert_eq!(pe1.join().unwrap(), vec![b"new0".to_vec(), b"new1".to_vec()]);
            assert_eq!(srv.shutdown(), Ok(()));
        });
    }
}

#[cfg(test)]
mod wait_timeout_tests {
    //! Host collectives honour the wait timeout (module docs, "Wait
    //! timeout"): one process, a thread per PE.

    use super::cycle_tests::{CONNECT, expect_cycle, join, launch, peer_failed, repeating, within};
    use super::*;

    const T: Duration = Duration::from_millis(300);

    /// A server that ends after one cycle (PE 0's under mpirun).
    fn single(n: i32) -> (ServerHandle, String) {
        let s = Server::bind("127.0.0.1:0")
            .unwrap()
            .with_connect_timeout(CONNECT)
            .spawn(n)
            .unwrap();
        let addr = s.local_addr().to_string();
        (s, addr)
    }

    fn join_with(pe: i32, n: i32, addr: &str, timeout: Option<Duration>) -> Bootstrap {
        let b = join(pe, n, addr);
        b.set_wait_timeout(timeout);
        b
    }

    /// A PE that joined but does not call the collective: it waits until
    /// it hears of the failure; then its own barrier fails with it too.
    fn stuck(b: Bootstrap) -> thread::JoinHandle<(i32, String)> {
        thread::spawn(move || {
            let t0 = Instant::now();
            while b.failure().is_none() {
                assert!(t0.elapsed() < Duration::from_secs(20), "never told");
                thread::sleep(Duration::from_millis(5));
            }
            peer_failed(b.barrier())
        })
    }

    fn barrier_in_thread(b: Bootstrap) -> thread::JoinHandle<(i32, String)> {
        thread::spawn(move || peer_failed(b.barrier()))
    }

    #[test]
    fn a_pe_that_never_arrives_is_named_on_every_pe() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(3);
            let pes: Vec<Bootstrap> = (0..3).map(|p| join_with(p, 3, &addr, Some(T))).collect();
            // Round 0 completes; PE 1 then never comes to round 1.
            let pes: Vec<Bootstrap> = pes
                .into_iter()
                .map(|b| {
                    thread::spawn(move || {
                        b.barrier().unwrap();
                        b
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect();
            let [p0, p1, p2]: [Bootstrap; 3] = pes.try_into().unwrap();
            let t0 = Instant::now();
            let waiting: Vec<_> = [p0, p2]
                .into_iter()
                .map(|b| thread::spawn(move || peer_failed(b.allgather(b"x"))))
                .collect();
            let p1 = stuck(p1);
            let mut reports: Vec<(i32, String)> =
                waiting.into_iter().map(|t| t.join().unwrap()).collect();
            let elapsed = t0.elapsed();
            reports.push(p1.join().unwrap());
            assert!(elapsed >= T && elapsed < Duration::from_secs(5), "{elapsed:?}");
            for (pe, reason) in &reports {
                assert_eq!(*pe, 1, "{reason}");
                assert!(
                    reason.starts_with("collective timeout: PE 0 gave up on allgather/barrier round 1 after waiting ")
                        || reason.starts_with("collective timeout: PE 2 gave up on allgather/barrier round 1 after waiting "),
                    "{reason}"
                );
                assert!(
                    reason.contains("s (its wait timeout: 0.3s); not arrived: PE 1 (2 of 3 PEs had). Is it stuck")
                        && reason.contains("Raise CPNET_COLLECTIVE_TIMEOUT"),
                    "{reason}"
                );
            }
            // Every PE got the same report.
            assert!(reports.windows(2).all(|w| w[0] == w[1]), "{reports:?}");
            assert_eq!(srv.join().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn several_missing_pes_are_listed_and_none_is_blamed() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(4);
            let p0 = join_with(0, 4, &addr, Some(T));
            let others: Vec<_> = (1..4).map(|p| stuck(join_with(p, 4, &addr, None))).collect();
            let (pe, reason) = peer_failed(p0.barrier());
            assert_eq!(pe, -1, "{reason}");
            assert!(
                reason.contains("PE 0 gave up on allgather/barrier round 0 after waiting")
                    && reason.contains("not arrived: 3 PEs (1, 2, 3) (1 of 4 PEs had). Are they stuck"),
                "{reason}"
            );
            for t in others {
                assert_eq!(t.join().unwrap(), (pe, reason.clone()));
            }
            drop(p0);
            assert_eq!(srv.join().unwrap_err().pe, -1);
        });
    }

    #[test]
    fn pes_may_disagree_the_first_deadline_decides() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(4);
            // PE 0 waits forever, PE 1 for 3 s, both from t = 0; PE 2 for
            // 0.3 s from t = 0.5: its deadline (0.8 s) is the first. PE 3
            // never comes.
            let t0 = Instant::now();
            let a = barrier_in_thread(join_with(0, 4, &addr, None));
            let b = barrier_in_thread(join_with(1, 4, &addr, Some(Duration::from_secs(3))));
            let p2 = join_with(2, 4, &addr, Some(T));
            let d = stuck(join_with(3, 4, &addr, Some(T)));
            thread::sleep(Duration::from_millis(500));
            let (pe, reason) = peer_failed(p2.barrier());
            let elapsed = t0.elapsed();
            assert!(
                elapsed >= Duration::from_millis(800) && elapsed < Duration::from_millis(2900),
                "{elapsed:?}"
            );
            assert_eq!(pe, 3, "{reason}");
            assert!(
                reason.starts_with("collective timeout: PE 2 gave up on allgather/barrier round 0")
                    && reason.contains("not arrived: PE 3 (3 of 4 PEs had)"),
                "{reason}"
            );
            for t in [a, b, d] {
                assert_eq!(t.join().unwrap(), (pe, reason.clone()));
            }
            drop(p2);
            assert_eq!(srv.join().unwrap_err().pe, 3);
        });
    }

    #[test]
    fn collectives_within_the_timeout_and_time_between_them_are_fine() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(3);
            let threads: Vec<_> = (0..3)
                .map(|pe| {
                    let addr = addr.clone();
                    thread::spawn(move || {
                        let b = join_with(pe, 3, &addr, Some(T));
                        for round in 0..4u64 {
                            // Arrivals spread over 0.1 s of the 0.3 s.
                            thread::sleep(Duration::from_millis(50 * pe as u64));
                            let all = b.allgather(&[pe as u8]).unwrap();
                            assert_eq!(all, vec![vec![0], vec![1], vec![2]], "round {round}");
                            // Longer than the timeout, between collectives.
                            if round == 1 {
                                thread::sleep(Duration::from_millis(600));
                            }
                        }
                        b.finalize().unwrap();
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(srv.join(), Ok(()));
        });
    }

    #[test]
    fn the_clock_starts_when_the_last_pe_joined() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(2);
            let p0 = join_with(0, 2, &addr, Some(T));
            let a = thread::spawn(move || {
                p0.barrier().unwrap();
                p0.finalize().unwrap();
            });
            // PE 1 joins after PE 0 waited twice its timeout (the connect
            // timeout is 10 s): not a collective timeout.
            thread::sleep(Duration::from_millis(700));
            let p1 = join_with(1, 2, &addr, Some(T));
            thread::sleep(Duration::from_millis(100));
            p1.barrier().unwrap();
            p1.finalize().unwrap();
            a.join().unwrap();
            assert_eq!(srv.join(), Ok(()));
        });
    }

    #[test]
    fn finalize_times_out_too() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(2);
            let p0 = join_with(0, 2, &addr, Some(T));
            let p1 = stuck(join_with(1, 2, &addr, None));
            let (pe, reason) = match p0.finalize() {
                Err(BootstrapError::PeerFailed { pe, reason }) => (pe, reason),
                r => panic!("{r:?}"),
            };
            assert_eq!(pe, 1);
            assert!(
                reason.starts_with("collective timeout: PE 0 gave up on finalize after waiting")
                    && reason.contains("not arrived: PE 1 (1 of 2 PEs had)"),
                "{reason}"
            );
            assert_eq!(p1.join().unwrap(), (pe, reason));
            assert_eq!(srv.join().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn a_later_init_cycle_is_named() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = repeating(2, CONNECT);
            for _ in 0..2 {
                let b = thread::spawn({
                    let addr = addr.clone();
                    move || join_with(1, 2, &addr, Some(T)).finalize().unwrap()
                });
                join_with(0, 2, &addr, Some(T)).finalize().unwrap();
                b.join().unwrap();
            }
            let p0 = join_with(0, 2, &addr, Some(T));
            let p1 = stuck(join_with(1, 2, &addr, Some(T)));
            let (pe, reason) = peer_failed(p0.barrier());
            assert_eq!(pe, 1);
            assert!(
                reason.starts_with(
                    "collective timeout: PE 0 gave up on allgather/barrier round 0 of the \
                     job's init #3 after waiting"
                ),
                "{reason}"
            );
            assert_eq!(p1.join().unwrap(), (pe, reason));
            drop(p0);
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn a_client_gives_up_on_a_silent_rendezvous_and_aborts() {
        within(Duration::from_secs(30), || {
            // A "rendezvous" that welcomes PE 0 and then says nothing.
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let silent = thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                let (kind, _) = wire::read_frame(&mut s, wire::MAX_FRAME).unwrap().unwrap();
                assert_eq!(kind, wire::HELLO);
                send_frame(&mut s, &wire::welcome(0)).unwrap();
                let mut got = Vec::new();
                while let Ok(Some((kind, body))) = wire::read_frame(&mut s, wire::MAX_FRAME) {
                    got.push(wire::decode_to_server(kind, body).unwrap());
                }
                got
            });
            let connect = Duration::from_millis(200);
            let b = Bootstrap::connect(&launch(0, 2, &addr, Launcher::CpnetRun), connect).unwrap();
            b.set_wait_timeout(Some(T));
            let t0 = Instant::now();
            let e = b.barrier().unwrap_err();
            let elapsed = t0.elapsed();
            let limit = T + connect + SERVER_SLACK;
            assert!(elapsed >= limit && elapsed < limit + Duration::from_secs(3), "{elapsed:?}");
            let BootstrapError::Timeout { what } = &e else {
                panic!("{e:?}")
            };
            assert!(
                what.starts_with("waiting for the rendezvous: PE 0 gave up on barrier round 0 after ")
                    && what.contains(&format!("the rendezvous at {addr} neither completed it")),
                "{what}"
            );
            // It aborted: its later collectives fail, and the server was told.
            assert_eq!(b.failure().map(|f| f.pe), Some(0));
            drop(b);
            let got = silent.join().unwrap();
            assert!(
                matches!(&got[..], [ToServer::Gather { round: 0, timeout_ms: 300, .. }, ToServer::Abort { reason }] if reason.contains("gave up on barrier round 0")),
                "{got:?}"
            );
        });
    }

    #[test]
    fn welcome_and_gather_on_a_raw_socket_carry_the_timeout() {
        // What the server counts is what the PE sent: a raw Gather with a
        // 0.2 s timeout against a PE that never comes.
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(2);
            let mut s = TcpStream::connect(&addr).unwrap();
            send_frame(&mut s, &wire::hello(0, 2)).unwrap();
            assert_eq!(expect_cycle(&mut s), 0);
            let p1 = stuck(join(1, 2, &addr));
            send_frame(&mut s, &wire::gather(0, Some(Duration::from_millis(200)), b"").unwrap()).unwrap();
            let (kind, body) = wire::read_frame(&mut s, wire::MAX_FRAME).unwrap().unwrap();
            match wire::decode_to_client(kind, &body).unwrap() {
                ToClient::Aborted { pe, reason } => {
                    assert_eq!(pe, 1);
                    assert!(reason.contains("(its wait timeout: 0.2s)"), "{reason}");
                }
                m => panic!("{m:?}"),
            }
            assert_eq!(p1.join().unwrap().0, 1);
            drop(s);
            assert_eq!(srv.join().unwrap_err().pe, 1);
        });
    }
}
