//! Whether each peer answers: a watch over the operations a transport has
//! posted to each PE and not yet seen finish, so that a peer the fabric
//! cannot reach gives a clear error instead of a hang.
//!
//! The rendezvous (a TCP connection of the bootstrap) reaching every PE does
//! not mean the fabric does: the provider's own connections use other
//! ports, and may take another route (issue 19, "a peer that cannot be
//! reached"). With `tcp;ofi_rxm` an operation to a peer behind a firewall
//! stays posted while TCP retries its connection for minutes, and the
//! work-group that waits for it could only say that the proxy made no
//! progress. The watch counts, per PE, the operations posted and not yet
//! answered, and notes since when the oldest of them has waited without any
//! answer from that PE; a PE past the timeout (`CPNET_REACH_TIMEOUT`) is
//! *unreachable*, and the transport turns that into one report naming the
//! PE, the operation, the provider and the addresses
//! ([`crate::service::Transport::fatal`]), on which the runtime aborts the
//! PE (every wait returns `ABORTED`).
//!
//! Only operations that finish on their own count (puts, gets, AMOs, their
//! batches): a barrier's messages wait for the other PEs to arrive, which
//! may legitimately take long.
//!
//! Cost on the hot path: an increment and a compare per operation posted,
//! a decrement and a store per answer; the clock is read when a peer's
//! count leaves zero, and in [`PeerWatch::overdue`], which the service
//! calls every [`crate::service::ACTIVE_REFRESH_PASSES`] passes.

use std::time::{Duration, Instant};

use crate::decode::Op;

/// A peer past the timeout, as [`PeerWatch::overdue`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overdue {
    /// The PE.
    pub pe: i32,
    /// How long its operations have waited without any answer from it.
    pub waited: Duration,
    /// Operations to it posted and not answered.
    pub pending: u32,
    /// Whether it answered anything before (it stopped answering), or never
    /// did (it was never reached).
    pub answered_before: bool,
    /// The timeout it passed (`CPNET_REACH_TIMEOUT`).
    pub timeout: Duration,
}

/// The per-peer watch of one transport (one service thread).
#[derive(Debug)]
pub struct PeerWatch {
    /// Per PE: operations posted and not yet answered.
    out: Vec<u32>,
    /// Per PE: the last answer from it, or when its count left zero.
    since: Vec<Instant>,
    /// Per PE: it has answered at least once.
    answered: Vec<bool>,
    /// Per PE: a post to it was refused for now (`-FI_EAGAIN`) and none
    /// succeeded since, nor did it answer: waiting on it as much as a
    /// posted operation (a connection being made may refuse posts).
    blocked: Vec<bool>,
    timeout: Option<Duration>,
    /// The clock as of the last [`PeerWatch::overdue`].
    now: Instant,
    /// An overdue peer was reported (only the first is).
    reported: bool,
}

impl PeerWatch {
    /// A watch over `n_pes` peers; `timeout` `None` never reports.
    pub fn new(n_pes: usize, timeout: Option<Duration>) -> PeerWatch {
        let now = Instant::now();
        PeerWatch {
            out: vec![0; n_pes],
            since: vec![now; n_pes],
            answered: vec![false; n_pes],
            blocked: vec![false; n_pes],
            timeout,
            now,
            reported: false,
        }
    }

    /// An operation to `pe` was posted.
    #[inline]
    pub fn sent(&mut self, pe: i32) {
        let p = pe as usize;
        if let Some(n) = self.out.get_mut(p) {
            if *n == 0 && !self.blocked[p] {
                // The clock itself, not `now` (as old as the last look): a
                // thread that slept while idle must not date this op back.
                self.since[p] = Instant::now();
            }
            self.blocked[p] = false;
            *n += 1;
        }
    }

    /// A post to `pe` was refused for now (`-FI_EAGAIN`): until a post to
    /// it succeeds or it answers, this waits on it like a posted operation.
    #[inline]
    pub fn blocked(&mut self, pe: i32) {
        let p = pe as usize;
        if let Some(&n) = self.out.get(p)
            && n == 0
            && !self.blocked[p]
        {
            self.blocked[p] = true;
            self.since[p] = Instant::now();
        }
    }

    /// An operation to `pe` finished (answered, or failed in the provider,
    /// which is an answer too).
    #[inline]
    pub fn answered(&mut self, pe: i32) {
        let p = pe as usize;
        if let Some(n) = self.out.get_mut(p) {
            *n = n.saturating_sub(1);
            self.since[p] = self.now;
            self.answered[p] = true;
            self.blocked[p] = false;
        }
    }

    /// `n` operations to `pe` finished at once (a batch's acknowledgement).
    #[inline]
    pub fn answered_n(&mut self, pe: i32, n: u32) {
        let p = pe as usize;
        if n > 0
            && let Some(c) = self.out.get_mut(p)
        {
            *c = c.saturating_sub(n);
            self.since[p] = self.now;
            self.answered[p] = true;
            self.blocked[p] = false;
        }
    }

    /// Operations to `pe` posted and not yet answered.
    pub fn pending(&self, pe: i32) -> u32 {
        self.out.get(pe as usize).copied().unwrap_or(0)
    }

    /// Read the clock; the first peer whose operations have waited longer
    /// than the timeout without an answer from it, once (later calls return
    /// `None`).
    pub fn overdue(&mut self) -> Option<Overdue> {
        self.now = Instant::now();
        let timeout = self.timeout?;
        if self.reported {
            return None;
        }
        let (p, waited) = (0..self.out.len())
            .filter(|&p| self.out[p] > 0 || self.blocked[p])
            .map(|p| (p, self.now.saturating_duration_since(self.since[p])))
            .find(|&(_, w)| w > timeout)?;
        self.reported = true;
        Some(Overdue { pe: p as i32, waited, pending: self.out[p], answered_before: self.answered[p], timeout })
    }
}

/// The report of an overdue peer: `me` cannot reach `o.pe` over `provider`;
/// `oldest` is an operation to it still waiting, with a note on where it
/// waits (empty, or e.g. ", in a batch of puts (2 waiting)"); `addrs` the
/// endpoints' printable addresses, index = PE.
pub fn unreachable_report(me: i32, o: &Overdue, provider: &str, oldest: Option<(&Op, String)>, addrs: &[String]) -> String {
    let one = oldest
        .map(|(op, note)| format!(" (one: {} to heap+{:#x}, {} bytes{note})", op.name(), op.addr(), op.size()))
        .unwrap_or_default();
    let addr = |pe: i32| addrs.get(pe as usize).map_or("?", String::as_str);
    let what = if o.pending > 0 {
        format!("{} operation(s) to it{one} have had no completion", o.pending)
    } else {
        format!("the provider has refused to post operations to it{one} (-FI_EAGAIN: no connection to it)")
    };
    let why = if o.answered_before {
        "it answered before and stopped: the link, the peer's host or its proxy went away"
    } else {
        "it never answered: the rendezvous reached it, so the fabric's own traffic is blocked or routed \
         elsewhere (a firewall between the hosts, the provider's ports — FI_TCP_PORT_LOW_RANGE / \
         FI_TCP_PORT_HIGH_RANGE for tcp — or an interface the peer cannot reach)"
    };
    format!(
        "PE {me} cannot reach PE {} over {provider}: {what} for {:.1} s \
         (CPNET_REACH_TIMEOUT={}); {why}; endpoints {} -> {}",
        o.pe,
        o.waited.as_secs_f64(),
        o.timeout.as_secs_f64(),
        addr(me),
        addr(o.pe),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_never_answers_is_overdue_once() {
        let mut w = PeerWatch::new(3, Some(Duration::from_millis(20)));
        w.overdue();
        w.sent(1);
        w.sent(2);
        w.sent(2);
        w.answered(1);
        assert_eq!(w.overdue(), None, "nothing has waited long yet");
        std::thread::sleep(Duration::from_millis(30));
        let o = w.overdue().expect("PE 2 waited past the timeout");
        assert_eq!((o.pe, o.pending, o.answered_before), (2, 2, false));
        assert!(o.waited >= Duration::from_millis(20));
        assert_eq!(w.overdue(), None, "reported once");
    }

    #[test]
    fn answers_keep_a_busy_peer_alive_and_idle_peers_never_expire() {
        let mut w = PeerWatch::new(2, Some(Duration::from_millis(30)));
        w.overdue();
        w.sent(1);
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(10));
            w.overdue();
            // One answer, one more operation: never idle, never silent for long.
            w.answered(1);
            w.sent(1);
        }
        assert_eq!(w.overdue(), None);
        w.answered_n(1, 5);
        assert_eq!(w.pending(1), 0);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(w.overdue(), None, "nothing pending: an idle peer is not unreachable");
        w.sent(1);
        std::thread::sleep(Duration::from_millis(40));
        let o = w.overdue().expect("pending past the timeout");
        assert!(o.answered_before);
    }

    #[test]
    fn refused_posts_wait_on_the_peer_until_it_answers() {
        let mut w = PeerWatch::new(2, Some(Duration::from_millis(20)));
        w.blocked(1);
        std::thread::sleep(Duration::from_millis(10));
        w.sent(1); // posted at last: still counted from the first refusal
        std::thread::sleep(Duration::from_millis(15));
        let o = w.overdue().expect("refused, then posted, never answered");
        assert_eq!((o.pe, o.pending), (1, 1));
        let mut w = PeerWatch::new(2, Some(Duration::from_millis(20)));
        w.blocked(1);
        w.overdue();
        w.answered(1);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(w.overdue(), None, "an answer clears a refusal");
    }

    #[test]
    fn no_timeout_never_reports_and_bad_pes_are_ignored() {
        let mut w = PeerWatch::new(2, None);
        w.sent(1);
        w.sent(7);
        w.answered(-1);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(w.overdue(), None);
        let op = Op::Put { pe: 1, dst: 0x40, src: crate::decode::PutSrc::Inline(0), size: 8 };
        let r = unreachable_report(
            0,
            &Overdue { pe: 1, waited: Duration::from_secs(3), pending: 2, answered_before: false, timeout: Duration::from_secs(3) },
            "tcp;ofi_rxm",
            Some((&op, String::new())),
            &["fi_sockaddr_in://10.0.0.1:1".into(), "fi_sockaddr_in://10.0.0.2:2".into()],
        );
        assert!(r.starts_with("PE 0 cannot reach PE 1 over tcp;ofi_rxm: 2 operation(s) to it (one: putmem"), "{r}");
        assert!(r.contains("never answered") && r.contains("10.0.0.2"), "{r}");
        assert!(r.contains("(one: putmem to heap+0x40, 8 bytes)") && r.contains("10.0.0.1:1 -> fi_sockaddr_in://10.0.0.2:2"), "{r}");
    }
}
