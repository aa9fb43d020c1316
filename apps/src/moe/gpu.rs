//! `moe -variant intra-kernel`: the dispatch and combine of [`super`] as one
//! persistent GPU kernel (`moe.cu`): the work-groups are thread blocks that
//! put tokens, counts and signals from inside the kernel.

use anyhow::{Context, ensure};
use cpnet::GpuPe;
use cpnet::device::cpu::SymAddr;
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, PushKernelArg};

use super::{Args, Layout, Routing, Timing, check, count_wrong, heap_bytes, initial_regions};
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
    cmeta: u64,
    disp_sig: u64,
    comb_sig: u64,
    comb: u64,
    cmeta_out: u64,
    route_e: u64,
    route_w: u64,
    slot: u64,
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
    row: i64,
}

// SAFETY: repr(C), plain 8-byte integers, laid out as `struct moe_params`
// (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for MoeParams {}

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
    let l = Layout::new(a, n);
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
    let slot = s.clone_htod(&r.slot.iter().map(|&q| q as u32).collect::<Vec<u32>>())?;
    let out = s.alloc_zeros::<f32>(t_n * h)?;
    let ctl_buf = new_ctl(&pe)?;
    let p = MoeParams {
        x: pe.dev_ptr(at(l.x)),
        recv: pe.dev_ptr(at(l.recv)),
        cmeta: pe.dev_ptr(at(l.cmeta)),
        disp_sig: pe.dev_ptr(at(l.disp_sig)),
        comb_sig: pe.dev_ptr(at(l.comb_sig)),
        comb: pe.dev_ptr(at(l.comb)),
        cmeta_out: pe.dev_ptr(at(l.cmeta_out)),
        route_e: dptr(&pe, &route_e),
        route_w: dptr(&pe, &route_w),
        slot: dptr(&pe, &slot),
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
        row: Layout::row_words(a, n) as i64,
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
    drop((route_e, route_w, slot, out, ctl_buf));
    pe.shfree(base)?;
    Ok((timing, wrong, pe))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust mirror has as many 8-byte fields as the C struct declares.
    #[test]
    fn params_mirror_the_kernel_struct() {
        let fields = crate::gpu::c_struct_fields(&source(), "moe_params");
        assert_eq!(size_of::<MoeParams>(), fields * 8);
    }

    /// The kernel compiles with NVRTC, without a warning or a non-coherent load.
    #[test]
    fn kernel_compiles() {
        crate::gpu::check_kernels_compile("moe kernel_compiles", &source());
    }
}
