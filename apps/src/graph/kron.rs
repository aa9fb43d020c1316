//! The Graph500 Kronecker generator (Graph500 specification v2.0, §3
//! "Generating the Edge List"), deterministic for a seed whatever the
//! number of PEs.
//!
//! * `N = 2^SCALE` vertices, `M = edgefactor * N` edges; each edge picks one
//!   quadrant of the adjacency matrix per bit with the initiator
//!   probabilities `A, B, C` (`D = 1 - A - B - C`), exactly as the
//!   specification's Octave reference does (`ii_bit = rand > A + B`,
//!   `jj_bit = rand > (C_norm * ii_bit + A_norm * !ii_bit)`).
//! * The random numbers are a *counter-based* stream: value `k` of edge `e`
//!   is a hash of `(seed, e, k)` ([`unit()`]), so any PE can generate any
//!   slice of the edge list on its own and the list does not depend on how
//!   it is split (the Graph500 reference gets the same property from a
//!   skip-ahead MRG). A hash rather than `rand`'s sequential generators
//!   because each value is addressed by its edge index.
//! * Vertex relabelling (§3: "the vertex numbers are randomly permuted"): a
//!   seeded pseudo-random permutation of `0..N`, a 4-round Feistel network
//!   over `2 * ceil(SCALE / 2)` bits with cycle walking ([`Relabel`]): a
//!   bijection computed per vertex, so no PE needs a table of `N` entries.
//!   The shuffle of the edge list order is left out: the CSR built from it
//!   does not depend on the order.
//! * Kernel 3 weights (§7): uniform in `[0, 1)`, one per generated edge, from
//!   the same counter stream; quantized to [`crate::graph::WEIGHT_ONE`]ths
//!   (fixed point, [`crate::graph::quantize`]).

/// Initiator probabilities of the specification (§3).
pub const A: f64 = 0.57;
/// See [`A`].
pub const B: f64 = 0.19;
/// See [`A`].
pub const C: f64 = 0.19;
/// The specification's edge factor (§3).
pub const EDGE_FACTOR: u64 = 16;
/// Largest SCALE accepted (vertex ids, packed with distances in SSSP, need
/// `SCALE` bits; see `crate::sssp`).
pub const MAX_SCALE: u32 = 30;

/// A 64-bit mix (splitmix64's finalizer): a bijection with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Random 64 bits number `k` of stream `stream` for `seed`.
pub fn bits(seed: u64, stream: u64, k: u64) -> u64 {
    mix(mix(seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_add(mix(stream.wrapping_mul(0xd1b5_4a32_d192_ed03) ^ k)))
}

/// A uniform value in `[0, 1)` (53 random bits): number `k` of stream `stream`.
pub fn unit(seed: u64, stream: u64, k: u64) -> f64 {
    (bits(seed, stream, k) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The seeded vertex relabelling: a permutation of `0..2^scale`.
#[derive(Clone, Copy, Debug)]
pub struct Relabel {
    scale: u32,
    half: u32,
    keys: [u64; 4],
}

impl Relabel {
    /// The permutation of `0..2^scale` for `seed`.
    pub fn new(scale: u32, seed: u64) -> Relabel {
        let half = scale.div_ceil(2).max(1);
        let keys = [0, 1, 2, 3].map(|r| bits(seed, u64::MAX - 1, r));
        Relabel { scale, half, keys }
    }

    fn round(&self, x: u64) -> u64 {
        let m = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & m);
        for k in self.keys {
            let f = mix(r ^ k) & m;
            (l, r) = (r, l ^ f);
        }
        (l << self.half) | r
    }

    /// The new label of vertex `v` (`v < 2^scale`).
    pub fn apply(&self, v: u64) -> u64 {
        let n = 1u64 << self.scale;
        let mut x = self.round(v);
        // Cycle walking: the network permutes 0..2^(2*half) >= n; walking
        // from a value < n until the next value < n permutes 0..n.
        while x >= n {
            x = self.round(x);
        }
        x
    }
}

/// Edge `e` (`e < edgefactor * 2^scale`) of the Kronecker graph for `seed`,
/// relabelled: `(u, v)`, and its kernel 3 weight in `[0, 1)`.
pub fn edge(scale: u32, seed: u64, relabel: &Relabel, e: u64) -> (u64, u64, f64) {
    let ab = A + B;
    let c_norm = C / (1.0 - ab);
    let a_norm = A / ab;
    let (mut i, mut j) = (0u64, 0u64);
    for ib in 0..u64::from(scale) {
        let ii = unit(seed, e, 2 * ib) > ab;
        let jj = unit(seed, e, 2 * ib + 1) > if ii { c_norm } else { a_norm };
        i |= u64::from(ii) << ib;
        j |= u64::from(jj) << ib;
    }
    let w = unit(seed ^ 0x5555_5555_5555_5555, u64::MAX, e);
    (relabel.apply(i), relabel.apply(j), w)
}

/// Edges in the Graph500 graph of `scale`: `EDGE_FACTOR * 2^scale`.
pub fn n_edges(scale: u32) -> u64 {
    EDGE_FACTOR << scale
}

/// The edge range `[lo, hi)` PE `pe` of `n_pes` generates.
pub fn edge_slice(scale: u32, pe: i32, n_pes: i32) -> (u64, u64) {
    let m = n_edges(scale);
    let at = |p: i32| (u128::from(m) * p as u128 / n_pes as u128) as u64;
    (at(pe), at(pe + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relabelling_is_a_permutation_for_even_and_odd_scales() {
        for scale in [1, 4, 7, 10] {
            let r = Relabel::new(scale, 3);
            let n = 1usize << scale;
            let mut seen = vec![false; n];
            for v in 0..n as u64 {
                let p = r.apply(v) as usize;
                assert!(p < n && !seen[p], "scale {scale}: {v} -> {p} repeats or leaves the range");
                seen[p] = true;
            }
            assert!(scale < 4 || (0..n as u64).any(|v| r.apply(v) != v), "identity");
        }
    }

    #[test]
    fn edges_do_not_depend_on_the_split_and_follow_the_initiator() {
        let (scale, seed) = (10, 7);
        let r = Relabel::new(scale, seed);
        let whole: Vec<_> = (0..n_edges(scale)).map(|e| edge(scale, seed, &r, e)).collect();
        let mut split = Vec::new();
        for p in 0..3 {
            let (lo, hi) = edge_slice(scale, p, 3);
            split.extend((lo..hi).map(|e| edge(scale, seed, &r, e)));
        }
        assert_eq!(whole, split);
        // Without relabelling, bit 0 of (i, j) falls in quadrant (0,0) with
        // probability A: check the generator's quadrant frequencies.
        let id = |e: u64| {
            let (mut q, ab) = ([0u32; 4], A + B);
            for ib in 0..u64::from(scale) {
                let ii = unit(seed, e, 2 * ib) > ab;
                let jj = unit(seed, e, 2 * ib + 1) > if ii { C / (1.0 - ab) } else { A / ab };
                q[usize::from(ii) * 2 + usize::from(jj)] += 1;
            }
            q
        };
        let mut tot = [0u64; 4];
        for e in 0..n_edges(scale) {
            for (t, c) in tot.iter_mut().zip(id(e)) {
                *t += u64::from(c);
            }
        }
        let all: u64 = tot.iter().sum();
        let f = tot.map(|t| t as f64 / all as f64);
        for (got, want) in f.iter().zip([A, B, C, 1.0 - A - B - C]) {
            assert!((got - want).abs() < 0.01, "quadrant frequencies {f:?}");
        }
        assert!(whole.iter().all(|&(u, v, w)| u < 1 << scale && v < 1 << scale && (0.0..1.0).contains(&w)));
    }
}
