//! What the integration tests that run `cpnet-check` share (included with
//! `mod common;`; each test file uses part of it).
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use cpnet_tests::launch::{self, Job};

/// `shm`, libfabric's shared-memory provider.
pub const SHM: &str = "shm";
/// `tcp;ofi_rxm` on loopback.
pub const TCP: &str = "tcp;ofi_rxm";

/// Run `cpnet-check args` as `n` PEs over `provider` with `env`, stopped
/// (and the test failed) after `limit`.
pub fn job(n: u32, provider: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Job {
    launch::run(Path::new(env!("CARGO_BIN_EXE_cpnet-check")), n, provider, args, env, limit)
}

/// [`job`] that must pass, every PE printing `PE k: OK`; its output.
pub fn ok_env(n: u32, provider: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let j = job(n, provider, args, env, Duration::from_secs(600));
    j.assert_every_pe_ok(n, &format!("cpnet-run -n {n} cpnet-check {args:?} over {provider} with {env:?}"), "");
    j.all
}

/// [`ok_env`] without extra environment.
pub fn ok(n: u32, provider: &str, args: &[&str]) -> String {
    ok_env(n, provider, args, &[])
}
