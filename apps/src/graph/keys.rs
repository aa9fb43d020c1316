//! Search keys (Graph500 specification v2.0 §5, "Sampling 64 Search
//! Keys"): distinct vertices of degree at least one not counting
//! self-loops, drawn at random from the seed; the same keys on every PE.

use anyhow::Result;

use super::comm::Collectives;
use super::{Csr, Partition, kron};

/// Candidates tried per round (one reduction each).
const BATCH: usize = 256;

/// Up to `want` distinct search keys (fewer only when the graph has fewer
/// eligible vertices). Candidates are `bits(seed, 7, k) mod n` for
/// `k = 0, 1, ...`, then, if that does not find `want` within `64 * want`
/// draws, every vertex in order. **Collective.**
///
/// # Errors
/// A communication failure.
pub fn search_keys(comm: &mut impl Collectives, csr: &Csr, part: &Partition, seed: u64, want: usize) -> Result<Vec<u64>> {
    let me = comm.my_pe();
    let (lo, _) = part.range(me);
    let eligible = |v: u64| part.owner(v) == me && csr.adj((v - lo) as usize).iter().any(|&u| u != v);
    let mut keys: Vec<u64> = Vec::new();
    let n = part.n;
    let random = (0..(64 * want) as u64).map(|k| kron::bits(seed, 7, k) % n);
    let mut all = random.chain(0..n);
    while keys.len() < want {
        let cand: Vec<u64> = all.by_ref().take(BATCH).collect();
        if cand.is_empty() {
            break;
        }
        let flags: Vec<u64> = cand.iter().map(|&v| u64::from(eligible(v))).collect();
        let ok = comm.sum(&flags)?;
        for (v, f) in cand.into_iter().zip(ok) {
            if f > 0 && keys.len() < want && !keys.contains(&v) {
                keys.push(v);
            }
        }
    }
    Ok(keys)
}
