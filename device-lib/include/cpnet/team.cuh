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
#define CPNET_TEAM_BACKOFF_MAX_NS 64
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

/** The reduction operators, in the order of team.rs's ReduceOp. */
enum reduce_op { RED_AND, RED_OR, RED_XOR, RED_MIN, RED_MAX, RED_SUM, RED_PROD };

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
    const cpnet_team_desc_t* e = team_entry(ctx, team);
    if (e == nullptr) return CPNET_E_BAD_TEAM;
    *d = *e;
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
    const uint64_t e = cpnet_ld_relaxed_sys_u64(seq) + 1;
    cpnet_st_relaxed_sys_u64(seq, e);
    uint64_t buf = 0;
    if (round) {
        uint64_t* rw = team_word(ctx, d, CPNET_TEAM_SCR_ROUND);
        const uint64_t r = cpnet_ld_relaxed_sys_u64(rw);
        cpnet_st_relaxed_sys_u64(rw, r + 1);
        buf = r % 2;
    }
    return e << 1 | buf;
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

/** cpnet_quiet's leader part (after every thread's fence): drain the
 *  queue when commands went into it (always without a p2p table), else
 *  return the remembered device-side failure. */
__device__ __forceinline__ int team_quiet_leader(cpnet_ctx_t* ctx)
{
    if (ctx->peers == nullptr || ctx->proxy_used) return drain(ctx, CPNET_OP_QUIET);
    const int pending = ctx->pending_error;
    ctx->pending_error = CPNET_E_OK;
    return pending;
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
            const int q = team_quiet_leader(ctx);
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
    {
        void* to;
        const void* from;
        uint64_t n;
        block(me, &to, &from, &n);
        team_local_copy(to, from, n);
    }
    const int r = team_wait_all(ctx, d, e);
    if (r != CPNET_E_OK) return r;
    return cpnet_quiet(ctx);
}

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
 * the original bits. */
template <int OP> struct combiner<cpnet_half_t, OP> {
    __device__ __forceinline__ static cpnet_half_t apply(cpnet_half_t a, cpnet_half_t b)
    {
        const float x = cpnet_half_to_float(a), y = cpnet_half_to_float(b);
        if constexpr (OP == RED_MIN) return y < x ? b : a;
        else if constexpr (OP == RED_MAX) return y > x ? b : a;
        else return cpnet_float_to_half(combine_f32<OP>(x, y));
    }
};
template <int OP> struct combiner<cpnet_bfloat16_t, OP> {
    __device__ __forceinline__ static cpnet_bfloat16_t apply(cpnet_bfloat16_t a, cpnet_bfloat16_t b)
    {
        const float x = cpnet_bfloat16_to_float(a), y = cpnet_bfloat16_to_float(b);
        if constexpr (OP == RED_MIN) return y < x ? b : a;
        else if constexpr (OP == RED_MAX) return y > x ? b : a;
        else return cpnet_float_to_bfloat16(combine_f32<OP>(x, y));
    }
};

/** Fold the `n` elements of every member's slot of buffer `buf`, in team
 *  order, into `dest` (collective). Each thread takes CPNET_TEAM_FOLD_UNROLL
 *  elements (i, i + nt, ...) at a time, loading them from one slot
 *  together, so that several loads are in flight instead of one. */
#ifndef CPNET_TEAM_FOLD_UNROLL
#define CPNET_TEAM_FOLD_UNROLL 4
#endif
template <typename T, int OP>
__device__ __forceinline__ void team_fold(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t buf, T* dest,
                                          uint64_t n)
{
    constexpr int U = CPNET_TEAM_FOLD_UNROLL;
    const uint64_t nt = (uint64_t)blockDim.x * blockDim.y * blockDim.z;
    const T* s0 = (const T*)team_data(ctx, d, buf, 0);
    const uint64_t stride = d.chunk / sizeof(T); /* elements between two senders' slots */
    for (uint64_t i = thread_rank(); i < n; i += U * nt) {
        T acc[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (i + u * nt < n) acc[u] = s0[i + u * nt];
        for (int j = 1; j < d.size; ++j) {
            const T* sj = s0 + (uint64_t)j * stride;
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
    return collective(ctx, [&]() -> int { return team_quiet_leader(ctx); });
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

/** Every member but this PE is peer-mapped: a round is LL words only (the
 *  same answer on every member, the peer table being symmetric). */
__device__ __forceinline__ bool team_all_p2p(const cpnet_ctx_t* ctx, const cpnet_team_desc_t& d)
{
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
 * reduction shares it.
 */
__device__ __noinline__ inline int team_small_round(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, const void* source,
                                                    uint64_t bytes, uint64_t* buf, uint32_t* p)
{
    __shared__ int small_err;
    __shared__ uint64_t small_eb;
    const uint64_t words = team_ll_words(bytes);
    const uint32_t np = team_small_threads(words);
    *p = np;
    __syncthreads();
    const uint32_t t = thread_rank();
    if (t >= np) return CPNET_E_OK;
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
        uint64_t* const to = (uint64_t*)(team_p2p(ctx, d, j) + to_off);
        for (uint64_t w = t; w < words; w += np)
            cpnet_st_relaxed_sys_u64(to + w, team_ll_word(team_src_word(source, bytes, w), e));
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
        if (r == CPNET_E_OK) r = team_quiet_leader(ctx);
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

/** One round of a reduction up to the fold (team.rs reduce): take the
 *  epoch and the buffer (returned in `*buf`), copy `bytes` of `source` into
 *  this PE's slot, put the slot into the same slot of every other member
 *  (signal SIG[me] = epoch), fence, wait for every other member's slot.
 *  Not inlined and not typed: every reduction shares it. */
__device__ __noinline__ inline int team_reduce_round(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, const void* source,
                                                     uint64_t bytes, uint64_t* buf)
{
    const uint64_t eb = team_next(ctx, d, true);
    const uint64_t e = eb >> 1;
    *buf = eb & 1;
    uint8_t* const mine = team_data(ctx, d, *buf, d.my_idx);
    team_local_copy(mine, source, bytes);
    uint64_t* const sig_me = team_sig(ctx, d, d.my_idx);
    for (int k = 1; k < d.size; ++k) {
        const int j = (d.my_idx + k) % d.size;
        cpnet_putmem_signal_nbi(ctx, mine, mine, bytes, sig_me, e, CPNET_SIGNAL_SET, team_world_pe(d, j));
    }
    /* The fence (cpnet_fence: every thread's own fence of its p2p stores,
     * then the leader's part), then the waits, in one barrier pair. */
    team_fence_threads(ctx);
    return team_wait_all(ctx, d, e, true);
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
    if (nreduce <= CPNET_TEAM_SMALL_MAX_BYTES / sizeof(T) && nreduce * sizeof(T) <= team_ll_max(d) &&
        team_all_p2p(ctx, d))
        return team_reduce_small<T, OP>(ctx, d, dest, source, nreduce);
    const uint64_t per_round = d.chunk / sizeof(T);
    uint64_t done = 0;
    /* One round even for nreduce == 0: every member takes the same epochs. */
    for (;;) {
        const uint64_t n = per_round < nreduce - done ? per_round : nreduce - done;
        uint64_t buf = 0;
        /* The same choice on every member: the same n, the same chunk. */
        const bool ll = n * sizeof(T) <= team_ll_max(d);
        const int r = ll ? team_reduce_round_ll(ctx, d, source + done, n * sizeof(T), &buf)
                         : team_reduce_round(ctx, d, source + done, n * sizeof(T), &buf);
        if (r != CPNET_E_OK) return r;
        if (n > 0) {
            if (ll) team_fold_ll<T, OP>(ctx, d, buf, dest + done, n);
            else team_fold<T, OP>(ctx, d, buf, dest + done, n);
        }
        done += n;
        if (done >= nreduce) break;
    }
    /* The quiet: every thread fenced its p2p stores in the last round. */
    return team_quiet_fenced(ctx);
}

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
