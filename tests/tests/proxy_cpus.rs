//! `CPNET_PROXY_CPUS` (runtime/src/env: the CPUs the proxy threads are
//! pinned to), run as real processes: a CPU this process may use pins every
//! PE's proxy thread there (each thread reads its affinity back and logs
//! it); a CPU it may not use, or a malformed list, fails init naming the
//! variable, the thread, the PE and the CPU.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;

use cpnet_tests::launch;

/// One job at a time: the 2-core CI machine.
static ONE_JOB: Mutex<()> = Mutex::new(());

/// `cpnet-run -n 2 -- cpnet-check ops` over shm with `CPNET_PROXY_CPUS=cpus`
/// and the proxy's debug log; its status and output.
fn ops_pinned(cpus: &str) -> (Output, String) {
    let _one = ONE_JOB.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let check = Path::new(env!("CARGO_BIN_EXE_cpnet-check"));
    let run = launch::cpnet_run(check.parent().expect("bin dir"), env!("CARGO"));
    let out = Command::new(run)
        .args(["-n", "2", "--grace", "10", "--"])
        .arg(check)
        .arg("ops")
        .env("CPNET_PROVIDER", "shm")
        .env("CPNET_PROXY_CPUS", cpus)
        .env("CPNET_WAIT_TIMEOUT", "60")
        .env("RUST_LOG", "warn,cpnet::proxy_threads=debug")
        .output()
        .expect("run cpnet-run");
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, all)
}

/// The first CPU this test process may run on.
fn allowed_cpu() -> usize {
    let set = rustix::thread::sched_getaffinity(None).expect("sched_getaffinity");
    (0..rustix::thread::CpuSet::MAX_CPU).find(|&c| set.is_set(c)).expect("some CPU is allowed")
}

#[test]
fn proxy_threads_run_on_the_cpu_given() {
    let cpu = allowed_cpu();
    let (out, all) = ops_pinned(&cpu.to_string());
    assert!(out.status.success(), "{}:\n{all}", out.status);
    for pe in 0..2 {
        assert!(all.contains(&format!("PE {pe}: OK")), "PE {pe} did not report OK:\n{all}");
    }
    let pinned = all.matches(&format!("proxy thread pinned to CPU {cpu}")).count();
    assert_eq!(pinned, 2, "want one pinned proxy thread per PE:\n{all}");
}

#[test]
fn a_cpu_this_process_may_not_use_fails_init_naming_it() {
    let set = rustix::thread::sched_getaffinity(None).expect("sched_getaffinity");
    let Some(cpu) = (0..1024).rev().find(|&c| !set.is_set(c)) else {
        eprintln!("SKIPPED a_cpu_this_process_may_not_use_fails_init_naming_it: every CPU is allowed");
        return;
    };
    let (out, all) = ops_pinned(&cpu.to_string());
    assert!(!out.status.success(), "init must fail:\n{all}");
    assert!(
        all.contains("CPNET_PROXY_CPUS: proxy thread 0 of PE") && all.contains(&format!("cannot run on CPU {cpu}")),
        "{all}"
    );
}

#[test]
fn a_malformed_list_fails_init_naming_the_variable() {
    for bad in ["3-1", "1024", "a", "1,,2"] {
        let (out, all) = ops_pinned(bad);
        assert!(!out.status.success(), "CPNET_PROXY_CPUS={bad} must fail:\n{all}");
        assert!(all.contains("CPNET_PROXY_CPUS") && all.contains("taskset"), "CPNET_PROXY_CPUS={bad}:\n{all}");
    }
}
