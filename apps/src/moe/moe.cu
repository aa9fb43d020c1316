/*
 * The MoE dispatch/combine kernel of `moe -variant intra-kernel` (design in
 * apps/src/moe.rs, the same steps as the CPU work-groups'; host side
 * apps/src/moe/gpu.rs).
 *
 * Prepended by the host: the #defines of apps/src/gpu.rs (APP_CTL_*,
 * APP_OP_*) and of moe/gpu.rs (MOE_*), then gpu/common.cuh.
 *
 * One cooperative launch runs warmup + iters iterations. Blocks share the
 * work round-robin; grid barriers separate the phases of an iteration:
 *   dispatch puts (every (token, k) pair) -> quiet -> grid barrier ->
 *   per PE its row (counts and the pairs' (t, j) records) with the dispatch
 *   signal -> wait for every source's signal ->
 *   experts on the received slots -> grid barrier -> outputs put home ->
 *   quiet -> grid barrier -> combine signal per source -> wait for every
 *   PE's.
 * Block 0's leader sums the dispatch, experts and combine times
 * (%globaltimer) of the timed iterations into MOE_CTL_DISPATCH_NS,
 * MOE_CTL_EXPERTS_NS and MOE_CTL_COMBINE_NS. After
 * the last iteration every block computes out[t] = sum_j w_j y_j for its
 * tokens, in f32 with j in order and no contraction (__fmul_rn,
 * __fadd_rn), the same operations as the host's reference.
 */

struct moe_params {
    app_u64 x;          /* heap: bf16 [T][H] */
    app_u64 recv;       /* heap: bf16 [E/n][n][T][H] */
    app_u64 cmeta;      /* heap: u64 [n][row]: per source its E/n counts, then its (t | j << 32)
                           records in (expert, slot) order */
    app_u64 disp_sig;   /* heap: u64 [n] */
    app_u64 comb_sig;   /* heap: u64 [n] */
    app_u64 comb;       /* heap: bf16 [T][k][H] */
    app_u64 cmeta_out;  /* heap: u64 [n][row], the row for each destination, filled by the host */
    app_u64 route_e;    /* device: u32 [T][k] expert */
    app_u64 route_w;    /* device: f32 [T][k] weight */
    app_u64 slot;       /* device: u32 [T][k] receive slot */
    app_u64 out;        /* device: f32 [T][H] */
    app_u64 ctl;        /* the control block */
    app_i64 tokens, hidden, topk, experts, n_pes, me;
    app_i64 warmup, iters;
    app_i64 row;        /* u64 words of a cmeta row: E/n + T * k */
};

__device__ __forceinline__ float moe_f32(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }

/* f32 -> bf16 bits, round to nearest even (the host's bf16()). */
__device__ __forceinline__ unsigned short moe_bf16(float x)
{
    const unsigned b = __float_as_uint(x);
    if (x != x) return (unsigned short)((b >> 16) | 0x40u);
    return (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* Expert e's output element (the host's expert()): one fused multiply-add. */
__device__ __forceinline__ unsigned short moe_expert(app_i64 e, app_i64 experts, unsigned short x)
{
    const float s = __fadd_rn(1.0f, __fdiv_rn((float)e, (float)experts));
    const float b = __fdiv_rn((float)e, 1024.0f);
    return moe_bf16(__fmaf_rn(moe_f32(x), s, b));
}

/**
 * The received slots as one list (items, in the order source s, local
 * expert el, slot q): every thread loads one count of `cmeta` (the EL
 * counts at the start of each source's row of `row` words, written by the
 * source's put before its dispatch signal, which this block has acquired)
 * with a system-scope acquire, all at once
 * rather than one after another, and the block forms the exclusive prefix
 * sums in pre[0 .. n*EL] (pre[n*EL]: the total). The whole block calls it.
 */
__device__ __noinline__ void moe_prefix(const app_u64* cmeta, unsigned el, app_u64 row, unsigned m, unsigned* pre)
{
    __shared__ unsigned warp_sum[MOE_THREADS / 32];
    /* Each thread sums a run of consecutive entries, the block scans the
     * runs' sums, then each thread writes its run's prefixes. */
    const unsigned per = (m + blockDim.x - 1) / blockDim.x;
    const unsigned a = threadIdx.x * per, b = a + per < m ? a + per : m;
    unsigned local = 0;
    for (unsigned i = a; i < b; ++i) {
        const unsigned c = (unsigned)cpnet_ld_acquire_sys_u64((const uint64_t*)(cmeta + (i / el) * row + i % el));
        pre[i] = c;
        local += c;
    }
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned incl = local;
    for (int d = 1; d < 32; d <<= 1) {
        const unsigned v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= (unsigned)d) incl += v;
    }
    if (lane == 31) warp_sum[warp] = incl;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned run = 0;
        for (unsigned w = 0; w < blockDim.x / 32; ++w) {
            const unsigned v = warp_sum[w];
            warp_sum[w] = run;
            run += v;
        }
        pre[m] = run;
    }
    __syncthreads();
    unsigned off = warp_sum[warp] + incl - local;
    for (unsigned i = a; i < b; ++i) {
        const unsigned c = pre[i];
        pre[i] = off;
        off += c;
    }
    __syncthreads();
}

/** The entry j of `pre` (exclusive prefixes of m entries) whose range holds
 *  item `item` < pre[m]: the largest j with pre[j] <= item and a nonempty
 *  range. */
__device__ __forceinline__ unsigned moe_find(const unsigned* pre, unsigned m, unsigned item)
{
    unsigned lo = 0, hi = m; /* pre[lo] <= item < pre[hi] */
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (pre[mid] <= item) lo = mid; else hi = mid;
    }
    return lo;
}

extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_run(cpnet_handle_t h, moe_params p)
{
    __shared__ cpnet_ctx_t ctx;
    __shared__ unsigned pre[MOE_MAX_EXPERTS + 1];
    app_u64* ctl = (app_u64*)p.ctl;
    const int me = (int)p.me;
    const app_i64 n = p.n_pes, T = p.tokens, H = p.hidden, K = p.topk, EL = p.experts / p.n_pes;
    const app_u64 hb = (app_u64)H * 2;
    if (app_call_failed(p.ctl, cpnet_ctx_create(&h, &ctx), APP_OP_CTX_CREATE, 0, me)) return;
    const unsigned* route_e = (const unsigned*)p.route_e;
    const float* route_w = (const float*)p.route_w;
    const unsigned* slot = (const unsigned*)p.slot;
    app_u64 gen = 0, disp_ns = 0, exp_ns = 0, comb_ns = 0;
    int fail = 0;
    const app_i64 total = p.warmup + p.iters;
    for (app_i64 it = 0; it < total && fail == 0; ++it) {
        const app_u64 epoch = (app_u64)it + 1;
        if ((fail = app_grid_sync(&h, ctl, ++gen, it)) != 0) break;
        const app_u64 t0 = cpnet_globaltimer_ns();
        /* Dispatch: one put per (token, expert) into the expert's receive
         * slot for this PE, and its (t, j) record. */
        for (app_i64 i = blockIdx.x; i < T * K; i += gridDim.x) {
            const app_i64 t = i / K, e = route_e[i];
            const int d = (int)(e / EL);
            const app_u64 idx = (app_u64)(((e % EL) * n + me) * T + slot[i]);
            cpnet_putmem_nbi(&ctx, (void*)(p.recv + idx * hb), (const void*)(p.x + (app_u64)t * hb), hb, d);
        }
        if (app_call_failed(p.ctl, cpnet_quiet(&ctx), MOE_OP_DISPATCH, it, me)) { fail = 1; break; }
        if ((fail = app_grid_sync(&h, ctl, ++gen, it)) != 0) break;
        /* Per destination one put: its row (counts, then the (t, j) records
         * of the slots, which the combine sends the outputs back by). */
        const app_u64 rb = (app_u64)p.row * 8;
        for (app_i64 d = blockIdx.x; d < n; d += gridDim.x)
            cpnet_putmem_signal_nbi(&ctx, (void*)(p.cmeta + (app_u64)me * rb), (const void*)(p.cmeta_out + (app_u64)d * rb), rb,
                                    (uint64_t*)(p.disp_sig + (app_u64)me * 8), epoch, CPNET_SIGNAL_SET, (int)d);
        for (app_i64 s = 0; s < n && fail == 0; ++s)
            fail = app_wait_ge(&h, ctl, (const app_u64*)(p.disp_sig + (app_u64)s * 8), epoch, MOE_OP_DISPATCH, it);
        if (fail != 0) break;
        const app_u64 t1 = cpnet_globaltimer_ns();
        /* Experts (pass 0: every received slot, round-robin over the
         * blocks, the output replacing the input in its slot), a grid
         * barrier, then the combine (pass 1: the same slots, each output
         * put home). Timed apart, as DeepEP times its combine kernel
         * without the experts' GEMMs. */
        app_u64 te = 0;
        const unsigned m = (unsigned)(n * EL);
        moe_prefix((const app_u64*)p.cmeta, (unsigned)EL, (app_u64)p.row, m, pre);
        for (int pass = 0; pass < 2; ++pass) {
            for (unsigned item = blockIdx.x; item < pre[m]; item += gridDim.x) {
                const unsigned jx = moe_find(pre, m, item);
                const app_i64 s = jx / EL, el = jx % EL;
                const app_u64 q = item - pre[jx];
                const app_u64 idx = (app_u64)((el * n + s) * T) + q;
                unsigned short* y = (unsigned short*)(p.recv + idx * hb);
                if (pass == 0) {
                    const app_i64 e = (app_i64)me * EL + el;
                    for (app_i64 i = threadIdx.x; i < H; i += blockDim.x) y[i] = moe_expert(e, p.experts, y[i]);
                } else {
                    /* The record: source s's row, past its counts, at the
                     * expert's first record (its prefix within the row) + q. */
                    const app_u64 ri = (app_u64)s * (app_u64)p.row + (app_u64)EL + (pre[jx] - pre[s * EL]) + q;
                    const app_u64 mt = *(volatile const app_u64*)(p.cmeta + ri * 8);
                    const app_u64 t = mt & 0xffffffffull, j = mt >> 32;
                    cpnet_putmem_nbi(&ctx, (void*)(p.comb + (t * (app_u64)K + j) * hb), (const void*)y, hb, (int)s);
                }
            }
            if (pass == 0) {
                if ((fail = app_grid_sync(&h, ctl, ++gen, it)) != 0) break;
                te = cpnet_globaltimer_ns();
            }
        }
        if (fail != 0) break;
        if (app_call_failed(p.ctl, cpnet_quiet(&ctx), MOE_OP_COMBINE, it, me)) { fail = 1; break; }
        if ((fail = app_grid_sync(&h, ctl, ++gen, it)) != 0) break;
        for (app_i64 s = blockIdx.x; s < n; s += gridDim.x) {
            uint64_t* sig = (uint64_t*)(p.comb_sig + (app_u64)me * 8);
            cpnet_putmem_signal_nbi(&ctx, sig, sig, 0, sig, epoch, CPNET_SIGNAL_SET, (int)s);
        }
        if (app_call_failed(p.ctl, cpnet_quiet(&ctx), MOE_OP_COMBINE, it, me)) { fail = 1; break; }
        for (app_i64 d = 0; d < n && fail == 0; ++d)
            fail = app_wait_ge(&h, ctl, (const app_u64*)(p.comb_sig + (app_u64)d * 8), epoch, MOE_OP_COMBINE, it);
        if (fail != 0) break;
        const app_u64 t2 = cpnet_globaltimer_ns();
        if (it >= p.warmup) {
            disp_ns += t1 - t0;
            exp_ns += te - t1;
            comb_ns += t2 - te;
        }
        if (it + 1 == total) {
            /* Combine: out[t] = sum_j w_j y_j, no contraction. */
            float* out = (float*)p.out;
            for (app_i64 t = blockIdx.x; t < T; t += gridDim.x) {
                for (app_i64 i = threadIdx.x; i < H; i += blockDim.x) {
                    float acc = 0.0f;
                    for (app_i64 j = 0; j < K; ++j) {
                        const unsigned short yb =
                            *(volatile const unsigned short*)(p.comb + ((app_u64)(t * K + j) * H + (app_u64)i) * 2);
                        acc = __fadd_rn(acc, __fmul_rn(route_w[t * K + j], moe_f32(yb)));
                    }
                    out[t * H + i] = acc;
                }
            }
        }
    }
    if (fail == 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        ctl[MOE_CTL_DISPATCH_NS] = disp_ns;
        ctl[MOE_CTL_COMBINE_NS] = comb_ns;
        ctl[MOE_CTL_EXPERTS_NS] = exp_ns;
    }
    if (fail == 0) app_call_failed(p.ctl, cpnet_ctx_destroy(&ctx), APP_OP_QUIET, 0, me);
}
