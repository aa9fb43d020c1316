//! The GPU variants of Jacobi: the same problem, partition, halo protocol,
//! norm reduction and stopping rule as the CPU variant (see
//! [`crate::jacobi`]), on one GPU per PE, the grids in the GPU symmetric
//! heap ([`cpnet::GpuPe`]). The kernels are in `jacobi.cu`.
//!
//! # `-variant intra-kernel`
//!
//! One persistent kernel (`jacobi_persistent`, a cooperative launch of as
//! many band blocks as fit on the GPU beside one more, or `-wgs` of them)
//! runs the whole loop. With three or more band blocks, block 0 owns row 1
//! alone and the last band block row `chunk` alone: each waits for its halo
//! of the previous iteration, computes its row and pushes it to the
//! neighbour PE, while the other blocks compute the interior without ever
//! waiting on the network. Where the kernel reaches the neighbour's heap
//! (`cpnet_ptr`: peer stores), the row goes as LL words (each float and
//! the round in one 8-byte store; the neighbour's boundary block polls and
//! unpacks them), else (and with `-halo-put`) with
//! `cpnet_putmem_signal_nbi` (SET signal = iteration + 1), whose release
//! waits for the row's stores to be acknowledged first. A grid barrier of
//! the band blocks (the kernel's own, on a device counter) closes each
//! iteration. The extra block, the norm block, owns no rows and does not
//! arrive at that barrier: it waits for its count, takes the L2 norm of that
//! check iteration while the band blocks compute the next one, through the
//! library's reduce to all (`cpnet_double_sum_reduce` on
//! `CPNET_TEAM_WORLD`, issue 22), and publishes its verdict, which the band
//! blocks wait for after their next barrier: a norm decides one iteration
//! after its own, as in the CPU variant. The CPU variant keeps its own
//! exchange (every PE's partial into a slot of every PE, put-with-signal
//! ADD on a per-parity counter).
//!
//! # `-variant inter-kernel`
//!
//! Two launches per iteration on the PE's stream: `jacobi_step` (the
//! stencil, no communication) then `jacobi_comm`, a three-block kernel that
//! pushes both boundary rows, waits for both halos, and on check
//! iterations reduces the norm across PEs (the library's reduce, as above). A GPU PE's heap is reachable
//! only by its GPU (and the proxy), not by CPU work-groups, so the paper's
//! "host-issued" communication between kernels is this short kernel,
//! synchronized with the compute kernels at kernel boundaries. The host
//! reads the norm of check iteration `it - 1` after iteration `it` was
//! launched (a stream synchronization, as multi-gpu-programming-models'
//! non-overlapped versions do) and stops after `it` when it is at most
//! 1e-8: the CPU variant's rule.
//!
//! # The single-GPU run and verification
//!
//! PE 0 first runs the problem on its GPU alone (`jacobi_persistent` with
//! `solo`: the whole `ny` rows in plain device memory, the periodic halo
//! copied locally, no cpnet call) for the "1 GPU" time of the report, for
//! both variants.
//!
//! The stencil's arithmetic is the CPU's term for term (see `jacobi.cu`), so
//! the GPU grids are expected to be bit-identical to the CPU single-PE
//! reference ([`super::single_pe`]). With `-verify`, every PE computes that
//! reference on its CPU (`-wgs` is not used for it: all cores, shared among
//! the PEs of the host), compares its own final chunk, and PE 0 also the
//! single-GPU grid; the tolerance is the CPU variant's, [`VERIFY_TOL`]
//! (max abs diff 1e-5), and the iteration counts must agree. No grid
//! crosses the network for it.

use std::time::Instant;

use anyhow::{Context, bail, ensure};
use cpnet::GpuPe;
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use super::{
    Args, Partition, Real, Solution, TOL, VERIFY_TOL, boundary, heap_need, print_norms,
    print_report, print_run_header, print_verdict, single_pe, sync_block, wg_rows,
};
use crate::cli::{Variant, init_gpu_pe};
use crate::gpu::{check_launch, kernel_source, max_coresident, new_ctl};

/// Threads per block of every Jacobi kernel.
pub const THREADS: u32 = 1024;

/// Control block words of the Jacobi kernels (`JACOBI_CTL_*`).
mod jctl {
    use crate::gpu::ctl::APP;
    /// Iterations run (persistent kernel, block 0 at the end).
    pub const ITERS: usize = APP;
    /// Nonzero: stop after the iteration this says (persistent kernel).
    pub const STOP: usize = APP + 1;
    /// Norms recorded in the norm list.
    pub const NNORMS: usize = APP + 2;
    /// The last norm recorded (f64 bits) and its iteration.
    pub const LAST_NORM: usize = APP + 3;
    /// See [`LAST_NORM`].
    pub const LAST_NORM_ITER: usize = APP + 4;
    /// Persistent kernel: the norm block's last verdict, `(k + 1) << 1 |
    /// stop` for the last check iteration k whose norm it took (the band
    /// blocks wait for it).
    pub const NORM_DONE: usize = APP + 5;
}
const _: () = assert!(crate::gpu::ctl::WORDS > jctl::NORM_DONE);

/// The `-phases` timers of `jacobi_persistent`, in index order
/// (`JACOBI_PH_<NAME>`), with the names the report prints; the last one
/// counts iterations. Each timed block has [`PHASE_STRIDE`] words.
const PHASES: [(&str, &str); 6] = [
    ("HALO", "halo wait"),
    ("ROWS", "boundary rows + puts"),
    ("BAND", "band"),
    ("NORM", "norm (sum + reduce)"),
    ("SYNC", "grid barrier"),
    ("ITERS", "iterations"),
];
/// The blocks `-phases` times, in slot order.
const PHASE_BLOCKS: [&str; 3] = ["block 0", "last band block", "norm block"];
/// Words per timed block in the `-phases` buffer (`JACOBI_PHASES`).
const PHASE_STRIDE: usize = 8;
const _: () = assert!(PHASES.len() <= PHASE_STRIDE);

/// The kernels' source with every `#define` they need.
pub fn source() -> String {
    let phase_names: Vec<String> = PHASES.iter().map(|(name, _)| format!("JACOBI_PH_{name}")).collect();
    let defines = [
        ("SYNC_TOP_SIG", format!("{}ull", sync_block::TOP_SIG)),
        ("SYNC_BOT_SIG", format!("{}ull", sync_block::BOT_SIG)),
        ("SYNC_NORM_SRC", format!("{}ull", sync_block::NORM_SRC)),
        ("JACOBI_CTL_ITERS", jctl::ITERS.to_string()),
        ("JACOBI_CTL_STOP", jctl::STOP.to_string()),
        ("JACOBI_CTL_NORM_DONE", jctl::NORM_DONE.to_string()),
        ("JACOBI_CTL_NNORMS", jctl::NNORMS.to_string()),
        ("JACOBI_CTL_LAST_NORM", jctl::LAST_NORM.to_string()),
        (
            "JACOBI_CTL_LAST_NORM_ITER",
            jctl::LAST_NORM_ITER.to_string(),
        ),
        ("JACOBI_TOL", format!("{TOL:e}")),
        ("JACOBI_THREADS", THREADS.to_string()),
        ("JACOBI_PHASES", PHASE_STRIDE.to_string()),
    ];
    let defines: Vec<(&str, String)> =
        defines.into_iter().chain(phase_names.iter().enumerate().map(|(k, n)| (n.as_str(), k.to_string()))).collect();
    kernel_source(&defines, include_str!("jacobi.cu"))
}

/// `jacobi_params` of `jacobi.cu`, field for field (all 8 bytes: no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct JacobiParams {
    a0: u64,
    a1: u64,
    sync: u64,
    ctl: u64,
    partials: u64,
    norms: u64,
    row_start: u64,
    nx: i64,
    chunk: i64,
    top_pe: i64,
    bottom_pe: i64,
    top_pe_halo: i64,
    niter: i64,
    nccheck: i64,
    csv: i64,
    solo: i64,
    iter: i64,
    blocks: i64,
    max_norms: i64,
    phases: u64,
    ll: u64,
    ll_on: i64,
}

// SAFETY: repr(C), plain 8-byte integers, laid out as `struct jacobi_params`
// (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for JacobiParams {}

/// First row of each of `blocks` blocks over rows `1 ..= chunk`, and
/// `chunk + 1` at the end (`blocks` capped at `chunk`). With three or more
/// blocks, block 0 gets row 1 alone and the last block row `chunk` alone
/// (they wait for halos and push rows; the others only compute); the
/// interior rows are split evenly among the others.
pub fn bands(chunk: usize, blocks: usize) -> Vec<u64> {
    let g = blocks.clamp(1, chunk.max(1));
    let mut v = Vec::with_capacity(g + 1);
    if g >= 3 {
        v.push(1);
        for k in 0..g - 2 {
            v.push(wg_rows(chunk - 2, g - 2, k).0 as u64 + 1);
        }
        v.push(chunk as u64);
    } else {
        for w in 0..g {
            v.push(wg_rows(chunk, g, w).0 as u64);
        }
    }
    v.push(chunk as u64 + 1);
    v
}

/// `rows × nx` cells, zero, with the fixed boundary columns of global rows
/// `offset ..`.
fn initial_grid(nx: usize, rows: usize, offset: usize, ny: usize) -> Vec<Real> {
    let mut g = vec![0.0 as Real; nx * rows];
    for r in 0..rows {
        let y0 = boundary(offset + r, ny);
        g[r * nx] = y0;
        g[r * nx + nx - 1] = y0;
    }
    g
}

fn as_bytes(v: &[Real]) -> &[u8] {
    // SAFETY: f32 has no padding and every bit pattern is a valid u8; the
    // slice covers exactly the floats' bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// The device address of a buffer of the PE's stream.
fn dptr<T>(pe: &GpuPe, s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = s.device_ptr(pe.stream());
    p
}

/// The loaded kernels.
struct Kernels {
    persistent: CudaFunction,
    step: CudaFunction,
    comm: CudaFunction,
    /// Blocks of `persistent` that fit on the GPU at once.
    max_blocks: u32,
}

/// The band blocks a persistent kernel uses for `rows` rows (it launches
/// one more, the norm block): `-wgs`, or all that fit beside the norm block,
/// capped at `rows`.
fn blocks_for(args: &Args, k: &Kernels, rows: usize) -> anyhow::Result<usize> {
    // The persistent kernel runs its band blocks and one norm block, all
    // resident at once.
    let fit = k.max_blocks.saturating_sub(1).max(1);
    if let Some(w) = args.wgs {
        ensure!(
            w <= fit,
            "-wgs {w}: at most {fit} band blocks of {THREADS} threads fit on this GPU beside the norm block, and \
             the persistent kernel needs all of its blocks resident",
        );
    }
    Ok((args.wgs.unwrap_or(fit) as usize).clamp(1, rows))
}

/// The norm list of a run.
fn read_norms(pe: &GpuPe, norms: &CudaSlice<u64>, count: u64) -> anyhow::Result<Vec<(u32, f64)>> {
    let raw = pe
        .stream()
        .clone_dtoh(norms)
        .context("cuMemcpyDtoH (norms)")?;
    Ok(raw
        .chunks(2)
        .take(count as usize)
        .map(|c| (c[0] as u32, f64::from_bits(c[1])))
        .collect())
}

/// The single-GPU run (PE 0): the whole grid in plain device memory,
/// `jacobi_persistent` with `solo`. Returns the run and, when `keep`, the
/// final grid (`ny × nx`).
fn run_solo(
    pe: &GpuPe,
    args: &Args,
    k: &Kernels,
    keep: bool,
) -> anyhow::Result<(Solution, Option<Vec<Real>>)> {
    let (nx, ny) = (args.nx, args.ny);
    let rows = ny - 2;
    let blocks = blocks_for(args, k, rows)?;
    let s = pe.stream();
    let init = initial_grid(nx, ny, 0, ny);
    let a0 = s.clone_htod(&init).context("single-GPU grid")?;
    let a1 = s.clone_htod(&init).context("single-GPU grid")?;
    drop(init);
    let ctl_buf = new_ctl(pe)?;
    let partials = s.alloc_zeros::<f64>(2 * blocks)?;
    let max_norms = args.niter as usize + 1;
    let norms = s.alloc_zeros::<u64>(2 * max_norms)?;
    let row_start = s.clone_htod(&bands(rows, blocks))?;
    let phases = phase_buffer(pe, args)?;
    let p = JacobiParams {
        a0: dptr(pe, &a0),
        a1: dptr(pe, &a1),
        ctl: dptr(pe, &ctl_buf),
        partials: dptr(pe, &partials),
        norms: dptr(pe, &norms),
        row_start: dptr(pe, &row_start),
        nx: nx as i64,
        chunk: rows as i64,
        niter: i64::from(args.niter),
        nccheck: i64::from(args.nccheck),
        csv: i64::from(args.csv),
        solo: 1,
        max_norms: max_norms as i64,
        phases: phases.as_ref().map_or(0, |b| dptr(pe, b)),
        ..JacobiParams::default()
    };
    s.synchronize().context("single-GPU setup")?;
    let h = pe.handle();
    let t = Instant::now();
    let mut b = s.launch_builder(&k.persistent);
    b.arg(&h).arg(&p);
    // SAFETY: the arguments match jacobi_persistent(cpnet_handle_t,
    // jacobi_params); every pointer in `p` is a live allocation of the
    // sizes the kernel indexes (grids ny × nx, partials 2 × blocks, norms
    // 2 × max_norms, row_start blocks + 1, the control block); they outlive
    // the kernel (synchronized in check_launch below). Cooperative: the
    // grid barrier needs every block resident (blocks + 1 <= max_blocks).
    unsafe { b.launch_cooperative(launch_cfg(blocks + 1)) }
        .context("launch jacobi_persistent (single GPU)")?;
    let words = check_launch(pe, &ctl_buf, "jacobi_persistent (single GPU)", "iteration")?;
    let secs = t.elapsed().as_secs_f64();
    if let Some(b) = &phases {
        print_phases(pe, "single GPU", b)?;
    }
    let sol = Solution {
        iters: words[jctl::ITERS] as u32,
        norms: read_norms(pe, &norms, words[jctl::NNORMS])?,
        secs,
    };
    let grid = if keep {
        let fin = if sol.iters.is_multiple_of(2) {
            &a0
        } else {
            &a1
        };
        Some(s.clone_dtoh(fin).context("single-GPU grid")?)
    } else {
        None
    };
    Ok((sol, grid))
}

/// The zeroed `-phases` timers (three timed blocks), or `None` without
/// `-phases`.
fn phase_buffer(pe: &GpuPe, args: &Args) -> anyhow::Result<Option<CudaSlice<u64>>> {
    Ok(if args.phases { Some(pe.stream().alloc_zeros::<u64>(PHASE_BLOCKS.len() * PHASE_STRIDE)?) } else { None })
}

/// Print the `-phases` means of block 0, the last band block and the norm
/// block, µs per iteration (one line each, from this PE).
fn print_phases(pe: &GpuPe, who: &str, buf: &CudaSlice<u64>) -> anyhow::Result<()> {
    let w = pe.stream().clone_dtoh(buf).context("cuMemcpyDtoH (phases)")?;
    let iters_at = PHASES.len() - 1;
    for (slot, block) in PHASE_BLOCKS.iter().enumerate() {
        let words = &w[slot * PHASE_STRIDE..(slot + 1) * PHASE_STRIDE];
        let iters = words[iters_at];
        if iters == 0 {
            continue;
        }
        let parts: Vec<String> = PHASES[..iters_at]
            .iter()
            .enumerate()
            .map(|(k, (_, name))| format!("{name} {:.2}", words[k] as f64 / 1e3 / iters as f64))
            .collect();
        let total: u64 = words[..iters_at].iter().sum();
        println!(
            "jacobi -phases {who}, {block}: {} (sum {:.2} µs per iteration, {iters} iterations)",
            parts.join(", "),
            total as f64 / 1e3 / iters as f64
        );
    }
    Ok(())
}

fn launch_cfg(blocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// This PE's part of the distributed run: its buffers and parameters.
struct Chunk {
    grids: [cpnet::device::cpu::SymAddr; 2],
    part: Partition,
    chunk: usize,
    blocks: usize,
    params: JacobiParams,
    ctl: CudaSlice<u64>,
    norms: CudaSlice<u64>,
    /// The `-phases` timers (`None` without `-phases`).
    phases: Option<CudaSlice<u64>>,
    // Kept alive for the kernels that point at them.
    _partials: CudaSlice<f64>,
    _row_start: CudaSlice<u64>,
}

/// Allocate and initialize this PE's chunk (**collective**).
fn setup(pe: &GpuPe, args: &Args, k: &Kernels) -> anyhow::Result<Chunk> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let part = Partition::new(args.ny, n as usize);
    let chunk = part.chunk(me as usize);
    let nx = args.nx;
    let rows = part.chunk_high + 2;
    let bytes = (nx * rows * size_of::<Real>()) as u64;
    let grids = [pe.shmalloc(bytes)?, pe.shmalloc(bytes)?];
    let sync = pe.shmalloc(sync_block::bytes(n as usize))?;
    // LL halo words, zero: no round (they count from 1) is there yet.
    let ll_bytes = nx as u64 * 32;
    let ll = pe.shmalloc(ll_bytes)?;
    pe.write_heap(ll, &vec![0u8; ll_bytes as usize])?;
    let init = initial_grid(
        nx,
        chunk + 2,
        part.iy_start_global(me as usize) - 1,
        args.ny,
    );
    for g in grids {
        pe.write_heap(g, as_bytes(&init))?;
    }
    let blocks = blocks_for(args, k, chunk)?;
    let s = pe.stream();
    let ctl_buf = new_ctl(pe)?;
    let partials = s.alloc_zeros::<f64>(2 * blocks)?;
    let max_norms = args.niter as usize + 1;
    let norms = s.alloc_zeros::<u64>(2 * max_norms)?;
    let row_start = s.clone_htod(&bands(chunk, blocks))?;
    let phases = phase_buffer(pe, args)?;
    let top_pe = if me > 0 { me - 1 } else { n - 1 };
    let bottom_pe = (me + 1) % n;
    let params = JacobiParams {
        a0: pe.dev_ptr(grids[0]),
        a1: pe.dev_ptr(grids[1]),
        sync: pe.dev_ptr(sync),
        ctl: dptr(pe, &ctl_buf),
        partials: dptr(pe, &partials),
        norms: dptr(pe, &norms),
        row_start: dptr(pe, &row_start),
        nx: nx as i64,
        chunk: chunk as i64,
        top_pe: i64::from(top_pe),
        bottom_pe: i64::from(bottom_pe),
        top_pe_halo: part.chunk(top_pe as usize) as i64 + 1,
        niter: i64::from(args.niter),
        nccheck: i64::from(args.nccheck),
        csv: i64::from(args.csv),
        // One PE: the persistent kernel copies its periodic halos itself.
        // Puts to itself would be same-device copies, which the driver may
        // run as a kernel that cannot start while the cooperative grid holds
        // every SM (seen: 16384^2 on 1 H200 timed out on its first halo).
        solo: i64::from(n == 1),
        iter: 0,
        blocks: blocks as i64,
        max_norms: max_norms as i64,
        phases: phases.as_ref().map_or(0, |b| dptr(pe, b)),
        ll: pe.dev_ptr(ll),
        ll_on: i64::from(!args.halo_put),
    };
    s.synchronize().context("setup")?;
    Ok(Chunk {
        grids,
        part,
        chunk,
        blocks,
        params,
        ctl: ctl_buf,
        norms,
        phases,
        _partials: partials,
        _row_start: row_start,
    })
}

/// `-variant intra-kernel` on this PE: one cooperative launch of
/// `jacobi_persistent`; returns the run (timed between two barriers of all
/// PEs, as the CPU variant).
fn run_intra(pe: &GpuPe, k: &Kernels, c: &Chunk) -> anyhow::Result<Solution> {
    let h = pe.handle();
    pe.barrier_all()?;
    let t = Instant::now();
    let mut b = pe.stream().launch_builder(&k.persistent);
    b.arg(&h).arg(&c.params);
    // SAFETY: the arguments match jacobi_persistent(cpnet_handle_t,
    // jacobi_params); every pointer in the parameters is a live allocation
    // of the size the kernel indexes (the symmetric grids and sync block in
    // the heap, the buffers held by `c`), alive until check_launch below
    // synchronized. Cooperative: every block resident (blocks + 1 <= max_blocks).
    unsafe { b.launch_cooperative(launch_cfg(c.blocks + 1)) }.context("launch jacobi_persistent")?;
    let words = check_launch(pe, &c.ctl, "jacobi_persistent", "iteration")?;
    pe.barrier_all()?;
    let secs = t.elapsed().as_secs_f64();
    if let Some(b) = &c.phases {
        print_phases(pe, &format!("PE {}", pe.my_pe()), b)?;
    }
    Ok(Solution {
        iters: words[jctl::ITERS] as u32,
        norms: read_norms(pe, &c.norms, words[jctl::NNORMS])?,
        secs,
    })
}

/// `-variant inter-kernel` on this PE: `jacobi_step` and `jacobi_comm` per
/// iteration, the norm of check iteration `it - 1` read by the host after
/// iteration `it` was launched (stop after `it` when it is at most 1e-8).
fn run_inter(pe: &GpuPe, args: &Args, k: &Kernels, c: &Chunk) -> anyhow::Result<Solution> {
    let h = pe.handle();
    let s = pe.stream();
    let mut p = c.params;
    let mut iters = args.niter;
    let mut stopped = false;
    pe.barrier_all()?;
    let t = Instant::now();
    for it in 0..args.niter {
        p.iter = i64::from(it);
        let mut b = s.launch_builder(&k.step);
        b.arg(&p);
        // SAFETY: the arguments match jacobi_step(jacobi_params); the
        // buffers it indexes (grids, row_start, partials) are alive until
        // the synchronization at the end of this function, and stream order
        // puts it after the previous jacobi_comm.
        unsafe { b.launch(launch_cfg(c.blocks)) }.context("launch jacobi_step")?;
        let mut b = s.launch_builder(&k.comm);
        b.arg(&h).arg(&p);
        // SAFETY: the arguments match jacobi_comm(cpnet_handle_t,
        // jacobi_params); its three blocks wait on nothing of each other;
        // the buffers live as above.
        unsafe { b.launch(launch_cfg(3)) }.context("launch jacobi_comm")?;
        if it >= 1 && args.is_check(it - 1) {
            let w = check_launch(pe, &c.ctl, "jacobi_step/jacobi_comm", "iteration")?;
            // The last record is iteration it's when it checks too.
            let norm = if w[jctl::LAST_NORM_ITER] == u64::from(it - 1) {
                f64::from_bits(w[jctl::LAST_NORM])
            } else {
                read_norms(pe, &c.norms, w[jctl::NNORMS])?
                    .iter()
                    .rev()
                    .find(|(at, _)| *at == it - 1)
                    .map(|&(_, v)| v)
                    .with_context(|| {
                        format!(
                            "internal: the norm of iteration {} was not recorded",
                            it - 1
                        )
                    })?
            };
            if norm <= TOL {
                iters = it + 1;
                stopped = true;
                break;
            }
        }
    }
    let words = check_launch(pe, &c.ctl, "jacobi_step/jacobi_comm", "iteration")?;
    pe.barrier_all()?;
    let secs = t.elapsed().as_secs_f64();
    let mut norms = read_norms(pe, &c.norms, words[jctl::NNORMS])?;
    if stopped {
        // As the CPU variant: the norm of the last iteration is not taken.
        norms.retain(|(at, _)| at + 1 < iters);
    }
    Ok(Solution { iters, norms, secs })
}

/// The largest difference between `got` (rows of global index `g0 ..`) and
/// the reference grid, and where (`who` names the PE or run).
fn compare(nx: usize, got: &[Real], g0: usize, reference: &[Real], who: &str) -> (f32, String) {
    let want = &reference[g0 * nx..g0 * nx + got.len()];
    let mut worst = (0.0f32, String::from("-"));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if d > worst.0 || d.is_nan() {
            worst = (
                if d.is_nan() { f32::INFINITY } else { d },
                format!("{who}, a[{} * {nx} + {}] = {g} vs {w}", g0 + i / nx, i % nx),
            );
        }
    }
    worst
}

/// The CPU reference for `-verify` on this PE: all cores, shared among the
/// PEs of this host.
fn cpu_reference(args: &Args) -> (Vec<Real>, Solution) {
    let local = cpnet::env::Launch::from_env().map_or(1, |l| l.local_size.max(1) as usize);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let ref_args = Args {
        wgs: Some((cores / local).max(1) as u32),
        ..args.clone()
    };
    single_pe(&ref_args)
}

/// The GPU variants' program (see the module docs). **Collective.**
///
/// # Errors
/// No GPU, init, kernel build and run errors (naming PE, work-group,
/// operation and address).
pub fn run(args: &Args) -> anyhow::Result<bool> {
    let (pe, raised) = init_gpu_pe(args.variant, |n| heap_need(args, n), 0)?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let say = me == 0 && !args.csv;
    if let (true, Some(h)) = (say, raised) {
        println!("Setting CPNET_HEAP_SIZE = {h} (symmetric heap for this run)");
    }
    let module = pe.build_module("jacobi.cu", &source())?;
    let load = |name: &str| {
        module
            .load_function(name)
            .with_context(|| format!("kernel {name}"))
    };
    let persistent = load("jacobi_persistent")?;
    let max_blocks = max_coresident(&pe, &persistent, THREADS)?;
    let k = Kernels {
        persistent,
        step: load("jacobi_step")?,
        comm: load("jacobi_comm")?,
        max_blocks,
    };
    let reference = if args.verify {
        Some(cpu_reference(args))
    } else {
        None
    };
    let single = if me == 0 && !args.skip_single {
        if say {
            println!(
                "Single GPU jacobi relaxation ({} band blocks and a norm block of {THREADS} threads): {} iterations on {} x {} mesh with norm check every {} iterations",
                blocks_for(args, &k, args.ny - 2)?,
                args.niter,
                args.ny,
                args.nx,
                args.nccheck
            );
        }
        let (sol, grid) = run_solo(&pe, args, &k, args.verify)?;
        if say {
            print_norms(&sol);
        }
        Some((sol, grid))
    } else {
        None
    };
    let c = setup(&pe, args, &k)?;
    if say {
        print_run_header(args, c.blocks, pe.provider());
    }
    let sol = match args.variant {
        Variant::IntraKernel => run_intra(&pe, &k, &c)?,
        Variant::InterKernel => run_inter(&pe, args, &k, &c)?,
        Variant::Cpu => bail!("internal: the cpu variant does not run here"),
    };
    if say {
        print_norms(&sol);
    }
    let mut ok = true;
    if let Some((ref_grid, ref_sol)) = &reference {
        let nx = args.nx;
        let mut got = vec![0.0 as Real; c.chunk * nx];
        let fin = c.grids[sol.iters as usize % 2];
        // SAFETY: `got` is a live, exclusively borrowed f32 buffer viewed as
        // its bytes for the copy; every bit pattern is a valid f32.
        let got_bytes = unsafe {
            std::slice::from_raw_parts_mut(got.as_mut_ptr().cast::<u8>(), size_of_val(&got[..]))
        };
        pe.read_heap(fin.add((nx * size_of::<Real>()) as u64), got_bytes)?;
        let g0 = c.part.iy_start_global(me as usize);
        let (worst, at) = compare(nx, &got, g0, ref_grid, &format!("PE {me}"));
        let mine_ok = worst <= VERIFY_TOL && sol.iters == ref_sol.iters;
        let mut blob = vec![u8::from(mine_ok)];
        blob.extend_from_slice(&worst.to_le_bytes());
        blob.extend_from_slice(at.as_bytes());
        let all = pe.allgather_bytes(&blob)?;
        ok = all.iter().all(|b| b.first() == Some(&1));
        if me == 0 {
            let (worst, at) = all
                .iter()
                .map(|b| {
                    let w = f32::from_le_bytes(b[1..5].try_into().expect("4 bytes"));
                    (w, String::from_utf8_lossy(&b[5..]).into_owned())
                })
                .fold((0.0f32, String::from("-")), |acc, x| {
                    if x.0 > acc.0 { x } else { acc }
                });
            let agreed = print_verdict(
                args,
                &format!("{n} PEs"),
                worst,
                &at,
                sol.iters,
                ref_sol.iters,
            );
            ok = ok && agreed;
            if let Some((single_sol, Some(grid))) = &single {
                let rows = &grid[nx..(args.ny - 1) * nx];
                let (w, at) = compare(nx, rows, 1, ref_grid, "single GPU");
                let single_ok = w <= VERIFY_TOL && single_sol.iters == ref_sol.iters;
                let line = format!(
                    "Single-GPU run vs the single-PE reference: max abs diff {w:e} (at {at}), tolerance {VERIFY_TOL:e}, \
                     iterations {} vs {}: {}",
                    single_sol.iters,
                    ref_sol.iters,
                    if single_ok { "OK" } else { "FAILED" }
                );
                if single_ok && !args.csv {
                    println!("{line}");
                } else {
                    eprintln!("{line}");
                }
                ok = ok && single_ok;
            }
        }
        // PE 0's verdict decides for every PE.
        let all = pe.allgather_bytes(&[u8::from(ok)])?;
        ok = all.first().and_then(|v| v.first()) == Some(&1);
    }
    if me == 0 && ok {
        let serial = single.as_ref().map(|(s, _)| s.secs);
        print_report(args, n, serial, sol.secs);
    }
    pe.finalize()?;
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_cover_every_row_once_with_lone_boundary_rows() {
        for chunk in 1..40 {
            for blocks in 1..50 {
                let b = bands(chunk, blocks);
                let g = blocks.min(chunk);
                assert_eq!(b.len(), g + 1, "chunk {chunk} blocks {blocks}");
                assert_eq!(b[0], 1);
                assert_eq!(*b.last().unwrap(), chunk as u64 + 1);
                assert!(
                    b.windows(2).all(|w| w[0] < w[1]),
                    "{b:?}: every block has a row"
                );
                if g >= 3 {
                    assert_eq!(b[1], 2, "block 0 owns row 1 alone: {b:?}");
                    assert_eq!(
                        b[g - 1],
                        chunk as u64,
                        "the last block owns row chunk alone: {b:?}"
                    );
                }
            }
        }
    }

    /// The Rust mirror has as many 8-byte fields as the C struct declares.
    #[test]
    fn params_mirror_the_kernel_struct() {
        let fields = crate::gpu::c_struct_fields(&source(), "jacobi_params");
        assert_eq!(size_of::<JacobiParams>(), fields * 8);
    }

    /// The kernels compile with NVRTC, without a warning or a
    /// non-coherent load.
    #[test]
    fn kernels_compile() {
        crate::gpu::check_kernels_compile("jacobi kernels_compile", &source());
    }
}
