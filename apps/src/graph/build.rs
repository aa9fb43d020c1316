//! Kernel 1 (Graph500 specification v2.0 §4, "Graph Construction"): from
//! the input (Kronecker generator or a file) to each PE's [`Csr`] of the
//! arcs leaving its block of vertices, and the checks that must fail
//! before any PE starts work (memory for the SCALE asked for).

use anyhow::{Result, bail};
use clap::Args;
use cpnet::Pe;
use rayon::prelude::*;

use super::exchange::Exchange;
use super::kron::{self, Relabel};
use super::load::EdgeList;
use super::{Csr, Partition, quantize};

/// The flags `bfs` and `sssp` share (flattened into each one's own).
#[derive(Args, Debug, Clone)]
pub struct GraphFlags {
    /// Generator, weight and search-key seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Read the graph from this file instead of generating it (.mtx Matrix
    /// Market, .gr DIMACS, otherwise a `u v [w]` edge list); edges without a
    /// weight get Graph500 kernel 3's.
    #[arg(long, conflicts_with = "road")]
    pub file: Option<std::path::PathBuf>,
    /// Generate a road-like graph instead of the Kronecker one: a SIDE x
    /// SIDE grid of degree at most 4 and diameter 2 (SIDE - 1), Graph500
    /// kernel 3 weights (`graph::load::road_grid`).
    #[arg(long, value_name = "SIDE")]
    pub road: Option<u64>,
    /// One search from this root instead of the sampled keys.
    #[arg(long)]
    pub root: Option<u64>,
    /// Validate every search (exit 1 on a failure).
    #[arg(long)]
    pub verify: bool,
    /// Exchange message size in 8-byte words.
    #[arg(long, default_value_t = super::exchange::DEFAULT_CHUNK_WORDS)]
    pub chunk: usize,
    /// Where the work-groups run: CPU threads, or GPU kernels (`bfs` only:
    /// one persistent kernel per search, or one launch per phase and level).
    #[arg(long, value_enum, default_value_t = crate::cli::Variant::Cpu)]
    pub variant: crate::cli::Variant,
}

/// Where the graph comes from.
#[derive(Clone, Debug)]
pub enum Input {
    /// The Graph500 Kronecker graph of `2^scale` vertices, edge factor 16.
    Kronecker {
        /// log2 of the vertex count.
        scale: u32,
        /// Generator seed.
        seed: u64,
    },
    /// A graph read from a file before start-up ([`super::load::read`]).
    File(std::sync::Arc<EdgeList>),
    /// The road-like grid of this side ([`super::load::road_grid`]).
    Road(std::sync::Arc<EdgeList>, u64),
}

impl Input {
    /// Vertices in the graph.
    pub fn n(&self) -> u64 {
        match self {
            Input::Kronecker { scale, .. } => 1 << scale,
            Input::File(g) | Input::Road(g, _) => g.n,
        }
    }

    /// Input edges (undirected).
    pub fn m(&self) -> u64 {
        match self {
            Input::Kronecker { scale, .. } => kron::n_edges(*scale),
            Input::File(g) | Input::Road(g, _) => g.edges.len() as u64,
        }
    }

    /// The Graph500 `graph_generation` field (a name for the input).
    pub fn name(&self) -> String {
        match self {
            Input::Kronecker { .. } => "Kronecker (Graph500 v2.0 section 3)".into(),
            Input::File(_) => "file".into(),
            Input::Road(_, side) => format!("road-like grid {side} x {side} (cpnet)"),
        }
    }
}

/// Bytes of process memory one PE needs for `input` on `n_pes` PEs (the
/// CSR, the generated edges and their exchange, the per-vertex arrays of
/// the searches), with a quarter more for the imbalance of the Kronecker
/// degrees.
pub fn bytes_per_pe(input: &Input, n_pes: i32) -> u64 {
    let p = n_pes.max(1) as u64;
    let arcs = 2 * input.m() / p;
    let generated = 2 * input.m() / p;
    let verts = input.n() / p + 1;
    (arcs * (8 + 4 + 24) + generated * 24 + verts * 48 + input.n() / 8) * 5 / 4
}

/// Memory this host has available (`MemAvailable` of /proc/meminfo), if known.
pub fn available_bytes() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuse an input too large for this host's memory, before start-up:
/// `local_pes` PEs of `n_pes` run here.
///
/// # Errors
/// SCALE above [`kron::MAX_SCALE`]; a need above the available memory,
/// saying how much is needed and how much there is.
pub fn check_memory(input: &Input, n_pes: i32, local_pes: i32) -> Result<()> {
    if let Input::Kronecker { scale, .. } = input
        && (*scale == 0 || *scale > kron::MAX_SCALE)
    {
        bail!("-scale {scale} is outside 1..={}", kron::MAX_SCALE);
    }
    let need = bytes_per_pe(input, n_pes);
    let here = need.saturating_mul(local_pes.max(1) as u64);
    if let Some(avail) = available_bytes()
        && here > avail
    {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        bail!(
            "the graph ({} vertices, {} edges) needs about {:.2} GiB per PE, {:.2} GiB for the {} PEs on this host, \
             and this host has {:.2} GiB available: use a smaller -scale or more hosts",
            input.n(),
            input.m(),
            gib(need),
            gib(here),
            local_pes,
            gib(avail)
        );
    }
    Ok(())
}

/// Kernel 1: this PE's CSR of `input` under `part`. Kronecker edges are
/// generated in parallel (this PE's slice of the edge list, on `threads`
/// threads) and each arc is sent to its source's owner through `ex`; a
/// file is already on every PE, which keeps its own arcs. Weights: the
/// file's, or Graph500 kernel 3's uniform `[0, 1)` per edge (from the
/// counter stream of `seed`), in fixed point. **Collective.**
///
/// # Errors
/// An exchange failure.
pub fn build_csr(pe: &Pe, ex: &mut Exchange, input: &Input, part: &Partition, threads: usize) -> Result<Csr> {
    let (me, n_pes) = (pe.my_pe(), pe.n_pes());
    let (lo, hi) = part.range(me);
    match input {
        Input::Kronecker { scale, seed } => {
            let (e_lo, e_hi) = kron::edge_slice(*scale, me, n_pes);
            let out = kron_arcs(*scale, *seed, part, (e_lo, e_hi), threads);
            let mut arcs = Vec::with_capacity(out[me as usize].len() / 3 * n_pes as usize);
            // The closure's own failures travel in its Ok value (with_ctx's
            // error type is the work-group's).
            pe.with_ctx(0, |wg| Ok(ex.all_to_all(wg, &out, 3, |_, w| arcs.extend(w.chunks_exact(3).map(|t| (t[0], t[1], t[2] as u32))))))??;
            drop(out);
            Ok(Csr::from_arcs(lo, (hi - lo) as usize, arcs))
        }
        Input::File(g) | Input::Road(g, _) => Ok(file_csr(g, part, me)),
    }
}

/// The two arcs of Kronecker edge `e`, `(source, target, weight)` both
/// ways, with kernel 3's weight in fixed point ([`quantize`]).
fn edge_arcs(scale: u32, seed: u64, relabel: &Relabel, e: u64) -> [(u64, u64, u64); 2] {
    let (u, v, w) = kron::edge(scale, seed, relabel, e);
    let wq = quantize(w);
    [(u, v, wq), (v, u, wq)]
}

/// The arcs of Kronecker edges `e_lo..e_hi` (generated on `threads`
/// threads) as `[source, target, weight]` words, in one list per owner of
/// the source.
fn kron_arcs(scale: u32, seed: u64, part: &Partition, (e_lo, e_hi): (u64, u64), threads: usize) -> Vec<Vec<u64>> {
    let n_pes = part.n_pes as usize;
    let relabel = Relabel::new(scale, seed);
    let threads = threads.max(1) as u64;
    let per = (e_hi - e_lo).div_ceil(threads);
    let outs: Vec<Vec<Vec<u64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let relabel = &relabel;
                s.spawn(move || {
                    let mut out = vec![Vec::new(); n_pes];
                    let (a, b) = ((e_lo + t * per).min(e_hi), (e_lo + (t + 1) * per).min(e_hi));
                    for e in a..b {
                        for (x, y, wq) in edge_arcs(scale, seed, relabel, e) {
                            out[part.owner(x) as usize].extend([x, y, wq]);
                        }
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("generator thread")).collect()
    });
    let mut out = vec![Vec::new(); n_pes];
    for o in outs {
        for (d, mut words) in o.into_iter().enumerate() {
            out[d].append(&mut words);
        }
    }
    out
}

/// PE `me`'s CSR of a graph read from a file (on every PE): its own arcs.
fn file_csr(g: &EdgeList, part: &Partition, me: i32) -> Csr {
    let (lo, hi) = part.range(me);
    let mut arcs = Vec::new();
    let seed = 1;
    for (e, &(u, v, w)) in g.edges.iter().enumerate() {
        let wq = quantize(w.unwrap_or_else(|| kron::unit(seed, u64::MAX, e as u64))) as u32;
        if part.owner(u) == me {
            arcs.push((u, v, wq));
        }
        if part.owner(v) == me {
            arcs.push((v, u, wq));
        }
    }
    Csr::from_arcs(lo, (hi - lo) as usize, arcs)
}

/// Kernel 1 without communication, for PEs whose host has no work-group
/// (GPU PEs): every PE generates the whole Kronecker edge list (the same
/// for a seed whatever the number of PEs) on a pool of `threads` threads and
/// keeps the arcs of its own vertices, sorted on the same pool; a file is
/// handled as [`build_csr`] does.
///
/// # Panics
/// If the thread pool cannot be created (no threads left to the process).
pub fn build_csr_local(input: &Input, part: &Partition, me: i32, threads: usize) -> Csr {
    let (lo, hi) = part.range(me);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build().expect("kernel 1's thread pool");
    pool.install(|| match input {
        Input::Kronecker { scale, seed } => {
            let (scale, seed) = (*scale, *seed);
            let relabel = Relabel::new(scale, seed);
            // Straight into (source, target, weight) tuples of this PE's
            // sources: no per-thread word lists to merge and convert (at
            // SCALE 24 those copies and a one-thread sort took most of a
            // GPU run's kernel 1).
            let arcs: Vec<(u64, u64, u32)> = (0..kron::n_edges(scale))
                .into_par_iter()
                .flat_map_iter(|e| {
                    edge_arcs(scale, seed, &relabel, e).into_iter().filter(|&(x, _, _)| part.owner(x) == me).map(|(x, y, wq)| (x, y, wq as u32))
                })
                .collect();
            Csr::from_arcs(lo, (hi - lo) as usize, arcs)
        }
        Input::File(g) | Input::Road(g, _) => file_csr(g, part, me),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each PE's CSR built alone equals the one kernel 1 builds with the
    /// exchange (every PE's slice of the edges, the arcs sent to their
    /// sources' owners).
    #[test]
    fn local_csr_equals_the_distributed_one() {
        let (scale, seed, n_pes) = (9, 3, 3);
        let part = Partition::new(1 << scale, n_pes);
        let slices: Vec<Vec<Vec<u64>>> =
            (0..n_pes).map(|pe| kron_arcs(scale, seed, &part, kron::edge_slice(scale, pe, n_pes), 2)).collect();
        for me in 0..n_pes {
            let (lo, hi) = part.range(me);
            let arcs = slices.iter().flat_map(|o| o[me as usize].chunks_exact(3).map(|t| (t[0], t[1], t[2] as u32))).collect();
            let want = Csr::from_arcs(lo, (hi - lo) as usize, arcs);
            let got = build_csr_local(&Input::Kronecker { scale, seed }, &part, me, 2);
            assert_eq!(got, want, "PE {me}");
            assert!(got.n_arcs() > 0);
        }
    }
}
