//! `moe -variant intra-kernel`: the dispatch and combine of [`super`] as one
//! persistent GPU kernel (`moe.cu`): the work-groups are thread blocks that
//! put tokens, counts and signals from inside the kernel.
//!
//! The kernel's receive buffers are packed per source, not per expert: the
//! rows a source sends PE `d` sit in one run, in (local expert, slot)
//! order, at the position [`positions`] gives each (token, j) pair. A PE
//! whose heap the kernel reaches (`cpnet_ptr`: peer stores) gets each row as
//! its own put, as DeepEP's low-latency kernels send them; a PE it does not
//! reach (the network path) gets its whole run as a few large puts, packed
//! first into a send buffer, so that a dispatch is a few puts of at least
//! `-bulk-min` bytes (one per block where the run is larger) instead of one
//! per row. The combine returns each output to the same position of the
//! source's combine buffer (a run per expert PE), by row or in bulk the same
//! way.

use anyhow::{Context, ensure};
use cpnet::GpuPe;
use cpnet::device::cpu::SymAddr;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, PushKernelArg};

use super::{Args, Regions, Routing, Timing, check, count_wrong, tokens_bytes};
use crate::cli::{Variant, init_gpu_pe};
use crate::gpu::{check_launch, ctl, kernel_source, max_coresident, new_ctl, op};

/// Threads per block.
pub const THREADS: u32 = 256;

/// Most experts the kernel takes (`-experts`): its list of received slots
/// keeps one prefix sum per (source PE, local expert) in shared memory,
/// `4 * (MAX_EXPERTS + 1)` bytes per block.
pub const MAX_EXPERTS: usize = 2048;

/// Control block words of the kernel.
mod moectl {
    use crate::gpu::ctl::APP;
    /// Dispatch ns summed over the timed iterations (block 0).
    pub const DISPATCH_NS: usize = APP;
    /// Combine ns summed over the timed iterations (block 0).
    pub const COMBINE_NS: usize = APP + 1;
    /// Experts ns summed over the timed iterations (block 0).
    pub const EXPERTS_NS: usize = APP + 2;
}

/// The kernel's source with every `#define` it needs.
pub fn source() -> String {
    let defines = [
        ("MOE_THREADS", THREADS.to_string()),
        ("MOE_MAX_EXPERTS", MAX_EXPERTS.to_string()),
        ("MOE_CTL_DISPATCH_NS", moectl::DISPATCH_NS.to_string()),
        ("MOE_CTL_COMBINE_NS", moectl::COMBINE_NS.to_string()),
        ("MOE_CTL_EXPERTS_NS", moectl::EXPERTS_NS.to_string()),
        ("MOE_OP_DISPATCH", format!("{}ull", op::MOE_DISPATCH)),
        ("MOE_OP_COMBINE", format!("{}ull", op::MOE_COMBINE)),
    ];
    kernel_source(&defines, include_str!("moe.cu"))
}

/// `moe_params` of `moe.cu`, field for field (all 8 bytes: no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct MoeParams {
    x: u64,
    recv: u64,
    counts: u64,
    disp_sig: u64,
    comb_sig: u64,
    comb: u64,
    counts_out: u64,
    send: u64,
    route_e: u64,
    route_w: u64,
    pos: u64,
    send_rows: u64,
    out: u64,
    ctl: u64,
    tokens: i64,
    hidden: i64,
    topk: i64,
    experts: i64,
    n_pes: i64,
    me: i64,
    warmup: i64,
    iters: i64,
    bulk_min: i64,
}

// SAFETY: repr(C), plain 8-byte integers, laid out as `struct moe_params`
// (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for MoeParams {}

/// Byte offsets of the kernel's regions in the PE's symmetric block, every
/// region 64-byte aligned. `TK = T x k`, the most rows a source can send
/// one PE.
#[derive(Clone, Copy, Debug)]
pub struct GpuLayout {
    /// `x[T][H]` bf16: this PE's tokens.
    pub x: u64,
    /// `recv[n][TK][H]` bf16: source `s`'s rows at `[s]`, in (local
    /// expert, slot) order; the experts' outputs replace them.
    pub recv: u64,
    /// `counts[n][E/n]` u64: per source its rows per local expert, put with
    /// its dispatch signal.
    pub counts: u64,
    /// `disp_sig[n]`, `comb_sig[n]` u64: per source the iteration's epoch.
    pub disp_sig: u64,
    /// See `disp_sig`.
    pub comb_sig: u64,
    /// `comb[n][TK][H]` bf16: the outputs expert PE `d` returns, at `[d]`
    /// and the pair's position.
    pub comb: u64,
    /// `counts_out[n][E/n]` u64: the counts this PE sends each PE.
    pub counts_out: u64,
    /// `send[n][TK][H]` bf16: the rows for a PE on the network path,
    /// packed as they land.
    pub send: u64,
    /// Bytes in all.
    pub total: u64,
}

impl GpuLayout {
    /// The layout for `a` on `n` PEs.
    pub fn new(a: &Args, n: usize) -> GpuLayout {
        let (t, h, k, el) = (a.tokens as u64, a.hidden as u64, a.topk as u64, (a.experts / n) as u64);
        let (n, rows) = (n as u64, t * k * h * 2);
        let mut r = Regions::default();
        let x = r.take(t * h * 2);
        let recv = r.take(n * rows);
        let counts = r.take(n * el * 8);
        let disp_sig = r.take(n * 8);
        let comb_sig = r.take(n * 8);
        let comb = r.take(n * rows);
        let counts_out = r.take(n * el * 8);
        let send = r.take(n * rows);
        GpuLayout { x, recv, counts, disp_sig, comb_sig, comb, counts_out, send, total: r.0 }
    }
}

/// Symmetric heap bytes the GPU kernel needs per PE for `a` on `n` PEs.
pub fn heap_bytes(a: &Args, n: usize) -> u64 {
    GpuLayout::new(a, n).total + (1 << 20)
}

/// Where each (token, j) pair lands in its expert PE's run for this source:
/// `pos[t * k + j]`, the rows of that PE's lower experts plus the pair's
/// slot; and `rows[d]`, the rows this PE sends PE `d`. Per PE the positions
/// are `0..rows[d]`, each once.
pub fn positions(a: &Args, r: &Routing, n: usize) -> (Vec<u32>, Vec<u32>) {
    let el = a.experts / n;
    // first[g]: where global expert g's rows start in its PE's run.
    let mut first = vec![0usize; a.experts];
    let mut rows = vec![0u32; n];
    for (g, &c) in r.count.iter().enumerate() {
        first[g] = rows[g / el] as usize;
        rows[g / el] += c as u32;
    }
    let pos = r.route.iter().zip(&r.slot).map(|(&(g, _), &q)| (first[g] + q) as u32).collect();
    (pos, rows)
}

/// What PE `me` writes into its block before the first iteration: its
/// tokens, its counts for each PE (unchanged between iterations) and the
/// zeroed signal words.
fn initial_regions(a: &Args, me: i32, r: &Routing, l: &GpuLayout, n: usize) -> [(u64, Vec<u8>); 4] {
    let counts = r.count.iter().flat_map(|&c| (c as u64).to_le_bytes()).collect();
    [(l.x, tokens_bytes(a, me)), (l.counts_out, counts), (l.disp_sig, vec![0; 8 * n]), (l.comb_sig, vec![0; 8 * n])]
}

fn dptr<T>(pe: &GpuPe, s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = s.device_ptr(pe.stream());
    p
}

/// Run the workload as one cooperative kernel per PE; returns this PE's
/// timing and wrong elements (0 without `-verify`). Initializes and
/// finalizes the GPU PE itself. **Collective.**
///
/// # Errors
/// No GPU, bad arguments, too many blocks for the GPU or the queues, a
/// failed launch (naming the block, operation and iteration).
pub fn run(a: &Args) -> anyhow::Result<(Timing, u64, GpuPe)> {
    let (pe, raised) = init_gpu_pe(Variant::IntraKernel, |n| heap_bytes(a, n as usize), a.wgs() as usize)?;
    let (me, n) = (pe.my_pe(), pe.n_pes() as usize);
    check(a, n)?;
    ensure!(a.experts <= MAX_EXPERTS, "-experts {}: the GPU kernel takes at most {MAX_EXPERTS}", a.experts);
    let blocks = a.wgs();
    let queues = pe.handle().0.n_queues;
    ensure!(blocks <= queues, "-wgs {blocks}: every block needs its own command queue and this PE has {queues} (raise CPNET_QUEUES)");
    let module = pe.build_module("moe.cu", &source())?;
    let func = module.load_function("moe_run").context("kernel moe_run")?;
    let max = max_coresident(&pe, &func, THREADS)?;
    ensure!(blocks <= max, "-wgs {blocks}: at most {max} blocks of {THREADS} threads fit on this GPU at once");
    let r = Routing::new(a, me)?;
    let l = GpuLayout::new(a, n);
    let base = pe
        .shmalloc(l.total)
        .with_context(|| format!("moe needs {} bytes of symmetric heap per PE (set CPNET_HEAP_SIZE)", heap_bytes(a, n)))?;
    let at = |off: u64| SymAddr(base.0 + off);
    let (t_n, h, k) = (a.tokens, a.hidden, a.topk);
    for (off, bytes) in initial_regions(a, me, &r, &l, n) {
        pe.write_heap(at(off), &bytes)?;
    }
    let s = pe.stream();
    let route_e = s.clone_htod(&r.route.iter().map(|&(e, _)| e as u32).collect::<Vec<u32>>())?;
    let route_w = s.clone_htod(&r.route.iter().map(|&(_, w)| w).collect::<Vec<f32>>())?;
    let (pos, rows) = positions(a, &r, n);
    let pos = s.clone_htod(&pos)?;
    let send_rows = s.clone_htod(&rows)?;
    let out = s.alloc_zeros::<f32>(t_n * h)?;
    let ctl_buf = new_ctl(&pe)?;
    let p = MoeParams {
        x: pe.dev_ptr(at(l.x)),
        recv: pe.dev_ptr(at(l.recv)),
        counts: pe.dev_ptr(at(l.counts)),
        disp_sig: pe.dev_ptr(at(l.disp_sig)),
        comb_sig: pe.dev_ptr(at(l.comb_sig)),
        comb: pe.dev_ptr(at(l.comb)),
        counts_out: pe.dev_ptr(at(l.counts_out)),
        send: pe.dev_ptr(at(l.send)),
        route_e: dptr(&pe, &route_e),
        route_w: dptr(&pe, &route_w),
        pos: dptr(&pe, &pos),
        send_rows: dptr(&pe, &send_rows),
        out: dptr(&pe, &out),
        ctl: dptr(&pe, &ctl_buf),
        tokens: t_n as i64,
        hidden: h as i64,
        topk: k as i64,
        experts: a.experts as i64,
        n_pes: n as i64,
        me: i64::from(me),
        warmup: a.warmup as i64,
        iters: a.iters as i64,
        bulk_min: a.bulk_min as i64,
    };
    pe.barrier_all()?;
    if me == 0 {
        super::print_header(a, n as i32, pe.provider(), raised, "intra-kernel", &format!("{blocks} block(s) of {THREADS} threads"));
    }
    let hnd = pe.handle();
    let cfg = crate::gpu::grid(blocks, THREADS);
    let mut b = s.launch_builder(&func);
    b.arg(&hnd).arg(&p);
    // SAFETY: the arguments match moe_run(cpnet_handle_t, moe_params); every
    // pointer in `p` is a live allocation of the size the kernel indexes
    // (the heap regions of `l`, sized by Layout::new for these arguments;
    // the routing tables, output and control block held until check_launch
    // below). Cooperative: the grid barriers need every block resident
    // (blocks <= the co-resident maximum, checked above).
    unsafe { b.launch_cooperative(cfg) }.context("launch moe_run")?;
    let w = check_launch(&pe, &ctl_buf, "moe_run", "iteration")?;
    let it = a.iters.max(1) as f64;
    let timing = Timing {
        dispatch_us: w[moectl::DISPATCH_NS] as f64 / it / 1e3,
        combine_us: w[moectl::COMBINE_NS] as f64 / it / 1e3,
        experts_us: w[moectl::EXPERTS_NS] as f64 / it / 1e3,
    };
    const _: () = assert!(ctl::WORDS > moectl::EXPERTS_NS);
    let wrong = if a.verify { count_wrong(a, me, &r, &s.clone_dtoh(&out).context("copy the output back")?) } else { 0 };
    drop((route_e, route_w, pos, send_rows, out, ctl_buf));
    pe.shfree(base)?;
    Ok((timing, wrong, pe))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The Rust mirror has as many 8-byte fields as the C struct declares.
    #[test]
    fn params_mirror_the_kernel_struct() {
        let fields = crate::gpu::c_struct_fields(&source(), "moe_params");
        assert_eq!(size_of::<MoeParams>(), fields * 8);
    }

    /// Per destination the positions are a permutation of its rows, in
    /// (expert, slot) order: a pair lands after every pair of a lower expert
    /// of that PE and at its slot among its own expert's.
    #[test]
    fn positions_pack_each_destination() {
        let a = Args::parse_from(["moe", "--tokens", "64", "--hidden", "16", "-k", "4", "--experts", "16", "--skew", "1.1"]);
        for n in [1, 2, 4] {
            let el = a.experts / n;
            let r = Routing::new(&a, 1 % n as i32).unwrap();
            let (pos, rows) = positions(&a, &r, n);
            assert_eq!(rows.iter().sum::<u32>() as usize, a.tokens * a.topk);
            let mut seen: Vec<Vec<bool>> = rows.iter().map(|&c| vec![false; c as usize]).collect();
            for (i, &(g, _)) in r.route.iter().enumerate() {
                let d = g / el;
                let below: usize = r.count[d * el..g].iter().sum();
                assert_eq!(pos[i] as usize, below + r.slot[i], "n {n} pair {i}");
                assert!(!std::mem::replace(&mut seen[d][pos[i] as usize], true), "n {n}: position {} twice", pos[i]);
            }
            assert!(seen.iter().flatten().all(|&b| b), "n {n}: every position once");
        }
    }

    /// The kernel compiles with NVRTC, without a warning or a non-coherent load.
    #[test]
    fn kernel_compiles() {
        crate::gpu::check_kernels_compile("moe kernel_compiles", &source());
    }
}
