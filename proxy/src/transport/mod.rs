//! The libfabric transport: one RDM endpoint per service thread, carrying
//! validated operations to other PEs as one-sided RMA and atomics
//! (fi_rma(3), fi_atomic(3)), and the dissemination barrier. This file:
//! the endpoint, its set-up and connection, the operations' stages;
//! `ops.rs`: the [`Transport`] calls the service makes; `tests.rs`.
//!
//! # Shape
//!
//! Every PE registers one contiguous host region: the symmetric heap
//! (`heap_size` bytes, what commands may address) followed by
//! [`INTERNAL_BYTES`] for the proxy itself (barrier flags). Service thread
//! `t` of every PE opens its own fabric, domain, completion queue, address
//! vector and endpoint, registers the whole region in its domain, and talks
//! only to thread `t` of the other PEs ([`PeerCard`]s are exchanged at init
//! through the bootstrap). So every PE must run the same number of service
//! threads; the runtime makes that a collective parameter.
//!
//! # Ordering (DESIGN.md "Ordering")
//!
//! * Every write is posted with `FI_DELIVERY_COMPLETE`, and every atomic
//!   (non-fetching AMOs, signals, barrier flags included) as a *fetching*
//!   atomic whose result is discarded: a completion then means "visible at
//!   the target", not just "local buffer free" (fi_cq(3) "Completion
//!   semantics"). (Non-fetching `fi_atomicmsg` with `FI_DELIVERY_COMPLETE`
//!   lost updates on shm 1.17: two back-to-back adds of 5 and 1 added 2.
//!   A fetching atomic completes only after the target executed it, on
//!   every provider.) So when
//!   the service drains a queue for `fence`, `quiet` or `barrier_all`, every
//!   earlier operation has landed, on providers without write-after-write
//!   ordering (rxm with atomics) and without `FI_FENCE` alike.
//! * Puts of at most [`crate::batch::BATCH_PUT_MAX`] bytes to another PE
//!   go in put batches ([`crate::batch`]): one message per target PE and
//!   pass, applied by the target's proxy, complete on its acknowledgement
//!   (so also "visible at the target"). Another operation to that PE waits
//!   for the batches opened before it (B6 there), which keeps one queue's
//!   operations to one PE in issue order, as the providers do for single
//!   operations.
//! * `putmem_signal` runs in two stages: the data write, and only after its
//!   delivery completion the signal atomic. A PE that sees the signal sees
//!   the data.
//! * Operations whose target is this PE run at once on the local heap
//!   ([`crate::local::apply_local`]).
//!
//! # Atomicity
//!
//! Remote AMOs are executed by the provider at the target (rxm emulates
//! them with messages the target's proxy executes while it polls; shm
//! executes them in the target's progress), local ones with CPU atomics on
//! the same words. The multi-PE tests check exact results of all AMOs under
//! contention from every PE, local and remote mixed.
//!
//! The minimum AMOs (a cpnet extension) use `FI_MIN` where the provider
//! reports it for the type (`fi_fetch_atomicvalid`, asked once at connect;
//! shm and tcp;ofi_rxm 1.17 have it for 32/64-bit integers). Where it does
//! not, they run as a remote compare-and-swap loop (`FI_ATOMIC_READ`, then
//! `FI_CSWAP` until the word is at most the operand or the swap wins), which
//! is atomic with respect to the provider's other atomics on the word.
//!
//! # Never blocking
//!
//! Posting never waits: `-FI_EAGAIN`, or no free operation slot, makes
//! [`Transport::submit`] return [`Submit::Busy`] and the service retries
//! later. The second stage of a put-signal that meets `-FI_EAGAIN` waits in
//! a deferred list that [`Transport::progress`] retries.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicU64 as StdAtomicU64;

use cpnet_device::cpu::{HeapView, SymAddr};
use cpnet_device::layout::{AmoOp, AmoType, ErrorCode, SignalOp};
use cpnet_device::ring::Outcome;
use cpnet_device::sync::Ordering;
use cpnet_fabric_sys as sys;

use crate::decode::{GetDst, Op, PutSrc};
use crate::batch::{BatchMem, Batcher, CTX_SEND};
use crate::fabric::{
    AddressVector, AtomicClass, AtomicOp, AtomicType, CAPS, CompletionQueue, Domain, Endpoint, Fabric, FabricError, FiAddr, Info,
    InfoRequest, LocalBuf, LocalBufMut, MSG_CAPS, MemoryRegion, MrKey, Post, RemoteMemory, RemoteTarget,
};
use crate::local::apply_local;
use crate::reach::{PeerWatch, unreachable_report};
use crate::service::{Finished, Submit, Tag, Transport};

/// Bytes after the symmetric heap that the proxy keeps for itself: the
/// barrier's flag words (one `u64` per dissemination round, 64 rounds).
pub const INTERNAL_BYTES: u64 = 4096;

/// Operations one transport keeps in flight at most (fabric operations, not
/// commands: a put-signal is one). More gives [`Submit::Busy`].
pub const MAX_INFLIGHT: usize = 1024;

/// Bytes of the region a PE registers for a heap of `heap_size` bytes: the
/// heap rounded up to 64 bytes, then [`INTERNAL_BYTES`].
pub fn region_len(heap_size: u64) -> u64 {
    heap_size.next_multiple_of(64) + INTERNAL_BYTES
}

/// Which provider to open and where to bind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricConfig {
    /// libfabric provider, as `FI_PROVIDER` spells it: `"shm"` (one host),
    /// `"tcp;ofi_rxm"` (any IP network), `"verbs;ofi_rxm"`, `"efa"`, `"cxi"`.
    pub provider: String,
    /// Local address to bind (IP providers), e.g. `"127.0.0.1"` for a
    /// single-host job over tcp. `None`: the provider's choice.
    pub src_node: Option<String>,
    /// A peer whose operations wait this long without any completion from
    /// it is unreachable: the transport reports it ([`crate::reach`],
    /// `CPNET_REACH_TIMEOUT`). `None`: never.
    pub reach_timeout: Option<std::time::Duration>,
}

/// The `fi_getinfo` result the transport opens for `cfg`: an RDM endpoint
/// with RMA and atomics ([`CAPS`]) and messages ([`MSG_CAPS`], for put
/// batches, [`crate::batch`]), or, where the provider has no messages
/// there, RMA and atomics alone (every put then goes on its own).
/// `cpnet-bench`'s raw floor opens its endpoints from the same request.
///
/// # Errors
/// `fi_getinfo`'s (`-FI_ENODATA` when the provider lacks RMA + atomics on
/// RDM endpoints).
pub fn fabric_info(cfg: &FabricConfig) -> Result<Info, FabricError> {
    let mut req = InfoRequest::provider(&cfg.provider);
    if let Some(n) = &cfg.src_node {
        req = req.with_src_node(n);
    }
    Info::get(&req.clone().with_caps(CAPS | MSG_CAPS)).or_else(|_| Info::get(&req))
}

/// What a peer's thread `t` needs to reach this PE's thread `t`: the
/// endpoint's address (fi_cm(3) `fi_getname`) and the region's key and
/// base. Exchanged at init; [`PeerCard::to_bytes`] is the wire form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCard {
    /// Endpoint name bytes.
    pub name: Vec<u8>,
    /// The registered region, as the provider addresses it.
    pub mem: RemoteMemory,
    /// The mailbox where peers acknowledge this thread's put batches
    /// ([`crate::batch`]); `None` where the endpoint has no messages (no
    /// batches to or from it).
    pub mailbox: Option<RemoteMemory>,
    /// The provider libfabric granted this endpoint (`fi_fabric_attr::prov_name`,
    /// e.g. `"shm"`, `"tcp;ofi_rxm"`): every PE must use the same one.
    pub provider: String,
}

impl PeerCard {
    /// Little-endian: base u64, len u64, key u64, name length u32, name,
    /// provider length u16, provider, then, with a mailbox, its base, len
    /// and key.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(54 + self.name.len() + self.provider.len());
        let mem = |b: &mut Vec<u8>, m: &RemoteMemory| {
            b.extend_from_slice(&m.base.to_le_bytes());
            b.extend_from_slice(&m.len.to_le_bytes());
            b.extend_from_slice(&m.key.0.to_le_bytes());
        };
        mem(&mut b, &self.mem);
        b.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.name);
        b.extend_from_slice(&(self.provider.len() as u16).to_le_bytes());
        b.extend_from_slice(self.provider.as_bytes());
        if let Some(m) = &self.mailbox {
            mem(&mut b, m);
        }
        b
    }

    /// Parses [`PeerCard::to_bytes`]; `None` if malformed.
    pub fn from_bytes(b: &[u8]) -> Option<PeerCard> {
        let u64_at = |i: usize| Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?));
        let mem_at = |i: usize| Some(RemoteMemory { base: u64_at(i)?, len: u64_at(i + 8)?, key: MrKey(u64_at(i + 16)?) });
        let mem = mem_at(0)?;
        let n = u32::from_le_bytes(b.get(24..28)?.try_into().ok()?) as usize;
        let name = b.get(28..28 + n)?.to_vec();
        let p = u16::from_le_bytes(b.get(28 + n..30 + n)?.try_into().ok()?) as usize;
        let provider = String::from_utf8(b.get(30 + n..30 + n + p)?.to_vec()).ok()?;
        let end = 30 + n + p;
        let mailbox = match b.len() - end {
            0 => None,
            24 => Some(mem_at(end)?),
            _ => return None,
        };
        Some(PeerCard { name, mem, mailbox, provider })
    }
}

/// Providers cpnet refuses, with why: `udp;ofi_rxd` (what `fi_getinfo`
/// grants for `CPNET_PROVIDER=udp`) crashes inside libfabric 1.17 on
/// cpnet's first atomic (a segfault in the provider, seen with `cpnet-check
/// ops`), so it is refused at init with a clear error instead.
pub(crate) fn refuse_broken(pe: i32, provider: &str) -> Result<(), TransportError> {
    if provider.contains("ofi_rxd") {
        return Err(TransportError::Config {
            pe,
            why: format!(
                "libfabric granted provider {provider}, which cpnet does not use: its RMA and atomics crash inside \
                 libfabric 1.17 (a segfault in the provider); for IP networks use CPNET_PROVIDER='tcp;ofi_rxm'"
            ),
        });
    }
    Ok(())
}

/// CPU PEs' transport needs atomic operations (AMOs, signals, barrier
/// flags): refuse a provider whose endpoint has no fetching 64-bit sum
/// (`fetch_add`: `fi_fetch_atomicvalid(FI_SUM, FI_UINT64)`), as libfabric
/// 1.17's `net` (its native TCP RDM endpoint,
/// [`crate::fabric::native_tcp_rdm`]), which lists `FI_ATOMIC` in its caps
/// but validates no atomic and answers every `fi_fetch_atomic` with
/// `-FI_ENOSYS`. GPU PEs use `net`: their staged transport sends messages.
pub(crate) fn refuse_without_atomics(pe: i32, provider: &str, fetch_add: bool) -> Result<(), TransportError> {
    if !fetch_add {
        return Err(TransportError::Config {
            pe,
            why: format!(
                "provider {provider} has no atomic operations on this endpoint (fi_fetch_atomicvalid(FI_SUM, \
                 FI_UINT64) says no), which CPU PEs need for AMOs, signals and barriers; use \
                 CPNET_PROVIDER='tcp;ofi_rxm' for CPU PEs over IP (GPU PEs may use {provider}: they send messages only)"
            ),
        });
    }
    Ok(())
}

/// The error text for PE `a` on provider `pa` and PE `b` on `pb`
/// (issue 19, bad input: mismatched providers).
pub(crate) fn mismatched_providers(a: i32, pa: &str, b: i32, pb: &str) -> String {
    format!(
        "PE {a} opened provider {pa}, PE {b} {pb}: every PE of a job must use the same provider (set CPNET_PROVIDER \
         alike on every PE; without it, PEs that all share one host pick shm and others an IP provider (net or \
         tcp;ofi_rxm), so a launcher that reports hosts differently to different PEs splits the job)"
    )
}

/// Errors of opening and connecting a transport ([`FabricEndpoint`],
/// [`crate::staged::StagedEndpoint`]), with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A libfabric call failed.
    #[error("PE {pe}: {what} (provider {provider}): {source}")]
    Fabric {
        /// This PE.
        pe: i32,
        /// The step.
        what: &'static str,
        /// The provider asked for.
        provider: String,
        /// The call and its return code.
        source: FabricError,
    },
    /// A CUDA call of the staged transport failed.
    #[error("PE {pe}: {what}: {why}")]
    Cuda {
        /// This PE.
        pe: i32,
        /// The call and its purpose.
        what: &'static str,
        /// The driver's answer.
        why: String,
    },
    /// The transport's configuration cannot work with this provider.
    #[error("PE {pe}: {why}")]
    Config {
        /// This PE.
        pe: i32,
        /// Why.
        why: String,
    },
    /// A peer's card did not parse, or the cards disagree with the job.
    #[error("PE {pe}: bad peer card from PE {peer}: {why}")]
    BadCard {
        /// This PE.
        pe: i32,
        /// The peer.
        peer: i32,
        /// Why.
        why: String,
    },
}

/// Thread-owned fabric objects before the peers are known: open it on the
/// service thread, send [`FabricEndpoint::card`] to the other PEs, then
/// [`FabricEndpoint::connect`] with theirs.
pub struct FabricEndpoint {
    // Field order is drop order: regions and the endpoint close before the
    // arena they point into.
    heap_mr: MemoryRegion,
    arena_mr: MemoryRegion,
    ep: Rc<Endpoint>,
    /// Put batches' buffers and mailbox (after the endpoint: posted
    /// receives point into them), where the endpoint has messages.
    batch: Option<BatchMem>,
    av: Rc<AddressVector>,
    cq: Rc<CompletionQueue>,
    domain: Rc<Domain>,
    provider: String,
    /// [`FabricConfig::reach_timeout`].
    reach_timeout: Option<std::time::Duration>,
    /// What libfabric granted, for [`FabricTransport::describe`].
    granted: Granted,
    my_pe: i32,
    region: HeapView,
    heap_size: u64,
    arena: Arena,
}

/// What `fi_getinfo` granted and where the endpoint listens, kept for
/// [`FabricTransport::describe`].
#[derive(Debug, Clone)]
struct Granted {
    provider: String,
    fabric: String,
    domain: String,
    local_addr: String,
}

/// How a connected [`FabricTransport`] reaches its peers, as libfabric
/// reports it: what the transport map prints (`CPNET_TRANSPORT_MAP`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointFacts {
    /// The provider libfabric granted (`fi_fabric_attr::prov_name`), e.g.
    /// `"shm"` or `"tcp;ofi_rxm"`.
    pub provider: String,
    /// The fabric's name (`fi_fabric_attr::name`): for tcp the IP subnet,
    /// e.g. `"10.0.0.0/24"`.
    pub fabric: String,
    /// The domain's name (`fi_domain_attr::name`): for tcp the network
    /// interface, e.g. `"eth0"`.
    pub domain: String,
    /// This endpoint's address in the provider's printable form
    /// (`fi_av_straddr` of `fi_getname`), e.g.
    /// `"fi_sockaddr_in://10.0.0.1:40000"`.
    pub local_addr: String,
    /// Per PE (index = PE), the address of that PE's endpoint in the same
    /// form; this PE's own entry is its `local_addr`.
    pub peer_addrs: Vec<String>,
}

/// Per-slot scratch words the fabric reads (operands) and writes (results)
/// behind Rust's back: reached only through raw pointers.
struct Arena {
    ptr: *mut u64,
    slots: usize,
}

/// Words per slot: operand, compare, result, spare.
const SLOT_WORDS: usize = 4;

impl Arena {
    fn new(slots: usize) -> Arena {
        let b: Box<[u64]> = vec![0u64; slots * SLOT_WORDS].into_boxed_slice();
        Arena { ptr: Box::into_raw(b).cast(), slots }
    }
    fn word(&self, slot: usize, w: usize) -> *mut u64 {
        assert!(slot < self.slots && w < SLOT_WORDS);
        // SAFETY: in bounds of the allocation (checked above).
        unsafe { self.ptr.add(slot * SLOT_WORDS + w) }
    }
    fn bytes(&self) -> usize {
        self.slots * SLOT_WORDS * 8
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw of a boxed slice of this length; every
        // region over it and the endpoint that could write it closed first
        // (field order of the owners).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.slots * SLOT_WORDS)) });
    }
}

impl FabricEndpoint {
    /// Open provider `cfg` and register `region` (heap of `heap_size` bytes
    /// followed by [`INTERNAL_BYTES`]) in a new domain. Call on the thread
    /// that will use it.
    ///
    /// # Errors
    /// [`TransportError::Fabric`] naming the step (`fi_getinfo` gives
    /// `-FI_ENODATA` when the provider lacks RMA + atomics on RDM endpoints).
    ///
    /// # Panics
    /// If `region` is shorter than [`region_len`]`(heap_size)`.
    pub fn open(cfg: &FabricConfig, my_pe: i32, region: HeapView, heap_size: u64) -> Result<FabricEndpoint, TransportError> {
        assert!(region.size() >= region_len(heap_size), "region too small for the heap and the internal area");
        let err = |what: &'static str| {
            let provider = cfg.provider.clone();
            move |source| TransportError::Fabric { pe: my_pe, what, provider, source }
        };
        let info = fabric_info(cfg).map_err(err("fi_getinfo (RMA + atomics, RDM endpoint)"))?;
        refuse_broken(my_pe, &info.provider_name())?;
        let fabric = Fabric::open(&info).map_err(err("fi_fabric"))?;
        let domain = Domain::open(&fabric).map_err(err("fi_domain"))?;
        let cq = CompletionQueue::open(&domain, 2 * MAX_INFLIGHT).map_err(err("fi_cq_open"))?;
        let av = AddressVector::open(&domain, 64).map_err(err("fi_av_open"))?;
        let ep = Endpoint::open(&domain, &cq, &av).map_err(err("endpoint"))?;
        let fetch_add = ep.atomic_supported(AtomicClass::Fetch, AtomicOp::Sum, AtomicType::U64);
        refuse_without_atomics(my_pe, &info.provider_name(), fetch_add)?;
        // SAFETY: the runtime keeps the region allocated until every
        // transport over it is dropped (it joins the service threads
        // first), and touches it only through HeapView (raw copies and
        // atomics), per MemoryRegion::register's contract.
        let heap_mr = unsafe { MemoryRegion::register(&domain, region.base(), region.size() as usize, Some(&ep)) }
            .map_err(err("fi_mr_reg (symmetric heap)"))?;
        let arena = Arena::new(MAX_INFLIGHT);
        // SAFETY: the arena is owned by `self` and dropped after the region
        // (field order); it is only touched through raw pointers.
        let arena_mr = unsafe { MemoryRegion::register(&domain, arena.ptr.cast(), arena.bytes(), Some(&ep)) }
            .map_err(err("fi_mr_reg (operand arena)"))?;
        let granted = Granted {
            provider: info.provider_name(),
            fabric: info.fabric_name(),
            domain: info.domain_name(),
            local_addr: printable(&av, ep.name()),
        };
        // Batches need messages in order and an 8-byte inject for the
        // acknowledgements.
        let batch = if info.caps() & sys::FI_MSG != 0 && info.msg_order() & sys::FI_ORDER_SAS != 0 && info.inject_size() >= 8
        {
            Some(BatchMem::open(&domain, &ep).map_err(err("fi_mr_reg (put batches)"))?)
        } else {
            None
        };
        tracing::debug!(
            pe = my_pe,
            provider = %info.provider_name(),
            mr_mode = info.mr_mode(),
            msg_order = info.msg_order(),
            inject_size = info.inject_size(),
            batches = batch.is_some(),
            "fabric endpoint open"
        );
        Ok(FabricEndpoint {
            heap_mr,
            arena_mr,
            ep,
            batch,
            av,
            cq,
            domain,
            provider: cfg.provider.clone(),
            reach_timeout: cfg.reach_timeout,
            granted,
            my_pe,
            region,
            heap_size,
            arena,
        })
    }

    /// What the peers need to reach us.
    pub fn card(&self) -> PeerCard {
        PeerCard {
            name: self.ep.name().to_vec(),
            mem: self.heap_mr.remote(),
            mailbox: self.batch.as_ref().map(BatchMem::mailbox),
            provider: self.granted.provider.clone(),
        }
    }

    /// Insert every PE's card (index = PE; ours included, unused) and
    /// become a transport. `barrier_epoch` is shared by every transport of
    /// this PE (barriers are PE-wide, one at a time).
    ///
    /// # Errors
    /// [`TransportError::BadCard`] for a region of the wrong size;
    /// `fi_av_insert` failures.
    pub fn connect(mut self, cards: &[PeerCard], barrier_epoch: Arc<StdAtomicU64>) -> Result<FabricTransport, TransportError> {
        let my_pe = self.my_pe;
        let mut peers = Vec::with_capacity(cards.len());
        let mut remote = Vec::with_capacity(cards.len());
        let mut peer_addrs = Vec::with_capacity(cards.len());
        for (pe, card) in cards.iter().enumerate() {
            if card.provider != self.granted.provider {
                return Err(TransportError::BadCard {
                    pe: my_pe,
                    peer: pe as i32,
                    why: mismatched_providers(pe as i32, &card.provider, my_pe, &self.granted.provider),
                });
            }
            if card.mem.len != self.region.size() {
                return Err(TransportError::BadCard {
                    pe: my_pe,
                    peer: pe as i32,
                    why: format!(
                        "its region is {} bytes, ours {} (every PE must use the same CPNET_HEAP_SIZE)",
                        card.mem.len,
                        self.region.size()
                    ),
                });
            }
            let addr = if pe as i32 == my_pe {
                FiAddr(sys::FI_ADDR_NOTAVAIL)
            } else {
                self.av.insert(&card.name).map_err(|source| TransportError::Fabric {
                    pe: my_pe,
                    what: "fi_av_insert (peer address)",
                    provider: self.provider.clone(),
                    source,
                })?
            };
            peers.push(addr);
            remote.push(card.mem);
            peer_addrs.push(if pe as i32 == my_pe { self.granted.local_addr.clone() } else { printable(&self.av, &card.name) });
        }
        let n_pes = cards.len() as i32;
        let rounds = if n_pes <= 1 { 0 } else { 32 - ((n_pes - 1) as u32).leading_zeros() };
        let batcher = match self.batch.as_mut() {
            Some(mem) => Some(
                Batcher::connect(
                    mem,
                    &self.domain,
                    &self.ep,
                    my_pe,
                    (self.region, self.heap_size),
                    peers.clone(),
                    cards.iter().map(|c| c.mailbox).collect(),
                )
                .map_err(|source| TransportError::Fabric {
                    pe: my_pe,
                    what: "put batches' receive buffers",
                    provider: self.provider.clone(),
                    source,
                })?,
            ),
            None => None,
        };
        let mut batcher = batcher;
        if let Some(b) = &mut batcher {
            b.watch = PeerWatch::new(cards.len(), self.reach_timeout);
        }
        let min_native = [AmoType::Int32, AmoType::Uint32, AmoType::Int64, AmoType::Uint64]
            .map(|ty| self.ep.atomic_supported(AtomicClass::Fetch, AtomicOp::Min, fi_type(ty)));
        tracing::debug!(pe = my_pe, ?min_native, "FI_MIN per type (int32, uint32, int64, uint64)");
        Ok(FabricTransport {
            min_native,
            free: (0..MAX_INFLIGHT as u32).rev().collect(),
            slots: vec![SlotState::default(); MAX_INFLIGHT],
            deferred: VecDeque::new(),
            peers,
            remote,
            n_pes,
            flags: self.heap_size.next_multiple_of(64),
            barrier: BarrierState { epoch: 0, round: 0, posted: false, failed: None },
            rounds,
            barrier_epoch,
            poll_buf: vec![0; 64],
            peer_addrs,
            batcher,
            early: Vec::new(),
            behind: Vec::new(),
            watch: PeerWatch::new(cards.len(), self.reach_timeout),
            inner: self,
        })
    }
}

#[derive(Clone, Copy, Debug, Default)]
enum Stage {
    #[default]
    Free,
    /// One fabric operation; its completion finishes the command.
    Single,
    /// The data write of a put-signal; the signal follows.
    Data,
    /// The signal atomic of a put-signal.
    Signal,
    /// A barrier flag increment (no command).
    BarrierFlag(i32),
    /// Emulated minimum AMO: the read of the target word.
    MinRead,
    /// Emulated minimum AMO: a compare-and-swap of the operand over the
    /// value last seen (arena word 1).
    MinCas,
}

#[derive(Clone, Copy, Debug, Default)]
struct SlotState {
    stage: Stage,
    tag: Option<Tag>,
    op: Option<Op>,
}

struct BarrierState {
    epoch: u64,
    round: u32,
    posted: bool,
    failed: Option<ErrorCode>,
}

/// The libfabric [`Transport`] of one service thread.
pub struct FabricTransport {
    free: Vec<u32>,
    slots: Vec<SlotState>,
    deferred: VecDeque<u32>,
    peers: Vec<FiAddr>,
    remote: Vec<RemoteMemory>,
    n_pes: i32,
    /// Region offset of the barrier flags.
    flags: u64,
    barrier: BarrierState,
    rounds: u32,
    barrier_epoch: Arc<StdAtomicU64>,
    poll_buf: Vec<u64>,
    /// Per PE: its endpoint's printable address (for [`Self::describe`]).
    peer_addrs: Vec<String>,
    /// Small puts to other PEs go in batches ([`crate::batch`]), where the
    /// provider has messages.
    batcher: Option<Batcher>,
    /// Operations finished inside `submit` (a batch that failed to send),
    /// reported at the next `progress`.
    early: Vec<Finished>,
    /// Operations waiting for batches to their PE to be acknowledged, and
    /// the batch each waits for (B6 in [`crate::batch`]).
    behind: Vec<(Tag, u64)>,
    /// Operations posted per peer and not finished ([`crate::reach`]).
    watch: PeerWatch,
    /// Per [`AmoType`] (index `ty as usize - 1`): the provider has a
    /// fetching `FI_MIN` for it; otherwise minimum AMOs run as a CAS loop.
    min_native: [bool; 4],
    // Last: owns the regions, queues and the arena (see FabricEndpoint).
    inner: FabricEndpoint,
}

fn fi_type(ty: AmoType) -> AtomicType {
    match ty {
        AmoType::Int32 => AtomicType::I32,
        AmoType::Uint32 => AtomicType::U32,
        AmoType::Int64 => AtomicType::I64,
        AmoType::Uint64 => AtomicType::U64,
    }
}

fn fi_op(op: AmoOp) -> AtomicOp {
    match op {
        AmoOp::Fetch => AtomicOp::Read,
        AmoOp::Set | AmoOp::Swap => AtomicOp::Write,
        AmoOp::CompareSwap => AtomicOp::Cswap,
        AmoOp::FetchAdd | AmoOp::Add => AtomicOp::Sum,
        AmoOp::FetchAnd | AmoOp::And => AtomicOp::Band,
        AmoOp::FetchOr | AmoOp::Or => AtomicOp::Bor,
        AmoOp::FetchXor | AmoOp::Xor => AtomicOp::Bxor,
        AmoOp::FetchMin | AmoOp::Min => AtomicOp::Min,
    }
}

/// The cpnet error for a fabric failure: unreachable peers are `PeerDead`.
pub(crate) fn fabric_code(e: &FabricError) -> ErrorCode {
    let c = e.code().saturating_abs();
    let unreachable =
        [sys::FI_ENOTCONN, sys::FI_ECONNREFUSED, sys::FI_ECONNRESET, sys::FI_ECONNABORTED, sys::FI_EHOSTUNREACH];
    // rxm cancels operations on a lost connection: err ECANCELED with the
    // socket's errno (ENOTCONN, ECONNRESET, EPIPE) as prov_errno.
    let lost = match e {
        FabricError::Completion { prov_errno, .. } => {
            [libc::ENOTCONN, libc::ECONNRESET, libc::ECONNREFUSED, libc::EPIPE, libc::ECONNABORTED].contains(prov_errno)
        }
        _ => false,
    };
    if lost || unreachable.contains(&c) {
        ErrorCode::PeerDead
    } else {
        ErrorCode::Fabric
    }
}

/// `addr` as the provider prints it, or why it cannot (for the transport map
/// only, so a failure is text rather than an error).
pub(crate) fn printable(av: &AddressVector, addr: &[u8]) -> String {
    av.straddr(addr).unwrap_or_else(|e| format!("(address not printable: {e})"))
}

fn mask(v: u64, bytes: u64) -> u64 {
    if bytes >= 8 { v } else { v & ((1u64 << (8 * bytes)) - 1) }
}

const DC: u64 = sys::FI_DELIVERY_COMPLETE;

impl FabricTransport {
    /// The provider in use, as asked for (`FabricConfig::provider`).
    pub fn provider(&self) -> &str {
        &self.inner.provider
    }

    /// How this transport reaches its peers, as libfabric granted and
    /// reports it: provider, fabric, domain, and the endpoints' addresses.
    pub fn describe(&self) -> EndpointFacts {
        let g = &self.inner.granted;
        EndpointFacts {
            provider: g.provider.clone(),
            fabric: g.fabric.clone(),
            domain: g.domain.clone(),
            local_addr: g.local_addr.clone(),
            peer_addrs: self.peer_addrs.clone(),
        }
    }

    fn target(&self, pe: i32, off: u64, len: u64) -> RemoteTarget {
        self.remote[pe as usize]
            .target(self.peers[pe as usize], off, len)
            .expect("decoder-checked range inside the peer's region")
    }

    fn heap_src(&self, off: u64) -> LocalBuf {
        self.inner.heap_mr.local(off as usize)
    }

    fn arena_buf(&self, slot: u32, w: usize) -> LocalBufMut {
        LocalBufMut { ptr: self.inner.arena.word(slot as usize, w).cast(), desc: self.inner.arena_mr.desc() }
    }

    fn arena_src(&self, slot: u32, w: usize) -> LocalBuf {
        let b = self.arena_buf(slot, w);
        LocalBuf { ptr: b.ptr, desc: b.desc }
    }

    fn set_word(&self, slot: u32, w: usize, v: u64) {
        // SAFETY: the slot is ours (not posted) so the fabric does not touch
        // its words now; in bounds (Arena::word).
        unsafe { self.inner.arena.word(slot as usize, w).write(v) }
    }

    fn get_word(&self, slot: u32, w: usize) -> u64 {
        // SAFETY: the slot's operation completed (its completion was read),
        // so the fabric no longer writes it; in bounds.
        unsafe { self.inner.arena.word(slot as usize, w).read() }
    }

    /// Post the fabric operation for `slot`'s current stage.
    fn post(&mut self, slot: u32) -> Result<Post, FabricError> {
        let st = self.slots[slot as usize];
        let ctx = u64::from(slot);
        let op = st.op;
        // SAFETY (for every post below): local buffers are inside the heap
        // region (decoder-checked ranges) or in this slot's arena words,
        // both registered in this domain and alive until the completion is
        // read (the slot stays out of the free list until then); remote
        // targets are built by RemoteMemory::target from the peer's card and
        // the peer came from our AV.
        match (st.stage, op) {
            (Stage::Data, Some(Op::PutSignal { pe, dst, src, size, .. }))
            | (Stage::Single, Some(Op::Put { pe, dst, src, size })) => {
                let buf = match src {
                    PutSrc::Heap(off) => self.heap_src(off),
                    PutSrc::Inline(bits) => {
                        self.set_word(slot, 0, bits);
                        self.arena_src(slot, 0)
                    }
                    PutSrc::Payload | PutSrc::Host { .. } => unreachable!("refused in submit"),
                };
                let t = self.target(pe, dst, size);
                // SAFETY: see above.
                unsafe { self.inner.ep.writemsg(buf, size as usize, t, ctx, DC) }
            }
            (Stage::Signal, Some(Op::PutSignal { pe, sig, signal, op, .. })) => {
                self.set_word(slot, 0, signal);
                let fop = match op {
                    SignalOp::Set => AtomicOp::Write,
                    SignalOp::Add => AtomicOp::Sum,
                };
                let t = self.target(pe, sig, 8);
                // SAFETY: see above.
                unsafe { self.inner.ep.fetch_atomic(fop, AtomicType::U64, self.arena_src(slot, 0), self.arena_buf(slot, 2), 1, t, ctx) }
            }
            (Stage::Single, Some(Op::Get { pe, dst, src, size })) => {
                let buf = match dst {
                    GetDst::Heap(off) => self.inner.heap_mr.local_mut(off as usize),
                    GetDst::Result => {
                        self.set_word(slot, 2, 0);
                        self.arena_buf(slot, 2)
                    }
                };
                let t = self.target(pe, src, size);
                // SAFETY: see above.
                unsafe { self.inner.ep.read(buf, size as usize, t, ctx) }
            }
            (Stage::Single, Some(Op::Amo { pe, ty, op, dst, value, cond })) => {
                self.set_word(slot, 0, value);
                self.set_word(slot, 1, cond);
                self.set_word(slot, 2, 0);
                let t = self.target(pe, dst, ty.size());
                let (fty, fop) = (fi_type(ty), fi_op(op));
                let (src, cmp, res) = (self.arena_src(slot, 0), self.arena_src(slot, 1), self.arena_buf(slot, 2));
                // SAFETY: see above (operands are little-endian words, so a
                // 4-byte element reads the low half).
                unsafe {
                    match op {
                        AmoOp::CompareSwap => self.inner.ep.compare_atomic(fop, fty, src, cmp, res, 1, t, ctx),
                        _ => self.inner.ep.fetch_atomic(fop, fty, src, res, 1, t, ctx),
                    }
                }
            }
            (Stage::MinRead, Some(Op::Amo { pe, ty, value, dst, .. })) => {
                self.set_word(slot, 0, value);
                self.set_word(slot, 2, 0);
                let t = self.target(pe, dst, ty.size());
                // SAFETY: see above.
                unsafe {
                    self.inner.ep.fetch_atomic(AtomicOp::Read, fi_type(ty), self.arena_src(slot, 0), self.arena_buf(slot, 2), 1, t, ctx)
                }
            }
            (Stage::MinCas, Some(Op::Amo { pe, ty, dst, .. })) => {
                // Words 0 (operand) and 1 (compare: the value last seen) were
                // set by `completed`.
                self.set_word(slot, 2, 0);
                let t = self.target(pe, dst, ty.size());
                let (src, cmp, res) = (self.arena_src(slot, 0), self.arena_src(slot, 1), self.arena_buf(slot, 2));
                // SAFETY: see above.
                unsafe { self.inner.ep.compare_atomic(AtomicOp::Cswap, fi_type(ty), src, cmp, res, 1, t, ctx) }
            }
            (Stage::BarrierFlag(_), _) => {
                let peer = (self.inner.my_pe + (1 << self.barrier.round)) % self.n_pes;
                self.set_word(slot, 0, 1);
                let t = self.target(peer, self.flags + 8 * u64::from(self.barrier.round), 8);
                // SAFETY: see above (the flag word is in the internal area).
                unsafe {
                    self.inner.ep.fetch_atomic(AtomicOp::Sum, AtomicType::U64, self.arena_src(slot, 0), self.arena_buf(slot, 2), 1, t, ctx)
                }
            }
            (stage, op) => unreachable!("slot {slot} in stage {stage:?} with {op:?}"),
        }
    }

    fn release(&mut self, slot: u32) {
        self.slots[slot as usize] = SlotState::default();
        self.free.push(slot);
    }

    fn fail(&mut self, slot: u32, e: &FabricError, done: &mut Vec<Finished>) {
        let st = self.slots[slot as usize];
        let code = fabric_code(e);
        match (st.tag, st.op) {
            (Some(tag), Some(op)) => {
                tracing::error!(
                    "PE {}: {} to PE {} at heap+{:#x} ({} bytes) failed in the fabric ({}): {e}",
                    self.inner.my_pe,
                    op.name(),
                    op.pe().unwrap_or(-1),
                    op.addr(),
                    op.size(),
                    self.inner.provider
                );
                if let Some(pe) = op.pe() {
                    self.watch.answered(pe);
                }
                done.push(Finished { tag, outcome: Outcome::Failed(code), op });
            }
            _ => {
                if let Stage::BarrierFlag(pe) = st.stage {
                    self.watch.answered(pe);
                }
                tracing::error!("PE {}: barrier flag update failed ({}): {e}", self.inner.my_pe, self.inner.provider);
                self.barrier.failed = Some(code);
            }
        }
        self.release(slot);
    }

    fn completed(&mut self, slot: u32, done: &mut Vec<Finished>) {
        let st = self.slots[slot as usize];
        // The peer answered (a data stage's signal that follows counts anew).
        if let Stage::BarrierFlag(pe) = st.stage {
            self.watch.answered(pe);
        }
        if let Some(pe) = st.op.and_then(|op| op.pe()) {
            self.watch.answered(pe);
            if matches!(st.stage, Stage::Data) {
                self.watch.sent(pe);
            }
        }
        let outcome = match (st.stage, st.op) {
            (Stage::MinRead | Stage::MinCas, Some(Op::Amo { pe, ty, op, value, .. })) => {
                let seen = mask(self.get_word(slot, 2), ty.size());
                let won = matches!(st.stage, Stage::MinCas) && seen == mask(self.get_word(slot, 1), ty.size());
                if !won && crate::staged::amo_apply(ty, AmoOp::Min, seen, value, 0) != seen {
                    // The operand is smaller than what the word holds: try
                    // to swap it in over that value.
                    self.set_word(slot, 0, value);
                    self.set_word(slot, 1, seen);
                    self.slots[slot as usize].stage = Stage::MinCas;
                    self.watch.sent(pe);
                    self.post_or_defer(slot, done);
                    return;
                }
                // Swapped in over `seen`, or `seen` is already at most the
                // operand: `seen` is the old value either way.
                if op.fetches() { Outcome::Value(seen) } else { Outcome::Done }
            }
            (Stage::Data, Some(_)) => {
                self.slots[slot as usize].stage = Stage::Signal;
                self.post_or_defer(slot, done);
                return;
            }
            (Stage::Single, Some(Op::Get { dst: GetDst::Result, size, .. })) => {
                Outcome::Value(mask(self.get_word(slot, 2), size))
            }
            (Stage::Single, Some(Op::Amo { ty, op, .. })) if op.fetches() => {
                Outcome::Value(mask(self.get_word(slot, 2), ty.size()))
            }
            _ => Outcome::Done,
        };
        if let (Some(tag), Some(op)) = (st.tag, st.op) {
            done.push(Finished { tag, outcome, op });
        }
        self.release(slot);
    }

    fn post_or_defer(&mut self, slot: u32, done: &mut Vec<Finished>) {
        match self.post(slot) {
            Ok(Post::Posted) => {}
            Ok(Post::Again) => self.deferred.push_back(slot),
            Err(e) => self.fail(slot, &e, done),
        }
    }

    fn load_flag(&self, round: u32) -> u64 {
        let a = self
            .inner
            .region
            .atomic_u64(SymAddr(self.flags + 8 * u64::from(round)))
            .expect("barrier flags lie in the internal area");
        // Acquire: pairs with the provider's application of a peer's
        // delivery-complete flag increment (made after that peer's earlier
        // operations completed), so our later reads see its data.
        a.load(Ordering::Acquire)
    }
}

mod ops;

#[cfg(test)]
mod tests;
