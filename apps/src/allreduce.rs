//! Multi-ring allreduce (sum), the collective of ComP-Net §5.4, measured and
//! printed as nccl-tests' `all_reduce_perf` prints it.
//!
//! # The algorithm
//!
//! `R = -wgs` rings, of which a size of `s` bytes uses
//! `R' = min(R, ceil(s / -min-ring-bytes))` (at least one; the others idle:
//! each ring costs its own messages, so small sizes take few). The `count`
//! elements are split into `R'` contiguous segments (sizes differ by at
//! most one element; some may be empty), one per ring; ring `i` is run by
//! work-group `i` of every PE: work-group `i` of PE `p` receives from
//! work-group `i` of PE `p - 1` and sends to work-group `i` of PE `p + 1`
//! (both wrapping). Each ring runs the classic ring
//! allreduce on its segment, split into `n` blocks (again differing by at
//! most one element):
//!
//! - reduce-scatter, steps `s = 0 .. n-2`: send block `p - s`, receive block
//!   `p - s - 1` and add this PE's input to it; after it, PE `p` holds the
//!   full sum of block `p + 1`;
//! - allgather, steps `t = 0 .. n-2`: send block `p + 1 - t`, receive block
//!   `p - t` and keep it.
//!
//! Every block is cut into pieces of at most `-chunk` bytes, and the whole
//! exchange is one pipelined stream of messages per ring and direction: a
//! piece of step `s + 1` leaves as soon as the same piece of step `s` has
//! arrived and been reduced, so the steps overlap piece by piece.
//!
//! # Messages and flow control
//!
//! Message `g` (counted over the whole life of the ring, across
//! allreduces) goes with `putmem_signal_nbi` into staging slot `g % K`
//! (`K = -slots`) of the receiver's ring `i`, and SETs that slot's signal
//! word to `g + 1`; the signal lands only after the data. The receiver
//! waits for `signal[g % K] >= g + 1`, reduces or copies the piece into its
//! output, then adds 1 (`atomic_add`) to the sender's acknowledgement word.
//! The sender issues message `g` only when `ack >= g + 1 - K`: a slot is
//! rewritten only after the receiver has consumed what it held, so a sender
//! never overwrites a receive buffer the receiver has not consumed. One
//! signal word per slot (rather than one counter per ring) keeps messages
//! free to complete out of order, as cpnet allows between fences.
//!
//! Before a received piece overwrites a range of the output that an
//! earlier put still in flight reads as its source (the same block sent in
//! reduce-scatter, or in the previous allreduce), the receiver waits for
//! the acknowledgement of that put: the output is never changed under a
//! pending `putmem_nbi`. Each wait involves only messages earlier in the
//! order (allreduce, phase, step), so the rings cannot deadlock; every wait
//! is bounded by `CPNET_WAIT_TIMEOUT` and reports the word, the expected and
//! the found value. A ring that polls without progress also issues a
//! blocking no-op every 2 ms: polling heap words cannot see the job fail,
//! the queue can (a dead peer ends the ring with `PEER_DEAD` at once).
//!
//! One PE needs no messages: out-of-place copies input to output. Element
//! counts smaller than `R × n` leave some blocks and segments empty; empty
//! blocks carry no message.
//!
//! The CPU variant's rings, sweep and program are in `allreduce/cpu.rs`;
//! this file keeps the flags, the element types, the buffers' layout and
//! the nccl-tests sweep and output that every variant shares.
//!
//! # The GPU variants
//!
//! The same rings as thread blocks of a GPU kernel: `-variant intra-kernel`
//! (one persistent kernel for all the allreduces of a size) and `-variant
//! inter-kernel` (a kernel per ring step); see [`gpu`].
//!
//! # What is measured
//!
//! For each size, out-of-place then in-place: `-warmup` allreduces, then
//! `-iters` timed ones back to back (the work-groups stay up: the paper's
//! persistent kernel), the time per allreduce averaged over PEs; then, with
//! `-check 1`, one more on fresh inputs whose sums are exact in every type
//! (small integers), counting the elements that differ from the exact sum
//! (`#wrong`, summed over PEs). `algbw = bytes / time`, `busbw = algbw · 2(n-1)/n`
//! (nccl-tests' definitions).

use anyhow::ensure;
use clap::{Parser, ValueEnum};
use cpnet::device::cpu::SymAddr;

use crate::cli::{Variant, parse_size};

mod cpu;
pub mod gpu;
mod plan;


/// `allreduce`'s flags: nccl-tests' short ones (`-b -e -f -i -n -w -c -d`)
/// plus cpnet's (`-wgs -variant -chunk -slots`); long names work with one
/// dash or two.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "allreduce",
    about = "Multi-ring allreduce from inside the work-groups (cpnet; run under cpnet-run)"
)]
pub struct Args {
    /// Smallest size, bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", value_parser = parse_size, default_value = "8")]
    pub min_bytes: u64,
    /// Largest size, bytes.
    #[arg(short = 'e', long = "maxbytes", value_parser = parse_size, default_value = "256M")]
    pub max_bytes: u64,
    /// Multiply the size by this factor from one line to the next (> 1), or
    /// add `-i` when it is 1.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub step_factor: u64,
    /// Add this many bytes from one size to the next (with `-f 1`).
    #[arg(short = 'i', long = "stepbytes", value_parser = parse_size, default_value = "1M")]
    pub step_bytes: u64,
    /// Timed allreduces per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u32,
    /// Untimed allreduces before them.
    #[arg(short = 'w', long = "warmup", default_value_t = 5)]
    pub warmup: u32,
    /// Check the results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// Element type.
    #[arg(short = 'd', long = "type", value_enum, default_value_t = DataType::Float)]
    pub dtype: DataType,
    /// Work-groups per PE = rings (default: 2 for `-variant cpu`,
    /// [`GPU_DEFAULT_WGS`] for the GPU variants).
    #[arg(long, default_value_t = 2)]
    pub wgs: u32,
    /// Which variant runs the rings.
    #[arg(long, value_enum, default_value_t = Variant::Cpu)]
    pub variant: Variant,
    /// Largest message (pipeline piece), bytes; a multiple of 8 (default:
    /// 128K for `-variant cpu`, [`GPU_DEFAULT_CHUNK`] for the GPU variants).
    #[arg(long, value_parser = parse_size, default_value = "128K")]
    pub chunk: u64,
    /// Staging slots per ring on the receiver (messages in flight per ring;
    /// default: 4 for `-variant cpu`, [`GPU_DEFAULT_SLOTS`] for the GPU
    /// variants).
    #[arg(long, default_value_t = 4)]
    pub slots: u32,
    /// Fewest bytes a ring's segment takes: an allreduce of `s` bytes runs
    /// on `min(-wgs, ceil(s / this))` rings (at least one), the others
    /// idle (NCCL likewise runs small sizes on fewer channels). Every ring
    /// costs its own messages, so a 64-byte allreduce over 16 rings sent 16
    /// times the messages of one ring for the same bytes. `1`: every ring
    /// takes a share of every size.
    #[arg(long = "min-ring-bytes", value_parser = parse_size, default_value = "4K")]
    pub min_ring_bytes: u64,
    /// Which algorithm runs a size: the library's reduce to all over
    /// `CPNET_TEAM_WORLD` (`team`: one work-group calls
    /// `cpnet_<type>_sum_reduce`, or `CpuCtx::reduce` on CPU PEs; with
    /// `-variant inter-kernel`, one `GpuPe::team_reduce_on_stream` call per
    /// allreduce, a grid from `cpnet::gpu::REDUCE_GRID_MIN_BYTES` where the
    /// heaps are mapped), the
    /// multi-ring allreduce (`ring`), or `auto`: the library up to
    /// `-team-max` bytes, the rings above.
    #[arg(long, value_enum, default_value_t = Algo::Auto)]
    pub algo: Algo,
    /// Largest size `-algo auto` gives the library's reduce, bytes. 8 KiB:
    /// on two H200s (docs/results.md, "Session 19") the library's reduce
    /// beat 16-120 rings up to 8 KiB on every path (peer stores 8.1 against
    /// 15.3 µs, the network path over shm 30 against 35, over net 44
    /// against 72) and lost from 16 KiB (shm 51 against 38).
    #[arg(long = "team-max", value_parser = parse_size, default_value = "8K")]
    pub team_max: u64,
}

/// What runs an allreduce (`-algo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Algo {
    /// The library's reduce to all up to `-team-max` bytes, rings above.
    Auto,
    /// The multi-ring allreduce at every size.
    Ring,
    /// The library's reduce to all at every size.
    Team,
}

impl Args {
    /// Whether an allreduce of `bytes` runs through the library's reduce.
    pub fn use_team(&self, bytes: u64) -> bool {
        match self.algo {
            Algo::Team => true,
            Algo::Ring => false,
            Algo::Auto => bytes <= self.team_max,
        }
    }

    /// The algorithm line of the header.
    fn algo_text(&self) -> String {
        match self.algo {
            Algo::Team => "the library's reduce to all (team world) at every size".to_owned(),
            Algo::Ring => "rings at every size".to_owned(),
            Algo::Auto => format!("the library's reduce to all (team world) up to {} bytes, rings above", self.team_max),
        }
    }
}

/// `-wgs` of the GPU variants when not given: 120 rings (a block of 512
/// threads each; the PE's `CPNET_QUEUES` is raised to match when unset):
/// two PEs sharing an H100 under MPS have 132 such blocks each, less 8
/// blocks' room for the proxy's 16 landing agents (`GpuPe::max_persistent_blocks`).
/// The figures below were taken with 128.
/// With peer-to-peer stores the rings' blocks do the copies, so bandwidth
/// grows with them: on two H200s 16 rings reach 100 GB/s busbw at 8 MiB,
/// 128 rings 222 GB/s (docs/results.md, "Peer-to-peer stores").
pub const GPU_DEFAULT_WGS: u32 = 120;
/// `-chunk` of the GPU variants when not given, bytes.
pub const GPU_DEFAULT_CHUNK: u64 = 256 << 10;
/// `-slots` of the GPU variants when not given.
pub const GPU_DEFAULT_SLOTS: u32 = 8;

impl Args {
    /// Parse the process's arguments (one-dash long flags accepted), then
    /// [`Args::apply_variant_defaults`].
    pub fn from_command_line() -> Args {
        let (mut a, m) = crate::cli::parse_args_and_matches::<Args>();
        a.apply_variant_defaults(&m);
        a
    }

    /// Give the GPU variants their own `-wgs`, `-chunk` and `-slots`
    /// ([`GPU_DEFAULT_WGS`], [`GPU_DEFAULT_CHUNK`], [`GPU_DEFAULT_SLOTS`])
    /// where `m` says the value is clap's default, not the user's.
    pub fn apply_variant_defaults(&mut self, m: &clap::ArgMatches) {
        if self.variant == Variant::Cpu {
            return;
        }
        let defaulted = |id: &str| m.value_source(id) == Some(clap::parser::ValueSource::DefaultValue);
        if defaulted("wgs") {
            self.wgs = GPU_DEFAULT_WGS;
        }
        if defaulted("chunk") {
            self.chunk = GPU_DEFAULT_CHUNK;
        }
        if defaulted("slots") {
            self.slots = GPU_DEFAULT_SLOTS;
        }
    }
}

impl Args {
    /// The sizes of the sweep, bytes, as nccl-tests steps them.
    pub fn sizes(&self) -> Vec<u64> {
        let mut v = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            v.push(s);
            let next = if self.step_factor > 1 {
                s.saturating_mul(self.step_factor)
            } else {
                s.saturating_add(self.step_bytes)
            };
            if next == s {
                break;
            }
            s = next;
        }
        v
    }

    /// Check the flags.
    ///
    /// # Errors
    /// A message naming the bad flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        ensure!(
            self.min_bytes <= self.max_bytes,
            "-b {} is larger than -e {}",
            self.min_bytes,
            self.max_bytes
        );
        ensure!(self.step_factor >= 1, "-f must be at least 1");
        ensure!(
            self.step_factor > 1 || self.step_bytes > 0,
            "-f 1 needs -i > 0"
        );
        ensure!(self.wgs >= 1, "-wgs must be at least 1");
        ensure!(self.slots >= 1, "-slots must be at least 1");
        ensure!(
            self.chunk >= 8 && self.chunk.is_multiple_of(8),
            "-chunk {} must be a positive multiple of 8",
            self.chunk
        );
        ensure!(self.check <= 1, "-check is 0 or 1");
        Ok(())
    }
}

/// The element types (nccl-tests' names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DataType {
    /// `f32`.
    Float,
    /// `i32` (wrapping sum).
    Int32,
    /// `f64`.
    Double,
}

/// An element type the allreduce sums.
pub trait Elem: cpnet::device::cpu::ReduceType + Copy + Send + Sync + PartialEq + std::fmt::Debug + 'static {
    /// nccl-tests' name of the type.
    const NAME: &'static str;
    /// The sum (wrapping for integers).
    fn add(a: Self, b: Self) -> Self;
    /// A small integer, exactly.
    fn from_small(v: i32) -> Self;
    /// A value no correct result holds (NaN, `i32::MIN`), to fill outputs
    /// before a check.
    fn poison() -> Self;
}

impl Elem for f32 {
    const NAME: &'static str = "float";
    fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    fn from_small(v: i32) -> f32 {
        v as f32
    }
    fn poison() -> f32 {
        f32::NAN
    }
}

impl Elem for f64 {
    const NAME: &'static str = "double";
    fn add(a: f64, b: f64) -> f64 {
        a + b
    }
    fn from_small(v: i32) -> f64 {
        f64::from(v)
    }
    fn poison() -> f64 {
        f64::NAN
    }
}

impl Elem for i32 {
    const NAME: &'static str = "int32";
    fn add(a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }
    fn from_small(v: i32) -> i32 {
        v
    }
    fn poison() -> i32 {
        i32::MIN
    }
}

/// Input element `i` of PE `pe`: a small integer in `-8..=8`, so that sums
/// over any number of PEs are exact in every type.
pub fn input_value(pe: usize, i: usize) -> i32 {
    ((pe * 7 + i * 13) % 17) as i32 - 8
}

pub use plan::{RingPlan, active_rings, min_seg_elems};

/// Messages a ring has sent and received over its whole life (signal and
/// acknowledgement words count them across allreduces).
#[derive(Debug, Default, Clone, Copy)]
struct RingCount {
    sent: u64,
    received: u64,
}

/// The symmetric buffers and words of the rings.
#[derive(Debug, Clone, Copy)]
struct Layout {
    input: SymAddr,
    output: SymAddr,
    staging: SymAddr,
    sigs: SymAddr,
    acks: SymAddr,
    slots: u64,
    chunk: u64,
}

impl Layout {
    /// The layout of one run: in place, the output is the input.
    fn for_run(&self, in_place: bool) -> Layout {
        Layout { output: if in_place { self.input } else { self.output }, ..*self }
    }
    fn sig_stride(slots: u64) -> u64 {
        (8 * slots).next_multiple_of(64)
    }
    fn stage(&self, ring: usize, slot: u64) -> SymAddr {
        self.staging
            .add((ring as u64 * self.slots + slot) * self.chunk)
    }
    fn sig(&self, ring: usize, slot: u64) -> SymAddr {
        self.sigs
            .add(ring as u64 * Layout::sig_stride(self.slots) + 8 * slot)
    }
    fn ack(&self, ring: usize) -> SymAddr {
        self.acks.add(64 * ring as u64)
    }
}

/// Symmetric heap bytes a PE needs for `args` (input, output, staging,
/// signal and acknowledgement words, each 64-byte aligned, plus slack).
pub fn heap_need(args: &Args) -> u64 {
    let (r, k) = (u64::from(args.wgs), u64::from(args.slots));
    let data = args.max_bytes.max(8).next_multiple_of(64);
    2 * data + r * k * args.chunk.next_multiple_of(64) + r * Layout::sig_stride(k) + 64 * r + 4096
}

/// Elements of `got` (a result on `n` PEs) that differ from the exact sum
/// of the inputs.
fn wrong_elements<T: Elem>(got: &[T], n: usize) -> u64 {
    got.iter()
        .enumerate()
        .filter(|&(i, &g)| g != T::from_small((0..n).map(|p| input_value(p, i)).sum::<i32>()))
        .count() as u64
}

/// One line of results: time (us) and #wrong, out-of-place then in-place.
type Line = [(f64, u64); 2];

/// The sweep of nccl-tests, whatever runs the allreduces: for each size,
/// out-of-place then in-place, `measure(count, in_place)` returns this PE's
/// seconds per timed allreduce and its wrong elements; the times are
/// averaged and the wrong elements summed over PEs (`allgather`), and PE 0
/// (`me`) prints the line. Returns the total `#wrong`, the same on every PE.
fn sweep_with<T: Elem>(
    me: i32,
    n: i32,
    args: &Args,
    allgather: impl Fn(&[u8]) -> anyhow::Result<Vec<Vec<u8>>>,
    mut measure: impl FnMut(usize, bool) -> anyhow::Result<(f64, u64)>,
) -> anyhow::Result<u64> {
    let esize = size_of::<T>() as u64;
    let mut wrong_total = 0;
    let mut busbw_sum = 0.0;
    let mut busbw_n = 0u32;
    for size in args.sizes() {
        let count = (size / esize) as usize;
        let mut line: Line = [(0.0, 0); 2];
        for (mode, in_place) in [false, true].into_iter().enumerate() {
            let (secs, wrong) = measure(count, in_place)?;
            line[mode] = (secs * 1e6, wrong);
        }
        let mut mine = Vec::new();
        for (t, w) in line {
            mine.extend_from_slice(&t.to_le_bytes());
            mine.extend_from_slice(&w.to_le_bytes());
        }
        let all = allgather(&mine)?;
        let mut sum: Line = [(0.0, 0); 2];
        for blob in &all {
            for (m, s) in sum.iter_mut().enumerate() {
                let t = f64::from_le_bytes(blob[16 * m..16 * m + 8].try_into()?);
                let w = u64::from_le_bytes(blob[16 * m + 8..16 * m + 16].try_into()?);
                s.0 += t / f64::from(n);
                s.1 += w;
            }
        }
        wrong_total += sum[0].1 + sum[1].1;
        if me == 0 {
            let bytes = count as u64 * esize;
            let mut text = format!(
                "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
                bytes,
                count,
                <T as Elem>::NAME,
                "sum",
                -1
            );
            for (t_us, w) in sum {
                let algbw = if t_us > 0.0 {
                    bytes as f64 / 1e3 / t_us
                } else {
                    0.0
                };
                let busbw = algbw * 2.0 * f64::from(n - 1) / f64::from(n);
                busbw_sum += busbw;
                busbw_n += 1;
                // nccl-tests: "  %6g" with a check, "    N/A" without.
                let wrong = if args.check == 1 {
                    format!("  {:>6}", w)
                } else {
                    "    N/A".to_owned()
                };
                text += &format!(
                    "  {}  {}  {}{}",
                    fmt_float(t_us, 7),
                    fmt_float(algbw, 6),
                    fmt_float(busbw, 6),
                    wrong
                );
            }
            println!("{text}");
        }
    }
    if me == 0 {
        println!(
            "# {:<20} : {} {}",
            "Out of bounds values",
            wrong_total,
            if wrong_total == 0 { "OK" } else { "FAILED" }
        );
        println!(
            "# {:<20} : {} ",
            "Avg bus bandwidth",
            fmt_g(busbw_sum / f64::from(busbw_n.max(1)))
        );
        println!("#");
    }
    Ok(wrong_total)
}

/// nccl-tests' `getFloatStr`: `%*.2f`, or fewer decimals, or `%e`, to fit `width`.
pub fn fmt_float(v: f64, width: usize) -> String {
    for prec in [2, 1, 0] {
        let s = format!("{v:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    let s = format!("{v:>width$.1e}");
    s
}

/// `%g`-like: six significant digits.
fn fmt_g(v: f64) -> String {
    if v == 0.0 {
        return "0".to_owned();
    }
    let digits = 6 - 1 - v.abs().log10().floor() as i32;
    let s = format!("{:.*}", digits.max(0) as usize, v);
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// The whole program. **Collective.** Returns the total `#wrong` (summed
/// over PEs, sizes and both modes; the same on every PE). The GPU variants
/// run in [`gpu::run`].
///
/// # Errors
/// Bad flags, a GPU variant without a GPU, init and run errors.
pub fn run(args: &Args) -> anyhow::Result<u64> {
    args.variant.require_available()?;
    args.validate()?;
    if args.variant.is_gpu() {
        return gpu::run(args);
    }
    cpu::run(args)
}

/// nccl-tests' header (PE 0).
fn print_header(args: &Args, n: i32, provider: &str, raised: Option<u64>) {
    println!(
        "# cpnet allreduce: multi-ring (ComP-Net §5.4), variant {}, {n} PEs, {} rings (work-groups) per PE, provider {}",
        args.variant.name(),
        args.wgs,
        provider
    );
    println!(
        "# minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} validation: {} chunk: {} slots: {}{}",
        args.min_bytes,
        args.max_bytes,
        if args.step_factor > 1 {
            format!("{}(factor)", args.step_factor)
        } else {
            format!("{}(bytes)", args.step_bytes)
        },
        args.warmup,
        args.iters,
        args.check,
        args.chunk,
        args.slots,
        raised.map(|h| format!(" heap: {h}")).unwrap_or_default()
    );
    println!("# algorithm: {}", args.algo_text());
    println!("#");
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
        "", "", "", "", ""
    );
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(argv: &[&str]) -> Args {
        use clap::{CommandFactory, FromArgMatches};
        let argv = crate::cli::single_dash_to_long::<Args>(argv.iter().map(std::ffi::OsString::from));
        let m = Args::command().get_matches_from(argv);
        let mut a = Args::from_arg_matches(&m).expect("parse");
        a.apply_variant_defaults(&m);
        a
    }

    /// The GPU variants get their own ring count, piece and slots unless
    /// the command line gives them; the CPU variant keeps its defaults.
    #[test]
    fn gpu_variants_default_to_more_rings_unless_told() {
        let cpu = parsed(&["allreduce"]);
        assert_eq!((cpu.wgs, cpu.chunk, cpu.slots), (2, 128 << 10, 4));
        let gpu = parsed(&["allreduce", "-variant", "intra-kernel"]);
        assert_eq!((gpu.wgs, gpu.chunk, gpu.slots), (GPU_DEFAULT_WGS, GPU_DEFAULT_CHUNK, GPU_DEFAULT_SLOTS));
        let told = parsed(&["allreduce", "-variant", "inter-kernel", "-wgs", "16", "-chunk", "128K"]);
        assert_eq!((told.wgs, told.chunk, told.slots), (16, 128 << 10, GPU_DEFAULT_SLOTS));
        let told_default = parsed(&["allreduce", "-variant", "intra-kernel", "-wgs", "2"]);
        assert_eq!(told_default.wgs, 2, "a value equal to the CPU default is still the user's");
    }

    #[test]
    fn sizes_step_like_nccl_tests() {
        let a = Args::parse_from(["allreduce", "-b", "8", "-e", "100", "-f", "3"]);
        assert_eq!(a.sizes(), vec![8, 24, 72]);
        let a = Args::parse_from(["allreduce", "-b", "8", "-e", "30", "-f", "1", "-i", "10"]);
        assert_eq!(a.sizes(), vec![8, 18, 28]);
    }

    #[test]
    fn floats_print_like_nccl_tests() {
        assert_eq!(fmt_float(12.345, 7), "  12.35");
        assert_eq!(fmt_float(123456.7, 7), " 123457");
        assert_eq!(fmt_float(1234567.0, 7), "1234567");
        assert_eq!(fmt_float(0.0, 6), "  0.00");
        assert_eq!(fmt_g(0.122843), "0.122843");
    }
}
