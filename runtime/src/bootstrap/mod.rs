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


mod client;
mod failure;
mod server;
#[cfg(test)]
mod tests;
mod wire;

pub use client::Bootstrap;
pub use failure::{BootstrapError, FailureHandler, PeerFailure};
pub use server::{Server, ServerHandle};

// What the server and client files share.
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::env::{self, Launch, Launcher};
use failure::failure_text;
use wire::{ToClient, ToServer, send_frame};

/// Seconds as a decimal number, for messages.
fn secs(d: Duration) -> String {
    format!("{}", d.as_secs_f64())
}
