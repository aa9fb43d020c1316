//! `moe`: expert-parallel token dispatch and combine in the style of
//! DeepEP's low-latency kernels (issue 22, item 4), on cpnet's one-sided
//! puts and signals from inside the work-groups.
//!
//! Every PE holds `T` tokens of hidden size `H` in bfloat16 and routes each
//! to its top-`k` of `E` experts (seeded random routing, or skewed: expert
//! popularity ∝ 1 / (rank + 1)^s, Zipf); the experts are spread evenly over
//! the PEs (`E / n` each, expert `e` on PE `e / (E / n)`).
//!
//! **Dispatch** (one put per (token, expert), as DeepEP's low-latency
//! mode): the token goes to receive slot `slot(t, e)` of expert `e`'s region
//! for this source PE on the expert's PE, with an 8-byte record
//! `(t, j)` (token index, top-k position) beside it; `slot` counts this
//! PE's tokens routed to `e` before `t`, so no atomics are needed. After
//! every put to a PE, one put-with-signal carries the per-expert counts and
//! sets the source's dispatch signal to the iteration's epoch.
//!
//! **Experts** run on the receiving PE: expert `e`'s output is the
//! elementwise `y = bf16(x * s_e + b_e)` (`s_e = 1 + e / E`, `b_e = e /
//! 1024`), a stand-in for the expert MLP that keeps the check exact.
//!
//! **Combine**: each output goes back to slot `(t, j)` of the source's
//! combine buffer; after all of them, one signal per source. The source then
//! computes `out[t] = Σ_j w_j y_j` in f32, j in order.
//!
//! `-verify` compares every element of `out` with a reference the PE
//! computes from its own tokens and the same routing (the same operations
//! in the same order: bit-exact), and prints `#wrong`.
//!
//! Buffers are reused across iterations without a barrier: a source
//! dispatches iteration i + 1 to a PE only after that PE's combine signal
//! for iteration i (so the PE has read its receive slots), and a PE writes
//! a source's combine buffer for i + 1 only after that source's dispatch
//! for i + 1 (so the source has read it).
//!
//! The GPU kernel ([`gpu`]) takes the same steps over buffers packed per
//! source instead: no records (an output returns to the position its token
//! came from), and a PE on the network path gets a source's tokens as a few
//! large puts rather than one per row.
//!
//! Layout of the CPU variant (one symmetric allocation, every region 64-byte
//! aligned):
//! `x[T][H]` bf16; `recv[E/n][n][T][H]` bf16 (slot `(el, src, slot)`);
//! `meta[E/n][n][T]` u64 (`t | j << 32`); `counts[n][E/n]` u64 (row per
//! source); `disp_sig[n]`, `comb_sig[n]` u64; `comb[T][k][H]` bf16;
//! `meta_out[T][k]` u64 and `counts_out[n][E/n]` u64 (the sources of the
//! small puts).

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use cpnet::device::cpu::{Error as WgError, Result as WgResult, SymAddr};
use cpnet::device::layout::{Cmp, SignalOp};
use cpnet::{Pe, WorkGroup};

use crate::cli::Variant;
use crate::team::TeamBarrier;

pub mod gpu;

/// Command line of `moe`.
#[derive(Parser, Debug, Clone)]
#[command(about = "Expert-parallel MoE dispatch and combine (DeepEP low-latency style) over cpnet")]
pub struct Args {
    /// Tokens per PE (T).
    #[arg(short = 't', long, default_value_t = 128)]
    pub tokens: usize,
    /// Hidden size (H), bfloat16 elements per token.
    #[arg(long, default_value_t = 7168)]
    pub hidden: usize,
    /// Experts per token (k).
    #[arg(short = 'k', long, default_value_t = 8)]
    pub topk: usize,
    /// Experts in all (E), a multiple of the number of PEs.
    #[arg(short = 'e', long, default_value_t = 256)]
    pub experts: usize,
    /// Skewed routing: expert popularity ∝ 1 / (rank + 1)^skew (0: uniform).
    #[arg(long, default_value_t = 0.0)]
    pub skew: f64,
    /// Routing and token seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Timed iterations.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Work-groups per PE: CPU threads (`cpu`) or thread blocks
    /// (`intra-kernel`; default 2 for cpu, 32 for intra-kernel).
    #[arg(long)]
    pub wgs: Option<u32>,
    /// Where the work-groups run: `cpu` threads, or the blocks of one
    /// persistent GPU kernel (`intra-kernel`).
    #[arg(long, value_enum, default_value = "cpu")]
    pub variant: Variant,
    /// Check every output element against the reference.
    #[arg(long)]
    pub verify: bool,
    /// GPU variant, PEs on the network path: the least bytes of one of the
    /// puts a packed run is cut into (one per block where the run is
    /// larger). K, M suffixes.
    #[arg(long, default_value = "256K", value_parser = crate::cli::parse_size)]
    pub bulk_min: u64,
}

impl Args {
    /// Work-groups per PE: `-wgs`, or 2 CPU threads / 32 blocks.
    pub fn wgs(&self) -> u32 {
        self.wgs.unwrap_or(if self.variant == Variant::Cpu { 2 } else { 32 })
    }
}

/// The header line (PE 0): the job, the workload and how it runs.
pub fn print_header(a: &Args, n: i32, provider: &str, raised: Option<u64>, variant: &str, wgs: &str) {
    println!(
        "# cpnet moe: {n} PEs, variant {variant}, {wgs} per PE; T={} tokens/PE, H={}, k={}, E={} ({} per PE), {} routing (seed {}), provider {}{}",
        a.tokens,
        a.hidden,
        a.topk,
        a.experts,
        a.experts / n.max(1) as usize,
        if a.skew > 0.0 { format!("skewed (Zipf s={})", a.skew) } else { "uniform".to_owned() },
        a.seed,
        provider,
        raised.map(|b| format!(", heap raised to {b} bytes")).unwrap_or_default()
    );
}

/// SplitMix64 (Steele, Lea, Flood 2014): a seeded, portable generator for
/// the routing and the tokens, the same on every PE and platform.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// f32 to bfloat16 bits, round to nearest even (NaN stays NaN).
pub fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// bfloat16 bits to f32 (exact).
pub fn f32_of(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Expert `e`'s output element for input element `x` (bf16 bits), of `n_experts`.
pub fn expert(e: usize, n_experts: usize, x: u16) -> u16 {
    let s = 1.0 + e as f32 / n_experts as f32;
    let b = e as f32 / 1024.0;
    bf16(f32_of(x).mul_add(s, b))
}

/// One PE's routing: for token t, its k (expert, weight) pairs.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// `route[t * k + j] = (expert, weight)`; experts of a token distinct,
    /// weights positive and summing to 1 (a softmax of random logits).
    pub route: Vec<(usize, f32)>,
    /// `slot[t * k + j]`: the receive slot of that token at that expert
    /// (tokens of this PE routed to the expert before t).
    pub slot: Vec<usize>,
    /// `count[e]`: this PE's tokens routed to expert e.
    pub count: Vec<usize>,
}

impl Routing {
    /// The routing of PE `pe` for `a` (deterministic in seed and PE).
    ///
    /// # Errors
    /// `k > E`, `E == 0`, or a skew that is negative or not finite.
    pub fn new(a: &Args, pe: i32) -> Result<Routing> {
        let (t_n, k, e_n) = (a.tokens, a.topk, a.experts);
        if e_n == 0 || k == 0 || k > e_n {
            bail!("-topk {k} must be in 1..=experts ({e_n})");
        }
        if !a.skew.is_finite() || a.skew < 0.0 {
            bail!("-skew {} must be a finite number >= 0", a.skew);
        }
        let mut rng = SplitMix::new(a.seed ^ (0x5151_0000 + pe as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        // Expert popularity: a seeded permutation ranks the experts (the
        // same on every PE), rank r weighs 1 / (r + 1)^skew.
        let mut order: Vec<usize> = (0..e_n).collect();
        let mut prng = SplitMix::new(a.seed);
        for i in (1..e_n).rev() {
            order.swap(i, (prng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut pop = vec![0f64; e_n];
        for (r, &e) in order.iter().enumerate() {
            pop[e] = 1.0 / ((r + 1) as f64).powf(a.skew);
        }
        let mut route = Vec::with_capacity(t_n * k);
        let mut slot = Vec::with_capacity(t_n * k);
        let mut count = vec![0usize; e_n];
        for _ in 0..t_n {
            // k distinct experts, each drawn ∝ popularity among those left.
            let mut left = pop.clone();
            let mut chosen = Vec::with_capacity(k);
            for _ in 0..k {
                let total: f64 = left.iter().sum();
                let mut u = rng.next_f64() * total;
                let mut pick = left.iter().rposition(|&p| p > 0.0).expect("k <= E leaves an expert");
                for (e, &p) in left.iter().enumerate() {
                    if p > 0.0 && u < p {
                        pick = e;
                        break;
                    }
                    u -= p;
                }
                left[pick] = 0.0;
                chosen.push(pick);
            }
            let logits: Vec<f64> = (0..k).map(|_| rng.next_f64() * 4.0).collect();
            let m = logits.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
            for (j, &e) in chosen.iter().enumerate() {
                route.push((e, ((logits[j] - m).exp() / z) as f32));
                slot.push(count[e]);
                count[e] += 1;
            }
        }
        Ok(Routing { route, slot, count })
    }
}

/// Token element `i` of token `t` on PE `pe` (bf16 bits), in [-1, 1).
pub fn token(seed: u64, pe: i32, t: usize, i: usize) -> u16 {
    let mut r = SplitMix::new(seed ^ ((pe as u64) << 48) ^ ((t as u64) << 24) ^ i as u64);
    bf16((r.next_f64() * 2.0 - 1.0) as f32)
}

/// The reference output of this PE's token `t`: `Σ_j w_j expert_j(x)` in
/// f32, j in order, from the bf16 expert outputs (what combine computes).
pub fn reference(a: &Args, pe: i32, r: &Routing, t: usize) -> Vec<f32> {
    let mut out = vec![0f32; a.hidden];
    for j in 0..a.topk {
        let (e, w) = r.route[t * a.topk + j];
        for (i, o) in out.iter_mut().enumerate() {
            *o += w * f32_of(expert(e, a.experts, token(a.seed, pe, t, i)));
        }
    }
    out
}

/// Byte offsets of the regions in the PE's symmetric block (CPU variant;
/// the GPU variant's are [`gpu::GpuLayout`]).
#[derive(Clone, Copy, Debug)]
struct Layout {
    x: u64,
    recv: u64,
    meta: u64,
    counts: u64,
    disp_sig: u64,
    comb_sig: u64,
    comb: u64,
    meta_out: u64,
    counts_out: u64,
    total: u64,
}

/// Hands out 64-byte aligned byte offsets in a symmetric block, in order.
#[derive(Default)]
struct Regions(u64);

impl Regions {
    /// The offset of the next region of `bytes`.
    fn take(&mut self, bytes: u64) -> u64 {
        let at = self.0;
        self.0 = (self.0 + bytes).next_multiple_of(64);
        at
    }
}

impl Layout {
    fn new(a: &Args, n: usize) -> Layout {
        let (t, h, k, el) = (a.tokens as u64, a.hidden as u64, a.topk as u64, (a.experts / n) as u64);
        let n = n as u64;
        let mut r = Regions::default();
        let x = r.take(t * h * 2);
        let recv = r.take(el * n * t * h * 2);
        let meta = r.take(el * n * t * 8);
        let counts = r.take(n * el * 8);
        let disp_sig = r.take(n * 8);
        let comb_sig = r.take(n * 8);
        let comb = r.take(t * k * h * 2);
        let meta_out = r.take(t * k * 8);
        let counts_out = r.take(n * el * 8);
        Layout { x, recv, meta, counts, disp_sig, comb_sig, comb, meta_out, counts_out, total: r.0 }
    }
}

/// Whether `a` can run on `n` PEs (before any PE starts work).
///
/// # Errors
/// E not a positive multiple of `n`, k outside 1..=E, no tokens, no
/// hidden elements, no work-groups, a negative or non-finite skew.
pub fn check(a: &Args, n: usize) -> Result<()> {
    if a.experts == 0 || !a.experts.is_multiple_of(n) {
        bail!("-experts {} must be a positive multiple of the number of PEs ({n})", a.experts);
    }
    if a.topk == 0 || a.topk > a.experts {
        bail!("-topk {} must be in 1..=experts ({})", a.topk, a.experts);
    }
    if a.tokens == 0 || a.hidden == 0 || a.tokens > u32::MAX as usize {
        bail!("-tokens and -hidden must be positive (and tokens < 2^32)");
    }
    if a.wgs == Some(0) {
        bail!("-wgs must be at least 1");
    }
    if a.bulk_min == 0 {
        bail!("-bulk-min must be at least 1 byte");
    }
    if a.variant == Variant::InterKernel {
        bail!("-variant inter-kernel is not built for moe (dispatch and combine run inside one kernel); use intra-kernel or cpu");
    }
    if !a.skew.is_finite() || a.skew < 0.0 {
        bail!("-skew {} must be a finite number >= 0", a.skew);
    }
    Ok(())
}

/// What PE `me` writes into its block (at the offsets of [`Layout`])
/// before the first iteration: its tokens, the `(t, j)` records and the
/// per-PE count rows its small puts send, all unchanged between
/// iterations, and the zeroed signal words.
fn initial_regions(a: &Args, me: i32, r: &Routing, l: &Layout, n: usize) -> [(u64, Vec<u8>); 5] {
    let (t_n, k, el) = (a.tokens, a.topk, a.experts / n);
    let record = |i: usize| (i / k) as u64 | (((i % k) as u64) << 32);
    let meta = (0..t_n * k).flat_map(|i| record(i).to_le_bytes()).collect();
    let counts = (0..n * el).flat_map(|i| (r.count[i] as u64).to_le_bytes()).collect();
    [
        (l.x, tokens_bytes(a, me)),
        (l.meta_out, meta),
        (l.counts_out, counts),
        (l.disp_sig, vec![0; 8 * n]),
        (l.comb_sig, vec![0; 8 * n]),
    ]
}

/// PE `me`'s tokens, `[T][H]` bf16, little-endian bytes.
fn tokens_bytes(a: &Args, me: i32) -> Vec<u8> {
    let h = a.hidden;
    (0..a.tokens * h).flat_map(|i| token(a.seed, me, i / h, i % h).to_le_bytes()).collect()
}

/// Elements of `out` (`[T][H]` f32, this PE's combined tokens) that differ
/// from [`reference`] bit for bit; the first few are printed.
fn count_wrong(a: &Args, me: i32, r: &Routing, out: &[f32]) -> u64 {
    let h = a.hidden;
    let mut wrong = 0u64;
    for t in 0..a.tokens {
        let want = reference(a, me, r, t);
        for (i, (&g, &x)) in out[t * h..][..h].iter().zip(&want).enumerate() {
            if g.to_bits() != x.to_bits() {
                if wrong < 5 {
                    eprintln!("moe: PE {me}: token {t} element {i}: got {g}, want {x}");
                }
                wrong += 1;
            }
        }
    }
    wrong
}

/// Symmetric heap bytes `moe` needs per PE for `a` on `n` PEs with CPU
/// work-groups (the GPU kernel's: [`gpu::heap_bytes`]).
pub fn heap_bytes(a: &Args, n: usize) -> u64 {
    Layout::new(a, n).total + (1 << 20)
}

/// What one PE measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    /// Mean µs from an iteration's start to the last dispatch signal seen.
    pub dispatch_us: f64,
    /// Mean µs from the outputs' first put (the experts done) to the last
    /// combine signal seen.
    pub combine_us: f64,
    /// Mean µs of the experts (between dispatch and combine, not in either).
    pub experts_us: f64,
}

/// Run the workload on CPU work-groups; returns (timing, wrong elements;
/// 0 without `-verify`). **Collective.**
///
/// # Errors
/// Bad arguments (E not a multiple of the PEs, k > E), a heap too small
/// (names the bytes needed), and work-group errors.
pub fn run_cpu(pe: &Pe, a: &Args) -> Result<(Timing, u64)> {
    let n = pe.n_pes() as usize;
    let me = pe.my_pe();
    check(a, n)?;
    let r = Routing::new(a, me)?;
    let l = Layout::new(a, n);
    let base = pe
        .shmalloc(l.total)
        .with_context(|| format!("moe needs {} bytes of symmetric heap per PE (set CPNET_HEAP_SIZE)", heap_bytes(a, n)))?;
    let at = |off: u64| SymAddr(base.0 + off);
    for (off, bytes) in initial_regions(a, me, &r, &l, n) {
        pe.heap().write_bytes(at(off), &bytes).map_err(|c| anyhow::anyhow!("writing the initial tables: {c}"))?;
    }
    pe.barrier_all()?;

    let team = TeamBarrier::new(a.wgs() as usize);
    let times = std::sync::Mutex::new(Timing::default());
    let out = std::sync::Mutex::new(vec![0f32; a.tokens * a.hidden]);
    pe.run_work_groups(a.wgs(), |wg: &mut WorkGroup| -> WgResult<()> {
        // A failing work-group breaks the team barrier, so that the others
        // stop instead of waiting for it; its error is the one reported.
        let r = work_group(wg, a, &r, l, base, (&team, &times, &out));
        if r.is_err() {
            team.abort();
        }
        r
    })?;
    pe.barrier_all()?;
    let wrong = if a.verify {
        count_wrong(a, me, &r, &out.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner))
    } else {
        0
    };
    pe.shfree(base)?;
    Ok((times.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner), wrong))
}

/// What the work-groups of one PE share.
type Shared<'a> = (&'a TeamBarrier, &'a std::sync::Mutex<Timing>, &'a std::sync::Mutex<Vec<f32>>);

/// One work-group's part of every iteration (see the module docs).
fn work_group(wg: &mut WorkGroup, a: &Args, r: &Routing, l: Layout, base: SymAddr, (team, times, out): Shared<'_>) -> WgResult<()> {
    let n = wg.n_pes() as usize;
    let me = wg.my_pe();
    let at = |off: u64| SymAddr(base.0 + off);
    let (t_n, h, k, el) = (a.tokens, a.hidden, a.topk, a.experts / n);
    let hb = (h * 2) as u64;
    let total = a.warmup + a.iters;
    let w = wg.wg() as usize;
    let nw = a.wgs() as usize;
        let (mut disp_sum, mut exp_sum, mut comb_sum) = (0f64, 0f64, 0f64);
    let mut buf = vec![0u8; h * 2];
    for it in 0..total {
        let epoch = it as u64 + 1;
        let t0 = Instant::now();
        // Dispatch: our tokens, round-robin over the work-groups. Every
        // destination's slots are free: its combine signal for the last
        // iteration came back (waited for at the end of it).
        for t in (w..t_n).step_by(nw) {
            for j in 0..k {
                let (e, _) = r.route[t * k + j];
                let (d, e_l) = ((e / el) as i32, e % el);
                let s = r.slot[t * k + j];
                let idx = ((e_l * n + me as usize) * t_n + s) as u64;
                wg.putmem_nbi(at(l.recv + idx * hb), at(l.x + t as u64 * hb), hb, d)?;
                wg.putmem_nbi(at(l.meta + 8 * idx), at(l.meta_out + 8 * (t * k + j) as u64), 8, d)?;
            }
        }
        wg.quiet()?;
        if !team.wait() {
            return Ok(());
        }
        // Counts and the dispatch signal, one put-with-signal per PE.
        for d in (w..n).step_by(nw) {
            let row = at(l.counts_out + 8 * (d * el) as u64);
            let dst = at(l.counts + 8 * (me as usize * el) as u64);
            wg.putmem_signal_nbi(dst, row, (el * 8) as u64, at(l.disp_sig + 8 * me as u64), epoch, SignalOp::Set, d as i32)?;
        }
        // Receive: every source's tokens for our experts.
        for s in 0..n {
            wg.signal_wait_until(at(l.disp_sig + 8 * s as u64), Cmp::Ge, epoch)?;
        }
        let t1 = Instant::now();
        // Experts (pass 0: every received slot, round-robin over the
        // work-groups, the output replacing the input in its slot), a team
        // barrier, then the combine (pass 1: each output put home). Timed
        // apart, as DeepEP times its combine without the experts' GEMMs.
        let mut te = t1;
        for pass in 0..2 {
            let mut item = 0usize;
            for s in 0..n {
                for e_l in 0..el {
                    let mut cb = [0u8; 8];
                    let ca = at(l.counts + 8 * (s * el + e_l) as u64);
                    wg.heap().read_bytes(ca, &mut cb).map_err(|c| wg_err(wg, ca, c))?;
                    let cnt = u64::from_le_bytes(cb) as usize;
                    for slot in 0..cnt {
                        item += 1;
                        if item % nw != w {
                            continue;
                        }
                        let idx = ((e_l * n + s) * t_n + slot) as u64;
                        let slot_at = at(l.recv + idx * hb);
                        if pass == 0 {
                            let e = (me as usize) * el + e_l;
                            wg.heap().read_bytes(slot_at, &mut buf).map_err(|c| wg_err(wg, slot_at, c))?;
                            for i in 0..h {
                                let y = expert(e, a.experts, u16::from_le_bytes([buf[2 * i], buf[2 * i + 1]]));
                                buf[2 * i..][..2].copy_from_slice(&y.to_le_bytes());
                            }
                            wg.heap().write_bytes(slot_at, &buf).map_err(|c| wg_err(wg, slot_at, c))?;
                        } else {
                            let ma = at(l.meta + 8 * idx);
                            wg.heap().read_bytes(ma, &mut cb).map_err(|c| wg_err(wg, ma, c))?;
                            let m = u64::from_le_bytes(cb);
                            let (t, j) = ((m & 0xffff_ffff) as usize, (m >> 32) as usize);
                            wg.putmem_nbi(at(l.comb + ((t * k + j) as u64) * hb), slot_at, hb, s as i32)?;
                        }
                    }
                }
            }
            if pass == 0 {
                if !team.wait() {
                    return Ok(());
                }
                te = Instant::now();
            }
        }
        wg.quiet()?;
        if !team.wait() {
            return Ok(());
        }
        for s in (w..n).step_by(nw) {
            let sig = at(l.comb_sig + 8 * me as u64);
            wg.putmem_signal_nbi(sig, sig, 0, sig, epoch, SignalOp::Set, s as i32)?;
        }
        wg.quiet()?;
        for d in 0..n {
            wg.signal_wait_until(at(l.comb_sig + 8 * d as u64), Cmp::Ge, epoch)?;
        }
        let t2 = Instant::now();
        if it >= a.warmup {
            disp_sum += (t1 - t0).as_secs_f64();
            exp_sum += (te - t1).as_secs_f64();
            comb_sum += (t2 - te).as_secs_f64();
        }
        // Combine: out[t] = Σ_j w_j y_j for our tokens.
        if it + 1 == total {
            let mut o = vec![0f32; h];
            let mut res = Vec::new();
            for t in (w..t_n).step_by(nw) {
                o.iter_mut().for_each(|v| *v = 0.0);
                for j in 0..k {
                    let (_, wt) = r.route[t * k + j];
                    let ya = at(l.comb + ((t * k + j) as u64) * hb);
                    wg.heap().read_bytes(ya, &mut buf).map_err(|c| wg_err(wg, ya, c))?;
                    for (i, v) in o.iter_mut().enumerate() {
                        *v += wt * f32_of(u16::from_le_bytes([buf[2 * i], buf[2 * i + 1]]));
                    }
                }
                res.push((t, o.clone()));
            }
            let mut out = out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (t, o) in res {
                out[t * h..][..h].copy_from_slice(&o);
            }
        }
        if !team.wait() {
            return Ok(());
        }
    }
    if w == 0 {
        let mut tm = times.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let it = a.iters.max(1) as f64;
        *tm = Timing { dispatch_us: disp_sum / it * 1e6, combine_us: comb_sum / it * 1e6, experts_us: exp_sum / it * 1e6 };
    }
    Ok(())
}

/// The error of a local access to this PE's heap at `addr`.
fn wg_err(wg: &WorkGroup, addr: SymAddr, code: cpnet::device::layout::ErrorCode) -> WgError {
    WgError::Op { my_pe: wg.my_pe(), wg: wg.wg(), op: "moe: local heap access", pe: wg.my_pe(), addr, code }
}

/// Token bytes this PE sends in a dispatch and in a combine (`T x k` rows
/// of `H` bf16 each; the records and counts beside them are not counted).
pub fn bytes_moved(a: &Args) -> (u64, u64) {
    let b = (a.tokens * a.topk * a.hidden * 2) as u64;
    (b, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Args {
        Args::parse_from(["moe", "--tokens", "64", "--hidden", "16", "-k", "4", "--experts", "16"])
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        assert_eq!(f32_of(bf16(1.0 + 1.0 / 256.0)), 1.0, "a tie rounds to even");
        assert_eq!(f32_of(bf16(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
        assert!(f32_of(bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn routing_is_distinct_normalised_and_slotted() {
        let a = args();
        let r = Routing::new(&a, 1).unwrap();
        assert_eq!(r, Routing::new(&a, 1).unwrap(), "deterministic");
        assert_ne!(r.route, Routing::new(&a, 0).unwrap().route, "per PE");
        let mut next = vec![0usize; a.experts];
        for t in 0..a.tokens {
            let es: Vec<usize> = (0..a.topk).map(|j| r.route[t * a.topk + j].0).collect();
            let mut u = es.clone();
            u.sort_unstable();
            u.dedup();
            assert_eq!(u.len(), a.topk, "distinct experts");
            let s: f32 = (0..a.topk).map(|j| r.route[t * a.topk + j].1).sum();
            assert!((s - 1.0).abs() < 1e-5);
            for (j, &e) in es.iter().enumerate() {
                assert_eq!(r.slot[t * a.topk + j], next[e], "slots count tokens in order");
                next[e] += 1;
            }
        }
        assert_eq!(next, r.count);
    }

    #[test]
    fn skew_concentrates_the_load() {
        let mut a = args();
        a.skew = 2.0;
        let c = Routing::new(&a, 0).unwrap().count;
        let mut sorted = c.clone();
        sorted.sort_unstable_by(|x, y| y.cmp(x));
        assert!(sorted[0] >= a.tokens * 9 / 10, "the top expert takes most tokens: {c:?}");
        assert!(Routing::new(&Args { topk: 17, ..args() }, 0).is_err());
        assert!(Routing::new(&Args { skew: -1.0, ..args() }, 0).is_err());
    }
}
