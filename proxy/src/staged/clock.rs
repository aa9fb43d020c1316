//! The staged transport's timing report (`RUST_LOG=cpnet_proxy::staged=debug`):
//! where an operation's time goes, summed per thread and printed at teardown.

/// Where a staged operation's time goes, for the debug report at teardown
/// (`RUST_LOG=cpnet_proxy::staged=debug`): sums in ns, counts, minima.
#[derive(Debug, Default)]
pub(super) struct StageClock {
    /// Progress calls, and the time from the first to the last.
    pub(super) passes: u64,
    pub(super) first_pass: Option<std::time::Instant>,
    pub(super) last_pass: Option<std::time::Instant>,
    /// A received PUT: its receive completion read, to the data landed.
    pub(super) land: (u64, u64, u64),
    /// A remote op: submitted, to its request posted.
    pub(super) post: (u64, u64, u64),
    /// A remote op: submitted, to its last answer.
    pub(super) answer: (u64, u64, u64),
    /// A received PUT of at most 8 bytes (inline) / a larger one: its
    /// sender's `fi_send`, to its receive completion read here (CLOCK_MONOTONIC
    /// of one host: both PEs on one machine; meaningless across hosts).
    pub(super) req_wire_small: (u64, u64, u64),
    pub(super) req_wire_big: (u64, u64, u64),
    /// A received ACK: the target's `fi_send`, to its completion read here.
    pub(super) ack_wire: (u64, u64, u64),
    /// A header-only / a larger message of ours: `fi_send`, to its send
    /// completion read here.
    pub(super) send_small: (u64, u64, u64),
    pub(super) send_big: (u64, u64, u64),
}

/// CLOCK_MONOTONIC in ns: the send stamps of the timing report, comparable
/// between processes of one host.
pub(super) fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own; CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl StageClock {
    pub(super) fn add(acc: &mut (u64, u64, u64), since: std::time::Instant) {
        Self::add_ns(acc, since.elapsed().as_nanos() as u64);
    }
    /// A span from a peer's send stamp (`mono_ns`) to now; 0: not stamped.
    pub(super) fn add_wire(acc: &mut (u64, u64, u64), sent: u64) {
        if sent != 0 {
            Self::add_ns(acc, mono_ns().saturating_sub(sent));
        }
    }
    pub(super) fn add_ns(acc: &mut (u64, u64, u64), ns: u64) {
        acc.0 += 1;
        acc.1 += ns;
        acc.2 = if acc.0 == 1 { ns } else { acc.2.min(ns) };
    }
    pub(super) fn show(acc: (u64, u64, u64)) -> String {
        if acc.0 == 0 { "-".into() } else { format!("n {} mean {:.2} us min {:.2} us", acc.0, acc.1 as f64 / acc.0 as f64 / 1e3, acc.2 as f64 / 1e3) }
    }
}

impl StageClock {
    /// The teardown report (debug level): the landing agents' per-record
    /// times (`records`, reading, applying, publishing ns summed over the
    /// lanes), agent `launches` and `refused`, and this clock's sums.
    pub(super) fn report(&self, pe: i32, lanes: usize, (n, tr, ta, tp): (u64, u64, u64, u64), (launches, refused): (u64, u64)) {
        let per = |t: u64| t as f64 / n.max(1) as f64 / 1e3;
        let c = self;
        if let (Some(a), Some(b)) = (c.first_pass, c.last_pass) {
            tracing::debug!(
                "PE {}: landing agents ({} lanes): {n} records; per record {:.2} us reading, {:.2} us applying, {:.2} us publishing",
                pe,
                lanes,
                per(tr),
                per(ta),
                per(tp)
            );
            tracing::debug!(
                "PE {}: staged transport: {} passes, mean {:.3} us; received put landed: {}; request posted: {}; answered: {}; agent launches {}, refused {}",
                pe,
                c.passes,
                (b - a).as_nanos() as f64 / c.passes.max(1) as f64 / 1e3,
                StageClock::show(c.land),
                StageClock::show(c.post),
                StageClock::show(c.answer),
                launches,
                refused
            );
            tracing::debug!(
                "PE {}: staged transport, sender's fi_send to receive completion read (one host's clock): put <= 8 B: {}; larger put: {}; ACK: {}; own fi_send to its send completion: header-only {}; larger {}",
                pe,
                StageClock::show(c.req_wire_small),
                StageClock::show(c.req_wire_big),
                StageClock::show(c.ack_wire),
                StageClock::show(c.send_small),
                StageClock::show(c.send_big)
            );
        }
    }
}
