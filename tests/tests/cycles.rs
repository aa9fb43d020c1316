//! Repeated init/finalize in one process (issue 7): `cpnet-cycles` as real
//! PE processes over real libfabric providers, under `cpnet-run` (whose
//! rendezvous serves every cycle) and mpirun-style (PE 0 hosts a new
//! rendezvous each cycle). Each PE checks its own data every cycle, and
//! that RSS, malloc'd bytes, open fds, threads and `/dev/shm` files stop
//! growing after the warm-up; it fails with the numbers otherwise.
//!
//! 100 cycles over each provider take ~10 s (shm) and ~17 s (tcp;ofi_rxm)
//! on the idle 2-core CI machine, up to ~50 s for tcp while it builds.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpnet_tests::launch::{self, Job};

const SHM: &str = "shm";
const TCP: &str = "tcp;ofi_rxm";

fn cycles_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cpnet-cycles"))
}

/// `cpnet-run -n n cpnet-cycles args` over `provider`.
fn job(n: u32, provider: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Job {
    launch::run(cycles_bin(), n, provider, args, env, limit)
}

/// The job must pass with every PE reporting OK; prints each PE's summary
/// (the numbers docs/reliability.md quotes) and returns the output.
fn ok(n: u32, provider: &str, cycles: u32) -> String {
    let c = cycles.to_string();
    let j = job(n, provider, &["--cycles", &c], &[], Duration::from_secs(600));
    j.assert_every_pe_ok(n, &format!("cpnet-run -n {n} cpnet-cycles --cycles {cycles} over {provider}"), &format!(" ({cycles} cycles"));
    eprintln!("{cycles} cycles over {provider} in {:.1} s:", j.elapsed.as_secs_f64());
    for l in j.stdout.lines().filter(|l| l.contains("after the warm-up") || l.contains(": OK (")) {
        eprintln!("  {l}");
    }
    j.all
}

#[test]
fn shm_100_cycles() {
    ok(2, SHM, 100);
}

#[test]
fn tcp_100_cycles() {
    ok(2, TCP, 100);
}

/// Under mpirun or srun there is no cpnet-run: PE 0 binds a rendezvous at
/// every init and ends it at finalize; the other PE re-initializes, often
/// before PE 0 has bound the next one, and must reconnect.
#[test]
fn pe0_hosted_rendezvous_cycles() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address").port()
    };
    let addr = format!("127.0.0.1:{port}");
    let t = Instant::now();
    let pes: Vec<_> = (0..2)
        .map(|r| {
            let mut cmd = Command::new(cycles_bin());
            cmd.args(["--cycles", "30"])
                .env("OMPI_COMM_WORLD_RANK", r.to_string())
                .env("OMPI_COMM_WORLD_SIZE", "2")
                .env("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string())
                .env("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
                .env("CPNET_BOOTSTRAP_ADDR", &addr)
                .env("CPNET_PROVIDER", SHM)
                .env("CPNET_CONNECT_TIMEOUT", "30")
                .env("RUST_LOG", "warn")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for v in ["CPNET_PE", "CPNET_N_PES", "CPNET_LOCAL_PE", "CPNET_LOCAL_SIZE"] {
                cmd.env_remove(v);
            }
            cmd.spawn().expect("start cpnet-cycles")
        })
        .collect();
    let outs: Vec<_> = pes.into_iter().map(|p| p.wait_with_output().expect("wait for cpnet-cycles")).collect();
    let all: String = outs
        .iter()
        .map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
        .collect();
    for (pe, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "PE {pe} ({}):\n{all}", o.status);
        assert!(all.contains(&format!("PE {pe}: OK (30 cycles")), "PE {pe} did not report OK:\n{all}");
    }
    eprintln!("30 mpirun-style cycles over shm in {:.1} s:", t.elapsed().as_secs_f64());
    for l in all.lines().filter(|l| l.contains("after the warm-up")) {
        eprintln!("  {l}");
    }
}

/// A PE that ends between cycles (`how`: exit 0, or killed) while the
/// other inits again: that init fails at once, naming the PE and the init,
/// and the job fails.
fn pe_leaves_between_cycles(how: &str) {
    let j = job(2, SHM, &["--cycles", "6", "--leave-after", "3", "--leave-by", how], &[], Duration::from_secs(120));
    assert!(!j.status.success(), "the job must fail:\n{}", j.all);
    assert!(j.elapsed < Duration::from_secs(20), "took {:?}:\n{}", j.elapsed, j.all);
    assert!(j.all.contains("PE 1: leaving after 3 cycles"), "{}", j.all);
    let line = j
        .all
        .lines()
        .find(|l| l.starts_with("cpnet-cycles: PE 0: FAILED: cycle 4 of 6:"))
        .unwrap_or_else(|| panic!("PE 0 did not fail its 4th init:\n{}", j.all));
    assert!(line.contains("PE 1 failed: process (pid "), "{line}");
    if how == "kill" {
        // cpnet-run's "killed by signal 9" notice, alone or (when PE 0 had
        // joined its 4th init already) with "without joining ...".
        assert!(line.contains("killed by signal 9 (SIGKILL)"), "{line}");
    } else {
        assert!(line.contains("exited with status 0 without joining the job's init #4"), "{line}");
    }
    assert!(!j.all.contains("killing PEs"), "the launcher had to kill a PE:\n{}", j.all);
}

#[test]
fn pe_that_exits_between_cycles_fails_the_next_init() {
    pe_leaves_between_cycles("exit");
}

#[test]
fn pe_killed_between_cycles_fails_the_next_init() {
    pe_leaves_between_cycles("kill");
}

/// GPU PEs (`GpuPe`), where there is a GPU: 100 cycles over shm. Without
/// one, a loud SKIPPED line (a failure with `CPNET_REQUIRE_GPU=1`).
#[test]
fn gpu_100_cycles() {
    if let Err(why) = cpnet_tests::gpu::gpu_available() {
        if std::env::var("CPNET_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("CPNET_REQUIRE_GPU=1 but {why}");
        }
        eprintln!("SKIPPED gpu_100_cycles: {why} (set CPNET_REQUIRE_GPU=1 to make this a failure)");
        return;
    }
    let j = job(2, SHM, &["--gpu", "--cycles", "100"], &[("CPNET_HEAP_SIZE", "64M")], Duration::from_secs(600));
    j.assert_every_pe_ok(2, "cpnet-cycles --gpu", " (100 cycles");
    assert!(!j.all.contains("SKIP"), "a PE skipped although this machine has a GPU:\n{}", j.all);
    for l in j.stdout.lines().filter(|l| l.contains("after the warm-up") || l.contains(": OK (")) {
        eprintln!("  {l}");
    }
}
