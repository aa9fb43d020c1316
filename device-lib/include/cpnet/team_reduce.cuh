/*
 * cpnet/team_reduce.cuh -- the reductions of cpnet/team.cuh (OpenSHMEM 1.5
 * §9.9.12): the element operations (exactly team.rs's ReduceType::combine),
 * the rounds through the team scratch's data buffers, the LL rounds between
 * peer-mapped members, the short path, and team_reduce. Part of
 * <cpnet/team.cuh>, which includes it where these build on its helpers
 * (team_get, team_next, the signal and wait steps) and before the typed
 * cpnet_<NAME>_<op>_reduce entry points (included first, it includes
 * <cpnet/team.cuh>, which brings it in at that point).
 */
#ifndef CPNET_TEAM_CUH
/* Included on its own: team.cuh includes this file where it belongs. */
#include <cpnet/team.cuh>
#elif !defined(CPNET_TEAM_REDUCE_CUH)
#define CPNET_TEAM_REDUCE_CUH

namespace cpnet_detail {

/* -- element operations, exactly team.rs's ReduceType::combine ----------- */

template <int N> struct uint_of;
template <> struct uint_of<1> { typedef uint8_t t; };
template <> struct uint_of<2> { typedef unsigned short t; };
template <> struct uint_of<4> { typedef uint32_t t; };
template <> struct uint_of<8> { typedef uint64_t t; };

/** `a op b` for an integer T: wrapping sum and product (computed unsigned,
 *  in at least 32 bits, so that no signed overflow happens), min/max by T's
 *  own order, bitwise and/or/xor. */
template <typename T, int OP>
__device__ __forceinline__ T combine(T a, T b)
{
    typedef typename uint_of<sizeof(T)>::t U;
    typedef typename uint_of<(sizeof(T) < 4 ? 4 : sizeof(T))>::t W;
    if constexpr (OP == RED_AND) return (T)((U)a & (U)b);
    else if constexpr (OP == RED_OR) return (T)((U)a | (U)b);
    else if constexpr (OP == RED_XOR) return (T)((U)a ^ (U)b);
    else if constexpr (OP == RED_MIN) return b < a ? b : a;
    else if constexpr (OP == RED_MAX) return b > a ? b : a;
    else if constexpr (OP == RED_SUM) return (T)(U)((W)(U)a + (W)(U)b);
    else return (T)(U)((W)(U)a * (W)(U)b);
}

/** Floating point (float, double): min/max keep `a` unless `b` compares
 *  strictly less/greater (so -0.0/+0.0 and NaNs fold as team.rs's); sum and
 *  product in the type itself, one rounding each. */
template <typename T, int OP>
__device__ __forceinline__ T combine_float(T a, T b)
{
    static_assert(OP >= RED_MIN, "cpnet: no bitwise reduction of a floating type");
    if constexpr (OP == RED_MIN) return b < a ? b : a;
    else if constexpr (OP == RED_MAX) return b > a ? b : a;
    else if constexpr (OP == RED_SUM) return __fadd_rn(a, b);
    else return __fmul_rn(a, b);
}
template <>
__device__ __forceinline__ double combine_float<double, RED_SUM>(double a, double b) { return __dadd_rn(a, b); }
template <>
__device__ __forceinline__ double combine_float<double, RED_PROD>(double a, double b) { return __dmul_rn(a, b); }

template <int OP>
__device__ __forceinline__ float combine_f32(float a, float b)
{
    return combine_float<float, OP>(a, b);
}

template <typename T, int OP> struct combiner {
    __device__ __forceinline__ static T apply(T a, T b) { return combine<T, OP>(a, b); }
};
template <int OP> struct combiner<float, OP> {
    __device__ __forceinline__ static float apply(float a, float b) { return combine_float<float, OP>(a, b); }
};
template <int OP> struct combiner<double, OP> {
    __device__ __forceinline__ static double apply(double a, double b) { return combine_float<double, OP>(a, b); }
};
/* half, bfloat16: in float, rounded once (see cpnet_half_t). min/max keep
 * the original bits. One body over the type's two conversions. */
template <typename H, float (*TO)(H), H (*FROM)(float), int OP> struct combiner_f16 {
    __device__ __forceinline__ static H apply(H a, H b)
    {
        const float x = TO(a), y = TO(b);
        if constexpr (OP == RED_MIN) return y < x ? b : a;
        else if constexpr (OP == RED_MAX) return y > x ? b : a;
        else return FROM(combine_f32<OP>(x, y));
    }
};
template <int OP>
struct combiner<cpnet_half_t, OP> : combiner_f16<cpnet_half_t, cpnet_half_to_float, cpnet_float_to_half, OP> {};
template <int OP>
struct combiner<cpnet_bfloat16_t, OP>
    : combiner_f16<cpnet_bfloat16_t, cpnet_bfloat16_to_float, cpnet_float_to_bfloat16, OP> {};

/** Fold the `n` elements of every member's slot of buffer `buf`, in team
 *  order, into `dest` (collective). Each thread takes CPNET_TEAM_FOLD_UNROLL
 *  elements (i, i + nt, ...) at a time, loading them from one slot
 *  together, so that several loads are in flight instead of one. */
#ifndef CPNET_TEAM_FOLD_UNROLL
#define CPNET_TEAM_FOLD_UNROLL 4
#endif
template <typename T, int OP>
__device__ __forceinline__ void team_fold(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t buf, T* dest,
                                          uint64_t n, const T* own = nullptr)
{
    constexpr int U = CPNET_TEAM_FOLD_UNROLL;
    const uint64_t nt = (uint64_t)blockDim.x * blockDim.y * blockDim.z;
    const T* const slots = (const T*)team_data(ctx, d, buf, 0);
    const uint64_t stride = d.chunk / sizeof(T); /* elements between two senders' slots */
    /* Member j's elements: its slot, or `own` (this PE's source, not
     * copied into its slot) for this PE. */
    auto from = [&](int j) { return own != nullptr && j == d.my_idx ? own : slots + (uint64_t)j * stride; };
    const T* s0 = from(0);
    for (uint64_t i = thread_rank(); i < n; i += U * nt) {
        T acc[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * nt < n) acc[u] = s0[i + u * nt];
        for (int j = 1; j < d.size; ++j) {
            const T* sj = from(j);
            T x[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i + u * nt < n) x[u] = sj[i + u * nt];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (i + u * nt < n) acc[u] = combiner<T, OP>::apply(acc[u], x[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * nt < n) dest[i + u * nt] = acc[u];
    }
}

/** cpnet_quiet, not inlined (the collectives' common end). */
__device__ __noinline__ inline int team_quiet(cpnet_ctx_t* ctx) { return cpnet_quiet(ctx); }

/** cpnet_quiet after team_fence_threads with no peer-to-peer store since
 *  (a reduction's end: its fold writes only local memory): the leader's
 *  part only (drain the queue if used, else the remembered failure). */
__device__ __noinline__ inline int team_quiet_fenced(cpnet_ctx_t* ctx)
{
    return collective(ctx, [&]() -> int { return quiet_leader(ctx); });
}

/** Above this many bytes per member a reduction round takes the signal
 *  protocol even where LL words fit: an LL word carries 4 data bytes in an
 *  8-byte store, so LL moves twice the bytes in single stores. Measured on
 *  two H200s over NVLink, 128 threads, reduce to all (session 17): LL 3.0-3.8
 *  µs against 5.0-5.1 from 8 B to 1 KiB, 8.8 against 5.9 µs at 4 KiB. */
#define CPNET_TEAM_LL_MAX_BYTES 1024ull

/** Largest round (bytes per member) a reduction sends as LL words between
 *  peer-mapped members: CPNET_TEAM_LL_MAX_BYTES, or less where an LL slot
 *  (`chunk` bytes, 4 data bytes a word) holds less. */
__device__ __forceinline__ uint64_t team_ll_max(const cpnet_team_desc_t& d)
{
    return d.chunk / 2 < CPNET_TEAM_LL_MAX_BYTES ? d.chunk / 2 : CPNET_TEAM_LL_MAX_BYTES;
}

/**
 * Poll LL word `w` of team PE j's slot `slot` until it carries `flag` (the
 * epoch's low 32 bits), giving up like every team wait: on the abort code
 * or CPNET_E_TIMEOUT, or at once when another thread already failed
 * (`*err`, shared by the polling threads). The first failure is stored in
 * `*err` and, for a timeout, reported with the word's heap offset, the
 * epoch and the word found. Returns CPNET_E_OK or the failure.
 */
__device__ __forceinline__ int team_ll_poll(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, int j, const uint64_t* slot,
                                            uint64_t w, uint32_t flag, int* err)
{
    spin sp(CPNET_TEAM_BACKOFF_MAX_NS);
    for (;;) {
        /* Relaxed, system scope: the word is its own flag (no other data
         * depends on it); a peer's 8-byte store wrote it. */
        const uint64_t v = cpnet_ld_relaxed_sys_u64(slot + w);
        if ((uint32_t)(v >> 32) == flag) return CPNET_E_OK;
        int r = *(volatile int*)err;
        if (r == CPNET_E_OK) r = sp.pause(ctx);
        if (r != CPNET_E_OK) {
            if (atomicCAS(err, CPNET_E_OK, r) == CPNET_E_OK && r == CPNET_E_TIMEOUT)
                report_dev_error(ctx, r, team_world_pe(d, j), heap_offset(ctx, slot + w), flag, v >> 32, CPNET_CMP_EQ);
            return r;
        }
    }
}

/**
 * Wait until every LL sender's slot of buffer `buf` holds `words` words of
 * epoch `e` (collective): each thread polls its own words (a word is either
 * old or whole: one 8-byte store wrote it), giving up like every team wait
 * (abort code, CPNET_E_TIMEOUT reported with the word's heap offset, the
 * epoch and the word found). Ends with a block barrier.
 */
__device__ __noinline__ inline int team_ll_wait(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t buf, uint64_t e,
                                                uint64_t words)
{
    __shared__ int ll_err;
    if (is_leader()) ll_err = CPNET_E_OK;
    __syncthreads();
    const uint32_t flag = (uint32_t)e;
    const uint64_t nt = (uint64_t)blockDim.x * blockDim.y * blockDim.z;
    for (int j = 0; j < d.size; ++j) {
        if (team_p2p(ctx, d, j) == 0) continue;
        const uint64_t* slot = team_ll(ctx, d, buf, j);
        for (uint64_t w = thread_rank(); w < words; w += nt) team_ll_poll(ctx, d, j, slot, w, flag, &ll_err);
    }
    __syncthreads();
    const int r = ll_err;
    if (r != CPNET_E_OK && is_leader()) note_error(ctx, r);
    return r;
}

/**
 * One round of a reduction of at most team_ll_max(d) bytes: as
 * team_reduce_round, except that to a peer-mapped member the block stores
 * its slot as LL words straight into that member's LL slot for this PE
 * (no separate signal, no fence before it); members reached through the
 * queue get the put-with-signal and the fenced wait of team_reduce_round.
 * Then every thread polls the LL senders' words (team_ll_wait).
 */
__device__ __noinline__ inline int team_reduce_round_ll(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d,
                                                        const void* source, uint64_t bytes, uint64_t* buf)
{
    const uint64_t eb = team_next(ctx, d, true);
    const uint64_t e = eb >> 1;
    *buf = eb & 1;
    uint8_t* const mine = team_data(ctx, d, *buf, d.my_idx);
    team_local_copy(mine, source, bytes);
    /* Waits for commands a cpnet_fence ordered before these stores, and a
     * block barrier: the copy into `mine` is visible to every thread. */
    const int entered = p2p_enter(ctx);
    if (entered != CPNET_E_OK) return p2p_leave(ctx, entered);
    const uint64_t words = team_ll_words(bytes);
    const uint32_t* const src = (const uint32_t*)mine; /* 64-byte aligned; past `bytes`: unread padding */
    const uint64_t to_off = heap_offset(ctx, team_ll(ctx, d, *buf, d.my_idx));
    uint64_t* const sig_me = team_sig(ctx, d, d.my_idx);
    bool queued = false;
    for (int k = 1; k < d.size; ++k) {
        const int j = (d.my_idx + k) % d.size;
        const uint64_t base = team_p2p(ctx, d, j); /* the same in every thread */
        if (base != 0) {
            uint64_t* const to = (uint64_t*)(base + to_off);
            for (uint64_t w = thread_rank(); w < words; w += (uint64_t)blockDim.x * blockDim.y * blockDim.z)
                cpnet_st_relaxed_sys_u64(to + w, team_ll_word(src[w], e));
        } else {
            cpnet_putmem_signal_nbi(ctx, mine, mine, bytes, sig_me, e, CPNET_SIGNAL_SET, team_world_pe(d, j));
            queued = true;
        }
    }
    if (queued) {
        /* The queue path's round as in team_reduce_round: fence, then the
         * waits for those members' signals. */
        team_fence_threads(ctx);
        const int r = collective(ctx, [&]() -> int {
            team_fence_leader(ctx);
            for (int j = 0; j < d.size; ++j) {
                if (j == d.my_idx || team_p2p(ctx, d, j) != 0) continue;
                const int w = team_wait_leader(ctx, team_sig(ctx, d, j), e);
                if (w != CPNET_E_OK) return w;
            }
            return CPNET_E_OK;
        });
        if (r != CPNET_E_OK) return r;
    }
    return team_ll_wait(ctx, d, *buf, e, words);
}

/** Element i (of T) of sender j's round in buffer `buf`: from its LL slot
 *  where j is peer-mapped (4 data bytes a word; an 8-byte element is two
 *  words), else from its data slot. Loads through L2: peers wrote them. */
template <typename T>
__device__ __forceinline__ T team_ll_elem(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t buf, int j,
                                          uint64_t i)
{
    typedef typename uint_of<sizeof(T)>::t U;
    U bits;
    if (team_p2p(ctx, d, j) == 0) {
        bits = ((const U*)team_data(ctx, d, buf, j))[i];
    } else {
        const uint64_t* slot = team_ll(ctx, d, buf, j);
        if (sizeof(T) == 8) {
            const uint64_t lo = (uint32_t)cpnet_ld_relaxed_sys_u64(slot + 2 * i);
            const uint64_t hi = (uint32_t)cpnet_ld_relaxed_sys_u64(slot + 2 * i + 1);
            bits = (U)(lo | hi << 32);
        } else {
            const uint64_t b = i * sizeof(T);
            const uint32_t data = (uint32_t)cpnet_ld_relaxed_sys_u64(slot + b / 4);
            bits = (U)(data >> (8 * (b % 4)));
        }
    }
    return from_bits<T>((uint64_t)bits);
}

/** The fold of an LL round (team_fold's order: slot 0 op slot 1 op ...,
 *  so every member computes the same bits), each sender's elements where
 *  team_ll_elem finds them. */
template <typename T, int OP>
__device__ __forceinline__ void team_fold_ll(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t buf, T* dest,
                                             uint64_t n)
{
    const uint64_t nt = (uint64_t)blockDim.x * blockDim.y * blockDim.z;
    for (uint64_t i = thread_rank(); i < n; i += nt) {
        T acc = team_ll_elem<T>(ctx, d, buf, 0, i);
        for (int j = 1; j < d.size; ++j) acc = combiner<T, OP>::apply(acc, team_ll_elem<T>(ctx, d, buf, j, i));
        dest[i] = acc;
    }
}

/** Largest reduction (bytes per member) that takes the short path
 *  (team_reduce_small) where every other member is peer-mapped: one LL
 *  round (so at most team_ll_max too) on the block's first warps, one LL
 *  word per thread, in two block barriers (entry and exit) and two barriers
 *  of those warps, against seven block barriers for the block's LL round
 *  (team_next, p2p_enter, the LL wait's pair, the quiet), whose cost grows
 *  with the block: at 1024 threads an 8-byte reduce took 8.2 us on the
 *  block's round against 4.1 on the short path (two H200s, session 18). 0
 *  turns it off. */
#ifndef CPNET_TEAM_SMALL_MAX_BYTES
#define CPNET_TEAM_SMALL_MAX_BYTES 1024ull
#endif

/** Threads of a short round of `words` LL words: one word each, in whole
 *  warps from thread rank 0 (warps are formed from linear thread ranks), at
 *  most the block's whole warps (a word then takes several turns); the
 *  whole block when it has fewer than 32 threads. The same in every thread. */
__device__ __forceinline__ uint32_t team_small_threads(uint64_t words)
{
    const uint32_t nt = blockDim.x * blockDim.y * blockDim.z;
    if (nt < 32) return nt;
    const uint64_t want = (words + 31) / 32 * 32;
    const uint32_t whole = nt / 32 * 32;
    return want < whole ? (uint32_t)want : whole;
}

/** Barrier of the first `p` threads (team_small_threads), ordering their
 *  memory accesses as __syncthreads does: their warp's __syncwarp for one
 *  warp or less, else named barrier 1 for p threads (barrier 0 is
 *  __syncthreads'; the block's other threads wait at the collective's exit
 *  barrier meanwhile, so no other use of barrier 1 can run in this block). */
__device__ __forceinline__ void team_small_sync(uint32_t p)
{
    if (p <= 32) __syncwarp(p == 32 ? 0xffffffffu : (1u << p) - 1u);
    else asm volatile("bar.sync 1, %0;" ::"r"(p) : "memory");
}

/** Every member of `team` (entry `d`) but this PE is peer-mapped: a round
 *  is LL words only (the same answer on every member, the peer table being
 *  symmetric). The world team's answer is the context's
 *  (cpnet_ctx_t.world_all_p2p, taken at create). */
__device__ __forceinline__ bool team_all_p2p(const cpnet_ctx_t* ctx, cpnet_team_t team, const cpnet_team_desc_t& d)
{
    if (team == CPNET_TEAM_WORLD && ctx->world_ok != 0) return ctx->world_all_p2p != 0;
    for (int j = 0; j < d.size; ++j)
        if (j != d.my_idx && team_p2p(ctx, d, j) == 0) return false;
    return true;
}

/** Data word w of an LL round: bytes 4w..4w+3 of `source` (`bytes` long),
 *  zero past its end; one 4-byte load where aligned. */
__device__ __forceinline__ uint32_t team_src_word(const void* source, uint64_t bytes, uint64_t w)
{
    const uint8_t* s = (const uint8_t*)source;
    const uint64_t b = 4 * w;
    if (((uint64_t)s & 3) == 0 && b + 4 <= bytes) return *(const uint32_t*)(s + b);
    uint32_t v = 0;
    for (uint64_t k = 0; k < 4; ++k)
        if (b + k < bytes) v |= (uint32_t)s[b + k] << (8 * k);
    return v;
}

/**
 * The untyped part of a short reduction round (team_reduce_small), up to
 * the fold. Collective over the block: an entry block barrier (the block's
 * writes of `source` come first), then on the first `p` threads only
 * (team_small_threads of the round's words, `*p` in every thread): thread 0
 * takes the epoch and buffer (`*buf`) and, after a cpnet_fence with commands
 * queued, waits for them (p2p_enter's part); the threads pack the `bytes` of
 * `source` into LL words for every other member (all peer-mapped), one word
 * each, then poll those members' words of this epoch. Returns, the same in
 * each of the p threads: CPNET_E_OK, the fence's failure, or the wait's
 * (abort code, CPNET_E_TIMEOUT reported as team_ll_wait does); the other
 * threads get CPNET_E_OK and nothing else. Not inlined and not typed: every
 * reduction shares it, and so do the short fcollect and alltoall
 * (team_small_blocks), which send member j the bytes at `source + j *
 * src_stride` (0: the same bytes to everyone).
 */
__device__ __noinline__ inline int team_small_round(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, const void* source,
                                                    uint64_t bytes, uint64_t* buf, uint32_t* p, uint64_t src_stride = 0)
{
    __shared__ int small_err;
    __shared__ uint64_t small_eb;
    const uint64_t words = team_ll_words(bytes);
    const uint32_t np = team_small_threads(words);
    *p = np;
    __syncthreads();
    const uint32_t t = thread_rank();
    if (t >= np) return CPNET_E_OK;
    /* The next member's heap base, loaded while thread 0 takes the epoch
     * (with two members the only one: its latency overlaps the epoch's). */
    const int j1 = (d.my_idx + 1) % d.size;
    const uint64_t base1 = team_p2p(ctx, d, j1);
    if (t == 0) {
        small_eb = team_next_leader(ctx, d, true);
        small_err = fence_wait_leader(ctx);
    }
    /* Thread 0's writes (small_err, small_eb, the epoch words) before the
     * others read them. */
    team_small_sync(np);
    const uint64_t eb = small_eb;
    *buf = eb & 1;
    int r = *(volatile int*)&small_err;
    if (r != CPNET_E_OK) return r;
    const uint64_t e = eb >> 1;
    const uint64_t to_off = heap_offset(ctx, team_ll(ctx, d, *buf, d.my_idx));
    for (int k = 1; k < d.size; ++k) {
        const int j = (d.my_idx + k) % d.size;
        uint64_t* const to = (uint64_t*)((k == 1 ? base1 : team_p2p(ctx, d, j)) + to_off);
        const void* const from = (const uint8_t*)source + (uint64_t)j * src_stride;
        for (uint64_t w = t; w < words; w += np)
            cpnet_st_relaxed_sys_u64(to + w, team_ll_word(team_src_word(from, bytes, w), e));
    }
    const uint32_t flag = (uint32_t)e;
    for (int j = 0; j < d.size; ++j) {
        if (j == d.my_idx) continue;
        const uint64_t* slot = team_ll(ctx, d, *buf, j);
        int x = CPNET_E_OK;
        for (uint64_t w = t; w < words && x == CPNET_E_OK; w += np)
            x = team_ll_poll(ctx, d, j, slot, w, flag, &small_err);
    }
    /* Every thread's polls and small_err before the fold reads the words
     * (as team_ll_wait's barrier), and the threads agree on the outcome. */
    team_small_sync(np);
    return *(volatile int*)&small_err;
}

/** The end of a short reduction (collective over the block): the leader
 *  records a failure `r` or, on success, quiets (only the queue's part: LL
 *  words need no fence); then a block barrier, after which dest and the
 *  result are visible to every thread and `source` may be rewritten.
 *  Returns the result to every thread. */
__device__ __noinline__ inline int team_small_finish(cpnet_ctx_t* ctx, int r)
{
    if (is_leader()) {
        note_error(ctx, r);
        if (r == CPNET_E_OK) r = quiet_leader(ctx);
        ctx->ret = r;
    }
    __syncthreads();
    return ctx->ret;
}

/**
 * A reduction of n elements (n * sizeof(T) <= CPNET_TEAM_SMALL_MAX_BYTES and
 * team_ll_max(d)) over a team whose other members are all peer-mapped, on
 * the block's first warps (collective over the block): team_small_round,
 * the fold on its threads (team_fold_ll's order, this PE's own part read
 * from `source`, so nothing is copied into its slot), team_small_finish.
 * The protocol, epochs, buffers and words are those of
 * team_reduce_round_ll, so a member on this path pairs with one on the
 * block's: the choice depends only on n, the chunk and the symmetric peer
 * table. `dest` may equal `source`: each element is read and written by one
 * thread, after every LL word went out.
 */
template <typename T, int OP>
__device__ __forceinline__ int team_reduce_small(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, T* dest,
                                                 const T* source, uint64_t n)
{
    uint64_t buf = 0;
    uint32_t np = 0;
    const int r = team_small_round(ctx, d, source, n * sizeof(T), &buf, &np);
    if (r == CPNET_E_OK && thread_rank() < np) {
        for (uint64_t i = thread_rank(); i < n; i += np) {
            T acc = d.my_idx == 0 ? source[i] : team_ll_elem<T>(ctx, d, buf, 0, i);
            for (int j = 1; j < d.size; ++j)
                acc = combiner<T, OP>::apply(acc, j == d.my_idx ? source[i] : team_ll_elem<T>(ctx, d, buf, j, i));
            dest[i] = acc;
        }
    }
    return team_small_finish(ctx, r);
}

/** Largest fcollect and alltoall block (bytes per member pair) that takes
 *  the short path (team_small_blocks) where every other member is
 *  peer-mapped: LL words on the block's first warps, as the short
 *  reduction. 0 turns it off. */
#ifndef CPNET_TEAM_SMALL_BLOCK_MAX_BYTES
#define CPNET_TEAM_SMALL_BLOCK_MAX_BYTES 1024ull
#endif

/** Whether a `bytes` block per member pair on `d` takes the short path:
 *  the same answer on every member (the same bytes, chunk and symmetric
 *  peer table). */
__device__ __forceinline__ bool team_small_blocks_fit(const cpnet_ctx_t* ctx, cpnet_team_t team,
                                                      const cpnet_team_desc_t& d, uint64_t bytes)
{
    return bytes > 0 && bytes <= CPNET_TEAM_SMALL_BLOCK_MAX_BYTES && bytes <= team_ll_max(d) && d.size > 1 &&
           team_all_p2p(ctx, team, d);
}

/**
 * fcollect (`src_stride` 0) or alltoall (`src_stride` = `bytes`) of
 * `bytes` per member pair over a team whose other members are all
 * peer-mapped (team_small_blocks_fit), collective over the block: one short
 * round (team_small_round: member j gets the bytes at source + j *
 * src_stride as LL words in its LL slot for this PE, this PE polls every
 * other member's), then the same threads unpack member j's words into
 * `dest + j * bytes` and copy this PE's own block, and team_small_finish.
 * The LL words never reach `dest` itself, so a member's block is complete
 * when the call returns. Buffers and epochs are the reductions' (a round
 * each), whose argument covers reuse: member j writes a buffer again two
 * rounds later, after this PE's next round reached it, sent after this PE
 * unpacked. Unlike the signal path it sends no data put into the peer's
 * `dest` and no signal.
 */
__device__ __noinline__ inline int team_small_blocks(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, void* dest,
                                                     const void* source, uint64_t bytes, uint64_t src_stride)
{
    uint64_t buf = 0;
    uint32_t np = 0;
    const int r = team_small_round(ctx, d, source, bytes, &buf, &np, src_stride);
    const uint32_t t = thread_rank();
    if (r == CPNET_E_OK && t < np) {
        const uint64_t words = team_ll_words(bytes);
        for (int j = 0; j < d.size; ++j) {
            uint8_t* const to = (uint8_t*)dest + (uint64_t)j * bytes;
            if (j == d.my_idx) {
                const uint8_t* const from = (const uint8_t*)source + (uint64_t)j * src_stride;
                for (uint64_t b = t; b < bytes; b += np) to[b] = from[b];
                continue;
            }
            const uint64_t* const slot = team_ll(ctx, d, buf, j);
            for (uint64_t w = t; w < words; w += np) {
                /* This thread polled word w of every sender in the round. */
                const uint32_t v = (uint32_t)cpnet_ld_relaxed_sys_u64(slot + w);
                const uint64_t b = 4 * w;
                if (((uint64_t)to & 3) == 0 && b + 4 <= bytes) {
                    *(uint32_t*)(to + b) = v;
                } else {
                    for (uint64_t k = 0; k < 4 && b + k < bytes; ++k) to[b + k] = (uint8_t)(v >> (8 * k));
                }
            }
        }
    }
    return team_small_finish(ctx, r);
}

/** One round of a reduction up to the fold (team.rs reduce): take the
 *  epoch and the buffer (returned in `*buf`), copy `bytes` of `source` into
 *  this PE's slot, put the slot into the same slot of every other member
 *  (signal SIG[me] = epoch), fence, wait for every other member's slot.
 *  Not inlined and not typed: every reduction shares it. */
__device__ __noinline__ inline int team_reduce_round(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, const void* source,
                                                     uint64_t bytes, uint64_t* buf, bool direct = false)
{
    const uint64_t eb = team_next(ctx, d, true);
    const uint64_t e = eb >> 1;
    *buf = eb & 1;
    uint8_t* const mine = team_data(ctx, d, *buf, d.my_idx);
    /* `direct` (every other member peer-mapped): the block's stores read
     * `source` itself and are done when the puts return, so the fold can
     * read this PE's part from `source` and `dest` may still be `source`;
     * through the queue the proxy reads the slot later, so the part is
     * copied there first. */
    if (!direct) team_local_copy(mine, source, bytes);
    const void* const from = direct ? source : (const void*)mine;
    uint64_t* const sig_me = team_sig(ctx, d, d.my_idx);
    for (int k = 1; k < d.size; ++k) {
        const int j = (d.my_idx + k) % d.size;
        cpnet_putmem_signal_nbi(ctx, mine, from, bytes, sig_me, e, CPNET_SIGNAL_SET, team_world_pe(d, j));
    }
    /* The fence (cpnet_fence: every thread's own fence of its p2p stores,
     * then the leader's part), then the waits, in one barrier pair. A
     * direct round skips the threads' fences: every put went by the
     * block's stores with a SET signal, which the leader stored with
     * st.release.sys after p2p_put_signal's block barrier, cumulative over
     * every thread's stores (the argument of team_sync's quiet, team.cuh);
     * the reduction's closing team_quiet_fenced rests on those releases. */
    if (!direct) team_fence_threads(ctx);
    return team_wait_all(ctx, d, e, true);
}

/** Whether a signal round of `bytes` from `source` on a team whose other
 *  members are all peer-mapped goes entirely by the block's own stores
 *  (p2p_remote's local conditions for its puts, p2p_local_ok), so that
 *  team_reduce_round may send `source` itself (`direct`). */
__device__ __forceinline__ bool team_round_direct(const cpnet_ctx_t* ctx, const void* source, uint64_t bytes)
{
    return p2p_local_ok(ctx, source, bytes);
}

/** Reduce to all (team.rs reduce): rounds of team_reduce_round, each
 *  followed by the fold of its buffer; quiet at the end. */
template <typename T, int OP>
__device__ __forceinline__ int team_reduce(cpnet_ctx_t* ctx, cpnet_team_t team, T* dest, const T* source,
                                           uint64_t nreduce)
{
    cpnet_team_desc_t d;
    const int bad = team_get(ctx, team, &d);
    if (bad != CPNET_E_OK) return team_fail(ctx, bad);
    /* The same choice on every member: the same size and chunk, a symmetric
     * peer table. */
    const bool all_p2p = team_all_p2p(ctx, team, d);
    if (nreduce <= CPNET_TEAM_SMALL_MAX_BYTES / sizeof(T) && nreduce * sizeof(T) <= team_ll_max(d) && all_p2p)
        return team_reduce_small<T, OP>(ctx, d, dest, source, nreduce);
    const uint64_t per_round = d.chunk / sizeof(T);
    uint64_t done = 0;
    /* One round even for nreduce == 0: every member takes the same epochs. */
    for (;;) {
        const uint64_t n = per_round < nreduce - done ? per_round : nreduce - done;
        uint64_t buf = 0;
        /* The same choice on every member: the same n, the same chunk. */
        const bool ll = n * sizeof(T) <= team_ll_max(d);
        /* This PE's choice alone (the others see the same data either
         * way): every put of the round is the block's own stores. */
        const bool direct = !ll && all_p2p && team_round_direct(ctx, source + done, n * sizeof(T));
        const int r = ll ? team_reduce_round_ll(ctx, d, source + done, n * sizeof(T), &buf)
                         : team_reduce_round(ctx, d, source + done, n * sizeof(T), &buf, direct);
        if (r != CPNET_E_OK) return r;
        if (n > 0) {
            if (ll) team_fold_ll<T, OP>(ctx, d, buf, dest + done, n);
            else team_fold<T, OP>(ctx, d, buf, dest + done, n, direct ? source + done : nullptr);
        }
        done += n;
        if (done >= nreduce) break;
    }
    /* The quiet: every thread fenced its p2p stores in the last round, or
     * (direct) the leader's signals released them. */
    return team_quiet_fenced(ctx);
}

} /* namespace cpnet_detail */

#endif /* CPNET_TEAM_CUH, CPNET_TEAM_REDUCE_CUH */
