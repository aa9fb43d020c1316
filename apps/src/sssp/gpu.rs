//! The GPU variant of `sssp`: the same 1D partition, CSR, distance words and
//! delta-stepping as the CPU work-groups ([`super`]), on one GPU per PE,
//! every round's communication issued from inside one persistent kernel
//! (`sssp.cu`), the layout and the exchange of [`crate::bfs::gpu`].
//!
//! # Data
//!
//! Each PE copies its CSR to its GPU (row offsets `u64`, targets and
//! fixed-point weights `u32`) and keeps there what the scan last saw of each
//! word (`known`), the far flags, the bucket stamps (settled counts), two
//! near piles (by round parity), a cache of the smallest word sent per
//! remote vertex (`best`), the round each remote vertex was last queued in
//! (`mark`) and a list of queued vertices per destination. In the symmetric
//! heap: the distance words (the CPU variant's encoding, `distance << b |
//! parent`, whose unsigned minimum is the relaxation), a send slot per
//! destination, a receive slot per (source, parity) and a signal word per
//! source. A slot holds a 6-word header and at most one pair `[v, word]`
//! per vertex of the destination's block (a remote vertex is queued at most
//! once per round), so one message per pair of PEs and round always fits.
//!
//! # A round (in the kernel)
//!
//! 1. **Relax** (one warp per near vertex): a local target by `atomicMin`
//!    on its word; a remote target by `atomicMin` on `best[v]` and, if that
//!    improved it and `v` is not queued yet this round, into its owner's
//!    list. A near vertex of more than [`crate::bfs::gpu::BIG_DEGREE`]
//!    arcs goes into the round's big list instead, whose arcs every warp of
//!    the grid then shares in equal chunks after a grid barrier (bfs's
//!    remedy for a Kronecker graph's hubs, which held one warp while the
//!    GPU waited).
//! 2. **Exchange**: each destination's pairs `[v, best[v]]` into its send
//!    slot, then one `cpnet_putmem_signal_nbi` per destination (signal SET
//!    to the round's `seq`) and a wait for every source's. The header
//!    carries the sender's near and far counts, its smallest far distance,
//!    the vertices it settled so far and the time in the current bucket, so
//!    the per-round reductions over PEs ride on the exchange: every PE
//!    sums the same headers and takes the same decision.
//! 3. **Apply**: every received pair by `atomicMin` on the local word.
//! 4. **Decide and scan**: a round in which no PE relaxed anything ends
//!    the bucket (and the search, when no PE has a far vertex): the
//!    controller ([`super::controller`], ported line for line into the
//!    kernel: same inputs on every PE, the same delta) gives the next
//!    delta, the threshold moves. The scan compares every word with what
//!    it last saw: changed words below the threshold (and far ones the
//!    threshold has passed) form the next near pile, changed words at or
//!    beyond it the far pile.
//!
//! Remote relaxations travel as batched messages, one per destination and
//! round, rather than one remote `cpnet_uint64_atomic_min` per target: the
//! device API's calls are block-collective (one command per call and a
//! block barrier), so an AMO per relaxation would serialize a block on the
//! queue; the batch puts each round's remote candidates in one command per
//! pair of PEs and the owner applies them with local `atomicMin`s, the same
//! word update. The signal orders and the parity argument are those of
//! [`crate::bfs::gpu`] (a source can be one round ahead, never two;
//! sequence numbers continue across searches).
//!
//! # `-variant intra-kernel`
//!
//! One cooperative launch per search (`sssp_persistent`, as many blocks as
//! fit on the GPU at once less room for the proxy's landing agents,
//! [`crate::gpu::persistent_grid`], as bfs; or `-wgs`). The adaptive
//! controller adapts delta only: every block relaxes in every round (a GPU
//! does not gain from idling blocks the way CPU threads do), and a bucket
//! counts as too narrow below `MIN_SETTLED x blocks` settled vertices.
//!
//! (On the network path the first round's put-with-signal once never
//! completed: the landing agent found no block slot beside the persistent
//! grid and the L1/shared split of the two differed; session 13 left the
//! agents room and gave both the same carveout, docs/results.md "The
//! landing agent beside persistent kernels".)
//!
//! # `-variant inter-kernel`
//!
//! The same phases as separate launches (ComP-Net's baseline, as bfs's):
//! `sssp_init_k`, then per round `sssp_relax_k` (block 0 composes the
//! header, with the host's time in the bucket), `sssp_relax_big_k`,
//! `sssp_fill_k`,
//! `sssp_exchange_k` (one block: the puts, the waits, the sums of the
//! headers into the state block), `sssp_apply_k`; the host synchronizes
//! the stream, reads the sums and decides as the persistent kernel does
//! (the same [`Controller`] arithmetic on the same sums, so every PE takes
//! the same decision), then `sssp_scan_k` with the threshold and bucket it
//! chose.
//!
//! # Around the searches
//!
//! Kernel 1 runs on the host without communication
//! ([`build_csr_local`]), the keys, sums, energy and `-verify` go through
//! [`GpuHostComm`], and the per-search report, the Dijkstra validation and
//! the Graph500 block are the CPU variant's (`super::setup`,
//! `super::Run`). A search's time runs from a barrier to the end of its
//! kernel on each PE (the slowest PE's; the state reset included, the copy
//! back not). Energy: NVML's counter of each PE's GPU read before and after
//! each search ([`crate::energy`]).

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use cpnet::GpuPe;
use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, PushKernelArg};

use super::controller::{Bucket, Controller, MAX_ROUNDS, MIN_SETTLED, Mode, RANGE};
use super::{Args, Run, Searched, id_bits};
use crate::cli::{Variant, init_gpu_pe};
use crate::energy::EnergyMeter;
use crate::gpu::{check_launch, dptr, grid, kernel_source, max_coresident, new_ctl, op, persistent_grid};
use crate::graph::build::{Input, build_csr_local};
use crate::graph::comm::{Collectives, GpuHostComm};
use crate::graph::{Csr, Partition};

/// Threads per block of the sssp kernel.
pub const THREADS: u32 = 256;
/// Buckets whose delta the kernel records (the report shows the first few).
pub const HIST: usize = 64;

/// Words of the state block (`SSSP_ST_*`).
mod st {
    /// Far vertices the last scan counted.
    pub const FARCNT: usize = 2;
    /// Their smallest distance.
    pub const FARMIN: usize = 3;
    /// Vertices settled this search (near at least once per bucket).
    pub const SETTLED: usize = 4;
    /// Arcs relaxed this search.
    pub const RELAX: usize = 5;
    /// A distance did not fit its word.
    pub const OVERFLOW: usize = 6;
    /// Rounds the kernel ran.
    pub const ROUNDS: usize = 7;
    /// Buckets it finished.
    pub const BUCKETS: usize = 8;
    /// This PE's header of the current round (5 words).
    pub const HDR: usize = 9;
    /// Inter-kernel: the sums of every PE's header of the last exchange (5
    /// words: near, far, far min, settled, bucket ns).
    pub const SUMS: usize = 16;
    /// Inter-kernel: 1 if the last exchange failed.
    pub const XFAIL: usize = 21;
    /// The round's big list (`sssp.cu`): its entries << 38 | its arcs.
    pub const BIG: usize = 22;
    /// Queued vertices per destination (one word per PE from here).
    pub const OUT: usize = 23;
}

/// The kernel's source with every `#define` it needs.
pub fn source() -> String {
    let defines = [
        ("SSSP_THREADS", THREADS.to_string()),
        ("SSSP_HIST", format!("{HIST}ull")),
        ("SSSP_ST_FARCNT", st::FARCNT.to_string()),
        ("SSSP_ST_FARMIN", st::FARMIN.to_string()),
        ("SSSP_ST_SETTLED", st::SETTLED.to_string()),
        ("SSSP_ST_RELAX", st::RELAX.to_string()),
        ("SSSP_ST_OVERFLOW", st::OVERFLOW.to_string()),
        ("SSSP_ST_ROUNDS", st::ROUNDS.to_string()),
        ("SSSP_ST_BUCKETS", st::BUCKETS.to_string()),
        ("SSSP_ST_HDR", st::HDR.to_string()),
        ("SSSP_ST_SUMS", st::SUMS.to_string()),
        ("SSSP_ST_XFAIL", st::XFAIL.to_string()),
        ("SSSP_ST_BIG", st::BIG.to_string()),
        ("SSSP_ST_OUT", st::OUT.to_string()),
        ("SSSP_BIG_DEGREE", format!("{}ull", crate::bfs::gpu::BIG_DEGREE)),
        ("SSSP_BIG_CHUNK", "512ull".to_string()),
        ("SSSP_MAX_ROUNDS", format!("{MAX_ROUNDS}ull")),
        ("SSSP_RANGE", format!("{RANGE}ull")),
        ("SSSP_OP_ROUND", format!("{}ull", op::SSSP_ROUND)),
    ];
    kernel_source(&defines, include_str!("sssp.cu"))
}

/// `sssp_params` of `sssp.cu`, field for field (all 8 bytes: no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SsspParams {
    rows: u64,
    cols: u64,
    wts: u64,
    dist: u64,
    known: u64,
    far: u64,
    stamp: u64,
    near: u64,
    best: u64,
    mark: u64,
    list: u64,
    state: u64,
    hist: u64,
    ctl: u64,
    send: u64,
    recv: u64,
    sig: u64,
    big: u64,
    big_cap: i64,
    n: i64,
    nl: i64,
    lo: i64,
    block: i64,
    slot: i64,
    n_pes: i64,
    me: i64,
    root: i64,
    seq0: i64,
    idb: i64,
    dmax: i64,
    delta0: i64,
    adaptive: i64,
    min_settled: i64,
    round: i64,
    threshold: i64,
    bucket: i64,
    bucket_ns: i64,
}

// SAFETY: repr(C), plain 8-byte integers, laid out as `struct sssp_params`
// (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for SsspParams {}

/// Words of one send or receive slot for `part`.
fn slot_words(part: &Partition) -> u64 {
    6 + 2 * part.block
}

/// Symmetric heap bytes per PE: distance words, send slots, receive slots
/// (two parities), signals.
pub fn heap_bytes(part: &Partition) -> u64 {
    let p = part.n_pes.max(1) as u64;
    part.block * 8 + 3 * p * slot_words(part) * 8 + (p * 8).next_multiple_of(64) + 5 * 64
}

/// The loaded kernels.
struct Kernels {
    persistent: CudaFunction,
    init: CudaFunction,
    relax: CudaFunction,
    relax_big: CudaFunction,
    fill: CudaFunction,
    exchange: CudaFunction,
    apply: CudaFunction,
    scan: CudaFunction,
}

/// One PE's GPU search state and kernels.
struct GpuSssp<'a> {
    pe: &'a GpuPe,
    variant: Variant,
    k: Kernels,
    blocks: u32,
    params: SsspParams,
    nl: usize,
    seq0: u64,
    // Device buffers the parameters point into (held for the kernel).
    _u64s: [CudaSlice<u64>; 4],
    _u32s: [CudaSlice<u32>; 7],
    state: CudaSlice<u64>,
    hist: CudaSlice<u64>,
    ctl: CudaSlice<u64>,
    dist: cpnet::device::cpu::SymAddr,
}

impl GpuSssp<'_> {
    /// One search from `root` (**collective**): this PE's words, and what
    /// the kernel counted.
    fn search(&mut self, root: u64) -> Result<Searched> {
        let s = self.pe.stream().clone();
        s.memset_zeros(&mut self.ctl).context("reset the control block")?;
        let mut p = self.params;
        p.root = root as i64;
        p.seq0 = self.seq0 as i64;
        let hnd = self.pe.handle();
        let t = Instant::now();
        let (rounds, buckets, deltas, secs, stv) = if self.variant == Variant::InterKernel {
            let (rounds, buckets, deltas) = self.inter_kernel(&p)?;
            let secs = t.elapsed().as_secs_f64();
            let stv = s.clone_dtoh(&self.state).context("copy the search state back")?;
            (rounds, buckets, deltas, secs, stv)
        } else {
            let mut b = s.launch_builder(&self.k.persistent);
            b.arg(&hnd).arg(&p);
            // SAFETY: the arguments match sssp_persistent(cpnet_handle_t,
            // sssp_params); every pointer in `p` is a live allocation of the
            // size the kernel indexes (the CSR, per-vertex arrays, piles, lists,
            // state and history held by `self`; the heap words and slots sized
            // by heap_bytes), alive until check_launch below. Cooperative:
            // blocks <= the co-resident maximum (run).
            unsafe { b.launch_cooperative(grid(self.blocks, THREADS)) }.context("launch sssp_persistent")?;
            check_launch(self.pe, &self.ctl, "sssp_persistent", "signal")?;
            let secs = t.elapsed().as_secs_f64();
            let stv = s.clone_dtoh(&self.state).context("copy the search state back")?;
            let buckets = stv[st::BUCKETS] as usize;
            let hist = s.clone_dtoh(&self.hist).context("copy the delta history back")?;
            (stv[st::ROUNDS], buckets, hist[..(buckets + 1).min(HIST)].to_vec(), secs, stv)
        };
        if stv[st::OVERFLOW] != 0 {
            bail!("a distance does not fit the {} bits a distance word leaves for it", 64 - self.params.idb);
        }
        ensure!(rounds >= 1, "internal: the search ran no round");
        self.seq0 += rounds;
        let mut words = vec![0u8; self.nl * 8];
        self.pe.read_heap(self.dist, &mut words).context("copy the distance words back")?;
        let words = words.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        Ok(Searched { words, secs, buckets, rounds: rounds as u32, deltas, relaxations: stv[st::RELAX] })
    }

    /// Launch one of the inter-kernel phases that take only
    /// `(sssp_params)` (init, relax, fill, apply, scan) on `blocks` blocks.
    fn launch_phase(&self, k: &CudaFunction, name: &str, blocks: u32, p: &SsspParams) -> Result<()> {
        let mut b = self.pe.stream().launch_builder(k);
        b.arg(p);
        // SAFETY: every phase kernel takes (sssp_params) by value; every
        // pointer in `p` is a live allocation held by `self` (search()'s
        // argument), and the stream orders each phase after the one before.
        unsafe { b.launch(grid(blocks, THREADS)) }.with_context(|| format!("launch {name}"))?;
        Ok(())
    }

    /// `-variant inter-kernel`: the launches of one search, the host
    /// deciding after each exchange as `sssp_persistent` does (the same
    /// sums, the same controller: [`Controller`] with this PE's blocks, so
    /// the same `MIN_SETTLED x blocks`; the time in a bucket is the host's,
    /// the slowest PE's through the headers). Returns the rounds, the
    /// buckets and the deltas used.
    fn inter_kernel(&self, p0: &SsspParams) -> Result<(u64, usize, Vec<u64>)> {
        let s = self.pe.stream();
        let hnd = self.pe.handle();
        self.launch_phase(&self.k.init, "sssp_init_k", self.blocks, p0)?;
        let mode = if p0.adaptive != 0 { Mode::Adaptive } else { Mode::Fixed };
        let mut ctlr = Controller::new(mode, p0.delta0 as u64, self.blocks);
        let mut threshold = ctlr.delta();
        let (mut bucket_rounds, mut settled0, mut buckets) = (0u32, 0u64, 0usize);
        let mut bucket_t0 = Instant::now();
        let mut p = *p0;
        for r in 0.. {
            p.round = r;
            p.bucket_ns = bucket_t0.elapsed().as_nanos().min(i64::MAX as u128) as i64;
            self.launch_phase(&self.k.relax, "sssp_relax_k", self.blocks, &p)?;
            self.launch_phase(&self.k.relax_big, "sssp_relax_big_k", self.blocks, &p)?;
            self.launch_phase(&self.k.fill, "sssp_fill_k", self.blocks, &p)?;
            let mut b = s.launch_builder(&self.k.exchange);
            b.arg(&hnd).arg(&p);
            // SAFETY: sssp_exchange_k(cpnet_handle_t, sssp_params), one block
            // (its own context); buffers as in search().
            unsafe { b.launch(grid(1, THREADS)) }.context("launch sssp_exchange_k")?;
            self.launch_phase(&self.k.apply, "sssp_apply_k", self.blocks, &p)?;
            // Synchronize before the copy (bfs's reason: a copy to pageable
            // memory while the exchange runs holds up the proxy's own calls).
            self.pe.synchronize().context("sssp round")?;
            let stv = s.clone_dtoh(&self.state).context("read the round's sums")?;
            if stv[st::XFAIL] != 0 {
                check_launch(self.pe, &self.ctl, "sssp_exchange_k", "signal")?;
                bail!("sssp_exchange_k failed without a record");
            }
            let (near, far, far_min, settled, bucket_ns) =
                (stv[st::SUMS], stv[st::SUMS + 1], stv[st::SUMS + 2], stv[st::SUMS + 3], stv[st::SUMS + 4]);
            if near > 0 {
                bucket_rounds += 1;
            } else {
                if far == 0 {
                    check_launch(self.pe, &self.ctl, "sssp inter-kernel search", "signal")?;
                    return Ok((r as u64 + 1, buckets, ctlr.history.iter().copied().take(HIST).collect()));
                }
                let delta = ctlr.bucket_done(Bucket { settled: settled - settled0, rounds: bucket_rounds, secs: bucket_ns as f64 * 1e-9 });
                settled0 = settled;
                buckets += 1;
                bucket_rounds = 0;
                let next = threshold.saturating_add(delta);
                threshold = if far_min >= next { far_min.saturating_add(delta) } else { next };
                bucket_t0 = Instant::now();
            }
            p.threshold = threshold as i64;
            p.bucket = buckets as i64;
            self.launch_phase(&self.k.scan, "sssp_scan_k", self.blocks, &p)?;
        }
        unreachable!("the round loop only ends by returning")
    }
}

/// `sssp -variant intra-kernel` on this PE: all searches valid? Initializes
/// and finalizes the GPU PE itself.
///
/// # Errors
/// No GPU, start-up, a kernel failure (naming the work-group, the operation
/// and the signal), a communication failure, a distance overflow.
pub fn run(args: &Args, input: &Input) -> Result<bool> {
    let variant = args.g.variant;
    let n = input.n();
    let (pe, raised) = init_gpu_pe(variant, |p| heap_bytes(&Partition::new(n, p)), 0)?;
    let (me, n_pes) = (pe.my_pe(), pe.n_pes());
    let part = Partition::new(n, n_pes);
    let t0 = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).div_ceil(n_pes.max(1) as usize);
    let csr = build_csr_local(input, &part, me, threads);
    let module = pe.build_module("sssp.cu", &source())?;
    let load = |name: &str| module.load_function(name).with_context(|| format!("kernel {name}"));
    let k = Kernels {
        persistent: load("sssp_persistent")?,
        init: load("sssp_init_k")?,
        relax: load("sssp_relax_k")?,
        relax_big: load("sssp_relax_big_k")?,
        fill: load("sssp_fill_k")?,
        exchange: load("sssp_exchange_k")?,
        apply: load("sssp_apply_k")?,
        scan: load("sssp_scan_k")?,
    };
    let max = max_coresident(&pe, &k.persistent, THREADS)?;
    let queues = pe.handle().0.n_queues;
    ensure!(
        n_pes.max(1) as u32 <= queues || variant == Variant::InterKernel,
        "sssp needs a command queue per sending block ({n_pes} of them) and this PE has {queues} (raise CPNET_QUEUES)"
    );
    let blocks = persistent_grid(max, args.wgs, THREADS)?;
    let idb = id_bits(n);
    let mut comm = GpuHostComm(&pe);
    let setup = super::setup(&mut comm, &csr, &part, args, t0.elapsed().as_secs_f64())?;
    let mut g = upload(&pe, variant, k, &csr, &part, blocks, idb, setup.delta0, args.controller)?;
    let meter = if args.no_energy { Err("-no-energy".to_owned()) } else { EnergyMeter::for_gpu(&pe) };
    if me == 0 {
        println!(
            "# sssp -variant {}: {n_pes} GPU PE(s), {blocks} block(s) of {THREADS} threads per PE, provider {}{}",
            variant.name(),
            pe.provider(),
            raised.map(|b| format!(", heap raised to {b} bytes")).unwrap_or_default()
        );
        if let Err(why) = &meter {
            println!("# energy: n/a ({why})");
        }
    }
    let meter = meter.ok();
    let has_meter = comm.sum(&[u64::from(meter.is_none())])?[0] == 0;
    let mut run = Run::new(me, &setup, args);
    for (k, &root) in setup.keys.iter().enumerate() {
        comm.barrier()?;
        let e0 = meter.as_ref().map(EnergyMeter::read_mj).transpose().map_err(anyhow::Error::msg)?;
        let o = g.search(root)?;
        let e1 = meter.as_ref().map(EnergyMeter::read_mj).transpose().map_err(anyhow::Error::msg)?;
        // Microjoules of this PE's share of its GPU's energy, summed below.
        let uj = match (&meter, e0, e1) {
            (Some(m), Some(a), Some(b)) => (b.saturating_sub(a) as f64 * 1000.0 * m.share()) as u64,
            _ => 0,
        };
        let joules = if has_meter { Some(comm.sum(&[uj])?[0] as f64 * 1e-6) } else { None };
        run.search(&mut comm, &csr, &part, idb, k, root, o, joules)?;
    }
    let ok = run.finish(input, args, &part, &format!("blocks per PE: {blocks}"), if args.no_energy { "not measured (-no-energy)" } else { "n/a (no NVML)" });
    drop(g);
    pe.finalize()?;
    Ok(ok)
}

/// The device buffers and heap slots of one PE (**collective**: heap
/// allocations and a barrier).
///
/// # Errors
/// Allocations and copies.
#[allow(clippy::too_many_arguments)]
fn upload<'a>(
    pe: &'a GpuPe,
    variant: Variant,
    k: Kernels,
    csr: &Csr,
    part: &Partition,
    blocks: u32,
    idb: u32,
    delta0: u64,
    mode: Mode,
) -> Result<GpuSssp<'a>> {
    let s = pe.stream();
    let (me, p) = (pe.my_pe(), part.n_pes as u64);
    let nl = csr.n_local();
    let rows = s.clone_htod(&csr.rows).context("copy the CSR rows")?;
    let cols32: Vec<u32> = csr.cols.iter().map(|&v| v as u32).collect();
    let cols = s.clone_htod(&cols32).context("copy the CSR targets")?;
    drop(cols32);
    let wts = s.clone_htod(&csr.weights).context("copy the CSR weights")?;
    let known = s.alloc_zeros::<u64>(nl.max(1))?;
    let far = s.alloc_zeros::<u32>(nl.max(1))?;
    let stamp = s.alloc_zeros::<u32>(nl.max(1))?;
    let near = s.alloc_zeros::<u32>(2 * nl.max(1))?;
    let best = s.alloc_zeros::<u64>(part.n as usize)?;
    let mark = s.alloc_zeros::<u32>(part.n as usize)?;
    // A vertex is near at most once per round: a round's big list holds at
    // most every local vertex above the threshold.
    let big_cap = (0..nl).filter(|&i| csr.degree(i) > crate::bfs::gpu::BIG_DEGREE).count().max(1);
    let big = s.alloc_zeros::<u64>(2 * big_cap)?;
    let list = s.alloc_zeros::<u32>((p * part.block.max(1)) as usize)?;
    let state = s.alloc_zeros::<u64>(st::OUT + p as usize)?;
    let hist = s.alloc_zeros::<u64>(HIST)?;
    let ctl = new_ctl(pe)?;
    let slot = slot_words(part);
    let dist = pe.shmalloc(part.block.max(1) * 8).context("sssp distance words (symmetric heap)")?;
    let send = pe.shmalloc(p * slot * 8).context("sssp send slots (symmetric heap)")?;
    let recv = pe.shmalloc(2 * p * slot * 8).context("sssp receive slots (symmetric heap)")?;
    let sig = pe.shmalloc(p * 8).context("sssp signals (symmetric heap)")?;
    pe.write_heap(sig, &vec![0u8; (p * 8) as usize])?;
    // Every PE's signals are zero before any PE sends.
    pe.barrier_all()?;
    let params = SsspParams {
        rows: dptr(pe, &rows),
        cols: dptr(pe, &cols),
        wts: dptr(pe, &wts),
        dist: pe.dev_ptr(dist),
        known: dptr(pe, &known),
        far: dptr(pe, &far),
        stamp: dptr(pe, &stamp),
        near: dptr(pe, &near),
        best: dptr(pe, &best),
        mark: dptr(pe, &mark),
        list: dptr(pe, &list),
        state: dptr(pe, &state),
        hist: dptr(pe, &hist),
        ctl: dptr(pe, &ctl),
        send: pe.dev_ptr(send),
        recv: pe.dev_ptr(recv),
        sig: pe.dev_ptr(sig),
        big: dptr(pe, &big),
        big_cap: big_cap as i64,
        n: part.n as i64,
        nl: nl as i64,
        lo: part.lo(me) as i64,
        block: part.block as i64,
        slot: slot as i64,
        n_pes: p as i64,
        me: i64::from(me),
        idb: i64::from(idb),
        dmax: ((u64::MAX >> idb) - 1) as i64,
        delta0: delta0 as i64,
        adaptive: i64::from(mode == Mode::Adaptive),
        min_settled: (MIN_SETTLED * u64::from(blocks)) as i64,
        ..SsspParams::default()
    };
    Ok(GpuSssp {
        pe,
        variant,
        k,
        blocks,
        params,
        nl,
        seq0: 0,
        _u64s: [rows, known, best, big],
        _u32s: [cols, wts, far, stamp, near, mark, list],
        state,
        hist,
        ctl,
        dist,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust mirror has as many 8-byte fields as the C struct declares.
    #[test]
    fn params_mirror_the_kernel_struct() {
        let fields = crate::gpu::c_struct_fields(&source(), "sssp_params");
        assert_eq!(size_of::<SsspParams>(), fields * 8);
    }

    /// The kernel compiles with NVRTC, without a warning or a non-coherent load.
    #[test]
    fn kernels_compile() {
        crate::gpu::check_kernels_compile("sssp kernels_compile", &source());
    }

    /// A slot holds the header and one pair per vertex of the largest block;
    /// the state block's words do not overlap.
    #[test]
    fn slots_hold_a_whole_block_and_state_words_are_distinct() {
        let part = Partition::new(1 << 20, 3);
        assert_eq!(slot_words(&part), 6 + 2 * part.block);
        assert!(heap_bytes(&part) >= part.block * 8 + 3 * 3 * slot_words(&part) * 8 + 3 * 8);
        const { assert!(st::BUCKETS < st::HDR && st::HDR + 5 <= st::SUMS && st::SUMS + 5 <= st::XFAIL && st::XFAIL < st::BIG && st::BIG < st::OUT) };
    }
}
