//! `bfs` and `sssp` as a user runs them: N real processes under
//! `cpnet-run`, over `shm` and `tcp;ofi_rxm`, validated (`-verify`: the
//! five Graph500 rules for every BFS tree; every SSSP result against a
//! sequential Dijkstra), on the Kronecker graph at SCALE 14 and 16 with 2
//! and 4 PEs and on a real graph file; and their bad-input errors, which
//! must stop every PE before any work. Jobs run one at a time (the CI
//! machine has two cores).
//!
//! The GPU variants of `bfs` (`-variant intra-kernel|inter-kernel`, one GPU
//! per PE; several PEs share a GPU under MPS) and of `sssp` (`-variant
//! intra-kernel`) run where there is a GPU and are skipped loudly elsewhere
//! (`CPNET_REQUIRE_GPU=1` makes that a failure); without one, the tests
//! that they fail clearly run instead.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use cpnet_tests::gpu::{gpu_available, gpu_or_skip};
use cpnet_tests::launch::{self, Job};

const SHM: &str = "shm";
const TCP: &str = "tcp;ofi_rxm";
const BFS: &str = env!("CARGO_BIN_EXE_bfs");
const SSSP: &str = env!("CARGO_BIN_EXE_sssp");
/// The real graph Debian's python3-networkx ships (scripts/setup.sh).
const HARTFORD: &str = "/usr/share/doc/python3-networkx/examples/algorithms/hartford_drug.edgelist";

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn job(n: u32, provider: &str, bin: &str, args: &[&str]) -> Job {
    job_env(n, provider, bin, args, &[])
}

fn job_env(n: u32, provider: &str, bin: &str, args: &[&str], env: &[(&str, &str)]) -> Job {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    launch::run(Path::new(bin), n, provider, args, env, Duration::from_secs(300))
}

fn ok_env(n: u32, provider: &str, bin: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let j = job_env(n, provider, bin, args, env);
    assert!(j.status.success(), "cpnet-run -n {n} {bin} {args:?} over {provider} ({env:?}) failed:\n{}", j.all);
    j.stdout
}

/// A validated BFS run: every search line says "valid", the Graph500 block
/// is there with its harmonic mean, and the verdict is PASSED.
fn bfs_valid(n: u32, provider: &str, args: &[&str], searches: usize) -> String {
    bfs_valid_env(n, provider, args, searches, &[])
}

/// [`bfs_valid`] with extra environment variables.
fn bfs_valid_env(n: u32, provider: &str, args: &[&str], searches: usize, env: &[(&str, &str)]) -> String {
    let mut a = args.to_vec();
    a.push("-verify");
    let out = ok_env(n, provider, BFS, &a, env);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("search ")).collect();
    assert_eq!(lines.len(), searches, "{out}");
    assert!(lines.iter().all(|l| l.ends_with("valid")), "{out}");
    for field in ["bfs_harmonic_mean_TEPS: ", "bfs_median_time: ", &format!("num_mpi_processes: {n}"), "construction_time: "] {
        assert!(out.contains(field), "{field} missing:\n{out}");
    }
    assert!(out.contains("validation: PASSED"), "{out}");
    out
}

fn sssp_valid(n: u32, provider: &str, args: &[&str], searches: usize) -> String {
    sssp_valid_env(n, provider, args, searches, &[])
}

/// [`sssp_valid`] with extra environment variables.
fn sssp_valid_env(n: u32, provider: &str, args: &[&str], searches: usize, env: &[(&str, &str)]) -> String {
    let mut a = args.to_vec();
    a.push("-verify");
    let out = ok_env(n, provider, SSSP, &a, env);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("search ")).collect();
    assert_eq!(lines.len(), searches, "{out}");
    assert!(lines.iter().all(|l| l.ends_with("valid")), "{out}");
    assert!(out.contains("sssp_harmonic_mean_TEPS: ") && out.contains("validation: PASSED"), "{out}");
    out
}

#[test]
fn bfs_scale_16_on_2_pes_is_valid() {
    let out = bfs_valid(2, SHM, &["-scale", "16", "-nbfs", "8"], 8);
    assert!(out.contains("SCALE: 16") && out.contains("NBFS: 8") && out.contains("edgefactor: 16"), "{out}");
}

#[test]
fn bfs_scale_14_on_4_pes_top_down_and_hybrid_are_valid() {
    let td = bfs_valid(4, TCP, &["-scale", "14", "-nbfs", "6", "-direction", "top-down"], 6);
    assert!(td.contains("+ 0 bottom-up"), "top-down only:\n{td}");
    let hy = bfs_valid(4, SHM, &["-scale", "14", "-nbfs", "6"], 6);
    assert!(!hy.lines().filter(|l| l.starts_with("search ")).all(|l| l.contains("+ 0 bottom-up")), "hybrid took no bottom-up level:\n{hy}");
}

/// The Kronecker graph of a seed does not depend on the number of PEs: the
/// same root reaches the same number of edges on 1 and 3 PEs.
#[test]
fn the_generated_graph_does_not_depend_on_the_pe_count() {
    let edges = |n| edges_of(&bfs_valid(n, SHM, &["-scale", "12", "-seed", "5", "-root", "17"], 1));
    assert_eq!(edges(1), edges(3));
}

#[test]
fn sssp_scale_14_on_2_and_4_pes_matches_dijkstra() {
    sssp_valid(2, SHM, &["-scale", "14", "-nsssp", "4"], 4);
    let f = sssp_valid(4, TCP, &["-scale", "14", "-nsssp", "2", "-controller", "fixed", "-wgs", "2"], 2);
    assert!(f.contains("controller: Fixed") && f.contains("work-groups: 2"), "{f}");
}

#[test]
fn a_real_graph_from_a_package_is_searched_validly() {
    bfs_valid(3, SHM, &["-file", HARTFORD, "-nbfs", "4"], 4);
    sssp_valid(3, SHM, &["-file", HARTFORD, "-nsssp", "4", "-wgs", "2"], 4);
}

/// The road-like grid (`-road SIDE`): degree at most 4, diameter 2 (SIDE -
/// 1), thousands of buckets; both searches valid, both controllers, and the
/// header names the input.
#[test]
fn a_road_like_grid_is_searched_validly() {
    let b = bfs_valid(2, SHM, &["-road", "48", "-nbfs", "4"], 4);
    assert!(b.contains("graph_generation: road-like grid 48 x 48"), "{b}");
    sssp_valid(2, SHM, &["-road", "48", "-nsssp", "4"], 4);
    sssp_valid(3, SHM, &["-road", "40", "-nsssp", "2", "-controller", "fixed"], 2);
}

/// Bad input stops every PE before any work, with a message that names it.
fn fails_with(bin: &str, args: &[&str], want: &str) {
    let j = job(2, SHM, bin, args);
    assert!(!j.status.success(), "{bin} {args:?} succeeded:\n{}", j.all);
    assert!(j.all.contains(want), "{bin} {args:?}: expected '{want}' in:\n{}", j.all);
    assert!(!j.stdout.contains("search "), "work started:\n{}", j.all);
}

#[test]
fn bad_input_is_refused_before_any_work() {
    let dir = std::env::temp_dir().join(format!("cpnet-graph-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let neg = dir.join("neg.gr");
    std::fs::write(&neg, "p sp 3 2\na 1 2 1.5\na 2 3 -2\n").unwrap();
    let cut = dir.join("cut.mtx");
    std::fs::write(&cut, "%%MatrixMarket matrix coordinate pattern symmetric\n4 4 3\n1 2\n2 3\n").unwrap();
    let (neg, cut) = (neg.to_str().unwrap(), cut.to_str().unwrap());
    fails_with(SSSP, &["-file", neg], &format!("{neg}:3: weight -2 is negative or not finite; SSSP needs weights >= 0"));
    fails_with(BFS, &["-file", cut], &format!("{cut}:4: truncated: 2 of the 3 entries the size line announced"));
    fails_with(BFS, &["-scale", "10", "-root", "1024"], "-root 1024 is outside the graph (vertices 0..1024)");
    fails_with(SSSP, &["-scale", "30"], "needs about");
    fails_with(BFS, &["-scale", "31"], "-scale 31 is outside 1..=30");
    std::fs::remove_dir_all(&dir).ok();
}

// ------------------------------------------------------------ GPU bfs

/// The edges the search from `root` reached (the search line's field).
fn edges_of(out: &str) -> String {
    let l = out.lines().find(|l| l.starts_with("search ")).unwrap_or_else(|| panic!("no search line:\n{out}"));
    l.split_whitespace().skip_while(|w| *w != "s").nth(1).unwrap().to_owned()
}

#[test]
fn bfs_gpu_variants_are_valid_on_1_and_2_pes() {
    if !gpu_or_skip("bfs_gpu_variants_are_valid_on_1_and_2_pes") {
        return;
    }
    for v in ["intra-kernel", "inter-kernel"] {
        let one = bfs_valid(1, SHM, &["-variant", v, "-scale", "12", "-nbfs", "4"], 4);
        assert!(one.contains(&format!("# bfs -variant {v}: 1 GPU PE")) && one.contains("direction: TopDown"), "{one}");
        assert!(one.lines().filter(|l| l.starts_with("search ")).all(|l| l.contains("+ 0 bottom-up")), "{one}");
        bfs_valid(2, SHM, &["-variant", v, "-scale", "14", "-nbfs", "4"], 4);
    }
}

/// With the direct paths off every exchange takes the network path (the
/// staged transport and the landing agents).
#[test]
fn bfs_gpu_variants_are_valid_on_the_network_path() {
    if !gpu_or_skip("bfs_gpu_variants_are_valid_on_the_network_path") {
        return;
    }
    let env = [("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0")];
    for v in ["intra-kernel", "inter-kernel"] {
        bfs_valid_env(2, SHM, &["-variant", v, "-scale", "14", "-nbfs", "4"], 4, &env);
    }
}

/// The GPU searches reach what the CPU search reaches from the same root
/// (the same graph, built without communication on GPU PEs), on 1 and 3 PEs.
#[test]
fn bfs_gpu_variants_reach_what_the_cpu_variant_reaches() {
    if !gpu_or_skip("bfs_gpu_variants_reach_what_the_cpu_variant_reaches") {
        return;
    }
    let a = ["-scale", "12", "-seed", "5", "-root", "17"];
    let cpu = edges_of(&bfs_valid(2, SHM, &a, 1));
    for (n, v) in [(1, "intra-kernel"), (3, "intra-kernel"), (3, "inter-kernel")] {
        let mut args = a.to_vec();
        args.extend(["-variant", v]);
        assert_eq!(edges_of(&bfs_valid(n, SHM, &args, 1)), cpu, "{v} on {n} PEs");
    }
}

/// Direction optimization on the GPU: `-variant intra-kernel -direction
/// hybrid` validates on 1 and 2 PEs, peer stores and the network path,
/// takes bottom-up levels, and reaches what the CPU search reaches.
#[test]
fn bfs_gpu_hybrid_is_valid_and_goes_bottom_up() {
    if !gpu_or_skip("bfs_gpu_hybrid_is_valid_and_goes_bottom_up") {
        return;
    }
    let h = ["-variant", "intra-kernel", "-direction", "hybrid"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> { h.iter().chain(extra).copied().collect() };
    let one = bfs_valid(1, SHM, &with(&["-scale", "14", "-nbfs", "4"]), 4);
    assert!(one.contains("-direction hybrid") && one.contains("direction: Hybrid"), "{one}");
    assert!(!one.lines().filter(|l| l.starts_with("search ")).all(|l| l.contains("+ 0 bottom-up")), "no bottom-up level:\n{one}");
    let two = bfs_valid(2, SHM, &with(&["-scale", "14", "-nbfs", "4"]), 4);
    assert!(!two.lines().filter(|l| l.starts_with("search ")).all(|l| l.contains("+ 0 bottom-up")), "no bottom-up level:\n{two}");
    let env = [("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0")];
    bfs_valid_env(2, SHM, &with(&["-scale", "14", "-nbfs", "4"]), 4, &env);
    let a = ["-scale", "12", "-seed", "5", "-root", "17"];
    let cpu = edges_of(&bfs_valid(2, SHM, &a, 1));
    let mut args = with(&a);
    args.extend(["-alpha", "1e9"]); // bottom-up whenever top-down would not be: both switches, level after level
    assert_eq!(edges_of(&bfs_valid(3, SHM, &args, 1)), cpu, "intra-kernel hybrid on 3 PEs");
}

/// Bottom-up levels run in the intra-kernel variant only: the inter-kernel
/// one refuses `-direction hybrid` before start-up (GPU or not); without a
/// GPU both GPU variants fail saying so.
#[test]
fn bfs_gpu_variants_refuse_what_they_cannot_do() {
    let j = job(1, SHM, BFS, &["-variant", "inter-kernel", "-scale", "10", "-direction", "hybrid"]);
    assert!(!j.status.success() && j.all.contains("bottom-up levels run in the intra-kernel variant only"), "{}", j.all);
    if gpu_available().is_err() {
        for v in ["intra-kernel", "inter-kernel"] {
            let j = job(1, SHM, BFS, &["-variant", v, "-scale", "10"]);
            assert!(!j.status.success(), "bfs -variant {v} must fail:\n{}", j.all);
            assert!(j.all.contains(&format!("-variant {v} needs a GPU")) && j.all.contains("-variant cpu"), "{}", j.all);
        }
    }
}

// ------------------------------------------------------------ GPU sssp

/// Both controllers of the GPU variant match Dijkstra on 1 and 2 PEs, and
/// the energy is reported (joules where NVML answers, n/a where not).
#[test]
fn sssp_gpu_matches_dijkstra_on_1_and_2_pes() {
    if !gpu_or_skip("sssp_gpu_matches_dijkstra_on_1_and_2_pes") {
        return;
    }
    for c in ["fixed", "adaptive"] {
        let one = sssp_valid(1, SHM, &["-variant", "intra-kernel", "-scale", "12", "-nsssp", "4", "-controller", c], 4);
        assert!(one.contains("# sssp -variant intra-kernel: 1 GPU PE"), "{one}");
        assert!(one.contains(" J per search") || one.contains("energy: n/a (no NVML)"), "{one}");
        sssp_valid(2, SHM, &["-variant", "intra-kernel", "-scale", "14", "-nsssp", "4", "-controller", c], 4);
    }
}

/// A real graph file on 3 PEs sharing the GPU.
#[test]
fn sssp_gpu_matches_dijkstra_on_a_file() {
    if !gpu_or_skip("sssp_gpu_matches_dijkstra_on_a_file") {
        return;
    }
    // The GPU machine has no python3-networkx (scripts/setup.sh installs it
    // where CI runs).
    if !std::path::Path::new(HARTFORD).exists() {
        eprintln!("SKIPPED sssp_gpu_matches_dijkstra_on_a_file: {HARTFORD} is not installed here (apt-get install python3-networkx)");
        return;
    }
    sssp_valid(3, SHM, &["-variant", "intra-kernel", "-file", HARTFORD, "-nsssp", "4"], 4);
}

/// With the direct paths off every round's exchange takes the network path,
/// landing through the proxy's agents beside a grid that fills the GPU
/// (`GpuPe::max_persistent_blocks`: room and a matching carveout; it hung
/// before those, docs/results.md, "The landing agent beside persistent
/// kernels").
#[test]
fn sssp_gpu_matches_dijkstra_on_the_network_path() {
    if !gpu_or_skip("sssp_gpu_matches_dijkstra_on_the_network_path") {
        return;
    }
    let env = [("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0")];
    sssp_valid_env(2, SHM, &["-variant", "intra-kernel", "-scale", "14", "-nsssp", "4"], 4, &env);
}

/// Without a GPU both GPU variants of sssp fail before any work, saying so.
#[test]
fn sssp_gpu_variants_refuse_what_they_cannot_do() {
    if gpu_available().is_err() {
        for v in ["intra-kernel", "inter-kernel"] {
            let j = job(1, SHM, SSSP, &["-variant", v, "-scale", "10"]);
            assert!(!j.status.success(), "sssp -variant {v} must fail:\n{}", j.all);
            assert!(j.all.contains(&format!("-variant {v} needs a GPU")) && j.all.contains("-variant cpu"), "{}", j.all);
        }
    }
}

/// `-variant inter-kernel` (a launch per phase, the host deciding between
/// rounds) matches Dijkstra with both controllers on 1 and 2 PEs, on peer
/// stores and the network path, and takes the same buckets as the
/// intra-kernel variant with fixed delta (the same decisions from the same
/// sums).
#[test]
fn sssp_gpu_inter_kernel_matches_dijkstra() {
    if !gpu_or_skip("sssp_gpu_inter_kernel_matches_dijkstra") {
        return;
    }
    for c in ["fixed", "adaptive"] {
        let one = sssp_valid(1, SHM, &["-variant", "inter-kernel", "-scale", "12", "-nsssp", "4", "-controller", c], 4);
        assert!(one.contains("# sssp -variant inter-kernel: 1 GPU PE"), "{one}");
        sssp_valid(2, SHM, &["-variant", "inter-kernel", "-scale", "14", "-nsssp", "4", "-controller", c], 4);
    }
    let env = [("CPNET_GPU_IPC", "0"), ("CPNET_GPU_P2P", "0")];
    sssp_valid_env(2, SHM, &["-variant", "inter-kernel", "-scale", "14", "-nsssp", "2"], 2, &env);
    let a = ["-scale", "12", "-nsssp", "2", "-controller", "fixed"];
    let buckets = |v: &str| -> Vec<String> {
        let mut args = a.to_vec();
        args.extend(["-variant", v]);
        let out = sssp_valid(2, SHM, &args, 2);
        // "... 8 buckets 19 rounds ...": the word before "buckets".
        let count = |l: &str| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.iter().position(|&x| x == "buckets").map(|i| w[i - 1].to_owned()).unwrap_or_default()
        };
        out.lines().filter(|l| l.starts_with("search ")).map(count).collect()
    };
    assert_eq!(buckets("inter-kernel"), buckets("intra-kernel"), "fixed delta: the same buckets");
}
