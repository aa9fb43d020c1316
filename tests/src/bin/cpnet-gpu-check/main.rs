//! `cpnet-gpu-check`: the operation matrix of `cpnet-check` for GPU PEs.
//! Each scenario is a CUDA kernel (NVRTC; sources in `cpnet_tests::gpu`)
//! run on every PE with several work-groups (CUDA blocks); the kernel
//! records every failed check in a per-block log, and the host checks the
//! logs and every byte the kernel moved against exact expected values.
//! Any mismatch ends the PE with status 1 and a message naming PE,
//! work-group, the kernel source line or the data, and both values.
//!
//! ```text
//! cpnet-run -n 2 -- cpnet-gpu-check ops
//! cpnet-run -n 2 -- cpnet-gpu-check amo --iters 50
//! CPNET_WAIT_TIMEOUT=1 cpnet-run -n 2 -- cpnet-gpu-check stuck-wait
//! ```
//!
//! Without a GPU it prints `SKIP: <why>` and exits 0 (1 with
//! `CPNET_REQUIRE_GPU=1`).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, Subcommand};
use cpnet::GpuPe;
use cpnet::device::cpu::SymAddr;
use cpnet::device::layout::{Cmp, ErrorCode};
use cpnet::device::layout::TeamDesc;
use cpnet::gpu::GpuError;
use cpnet_tests::check_eq;
use cpnet_tests::gpu::{self, LOG_WORDS};
use cpnet_tests::gpu_on_stream_bench::{self, a2a_sizes, print_a2a};
use cpnet_tests::heap_words::{bytes_u64s, read_u64s, u64s_bytes};
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

mod coll;
mod faults;

#[derive(Parser)]
#[command(about = "cpnet GPU multi-PE checks (run under cpnet-run)")]
struct Cli {
    /// Work-groups (CUDA blocks) per PE.
    #[arg(long, default_value_t = 4)]
    wgs: u32,
    /// Threads per work-group.
    #[arg(long, default_value_t = 128)]
    threads: u32,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// putmem/getmem (blocking, nbi) of sizes 1 B..1 MiB, typed p/g/put/get
    /// for every RMA type, put-with-signal SET/ADD: to the right neighbour
    /// and to this PE.
    Ops,
    /// Every AMO on int32/int64/uint32/uint64 under contention from every
    /// work-group of every PE on PE 0 and PE n-1; exact results.
    Amo {
        /// Iterations per work-group.
        #[arg(long, default_value_t = 50)]
        iters: u32,
    },
    /// put, fence, flag; and a put-with-signal pipeline: data visible with
    /// its flag or signal.
    Order {
        /// Rounds of put + fence + flag.
        #[arg(long, default_value_t = 100)]
        rounds: u32,
        /// Messages of the put-with-signal pipeline.
        #[arg(long, default_value_t = 200)]
        msgs: u32,
    },
    /// cpnet_barrier_all from a kernel in a loop, with puts before each.
    Barrier {
        /// Rounds.
        #[arg(long, default_value_t = 50)]
        rounds: u32,
    },
    /// Bad PE, address past the heap, misaligned AMO: each call returns its
    /// CPNET_E_* code, the proxy reports it, nothing is written.
    BadInput,
    /// A wait nobody satisfies must time out with a report naming PE,
    /// work-group, address, expected and found value (set
    /// CPNET_WAIT_TIMEOUT small).
    StuckWait,
    /// The device team collectives (team.cuh) on CPNET_TEAM_WORLD, the node
    /// team and a strided split: every reduction type and operator, the
    /// data collectives and their typed forms, barrier and sync, checked
    /// element by element; then the bad-input calls (CPNET_E_BAD_TEAM,
    /// CPNET_E_BAD_PE, -1 from the queries, nothing written). One block per
    /// PE (a team's collectives take one work-group per PE).
    Collectives,
    /// Device team collectives' latency on CPNET_TEAM_WORLD, averaged over
    /// `iters` calls inside one kernel: barrier, sync, and float sum
    /// reduce-to-all of 8 B to 8 KiB. One block per PE (built with
    /// `__launch_bounds__` of `--threads`, so up to 1024 fit); PE 0 prints.
    CollBench {
        /// Calls per measurement.
        #[arg(long, default_value_t = 2000)]
        iters: u32,
        /// Build with CPNET_TEAM_SMALL_MAX_BYTES set to this (bytes; 0: no
        /// reduction takes the short path), for a side-by-side run.
        #[arg(long)]
        small_max: Option<u64>,
    },
    /// Device alltoall latency on CPNET_TEAM_WORLD (cpnet_alltoallmem, one
    /// block per PE): `min` (1 KiB) to `max` bytes per pair, x4, against NCCL's
    /// all_to_all_single of the same bytes (scripts/nccl_alltoall.py).
    /// PE 0 prints. The heap must hold 2 x n_pes x max bytes
    /// (CPNET_HEAP_SIZE).
    A2aBench {
        /// Calls per size up to 1 MiB (fewer above: about 1 GiB moved per size).
        #[arg(long, default_value_t = 200)]
        iters: u64,
        /// The largest size per pair, bytes (K, M suffixes).
        #[arg(long, default_value = "16M", value_parser = parse_size)]
        max: u64,
        /// The smallest size per pair, bytes (K, M suffixes): a run of one
        /// size, for the staged transport's timing report
        /// (`RUST_LOG=cpnet_proxy::staged=debug`) of that size alone.
        #[arg(long, default_value = "1K", value_parser = parse_size)]
        min: u64,
        /// Time the host-side form instead (`GpuPe::team_alltoall_on_stream`,
        /// launched back to back on the PE's stream, the host's clock around
        /// them and the synchronize: NCCL's measurement): one block below
        /// 512 KiB per pair, a grid from there where the heaps are mapped.
        #[arg(long)]
        on_stream: bool,
    },
    /// Float sum reduce to all through `GpuPe::team_reduce_on_stream` on
    /// CPNET_TEAM_WORLD, 4 KiB to `max` bytes x4, launched back to back on
    /// the PE's stream and timed on the host as scripts/nccl_allreduce.py
    /// times NCCL's allreduce (one block below
    /// cpnet::gpu::REDUCE_GRID_MIN_BYTES, a grid from there where heaps are
    /// mapped); the last result checked element by element. PE 0 prints.
    /// The heap must hold 2 x `max` bytes (CPNET_HEAP_SIZE); `max` with
    /// `--in-place`.
    ReduceBench {
        /// Calls per size up to 1 MiB (fewer above: about 1 GiB moved per size).
        #[arg(long, default_value_t = 200)]
        iters: u64,
        /// The largest array, bytes (K, M suffixes).
        #[arg(long, default_value = "16M", value_parser = parse_size)]
        max: u64,
        /// The smallest array, bytes (K, M suffixes).
        #[arg(long, default_value = "4K", value_parser = parse_size)]
        min: u64,
        /// `dest == source`, as NCCL's allreduce through PyTorch runs
        /// (scripts/nccl_allreduce.py): each call reduces the last one's
        /// result; the check reinitializes the array and runs one more.
        #[arg(long)]
        in_place: bool,
    },
    /// The host-side `_on_stream` team collectives (GpuPe::team_*_on_stream)
    /// on the world team and an even-PE split, every element checked.
    OnStream,
    /// The floor under the staged transport's copies: a copy between the
    /// device and pinned host memory and its polled event, alone and with
    /// a signal after it (`cpnet_tests::copy_floor`). PE 0 prints; run
    /// with one PE.
    CopyFloor {
        /// Rounds per size.
        #[arg(long, default_value_t = 200)]
        iters: u32,
        /// The smallest copy, bytes (K, M suffixes).
        #[arg(long, default_value = "16K", value_parser = parse_size)]
        min: u64,
        /// The largest copy, bytes (K, M suffixes).
        #[arg(long, default_value = "4M", value_parser = parse_size)]
        max: u64,
    },
}

/// A byte count with an optional K/M/G suffix (the runtime's own parser,
/// as for `CPNET_HEAP_SIZE`); for clap.
fn parse_size(s: &str) -> Result<u64, String> {
    cpnet::env::parse_bytes(s).ok_or_else(|| format!("'{s}' is not a byte count (e.g. 64K, 16M)"))
}

/// One line to stderr in one write (PEs share the terminal).
fn say(line: String) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let pe = match GpuPe::init() {
        Ok(pe) => pe,
        Err(cpnet::pe::Error::Gpu(e @ (GpuError::NoDriver | GpuError::NoDevice { .. }))) => {
            println!("SKIP: {e}");
            if std::env::var("CPNET_REQUIRE_GPU").as_deref() == Ok("1") {
                say("cpnet-gpu-check: CPNET_REQUIRE_GPU=1 but there is no usable GPU".into());
                return ExitCode::from(1);
            }
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            say(format!("cpnet-gpu-check: init failed: {e}"));
            return ExitCode::from(2);
        }
    };
    let me = pe.my_pe();
    let t = Instant::now();
    let (wgs, threads) = (cli.wgs, cli.threads);
    let r = match cli.scenario {
        Scenario::Ops => ops(&pe, wgs, threads),
        Scenario::Amo { iters } => amo(&pe, wgs, threads, iters),
        Scenario::Order { rounds, msgs } => order(&pe, wgs, threads, rounds, msgs),
        Scenario::Barrier { rounds } => barrier(&pe, threads, rounds),
        Scenario::BadInput => faults::bad_input(&pe, wgs, threads),
        Scenario::StuckWait => faults::stuck_wait(&pe, threads),
        Scenario::Collectives => coll::collectives(&pe, threads),
        Scenario::CollBench { iters, small_max } => coll::coll_bench(&pe, threads, iters, small_max),
        Scenario::A2aBench { iters, max, min, on_stream: false } => coll::a2a_bench(&pe, threads, min, iters, max),
        Scenario::A2aBench { iters, max, min, on_stream: true } => gpu_on_stream_bench::alltoall(&pe, min, iters, max),
        Scenario::ReduceBench { iters, max, min, in_place } => gpu_on_stream_bench::reduce(&pe, iters, min, max, in_place),
        Scenario::OnStream => cpnet_tests::gpu_on_stream::on_stream(&pe),
        Scenario::CopyFloor { iters, min, max } => cpnet_tests::copy_floor::copy_floor(me, pe.cuda(), min, max, iters),
    };
    match r.and_then(|()| pe.finalize().context("finalize")) {
        Ok(()) => {
            println!("PE {me}: OK ({:.3} s)", t.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(format!("cpnet-gpu-check: PE {me}: FAILED: {e:#}"));
            ExitCode::from(1)
        }
    }
}

/// A scenario's kernel, built for this GPU, with its full source (failure
/// logs quote its lines).
struct Kernel {
    src: String,
    func: CudaFunction,
}

/// Build scenario `scenario`'s kernel (`func` in `kernel`, see
/// `cpnet_tests::gpu::KERNELS`).
fn build(pe: &GpuPe, scenario: &str, func: &str, kernel: &str) -> Result<Kernel> {
    build_with(pe, scenario, func, "", kernel)
}

/// [`build`] with `defines` (`#define` lines) before the prelude, where the
/// cpnet headers read them when included.
fn build_with(pe: &GpuPe, scenario: &str, func: &str, defines: &str, kernel: &str) -> Result<Kernel> {
    let src = format!("{defines}{}", gpu::source(kernel));
    let module = pe.build_module(&format!("{scenario}.cu"), &src)?;
    let func = module.load_function(func).with_context(|| format!("load kernel {func}"))?;
    Ok(Kernel { src, func })
}

fn grid(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// `len` bytes of the local heap at `a`.
fn read(pe: &GpuPe, a: SymAddr, len: u64) -> Result<Vec<u8>> {
    let mut v = vec![0u8; len as usize];
    pe.read_heap(a, &mut v)?;
    Ok(v)
}


/// The blocks' failure logs at `logs`, checked.
fn check_logs(pe: &GpuPe, k: &Kernel, logs: SymAddr, blocks: u32) -> Result<()> {
    let words = read_u64s(pe, logs, blocks as usize * LOG_WORDS)?;
    gpu::check_logs(&words, blocks as usize, &k.src, &format!("PE {}", pe.my_pe())).map_err(anyhow::Error::msg)
}

/// Expected contents of a heap region, compared segment by segment so a
/// mismatch names what the bytes were for.
struct Expect {
    want: Vec<u8>,
    segs: Vec<(usize, usize, String)>,
}

impl Expect {
    fn zeros(len: u64) -> Expect {
        Expect { want: vec![0; len as usize], segs: Vec::new() }
    }

    /// `bytes` at `at`, labelled `what`; `len` bytes from `at` (the
    /// segment, including zero padding after `bytes`) are checked together.
    fn put(&mut self, at: u64, len: u64, bytes: &[u8], what: String) {
        let at = at as usize;
        self.want[at..at + bytes.len()].copy_from_slice(bytes);
        self.segs.push((at, len as usize, what));
    }

    /// Compare with `got`: one message per differing segment, and one for
    /// differences outside every segment (bytes that must stay zero).
    fn check(&self, got: &[u8], region: &str, fails: &mut Vec<String>) {
        let mut covered = vec![false; self.want.len()];
        for (at, len, what) in &self.segs {
            covered[*at..at + len].iter_mut().for_each(|c| *c = true);
            if let Err(e) = check_eq(&got[*at..at + len], &self.want[*at..at + len], || format!("{region}: {what}")) {
                fails.push(e);
            }
        }
        if let Some(i) = (0..got.len()).find(|&i| !covered[i] && got[i] != self.want[i]) {
            fails.push(format!("{region}: byte {i} (outside every checked segment) is {:#04x}, expected {:#04x}", got[i], self.want[i]));
        }
    }
}

/// `Ok` if nothing failed; else every message (at most 40).
fn verdict(fails: Vec<String>) -> Result<()> {
    if fails.is_empty() {
        return Ok(());
    }
    let n = fails.len();
    let mut msg: Vec<String> = fails.into_iter().take(40).collect();
    if n > 40 {
        msg.push(format!("... and {} more", n - 40));
    }
    bail!("{} check(s) failed:\n{}", n, msg.join("\n"))
}

/// Every RMA and signal operation, from every block to the right neighbour
/// and to this PE, checked in the kernel and byte for byte here.
fn ops(pe: &GpuPe, wgs: u32, threads: u32) -> Result<()> {
    use gpu::{PG_LANE, SIG_LANE};
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let (nb, nn) = (u64::from(wgs), n as u64);
    let left = (me + n - 1) % n;
    let k = build(pe, "ops", "ops", gpu::OPS)?;
    let (sizes, offs, lane) = gpu::ops_cases();
    let ncases = sizes.len() as u32;
    let src = pe.shmalloc(nb * lane)?;
    let dst = pe.shmalloc(nn * nb * lane)?;
    let back = pe.shmalloc(2 * nb * lane)?;
    let table = pe.shmalloc(16 * u64::from(ncases))?;
    let pg = pe.shmalloc(nn * nb * PG_LANE)?;
    let pgback = pe.shmalloc(2 * nb * PG_LANE)?;
    let pgsrc = pe.shmalloc(nb * PG_LANE)?;
    let typeinfo = pe.shmalloc(nb * 32 * 8)?;
    let sigsrc = pe.shmalloc(nb * SIG_LANE)?;
    let sigdata = pe.shmalloc(2 * nn * nb * SIG_LANE)?;
    let sigs = pe.shmalloc(2 * nn * nb * 16)?;
    let logs = pe.shmalloc(nb * LOG_WORDS as u64 * 8)?;
    pe.write_heap(table, &u64s_bytes(&[sizes.clone(), offs.clone()].concat()))?;
    pe.barrier_all()?;

    let h = pe.handle();
    let p = |a: SymAddr| pe.dev_ptr(a);
    let (p_src, p_dst, p_back, p_sizes, p_offs) =
        (p(src), p(dst), p(back), p(table), p(SymAddr(table.0 + 8 * u64::from(ncases))));
    let (p_pg, p_pgback, p_pgsrc, p_ti) = (p(pg), p(pgback), p(pgsrc), p(typeinfo));
    let (p_sigsrc, p_sigdata, p_sigs, p_logs) = (p(sigsrc), p(sigdata), p(sigs), p(logs));
    let mut b = pe.stream().launch_builder(&k.func);
    b.arg(&h).arg(&p_src).arg(&p_dst).arg(&p_back).arg(&p_sizes).arg(&p_offs).arg(&ncases).arg(&lane);
    b.arg(&p_pg).arg(&p_pgback).arg(&p_pgsrc).arg(&p_ti).arg(&p_sigsrc).arg(&p_sigdata).arg(&p_sigs).arg(&p_logs);
    // SAFETY: the arguments match `ops` in cpnet_tests::gpu::OPS (handle by
    // value, device pointers into this PE's heap sized as the kernel's
    // layout comment says, u32 ncases, u64 lane); the heap outlives the
    // kernel (synchronized below).
    unsafe { b.launch(grid(wgs, threads)) }.context("launch ops")?;
    pe.synchronize()?;
    pe.barrier_all()?; // every PE's puts to us are complete

    let mut fails = Vec::new();
    if let Err(e) = check_logs(pe, &k, logs, wgs) {
        fails.push(e.to_string());
    }
    let ti = read_u64s(pe, typeinfo, wgs as usize * 32)?;
    for w in 0..wgs as usize {
        let t = &ti[w * 32..w * 32 + 32];
        let want: Vec<u64> = gpu::RMA_TYPES.iter().map(|&(_, s, _)| s as u64).collect();
        if t[31] != want.len() as u64 || t[..want.len()] != want[..] {
            fails.push(format!(
                "PE {me} block {w}: CPNET_RMA_TYPES has {} types of sizes {:?}; cpnet_tests::gpu::RMA_TYPES expects {} of {want:?}",
                t[31],
                &t[..(t[31] as usize).min(31)],
                want.len()
            ));
        }
    }
    let mode = |c: usize| if c.is_multiple_of(2) { "blocking" } else { "nbi" };
    let case_seg = |e: &mut Expect, base: u64, pe_: u32, w: u32, c: usize, what: &str| {
        let len = offs.get(c + 1).copied().unwrap_or(lane) - offs[c];
        let what = format!("{what} case {c} ({} B, {})", sizes[c], mode(c));
        e.put(base + offs[c], len, &gpu::pattern(pe_, w, c as u32, sizes[c]), what);
    };
    // Where our left neighbour's and our own puts landed.
    let got = read(pe, dst, nn * nb * lane)?;
    let mut e = Expect::zeros(nn * nb * lane);
    for s in [me, left] {
        for w in 0..wgs {
            for c in 0..sizes.len() {
                case_seg(&mut e, (s as u64 * nb + u64::from(w)) * lane, s as u32, w, c, &format!("putmem from PE {s} block {w}"));
            }
        }
    }
    e.check(&got, &format!("PE {me}: putmem destinations"), &mut fails);
    // What each block got back from each target.
    let got = read(pe, back, 2 * nb * lane)?;
    let mut e = Expect::zeros(2 * nb * lane);
    for w in 0..wgs {
        for t in 0..2u64 {
            let target = if t == 0 { (me + 1) % n } else { me };
            for c in 0..sizes.len() {
                case_seg(&mut e, (2 * u64::from(w) + t) * lane, me as u32, w, c, &format!("block {w} getmem from PE {target}"));
            }
        }
    }
    e.check(&got, &format!("PE {me}: getmem results"), &mut fails);
    // Typed p and put slots here (from us and from the left), and the typed gets.
    let typed = |e: &mut Expect, base: u64, s: u32, w: u32, with_p: bool, what: &str| {
        for (k, (name, size, _)) in gpu::RMA_TYPES.iter().enumerate() {
            let k64 = k as u64;
            if with_p {
                e.put(base + 8 * k64, 8, &gpu::rma_value_bytes(k, s, w, 3), format!("{what} {name}_p"));
            }
            let three: Vec<u8> = (0..3).flat_map(|j| gpu::rma_value_bytes(k, s, w, j)).collect();
            assert_eq!(three.len(), 3 * size);
            e.put(base + 256 + 32 * k64, 32, &three, format!("{what} {name}_put/get (3 elements, blocking)"));
            e.put(base + 1280 + 32 * k64, 32, &three, format!("{what} {name}_put_nbi/get_nbi (3 elements)"));
        }
    };
    let got = read(pe, pg, nn * nb * PG_LANE)?;
    let mut e = Expect::zeros(nn * nb * PG_LANE);
    for s in [me, left] {
        for w in 0..wgs {
            typed(&mut e, (s as u64 * nb + u64::from(w)) * PG_LANE, s as u32, w, true, &format!("from PE {s} block {w}:"));
        }
    }
    e.check(&got, &format!("PE {me}: typed puts"), &mut fails);
    let got = read(pe, pgback, 2 * nb * PG_LANE)?;
    let mut e = Expect::zeros(2 * nb * PG_LANE);
    for w in 0..wgs {
        for t in 0..2u64 {
            typed(&mut e, (2 * u64::from(w) + t) * PG_LANE, me as u32, w, false, &format!("block {w} target index {t}:"));
        }
    }
    e.check(&got, &format!("PE {me}: typed gets"), &mut fails);
    // Put-with-signal data and signal words here.
    let got = read(pe, sigdata, 2 * nn * nb * SIG_LANE)?;
    let mut e = Expect::zeros(2 * nn * nb * SIG_LANE);
    let gsig = read_u64s(pe, sigs, (4 * nn * nb) as usize)?;
    let mut want_sig = vec![0u64; (4 * nn * nb) as usize];
    for t in 0..2u64 {
        let from = if t == 0 { left } else { me };
        for w in 0..wgs {
            let li = (t * nn + from as u64) * nb + u64::from(w);
            for &(off, len, c) in gpu::SIG_PARTS {
                let what = format!("put-with-signal from PE {from} block {w} (target index {t}), {len} B at +{off}");
                e.put(li * SIG_LANE + off, len, &gpu::pattern(from as u32, w, c, len), what);
            }
            want_sig[2 * li as usize] = gpu::SIG_TOTAL;
            want_sig[2 * li as usize + 1] = gpu::SIG2;
        }
    }
    e.check(&got, &format!("PE {me}: put-with-signal data"), &mut fails);
    for (i, (g, w)) in gsig.iter().zip(&want_sig).enumerate() {
        if g != w {
            fails.push(format!("PE {me}: signal word {i} (lane {}, word {}) is {g:#x}, expected {w:#x}", i / 2, i % 2));
        }
    }
    verdict(fails)
}

/// Contention AMOs on PE 0 and PE n-1 from every block of every PE; exact
/// final values, distinct fetch_add results, compare_swap successes
/// matching the count, swapped values conserved.
fn amo(pe: &GpuPe, wgs: u32, threads: u32, iters: u32) -> Result<()> {
    use gpu::{AMO_PRIV_SLOTS, AMO_WORDS};
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let (nb, ids) = (u64::from(wgs), n as u64 * u64::from(wgs));
    ensure!(ids <= 32, "amo: at most 32 work-groups in all (one bit each in 32-bit words); have {n} PEs x {wgs}");
    ensure!(u64::from(iters) < 1 << 16, "amo: --iters must be below 65536");
    let k = build(pe, "amo", "amo", gpu::AMO)?;
    let words = pe.shmalloc(4 * AMO_WORDS as u64 * 8)?;
    let privs = pe.shmalloc(ids * AMO_PRIV_SLOTS as u64 * 8)?;
    let per = nb * u64::from(iters); // values per (target, type, op) and PE
    let fetched = pe.shmalloc(2 * 4 * 3 * per * 8)?;
    let cas_ok = pe.shmalloc(2 * 4 * nb * 8)?;
    let logs = pe.shmalloc(nb * LOG_WORDS as u64 * 8)?;
    let widths = [4usize, 8, 4, 8]; // int32, int64, uint32, uint64
    let mut init = vec![0u8; 4 * AMO_WORDS * 8];
    for (ty, &wd) in widths.iter().enumerate() {
        for word in [9, 10] {
            let at = (ty * AMO_WORDS + word) * 8;
            init[at..at + wd].fill(0xff);
        }
    }
    pe.write_heap(words, &init)?;
    pe.barrier_all()?;

    let h = pe.handle();
    let (p_words, p_priv, p_fetched, p_cas, p_logs) =
        (pe.dev_ptr(words), pe.dev_ptr(privs), pe.dev_ptr(fetched), pe.dev_ptr(cas_ok), pe.dev_ptr(logs));
    let mut b = pe.stream().launch_builder(&k.func);
    b.arg(&h).arg(&p_words).arg(&p_priv).arg(&p_fetched).arg(&p_cas).arg(&p_logs).arg(&iters);
    // SAFETY: the arguments match `amo` in cpnet_tests::gpu::AMO; every
    // pointer is into this PE's heap, sized for the layout the kernel
    // documents; synchronized below.
    unsafe { b.launch(grid(wgs, threads)) }.context("launch amo")?;
    pe.synchronize()?;
    pe.barrier_all()?; // every PE's AMOs on our words are complete

    let mut fails = Vec::new();
    if let Err(e) = check_logs(pe, &k, logs, wgs) {
        fails.push(e.to_string());
    }
    let all_f: Vec<Vec<u64>> = pe.allgather_bytes(&read(pe, fetched, 2 * 4 * 3 * per * 8)?)?.iter().map(|b| bytes_u64s(b)).collect();
    let all_c: Vec<Vec<u64>> = pe.allgather_bytes(&read(pe, cas_ok, 2 * 4 * nb * 8)?)?.iter().map(|b| bytes_u64s(b)).collect();
    let targets: Vec<i32> = if n > 1 { vec![0, n - 1] } else { vec![0] };
    let got = read(pe, words, 4 * AMO_WORDS as u64 * 8)?;
    let total = ids * u64::from(iters);
    let id_mask = if ids == 64 { u64::MAX } else { (1u64 << ids) - 1 };
    let names = ["int32", "int64", "uint32", "uint64"];
    for (ti, &t) in targets.iter().enumerate() {
        if t != me {
            continue;
        }
        for (ty, &wd) in widths.iter().enumerate() {
            let mask = if wd == 4 { 0xffff_ffffu64 } else { u64::MAX };
            let word = |i: usize| u64::from_le_bytes(got[(ty * AMO_WORDS + i) * 8..][..8].try_into().expect("8 bytes"));
            let name = names[ty];
            for i in 0..AMO_WORDS {
                if word(i) & !mask != 0 {
                    fails.push(format!("PE {me}: {name} word {i}: bytes past the {wd}-byte word were written: {:#x}", word(i)));
                }
            }
            let fetched_of = |op: u64| -> Vec<u64> {
                let mut v = Vec::new();
                for f in &all_f {
                    let base = ((ti as u64 * 4 + ty as u64) * 3 + op) * per;
                    v.extend_from_slice(&f[base as usize..(base + per) as usize]);
                }
                v
            };
            let cas_sum: u64 = all_c.iter().map(|c| c[((ti * 4 + ty) * wgs as usize)..][..wgs as usize].iter().sum::<u64>()).sum();
            let xor_want = if iters % 2 == 1 { id_mask } else { 0 };
            let checks: [(&str, usize, u64); 12] = [
                ("fetch_add 1", 0, total),
                ("fetch_inc", 1, total),
                ("add 3", 2, total.wrapping_mul(3) & mask),
                ("inc", 3, total),
                ("add -2", 4, total.wrapping_mul(2).wrapping_neg() & mask),
                ("compare_swap increment loop", 5, total),
                ("single compare_swap attempts", 6, cas_sum),
                ("or", 7, id_mask),
                ("fetch_or", 8, id_mask),
                ("and", 9, mask & !id_mask),
                ("fetch_and", 10, mask & !id_mask),
                ("xor", 11, xor_want),
            ];
            for (what, i, want) in checks {
                let g = word(i) & mask;
                if g != want {
                    fails.push(format!("PE {me}: {name} {what} (word {i}) after contention: {g:#x}, expected {want:#x}"));
                }
            }
            if word(12) & mask != xor_want {
                fails.push(format!("PE {me}: {name} fetch_xor (word 12): {:#x}, expected {xor_want:#x}", word(12) & mask));
            }
            if cas_sum == 0 {
                fails.push(format!("PE {me}: {name}: no single compare_swap attempt succeeded"));
            }
            for (op, what) in [(0, "fetch_add"), (1, "fetch_inc")] {
                let mut v = fetched_of(op);
                v.sort_unstable();
                if v.iter().copied().ne(0..total) {
                    let first = v.iter().zip(0..).find(|(a, b)| *a != b).map(|(a, b)| (*a, b));
                    fails.push(format!(
                        "PE {me}: {name} {what}: the {total} fetched values are not 0..{total} each once (first difference: {first:?} as (got, expected))"
                    ));
                }
            }
            let mut out = fetched_of(2);
            out.push(word(13) & mask);
            out.sort_unstable();
            let mut inn: Vec<u64> = (0..ids).flat_map(|id| (1..=u64::from(iters)).map(move |i| (id << 16) | i)).collect();
            inn.push(0);
            inn.sort_unstable();
            if out != inn {
                fails.push(format!("PE {me}: {name} swap: the values swapped out plus the final one are not the values swapped in plus the initial 0"));
            }
        }
    }
    if n > 2 && !targets.contains(&me) && got != init {
        fails.push(format!("PE {me}: contention words of a PE nobody targets changed"));
    }
    verdict(fails)
}

/// put + fence + flag rounds and a put-with-signal pipeline; the kernel
/// checks each message when its flag or signal shows.
fn order(pe: &GpuPe, wgs: u32, threads: u32, rounds: u32, msgs: u32) -> Result<()> {
    use gpu::{ORDER_DATA_STRIDE, ORDER_SLOT_BYTES, ORDER_SLOTS, ORDER_WORDS};
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let (nb, nn) = (u64::from(wgs), n as u64);
    let k = build(pe, "order", "order", gpu::ORDER)?;
    let data = pe.shmalloc(nn * nb * ORDER_DATA_STRIDE)?;
    let words = pe.shmalloc(nn * nb * ORDER_WORDS * 8)?;
    let pipe = pe.shmalloc(nn * nb * ORDER_SLOTS * ORDER_SLOT_BYTES)?;
    let srcb = pe.shmalloc(nb * (ORDER_DATA_STRIDE + ORDER_SLOTS * ORDER_SLOT_BYTES))?;
    let logs = pe.shmalloc(nb * LOG_WORDS as u64 * 8)?;
    pe.barrier_all()?;

    let h = pe.handle();
    let (p_data, p_words, p_pipe, p_srcb, p_logs) =
        (pe.dev_ptr(data), pe.dev_ptr(words), pe.dev_ptr(pipe), pe.dev_ptr(srcb), pe.dev_ptr(logs));
    let mut b = pe.stream().launch_builder(&k.func);
    b.arg(&h).arg(&p_data).arg(&p_words).arg(&p_pipe).arg(&p_srcb).arg(&p_logs).arg(&rounds).arg(&msgs);
    // SAFETY: the arguments match `order` in cpnet_tests::gpu::ORDER; the
    // regions are sized as its layout comment says; synchronized below.
    unsafe { b.launch(grid(wgs, threads)) }.context("launch order")?;
    pe.synchronize()?;
    pe.barrier_all()?;

    let mut fails = Vec::new();
    if let Err(e) = check_logs(pe, &k, logs, wgs) {
        fails.push(e.to_string());
    }
    let (left, right) = ((me + n - 1) % n, (me + 1) % n);
    let wv = read_u64s(pe, words, (nn * nb * ORDER_WORDS) as usize)?;
    for w in 0..nb {
        let at = |pe_: i32, i: u64| wv[((pe_ as u64 * nb + w) * ORDER_WORDS + i) as usize];
        let finals = [
            ("inline word from the left", at(left, 0), u64::from(rounds)),
            ("flag from the left", at(left, 1), u64::from(rounds)),
            ("acks from the right", at(right, 2), u64::from(rounds)),
            ("pipeline acks from the right", at(right, 3), u64::from(msgs)),
            ("AMO counter from the left", at(left, 4), u64::from(rounds)),
            ("AMO acks from the right", at(right, 6), u64::from(rounds)),
            ("burst flag from the left", at(left, gpu::ORDER_BURST_FLAG), 1),
        ];
        for (what, got, want) in finals {
            if got != want {
                fails.push(format!("PE {me} block {w}: final {what}: {got}, expected {want}"));
            }
        }
    }
    verdict(fails)
}

/// cpnet_barrier_all from one block per PE in a loop, with a word, bytes
/// and an atomic add to every PE before each barrier.
fn barrier(pe: &GpuPe, threads: u32, rounds: u32) -> Result<()> {
    use gpu::BARRIER_BYTES;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let nn = n as u64;
    let k = build(pe, "barrier", "barrier", gpu::BARRIER)?;
    let slots = pe.shmalloc(8 * nn)?;
    let ctr = pe.shmalloc(8)?;
    let data = pe.shmalloc(nn * BARRIER_BYTES)?;
    let bsrc = pe.shmalloc(BARRIER_BYTES)?;
    let logs = pe.shmalloc(LOG_WORDS as u64 * 8)?;
    pe.barrier_all()?;

    let h = pe.handle();
    let (p_slots, p_ctr, p_data, p_bsrc, p_logs) =
        (pe.dev_ptr(slots), pe.dev_ptr(ctr), pe.dev_ptr(data), pe.dev_ptr(bsrc), pe.dev_ptr(logs));
    let mut b = pe.stream().launch_builder(&k.func);
    b.arg(&h).arg(&p_slots).arg(&p_ctr).arg(&p_data).arg(&p_bsrc).arg(&p_logs).arg(&rounds);
    // SAFETY: the arguments match `barrier` in cpnet_tests::gpu::BARRIER;
    // one block (the device barrier counts one work-group per PE);
    // synchronized below.
    unsafe { b.launch(grid(1, threads)) }.context("launch barrier")?;
    pe.synchronize()?;
    pe.barrier_all()?;

    let mut fails = Vec::new();
    if let Err(e) = check_logs(pe, &k, logs, 1) {
        fails.push(e.to_string());
    }
    let r = u64::from(rounds);
    let c = read_u64s(pe, ctr, 1)?[0];
    if c != r * nn {
        fails.push(format!("PE {me}: counter {c} after {rounds} rounds, expected {}", r * nn));
    }
    for (s, v) in read_u64s(pe, slots, n as usize)?.into_iter().enumerate() {
        if v != r * 1000 + s as u64 {
            fails.push(format!("PE {me}: word from PE {s}: {v}, expected {}", r * 1000 + s as u64));
        }
    }
    let got = read(pe, data, nn * BARRIER_BYTES)?;
    let mut e = Expect::zeros(nn * BARRIER_BYTES);
    for s in 0..n {
        e.put(s as u64 * BARRIER_BYTES, BARRIER_BYTES, &gpu::pattern(s as u32, 0, rounds, BARRIER_BYTES), format!("round {rounds} bytes from PE {s}"));
    }
    e.check(&got, &format!("PE {me}: barrier data"), &mut fails);
    verdict(fails)
}
