//! Peer death in the apps (issue 7): a PE of a running `allreduce` or
//! `jacobi` (CPU work-groups) is killed with SIGKILL at a random moment;
//! every other PE must exit non-zero by itself, naming the dead PE, within
//! 30 s, with no process left behind. A few trials per app and provider
//! here; `scripts/peer_death.sh` runs the full 100 (docs/reliability.md).
//!
//! The checks are [`cpnet_tests::chaos`]'s, which read the launcher's
//! closing `cpnet-run: PE exit statuses:` line and every PE's messages.

use std::path::Path;
use std::time::Duration;

use cpnet_tests::Rng;
use cpnet_tests::chaos::{Limits, Trial, run_trial};

/// `trials` kills of a random PE of `pes`, 0.05-1.5 s after the PEs are up.
fn trials(bin: &str, args: &[&str], pes: u32, provider: &str, trials: u32, seed: u64) {
    // One job at a time: the 30 s bound must not depend on the other tests.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let bin = Path::new(bin);
    let launcher = cpnet_tests::launch::cpnet_run(bin.parent().expect("bin dir"), env!("CARGO"));
    let t = Trial {
        launcher,
        pes,
        program: bin.into(),
        args: args.iter().map(|s| (*s).to_owned()).collect(),
        env: vec![("CPNET_PROVIDER".into(), provider.into()), ("RUST_LOG".into(), "warn".into())],
    };
    let mut rng = Rng::new(seed);
    let mut done = 0;
    let mut missed = 0;
    while done < trials {
        let victim = rng.below(u64::from(pes)) as u32;
        let after = Duration::from_millis(50 + rng.below(1450));
        let o = run_trial(&t, victim, after, Limits::default()).expect("the trial runs");
        if o.missed {
            missed += 1;
            assert!(missed < 10, "the job keeps ending before the kill: {bin:?} {args:?}");
            continue;
        }
        assert!(
            o.passed(),
            "{bin:?} {args:?} over {provider}, PE {victim} killed after {:.2} s: {}\n{}",
            o.kill_after,
            o.failures.join("; "),
            o.output
        );
        done += 1;
    }
}

const ALLREDUCE: &str = env!("CARGO_BIN_EXE_allreduce");
const JACOBI: &str = env!("CARGO_BIN_EXE_jacobi");
const AR_ARGS: &[&str] = &["-variant", "cpu", "-b", "8", "-e", "4M", "-f", "4", "-iters", "200"];
const JACOBI_ARGS: &[&str] = &["-variant", "cpu", "-nx", "512", "-ny", "512", "-niter", "1000000", "-skip_single"];

#[test]
fn allreduce_pe_killed_shm() {
    trials(ALLREDUCE, AR_ARGS, 3, "shm", 3, 1);
}

#[test]
fn allreduce_pe_killed_tcp() {
    trials(ALLREDUCE, AR_ARGS, 3, "tcp;ofi_rxm", 3, 2);
}

#[test]
fn jacobi_pe_killed_shm() {
    trials(JACOBI, JACOBI_ARGS, 3, "shm", 3, 3);
}

#[test]
fn jacobi_pe_killed_tcp() {
    trials(JACOBI, JACOBI_ARGS, 3, "tcp;ofi_rxm", 3, 4);
}
