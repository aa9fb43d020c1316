/*
 * cpnet/team.cuh -- teams (OpenSHMEM 1.5 §9.4) and team collectives (§9.9)
 * for GPU work-groups. Included by <cpnet/device.cuh> (which is all a kernel
 * needs to include); including this file alone works too.
 *
 *     __global__ void k(cpnet_handle_t h, double* x, double* sum)   // x, sum: symmetric
 *     {
 *         __shared__ cpnet_ctx_t ctx;
 *         if (cpnet_ctx_create(&h, &ctx) != CPNET_E_OK) return;
 *         int err = cpnet_double_sum_reduce(&ctx, CPNET_TEAM_WORLD, sum, x, 1000);
 *         err = cpnet_team_barrier(&ctx, CPNET_TEAM_WORLD);
 *         cpnet_ctx_destroy(&ctx);
 *     }
 *
 * RULES
 *
 *  - Every collective here is COLLECTIVE OVER THE WORK-GROUP (every thread of
 *    the block calls it with the same arguments, from converged control flow;
 *    the block's threads move the data) AND COLLECTIVE OVER THE TEAM: ONE
 *    work-group of every member PE (a kernel's block or a CPU work-group,
 *    device-lib/src/cpu/team.rs, which speaks the same protocol) calls the
 *    same collectives on the team in the same order with the same arguments
 *    (`nbytes`, `root`, ...; a mismatch is undefined: detected where a wait
 *    times out, not otherwise). Collectives on one team must not overlap on a
 *    PE (one work-group per PE per team at a time); on different teams they
 *    may.
 *  - `dest` and `source` are symmetric addresses (this PE's heap). A call
 *    returns when this PE's part is done: its `dest` holds the result, its
 *    `source` may be reused, and its puts are complete (each collective ends
 *    with a quiet). It does not wait for the other members to finish; only
 *    cpnet_team_sync and cpnet_team_barrier synchronize. So a `dest` that
 *    others write in a later collective (broadcast, fcollect, collect,
 *    alltoall) may change as soon as they have moved on: read the result,
 *    then cpnet_team_sync before the next such collective (OpenSHMEM 1.5
 *    §9.9: `dest` must be ready to accept the data). A reduction's data
 *    only lands in the team's scratch: its `dest` needs no sync.
 *  - Errors: int CPNET_E_*, the same in every thread. CPNET_E_BAD_TEAM for a
 *    handle that names no team (out of range, a free or destroyed entry, no
 *    team table in the handle) or a team this PE is not a member of;
 *    CPNET_E_NO_QUEUE after a failed cpnet_ctx_create; CPNET_E_BAD_PE for a
 *    root outside the team; then what the puts, quiet and waits return
 *    (CPNET_E_TIMEOUT after handle.wait_timeout_ns when a member does not
 *    arrive, reported in the status block; the abort code). A bad handle or
 *    root is refused before anything is written anywhere.
 *
 * THE PROTOCOL (the same as the CPU work-group's, device-lib/src/cpu/team.rs,
 * on the scratch layout of cmd.h "Teams"; the two are reviewed side by side)
 *
 *  - Every collective takes the team's next epoch e: SEQ + 1, stored back
 *    (only this PE writes SEQ). Data travels as put-with-signal SETting the
 *    receiver's SIG[sender] (or SYNC[k]) to e; a receiver waits until the word
 *    is >= e. Signals only grow; no word is ever reset.
 *  - sync: dissemination, ceil(log2 size) rounds; round k sets SYNC[k] of team
 *    PE (me + 2^k) mod size and waits for its own SYNC[k]. barrier: quiet, sync.
 *  - broadcast: the root copies source to its own dest and puts to every other
 *    member's dest in team order (0, 1, ...), then quiet; the others wait for
 *    SIG[root]. fcollect, alltoall: every member puts its block to every other
 *    member, starting with me + 1 (so not all start with team PE 0), copies
 *    its own block locally, waits for every SIG[j], quiet. collect: the sizes
 *    first (8 bytes each through the data buffers, one ROUND), then the blocks
 *    at their offsets (a second epoch).
 *  - reduce: rounds of at most `chunk` bytes; each round takes an epoch and
 *    ROUND r (buffer r % 2); the member copies its part of source into its
 *    slot of buffer r % 2, puts that slot into the same slot of every other
 *    member, FENCES (so this round's signal cannot overtake the previous
 *    round's data), waits for every SIG[j], and folds the slots in team order
 *    (slot 0 op slot 1 op ... : every member gets the same bits, floating
 *    point included) into dest. Quiet at the end. A buffer is rewritten two
 *    rounds later only after every member's data of the round between
 *    arrived, which each member sent after it had folded the buffer.
 *  - reduce, LL rounds (GPU only): a round of at most team_ll_max bytes (1 KiB) goes
 *    to each member whose heap this block maps (peer stores) as 8-byte
 *    words {4 data bytes, the epoch's low 32 bits} stored straight into
 *    that member's LL slot for this PE, one store per word: no separate
 *    signal and no fence; the receiver's threads each poll their own words
 *    until they carry the epoch, then fold (same order, same bits). Members
 *    reached through the queue get the round as above. Pair by pair, so it
 *    needs the peer table to be symmetric (CPNET_GPU_P2P the same on every
 *    PE); a CPU work-group is never peer-mapped, so it never sees LL words.
 *    Every round sends at least one word, so each still tells every member
 *    the sender got this far.
 *  - reduce, short rounds (GPU only): a reduction that fits one LL round of
 *    at most CPNET_TEAM_SMALL_MAX_BYTES, on a team whose other members are
 *    all peer-mapped, runs that round on the block's first warps only (one
 *    word per thread, their own barrier between the steps) inside one entry
 *    and one exit block barrier: the same words, epochs and buffers, so
 *    members on either form pair up.
 *
 * PATHS: every put goes where cpnet_putmem_signal_nbi sends it: the block's
 * own stores into a peer's heap where cpnet_ptr reaches it (p2p, signal
 * stored with st.release.sys), the queue and the proxy otherwise (IPC copies,
 * the network path). Signal-only puts (sync) and the waits run on the
 * leader thread inside one block barrier pair per step. Waits poll GPU
 * memory with a backoff capped at CPNET_TEAM_BACKOFF_MAX_NS.
 *
 * OpenSHMEM sections are those of OpenSHMEM 1.5 (June 2020), as cited by the
 * CPU work-group's team.rs and runtime/src/team.rs.
 */
#ifndef CPNET_TEAM_CUH
#define CPNET_TEAM_CUH

/* The device API this builds on. device.cuh includes this file at its end,
 * so either include order works (the guards make the inner include empty). */
#include <cpnet/device.cuh>

/** Longest backoff sleep (ns) of a team collective's wait. Its words are in
 *  GPU memory (a poll does not cross PCIe), so the cap is short: a wait ends
 *  at most this long after its signal landed. Define before including. */
#ifndef CPNET_TEAM_BACKOFF_MAX_NS
#define CPNET_TEAM_BACKOFF_MAX_NS CPNET_LOCAL_BACKOFF_MAX_NS
#endif

/* ------------------------------------------------------------------------ */
/* half and bfloat16 for the reductions                                     */
/* ------------------------------------------------------------------------ */

/**
 * IEEE binary16 and bfloat16 as 2-byte bit carriers. NVRTC has no
 * <cuda_fp16.h>/<cuda_bf16.h> of its own (they live in the toolkit's include
 * directory, which cpnet's NVRTC builds do not pass), so the reductions take
 * these; a `__half*` or `__nv_bfloat16*` of code that includes those headers
 * converts with a cast (same size, same bits). Arithmetic is done in float
 * and rounded to nearest even once per operation, which gives the correctly
 * rounded binary16/bfloat16 result (float has more than 2p + 2 bits for
 * both), the same bits as native __hadd/__hmul and as the CPU work-group's
 * `half::f16` / `half::bf16`.
 */
typedef struct cpnet_half {
    unsigned short bits;
} cpnet_half_t;
/** bfloat16: the high half of a float (see cpnet_half_t). */
typedef struct cpnet_bfloat16 {
    unsigned short bits;
} cpnet_bfloat16_t;

/** binary16 -> float (exact). */
__device__ __forceinline__ float cpnet_half_to_float(cpnet_half_t h)
{
    float f;
    const unsigned short b = h.bits;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
    return f;
}
/** float -> binary16, round to nearest even. */
__device__ __forceinline__ cpnet_half_t cpnet_float_to_half(float f)
{
    unsigned short b;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(f));
    cpnet_half_t h;
    h.bits = b;
    return h;
}
/** bfloat16 -> float (exact). */
__device__ __forceinline__ float cpnet_bfloat16_to_float(cpnet_bfloat16_t b)
{
    return __uint_as_float((uint32_t)b.bits << 16);
}
/** float -> bfloat16, round to nearest even; a NaN stays a (quiet) NaN. */
__device__ __forceinline__ cpnet_bfloat16_t cpnet_float_to_bfloat16(float f)
{
    const uint32_t u = __float_as_uint(f);
    cpnet_bfloat16_t b;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        b.bits = (unsigned short)((u >> 16) | 0x40u);
    else
        b.bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return b;
}

/* ------------------------------------------------------------------------ */
/* Type lists of the team collectives (X-macros)                            */
/* ------------------------------------------------------------------------ */

/** OpenSHMEM 1.5 Table 10, bitwise reductions (and, or, xor): X(NAME, TYPE). */
#define CPNET_REDUCE_BITWISE_TYPES(X)                                                           \
    X(uchar, unsigned char) X(ushort, unsigned short) X(uint, unsigned int)                    \
    X(ulong, unsigned long) X(ulonglong, unsigned long long) X(int8, int8_t) X(int16, short)   \
    X(int32, int32_t) X(int64, int64_t) X(uint8, uint8_t) X(uint16, unsigned short)            \
    X(uint32, uint32_t) X(uint64, uint64_t) X(size, cpnet_size_t)

/** OpenSHMEM 1.5 Table 10, comparison and arithmetic reductions (min, max,
 *  sum, prod), without longdouble and the complex types, plus cpnet's half
 *  and bfloat16: X(NAME, TYPE). */
#define CPNET_REDUCE_ARITH_TYPES(X)                                                             \
    X(char, char) X(schar, signed char) X(short, short) X(int, int) X(long, long)              \
    X(longlong, long long) X(ptrdiff, cpnet_ptrdiff_t) X(uchar, unsigned char)                 \
    X(ushort, unsigned short) X(uint, unsigned int) X(ulong, unsigned long)                    \
    X(ulonglong, unsigned long long) X(int8, int8_t) X(int16, short) X(int32, int32_t)         \
    X(int64, int64_t) X(uint8, uint8_t) X(uint16, unsigned short) X(uint32, uint32_t)          \
    X(uint64, uint64_t) X(size, cpnet_size_t) X(float, float) X(double, double)                \
    X(half, cpnet_half_t) X(bfloat16, cpnet_bfloat16_t)

/* ------------------------------------------------------------------------ */
/* Internals                                                                */
/* ------------------------------------------------------------------------ */

namespace cpnet_detail {

/** The reduction operators, in the order of team.rs's ReduceOp (cmd.h's
 *  CPNET_RED_*, their one source). */
enum reduce_op {
    RED_AND = CPNET_RED_AND,
    RED_OR = CPNET_RED_OR,
    RED_XOR = CPNET_RED_XOR,
    RED_MIN = CPNET_RED_MIN,
    RED_MAX = CPNET_RED_MAX,
    RED_SUM = CPNET_RED_SUM,
    RED_PROD = CPNET_RED_PROD
};

/** The team table entry of `team`, or nullptr: no table, out of range, or a
 *  free entry (size 0). Plain loads: the host writes an entry only while no
 *  kernel uses that team (cmd.h, handle.teams). */
__device__ __forceinline__ const cpnet_team_desc_t* team_entry(const cpnet_ctx_t* ctx, cpnet_team_t team)
{
    if (ctx->teams == nullptr || team < 0 || (uint32_t)team >= ctx->n_teams) return nullptr;
    const cpnet_team_desc_t* d = ctx->teams + team;
    return d->size > 0 ? d : nullptr;
}

/** A team usable for a collective by this PE, copied into `*d` (every thread
 *  reads the same entry): CPNET_E_OK; CPNET_E_NO_QUEUE (no context);
 *  CPNET_E_BAD_TEAM: no such team, this PE not a member, or an entry whose
 *  scratch does not fit the heap (nothing is written then). */
__device__ __forceinline__ int team_get(const cpnet_ctx_t* ctx, cpnet_team_t team, cpnet_team_desc_t* d)
{
    if (ctx->ctl == nullptr) return CPNET_E_NO_QUEUE;
    if (team == CPNET_TEAM_WORLD && ctx->world_ok != 0) {
        *d = ctx->world; /* the context's copy (cpnet_ctx_t.world) */
    } else {
        const cpnet_team_desc_t* e = team_entry(ctx, team);
        if (e == nullptr) return CPNET_E_BAD_TEAM;
        *d = *e;
    }
    if (d->my_idx < 0 || d->my_idx >= d->size || d->stride < 1) return CPNET_E_BAD_TEAM;
    const uint64_t n = (uint64_t)d->size;
    const uint64_t end = d->scratch + d->data_off + 4 * n * d->chunk; /* data and LL buffers */
    if (d->chunk < CPNET_TEAM_CHUNK_ALIGN || (d->chunk % CPNET_TEAM_CHUNK_ALIGN) != 0 ||
        d->data_off < CPNET_TEAM_SCR_SIG + 8 * n || end > ctx->heap_size || end < d->scratch)
        return CPNET_E_BAD_TEAM;
    return CPNET_E_OK;
}

/** World PE of team PE `j`. */
__device__ __forceinline__ int team_world_pe(const cpnet_team_desc_t& d, int j) { return d.start + j * d.stride; }

/** The scratch word at `off` (CPNET_TEAM_SCR_*) of this PE. */
__device__ __forceinline__ uint64_t* team_word(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t off)
{
    return (uint64_t*)(ctx->heap_base + d.scratch + off);
}

/** SIG[j]: the signal of team PE j's data for this PE. */
__device__ __forceinline__ uint64_t* team_sig(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, int j)
{
    return team_word(ctx, d, CPNET_TEAM_SCR_SIG + 8 * (uint64_t)j);
}

/** Slot of sender `j` in data buffer `buf`. */
__device__ __forceinline__ uint8_t* team_data(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t buf, int j)
{
    return (uint8_t*)(ctx->heap_base + d.scratch + d.data_off + (buf * (uint64_t)d.size + (uint64_t)j) * d.chunk);
}

/** Slot of sender `j` in LL buffer `buf` (cmd.h "Teams": past the data
 *  buffers; team.rs's TeamDesc::ll). */
__device__ __forceinline__ uint64_t* team_ll(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t buf, int j)
{
    return (uint64_t*)team_data(ctx, d, 2 + buf, j);
}

/** Team PE j's heap as this block reaches it with its own stores, or 0 (the
 *  queue). A reduction round goes LL between two members exactly where this
 *  is non-zero on both sides (the peer table is symmetric: both PEs mapped
 *  each other's heap, with the same CPNET_GPU_P2P on every PE of the job). */
__device__ __forceinline__ uint64_t team_p2p(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, int j)
{
    return j == d.my_idx ? 0 : p2p_base(ctx, team_world_pe(d, j));
}

/** An LL word of epoch `e`: 4 bytes of data (low half) and the epoch's low
 *  32 bits (high half). Epochs start at 1, so a zeroed slot never matches;
 *  an LL buffer holds only LL words of older epochs. */
__device__ __forceinline__ uint64_t team_ll_word(uint32_t data, uint64_t e)
{
    return (uint64_t)data | ((uint64_t)(uint32_t)e << 32);
}

/** Words of an LL slot for `bytes` of data: at least one, so that every
 *  round, an empty one too, tells each receiver the sender got this far
 *  (the buffer reuse argument of cmd.h needs every round's data seen). */
__device__ __forceinline__ uint64_t team_ll_words(uint64_t bytes) { return bytes == 0 ? 1 : (bytes + 3) / 4; }

/** A collective call that only returns `e` (an argument refused before
 *  anything moved): sets ctx->ret like every call, block barriers. */
__device__ __forceinline__ int team_fail(cpnet_ctx_t* ctx, int e)
{
    return collective(ctx, [&]() -> int { return e; });
}

/** The team's next epoch (SEQ + 1, stored back) and, with `round`, its next
 *  data buffer (ROUND % 2, ROUND + 1 stored back): epoch << 1 | buffer.
 *  team_next_leader on one thread; team_next as one collective step that
 *  returns it to every thread. Relaxed: only this PE's work-groups write the
 *  words, one at a time (team.rs's team_epoch). */
__device__ __forceinline__ uint64_t team_next_leader(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, bool round)
{
    uint64_t* seq = team_word(ctx, d, CPNET_TEAM_SCR_SEQ);
    uint64_t* rw = team_word(ctx, d, CPNET_TEAM_SCR_ROUND);
    /* Both loads before either store, so that their latencies overlap (a
     * store after each load waited for that load: two L2 round trips on
     * every collective call). */
    const uint64_t e = cpnet_ld_relaxed_sys_u64(seq) + 1;
    const uint64_t r = round ? cpnet_ld_relaxed_sys_u64(rw) : 0;
    cpnet_st_relaxed_sys_u64(seq, e);
    if (round) cpnet_st_relaxed_sys_u64(rw, r + 1);
    return e << 1 | (r % 2);
}
__device__ __forceinline__ uint64_t team_next(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, bool round)
{
    collective(ctx, [&]() -> int {
        ctx->val = team_next_leader(ctx, d, round);
        return CPNET_E_OK;
    });
    return ctx->val;
}

/** Wait until the local word `w` >= `e` (leader only): wait_until_leader's
 *  protocol (acquire system-scope polls, pairing with the writer's release:
 *  a peer's st.release.sys or the proxy's store after the data) with the
 *  team's backoff cap. Fails with the abort code or CPNET_E_TIMEOUT
 *  (reported: dev_addr = the word's heap offset, dev_expected = e, dev_found
 *  = the last value, dev_cmp = GE). */
__device__ __noinline__ inline int team_wait_leader(cpnet_ctx_t* ctx, const uint64_t* w, uint64_t e)
{
    spin sp(CPNET_TEAM_BACKOFF_MAX_NS);
    for (;;) {
        /* Acquire: pairs with the writer's release (see above). */
        const uint64_t v = cpnet_ld_acquire_sys_u64(w);
        if (v >= e) return CPNET_E_OK;
        const int r = sp.pause(ctx);
        if (r != CPNET_E_OK) {
            if (r == CPNET_E_TIMEOUT) report_dev_error(ctx, r, ctx->my_pe, heap_offset(ctx, w), e, v, CPNET_CMP_GE);
            return r;
        }
    }
}

/** cpnet_fence's leader part (cpnet_fence: a FENCE command through the
 *  queue; with a p2p table a system-scope fence, and the FENCE command
 *  only when commands went into the queue, which the next p2p access then
 *  waits for). The caller has every thread fence.acq_rel.sys its own
 *  peer-to-peer stores first (team_fence_threads), which is what
 *  cpnet_quiet asks of p2p stores too, so the leader does not fence again. */
__device__ __forceinline__ void team_fence_threads(const cpnet_ctx_t* ctx)
{
    if (ctx->peers != nullptr) cpnet_fence_acq_rel_sys();
}
__device__ __forceinline__ void team_fence_leader(cpnet_ctx_t* ctx)
{
    cpnet_cmd_t c = {};
    c.opcode = CPNET_OP_FENCE;
    if (ctx->peers == nullptr) {
        call_nbi(ctx, c);
        return;
    }
    if (ctx->proxy_used) {
        call_nbi(ctx, c);
        ctx->fence_idx = ctx->write_idx;
    }
}

/** Wait for SIG[j] >= e of every member j but this PE (collective; after a
 *  fence when `fence`, in the same block barrier pair): after it every
 *  thread sees the data those signals followed. */
__device__ __forceinline__ int team_wait_all(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t e,
                                             bool fence = false)
{
    return collective(ctx, [&]() -> int {
        if (fence) team_fence_leader(ctx);
        for (int j = 0; j < d.size; ++j) {
            if (j == d.my_idx) continue;
            const int r = team_wait_leader(ctx, team_sig(ctx, d, j), e);
            if (r != CPNET_E_OK) return r;
        }
        return CPNET_E_OK;
    });
}

/** Wait until the local word `w` >= `e` (collective). */
__device__ __forceinline__ int team_wait_one(cpnet_ctx_t* ctx, const uint64_t* w, uint64_t e)
{
    return collective(ctx, [&]() -> int { return team_wait_leader(ctx, w, e); });
}

/** A signal-only put (leader only): SET `word` (a scratch word) of world PE
 *  `pe` to `e`, as cpnet_putmem_signal_nbi(word, word, 0, word, e, SET, pe)
 *  does it: a st.release.sys into the peer's heap on the p2p path (after
 *  waiting for commands a cpnet_fence ordered before it, as p2p_enter), the
 *  queue otherwise (its failure surfaces at quiet). */
__device__ __forceinline__ int team_signal_leader(cpnet_ctx_t* ctx, uint64_t* word, uint64_t e, int pe)
{
    uint8_t* remote = nullptr;
    uint64_t* sig_remote = nullptr;
    if (p2p_put_signal_route(ctx, word, word, 0, word, CPNET_SIGNAL_SET, pe, &remote, &sig_remote)) {
        const int r = fence_wait_leader(ctx);
        if (r != CPNET_E_OK) {
            note_error(ctx, r);
            return r;
        }
        /* Release, cumulative over the block's stores before the caller's
         * barrier; pairs with the target's acquire in team_wait_leader. */
        cpnet_st_release_sys_u64(sig_remote, e);
        return CPNET_E_OK;
    }
    call_nbi(ctx, put_signal_cmd(ctx, word, word, 0, word, e, CPNET_SIGNAL_SET, pe));
    return CPNET_E_OK;
}

/** A sync (team.rs team_sync), after a quiet when `quiet` (team_barrier):
 *  the quiet, the epoch and the dissemination rounds in ONE block barrier
 *  pair. A failed quiet returns before the epoch moves, as team.rs's
 *  barrier.
 *
 *  The quiet's part for the block's peer-to-peer stores (cpnet_quiet fences
 *  in every thread) is the leader's first signal: the entry barrier orders
 *  every thread's earlier stores before it, and the signal is a release at
 *  system scope (st.release.sys on the p2p route, the command's commit on
 *  the queue route), cumulative over them (PTX memory model: a release
 *  orders what precedes it in causality order, bar.sync included). A member
 *  leaves only after it acquired a chain of such releases from every other
 *  member, so it sees their stores, as do PEs it tells later. A separate
 *  fence (per thread, or the leader's) measured 0.5-0.6 µs more per barrier
 *  on two H200s (session 17). A team of one sends nothing: its leader
 *  fences instead. */
__device__ __forceinline__ int team_sync_rounds(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, bool quiet)
{
    return collective(ctx, [&]() -> int {
        if (quiet) {
            if (d.size == 1 && ctx->peers != nullptr) cpnet_fence_acq_rel_sys();
            const int q = quiet_leader(ctx);
            if (q != CPNET_E_OK) return q;
        }
        uint64_t* seq = team_word(ctx, d, CPNET_TEAM_SCR_SEQ);
        const uint64_t e = cpnet_ld_relaxed_sys_u64(seq) + 1; /* as team_next */
        cpnet_st_relaxed_sys_u64(seq, e);
        const int64_t n = d.size;
        for (int k = 0; ((int64_t)1 << k) < n; ++k) {
            uint64_t* word = team_word(ctx, d, CPNET_TEAM_SCR_SYNC + 8 * (uint64_t)k);
            const int partner = (int)(((int64_t)d.my_idx + ((int64_t)1 << k)) % n);
            int r = team_signal_leader(ctx, word, e, team_world_pe(d, partner));
            if (r == CPNET_E_OK) r = team_wait_leader(ctx, word, e);
            if (r != CPNET_E_OK) return r;
        }
        return CPNET_E_OK;
    });
}

/** A local copy by the block (nothing for 0 bytes or dest == source). The
 *  next collective step's entry barrier publishes it to every thread. */
__device__ __forceinline__ void team_local_copy(void* dest, const void* source, uint64_t nbytes)
{
    if (nbytes != 0 && dest != source) block_copy(dest, source, nbytes);
}

/** The body of fcollect, alltoall and collect (team.rs blocks_to_all):
 *  `block(j, &to, &from, &n)` names (where at team PE j, from where here,
 *  bytes) for every member j; each put signals SIG[me] = e at j, in the
 *  order me + 1, me + 2, ...; then this PE's own block by a local copy;
 *  then wait for every other member's signal; quiet. */
template <typename B>
__device__ __forceinline__ int team_blocks_to_all(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t e, B&& block)
{
    const int me = d.my_idx;
    uint64_t* const sig_me = team_sig(ctx, d, me);
    for (int k = 1; k < d.size; ++k) {
        const int j = (me + k) % d.size;
        void* to;
        const void* from;
        uint64_t n;
        block(j, &to, &from, &n);
        cpnet_putmem_signal_nbi(ctx, to, from, n, sig_me, e, CPNET_SIGNAL_SET, team_world_pe(d, j));
    }
    /* The quiet's QUIET now: the targets' ACKs come back while this member
     * copies its own block and waits for the others'. */
    split_quiet q;
    quiet_post(ctx, &q);
    {
        void* to;
        const void* from;
        uint64_t n;
        block(me, &to, &from, &n);
        team_local_copy(to, from, n);
    }
    const int r = team_wait_all(ctx, d, e);
    /* On a failed wait the QUIET stays posted; the next quiet or the
     * context's destroy drains past it. */
    if (r != CPNET_E_OK) return r;
    return quiet_finish(ctx, &q);
}

} /* namespace cpnet_detail */

/* The reductions: cpnet/team_reduce.cuh (element operations, rounds, LL,
 * the short path, team_reduce). */
#include <cpnet/team_reduce.cuh>

namespace cpnet_detail {

/** Broadcast (team.rs broadcastmem). */
__device__ __noinline__ inline int team_broadcast(cpnet_ctx_t* ctx, cpnet_team_t team, void* dest, const void* source,
                                              uint64_t nbytes, int root)
{
    cpnet_team_desc_t d;
    int bad = team_get(ctx, team, &d);
    if (bad == CPNET_E_OK && (root < 0 || root >= d.size)) bad = CPNET_E_BAD_PE;
    if (bad != CPNET_E_OK) return team_fail(ctx, bad);
    const uint64_t e = team_next(ctx, d, false) >> 1;
    uint64_t* const sig = team_sig(ctx, d, root);
    if (d.my_idx != root) return team_wait_one(ctx, sig, e);
    team_local_copy(dest, source, nbytes);
    for (int j = 0; j < d.size; ++j) {
        if (j == d.my_idx) continue;
        cpnet_putmem_signal_nbi(ctx, dest, source, nbytes, sig, e, CPNET_SIGNAL_SET, team_world_pe(d, j));
    }
    return cpnet_quiet(ctx);
}

/** fcollect (team.rs fcollectmem). */
__device__ __noinline__ inline int team_fcollect(cpnet_ctx_t* ctx, cpnet_team_t team, void* dest, const void* source,
                                             uint64_t nbytes)
{
    cpnet_team_desc_t d;
    const int bad = team_get(ctx, team, &d);
    if (bad != CPNET_E_OK) return team_fail(ctx, bad);
    if (team_small_blocks_fit(ctx, team, d, nbytes)) return team_small_blocks(ctx, d, dest, source, nbytes, 0);
    const uint64_t e = team_next(ctx, d, false) >> 1;
    uint8_t* const at = (uint8_t*)dest + (uint64_t)d.my_idx * nbytes;
    return team_blocks_to_all(ctx, d, e, [&](int, void** to, const void** from, uint64_t* n) {
        *to = at;
        *from = source;
        *n = nbytes;
    });
}

/** alltoall (team.rs alltoallmem). */
__device__ __noinline__ inline int team_alltoall(cpnet_ctx_t* ctx, cpnet_team_t team, void* dest, const void* source,
                                             uint64_t nbytes)
{
    cpnet_team_desc_t d;
    const int bad = team_get(ctx, team, &d);
    if (bad != CPNET_E_OK) return team_fail(ctx, bad);
    if (team_small_blocks_fit(ctx, team, d, nbytes)) return team_small_blocks(ctx, d, dest, source, nbytes, nbytes);
    const uint64_t e = team_next(ctx, d, false) >> 1;
    uint8_t* const at = (uint8_t*)dest + (uint64_t)d.my_idx * nbytes;
    return team_blocks_to_all(ctx, d, e, [&](int j, void** to, const void** from, uint64_t* n) {
        *to = at;
        *from = (const uint8_t*)source + (uint64_t)j * nbytes;
        *n = nbytes;
    });
}

/** collect (team.rs collectmem): the sizes through the data buffers, then
 *  the blocks; the total in `*total` (if not null). */
__device__ __noinline__ inline int team_collect(cpnet_ctx_t* ctx, cpnet_team_t team, void* dest, const void* source,
                                            uint64_t nbytes, cpnet_size_t* total)
{
    cpnet_team_desc_t d;
    const int bad = team_get(ctx, team, &d);
    if (bad != CPNET_E_OK) return team_fail(ctx, bad);
    const int me = d.my_idx;
    const uint64_t eb = team_next(ctx, d, true);
    const uint64_t e = eb >> 1, buf = eb & 1;
    uint64_t* const mine = (uint64_t*)team_data(ctx, d, buf, me);
    if (is_leader()) *mine = nbytes; /* published by the first put's entry barrier */
    int r = team_blocks_to_all(ctx, d, e, [&](int, void** to, const void** from, uint64_t* n) {
        *to = mine;
        *from = mine;
        *n = 8;
    });
    if (r != CPNET_E_OK) return r;
    /* Every thread sums the sizes (the same loads, the same result). */
    uint64_t offset = 0, sum = 0;
    for (int j = 0; j < d.size; ++j) {
        const uint64_t s = *(const uint64_t*)team_data(ctx, d, buf, j);
        if (j < me) offset += s;
        sum += s;
    }
    const uint64_t e2 = team_next(ctx, d, false) >> 1;
    uint8_t* const at = (uint8_t*)dest + offset;
    r = team_blocks_to_all(ctx, d, e2, [&](int, void** to, const void** from, uint64_t* n) {
        *to = at;
        *from = source;
        *n = nbytes;
    });
    if (total != nullptr && is_leader()) *total = (cpnet_size_t)sum;
    __syncthreads();
    return r;
}

/** sync (team.rs team_sync); barrier (team.rs team_barrier) when `quiet`. */
__device__ __noinline__ inline int team_sync(cpnet_ctx_t* ctx, cpnet_team_t team, bool quiet)
{
    cpnet_team_desc_t d;
    const int bad = team_get(ctx, team, &d);
    if (bad != CPNET_E_OK) return team_fail(ctx, bad);
    return team_sync_rounds(ctx, d, quiet);
}

} /* namespace cpnet_detail */

/* ======================================================================== */
/* Team queries (OpenSHMEM 1.5 §9.4)                                         */
/* ======================================================================== */

/**
 * This PE's number in `team` (0 <= n < cpnet_team_n_pes), or -1 when `team`
 * names no team or this PE is not a member. OpenSHMEM 1.5 §9.4.5
 * (shmem_team_my_pe). Not collective: any thread, any time after
 * cpnet_ctx_create.
 */
__device__ inline int cpnet_team_my_pe(const cpnet_ctx_t* ctx, cpnet_team_t team)
{
    const cpnet_team_desc_t* d = cpnet_detail::team_entry(ctx, team);
    return d != nullptr && d->my_idx >= 0 && d->my_idx < d->size ? d->my_idx : -1;
}

/**
 * The number of PEs in `team`, or -1 when `team` names no team. OpenSHMEM 1.5
 * §9.4.6 (shmem_team_n_pes). Not collective.
 */
__device__ inline int cpnet_team_n_pes(const cpnet_ctx_t* ctx, cpnet_team_t team)
{
    const cpnet_team_desc_t* d = cpnet_detail::team_entry(ctx, team);
    return d != nullptr ? d->size : -1;
}

/**
 * The number in `dest_team` of the PE that is number `src_pe` in `src_team`,
 * or -1: either team names no team, `src_pe` is outside `src_team`, or that
 * PE is not a member of `dest_team`. OpenSHMEM 1.5 §9.4.8
 * (shmem_team_translate_pe); CPNET_TEAM_WORLD numbers are world PEs. Not
 * collective.
 */
__device__ inline int cpnet_team_translate_pe(const cpnet_ctx_t* ctx, cpnet_team_t src_team, int src_pe,
                                              cpnet_team_t dest_team)
{
    const cpnet_team_desc_t* s = cpnet_detail::team_entry(ctx, src_team);
    const cpnet_team_desc_t* t = cpnet_detail::team_entry(ctx, dest_team);
    if (s == nullptr || t == nullptr || src_pe < 0 || src_pe >= s->size || t->stride < 1) return -1;
    const int64_t world = (int64_t)s->start + (int64_t)src_pe * s->stride;
    const int64_t off = world - t->start;
    if (off < 0 || off % t->stride != 0 || off / t->stride >= t->size) return -1;
    return (int)(off / t->stride);
}

/* ======================================================================== */
/* Team synchronization (OpenSHMEM 1.5 §9.9)                                 */
/* ======================================================================== */

/**
 * Wait until every member of `team` has called it (shmem_team_sync,
 * OpenSHMEM 1.5 §9.9.2, as team.rs cites it). Does NOT complete this PE's
 * earlier puts (cpnet_team_barrier does). Dissemination: ceil(log2 n)
 * signal-and-wait rounds on the scratch's SYNC words, each a single 8-byte
 * store (p2p) or signal-only command.
 *
 * Collective over the work-group and over the team. Returns CPNET_E_OK,
 * CPNET_E_BAD_TEAM, CPNET_E_NO_QUEUE, the abort code or CPNET_E_TIMEOUT (a
 * member did not arrive within handle.wait_timeout_ns). Errors of the queued
 * signals surface at the next quiet.
 */
__device__ inline int cpnet_team_sync(cpnet_ctx_t* ctx, cpnet_team_t team)
{
    return cpnet_detail::team_sync(ctx, team, false);
}

/**
 * cpnet_quiet, then cpnet_team_sync: when it returns on any member, every
 * put, put-with-signal and AMO each member issued on its context before the
 * call is complete (the team form of shmem_barrier_all, OpenSHMEM 1.5
 * §9.9.1; shmem_barrier on an active set, §9.9.2, deprecated in 1.5). Only
 * the calling work-group's context is quieted.
 *
 * Collective over the work-group and over the team. Returns CPNET_E_BAD_TEAM
 * (nothing is sent), the quiet's error (then the sync is not entered), or the
 * sync's.
 */
__device__ inline int cpnet_team_barrier(cpnet_ctx_t* ctx, cpnet_team_t team)
{
    return cpnet_detail::team_sync(ctx, team, true);
}

/* ======================================================================== */
/* Team data collectives (OpenSHMEM 1.5 §9.9)                                */
/* ======================================================================== */

/**
 * Copy `nbytes` bytes from `source` on team PE `root` to `dest` on every
 * member, `root` included (shmem_broadcastmem, OpenSHMEM 1.5 §9.9.7). The
 * root puts to every other member in team order, each put signalling
 * SIG[root]; the others wait for it. `source` is read on the root only.
 * `dest` and `source` may be the same; other overlaps are undefined.
 *
 * Collective over the work-group and over the team. Returns CPNET_E_OK,
 * CPNET_E_BAD_TEAM, CPNET_E_BAD_PE (root outside the team; nothing sent),
 * the quiet's error on the root (a put failed), a wait failure on the others.
 */
__device__ inline int cpnet_broadcastmem(cpnet_ctx_t* ctx, cpnet_team_t team, void* dest, const void* source,
                                         cpnet_size_t nbytes, int root)
{
    return cpnet_detail::team_broadcast(ctx, team, dest, source, (uint64_t)nbytes, root);
}

/**
 * Every member's `nbytes` bytes at `source`, concatenated in team order into
 * `dest` of every member: dest[j * nbytes ..] is team PE j's block
 * (shmem_fcollectmem, OpenSHMEM 1.5 §9.9.9). `dest` holds size * nbytes
 * bytes and must not overlap `source`.
 *
 * Collective over the work-group and over the team. Returns CPNET_E_OK,
 * CPNET_E_BAD_TEAM, a wait failure, or the final quiet's error.
 */
__device__ inline int cpnet_fcollectmem(cpnet_ctx_t* ctx, cpnet_team_t team, void* dest, const void* source,
                                        cpnet_size_t nbytes)
{
    return cpnet_detail::team_fcollect(ctx, team, dest, source, (uint64_t)nbytes);
}

/**
 * Every member's `nbytes` bytes at `source` -- which MAY DIFFER between
 * members -- concatenated in team order into `dest` of every member
 * (shmem_collectmem, OpenSHMEM 1.5 §9.9.8). `dest` must hold the sum of the
 * members' sizes. When `total` is not null, the leader stores that sum there
 * (a cpnet extension). Two epochs: the sizes travel first, 8 bytes per
 * member through the scratch's data buffers.
 *
 * Collective over the work-group and over the team. Returns as
 * cpnet_fcollectmem.
 */
__device__ inline int cpnet_collectmem(cpnet_ctx_t* ctx, cpnet_team_t team, void* dest, const void* source,
                                       cpnet_size_t nbytes, cpnet_size_t* total = nullptr)
{
    return cpnet_detail::team_collect(ctx, team, dest, source, (uint64_t)nbytes, total);
}

/**
 * Block j of `source` (`nbytes` bytes each) to block `me` of `dest` at team
 * PE j, for every member j (shmem_alltoallmem, OpenSHMEM 1.5 §9.9.10). Both
 * hold size * nbytes bytes and must not overlap.
 *
 * Collective over the work-group and over the team. Returns as
 * cpnet_fcollectmem.
 */
__device__ inline int cpnet_alltoallmem(cpnet_ctx_t* ctx, cpnet_team_t team, void* dest, const void* source,
                                        cpnet_size_t nbytes)
{
    return cpnet_detail::team_alltoall(ctx, team, dest, source, (uint64_t)nbytes);
}

/**
 * Typed team collectives, for every (NAME, TYPE) of CPNET_RMA_TYPES (char,
 * schar, short, int, long, longlong, uchar, ushort, uint, ulong, ulonglong,
 * int8, int16, int32, int64, uint8, uint16, uint32, uint64, size, ptrdiff,
 * float, double). Counts are in ELEMENTS; each is the *mem form above on
 * nelems * sizeof(TYPE) bytes, with its semantics and errors.
 *
 *   int cpnet_NAME_broadcast(ctx, team, TYPE* dest, const TYPE* source, size_t nelems, int root)  §9.9.7
 *   int cpnet_NAME_collect(ctx, team, TYPE* dest, const TYPE* source, size_t nelems)              §9.9.8
 *   int cpnet_NAME_fcollect(ctx, team, TYPE* dest, const TYPE* source, size_t nelems)             §9.9.9
 *   int cpnet_NAME_alltoall(ctx, team, TYPE* dest, const TYPE* source, size_t nelems)             §9.9.10
 */
#define CPNET_DEFINE_TEAM_COLL(NAME, TYPE)                                                          \
    __device__ inline int cpnet_##NAME##_broadcast(cpnet_ctx_t* ctx, cpnet_team_t team, TYPE* dest, \
                                                   const TYPE* source, cpnet_size_t nelems, int root) \
    {                                                                                               \
        return cpnet_detail::team_broadcast(ctx, team, dest, source, (uint64_t)nelems * sizeof(TYPE), root); \
    }                                                                                               \
    __device__ inline int cpnet_##NAME##_collect(cpnet_ctx_t* ctx, cpnet_team_t team, TYPE* dest,   \
                                                 const TYPE* source, cpnet_size_t nelems)           \
    {                                                                                               \
        return cpnet_detail::team_collect(ctx, team, dest, source, (uint64_t)nelems * sizeof(TYPE), nullptr); \
    }                                                                                               \
    __device__ inline int cpnet_##NAME##_fcollect(cpnet_ctx_t* ctx, cpnet_team_t team, TYPE* dest,  \
                                                  const TYPE* source, cpnet_size_t nelems)          \
    {                                                                                               \
        return cpnet_detail::team_fcollect(ctx, team, dest, source, (uint64_t)nelems * sizeof(TYPE)); \
    }                                                                                               \
    __device__ inline int cpnet_##NAME##_alltoall(cpnet_ctx_t* ctx, cpnet_team_t team, TYPE* dest,  \
                                                  const TYPE* source, cpnet_size_t nelems)          \
    {                                                                                               \
        return cpnet_detail::team_alltoall(ctx, team, dest, source, (uint64_t)nelems * sizeof(TYPE)); \
    }
CPNET_RMA_TYPES(CPNET_DEFINE_TEAM_COLL)
#undef CPNET_DEFINE_TEAM_COLL

/* ======================================================================== */
/* Reductions (OpenSHMEM 1.5 §9.9.12)                                        */
/* ======================================================================== */

/**
 * Reduce to all: dest[i] = source_0[i] op source_1[i] op ... op
 * source_{n-1}[i] over the members in team order, for i < nreduce, on every
 * member (shmem_TYPENAME_OP_reduce, OpenSHMEM 1.5 §9.9.12). Every member gets
 * the same bits (floating point included): each folds the same slots in the
 * same order. `dest` may equal `source`; other overlaps are undefined.
 *
 *   int cpnet_NAME_and_reduce / _or_reduce / _xor_reduce(ctx, team, TYPE* dest, const TYPE* source, size_t nreduce)
 *       for (NAME, TYPE) of CPNET_REDUCE_BITWISE_TYPES (uchar, ushort, uint,
 *       ulong, ulonglong, int8, int16, int32, int64, uint8, uint16, uint32,
 *       uint64, size)
 *   int cpnet_NAME_min_reduce / _max_reduce / _sum_reduce / _prod_reduce(ctx, team, TYPE* dest, const TYPE* source, size_t nreduce)
 *       for (NAME, TYPE) of CPNET_REDUCE_ARITH_TYPES (those above and char,
 *       schar, short, int, long, longlong, ptrdiff, float, double, and
 *       half / bfloat16 as cpnet_half_t / cpnet_bfloat16_t)
 *
 * Semantics per element: integer sum and prod wrap (two's complement);
 * min/max keep the earlier member's value unless a later one compares
 * strictly less/greater (so NaN and signed zeros fold as in team.rs); float
 * and double sum/prod round once per step; half and bfloat16 are computed in
 * float and rounded to nearest even per step (the correctly rounded result).
 *
 * Rounds of up to the team's `chunk` bytes (cmd.h cpnet_team_desc_t; each
 * round exchanges through the scratch's data buffers, with a fence between
 * rounds), then a quiet.
 *
 * Collective over the work-group and over the team. Returns CPNET_E_OK,
 * CPNET_E_BAD_TEAM (nothing sent), a wait failure, or the quiet's error.
 */
#define CPNET_DEFINE_REDUCE_OP(NAME, TYPE, OPNAME, OP)                                               \
    __device__ inline int cpnet_##NAME##OPNAME(cpnet_ctx_t* ctx, cpnet_team_t team, TYPE* dest,      \
                                               const TYPE* source, cpnet_size_t nreduce)             \
    {                                                                                                \
        return cpnet_detail::team_reduce<TYPE, cpnet_detail::OP>(ctx, team, dest, source, (uint64_t)nreduce); \
    }
/* OPNAME carries the underscores: "and", "or", "xor" are C++ alternative tokens. */
#define CPNET_DEFINE_REDUCE_BITWISE(NAME, TYPE)                                                      \
    CPNET_DEFINE_REDUCE_OP(NAME, TYPE, _and_reduce, RED_AND)                                         \
    CPNET_DEFINE_REDUCE_OP(NAME, TYPE, _or_reduce, RED_OR)                                           \
    CPNET_DEFINE_REDUCE_OP(NAME, TYPE, _xor_reduce, RED_XOR)
#define CPNET_DEFINE_REDUCE_ARITH(NAME, TYPE)                                                        \
    CPNET_DEFINE_REDUCE_OP(NAME, TYPE, _min_reduce, RED_MIN)                                         \
    CPNET_DEFINE_REDUCE_OP(NAME, TYPE, _max_reduce, RED_MAX)                                         \
    CPNET_DEFINE_REDUCE_OP(NAME, TYPE, _sum_reduce, RED_SUM)                                         \
    CPNET_DEFINE_REDUCE_OP(NAME, TYPE, _prod_reduce, RED_PROD)
CPNET_REDUCE_BITWISE_TYPES(CPNET_DEFINE_REDUCE_BITWISE)
CPNET_REDUCE_ARITH_TYPES(CPNET_DEFINE_REDUCE_ARITH)
#undef CPNET_DEFINE_REDUCE_ARITH
#undef CPNET_DEFINE_REDUCE_BITWISE
#undef CPNET_DEFINE_REDUCE_OP

#endif /* CPNET_TEAM_CUH */
