//! The transport map (`cpnet-run --transport-map`, `CPNET_TRANSPORT_MAP=1`;
//! `cpnet::transport_map`), run as real processes: CPU PEs print, after
//! init, one line per PE, both directions `rma` over the provider libfabric
//! granted, themselves `self`; nothing when it is off; a bad value of the
//! variable fails init naming it. The two-host run over a veth pair checks
//! `rma via tcp;ofi_rxm` across network namespaces (scripts/twohost.sh).

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;

use cpnet_tests::launch;

/// One job at a time: the 2-core CI machine.
static ONE_JOB: Mutex<()> = Mutex::new(());

/// `cpnet-run -n 2 [launcher_args] -- cpnet-check ops` with `env` set and
/// `CPNET_PROVIDER`/`CPNET_TRANSPORT_MAP` only as given; its output, stdout
/// then stderr.
fn check_ops(launcher_args: &[&str], env: &[(&str, &str)]) -> (Output, String) {
    let _one = ONE_JOB.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let check = Path::new(env!("CARGO_BIN_EXE_cpnet-check"));
    let run = launch::cpnet_run(check.parent().expect("bin dir"), env!("CARGO"));
    let mut cmd = Command::new(run);
    cmd.args(["-n", "2", "--grace", "25"])
        .args(launcher_args)
        .arg("--")
        .arg(check)
        .arg("ops")
        .env_remove("CPNET_PROVIDER")
        .env_remove("CPNET_TRANSPORT_MAP")
        .env("CPNET_WAIT_TIMEOUT", "60")
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run cpnet-run");
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, all)
}

/// The map line of PE `from` to PE `to`, which must exist exactly once.
fn map_line(all: &str, from: i32, to: i32) -> &str {
    let head = format!("cpnet: transport map: PE {from} -> PE {to}: ");
    let lines: Vec<&str> = all.lines().filter(|l| l.starts_with(&head)).collect();
    assert_eq!(lines.len(), 1, "want one line starting {head:?}:\n{all}");
    lines[0]
}

fn assert_ok(out: &Output, all: &str) {
    assert!(out.status.success(), "{}:\n{all}", out.status);
    for pe in 0..2 {
        assert!(all.contains(&format!("PE {pe}: OK")), "PE {pe} did not report OK:\n{all}");
    }
}

#[test]
fn cpu_pes_over_shm_print_rma_both_ways_and_self() {
    let (out, all) = check_ops(&["--transport-map"], &[]);
    assert_ok(&out, &all);
    for (from, to) in [(0, 1), (1, 0)] {
        let l = map_line(&all, from, to);
        assert!(l.contains(": rma via shm ["), "{l}");
        assert!(l.contains("registered host heap (FI_HMEM: no)"), "{l}");
        assert!(l.ends_with(']'), "{l}");
    }
    for pe in 0..2 {
        assert!(map_line(&all, pe, pe).contains(": self via none ["), "{all}");
    }
    assert_eq!(all.matches("cpnet: transport map: ").count(), 4, "one line per pair:\n{all}");
}

#[test]
fn tcp_on_loopback_is_rma_between_loopback_addresses() {
    let (out, all) = check_ops(&["--transport-map"], &[("CPNET_PROVIDER", "tcp;ofi_rxm")]);
    assert_ok(&out, &all);
    for (from, to) in [(0, 1), (1, 0)] {
        let l = map_line(&all, from, to);
        assert!(l.contains(": rma via tcp;ofi_rxm ["), "{l}");
        assert!(
            l.contains("fi_sockaddr_in://127.0.0.1:") && l.contains(" -> fi_sockaddr_in://127.0.0.1:"),
            "one-host tcp binds loopback: {l}"
        );
    }
}

#[test]
fn the_variable_alone_turns_it_on_and_it_is_off_by_default() {
    let (out, all) = check_ops(&[], &[("CPNET_TRANSPORT_MAP", "1")]);
    assert_ok(&out, &all);
    assert!(map_line(&all, 1, 0).contains(": rma via shm ["), "{all}");

    let (out, all) = check_ops(&[], &[]);
    assert_ok(&out, &all);
    assert!(!all.contains("transport map"), "printed while off:\n{all}");
}

#[test]
fn a_bad_value_fails_init_naming_the_variable() {
    let (out, all) = check_ops(&[], &[("CPNET_TRANSPORT_MAP", "yes")]);
    assert!(!out.status.success(), "a bad CPNET_TRANSPORT_MAP was accepted:\n{all}");
    assert!(all.contains("CPNET_TRANSPORT_MAP=\"yes\"") && all.contains("0 or 1"), "{all}");
}
