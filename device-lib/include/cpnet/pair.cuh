/*
 * cpnet/pair.cuh -- the pair staging's kernels (issue 22; the runtime's
 * side is runtime/src/gpu/pair_stage.rs): the world team of a job of two
 * GPU PEs that share host memory, each PE with two halves of a zone in
 * host memory that the peer maps. A call's kernel writes this PE's array
 * for the peer straight into the peer's half (GPU stores over PCIe), and
 * reads the peer's array from this PE's half with ld.global.cv (the half
 * is rewritten by the peer's GPU between two uses of it, so no cached line
 * may serve a load). The proxy carries only the signals. The runtime's
 * NVRTC kernels (reduce_net.rs's staged form, alltoall_net.rs's
 * cpnet_alltoall_pair) build on it.
 *
 * THE PIPELINE. The array goes in K chunks (pair_plan: whole 256-byte
 * pieces, at most CPNET_PAIR_MAX_CHUNKS) and the blocks of the launch take
 * roles:
 *
 *  - block 0 controls (pair_control): it opens a context and takes the
 *    team's next epoch e. Once every producer counted chunk c, it SETs
 *    chunk c's signal word at the peer to e through the proxy (`sigs`,
 *    CPNET_PAIR_MAX_CHUNKS words of the heap at the same offset on both
 *    PEs: the runtime's reduce scratch, reduce_net.rs's pair_sigs_at).
 *    Once this PE's word c holds e or more as well, it releases chunk c to
 *    the consumers: words[0] = c + 1 (a release store; CPNET_PAIR_FAIL
 *    where it failed). After the last SET it posts the close's quiet;
 *  - blocks 1 .. P produce (pair_produce): chunk after chunk, each writes
 *    its run of the chunk into the peer's half, fences it (fence.sc.sys)
 *    and counts itself in the chunk's byte of words[5]; they never wait;
 *  - blocks P + 1 .. gridDim.x - 1 consume (pair_consume): each waits for
 *    chunk c's release, then folds (the reduce) or copies (the alltoall)
 *    its run of the chunk from this PE's half.
 *
 * So the stores of chunk c + 1 into the peer's half (PCIe writes) overlap
 * the loads of chunk c from this PE's half (PCIe reads), and each signal's
 * round through the two proxies overlaps both; where every block wrote its
 * run and then read it, a call took the sum of the two (session 28). One
 * word per chunk needs no FENCE between the SETs (which cost a round
 * through the proxies where one word took them all, session 29): each word
 * is SET once per call, in any order, and every SET of a call was applied
 * before the call's kernel ended (its close's quiet), so no SET of an
 * earlier call lands after a later call's; epochs only grow, so a word
 * holding an earlier call's epoch never passes a later call's wait. A
 * chunk is released only once this PE's producers counted it too, so an
 * in-place reduce folds into an element only after it went out.
 *
 * THE HALVES. The runtime alternates them call by call (reduce_net.rs's
 * Pairs): the peer writes call k + 2 into a half only after its call k + 1
 * kernel saw every SET of this PE's call k + 1, which this PE sent after
 * its call k kernel -- whose loads of that half -- ended. Both PEs launch the same plan: the same bytes and
 * tuning (pair_stage.rs checks the tuning at init).
 *
 * The launch's words (grid.cuh's, zeroed): words[0] the chunks released,
 * words[1] grid_close's count, words[5] the producers' counts, one byte
 * per chunk.
 */
#ifndef CPNET_PAIR_CUH
#define CPNET_PAIR_CUH

#include <cpnet/grid.cuh>

/* CPNET_PAIR_MAX_CHUNKS and CPNET_PAIR_MAX_PRODUCERS: cmd.h. */
static_assert(8 * CPNET_PAIR_MAX_CHUNKS <= 64 && CPNET_PAIR_MAX_PRODUCERS <= 255,
              "pair.cuh: one count byte per chunk in words[5]");

/** words[0] once block 0 failed: above every count of released chunks. */
#define CPNET_PAIR_FAIL (1ull << 32)

namespace cpnet_detail {

/** A pair call's shape, the same on both PEs. */
struct pair_plan {
    uint64_t nbytes;    /* bytes this PE sends the peer, and receives */
    uint32_t chunks;    /* K: 1 .. CPNET_PAIR_MAX_CHUNKS */
    uint32_t producers; /* P: 1 .. CPNET_PAIR_MAX_PRODUCERS; gridDim.x >= P + 2 */
};

/** Bytes [*lo, *hi) of chunk c: chunks of whole 256-byte pieces, the last
 *  shorter (or empty). */
__device__ __forceinline__ void pair_chunk(const pair_plan& p, uint32_t c, uint64_t* lo, uint64_t* hi)
{
    const uint64_t cb = ((p.nbytes + p.chunks - 1) / p.chunks + 255) / 256 * 256;
    *lo = (uint64_t)c * cb < p.nbytes ? (uint64_t)c * cb : p.nbytes;
    *hi = *lo + cb < p.nbytes ? *lo + cb : p.nbytes;
}

/** A producer block (1 .. P), whole block: for each chunk, its run of
 *  `from` (this PE's array for the peer, in device memory) into `to` (the
 *  peer's half, host memory), then -- after the barrier, thread 0's
 *  fence.sc.sys, cumulative over the block's stores -- its count in the
 *  chunk's byte of words[5], which block 0 acquires. */
__device__ inline void pair_produce(const pair_plan& p, uint8_t* to, const uint8_t* from, unsigned long long* words)
{
    for (uint32_t c = 0; c < p.chunks; ++c) {
        uint64_t clo, chi, lo, hi;
        pair_chunk(p, c, &clo, &chi);
        grid_run(clo, chi, 256, blockIdx.x - 1, p.producers, &lo, &hi);
        if (hi > lo) block_copy(to + lo, from + lo, hi - lo);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system();
            atomicAdd(&words[5], 1ull << (8 * c));
        }
    }
}

/** A consumer block (P + 1 .. gridDim.x - 1), whole block: for each chunk,
 *  wait for its release (words[0] > c; the acquire pairs with block 0's
 *  release store), then `take(lo, hi)` this block's run of the chunk's
 *  bytes, in whole `unit`-byte words (a divisor of 256). Returns false
 *  where block 0 failed (CPNET_PAIR_FAIL) or the job aborted: the block
 *  leaves without grid_close. */
template <typename F>
__device__ inline bool pair_consume(cpnet_handle_t* h, const pair_plan& p, uint64_t unit, unsigned long long* words,
                                    F&& take)
{
    __shared__ int go;
    const uint64_t first = 1 + (uint64_t)p.producers;
    for (uint32_t c = 0; c < p.chunks; ++c) {
        if (threadIdx.x == 0) {
            unsigned polls = 0;
            unsigned long long v;
            int ok = 1;
            while ((v = cpnet_ld_acquire_sys_u64((const uint64_t*)&words[0])) <= c)
                if ((++polls & 1023) == 0 && cpnet_abort_code(h) != CPNET_E_OK) {
                    ok = 0;
                    break;
                }
            go = ok && v < CPNET_PAIR_FAIL;
        }
        __syncthreads();
        if (!go) return false;
        uint64_t clo, chi, lo, hi;
        pair_chunk(p, c, &clo, &chi);
        grid_run(clo, chi, unit, blockIdx.x - first, gridDim.x - first, &lo, &hi);
        if (hi > lo) take(lo, hi);
        /* Every thread read `go` before thread 0 writes it again. */
        __syncthreads();
    }
    return true;
}

/** Block 0, whole block: open (one epoch), then the chunks' SETs and
 *  releases, one thread polling both the producers' counts and this PE's
 *  chunk signals `sigs` (THE PIPELINE). Returns whether it goes on to
 *  grid_close; where not, st->err holds the failure, reported, its context
 *  closed, and words[0] holds CPNET_PAIR_FAIL. A wait past the context's
 *  timeout fails with CPNET_E_TIMEOUT, reported on the chunk's signal word. */
__device__ inline bool pair_control(cpnet_handle_t* h, int team, int my_idx, const pair_plan& p, uint64_t* sigs,
                                    unsigned long long* words, grid_state* st)
{
    if (!grid_open(h, team, my_idx, 2, words, 1, false, st)) {
        if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)&words[0], CPNET_PAIR_FAIL);
        return false;
    }
    cpnet_ctx_t* const ctx = &st->ctx;
    const int r = collective(ctx, [&]() -> int {
        const uint64_t e = st->epoch;
        const int peer = team_world_pe(st->d, 1 - my_idx);
        uint32_t sent = 0, released = 0;
        uint64_t v = 0;
        spin sp(CPNET_TEAM_BACKOFF_MAX_NS);
        while (released < p.chunks) {
            bool moved = false;
            if (sent < p.chunks) {
                /* Acquire: pairs with the producers' fenced counts (their
                 * stores into the peer's half before this SET's command). */
                const unsigned long long n = cpnet_ld_acquire_sys_u64((const uint64_t*)&words[5]);
                while (sent < p.chunks && ((n >> (8 * sent)) & 0xff) == p.producers) {
                    const int s = team_signal_leader(ctx, &sigs[sent], e, peer);
                    if (s != CPNET_E_OK) return s;
                    ++sent;
                    moved = true;
                }
                if (sent == p.chunks) {
                    /* The close's quiet now (grid_quiet_post's leader part):
                     * the SETs complete while the consumers work. */
                    st->q.on = quiet_drains(ctx);
                    if (st->q.on) st->q.posted = drain_post(ctx, CPNET_OP_QUIET, &st->q.upto);
                    st->quiet = 1;
                }
            }
            if (released < sent) {
                /* Acquire: pairs with the proxy's store of the peer's SET,
                 * made after the peer's chunk was in this PE's half. */
                uint32_t upto = released;
                while (upto < sent && (v = cpnet_ld_acquire_sys_u64(&sigs[upto])) >= e) ++upto;
                if (upto > released) {
                    released = upto;
                    /* Release: what this thread acquired (the peer's chunks,
                     * this PE's counts) before the consumers' loads. */
                    cpnet_st_release_gpu_u64((uint64_t*)&words[0], released);
                    moved = true;
                }
            }
            if (moved) {
                sp = spin(CPNET_TEAM_BACKOFF_MAX_NS);
                continue;
            }
            const int w = sp.pause(ctx);
            if (w != CPNET_E_OK) {
                if (w == CPNET_E_TIMEOUT)
                    report_dev_error(ctx, w, ctx->my_pe, heap_offset(ctx, &sigs[released]), e, v, CPNET_CMP_GE);
                return w;
            }
        }
        return CPNET_E_OK;
    });
    if (r == CPNET_E_OK) return true;
    if (threadIdx.x == 0) {
        cpnet_st_release_gpu_u64((uint64_t*)&words[0], CPNET_PAIR_FAIL);
        st->err = r;
    }
    grid_fail(h, ctx, r);
    /* The destroy drains past a posted quiet. */
    cpnet_ctx_destroy(ctx);
    __syncthreads(); /* st->err for every thread */
    return false;
}

/** The reduce to all of the world team of a job of two through the pair
 *  staging (reduce_net.rs's staged form): `n` elements of T from `source`
 *  to `dest` (the same array in place: every element goes out before it
 *  is folded into), `out` the peer's half of this call and `land` this
 *  PE's, `sigs` the chunk signals (pair_control), `p.nbytes` = n x
 *  sizeof(T). Producers send `source`; consumers
 *  fold in team order (member 0's contribution first: this member's from
 *  `source`, the peer's from `land`) into `dest`. Every block of the launch
 *  calls it with the same arguments. Returns, in block 0, CPNET_E_OK or the
 *  failure it also reported; CPNET_E_OK in the others. */
template <typename T, int OP>
__device__ inline int reduce_staged(cpnet_handle_t* h, int team, uint64_t dest, uint64_t source, uint64_t n,
                                    unsigned long long* words, int my_idx, uint64_t land, uint64_t out,
                                    uint64_t* sigs, const pair_plan& p)
{
    __shared__ grid_state st;
    if (blockIdx.x == 0) {
        if (!pair_control(h, team, my_idx, p, sigs, words, &st)) return st.err;
    } else if (blockIdx.x <= p.producers) {
        pair_produce(p, (uint8_t*)out, (const uint8_t*)source, words);
    } else {
        constexpr uint64_t V = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
        const uint64_t q = ((dest | source | land) & 15) == 0 ? V : 1;
        cpnet_reduce_grid_args_t b;
        b.src[my_idx] = source;
        b.src[1 - my_idx] = land;
        b.dst[my_idx] = dest;
        b.my_idx = my_idx;
        b.size = 2;
        const bool ok = pair_consume(h, p, q * sizeof(T), words, [&](uint64_t lo, uint64_t hi) {
            reduce_grid_span<T, OP, true>(b, lo / sizeof(T), hi / sizeof(T), q, 1);
        });
        if (!ok) return CPNET_E_OK;
    }
    return grid_close(h, words, 0, &st, false);
}

/** The alltoall of the world team of a job of two through the pair
 *  staging (alltoall_net.rs's cpnet_alltoall_pair): pairs of `p.nbytes`
 *  bytes, pair j of `source` for member j, pair j of `dest` from member j;
 *  `out` the peer's half of this call and `into` this PE's, `sigs` as
 *  reduce_staged's. Producers send
 *  the peer's pair; consumers copy their run of this PE's own pair first
 *  (a local copy, while the peer's first chunk is on its way), then the
 *  peer's pair out of `into`. Every block calls it with the same arguments;
 *  returns as reduce_staged. */
__device__ inline int alltoall_staged(cpnet_handle_t* h, int team, uint64_t dest, uint64_t source,
                                      unsigned long long* words, int my_idx, uint64_t into, uint64_t out,
                                      uint64_t* sigs, const pair_plan& p)
{
    __shared__ grid_state st;
    const uint64_t me = (uint64_t)my_idx, peer = 1 - me;
    uint8_t* const d = (uint8_t*)dest;
    const uint8_t* const s = (const uint8_t*)source;
    if (blockIdx.x == 0) {
        if (!pair_control(h, team, my_idx, p, sigs, words, &st)) return st.err;
    } else if (blockIdx.x <= p.producers) {
        pair_produce(p, (uint8_t*)out, s + peer * p.nbytes, words);
    } else {
        const uint64_t first = 1 + (uint64_t)p.producers;
        uint64_t lo, hi;
        grid_run(0, p.nbytes, 256, blockIdx.x - first, gridDim.x - first, &lo, &hi);
        if (hi > lo) block_copy(d + me * p.nbytes + lo, s + me * p.nbytes + lo, hi - lo);
        const bool ok = pair_consume(h, p, 256, words, [&](uint64_t lo, uint64_t hi) {
            cpnet_block_copy_cv(d + peer * p.nbytes + lo, (const uint8_t*)into + lo, hi - lo);
        });
        if (!ok) return CPNET_E_OK;
    }
    return grid_close(h, words, 0, &st, false);
}

} /* namespace cpnet_detail */

#endif /* CPNET_PAIR_CUH */
