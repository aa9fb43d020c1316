//! The host-side collectives of the graph apps (the search keys, the
//! validation, the TEPS sums), over either kind of PE:
//!
//! - [`CpuComm`]: a CPU work-group and the [`Exchange`] (one-sided puts
//!   with signals into per-source receive slots, the same path the searches
//!   take);
//! - [`GpuHostComm`]: a GPU PE, whose symmetric heap only its GPU and its
//!   proxy reach, so its host goes through the launcher's rendezvous
//!   (`allgather`). The GPU searches themselves communicate from inside
//!   their kernels ([`crate::bfs::gpu`]); this carries only the setup and
//!   the checks between searches.
//!
//! Every call is **collective**: every PE makes the same sequence of calls.

use anyhow::{Context, Result};
use cpnet::{GpuPe, WorkGroup};

use super::exchange::Exchange;

/// What `bfs`, `sssp` and their checks need from the PEs between searches.
pub trait Collectives {
    /// This PE.
    fn my_pe(&self) -> i32;

    /// Wait until every PE has called it.
    ///
    /// # Errors
    /// A communication failure.
    fn barrier(&mut self) -> Result<()>;

    /// Send `out[d]` to every PE `d` and hand every PE's records for this PE
    /// to `recv(source, words)`: whole records of `rec` words, in order per
    /// source, never an empty piece ([`Exchange::all_to_all`]).
    ///
    /// # Errors
    /// A communication failure.
    fn all_to_all_dyn(&mut self, out: &[Vec<u64>], rec: usize, recv: &mut dyn FnMut(i32, &[u64])) -> Result<()>;

    /// The number of PEs (`out` lists of [`Collectives::all_to_all_dyn`]).
    fn n_pes(&self) -> i32;

    /// The element-wise sum over all PEs of `vals` (every PE passes the
    /// same length).
    ///
    /// # Errors
    /// As [`Collectives::all_to_all_dyn`].
    fn sum(&mut self, vals: &[u64]) -> Result<Vec<u64>> {
        reduce(self, vals, u64::wrapping_add)
    }

    /// The element-wise maximum over all PEs.
    ///
    /// # Errors
    /// As [`Collectives::all_to_all_dyn`].
    fn max(&mut self, vals: &[u64]) -> Result<Vec<u64>> {
        reduce(self, vals, u64::max)
    }
}

/// Every PE's `vals` combined element-wise with `op`.
fn reduce<C: Collectives + ?Sized>(c: &mut C, vals: &[u64], op: fn(u64, u64) -> u64) -> Result<Vec<u64>> {
    let p = c.n_pes() as usize;
    let out = vec![vals.to_vec(); p];
    let mut acc: Vec<Option<u64>> = vec![None; vals.len()];
    let mut at = vec![0usize; p];
    c.all_to_all_dyn(&out, 1, &mut |s, w| {
        let at = &mut at[s as usize];
        for (a, x) in acc[*at..].iter_mut().zip(w) {
            *a = Some(a.map_or(*x, |a| op(a, *x)));
        }
        *at += w.len();
    })?;
    Ok(acc.into_iter().map(|a| a.unwrap_or(0)).collect())
}

/// A CPU PE's collectives: its work-group and its exchange.
pub struct CpuComm<'a> {
    /// The work-group that makes the calls.
    pub wg: &'a mut WorkGroup,
    /// The exchange's slots.
    pub ex: &'a mut Exchange,
}

impl Collectives for CpuComm<'_> {
    fn my_pe(&self) -> i32 {
        self.wg.my_pe()
    }

    fn n_pes(&self) -> i32 {
        self.wg.n_pes()
    }

    fn barrier(&mut self) -> Result<()> {
        Ok(self.wg.barrier_all()?)
    }

    fn all_to_all_dyn(&mut self, out: &[Vec<u64>], rec: usize, recv: &mut dyn FnMut(i32, &[u64])) -> Result<()> {
        self.ex.all_to_all(self.wg, out, rec, recv)
    }
}

/// A GPU PE's host-side collectives, through the rendezvous (see the module
/// docs): fine for the setup's and the checks' volumes, not for the
/// searches.
pub struct GpuHostComm<'a>(pub &'a GpuPe);

impl Collectives for GpuHostComm<'_> {
    fn my_pe(&self) -> i32 {
        self.0.my_pe()
    }

    fn n_pes(&self) -> i32 {
        self.0.n_pes()
    }

    fn barrier(&mut self) -> Result<()> {
        Ok(self.0.barrier_all()?)
    }

    /// Every PE contributes `[len_0, .., len_{p-1}, out[0] .., out[p-1] ..]`
    /// (little-endian words) and takes its own lists out of every
    /// contribution.
    fn all_to_all_dyn(&mut self, out: &[Vec<u64>], rec: usize, recv: &mut dyn FnMut(i32, &[u64])) -> Result<()> {
        assert_eq!(out.len(), self.n_pes() as usize, "one outgoing list per PE");
        assert!(out.iter().all(|o| o.len() % rec.max(1) == 0), "outgoing lists of whole {rec}-word records");
        let me = self.my_pe() as usize;
        let all = self.0.allgather_bytes(&encode(out)).context("host all-to-all through the rendezvous")?;
        for (s, b) in all.iter().enumerate() {
            let words = list_for(b, out.len(), me);
            if !words.is_empty() {
                recv(s as i32, &words);
            }
        }
        Ok(())
    }
}

/// One PE's contribution to [`GpuHostComm`]'s all-to-all: `[len_0, ..,
/// len_{p-1}]` then the lists, little-endian words.
fn encode(out: &[Vec<u64>]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(8 * (out.len() + out.iter().map(Vec::len).sum::<usize>()));
    for o in out {
        blob.extend_from_slice(&(o.len() as u64).to_le_bytes());
    }
    for w in out.iter().flatten() {
        blob.extend_from_slice(&w.to_le_bytes());
    }
    blob
}

/// The list for PE `me` in a contribution of `p` lists ([`encode`]).
fn list_for(blob: &[u8], p: usize, me: usize) -> Vec<u64> {
    let word = |i: usize| u64::from_le_bytes(blob[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let start = p + (0..me).map(|d| word(d) as usize).sum::<usize>();
    (start..start + word(me) as usize).map(word).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pe_finds_its_own_list_in_a_contribution() {
        let out = vec![vec![1, 2], vec![], vec![3, 4, 5, 6]];
        let blob = encode(&out);
        assert_eq!(blob.len(), 8 * (3 + 6));
        for (me, want) in out.iter().enumerate() {
            assert_eq!(&list_for(&blob, 3, me), want);
        }
    }
}
