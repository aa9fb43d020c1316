//! Peer-failure notices: why a job is failing ([`PeerFailure`]), what the
//! bootstrap's calls return ([`BootstrapError`]), and the handler a PE installs
//! to hear of a failure ([`FailureHandler`]). See the [protocol](super),
//! step 5 "Failure".

use std::fmt;
use std::io;

/// Why a job is failing: which PE, and what happened to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFailure {
    /// The PE that failed; -1 when no single PE is to blame (e.g. the
    /// launcher's rendezvous went away).
    pub pe: i32,
    /// What happened, in words ("killed by signal 9 (SIGKILL)", "connection
    /// to PE 3 lost (process died?)", or the reason a PE gave to
    /// [`Bootstrap::abort`](super::Bootstrap::abort)).
    pub reason: String,
}

impl fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&failure_text(self.pe, &self.reason))
    }
}

pub(super) fn failure_text(pe: i32, reason: &str) -> String {
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
    /// The [`Launch`](crate::env::Launch) cannot be bootstrapped (e.g. no rendezvous address).
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
    /// Another PE (or this one, after [`Bootstrap::abort`](super::Bootstrap::abort)) failed; the job
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

/// The failure handler's type; see [`Bootstrap::set_failure_handler`](super::Bootstrap::set_failure_handler).
pub type FailureHandler = dyn Fn(&PeerFailure) + Send + Sync;
