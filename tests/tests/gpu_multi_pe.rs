//! The GPU operation matrix: each test runs `cpnet-gpu-check <scenario>` as
//! real GPU PEs under `cpnet-run` (PE i on GPU i % device count) and checks
//! the exit status and output. Two PEs on one host reach each other through
//! CUDA IPC peer copies by default; the `_staged` tests turn that off
//! (`CPNET_GPU_IPC=0`) so the staged path over the provider runs too, and
//! the `_network_path` ones turn every direct path off.
//!
//! Where there is no GPU (no CUDA driver, or no device) every job test
//! prints a loud SKIPPED line and passes, unless `CPNET_REQUIRE_GPU=1`
//! (set it on the GPU machine), which makes a missing GPU a failure.
//! `every_kernel_compiles` needs no GPU, only libnvrtc: it compiles every
//! scenario's kernel for sm_90 (skipped without libnvrtc unless
//! `CPNET_REQUIRE_NVRTC=1`).

use std::path::Path;
use std::time::Duration;

use cpnet_device::nvrtc::{self, BuildOptions};
use cpnet_tests::gpu;
use cpnet_tests::launch::{self, Job};

const SHM: &str = "shm";
const TCP: &str = "tcp;ofi_rxm";
/// libfabric 1.17's native TCP RDM endpoint, which GPU PEs take between
/// hosts (docs/runtime.md).
const NET_TCP: &str = "net";

/// Whether to run a GPU job: true with a GPU; false (after a loud message)
/// without one; a panic without one when `CPNET_REQUIRE_GPU=1`.
fn have_gpu(test: &str) -> bool {
    match gpu::gpu_available() {
        Ok(_) => true,
        Err(why) => {
            if std::env::var("CPNET_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("CPNET_REQUIRE_GPU=1 but {why}");
            }
            eprintln!("SKIPPED {test}: {why} (set CPNET_REQUIRE_GPU=1 to make this a failure)");
            false
        }
    }
}

/// Run `cpnet-gpu-check args` as `n` GPU PEs over `provider`.
fn job(n: u32, provider: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Job {
    let check = Path::new(env!("CARGO_BIN_EXE_cpnet-gpu-check"));
    // The ops scenario moves 1 MiB cases through ~20 lanes per PE.
    let mut all = vec![("CPNET_HEAP_SIZE", "256M")];
    all.extend_from_slice(env);
    launch::run(check, n, provider, args, &all, limit)
}

/// The job must succeed with every PE reporting OK; returns its output.
fn ok_env(n: u32, provider: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let j = job(n, provider, args, env, Duration::from_secs(300));
    j.assert_every_pe_ok(n, &format!("cpnet-run -n {n} cpnet-gpu-check {args:?} over {provider} (env {env:?})"), "");
    assert!(!j.all.contains("SKIP"), "a PE skipped although this machine has a GPU:\n{}", j.all);
    j.all
}

fn ok(n: u32, provider: &str, args: &[&str]) -> String {
    ok_env(n, provider, args, &[])
}

macro_rules! gpu_test {
    ($($name:ident: $body:expr;)*) => {$(
        #[test]
        fn $name() {
            if have_gpu(stringify!($name)) {
                $body;
            }
        }
    )*};
}

/// `CPNET_GPU_IPC=0`: every remote operation through the staged path
/// (active messages through pinned buffers) instead of CUDA IPC peer copies.
const STAGED: &[(&str, &str)] = &[("CPNET_GPU_IPC", "0")];

/// The staged path over shm with the data inside the messages
/// (`CPNET_STAGE_SHARED=0`: no staging zones).
const STAGED_NO_ZONES: &[(&str, &str)] = &[("CPNET_GPU_IPC", "0"), ("CPNET_STAGE_SHARED", "0")];

gpu_test! {
    ops_1_pe: ok(1, SHM, &["ops"]);
    ops_2_pes_shm: ok(2, SHM, &["ops"]);
    ops_2_pes_shm_staged: ok_env(2, SHM, &["ops"], STAGED);
    ops_2_pes_shm_staged_no_zones: ok_env(2, SHM, &["ops"], STAGED_NO_ZONES);
    ops_2_pes_tcp_staged: ok_env(2, TCP, &["ops"], STAGED);
    amo_1_pe: ok(1, SHM, &["amo", "--iters", "30"]);
    amo_2_pes_shm: ok(2, SHM, &["amo", "--iters", "30"]);
    amo_2_pes_shm_staged: ok_env(2, SHM, &["amo", "--iters", "30"], STAGED);
    amo_2_pes_tcp_staged: ok_env(2, TCP, &["--wgs", "2", "amo", "--iters", "20"], STAGED);
    order_2_pes_shm: ok(2, SHM, &["order", "--rounds", "100", "--msgs", "300"]);
    order_2_pes_shm_staged: ok_env(2, SHM, &["order", "--rounds", "100", "--msgs", "300"], STAGED);
    order_2_pes_tcp_staged: ok_env(2, TCP, &["order", "--rounds", "40", "--msgs", "100"], STAGED);
    ops_2_pes_net_staged: ok_env(2, NET_TCP, &["ops"], STAGED);
    amo_2_pes_net_staged: ok_env(2, NET_TCP, &["--wgs", "2", "amo", "--iters", "20"], STAGED);
    order_2_pes_net_staged: ok_env(2, NET_TCP, &["order", "--rounds", "40", "--msgs", "100"], STAGED);
    barrier_2_pes_shm: ok(2, SHM, &["barrier", "--rounds", "50"]);
    barrier_2_pes_shm_staged: ok_env(2, SHM, &["barrier", "--rounds", "50"], STAGED);
    bad_input_2_pes_shm: bad_input(SHM);
    stuck_wait_2_pes_shm: stuck_wait();
    collectives_1_pe: ok(1, SHM, &["collectives"]);
    collectives_2_pes_shm: ok(2, SHM, &["collectives"]);
    collectives_2_pes_shm_network_path: ok_env(2, SHM, &["collectives"], NETWORK_PATH);
    coll_bench_2_pes_shm: coll_bench();
    a2a_bench_2_pes_shm: a2a_bench(&[]);
    a2a_bench_2_pes_shm_network_path: a2a_bench(NETWORK_PATH);
    on_stream_2_pes_shm: ok(2, SHM, &["on-stream"]);
    // The pair exchange of a team of two, and in place through the reduce
    // scratch in one chunk.
    on_stream_2_pes_shm_network_path: ok_env(2, SHM, &["on-stream"], NETWORK_PATH);
    on_stream_2_pes_shm_network_path_no_pair_stage: ok_env(2, SHM, &["on-stream"], NETWORK_PATH_NO_PAIR_STAGE);
    on_stream_2_pes_shm_network_path_chunked_scratch: ok_env(2, SHM, &["on-stream"], NETWORK_PATH_CHUNKED_SCRATCH);
    // In place in chunks of 1 MiB (the 8 MiB reduces: 9 chunks).
    on_stream_3_pes_shm_network_path: ok_env(3, SHM, &["on-stream"], NETWORK_PATH_SMALL_SCRATCH);
    // The alltoall's network-path form (a block per proxy thread), which
    // the shm provider's staging zones leave aside.
    on_stream_3_pes_net_network_path: ok_env(3, NET_TCP, &["on-stream"], NETWORK_PATH);
}

/// `CPNET_GPU_IPC=0 CPNET_GPU_P2P=0`: the network path (every operation
/// through the queue and the provider, as to a PE on another host).
const NETWORK_PATH: &[(&str, &str)] = &[("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0")];

/// The network path, the world team of two's reduce through the proxy
/// into the landing halves, as without the pair staging
/// (`CPNET_PAIR_STAGE=0`).
const NETWORK_PATH_NO_PAIR_STAGE: &[(&str, &str)] = &[("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0"), ("CPNET_PAIR_STAGE", "0")];

/// A reduce scratch of the landing halves and 2 MiB of copy: the in-place
/// reduce of 8 MiB goes in chunks of 2 MiB through the landing halves with
/// the kernel's copy-in (not the pair zone, whose kernel has none).
const NETWORK_PATH_CHUNKED_SCRATCH: &[(&str, &str)] = &[("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0"), ("CPNET_REDUCE_SCRATCH", "10M")];

/// The network path with a reduce scratch of 1 MiB
/// (`CPNET_REDUCE_SCRATCH`): an in-place reduce of more runs in chunks.
const NETWORK_PATH_SMALL_SCRATCH: &[(&str, &str)] = &[("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0"), ("CPNET_REDUCE_SCRATCH", "1M")];

/// The device collectives' benchmark runs and prints its table.
fn coll_bench() {
    let out = ok(2, SHM, &["coll-bench", "--iters", "200"]);
    for op in ["barrier", "sync", "reduce"] {
        assert!(out.lines().any(|l| l.starts_with("coll-bench:") && l.contains(op)), "no {op} line:\n{out}");
    }
}

/// The alltoall benchmark runs and prints a line per size (1 KiB-1 MiB).
fn a2a_bench(env: &[(&str, &str)]) {
    let out = ok_env(2, SHM, &["a2a-bench", "--iters", "20", "--max", "1M"], env);
    for size in ["1024", "4096", "16384", "65536", "262144", "1048576"] {
        assert!(
            out.lines().any(|l| l.starts_with("a2a-bench:") && l.split_whitespace().nth(1) == Some(size)),
            "no {size} line:\n{out}"
        );
    }
}

/// Every case is reported by the proxy naming PE, work-group, operation and
/// heap address, on every PE.
fn bad_input(provider: &str) {
    let out = ok(2, provider, &["--wgs", "2", "bad-input"]);
    for pe in 0..2 {
        for (what, _, _) in gpu::BAD_CASES {
            for wg in 0..2 {
                let line = out
                    .lines()
                    .find(|l| l.starts_with(&format!("bad-input PE {pe} wg {wg}: {what}: ")))
                    .unwrap_or_else(|| panic!("no report of '{what}' on PE {pe} wg {wg}:\n{out}"));
                assert!(line.contains(&format!("PE {pe} work-group {wg}")) && line.contains("heap+0x"), "{line}");
            }
        }
    }
}

/// The timed-out wait is reported by `synchronize` with PE, work-group,
/// address, expected and found value; the scenario checks the details and
/// prints the report.
fn stuck_wait() {
    let j = job(2, SHM, &["stuck-wait"], &[("CPNET_WAIT_TIMEOUT", "1")], Duration::from_secs(120));
    assert!(j.status.success(), "{}", j.all);
    for pe in 0..2 {
        let line = j
            .all
            .lines()
            .find(|l| l.starts_with(&format!("stuck-wait PE {pe}: ")))
            .unwrap_or_else(|| panic!("no report from PE {pe}:\n{}", j.all));
        assert!(line.contains("work-group 1") && line.contains("42") && line.contains("found 7"), "{line}");
    }
}

/// Every scenario's kernel compiles with NVRTC for sm_90 (no GPU needed).
#[test]
fn every_kernel_compiles() {
    if !nvrtc::is_available() {
        if std::env::var("CPNET_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!("CPNET_REQUIRE_NVRTC=1 but libnvrtc was not found ({:?})", nvrtc::library_candidates());
        }
        eprintln!("SKIPPED every_kernel_compiles: libnvrtc not found (source scripts/nvrtc-env.sh)");
        return;
    }
    for (scenario, func, kernel) in gpu::KERNELS {
        let opts = BuildOptions { name: format!("{scenario}.cu"), ..BuildOptions::default() };
        let t = std::time::Instant::now();
        let out = nvrtc::compile(&gpu::source(kernel), &opts)
            .unwrap_or_else(|e| panic!("{scenario}: {e}\n{}", e.log().unwrap_or_default()));
        assert!(out.log.trim().is_empty(), "{scenario}: NVRTC warnings:\n{}", out.log);
        assert!(out.ptx.contains(&format!(".entry {func}(")), "{scenario}: no entry {func} in the PTX");
        eprintln!("{scenario}: compiled in {:.1} s", t.elapsed().as_secs_f64());
    }
}
