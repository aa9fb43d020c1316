//! The GPU variants of the multi-ring allreduce: the CPU variant's
//! algorithm, messages and flow control (see [`crate::allreduce`]) run by
//! thread blocks on one GPU per PE, the buffers in the GPU symmetric heap
//! ([`cpnet::GpuPe`]). The kernels are in `allreduce.cu`.
//!
//! Ring `i` is block `i` of every PE's kernel: it receives from block `i` of
//! PE `p - 1` and sends to block `i` of PE `p + 1`, reduce-scatter then
//! allgather, every block cut into pieces of at most `-chunk` bytes sent
//! with `cpnet_putmem_signal_nbi` into `-slots` staging slots of the
//! receiver (SET signal = message index + 1), acknowledged with
//! `cpnet_uint64_atomic_add` on the sender's word. The block's leader
//! thread runs the ring's state machine; the whole block performs each
//! action (the put, or the reduction of a received piece into the output,
//! on the GPU). The per-ring schedule (segment, blocks, steps, message
//! offsets) is [`RingPlan`], computed on the host and handed to the kernel
//! as a table; the message counters and acknowledgement words live across
//! allreduces and launches, as on the CPU.
//!
//! - `-variant intra-kernel`: one cooperative launch per size and mode runs
//!   `-warmup` then `-iters` allreduces back to back (the paper's persistent
//!   kernel); the time is taken on the GPU (`%globaltimer`) between two grid
//!   barriers, after the warm-up and after the timed allreduces.
//! - `-variant inter-kernel`: one launch per ring step (`2(n-1)` per
//!   allreduce; every block sends and receives that step's pieces, then the
//!   kernel ends and its contexts quiet), synchronized with the next step at
//!   the kernel boundary: the pipelining across steps is lost, as in the
//!   paper's Inter-Kernel baseline. Timed on the host around the launches.
//!   A size the library takes (`-algo team`, or `auto` up to `-team-max`)
//!   is one `GpuPe::team_reduce_on_stream` call per allreduce instead: the
//!   library's host-side form, launched as NCCL's allreduce is (one block;
//!   from `cpnet::gpu::REDUCE_GRID_MIN_BYTES` a grid where the heaps are
//!   mapped).
//!
//! The check (`-check 1`) and the output are the CPU variant's: inputs are
//! small integers, so every type's sum is exact and `#wrong` counts every
//! element that differs, summed over PEs.

use std::time::Instant;

use anyhow::{Context, bail, ensure};
use cpnet::GpuPe;
use cpnet::device::cpu::{ReduceOp, SymAddr};
use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::{
    Args, DataType, Elem, Layout, RingPlan, min_seg_elems, heap_need, input_value, print_header, sweep_with, wrong_elements,
};
use crate::cli::{Variant, init_gpu_pe};
use crate::gpu::{check_launch, kernel_source, max_coresident, new_ctl};

/// Threads per ring block.
pub const THREADS: u32 = 512;

/// An idle ring issues a blocking no-op this often (ns), as the CPU
/// variant's probe: polling heap words cannot see the job fail.
const PROBE_EVERY_NS: u64 = 2_000_000;

/// Plan words a ring block keeps in shared memory (8 KiB; a ring's plan
/// is `4 + 3n + 4(2(n - 1) + 1)` = `11n` words, so up to 93 PEs); larger plans are
/// read from global memory.
const PLAN_SHARED_WORDS: usize = 1024;

/// Polls of the next signal and the acknowledgement word the ring leader
/// makes alone before an idle round of the whole block.
const LEADER_SPIN: u32 = 64;

/// Control block words of the allreduce kernel.
mod arctl {
    use crate::gpu::ctl::APP;
    /// `%globaltimer` after the warm-up's grid barrier.
    pub const T0: usize = APP;
    /// `%globaltimer` after the timed allreduces' grid barrier.
    pub const T1: usize = APP + 1;
}

/// Word offsets of a ring's plan table (`AR_PLAN_*`).
mod plan {
    /// Steps (`2(n-1)`).
    pub const STEPS: usize = 0;
    /// First element of the ring's segment.
    pub const SEG_OFF: usize = 1;
    /// Elements of the segment.
    pub const SEG_LEN: usize = 2;
    /// PEs.
    pub const N: usize = 3;
    /// Per block (3 words each): first element, elements, first piece index;
    /// then per step `0 ..= steps` (4 words each): block sent, block
    /// received, first message sent, first message received.
    pub const BLOCKS: usize = 4;
}

/// The kernels' source with every `#define` they need.
pub fn source() -> String {
    let defines = [
        ("AR_PLAN_STEPS", plan::STEPS.to_string()),
        ("AR_PLAN_SEG_OFF", plan::SEG_OFF.to_string()),
        ("AR_PLAN_SEG_LEN", plan::SEG_LEN.to_string()),
        ("AR_PLAN_N", plan::N.to_string()),
        ("AR_PLAN_BLOCKS", plan::BLOCKS.to_string()),
        ("AR_CTL_T0", arctl::T0.to_string()),
        ("AR_CTL_T1", arctl::T1.to_string()),
        ("AR_THREADS", THREADS.to_string()),
        ("AR_PROBE_EVERY_NS", format!("{PROBE_EVERY_NS}ull")),
        ("AR_PLAN_SHARED_WORDS", PLAN_SHARED_WORDS.to_string()),
        ("AR_LEADER_SPIN", LEADER_SPIN.to_string()),
    ];
    kernel_source(&defines, include_str!("allreduce.cu"))
}

/// `ar_params` of `allreduce.cu`, field for field (all 8 bytes: no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ArParams {
    input: u64,
    output: u64,
    staging: u64,
    sigs: u64,
    acks: u64,
    slots: u64,
    chunk: u64,
    sig_stride: u64,
    plan: u64,
    plan_stride: u64,
    out_sent: u64,
    out_sent_stride: u64,
    counts: u64,
    ctl: u64,
    piece: u64,
    prev: i64,
    next: i64,
    in_place: i64,
    s0: i64,
    s1: i64,
    warmup: i64,
    iters: i64,
    timed: i64,
    team: i64,
    count: u64,
}

// SAFETY: repr(C), plain 8-byte integers, laid out as `struct ar_params`
// (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for ArParams {}

/// The plan tables of every ring of this PE, as the kernel reads them:
/// `(table, words per ring, pieces per ring at most)`.
pub fn plan_tables(
    count: usize,
    rings: usize,
    n: usize,
    me: usize,
    piece: usize,
    min_seg: usize,
) -> (Vec<u64>, usize, usize) {
    let steps = 2 * (n - 1);
    let stride = plan::BLOCKS + 3 * n + 4 * (steps + 1);
    let mut table = Vec::with_capacity(rings * stride);
    let mut max_pieces = 1;
    for ring in 0..rings {
        let p = RingPlan::new(count, rings, ring, n, me, piece, min_seg);
        assert_eq!(p.steps(), steps);
        table.extend_from_slice(&[steps as u64, p.seg_off as u64, p.seg_len as u64, n as u64]);
        let mut base = 0usize;
        for b in 0..n {
            let (off, len) = p.blocks[b];
            table.extend_from_slice(&[(p.seg_off + off) as u64, len as u64, base as u64]);
            base += p.pieces(b);
        }
        max_pieces = max_pieces.max(base);
        for s in 0..=steps {
            let (sb, rb) = if s < steps {
                (p.send_block[s], p.recv_block[s])
            } else {
                (0, 0)
            };
            table.extend_from_slice(&[
                sb as u64,
                rb as u64,
                p.send_off[s] as u64,
                p.recv_off[s] as u64,
            ]);
        }
        debug_assert_eq!(table.len(), (ring + 1) * stride);
    }
    (table, stride, max_pieces)
}

/// `v` as its bytes.
fn bytes_of<T: Elem>(v: &[T]) -> &[u8] {
    // SAFETY: Elem is implemented for f32, f64 and i32 only: plain values
    // without padding, so every byte of the slice is initialized.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), size_of_val(v)) }
}

/// The device address of a buffer of the PE's stream.
fn dptr<T>(pe: &GpuPe, s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = s.device_ptr(pe.stream());
    p
}

/// The rings of this PE on its GPU.
struct GpuRings {
    layout: Layout,
    rings: usize,
    /// `-min-ring-bytes`.
    min_ring_bytes: u64,
    /// Messages sent and received per ring, across allreduces and launches
    /// (the signal and acknowledgement words count the same messages).
    counts: CudaSlice<u64>,
    module: std::sync::Arc<CudaModule>,
    variant: Variant,
}

impl GpuRings {
    /// Run `warmup + iters` allreduces of `count` elements of `T` on every
    /// ring with the buffers of `layout` (with `team`, block 0 calls the
    /// library's reduce instead: `-algo`); returns seconds per timed
    /// allreduce on this PE.
    #[allow(clippy::too_many_arguments)]
    fn run<T: Elem>(
        &self,
        pe: &GpuPe,
        layout: &Layout,
        count: usize,
        in_place: bool,
        warmup: u32,
        iters: u32,
        piece: usize,
        team: bool,
    ) -> anyhow::Result<f64> {
        let (me, n) = (pe.my_pe(), pe.n_pes());
        let s = pe.stream();
        let name = format!("ar_ring_{}", <T as Elem>::NAME);
        let func = self
            .module
            .load_function(&name)
            .with_context(|| format!("kernel {name}"))?;
        // Gives this type's kernel the landing agents' carveout (the probe's
        // count at run start holds for every type: same shape).
        max_coresident(pe, &func, THREADS)?;
        let (table, stride, max_pieces) =
            plan_tables(count, self.rings, n as usize, me as usize, piece, min_seg_elems::<T>(self.min_ring_bytes));
        let plan_buf = s.clone_htod(&table).context("plan tables")?;
        let out_sent = s.alloc_zeros::<u64>(self.rings * max_pieces)?;
        let ctl_buf = new_ctl(pe)?;
        let mut p = ArParams {
            input: pe.dev_ptr(layout.input),
            output: pe.dev_ptr(layout.output),
            staging: pe.dev_ptr(layout.staging),
            sigs: pe.dev_ptr(layout.sigs),
            acks: pe.dev_ptr(layout.acks),
            slots: layout.slots,
            chunk: layout.chunk,
            sig_stride: Layout::sig_stride(layout.slots),
            plan: dptr(pe, &plan_buf),
            plan_stride: stride as u64,
            out_sent: dptr(pe, &out_sent),
            out_sent_stride: max_pieces as u64,
            counts: dptr(pe, &self.counts),
            ctl: dptr(pe, &ctl_buf),
            piece: piece as u64,
            prev: i64::from((me + n - 1) % n),
            next: i64::from((me + 1) % n),
            in_place: i64::from(in_place),
            s0: 0,
            s1: i64::MAX,
            warmup: i64::from(warmup),
            iters: i64::from(iters),
            timed: 1,
            team: i64::from(team),
            count: count as u64,
        };
        let cfg = LaunchConfig {
            grid_dim: (self.rings as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let h = pe.handle();
        let launch = |p: &ArParams| -> anyhow::Result<()> {
            let mut b = s.launch_builder(&func);
            b.arg(&h).arg(p);
            // SAFETY: the arguments match ar_ring_<T>(cpnet_handle_t,
            // ar_params); every pointer in `p` is a live allocation of the
            // size the kernel indexes (the heap buffers of `layout`, sized by
            // heap_need; the plan table, out_sent scratch, counters and
            // control block held until the check_launch below). Cooperative:
            // the rings' blocks must be resident together (ring i of PE p
            // waits for ring i of its neighbours, and the timing uses grid
            // barriers); rings <= the co-resident maximum (checked at start).
            unsafe { b.launch_cooperative(cfg) }.with_context(|| format!("launch {name}"))?;
            Ok(())
        };
        match self.variant {
            Variant::IntraKernel => {
                launch(&p)?;
                let w = check_launch(pe, &ctl_buf, &name, "message")?;
                Ok(if iters > 0 {
                    w[arctl::T1].saturating_sub(w[arctl::T0]) as f64 / 1e9 / f64::from(iters)
                } else {
                    0.0
                })
            }
            Variant::InterKernel => {
                p.timed = 0;
                p.warmup = 0;
                p.iters = 1;
                let steps = 2 * (n as i64 - 1);
                let world = pe.team_world();
                let one = |p: &mut ArParams| -> anyhow::Result<()> {
                    if p.team != 0 {
                        // The library's host-side form: one block, or a
                        // grid from REDUCE_GRID_MIN_BYTES where the heaps
                        // are mapped (runtime/src/gpu/reduce_grid.rs).
                        pe.team_reduce_on_stream::<T>(&world, ReduceOp::Sum, layout.output, layout.input, count, s)?;
                        return Ok(());
                    }
                    if steps == 0 {
                        (p.s0, p.s1) = (0, 0);
                        return launch(p);
                    }
                    for step in 0..steps {
                        (p.s0, p.s1) = (step, step + 1);
                        launch(p)?;
                    }
                    Ok(())
                };
                for _ in 0..warmup {
                    one(&mut p)?;
                }
                check_launch(pe, &ctl_buf, &name, "message")?;
                let t = Instant::now();
                for _ in 0..iters {
                    one(&mut p)?;
                }
                check_launch(pe, &ctl_buf, &name, "message")?;
                let secs = t.elapsed().as_secs_f64();
                Ok(if iters > 0 {
                    secs / f64::from(iters)
                } else {
                    0.0
                })
            }
            Variant::Cpu => bail!("internal: the cpu variant does not run here"),
        }
    }
}

/// Fill the input with PE `me`'s values (and the output with poison when
/// out-of-place).
fn prepare<T: Elem>(
    pe: &GpuPe,
    layout: &Layout,
    count: usize,
    in_place: bool,
) -> anyhow::Result<()> {
    let me = pe.my_pe() as usize;
    let input: Vec<T> = (0..count)
        .map(|i| T::from_small(input_value(me, i)))
        .collect();
    pe.write_heap(layout.input, bytes_of(&input))?;
    if !in_place {
        pe.write_heap(layout.output, bytes_of(&vec![T::poison(); count]))?;
    }
    Ok(())
}

/// Elements of the result that differ from the exact sum.
fn count_wrong<T: Elem>(pe: &GpuPe, layout: &Layout, count: usize) -> anyhow::Result<u64> {
    let n = pe.n_pes() as usize;
    let mut got = vec![T::poison(); count];
    // SAFETY: `got` is a live, exclusively borrowed buffer of a plain type
    // (f32, f64 or i32: every bit pattern is valid), viewed as its bytes for
    // the copy.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(got.as_mut_ptr().cast::<u8>(), size_of_val(&got[..]))
    };
    pe.read_heap(layout.output, bytes)?;
    Ok(wrong_elements(&got, n))
}

fn sweep<T: Elem>(pe: &GpuPe, args: &Args, rings: &GpuRings) -> anyhow::Result<u64> {
    let piece = (args.chunk / size_of::<T>() as u64) as usize;
    sweep_with::<T>(
        pe.my_pe(),
        pe.n_pes(),
        args,
        |blob| Ok(pe.allgather_bytes(blob)?),
        |count, in_place| {
            let layout = rings.layout.for_run(in_place);
            let team = args.use_team((count * size_of::<T>()) as u64);
            prepare::<T>(pe, &layout, count, in_place)?;
            pe.barrier_all()?;
            let secs =
                rings.run::<T>(pe, &layout, count, in_place, args.warmup, args.iters, piece, team)?;
            let mut wrong = 0;
            if args.check == 1 {
                prepare::<T>(pe, &layout, count, in_place)?;
                rings.run::<T>(pe, &layout, count, in_place, 0, 1, piece, team)?;
                wrong = count_wrong::<T>(pe, &layout, count)?;
            }
            Ok((secs, wrong))
        },
    )
}

/// The GPU variants' program. **Collective.** Returns the total `#wrong`.
///
/// # Errors
/// No GPU, more rings than queues or than fit on the GPU at once, init,
/// kernel build and run errors (naming PE, work-group, operation and
/// address).
pub fn run(args: &Args) -> anyhow::Result<u64> {
    let (pe, raised) = init_gpu_pe(args.variant, |_| heap_need(args), args.wgs as usize)?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let rings = args.wgs as usize;
    let queues = pe.handle().0.n_queues as usize;
    ensure!(
        rings <= queues,
        "-wgs {rings}: every ring's block needs its own command queue and this PE has {queues} \
         (raise CPNET_QUEUES, or unset it to let the allreduce size it)"
    );
    let module = pe.build_module("allreduce.cu", &source())?;
    let probe: CudaFunction = module
        .load_function("ar_ring_float")
        .context("kernel ar_ring_float")?;
    let max_blocks = max_coresident(&pe, &probe, THREADS)? as usize;
    ensure!(
        rings <= max_blocks,
        "-wgs {rings}: at most {max_blocks} blocks of {THREADS} threads fit on this GPU at once, and \
         every ring's block must be resident"
    );
    let (r, k) = (args.wgs as u64, u64::from(args.slots));
    let data = args.max_bytes.max(8);
    let alloc = |bytes: u64| -> anyhow::Result<SymAddr> { Ok(pe.shmalloc(bytes)?) };
    let layout = Layout {
        input: alloc(data)?,
        output: alloc(data)?,
        staging: alloc(r * k * args.chunk)?,
        sigs: alloc(r * Layout::sig_stride(k))?,
        acks: alloc(64 * r)?,
        slots: k,
        chunk: args.chunk,
    };
    let gpu_rings = GpuRings {
        layout,
        rings,
        min_ring_bytes: args.min_ring_bytes,
        counts: pe.stream().alloc_zeros::<u64>(2 * rings)?,
        module,
        variant: args.variant,
    };
    pe.barrier_all()?;
    if me == 0 {
        print_header(args, n, pe.provider(), raised);
    }
    let wrong = match args.dtype {
        DataType::Float => sweep::<f32>(&pe, args, &gpu_rings)?,
        DataType::Int32 => sweep::<i32>(&pe, args, &gpu_rings)?,
        DataType::Double => sweep::<f64>(&pe, args, &gpu_rings)?,
    };
    drop(gpu_rings);
    pe.finalize()?;
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables say what RingPlan says, in the words the kernel reads.
    #[test]
    fn plan_tables_follow_ring_plans() {
        for n in 1..=4 {
            for rings in 1..=3 {
                for count in [0, 1, 7, 100, 1001] {
                    for piece in [1, 5, 64] {
                        for me in 0..n {
                            let (t, stride, max_pieces) = plan_tables(count, rings, n, me, piece, 1);
                            assert_eq!(t.len(), rings * stride);
                            for ring in 0..rings {
                                let p = RingPlan::new(count, rings, ring, n, me, piece, 1);
                                let w = &t[ring * stride..(ring + 1) * stride];
                                let steps = w[plan::STEPS] as usize;
                                assert_eq!(steps, p.steps());
                                assert_eq!(w[plan::SEG_OFF] as usize, p.seg_off);
                                let step = |s: usize, k: usize| {
                                    w[plan::BLOCKS + 3 * n + 4 * s + k] as usize
                                };
                                assert_eq!(step(steps, 2), p.sends());
                                assert_eq!(step(steps, 3), p.recvs());
                                let mut pieces = 0;
                                for b in 0..n {
                                    let blk = &w[plan::BLOCKS + 3 * b..plan::BLOCKS + 3 * b + 3];
                                    assert_eq!(blk[0] as usize, p.seg_off + p.blocks[b].0);
                                    assert_eq!(blk[1] as usize, p.blocks[b].1);
                                    assert_eq!(blk[2] as usize, pieces);
                                    pieces += p.pieces(b);
                                }
                                assert!(pieces <= max_pieces);
                                for s in 0..steps {
                                    assert_eq!(step(s, 0), p.send_block[s]);
                                    assert_eq!(step(s, 1), p.recv_block[s]);
                                    assert_eq!(step(s, 2), p.send_off[s]);
                                    assert_eq!(step(s, 3), p.recv_off[s]);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The Rust mirror has as many 8-byte fields as the C struct declares.
    #[test]
    fn params_mirror_the_kernel_struct() {
        let fields = crate::gpu::c_struct_fields(&source(), "ar_params");
        assert_eq!(size_of::<ArParams>(), fields * 8);
    }

    /// The kernels compile with NVRTC, without a warning or a
    /// non-coherent load.
    #[test]
    fn kernels_compile() {
        crate::gpu::check_kernels_compile("allreduce kernels_compile", &source());
    }
}
