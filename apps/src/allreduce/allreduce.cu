/*
 * The multi-ring allreduce kernels of the GPU variants (design notes in
 * apps/src/allreduce/gpu.rs; the algorithm, message protocol and flow
 * control are the CPU variant's, apps/src/allreduce.rs, step for step).
 *
 * Prepended by the host: the #defines of gpu.rs (APP_CTL_*, APP_OP_*), the
 * ones of allreduce/gpu.rs (AR_*), then gpu/common.cuh.
 *
 * One block per ring (ring = blockIdx.x), AR_THREADS threads. The block's
 * leader (thread 0) runs the ring's state machine -- which message to send
 * next, whether the next one has arrived -- and publishes one action at a
 * time in shared memory; the whole block then performs it: a
 * putmem_signal_nbi (collective), or the reduction/copy of a received piece
 * (every thread) followed by the acknowledgement (a SET signal at the
 * sender, collective).
 *
 *   ar_ring_<type>   both variants: steps [s0, s1) of `reps` allreduces.
 *                    intra-kernel: one cooperative launch runs every step of
 *                    warmup + iters allreduces, timed between two grid
 *                    barriers; inter-kernel: one launch per ring step.
 */

/** The kernel's parameters (by value; all fields 8 bytes, mirrored by
 *  ArParams in allreduce/gpu.rs). Heap addresses are device pointers into
 *  this PE's symmetric heap. */
struct ar_params {
    app_u64 input;       /* T[count] */
    app_u64 output;      /* T[count] (== input in place) */
    app_u64 staging;     /* rings * slots staging slots of chunk bytes */
    app_u64 sigs;        /* per ring: slots signal words, sig_stride bytes apart per ring */
    app_u64 acks;        /* per ring: one acknowledgement word, 64 bytes apart */
    app_u64 slots;       /* staging slots per ring (K) */
    app_u64 chunk;       /* bytes per staging slot */
    app_u64 sig_stride;  /* bytes between two rings' signal words */
    app_u64 plan;        /* app_u64 table: AR_PLAN_* layout, plan_stride words per ring */
    app_u64 plan_stride;
    app_u64 out_sent;    /* app_u64 scratch: per ring, per piece of the segment: index + 1 of
                            the last message that read that piece of the output (0: none) */
    app_u64 out_sent_stride;
    app_u64 counts;      /* app_u64[2 * rings]: messages sent, received over the ring's life */
    app_u64 ctl;         /* the control block */
    app_u64 piece;       /* elements per message */
    app_i64 prev, next;  /* ring neighbours: receive from prev, send to next */
    app_i64 in_place;
    app_i64 s0, s1;      /* steps to run, [s0, s1) (s1 = steps: to the end) */
    app_i64 warmup;      /* untimed allreduces first */
    app_i64 iters;       /* then these, timed when `timed` */
    app_i64 timed;       /* 1: grid barriers and %globaltimer around the timed ones (cooperative) */
    app_i64 team;        /* 1: block 0 calls the library's reduce to all instead of the rings */
    app_u64 count;       /* elements (for `team`) */
};

/* The plan table of one ring (host: RingPlan), app_u64 words:
 *   [AR_PLAN_STEPS] steps, [AR_PLAN_SEG_OFF] first element of the segment,
 *   [AR_PLAN_SEG_LEN] its elements, [AR_PLAN_N] PEs,
 *   then per block b < n at AR_PLAN_BLOCKS + 3b: first element (absolute),
 *   elements, index of its first piece in the segment's piece numbering,
 *   then per step s <= steps at AR_PLAN_BLOCKS + 3n + 4s: block sent, block
 *   received, index of the first message sent, of the first received
 *   (entry `steps` holds the totals). */
__device__ __forceinline__ app_u64 ar_plan_block(const app_u64* pl, app_u64 b, app_u64 k)
{
    return pl[AR_PLAN_BLOCKS + 3 * b + k];
}
__device__ __forceinline__ app_u64 ar_plan_step(const app_u64* pl, app_u64 s, app_u64 k)
{
    return pl[AR_PLAN_BLOCKS + 3 * pl[AR_PLAN_N] + 4 * s + k];
}

/** Ring `ring`'s signal word of staging slot `slot` (this PE's copy; a
 *  sender passes it as the symmetric address at its next PE). */
__device__ __forceinline__ uint64_t* ar_sig(const ar_params& p, app_u64 ring, app_u64 slot)
{
    return (uint64_t*)(p.sigs + ring * p.sig_stride + 8 * slot);
}

template <typename T> __device__ __forceinline__ T ar_add(T a, T b) { return a + b; }
/* int32 sums wrap, as on the CPU (signed overflow is undefined in C++). */
template <> __device__ __forceinline__ int ar_add<int>(int a, int b)
{
    return (int)((unsigned)a + (unsigned)b);
}

/** out[i] = staged[i] (+ other[i] when `add`) for i < len, by the whole
 *  block: 16-byte words when all three addresses allow, then the rest by
 *  element. The staged piece bypasses L1 (__ldcg): the sender rewrites the
 *  slot every K messages. The sum is ar_add(staged, other), as the CPU
 *  variant computes it. */
template <typename T>
__device__ __forceinline__ void ar_receive(T* out, const T* staged, const T* other, app_u64 len, bool add)
{
    constexpr unsigned V = 16 / sizeof(T);
    union vec {
        uint4 v;
        T t[V];
    };
    app_u64 done = 0;
    if ((((app_u64)out | (app_u64)staged | (app_u64)other) & 15) == 0) {
        const app_u64 nv = len / V;
        const uint4* sv = (const uint4*)staged;
        const uint4* ov = (const uint4*)other;
        uint4* dv = (uint4*)out;
        for (app_u64 i = threadIdx.x; i < nv; i += blockDim.x) {
            vec x;
            x.v = __ldcg(sv + i);
            if (add) {
                vec y;
                y.v = ov[i];
#pragma unroll
                for (unsigned k = 0; k < V; ++k) x.t[k] = ar_add<T>(x.t[k], y.t[k]);
            }
            dv[i] = x.v;
        }
        done = nv * V;
    }
    for (app_u64 i = done + threadIdx.x; i < len; i += blockDim.x) {
        const T x = __ldcg(staged + i);
        out[i] = add ? ar_add<T>(x, other[i]) : x;
    }
}

enum { AR_ACT_IDLE = 0, AR_ACT_SEND = 1, AR_ACT_RECV = 2, AR_ACT_DONE = 3, AR_ACT_STOP = 4 };

/** What the block does next (written by the leader, read by all). */
struct ar_action {
    int kind;
    int reduce;       /* RECV: reduce-scatter (add) or allgather (copy) */
    int probe;        /* IDLE: issue a blocking no-op (see the job failing) */
    app_u64 g;        /* message index */
    app_u64 slot;     /* g % K */
    app_u64 first;    /* first element of the piece (whole buffer) */
    app_u64 len;      /* elements */
    app_u64 src;      /* SEND: device address of the source */
};

/** The leader's cursors over one allreduce's messages. */
struct ar_state {
    app_u64 base_s, base_r;     /* ring counters at the start of this allreduce */
    app_u64 ns, nr;             /* next message to send / receive (index in this allreduce) */
    app_u64 ns_end, nr_end;     /* stop before these (the step range) */
    app_u64 ss, sj, rs, rj;     /* (step, piece) of the next send / receive */
    app_u64 acked;              /* last acknowledgement count read */
    app_u64 idle_since;         /* %globaltimer when the ring stopped making progress (0: it moves) */
    app_u64 last_probe;
    unsigned idle_polls;
};

__device__ __forceinline__ app_u64 ar_pieces(app_u64 len, app_u64 piece) { return (len + piece - 1) / piece; }

/** Advance (s, j) past steps whose block has no piece left (leader). */
__device__ __forceinline__ void ar_skip_empty(const app_u64* pl, app_u64 piece, app_u64* s, app_u64* j, int which,
                                              app_u64 s_end)
{
    while (*s < s_end) {
        const app_u64 blk = ar_plan_step(pl, *s, which);
        if (*j < ar_pieces(ar_plan_block(pl, blk, 1), piece)) break;
        ++*s;
        *j = 0;
    }
}

/**
 * Leader: choose the next action of ring `ring` (the CPU variant's send and
 * receive conditions, in that order). Returns the action in `*a`.
 */
__device__ __noinline__ void ar_decide_leader(const cpnet_handle_t* h, const ar_params& p, app_u64 ring,
                                              const app_u64* pl, ar_state* st, ar_action* a, app_u64 esize)
{
    app_u64* ctl = (app_u64*)p.ctl;
    app_u64* out_sent = (app_u64*)p.out_sent + ring * p.out_sent_stride;
    const app_u64 K = p.slots;
    const app_u64 steps = pl[AR_PLAN_STEPS];
    const app_u64 n_rs = steps / 2;
    const uint64_t* ack = (const uint64_t*)(p.acks + 64 * ring);
    a->probe = 0;
    if (st->ns >= st->ns_end && st->nr >= st->nr_end) {
        a->kind = AR_ACT_DONE;
        return;
    }
    /* Send: the window has room and the piece is ready. */
    if (st->ns < st->ns_end) {
        const app_u64 g = st->base_s + st->ns;
        bool can = true;
        if (g + 1 > st->acked + K) {
            st->acked = cpnet_ld_acquire_sys_u64(ack);
            can = g + 1 <= st->acked + K;
        }
        /* A piece of step s > 0 is the one received at step s - 1. */
        if (can && st->ss > 0 && st->nr <= ar_plan_step(pl, st->ss - 1, 3) + st->sj) can = false;
        if (can) {
            const app_u64 blk = ar_plan_step(pl, st->ss, 0);
            const app_u64 first = ar_plan_block(pl, blk, 0) + st->sj * p.piece;
            const app_u64 rest = ar_plan_block(pl, blk, 1) - st->sj * p.piece;
            const bool from_output = st->ss > 0 || p.in_place != 0;
            if (from_output) out_sent[ar_plan_block(pl, blk, 2) + st->sj] = g + 1;
            a->kind = AR_ACT_SEND;
            a->g = g;
            a->slot = g % K;
            a->first = first;
            a->len = rest < p.piece ? rest : p.piece;
            a->src = (from_output ? p.output : p.input) + first * esize;
            ++st->ns;
            ++st->sj;
            ar_skip_empty(pl, p.piece, &st->ss, &st->sj, 0, steps);
            st->idle_since = 0;
            return;
        }
    }
    /* Receive: the next message has landed and no put still reads its range. */
    if (st->nr < st->nr_end) {
        const app_u64 g = st->base_r + st->nr;
        const app_u64 slot = g % K;
        const uint64_t* sig = ar_sig(p, ring, slot);
        /* Acquire: pairs with the sender's release of the signal (its
         * st.release.sys, or the proxy's after the copy): the piece is
         * visible once the signal is. */
        if (cpnet_ld_acquire_sys_u64(sig) >= g + 1) {
            const app_u64 blk = ar_plan_step(pl, st->rs, 1);
            const app_u64 idx = ar_plan_block(pl, blk, 2) + st->rj;
            bool can = true;
            if (out_sent[idx] > st->acked) {
                st->acked = cpnet_ld_acquire_sys_u64(ack);
                can = out_sent[idx] <= st->acked;
            }
            if (can) {
                const app_u64 first = ar_plan_block(pl, blk, 0) + st->rj * p.piece;
                const app_u64 rest = ar_plan_block(pl, blk, 1) - st->rj * p.piece;
                a->kind = AR_ACT_RECV;
                a->reduce = st->rs < n_rs;
                a->g = g;
                a->slot = slot;
                a->first = first;
                a->len = rest < p.piece ? rest : p.piece;
                ++st->nr;
                ++st->rj;
                ar_skip_empty(pl, p.piece, &st->rs, &st->rj, 1, steps);
                st->idle_since = 0;
                return;
            }
        }
    }
    /* Nothing to do now. Before handing an idle round to the whole block
     * (two block barriers per round), the leader watches, alone, the two
     * words that can change that: the next message's signal and the
     * acknowledgement word (bounded: the checks below still run). */
    {
        const uint64_t* next_sig = st->nr < st->nr_end
            ? ar_sig(p, ring, (st->base_r + st->nr) % K)
            : nullptr;
        const app_u64 want = st->base_r + st->nr + 1;
        for (unsigned k = 0; k < AR_LEADER_SPIN; ++k) {
            if (next_sig != nullptr && cpnet_ld_relaxed_sys_u64(next_sig) >= want) break;
            if (cpnet_ld_relaxed_sys_u64(ack) != st->acked) break;
        }
    }
    /* Idle: bounded, abortable, interrupted by another ring's failure. */
    a->kind = AR_ACT_IDLE;
    const app_u64 now = cpnet_globaltimer_ns();
    if (st->idle_since == 0) {
        st->idle_since = now;
        st->idle_polls = 0;
    }
    ++st->idle_polls;
    if (app_failed(ctl)) {
        a->kind = AR_ACT_STOP;
        return;
    }
    if ((st->idle_polls & (APP_CHECK_EVERY - 1)) == 0) {
        int code = cpnet_abort_code(h, (st->idle_polls & (APP_CHECK_EVERY * APP_ABORT_HOST_EVERY - 1)) == 0);
        if (code == CPNET_E_OK && h->wait_timeout_ns != 0 && now - st->idle_since > h->wait_timeout_ns)
            code = CPNET_E_TIMEOUT;
        if (code != CPNET_E_OK) {
            const bool receiving = st->nr < st->nr_end;
            const app_u64 g = receiving ? st->base_r + st->nr : st->base_s + st->ns;
            const uint64_t* word = receiving ? ar_sig(p, ring, g % K) : ack;
            const app_u64 expected = receiving ? g + 1 : (g + 1 > K ? g + 1 - K : 0);
            app_fail_leader(ctl, code, receiving ? APP_OP_RING_RECV : APP_OP_RING_ACK, g, h->my_pe,
                            (app_u64)word - h->heap_base, expected, cpnet_ld_relaxed_sys_u64(word));
            a->kind = AR_ACT_STOP;
            return;
        }
    }
    /* Polling heap words cannot see the job fail; the queue can (a dead
     * peer's abort, as the CPU variant's probe). */
    if (now - st->last_probe > AR_PROBE_EVERY_NS) {
        a->probe = 1;
        st->last_probe = now;
    }
    if (st->idle_polls > APP_TIGHT_POLLS) __nanosleep(APP_POLL_SLEEP_NS);
}

/**
 * Steps [s0, s1) of one allreduce on ring `ring` (whole block). Returns 0,
 * or nonzero when the ring failed or another one did (recorded).
 */
template <typename T>
__device__ __noinline__ int ar_ring(const cpnet_handle_t* h, cpnet_ctx_t* ctx, const ar_params& p, app_u64 ring)
{
    __shared__ ar_state st;
    __shared__ ar_action act;
    __shared__ app_u64 plan_s[AR_PLAN_SHARED_WORDS];
    app_u64* ctl = (app_u64*)p.ctl;
    const app_u64* pl = (const app_u64*)p.plan + ring * p.plan_stride;
    /* The ring's plan in shared memory when it fits (up to 93 PEs): the
     * leader reads it at every decision, and from global memory those are
     * dependent L2 loads (its acquire loads keep invalidating L1). */
    if (p.plan_stride <= AR_PLAN_SHARED_WORDS) {
        __syncthreads(); /* the previous allreduce's last reads of plan_s are done */
        for (app_u64 i = threadIdx.x; i < p.plan_stride; i += blockDim.x) plan_s[i] = pl[i];
        __syncthreads();
        pl = plan_s;
    }
    const app_u64 steps = pl[AR_PLAN_STEPS];
    if (steps == 0) {
        /* One PE: out of place copies the segment, in place has nothing to do. */
        if (p.s0 == 0 && !p.in_place) {
            const T* in = (const T*)p.input;
            T* out = (T*)p.output;
            const app_u64 off = pl[AR_PLAN_SEG_OFF], len = pl[AR_PLAN_SEG_LEN];
            for (app_u64 i = threadIdx.x; i < len; i += blockDim.x) out[off + i] = in[off + i];
        }
        return 0;
    }
    const app_u64 s0 = (app_u64)p.s0 < steps ? (app_u64)p.s0 : steps;
    const app_u64 s1 = (app_u64)p.s1 < steps ? (app_u64)p.s1 : steps;
    app_u64* counts = (app_u64*)p.counts + 2 * ring;
    if (threadIdx.x == 0) {
        st.base_s = counts[0];
        st.base_r = counts[1];
        st.ns = ar_plan_step(pl, s0, 2);
        st.nr = ar_plan_step(pl, s0, 3);
        st.ns_end = ar_plan_step(pl, s1, 2);
        st.nr_end = ar_plan_step(pl, s1, 3);
        st.ss = st.rs = s0;
        st.sj = st.rj = 0;
        ar_skip_empty(pl, p.piece, &st.ss, &st.sj, 0, steps);
        ar_skip_empty(pl, p.piece, &st.rs, &st.rj, 1, steps);
        st.acked = cpnet_ld_acquire_sys_u64((const uint64_t*)(p.acks + 64 * ring));
        st.idle_since = 0;
        st.idle_polls = 0;
        st.last_probe = cpnet_globaltimer_ns();
    }
    int result = 0;
    for (;;) {
        if (threadIdx.x == 0) ar_decide_leader(h, p, ring, pl, &st, &act, sizeof(T));
        __syncthreads();
        const int kind = act.kind;
        if (kind == AR_ACT_DONE) break;
        if (kind == AR_ACT_STOP) {
            result = -1;
            break;
        }
        if (kind == AR_ACT_SEND) {
            cpnet_putmem_signal_nbi(ctx, (void*)(p.staging + (ring * p.slots + act.slot) * p.chunk),
                                    (const void*)act.src, act.len * sizeof(T),
                                    ar_sig(p, ring, act.slot), act.g + 1,
                                    CPNET_SIGNAL_SET, (int)p.next);
        } else if (kind == AR_ACT_RECV) {
            const T* staged = (const T*)(p.staging + (ring * p.slots + act.slot) * p.chunk);
            T* out = (T*)p.output + act.first;
            const T* in = (const T*)p.input + act.first;
            ar_receive<T>(out, staged, p.in_place ? out : in, act.len, act.reduce != 0);
            /* Collective: its entry barrier orders every thread's reads of the
             * slot (and writes of the output) before the acknowledgement.
             * Messages of a ring are consumed in order, so the count after
             * this one is act.g + 1: a SET signal with no data (one writer
             * per word), not an AMO, which would go through the target's
             * atomic executor (two more copy rounds). */
            uint64_t* ack = (uint64_t*)(p.acks + 64 * ring);
            cpnet_putmem_signal_nbi(ctx, ack, ack, 0, ack, act.g + 1, CPNET_SIGNAL_SET, (int)p.prev);
        } else if (act.probe) {
            const int e = cpnet_nop(ctx);
            if (e != CPNET_E_OK) {
                if (threadIdx.x == 0) app_fail_leader(ctl, e, APP_OP_PROBE, act.g, h->my_pe, ~0ull, 0, 0);
                result = e;
                break;
            }
        }
        __syncthreads(); /* everyone has read `act` before the leader rewrites it */
    }
    if (result == 0 && threadIdx.x == 0 && s1 == steps) {
        counts[0] = st.base_s + ar_plan_step(pl, steps, 2);
        counts[1] = st.base_r + ar_plan_step(pl, steps, 3);
    }
    __syncthreads();
    return result;
}

/** Reduce-name dispatch for ar_team: the library's sum reduce of T. */
__device__ __forceinline__ int ar_sum_reduce(cpnet_ctx_t* ctx, float* d, const float* s, app_u64 n)
{
    return cpnet_float_sum_reduce(ctx, CPNET_TEAM_WORLD, d, s, n);
}
__device__ __forceinline__ int ar_sum_reduce(cpnet_ctx_t* ctx, int* d, const int* s, app_u64 n)
{
    return cpnet_int_sum_reduce(ctx, CPNET_TEAM_WORLD, d, s, n);
}
__device__ __forceinline__ int ar_sum_reduce(cpnet_ctx_t* ctx, double* d, const double* s, app_u64 n)
{
    return cpnet_double_sum_reduce(ctx, CPNET_TEAM_WORLD, d, s, n);
}

/**
 * One allreduce through the library (p.team, `-algo team`): block 0 calls
 * cpnet_<type>_sum_reduce over CPNET_TEAM_WORLD (OpenSHMEM 1.5 §9.9.12;
 * its LL and short rounds up to 1 KiB, then rounds of the team's chunk,
 * device-lib team.cuh); the other blocks have nothing to do. In place is
 * dest == source, which the library allows.
 */
template <typename T>
__device__ __noinline__ int ar_team(cpnet_handle_t* h, cpnet_ctx_t* ctx, const ar_params& p)
{
    if (blockIdx.x != 0) return 0;
    const int e = ar_sum_reduce(ctx, (T*)p.output, (const T*)p.input, p.count);
    if (e != CPNET_E_OK && threadIdx.x == 0)
        app_fail_leader((app_u64*)p.ctl, e, APP_OP_TEAM_REDUCE, 0, h->my_pe, ~0ull, p.output, p.count * sizeof(T));
    return e;
}

/**
 * `warmup + iters` allreduces (steps [s0, s1) of each) on ring blockIdx.x.
 * With p.timed (a cooperative launch): grid barriers after the warm-up and
 * after the timed allreduces, %globaltimer at both in AR_CTL_T0 / AR_CTL_T1.
 */
template <typename T>
__device__ __forceinline__ void ar_kernel(cpnet_handle_t h, const ar_params& p)
{
    __shared__ cpnet_ctx_t ctx;
    app_u64* ctl = (app_u64*)p.ctl;
    const app_u64 ring = blockIdx.x;
    const int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) {
        if (threadIdx.x == 0) app_fail_leader(ctl, e, APP_OP_CTX_CREATE, 0, h.my_pe, ~0ull, 0, 0);
        return;
    }
    int fail = 0;
    for (app_i64 r = 0; r < p.warmup && fail == 0; ++r)
        fail = p.team ? ar_team<T>(&h, &ctx, p) : ar_ring<T>(&h, &ctx, p, ring);
    if (fail == 0 && p.timed) {
        fail = app_grid_sync(&h, ctl, 1, 0);
        if (fail == 0 && ring == 0 && threadIdx.x == 0) ctl[AR_CTL_T0] = cpnet_globaltimer_ns();
    }
    for (app_i64 r = 0; r < p.iters && fail == 0; ++r)
        fail = p.team ? ar_team<T>(&h, &ctx, p) : ar_ring<T>(&h, &ctx, p, ring);
    if (fail == 0 && p.timed) {
        fail = app_grid_sync(&h, ctl, 2, 0);
        if (fail == 0 && ring == 0 && threadIdx.x == 0) ctl[AR_CTL_T1] = cpnet_globaltimer_ns();
    }
    if (fail == 0) {
        const int d = cpnet_ctx_destroy(&ctx);
        if (d != CPNET_E_OK && threadIdx.x == 0) app_fail_leader(ctl, d, APP_OP_QUIET, 0, h.my_pe, ~0ull, 0, 0);
    }
}

extern "C" __global__ void __launch_bounds__(AR_THREADS) ar_ring_float(cpnet_handle_t h, ar_params p)
{
    ar_kernel<float>(h, p);
}
extern "C" __global__ void __launch_bounds__(AR_THREADS) ar_ring_int32(cpnet_handle_t h, ar_params p)
{
    ar_kernel<int>(h, p);
}
extern "C" __global__ void __launch_bounds__(AR_THREADS) ar_ring_double(cpnet_handle_t h, ar_params p)
{
    ar_kernel<double>(h, p);
}
