//! The allreduce's plan: how `count` elements split into ring segments and
//! blocks, and the order in which each ring sends and receives them
//! ([`RingPlan`]; the algorithm is in the parent module's documentation).
//! Computed on the host for every variant (the GPU kernels read it as a
//! table, `gpu::plan_tables`).

/// `[offset, offset + len)` of part `k` of `len` items split into `parts`
/// (balanced: the first `len % parts` parts get one more).
pub fn split(len: usize, parts: usize, k: usize) -> (usize, usize) {
    let (q, r) = (len / parts, len % parts);
    (k * q + k.min(r), q + usize::from(k < r))
}

/// The rings an allreduce of `count` elements runs on, of `rings`, when a
/// segment takes at least `min_seg` elements (`-min-ring-bytes`): at least
/// one, at most `rings`.
pub fn active_rings(count: usize, rings: usize, min_seg: usize) -> usize {
    rings.min(count.div_ceil(min_seg.max(1)).max(1))
}

/// Elements of type `T` in `-min-ring-bytes` (at least one).
pub fn min_seg_elems<T>(min_ring_bytes: u64) -> usize {
    (min_ring_bytes as usize / size_of::<T>()).max(1)
}

/// One ring's share of an allreduce of `count` elements on PE `p` of `n`:
/// its blocks and the step schedule of both directions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingPlan {
    /// First element of the ring's segment.
    pub seg_off: usize,
    /// Elements in the segment.
    pub seg_len: usize,
    /// `(offset in segment, length)` of each of the `n` blocks.
    pub blocks: Vec<(usize, usize)>,
    /// Elements per piece (message).
    pub piece: usize,
    /// Block sent at each step (`2(n-1)` steps).
    pub send_block: Vec<usize>,
    /// Block received at each step.
    pub recv_block: Vec<usize>,
    /// Index of the first message of each step, sending side (`steps + 1` entries).
    pub send_off: Vec<usize>,
    /// Index of the first message of each step, receiving side.
    pub recv_off: Vec<usize>,
}

impl RingPlan {
    /// The plan of ring `ring` of `rings` on PE `p` of `n`, messages of at
    /// most `piece` elements (`piece >= 1`), segments of at least `min_seg`
    /// elements (rings past [`active_rings`] get an empty one).
    pub fn new(
        count: usize,
        rings: usize,
        ring: usize,
        n: usize,
        p: usize,
        piece: usize,
        min_seg: usize,
    ) -> RingPlan {
        let active = active_rings(count, rings, min_seg);
        let (seg_off, seg_len) = if ring < active { split(count, active, ring) } else { (count, 0) };
        let blocks: Vec<_> = (0..n).map(|b| split(seg_len, n, b)).collect();
        let steps = 2 * (n - 1);
        let m = |x: isize| x.rem_euclid(n as isize) as usize;
        let (pi, ni) = (p as isize, n as isize);
        let send_block: Vec<usize> = (0..steps as isize)
            .map(|s| {
                if s < ni - 1 {
                    m(pi - s)
                } else {
                    m(pi + 1 - (s - (ni - 1)))
                }
            })
            .collect();
        let recv_block: Vec<usize> = (0..steps as isize)
            .map(|s| {
                if s < ni - 1 {
                    m(pi - s - 1)
                } else {
                    m(pi - (s - (ni - 1)))
                }
            })
            .collect();
        let pieces = |b: usize| blocks[b].1.div_ceil(piece);
        let prefix = |bs: &[usize]| {
            let mut v = vec![0];
            for &b in bs {
                v.push(v.last().unwrap() + pieces(b));
            }
            v
        };
        let send_off = prefix(&send_block);
        let recv_off = prefix(&recv_block);
        RingPlan {
            seg_off,
            seg_len,
            blocks,
            piece,
            send_block,
            recv_block,
            send_off,
            recv_off,
        }
    }

    /// Steps (`2(n-1)`).
    pub fn steps(&self) -> usize {
        self.send_block.len()
    }

    /// Messages this PE sends on the ring per allreduce.
    pub fn sends(&self) -> usize {
        *self.send_off.last().unwrap()
    }

    /// Messages this PE receives on the ring per allreduce.
    pub fn recvs(&self) -> usize {
        *self.recv_off.last().unwrap()
    }

    /// `(first element, elements)` of piece `j` of block `b`, in the whole buffer.
    pub fn piece_range(&self, b: usize, j: usize) -> (usize, usize) {
        let (off, len) = self.blocks[b];
        let start = j * self.piece;
        (self.seg_off + off + start, self.piece.min(len - start))
    }

    /// Pieces of block `b`.
    pub fn pieces(&self, b: usize) -> usize {
        self.blocks[b].1.div_ceil(self.piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What PE `p` sends on a ring is exactly what PE `p + 1` expects, piece
    /// for piece, and every element of the segment is reduced on one PE and
    /// received by all the others.
    #[test]
    fn sender_and_receiver_agree_on_every_message() {
        for n in 1..=5 {
            for rings in 1..=3 {
                for count in [0, 1, 2, 3, 7, 12, 13, 100, 1001] {
                    for (piece, min_seg) in [(1, 1), (2, 1), (5, 1), (64, 1), (1, 4), (5, 50), (2, 2000)] {
                        for ring in 0..rings {
                            let plans: Vec<_> = (0..n)
                                .map(|p| RingPlan::new(count, rings, ring, n, p, piece, min_seg))
                                .collect();
                            for p in 0..n {
                                let (tx, rx) = (&plans[p], &plans[(p + 1) % n]);
                                assert_eq!(tx.steps(), 2 * (n - 1));
                                assert_eq!(
                                    tx.sends(),
                                    rx.recvs(),
                                    "n {n} count {count} piece {piece} ring {ring} p {p}"
                                );
                                for s in 0..tx.steps() {
                                    assert_eq!(tx.send_block[s], rx.recv_block[s]);
                                    // The piece sent at step s > 0 was received at step s - 1.
                                    if s > 0 {
                                        assert_eq!(tx.send_block[s], tx.recv_block[s - 1]);
                                    }
                                }
                            }
                            // Reduce-scatter leaves block p + 1 complete on PE p;
                            // the allgather then delivers every other block.
                            for (p, plan) in plans.iter().enumerate() {
                                if n > 1 {
                                    assert_eq!(plan.recv_block[n - 2], (p + 1) % n);
                                    let mut got: Vec<usize> = plan.recv_block[n - 1..].to_vec();
                                    got.push((p + 1) % n);
                                    got.sort();
                                    assert_eq!(got, (0..n).collect::<Vec<_>>());
                                }
                                let covered: usize = (0..n).map(|b| plan.blocks[b].1).sum();
                                assert_eq!(covered, plan.seg_len);
                            }
                        }
                        // The segments of the rings at work cover the count, each
                        // of at least min_seg elements but the last; the others are empty.
                        let segs: Vec<_> = (0..rings).map(|r| RingPlan::new(count, rings, r, n, 0, piece, min_seg)).collect();
                        let active = active_rings(count, rings, min_seg);
                        assert_eq!(segs.iter().map(|q| q.seg_len).sum::<usize>(), count);
                        assert!(segs[active..].iter().all(|q| q.seg_len == 0));
                        // As many rings as the count allows at min_seg each, at most rings.
                        assert!((1..=rings).contains(&active));
                        assert!(active == rings || (active - 1) * min_seg < count.max(1));
                        assert!(active == 1 || segs[..active].iter().all(|q| q.seg_len >= min_seg.min(count / active)));
                    }
                }
            }
        }
    }
}
