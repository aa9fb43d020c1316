//! The CPU PE's transport backend ([`HostBackend`]): libfabric RMA and
//! atomics on a heap in host memory, for the proxy threads of a CPU PE in
//! its own process or in the daemon (the heap then mapped from the PE's
//! memfd).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use cpnet_device::cpu::HeapView;
use cpnet_proxy::transport::{EndpointFacts, FabricConfig, FabricEndpoint, PeerCard};

use crate::proxy_threads::Backend;

/// The CPU PE's transport: libfabric RMA and atomics on the host heap.
pub(crate) struct HostBackend {
    /// The provider and bind address.
    pub(crate) fabric: FabricConfig,
    /// The PE served.
    pub(crate) me: i32,
    /// The whole registered region (`region_len(heap_size)` bytes).
    pub(crate) region: HeapView,
    /// The user heap's size, bytes.
    pub(crate) heap_size: u64,
    /// Shared by the PE's transports (`FabricEndpoint::connect`).
    pub(crate) epoch: Arc<AtomicU64>,
}

impl Backend for HostBackend {
    type Endpoint = FabricEndpoint;
    type Transport = cpnet_proxy::transport::FabricTransport;
    fn open(&self, _t: usize) -> std::result::Result<FabricEndpoint, String> {
        FabricEndpoint::open(&self.fabric, self.me, self.region, self.heap_size).map_err(|e| e.to_string())
    }
    fn card(ep: &FabricEndpoint) -> Vec<u8> {
        ep.card().to_bytes()
    }
    fn connect(&self, ep: FabricEndpoint, cards: Vec<Vec<u8>>) -> std::result::Result<Self::Transport, String> {
        let mut parsed = Vec::with_capacity(cards.len());
        for (peer, c) in cards.iter().enumerate() {
            parsed.push(PeerCard::from_bytes(c).ok_or_else(|| format!("PE {peer} sent a malformed fabric card"))?);
        }
        ep.connect(&parsed, Arc::clone(&self.epoch)).map_err(|e| e.to_string())
    }
    fn describe(tr: &Self::Transport) -> EndpointFacts {
        tr.describe()
    }
}

