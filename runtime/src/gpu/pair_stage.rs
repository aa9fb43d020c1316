//! The world team of two's staging in host memory (issue 22, sessions 28-29).
//!
//! The network path's reduce of a world team of two (the pair exchange of
//! `reduce_net.rs`) put each member's array into the peer's landing half
//! through the proxy: a copy out of the GPU heap into the peer's staging
//! zone (a copy engine, or the landing agents up to 256 KiB), the header
//! through the provider, a copy from the zone into the peer's heap, the
//! signal. Two DMA copies in series, each with some 8 µs of fixed cost, and
//! the rounds between them: 83 µs for 1 MiB on two H200s against NCCL's 62
//! through host memory (docs/results.md, "Session 27").
//!
//! Here each PE of a job of two keeps a *pair zone*: a staging zone
//! (`cpnet_proxy::staged::zone`, a memfd registered with CUDA) of one
//! section of two halves of [`NET_PAIR_MAX_BYTES`] (8 MiB of pinned host
//! memory a PE), which the peer maps and registers too. Reduces of 64 KiB
//! to [`super::reduce_net::PAIR_STAGE_MAX_BYTES`] (4 MiB) take it; on two
//! H200s 28 / 35 / 63 / 164 µs for 64 KiB / 256 KiB / 1 MiB / 4 MiB in
//! place against 40 / 50 / 81 / 168-179 through the landing halves and
//! NCCL's 27 / 35 / 63 / 171 through host memory (docs/results.md,
//! "Session 29"). The world team's alltoall on a stream of 64 KiB-4 MiB
//! per pair takes it too
//! (`alltoall_net.rs`'s `alltoall_pair`), except on a stream under CUDA
//! graph capture, whose replays would all use one half: a PE that captures
//! such a call must have its peer capture it too, or their forms differ.
//!
//! A call's kernel (`cpnet/pair.cuh`, THE PIPELINE) cuts the array into
//! chunks of `CPNET_PAIR_CHUNK` bytes ([`PairPlan`]). Producer blocks write
//! them straight into the peer's half (GPU stores over PCIe into host
//! memory), fence them and count them; block 0 SETs the peer's signal
//! through the proxy once per chunk, the only thing the proxy carries; and
//! consumer blocks fold (or copy) each of the peer's chunks from this PE's
//! half as its signal arrives, with loads that are never served from a
//! stale cache line (`ld.global.cv`). So the stores of one chunk overlap
//! the loads of the one before (session 29; session 28's kernels stored
//! the whole array, then loaded it). The same halves alternate call by call as the
//! landing halves do ([`super::reduce_net::Scratch`]), under the same
//! argument. This is the data path of NCCL's network transport without
//! GPUDirect (kernels fill and drain host staging, the proxy moves it
//! between hosts), where two processes of one host share the staging, as
//! they share a staging zone: the proxy's part is the signal alone.
//!
//! Both PEs take it or neither: where either lacks it (another provider,
//! `CPNET_STAGE_SHARED=0`, `CPNET_PAIR_STAGE=0`, no landing halves, a zone
//! that does not map), the landing halves through the proxy stay.

use std::sync::Arc;

use cpnet_proxy::staged::zone::{PeerZone, Zone, ZoneCard};
use cudarc::driver::CudaContext;

use super::GpuPe;
use super::reduce_net::NET_PAIR_MAX_BYTES;
use crate::error::Result;

/// A PE's pair zone and its section of the peer's (see the module).
#[derive(Debug)]
pub(super) struct PairStage {
    /// This PE's zone: the peer writes its array into it, this PE's fold
    /// reads it.
    mine: Zone,
    /// The peer's zone, mapped here: this PE's blocks write into it.
    peer: PeerZone,
    /// Bound while the zones are unregistered (drop).
    cuda: Arc<CudaContext>,
}

// SAFETY: the zones' raw pointers are to mappings the value owns; after
// construction it only hands out their device addresses (plain integers)
// and never reads or writes through them, and its drop (cuMemHostUnregister
// with the context bound, munmap) may run on any thread.
unsafe impl Send for PairStage {}
// SAFETY: as above; `&PairStage` allows only the address getters.
unsafe impl Sync for PairStage {}

impl Drop for PairStage {
    fn drop(&mut self) {
        // The registrations are the context's: bind it before the fields
        // drop (a failure leaves them to the context's own teardown).
        let _ = self.cuda.bind_to_thread();
    }
}

impl PairStage {
    /// Where this PE's blocks write call `k`'s array (the peer's half `k mod
    /// 2`; device address).
    pub(super) fn out_half(&self, k: u64) -> u64 {
        self.peer.dev((k % 2) as u32)
    }

    /// Where this PE's fold reads the peer's array of call `k` (its own half
    /// `k mod 2`; device address).
    pub(super) fn in_half(&self, k: u64) -> u64 {
        self.mine.dev(0, (k % 2) as u32)
    }
}

impl GpuPe {
    /// The pair zones of a job of two GPU PEs: **collective** where
    /// `n_pes == 2` (two allgathers: the cards, then whether each mapped the
    /// other's), nothing elsewhere. `None` (logged where it was wanted but
    /// failed) unless both PEs have staging zones, the landing halves and
    /// `CPNET_PAIR_STAGE` on and both mapped the other's zone. Called once
    /// at init, with the PE's context bound.
    ///
    /// # Errors
    /// [`crate::Error::Bootstrap`] from the allgathers.
    pub(super) fn open_pair_stage(&self) -> Result<Option<PairStage>> {
        if self.n_pes() != 2 {
            return Ok(None);
        }
        let me = self.my_pe();
        let wanted = self.core.tuning.pair_stage && self.staging_zones() && self.reduce_scratch.has_landing();
        let mine = if wanted {
            self.bind()?;
            Zone::new(1, 2, NET_PAIR_MAX_BYTES as usize)
                .inspect_err(|e| tracing::warn!("PE {me}: no pair zone ({e}): the world team's reduce puts through the proxy"))
                .ok()
        } else {
            None
        };
        let cards = self.core.allgather_bytes(&mine.as_ref().map(|z| z.card().to_bytes()).unwrap_or_default())?;
        let peer_card = cards.get((1 - me) as usize).and_then(|b| ZoneCard::from_bytes(b));
        let peer = match (&mine, peer_card) {
            (Some(_), Some(card)) => PeerZone::open(&card, 0)
                .inspect_err(|e| tracing::warn!("PE {me}: the peer's pair zone does not map ({e}): the world team's reduce puts through the proxy"))
                .ok(),
            _ => None,
        };
        // Whether each mapped the other's zone, and the plans' tuning: both
        // PEs must cut a call alike (pair.cuh's epochs and counts).
        let t = &self.core.tuning;
        let mut word = vec![u8::from(peer.is_some())];
        word.extend_from_slice(&t.pair_chunk.to_le_bytes());
        word.extend_from_slice(&t.pair_blocks.to_le_bytes());
        let ok = self.core.allgather_bytes(&word)?;
        let mapped = ok.iter().all(|b| b.first() == Some(&1));
        let alike = ok.iter().all(|b| b[1..] == word[1..]);
        if mapped && !alike {
            tracing::warn!("PE {me}: CPNET_PAIR_CHUNK or CPNET_PAIR_BLOCKS differs between the PEs: no pair staging");
        }
        Ok(match (mine, peer) {
            (Some(mine), Some(peer)) if mapped && alike => Some(PairStage { mine, peer, cuda: Arc::clone(&self.cuda) }),
            _ => None,
        })
    }

    /// The plan of a call of `nbytes` through the pair staging (see
    /// [`PairPlan`]), from `CPNET_PAIR_CHUNK` and `CPNET_PAIR_BLOCKS`.
    pub(super) fn pair_plan(&self, nbytes: u64) -> PairPlan {
        PairPlan::new(nbytes, self.core.tuning.pair_chunk, self.core.tuning.pair_blocks)
    }
}

/// Most chunks of a call (cmd.h's `CPNET_PAIR_MAX_CHUNKS`: one count byte
/// each in a 64-bit launch word of `cpnet/pair.cuh`).
pub const PAIR_MAX_CHUNKS: u64 = cpnet_device::layout::CPNET_PAIR_MAX_CHUNKS as u64;
// `CPNET_PAIR_BLOCKS`'s most producers fit a chunk's count byte.
const _: () = assert!(crate::env::PAIR_BLOCKS_MAX as u64 <= cpnet_device::layout::CPNET_PAIR_MAX_PRODUCERS as u64);
/// Bytes of the array per producer block where `CPNET_PAIR_BLOCKS` is 0.
pub const PAIR_BYTES_PER_BLOCK: u64 = 16 << 10;
/// Most producer blocks where `CPNET_PAIR_BLOCKS` is 0 (with as many
/// consumers and block 0: 33 blocks). On two H200s (docs/results.md,
/// "Session 29", j46) 8 or 16 producers took 63-66 µs for 1 MiB and
/// 164-168 for 4 MiB, 31 took 68-77 and 180-183.
pub const PAIR_AUTO_BLOCKS: u64 = 16;

/// How a call through the pair staging runs (`cpnet/pair.cuh`, THE
/// PIPELINE): `chunks` signalled chunks, `producers` blocks that write the
/// array into the peer's half, as many that read the peer's, and block 0,
/// which signals. The same on both PEs for the same bytes (the tuning is
/// checked alike at init).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PairPlan {
    /// Blocks of the launch: 1 + 2 x `producers`.
    pub blocks: u32,
    /// Chunks: `ceil(nbytes / chunk)`, 1..=[`PAIR_MAX_CHUNKS`].
    pub chunks: u32,
    /// Producer blocks (as many consumers).
    pub producers: u32,
}

impl PairPlan {
    /// The plan for `nbytes` with chunks of `chunk` bytes and `blocks`
    /// producers (0: one per [`PAIR_BYTES_PER_BLOCK`], at most
    /// [`PAIR_AUTO_BLOCKS`]).
    pub(super) fn new(nbytes: u64, chunk: u64, blocks: u32) -> PairPlan {
        let chunks = nbytes.div_ceil(chunk.max(256)).clamp(1, PAIR_MAX_CHUNKS) as u32;
        let producers = if blocks > 0 { blocks } else { nbytes.div_ceil(PAIR_BYTES_PER_BLOCK).clamp(1, PAIR_AUTO_BLOCKS) as u32 };
        PairPlan { blocks: 1 + 2 * producers, chunks, producers }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks and blocks by size, within the kernel's limits.
    #[test]
    fn plans_follow_the_size_and_the_tuning() {
        assert_eq!(PairPlan::new(64 << 10, 512 << 10, 0), PairPlan { blocks: 9, chunks: 1, producers: 4 });
        assert_eq!(PairPlan::new(1 << 20, 512 << 10, 0), PairPlan { blocks: 33, chunks: 2, producers: 16 });
        assert_eq!(PairPlan::new(4 << 20, 256 << 10, 0).chunks, 8);
        assert_eq!(PairPlan::new(1 << 20, 4 << 20, 8), PairPlan { blocks: 17, chunks: 1, producers: 8 });
        assert_eq!(PairPlan::new((1 << 20) + 1, 512 << 10, 0).chunks, 3);
        for n in [1, 255, 64 << 10, 3 << 20, 4 << 20] {
            for blocks in [0, 1, 127] {
                let p = PairPlan::new(n, 4096, blocks);
                assert!((1..=PAIR_MAX_CHUNKS as u32).contains(&p.chunks) && p.producers >= 1 && p.blocks == 1 + 2 * p.producers);
            }
        }
    }
}
