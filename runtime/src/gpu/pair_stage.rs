//! The world team of two's staging in host memory (issue 22, session 28).
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
//! to [`super::reduce_net::PAIR_STAGE_MAX_BYTES`] (2 MiB) take it; on two
//! H200s 31 / 38 / 69 µs for 64 KiB / 256 KiB / 1 MiB against 40 / 50 / 83
//! through the landing halves and NCCL's 32 / 38 / 63 through host memory
//! (docs/results.md, "Session 28"). At 4 MiB the landing halves' pieces,
//! which pipeline through the copy engines, are faster. The world team's
//! alltoall on a stream of 64 KiB-2 MiB per pair takes it too
//! (`alltoall_net.rs`'s `alltoall_pair`), except on a stream under CUDA
//! graph capture, whose replays would all use one half: a PE that captures
//! such a call must have its peer capture it too, or their forms differ. The reduce's blocks write their runs of the array
//! straight into the peer's half (GPU stores over PCIe into host memory),
//! fence them, and block 0 SETs the peer's signal through the proxy, the
//! only thing the proxy carries; the peer's blocks fold this PE's array
//! from their own half with loads that are never served from a stale cache
//! line (`ld.global.cv`). The same halves alternate call by call as the
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
        let ok = self.core.allgather_bytes(&[u8::from(peer.is_some())])?;
        let both = ok.iter().all(|b| b.as_slice() == [1]);
        Ok(match (mine, peer) {
            (Some(mine), Some(peer)) if both => Some(PairStage { mine, peer, cuda: Arc::clone(&self.cuda) }),
            _ => None,
        })
    }
}
