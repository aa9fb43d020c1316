//! Distributed single-source shortest paths by delta-stepping (Meyer and
//! Sanders, J. Algorithms 2003) in its near/far-pile form (Davidson et al.,
//! IPDPS 2014), the Graph500 "Shortest Path" kernel (specification v2.0 §7
//! kernel 3, §8 validation, §9 output), on cpnet with CPU work-groups.
//! Remote relaxations are remote atomic minimums (`atomic_min`, the cpnet
//! extension to OpenSHMEM of `CPNET_AMO_MIN`).
//!
//! # Distances
//!
//! Weights are fixed point ([`crate::graph::WEIGHT_ONE`] `= 2^16` per unit:
//! Graph500's uniform `[0, 1)` weights become `0..=65536`). Each vertex has
//! one 64-bit word in the symmetric heap of its owner: its distance in the
//! high `64 - b` bits and its parent in the low `b` bits, `b` the bits of a
//! vertex id (`u64::MAX`: not reached). An unsigned minimum of such words
//! keeps the shorter distance and, with it, its parent, in one atomic
//! operation, so a relaxation of `(u, v)` with weight `w` is one
//! `atomic_min(word(v), (d(u) + w) << b | u)` on `v`'s owner (a heap atomic
//! when `v` is local). A distance that would not fit the high bits stops
//! the run with an error.
//!
//! # The algorithm (per search)
//!
//! The *near pile* of a PE holds its vertices whose distance fell below
//! the current threshold `T` and that still have to relax their arcs; the
//! *far pile* the improved vertices at `T` or beyond. A round: the active
//! work-groups of every PE relax the arcs of the near pile (remote ones as
//! non-blocking atomic minimums, a per-PE cache skipping any candidate not
//! smaller than one already sent for that vertex), quiet, and a
//! `barrier_all` makes every minimum visible; then work-group 0 of each PE
//! scans its words for changes: improved vertices below `T` form the next
//! near pile, the others join the far pile. One sum over the PEs (the
//! [`Exchange`]) says whether any near pile is non-empty; if none is, the
//! bucket is done: `T` grows by delta and the far pile vertices below the
//! new `T` become the near pile (when none are, `T` jumps to the smallest
//! far distance plus delta); the search ends when both piles are empty on
//! every PE.
//!
//! Delta and the work-groups active per round come from
//! [`controller::Controller`]: fixed (`-controller fixed`, the baseline) or
//! adapted from the measured progress of each bucket (`-controller
//! adaptive`).
//!
//! `-verify` gathers the graph and each search's words on PE 0 and compares
//! them with a sequential Dijkstra on the same fixed-point weights
//! ([`dijkstra`]): every distance equal, every parent closing its vertex's
//! distance through an arc.
//!
//! Energy: on CPU PEs there is no NVML reading; the report says so.
//!
//! # GPU variant ([`gpu`])
//!
//! `-variant intra-kernel` runs each search as one persistent cooperative
//! kernel per PE: the same words, piles and controller, the rounds'
//! remote relaxations batched into one message per pair of PEs and the
//! per-round sums over PEs riding on those messages; it reports the GPU's
//! energy per search from NVML where the driver exposes it (`energy: n/a
//! (no NVML)` elsewhere). `-variant inter-kernel` runs the same phases as
//! separate launches, the host deciding after each round's exchange
//! (ComP-Net's baseline). The keys, the validation and the report are shared
//! (`setup`, `Run`) and go through [`Collectives`].

pub mod controller;
pub mod dijkstra;
pub mod gpu;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Parser;
use cpnet::device::cpu::{HeapView, SymAddr};
use cpnet::{Pe, WorkGroup};

use crate::bfs::prepare_input;
use crate::cli::init_pe;
use crate::graph::build::{GraphFlags, Input, build_csr};
use crate::graph::comm::{Collectives, CpuComm};
use crate::graph::exchange::Exchange;
use crate::graph::keys::search_keys;
use crate::graph::{Csr, Partition, WEIGHT_ONE, stats};
use crate::team::TeamBarrier;
use controller::{Bucket, Controller, Mode};
use dijkstra::INF;

/// `sssp`'s flags (`-scale 14` and `--scale 14` both work).
#[derive(Parser, Debug, Clone)]
#[command(name = "sssp", about = "Graph500 shortest paths by delta-stepping over cpnet (run under cpnet-run)")]
pub struct Args {
    /// log2 of the vertex count of the Kronecker graph (edge factor 16).
    #[arg(long, default_value_t = 14)]
    pub scale: u32,
    /// Search keys (Graph500: 64).
    #[arg(long, default_value_t = 64)]
    pub nsssp: usize,
    /// Initial bucket width in weight units (default: the largest weight
    /// over the average degree).
    #[arg(long)]
    pub delta: Option<f64>,
    /// Fixed delta (baseline) or adapted from measured progress.
    #[arg(long, value_enum, default_value_t = Mode::Adaptive)]
    pub controller: Mode,
    /// Work-groups per PE: CPU threads, each with its own queue (default
    /// 1); GPU variant: thread blocks per PE (default: as many as fit on the
    /// GPU at once, less room for the proxy's landing agents).
    #[arg(long)]
    pub wgs: Option<u32>,
    /// GPU variant: do not read the GPU's energy counter (NVML).
    #[arg(long)]
    pub no_energy: bool,
    /// Input, validation and placement flags.
    #[command(flatten)]
    pub g: GraphFlags,
}

/// Bits of a vertex id in a distance word for `n` vertices.
pub fn id_bits(n: u64) -> u32 {
    (64 - (n.max(2) - 1).leading_zeros()).max(1)
}

/// What the work-groups of a PE share during the searches.
struct Shared {
    team: TeamBarrier,
    near: RwLock<Vec<u32>>,
    active: AtomicU32,
    /// Searches finished (work-group 0 bumps it at the end of each; a
    /// helper in search `k` stops when it exceeds `k`). Monotonic, so no
    /// reset can race with a helper's read.
    finished: AtomicU64,
    /// Per global vertex: the smallest word this PE sent for it (remote
    /// relaxations skip anything not smaller).
    best: Vec<AtomicU64>,
    relaxations: AtomicU64,
    error: Mutex<Option<anyhow::Error>>,
}

/// One PE's fixed facts of the run.
struct Ctx<'a> {
    csr: &'a Csr,
    part: Partition,
    heap: HeapView,
    dist: SymAddr,
    idb: u32,
    dmax: u64,
}

impl Ctx<'_> {
    fn word_addr(&self, owner: i32, v: u64) -> SymAddr {
        self.dist.add(8 * (v - self.part.lo(owner)))
    }

    fn local_word(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        self.heap.atomic_u64(self.dist.add(8 * i as u64)).expect("distance words lie in the heap")
    }
}

/// Relax the arcs of `wg`'s share (index `k` of `active`) of the near pile.
fn relax(wg: &mut WorkGroup, c: &Ctx, sh: &Shared, k: u32, active: u32) -> Result<()> {
    let me = wg.my_pe();
    let lo = c.part.lo(me);
    let near = sh.near.read().unwrap_or_else(PoisonError::into_inner);
    let mut count = 0u64;
    for &u_l in near.iter().skip(k as usize).step_by(active as usize) {
        let u_l = u_l as usize;
        // Acquire: pairs with the AcqRel minimums (local, or applied by the
        // proxy) that wrote the word; the barrier of the round ordered them.
        let du = c.local_word(u_l).load(Ordering::Acquire) >> c.idb;
        let u = lo + u_l as u64;
        for j in c.csr.arcs(u_l) {
            let (v, w) = (c.csr.cols[j], u64::from(c.csr.weights[j]));
            let nd = du + w;
            if nd > c.dmax {
                bail!("distance {nd} / {WEIGHT_ONE} does not fit the {} bits a distance word leaves for it", 64 - c.idb);
            }
            let cand = (nd << c.idb) | u;
            let o = c.part.owner(v);
            count += 1;
            if o == me {
                // AcqRel: pairs with the scan's Acquire loads and with the
                // other minimums on the word.
                c.local_word((v - lo) as usize).fetch_min(cand, Ordering::AcqRel);
            } else if sh.best[v as usize].fetch_min(cand, Ordering::Relaxed) > cand {
                // (Relaxed: a cache of this PE's own sends, no data hangs
                // on it; the remote word is the truth.)
                wg.atomic_min::<u64>(c.word_addr(o, v), cand, o)?;
            }
        }
    }
    // Relaxed: a statistic, read by work-group 0 after the team barriers
    // that end the search (they order it).
    sh.relaxations.fetch_add(count, Ordering::Relaxed);
    Ok(())
}

/// The result of one search on this PE.
struct Outcome {
    secs: f64,
    buckets: usize,
    rounds: u32,
    deltas: Vec<u64>,
}

/// Work-group 0's side of one search from `root` (**collective** across
/// PEs; the other work-groups of the PE run [`helper_search`]).
#[allow(clippy::too_many_arguments)]
fn lead_search(wg: &mut WorkGroup, ex: &mut Exchange, c: &Ctx, sh: &Shared, root: u64, delta0: u64, mode: Mode, wgs: u32) -> Result<Outcome> {
    let me = wg.my_pe();
    let n_pes = c.part.n_pes;
    let nl = c.csr.n_local();
    let lo = c.part.lo(me);
    for i in 0..nl {
        // Relaxed: the barrier_all below orders these before every PE's
        // first minimum of this search.
        c.local_word(i).store(INF, Ordering::Relaxed);
    }
    for b in &sh.best {
        // Relaxed: the helpers read the cache only after team barrier A.
        b.store(INF, Ordering::Relaxed);
    }
    let mut known = vec![INF; nl];
    let mut near: Vec<u32> = Vec::new();
    if c.part.owner(root) == me {
        let r = (root - lo) as usize;
        known[r] = root;
        c.local_word(r).store(root, Ordering::Relaxed);
        near.push(r as u32);
    }
    wg.barrier_all()?;
    let t0 = Instant::now();
    let mut ctl = Controller::new(mode, delta0, wgs);
    let mut t = ctl.delta();
    let mut far: Vec<u32> = Vec::new();
    let mut in_far = vec![false; nl];
    // The bucket each vertex was last in the near pile for (settled counts).
    let mut stamp = vec![u32::MAX; nl];
    let (mut bucket, mut rounds, mut total_rounds) = (0u32, 0u32, 0u32);
    let mut settled = 0u64;
    let mut bucket_t = Instant::now();
    let mut near_total = 1u64;
    loop {
        for &i in &near {
            if stamp[i as usize] != bucket {
                stamp[i as usize] = bucket;
                settled += 1;
            }
        }
        let active = ctl.active(near_total, n_pes);
        *sh.near.write().unwrap_or_else(PoisonError::into_inner) = std::mem::take(&mut near);
        // Relaxed: team barrier A (a mutex and condition variable) orders
        // it before the helpers' load.
        sh.active.store(active, Ordering::Relaxed);
        // A: the near pile and the active count are published (the team
        // barrier orders them before the helpers' reads).
        if !sh.team.wait() {
            bail!("a work-group of this PE failed");
        }
        if active > 0 {
            relax(wg, c, sh, 0, active)?;
        }
        wg.quiet()?;
        // B: every work-group of this PE has relaxed and quieted.
        if !sh.team.wait() {
            bail!("a work-group of this PE failed");
        }
        // Every PE's minimums are complete and visible.
        wg.barrier_all()?;
        rounds += 1;
        total_rounds += 1;
        for i in 0..nl {
            let w = c.local_word(i).load(Ordering::Acquire);
            if w != known[i] {
                known[i] = w;
                if w >> c.idb < t {
                    near.push(i as u32);
                } else if !in_far[i] {
                    in_far[i] = true;
                    far.push(i as u32);
                }
            }
        }
        near_total = ex.sum(wg, &[near.len() as u64])?[0];
        if near_total > 0 {
            continue;
        }
        // The bucket is done: measure, adapt, move the threshold.
        let s = ex.sum(wg, &[settled])?[0];
        let secs = f64::from_bits(ex.max(wg, &[bucket_t.elapsed().as_secs_f64().to_bits()])?[0]);
        let delta = ctl.bucket_done(Bucket { settled: s, rounds, secs });
        bucket += 1;
        settled = 0;
        rounds = 0;
        bucket_t = Instant::now();
        t = t.saturating_add(delta);
        loop {
            let mut keep = Vec::with_capacity(far.len());
            for &i in &far {
                if known[i as usize] >> c.idb < t {
                    in_far[i as usize] = false;
                    near.push(i);
                } else {
                    keep.push(i);
                }
            }
            far = keep;
            let g = ex.sum(wg, &[near.len() as u64, far.len() as u64])?;
            near_total = g[0];
            if g[0] > 0 || g[1] == 0 {
                break;
            }
            // Nothing below the new threshold anywhere: jump to the
            // smallest far distance.
            let local_min = far.iter().map(|&i| known[i as usize] >> c.idb).min().unwrap_or(u64::MAX);
            let m = !ex.max(wg, &[!local_min])?[0];
            t = m.saturating_add(delta);
        }
        if near_total == 0 {
            break;
        }
    }
    // Relaxed: ordered before the helpers' load by the team barrier below.
    sh.finished.fetch_add(1, Ordering::Relaxed);
    // Release the helpers from A (the barrier orders the bump before their reads).
    if !sh.team.wait() {
        bail!("a work-group of this PE failed");
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok(Outcome { secs, buckets: bucket as usize, rounds: total_rounds, deltas: ctl.history })
}

/// A helper work-group's side of search number `search`: relax its share
/// each round until work-group 0 has finished that search.
fn helper_search(wg: &mut WorkGroup, c: &Ctx, sh: &Shared, search: u64) -> Result<()> {
    loop {
        if !sh.team.wait() {
            bail!("work-group 0 of this PE failed");
        }
        if sh.finished.load(Ordering::Relaxed) > search {
            return Ok(());
        }
        let active = sh.active.load(Ordering::Relaxed);
        if wg.wg() < active {
            relax(wg, c, sh, wg.wg(), active)?;
        }
        wg.quiet()?;
        if !sh.team.wait() {
            bail!("work-group 0 of this PE failed");
        }
    }
}

/// Run `sssp` as its flags say; `Ok(false)` if a validation failed.
///
/// # Errors
/// Bad input (before start-up), start-up failures, communication failures,
/// a distance overflow.
pub fn run(args: &Args) -> Result<bool> {
    args.g.variant.require_available()?;
    if args.nsssp == 0 || args.wgs == Some(0) {
        bail!("-nsssp and -wgs must be at least 1");
    }
    if let Some(d) = args.delta
        && !(d.is_finite() && d > 0.0)
    {
        bail!("-delta {d} must be a positive number of weight units");
    }
    let input = prepare_input(&args.g, args.scale, true)?;
    let idb = id_bits(input.n());
    let dmax = (u64::MAX >> idb) - 1;
    if let Input::File(g) = &input {
        let wmax = g.edges.iter().filter_map(|e| e.2).fold(0.0f64, f64::max);
        if crate::graph::quantize(wmax) > dmax {
            bail!("weight {wmax} does not fit a distance word ({} bits for distances in units of 1/{WEIGHT_ONE})", 64 - idb);
        }
    }
    if args.g.variant.is_gpu() {
        return gpu::run(args, &input);
    }
    let chunk = args.g.chunk.max(16);
    let n = input.n();
    let (pe, _) = init_pe(|p| Exchange::heap_bytes(p, chunk) + Partition::new(n, p).block * 8 + (1 << 20))?;
    let part = Partition::new(n, pe.n_pes());
    let mut ex = Exchange::new(&pe, chunk)?;
    let dist = pe.shmalloc(part.block * 8)?;
    let t0 = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).div_ceil(pe.n_pes().max(1) as usize);
    let csr = build_csr(&pe, &mut ex, &input, &part, threads)?;
    let construction = t0.elapsed().as_secs_f64();
    let ok = searches(&pe, ex, &csr, part, dist, idb, dmax, &input, args, construction);
    let fin = pe.finalize();
    let ok = ok?;
    fin?;
    Ok(ok)
}

/// What every variant settles before the searches (the same on every PE).
pub(crate) struct Setup {
    /// The search keys.
    pub keys: Vec<u64>,
    /// Kernel 1's time (the slowest PE's).
    pub construction: f64,
    /// The initial delta (fixed point).
    pub delta0: u64,
    /// With `-verify`: every arc `(u, v, w)` of the graph on PE 0.
    pub full: Vec<(u64, u64, u32)>,
}

/// The keys, the construction time, the initial delta and (with `-verify`)
/// the whole graph on PE 0 (**collective**).
///
/// # Errors
/// A communication failure; a graph with no edge.
pub(crate) fn setup<C: Collectives>(comm: &mut C, csr: &Csr, part: &Partition, args: &Args, construction: f64) -> Result<Setup> {
    let construction = f64::from_bits(comm.max(&[construction.to_bits()])?[0]);
    let keys = match args.g.root {
        Some(r) => vec![r],
        None => search_keys(comm, csr, part, args.g.seed, args.nsssp)?,
    };
    if keys.is_empty() {
        bail!("the graph has no vertex with an edge to another vertex: nothing to search");
    }
    let wmax = u64::from(csr.weights.iter().copied().max().unwrap_or(0));
    let g = comm.sum(&[csr.n_arcs()])?;
    let wmax = comm.max(&[wmax])?[0].max(1);
    let avg_deg = g[0] as f64 / part.n as f64;
    let delta0 = match args.delta {
        Some(d) => crate::graph::quantize(d).max(1),
        None => ((wmax as f64 / avg_deg.max(1.0)) as u64).max(1),
    };
    let mut full = Vec::new();
    if args.g.verify {
        let mut out = vec![Vec::new(); part.n_pes as usize];
        let lo = csr.lo;
        out[0] = (0..csr.n_local())
            .flat_map(|i| csr.arcs(i).flat_map(move |j| [lo + i as u64, csr.cols[j], u64::from(csr.weights[j])]))
            .collect();
        comm.all_to_all_dyn(&out, 3, &mut |_, w| full.extend(w.chunks_exact(3).map(|t| (t[0], t[1], t[2] as u32))))?;
    }
    Ok(Setup { keys, construction, delta0, full })
}

/// One search as a PE saw it (any variant).
pub(crate) struct Searched {
    /// This PE's distance words.
    pub words: Vec<u64>,
    /// Its time on this PE.
    pub secs: f64,
    /// Buckets finished.
    pub buckets: usize,
    /// Relaxation rounds.
    pub rounds: u32,
    /// Delta of each bucket (at least the first ones).
    pub deltas: Vec<u64>,
    /// Arcs this PE relaxed.
    pub relaxations: u64,
}

/// The searches' report, shared by the variants: each search's line (and
/// validation), then the Graph500 block and the summary line on PE 0.
pub(crate) struct Run<'a> {
    me: i32,
    setup: &'a Setup,
    verify: bool,
    times: Vec<f64>,
    nedges: Vec<f64>,
    joules: Vec<Option<f64>>,
    ok: bool,
    vtime: f64,
}

impl<'a> Run<'a> {
    pub(crate) fn new(me: i32, setup: &'a Setup, args: &Args) -> Run<'a> {
        Run { me, setup, verify: args.g.verify, times: Vec::new(), nedges: Vec::new(), joules: Vec::new(), ok: true, vtime: 0.0 }
    }

    /// Account search `k` from `root` (**collective**): its time (the
    /// slowest PE's), edges, relaxations, validation against Dijkstra with
    /// `-verify`, and `joules` (the whole job's GPU energy) if measured.
    ///
    /// # Errors
    /// A communication failure.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn search<C: Collectives>(
        &mut self,
        comm: &mut C,
        csr: &Csr,
        part: &Partition,
        idb: u32,
        k: usize,
        root: u64,
        o: Searched,
        joules: Option<f64>,
    ) -> Result<()> {
        let secs = f64::from_bits(comm.max(&[o.secs.to_bits()])?[0]);
        let nl = csr.n_local();
        let words = &o.words;
        let deg: u64 = (0..nl).filter(|&i| words[i] != INF).map(|i| csr.degree(i)).sum();
        let g = comm.sum(&[deg, o.relaxations])?;
        let nedge = g[0] / 2;
        let mut valid = true;
        if self.verify {
            let tv = Instant::now();
            let mut out = vec![Vec::new(); part.n_pes as usize];
            out[0] = words.clone();
            let mut all = vec![INF; if self.me == 0 { part.n as usize } else { 0 }];
            let mut at = vec![0usize; part.n_pes as usize];
            comm.all_to_all_dyn(&out, 1, &mut |s, w| {
                let base = part.lo(s) as usize + at[s as usize];
                all[base..base + w.len()].copy_from_slice(w);
                at[s as usize] += w.len();
            })?;
            let mut bad = 0;
            if self.me == 0 {
                let full = &self.setup.full;
                let want = dijkstra::dijkstra(part.n as usize, full, root);
                let mask = (1u64 << idb) - 1;
                let d: Vec<u64> = all.iter().map(|&w| if w == INF { INF } else { w >> idb }).collect();
                let p: Vec<u64> = all.iter().map(|&w| if w == INF { u64::MAX } else { w & mask }).collect();
                let (n, msgs) = dijkstra::check(full, root, &want, &d, &p, 5);
                for m in msgs {
                    eprintln!("sssp validation, root {root}: {m}");
                }
                bad = n;
            }
            valid = comm.sum(&[bad])?[0] == 0;
            self.vtime += tv.elapsed().as_secs_f64();
        }
        if self.me == 0 {
            let dl: Vec<String> = o.deltas.iter().take(6).map(|d| format!("{:.4}", *d as f64 / WEIGHT_ONE as f64)).collect();
            println!(
                "search {k:2}: root {root:>10}  {secs:>9.6} s  {nedge:>10} edges  {:.4e} TEPS  {} buckets {} rounds  {} relaxations  delta {}{}{}{}",
                nedge as f64 / secs,
                o.buckets,
                o.rounds,
                g[1],
                dl.join(" "),
                if o.deltas.len() > 6 || o.buckets + 1 > o.deltas.len() { " ..." } else { "" },
                joules.map(|j| format!("  {j:.3} J")).unwrap_or_default(),
                if self.verify { if valid { "  valid" } else { "  INVALID" } } else { "" }
            );
        }
        self.times.push(secs);
        self.nedges.push(nedge as f64);
        self.joules.push(joules);
        self.ok &= valid;
        Ok(())
    }

    /// The Graph500 block and the summary line on PE 0; all searches valid?
    /// `workers` says what ran (work-groups or blocks per PE); `no_energy`
    /// what to say when the energy was not measured.
    pub(crate) fn finish(self, input: &Input, args: &Args, part: &Partition, workers: &str, no_energy: &str) -> bool {
        if self.me == 0 {
            let kron = matches!(input, Input::Kronecker { .. }).then_some(args.scale);
            print!("{}", stats::header(input, kron, "NSSSP", self.setup.keys.len(), part.n_pes, self.setup.construction));
            print!("{}", stats::kernel_block("sssp", &self.times, &self.nedges));
            if self.verify {
                println!("sssp_mean_validate: {:.17e}", self.vtime / self.setup.keys.len() as f64);
            }
            let energy = if self.joules.iter().all(Option::is_some) && !self.joules.is_empty() {
                let j: f64 = self.joules.iter().flatten().sum();
                let t: f64 = self.times.iter().sum();
                format!("{:.4} J per search (mean of {}; {:.1} W over the searches)", j / self.joules.len() as f64, self.joules.len(), j / t.max(1e-12))
            } else {
                no_energy.to_owned()
            };
            println!(
                "controller: {:?}  initial delta: {:.6}  {workers}  energy: {energy}  validation: {}",
                args.controller,
                self.setup.delta0 as f64 / WEIGHT_ONE as f64,
                if !self.verify { "not run (-verify)" } else if self.ok { "PASSED" } else { "FAILED" }
            );
            if !self.ok {
                eprintln!("sssp: validation FAILED");
            }
        }
        self.ok
    }
}

#[allow(clippy::too_many_arguments)]
fn searches(
    pe: &Pe,
    ex: Exchange,
    csr: &Csr,
    part: Partition,
    dist: SymAddr,
    idb: u32,
    dmax: u64,
    input: &Input,
    args: &Args,
    construction: f64,
) -> Result<bool> {
    let me = pe.my_pe();
    let wgs = args.wgs.unwrap_or(1);
    let ex = Mutex::new(ex);
    let lock = || ex.lock().unwrap_or_else(PoisonError::into_inner);
    let setup = pe.with_ctx(0, |wg| Ok(setup(&mut CpuComm { wg, ex: &mut lock() }, csr, &part, args, construction)))??;
    let c = Ctx { csr, part, heap: *pe.heap(), dist, idb, dmax };
    let sh = Shared {
        team: TeamBarrier::new(wgs as usize),
        near: RwLock::new(Vec::new()),
        active: AtomicU32::new(0),
        finished: AtomicU64::new(0),
        best: (0..part.n).map(|_| AtomicU64::new(INF)).collect(),
        relaxations: AtomicU64::new(0),
        error: Mutex::new(None),
    };
    let report = Mutex::new(Run::new(me, &setup, args));
    pe.run_work_groups(wgs, |wg| {
        let r = if wg.wg() == 0 {
            lead(wg, &mut lock(), &c, &sh, &setup, wgs, args, &report)
        } else {
            (0..setup.keys.len() as u64).try_for_each(|k| helper_search(wg, &c, &sh, k))
        };
        if let Err(e) = r {
            sh.team.abort();
            sh.error.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(e);
        }
        Ok(())
    })?;
    if let Some(e) = sh.error.lock().unwrap_or_else(PoisonError::into_inner).take() {
        return Err(e);
    }
    let run = report.into_inner().unwrap_or_else(PoisonError::into_inner);
    Ok(run.finish(input, args, &part, &format!("work-groups: {wgs}"), "not measured (CPU PEs have no NVML)"))
}

#[allow(clippy::too_many_arguments)]
fn lead(wg: &mut WorkGroup, ex: &mut Exchange, c: &Ctx, sh: &Shared, setup: &Setup, wgs: u32, args: &Args, report: &Mutex<Run>) -> Result<()> {
    for (k, &root) in setup.keys.iter().enumerate() {
        sh.relaxations.store(0, Ordering::Relaxed);
        let o = lead_search(wg, ex, c, sh, root, setup.delta0, args.controller, wgs)?;
        let nl = c.csr.n_local();
        let words: Vec<u64> = (0..nl).map(|i| c.local_word(i).load(Ordering::Acquire)).collect();
        let s = Searched {
            words,
            secs: o.secs,
            buckets: o.buckets,
            rounds: o.rounds,
            deltas: o.deltas,
            relaxations: sh.relaxations.load(Ordering::Relaxed),
        };
        let mut comm = CpuComm { wg, ex };
        report.lock().unwrap_or_else(PoisonError::into_inner).search(&mut comm, c.csr, &c.part, c.idb, k, root, s, None)?;
    }
    Ok(())
}
