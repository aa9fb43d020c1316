//! A service thread's staged endpoint before the peers are known
//! ([`StagedEndpoint`]: open the provider, the staging memory, the streams
//! and the landing lanes; exchange cards; connect into a
//! [`StagedTransport`]), and the configuration and per-PE state it is opened
//! with.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use cpnet_device::layout::CPNET_AGENT_DEFAULT_DEPTH;
use cpnet_fabric_sys as sys;
use cudarc::driver::CudaContext;

use super::clock::StageClock;
use super::state::{BarrierState, OpSlot};
use super::zone::{PeerZone, Zone, ZoneCard};
use super::{BARRIER_BUFS, HDR_BYTES, MAX_OPS, SMALL_BUFS, StagedTransport};
use crate::agent::{AgentKernel, Landing};
use crate::cuda::{CudaError, EventPool, Pinned, Stream};
use crate::fabric::{AddressVector, CompletionQueue, Domain, Endpoint, Fabric, FiAddr, Info, InfoRequest, MSG_CAPS, MemoryRegion};
use crate::reach::PeerWatch;
use crate::transport::{FabricConfig, TransportError, printable};

/// Where the staged transport's data lives on this PE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuHeap {
    /// Device address of heap offset 0 (`CUdeviceptr`).
    pub base: u64,
    /// Bytes (the same on every PE).
    pub size: u64,
}

/// Tuning of the staged transport (collective: the same on every PE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedConfig {
    /// Provider and address.
    pub fabric: FabricConfig,
    /// Bytes of data per message (`CPNET_STAGE_CHUNK`).
    pub chunk: usize,
    /// Requests in flight per target PE and thread (`CPNET_STAGE_CREDITS`).
    pub credits: u32,
    /// Send buffers of `64 + chunk` bytes per thread.
    pub send_bufs: usize,
    /// Same-host staging zones (`CPNET_STAGE_SHARED`, `zone.rs`): with the
    /// `shm` provider, put data goes by DMA into the target's zone and the
    /// message carries only the header. Ignored for other providers.
    pub shared: bool,
    /// Bytes of a zone slot (`CPNET_STAGE_SLOT`): a put through a zone
    /// moves in pieces of this size, not `chunk` (no message carries them,
    /// and each piece costs the proxy two copy calls and two events).
    pub slot: usize,
    /// Slots per source PE in each zone (`CPNET_STAGE_SLOTS`).
    pub slots: u32,
}

impl StagedConfig {
    /// `fabric` with the defaults: 256 KiB chunks, 8 credits, 16 send
    /// buffers, zones on with 4 slots of 1 MiB per source PE.
    pub fn new(fabric: FabricConfig) -> StagedConfig {
        StagedConfig { fabric, chunk: 256 << 10, credits: 8, send_bufs: 16, shared: true, slot: 1 << 20, slots: 4 }
    }
}

/// State shared by every staged transport of one PE.
#[derive(Debug)]
pub struct PeShared {
    /// Highest barrier epoch that arrived, per dissemination round.
    pub(super) arrived: [AtomicU64; 64],
    /// Barriers started by this PE.
    pub(super) epoch: AtomicU64,
}

impl Default for PeShared {
    fn default() -> PeShared {
        PeShared { arrived: std::array::from_fn(|_| AtomicU64::new(0)), epoch: AtomicU64::new(0) }
    }
}

/// Thread-owned objects before the peers are known: open on the service
/// thread, send [`StagedEndpoint::card`] to the peers, then
/// [`StagedEndpoint::connect`].
pub struct StagedEndpoint {
    // Field order is drop order: regions and the endpoint close before the
    // staging memory they point into; the stream is synchronized in Drop of
    // the transport.
    pub(super) mr: MemoryRegion,
    pub(super) ep: Rc<Endpoint>,
    pub(super) av: Rc<AddressVector>,
    pub(super) cq: Rc<CompletionQueue>,
    pub(super) _domain: Rc<Domain>,
    pub(super) events: EventPool,
    /// Copies into the heap (landing, local and peer-path operations).
    pub(super) stream: Stream,
    /// Copies out of the heap (a put's chunks, a get's reply), on their own
    /// stream so they overlap the landing copies (both copy engines).
    pub(super) out: Stream,
    /// Before `mem`: they stop their agents (which read and write the
    /// staging memory) when dropped. One per lane (`AgentKernel::lanes`).
    pub(super) lanes: Vec<Landing>,
    pub(super) mem: Pinned,
    /// This thread's staging zone, if zones are on (`zone.rs`).
    pub(super) zone: Option<Zone>,
    pub(super) layout: Layout,
    pub(super) provider: String,
    /// The granted fabric and domain names (`fi_fabric_attr::name`,
    /// `fi_domain_attr::name`), for the transport map.
    pub(super) names: (String, String),
    pub(super) my_pe: i32,
    pub(super) n_pes: i32,
    pub(super) heap: GpuHeap,
    pub(super) cfg: StagedConfig,
    pub(super) shared: Arc<PeShared>,
    /// Per PE: the device address of its heap mapped into this process
    /// (CUDA IPC, same host), for the peer path; `None`: messages.
    pub(super) peer_heaps: Vec<Option<u64>>,
    pub(super) _cuda: Arc<CudaContext>,
}

/// Offsets in the pinned staging memory.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) buf: usize,
    pub(super) recv: usize,
    pub(super) n_recv: usize,
    pub(super) big: usize,
    pub(super) n_big: usize,
    pub(super) small: usize,
    /// Per-op scratch words (4 per op): inline data, signal, result.
    pub(super) scratch: usize,
    pub(super) total: usize,
}

impl Layout {
    pub(super) fn new(cfg: &StagedConfig, n_pes: i32) -> Layout {
        let buf = HDR_BYTES + cfg.chunk;
        let n_recv = 2 * cfg.credits as usize * (n_pes.max(1) as usize - 1) + BARRIER_BUFS;
        let recv = 0;
        let big = recv + n_recv * buf;
        let small = big + cfg.send_bufs * buf;
        let scratch = small + SMALL_BUFS * HDR_BYTES;
        let total = scratch + MAX_OPS * 32;
        Layout { buf, recv, n_recv, big, n_big: cfg.send_bufs, small, scratch, total }
    }
}

impl StagedEndpoint {
    /// Open provider `cfg.fabric` for messages, allocate and register the
    /// staging memory, and create the copy stream and the landing ring of
    /// `agent` (the PE's landing agent, [`crate::agent`]), binding `cuda` (the
    /// PE's GPU) to this thread. Call on the service thread that will use it.
    ///
    /// # Errors
    /// [`TransportError::Fabric`] naming the step; [`TransportError::Cuda`].
    #[allow(clippy::too_many_arguments, reason = "each is a distinct fact of the PE; the runtime passes them once per thread")]
    pub fn open(
        cfg: &StagedConfig,
        cuda: Arc<CudaContext>,
        my_pe: i32,
        n_pes: i32,
        heap: GpuHeap,
        shared: Arc<PeShared>,
        peer_heaps: Vec<Option<u64>>,
        agent: AgentKernel,
    ) -> Result<StagedEndpoint, TransportError> {
        let cuda_err = |e: CudaError| TransportError::Cuda { pe: my_pe, what: e.what, why: format!("{:?}", e.source) };
        cuda.bind_to_thread().map_err(|e| TransportError::Cuda { pe: my_pe, what: "cuCtxSetCurrent", why: format!("{e:?}") })?;
        if cfg.chunk == 0 || cfg.credits == 0 || cfg.send_bufs == 0 || cfg.slot == 0 || cfg.slots == 0 {
            return Err(TransportError::Config { pe: my_pe, why: "chunk, credits, send buffers, zone slots and their size must be at least 1".into() });
        }
        let err = |what: &'static str| {
            let provider = cfg.fabric.provider.clone();
            move |source| TransportError::Fabric { pe: my_pe, what, provider, source }
        };
        let mut req = InfoRequest::provider(&cfg.fabric.provider).with_caps(MSG_CAPS);
        if let Some(n) = &cfg.fabric.src_node {
            req = req.with_src_node(n);
        }
        let info = Info::get(&req).map_err(err("fi_getinfo (messages, RDM endpoint)"))?;
        crate::transport::refuse_broken(my_pe, &info.provider_name())?;
        if info.max_msg_size() < HDR_BYTES + cfg.chunk {
            return Err(TransportError::Config {
                pe: my_pe,
                why: format!(
                    "provider {} carries messages of at most {} bytes; CPNET_STAGE_CHUNK must be at most {}",
                    info.provider_name(),
                    info.max_msg_size(),
                    info.max_msg_size().saturating_sub(HDR_BYTES)
                ),
            });
        }
        let layout = Layout::new(cfg, n_pes);
        let fabric = Fabric::open(&info).map_err(err("fi_fabric"))?;
        let domain = Domain::open(&fabric).map_err(err("fi_domain"))?;
        let cq = CompletionQueue::open(&domain, 4 * (layout.n_recv + layout.n_big + SMALL_BUFS)).map_err(err("fi_cq_open"))?;
        let av = AddressVector::open(&domain, n_pes.max(1) as usize).map_err(err("fi_av_open"))?;
        let ep = Endpoint::open(&domain, &cq, &av).map_err(err("endpoint"))?;
        let mem = Pinned::new(layout.total).map_err(cuda_err)?;
        // SAFETY: `mem` is one live allocation owned by the endpoint and
        // dropped after the region (field order); it is touched only through
        // raw pointers (the fabric and the copy engines write it).
        let mr = unsafe { MemoryRegion::register(&domain, mem.ptr(), mem.len(), Some(&ep)) }
            .map_err(err("fi_mr_reg (staging buffers)"))?;
        let stream = Stream::new().map_err(cuda_err)?;
        let out = Stream::new().map_err(cuda_err)?;
        let zone = if cfg.shared && info.provider_name() == "shm" && n_pes > 1 {
            match Zone::new(n_pes, cfg.slots, cfg.slot) {
                Ok(z) => Some(z),
                Err(why) => {
                    tracing::warn!("PE {my_pe}: no staging zone ({why}); put data goes inside the messages");
                    None
                }
            }
        } else {
            None
        };
        let lanes = (0..agent.lanes.max(1))
            .map(|_| Landing::new(agent.clone(), u64::from(CPNET_AGENT_DEFAULT_DEPTH), heap.base, heap.size))
            .collect::<Result<Vec<_>, _>>()
            .map_err(cuda_err)?;
        tracing::debug!(pe = my_pe, provider = %info.provider_name(), staging = layout.total, "staged endpoint open");
        Ok(StagedEndpoint {
            mr,
            ep,
            av,
            cq,
            _domain: domain,
            events: EventPool::default(),
            stream,
            out,
            lanes,
            mem,
            zone,
            layout,
            provider: info.provider_name(),
            names: (info.fabric_name(), info.domain_name()),
            my_pe,
            n_pes,
            heap,
            cfg: cfg.clone(),
            shared,
            peer_heaps,
            _cuda: cuda,
        })
    }

    /// What the peers need to reach us: the provider granted (length u16
    /// little-endian, then its name: every PE must use the same one), the
    /// staging zone's card (length u16, then 0 or `zone::CARD_BYTES`
    /// bytes), then the endpoint's address.
    pub fn card(&self) -> Vec<u8> {
        let mut c = (self.provider.len() as u16).to_le_bytes().to_vec();
        c.extend_from_slice(self.provider.as_bytes());
        let z = self.zone.as_ref().map(|z| z.mem.card.to_bytes()).unwrap_or_default();
        c.extend_from_slice(&(z.len() as u16).to_le_bytes());
        c.extend_from_slice(&z);
        c.extend_from_slice(self.ep.name());
        c
    }

    /// Insert every PE's card (index = PE; ours included, unused), post the
    /// receive buffers and become a transport.
    ///
    /// # Errors
    /// [`TransportError::BadCard`] for a malformed card or a peer on
    /// another provider; `fi_av_insert` and `fi_recv` failures.
    pub fn connect(self, cards: &[Vec<u8>]) -> Result<StagedTransport, TransportError> {
        let my_pe = self.my_pe;
        let mut names = Vec::with_capacity(cards.len());
        let mut zone_cards = Vec::with_capacity(cards.len());
        for (pe, card) in cards.iter().enumerate() {
            let bad = |why: String| TransportError::BadCard { pe: my_pe, peer: pe as i32, why };
            let u16_at = |o: usize| card.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
            let n = u16_at(0).ok_or_else(|| bad("truncated card".into()))?;
            let prov = card.get(2..2 + n).and_then(|p| std::str::from_utf8(p).ok()).ok_or_else(|| bad("truncated card".into()))?;
            if prov != self.provider {
                return Err(bad(crate::transport::mismatched_providers(pe as i32, prov, my_pe, &self.provider)));
            }
            let zn = u16_at(2 + n).ok_or_else(|| bad("truncated card".into()))?;
            let zb = card.get(4 + n..4 + n + zn).ok_or_else(|| bad("truncated card".into()))?;
            let zc = match zn {
                0 => None,
                _ => Some(ZoneCard::from_bytes(zb).ok_or_else(|| bad("malformed staging zone card".into()))?),
            };
            zone_cards.push(zc);
            names.push(card[4 + n + zn..].to_vec());
        }
        // Map our section of every peer's zone (only peers with one: zones
        // are on for the shm provider, whose peers are all on this host).
        let peer_zones: Vec<Option<PeerZone>> = zone_cards
            .iter()
            .enumerate()
            .map(|(pe, zc)| {
                let zc = zc.as_ref().filter(|_| pe as i32 != my_pe && self.zone.is_some())?;
                if zc.slots != self.cfg.slots || zc.slot != self.cfg.slot as u64 {
                    tracing::warn!("PE {my_pe}: PE {pe}'s staging zone has other slots (CPNET_STAGE_SLOTS, CPNET_STAGE_SLOT); put data to it goes inside the messages");
                    return None;
                }
                PeerZone::open(zc, my_pe)
                    .inspect_err(|why| tracing::warn!("PE {my_pe}: PE {pe}'s staging zone: {why}; put data to it goes inside the messages"))
                    .ok()
            })
            .collect();
        let cards = &names;
        let mut peers = Vec::with_capacity(cards.len());
        for (pe, card) in cards.iter().enumerate() {
            if pe as i32 == my_pe {
                peers.push(FiAddr(sys::FI_ADDR_NOTAVAIL));
            } else {
                peers.push(self.av.insert(card).map_err(|source| TransportError::Fabric {
                    pe: my_pe,
                    what: "fi_av_insert (peer address)",
                    provider: self.provider.clone(),
                    source,
                })?);
            }
        }
        let n = self.n_pes.max(1) as usize;
        let rounds = if self.n_pes <= 1 { 0 } else { 32 - ((self.n_pes - 1) as u32).leading_zeros() };
        let peer_addrs = cards.iter().map(|c| printable(&self.av, c)).collect();
        let t = StagedTransport {
            watch: PeerWatch::new(n, self.cfg.fabric.reach_timeout),
            stream_writes: true,
            peer_addrs,
            timing: tracing::enabled!(tracing::Level::DEBUG),
            clock: StageClock::default(),
            recv_at: vec![None; self.layout.n_recv],
            op_at: vec![None; MAX_OPS],
            big_sent_at: vec![None; self.layout.n_big],
            small_sent_at: vec![None; SMALL_BUFS],
            ops: vec![OpSlot::default(); MAX_OPS],
            free_ops: (0..MAX_OPS as u32).rev().collect(),
            free_big: (0..self.layout.n_big as u32).rev().collect(),
            big_owner: vec![None; self.layout.n_big],
            free_small: (0..SMALL_BUFS as u32).rev().collect(),
            small_owner: vec![None; SMALL_BUFS],
            credits: vec![self.cfg.credits; n],
            peers,
            to_stage: VecDeque::new(),
            copies: VecDeque::new(),
            out_copies: VecDeque::new(),
            free_slots: (0..n).map(|_| (0..self.cfg.slots).rev().collect()).collect(),
            peer_zones,
            to_send: VecDeque::new(),
            small_backlog: VecDeque::new(),
            get_wait: VecDeque::new(),
            recv_repost: Vec::new(),
            landed: (0..self.lanes.len()).map(|_| VecDeque::new()).collect(),
            landing_backlog: (0..self.lanes.len()).map(|_| VecDeque::new()).collect(),
            joins: Vec::new(),
            free_joins: Vec::new(),
            barrier: BarrierState { epoch: 0, round: 0, sent: false },
            rounds,
            poll_buf: vec![0; 64],
            broken: None,
            inner: self,
        };
        let mut t = t;
        for i in 0..t.inner.layout.n_recv {
            t.post_recv(i as u32).map_err(|source| TransportError::Fabric {
                pe: my_pe,
                what: "fi_recv (staging receive buffers)",
                provider: t.inner.provider.clone(),
                source,
            })?;
        }
        Ok(t)
    }
}
