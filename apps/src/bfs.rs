//! Distributed breadth-first search, the Graph500 "Search" benchmark
//! (specification v2.0: §4 kernel 1, §5 search keys, §6 kernel 2, §8
//! validation, §9 output), on cpnet with CPU work-groups (`-variant cpu`,
//! this module) or GPU kernels (`-variant intra-kernel|inter-kernel`,
//! [`gpu`]).
//!
//! # Distribution
//!
//! The vertices are split in blocks over the PEs ([`Partition`], 1D); each
//! PE holds the compressed sparse rows of the arcs leaving its block
//! ([`Csr`]) and the parent and level of its vertices.
//!
//! # The search (one work-group per PE, level-synchronous)
//!
//! Level `L` expands the frontier (the vertices found at level `L`) in one
//! of two directions:
//!
//! - **Top-down**: for every frontier vertex `u` and arc `(u, v)`: a local
//!   `v` not yet visited gets parent `u` and level `L + 1` at once; a remote
//!   `v` goes into the message for its owner as the pair `(v, u)`, once per
//!   search (a bitmap of vertices already sent). The messages travel through
//!   the [`Exchange`] (`putmem_signal_nbi` into per-source receive slots,
//!   acknowledged: the frontier exchange); the owner claims each `v` not yet
//!   visited for the first `u` it reads.
//! - **Bottom-up** (with `-direction hybrid`, after Beamer, Asanović and
//!   Patterson, SC'12): every PE sends its frontier as a bitmap of its
//!   block to every PE (the same exchange), and every unvisited local
//!   vertex looks for a parent among its neighbours in the frontier,
//!   stopping at the first. The search switches to bottom-up when the
//!   frontier's arcs `m_f` exceed `m_u / alpha` (the arcs of the unvisited
//!   vertices) and back to top-down when the frontier has fewer than
//!   `n / beta` vertices.
//!
//! After each level one sum over the PEs (through the exchange: every PE
//! sends its three counts to every PE) gives the next frontier's size, its
//! arcs and the unvisited arcs; the search ends when the frontier is empty.
//! The reduction is the barrier between levels: a PE starts level `L + 1`
//! only after every PE finished level `L`, so receive slots are never
//! rewritten while read (the exchange's acknowledgements guarantee it
//! anyway).
//!
//! # Measurements
//!
//! Each search is timed on PE 0 from a `barrier_all` to the last reduction.
//! Its edge count is the number of input edges in the component searched
//! (the degrees of the visited vertices, summed over the PEs, halved: every
//! input edge, self-loops and duplicates included, is two arcs), as
//! Graph500 §9 counts it; TEPS = edges / time. `-verify` checks every tree
//! with the five rules of §8 ([`validate`]).
//!
//! # GPU variants ([`gpu`])
//!
//! The same partition, CSR and top-down search on one GPU per PE:
//! `-variant intra-kernel` runs each search as one persistent cooperative
//! kernel whose blocks exchange the frontier with `putmem_signal_nbi` and
//! sum the frontier sizes over the PEs from inside the kernel (with
//! `-direction hybrid`, bottom-up levels too: frontier bitmaps exchanged
//! from the kernel); `-variant inter-kernel` launches the phases of every
//! level as separate kernels, the host deciding between levels whether to
//! go on (ComP-Net's baseline; top-down only). The GPU variants default to
//! top-down. The keys, the validation,
//! the TEPS and the output are this module's ([`searches`], over the host
//! collectives of [`crate::graph::comm`]).

pub mod gpu;
pub mod validate;

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::{Parser, ValueEnum};
use cpnet::WorkGroup;

use crate::cli::{Variant, init_pe};
use crate::graph::build::{GraphFlags, Input, build_csr, check_memory};
use crate::graph::comm::{Collectives, CpuComm};
use crate::graph::exchange::Exchange;
use crate::graph::keys::search_keys;
use crate::graph::{Csr, Partition, load, stats};

/// Level of a vertex not reached.
pub const UNVISITED: u32 = u32::MAX;
/// Parent of a vertex not reached.
pub const NO_PARENT: u64 = u64::MAX;

/// Which directions the search may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Direction {
    /// Top-down levels only.
    TopDown,
    /// Direction-optimizing: top-down and bottom-up levels (Beamer et al.).
    Hybrid,
}

/// `bfs`'s flags (`-scale 16` and `--scale 16` both work).
#[derive(Parser, Debug, Clone)]
#[command(name = "bfs", about = "Graph500 breadth-first search over cpnet (run under cpnet-run)")]
pub struct Args {
    /// log2 of the vertex count of the Kronecker graph (edge factor 16).
    #[arg(long, default_value_t = 16)]
    pub scale: u32,
    /// Search keys (Graph500: 64).
    #[arg(long, default_value_t = 64)]
    pub nbfs: usize,
    /// Top-down only, or direction-optimizing (default: hybrid on CPU
    /// work-groups, top-down on the GPU variants; hybrid there runs in
    /// `-variant intra-kernel` only).
    #[arg(long, value_enum)]
    pub direction: Option<Direction>,
    /// Switch to bottom-up when the frontier's arcs exceed the unvisited
    /// arcs / alpha.
    #[arg(long, default_value_t = 14.0)]
    pub alpha: f64,
    /// Switch back to top-down when the frontier has fewer than n / beta vertices.
    #[arg(long, default_value_t = 24.0)]
    pub beta: f64,
    /// GPU variants: thread blocks per PE (default: as many as fit on the
    /// GPU at once, shared among its PEs, less room for the proxy's
    /// landing agents).
    #[arg(long)]
    pub wgs: Option<u32>,
    /// Input, validation and placement flags.
    #[command(flatten)]
    pub g: GraphFlags,
}

impl Args {
    /// The directions the search may take: `-direction`, or hybrid for
    /// `-variant cpu` and top-down for the GPU variants.
    pub fn direction(&self) -> Direction {
        self.direction.unwrap_or(if self.g.variant.is_gpu() { Direction::TopDown } else { Direction::Hybrid })
    }
}

/// Read the input named by the flags and check it, before start-up:
/// errors here stop every PE before any work.
///
/// # Errors
/// A bad graph file ([`load::read`]) or road side ([`load::road_grid`]),
/// a root outside the graph, a SCALE
/// outside the generator's range or too large for this host's memory.
pub fn prepare_input(g: &GraphFlags, scale: u32, weights: bool) -> Result<Input> {
    let launch = cpnet::env::Launch::from_env()?;
    let (seed, root) = (g.seed, g.root);
    let input = match (&g.file, g.road) {
        (Some(path), _) => Input::File(Arc::new(load::read(path, weights)?)),
        (None, Some(side)) => Input::Road(Arc::new(load::road_grid(side)?), side),
        (None, None) => Input::Kronecker { scale, seed },
    };
    if let Some(r) = root
        && r >= input.n()
    {
        bail!("-root {r} is outside the graph (vertices 0..{})", input.n());
    }
    check_memory(&input, launch.n_pes, launch.local_size)?;
    Ok(input)
}

/// One PE's search state.
pub struct Search {
    /// Parent (global id) of each local vertex, [`NO_PARENT`] if not reached.
    pub parent: Vec<u64>,
    /// Level of each local vertex, [`UNVISITED`] if not reached.
    pub level: Vec<u32>,
    /// Levels run top-down and bottom-up.
    pub levels: (u32, u32),
}

fn set_bit(bits: &mut [u64], i: u64) -> bool {
    let (w, b) = ((i / 64) as usize, 1u64 << (i % 64));
    let was = bits[w] & b != 0;
    bits[w] |= b;
    !was
}

fn bit(bits: &[u64], i: u64) -> bool {
    bits[(i / 64) as usize] & (1 << (i % 64)) != 0
}

/// One search from `root` (global id): every PE calls it with the same
/// root (**collective**).
///
/// # Errors
/// An exchange failure.
pub fn bfs(wg: &mut WorkGroup, ex: &mut Exchange, csr: &Csr, part: &Partition, root: u64, args: &Args) -> Result<Search> {
    let me = wg.my_pe();
    let p = part.n_pes as usize;
    let (lo, _) = part.range(me);
    let nl = csr.n_local();
    let mut parent = vec![NO_PARENT; nl];
    let mut level = vec![UNVISITED; nl];
    let mut frontier: Vec<u32> = Vec::new();
    let mut sent = vec![0u64; part.n.div_ceil(64) as usize];
    let block_words = (part.block / 64) as usize;
    let mut unvisited_arcs: u64 = csr.n_arcs();
    if part.owner(root) == me {
        let r = (root - lo) as usize;
        parent[r] = root;
        level[r] = 0;
        frontier.push(r as u32);
        unvisited_arcs -= csr.degree(r);
    }
    // Global counts of the current frontier (vertices, arcs) and of the
    // unvisited arcs, as the last reduction gave them.
    let total_arcs = ex.sum(wg, &[csr.n_arcs()])?[0];
    let root_deg = ex.sum(wg, &[frontier.iter().map(|&i| csr.degree(i as usize)).sum()])?[0];
    let (mut n_f, mut m_f, mut m_u) = (1u64, root_deg, total_arcs - root_deg);
    let mut bottom_up = false;
    let mut levels = (0, 0);
    let mut lvl = 0u32;
    while n_f > 0 {
        if args.direction() == Direction::Hybrid {
            if !bottom_up && m_f as f64 > m_u as f64 / args.alpha {
                bottom_up = true;
            } else if bottom_up && (n_f as f64) < part.n as f64 / args.beta {
                bottom_up = false;
            }
        }
        let mut next: Vec<u32> = Vec::new();
        let claim = |v_l: usize, u: u64, next: &mut Vec<u32>, parent: &mut [u64], level: &mut [u32]| {
            if level[v_l] == UNVISITED {
                level[v_l] = lvl + 1;
                parent[v_l] = u;
                next.push(v_l as u32);
            }
        };
        if bottom_up {
            levels.1 += 1;
            // Every PE's frontier bitmap, whole words of its block.
            let mut mine = vec![0u64; block_words];
            for &i in &frontier {
                set_bit(&mut mine, u64::from(i));
            }
            let out = vec![mine; p];
            let mut global = vec![0u64; block_words * p];
            let mut at = vec![0usize; p];
            ex.all_to_all(wg, &out, 1, |s, w| {
                let s = s as usize;
                global[s * block_words + at[s]..][..w.len()].copy_from_slice(w);
                at[s] += w.len();
            })?;
            for v_l in 0..nl {
                if level[v_l] != UNVISITED {
                    continue;
                }
                if let Some(&u) = csr.adj(v_l).iter().find(|&&u| bit(&global, u)) {
                    claim(v_l, u, &mut next, &mut parent, &mut level);
                }
            }
        } else {
            levels.0 += 1;
            let mut out = vec![Vec::new(); p];
            for &u_l in &frontier {
                let u = lo + u64::from(u_l);
                for &v in csr.adj(u_l as usize) {
                    let o = part.owner(v);
                    if o == me {
                        claim((v - lo) as usize, u, &mut next, &mut parent, &mut level);
                    } else if set_bit(&mut sent, v) {
                        out[o as usize].extend([v, u]);
                    }
                }
            }
            ex.all_to_all(wg, &out, 2, |_, w| {
                for pair in w.chunks_exact(2) {
                    claim((pair[0] - lo) as usize, pair[1], &mut next, &mut parent, &mut level);
                }
            })?;
        }
        let m_next: u64 = next.iter().map(|&i| csr.degree(i as usize)).sum();
        unvisited_arcs -= m_next;
        let g = ex.sum(wg, &[next.len() as u64, m_next, unvisited_arcs])?;
        (n_f, m_f, m_u) = (g[0], g[1], g[2]);
        frontier = next;
        lvl += 1;
    }
    Ok(Search { parent, level, levels })
}

/// Run `bfs` as its flags say; `Ok(false)` if a validation failed.
///
/// # Errors
/// Bad input (before start-up), start-up failures, communication failures.
pub fn run(args: &Args) -> Result<bool> {
    if args.g.variant == Variant::InterKernel && args.direction() == Direction::Hybrid {
        bail!(
            "-variant inter-kernel -direction hybrid: bottom-up levels run in the intra-kernel variant only; \
             use -variant intra-kernel or cpu, or -direction top-down"
        );
    }
    args.g.variant.require_available()?;
    if args.nbfs == 0 {
        bail!("-nbfs must be at least 1");
    }
    let input = prepare_input(&args.g, args.scale, false)?;
    let (ok, me) = if args.g.variant.is_gpu() { gpu::run(args, &input)? } else { run_cpu(args, &input)? };
    if me == 0 && !ok {
        eprintln!("bfs: validation FAILED");
    }
    Ok(ok)
}

/// The CPU variant on this PE: `(all searches valid, this PE)`.
fn run_cpu(args: &Args, input: &Input) -> Result<(bool, i32)> {
    let chunk = args.g.chunk.max(16);
    let (pe, _) = init_pe(|n| Exchange::heap_bytes(n, chunk) + (1 << 20))?;
    let (me, n_pes) = (pe.my_pe(), pe.n_pes());
    let part = Partition::new(input.n(), n_pes);
    let mut ex = Exchange::new(&pe, chunk)?;
    let t0 = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).div_ceil(n_pes.max(1) as usize);
    let csr = build_csr(&pe, &mut ex, input, &part, threads)?;
    let construction = t0.elapsed().as_secs_f64();
    let r = pe.with_ctx(0, |wg| {
        let mut comm = CpuComm { wg, ex: &mut ex };
        Ok(searches(&mut comm, &csr, &part, input, args, construction, |c, root| {
            let t = Instant::now();
            let s = bfs(c.wg, c.ex, &csr, &part, root, args)?;
            Ok((s, t.elapsed().as_secs_f64()))
        }))
    })?;
    let ok = r?;
    pe.finalize()?;
    Ok((ok, me))
}

/// The Graph500 protocol around `search` (one search from a root, and its
/// time in seconds; **collective**): the keys, every search (validated with
/// `-verify`), its TEPS line, and the Graph500 block on PE 0. Shared by the
/// CPU and the GPU variants; `comm` carries the host-side collectives.
/// `Ok(false)` if a validation failed.
///
/// # Errors
/// A search or a communication failure.
pub fn searches<C: Collectives>(
    comm: &mut C,
    csr: &Csr,
    part: &Partition,
    input: &Input,
    args: &Args,
    construction: f64,
    mut search: impl FnMut(&mut C, u64) -> Result<(Search, f64)>,
) -> Result<bool> {
    let me = comm.my_pe();
    let construction = f64::from_bits(comm.max(&[construction.to_bits()])?[0]);
    let keys = match args.g.root {
        Some(r) => vec![r],
        None => search_keys(comm, csr, part, args.g.seed, args.nbfs)?,
    };
    if keys.is_empty() {
        bail!("the graph has no vertex with an edge to another vertex: nothing to search");
    }
    let (mut times, mut nedges) = (Vec::new(), Vec::new());
    let mut all_ok = true;
    let mut validate_time = 0.0;
    for (k, &root) in keys.iter().enumerate() {
        comm.barrier()?;
        let (s, secs) = search(comm, root)?;
        let deg: u64 = (0..csr.n_local()).filter(|&i| s.level[i] != UNVISITED).map(|i| csr.degree(i)).sum();
        let nedge = comm.sum(&[deg])?[0] / 2;
        if args.g.verify {
            let tv = Instant::now();
            let errors = validate::validate(comm, csr, part, root, &s)?;
            validate_time += tv.elapsed().as_secs_f64();
            if errors > 0 {
                all_ok = false;
                if me == 0 {
                    eprintln!("bfs: search {k} from root {root}: {errors} violations of the Graph500 rules");
                }
            }
        }
        if me == 0 {
            println!(
                "search {k:2}: root {root:>10}  {:>9.6} s  {nedge:>10} edges  {:.4e} TEPS  levels {} top-down + {} bottom-up{}",
                secs,
                nedge as f64 / secs,
                s.levels.0,
                s.levels.1,
                if args.g.verify { "  valid" } else { "" }
            );
        }
        times.push(secs);
        nedges.push(nedge as f64);
    }
    if me == 0 {
        let kron = matches!(input, Input::Kronecker { .. }).then_some(args.scale);
        print!("{}", stats::header(input, kron, "NBFS", keys.len(), part.n_pes, construction));
        print!("{}", stats::kernel_block("bfs", &times, &nedges));
        if args.g.verify {
            println!("bfs_mean_validate: {:.17e}", validate_time / keys.len() as f64);
        }
        println!("direction: {:?}  validation: {}", args.direction(), if !args.g.verify { "not run (-verify)" } else if all_ok { "PASSED" } else { "FAILED" });
    }
    Ok(all_ok)
}
