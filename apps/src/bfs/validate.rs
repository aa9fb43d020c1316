//! Validation of a BFS tree by the five rules of the Graph500
//! specification (v2.0 §8, "Validation"):
//!
//! 1. the tree is a tree: it has no cycles;
//! 2. each tree edge connects vertices whose BFS levels differ by exactly one;
//! 3. every edge of the input has endpoints whose levels differ by at most
//!    one, or neither endpoint is in the tree;
//! 4. the tree spans an entire connected component: every vertex of the
//!    root's component is in it (an edge with one endpoint in the tree and
//!    one out of it breaks this);
//! 5. a vertex and its parent are joined by an edge of the input.
//!
//! Every PE receives every PE's parent and level arrays through the
//! exchange, then checks its own vertices and arcs: rule 2 as
//! `level(v) == level(parent(v)) + 1` for every vertex but the root (whose
//! parent is itself, at level 0, and the only vertex at level 0); rule 1
//! follows, since levels strictly decrease along parent pointers and so no
//! walk along them can come back; rules 3 and 4 on every arc; rule 5 by a
//! binary search of the vertex's sorted row. The counts of violations are
//! summed over the PEs; each PE prints its first few.

use anyhow::Result;

use super::{NO_PARENT, Search, UNVISITED};
use crate::graph::comm::Collectives;
use crate::graph::{Csr, Partition};

/// Violations printed per PE per search.
const SHOW: usize = 5;

/// Check `s` (the search from `root`) on every PE; the number of
/// violations over all PEs (0: valid). **Collective.**
///
/// # Errors
/// A communication failure.
pub fn validate(comm: &mut impl Collectives, csr: &Csr, part: &Partition, root: u64, s: &Search) -> Result<u64> {
    let me = comm.my_pe();
    let p = part.n_pes as usize;
    let n = part.n as usize;
    // Gather (parent, level) of every vertex.
    let mine: Vec<u64> = s.parent.iter().zip(&s.level).flat_map(|(&pa, &l)| [pa, u64::from(l)]).collect();
    let out = vec![mine; p];
    let mut parent = vec![NO_PARENT; n];
    let mut level = vec![UNVISITED; n];
    let mut at = vec![0usize; p];
    comm.all_to_all_dyn(&out, 2, &mut |src, w| {
        let base = part.lo(src) as usize + at[src as usize];
        for (i, pair) in w.chunks_exact(2).enumerate() {
            parent[base + i] = pair[0];
            level[base + i] = pair[1] as u32;
        }
        at[src as usize] += w.len() / 2;
    })?;
    let bad = check_local(csr, part, me, root, &parent, &level);
    for msg in bad.iter().take(SHOW) {
        eprintln!("bfs validation, PE {me}, root {root}: {msg}");
    }
    Ok(comm.sum(&[bad.len() as u64])?[0])
}

/// The violations among PE `me`'s vertices and arcs of the tree given by
/// the global `parent` and `level` arrays of the search from `root`, one
/// message each (see the module docs for the rules).
pub fn check_local(csr: &Csr, part: &Partition, me: i32, root: u64, parent: &[u64], level: &[u32]) -> Vec<String> {
    let (lo, _) = part.range(me);
    let mut bad = Vec::new();
    let mut report = |msg: String| bad.push(msg);
    if part.owner(root) == me && (parent[root as usize] != root || level[root as usize] != 0) {
        report(format!("the root has parent {} and level {} (expected itself and 0)", parent[root as usize] as i64, level[root as usize]));
    }
    for i in 0..csr.n_local() {
        let v = lo + i as u64;
        let (pv, lv) = (parent[v as usize], level[v as usize]);
        let visited = lv != UNVISITED;
        if visited != (pv != NO_PARENT) {
            report(format!("vertex {v} has parent {} but level {}", pv as i64, lv as i64));
            continue;
        }
        if visited && v != root {
            if lv == 0 {
                report(format!("vertex {v} is at level 0 but is not the root"));
            }
            if pv >= part.n {
                report(format!("vertex {v} has parent {pv}, outside the graph"));
                continue;
            }
            // Rules 1 and 2.
            let lp = level[pv as usize];
            if lp == UNVISITED || lp + 1 != lv {
                report(format!("rule 2: tree edge ({pv}, {v}) joins levels {} and {lv}", lp as i64));
            }
            // Rule 5.
            if !csr.has_arc(i, pv) {
                report(format!("rule 5: vertex {v} has parent {pv}, which is not a neighbour"));
            }
        }
        for &u in csr.adj(i) {
            let lu = level[u as usize];
            match (visited, lu != UNVISITED) {
                (true, true) if lv.abs_diff(lu) > 1 => {
                    report(format!("rule 3: edge ({v}, {u}) joins levels {lv} and {lu}"));
                }
                (true, false) | (false, true) => {
                    report(format!("rule 4: edge ({v}, {u}) leaves the tree (levels {} and {})", lv as i64, lu as i64));
                }
                _ => {}
            }
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path 0 - 1 - 2 - 3 plus the edge 0 - 2 and an isolated vertex 4,
    /// on one PE.
    fn graph() -> (Csr, Partition) {
        let e = [(0, 1), (1, 2), (2, 3), (0, 2)];
        let arcs = e.iter().flat_map(|&(u, v)| [(u, v, 1), (v, u, 1)]).collect();
        (Csr::from_arcs(0, 5, arcs), Partition::new(5, 1))
    }

    #[test]
    fn a_bfs_tree_passes_and_each_broken_rule_is_named() {
        let (csr, part) = graph();
        let n = NO_PARENT;
        let u = UNVISITED;
        let check = |p: [u64; 5], l: [u32; 5]| check_local(&csr, &part, 0, 0, &p, &l);
        assert_eq!(check([0, 0, 0, 2, n], [0, 1, 1, 2, u]), Vec::<String>::new());
        // Vertex 3 one level too deep: rule 2 (its tree edge) and rule 3
        // (its edge to 2 stays within one level, so only the tree edge).
        let e = check([0, 0, 0, 2, n], [0, 1, 1, 3, u]);
        assert!(e.iter().any(|m| m.starts_with("rule 2: tree edge (2, 3)")), "{e:?}");
        // 2 reached through 1 at level 2: the edge 0 - 2 joins levels 0 and 2.
        let e = check([0, 0, 1, 2, n], [0, 1, 2, 3, u]);
        assert!(e.iter().any(|m| m.starts_with("rule 3: edge (0, 2) joins levels 0 and 2")), "{e:?}");
        // 3 left out: the component is not spanned.
        let e = check([0, 0, 0, n, n], [0, 1, 1, u, u]);
        assert!(e.iter().any(|m| m.starts_with("rule 4: edge (2, 3) leaves the tree")), "{e:?}");
        // 3's parent is 1, not a neighbour.
        let e = check([0, 0, 0, 1, n], [0, 1, 1, 2, u]);
        assert!(e.iter().any(|m| m.starts_with("rule 5: vertex 3 has parent 1")), "{e:?}");
        // A cycle 1 -> 2 -> 1 cannot keep levels decreasing: rule 2 (rule 1).
        let e = check([0, 2, 1, 2, n], [0, 1, 1, 2, u]);
        assert!(e.iter().any(|m| m.starts_with("rule 2: tree edge (2, 1)")), "{e:?}");
    }
}
