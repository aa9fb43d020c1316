//! Reliability checks of issue 7 that run as real processes over real
//! providers: the proxy watchdog. (Peer death in the apps is in
//! `apps/tests/peer_death.rs`; stuck waits and dead peers of the checker's
//! own scenarios in `multi_pe.rs`.)

use std::time::Duration;

mod common;

fn job(n: u32, provider: &str, args: &[&str], env: &[(&str, &str)]) -> cpnet_tests::launch::Job {
    common::job(n, provider, args, env, Duration::from_secs(120))
}

/// A proxy thread of PE 1 hangs inside a submit (injected): its watchdog
/// reports the thread, the command it is stuck in and what is pending on
/// its queues, the PE ends non-zero, and so does the job, in seconds.
fn stalled_proxy(provider: &str) {
    let j = job(
        3,
        provider,
        &["--wgs", "4", "stress", "--ops", "50000"],
        &[("CPNET_INJECT_PROXY_STALL", "0:30:1"), ("CPNET_PROXY_STALL_TIMEOUT", "1"), ("CPNET_ABORT_GRACE", "3")],
    );
    assert!(!j.status.success(), "the job must fail when a proxy stalls:\n{}", j.all);
    assert!(j.elapsed < Duration::from_secs(30), "took {:?}:\n{}", j.elapsed, j.all);
    let report = j
        .all
        .lines()
        .find(|l| l.starts_with("cpnet: PE 1: watchdog: proxy thread 0 (cpnet-proxy-0) has made no progress"))
        .unwrap_or_else(|| panic!("no watchdog report from PE 1:\n{}", j.all));
    // The call it hangs in, with the command, its queue and work-group.
    assert!(report.contains("inside the transport's submit of ") && report.contains("(queue "), "{report}");
    assert!(report.contains("work-group ") && report.contains(", seq "), "{report}");
    // It hangs in the first submit once 30 commands were taken (ordering
    // commands complete without a submit, so maybe a little later).
    let taken: u64 = report
        .split_once("after ")
        .and_then(|(_, r)| r.split_once(" commands taken"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no command count in: {report}"));
    assert!((30..40).contains(&taken), "{report}");
    assert!(report.contains("pending: "), "{report}");
    assert!(report.ends_with("aborting this PE"), "{report}");
    // Nobody else stalled, and the others say PE 1 failed: told by the
    // rendezvous ("cpnet: PE 0: PE 1 failed: ...") or by their own
    // operations to PE 1 failing first (tcp: its connections closed).
    assert_eq!(j.all.matches("watchdog:").count(), 1, "{}", j.all);
    for pe in [0, 2] {
        assert!(cpnet_tests::chaos::names_dead_pe(&j.all, pe, 1), "PE {pe} did not name PE 1:\n{}", j.all);
    }
}

#[test]
fn stalled_proxy_is_reported_and_ends_the_job_shm() {
    stalled_proxy("shm");
}

#[test]
fn stalled_proxy_is_reported_and_ends_the_job_tcp() {
    stalled_proxy("tcp;ofi_rxm");
}

/// With the default timeout, an ordinary job never trips the watchdog,
/// including idle proxy threads while PEs wait in barriers.
#[test]
fn no_false_stall_reports() {
    let j = job(2, "shm", &["--wgs", "4", "barrier", "--rounds", "20"], &[("CPNET_PROXY_STALL_TIMEOUT", "0.2")]);
    assert!(j.status.success(), "{}", j.all);
    assert!(!j.all.contains("watchdog"), "{}", j.all);
}
