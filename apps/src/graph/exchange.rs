//! All-to-all of `u64` records between PEs over cpnet, from a CPU
//! work-group: the frontier exchange of [`crate::bfs`], the edge
//! distribution of [`super::build`] and the small reductions both apps
//! need (counts per level, validation errors).
//!
//! # Protocol (per ordered pair of PEs `s -> d`)
//!
//! Every PE has, in its symmetric heap, a receive slot of `chunk` words per
//! source, a send slot of `chunk` words per destination, a signal word per
//! source and an acknowledgement word per destination. `s` sends its
//! records for `d` in messages of at most `chunk` words, numbered
//! `k = 1, 2, ...` over the life of the [`Exchange`]:
//!
//! 1. `s` waits until its `ack[d]` word (written by `d`) equals `k - 1`:
//!    `d` has read message `k - 1`, so `d`'s receive slot for `s` and `s`'s
//!    send slot for `d` are free (the data of `k - 1` was delivered before
//!    its signal, which `d` acquired before acknowledging).
//! 2. `s` copies the words into its send slot and issues
//!    `putmem_signal_nbi` (OpenSHMEM 1.5 §9.8.2) of them into `d`'s receive
//!    slot for `s`, with a SET of `d`'s `sig[s]` to
//!    `k << 32 | words << 1 | last`.
//! 3. `d` loads `sig[s]` with Acquire (pairing with the release with which
//!    the proxy applies the signal after the data, `proxy::local` and the
//!    fabric transport's two stages), sees `k`, hands the words to the
//!    caller, then puts `k` into `s`'s `ack[d]` (`shmem_p`, §9.5.4).
//!
//! Every call sends at least one message per pair (an empty one with `last`
//! set where there is nothing), so both sides of a pair count messages the
//! same way. One work-group of each PE makes the calls, and every PE makes
//! the same sequence of calls (**collective**). A PE polls all its pairs in
//! one loop, so no pair waits on another and the exchange cannot deadlock.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cpnet::device::cpu::{HeapView, SymAddr};
use cpnet::device::layout::SignalOp;
use cpnet::{Pe, WorkGroup};

use super::comm::{Collectives, CpuComm};
use crate::mem::SymArray;

/// Default message size: 1 MiB (131072 words).
pub const DEFAULT_CHUNK_WORDS: usize = 1 << 17;

/// How long a PE waits for a peer's message or acknowledgement without any
/// progress before it reports the peer.
const STALL: Duration = Duration::from_secs(120);

/// The all-to-all machinery of one PE (see the module docs).
pub struct Exchange {
    me: i32,
    n_pes: i32,
    chunk: usize,
    recv: SymArray<u64>,
    send: SymArray<u64>,
    sig: SymAddr,
    ack: SymAddr,
    heap: HeapView,
    out_seq: Vec<u64>,
    in_seq: Vec<u64>,
}

impl Exchange {
    /// Symmetric heap bytes an exchange of `chunk` words per message takes
    /// on each of `n_pes` PEs.
    pub fn heap_bytes(n_pes: i32, chunk: usize) -> u64 {
        let p = n_pes.max(1) as u64;
        2 * p * chunk as u64 * 8 + 2 * (p * 8).next_multiple_of(64) + 4 * 64
    }

    /// Allocate the slots (**collective**: `shmalloc` on every PE).
    ///
    /// # Errors
    /// A heap too small for [`Exchange::heap_bytes`].
    pub fn new(pe: &Pe, chunk: usize) -> Result<Exchange> {
        let (me, n_pes) = (pe.my_pe(), pe.n_pes());
        let p = n_pes as usize;
        let words = (p * chunk) as u64 * 8;
        let recv = pe.shmalloc(words)?;
        let send = pe.shmalloc(words)?;
        let sig = pe.shmalloc((p as u64 * 8).next_multiple_of(64))?;
        let ack = pe.shmalloc((p as u64 * 8).next_multiple_of(64))?;
        let heap = *pe.heap();
        for s in 0..p as u64 {
            heap.write_bytes(sig.add(8 * s), &[0; 8]).map_err(|e| anyhow::anyhow!("{e}"))?;
            heap.write_bytes(ack.add(8 * s), &[0; 8]).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        // Every PE's words are zero before any PE sends.
        pe.barrier_all()?;
        Ok(Exchange {
            me,
            n_pes,
            chunk,
            recv: SymArray::new(&heap, recv, p * chunk),
            send: SymArray::new(&heap, send, p * chunk),
            sig,
            ack,
            heap,
            out_seq: vec![0; p],
            in_seq: vec![0; p],
        })
    }

    fn word(&self, base: SymAddr, i: i32) -> u64 {
        let a = self.heap.atomic_u64(base.add(8 * i as u64)).expect("exchange words lie in the heap");
        // Acquire: pairs with the release with which the proxy applies a
        // peer's signal (after its data) or acknowledgement.
        a.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Send `out[d]` to every PE `d` and hand every PE's records for this
    /// PE to `recv(source, words)`: in pieces of whole records of `rec`
    /// words, in order per source (this PE's own `out[me]` in one piece;
    /// never an empty piece).
    /// **Collective** (one work-group per PE).
    ///
    /// # Errors
    /// A cpnet operation failed; a peer made no progress for 120 s (named).
    ///
    /// # Panics
    /// If `out.len()` is not the number of PEs, `rec` is 0 or larger than
    /// the chunk, or a list is not whole records.
    pub fn all_to_all(&mut self, wg: &mut WorkGroup, out: &[Vec<u64>], rec: usize, mut recv: impl FnMut(i32, &[u64])) -> Result<()> {
        let p = self.n_pes as usize;
        assert_eq!(out.len(), p, "one outgoing list per PE");
        assert!(rec >= 1 && rec <= self.chunk, "records of {rec} words in messages of {}", self.chunk);
        assert!(out.iter().all(|o| o.len() % rec == 0), "outgoing lists of whole {rec}-word records");
        let per_msg = self.chunk / rec * rec;
        let me = self.me as usize;
        if !out[me].is_empty() {
            recv(self.me, &out[me]);
        }
        let mut pos = vec![0usize; p];
        let mut sent = vec![false; p];
        let mut got = vec![false; p];
        sent[me] = true;
        got[me] = true;
        let mut last_progress = Instant::now();
        let mut idle = 0u32;
        while sent.iter().chain(&got).any(|x| !x) {
            let mut progress = false;
            for d in 0..p {
                if sent[d] || self.word(self.ack, d as i32) != self.out_seq[d] {
                    continue;
                }
                let n = (out[d].len() - pos[d]).min(per_msg);
                let last = pos[d] + n == out[d].len();
                // SAFETY: send slot d is ours: the proxy finished reading
                // it for message out_seq[d] (acknowledged above, after it
                // was delivered), and no other thread writes it.
                unsafe { self.send.slice_mut(d * self.chunk, n) }.copy_from_slice(&out[d][pos[d]..pos[d] + n]);
                let k = self.out_seq[d] + 1;
                let sigval = (k << 32) | ((n as u64) << 1) | u64::from(last);
                wg.putmem_signal_nbi(
                    self.recv.addr(me * self.chunk),
                    self.send.addr(d * self.chunk),
                    8 * n as u64,
                    self.sig.add(8 * me as u64),
                    sigval,
                    SignalOp::Set,
                    d as i32,
                )?;
                self.out_seq[d] = k;
                pos[d] += n;
                sent[d] = last;
                progress = true;
            }
            #[allow(clippy::needless_range_loop)] // s indexes four per-PE arrays
            for s in 0..p {
                if got[s] {
                    continue;
                }
                let v = self.word(self.sig, s as i32);
                if v >> 32 != self.in_seq[s] + 1 {
                    continue;
                }
                let n = ((v >> 1) & 0x7fff_ffff) as usize;
                if n > 0 {
                    // SAFETY: receive slot s holds message in_seq+1, delivered
                    // before its signal (acquired above); source s does not
                    // write it again before our acknowledgement below.
                    let words = unsafe { self.recv.slice(s * self.chunk, n) };
                    recv(s as i32, words);
                }
                self.in_seq[s] += 1;
                wg.p::<u64>(self.ack.add(8 * me as u64), self.in_seq[s], s as i32)?;
                got[s] = v & 1 == 1;
                progress = true;
            }
            if progress {
                last_progress = Instant::now();
                idle = 0;
            } else {
                idle += 1;
                if idle > 64 {
                    std::thread::yield_now();
                }
                if last_progress.elapsed() > STALL {
                    let waiting: Vec<usize> = (0..p).filter(|&s| !got[s]).collect();
                    let unacked: Vec<usize> = (0..p).filter(|&d| !sent[d]).collect();
                    bail!(
                        "PE {me}: exchange made no progress for {} s: no message from PEs {waiting:?}, no acknowledgement from PEs {unacked:?}",
                        STALL.as_secs()
                    );
                }
            }
        }
        Ok(())
    }

    /// The element-wise sum over all PEs of `vals` (every PE passes the
    /// same length). **Collective.**
    ///
    /// # Errors
    /// As [`Exchange::all_to_all`].
    pub fn sum(&mut self, wg: &mut WorkGroup, vals: &[u64]) -> Result<Vec<u64>> {
        CpuComm { wg, ex: self }.sum(vals)
    }

    /// The element-wise maximum over all PEs. **Collective.**
    ///
    /// # Errors
    /// As [`Exchange::all_to_all`].
    pub fn max(&mut self, wg: &mut WorkGroup, vals: &[u64]) -> Result<Vec<u64>> {
        CpuComm { wg, ex: self }.max(vals)
    }
}
