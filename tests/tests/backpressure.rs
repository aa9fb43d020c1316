//! Backpressure end to end (issue 7, reliability): `cpnet-check
//! backpressure` as real processes under `cpnet-run`, over real libfabric
//! providers (`shm`, `tcp;ofi_rxm`), with queues of depth 2 and 4
//! (`CPNET_QUEUE_DEPTH`): every work-group streams non-blocking atomics and
//! put-signals carrying sequence numbers to every PE while its ring is
//! nearly always full; counts, signals and fenced sequence numbers must be
//! exact (nothing lost, duplicated or reordered).
//!
//! The 10^7-operation run is by hand (release build; on the 2-core CI
//! machine, busy with other jobs, 54.8 s and 28.5 s):
//!
//! ```text
//! CPNET_PROVIDER=shm CPNET_QUEUE_DEPTH=2 cpnet-run -n 2 -- cpnet-check --wgs 4 backpressure --ops 5000000
//! CPNET_PROVIDER=shm CPNET_QUEUE_DEPTH=4 cpnet-run -n 2 -- cpnet-check --wgs 4 backpressure --ops 5000000
//! ```

mod common;
use common::{SHM, TCP, ok_env};

/// `ops` commands from `wgs` work-groups per PE on `n` PEs, rings of `depth`.
fn backpressure(n: u32, provider: &str, depth: &str, wgs: &str, ops: &str) {
    let out = ok_env(
        n,
        provider,
        &["--wgs", wgs, "backpressure", "--ops", ops, "--check-every", "16"],
        &[("CPNET_QUEUE_DEPTH", depth)],
    );
    let line = out.lines().find(|l| l.starts_with("backpressure: ")).unwrap_or_else(|| panic!("no summary:\n{out}"));
    assert!(line.contains(&format!("queue depth {depth}")) && line.contains("exact"), "{line}");
}

#[test]
fn depth_2_shm() {
    backpressure(2, SHM, "2", "4", "40000");
}

#[test]
fn depth_4_shm() {
    backpressure(3, SHM, "4", "3", "40000");
}

#[test]
fn depth_2_tcp() {
    backpressure(2, TCP, "2", "4", "40000");
}

#[test]
fn depth_4_tcp() {
    backpressure(3, TCP, "4", "3", "40000");
}

/// Several proxy threads per PE: each serves its share of the tiny rings.
#[test]
fn depth_2_three_proxy_threads_shm() {
    let env = [("CPNET_QUEUE_DEPTH", "2"), ("CPNET_PROXY_THREADS", "3")];
    let out = ok_env(2, SHM, &["--wgs", "6", "backpressure", "--ops", "30000", "--check-every", "8"], &env);
    assert!(out.contains("queue depth 2"), "{out}");
}
