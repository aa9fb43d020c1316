/*
 * The Jacobi kernels of the GPU variants (apps/src/jacobi/gpu.rs has the
 * design notes; apps/src/jacobi.rs the problem and the CPU variant, whose
 * logic the persistent kernel follows step for step).
 *
 * Prepended by the host: the #defines of gpu.rs (APP_CTL_*, APP_OP_*),
 * the ones of jacobi/gpu.rs (SYNC_*: the sync block of the symmetric heap,
 * JACOBI_CTL_*, JACOBI_TOL, JACOBI_THREADS, and the -phases timers
 * JACOBI_PH_* and their stride JACOBI_PHASES), then gpu/common.cuh.
 *
 *   jacobi_persistent  -variant intra-kernel, and the single-GPU run (solo)
 *   jacobi_step        -variant inter-kernel: one iteration's stencil
 *   jacobi_comm        -variant inter-kernel: the halo exchange and the norm
 *                      reduction of one iteration, between two jacobi_step
 *
 * The arithmetic is the CPU variant's, term for term: a_new = 0.25f *
 * (((E + W) + S) + N) in float (nothing to contract into an FMA: the
 * multiplication comes last), so grids are bit-identical to the CPU
 * reference; the norm's sum of squares is accumulated in double, in a
 * different order than on the CPU (it only decides an early stop and is
 * printed).
 */

/** Everything a Jacobi kernel needs besides the cpnet handle (by value; all
 *  fields 8 bytes, mirrored by JacobiParams in jacobi/gpu.rs). */
struct jacobi_params {
    app_u64 a0, a1;      /* float grids, chunk + 2 rows of nx (halos included) */
    app_u64 sync;        /* the sync block in the symmetric heap (unused when solo) */
    app_u64 ctl;         /* the control block (app_u64[APP_CTL_WORDS]) */
    app_u64 partials;    /* double[2 * gridDim.x] (persistent) or double[blocks] (step) */
    app_u64 norms;       /* app_u64[2 * max_norms]: (iteration, double bits) per norm */
    app_u64 row_start;   /* app_u64[blocks + 1]: block b owns rows [row_start[b], row_start[b+1]) */
    app_i64 nx;          /* columns */
    app_i64 chunk;       /* interior rows of this PE (rows 1..=chunk) */
    app_i64 top_pe;      /* the PE above (its last row is this PE's row 0) */
    app_i64 bottom_pe;   /* the PE below (its first row is this PE's row chunk + 1) */
    app_i64 top_pe_halo; /* the bottom halo row of the PE above (its chunk + 1) */
    app_i64 niter;       /* iterations */
    app_i64 nccheck;     /* norm every nccheck iterations ... */
    app_i64 csv;         /* ... and every 100th unless csv */
    app_i64 solo;        /* 1: one GPU alone, periodic halos copied locally, no cpnet */
    app_i64 iter;        /* jacobi_step / jacobi_comm: the iteration */
    app_i64 blocks;      /* jacobi_comm: blocks of jacobi_step (partials to sum) */
    app_i64 max_norms;   /* capacity of norms */
    app_u64 phases;      /* 0, or app_u64[3 * JACOBI_PHASES]: -phases timers of block 0, the last band block and the norm block (ns) */
    app_u64 ll;          /* heap: u64 [2 parity][2 side][nx] LL halo words (side 0: from the PE above, 1: from below) */
    app_i64 ll_on;       /* 1: LL halos towards neighbours whose heap cpnet_ptr reaches; 0: put-with-signal always */
};

/** -phases: the timers of one timed block, in shared memory written by
 *  thread 0 (a global read-modify-write per mark would add its latency to
 *  the phases it times; registers held across the loop made the stencil
 *  spill) and copied out once at the end. */
struct jacobi_timers {
    int slot;                /* < 0: untimed block, or -phases off */
    unsigned long long t;    /* the last mark */
    unsigned long long* acc; /* shared: ns per phase; JACOBI_PH_ITERS counts */

    __device__ __forceinline__ jacobi_timers(int s, unsigned long long* shared_acc) : slot(s), t(0), acc(shared_acc)
    {
        if (slot < 0 || threadIdx.x != 0) return;
        for (int k = 0; k < JACOBI_PHASES; ++k) acc[k] = 0;
        t = cpnet_globaltimer_ns();
    }
    /** Thread 0: the time since the last mark goes to phase k. */
    __device__ __forceinline__ void mark(int k)
    {
        if (slot < 0 || threadIdx.x != 0) return;
        const unsigned long long now = cpnet_globaltimer_ns();
        acc[k] += now - t;
        t = now;
    }
    __device__ __forceinline__ void count(int k)
    {
        if (slot >= 0 && threadIdx.x == 0) acc[k] += 1;
    }
    __device__ __forceinline__ void flush(const jacobi_params& p) const
    {
        if (slot < 0 || threadIdx.x != 0) return;
        for (int k = 0; k < JACOBI_PHASES; ++k) ((app_u64*)p.phases)[slot * JACOBI_PHASES + k] = acc[k];
    }
};

__device__ __forceinline__ bool jacobi_is_check(app_i64 nccheck, app_i64 csv, app_i64 it)
{
    return it % nccheck == 0 || (csv == 0 && it % 100 == 0);
}
__device__ __forceinline__ bool jacobi_is_check(const jacobi_params& p, app_i64 it)
{
    return jacobi_is_check(p.nccheck, p.csv, it);
}

/** The fields of jacobi_params the norm needs, passed by value to the norm
 *  block's loop: a reference to the kernel's parameters would make the
 *  kernel copy them all to local memory (and the stencil spill more). */
struct jacobi_norm_args {
    app_u64 ctl, partials, norms, sync;
    app_i64 niter, nccheck, csv, max_norms, solo;
};

__device__ __forceinline__ jacobi_norm_args jacobi_norm_args_of(const jacobi_params& p)
{
    return jacobi_norm_args{p.ctl, p.partials, p.norms, p.sync, p.niter, p.nccheck, p.csv, p.max_norms, p.solo};
}

/** V consecutive floats of one thread (V = 4: one 16-byte access). */
template <int V>
struct jacobi_vec {
    float x[V];
};

/** Load V floats at p through L2 only (__ldcg: a row next to a halo may have
 *  been rewritten by a peer copy since this SM last cached it, and nothing
 *  is read twice by one SM in an iteration anyway); zeros when !ok. */
template <int V>
__device__ __forceinline__ jacobi_vec<V> jacobi_ld(const float* p, bool ok)
{
    jacobi_vec<V> v;
    if (!ok) {
#pragma unroll
        for (int i = 0; i < V; ++i) v.x[i] = 0.0f;
        return v;
    }
    if constexpr (V == 4) {
        const float4 f = __ldcg(reinterpret_cast<const float4*>(p));
        v.x[0] = f.x;
        v.x[1] = f.y;
        v.x[2] = f.z;
        v.x[3] = f.w;
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) v.x[i] = __ldcg(p + i);
    }
    return v;
}

/**
 * Rows [r0, r1) of dst from src (whole block, r0 < r1, rows r0 - 1 and r1
 * readable); returns this thread's share of sum((new - old)^2) when `norm`.
 *
 * The band is swept in column strips of blockDim.x * V columns; thread t owns
 * columns [strip + V t, strip + V t + V) and walks down the rows keeping the
 * rows above, at and below in registers, so each cell is loaded from memory
 * once per sweep (plus two rows per strip), with the next row's load issued
 * before the current row is computed. West and east neighbours come from the
 * adjacent lanes by shuffle (lanes 0 and 31 load theirs). The fixed boundary
 * columns 0 and nx - 1 are written back unchanged (V = 4 writes whole
 * vectors). V = 4 needs nx % 4 == 0 and 16-byte aligned grids.
 */
template <int V>
__device__ __forceinline__ double jacobi_band(const float* src, float* dst, app_i64 nx, app_i64 r0, app_i64 r1,
                                              bool norm)
{
    double sum = 0.0;
    const app_i64 width = (app_i64)blockDim.x * V;
    const unsigned lane = threadIdx.x & 31u;
    for (app_i64 x0 = 0; x0 < nx; x0 += width) {
        const app_i64 col = x0 + (app_i64)threadIdx.x * V;
        const bool ok = col < nx;
        jacobi_vec<V> n = jacobi_ld<V>(src + (r0 - 1) * nx + col, ok);
        jacobi_vec<V> c = jacobi_ld<V>(src + r0 * nx + col, ok);
        jacobi_vec<V> s = jacobi_ld<V>(src + (r0 + 1) * nx + col, ok);
        for (app_i64 r = r0; r < r1; ++r) {
            jacobi_vec<V> next;
            if (r + 2 <= r1) next = jacobi_ld<V>(src + (r + 2) * nx + col, ok);
            float w = __shfl_up_sync(0xffffffffu, c.x[V - 1], 1);
            float e = __shfl_down_sync(0xffffffffu, c.x[0], 1);
            if (lane == 0 && ok && col > 0) w = __ldcg(src + r * nx + col - 1);
            if (lane == 31 && ok && col + V < nx) e = __ldcg(src + r * nx + col + V);
            jacobi_vec<V> o;
#pragma unroll
            for (int i = 0; i < V; ++i) {
                const float wi = i == 0 ? w : c.x[i - 1];
                const float ei = i == V - 1 ? e : c.x[i + 1];
                const app_i64 ix = col + i;
                float v = 0.25f * (((ei + wi) + s.x[i]) + n.x[i]);
                if (ix == 0 || ix >= nx - 1) v = c.x[i];
                o.x[i] = v;
                if (norm) {
                    const float d = v - c.x[i];
                    sum += (double)(d * d);
                }
            }
            if (ok) {
                float* out = dst + r * nx + col;
                if constexpr (V == 4) {
                    *reinterpret_cast<float4*>(out) = make_float4(o.x[0], o.x[1], o.x[2], o.x[3]);
                } else {
#pragma unroll
                    for (int i = 0; i < V; ++i) out[i] = o.x[i];
                }
            }
            n = c;
            c = s;
            s = next;
        }
    }
    return sum;
}

/** Whether jacobi_band<4> applies: nx a multiple of 4, 16-byte aligned
 *  grids, and rows wide enough that 4 columns a thread keeps every thread
 *  busy (else one column a thread). Uniform over the grid. */
__device__ __forceinline__ bool jacobi_vec4(const jacobi_params& p)
{
    return (p.nx & 3) == 0 && ((p.a0 | p.a1) & 15) == 0 && p.nx >= 4 * (app_i64)blockDim.x;
}

/** Rows [r0, r1) (nothing when r0 >= r1); see jacobi_band. */
__device__ __forceinline__ double jacobi_rows(const jacobi_params& p, const float* src, float* dst, app_i64 r0,
                                              app_i64 r1, bool norm)
{
    if (r0 >= r1) return 0.0;
    return jacobi_vec4(p) ? jacobi_band<4>(src, dst, p.nx, r0, r1, norm)
                          : jacobi_band<1>(src, dst, p.nx, r0, r1, norm);
}

/** Copy row `from` of dst to row `to` (the periodic halo of a solo run),
 *  after a block barrier: other threads of the block wrote row `from`. The
 *  boundary columns of halo rows are never read. */
__device__ __forceinline__ void jacobi_copy_row(float* dst, app_i64 nx, app_i64 from, app_i64 to)
{
    __syncthreads();
    for (app_i64 ix = 1 + threadIdx.x; ix < nx - 1; ix += blockDim.x) dst[to * nx + ix] = dst[from * nx + ix];
}

__device__ __forceinline__ app_u64* jacobi_word(app_u64 sync, app_u64 byte_off)
{
    return (app_u64*)(sync + byte_off);
}

/** The norm's thread 0: append (iteration, norm) to the list; the last one
 *  also goes to JACOBI_CTL_LAST_NORM(_ITER) for the inter-kernel host.
 *  `*count` is the list's length (JACOBI_CTL_NNORMS), which a caller that
 *  records many norms keeps between calls instead of loading it each time
 *  (a dependent L2 round trip on the norm's path); it is stored back. */
__device__ __forceinline__ void jacobi_record_norm_leader(const jacobi_norm_args& p, app_i64 at, double norm, app_u64* count)
{
    app_u64* ctl = (app_u64*)p.ctl;
    app_u64* norms = (app_u64*)p.norms;
    const app_u64 k = *count;
    if (k < (app_u64)p.max_norms) {
        norms[2 * k] = (app_u64)at;
        norms[2 * k + 1] = (app_u64)__double_as_longlong(norm);
        *count = k + 1;
        ctl[JACOBI_CTL_NNORMS] = k + 1;
    }
    ctl[JACOBI_CTL_LAST_NORM_ITER] = (app_u64)at;
    ctl[JACOBI_CTL_LAST_NORM] = (app_u64)__double_as_longlong(norm);
}

/**
 * The norm of one check iteration (collective over the block): the sum of
 * the `count` block partials at `parts` on the block's first warp alone
 * (each lane a strided share in order, then a fixed shuffle tree: the same
 * bits for the same grid; no block barrier on one PE), and unless p.solo
 * (one PE) the library's reduce to all over CPNET_TEAM_WORLD
 * (cpnet_double_sum_reduce, OpenSHMEM 1.5 §9.9.12; its LL path between
 * peer-mapped GPUs, the queue otherwise) through the symmetric words
 * SYNC_NORM_SRC / + 8, so every PE gets the same bits. `*norm` (thread 0)
 * is the square root. Returns 0, or nonzero on failure (recorded).
 */
__device__ __noinline__ int jacobi_norm(cpnet_ctx_t* ctx, const jacobi_norm_args& p, const double* parts,
                                        app_u64 count, app_i64 it, double* norm)
{
    double s = 0.0;
    if (threadIdx.x < 32) {
        for (app_u64 k = threadIdx.x; k < count; k += 32) s += __ldcg(parts + k);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    }
    if (p.solo == 0) {
        double* src = (double*)jacobi_word(p.sync, SYNC_NORM_SRC);
        if (threadIdx.x == 0) *src = s;
        /* The reduce's threads read `src`: thread 0's store first. */
        __syncthreads();
        const int e = cpnet_double_sum_reduce(ctx, CPNET_TEAM_WORLD, src + 1, src, 1);
        if (e != CPNET_E_OK) {
            if (threadIdx.x == 0)
                app_fail_leader((app_u64*)p.ctl, e, APP_OP_NORM, (app_u64)it, cpnet_my_pe(ctx), ~0ull, 0, 0);
            return e;
        }
        s = src[1]; /* the reduce ends with a block barrier after its fold */
    }
    if (threadIdx.x == 0) *norm = sqrt(s);
    return 0;
}

/**
 * LL halos (where the neighbour's heap is mapped): a boundary row travels as
 * LL words, each float and the round number `flag` in one 8-byte
 * st.relaxed.sys into the neighbour's words for this side and parity,
 * without a fence or a separate signal (a put-with-signal's
 * st.release.sys waits for the row's stores to be acknowledged across
 * NVLink first: raw_put_signal against raw_ll in `cpnet-gpu-p2p
 * --pingpong`). Whole block; the row's stores come first (block barrier).
 */
__device__ __forceinline__ void jacobi_ll_send(app_u64* to, const float* row, app_i64 nx, app_u64 flag)
{
    __syncthreads();
    for (app_i64 i = threadIdx.x; i < nx; i += blockDim.x)
        cpnet_st_relaxed_sys_u64((uint64_t*)(to + i), (flag << 32) | (app_u64)__float_as_uint(row[i]));
}

/**
 * Wait until each of this PE's `nx` LL words `from` carries round `flag`
 * (each thread polls its own words, ld.relaxed.sys: a word is one store,
 * its float arrives with its flag) and unpack them into the halo row `row`.
 * Whole block; returns 0, or nonzero in every thread when a wait failed
 * (the first failure recorded with the word's heap offset, or another
 * block's failure seen).
 */
__device__ __noinline__ int jacobi_ll_recv(const cpnet_handle_t* h, app_u64* ctl, const app_u64* from, float* row,
                                           app_i64 nx, app_u64 flag, app_u64 op, app_u64 iter)
{
    int r = 0;
    for (app_i64 i = threadIdx.x; i < nx && r == 0; i += blockDim.x) {
        app_u64 w = cpnet_ld_relaxed_sys_u64((const uint64_t*)(from + i));
        if ((w >> 32) != flag) {
            app_spin sp;
            do {
                r = sp.pause(h, ctl);
                if (r != 0) {
                    if (r > 0) app_fail_leader(ctl, r, op, iter, h->my_pe, (app_u64)(from + i) - h->heap_base, flag, w >> 32);
                    break;
                }
                w = cpnet_ld_relaxed_sys_u64((const uint64_t*)(from + i));
            } while ((w >> 32) != flag);
        }
        if (r == 0) row[i] = __uint_as_float((unsigned)w);
    }
    /* The row's stores before the stencil reads them, and one verdict. */
    return __syncthreads_or(r != 0);
}

/**
 * -variant intra-kernel (and the single-GPU run with p.solo): the whole
 * iteration loop in one cooperative launch of gridDim.x co-resident blocks
 * of JACOBI_THREADS threads: band blocks b < gridDim.x - 1 own rows
 * [row_start[b], row_start[b+1]); the last block, the norm block, owns none.
 * Per iteration it (reading grid it % 2, writing grid (it + 1) % 2):
 *
 *  1. The block owning row 1 waits for the top halo of iteration it - 1
 *     (TOP_SIG >= it, SET by the PE above), computes row 1 and pushes it with
 *     putmem_signal_nbi into the bottom halo of the PE above (its BOT_SIG :=
 *     it + 1). The block owning row `chunk` does the same downwards. Where
 *     cpnet_ptr reaches the neighbour (and p.ll_on), the row goes as LL words
 *     instead (jacobi_ll_send, round it + 1, parity (it + 1) % 2), which the
 *     neighbour's boundary block unpacks into its halo row when it waits
 *     for it (jacobi_ll_recv): parity (it + 1) % 2 is written again at it + 2
 *     only after this block received the neighbour's row of it + 1, sent
 *     after it unpacked ours (the put's argument below, word for word). With
 *     three or more band blocks these two own nothing else: every other
 *     block computes its band meanwhile, never waiting on the network.
 *  2. Check iterations: each band block's sum of squared updates goes to
 *     partials[it % 2][b].
 *  3. Meanwhile the norm block computes the norm of the previous check
 *     iteration (jacobi_norm: its partials, then the library's reduce to all
 *     across PEs) and sets JACOBI_CTL_STOP when it is at most JACOBI_TOL.
 *     No band block waits for it during the iteration, the boundary blocks
 *     included (jacobi_norm_loop).
 *  4. The band blocks' barrier, then (after a check iteration it - 1) the
 *     wait for the norm block's verdict on it - 1 (JACOBI_CTL_NORM_DONE,
 *     jacobi_wait_verdict); they stop after it when the verdict says so (a
 *     norm decides one iteration after its own, as in the CPU variant).
 *
 * Why nothing races is the CPU variant's argument (jacobi.rs, "Why nothing
 * races"), with the grid barrier for the team barrier; partials[it % 2] are
 * read by the norm block during iteration it + 1, while the band blocks
 * write the other parity, and rewritten at it + 2, after the barrier that
 * ends it + 1. The put sources need no per-iteration quiet: row 1 of grid
 * B, pushed at iteration it, is rewritten at it + 2 only after this block
 * saw TOP_SIG >= it + 2, which the PE above raised after it waited for
 * BOT_SIG >= it + 1, i.e. after our put of iteration it was delivered
 * (put-with-signal: data first). The same holds downwards. The context's
 * final quiet (ctx_destroy) surfaces any error of a non-blocking put.
 */
/** The band blocks' wait for the norm block's verdict on check iteration
 *  it - 1 (whole block): JACOBI_CTL_NORM_DONE = (k + 1) << 1 | stop for the
 *  last norm k taken, polled by thread 0 with acquire loads (pairing with
 *  the norm block's fence before its store), so one load gives both the
 *  progress and the verdict: (k + 1) >= it is the word >= it << 1. Returns
 *  0 with `*stop`, or the failure (recorded), the same in every thread. */
__device__ __forceinline__ int jacobi_wait_verdict(const cpnet_handle_t* h, app_u64* ctl, app_u64 it, bool* stop)
{
    app_u64 v = 0;
    const int r = app_wait_ge(h, ctl, &ctl[JACOBI_CTL_NORM_DONE], it << 1, APP_OP_NORM, it, &v);
    *stop = (v & 1ull) != 0;
    return r;
}

/** jacobi_persistent's band blocks (b < nc): the halos, the stencil and the
 *  partials, then the grid barrier, every iteration. Returns the first
 *  failure (recorded) or 0; `*it_out` = iterations run. Not inlined, and
 *  apart from the norm block's loop, so the stencil's registers are
 *  allocated without the reduce's call (together they spilled: session
 *  17, ptxas -v). */
__device__ __forceinline__ int jacobi_band_loop(cpnet_handle_t* h, const jacobi_params& p, cpnet_ctx_t* ctx,
                                             jacobi_timers& ph, app_i64* it_out)
{
    app_u64* ctl = (app_u64*)p.ctl;
    float* grid[2] = {(float*)p.a0, (float*)p.a1};
    double* partials = (double*)p.partials;
    const app_u64* rows = (const app_u64*)p.row_start;
    const app_u64 b = blockIdx.x, nc = gridDim.x - 1;
    const app_i64 nx = p.nx, chunk = p.chunk;
    const app_i64 r0 = (app_i64)rows[b], r1 = (app_i64)rows[b + 1];
    const bool solo = p.solo != 0;
    const bool owns_top = r0 == 1; /* always block 0 */
    const bool owns_bottom = r1 == chunk + 1;
    const app_u64 row_bytes = (app_u64)nx * sizeof(float);
    app_u64* top_sig = solo ? nullptr : jacobi_word(p.sync, SYNC_TOP_SIG);
    app_u64* bot_sig = solo ? nullptr : jacobi_word(p.sync, SYNC_BOT_SIG);
    /* LL words: ours at p.ll, the neighbours' where mapped (only the
     * boundary blocks have a context, and only they use them). The peer
     * table is symmetric: the PE above sends us LL words iff we reach it. */
    const bool ll = !solo && p.ll_on != 0 && (owns_top || owns_bottom);
    app_u64* ll_up = ll ? (app_u64*)cpnet_ptr(ctx, (const void*)p.ll, (int)p.top_pe) : nullptr;
    app_u64* ll_down = ll ? (app_u64*)cpnet_ptr(ctx, (const void*)p.ll, (int)p.bottom_pe) : nullptr;
    const app_u64* ll_mine = (const app_u64*)p.ll;
    /* LL words of `side` (0: from the PE above, 1: from below) for round `r`. */
#define JACOBI_LL(base, r, side) ((base) + ((((r) & 1ull) * 2ull) + (side)) * (app_u64)nx)
    int fail = 0;
    app_i64 it = 0;
    for (; it < p.niter; ++it) {
        const float* src = grid[it & 1];
        float* dst = grid[(it + 1) & 1];
        const bool check = jacobi_is_check(p, it);
        double partial = 0.0;
        bool done_top = false, done_bottom = false;
        if (owns_top) {
            if (!solo) {
                /* Iteration 0 reads the initial halos. */
                if (ll_up != nullptr && it > 0)
                    fail = jacobi_ll_recv(h, ctl, JACOBI_LL(ll_mine, (app_u64)it, 0), (float*)src, nx, (app_u64)it,
                                          APP_OP_TOP_HALO, (app_u64)it);
                else
                    fail = app_wait_ge(h, ctl, top_sig, (app_u64)it, APP_OP_TOP_HALO, (app_u64)it);
                if (fail == 0 && chunk == 1) {
                    if (ll_down != nullptr && it > 0)
                        fail = jacobi_ll_recv(h, ctl, JACOBI_LL(ll_mine, (app_u64)it, 1), (float*)src + (chunk + 1) * nx,
                                              nx, (app_u64)it, APP_OP_BOTTOM_HALO, (app_u64)it);
                    else
                        fail = app_wait_ge(h, ctl, bot_sig, (app_u64)it, APP_OP_BOTTOM_HALO, (app_u64)it);
                }
                if (fail != 0) break;
            }
            ph.mark(JACOBI_PH_HALO);
            partial += jacobi_rows(p, src, dst, 1, 2, check);
            done_top = true;
            done_bottom = chunk == 1;
            if (!solo) {
                if (ll_up != nullptr)
                    jacobi_ll_send(JACOBI_LL(ll_up, (app_u64)it + 1, 1), dst + nx, nx, (app_u64)it + 1);
                else
                    cpnet_putmem_signal_nbi(ctx, dst + p.top_pe_halo * nx, dst + nx, row_bytes, (uint64_t*)bot_sig,
                                            (uint64_t)it + 1, CPNET_SIGNAL_SET, (int)p.top_pe);
                if (chunk == 1) {
                    if (ll_down != nullptr)
                        jacobi_ll_send(JACOBI_LL(ll_down, (app_u64)it + 1, 0), dst + nx, nx, (app_u64)it + 1);
                    else
                        cpnet_putmem_signal_nbi(ctx, dst, dst + nx, row_bytes, (uint64_t*)top_sig, (uint64_t)it + 1,
                                                CPNET_SIGNAL_SET, (int)p.bottom_pe);
                }
            } else {
                jacobi_copy_row(dst, nx, 1, chunk + 1);
                if (chunk == 1) jacobi_copy_row(dst, nx, 1, 0);
            }
            ph.mark(JACOBI_PH_ROWS);
        }
        if (owns_bottom && !done_bottom) {
            if (!solo) {
                if (ll_down != nullptr && it > 0)
                    fail = jacobi_ll_recv(h, ctl, JACOBI_LL(ll_mine, (app_u64)it, 1), (float*)src + (chunk + 1) * nx, nx,
                                          (app_u64)it, APP_OP_BOTTOM_HALO, (app_u64)it);
                else
                    fail = app_wait_ge(h, ctl, bot_sig, (app_u64)it, APP_OP_BOTTOM_HALO, (app_u64)it);
                if (fail != 0) break;
            }
            ph.mark(JACOBI_PH_HALO);
            partial += jacobi_rows(p, src, dst, chunk, chunk + 1, check);
            done_bottom = true;
            if (!solo && ll_down != nullptr)
                jacobi_ll_send(JACOBI_LL(ll_down, (app_u64)it + 1, 0), dst + chunk * nx, nx, (app_u64)it + 1);
            else if (!solo)
                cpnet_putmem_signal_nbi(ctx, dst, dst + chunk * nx, row_bytes, (uint64_t*)top_sig,
                                        (uint64_t)it + 1, CPNET_SIGNAL_SET, (int)p.bottom_pe);
            else
                jacobi_copy_row(dst, nx, chunk, 0);
            ph.mark(JACOBI_PH_ROWS);
        }
        /* The rest of the band: rows 1 and chunk, if done above, are at its
         * ends (block 0 starts at row 1, the last band block ends at row
         * chunk). */
        partial += jacobi_rows(p, src, dst, r0 + ((r0 == 1 && done_top) ? 1 : 0),
                               r1 - ((r1 == chunk + 1 && done_bottom) ? 1 : 0), check);
        if (check) {
            const double s = app_block_sum(partial);
            if (threadIdx.x == 0) partials[(it & 1) * nc + b] = s;
        }
        ph.mark(JACOBI_PH_BAND);
        /* The band blocks' barrier (the norm block does not arrive; it
         * waits for the same count to read the partials). */
        fail = app_grid_sync_of(h, ctl, (app_u64)it + 1, (app_u64)it, nc);
        if (fail != 0) break;
        /* The norm of the previous check iteration decides whether this one
         * was the last: wait until the norm block has taken it. */
        bool stop = false;
        if (it >= 1 && jacobi_is_check(p, it - 1)) {
            fail = jacobi_wait_verdict(h, ctl, (app_u64)it, &stop);
            if (fail != 0) break;
        }
        ph.mark(JACOBI_PH_SYNC);
        ph.count(JACOBI_PH_ITERS);
        if (stop) {
            ++it;
            break;
        }
    }
#undef JACOBI_LL
    *it_out = it;
    return fail;
}

/** jacobi_persistent's norm block (b == nc): for each check iteration k, in
 *  order, it waits until the band blocks' barrier of k has passed (their
 *  partials of k are in), takes the norm of k (jacobi_norm), records it,
 *  sets JACOBI_CTL_STOP when it is at most JACOBI_TOL, and publishes
 *  JACOBI_CTL_NORM_DONE = (k + 1) << 1 | stop, which the band blocks wait
 *  for at the end of iteration k + 1 (the one-iteration rule). It does not arrive at their
 *  barriers, so its arrival and release are off the iteration's path: the
 *  norm of k overlaps the band blocks' iteration k + 1, and the next norm
 *  starts as soon as this one is out. The partials of k (parity k % 2) are
 *  rewritten at iteration k + 2 only after the band blocks saw NORM_DONE
 *  >= k + 1. Returns after the norm that stops the run (its next iteration
 *  is the last, whose norm is not taken, as the CPU variant) or after the
 *  last iteration's. */
__device__ __noinline__ int jacobi_norm_loop(cpnet_handle_t* h, const jacobi_norm_args p, cpnet_ctx_t* ctx,
                                             jacobi_timers& ph)
{
    app_u64* ctl = (app_u64*)p.ctl;
    const double* partials = (const double*)p.partials;
    const app_u64 nc = gridDim.x - 1;
    app_u64 nnorms = threadIdx.x == 0 ? ctl[JACOBI_CTL_NNORMS] : 0; /* thread 0's count of the list */
    __shared__ int stop; /* thread 0's verdict, for the whole block */
    if (threadIdx.x == 0) stop = 0;
    int fail = 0;
    for (app_i64 k = 0; k < p.niter; ++k) {
        if (!jacobi_is_check(p.nccheck, p.csv, k)) continue;
        fail = app_wait_ge(h, ctl, &ctl[APP_CTL_BARRIER], ((app_u64)k + 1) * nc, APP_OP_GRID_BARRIER, (app_u64)k);
        if (fail != 0) return fail;
        ph.mark(JACOBI_PH_SYNC);
        double norm = 0.0;
        fail = jacobi_norm(ctx, p, partials + (k & 1) * nc, nc, k, &norm);
        if (fail != 0) return fail;
        if (threadIdx.x == 0) {
            jacobi_record_norm_leader(p, k, norm, &nnorms);
            if (norm <= JACOBI_TOL) {
                app_st_relaxed_gpu(&ctl[JACOBI_CTL_STOP], (app_u64)k + 2);
                stop = 1;
            }
            /* Release: the record before the band blocks (jacobi_wait_verdict's
             * acquire) go on; the verdict rides in the word. */
            app_fence_gpu();
            app_st_relaxed_gpu(&ctl[JACOBI_CTL_NORM_DONE], ((app_u64)k + 1) << 1 | (app_u64)stop);
        }
        ph.mark(JACOBI_PH_NORM);
        ph.count(JACOBI_PH_ITERS);
        __syncthreads();
        if (stop != 0) return 0;
    }
    return 0;
}

extern "C" __global__ void __launch_bounds__(JACOBI_THREADS) jacobi_persistent(cpnet_handle_t h, jacobi_params p)
{
    __shared__ cpnet_ctx_t ctx;
    __shared__ unsigned long long ph_acc[JACOBI_PHASES];
    app_u64* ctl = (app_u64*)p.ctl;
    const app_u64 b = blockIdx.x, nc = gridDim.x - 1; /* nc band blocks, then the norm block */
    const bool norm_blk = b == nc;
    const app_u64* rows = (const app_u64*)p.row_start;
    const bool solo = p.solo != 0;
    const bool comm =
        !solo && (norm_blk || (app_i64)rows[b] == 1 || (app_i64)rows[b + 1] == p.chunk + 1);
    /* -phases: block 0 times into slot 0, the last band block into slot 1,
     * the norm block into slot 2. */
    jacobi_timers ph(p.phases == 0 ? -1 : (norm_blk ? 2 : (b == 0 ? 0 : (b == nc - 1 ? 1 : -1))), ph_acc);

    if (comm) {
        const int e = cpnet_ctx_create(&h, &ctx);
        if (e != CPNET_E_OK) {
            if (threadIdx.x == 0) app_fail_leader(ctl, e, APP_OP_CTX_CREATE, 0, h.my_pe, ~0ull, 0, 0);
            return;
        }
    }
    app_i64 it = 0;
    int fail = norm_blk ? jacobi_norm_loop(&h, jacobi_norm_args_of(p), &ctx, ph) : jacobi_band_loop(&h, p, &ctx, ph, &it);
    if (comm && fail == 0) {
        const int e = cpnet_ctx_destroy(&ctx);
        if (e != CPNET_E_OK) {
            fail = e;
            if (threadIdx.x == 0) app_fail_leader(ctl, e, APP_OP_QUIET, (app_u64)it, h.my_pe, ~0ull, 0, 0);
        }
    }
    ph.flush(p);
    if (b == 0 && threadIdx.x == 0 && fail == 0) ctl[JACOBI_CTL_ITERS] = (app_u64)it;
}

/**
 * -variant inter-kernel, compute: iteration p.iter on this PE's rows, no
 * communication (the halos were delivered before the previous jacobi_comm
 * ended). Any grid size: block b owns rows [row_start[b], row_start[b+1]);
 * check iterations leave block b's sum of squared updates in partials[b].
 */
extern "C" __global__ void __launch_bounds__(JACOBI_THREADS) jacobi_step(jacobi_params p)
{
    const app_i64 it = p.iter;
    const float* src = (const float*)((it & 1) ? p.a1 : p.a0);
    float* dst = (float*)((it & 1) ? p.a0 : p.a1);
    const app_u64* rows = (const app_u64*)p.row_start;
    const app_u64 b = blockIdx.x;
    const app_i64 r0 = (app_i64)rows[b], r1 = (app_i64)rows[b + 1];
    const bool check = jacobi_is_check(p, it);
    double partial = 0.0;
    partial += jacobi_rows(p, src, dst, r0, r1, check);
    if (check) {
        const double s = app_block_sum(partial);
        if (threadIdx.x == 0) ((double*)p.partials)[b] = s;
    }
}

/**
 * -variant inter-kernel, communication of iteration p.iter, launched after
 * jacobi_step on the same stream (so the rows it sends are complete): the
 * "host-issued" step of the paper's Inter-Kernel baseline. A GPU PE's heap is
 * not reachable by CPU work-groups, so the host issues it as this short
 * kernel instead. Three blocks, each with its own context:
 *
 *  block 0: row 1 into the bottom halo of the PE above (BOT_SIG := it + 1),
 *           then wait for this PE's top halo (TOP_SIG >= it + 1);
 *  block 1: row chunk into the top halo of the PE below, then wait for the
 *           bottom halo;
 *  block 2: check iterations only: the norm (jacobi_norm: the step
 *           kernel's partials, then the library's reduce to all across PEs),
 *           recorded for the host to read after the kernel.
 *
 * When it ends, both halos of grid (it + 1) % 2 hold the neighbours' rows of
 * iteration it and every put is complete (ctx_destroy quiets). A neighbour
 * writes our halo of grid B at iteration it only after we sent ours of
 * iteration it - 1, i.e. after our jacobi_step of iteration it - 1 -- the
 * last one that read that halo -- ended.
 */
extern "C" __global__ void __launch_bounds__(JACOBI_THREADS) jacobi_comm(cpnet_handle_t h, jacobi_params p)
{
    __shared__ cpnet_ctx_t ctx;
    app_u64* ctl = (app_u64*)p.ctl;
    const app_i64 it = p.iter;
    float* dst = (float*)((it & 1) ? p.a0 : p.a1);
    const app_i64 nx = p.nx, chunk = p.chunk;
    const app_u64 row_bytes = (app_u64)nx * sizeof(float);
    app_u64* top_sig = jacobi_word(p.sync, SYNC_TOP_SIG);
    app_u64* bot_sig = jacobi_word(p.sync, SYNC_BOT_SIG);
    const unsigned b = blockIdx.x;
    if (b >= 3 || (b == 2 && !jacobi_is_check(p, it))) return;

    const int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) {
        if (threadIdx.x == 0) app_fail_leader(ctl, e, APP_OP_CTX_CREATE, (app_u64)it, h.my_pe, ~0ull, 0, 0);
        return;
    }
    int fail = 0;
    if (b == 0) {
        cpnet_putmem_signal_nbi(&ctx, dst + p.top_pe_halo * nx, dst + nx, row_bytes, (uint64_t*)bot_sig,
                                (uint64_t)it + 1, CPNET_SIGNAL_SET, (int)p.top_pe);
        fail = app_wait_ge(&h, ctl, top_sig, (app_u64)it + 1, APP_OP_TOP_HALO, (app_u64)it);
    } else if (b == 1) {
        cpnet_putmem_signal_nbi(&ctx, dst, dst + chunk * nx, row_bytes, (uint64_t*)top_sig, (uint64_t)it + 1,
                                CPNET_SIGNAL_SET, (int)p.bottom_pe);
        fail = app_wait_ge(&h, ctl, bot_sig, (app_u64)it + 1, APP_OP_BOTTOM_HALO, (app_u64)it);
    } else {
        double norm = 0.0;
        const jacobi_norm_args na = jacobi_norm_args_of(p);
        fail = jacobi_norm(&ctx, na, (const double*)p.partials, (app_u64)p.blocks, it, &norm);
        if (fail == 0 && threadIdx.x == 0) {
            app_u64 nnorms = ((const app_u64*)p.ctl)[JACOBI_CTL_NNORMS];
            jacobi_record_norm_leader(na, it, norm, &nnorms);
        }
    }
    if (fail == 0) {
        const int d = cpnet_ctx_destroy(&ctx);
        if (d != CPNET_E_OK && threadIdx.x == 0)
            app_fail_leader(ctl, d, APP_OP_QUIET, (app_u64)it, h.my_pe, ~0ull, 0, 0);
    }
}
