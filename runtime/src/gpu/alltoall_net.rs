//! The on-stream alltoall of large blocks over the network path (issue
//! 22): where some member's heap is not mapped here (the grid form of
//! `alltoall_grid.rs` cannot store into it), [`GpuPe::team_alltoall_on_stream`]
//! of at least [`NET_MIN_BYTES`] per pair launches one block per proxy
//! service thread (`CPNET_PROXY_THREADS`, at most [`NET_MAX_BLOCKS`]), each
//! with a context of its own. Contexts take different queues, served by
//! different proxy threads, so the pairs' data moves through every
//! thread's copy streams and endpoint at once. One block's puts are one
//! thread's: over `net` (tcp) on two H200s, 16 MiB per pair took 7226 µs
//! on the one-block form and 2453 on this one, against NCCL's 7516 over
//! sockets (docs/results.md, "Session 23").
//!
//! Not over `shm` with staging zones (`CPNET_STAGE_SHARED`, the default
//! there): a thread's puts through a zone already reach 36 GB/s a direction
//! in slots of 1 MiB, and the extra contexts, quiets and signal round cost
//! more than they gain (4 MiB per pair 194-199 µs against 155-170 on one
//! block, same call).
//!
//! The protocol keeps `cpnet_alltoallmem`'s signals (team.cuh,
//! `team_blocks_to_all`), so a member on this form and one on the
//! one-block form pair up:
//!
//! 1. every block opens a context and checks the team; block 0 takes the
//!    team's next epoch `e` (no entry epoch, as the other forms);
//! 2. block `b` puts part `b` of every pair (`part` bytes at `b x part`)
//!    to its member with `putmem_nbi`, copies part `b` of its own pair
//!    locally, quiets (its puts are in the targets' memory) and counts
//!    itself in `done`; a block that got no queue marks itself in the
//!    launch's `missing` mask instead, and block 0 moves its part;
//! 3. block 0 waits for the count, moves the missing parts and quiets,
//!    SETs `SIG[my_idx] = e` at every other member (after every block's
//!    quiet: the data is in place first), waits for every member's
//!    `SIG[j] >= e`, and closes its context.
//!
//! The launch's words (grid.cuh's, zeroed): `missing` (bit b: block b had
//! no queue), `done`, and the first error a block met.
//!
//! Also here: the world team of a job of two through the pair zone
//! (`pair_stage.rs`; [`pair_kernel`], `GpuPe::alltoall_pair`), which
//! `team_alltoall_on_stream_large` tries before the form above: over shm
//! from 64 KiB to 4 MiB per pair, not under graph capture.

use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::CPNET_TEAM_WORLD;
use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaStream, DeviceRepr};

use super::GpuPe;
use super::reduce_net::PAIR_STAGE_MAX_BYTES;
use crate::error::GpuError;
use crate::error::Result;
use crate::team::Team;

/// Bytes per pair from which the alltoall runs on several blocks over the
/// network path.
pub const NET_MIN_BYTES: u64 = 128 << 10;
/// Most blocks (the `missing` mask has 64 bits).
pub const NET_MAX_BLOCKS: u32 = 64;
/// Fewest bytes of a pair per block: a part smaller than this is not worth
/// a context of its own.
pub const NET_BYTES_PER_BLOCK: u64 = 32 << 10;

/// `a2a_net_args` of the kernel, field for field.
#[repr(C)]
#[derive(Clone, Copy)]
struct NetArgs {
    dest: u64,
    source: u64,
    nbytes: u64,
    /// Bytes of each pair per block (a 256-byte multiple).
    part: u64,
    /// The launch's words (`missing`, `done`, error).
    words: u64,
    my_idx: i32,
    size: i32,
}

// SAFETY: repr(C), plain integers laid out as `struct a2a_net_args` of
// kernel() (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for NetArgs {}

const _: () = assert!(size_of::<NetArgs>() == 48);

/// The kernel (compiled once per PE, on first use).
pub(super) fn kernel() -> String {
    r#"#include <cpnet/grid.cuh>
struct a2a_net_args {
    uint64_t dest, source, nbytes, part, words;
    int32_t my_idx, size;
};
static_assert(sizeof(a2a_net_args) == 48, "a2a_net_args: as NetArgs in alltoall_net.rs");

namespace {
/* Part b of every pair: puts to the other members, a local copy of our own. */
__device__ void a2a_net_part(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, const a2a_net_args& a, uint64_t b)
{
    using namespace cpnet_detail;
    const uint64_t lo = b * a.part;
    if (lo >= a.nbytes) return;
    const uint64_t n = (lo + a.part < a.nbytes ? lo + a.part : a.nbytes) - lo;
    uint8_t* const to = (uint8_t*)a.dest + (uint64_t)d.my_idx * a.nbytes + lo;
    for (int k = 1; k < d.size; ++k) {
        const int j = (d.my_idx + k) % d.size;
        cpnet_putmem_nbi(ctx, to, (const uint8_t*)a.source + (uint64_t)j * a.nbytes + lo, n, team_world_pe(d, j));
    }
    team_local_copy(to, (const uint8_t*)a.source + (uint64_t)d.my_idx * a.nbytes + lo, n);
}
}

__device__ __forceinline__ void a2a_net_body(cpnet_handle_t& h, int team, const a2a_net_args& a)
{
    using namespace cpnet_detail;
    __shared__ grid_state st;
    unsigned long long* const words = (unsigned long long*)a.words;
    unsigned long long* const missing = &words[0];
    unsigned long long* const done = &words[1];
    unsigned long long* const first_err = &words[2];
    int e = cpnet_ctx_create(&h, &st.ctx);
    if (e != CPNET_E_OK) {
        if (blockIdx.x != 0) {
            /* No queue for this block: block 0 moves its part. The fence
             * orders the mark before the count, which block 0 acquires. */
            if (threadIdx.x == 0) {
                atomicOr(missing, 1ull << blockIdx.x);
                __threadfence();
                atomicAdd(done, 1ull);
            }
            return;
        }
        grid_fail(&h, nullptr, e);
        return;
    }
    if (threadIdx.x == 0) {
        cpnet_team_desc_t t;
        int r = team_get(&st.ctx, team, &t);
        if (r == CPNET_E_OK && (t.my_idx != a.my_idx || t.size != a.size)) r = CPNET_E_BAD_TEAM;
        st.d = t;
        st.ctx.ret = r;
        if (r == CPNET_E_OK && blockIdx.x == 0) st.epoch = team_next_leader(&st.ctx, t, false) >> 1;
    }
    __syncthreads();
    e = st.ctx.ret;
    if (e == CPNET_E_OK) {
        a2a_net_part(&st.ctx, st.d, a, blockIdx.x);
        e = cpnet_quiet(&st.ctx);
    }
    if (blockIdx.x != 0) {
        if (threadIdx.x == 0) {
            if (e != CPNET_E_OK) atomicCAS(first_err, 0ull, (unsigned long long)(unsigned)e);
            /* This block's local copy and error before the count (the
             * barrier inside the quiet ordered the block's threads); block
             * 0's acquire below pairs with it. Its puts are in the targets'
             * memory already: the quiet returned. */
            grid_arrive(done);
        }
        if (e != CPNET_E_OK) grid_fail(&h, &st.ctx, e);
        cpnet_ctx_destroy(&st.ctx);
        return;
    }
    if (threadIdx.x == 0) {
        const int w = grid_wait_count(&h, done, gridDim.x - 1);
        if (e == CPNET_E_OK) e = w;
        if (e == CPNET_E_OK) e = (int)*first_err;
        st.err = e;
    }
    __syncthreads();
    e = st.err;
    if (e == CPNET_E_OK) {
        const unsigned long long m = *(volatile unsigned long long*)missing;
        if (m != 0) {
            for (unsigned b = 1; b < gridDim.x; ++b)
                if (m & (1ull << b)) a2a_net_part(&st.ctx, st.d, a, b);
            e = cpnet_quiet(&st.ctx);
        }
    }
    if (e == CPNET_E_OK) e = grid_epoch(&st.ctx, st.d, st.epoch);
    if (e != CPNET_E_OK) grid_fail(&h, &st.ctx, e);
    cpnet_ctx_destroy(&st.ctx);
}

extern "C" __global__ void __launch_bounds__(CPNET_GRID_THREADS)
cpnet_alltoall_net(cpnet_handle_t h, int team, a2a_net_args a)
{
    a2a_net_body(h, team, a);
    cpnet_detail::grid_exit((unsigned long long*)a.words);
}
"#
    .to_owned()
}

impl GpuPe {
    /// The alltoall on several blocks over the network path, if it runs
    /// there (at least [`NET_MIN_BYTES`] per pair, a team of two or more
    /// that the peer grid form cannot take, two or more proxy threads, no
    /// staging zones): `Ok(true)` once launched, `Ok(false)` for another
    /// form. Every member decides alike: the provider and tuning are the
    /// job's.
    pub(super) fn alltoall_net(&self, team: &Team, dest: SymAddr, source: SymAddr, nbytes: u64, stream: &CudaStream) -> Result<bool> {
        let d = team.desc();
        let threads = self.core.tuning.gpu_service_threads() as u64;
        if nbytes < NET_MIN_BYTES || d.size < 2 || threads < 2 || self.staging_zones() {
            return Ok(false);
        }
        let blocks = nbytes.div_ceil(NET_BYTES_PER_BLOCK).min(threads).min(u64::from(NET_MAX_BLOCKS));
        let part = nbytes.div_ceil(blocks).div_ceil(256) * 256;
        let f = self.on_stream_built("cpnet_alltoall_net", "cpnet_alltoall_net", kernel)?;
        // SAFETY: kernel() declares cpnet_alltoall_net(cpnet_handle_t, int,
        // a2a_net_args), which NetArgs mirrors (asserted on both sides);
        // `dest` and `source` were checked inside the heap by the caller for
        // n_pes x nbytes, and the kernel reaches them only there (parts end
        // at nbytes) and through puts, whose targets the proxy checks.
        unsafe {
            self.launch_grid(stream, &f, team, blocks as u32, "cuLaunchKernel (network-path alltoall)", |words| NetArgs {
                dest: self.dev_ptr(dest),
                source: self.dev_ptr(source),
                nbytes,
                part,
                words,
                my_idx: d.my_idx,
                size: d.size,
            })
        }?;
        Ok(true)
    }
}

/// Fewest bytes per pair for the alltoall through the pair zone.
pub const PAIR_MIN_BYTES: u64 = 64 << 10;

/// `a2a_pair_args` of [`pair_kernel`], field for field.
#[repr(C)]
#[derive(Clone, Copy)]
struct PairArgs {
    dest: u64,
    source: u64,
    nbytes: u64,
    /// The launch's words (`cpnet/pair.cuh`'s).
    words: u64,
    /// The peer's half this call writes (device address of host memory).
    out: u64,
    /// This PE's half the peer writes (device address of host memory).
    into: u64,
    /// The chunk signals (device address of this PE's words in the reduce
    /// scratch: `Scratch::pair_sigs_at`).
    sigs: u64,
    my_idx: i32,
    /// The plan ([`super::pair_stage::PairPlan`]): chunks and producer
    /// blocks.
    chunks: i32,
    producers: i32,
    _pad: i32,
}

// SAFETY: repr(C), plain integers laid out as `struct a2a_pair_args` of
// pair_kernel() (same fields, same order, no padding on either side).
unsafe impl DeviceRepr for PairArgs {}

const _: () = assert!(size_of::<PairArgs>() == 72);

/// The alltoall of the world team of a job of two through the pair zone
/// (`pair_stage.rs`; `cpnet/pair.cuh`'s `alltoall_staged`): producer blocks
/// write the peer's pair into the peer's half in chunks, block 0 SETs the
/// peer's signal through the proxy per chunk, and consumer blocks copy
/// their run of this PE's own pair, then of the peer's pair out of this
/// PE's half as its chunks arrive. Compiled once per PE, on first use.
pub(super) fn pair_kernel() -> String {
    r#"#include <cpnet/pair.cuh>
struct a2a_pair_args {
    uint64_t dest, source, nbytes, words, out, into, sigs;
    int32_t my_idx, chunks, producers, pad;
};
static_assert(sizeof(a2a_pair_args) == 72, "a2a_pair_args: as PairArgs in alltoall_net.rs");

extern "C" __global__ void __launch_bounds__(CPNET_GRID_THREADS)
cpnet_alltoall_pair(cpnet_handle_t h, int team, a2a_pair_args a)
{
    const cpnet_detail::pair_plan p = {a.nbytes, (uint32_t)a.chunks, (uint32_t)a.producers};
    cpnet_detail::alltoall_staged(&h, team, a.dest, a.source, (unsigned long long*)a.words, a.my_idx, a.into, a.out,
        (uint64_t*)a.sigs, p);
    cpnet_detail::grid_exit((unsigned long long*)a.words);
}
"#
    .to_owned()
}

impl GpuPe {
    /// The alltoall through the pair zone, if it runs (the world team of a
    /// job of two whose PEs both have the pair zone, [`PAIR_MIN_BYTES`] to
    /// [`PAIR_STAGE_MAX_BYTES`] per pair, a stream that is not being
    /// captured into a CUDA graph: the half is chosen when the call is
    /// enqueued, as for the reduce): `Ok(true)` once launched. Every member
    /// decides alike where they capture alike.
    pub(super) fn alltoall_pair(&self, team: &Team, dest: SymAddr, source: SymAddr, nbytes: u64, stream: &CudaStream) -> Result<bool> {
        let d = team.desc();
        let Some(stage) = self.pair_stage.as_ref() else { return Ok(false) };
        if team.id() != CPNET_TEAM_WORLD || d.size != 2 || !(PAIR_MIN_BYTES..=PAIR_STAGE_MAX_BYTES).contains(&nbytes) {
            return Ok(false);
        }
        let status = stream.capture_status().map_err(|source| GpuError::Cuda { what: "cuStreamIsCapturing", source })?;
        if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(false);
        }
        let plan = self.pair_plan(nbytes);
        let f = self.on_stream_built("cpnet_alltoall_pair", "cpnet_alltoall_pair", pair_kernel)?;
        self.scratch_turn(stream, |turn| {
            let k = turn.next();
            // SAFETY: pair_kernel() declares cpnet_alltoall_pair(
            // cpnet_handle_t, int, a2a_pair_args), which PairArgs mirrors
            // (asserted on both sides); `dest` and `source` were checked
            // inside the heap by the caller for 2 x nbytes, `out` and `into`
            // are halves of NET_PAIR_MAX_BYTES >= nbytes of the pair zones,
            // registered host memory that lives as long as the PE, `sigs` is
            // the reduce scratch's chunk signals (the pair zone exists only
            // where the scratch holds them; at most CPNET_PAIR_MAX_CHUNKS
            // words, in the heap), and the kernel reaches them only there
            // (runs end at nbytes; its signals' targets the proxy checks).
            unsafe {
                self.launch_grid(stream, &f, team, plan.blocks, "cuLaunchKernel (the alltoall through the pair zone)", |words| PairArgs {
                    dest: self.dev_ptr(dest),
                    source: self.dev_ptr(source),
                    nbytes,
                    words,
                    out: stage.out_half(k),
                    into: stage.in_half(k),
                    sigs: self.dev_ptr(self.reduce_scratch.pair_sigs_at()),
                    my_idx: d.my_idx,
                    chunks: plan.chunks as i32,
                    producers: plan.producers as i32,
                    _pad: 0,
                })
            }
        })?;
        Ok(true)
    }
}
