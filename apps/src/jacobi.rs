//! Jacobi 2D: the problem of NVIDIA's multi-gpu-programming-models
//! (`nccl/jacobi.cpp`, `nvshmem/jacobi.cu`), so that the two can be run side
//! by side, with cpnet's communication issued from the work-groups
//! themselves (the Jacobi stencil of the ComP-Net evaluation, §5).
//!
//! # The problem
//!
//! A float grid of `nx` columns by `ny` rows. Columns `0` and `nx - 1` are
//! fixed to `sin(2π·iy/(ny-1))`; the interior starts at zero. Rows `1 ..=
//! ny-2` are the interior; rows `0` and `ny-1` are halos that, after every
//! step, hold copies of rows `ny-2` and `1` (periodic in y). A step computes
//! `a_new = 0.25·(E + W + S + N)` on every interior point, in `f32`, in that
//! order of additions (so every variant and PE count gives bit-identical
//! grids). Every `nccheck` iterations (and every 100th when not `-csv`) it
//! computes the L2 norm of the update, `sqrt(Σ (a_new - a)²)` over all PEs.
//! The loop runs `niter` iterations, or stops early once a norm is at most
//! `1e-8`.
//!
//! The `ny - 2` interior rows are split in contiguous chunks, one per PE,
//! exactly as their code does: `(ny-2)/n` rows for the first
//! `num_ranks_low` PEs, one more for the others ([`Partition`]). A PE holds
//! its chunk plus a halo row above and below (`chunk + 2` rows, allocated
//! as `chunk_high + 2` on every PE so the heap stays symmetric); its top
//! halo is the last row of the PE above (`pe - 1`, wrapping) and its bottom
//! halo the first row of the PE below (`pe + 1`, wrapping).
//!
//! # The CPU variant (the paper's "CPU" configuration of "Intra-Kernel")
//!
//! `-wgs W` persistent work-groups per PE run the whole iteration loop
//! ([`run_cpu`]); work-group `w` owns a contiguous band of the chunk's rows.
//! Each iteration `it` reads buffer `it % 2` and writes buffer `(it+1) % 2`:
//!
//! 1. The work-group owning row 1 waits (`signal_wait_until`, `>= it`) for
//!    the top halo of iteration `it - 1`, computes row 1 first and pushes it
//!    with `putmem_signal_nbi` into the bottom halo row of the PE above, in
//!    the buffer being written, raising that PE's `bottom` signal to `it + 1`
//!    (SET). The work-group owning the last row does the same downwards. The
//!    signal lands only after the row (put-with-signal).
//! 2. Every work-group computes the rest of its rows meanwhile; the interior
//!    work-groups never wait on the network.
//! 3. Every work-group stores its partial sum of squared updates; the team
//!    barrier ([`crate::team::TeamBarrier`], the CPU's grid barrier) closes
//!    the iteration.
//! 4. The norm, reduced across PEs from inside the loop, overlapped by one
//!    iteration (as `nvshmem/jacobi.cu -norm_overlap`): after the barrier of
//!    a check iteration, work-group 0 sums its PE's partials and puts the
//!    `f64` into slot `[parity][my_pe]` of every PE with
//!    `putmem_signal_nbi`, adding 1 to that PE's counter `[parity]`. In the
//!    next iteration, before its barrier, it waits until the counter holds
//!    every PE's contribution, sums the slots in PE order (so every PE gets
//!    the same bits and takes the same decision) and decides whether to stop
//!    after this iteration.
//!
//! Why nothing races:
//!
//! - Halos: a put of iteration `it` into the neighbour's halo of buffer
//!   `B = (it+1) % 2` is issued after this PE saw the neighbour's signal of
//!   iteration `it - 1`, which the neighbour raised after it computed — and
//!   so finished reading — the row next to that halo from `B` at iteration
//!   `it - 1`. Only the work-group that sends a boundary row reads the halo
//!   next to it, so program order covers it.
//! - Put sources: a boundary work-group quiets before every iteration, so
//!   the row it pushed is delivered before it is overwritten two iterations
//!   later.
//! - Norm slots are double-buffered by round parity and reads come before
//!   contributions: work-group 0 reads round `r` before it contributes round
//!   `r + 1`; a PE can contribute round `r + 2` (same parity as `r`) only
//!   after it read round `r + 1` complete, which needs every PE's round
//!   `r + 1` contribution, which each PE made after reading round `r`.
//! - Partials of the work-groups of a PE are double-buffered by iteration
//!   parity and read by work-group 0 between the two barriers that bracket
//!   their next rewrite.
//!
//! # The GPU variants
//!
//! `-variant intra-kernel` (one persistent kernel, the same protocol with a
//! grid barrier for the team barrier) and `-variant inter-kernel` (a
//! compute kernel and a communication kernel per iteration): see [`gpu`].
//!
//! # The single-PE reference
//!
//! PE 0 first runs the problem alone ([`single_pe`]: the same stencil and
//! the same stopping rule on plain memory, with `W` threads, the periodic
//! halo copied locally) for the "1 GPU" time of the report, as their tool
//! runs `single_gpu()`. With `-verify`, PE 0 then fetches every PE's final
//! chunk with `getmem_nbi` and compares it to the reference.
//!
//! # Sizes on a CPU
//!
//! The default 16384² grid (1 GiB per buffer) is sized for GPUs; a CPU
//! core updates a few hundred million points per second, so 16384² × 1000
//! iterations takes minutes per PE. Sensible CPU runs: 1024² to 4096² with
//! 100 to 1000 iterations; tests use 256² (and odd sizes) with 100.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, ensure};
use clap::Parser;
use cpnet::Pe;
use cpnet::device::cpu::{Result as WgResult, SymAddr};
use cpnet::device::layout::{Cmp, SignalOp};

use crate::cli::{Variant, init_pe};
use crate::mem::SymArray;
use crate::team::TeamBarrier;

mod cpu;
pub mod gpu;

pub use cpu::run_cpu;

/// The element type (`real` in their code).
pub type Real = f32;

/// The early-stop tolerance of the norm (`tol` in their code).
pub const TOL: f64 = 1.0e-8;

/// Largest verification transfer, bytes.
const VERIFY_BATCH: usize = 1 << 20;

/// The verification tolerance: the largest difference from the single-PE
/// reference accepted (the arithmetic is the same, so 0 is expected).
pub const VERIFY_TOL: f32 = 1.0e-5;

/// `jacobi`'s flags, spelled as multi-gpu-programming-models spells them
/// (`-nx 1024` and `--nx 1024` both work).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "jacobi",
    about = "Jacobi 2D with halo exchange and norm reduction from inside the work-groups (cpnet; run under cpnet-run)"
)]
pub struct Args {
    /// Columns.
    #[arg(long, default_value_t = 16384)]
    pub nx: usize,
    /// Rows (two of them are halos).
    #[arg(long, default_value_t = 16384)]
    pub ny: usize,
    /// Iterations (fewer if the norm falls below 1e-8).
    #[arg(long, default_value_t = 1000)]
    pub niter: u32,
    /// Compute the norm every this many iterations.
    #[arg(long, default_value_t = 1)]
    pub nccheck: u32,
    /// Print one CSV line instead of the report.
    #[arg(long)]
    pub csv: bool,
    /// Which variant runs the loop.
    #[arg(long, value_enum, default_value_t = Variant::Cpu)]
    pub variant: Variant,
    /// Work-groups per PE, capped at the PE's row count: CPU threads with
    /// the cpu variant (default 2); thread blocks of the GPU variants
    /// (default: as many as fit on the GPU at once).
    #[arg(long)]
    pub wgs: Option<u32>,
    /// Compare every PE's final chunk with the single-PE reference
    /// (max abs diff <= 1e-5) and fail if it differs.
    #[arg(long)]
    pub verify: bool,
    /// Skip PE 0's single-PE (single-GPU) run: the report gives the N-PE
    /// time only. For long runs where only the distributed phase matters
    /// (the peer-death trials of scripts/peer_death.sh kill PEs during it);
    /// not with `-verify`, which needs that run.
    #[arg(long = "skip_single")]
    pub skip_single: bool,
    /// GPU `-variant intra-kernel` (and the single-GPU run): time, on thread
    /// 0 of block 0 and of the last block with `%globaltimer`, the phases of
    /// an iteration (halo wait, boundary rows and their puts, the band, the
    /// norm's collect, the grid barrier, the norm's contribution) and print
    /// each PE's means in µs per iteration. Costs a few timer reads per
    /// iteration.
    #[arg(long)]
    pub phases: bool,
    /// GPU `-variant intra-kernel`: send the boundary rows with
    /// put-with-signal also to neighbours whose heap the kernel reaches
    /// (by default those get LL words: each float and its round in one
    /// 8-byte store, no fence and no signal; see jacobi.cu).
    #[arg(long = "halo-put")]
    pub halo_put: bool,
}

impl Args {
    /// Whether iteration `it` computes the norm (their
    /// `(iter % nccheck) == 0 || (!csv && (iter % 100) == 0)`).
    pub fn is_check(&self, it: u32) -> bool {
        it.is_multiple_of(self.nccheck) || (!self.csv && it.is_multiple_of(100))
    }

    /// Check the sizes for `n_pes` PEs.
    ///
    /// # Errors
    /// A message naming the bad flag.
    pub fn validate(&self, n_pes: i32) -> anyhow::Result<()> {
        ensure!(
            self.nx >= 3,
            "-nx {} : need at least 3 columns (two are fixed boundaries)",
            self.nx
        );
        ensure!(
            self.ny >= 3,
            "-ny {} : need at least 3 rows (two are halos)",
            self.ny
        );
        ensure!(
            self.ny - 2 >= n_pes as usize,
            "-ny {} : {} interior rows cannot be split among {n_pes} PEs (every PE needs a row)",
            self.ny,
            self.ny - 2
        );
        ensure!(self.nccheck >= 1, "-nccheck must be at least 1");
        ensure!(self.wgs != Some(0), "-wgs must be at least 1");
        ensure!(!(self.skip_single && self.verify), "-skip_single and -verify exclude each other (-verify compares with the single-PE run)");
        Ok(())
    }

    /// `-wgs` for the CPU (variant and reference): 2 when not given.
    pub fn cpu_work_groups(&self) -> usize {
        self.wgs.unwrap_or(2).max(1) as usize
    }
}

/// The split of the `ny - 2` interior rows among PEs, as their code does it:
/// the first `num_ranks_low` PEs get `chunk_low` rows, the others one more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Number of PEs.
    pub n_pes: usize,
    /// `(ny - 2) / n_pes`.
    pub chunk_low: usize,
    /// `chunk_low + 1`.
    pub chunk_high: usize,
    /// PEs with `chunk_low` rows.
    pub num_ranks_low: usize,
}

impl Partition {
    /// The split of `ny - 2` rows among `n_pes` PEs (`ny - 2 >= n_pes >= 1`).
    pub fn new(ny: usize, n_pes: usize) -> Partition {
        let chunk_low = (ny - 2) / n_pes;
        let chunk_high = chunk_low + 1;
        let num_ranks_low = n_pes * chunk_low + n_pes - (ny - 2);
        Partition {
            n_pes,
            chunk_low,
            chunk_high,
            num_ranks_low,
        }
    }

    /// Interior rows of `pe`.
    pub fn chunk(&self, pe: usize) -> usize {
        if pe < self.num_ranks_low {
            self.chunk_low
        } else {
            self.chunk_high
        }
    }

    /// Global index of `pe`'s first interior row (`iy_start_global`).
    pub fn iy_start_global(&self, pe: usize) -> usize {
        if pe < self.num_ranks_low {
            pe * self.chunk_low + 1
        } else {
            self.num_ranks_low * self.chunk_low + (pe - self.num_ranks_low) * self.chunk_high + 1
        }
    }
}

/// The fixed value of columns `0` and `nx - 1` in global row `iy`
/// (`sin(2.0 * pi * iy / (ny - 1))` with their float `pi`).
pub fn boundary(iy: usize, ny: usize) -> Real {
    let pi = f64::from(std::f32::consts::PI);
    (2.0 * pi * iy as f64 / (ny - 1) as f64).sin() as Real
}

/// Rows `[start, end)` of work-group `w` of `wgs` among rows `1 ..= rows`
/// (balanced; every work-group gets at least one row when `wgs <= rows`).
pub fn wg_rows(rows: usize, wgs: usize, w: usize) -> (usize, usize) {
    let (q, r) = (rows / wgs, rows % wgs);
    let start = 1 + w * q + w.min(r);
    (start, start + q + usize::from(w < r))
}

/// One stencil row: `out[ix] = 0.25·(row[ix+1] + row[ix-1] + below[ix] +
/// above[ix])` for `ix` in `1 .. nx-1`; returns `Σ (out - row)²` when `norm`.
pub fn stencil_row(
    above: &[Real],
    row: &[Real],
    below: &[Real],
    out: &mut [Real],
    norm: bool,
) -> f64 {
    let nx = row.len();
    let m = nx - 2;
    let (e, w, c) = (&row[2..], &row[..m], &row[1..nx - 1]);
    let (s, n, o) = (&below[1..nx - 1], &above[1..nx - 1], &mut out[1..nx - 1]);
    let (e, w, c, s, n, o) = (&e[..m], &w[..m], &c[..m], &s[..m], &n[..m], &mut o[..m]);
    let mut sum = 0.0f64;
    if norm {
        for i in 0..m {
            let v = 0.25 * (e[i] + w[i] + s[i] + n[i]);
            o[i] = v;
            let r = v - c[i];
            sum += f64::from(r * r);
        }
    } else {
        for i in 0..m {
            o[i] = 0.25 * (e[i] + w[i] + s[i] + n[i]);
        }
    }
    sum
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Solution {
    /// Iterations run.
    pub iters: u32,
    /// `(iteration, norm)` of every norm computed.
    pub norms: Vec<(u32, f64)>,
    /// Seconds the loop took.
    pub secs: f64,
}

/// A raw grid shared by the reference's threads.
#[derive(Clone, Copy)]
struct RawGrid(*mut Real);
// SAFETY: the reference's threads write disjoint rows of the write buffer
// and read the read buffer, with a team barrier between iterations.
unsafe impl Send for RawGrid {}
// SAFETY: as above.
unsafe impl Sync for RawGrid {}

/// The problem on one PE without communication: `wgs` threads (at most
/// `ny - 2`), the periodic halo copied in memory, the same arithmetic and
/// stopping rule as [`run_cpu`]. Returns the final `ny × nx` grid.
pub fn single_pe(args: &Args) -> (Vec<Real>, Solution) {
    let (nx, ny) = (args.nx, args.ny);
    let mut bufs = [vec![0.0 as Real; nx * ny], vec![0.0 as Real; nx * ny]];
    for b in &mut bufs {
        for iy in 0..ny {
            let y0 = boundary(iy, ny);
            b[iy * nx] = y0;
            b[iy * nx + nx - 1] = y0;
        }
    }
    let wgs = args.cpu_work_groups().min(ny - 2);
    let team = TeamBarrier::new(wgs);
    let partials: Vec<[AtomicU64; 3]> = (0..wgs).map(|_| Default::default()).collect();
    let norms = Mutex::new(Vec::new());
    let iters = AtomicU32::new(args.niter);
    let stopped = AtomicBool::new(false);
    let raw = [RawGrid(bufs[0].as_mut_ptr()), RawGrid(bufs[1].as_mut_ptr())];
    let sum_of = |slot: usize| -> f64 {
        partials
            .iter()
            .map(|p| f64::from_bits(p[slot].load(Ordering::Relaxed)))
            .sum()
    };
    let t = Instant::now();
    std::thread::scope(|s| {
        for w in 0..wgs {
            let (team, partials, norms, iters, stopped, sum_of) =
                (&team, &partials, &norms, &iters, &stopped, &sum_of);
            s.spawn(move || {
                let (r0, r1) = wg_rows(ny - 2, wgs, w);
                for it in 0..args.niter {
                    let (src, dst) = (raw[it as usize % 2], raw[(it as usize + 1) % 2]);
                    let check = args.is_check(it);
                    let mut partial = 0.0;
                    for r in r0..r1 {
                        // SAFETY: this thread alone writes rows r0..r1 (and
                        // the halo rows it copies them to) of `dst` in this
                        // iteration; everyone only reads `src`; the team
                        // barrier separates iterations.
                        let (above, row, below, out) = unsafe {
                            (
                                std::slice::from_raw_parts(src.0.add((r - 1) * nx), nx),
                                std::slice::from_raw_parts(src.0.add(r * nx), nx),
                                std::slice::from_raw_parts(src.0.add((r + 1) * nx), nx),
                                std::slice::from_raw_parts_mut(dst.0.add(r * nx), nx),
                            )
                        };
                        partial += stencil_row(above, row, below, out, check);
                        // Periodic boundary: row 1 is the bottom halo, row
                        // ny-2 the top halo.
                        // SAFETY: the halo rows of `dst` are written only by
                        // the owner of rows 1 and ny-2, and read next iteration.
                        unsafe {
                            if r == 1 {
                                std::ptr::copy_nonoverlapping(
                                    dst.0.add(nx),
                                    dst.0.add((ny - 1) * nx),
                                    nx,
                                );
                            }
                            if r == ny - 2 {
                                std::ptr::copy_nonoverlapping(dst.0.add((ny - 2) * nx), dst.0, nx);
                            }
                        }
                    }
                    partials[w][it as usize % 3].store(partial.to_bits(), Ordering::Relaxed);
                    team.wait();
                    // The norm of the previous check iteration decides
                    // whether this one was the last (as run_cpu does).
                    if it >= 1 && args.is_check(it - 1) {
                        let norm = sum_of((it as usize - 1) % 3).sqrt();
                        if w == 0 {
                            norms.lock().unwrap().push((it - 1, norm));
                        }
                        if norm <= TOL {
                            if w == 0 {
                                iters.store(it + 1, Ordering::Relaxed);
                                stopped.store(true, Ordering::Relaxed);
                            }
                            break;
                        }
                    }
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    let iters = iters.into_inner();
    let mut norms = norms.into_inner().unwrap();
    if !stopped.into_inner() && iters >= 1 && args.is_check(iters - 1) {
        norms.push((iters - 1, sum_of((iters as usize - 1) % 3).sqrt()));
    }
    let [b0, b1] = bufs;
    let grid = if iters.is_multiple_of(2) { b0 } else { b1 };
    (grid, Solution { iters, norms, secs })
}

/// Offsets in the synchronization block of the symmetric heap.
mod sync_block {
    /// Raised to `it + 1` (SET) by the PE above when its last row of
    /// iteration `it` is in this PE's top halo.
    pub const TOP_SIG: u64 = 0;
    /// Raised by the PE below when its first row is in the bottom halo.
    pub const BOT_SIG: u64 = 64;
    /// Norm contribution counters, one per round parity (own cache lines).
    pub const NORM_CNT: u64 = 128;
    /// This PE's contribution, staged in the heap (two parities). The GPU
    /// variants' norm goes through the library's reduce instead, with its
    /// source here and its destination 8 bytes on (jacobi.cu, jacobi_norm).
    pub const NORM_SRC: u64 = 256;
    /// `[parity][pe]` contributions of every PE, f64 (CPU variant).
    pub const NORM_SLOTS: u64 = 320;

    /// Bytes of the block for `n` PEs.
    pub fn bytes(n: usize) -> u64 {
        NORM_SLOTS + 16 * n as u64
    }
}

/// Bytes of symmetric heap a PE needs: two grids of `chunk_high + 2` rows
/// and the synchronization block, each 64-byte aligned, plus slack.
pub fn heap_need(args: &Args, n_pes: i32) -> u64 {
    let n = n_pes.max(1) as usize;
    let rows = if args.ny >= 3 && args.ny - 2 >= n {
        Partition::new(args.ny, n).chunk_high + 2
    } else {
        3
    };
    let grid = ((args.nx * rows * size_of::<Real>()) as u64).next_multiple_of(64);
    // The GPU variant's LL halo words: [2 parities][2 sides][nx] u64.
    let ll = (args.nx as u64 * 32).next_multiple_of(64);
    2 * grid + sync_block::bytes(n).next_multiple_of(64) + ll + 4096
}

/// PE 0: fetch every PE's final chunk (`getmem_nbi` into `scratch`) and
/// return the largest difference from the reference grid, and where.
fn compare_all(
    pe: &Pe,
    args: &Args,
    reference: &[Real],
    fin: SymArray<Real>,
    scratch: SymArray<Real>,
) -> anyhow::Result<(f32, String)> {
    let nx = args.nx;
    let part = Partition::new(args.ny, pe.n_pes() as usize);
    let mut worst = (0.0f32, String::from("-"));
    for q in 0..pe.n_pes() {
        let rows = part.chunk(q as usize);
        let g0 = part.iy_start_global(q as usize);
        let grid = if q == pe.my_pe() {
            fin
        } else {
            let batch = (VERIFY_BATCH / (nx * size_of::<Real>())).max(1);
            pe.with_ctx(0, |ctx| {
                let mut r = 1;
                while r <= rows {
                    let k = batch.min(rows + 1 - r);
                    ctx.getmem_nbi(
                        scratch.addr(r * nx),
                        fin.addr(r * nx),
                        (k * nx * size_of::<Real>()) as u64,
                        q,
                    )?;
                    r += k;
                }
                ctx.quiet()
            })?;
            scratch
        };
        // SAFETY: the run is over on every PE (barrier) and the gets into
        // `scratch` are complete (quiet); nothing writes either buffer now.
        let got = unsafe { grid.slice(nx, rows * nx) };
        let want = &reference[g0 * nx..(g0 + rows) * nx];
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let d = (g - w).abs();
            if d > worst.0 || d.is_nan() {
                worst = (
                    if d.is_nan() { f32::INFINITY } else { d },
                    format!(
                        "PE {q}, a[{} * {nx} + {}] = {g} vs {w}",
                        g0 + i / nx,
                        i % nx
                    ),
                );
            }
        }
    }
    Ok(worst)
}

/// The whole program: reference on PE 0, distributed run, optional
/// verification, report. Returns whether the verification passed (`true`
/// without `-verify`). **Collective.** The GPU variants run in
/// [`gpu::run`].
///
/// # Errors
/// Bad flags, a GPU variant without a GPU, init and run errors.
pub fn run(args: &Args) -> anyhow::Result<bool> {
    args.variant.require_available()?;
    args.validate(cpnet::env::Launch::from_env()?.n_pes)?;
    if args.variant.is_gpu() {
        return gpu::run(args);
    }
    let (pe, raised) = init_pe(|n| heap_need(args, n))?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let say = me == 0 && !args.csv;
    if let (true, Some(h)) = (say, raised) {
        println!("Setting CPNET_HEAP_SIZE = {h} (symmetric heap for this run)");
    }
    let reference = if me == 0 && !args.skip_single {
        if say {
            println!(
                "Single PE jacobi relaxation ({} work-groups): {} iterations on {} x {} mesh with norm check every {} iterations",
                args.cpu_work_groups().min(args.ny - 2),
                args.niter,
                args.ny,
                args.nx,
                args.nccheck
            );
        }
        let (grid, sol) = single_pe(args);
        if say {
            print_norms(&sol);
        }
        Some((grid, sol))
    } else {
        None
    };
    pe.barrier_all()?;
    if say {
        print_run_header(args, args.cpu_work_groups(), pe.provider());
    }
    let (sol, fin, scratch) = match args.variant {
        Variant::Cpu => run_cpu(&pe, args)?,
        Variant::IntraKernel | Variant::InterKernel => bail!("unreachable: dispatched above"),
    };
    if say {
        print_norms(&sol);
    }
    let mut ok = true;
    if args.verify {
        let mut verdict = [1u8];
        if let Some((grid, ref_sol)) = &reference {
            let (worst, at) = compare_all(&pe, args, grid, fin, scratch)?;
            ok = print_verdict(
                args,
                &format!("{n} PEs"),
                worst,
                &at,
                sol.iters,
                ref_sol.iters,
            );
            verdict[0] = u8::from(ok);
        }
        let all = pe.allgather_bytes(&verdict)?;
        ok = all.iter().all(|v| v.first() == Some(&1));
    }
    if me == 0 && ok {
        let serial = reference.as_ref().map(|(_, s)| s.secs);
        print_report(args, n, serial, sol.secs);
    }
    pe.finalize()?;
    Ok(ok)
}

/// The line that introduces the distributed run.
fn print_run_header(args: &Args, work_groups: usize, provider: &str) {
    println!(
        "Jacobi relaxation (cpnet {}, {work_groups} work-groups per PE, provider {provider}): {} iterations on {} x {} mesh with norm check every {} iterations",
        args.variant.name(),
        args.niter,
        args.ny,
        args.nx,
        args.nccheck
    );
}

/// The verification line of `who` (`"2 PEs"`, ...) against the single-PE
/// reference, printed where it belongs (stdout when it passed, stderr when
/// not or with `-csv`); returns whether it passed: the largest difference
/// is at most [`VERIFY_TOL`] and the iteration counts agree.
fn print_verdict(args: &Args, who: &str, worst: f32, at: &str, iters: u32, ref_iters: u32) -> bool {
    let ok = worst <= VERIFY_TOL && iters == ref_iters;
    let line = format!(
        "Verification: {who} vs the single-PE reference: max abs diff {worst:e} (at {at}), tolerance {VERIFY_TOL:e}, \
         iterations {iters} vs {ref_iters}: {}",
        if ok { "OK" } else { "FAILED" }
    );
    if ok && !args.csv {
        println!("{line}");
    } else {
        // CSV output stays one line; the verdict goes to stderr.
        eprintln!("{line}");
    }
    ok
}

/// The report of their tool (or its CSV line): the single-PE ("1 GPU")
/// time `serial`, the `n`-PE time `t`, speedup and efficiency.
fn print_report(args: &Args, n: i32, serial: Option<f64>, t: f64) {
    if args.csv {
        // The single-PE column is NaN when that run was skipped.
        println!(
            "cpnet-{}, {}, {}, {}, {}, {}, 1, {:.6}, {:.6}",
            args.variant.name(),
            args.nx,
            args.ny,
            args.niter,
            args.nccheck,
            n,
            t,
            serial.unwrap_or(f64::NAN)
        );
        return;
    }
    println!("Num GPUs: {n}.");
    match serial {
        Some(serial) => println!(
            "{}x{}: 1 GPU: {:8.4} s, {} GPUs: {:8.4} s, speedup: {:8.2}, efficiency: {:8.2} ",
            args.ny,
            args.nx,
            serial,
            n,
            t,
            serial / t,
            serial / (f64::from(n) * t) * 100.0
        ),
        None => println!("{}x{}: {} GPUs: {:8.4} s (single-PE run skipped)", args.ny, args.nx, n, t),
    }
}

/// The norm lines of their tool: every 100th iteration, `"%5d, %0.6f"`.
fn print_norms(sol: &Solution) {
    for &(it, norm) in &sol.norms {
        if it.is_multiple_of(100) {
            println!("{it:5}, {norm:.6}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_matches_their_formula_and_covers_every_row() {
        for ny in 3..60 {
            for n in 1..=(ny - 2).min(9) {
                let p = Partition::new(ny, n);
                let mut next = 1;
                for pe in 0..n {
                    assert_eq!(p.iy_start_global(pe), next, "ny {ny} n {n} pe {pe}");
                    assert!(p.chunk(pe) == p.chunk_low || p.chunk(pe) == p.chunk_high);
                    assert!(p.chunk(pe) >= 1);
                    next += p.chunk(pe);
                }
                assert_eq!(
                    next,
                    ny - 1,
                    "ny {ny} n {n}: the chunks cover rows 1..=ny-2"
                );
            }
        }
    }

    #[test]
    fn work_group_rows_are_balanced_and_contiguous() {
        for rows in 1..40 {
            for wgs in 1..=rows {
                let mut next = 1;
                for w in 0..wgs {
                    let (a, b) = wg_rows(rows, wgs, w);
                    assert_eq!(a, next);
                    assert!(b - a == rows / wgs || b - a == rows / wgs + 1);
                    next = b;
                }
                assert_eq!(next, rows + 1);
            }
        }
    }

    #[test]
    fn reference_is_independent_of_its_thread_count() {
        let mut args = Args::parse_from([
            "jacobi", "--nx", "37", "--ny", "29", "--niter", "40", "--wgs", "1",
        ]);
        let (g1, s1) = single_pe(&args);
        args.wgs = Some(5);
        let (g5, s5) = single_pe(&args);
        assert_eq!(g1, g5, "bit-identical grids");
        assert_eq!(s1.iters, 40);
        assert_eq!(s1.norms.len(), s5.norms.len());
        assert!(s1.norms[0].1 > 0.0);
    }

    #[test]
    fn a_small_grid_converges_and_stops_early() {
        // 4 x 4 reaches a fixed point in f32 well before 10000 iterations.
        let args = Args::parse_from([
            "jacobi", "--nx", "4", "--ny", "4", "--niter", "10000", "--wgs", "2",
        ]);
        let (_, s) = single_pe(&args);
        assert!(s.iters < 10000, "ran {} iterations", s.iters);
        let last = s.norms.last().unwrap();
        assert!(
            last.1 <= TOL && last.0 + 2 == s.iters,
            "{:?} / {}",
            last,
            s.iters
        );
    }
}
