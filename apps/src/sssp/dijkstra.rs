//! The sequential reference for [`crate::sssp`]: Dijkstra's algorithm on
//! one PE over the whole graph with the same fixed-point weights, and the
//! check of a distributed result against it: every distance equal, and
//! every reached vertex's parent joined to it by an arc whose weight
//! closes the distance exactly (`d(v) == d(parent) + w`), the root its own
//! parent at distance 0 (the Graph500 kernel 3 validation, specification
//! v2.0 §8, with exact arithmetic).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Distance of a vertex not reached.
pub const INF: u64 = u64::MAX;

/// Distances from `root` over `n` vertices and `arcs` `(u, v, w)` (both
/// directions of every edge present), in fixed point.
pub fn dijkstra(n: usize, arcs: &[(u64, u64, u32)], root: u64) -> Vec<u64> {
    let mut rows = vec![0usize; n + 1];
    for a in arcs {
        rows[a.0 as usize + 1] += 1;
    }
    for i in 0..n {
        rows[i + 1] += rows[i];
    }
    let mut adj = vec![(0u64, 0u32); arcs.len()];
    let mut fill = rows.clone();
    for &(u, v, w) in arcs {
        adj[fill[u as usize]] = (v, w);
        fill[u as usize] += 1;
    }
    let mut dist = vec![INF; n];
    let mut heap = BinaryHeap::new();
    dist[root as usize] = 0;
    heap.push(Reverse((0u64, root)));
    while let Some(Reverse((d, u))) = heap.pop() {
        if d > dist[u as usize] {
            continue;
        }
        for &(v, w) in &adj[rows[u as usize]..rows[u as usize + 1]] {
            let nd = d + u64::from(w);
            if nd < dist[v as usize] {
                dist[v as usize] = nd;
                heap.push(Reverse((nd, v)));
            }
        }
    }
    dist
}

/// The differences between a distributed result (`dist`, `parent` per
/// vertex; [`INF`] / `u64::MAX` where not reached) and the reference
/// `want`, one message each (at most `show`), and their number.
pub fn check(arcs: &[(u64, u64, u32)], root: u64, want: &[u64], dist: &[u64], parent: &[u64], show: usize) -> (u64, Vec<String>) {
    let mut bad = 0u64;
    let mut msgs = Vec::new();
    let mut report = |m: String| {
        bad += 1;
        if msgs.len() < show {
            msgs.push(m);
        }
    };
    for v in 0..want.len() {
        if dist[v] != want[v] {
            report(format!("vertex {v}: distance {} (Dijkstra: {})", dist[v] as i128, want[v] as i128));
        }
    }
    if dist[root as usize] != 0 || parent[root as usize] != root {
        report(format!("root {root}: distance {} parent {}", dist[root as usize] as i128, parent[root as usize] as i128));
    }
    // Every reached vertex but the root: an arc (parent, v) closes its distance.
    let mut closed = vec![false; want.len()];
    closed[root as usize] = true;
    for &(u, v, w) in arcs {
        let (u, v) = (u as usize, v as usize);
        if parent[v] == u as u64 && dist[u] != INF && dist[v] != INF && dist[u] + u64::from(w) == dist[v] {
            closed[v] = true;
        }
    }
    for v in 0..want.len() {
        if dist[v] != INF && !closed[v] {
            report(format!("vertex {v}: parent {} with no arc that closes distance {}", parent[v] as i128, dist[v]));
        }
    }
    (bad, msgs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dijkstra_and_the_check() {
        // 0 -5- 1 -1- 2, 0 -9- 2, 3 alone.
        let e = [(0u64, 1u64, 5u32), (1, 2, 1), (0, 2, 9)];
        let arcs: Vec<_> = e.iter().flat_map(|&(u, v, w)| [(u, v, w), (v, u, w)]).collect();
        let d = dijkstra(4, &arcs, 0);
        assert_eq!(d, vec![0, 5, 6, INF]);
        let parent = [0, 0, 1, u64::MAX];
        assert_eq!(check(&arcs, 0, &d, &d, &parent, 5).0, 0);
        let (n, m) = check(&arcs, 0, &d, &[0, 5, 7, INF], &parent, 5);
        assert_eq!(n, 2, "{m:?}");
        assert!(m[0].starts_with("vertex 2: distance 7 (Dijkstra: 6)"));
        let (n, m) = check(&arcs, 0, &d, &d, &[0, 0, 0, u64::MAX], 5);
        assert_eq!(n, 1);
        assert!(m[0].starts_with("vertex 2: parent 0 with no arc"), "{m:?}");
    }
}
