//! The proxy daemon, `cpnet-proxyd` (DESIGN.md "The proxy daemon"): a
//! process that owns the fabric endpoints and the service threads of every
//! PE attached to it, from one or several processes and jobs: one per GPU
//! for GPU PEs (`--gpu UUID`, their default under MPS; their side is
//! `crate::gpu`'s daemon module), one per host for CPU PEs
//! (`CPNET_PROXY=daemon`, [`crate::env`]).
//!
//! # Start and election
//!
//! The first PE that finds none (under cpnet-run, mpirun or srun) starts
//! `cpnet-proxyd --dir DIR` when no daemon answers on the socket
//! ([`ensure_running`]); a daemon holds an exclusive `flock` on
//! `DIR/proxyd.lock` for its life and binds `DIR/proxyd.sock` only then, so
//! of several started at once one serves and the others exit. A daemon with
//! no connection for its linger time (`--linger`, `CPNET_PROXYD_LINGER`,
//! default 10 s) exits, unless `--persistent`; SIGINT/SIGTERM stop it. It
//! logs through `tracing` (to `DIR/proxyd.log` when a PE or cpnet-run
//! started it).
//!
//! # Security model
//!
//! * The directory (`CPNET_PROXYD_DIR`, default `$XDG_RUNTIME_DIR/cpnet`,
//!   else `/tmp/cpnet-<uid>`) is created mode 0700 and refused if another
//!   user owns it or its mode lets others in; the socket is 0600.
//! * The daemon reads the peer's credentials (`SO_PEERCRED`) and refuses any
//!   uid but its own.
//! * Jobs: an Attach names a job id and its token (`CPNET_JOB_ID`,
//!   `CPNET_JOB_TOKEN`, drawn at random by cpnet-run). The first PE of a
//!   job fixes its token and size; a PE that names a known job with another
//!   token, another size, or a PE number that is attached already, is
//!   refused. Each PE gets its own endpoints, and its commands are decoded
//!   against its own job's size and heap ([`cpnet_proxy::decode::Limits`]):
//!   no command of one job can name another job's PE or memory.
//! * Anything malformed (bad magic, version, kind, lengths, a truncated
//!   message, no message within 10 s, fds missing or unsealed) is refused
//!   with a line in the daemon's log and, where possible, a Refused answer;
//!   other connections are not affected.
//!
//! # Memory
//!
//! The PE's queue pool and symmetric heap region are memfds ([`shm`]),
//! sealed at their size, passed with `SCM_RIGHTS` in the Attach message
//! ([`wire`]) and mapped by both sides; the daemon registers the heap with
//! libfabric for its endpoints. Nothing is named in `/dev/shm`: the memory
//! goes when both sides have unmapped it.
//!
//! # Faults
//!
//! * A PE that goes away without detaching (killed): the daemon abandons its
//!   services (no drain), and closes its endpoints and unmaps its memory
//!   once every PE of its init cycle has left (a peer endpoint in the same
//!   process may reach them until then: libfabric's shm provider maps a
//!   region once per process); the
//!   PE's job learns of the death through the rendezvous, as without a
//!   daemon; other jobs are not touched.
//! * The daemon dies: every attached PE's link reader sees the connection
//!   end and aborts the PE at once ("lost the proxy daemon cpnet-proxyd (pid
//!   P, socket S)"), which exits with status 1 after `CPNET_ABORT_GRACE`.
//!   cpnet-run removes the dead daemon's socket and shm regions after the job.
//! * A service thread of a PE stalls in the daemon: the daemon's watchdog
//!   (`CPNET_PROXY_STALL_TIMEOUT`, sent in the Attach) reports it to the PE,
//!   which aborts as with the in-process watchdog.

mod client;
mod paths;
mod server;
pub mod shm;
pub mod wire;

pub(crate) use client::DaemonLink;
pub use paths::{DaemonPaths, ensure_running};
pub use server::{DaemonOptions, serve};

/// A fresh job identity for the daemon (`CPNET_JOB_ID`, `CPNET_JOB_TOKEN`)
/// from the kernel's random source.
///
/// # Errors
/// `getrandom` failed.
pub fn new_job_key() -> std::io::Result<crate::env::JobKey> {
    let mut b = [0u8; 24];
    let mut filled = 0;
    while filled < b.len() {
        filled += rustix::rand::getrandom(&mut b[filled..], rustix::rand::GetRandomFlags::empty())?;
    }
    let id = u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) >> 1;
    Ok(crate::env::JobKey { id, token: b[8..].try_into().expect("16 bytes") })
}
