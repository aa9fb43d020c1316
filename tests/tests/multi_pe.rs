//! Multi-PE integration tests: each runs `cpnet-check <scenario>` as N real
//! processes under `cpnet-run`, over a real libfabric provider (`shm` and
//! `tcp;ofi_rxm` on loopback), and checks the exit status and output.
//!
//! Runs are serialized (one job at a time) so that timing-sensitive checks
//! (a dead peer noticed within 30 s) do not compete with each other on a
//! small CI machine.

use std::time::Duration;

mod common;
use common::{SHM, TCP, job, ok, ok_env};

macro_rules! matrix {
    ($($name:ident: $args:expr;)*) => {$(
        mod $name {
            use super::*;
            #[test] fn shm_2_pes() { ok(2, SHM, $args); }
            #[test] fn shm_4_pes() { ok(4, SHM, $args); }
            #[test] fn tcp_2_pes() { ok(2, TCP, $args); }
            #[test] fn tcp_4_pes() { ok(4, TCP, $args); }
        }
    )*};
}

matrix! {
    every_operation: &["ops"];
    amo_contention_exact: &["--wgs", "4", "amo", "--iters", "100"];
    put_signal_pipeline: &["signal", "--msgs", "300"];
    fence_and_quiet_order: &["order", "--rounds", "100"];
    batched_puts_stay_in_order: &["--wgs", "3", "put-order", "--rounds", "30"];
    barrier_all: &["barrier", "--rounds", "50"];
    stress_small: &["stress", "--ops", "40000"];
}

/// At least 10^6 random mixed operations, each checked against the model.
#[test]
fn stress_million_ops_shm() {
    let out = ok(2, SHM, &["--wgs", "4", "stress", "--ops", "1000000", "--seed", "7"]);
    assert!(out.contains("1000000 ops"), "{out}");
}

/// The same over tcp;ofi_rxm.
#[test]
fn stress_million_ops_tcp() {
    let out = ok(2, TCP, &["--wgs", "4", "stress", "--ops", "1000000", "--seed", "11"]);
    assert!(out.contains("1000000 ops"), "{out}");
}

/// Several service threads per PE (queues split among them, one endpoint
/// each): every operation, and AMO contention across threads.
fn proxy_threads(provider: &str) {
    let env = [("CPNET_PROXY_THREADS", "3")];
    ok_env(2, provider, &["--wgs", "4", "ops"], &env);
    ok_env(3, provider, &["--wgs", "4", "amo", "--iters", "50"], &env);
    ok_env(2, provider, &["--wgs", "4", "barrier", "--rounds", "20"], &env);
    ok_env(2, provider, &["--wgs", "3", "stress", "--ops", "30000"], &env);
}

#[test]
fn three_proxy_threads_shm() {
    proxy_threads(SHM);
}

#[test]
fn three_proxy_threads_tcp() {
    proxy_threads(TCP);
}

fn bad_input(provider: &str) {
    let out = ok(2, provider, &["bad-input"]);
    for what in ["PE out of range", "address outside the heap", "misaligned atomic", "size past the end"] {
        for pe in 0..2 {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("bad-input PE {pe} wg 0: {what}")))
                .unwrap_or_else(|| panic!("no report of '{what}' on PE {pe}:\n{out}"));
            // The message names the PE, the work-group, the operation and the address.
            assert!(line.contains(&format!("PE {pe} work-group 0")), "{line}");
            assert!(line.contains("heap+0x"), "no address in: {line}");
        }
    }
}

#[test]
fn bad_input_is_reported_and_corrupts_nothing_shm() {
    bad_input(SHM);
}

#[test]
fn bad_input_is_reported_and_corrupts_nothing_tcp() {
    bad_input(TCP);
}

#[test]
fn stuck_wait_times_out_with_a_report() {
    let j = job(2, SHM, &["stuck-wait"], &[("CPNET_WAIT_TIMEOUT", "1")], Duration::from_secs(60));
    assert!(j.status.success(), "{}", j.all);
    for pe in 0..2 {
        let line = j.all.lines().find(|l| l.starts_with(&format!("stuck-wait PE {pe}:"))).unwrap_or_else(|| panic!("{}", j.all));
        assert!(line.contains("42") && line.contains('7'), "expected and found values in: {line}");
    }
}

fn peer_death(provider: &str) {
    let j = job(3, provider, &["peer-death", "--victim", "1"], &[], Duration::from_secs(120));
    assert!(!j.status.success(), "the job must fail when a PE dies:\n{}", j.all);
    assert!(j.elapsed < Duration::from_secs(30), "took {:?} to end:\n{}", j.elapsed, j.all);
    // Each survivor learns of the death from the rendezvous ("PE 1 failed:
    // ... killed by signal 9") or from the fabric first (an operation to
    // PE 1 failing with "peer PE is dead"), and says so.
    for pe in [0, 2] {
        let via_bootstrap = j.all.contains(&format!("cpnet: PE {pe}: PE 1 failed"));
        let via_fabric = j.all.lines().any(|l| l.contains(&format!("PE {pe}: FAILED")) && l.contains("to PE 1") && l.contains("peer PE is dead"));
        assert!(via_bootstrap || via_fabric, "PE {pe} did not report the dead PE 1:\n{}", j.all);
    }
    // The launcher names the dead PE and its signal, first or (when a
    // survivor's exit was reaped first) in its "also failed" line.
    assert!(
        j.all.lines().any(|l| l.starts_with("cpnet-run:") && l.contains("PE 1 (") && l.contains("signal 9")),
        "the launcher names the dead PE:\n{}",
        j.all
    );
    assert!(!j.all.contains("killing PEs"), "the launcher had to kill survivors:\n{}", j.all);
    let left = leftover_pes("peer-death");
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

/// Pids of `cpnet-check` processes still running `scenario`.
fn leftover_pes(scenario: &str) -> Vec<u32> {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("cpnet-check") && cmd.contains(scenario) && !cmd.contains("cpnet-run") {
            left.push(pid);
        }
    }
    left
}

#[test]
fn dead_peer_ends_every_pe_shm() {
    peer_death(SHM);
}

#[test]
fn dead_peer_ends_every_pe_tcp() {
    peer_death(TCP);
}

/// Every team collective (issue 22) on the world, node, strided-split and
/// 2D-split teams, every value checked, at 2, 3 and 4 PEs over shm.
#[test]
fn team_collectives_shm_2_3_4_pes() {
    for n in [2, 3, 4] {
        ok(n, SHM, &["collectives"]);
    }
}

/// The same over tcp;ofi_rxm, 2 and 3 PEs.
#[test]
fn team_collectives_tcp() {
    ok(2, TCP, &["collectives"]);
    ok(3, TCP, &["collectives"]);
}
