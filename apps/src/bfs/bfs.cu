/*
 * The GPU kernels of `bfs -variant intra-kernel` and `-variant inter-kernel`
 * (design and protocol in apps/src/bfs/gpu.rs; the same top-down search as
 * the CPU work-groups' in apps/src/bfs.rs).
 *
 * Prepended by the host: the #defines of apps/src/gpu.rs (APP_CTL_*,
 * APP_OP_*) and of bfs/gpu.rs (BFS_*), then gpu/common.cuh.
 *
 *   bfs_persistent   -variant intra-kernel: one cooperative launch per
 *                    search, every round (init, expand, send, wait, receive)
 *                    with grid barriers between the phases;
 *   bfs_init_k, bfs_expand_k, bfs_exchange_k, bfs_receive_k
 *                    -variant inter-kernel: the same phases as separate
 *                    launches, the host deciding after each exchange whether
 *                    the search goes on.
 *
 * Round r expands the frontier of level r (queue[r & 1], count st[r & 1])
 * into level r + 1 (queue[(r + 1) & 1], st[(r + 1) & 1]); its messages carry
 * signal value seq = seq0 + r + 1. A message to PE d is
 * [frontier size of the sender, pairs k, k words (v << 32 | u)] in d's receive
 * slot (seq & 1, sender); the signal (SET seq) follows its data.
 */

/** Everything the kernels need besides the cpnet handle (by value; every
 *  field 8 bytes, mirrored by BfsParams in bfs/gpu.rs). */
struct bfs_params {
    app_u64 rows;   /* device: u64 [nl + 1] row offsets */
    app_u64 cols;   /* device: u32 [arcs] arc targets (global ids) */
    app_u64 level;  /* device: u32 [nl] level, BFS_UNVISITED if not reached */
    app_u64 parent; /* device: u64 [nl] parent (global id), ~0 if not reached */
    app_u64 queue;  /* device: u32 [2][nl] frontier queues by round parity */
    app_u64 sent;   /* device: u64 [ceil(n / 64)] remote vertices sent this search */
    app_u64 state;  /* device: u64 [BFS_ST_OUT + n_pes] counters (BFS_ST_*) */
    app_u64 ctl;    /* the control block */
    app_u64 send;   /* heap: u64 [n_pes][slot] outgoing message per destination */
    app_u64 recv;   /* heap: u64 [2][n_pes][slot] message per (seq parity, source) */
    app_u64 sig;    /* heap: u64 [n_pes] signal per source (last seq) */
    app_i64 n, nl, lo, block, slot, n_pes, me, root;
    app_i64 seq0;   /* this search's signals are seq0 + round + 1 */
    app_i64 round;  /* inter-kernel: the round of this launch */
};

__device__ __forceinline__ unsigned bfs_ld_u32(const unsigned* p)
{
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/** A word another PE (or the proxy) delivered: through L2 (an SM may still
 *  hold the slot's previous message in L1). */
__device__ __forceinline__ app_u64 bfs_ld_msg(const app_u64* p) { return __ldcg(p); }

__device__ __forceinline__ app_u64* bfs_st(const bfs_params& p) { return (app_u64*)p.state; }

/** Level lvl1 and parent u for local vertex vl if nobody claimed it first;
 *  then it joins the next frontier. */
__device__ __forceinline__ void bfs_claim(const bfs_params& p, unsigned vl, app_u64 u, unsigned lvl1, unsigned* next,
                                          app_u64* next_cnt)
{
    unsigned* level = (unsigned*)p.level;
    if (bfs_ld_u32(&level[vl]) != BFS_UNVISITED) return;
    if (atomicCAS(&level[vl], BFS_UNVISITED, lvl1) != BFS_UNVISITED) return;
    ((app_u64*)p.parent)[vl] = u;
    next[atomicAdd(next_cnt, 1ull)] = vl;
}

/** Reset the search state for p.root (thread t of nt): every level and
 *  parent, the sent bitmap, the counters; the root's owner puts it in the
 *  frontier of round 0. */
__device__ void bfs_init(const bfs_params& p, app_u64 t, app_u64 nt)
{
    const bool mine = p.root >= p.lo && p.root < p.lo + p.nl;
    const app_u64 rl = (app_u64)(p.root - p.lo);
    unsigned* level = (unsigned*)p.level;
    app_u64* parent = (app_u64*)p.parent;
    for (app_u64 i = t; i < (app_u64)p.nl; i += nt) {
        const bool root = mine && i == rl;
        level[i] = root ? 0u : BFS_UNVISITED;
        parent[i] = root ? (app_u64)p.root : ~0ull;
    }
    app_u64* sent = (app_u64*)p.sent;
    for (app_u64 i = t; i < ((app_u64)p.n + 63) / 64; i += nt) sent[i] = 0;
    if (t == 0) {
        app_u64* st = bfs_st(p);
        ((unsigned*)p.queue)[0] = (unsigned)rl;
        st[0] = mine ? 1 : 0;
        st[1] = 0;
        st[BFS_ST_TOTAL] = 0;
        for (app_i64 d = 0; d < p.n_pes; ++d) st[BFS_ST_OUT + d] = 0;
    }
}

/** Round r's expansion of its F frontier vertices, one warp per vertex
 *  (warp gw of nw): a local target is claimed at once; a remote one not
 *  sent yet this search goes into its owner's message. */
__device__ void bfs_expand(const bfs_params& p, app_u64 r, app_u64 F, app_u64 gw, app_u64 nw)
{
    const unsigned lane = threadIdx.x & 31u;
    const app_u64 nl = (app_u64)p.nl, lo = (app_u64)p.lo;
    const unsigned* cur = (const unsigned*)p.queue + (r & 1ull) * nl;
    unsigned* next = (unsigned*)p.queue + ((r + 1) & 1ull) * nl;
    app_u64* st = bfs_st(p);
    app_u64* next_cnt = &st[(r + 1) & 1ull];
    const app_u64* rows = (const app_u64*)p.rows;
    const unsigned* cols = (const unsigned*)p.cols;
    app_u64* sent = (app_u64*)p.sent;
    app_u64* send = (app_u64*)p.send;
    const unsigned block = (unsigned)p.block, me = (unsigned)p.me;
    for (app_u64 i = gw; i < F; i += nw) {
        const unsigned ul = __ldcg(&cur[i]);
        const app_u64 u = lo + ul;
        const app_u64 end = rows[ul + 1];
        for (app_u64 a = rows[ul] + lane; a < end; a += 32) {
            const unsigned v = cols[a];
            const unsigned o = v / block;
            if (o == me) {
                bfs_claim(p, (unsigned)(v - lo), u, (unsigned)r + 1, next, next_cnt);
                continue;
            }
            const app_u64 bit = 1ull << (v & 63u);
            app_u64* w = &sent[v >> 6];
            if ((app_ld_relaxed_gpu(w) & bit) != 0 || (atomicOr(w, bit) & bit) != 0) continue;
            const app_u64 k = atomicAdd(&st[BFS_ST_OUT + o], 1ull);
            send[(app_u64)o * (app_u64)p.slot + 2 + k] = ((app_u64)v << 32) | u;
        }
    }
}

/** Block-collective: send this round's message (seq, frontier size F) to
 *  every other PE d = first, first + stride, ..., then quiet (so the send
 *  slots may be refilled next round). Returns a CPNET_E_*. */
__device__ int bfs_send(cpnet_ctx_t* ctx, const bfs_params& p, app_u64 seq, app_u64 F, app_i64 first, app_i64 stride)
{
    app_u64* st = bfs_st(p);
    for (app_i64 d = first; d < p.n_pes; d += stride) {
        if (d == p.me) continue;
        app_u64* msg = (app_u64*)p.send + (app_u64)d * (app_u64)p.slot;
        const app_u64 k = app_ld_relaxed_gpu(&st[BFS_ST_OUT + d]);
        if (threadIdx.x == 0) {
            msg[0] = F;
            msg[1] = k;
        }
        /* The call's block barrier orders the header before the command. */
        cpnet_putmem_signal_nbi(ctx, app_recv_slot(p, seq, p.me), msg, (k + 2) * 8, (uint64_t*)p.sig + p.me, seq,
                                CPNET_SIGNAL_SET, (int)d);
        if (threadIdx.x == 0) st[BFS_ST_OUT + d] = 0;
    }
    return cpnet_quiet(ctx);
}

/** Block-collective: wait for round seq's message of every other PE; the
 *  sum of every PE's frontier size (F is this PE's) in *total. Returns 0,
 *  -1 (another block failed) or the recorded failure. */
__device__ int bfs_wait_all(const cpnet_handle_t* h, const bfs_params& p, app_u64 seq, app_u64 F, app_u64* total)
{
    app_u64 sum = F;
    for (app_i64 s = 0; s < p.n_pes; ++s) {
        if (s == p.me) continue;
        const int e = app_wait_ge(h, (app_u64*)p.ctl, (const app_u64*)p.sig + s, seq, BFS_OP_FRONTIER, seq);
        if (e != 0) return e;
        sum += bfs_ld_msg(app_recv_slot(p, seq, s));
    }
    *total = sum;
    return 0;
}

/** Round r's received pairs (thread t of nt): claim each (v, u). */
__device__ void bfs_receive(const bfs_params& p, app_u64 r, app_u64 seq, app_u64 t, app_u64 nt)
{
    const app_u64 nl = (app_u64)p.nl, lo = (app_u64)p.lo;
    unsigned* next = (unsigned*)p.queue + ((r + 1) & 1ull) * nl;
    app_u64* next_cnt = &bfs_st(p)[(r + 1) & 1ull];
    for (app_i64 s = 0; s < p.n_pes; ++s) {
        if (s == p.me) continue;
        const app_u64* msg = app_recv_slot(p, seq, s);
        const app_u64 k = bfs_ld_msg(&msg[1]);
        for (app_u64 i = t; i < k; i += nt) {
            const app_u64 w = bfs_ld_msg(&msg[2 + i]);
            bfs_claim(p, (unsigned)((w >> 32) - lo), w & 0xffffffffull, (unsigned)r + 1, next, next_cnt);
        }
    }
}

/* ---------------------------------------------------------------- intra */

/**
 * One search, every round, in one cooperative launch (every block
 * resident). Blocks 0 .. min(grid, n_pes) - 1 hold a context and send the
 * messages; every block waits for every message and claims a share of the
 * received pairs. Grid barriers: after init, after each expansion (the
 * messages are complete), after each receive (the next frontier is
 * complete, and so this PE's receive slots of parity seq & 1 are free: a
 * peer writes them again at seq + 2, after our message of seq + 1). Block
 * 0 writes the rounds run into st[BFS_ST_ROUNDS].
 */
extern "C" __global__ void __launch_bounds__(BFS_THREADS) bfs_persistent(cpnet_handle_t h, bfs_params p)
{
    __shared__ cpnet_ctx_t ctx;
    app_u64* ctl = (app_u64*)p.ctl;
    app_u64* st = bfs_st(p);
    const app_i64 senders = p.n_pes < (app_i64)gridDim.x ? p.n_pes : (app_i64)gridDim.x;
    const bool sender = (app_i64)blockIdx.x < senders;
    int fail = 0;
    if (sender && app_call_failed(p.ctl, cpnet_ctx_create(&h, &ctx), APP_OP_CTX_CREATE, 0, p.me)) fail = 1;
    const app_u64 t = (app_u64)blockIdx.x * blockDim.x + threadIdx.x, nt = (app_u64)gridDim.x * blockDim.x;
    bfs_init(p, t, nt);
    app_u64 gen = 0, r = 0;
    if (fail == 0) fail = app_grid_sync(&h, ctl, ++gen, 0);
    for (; fail == 0; ++r) {
        const app_u64 seq = (app_u64)p.seq0 + r + 1;
        const app_u64 F = app_ld_relaxed_gpu(&st[r & 1ull]);
        bfs_expand(p, r, F, t >> 5, nt >> 5);
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
        /* Every block read F before the barrier: the counter is free for
         * round r + 1's claims (its next frontier). */
        if (blockIdx.x == 0 && threadIdx.x == 0) st[r & 1ull] = 0;
        if (sender && app_call_failed(p.ctl, bfs_send(&ctx, p, seq, F, blockIdx.x, senders), BFS_OP_FRONTIER, seq, p.me)) {
            fail = 1;
            break;
        }
        app_u64 total = 0;
        if ((fail = bfs_wait_all(&h, p, seq, F, &total)) != 0) break;
        if (total == 0) break;
        bfs_receive(p, r, seq, t, nt);
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
    }
    if (fail == 0 && blockIdx.x == 0 && threadIdx.x == 0) st[BFS_ST_ROUNDS] = r + 1;
    if (fail == 0 && sender) app_call_failed(p.ctl, cpnet_ctx_destroy(&ctx), APP_OP_QUIET, 0, p.me);
}

/* ---------------------------------------------------------------- inter */

extern "C" __global__ void __launch_bounds__(BFS_THREADS) bfs_init_k(bfs_params p)
{
    bfs_init(p, (app_u64)blockIdx.x * blockDim.x + threadIdx.x, (app_u64)gridDim.x * blockDim.x);
}

extern "C" __global__ void __launch_bounds__(BFS_THREADS) bfs_expand_k(bfs_params p)
{
    const app_u64 r = (app_u64)p.round;
    const app_u64 t = (app_u64)blockIdx.x * blockDim.x + threadIdx.x, nt = (app_u64)gridDim.x * blockDim.x;
    bfs_expand(p, r, bfs_st(p)[r & 1ull], t >> 5, nt >> 5);
}

/** One block: round p.round's messages to every PE and the wait for every
 *  PE's; the global frontier size into st[BFS_ST_TOTAL] (BFS_TOTAL_FAILED
 *  after a failure, recorded in the control block). */
extern "C" __global__ void __launch_bounds__(BFS_THREADS) bfs_exchange_k(cpnet_handle_t h, bfs_params p)
{
    __shared__ cpnet_ctx_t ctx;
    app_u64* st = bfs_st(p);
    const app_u64 r = (app_u64)p.round, seq = (app_u64)p.seq0 + r + 1;
    const app_u64 F = st[r & 1ull];
    __syncthreads();
    if (threadIdx.x == 0) st[r & 1ull] = 0;
    app_u64 total = BFS_TOTAL_FAILED;
    if (!app_call_failed(p.ctl, cpnet_ctx_create(&h, &ctx), APP_OP_CTX_CREATE, seq, p.me)) {
        if (!app_call_failed(p.ctl, bfs_send(&ctx, p, seq, F, 0, 1), BFS_OP_FRONTIER, seq, p.me) &&
            bfs_wait_all(&h, p, seq, F, &total) != 0)
            total = BFS_TOTAL_FAILED;
        if (app_call_failed(p.ctl, cpnet_ctx_destroy(&ctx), APP_OP_QUIET, seq, p.me)) total = BFS_TOTAL_FAILED;
    }
    if (threadIdx.x == 0) st[BFS_ST_TOTAL] = total;
}

extern "C" __global__ void __launch_bounds__(BFS_THREADS) bfs_receive_k(bfs_params p)
{
    const app_u64 r = (app_u64)p.round;
    bfs_receive(p, r, (app_u64)p.seq0 + r + 1, (app_u64)blockIdx.x * blockDim.x + threadIdx.x,
                (app_u64)gridDim.x * blockDim.x);
}
