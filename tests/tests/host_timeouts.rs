//! Host collectives honour `CPNET_COLLECTIVE_TIMEOUT` (issue 7): a PE that is
//! alive but never arrives at a host barrier fails the job, on every PE,
//! with the rendezvous's report naming it; one that comes late within the
//! timeout does not. Real processes under `cpnet-run`.

use std::time::Duration;

mod common;

fn job(n: u32, provider: &str, args: &[&str], env: &[(&str, &str)]) -> cpnet_tests::launch::Job {
    common::job(n, provider, args, env, Duration::from_secs(120))
}

/// PE 1 sleeps 3 s before `barrier_all`, past a 1 s wait timeout: every PE
/// (PE 1 too, once it wakes) prints the report naming PE 1 as missing,
/// and the job ends non-zero in seconds.
fn stuck_barrier(provider: &str) {
    let j = job(3, provider, &["stuck-barrier", "--late", "1", "--sleep", "3"], &[("CPNET_COLLECTIVE_TIMEOUT", "1")]);
    assert!(!j.status.success(), "the job must fail:\n{}", j.all);
    assert!(j.elapsed < Duration::from_secs(15), "took {:?}:\n{}", j.elapsed, j.all);
    for pe in 0..3 {
        let line = j
            .all
            .lines()
            .find(|l| l.starts_with(&format!("stuck-barrier PE {pe}: ")))
            .unwrap_or_else(|| panic!("no report from PE {pe}:\n{}", j.all));
        // The error names this PE, the PE that gave up (0 or 2, whose
        // timers ran out first), the collective and round, the wait, and
        // who had not arrived.
        assert!(line.contains(&format!("PE {pe}: bootstrap: PE 1 failed: collective timeout: PE ")), "{line}");
        assert!(line.contains("PE 0 gave up on allgather/barrier round ") || line.contains("PE 2 gave up on allgather/barrier round "), "{line}");
        assert!(line.contains("(its wait timeout: 1s); not arrived: PE 1 (2 of 3 PEs had)"), "{line}");
        assert!(line.contains("CPNET_COLLECTIVE_TIMEOUT"), "{line}");
    }
    // The PEs that waited were told within a second or two of the timeout,
    // not when PE 1 woke (3 s).
    for pe in [0, 2] {
        let failed = j
            .all
            .lines()
            .find(|l| l.starts_with(&format!("cpnet-check: PE {pe}: FAILED: barrier_all failed after ")))
            .unwrap_or_else(|| panic!("no FAILED line from PE {pe}:\n{}", j.all));
        let secs: f64 = failed
            .split("failed after ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no time in: {failed}"));
        assert!((1.0..2.9).contains(&secs), "{failed}");
    }
    // Nothing was left to cpnet-run's kill.
    assert!(!j.all.contains("killing PEs"), "{}", j.all);
}

#[test]
fn stuck_barrier_fails_the_job_naming_the_missing_pe_shm() {
    stuck_barrier("shm");
}

#[test]
fn stuck_barrier_fails_the_job_naming_the_missing_pe_tcp() {
    stuck_barrier("tcp;ofi_rxm");
}

/// A PE 0.5 s late to a barrier with a 3 s timeout: the job passes (and
/// init and finalize, which wait max(CPNET_COLLECTIVE_TIMEOUT,
/// CPNET_CONNECT_TIMEOUT), do not trip it either).
#[test]
fn a_late_pe_within_the_timeout_is_fine() {
    let j = job(3, "shm", &["stuck-barrier", "--late", "1", "--sleep", "0.5"], &[("CPNET_COLLECTIVE_TIMEOUT", "3")]);
    j.assert_every_pe_ok(3, "cpnet-check stuck-barrier --late 1 --sleep 0.5", "");
    for pe in 0..3 {
        assert!(j.all.contains(&format!("stuck-barrier PE {pe}: barrier passed")), "{}", j.all);
    }
}

/// Two PEs of `cpnet-check ops`, launched as mpirun would (rank and size
/// in `OMPI_COMM_WORLD_*`, a rendezvous on a free port), PE r with
/// `env(r)` on top: their stdout and stderr, after both ended, and how long
/// that took.
fn two_pes_as_mpirun(env: impl Fn(usize) -> Vec<(&'static str, String)>) -> (Vec<std::process::Output>, String, Duration) {
    use std::process::{Command, Stdio};
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address").port()
    };
    let addr = format!("127.0.0.1:{port}");
    let t = std::time::Instant::now();
    let pes: Vec<_> = (0..2)
        .map(|r| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_cpnet-check"));
            cmd.arg("ops")
                .env("OMPI_COMM_WORLD_RANK", r.to_string())
                .env("OMPI_COMM_WORLD_SIZE", "2")
                .env("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string())
                .env("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
                .env("CPNET_BOOTSTRAP_ADDR", &addr)
                .env("CPNET_CONNECT_TIMEOUT", "30")
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for v in ["CPNET_PE", "CPNET_N_PES", "CPNET_LOCAL_PE", "CPNET_LOCAL_SIZE", "FI_PROVIDER", "CPNET_HEAP_SIZE"] {
                cmd.env_remove(v);
            }
            cmd.envs(env(r));
            cmd.spawn().expect("start cpnet-check")
        })
        .collect();
    let outs: Vec<_> = pes.into_iter().map(|p| p.wait_with_output().expect("wait for cpnet-check")).collect();
    let all: String = outs
        .iter()
        .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
        .collect();
    (outs, all, t.elapsed())
}

/// PE `pe`'s "init failed" line in `o`'s stderr (`all`: both PEs' output,
/// for the panic message).
fn init_failure(pe: usize, o: &std::process::Output, all: &str) -> String {
    assert!(!o.status.success(), "PE {pe} must fail:\n{all}");
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("init failed"))
        .unwrap_or_else(|| panic!("PE {pe} printed no init failure:\n{all}"))
        .to_owned();
    assert!(line.contains(&format!("cpnet-check: init failed: PE {pe}:")), "{line}");
    line
}

/// Two PEs on different providers (issue 19, bad input: mismatched
/// providers), launched as mpirun would, with a different CPNET_PROVIDER
/// each: both fail at init within seconds, each naming both PEs and both
/// providers, instead of an address-vector error or a hang.
#[test]
fn mismatched_providers_fail_at_init_naming_both() {
    let (outs, all, took) = two_pes_as_mpirun(|r| vec![("CPNET_PROVIDER", if r == 0 { "shm" } else { "tcp;ofi_rxm" }.to_owned())]);
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{all}");
    for (pe, o) in outs.iter().enumerate() {
        let line = init_failure(pe, o, &all);
        assert!(
            line.contains("PE 1 opened provider tcp;ofi_rxm, PE 0 shm")
                || line.contains("PE 0 opened provider shm, PE 1 tcp;ofi_rxm"),
            "{line}"
        );
        assert!(line.contains("every PE of a job must use the same provider"), "{line}");
    }
}

/// Two PEs with different heap sizes (issue 22, bad input: every symmetric
/// address is one offset on every PE, OpenSHMEM 1.5 §3), launched as mpirun
/// would with CPNET_HEAP_SIZE 32M on PE 0 and 48M on PE 1: both fail at
/// init within seconds, each naming the other's layout and the variables
/// to set alike, instead of puts landing at the wrong offsets.
#[test]
fn mismatched_heap_sizes_fail_at_init_naming_both() {
    let (outs, all, took) =
        two_pes_as_mpirun(|r| vec![("CPNET_PROVIDER", "shm".to_owned()), ("CPNET_HEAP_SIZE", if r == 0 { "32M" } else { "48M" }.to_owned())]);
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{all}");
    for (pe, o) in outs.iter().enumerate() {
        let line = init_failure(pe, o, &all);
        let (mine, theirs, other) = if pe == 0 { (32u64 << 20, 48u64 << 20, 1) } else { (48 << 20, 32 << 20, 0) };
        assert!(line.contains("init is collective and must get the same arguments on every PE"), "{line}");
        assert!(line.contains(&format!("this PE has {mine} / ")), "{line}");
        assert!(line.contains(&format!("PE {other} has {theirs} / ")), "{line}");
        assert!(line.contains("CPNET_HEAP_SIZE") && line.contains("set them alike on every PE"), "{line}");
    }
}

/// A provider cpnet refuses (`udp;ofi_rxd`, which `CPNET_PROVIDER=udp`
/// gets, segfaults inside libfabric 1.17 on the first atomic): every PE
/// fails at init with a message naming it and the provider to use, instead
/// of a crash in the provider.
#[test]
fn a_broken_provider_is_refused_at_init() {
    let j = refused_at_init("udp", "libfabric granted provider udp;ofi_rxd, which cpnet does not use", "use CPNET_PROVIDER='tcp;ofi_rxm'");
    assert!(!j.all.contains("signal 11"), "a crash, not a refusal:\n{}", j.all);
}

/// `cpnet-check ops` on 2 PEs over `provider` fails within 20 s, each PE's
/// init failure from its proxy thread 0 saying `why`, and someone saying
/// `hint`.
fn refused_at_init(provider: &str, why: &str, hint: &str) -> cpnet_tests::launch::Job {
    let j = job(2, provider, &["ops"], &[]);
    assert!(!j.status.success(), "the job must fail:\n{}", j.all);
    assert!(j.elapsed < Duration::from_secs(20), "took {:?}:\n{}", j.elapsed, j.all);
    for pe in 0..2 {
        assert!(j.all.contains(&format!("init failed: PE {pe}: proxy service thread 0: PE {pe}: {why}")), "PE {pe}:\n{}", j.all);
    }
    assert!(j.all.contains(hint), "{}", j.all);
    j
}

/// libfabric 1.17's native TCP endpoint (`net`), which GPU PEs use between
/// hosts, has no atomic operations (issue 19, bad input: a provider without
/// atomics): CPU PEs asked to use it fail at init, naming it and the
/// provider to use, not at their first AMO. Skips where
/// this libfabric has no `net` provider.
#[test]
fn cpu_pes_refuse_a_provider_without_atomics_at_init() {
    if cpnet_proxy::fabric::native_tcp_rdm() != Some("net") {
        eprintln!("skipped: this libfabric has no `net` provider (its native TCP RDM endpoint is libfabric 1.17's)");
        return;
    }
    refused_at_init("net", "provider net has no atomic operations", "use CPNET_PROVIDER='tcp;ofi_rxm' for CPU PEs over IP");
}
