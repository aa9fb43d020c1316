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
 *   bfs_persistent_hybrid
 *                    -variant intra-kernel -direction hybrid: the same, with a
 *                    count exchange opening every round and bottom-up rounds
 *                    (frontier bitmaps) where Beamer's rule says;
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
 *
 * Big vertices: a frontier vertex of more than BFS_BIG_DEGREE arcs is not
 * expanded by one warp (a Kronecker graph's largest degree grows with
 * SCALE: 321,192 arcs at SCALE 22, some 10,000 rounds of one warp, which
 * held up every round it was in, on any number of PEs). The warp appends
 * it to the round's big list instead (st[BFS_ST_BIG] packs the count and
 * the arcs so far, so each entry gets its offset in the list's arcs from
 * the same atomic); after a grid barrier every warp of the grid takes
 * equal chunks of those arcs (bfs_expand_big).
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
    app_u64 big;    /* device: u64 [2][big_cap]: a round's big frontier vertices: arc offset, then local id */
    app_i64 big_cap; /* local vertices of degree > BFS_BIG_DEGREE (at least 1) */
    app_i64 n, nl, lo, block, slot, n_pes, me, root;
    app_i64 seq0;   /* this search's signals are seq0 + round + 1 (hybrid: seq0 + 1, + 2, ...) */
    app_i64 round;  /* inter-kernel: the round of this launch */
    double alpha;   /* hybrid: go bottom-up when the frontier's arcs * alpha > the unvisited arcs */
    double beta;    /* hybrid: back to top-down when the frontier's vertices * beta < n */
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

/** atomicAdd(ctr, 1) for each calling lane, as one atomic per distinct
 *  counter among the warp's lanes that call it together (warp-aggregated:
 *  a frontier's claims and sends all go through a few counters, and one
 *  address takes atomics one after another); returns this lane's old
 *  value. The lanes of one call agree on the order of their slots. */
__device__ __forceinline__ app_u64 bfs_inc(app_u64* ctr)
{
    const unsigned active = __activemask();
    const unsigned peers = __match_any_sync(active, (unsigned long long)ctr);
    const int leader = __ffs(peers) - 1;
    const unsigned lane = threadIdx.x & 31u;
    app_u64 base = 0;
    if ((int)lane == leader) base = atomicAdd(ctr, (app_u64)__popc(peers));
    base = __shfl_sync(peers, base, leader);
    return base + (app_u64)__popc(peers & ((1u << lane) - 1u));
}

/** Level lvl1 and parent u for local vertex vl if nobody claimed it first;
 *  then it joins the next frontier. With `arcs` (hybrid searches) its
 *  degree goes into the next frontier's arc count, st[BFS_ST_ARCS + (lvl1 & 1)]. */
__device__ __forceinline__ void bfs_claim(const bfs_params& p, unsigned vl, app_u64 u, unsigned lvl1, unsigned* next,
                                          app_u64* next_cnt, bool arcs)
{
    unsigned* level = (unsigned*)p.level;
    if (bfs_ld_u32(&level[vl]) != BFS_UNVISITED) return;
    if (atomicCAS(&level[vl], BFS_UNVISITED, lvl1) != BFS_UNVISITED) return;
    ((app_u64*)p.parent)[vl] = u;
    next[bfs_inc(next_cnt)] = vl;
    if (arcs) {
        const app_u64* rows = (const app_u64*)p.rows;
        atomicAdd(&bfs_st(p)[BFS_ST_ARCS + (lvl1 & 1u)], rows[vl + 1] - rows[vl]);
    }
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
        const app_u64* rows = (const app_u64*)p.rows;
        st[BFS_ST_ARCS] = mine ? rows[rl + 1] - rows[rl] : 0;
        st[BFS_ST_ARCS + 1] = 0;
        st[BFS_ST_VARCS] = 0;
        st[BFS_ST_BU] = 0;
        st[BFS_ST_SEQS] = 0;
        st[BFS_ST_BIG] = 0;
        for (app_i64 d = 0; d < p.n_pes; ++d) st[BFS_ST_OUT + d] = 0;
    }
}

/** Round r's arc u -> v: a local target is claimed at once; a remote one
 *  not sent yet this search goes into its owner's message. */
__device__ __forceinline__ void bfs_visit(const bfs_params& p, app_u64 r, app_u64 u, unsigned v, bool arcs)
{
    const app_u64 nl = (app_u64)p.nl, lo = (app_u64)p.lo;
    app_u64* st = bfs_st(p);
    const unsigned o = v / (unsigned)p.block;
    if (o == (unsigned)p.me) {
        unsigned* next = (unsigned*)p.queue + ((r + 1) & 1ull) * nl;
        bfs_claim(p, (unsigned)(v - lo), u, (unsigned)r + 1, next, &st[(r + 1) & 1ull], arcs);
        return;
    }
    const app_u64 bit = 1ull << (v & 63u);
    app_u64* w = &((app_u64*)p.sent)[v >> 6];
    if ((app_ld_relaxed_gpu(w) & bit) != 0 || (atomicOr(w, bit) & bit) != 0) return;
    const app_u64 k = bfs_inc(&st[BFS_ST_OUT + o]);
    ((app_u64*)p.send)[(app_u64)o * (app_u64)p.slot + 2 + k] = ((app_u64)v << 32) | u;
}

/** Round r's expansion of its F frontier vertices, one warp per vertex
 *  (warp gw of nw), each arc through bfs_visit; a vertex of more than
 *  BFS_BIG_DEGREE arcs goes into the round's big list instead (its arcs are
 *  bfs_expand_big's, after a grid barrier). */
__device__ void bfs_expand(const bfs_params& p, app_u64 r, app_u64 F, app_u64 gw, app_u64 nw, bool arcs)
{
    const unsigned lane = threadIdx.x & 31u;
    const app_u64 nl = (app_u64)p.nl, lo = (app_u64)p.lo;
    const unsigned* cur = (const unsigned*)p.queue + (r & 1ull) * nl;
    const app_u64* rows = (const app_u64*)p.rows;
    const unsigned* cols = (const unsigned*)p.cols;
    for (app_u64 i = gw; i < F; i += nw) {
        const unsigned ul = __ldcg(&cur[i]);
        const app_u64 u = lo + ul;
        const app_u64 begin = rows[ul], end = rows[ul + 1];
        if (end - begin > BFS_BIG_DEGREE) {
            if (lane == 0) app_big_push(&bfs_st(p)[BFS_ST_BIG], (app_u64*)p.big, (app_u64)p.big_cap, ul, end - begin);
            continue;
        }
        for (app_u64 a = begin + lane; a < end; a += 32) bfs_visit(p, r, u, cols[a], arcs);
    }
}

/** The round's big list (see bfs_expand), after a grid barrier: its arcs
 *  through bfs_visit, in chunks of BFS_BIG_CHUNK per warp (warp gw of nw).
 *  Every thread of the grid calls it; the list is empty in most rounds. */
__device__ void bfs_expand_big(const bfs_params& p, app_u64 r, app_u64 gw, app_u64 nw, bool arcs)
{
    const unsigned* cols = (const unsigned*)p.cols;
    app_big_walk(&bfs_st(p)[BFS_ST_BIG], (const app_u64*)p.big, (app_u64)p.big_cap, (const app_u64*)p.rows,
                 BFS_BIG_CHUNK, gw, nw, [&](app_u64 ul, app_u64 a) { bfs_visit(p, r, (app_u64)p.lo + ul, cols[a], arcs); });
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
__device__ void bfs_receive(const bfs_params& p, app_u64 r, app_u64 seq, app_u64 t, app_u64 nt, bool arcs)
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
            bfs_claim(p, (unsigned)((w >> 32) - lo), w & 0xffffffffull, (unsigned)r + 1, next, next_cnt, arcs);
        }
    }
}

/** The blocks of a persistent kernel that hold a context and send:
 *  0 .. min(grid, n_pes) - 1. */
__device__ __forceinline__ app_i64 bfs_senders(const bfs_params& p)
{
    return p.n_pes < (app_i64)gridDim.x ? p.n_pes : (app_i64)gridDim.x;
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
    const app_i64 senders = bfs_senders(p);
    const bool sender = (app_i64)blockIdx.x < senders;
    int fail = sender && app_call_failed(p.ctl, cpnet_ctx_create(&h, &ctx), APP_OP_CTX_CREATE, 0, p.me) ? 1 : 0;
    const app_u64 t = (app_u64)blockIdx.x * blockDim.x + threadIdx.x, nt = (app_u64)gridDim.x * blockDim.x;
    bfs_init(p, t, nt);
    app_u64 gen = 0, r = 0;
    if (fail == 0) fail = app_grid_sync(&h, ctl, ++gen, 0);
    for (; fail == 0; ++r) {
        const app_u64 seq = (app_u64)p.seq0 + r + 1;
        const app_u64 F = app_ld_relaxed_gpu(&st[r & 1ull]);
        bfs_expand(p, r, F, t >> 5, nt >> 5, false);
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
        if (app_big_any(&st[BFS_ST_BIG])) {
            bfs_expand_big(p, r, t >> 5, nt >> 5, false);
            if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
        }
        /* Every block read F and the big list before the barrier: the
         * counter is free for round r + 1's claims (its next frontier), the
         * list for its expansion. */
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            st[r & 1ull] = 0;
            st[BFS_ST_BIG] = 0;
        }
        if (sender && app_call_failed(p.ctl, bfs_send(&ctx, p, seq, F, blockIdx.x, senders), BFS_OP_FRONTIER, seq, p.me)) {
            fail = 1;
            break;
        }
        app_u64 total = 0;
        if ((fail = bfs_wait_all(&h, p, seq, F, &total)) != 0) break;
        if (total == 0) break;
        bfs_receive(p, r, seq, t, nt, false);
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
    }
    if (fail == 0 && blockIdx.x == 0 && threadIdx.x == 0) st[BFS_ST_ROUNDS] = r + 1;
    if (fail == 0 && sender) app_call_failed(p.ctl, cpnet_ctx_destroy(&ctx), APP_OP_QUIET, 0, p.me);
}

/* --------------------------------------------------------------- hybrid */

/** Where a slot keeps the counts of a count exchange: its last
 *  BFS_COUNT_WORDS words, past every pair (bfs/gpu.rs, slot_words), so the
 *  blocks that start expanding while a sender still puts the counts never
 *  write over them. */
__device__ __forceinline__ app_u64 bfs_counts_at(const bfs_params& p) { return (app_u64)p.slot - BFS_COUNT_WORDS; }

/** Block-collective: this round's counts [F, frontier arcs, unvisited arcs]
 *  of this PE to every other PE d = first, first + stride, ... (from the
 *  counts words of d's send slot, into those of d's receive slot for this
 *  PE), signal SET seq; then quiet. Returns a CPNET_E_*. */
__device__ int bfs_send_counts(cpnet_ctx_t* ctx, const bfs_params& p, app_u64 seq, app_u64 F, app_u64 mf, app_u64 mu,
                               app_i64 first, app_i64 stride)
{
    for (app_i64 d = first; d < p.n_pes; d += stride) {
        if (d == p.me) continue;
        app_u64* msg = (app_u64*)p.send + (app_u64)d * (app_u64)p.slot + bfs_counts_at(p);
        if (threadIdx.x == 0) {
            msg[0] = F;
            msg[1] = mf;
            msg[2] = mu;
        }
        /* The call's block barrier orders the words before the command. */
        cpnet_putmem_signal_nbi(ctx, app_recv_slot(p, seq, p.me) + bfs_counts_at(p), msg, BFS_COUNT_WORDS * 8,
                                (uint64_t*)p.sig + p.me, seq, CPNET_SIGNAL_SET, (int)d);
    }
    return cpnet_quiet(ctx);
}

/** Block-collective: wait for every other PE's counts of seq and add them
 *  to this PE's (c[0..3]: vertices, arcs of the frontier, unvisited arcs).
 *  Returns 0, -1 (another block failed) or the recorded failure. */
__device__ int bfs_wait_counts(const cpnet_handle_t* h, const bfs_params& p, app_u64 seq, app_u64 c[BFS_COUNT_WORDS])
{
    for (app_i64 s = 0; s < p.n_pes; ++s) {
        if (s == p.me) continue;
        const int e = app_wait_ge(h, (app_u64*)p.ctl, (const app_u64*)p.sig + s, seq, BFS_OP_FRONTIER, seq);
        if (e != 0) return e;
        const app_u64* msg = app_recv_slot(p, seq, s) + bfs_counts_at(p);
        for (int i = 0; i < BFS_COUNT_WORDS; ++i) c[i] += bfs_ld_msg(&msg[i]);
    }
    return 0;
}

/** This PE's frontier bitmap: words 2 .. 2 + block / 64 of its own send
 *  slot (never a destination), bit i = local vertex i. */
__device__ __forceinline__ app_u64* bfs_my_bitmap(const bfs_params& p)
{
    return (app_u64*)p.send + (app_u64)p.me * (app_u64)p.slot + 2;
}

/** Block-collective: the bitmap with its header [F, words] (block 0 wrote
 *  the header before the grid barrier that precedes the sends) to every
 *  other PE d = first, first + stride, ..., into its receive slot (seq, me);
 *  then quiet. */
__device__ int bfs_send_bitmap(cpnet_ctx_t* ctx, const bfs_params& p, app_u64 seq, app_i64 first, app_i64 stride)
{
    const app_u64* msg = bfs_my_bitmap(p) - 2;
    const app_u64 words = (app_u64)p.block / 64;
    for (app_i64 d = first; d < p.n_pes; d += stride) {
        if (d == p.me) continue;
        cpnet_putmem_signal_nbi(ctx, app_recv_slot(p, seq, p.me), (void*)msg, (2 + words) * 8, (uint64_t*)p.sig + p.me,
                                seq, CPNET_SIGNAL_SET, (int)d);
    }
    return cpnet_quiet(ctx);
}

/** A bottom-up level (thread t of nt): every unvisited local vertex takes
 *  the first neighbour (in CSR order, as the CPU variant) that is in the
 *  frontier of round seq, found in its owner's bitmap (this PE's own, or
 *  the owner's message). Each vertex is looked at by one thread only. */
__device__ void bfs_scan(const bfs_params& p, app_u64 r, app_u64 seq, app_u64 t, app_u64 nt)
{
    const app_u64 nl = (app_u64)p.nl, block = (app_u64)p.block;
    const unsigned* level = (const unsigned*)p.level;
    const app_u64* rows = (const app_u64*)p.rows;
    const unsigned* cols = (const unsigned*)p.cols;
    const app_u64* mine = bfs_my_bitmap(p);
    unsigned* next = (unsigned*)p.queue + ((r + 1) & 1ull) * nl;
    app_u64* next_cnt = &bfs_st(p)[(r + 1) & 1ull];
    for (app_u64 vl = t; vl < nl; vl += nt) {
        if (bfs_ld_u32(&level[vl]) != BFS_UNVISITED) continue;
        const app_u64 end = rows[vl + 1];
        for (app_u64 a = rows[vl]; a < end; ++a) {
            const app_u64 u = cols[a];
            const app_u64 o = u / block, i = u - o * block;
            const app_u64* bits = o == (app_u64)p.me ? mine : app_recv_slot(p, seq, (app_i64)o) + 2;
            const app_u64 w = o == (app_u64)p.me ? __ldcg(&bits[i >> 6]) : bfs_ld_msg(&bits[i >> 6]);
            if ((w >> (i & 63u)) & 1ull) {
                bfs_claim(p, (unsigned)vl, u, (unsigned)r + 1, next, next_cnt, true);
                break;
            }
        }
    }
}

/**
 * `-direction hybrid`: one search in one cooperative launch, like
 * bfs_persistent, each round opening with a count exchange (signal seq,
 * every PE's frontier size, frontier arcs and unvisited arcs to every PE)
 * whose sums every block takes alike: the search ends on an empty global
 * frontier, and Beamer's rule picks the round's direction (bottom-up once
 * the frontier's arcs * alpha exceed the unvisited arcs, top-down again
 * once its vertices * beta fall under n) the same in every block of every
 * PE. Then, with signal seq + 1:
 *  - top-down: expand, send pairs, wait, receive (as bfs_persistent);
 *  - bottom-up: the frontier as a bitmap of this PE's block (cleared,
 *    grid barrier, bits set, grid barrier), sent to every PE; wait; scan.
 * A grid barrier ends the round. Slot reuse is bfs_persistent's argument
 * with two signals a round: a peer writes parity seq & 1 again at seq + 2,
 * after our message of seq + 1, which we send after reading seq's.
 * Block 0 writes the rounds, the bottom-up rounds and the signals used
 * (st[BFS_ST_ROUNDS], st[BFS_ST_BU], st[BFS_ST_SEQS]).
 */
extern "C" __global__ void __launch_bounds__(BFS_THREADS) bfs_persistent_hybrid(cpnet_handle_t h, bfs_params p)
{
    __shared__ cpnet_ctx_t ctx;
    app_u64* ctl = (app_u64*)p.ctl;
    app_u64* st = bfs_st(p);
    const app_i64 senders = bfs_senders(p);
    const bool sender = (app_i64)blockIdx.x < senders;
    int fail = sender && app_call_failed(p.ctl, cpnet_ctx_create(&h, &ctx), APP_OP_CTX_CREATE, 0, p.me) ? 1 : 0;
    const app_u64 t = (app_u64)blockIdx.x * blockDim.x + threadIdx.x, nt = (app_u64)gridDim.x * blockDim.x;
    const app_u64 local_arcs = ((const app_u64*)p.rows)[p.nl];
    const app_u64 words = (app_u64)p.block / 64;
    bfs_init(p, t, nt);
    app_u64 gen = 0, r = 0, seq = (app_u64)p.seq0, bu = 0;
    bool bottom_up = false;
    if (fail == 0) fail = app_grid_sync(&h, ctl, ++gen, 0);
    for (; fail == 0; ++r) {
        const app_u64 F = app_ld_relaxed_gpu(&st[r & 1ull]);
        const app_u64 mf = app_ld_relaxed_gpu(&st[BFS_ST_ARCS + (r & 1ull)]);
        const app_u64 mu = local_arcs - app_ld_relaxed_gpu(&st[BFS_ST_VARCS]) - mf;
        ++seq;
        if (sender && app_call_failed(p.ctl, bfs_send_counts(&ctx, p, seq, F, mf, mu, blockIdx.x, senders), BFS_OP_FRONTIER,
                                      seq, p.me)) {
            fail = 1;
            break;
        }
        app_u64 c[BFS_COUNT_WORDS] = {F, mf, mu};
        if ((fail = bfs_wait_counts(&h, p, seq, c)) != 0) break;
        if (c[0] == 0) break;
        if (!bottom_up && (double)c[1] * p.alpha > (double)c[2]) bottom_up = true;
        else if (bottom_up && (double)c[0] * p.beta < (double)p.n) bottom_up = false;
        ++seq;
        if (!bottom_up) {
            bfs_expand(p, r, F, t >> 5, nt >> 5, true);
            if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
            if (app_big_any(&st[BFS_ST_BIG])) bfs_expand_big(p, r, t >> 5, nt >> 5, true);
        } else {
            app_u64* bits = bfs_my_bitmap(p);
            for (app_u64 i = t; i < words; i += nt) bits[i] = 0;
            if (t == 0) {
                bits[-2] = F;
                bits[-1] = words;
            }
        }
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
        /* Every block read this round's counters before the barrier: they
         * are free for round r + 2's claims. */
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            st[r & 1ull] = 0;
            st[BFS_ST_ARCS + (r & 1ull)] = 0;
            st[BFS_ST_VARCS] += mf;
            st[BFS_ST_BIG] = 0;
        }
        if (!bottom_up) {
            if (sender && app_call_failed(p.ctl, bfs_send(&ctx, p, seq, F, blockIdx.x, senders), BFS_OP_FRONTIER, seq, p.me)) {
                fail = 1;
                break;
            }
            app_u64 unused = 0;
            if ((fail = bfs_wait_all(&h, p, seq, F, &unused)) != 0) break;
            bfs_receive(p, r, seq, t, nt, true);
        } else {
            const unsigned* cur = (const unsigned*)p.queue + (r & 1ull) * (app_u64)p.nl;
            app_u64* bits = bfs_my_bitmap(p);
            for (app_u64 i = t; i < F; i += nt) {
                const unsigned v = __ldcg(&cur[i]);
                atomicOr(&bits[v >> 6], 1ull << (v & 63u));
            }
            if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
            if (sender && app_call_failed(p.ctl, bfs_send_bitmap(&ctx, p, seq, blockIdx.x, senders), BFS_OP_FRONTIER, seq,
                                          p.me)) {
                fail = 1;
                break;
            }
            app_u64 unused = 0;
            if ((fail = bfs_wait_all(&h, p, seq, F, &unused)) != 0) break;
            bfs_scan(p, r, seq, t, nt);
            ++bu;
        }
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
    }
    if (fail == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        st[BFS_ST_ROUNDS] = r;
        st[BFS_ST_BU] = bu;
        st[BFS_ST_SEQS] = seq - (app_u64)p.seq0;
    }
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
    bfs_expand(p, r, bfs_st(p)[r & 1ull], t >> 5, nt >> 5, false);
}

/** The round's big list (bfs_expand_big), launched after bfs_expand_k. */
extern "C" __global__ void __launch_bounds__(BFS_THREADS) bfs_expand_big_k(bfs_params p)
{
    const app_u64 t = (app_u64)blockIdx.x * blockDim.x + threadIdx.x, nt = (app_u64)gridDim.x * blockDim.x;
    bfs_expand_big(p, (app_u64)p.round, t >> 5, nt >> 5, false);
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
    if (threadIdx.x == 0) {
        st[r & 1ull] = 0;
        st[BFS_ST_BIG] = 0; /* bfs_expand_big_k, before in stream order, is done with it */
    }
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
                (app_u64)gridDim.x * blockDim.x, false);
}
