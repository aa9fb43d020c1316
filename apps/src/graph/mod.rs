//! Graph inputs and their distributed form, shared by [`crate::bfs`] and
//! [`crate::sssp`].
//!
//! - [`kron`]: the Graph500 Kronecker generator (specification v2.0 §3),
//!   generated in parallel on the PEs, deterministic for a seed whatever the
//!   number of PEs;
//! - [`load`]: Matrix Market (`.mtx`), DIMACS shortest-path (`.gr`) and
//!   SNAP-style edge-list readers, with errors that name the file, the line
//!   and the reason;
//! - [`exchange`]: the all-to-all of records between PEs over cpnet
//!   (put-with-signal into per-source receive slots, acknowledged), used to
//!   distribute edges, exchange BFS frontiers and reduce counters;
//! - [`Partition`] and [`Csr`]: the 1D partition (a block of consecutive
//!   vertex ids per PE) and each PE's compressed sparse rows of the arcs
//!   leaving its vertices (Graph500 §4, kernel 1);
//! - [`comm`]: the host-side collectives (sums, maxima, all-to-all)
//!   over a CPU work-group's exchange or a GPU PE's rendezvous;
//! - [`build`]: kernel 1 itself (input -> each PE's CSR) and the memory
//!   check that refuses a SCALE too large before any PE starts work;
//! - [`keys`]: the 64 search keys (§5);
//! - [`stats`]: the Graph500 output block (§9).
//!
//! Weights (SSSP) are fixed point: `w_q = round(w * WEIGHT_ONE)` with
//! [`WEIGHT_ONE`] `= 2^16`, so distances are exact integer sums and the
//! distributed result can be compared bit for bit with a sequential
//! Dijkstra on the same quantized weights. Graph500 kernel 3 weights are
//! uniform in `[0, 1)`, i.e. `0..=65535` after quantization.

pub mod build;
pub mod comm;
pub mod exchange;
pub mod keys;
pub mod kron;
pub mod load;
pub mod stats;

use rayon::prelude::*;

/// One unit of weight in fixed point (16 fractional bits).
pub const WEIGHT_ONE: u64 = 1 << 16;

/// `w` (non-negative, finite) in fixed point: `round(w * WEIGHT_ONE)`.
pub fn quantize(w: f64) -> u64 {
    (w * WEIGHT_ONE as f64).round() as u64
}

/// The 1D block partition of `n` vertices over `n_pes` PEs: PE `p` owns
/// `[p * block, min(n, (p + 1) * block))` with `block = ceil(n / n_pes)`
/// rounded up to a multiple of 64 (so a PE's block is whole words of a
/// vertex bitmap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Vertices in the graph.
    pub n: u64,
    /// PEs.
    pub n_pes: i32,
    /// Vertices per PE (the last PE may have fewer).
    pub block: u64,
}

impl Partition {
    /// The partition of `n` vertices over `n_pes` PEs.
    pub fn new(n: u64, n_pes: i32) -> Partition {
        Partition { n, n_pes, block: n.div_ceil(n_pes.max(1) as u64).max(1).next_multiple_of(64) }
    }

    /// The PE owning vertex `v`.
    pub fn owner(&self, v: u64) -> i32 {
        (v / self.block) as i32
    }

    /// The first vertex of PE `pe`.
    pub fn lo(&self, pe: i32) -> u64 {
        (pe as u64 * self.block).min(self.n)
    }

    /// The vertices of PE `pe`: `[lo, hi)`.
    pub fn range(&self, pe: i32) -> (u64, u64) {
        (self.lo(pe), self.lo(pe + 1))
    }

    /// How many vertices PE `pe` owns.
    pub fn count(&self, pe: i32) -> usize {
        let (lo, hi) = self.range(pe);
        (hi - lo) as usize
    }
}

/// One PE's arcs in compressed sparse rows: the arcs leaving each of its
/// vertices, targets as global ids, each row sorted by target (so "is
/// `(u, v)` an edge" is a binary search). An undirected input edge `{u, v}`
/// is two arcs, one on `u`'s owner and one on `v`'s (a self-loop is two
/// arcs `(u, u)`), so the sum of the degrees of a set of vertices counts
/// every input edge among them twice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Csr {
    /// Global id of local vertex 0.
    pub lo: u64,
    /// Row offsets: the arcs of local vertex `i` are `cols[rows[i]..rows[i + 1]]`.
    pub rows: Vec<u64>,
    /// Arc targets (global ids).
    pub cols: Vec<u64>,
    /// Arc weights in fixed point ([`WEIGHT_ONE`]), parallel to `cols`.
    pub weights: Vec<u32>,
}

impl Csr {
    /// The CSR of `n_local` vertices starting at `lo` from `arcs`
    /// (`(source global id, target, weight)`, sources in `[lo, lo + n_local)`),
    /// each row sorted by (target, weight).
    ///
    /// # Panics
    /// If a source is outside the range (a bug of the caller's partition).
    pub fn from_arcs(lo: u64, n_local: usize, mut arcs: Vec<(u64, u64, u32)>) -> Csr {
        // On the calling thread's rayon pool (the global one unless the
        // caller installed its own): at SCALE 24 a PE sorts 2^28 arcs.
        arcs.par_sort_unstable();
        let mut rows = vec![0u64; n_local + 1];
        for &(u, _, _) in &arcs {
            assert!(u >= lo && u - lo < n_local as u64, "arc source {u} outside [{lo}, {})", lo + n_local as u64);
            rows[(u - lo) as usize + 1] += 1;
        }
        for i in 0..n_local {
            rows[i + 1] += rows[i];
        }
        let cols = arcs.par_iter().map(|a| a.1).collect();
        let weights = arcs.par_iter().map(|a| a.2).collect();
        Csr { lo, rows, cols, weights }
    }

    /// Local vertices.
    pub fn n_local(&self) -> usize {
        self.rows.len() - 1
    }

    /// Arcs.
    pub fn n_arcs(&self) -> u64 {
        self.cols.len() as u64
    }

    /// The arc index range of local vertex `i`.
    pub fn arcs(&self, i: usize) -> std::ops::Range<usize> {
        self.rows[i] as usize..self.rows[i + 1] as usize
    }

    /// The targets of local vertex `i`.
    pub fn adj(&self, i: usize) -> &[u64] {
        &self.cols[self.arcs(i)]
    }

    /// Degree of local vertex `i`.
    pub fn degree(&self, i: usize) -> u64 {
        self.rows[i + 1] - self.rows[i]
    }

    /// Whether local vertex `i` has an arc to `v` (binary search).
    pub fn has_arc(&self, i: usize, v: u64) -> bool {
        self.adj(i).binary_search(&v).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_covers_every_vertex_once() {
        for (n, p) in [(10u64, 3), (16, 4), (5, 8), (1, 1)] {
            let part = Partition::new(n, p);
            let mut total = 0;
            for pe in 0..p {
                let (lo, hi) = part.range(pe);
                total += hi - lo;
                for v in lo..hi {
                    assert_eq!(part.owner(v), pe);
                }
            }
            assert_eq!(total, n);
        }
    }

    #[test]
    fn csr_rows_are_sorted_and_searchable() {
        let c = Csr::from_arcs(10, 3, vec![(12, 4, 1), (10, 9, 2), (12, 1, 3), (10, 3, 4)]);
        assert_eq!(c.rows, vec![0, 2, 2, 4]);
        assert_eq!(c.adj(0), &[3, 9]);
        assert_eq!(c.adj(2), &[1, 4]);
        assert!(c.has_arc(2, 4) && !c.has_arc(1, 4));
        assert_eq!(c.weights, vec![4, 2, 3, 1]);
        assert_eq!(quantize(0.5), WEIGHT_ONE / 2);
    }
}
