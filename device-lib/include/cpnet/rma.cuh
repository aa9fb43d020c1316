/*
 * cpnet/rma.cuh -- puts and gets (OpenSHMEM 1.5 §9.6), signals (§9.8), point-to-point waits (§9.10), memory ordering and the barrier (§9.11, §9.9.1).
 * Part of the device API: included by <cpnet/device.cuh>, whose RULES
 * (work-group collective calls, symmetric addresses, errors, timeouts)
 * hold for every call here; including this file alone works too.
 */
/* First, outside the guard: device.cuh includes this file at its end, so
 * whichever header a kernel includes first, this file's body comes after
 * device.cuh's and before the files that build on it (team.cuh). */
#include <cpnet/device.cuh>

#ifndef CPNET_RMA_CUH
#define CPNET_RMA_CUH

/* ======================================================================== */
/* Remote memory access (OpenSHMEM 1.5 §9.6)                                 */
/* ======================================================================== */

/**
 * Copy `nbytes` bytes from `source` (local symmetric heap) to `dest` (a
 * symmetric address) on PE `pe`. OpenSHMEM 1.5 §9.6.1 (shmem_putmem).
 *
 * Collective over the work-group, one-sided towards `pe`. Payloads of at most
 * 8 bytes travel inline in the command (then `source` may be any device
 * memory); larger ones are read by the proxy from the heap. Blocking: returns
 * once the proxy completed the command, so `source` may be reused; remote
 * visibility to third parties is guaranteed after cpnet_quiet. nbytes == 0
 * does nothing. Returns CPNET_E_OK or the proxy's error (CPNET_E_BAD_PE,
 * CPNET_E_BAD_ADDR, CPNET_E_PEER_DEAD, CPNET_E_FABRIC, ...) or a wait failure
 * (abort code, CPNET_E_TIMEOUT), or CPNET_E_NO_QUEUE.
 */
__device__ inline int cpnet_putmem(cpnet_ctx_t* ctx, void* dest, const void* source, cpnet_size_t nbytes,
                                   int pe)
{
    return cpnet_detail::putmem(ctx, dest, source, (uint64_t)nbytes, pe);
}

/**
 * Non-blocking cpnet_putmem: returns once the command is queued. OpenSHMEM
 * 1.5 §9.6.7 (shmem_putmem_nbi).
 *
 * Collective over the work-group. `source` (when over 8 bytes) must not be
 * modified until cpnet_quiet returns; errors surface at cpnet_quiet. Waits
 * (bounded, abortable) only when the ring is full. (Through the queue, data
 * up to the payload slot size, CPNET_PAYLOAD_BYTES, is copied into the
 * queue's pinned payload slot during the call, cmd.h P0; portable code still
 * leaves `source` alone until quiet.)
 */
__device__ inline void cpnet_putmem_nbi(cpnet_ctx_t* ctx, void* dest, const void* source,
                                        cpnet_size_t nbytes, int pe)
{
    cpnet_detail::putmem_nbi(ctx, dest, source, (uint64_t)nbytes, pe);
}

/**
 * Copy `nbytes` bytes from `source` (a symmetric address) on PE `pe` to
 * `dest` (local symmetric heap). OpenSHMEM 1.5 §9.6.4 (shmem_getmem).
 *
 * Collective over the work-group, one-sided. Payloads of at most 8 bytes come
 * back inline through the queue (then `dest` may be any device memory) and
 * are stored by the leader; larger ones are written into the heap by the
 * proxy. Blocking: when it returns the data is visible to every thread of
 * the block. nbytes == 0 does nothing. Returns as cpnet_putmem.
 */
__device__ inline int cpnet_getmem(cpnet_ctx_t* ctx, void* dest, const void* source, cpnet_size_t nbytes,
                                   int pe)
{
    return cpnet_detail::getmem(ctx, dest, source, (uint64_t)nbytes, pe);
}

/**
 * Non-blocking cpnet_getmem: returns once the command is queued; `dest`
 * (always in the local heap, any size) holds the data after cpnet_quiet.
 * OpenSHMEM 1.5 §9.6.8 (shmem_getmem_nbi). Collective over the work-group;
 * errors surface at cpnet_quiet.
 */
__device__ inline void cpnet_getmem_nbi(cpnet_ctx_t* ctx, void* dest, const void* source,
                                        cpnet_size_t nbytes, int pe)
{
    cpnet_detail::getmem_nbi(ctx, dest, source, (uint64_t)nbytes, pe);
}

/**
 * Typed RMA, for every (NAME, TYPE) of CPNET_RMA_TYPES (char, schar, short,
 * int, long, longlong, uchar, ushort, uint, ulong, ulonglong, int8, int16,
 * int32, int64, uint8, uint16, uint32, uint64, size, ptrdiff, float, double).
 * All collective over the work-group; counts are in ELEMENTS of TYPE.
 *
 *   int  cpnet_NAME_put(ctx, TYPE* dest, const TYPE* source, size_t nelems, int pe)
 *        -- cpnet_putmem of nelems * sizeof(TYPE) bytes (§9.6.1, shmem_TYPENAME_put)
 *   void cpnet_NAME_put_nbi(ctx, TYPE* dest, const TYPE* source, size_t nelems, int pe)
 *        -- cpnet_putmem_nbi (§9.6.7)
 *   int  cpnet_NAME_get(ctx, TYPE* dest, const TYPE* source, size_t nelems, int pe)
 *        -- cpnet_getmem (§9.6.4)
 *   void cpnet_NAME_get_nbi(ctx, TYPE* dest, const TYPE* source, size_t nelems, int pe)
 *        -- cpnet_getmem_nbi (§9.6.8)
 *   void cpnet_NAME_p(ctx, TYPE* dest, TYPE value, int pe)
 *        -- put one element, inline (§9.6.2, shmem_TYPENAME_p). Fire-and-forget:
 *           `value` is in the command, so nothing is left to wait for; the
 *           put is complete, and its error reported, at cpnet_quiet.
 *   TYPE cpnet_NAME_g(ctx, const TYPE* source, int pe)
 *        -- get one element, inline and blocking (§9.6.5, shmem_TYPENAME_g);
 *           the same value in every thread; 0 on failure (see
 *           cpnet_ctx_last_error).
 */
#define CPNET_DEFINE_RMA(NAME, TYPE)                                                                \
    __device__ inline int cpnet_##NAME##_put(cpnet_ctx_t* ctx, TYPE* dest, const TYPE* source,      \
                                             cpnet_size_t nelems, int pe)                           \
    {                                                                                               \
        return cpnet_detail::putmem(ctx, dest, source, (uint64_t)nelems * sizeof(TYPE), pe);        \
    }                                                                                               \
    __device__ inline void cpnet_##NAME##_put_nbi(cpnet_ctx_t* ctx, TYPE* dest, const TYPE* source, \
                                                  cpnet_size_t nelems, int pe)                      \
    {                                                                                               \
        cpnet_detail::putmem_nbi(ctx, dest, source, (uint64_t)nelems * sizeof(TYPE), pe);           \
    }                                                                                               \
    __device__ inline int cpnet_##NAME##_get(cpnet_ctx_t* ctx, TYPE* dest, const TYPE* source,      \
                                             cpnet_size_t nelems, int pe)                           \
    {                                                                                               \
        return cpnet_detail::getmem(ctx, dest, source, (uint64_t)nelems * sizeof(TYPE), pe);        \
    }                                                                                               \
    __device__ inline void cpnet_##NAME##_get_nbi(cpnet_ctx_t* ctx, TYPE* dest, const TYPE* source, \
                                                  cpnet_size_t nelems, int pe)                      \
    {                                                                                               \
        cpnet_detail::getmem_nbi(ctx, dest, source, (uint64_t)nelems * sizeof(TYPE), pe);           \
    }                                                                                               \
    __device__ inline void cpnet_##NAME##_p(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, int pe)       \
    {                                                                                               \
        cpnet_detail::putmem_nbi(ctx, dest, &value, sizeof(TYPE), pe);                              \
    }                                                                                               \
    __device__ inline TYPE cpnet_##NAME##_g(cpnet_ctx_t* ctx, const TYPE* source, int pe)           \
    {                                                                                               \
        if (const uint8_t* r = cpnet_detail::p2p_remote(ctx, source, nullptr, sizeof(TYPE), pe))    \
            return cpnet_detail::from_bits<TYPE>(cpnet_detail::p2p_get_value(ctx, r, sizeof(TYPE))); \
        const cpnet_cmd_t c = cpnet_detail::get_cmd(ctx, nullptr, source, sizeof(TYPE), pe, true);  \
        return cpnet_detail::from_bits<TYPE>(cpnet_detail::fetch_blocking(ctx, c));                 \
    }
CPNET_RMA_TYPES(CPNET_DEFINE_RMA)
#undef CPNET_DEFINE_RMA

/* ======================================================================== */
/* Signaling (OpenSHMEM 1.5 §9.8)                                             */
/* ======================================================================== */

/**
 * Put `nbytes` bytes from `source` to `dest` on PE `pe`, then update the
 * signal word `sig_addr` (a symmetric uint64_t) on `pe`: sig_op
 * CPNET_SIGNAL_SET stores `signal`, CPNET_SIGNAL_ADD adds it (atomically with
 * respect to other cpnet signal operations). The signal becomes visible only
 * after the data. OpenSHMEM 1.5 §9.8.2 (shmem_putmem_signal).
 *
 * Collective over the work-group, one-sided. Payloads of at most 8 bytes
 * travel inline. nbytes == 0 is allowed and sends only the signal. Blocking
 * as cpnet_putmem; returns as cpnet_putmem, plus CPNET_E_BAD_OP for an
 * unknown sig_op and CPNET_E_BAD_ALIGN for a misaligned sig_addr.
 */
__device__ inline int cpnet_putmem_signal(cpnet_ctx_t* ctx, void* dest, const void* source,
                                          cpnet_size_t nbytes, uint64_t* sig_addr, uint64_t signal,
                                          int sig_op, int pe)
{
    const cpnet_cmd_t c = cpnet_detail::put_signal_cmd(ctx, dest, source, (uint64_t)nbytes, sig_addr, signal, sig_op, pe);
    uint8_t* remote;
    uint64_t* sig_remote;
    if (cpnet_detail::p2p_put_signal_route(ctx, dest, source, (uint64_t)nbytes, sig_addr, sig_op, pe, &remote, &sig_remote))
        return cpnet_detail::p2p_put_signal(ctx, remote, source, (uint64_t)nbytes, sig_remote, c, true);
    return cpnet_detail::queued_put(ctx, c, source, (uint64_t)nbytes, true);
}

/**
 * Non-blocking cpnet_putmem_signal: returns once the command is queued.
 * OpenSHMEM 1.5 §9.8.2 (shmem_putmem_signal_nbi). Collective over the
 * work-group; `source` (over 8 bytes) must not change until cpnet_quiet;
 * errors surface at cpnet_quiet.
 */
__device__ inline void cpnet_putmem_signal_nbi(cpnet_ctx_t* ctx, void* dest, const void* source,
                                               cpnet_size_t nbytes, uint64_t* sig_addr,
                                               uint64_t signal, int sig_op, int pe)
{
    const cpnet_cmd_t c = cpnet_detail::put_signal_cmd(ctx, dest, source, (uint64_t)nbytes, sig_addr, signal, sig_op, pe);
    uint8_t* remote;
    uint64_t* sig_remote;
    if (cpnet_detail::p2p_put_signal_route(ctx, dest, source, (uint64_t)nbytes, sig_addr, sig_op, pe, &remote, &sig_remote))
        cpnet_detail::p2p_put_signal(ctx, remote, source, (uint64_t)nbytes, sig_remote, c, false);
    else
        cpnet_detail::queued_put(ctx, c, source, (uint64_t)nbytes, false);
}

/**
 * Read the local signal word `sig_addr` (acquire: data delivered before the
 * signal is visible after the call). OpenSHMEM 1.5 §9.8.3
 * (shmem_signal_fetch). Collective over the work-group (the same value in
 * every thread); no command is sent.
 */
__device__ inline uint64_t cpnet_signal_fetch(cpnet_ctx_t* ctx, const uint64_t* sig_addr)
{
    cpnet_detail::collective(ctx, [&]() -> int {
        ctx->val = cpnet_ld_acquire_sys_u64(sig_addr);
        return CPNET_E_OK;
    });
    return ctx->val;
}

/**
 * Wait until the local signal word satisfies `*sig_addr cmp cmp_value`
 * (cmp: CPNET_CMP_EQ, NE, GT, GE, LT, LE) and return the value that satisfied
 * it. OpenSHMEM 1.5 §9.10 (shmem_signal_wait_until).
 *
 * Collective over the work-group; no command is sent (the word is polled in
 * local memory with acquire loads). On failure --
 * CPNET_E_BAD_OP for an unknown cmp, the abort code, CPNET_E_TIMEOUT after
 * handle.wait_timeout_ns (reported in the status block) -- returns the last
 * value seen, and cpnet_ctx_last_error() gives the code.
 */
__device__ inline uint64_t cpnet_signal_wait_until(cpnet_ctx_t* ctx, uint64_t* sig_addr, int cmp,
                                                   uint64_t cmp_value)
{
    cpnet_detail::wait_until<uint64_t>(ctx, sig_addr, cmp, cmp_value);
    return ctx->val;
}

/* ======================================================================== */
/* Point-to-point synchronization (OpenSHMEM 1.5 §9.10)                        */
/* ======================================================================== */

/**
 * Typed point-to-point synchronization on LOCAL symmetric memory, for every
 * (NAME, TYPE) of CPNET_P2P_TYPES (int, long, longlong, uint, ulong,
 * ulonglong, int32, int64, uint32, uint64, size, ptrdiff). Comparisons are
 * in TYPE (signed types compare signed). No command is sent; `ivar` is
 * written by other PEs through the proxy. Both collective over the
 * work-group.
 *
 *   int cpnet_NAME_wait_until(ctx, TYPE* ivar, int cmp, TYPE cmp_value)
 *       -- §9.10.1 (shmem_TYPENAME_wait_until): block until
 *          `*ivar cmp cmp_value`; then data delivered before ivar's update is
 *          visible to every thread. Returns CPNET_E_OK, CPNET_E_BAD_OP (unknown
 *          cmp), the abort code, or CPNET_E_TIMEOUT after
 *          handle.wait_timeout_ns (reported in the status block: dev_addr =
 *          ivar's heap offset, dev_expected = cmp_value, dev_found = the last
 *          value, dev_cmp = cmp).
 *   int cpnet_NAME_test(ctx, TYPE* ivar, int cmp, TYPE cmp_value)
 *       -- §9.10 (shmem_TYPENAME_test): 1 if `*ivar cmp cmp_value` now, else
 *          0 (also for an unknown cmp; cpnet_ctx_last_error says
 *          CPNET_E_BAD_OP).
 */
#define CPNET_DEFINE_P2P(NAME, TYPE)                                                                \
    __device__ inline int cpnet_##NAME##_wait_until(cpnet_ctx_t* ctx, TYPE* ivar, int cmp,          \
                                                    TYPE cmp_value)                                 \
    {                                                                                               \
        return cpnet_detail::wait_until<TYPE>(ctx, ivar, cmp, cmp_value);                           \
    }                                                                                               \
    __device__ inline int cpnet_##NAME##_test(cpnet_ctx_t* ctx, TYPE* ivar, int cmp, TYPE cmp_value) \
    {                                                                                               \
        return cpnet_detail::test<TYPE>(ctx, ivar, cmp, cmp_value);                                 \
    }
CPNET_P2P_TYPES(CPNET_DEFINE_P2P)
#undef CPNET_DEFINE_P2P

/* ======================================================================== */
/* Memory ordering (OpenSHMEM 1.5 §9.11) and the barrier (§9.9.1)             */
/* ======================================================================== */

/**
 * Complete every operation issued on this context: when it returns, every
 * earlier put, put-with-signal and AMO is complete and visible at its target,
 * every non-blocking get has delivered its data (visible to every thread of
 * the block). OpenSHMEM 1.5 §9.11.2 (shmem_ctx_quiet).
 *
 * Collective over the work-group. Sends CPNET_OP_QUIET (so the proxy can
 * flush), then waits until the queue's completed count reaches the producer's
 * write index. Returns CPNET_E_OK if no operation since the previous quiet
 * failed; otherwise, in this order: the quiet's own wait failure (abort code,
 * CPNET_E_TIMEOUT); the first device-side failure of an earlier call (a full
 * ring that timed out, an abort); the proxy's error code of the LAST command
 * it rejected since the previous quiet (ctl.error_seq moved; this includes
 * errors a blocking call already returned).
 */
__device__ inline int cpnet_quiet(cpnet_ctx_t* ctx)
{
    /* Peer-to-peer stores: each thread's are complete at system scope after
     * its own fence (the leader's, after the barrier, would be cumulative
     * over them by the PTX model; every thread fences so that completion does
     * not lean on that). Queued commands: drain, when there were any (always
     * without a peer-to-peer table). */
    if (ctx->peers != nullptr) cpnet_fence_acq_rel_sys();
    return cpnet_detail::collective(ctx, [&]() -> int { return cpnet_detail::quiet_leader(ctx); });
}

namespace cpnet_detail {

/** A quiet split in two around other work of the block (quiet_post, then
 *  quiet_finish); only the leader's copy is read. */
struct split_quiet {
    uint64_t upto; /* drain_post's write index */
    int posted;    /* drain_post's result */
    int on;        /* 1: a QUIET went into the queue */
};

/**
 * cpnet_quiet's first half (collective over the work-group): where
 * cpnet_quiet would drain the queue, post its QUIET now (drain_post), so
 * the proxy completes the queue -- for a put to another PE, the target's
 * ACK -- while the block does other work: waits on its own memory, folds,
 * local copies. No command may go into the context's queue before
 * quiet_finish, which must follow on every path (or a cpnet_quiet or
 * cpnet_ctx_destroy, which drain again).
 */
__device__ inline void quiet_post(cpnet_ctx_t* ctx, split_quiet* q)
{
    (void)collective(ctx, [&]() -> int {
        q->on = quiet_drains(ctx);
        if (q->on) q->posted = drain_post(ctx, CPNET_OP_QUIET, &q->upto);
        return CPNET_E_OK;
    });
}

/** The second half (collective over the work-group): returns what
 *  cpnet_quiet would have (its peer-to-peer fence included). */
__device__ inline int quiet_finish(cpnet_ctx_t* ctx, const split_quiet* q)
{
    if (ctx->peers != nullptr) cpnet_fence_acq_rel_sys();
    return collective(ctx,
                      [&]() -> int { return q->on ? drain_finish(ctx, q->posted, q->upto) : take_pending_error(ctx); });
}

} /* namespace cpnet_detail */

/**
 * Order delivery: every put, put-with-signal and AMO issued on this context
 * to a PE before the fence is delivered before any issued to the same PE
 * after it. Does not wait. OpenSHMEM 1.5 §9.11.1 (shmem_ctx_fence).
 * Collective over the work-group; an enqueue failure surfaces at quiet.
 */
__device__ inline void cpnet_fence(cpnet_ctx_t* ctx)
{
    cpnet_cmd_t c = {};
    c.opcode = CPNET_OP_FENCE;
    if (ctx->peers == nullptr) {
        cpnet_detail::enqueue_nbi(ctx, c);
        return;
    }
    /* Peer-to-peer stores before the fence: the leader's fence.acq_rel.sys
     * after the entry barrier orders every thread's before the block's later
     * stores and before a later command's release publish. Queued commands
     * before it: a FENCE command orders them before later queued ones, and
     * fence_idx makes the next peer-to-peer access wait for them. */
    cpnet_detail::collective(ctx, [&]() -> int {
        cpnet_fence_acq_rel_sys();
        if (ctx->proxy_used) {
            cpnet_detail::call_nbi(ctx, c);
            ctx->fence_idx = ctx->write_idx;
        }
        return CPNET_E_OK;
    });
}

/**
 * Quiet, then a barrier across all PEs: when it returns on any PE, every PE
 * has entered it and every operation each of them issued before it is
 * complete. OpenSHMEM 1.5 §9.9.1 (shmem_barrier_all).
 *
 * Collective over the work-group AND a PE-level collective: exactly ONE
 * work-group per PE calls it, the same number of times on every PE (the
 * proxy counts one arrival per PE; a second work-group of the same PE would
 * stand for a second barrier). Other work-groups of the PE are not
 * synchronized by it; order them against it in the kernel (e.g. a grid
 * barrier) if needed. One command (CPNET_OP_BARRIER_ALL, which the proxy
 * executes as quiet + barrier), waited for like cpnet_quiet; returns as
 * cpnet_quiet.
 */
__device__ inline int cpnet_barrier_all(cpnet_ctx_t* ctx)
{
    /* Complete this thread's peer-to-peer stores first (see cpnet_quiet). */
    if (ctx->peers != nullptr) cpnet_fence_acq_rel_sys();
    return cpnet_detail::collective(ctx,
                                    [&]() -> int { return cpnet_detail::drain(ctx, CPNET_OP_BARRIER_ALL); });
}

#endif /* CPNET_RMA_CUH */
