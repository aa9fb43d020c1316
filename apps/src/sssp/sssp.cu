/*
 * The GPU kernel of `sssp -variant intra-kernel` (design and protocol in
 * apps/src/sssp/gpu.rs; the same delta-stepping as the CPU work-groups' in
 * apps/src/sssp.rs, the same distance words).
 *
 * Prepended by the host: the #defines of apps/src/gpu.rs (APP_CTL_*,
 * APP_OP_*) and of sssp/gpu.rs (SSSP_*), then gpu/common.cuh.
 *
 *   sssp_persistent  one cooperative launch per search: init, then rounds
 *                    (relax, fill, send, wait, apply, decide, scan) with grid
 *                    barriers between the phases, until no PE has a near or
 *                    a far vertex (-variant intra-kernel);
 *   sssp_init_k, sssp_relax_k, sssp_fill_k, sssp_exchange_k, sssp_apply_k,
 *   sssp_scan_k      -variant inter-kernel: the same phases as separate
 *                    launches, the host deciding after each exchange (the
 *                    sums of the headers) how the search goes on.
 *
 * Round r relaxes the near pile of parity r & 1 (count st[r & 1]) and its
 * scan fills parity (r + 1) & 1; its messages carry signal value
 * seq = seq0 + r + 1. A message to PE d, in d's receive slot (seq & 1,
 * sender): the header [near, far, far min, settled, bucket ns, pairs k]
 * then k pairs [v, word]; the signal (SET seq) follows its data.
 *
 * Big vertices (as bfs.cu's): a near vertex of more than SSSP_BIG_DEGREE
 * arcs is not relaxed by one warp; it goes into the round's big list
 * (st[SSSP_ST_BIG] packs the count and the arcs so far, so each entry gets
 * its offset from the same atomic), whose arcs every warp of the grid
 * shares in chunks after a grid barrier (sssp_relax_big; inter-kernel: a
 * launch of its own). A Kronecker hub (321,192 arcs at SCALE 22) otherwise
 * holds one warp for some 10,000 steps while the GPU waits.
 */

/** Header words of a message. */
#define SSSP_HDR 6
#define SSSP_INF 0xffffffffffffffffull

/** Everything the kernel needs besides the cpnet handle (by value; every
 *  field 8 bytes, mirrored by SsspParams in sssp/gpu.rs). */
struct sssp_params {
    app_u64 rows;    /* device: u64 [nl + 1] row offsets */
    app_u64 cols;    /* device: u32 [arcs] arc targets (global ids) */
    app_u64 wts;     /* device: u32 [arcs] arc weights (fixed point) */
    app_u64 dist;    /* heap: u64 [block] distance words of this PE's vertices */
    app_u64 known;   /* device: u64 [nl] the words as the last scan saw them */
    app_u64 far;     /* device: u32 [nl] 1: in the far pile */
    app_u64 stamp;   /* device: u32 [nl] the bucket a vertex was last near in */
    app_u64 near;    /* device: u32 [2][nl] near piles by round parity */
    app_u64 best;    /* device: u64 [n] smallest word sent for a remote vertex */
    app_u64 mark;    /* device: u32 [n] the seq a remote vertex was last queued in */
    app_u64 list;    /* device: u32 [n_pes][block] vertices queued per destination */
    app_u64 state;   /* device: u64 [SSSP_ST_OUT + n_pes] (SSSP_ST_*) */
    app_u64 hist;    /* device: u64 [SSSP_HIST] delta of each bucket */
    app_u64 ctl;     /* the control block */
    app_u64 send;    /* heap: u64 [n_pes][slot] outgoing message per destination */
    app_u64 recv;    /* heap: u64 [2][n_pes][slot] message per (seq parity, source) */
    app_u64 sig;     /* heap: u64 [n_pes] signal per source (last seq) */
    app_u64 big;     /* device: u64 [2][big_cap]: a round's big near vertices: arc offset, then local id */
    app_i64 big_cap; /* local vertices of more than SSSP_BIG_DEGREE arcs (at least 1) */
    app_i64 n, nl, lo, block, slot, n_pes, me, root;
    app_i64 seq0;    /* this search's signals are seq0 + round + 1 */
    app_i64 idb;     /* bits of a vertex id in a word */
    app_i64 dmax;    /* the largest distance a word holds */
    app_i64 delta0;  /* initial delta (fixed point) */
    app_i64 adaptive;/* 1: the adaptive controller, 0: fixed delta */
    app_i64 min_settled; /* a bucket settling fewer widens delta */
    app_i64 round;     /* inter-kernel: the round of this launch */
    app_i64 threshold; /* inter-kernel: the scan's T (the host's decision) */
    app_i64 bucket;    /* inter-kernel: buckets finished (the scan's stamp) */
    app_i64 bucket_ns; /* inter-kernel: ns this PE has spent in the current bucket */
};

__device__ __forceinline__ app_u64* sssp_st(const sssp_params& p) { return (app_u64*)p.state; }

/** The controller of sssp/controller.rs (Controller::bucket_done), the same
 *  arithmetic on the same (global) inputs on every PE and thread. */
struct sssp_ctlr {
    app_u64 initial, delta;
    bool up, has_last;
    double last;

    __device__ app_u64 bucket_done(bool adaptive, app_u64 settled, app_u64 rounds, double secs, app_u64 min_settled)
    {
        if (!adaptive) return delta;
        const double rate = (double)settled / (secs > 1e-9 ? secs : 1e-9);
        if (rounds > SSSP_MAX_ROUNDS)
            up = false;
        else if (settled < min_settled)
            up = true;
        else if (has_last && rate < last)
            up = !up;
        has_last = true;
        last = rate;
        app_u64 lo = initial / SSSP_RANGE;
        if (lo < 1) lo = 1;
        const app_u64 hi = initial > (~0ull / SSSP_RANGE) ? ~0ull : initial * SSSP_RANGE;
        app_u64 d = up ? (delta > ~0ull / 2 ? ~0ull : delta * 2) : delta / 2;
        delta = d < lo ? lo : (d > hi ? hi : d);
        return delta;
    }
};

/** Reset the search state for p.root (thread t of nt). */
__device__ void sssp_init(const sssp_params& p, app_u64 t, app_u64 nt)
{
    const bool mine = p.root >= p.lo && p.root < p.lo + p.nl;
    const app_u64 rl = (app_u64)(p.root - p.lo);
    app_u64* dist = (app_u64*)p.dist;
    app_u64* known = (app_u64*)p.known;
    unsigned* far = (unsigned*)p.far;
    unsigned* stamp = (unsigned*)p.stamp;
    for (app_u64 i = t; i < (app_u64)p.nl; i += nt) {
        const app_u64 w = (mine && i == rl) ? (app_u64)p.root : SSSP_INF;
        dist[i] = w;
        known[i] = w;
        far[i] = 0;
        stamp[i] = (mine && i == rl) ? 0u : ~0u;
    }
    app_u64* best = (app_u64*)p.best;
    for (app_u64 i = t; i < (app_u64)p.n; i += nt) best[i] = SSSP_INF;
    if (t == 0) {
        app_u64* st = sssp_st(p);
        ((unsigned*)p.near)[0] = (unsigned)rl;
        st[0] = mine ? 1 : 0;
        st[1] = 0;
        st[SSSP_ST_FARCNT] = 0;
        st[SSSP_ST_FARMIN] = SSSP_INF;
        st[SSSP_ST_SETTLED] = mine ? 1 : 0;
        st[SSSP_ST_RELAX] = 0;
        st[SSSP_ST_OVERFLOW] = 0;
        st[SSSP_ST_BIG] = 0;
        for (app_i64 d = 0; d < p.n_pes; ++d) st[SSSP_ST_OUT + d] = 0;
    }
}

/** Relax arc `a` (target v) of near vertex u at distance du in round seq:
 *  a local target by atomicMin on its word, a remote one into the cache
 *  `best` and, the first time this round, its owner's list. */
__device__ __forceinline__ void sssp_arc(const sssp_params& p, app_u64 u, app_u64 du, app_u64 a, unsigned s32)
{
    const app_u64 lo = (app_u64)p.lo, idb = (app_u64)p.idb;
    const unsigned v = ((const unsigned*)p.cols)[a];
    const app_u64 nd = du + ((const unsigned*)p.wts)[a];
    app_u64* st = sssp_st(p);
    if (nd > (app_u64)p.dmax) {
        st[SSSP_ST_OVERFLOW] = 1;
        return;
    }
    const app_u64 cand = (nd << idb) | u;
    const unsigned block = (unsigned)p.block;
    const unsigned o = v / block;
    if (o == (unsigned)p.me) {
        atomicMin(&((app_u64*)p.dist)[v - lo], cand);
        return;
    }
    app_u64* best = (app_u64*)p.best;
    if (__ldcg(&best[v]) <= cand || atomicMin(&best[v], cand) <= cand) return;
    if (atomicExch(&((unsigned*)p.mark)[v], s32) == s32) return;
    const app_u64 k = atomicAdd(&st[SSSP_ST_OUT + o], 1ull);
    ((unsigned*)p.list)[(app_u64)o * block + k] = v;
}

/** Relax the F near vertices of round r, one warp per vertex (warp gw of
 *  nw), each arc through sssp_arc; a vertex of more than SSSP_BIG_DEGREE
 *  arcs goes into the round's big list instead (sssp_relax_big's, after a
 *  grid barrier). */
__device__ void sssp_relax(const sssp_params& p, app_u64 r, app_u64 seq, app_u64 F, app_u64 gw, app_u64 nw)
{
    const unsigned lane = threadIdx.x & 31u;
    const app_u64 nl = (app_u64)p.nl, lo = (app_u64)p.lo, idb = (app_u64)p.idb;
    const unsigned* cur = (const unsigned*)p.near + (r & 1ull) * nl;
    const app_u64* rows = (const app_u64*)p.rows;
    app_u64* st = sssp_st(p);
    const unsigned s32 = (unsigned)seq;
    for (app_u64 i = gw; i < F; i += nw) {
        const unsigned ul = __ldcg(&cur[i]);
        const app_u64 beg = rows[ul], end = rows[ul + 1];
        if (end - beg > SSSP_BIG_DEGREE) {
            if (lane == 0) {
                atomicAdd(&st[SSSP_ST_RELAX], end - beg);
                app_big_push(&st[SSSP_ST_BIG], (app_u64*)p.big, (app_u64)p.big_cap, ul, end - beg);
            }
            continue;
        }
        const app_u64 u = lo + ul;
        const app_u64 du = __ldcg(&((const app_u64*)p.known)[ul]) >> idb;
        if (lane == 0) atomicAdd(&st[SSSP_ST_RELAX], end - beg);
        for (app_u64 a = beg + lane; a < end; a += 32) sssp_arc(p, u, du, a, s32);
    }
}

/** The round's big list (see sssp_relax), after a grid barrier: its arcs
 *  through sssp_arc, in chunks of SSSP_BIG_CHUNK per warp (warp gw of nw). */
__device__ void sssp_relax_big(const sssp_params& p, app_u64 seq, app_u64 gw, app_u64 nw)
{
    const app_u64 lo = (app_u64)p.lo, idb = (app_u64)p.idb;
    app_big_walk(&sssp_st(p)[SSSP_ST_BIG], (const app_u64*)p.big, (app_u64)p.big_cap, (const app_u64*)p.rows,
                 SSSP_BIG_CHUNK, gw, nw, [&](app_u64 ul, app_u64 a) {
                     const app_u64 du = __ldcg(&((const app_u64*)p.known)[ul]) >> idb;
                     sssp_arc(p, lo + ul, du, a, (unsigned)seq);
                 });
}

/** Write the pairs [v, best[v]] of every destination's list into its send
 *  slot (thread t of nt; after the relaxation's grid barrier). */
__device__ void sssp_fill(const sssp_params& p, app_u64 t, app_u64 nt)
{
    const app_u64* best = (const app_u64*)p.best;
    const unsigned* list = (const unsigned*)p.list;
    app_u64* st = sssp_st(p);
    for (app_i64 d = 0; d < p.n_pes; ++d) {
        if (d == p.me) continue;
        const app_u64 k = app_ld_relaxed_gpu(&st[SSSP_ST_OUT + d]);
        app_u64* msg = (app_u64*)p.send + (app_u64)d * (app_u64)p.slot + SSSP_HDR;
        const unsigned* l = list + (app_u64)d * (app_u64)p.block;
        for (app_u64 i = t; i < k; i += nt) {
            const unsigned v = __ldcg(&l[i]);
            msg[2 * i] = v;
            msg[2 * i + 1] = __ldcg(&best[v]);
        }
    }
}

/** Block-collective: send this round's message (header hdr[0..5]) to every
 *  other PE d = first, first + stride, ..., then quiet. */
__device__ int sssp_send(cpnet_ctx_t* ctx, const sssp_params& p, app_u64 seq, const app_u64* hdr, app_i64 first,
                         app_i64 stride)
{
    app_u64* st = sssp_st(p);
    for (app_i64 d = first; d < p.n_pes; d += stride) {
        if (d == p.me) continue;
        app_u64* msg = (app_u64*)p.send + (app_u64)d * (app_u64)p.slot;
        const app_u64 k = app_ld_relaxed_gpu(&st[SSSP_ST_OUT + d]);
        if (threadIdx.x < SSSP_HDR - 1) msg[threadIdx.x] = app_ld_relaxed_gpu(&hdr[threadIdx.x]);
        if (threadIdx.x == 0) msg[SSSP_HDR - 1] = k;
        /* The call's block barrier orders the header before the command. */
        cpnet_putmem_signal_nbi(ctx, app_recv_slot(p, seq, p.me), msg, (SSSP_HDR + 2 * k) * 8,
                                (uint64_t*)p.sig + p.me, seq, CPNET_SIGNAL_SET, (int)d);
        if (threadIdx.x == 0) st[SSSP_ST_OUT + d] = 0;
    }
    return cpnet_quiet(ctx);
}

/** What every PE's header of a round adds up to (the same on every PE). */
struct sssp_sums {
    app_u64 near, far, far_min, settled, bucket_ns;
};

/** Block-collective: wait for round seq's message of every other PE and
 *  combine the headers with this PE's (hdr). Returns 0, -1 or the recorded
 *  failure. */
__device__ int sssp_wait_all(const cpnet_handle_t* h, const sssp_params& p, app_u64 seq, const app_u64* hdr,
                             sssp_sums* s)
{
    s->near = app_ld_relaxed_gpu(&hdr[0]);
    s->far = app_ld_relaxed_gpu(&hdr[1]);
    s->far_min = app_ld_relaxed_gpu(&hdr[2]);
    s->settled = app_ld_relaxed_gpu(&hdr[3]);
    s->bucket_ns = app_ld_relaxed_gpu(&hdr[4]);
    for (app_i64 src = 0; src < p.n_pes; ++src) {
        if (src == p.me) continue;
        const int e = app_wait_ge(h, (app_u64*)p.ctl, (const app_u64*)p.sig + src, seq, SSSP_OP_ROUND, seq);
        if (e != 0) return e;
        const app_u64* m = app_recv_slot(p, seq, src);
        s->near += __ldcg(&m[0]);
        s->far += __ldcg(&m[1]);
        const app_u64 fm = __ldcg(&m[2]);
        if (fm < s->far_min) s->far_min = fm;
        s->settled += __ldcg(&m[3]);
        const app_u64 bn = __ldcg(&m[4]);
        if (bn > s->bucket_ns) s->bucket_ns = bn;
    }
    return 0;
}

/** Apply the received pairs of round seq (thread t of nt). */
__device__ void sssp_apply(const sssp_params& p, app_u64 seq, app_u64 t, app_u64 nt)
{
    app_u64* dist = (app_u64*)p.dist;
    const app_u64 lo = (app_u64)p.lo;
    for (app_i64 s = 0; s < p.n_pes; ++s) {
        if (s == p.me) continue;
        const app_u64* m = app_recv_slot(p, seq, s);
        const app_u64 k = __ldcg(&m[SSSP_HDR - 1]);
        for (app_u64 i = t; i < k; i += nt)
            atomicMin(&dist[__ldcg(&m[SSSP_HDR + 2 * i]) - lo], __ldcg(&m[SSSP_HDR + 2 * i + 1]));
    }
}

/** Scan every word (thread t of nt, nt a multiple of 32): a changed word
 *  below T, or a far one that T has passed, joins the next near pile (and
 *  counts as settled once per bucket); a changed word at or past T joins
 *  the far pile. Counts the far pile and its smallest distance. */
__device__ void sssp_scan(const sssp_params& p, app_u64 r, app_u64 T, unsigned bucket, app_u64 t, app_u64 nt)
{
    const app_u64 nl = (app_u64)p.nl, idb = (app_u64)p.idb;
    const unsigned lane = threadIdx.x & 31u;
    app_u64* dist = (app_u64*)p.dist;
    app_u64* known = (app_u64*)p.known;
    unsigned* far = (unsigned*)p.far;
    unsigned* stamp = (unsigned*)p.stamp;
    unsigned* next = (unsigned*)p.near + ((r + 1) & 1ull) * nl;
    app_u64* st = sssp_st(p);
    app_u64* next_cnt = &st[(r + 1) & 1ull];
    const app_u64 end = (nl + 31) / 32 * 32;
    for (app_u64 i = t; i < end; i += nt) {
        bool in_far = false;
        app_u64 fd = SSSP_INF;
        if (i < nl) {
            const app_u64 w = __ldcg(&dist[i]);
            const app_u64 k = known[i];
            const bool changed = w != k;
            unsigned f = far[i];
            if (changed) known[i] = w;
            if (changed || f != 0) {
                const app_u64 d = w >> idb;
                if (d < T) {
                    next[atomicAdd(next_cnt, 1ull)] = (unsigned)i;
                    f = 0;
                    if (stamp[i] != bucket) {
                        stamp[i] = bucket;
                        atomicAdd(&st[SSSP_ST_SETTLED], 1ull);
                    }
                } else {
                    f = 1;
                }
                far[i] = f;
            }
            if (f != 0) {
                in_far = true;
                fd = w >> idb;
            }
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, in_far);
        for (int o = 16; o > 0; o >>= 1) {
            const app_u64 x = __shfl_xor_sync(0xffffffffu, fd, o);
            fd = x < fd ? x : fd;
        }
        if (lane == 0 && ballot != 0) {
            atomicAdd(&st[SSSP_ST_FARCNT], (app_u64)__popc(ballot));
            atomicMin(&st[SSSP_ST_FARMIN], fd);
        }
    }
}

/** This PE's header of a round (one thread): the F near vertices, the far
 *  pile the last scan counted (then reset for the next scan), the vertices
 *  settled so far and ns, the time in the current bucket. */
__device__ void sssp_header(const sssp_params& p, app_u64 F, app_u64 ns)
{
    app_u64* st = sssp_st(p);
    st[SSSP_ST_HDR + 0] = F;
    st[SSSP_ST_HDR + 1] = st[SSSP_ST_FARCNT];
    st[SSSP_ST_HDR + 2] = st[SSSP_ST_FARMIN];
    st[SSSP_ST_HDR + 3] = st[SSSP_ST_SETTLED];
    st[SSSP_ST_HDR + 4] = ns;
    st[SSSP_ST_FARCNT] = 0;
    st[SSSP_ST_FARMIN] = SSSP_INF;
}

/**
 * One search in one cooperative launch (every block resident). Blocks
 * 0 .. min(grid, n_pes) - 1 hold a context and send. Every round:
 *   block 0 composes this PE's header (near, far, far min, settled so far,
 *   time in the bucket) from the last scan's counters, and resets them;
 *   relax | grid | fill | grid | send (senders), wait for every PE's
 *   message | apply | grid | decide (every thread, the same decision on
 *   every PE: the sums of the headers) | scan | grid.
 * Decide: a round that relaxed nothing anywhere ends the bucket: the
 * search ends if no PE has a far vertex; otherwise the controller gives
 * delta, T moves to T + delta (or to the smallest far distance + delta
 * when nothing lies below that) and the scan moves the far vertices below
 * T into the near pile.
 * Block 0 writes the rounds, buckets, last delta and the delta history.
 */
extern "C" __global__ void __launch_bounds__(SSSP_THREADS) sssp_persistent(cpnet_handle_t h, sssp_params p)
{
    __shared__ cpnet_ctx_t ctx;
    app_u64* ctl = (app_u64*)p.ctl;
    app_u64* st = sssp_st(p);
    app_u64* hist = (app_u64*)p.hist;
    const app_i64 senders = p.n_pes < (app_i64)gridDim.x ? p.n_pes : (app_i64)gridDim.x;
    const bool sender = (app_i64)blockIdx.x < senders;
    const bool lead = blockIdx.x == 0 && threadIdx.x == 0;
    int fail = 0;
    if (sender && app_call_failed(p.ctl, cpnet_ctx_create(&h, &ctx), APP_OP_CTX_CREATE, 0, p.me)) fail = 1;
    const app_u64 t = (app_u64)blockIdx.x * blockDim.x + threadIdx.x, nt = (app_u64)gridDim.x * blockDim.x;
    sssp_init(p, t, nt);
    sssp_ctlr c;
    c.initial = c.delta = (app_u64)p.delta0;
    c.up = true;
    c.has_last = false;
    c.last = 0.0;
    app_u64 T = c.delta, gen = 0, r = 0, bucket_rounds = 0, settled0 = 0, buckets = 0;
    app_u64 bucket_t0 = cpnet_globaltimer_ns();
    if (lead) hist[0] = c.delta;
    if (fail == 0) fail = app_grid_sync(&h, ctl, ++gen, 0);
    for (; fail == 0; ++r) {
        const app_u64 seq = (app_u64)p.seq0 + r + 1;
        const app_u64 F = app_ld_relaxed_gpu(&st[r & 1ull]);
        if (lead) sssp_header(p, F, cpnet_globaltimer_ns() - bucket_t0);
        sssp_relax(p, r, seq, F, t >> 5, nt >> 5);
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
        if (app_big_any(&st[SSSP_ST_BIG])) {
            sssp_relax_big(p, seq, t >> 5, nt >> 5);
            if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
        }
        /* Every block read F and the big list before the barrier: the
         * counter is free for round r + 1's scan, the list for its relaxation. */
        if (lead) {
            st[r & 1ull] = 0;
            st[SSSP_ST_BIG] = 0;
        }
        sssp_fill(p, t, nt);
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
        const app_u64* hdr = &st[SSSP_ST_HDR];
        if (sender && app_call_failed(p.ctl, sssp_send(&ctx, p, seq, hdr, blockIdx.x, senders), SSSP_OP_ROUND, seq, p.me)) {
            fail = 1;
            break;
        }
        sssp_sums s;
        if ((fail = sssp_wait_all(&h, p, seq, hdr, &s)) != 0) break;
        sssp_apply(p, seq, t, nt);
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
        if (s.near > 0) {
            ++bucket_rounds;
        } else {
            if (s.far == 0) break;
            const app_u64 settled = s.settled - settled0;
            settled0 = s.settled;
            const app_u64 delta = c.bucket_done(p.adaptive != 0, settled, bucket_rounds, (double)s.bucket_ns * 1e-9,
                                                (app_u64)p.min_settled);
            ++buckets;
            bucket_rounds = 0;
            app_u64 nT = T + delta;
            if (s.far_min >= nT) nT = s.far_min + delta;
            T = nT;
            if (lead) {
                bucket_t0 = cpnet_globaltimer_ns();
                if (buckets < SSSP_HIST) hist[buckets] = delta;
            }
        }
        sssp_scan(p, r, T, (unsigned)buckets, t, nt);
        if ((fail = app_grid_sync(&h, ctl, ++gen, seq)) != 0) break;
    }
    if (fail == 0 && lead) {
        st[SSSP_ST_ROUNDS] = r + 1;
        st[SSSP_ST_BUCKETS] = buckets;
    }
    if (fail == 0 && sender) app_call_failed(p.ctl, cpnet_ctx_destroy(&ctx), APP_OP_QUIET, 0, p.me);
}

/* ---------------------------------------------------------------- inter */

/* -variant inter-kernel: the phases of sssp_persistent as launches in
 * stream order (the stream orders what the grid barriers order there); the
 * host reads the sums after each exchange and decides as the persistent
 * kernel does (sssp/gpu.rs, GpuSssp::inter_kernel). */

__device__ __forceinline__ app_u64 sssp_t() { return (app_u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ app_u64 sssp_nt() { return (app_u64)gridDim.x * blockDim.x; }

extern "C" __global__ void __launch_bounds__(SSSP_THREADS) sssp_init_k(sssp_params p)
{
    sssp_init(p, sssp_t(), sssp_nt());
}

/** Round p.round: block 0 composes this PE's header (p.bucket_ns), every
 *  block relaxes a share of the near pile. */
extern "C" __global__ void __launch_bounds__(SSSP_THREADS) sssp_relax_k(sssp_params p)
{
    const app_u64 r = (app_u64)p.round, seq = (app_u64)p.seq0 + r + 1;
    const app_u64 F = sssp_st(p)[r & 1ull];
    if (blockIdx.x == 0 && threadIdx.x == 0) sssp_header(p, F, (app_u64)p.bucket_ns);
    sssp_relax(p, r, seq, F, sssp_t() >> 5, sssp_nt() >> 5);
}

/** The round's big list (sssp_relax_big), launched after sssp_relax_k. */
extern "C" __global__ void __launch_bounds__(SSSP_THREADS) sssp_relax_big_k(sssp_params p)
{
    sssp_relax_big(p, (app_u64)p.seq0 + (app_u64)p.round + 1, sssp_t() >> 5, sssp_nt() >> 5);
}

/** The pairs into the send slots; the near counter and the big list read
 *  by the relaxation are free again (for this round's scan and the next
 *  round's relaxation). */
extern "C" __global__ void __launch_bounds__(SSSP_THREADS) sssp_fill_k(sssp_params p)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        sssp_st(p)[(app_u64)p.round & 1ull] = 0;
        sssp_st(p)[SSSP_ST_BIG] = 0;
    }
    sssp_fill(p, sssp_t(), sssp_nt());
}

/** One block: the round's messages to every PE, the wait for every PE's,
 *  and the sums of the headers into st[SSSP_ST_SUMS ..] (st[SSSP_ST_XFAIL]
 *  = 1 after a failure, recorded in the control block). */
extern "C" __global__ void __launch_bounds__(SSSP_THREADS) sssp_exchange_k(cpnet_handle_t h, sssp_params p)
{
    __shared__ cpnet_ctx_t ctx;
    app_u64* st = sssp_st(p);
    const app_u64 seq = (app_u64)p.seq0 + (app_u64)p.round + 1;
    int failed = 1;
    sssp_sums s = {0, 0, SSSP_INF, 0, 0};
    if (!app_call_failed(p.ctl, cpnet_ctx_create(&h, &ctx), APP_OP_CTX_CREATE, seq, p.me)) {
        if (!app_call_failed(p.ctl, sssp_send(&ctx, p, seq, &st[SSSP_ST_HDR], 0, 1), SSSP_OP_ROUND, seq, p.me) &&
            sssp_wait_all(&h, p, seq, &st[SSSP_ST_HDR], &s) == 0)
            failed = 0;
        if (app_call_failed(p.ctl, cpnet_ctx_destroy(&ctx), APP_OP_QUIET, seq, p.me)) failed = 1;
    }
    if (threadIdx.x == 0) {
        if (failed == 0) {
            st[SSSP_ST_SUMS + 0] = s.near;
            st[SSSP_ST_SUMS + 1] = s.far;
            st[SSSP_ST_SUMS + 2] = s.far_min;
            st[SSSP_ST_SUMS + 3] = s.settled;
            st[SSSP_ST_SUMS + 4] = s.bucket_ns;
        }
        st[SSSP_ST_XFAIL] = (app_u64)failed;
    }
}

extern "C" __global__ void __launch_bounds__(SSSP_THREADS) sssp_apply_k(sssp_params p)
{
    sssp_apply(p, (app_u64)p.seq0 + (app_u64)p.round + 1, sssp_t(), sssp_nt());
}

/** The scan of round p.round against the host's threshold and bucket. */
extern "C" __global__ void __launch_bounds__(SSSP_THREADS) sssp_scan_k(sssp_params p)
{
    sssp_scan(p, (app_u64)p.round, (app_u64)p.threshold, (unsigned)p.bucket, sssp_t(), sssp_nt());
}
