//! The GPU variants of `bfs`: the same 1D partition, CSR and search as the
//! CPU work-groups ([`super`]; top-down, or direction-optimizing with
//! `-variant intra-kernel -direction hybrid`), on one GPU per PE, the
//! frontier exchange issued from the GPU through cpnet (`bfs.cu`).
//!
//! # Data
//!
//! Each PE copies its CSR to its GPU (row offsets `u64`, targets `u32`:
//! SCALE is at most 30) and keeps there the level (`u32`) and parent
//! (`u64`) of its vertices, two frontier queues (by round parity), a bitmap
//! of the remote vertices already sent this search, and a few counters. In
//! the symmetric heap: a send slot per destination, a receive slot per
//! (source, parity) and a signal word per source; a slot holds `2 + block`
//! words (the header and at most one pair per vertex of the destination's
//! block: a remote vertex is sent at most once per search), so one message
//! per pair of PEs and round always fits, and 3 more for a hybrid search's
//! counts.
//!
//! # A round (level-synchronous, top-down)
//!
//! 1. **Expand** (one warp per frontier vertex): a local target not yet
//!    visited is claimed at once (`atomicCAS` of its level, then its parent
//!    and a slot in the next queue); a remote target not yet sent goes into
//!    its owner's send slot as one word `v << 32 | u`. A vertex of more
//!    than [`BIG_DEGREE`] arcs goes into the round's big list instead, whose
//!    arcs every warp of the grid then shares in equal chunks (after a grid
//!    barrier; inter-kernel: a second launch): a Kronecker graph's hubs
//!    (321,192 arcs at SCALE 22) would otherwise keep one warp busy while
//!    the rest of the GPU waits, on any number of PEs.
//! 2. **Exchange**: to every other PE, one `cpnet_putmem_signal_nbi` of
//!    `[frontier size, pairs, pairs...]` into its receive slot for this PE
//!    (parity of the round's sequence number `seq`), signal SET to `seq`;
//!    then a wait for every source's signal `>= seq`. The headers' frontier
//!    sizes, summed, are the global frontier of the round (the per-level sum
//!    over PEs rides on the frontier messages, so a round is one exchange);
//!    the search ends after the first round whose global frontier is empty.
//! 3. **Receive**: every received pair `(v, u)` is claimed as in 1.
//!
//! A source can be one round ahead of a receiver (it has our message of
//! round `seq` and moves on), never two: it sends `seq + 1` into the other
//! parity, and `seq + 2` only after our message of `seq + 1`, which we send
//! after reading `seq`'s. Sequence numbers continue across searches, so no
//! signal is ever reset.
//!
//! # `-variant intra-kernel`
//!
//! One cooperative launch per search (`bfs_persistent`, as many blocks as
//! fit on the GPU at once, shared among the PEs of the GPU under MPS, less
//! room for the proxy's landing agents ([`crate::gpu::max_coresident`]); or `-wgs`) runs init and
//! every round, with grid barriers after init, after each expand
//! and after each receive; the first `min(blocks, PEs)` blocks hold a cpnet
//! context and send.
//!
//! # `-direction hybrid` (intra-kernel)
//!
//! `bfs_persistent_hybrid` opens every round with a count exchange: each
//! PE puts its frontier's vertices, the frontier's arcs and its unvisited
//! arcs (kept as the claims add each new vertex's degree) into every other
//! PE's receive slot with signal `seq`, and every block of every PE sums
//! the same numbers. An empty global frontier ends the search; otherwise
//! Beamer's rule (as the CPU variant's: bottom-up once frontier arcs x
//! alpha exceed the unvisited arcs, top-down again once frontier vertices
//! x beta fall under n) picks the round's direction, identically
//! everywhere, and the round's payload travels with signal `seq + 1`:
//! top-down as above, or bottom-up: each PE's frontier as a bitmap of its
//! block (built in its own send slot, which is never a destination) to
//! every PE, then one thread per unvisited local vertex takes the first
//! neighbour, in CSR order, whose bit is set in its owner's bitmap. A
//! search uses two signal values per round and one for the final count
//! exchange; the kernel reports how many, with the rounds and bottom-up
//! rounds it ran.
//!
//! # `-variant inter-kernel`
//!
//! The same phases as separate launches: `bfs_init_k`, then per round
//! `bfs_expand_k`, `bfs_exchange_k` (one block: the puts, the waits, the
//! global frontier size) and, after the host read that size (one stream
//! synchronization per level, as a host-driven BFS does), `bfs_receive_k`
//! unless the search is over: the ComP-Net "inter-kernel" baseline.
//!
//! # Around the searches
//!
//! Kernel 1 runs on the host without communication ([`build_csr_local`]:
//! every PE generates the edge list and keeps its arcs), the keys, the TEPS
//! sums and `-verify` ([`super::validate`], on the levels and parents copied
//! back) go through the host collectives of [`GpuHostComm`], and the
//! Graph500 protocol and output are the CPU variant's ([`super::searches`]).
//! A search's time runs from a barrier to the end of its last kernel on
//! PE 0 (state reset included, the copy back not).

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use cpnet::GpuPe;
use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, PushKernelArg};

use super::{Args, Direction, Search, UNVISITED, searches};
use crate::cli::{Variant, init_gpu_pe};
use crate::gpu::{check_launch, dptr, grid, kernel_source, max_coresident, new_ctl, op, persistent_grid};
use crate::graph::build::{Input, build_csr_local};
use crate::graph::comm::GpuHostComm;
use crate::graph::{Csr, Partition};

/// Threads per block of every bfs kernel.
pub const THREADS: u32 = 256;

/// Words of the state block (`BFS_ST_*`).
mod st {
    /// Global frontier size of the last exchange (inter-kernel).
    pub const TOTAL: usize = 2;
    /// Rounds the persistent kernel ran.
    pub const ROUNDS: usize = 3;
    /// Hybrid: arcs of the frontier by round parity (two words).
    pub const ARCS: usize = 4;
    /// Hybrid: arcs of the vertices of every frontier expanded so far.
    pub const VARCS: usize = 6;
    /// Hybrid: bottom-up rounds of the search.
    pub const BU: usize = 7;
    /// Hybrid: signal values the search used.
    pub const SEQS: usize = 8;
    /// The round's big list (`bfs.cu`): its entries << 38 | its arcs.
    pub const BIG: usize = 9;
    /// Pairs for each destination (one word per PE from here).
    pub const OUT: usize = 10;
}

/// A frontier vertex of more arcs than this is expanded by every warp of
/// the grid together, not by one warp (`bfs.cu`, "Big vertices"): one warp
/// takes at most 32 steps of 32 arcs.
pub const BIG_DEGREE: u64 = 1024;

/// Arcs of the big list per warp and step of `bfs_expand_big`.
const BIG_CHUNK: u64 = 512;

/// [`st::TOTAL`] after a failed exchange.
const TOTAL_FAILED: u64 = u64::MAX;

/// The kernels' source with every `#define` they need.
pub fn source() -> String {
    let defines = [
        ("BFS_THREADS", THREADS.to_string()),
        ("BFS_UNVISITED", format!("{UNVISITED}u")),
        ("BFS_ST_TOTAL", st::TOTAL.to_string()),
        ("BFS_ST_ROUNDS", st::ROUNDS.to_string()),
        ("BFS_ST_ARCS", st::ARCS.to_string()),
        ("BFS_ST_VARCS", st::VARCS.to_string()),
        ("BFS_ST_BU", st::BU.to_string()),
        ("BFS_ST_SEQS", st::SEQS.to_string()),
        ("BFS_ST_BIG", st::BIG.to_string()),
        ("BFS_ST_OUT", st::OUT.to_string()),
        ("BFS_BIG_DEGREE", format!("{BIG_DEGREE}ull")),
        ("BFS_BIG_CHUNK", format!("{BIG_CHUNK}ull")),
        ("BFS_COUNT_WORDS", COUNT_WORDS.to_string()),
        ("BFS_TOTAL_FAILED", format!("{TOTAL_FAILED}ull")),
        ("BFS_OP_FRONTIER", format!("{}ull", op::BFS_FRONTIER)),
    ];
    kernel_source(&defines, include_str!("bfs.cu"))
}

/// `bfs_params` of `bfs.cu`, field for field (all 8 bytes: no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct BfsParams {
    rows: u64,
    cols: u64,
    level: u64,
    parent: u64,
    queue: u64,
    sent: u64,
    state: u64,
    ctl: u64,
    send: u64,
    recv: u64,
    sig: u64,
    big: u64,
    big_cap: i64,
    n: i64,
    nl: i64,
    lo: i64,
    block: i64,
    slot: i64,
    n_pes: i64,
    me: i64,
    root: i64,
    seq0: i64,
    round: i64,
    alpha: f64,
    beta: f64,
}

// SAFETY: repr(C), plain 8-byte integers and doubles, laid out as `struct
// bfs_params` (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for BfsParams {}

/// Words of a hybrid search's count message ([frontier vertices, frontier
/// arcs, unvisited arcs]), kept at the end of a slot (`BFS_COUNT_WORDS`).
const COUNT_WORDS: u64 = 3;

/// Words of one send or receive slot for `part`: the header, one pair per
/// vertex of the destination's block, and the count words past them (a
/// block still putting its counts while others expand into the pairs must
/// not share a word with them).
fn slot_words(part: &Partition) -> u64 {
    2 + part.block + COUNT_WORDS
}

/// Symmetric heap bytes per PE: send slots, receive slots (two parities),
/// signals.
pub fn heap_bytes(part: &Partition) -> u64 {
    let p = part.n_pes.max(1) as u64;
    3 * p * slot_words(part) * 8 + (p * 8).next_multiple_of(64) + 4 * 64
}

/// The loaded kernels.
struct Kernels {
    persistent: CudaFunction,
    hybrid: CudaFunction,
    init: CudaFunction,
    expand: CudaFunction,
    expand_big: CudaFunction,
    exchange: CudaFunction,
    receive: CudaFunction,
}

/// Device buffers the parameters point into, held for the kernels.
struct Held {
    _rows: CudaSlice<u64>,
    _cols: CudaSlice<u32>,
    _queue: CudaSlice<u32>,
    _sent: CudaSlice<u64>,
    _big: CudaSlice<u64>,
}

/// One PE's GPU search state and kernels.
struct GpuBfs<'a> {
    pe: &'a GpuPe,
    variant: Variant,
    /// `-direction hybrid` (intra-kernel only): `bfs_persistent_hybrid`.
    hybrid: bool,
    k: Kernels,
    blocks: u32,
    params: BfsParams,
    nl: usize,
    /// Signals used so far (the next search's are `seq0 + 1, ...`).
    seq0: u64,
    _bufs: Held,
    level: CudaSlice<u32>,
    parent: CudaSlice<u64>,
    state: CudaSlice<u64>,
    ctl: CudaSlice<u64>,
}

impl GpuBfs<'_> {
    /// One search from `root` (**collective**): its levels and parents, and
    /// its time.
    fn search(&mut self, root: u64) -> Result<(Search, f64)> {
        let s = self.pe.stream().clone();
        s.memset_zeros(&mut self.ctl).context("reset the control block")?;
        let mut p = self.params;
        p.root = root as i64;
        p.seq0 = self.seq0 as i64;
        let hnd = self.pe.handle();
        let t = Instant::now();
        // (signal values used, levels run top-down, levels run bottom-up)
        let (seqs, top_down, bottom_up) = match self.variant {
            Variant::IntraKernel => {
                let (kernel, name) =
                    if self.hybrid { (&self.k.hybrid, "bfs_persistent_hybrid") } else { (&self.k.persistent, "bfs_persistent") };
                let mut b = s.launch_builder(kernel);
                b.arg(&hnd).arg(&p);
                // SAFETY: the arguments match bfs_persistent and
                // bfs_persistent_hybrid(cpnet_handle_t, bfs_params); every
                // pointer in `p` is a live allocation of the size the kernel
                // indexes (the CSR, per-vertex arrays, queues, bitmap and
                // state held by `self`; the heap slots sized by heap_bytes),
                // alive until check_launch below. Cooperative: blocks <= the
                // co-resident maximum of the kernel that runs (run).
                unsafe { b.launch_cooperative(grid(self.blocks, THREADS)) }.with_context(|| format!("launch {name}"))?;
                check_launch(self.pe, &self.ctl, name, "signal")?;
                let state = s.clone_dtoh(&self.state).context("copy the search state back")?;
                let rounds = state[st::ROUNDS];
                if self.hybrid {
                    let (bu, seqs) = (state[st::BU], state[st::SEQS]);
                    ensure!(seqs >= 1 && bu <= rounds, "internal: hybrid search state rounds {rounds}, bottom-up {bu}, signals {seqs}");
                    (seqs, rounds - bu, bu)
                } else {
                    ensure!(rounds >= 1, "internal: the search ran no round");
                    (rounds, rounds - 1, 0)
                }
            }
            _ => {
                let rounds = self.inter_kernel(&p)?;
                ensure!(rounds >= 1, "internal: the search ran no round");
                (rounds, rounds - 1, 0)
            }
        };
        let secs = t.elapsed().as_secs_f64();
        self.seq0 += seqs;
        let mut level = s.clone_dtoh(&self.level).context("copy the levels back")?;
        let mut parent = s.clone_dtoh(&self.parent).context("copy the parents back")?;
        // The buffers hold at least one element (a PE may own no vertex).
        level.truncate(self.nl);
        parent.truncate(self.nl);
        Ok((Search { parent, level, levels: (top_down as u32, bottom_up as u32) }, secs))
    }

    /// `-variant inter-kernel`: the launches of one search; the rounds run.
    fn inter_kernel(&self, p0: &BfsParams) -> Result<u64> {
        let s = self.pe.stream();
        let hnd = self.pe.handle();
        let mut b = s.launch_builder(&self.k.init);
        b.arg(p0);
        // SAFETY: bfs_init_k(bfs_params); the buffers live as in search().
        unsafe { b.launch(grid(self.blocks, THREADS)) }.context("launch bfs_init_k")?;
        let mut p = *p0;
        for r in 0.. {
            p.round = r;
            let mut b = s.launch_builder(&self.k.expand);
            b.arg(&p);
            // SAFETY: bfs_expand_k(bfs_params); buffers as in search();
            // stream order puts it after the previous round's receive.
            unsafe { b.launch(grid(self.blocks, THREADS)) }.context("launch bfs_expand_k")?;
            let mut b = s.launch_builder(&self.k.expand_big);
            b.arg(&p);
            // SAFETY: bfs_expand_big_k(bfs_params); buffers as in search();
            // stream order puts it after the expansion that filled the list.
            unsafe { b.launch(grid(self.blocks, THREADS)) }.context("launch bfs_expand_big_k")?;
            let mut b = s.launch_builder(&self.k.exchange);
            b.arg(&hnd).arg(&p);
            // SAFETY: bfs_exchange_k(cpnet_handle_t, bfs_params), one block
            // (its own context); buffers as in search().
            unsafe { b.launch(grid(1, THREADS)) }.context("launch bfs_exchange_k")?;
            // Wait for the stream first: a copy to pageable memory issued
            // while the exchange kernel runs holds the driver up for the
            // proxy's own CUDA calls, which the exchange waits on.
            self.pe.synchronize().context("bfs_exchange_k")?;
            let total = s.clone_dtoh(&self.state).context("read the frontier size")?[st::TOTAL];
            if total == TOTAL_FAILED {
                check_launch(self.pe, &self.ctl, "bfs_exchange_k", "signal")?;
                bail!("bfs_exchange_k failed without a record");
            }
            if total == 0 {
                check_launch(self.pe, &self.ctl, "bfs inter-kernel search", "signal")?;
                return Ok(r as u64 + 1);
            }
            let mut b = s.launch_builder(&self.k.receive);
            b.arg(&p);
            // SAFETY: bfs_receive_k(bfs_params); buffers as in search().
            unsafe { b.launch(grid(self.blocks, THREADS)) }.context("launch bfs_receive_k")?;
        }
        unreachable!("the round loop only ends by returning")
    }
}

/// `bfs -variant intra-kernel|inter-kernel` on this PE: `(all searches
/// valid, this PE)`. Initializes and finalizes the GPU PE itself.
///
/// # Errors
/// No GPU, start-up, a kernel failure (naming the work-group, the operation
/// and the signal), a communication failure.
pub fn run(args: &Args, input: &Input) -> Result<(bool, i32)> {
    let variant = args.g.variant;
    let n = input.n();
    let (pe, raised) = init_gpu_pe(variant, |p| heap_bytes(&Partition::new(n, p)), 0)?;
    let (me, n_pes) = (pe.my_pe(), pe.n_pes());
    let part = Partition::new(n, n_pes);
    let t0 = Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).div_ceil(n_pes.max(1) as usize);
    let csr = build_csr_local(input, &part, me, threads);
    let module = pe.build_module("bfs.cu", &source())?;
    let load = |name: &str| module.load_function(name).with_context(|| format!("kernel {name}"));
    // bfs::run refused -direction hybrid with -variant inter-kernel.
    let hybrid = args.direction() == Direction::Hybrid;
    let persistent = load("bfs_persistent")?;
    let hybrid_k = load("bfs_persistent_hybrid")?;
    // The grid of the kernel that runs (the hybrid one may hold more registers).
    let max = max_coresident(&pe, if hybrid { &hybrid_k } else { &persistent }, THREADS)?;
    let queues = pe.handle().0.n_queues;
    ensure!(
        n_pes.max(1) as u32 <= queues || variant == Variant::InterKernel,
        "bfs needs a command queue per sending block ({} of them) and this PE has {queues} (raise CPNET_QUEUES)",
        n_pes
    );
    let k = Kernels {
        persistent,
        hybrid: hybrid_k,
        init: load("bfs_init_k")?,
        expand: load("bfs_expand_k")?,
        expand_big: load("bfs_expand_big_k")?,
        exchange: load("bfs_exchange_k")?,
        receive: load("bfs_receive_k")?,
    };
    let blocks = persistent_grid(max, args.wgs, THREADS)?;
    let mut g = upload(&pe, args, k, &csr, &part, blocks)?;
    let construction = t0.elapsed().as_secs_f64();
    if me == 0 {
        println!(
            "# bfs -variant {}{}: {n_pes} GPU PE(s), {} block(s) of {THREADS} threads per PE, provider {}{}",
            variant.name(),
            if hybrid { format!(" -direction hybrid (alpha {}, beta {})", args.alpha, args.beta) } else { String::new() },
            g.blocks,
            pe.provider(),
            raised.map(|b| format!(", heap raised to {b} bytes")).unwrap_or_default()
        );
    }
    let ok = searches(&mut GpuHostComm(&pe), &csr, &part, input, args, construction, |_, root| g.search(root))?;
    drop(g);
    pe.finalize()?;
    Ok((ok, me))
}

/// The device buffers and heap slots of one PE (**collective**: heap
/// allocations and a barrier).
///
/// # Errors
/// Allocations and copies.
fn upload<'a>(pe: &'a GpuPe, args: &Args, k: Kernels, csr: &Csr, part: &Partition, blocks: u32) -> Result<GpuBfs<'a>> {
    let s = pe.stream();
    let (me, p) = (pe.my_pe(), part.n_pes as u64);
    let nl = csr.n_local();
    let rows = s.clone_htod(&csr.rows).context("copy the CSR rows")?;
    let cols32: Vec<u32> = csr.cols.iter().map(|&v| v as u32).collect();
    let cols = s.clone_htod(&cols32).context("copy the CSR targets")?;
    drop(cols32);
    let level = s.alloc_zeros::<u32>(nl.max(1))?;
    let parent = s.alloc_zeros::<u64>(nl.max(1))?;
    let queue = s.alloc_zeros::<u32>(2 * nl.max(1))?;
    let sent = s.alloc_zeros::<u64>(part.n.div_ceil(64) as usize)?;
    // A vertex is in at most one round's frontier: the big list of a round
    // holds at most every local vertex above the threshold.
    let big_cap = (0..nl).filter(|&i| csr.degree(i) > BIG_DEGREE).count().max(1);
    let big = s.alloc_zeros::<u64>(2 * big_cap)?;
    let state = s.alloc_zeros::<u64>(st::OUT + p as usize)?;
    let ctl = new_ctl(pe)?;
    let slot = slot_words(part);
    let bytes = |words: u64| words * 8;
    let send = pe.shmalloc(bytes(p * slot)).context("bfs send slots (symmetric heap)")?;
    let recv = pe.shmalloc(bytes(2 * p * slot)).context("bfs receive slots (symmetric heap)")?;
    let sig = pe.shmalloc((p * 8).next_multiple_of(64)).context("bfs signals (symmetric heap)")?;
    pe.write_heap(sig, &vec![0u8; (p * 8) as usize])?;
    // Every PE's signals are zero before any PE sends.
    pe.barrier_all()?;
    let params = BfsParams {
        rows: dptr(pe, &rows),
        cols: dptr(pe, &cols),
        level: dptr(pe, &level),
        parent: dptr(pe, &parent),
        queue: dptr(pe, &queue),
        sent: dptr(pe, &sent),
        state: dptr(pe, &state),
        ctl: dptr(pe, &ctl),
        send: pe.dev_ptr(send),
        recv: pe.dev_ptr(recv),
        sig: pe.dev_ptr(sig),
        big: dptr(pe, &big),
        big_cap: big_cap as i64,
        n: part.n as i64,
        nl: nl as i64,
        lo: part.lo(me) as i64,
        block: part.block as i64,
        slot: slot as i64,
        n_pes: p as i64,
        me: i64::from(me),
        alpha: args.alpha,
        beta: args.beta,
        ..BfsParams::default()
    };
    Ok(GpuBfs {
        pe,
        variant: args.g.variant,
        hybrid: args.direction() == Direction::Hybrid,
        k,
        blocks,
        params,
        nl,
        seq0: 0,
        _bufs: Held { _rows: rows, _cols: cols, _queue: queue, _sent: sent, _big: big },
        level,
        parent,
        state,
        ctl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust mirror has as many 8-byte fields as the C struct declares.
    #[test]
    fn params_mirror_the_kernel_struct() {
        let fields = crate::gpu::c_struct_fields(&source(), "bfs_params");
        assert_eq!(size_of::<BfsParams>(), fields * 8);
    }

    /// The kernels compile with NVRTC, without a warning or a non-coherent load.
    #[test]
    fn kernels_compile() {
        crate::gpu::check_kernels_compile("bfs kernels_compile", &source());
    }

    /// A slot holds the header and one pair per vertex of the largest block.
    #[test]
    fn slots_hold_a_whole_block() {
        let part = Partition::new(1 << 20, 3);
        assert_eq!(slot_words(&part), 2 + part.block + COUNT_WORDS);
        // The bitmap of a bottom-up round (header and a bit per vertex)
        // ends before the count words.
        assert!(2 + part.block / 64 <= slot_words(&part) - COUNT_WORDS);
        assert!(heap_bytes(&part) >= 3 * 3 * slot_words(&part) * 8 + 3 * 8);
    }
}
