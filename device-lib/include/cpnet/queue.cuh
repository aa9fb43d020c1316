/*
 * cpnet/queue.cuh -- the work-group context and the producer side of the
 * command ring: claiming a queue, reserving a slot (P1), filling it (P2),
 * publishing it (P3), waiting for completion (P4), and the bounded, abortable
 * spin that every device-side wait uses.
 *
 * Everything in namespace cpnet_detail runs on ONE thread of the work-group
 * (the leader, linear thread index 0); the collective wrappers in
 * cpnet/device.cuh put the block barriers around it. Include
 * <cpnet/device.cuh>, not this file.
 *
 * The protocol is cpnet/cmd.h, "THE QUEUE PROTOCOL"; every ordered access below
 * names its step (P1..P4) and the consumer step it pairs with (C1..C4).
 */
#ifndef CPNET_QUEUE_CUH
#define CPNET_QUEUE_CUH

#include <cpnet/ptx.cuh>

/** Shortest backoff sleep of a device-side spin, in ns (after the first few
 *  polls, which do not sleep). Define before including to override. */
#ifndef CPNET_BACKOFF_MIN_NS
#define CPNET_BACKOFF_MIN_NS 32
#endif
/** Longest backoff sleep of a device-side spin, in ns. A poll of host-pinned
 *  memory costs about 1 us over PCIe already, so a short cap keeps latency low
 *  while bounding the PCIe traffic of a waiting work-group. */
#ifndef CPNET_BACKOFF_MAX_NS
#define CPNET_BACKOFF_MAX_NS 1024
#endif
/** Longest backoff sleep (ns) of a wait on a word in this GPU's memory
 *  (cpnet_<T>_wait_until on a heap word, the team collectives' waits): a
 *  poll does not cross PCIe, so the cap is short and the wait ends at most
 *  this long after its word landed. With the PCIe cap above, a signal wait
 *  slept up to 1 us past its signal. Define before including. */
#ifndef CPNET_LOCAL_BACKOFF_MAX_NS
#define CPNET_LOCAL_BACKOFF_MAX_NS 64
#endif
/** Polls without sleeping before the backoff starts. */
#ifndef CPNET_SPIN_TIGHT_POLLS
#define CPNET_SPIN_TIGHT_POLLS 4
#endif
/** The abort words are read only once a wait has lasted this long (ns), and
 *  then every CPNET_ABORT_CHECK_EVERY polls. Each read is a PCIe round trip,
 *  and the status block's abort word is one host cache line shared by every
 *  block of the GPU: reading it on every command serialized all blocks at
 *  about 1 M commands/s on an H200 (docs/results.md). */
#ifndef CPNET_ABORT_CHECK_AFTER_NS
#define CPNET_ABORT_CHECK_AFTER_NS 20000
#endif
/** Polls between two reads of the abort words, once they are read at all
 *  (a power of two). */
#ifndef CPNET_ABORT_CHECK_EVERY
#define CPNET_ABORT_CHECK_EVERY 8
#endif
/** With claim words (the abort mirror in GPU memory): checks between two
 *  reads of the host abort words, a fallback for a host that could not copy
 *  the mirror. A power of two. */
#ifndef CPNET_ABORT_HOST_EVERY
#define CPNET_ABORT_HOST_EVERY 64
#endif

/**
 * A work-group's communication context (OpenSHMEM 1.5 §9.5, shmem_ctx_t): one
 * claimed queue of the handle's pool plus the producer's private state.
 *
 * Declare it in shared memory, once per block, and pass its address to every
 * call:
 *
 *     __global__ void k(cpnet_handle_t h) {
 *         __shared__ cpnet_ctx_t ctx;
 *         if (cpnet_ctx_create(&h, &ctx) != CPNET_E_OK) return;   // all threads
 *         ...
 *         cpnet_ctx_destroy(&ctx);
 *     }
 *
 * Fields are written by the block's leader thread only, inside the collective
 * calls; treat the struct as opaque. write_idx and cached_consumed are the
 * producer's private copies (cmd.h P1): loaded from the queue's producer block
 * at create, stored back at destroy.
 */
typedef struct cpnet_ctx {
    cpnet_queue_ctl_t* ctl;    /**< the queue's control block (consumer-written); NULL: no queue */
    cpnet_queue_prod_t* prod;  /**< the queue's producer block */
    cpnet_cmd_t* slots;        /**< slot 0 of the ring */
    cpnet_status_t* status;    /**< the PE's status block; NULL if the handle has none */
    uint64_t write_idx;        /**< seq of the next command (P1) */
    uint64_t cached_consumed;  /**< last ctl.consumed read (P1) */
    uint64_t mask;             /**< depth - 1 */
    uint64_t seen_error_seq;   /**< ctl.error_seq as of the last quiet (or create) */
    uint64_t heap_base;        /**< handle.heap_base: pointers become offsets against it */
    uint64_t heap_size;        /**< handle.heap_size */
    uint64_t wait_timeout_ns;  /**< handle.wait_timeout_ns (0: wait forever) */
    uint64_t val;              /**< broadcast: the last call's fetched value (raw bits) */
    int32_t my_pe;             /**< handle.my_pe */
    int32_t n_pes;             /**< handle.n_pes */
    uint32_t qid;              /**< index of the claimed queue in the pool */
    uint32_t wg;               /**< linear block id of the owner */
    int32_t pending_error;     /**< first device-side failure since the last quiet (0: none) */
    int32_t ret;               /**< broadcast: the last call's CPNET_E_* */
    uint32_t* claims;          /**< handle.claims (GPU-memory claim words), or NULL */
    uint32_t n_queues;         /**< handle.n_queues (index of the status report's claim word) */
    uint32_t proxy_used;       /**< 1 once a command went into the queue since the last drain:
                                    quiet then has to ask the proxy; 0: only peer-to-peer stores,
                                    which a fence completes */
    const uint64_t* peers;     /**< handle.peers (the peer-to-peer table), or NULL */
    uint64_t fence_idx;        /**< nonzero: a cpnet_fence came after queued commands; the next
                                    peer-to-peer store first waits until ctl.completed reaches it */
    uint8_t* payload;          /**< payload slot 0 of this context's queue (P0), or NULL: none */
    uint64_t cached_completed; /**< last ctl.completed read for P0 */
    uint32_t payload_bytes;    /**< bytes per payload slot (0: none) */
    uint32_t n_teams;          /**< handle.n_teams: entries of the team table (0: none) */
    const cpnet_team_desc_t* teams; /**< handle.teams (the team table, cpnet/team.cuh), or NULL */
    cpnet_team_desc_t world;   /**< the CPNET_TEAM_WORLD entry, copied at create (world_ok): the
                                    world team is never rewritten, so a collective on it reads
                                    shared memory instead of the table (an L2 round trip a call) */
    uint32_t world_ok;         /**< 1: `world` holds a live entry */
    uint32_t world_all_p2p;    /**< 1: every other world PE's heap is peer-mapped (`peers`) */
} cpnet_ctx_t;

namespace cpnet_detail {

/** Linear index of the calling thread in its block. */
__device__ __forceinline__ uint32_t thread_rank(void)
{
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

/** True on the block's leader thread (linear thread index 0). */
__device__ __forceinline__ bool is_leader(void) { return thread_rank() == 0; }

/** Linear index of the calling block in the grid. */
__device__ __forceinline__ uint32_t block_rank(void)
{
    return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

/** Heap offset of a symmetric address of this PE: `ptr - heap_base`, computed
 *  in unsigned 64-bit arithmetic. Nothing is checked here: an address outside
 *  the heap becomes an offset >= heap_size, which the proxy rejects
 *  (CPNET_E_BAD_ADDR). No raw pointer ever goes into a slot. */
__device__ __forceinline__ uint64_t heap_offset(const cpnet_ctx_t* ctx, const void* ptr)
{
    return (uint64_t)ptr - ctx->heap_base;
}

/** The PE-wide abort word in force, or 0: with claim words the abort mirror
 *  in GPU memory (claims[CPNET_CLAIM_ABORT]), which the host fills whenever
 *  it sets an abort, and also cpnet_status_t.abort when `host`; without claim
 *  words always cpnet_status_t.abort (pinned host memory, a PCIe read).
 *  Relaxed: the words carry no data, only "stop waiting", and a later read
 *  sees them. */
__device__ __forceinline__ uint64_t pe_abort_word(const uint32_t* claims, uint32_t n_queues,
                                                  const cpnet_status_t* status, bool host)
{
    uint64_t a = 0;
    if (claims != nullptr) a = cpnet_ld_relaxed_sys_u32(claims + CPNET_CLAIM_ABORT(n_queues));
    if (a == 0 && status != nullptr && (claims == nullptr || host)) a = cpnet_ld_relaxed_sys_u32(&status->abort);
    return a;
}

/** An abort word as a CPNET_E_*: 0 is CPNET_E_OK, a value outside the
 *  CPNET_E_* range reads as CPNET_E_ABORTED. */
__device__ __forceinline__ int abort_word_code(uint64_t a)
{
    if (a == 0) return CPNET_E_OK;
    return a < CPNET_E_COUNT ? (int)a : CPNET_E_ABORTED;
}

/** The abort code in force for `ctx`, or 0: the PE-wide words
 *  (pe_abort_word), then, where the host words are read (no claim words, or
 *  `host`), the queue's ctl.abort. */
__device__ __forceinline__ int abort_code(const cpnet_ctx_t* ctx, bool host = true)
{
    uint64_t a = pe_abort_word(ctx->claims, ctx->n_queues, ctx->status, host);
    if (a == 0 && ctx->ctl != nullptr && (ctx->claims == nullptr || host))
        a = cpnet_ld_relaxed_sys_u64(&ctx->ctl->abort);
    return abort_word_code(a);
}

/** Report a device-side failure in the PE's status block: claim dev_error by
 *  CAS 0 -> `err` (only the first reporter of the PE wins; later ones leave the
 *  report alone), then fill dev_pe, dev_wg, dev_addr, dev_expected, dev_found,
 *  dev_cmp with relaxed system-scope stores and a system-scope fence, so the
 *  fields are visible to the host before anything this thread does next (in
 *  particular before the kernel ends).
 *  Caveat for readers: the fields follow dev_error, not precede it; a host
 *  that sees dev_error != 0 while the kernel still runs may read them a few
 *  microseconds early. Read them after the kernel ended or after a short
 *  delay. (Filling before the claim would let racing reporters mix fields.) */
__device__ __noinline__ inline void report_dev_error(const cpnet_ctx_t* ctx, int err, int32_t pe,
                                                     uint64_t addr, uint64_t expected,
                                                     uint64_t found, uint32_t cmp)
{
    cpnet_status_t* s = ctx->status;
    if (s == nullptr) return;
    if (ctx->claims != nullptr) {
        /* Claim the one report with a device-memory CAS (claims[CPNET_CLAIM_REPORT]),
         * fill the fields, then publish dev_error last with release: a host
         * that sees dev_error != 0 sees the whole report. */
        if (cpnet_atom_cas_acq_rel_sys_u32(ctx->claims + CPNET_CLAIM_REPORT(ctx->n_queues), 0u, 1u) != 0u) return;
        cpnet_st_relaxed_sys_u32((uint32_t*)&s->dev_pe, (uint32_t)pe);
        cpnet_st_relaxed_sys_u32(&s->dev_wg, ctx->wg);
        cpnet_st_relaxed_sys_u64(&s->dev_addr, addr);
        cpnet_st_relaxed_sys_u64(&s->dev_expected, expected);
        cpnet_st_relaxed_sys_u64(&s->dev_found, found);
        cpnet_st_relaxed_sys_u32(&s->dev_cmp, cmp);
        /* Release: pairs with the host's acquire load of dev_error. */
        cpnet_st_release_sys_u32(&s->dev_error, (uint32_t)err);
        cpnet_fence_acq_rel_sys();
        return;
    }
    if (cpnet_atom_cas_acq_rel_sys_u32(&s->dev_error, 0u, (uint32_t)err) != 0u) return;
    cpnet_st_relaxed_sys_u32((uint32_t*)&s->dev_pe, (uint32_t)pe);
    cpnet_st_relaxed_sys_u32(&s->dev_wg, ctx->wg);
    cpnet_st_relaxed_sys_u64(&s->dev_addr, addr);
    cpnet_st_relaxed_sys_u64(&s->dev_expected, expected);
    cpnet_st_relaxed_sys_u64(&s->dev_found, found);
    cpnet_st_relaxed_sys_u32(&s->dev_cmp, cmp);
    cpnet_fence_acq_rel_sys();
}

/**
 * The bounded spin every device-side wait uses: call `pause` after each poll
 * that found nothing. It returns 0 to keep polling, or the reason to stop:
 * the abort code (cpnet_status_t.abort or ctl.abort set by the host), or
 * CPNET_E_TIMEOUT once handle.wait_timeout_ns (if nonzero) has passed since
 * `start`. Backoff: a few tight polls, then __nanosleep doubling from
 * CPNET_BACKOFF_MIN_NS to CPNET_BACKOFF_MAX_NS. So no device wait outlives a
 * host abort by more than CPNET_ABORT_CHECK_AFTER_NS plus
 * CPNET_ABORT_CHECK_EVERY polls.
 */
struct spin {
    uint64_t start;
    uint32_t polls;
    uint32_t sleep_ns;
    uint32_t max_ns;

    /** `max_ns`: the longest backoff sleep (team collectives poll GPU memory
     *  and use a shorter cap than the PCIe polls of the queue). */
    __device__ __forceinline__ explicit spin(uint32_t max_ns = CPNET_BACKOFF_MAX_NS)
        : start(cpnet_globaltimer_ns()), polls(0), sleep_ns(0), max_ns(max_ns)
    {
    }

    __device__ __forceinline__ int pause(const cpnet_ctx_t* ctx)
    {
        ++polls;
        const uint64_t waited = cpnet_globaltimer_ns() - start;
        if (waited > CPNET_ABORT_CHECK_AFTER_NS && (polls & (CPNET_ABORT_CHECK_EVERY - 1)) == 0) {
            /* The GPU-memory mirror at every check; the host words (a PCIe
             * read each) only every CPNET_ABORT_HOST_EVERY checks, a fallback. */
            const bool host = (polls & (CPNET_ABORT_CHECK_EVERY * CPNET_ABORT_HOST_EVERY - 1)) == 0;
            int a = abort_code(ctx, host);
            if (a != CPNET_E_OK) return a;
        }
        if (ctx->wait_timeout_ns != 0 && waited > ctx->wait_timeout_ns)
            return CPNET_E_TIMEOUT;
        if (polls > CPNET_SPIN_TIGHT_POLLS) {
            sleep_ns = sleep_ns == 0 ? CPNET_BACKOFF_MIN_NS
                                     : (sleep_ns * 2 > max_ns ? max_ns : sleep_ns * 2);
            cpnet_sleep_ns(sleep_ns);
        }
        return CPNET_E_OK;
    }
};

/** The heap offset a command concerns, for error reports: the remote address
 *  for PUT/PUT_SIGNAL/AMO, the remote source for GET, 0 otherwise. */
__device__ __forceinline__ uint64_t cmd_addr(const cpnet_cmd_t& c)
{
    if (c.opcode == CPNET_OP_GET) return c.src;
    if (c.opcode == CPNET_OP_PUT || c.opcode == CPNET_OP_PUT_SIGNAL || c.opcode == CPNET_OP_AMO)
        return c.dst;
    return 0;
}

/**
 * Enqueue one command (leader only): P1 reserve, P2 fill, P3 publish.
 * `c.commit` is ignored. On success stores the command's seq in `*seq_out`
 * and returns CPNET_E_OK. Fails with CPNET_E_NO_QUEUE (the context holds no
 * queue), the abort code, or CPNET_E_TIMEOUT (the ring stayed full past the
 * timeout; reported in the status block with dev_addr = the command's heap
 * offset, dev_expected = the ctl.consumed value needed, dev_found = the last
 * one read, dev_cmp = CPNET_CMP_GE). A failed enqueue publishes nothing.
 */
__device__ __noinline__ inline int submit(cpnet_ctx_t* ctx, const cpnet_cmd_t& c, uint64_t* seq_out)
{
    if (ctx->ctl == nullptr) return CPNET_E_NO_QUEUE;
    const uint64_t seq = ctx->write_idx;
    const uint64_t depth = ctx->mask + 1;

    /* P1 Space: slot seq is free once seq - consumed < depth. Trust the cached
     * copy first; only when the ring looks full re-read ctl.consumed. */
    if (seq - ctx->cached_consumed >= depth) {
        spin sp;
        for (;;) {
            /* P1 acquire, pairs with C3 (consumer's release store of consumed):
             * the consumer's reads of the slot we are about to overwrite
             * happen before our overwrite. */
            const uint64_t consumed = cpnet_ld_acquire_sys_u64(&ctx->ctl->consumed);
            ctx->cached_consumed = consumed;
            if (seq - consumed < depth) break;
            const int e = sp.pause(ctx);
            if (e != CPNET_E_OK) {
                if (e == CPNET_E_TIMEOUT)
                    report_dev_error(ctx, e, c.pe, cmd_addr(c), seq + 1 - depth, consumed,
                                     CPNET_CMP_GE);
                return e;
            }
        }
    }

    cpnet_cmd_t* slot = ctx->slots + (seq & ctx->mask);
    uint64_t* w = reinterpret_cast<uint64_t*>(slot);
    /* Word 0: opcode, flags, dtype, subop (bytes 0..3), pe (bytes 4..7),
     * little-endian, as laid out in cpnet_cmd_t. */
    const uint64_t w0 = (uint64_t)c.opcode | ((uint64_t)c.flags << 8) | ((uint64_t)c.dtype << 16) |
                        ((uint64_t)c.subop << 24) | ((uint64_t)(uint32_t)c.pe << 32);
    /* P2 Fill: words 0..6 with weak (vector) stores; no order among them is
     * needed, P3's release orders all of them before the commit word. */
    cpnet_st_v2_u64(w + 0, w0, c.size);
    cpnet_st_v2_u64(w + 2, c.dst, c.src);
    cpnet_st_v2_u64(w + 4, c.value, c.cond);
    cpnet_st_weak_u64(w + 6, c.sig);
    /* P3 Publish: commit = seq + 1 with release at system scope; pairs with C1
     * (the consumer's acquire load of the commit word). The commit word
     * carries the lap, so the previous lap's seq + 1 - depth is never taken
     * as new. Release is cumulative: the put source written by any thread of
     * the block before the caller's block barrier is ordered before it too. */
    cpnet_st_release_sys_u64(&slot->commit, seq + 1);

    ctx->write_idx = seq + 1;
    *seq_out = seq;
    return CPNET_E_OK;
}

/**
 * P0 for the next command (leader only): wait until its payload slot is free,
 * i.e. ctl.completed >= write_idx + 1 - depth, trusting ctx->cached_completed
 * first. Returns the slot's address (in `*slot`) and CPNET_E_OK, the abort
 * code, or CPNET_E_TIMEOUT (reported like submit's, with dev_found = the last
 * ctl.completed read). The caller's block writes the data there, then
 * (after a block barrier) submits the command with CPNET_F_PAYLOAD; nothing
 * else may be submitted on the queue in between.
 */
__device__ __noinline__ inline int reserve_payload(cpnet_ctx_t* ctx, const cpnet_cmd_t& c, uint8_t** slot)
{
    if (ctx->ctl == nullptr) return CPNET_E_NO_QUEUE;
    const uint64_t seq = ctx->write_idx;
    const uint64_t depth = ctx->mask + 1;
    if (seq + 1 > depth + ctx->cached_completed) {
        spin sp;
        for (;;) {
            /* P0 acquire, pairs with C4 (the consumer's release store of
             * completed): the proxy's reads of this payload slot for command
             * seq - depth happen before our overwrite. */
            const uint64_t done = cpnet_ld_acquire_sys_u64(&ctx->ctl->completed);
            ctx->cached_completed = done;
            if (seq + 1 <= depth + done) {
                /* completed <= consumed: P1 holds too, no second read. */
                if (done > ctx->cached_consumed) ctx->cached_consumed = done;
                break;
            }
            const int e = sp.pause(ctx);
            if (e != CPNET_E_OK) {
                if (e == CPNET_E_TIMEOUT)
                    report_dev_error(ctx, e, c.pe, cmd_addr(c), seq + 1 - depth, done, CPNET_CMP_GE);
                return e;
            }
        }
    }
    *slot = ctx->payload + (seq & ctx->mask) * ctx->payload_bytes;
    return CPNET_E_OK;
}

/**
 * Wait until ctl.completed >= `target` (leader only), P4. For a blocking
 * command `seq` pass seq + 1 ("completed > seq"); for quiet pass write_idx.
 * Returns CPNET_E_OK, the abort code, or CPNET_E_TIMEOUT (reported with
 * dev_addr = the command's heap offset, dev_expected = `target`, dev_found =
 * the last ctl.completed read, dev_cmp = CPNET_CMP_GE).
 */
__device__ __noinline__ inline int wait_completed(cpnet_ctx_t* ctx, uint64_t target,
                                                  const cpnet_cmd_t& c)
{
    spin sp;
    for (;;) {
        /* P4 acquire, pairs with C4 (consumer's release store of completed):
         * the command's result/result_seq and error/error_seq, written before
         * it, and the data of a completed GET, are visible after it. */
        const uint64_t done = cpnet_ld_acquire_sys_u64(&ctx->ctl->completed);
        if (done >= target) return CPNET_E_OK;
        const int e = sp.pause(ctx);
        if (e != CPNET_E_OK) {
            if (e == CPNET_E_TIMEOUT)
                report_dev_error(ctx, e, c.pe, cmd_addr(c), target, done, CPNET_CMP_GE);
            return e;
        }
    }
}

/**
 * Wait until ctl.reply names command `seq` (leader only), P4's reply variant:
 * one acquire load per poll says both "complete" and the command's CPNET_E_*.
 * Stores the reply word in `*reply`. Returns CPNET_E_OK, the abort code, or
 * CPNET_E_TIMEOUT (reported like wait_completed's, dev_found = the last
 * ctl.completed read).
 */
__device__ __noinline__ inline int wait_reply(cpnet_ctx_t* ctx, uint64_t seq, const cpnet_cmd_t& c,
                                              uint64_t* reply)
{
    spin sp;
    for (;;) {
        /* P4 (reply) acquire, pairs with C5 (the consumer's release store of
         * ctl.reply): the command's result and a completed GET's data are
         * visible after it. */
        const uint64_t r = cpnet_ld_acquire_sys_u64(&ctx->ctl->reply);
        if ((r >> 8) == seq + 1) {
            *reply = r;
            return CPNET_E_OK;
        }
        const int e = sp.pause(ctx);
        if (e != CPNET_E_OK) {
            if (e == CPNET_E_TIMEOUT) {
                const uint64_t done = cpnet_ld_relaxed_sys_u64(&ctx->ctl->completed);
                report_dev_error(ctx, e, c.pe, cmd_addr(c), seq + 1, done, CPNET_CMP_GE);
            }
            return e;
        }
    }
}

/** ctl.error, read as the whole 8-byte word at CPNET_CTL_OFF_ERROR (the
 *  consumer writes error and error_pad as one word); the low half is the
 *  int32 code. Call only after an acquire of ctl.completed (P4). A rejected
 *  command that carries no code reads as CPNET_E_BAD_OP. */
__device__ __forceinline__ int proxy_error(const cpnet_ctx_t* ctx)
{
    const uint64_t w = cpnet_ld_relaxed_sys_u64((const uint64_t*)&ctx->ctl->error);
    const int e = (int)(int32_t)(uint32_t)w;
    return e != CPNET_E_OK ? e : CPNET_E_BAD_OP;
}

/** Remember the first device-side failure since the last quiet. */
__device__ __forceinline__ void note_error(cpnet_ctx_t* ctx, int e)
{
    if (e != CPNET_E_OK && ctx->pending_error == CPNET_E_OK) ctx->pending_error = e;
}

/** The first device-side failure remembered since the last quiet (note_error),
 *  cleared: a quiet returns it. */
__device__ __forceinline__ int take_pending_error(cpnet_ctx_t* ctx)
{
    const int pending = ctx->pending_error;
    ctx->pending_error = CPNET_E_OK;
    return pending;
}

/**
 * Enqueue a command with CPNET_F_BLOCKING and wait for its completion (leader
 * only). If `fetch`, the command returns a value: it is stored in `*result`
 * (raw 64 bits) when ctl.result_seq == seq + 1. Returns CPNET_E_OK, the
 * proxy's error for this command (ctl.error when ctl.error_seq == seq + 1), a
 * wait failure (abort code, CPNET_E_TIMEOUT), or CPNET_E_BAD_OP when a
 * fetching command completed without a result (a proxy bug).
 */
__device__ __noinline__ inline int call_blocking(cpnet_ctx_t* ctx, cpnet_cmd_t c, bool fetch,
                                                 uint64_t* result)
{
    uint64_t seq = 0;
    c.flags |= CPNET_F_BLOCKING;
    ctx->proxy_used = 1;
    int e = submit(ctx, c, &seq);
    uint64_t reply = 0;
    if (e == CPNET_E_OK) e = wait_reply(ctx, seq, c, &reply);
    if (e != CPNET_E_OK) {
        note_error(ctx, e);
        return e;
    }
    /* The reply word carries the command's CPNET_E_* (C5): no second read. */
    const int code = (int)(reply & 0xffu);
    if (code != CPNET_E_OK) return code;
    if (fetch) {
        /* Ordered by the reply's acquire: C4 wrote the result before C5.
         * The producer issues nothing while it waits, so no later command of
         * this queue can have overwritten it. */
        if (cpnet_ld_relaxed_sys_u64(&ctx->ctl->result_seq) != seq + 1) return CPNET_E_BAD_OP;
        *result = cpnet_ld_relaxed_sys_u64(&ctx->ctl->result);
    }
    return CPNET_E_OK;
}

/** Enqueue a command without waiting (leader only). A failure to enqueue
 *  (abort, timeout on a full ring, no queue) is remembered and returned by
 *  the next quiet. */
__device__ __forceinline__ void call_nbi(cpnet_ctx_t* ctx, const cpnet_cmd_t& c)
{
    uint64_t seq = 0;
    ctx->proxy_used = 1;
    note_error(ctx, submit(ctx, c, &seq));
}

/**
 * Enqueue `opcode` (CPNET_OP_QUIET or CPNET_OP_BARRIER_ALL) blocking without
 * waiting for it (leader only), drain's first half: `*upto` gets the write
 * index that covers it (every command of the queue so far). Returns the
 * submit's result, which drain_finish takes. A caller with other work while
 * the proxy completes the queue posts the drain early and finishes it later
 * (grid.cuh's pair exchange); nothing may go into the queue in between for
 * the finish to clear proxy_used.
 */
__device__ __noinline__ inline int drain_post(cpnet_ctx_t* ctx, uint8_t opcode, uint64_t* upto)
{
    cpnet_cmd_t c = {};
    c.opcode = opcode;
    c.flags = CPNET_F_BLOCKING;
    uint64_t seq = 0;
    const int e = submit(ctx, c, &seq);
    *upto = ctx->write_idx;
    return e;
}

/**
 * drain's second half (leader only): with `posted` (drain_post's result)
 * CPNET_E_OK, wait until completed >= `upto` (drain_post's index: every
 * command up to the drain is complete). Returns, in this order of
 * precedence: the post's or the wait's own failure; the first device-side
 * failure remembered since the last quiet; the proxy's error of the last
 * command rejected since the last quiet (ctl.error_seq moved). Clears both.
 */
__device__ __noinline__ inline int drain_finish(cpnet_ctx_t* ctx, int posted, uint64_t upto)
{
    int e = posted;
    if (e == CPNET_E_OK) {
        cpnet_cmd_t c = {};
        c.opcode = CPNET_OP_QUIET;
        e = wait_completed(ctx, upto, c);
    }
    /* Commands after the drain (none where the caller follows drain_post's
     * rule) are not covered by it. */
    if (e == CPNET_E_OK && ctx->write_idx == upto) {
        ctx->proxy_used = 0;
        ctx->fence_idx = 0;
    }
    const int pending = take_pending_error(ctx);
    if (e != CPNET_E_OK) return e;
    if (pending != CPNET_E_OK) return pending;
    /* Ordered by wait_completed's acquire (P4 / C4). */
    const uint64_t es = cpnet_ld_relaxed_sys_u64(&ctx->ctl->error_seq);
    if (es > ctx->seen_error_seq) {
        ctx->seen_error_seq = es;
        return proxy_error(ctx);
    }
    return CPNET_E_OK;
}

/**
 * Enqueue `opcode` (CPNET_OP_QUIET or CPNET_OP_BARRIER_ALL) blocking and wait
 * until every command of the queue is complete (leader only): drain_post,
 * then drain_finish. Returns as drain_finish.
 */
__device__ __noinline__ inline int drain(cpnet_ctx_t* ctx, uint8_t opcode)
{
    uint64_t upto = 0;
    const int posted = drain_post(ctx, opcode, &upto);
    return drain_finish(ctx, posted, upto);
}

/** Whether a quiet drains the queue (leader only): always without a
 *  peer-to-peer table (every operation went through the queue), else only
 *  where a command went into it since the last drain (proxy_used). */
__device__ __forceinline__ bool quiet_drains(const cpnet_ctx_t* ctx)
{
    return ctx->peers == nullptr || ctx->proxy_used != 0;
}

/** cpnet_quiet's leader part (after every thread's fence of its
 *  peer-to-peer stores): drain the queue where quiet_drains says so, else
 *  return the remembered device-side failure. */
__device__ __forceinline__ int quiet_leader(cpnet_ctx_t* ctx)
{
    return quiet_drains(ctx) ? drain(ctx, CPNET_OP_QUIET) : take_pending_error(ctx);
}

/**
 * Claim a queue of the handle's pool (leader only): try qid = wg % n_queues,
 * then the following ones, each with an acquire CAS of prod.in_use 0 -> 1.
 * On success load write_idx and cached_consumed from the producer block,
 * record the owner, and fill `ctx`. Returns CPNET_E_OK, CPNET_E_NO_QUEUE (every
 * queue is owned), CPNET_E_BAD_ADDR (the handle has no pool, or it is not
 * 64-byte aligned) or CPNET_E_BAD_SIZE (log2_depth outside 1..16).
 */
__device__ __noinline__ inline int create(const cpnet_handle_t* h, cpnet_ctx_t* ctx)
{
    ctx->ctl = nullptr;
    ctx->prod = nullptr;
    ctx->slots = nullptr;
    ctx->status = (cpnet_status_t*)h->status;
    ctx->write_idx = 0;
    ctx->cached_consumed = 0;
    ctx->mask = 0;
    ctx->seen_error_seq = 0;
    ctx->heap_base = h->heap_base;
    ctx->heap_size = h->heap_size;
    ctx->wait_timeout_ns = h->wait_timeout_ns;
    ctx->val = 0;
    ctx->my_pe = h->my_pe;
    ctx->n_pes = h->n_pes;
    ctx->qid = 0;
    ctx->wg = block_rank();
    ctx->pending_error = CPNET_E_OK;
    ctx->claims = (uint32_t*)h->claims;
    ctx->n_queues = h->n_queues;
    ctx->proxy_used = 0;
    ctx->peers = (const uint64_t*)h->peers;
    ctx->fence_idx = 0;
    ctx->payload = nullptr;
    ctx->cached_completed = 0;
    ctx->payload_bytes = 0;
    ctx->n_teams = h->teams != 0 ? h->n_teams : 0;
    ctx->teams = (const cpnet_team_desc_t*)h->teams;
    ctx->world_ok = 0;
    ctx->world_all_p2p = 0;

    if (h->queues == 0 || (h->queues & (CPNET_SLOT_BYTES - 1)) != 0 || h->n_queues == 0)
        return CPNET_E_BAD_ADDR;
    if (h->log2_depth < 1 || h->log2_depth > 16) return CPNET_E_BAD_SIZE;

    const uint64_t depth = 1ull << h->log2_depth;
    const uint64_t stride = CPNET_QUEUE_HEADER_BYTES + depth * CPNET_SLOT_BYTES;
    for (uint32_t i = 0; i < h->n_queues; ++i) {
        const uint32_t q = (uint32_t)(((uint64_t)ctx->wg + i) % h->n_queues);
        uint8_t* base = (uint8_t*)(h->queues + (uint64_t)q * stride);
        cpnet_queue_prod_t* prod = (cpnet_queue_prod_t*)(base + CPNET_QUEUE_OFF_PROD);
        /* Acquire: pairs with the previous owner's release store of the claim
         * word (claims[q] in GPU memory, or prod.in_use without claims) in
         * ctx_destroy, after which its write_idx/cached_consumed are ours. */
        if (ctx->claims != nullptr) {
            if (cpnet_atom_cas_acquire_sys_u32(ctx->claims + q, 0u, 1u) != 0u) continue;
            /* in_use then only tells the proxy which queues to poll. */
            cpnet_st_relaxed_sys_u32(&prod->in_use, 1u);
        } else if (cpnet_atom_cas_acquire_sys_u32(&prod->in_use, 0u, 1u) != 0u) {
            continue;
        }
        ctx->ctl = (cpnet_queue_ctl_t*)(base + CPNET_QUEUE_OFF_CTL);
        ctx->prod = prod;
        ctx->slots = (cpnet_cmd_t*)(base + CPNET_QUEUE_OFF_SLOTS);
        ctx->mask = depth - 1;
        ctx->qid = q;
        if (h->payload != 0 && h->payload_bytes >= 16 && (h->payload_bytes & (h->payload_bytes - 1)) == 0) {
            ctx->payload = (uint8_t*)(h->payload + ((uint64_t)q << h->log2_depth) * h->payload_bytes);
            ctx->payload_bytes = h->payload_bytes;
        }
        ctx->write_idx = cpnet_ld_relaxed_sys_u64(&prod->write_idx);
        ctx->cached_consumed = cpnet_ld_relaxed_sys_u64(&prod->cached_consumed);
        /* Errors of earlier owners are not ours. */
        ctx->seen_error_seq = cpnet_ld_relaxed_sys_u64(&ctx->ctl->error_seq);
        /* The world team's entry and peer mapping, once per context (plain
         * loads: the host wrote the world entry before any kernel ran and
         * never rewrites it; the peer table is fixed for the job). */
        if (ctx->teams != nullptr && ctx->n_teams > CPNET_TEAM_WORLD && ctx->teams[CPNET_TEAM_WORLD].size > 0) {
            ctx->world = ctx->teams[CPNET_TEAM_WORLD];
            ctx->world_ok = 1;
            uint32_t all = ctx->peers != nullptr ? 1u : 0u;
            for (int32_t j = 0; all != 0 && j < ctx->world.size; ++j) {
                const int32_t pe = ctx->world.start + j * ctx->world.stride;
                if (j != ctx->world.my_idx && (pe < 0 || pe >= ctx->n_pes || ctx->peers[pe] == 0)) all = 0;
            }
            ctx->world_all_p2p = all;
        }
        /* For the proxy's error reports only; no ordering needed. */
        cpnet_st_relaxed_sys_u32(&prod->owner, ctx->wg);
        /* Claim signal (cmd.h): release orders the in_use store above before
         * it; pairs with the proxy's acquire load of claim_gen. */
        if (ctx->status != nullptr) cpnet_red_add_release_sys_u32(&ctx->status->claim_gen, 1u);
        return CPNET_E_OK;
    }
    return CPNET_E_NO_QUEUE;
}

/** Return the context's queue (leader only): drain (quiet) where a command
 *  went in since the last drain, store the producer's private indices back,
 *  then release-store in_use = 0 (pairs with the next owner's acquire CAS).
 *  Returns the drain's result (without one, the device-side failure
 *  remembered since the last quiet, or CPNET_E_OK). */
__device__ __noinline__ inline int destroy(cpnet_ctx_t* ctx)
{
    if (ctx->ctl == nullptr) return CPNET_E_NO_QUEUE;
    /* Nothing went into the queue since the last drain (proxy_used is set
     * by every submit but the drain's own): the queue is complete already,
     * and that drain reported the proxy's errors; a device-side failure
     * since (pending_error) is still this call's to return. */
    const int e = ctx->proxy_used ? drain(ctx, CPNET_OP_QUIET) : take_pending_error(ctx);
    cpnet_st_relaxed_sys_u64(&ctx->prod->write_idx, ctx->write_idx);
    cpnet_st_relaxed_sys_u64(&ctx->prod->cached_consumed, ctx->cached_consumed);
    if (ctx->claims != nullptr) {
        cpnet_st_relaxed_sys_u32(&ctx->prod->in_use, 0u);
        /* Release: pairs with the next owner's acquire CAS of claims[qid];
         * orders the index and in_use stores above before it. */
        cpnet_st_release_sys_u32(ctx->claims + ctx->qid, 0u);
    } else {
        cpnet_st_release_sys_u32(&ctx->prod->in_use, 0u);
    }
    ctx->ctl = nullptr;
    ctx->prod = nullptr;
    ctx->slots = nullptr;
    return e;
}

/**
 * Run `leader_fn` (returning a CPNET_E_*) on the leader thread as one
 * work-group-collective call, and broadcast its result through ctx->ret.
 *
 * Entry barrier: (1) every thread's earlier writes -- e.g. a put source --
 * happen before the leader's publish; the leader's st.release.sys commit is
 * cumulative over them, so no extra fence.acq_rel.sys is needed (PTX memory
 * model: bar.sync orders the block's accesses at CTA scope; the release at
 * system scope then carries all of them to the proxy). (2) every thread has
 * read the previous call's broadcast before the leader overwrites it.
 * Exit barrier: the leader's result, and everything the leader observed with
 * acquire (a GET's data), is visible to every thread after it.
 */
template <typename F>
__device__ __forceinline__ int collective(cpnet_ctx_t* ctx, F&& leader_fn)
{
    __syncthreads();
    if (is_leader()) ctx->ret = leader_fn();
    __syncthreads();
    return ctx->ret;
}

/** The low sizeof(T) bytes of a 64-bit word hold T's bit pattern, upper bytes
 *  zero (zero extension, also for signed T). */
template <typename T>
__device__ __forceinline__ uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "cpnet: at most 8 bytes inline");
    /* Byte copy through unsigned char (well-defined aliasing; compiles to moves). */
    const unsigned char* s = reinterpret_cast<const unsigned char*>(&v);
    uint64_t b = 0;
    for (unsigned i = 0; i < sizeof(T); ++i) b |= (uint64_t)s[i] << (8 * i);
    return b;
}

/** T from the low sizeof(T) bytes of a 64-bit word (truncation). */
template <typename T>
__device__ __forceinline__ T from_bits(uint64_t b)
{
    static_assert(sizeof(T) <= 8, "cpnet: at most 8 bytes inline");
    T v;
    unsigned char* d = reinterpret_cast<unsigned char*>(&v);
    for (unsigned i = 0; i < sizeof(T); ++i) d[i] = (unsigned char)(b >> (8 * i));
    return v;
}

} /* namespace cpnet_detail */

#endif /* CPNET_QUEUE_CUH */
