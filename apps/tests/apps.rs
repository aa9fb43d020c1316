//! The apps as a user runs them: `jacobi` and `allreduce` as N real
//! processes under `cpnet-run`, over libfabric's `shm` provider and over
//! `tcp;ofi_rxm` on loopback. Jacobi is checked against its single-PE
//! reference (`-verify`, bit-identical expected); allreduce counts every
//! element that differs from the exact sum (`#wrong`, asserted 0 on every
//! line).
//!
//! The CPU variant runs everywhere. The GPU variants (`-variant
//! intra-kernel`, `inter-kernel`, over `shm`, one GPU per PE) run where
//! there is a usable GPU and are skipped loudly elsewhere
//! (`CPNET_REQUIRE_GPU=1` turns the skip into a failure); without a GPU,
//! the test that they fail clearly runs instead.
//!
//! Jobs run one at a time (a static lock), as in `tests/tests/multi_pe.rs`:
//! the CI machine has two cores.

use std::path::Path;
use std::time::Duration;

use cpnet_tests::launch::{self, Job};

const SHM: &str = "shm";
const TCP: &str = "tcp;ofi_rxm";

/// `cpnet-run -n n -- bin args` over `provider`, killed after `limit`.
fn job(n: u32, provider: &str, bin: &str, args: &[&str], limit: Duration) -> Job {
    let bin = Path::new(bin);
    launch::run(bin, n, provider, args, &[], limit)
}

fn ok(n: u32, provider: &str, bin: &str, args: &[&str]) -> String {
    let j = job(n, provider, bin, args, Duration::from_secs(300));
    assert!(
        j.status.success(),
        "cpnet-run -n {n} {bin} {args:?} over {provider} failed:\n{}",
        j.all
    );
    j.stdout
}

// ---------------------------------------------------------------- jacobi

const JACOBI: &str = env!("CARGO_BIN_EXE_jacobi");

/// Runs jacobi with `-verify` and checks the verdict and the report.
fn jacobi_verified(n: u32, provider: &str, args: &[&str]) -> String {
    let mut a = args.to_vec();
    a.push("-verify");
    let out = ok(n, provider, JACOBI, &a);
    let verdict = out
        .lines()
        .find(|l| l.starts_with("Verification:"))
        .unwrap_or_else(|| panic!("no verdict:\n{out}"));
    assert!(
        verdict.ends_with(": OK") && verdict.contains(&format!("{n} PEs")),
        "{verdict}"
    );
    assert!(
        verdict.contains("tolerance 1e-5"),
        "the tolerance is stated: {verdict}"
    );
    assert!(out.contains(&format!("Num GPUs: {n}.")), "{out}");
    let report = out
        .lines()
        .find(|l| l.contains(" 1 GPU: "))
        .unwrap_or_else(|| panic!("no report line:\n{out}"));
    for word in [&format!("{n} GPUs: ") as &str, "speedup: ", "efficiency: "] {
        assert!(report.contains(word), "{report}");
    }
    out
}

#[test]
fn jacobi_cpu_1_pe_matches_reference() {
    jacobi_verified(
        1,
        SHM,
        &["-nx", "256", "-ny", "256", "-niter", "100", "-wgs", "2"],
    );
}

#[test]
fn jacobi_cpu_2_pes_matches_reference() {
    let out = jacobi_verified(
        2,
        SHM,
        &["-nx", "256", "-ny", "256", "-niter", "100", "-wgs", "2"],
    );
    // The norm of the first iteration, as both runs print it.
    assert_eq!(
        out.lines().filter(|l| l.starts_with("    0, ")).count(),
        2,
        "{out}"
    );
}

/// 257 interior rows on 3 PEs: chunks of 85, 86 and 86 rows; 3 work-groups
/// per PE; norm every 7 iterations.
#[test]
fn jacobi_cpu_3_pes_uneven_rows_matches_reference() {
    jacobi_verified(
        3,
        SHM,
        &[
            "-nx", "200", "-ny", "259", "-niter", "100", "-wgs", "3", "-nccheck", "7",
        ],
    );
}

/// One row on two of the PEs (4 interior rows on 3 PEs: 1, 1, 2), more
/// work-groups asked than rows, over tcp.
#[test]
fn jacobi_cpu_3_pes_one_row_chunks_tcp() {
    jacobi_verified(
        3,
        TCP,
        &["-nx", "64", "-ny", "6", "-niter", "60", "-wgs", "4"],
    );
}

#[test]
fn jacobi_cpu_2_pes_tcp_matches_reference() {
    jacobi_verified(
        2,
        TCP,
        &["-nx", "128", "-ny", "131", "-niter", "100", "-wgs", "2"],
    );
}

/// The loop stops early once the norm reaches 1e-8 (a 4 x 4 grid, one
/// interior row per PE, reaches an exact fixed point in f32), at the same
/// iteration as the reference.
#[test]
fn jacobi_cpu_early_stop_matches_reference() {
    let out = jacobi_verified(
        2,
        SHM,
        &["-nx", "4", "-ny", "4", "-niter", "5000", "-wgs", "2"],
    );
    let verdict = out
        .lines()
        .find(|l| l.starts_with("Verification:"))
        .unwrap();
    let iters = verdict.split("iterations ").nth(1).unwrap();
    let (a, b) = iters.split_once(" vs ").unwrap();
    let b = b.split(':').next().unwrap();
    assert_eq!(a, b, "{verdict}");
    assert!(a.parse::<u32>().unwrap() < 5000, "{verdict}");
}

/// `-csv`: one line in their column order, nothing else on stdout.
#[test]
fn jacobi_csv_line() {
    let out = ok(
        2,
        SHM,
        JACOBI,
        &["-nx", "64", "-ny", "66", "-niter", "20", "-csv"],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    let cols: Vec<&str> = lines[0].split(", ").collect();
    assert_eq!(
        &cols[..7],
        &["cpnet-cpu", "64", "66", "20", "1", "2", "1"],
        "{out}"
    );
    assert!(
        cols[7].parse::<f64>().is_ok() && cols[8].parse::<f64>().is_ok(),
        "{out}"
    );
}

// ------------------------------------------------------------- allreduce

const ALLREDUCE: &str = env!("CARGO_BIN_EXE_allreduce");

/// Runs allreduce and checks that every size came out, with `#wrong` 0 in
/// both the out-of-place and the in-place column.
/// The rings at every size unless `args` name an `-algo`.
fn allreduce_exact(n: u32, provider: &str, args: &[&str], sizes: usize) -> String {
    let mut a: Vec<&str> = args.to_vec();
    if !args.contains(&"-algo") {
        a.extend(["-algo", "ring"]);
    }
    let out = ok(n, provider, ALLREDUCE, &a);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .collect();
    assert_eq!(rows.len(), sizes, "one line per size:\n{out}");
    for r in &rows {
        assert_eq!(
            r.len(),
            13,
            "size count type redop root, then time algbw busbw #wrong twice: {r:?}"
        );
        assert_eq!((r[3], r[4]), ("sum", "-1"), "{r:?}");
        assert_eq!((r[8], r[12]), ("0", "0"), "#wrong must be 0:\n{out}");
        let (bytes, count): (u64, u64) = (r[0].parse().unwrap(), r[1].parse().unwrap());
        let esize = match r[2] {
            "float" | "int32" => 4,
            "double" => 8,
            t => panic!("type {t}"),
        };
        assert_eq!(bytes, count * esize, "{r:?}");
    }
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    out
}

/// Sizes 12 B · 3^k (3^(k+1) elements of 4 bytes: odd counts, not
/// divisible by 2 or 4 rings or PEs, fewer than rings × PEs at first) up to
/// 6.4 MB, or 8 B · 3^k for doubles (1, 3, 9, ... elements).
fn sweep(n: u32, ty: &str, wgs: &str) {
    let b = if ty == "double" { "8" } else { "12" };
    let out = allreduce_exact(
        n,
        SHM,
        &[
            "-b", b, "-e", "7M", "-f", "3", "-type", ty, "-wgs", wgs, "-iters", "2", "-warmup", "1",
        ],
        13,
    );
    assert!(out.contains(&format!("{n} PEs, {wgs} rings")), "{out}");
}

macro_rules! allreduce_matrix {
    ($($name:ident: $n:expr, $wgs:expr;)*) => {$(
        mod $name {
            use super::*;
            #[test] fn float() { sweep($n, "float", $wgs); }
            #[test] fn int32() { sweep($n, "int32", $wgs); }
            #[test] fn double() { sweep($n, "double", $wgs); }
        }
    )*};
}

allreduce_matrix! {
    allreduce_1_pe: 1, "2";
    allreduce_2_pes: 2, "3";
    allreduce_3_pes: 3, "2";
    allreduce_4_pes: 4, "3";
}

/// `-algo team`: every size through the library's reduce to all
/// (`CpuCtx::reduce` over the world team), odd counts from 12 B to 700 KB,
/// 3 PEs over tcp and 2 over shm, every type; then `-algo auto` with the
/// switch inside the sweep (team up to 4 KiB, rings above).
#[test]
fn allreduce_team_cpu() {
    for ty in ["float", "int32", "double"] {
        let b = if ty == "double" { "8" } else { "12" };
        let out = allreduce_exact(
            3,
            TCP,
            &["-algo", "team", "-b", b, "-e", "800K", "-f", "3", "-type", ty, "-iters", "2", "-warmup", "1"],
            11,
        );
        assert!(out.contains("# algorithm: the library's reduce to all (team world) at every size"), "{out}");
    }
    allreduce_exact(2, SHM, &["-algo", "team", "-b", "8", "-e", "64K", "-f", "8", "-iters", "3", "-warmup", "1"], 5);
    let out = allreduce_exact(
        3,
        SHM,
        &["-algo", "auto", "-team-max", "4K", "-b", "12", "-e", "800K", "-f", "3", "-iters", "2", "-warmup", "1"],
        11,
    );
    assert!(out.contains("up to 4096 bytes, rings above"), "{out}");
}

/// The 8-byte allreduce of nccl-tests' first line, on 4 PEs with 4 rings:
/// 2 floats, most rings and blocks empty.
#[test]
fn allreduce_8_bytes_4_pes() {
    allreduce_exact(
        4,
        SHM,
        &[
            "-b", "8", "-e", "8", "-wgs", "4", "-iters", "3", "-warmup", "1",
        ],
        1,
    );
}

/// Tiny pieces and one staging slot per ring: every message waits for the
/// acknowledgement of the one before (flow control at its tightest), and
/// the output-overwrite rule is exercised on every piece.
#[test]
fn allreduce_one_slot_tiny_chunks() {
    allreduce_exact(
        3,
        SHM,
        &[
            "-b", "8", "-e", "64K", "-f", "8", "-chunk", "64", "-slots", "1", "-wgs", "2",
            "-iters", "3", "-warmup", "2",
        ],
        5,
    );
}

#[test]
fn allreduce_3_pes_tcp() {
    allreduce_exact(
        3,
        TCP,
        &[
            "-b", "12", "-e", "3M", "-f", "9", "-wgs", "2", "-iters", "2", "-warmup", "1",
        ],
        6,
    );
}

#[test]
fn allreduce_2_pes_double_tcp() {
    allreduce_exact(
        2,
        TCP,
        &[
            "-b", "8", "-e", "1M", "-f", "16", "-type", "double", "-wgs", "3", "-iters", "2",
            "-warmup", "1",
        ],
        5,
    );
}

// -------------------------------------------------------------- variants

/// Whether this machine can run the GPU variants (a CUDA driver and a
/// device). Without one, `CPNET_REQUIRE_GPU=1` (set it on the GPU machine)
/// makes that a failure instead of a skip.
fn gpu_usable() -> bool {
    let usable = cpnet::gpu::driver_present() && cpnet::gpu::open_device(0).is_ok();
    if !usable {
        assert!(
            std::env::var("CPNET_REQUIRE_GPU").as_deref() != Ok("1"),
            "CPNET_REQUIRE_GPU=1 but no usable GPU here"
        );
    }
    usable
}

/// True when the GPU tests can run; otherwise says loudly that `test` is
/// skipped (straight to stderr: libtest captures eprintln! of passing tests).
fn gpu_or_skip(test: &str) -> bool {
    if gpu_usable() {
        return true;
    }
    let line = format!("\n*** SKIPPED {test}: no usable GPU (CUDA driver and device) on this machine\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    false
}

/// Without a GPU, the GPU variants fail with an error that says so, never
/// run as something else.
#[test]
fn gpu_variants_without_a_gpu_fail_clearly() {
    if gpu_usable() {
        let line = "\n*** SKIPPED gpu_variants_without_a_gpu_fail_clearly: this machine has a GPU\n";
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        return;
    }
    for (bin, name) in [(JACOBI, "jacobi"), (ALLREDUCE, "allreduce")] {
        for v in ["intra-kernel", "inter-kernel"] {
            let j = job(1, SHM, bin, &["-variant", v], Duration::from_secs(60));
            assert!(!j.status.success(), "{name} -variant {v} must fail:\n{}", j.all);
            assert!(
                j.all.contains(&format!("-variant {v} needs a GPU")) && j.all.contains("-variant cpu"),
                "{name} -variant {v}: no clear error:\n{}",
                j.all
            );
        }
    }
}

// ------------------------------------------------------------ GPU jacobi

/// Runs a GPU variant of jacobi with `-verify` (every PE against the CPU
/// single-PE reference, and the single-GPU run too) and checks both
/// verdicts and the report.
fn jacobi_gpu_verified(n: u32, variant: &str, args: &[&str]) -> String {
    let mut a = vec!["-variant", variant];
    a.extend_from_slice(args);
    let out = jacobi_verified(n, SHM, &a);
    let single = out
        .lines()
        .find(|l| l.starts_with("Single-GPU run vs the single-PE reference:"))
        .unwrap_or_else(|| panic!("no single-GPU verdict:\n{out}"));
    assert!(single.ends_with(": OK"), "{single}");
    assert!(out.contains(&format!("cpnet {variant}")), "{out}");
    out
}

#[test]
fn jacobi_intra_kernel_2_pes_matches_reference() {
    if gpu_or_skip("jacobi_intra_kernel_2_pes_matches_reference") {
        jacobi_gpu_verified(2, "intra-kernel", &["-nx", "256", "-ny", "256", "-niter", "100"]);
    }
}

/// Uneven chunks (128 and 129 rows), norm every 7 iterations, two blocks
/// (no block dedicated to a boundary row), then three (the smallest grid
/// with dedicated boundary blocks).
#[test]
fn jacobi_intra_kernel_2_pes_uneven_few_blocks() {
    if gpu_or_skip("jacobi_intra_kernel_2_pes_uneven_few_blocks") {
        for wgs in ["2", "3"] {
            jacobi_gpu_verified(
                2,
                "intra-kernel",
                &["-nx", "200", "-ny", "259", "-niter", "100", "-nccheck", "7", "-wgs", wgs],
            );
        }
    }
}

#[test]
fn jacobi_intra_kernel_1_pe_matches_reference() {
    if gpu_or_skip("jacobi_intra_kernel_1_pe_matches_reference") {
        jacobi_gpu_verified(1, "intra-kernel", &["-nx", "256", "-ny", "130", "-niter", "100"]);
    }
}

/// One interior row per PE (4 x 4 on 2 PEs): the row is both boundaries;
/// the loop stops early at the reference's iteration.
#[test]
fn jacobi_intra_kernel_early_stop_one_row_chunks() {
    if gpu_or_skip("jacobi_intra_kernel_early_stop_one_row_chunks") {
        jacobi_gpu_verified(2, "intra-kernel", &["-nx", "4", "-ny", "4", "-niter", "5000"]);
    }
}

#[test]
fn jacobi_inter_kernel_2_pes_matches_reference() {
    if gpu_or_skip("jacobi_inter_kernel_2_pes_matches_reference") {
        jacobi_gpu_verified(
            2,
            "inter-kernel",
            &["-nx", "200", "-ny", "259", "-niter", "100", "-nccheck", "7"],
        );
    }
}

#[test]
fn jacobi_inter_kernel_1_pe_and_early_stop() {
    if gpu_or_skip("jacobi_inter_kernel_1_pe_and_early_stop") {
        jacobi_gpu_verified(1, "inter-kernel", &["-nx", "128", "-ny", "66", "-niter", "50"]);
        jacobi_gpu_verified(2, "inter-kernel", &["-nx", "4", "-ny", "4", "-niter", "5000"]);
    }
}

// --------------------------------------------------------- GPU allreduce

/// A GPU variant's sweep as [`sweep`] does it for the CPU (odd counts, up
/// to 6.4 MB).
fn gpu_sweep(n: u32, variant: &str, ty: &str, wgs: &str) {
    let b = if ty == "double" { "8" } else { "12" };
    let out = allreduce_exact(
        n,
        SHM,
        &[
            "-variant", variant, "-b", b, "-e", "7M", "-f", "3", "-type", ty, "-wgs", wgs, "-iters", "2",
            "-warmup", "1",
        ],
        13,
    );
    assert!(out.contains(&format!("variant {variant}, {n} PEs, {wgs} rings")), "{out}");
}

macro_rules! gpu_allreduce_matrix {
    ($($name:ident: $n:expr, $variant:expr, $wgs:expr;)*) => {$(
        mod $name {
            use super::*;
            #[test] fn float() { if gpu_or_skip(concat!(stringify!($name), "::float")) { gpu_sweep($n, $variant, "float", $wgs); } }
            #[test] fn int32() { if gpu_or_skip(concat!(stringify!($name), "::int32")) { gpu_sweep($n, $variant, "int32", $wgs); } }
            #[test] fn double() { if gpu_or_skip(concat!(stringify!($name), "::double")) { gpu_sweep($n, $variant, "double", $wgs); } }
        }
    )*};
}

gpu_allreduce_matrix! {
    allreduce_intra_kernel_1_pe: 1, "intra-kernel", "2";
    allreduce_intra_kernel_2_pes: 2, "intra-kernel", "3";
    allreduce_inter_kernel_2_pes: 2, "inter-kernel", "3";
}

/// `-algo team` and `-algo auto` on the GPU: block 0 calls the library's
/// `cpnet_<type>_sum_reduce` over `CPNET_TEAM_WORLD` (LL and short rounds
/// up to 1 KiB, chunked rounds above), odd counts up to 700 KB, both
/// variants, every type; auto switches inside the sweep.
#[test]
fn allreduce_gpu_team() {
    if gpu_or_skip("allreduce_gpu_team") {
        for v in ["intra-kernel", "inter-kernel"] {
            for ty in ["float", "int32", "double"] {
                let b = if ty == "double" { "8" } else { "12" };
                allreduce_exact(
                    2,
                    SHM,
                    &["-variant", v, "-algo", "team", "-b", b, "-e", "800K", "-f", "3", "-type", ty, "-wgs", "2", "-iters", "2", "-warmup", "1"],
                    11,
                );
            }
        }
        allreduce_exact(
            2,
            SHM,
            &["-variant", "intra-kernel", "-algo", "auto", "-team-max", "4K", "-b", "12", "-e", "800K", "-f", "3", "-wgs", "3", "-iters", "2", "-warmup", "1"],
            11,
        );
    }
}

/// Tiny pieces and one staging slot per ring on the GPU: every message
/// waits for the acknowledgement of the one before, and the
/// output-overwrite rule is exercised on every piece.
#[test]
fn allreduce_intra_kernel_one_slot_tiny_chunks() {
    if gpu_or_skip("allreduce_intra_kernel_one_slot_tiny_chunks") {
        allreduce_exact(
            2,
            SHM,
            &[
                "-variant", "intra-kernel", "-b", "8", "-e", "64K", "-f", "8", "-chunk", "64", "-slots", "1",
                "-wgs", "2", "-iters", "3", "-warmup", "2",
            ],
            5,
        );
    }
}

/// The 8-byte line with more rings than elements, both GPU variants.
#[test]
fn allreduce_gpu_8_bytes_4_rings() {
    if gpu_or_skip("allreduce_gpu_8_bytes_4_rings") {
        for v in ["intra-kernel", "inter-kernel"] {
            allreduce_exact(
                2,
                SHM,
                &["-variant", v, "-b", "8", "-e", "8", "-wgs", "4", "-iters", "3", "-warmup", "1"],
                1,
            );
        }
    }
}

/// `moe -verify` (issue 22): every output element of every PE equals the
/// reference bit for bit (`#wrong` 0 on every PE's line), uniform and
/// skewed routing, 2 and 4 PEs, both providers; bad arguments fail before
/// any PE works, naming the argument.
fn moe_verified(n: u32, provider: &str, args: &[&str]) -> String {
    moe_verified_env(n, provider, args, &[])
}

fn moe_verified_env(n: u32, provider: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    // The defaults, less those `args` sets itself.
    let base = [("-tokens", "24"), ("-hidden", "96"), ("-k", "4"), ("-experts", "8"), ("-iters", "3"), ("-warmup", "1")];
    let mut a: Vec<&str> = base.iter().filter(|(k, _)| !args.contains(k)).flat_map(|&(k, v)| [k, v]).collect();
    a.push("-verify");
    a.extend_from_slice(args);
    let j = launch::run(Path::new(env!("CARGO_BIN_EXE_moe")), n, provider, &a, env, Duration::from_secs(300));
    assert!(j.status.success(), "moe {a:?} with {env:?} over {provider} failed:\n{}", j.all);
    let out = j.stdout;
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
    assert_eq!(rows.len(), n as usize, "one line per PE:\n{out}");
    for r in &rows {
        assert_eq!(r.split_whitespace().last(), Some("0"), "#wrong must be 0: {r}\n{out}");
        assert_eq!(r.split_whitespace().count(), 7, "PE, dispatch, combine, two rates, experts, #wrong: {r}");
    }
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    out
}

#[test]
fn moe_2_pes_uniform_and_4_pes_skewed() {
    moe_verified(2, SHM, &[]);
    moe_verified(4, SHM, &["-skew", "1.5", "-wgs", "3", "-seed", "7"]);
}

#[test]
fn moe_2_pes_tcp() {
    moe_verified(2, TCP, &["-wgs", "1"]);
}

/// moe on GPU PEs (`-variant intra-kernel`), verified: uniform routing,
/// and skewed routing with 3 work-groups, where some experts receive no
/// token (empty ranges of the kernel's list of received slots); over peer
/// stores (a put per row) and over the network path (packed runs in bulk
/// puts; 3 PEs, odd hidden sizes, runs cut into pieces of unequal length).
#[test]
fn moe_gpu_verified() {
    if gpu_or_skip("moe_gpu_verified") {
        moe_verified(2, SHM, &["-variant", "intra-kernel", "-wgs", "4"]);
        moe_verified(2, SHM, &["-variant", "intra-kernel", "-skew", "2", "-wgs", "3", "-seed", "11"]);
        let net = [("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0")];
        moe_verified_env(2, SHM, &["-variant", "intra-kernel", "-wgs", "4"], &net);
        moe_verified_env(2, SHM, &["-variant", "intra-kernel", "-hidden", "4099", "-wgs", "5", "-skew", "1.5"], &net);
        moe_verified_env(3, SHM, &["-variant", "intra-kernel", "-experts", "9", "-hidden", "777", "-wgs", "3"], &net);
    }
}

#[test]
fn moe_bad_arguments_fail_clearly() {
    let j = job(3, SHM, env!("CARGO_BIN_EXE_moe"), &["-experts", "16"], Duration::from_secs(60));
    assert!(!j.status.success(), "{}", j.all);
    assert!(j.all.contains("-experts 16 must be a positive multiple of the number of PEs (3)"), "{}", j.all);
    let j = job(2, SHM, env!("CARGO_BIN_EXE_moe"), &["-experts", "4", "-k", "5"], Duration::from_secs(60));
    assert!(!j.status.success(), "{}", j.all);
    assert!(j.all.contains("-topk 5 must be in 1..=experts (4)"), "{}", j.all);
    let j = job(2, SHM, env!("CARGO_BIN_EXE_moe"), &["-bulk-min", "0"], Duration::from_secs(60));
    assert!(!j.status.success(), "{}", j.all);
    assert!(j.all.contains("-bulk-min must be at least 1 byte"), "{}", j.all);
}

/// `cpnet-providers` (issue 19 item 3) asks this machine's libfabric with
/// cpnet's hints: shm grants RMA, messages and every AMO cpnet uses; an
/// absent provider is reported as such, not as an error.
#[test]
fn providers_report_what_libfabric_grants() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cpnet-providers"))
        .args(["shm", "cxi"])
        .output()
        .expect("run cpnet-providers");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("## shm\nrma: yes (granted shm"), "{text}");
    assert!(text.contains("msg: yes (granted shm"), "{text}");
    assert!(
        text.contains("atomics fi_fetch_atomic: 32/64-bit integers: sum min max prod band bor bxor read write"),
        "{text}"
    );
    assert!(text.contains("## cxi\nrma: no ("), "{text}");
}

// ----------------------------------------------------------- cpnet-bench

const BENCH: &str = env!("CARGO_BIN_EXE_cpnet-bench");

/// The number after the word `key` in `line`.
fn number_after(line: &str, key: &str) -> f64 {
    let mut words = line.split_whitespace();
    words
        .position(|w| w == key)
        .and_then(|_| words.next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key:?} in: {line}"))
}

/// `cpnet-bench` prints the provider's own floors beside cpnet's rows (the
/// raw write ping-pong, and the message ping-pong and two-way exchange at 8
/// B, 4 KiB and 16 KiB, `cpnet_apps::floor`), each a positive time, over
/// both providers.
#[test]
fn bench_prints_the_providers_floors() {
    for provider in [SHM, TCP] {
        let out = ok(
            2,
            provider,
            BENCH,
            &["--max", "64", "--iters", "50", "--rate-msgs", "2000", "--rate-wgs", "1", "--floor-iters", "100", "--floor-msgs", "2000"],
        );
        let write = out
            .lines()
            .find(|l| l.starts_with("# floor: raw libfabric") && l.contains("8 B write ping-pong"))
            .unwrap_or_else(|| panic!("no write ping-pong floor over {provider}:\n{out}"));
        assert!(number_after(write, "one-way") > 0.0, "{write}");
        for size in [8, 4096, 16384] {
            let at = format!("# floor: raw libfabric fi_send/fi_recv {size} B:");
            let line = out
                .lines()
                .find(|l| l.starts_with(&at))
                .unwrap_or_else(|| panic!("no message floor at {size} B over {provider}:\n{out}"));
            for key in ["one-way", "exchange"] {
                let us = number_after(line, key);
                assert!(us.is_finite() && us > 0.0, "{key} of {us} us: {line}");
            }
        }
    }
}
