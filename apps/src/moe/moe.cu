/*
 * The MoE dispatch/combine kernel of `moe -variant intra-kernel` (design in
 * apps/src/moe.rs and apps/src/moe/gpu.rs, the same steps as the CPU
 * work-groups' over buffers packed per source; host side apps/src/moe/gpu.rs).
 *
 * Prepended by the host: the #defines of apps/src/gpu.rs (APP_CTL_*,
 * APP_OP_*) and of moe/gpu.rs (MOE_*), then gpu/common.cuh.
 *
 * One cooperative launch runs warmup + iters iterations. Blocks share the
 * work round-robin; grid barriers separate the phases of an iteration:
 *   dispatch: every (token, j) pair's row to its position in its expert
 *   PE's run for this source: a put where cpnet_ptr reaches the PE, else a
 *   copy into send[d] -> quiet -> grid barrier -> [the packed runs, a few
 *   large puts per PE not reached -> quiet -> grid barrier] -> per PE its
 *   counts with the dispatch signal -> wait for every source's signal ->
 *   experts on the received rows -> grid barrier -> outputs home (a put per
 *   row, or a source's whole run in a few puts) -> quiet -> grid barrier ->
 *   combine signal per source -> wait for every PE's.
 * Block 0's leader sums the dispatch, experts and combine times
 * (%globaltimer) of the timed iterations into MOE_CTL_DISPATCH_NS,
 * MOE_CTL_EXPERTS_NS and MOE_CTL_COMBINE_NS. After
 * the last iteration every block computes out[t] = sum_j w_j y_j for its
 * tokens, in f32 with j in order and no contraction (__fmul_rn,
 * __fadd_rn), the same operations as the host's reference.
 */

struct moe_params {
    app_u64 x;          /* heap: bf16 [T][H] */
    app_u64 recv;       /* heap: bf16 [n][TK][H], source s's run at [s] (TK = T * k) */
    app_u64 counts;     /* heap: u64 [n][E/n], per source its rows per local expert */
    app_u64 disp_sig;   /* heap: u64 [n] */
    app_u64 comb_sig;   /* heap: u64 [n] */
    app_u64 comb;       /* heap: bf16 [n][TK][H], expert PE d's outputs at [d] */
    app_u64 counts_out; /* heap: u64 [n][E/n], the counts for each destination, filled by the host */
    app_u64 send;       /* heap: bf16 [n][TK][H], the packed runs for PEs on the network path */
    app_u64 route_e;    /* device: u32 [T][k] expert */
    app_u64 route_w;    /* device: f32 [T][k] weight */
    app_u64 pos;        /* device: u32 [T][k] position in the expert PE's run */
    app_u64 send_rows;  /* device: u32 [n] rows of this PE's run for each PE */
    app_u64 out;        /* device: f32 [T][H] */
    app_u64 ctl;        /* the control block */
    app_i64 tokens, hidden, topk, experts, n_pes, me;
    app_i64 warmup, iters;
    app_i64 bulk_min;   /* least bytes of one piece of a packed run's puts */
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
 * The received rows as one list (items, in the order source s, local
 * expert el, slot q): every thread loads one of the m = n * EL counts
 * (`counts`, written by each source's put before its dispatch signal,
 * which this block has acquired) with a system-scope acquire, all at once
 * rather than one after another, and the block forms the exclusive prefix
 * sums in pre[0 .. m] (pre[m]: the total). Source s's run holds its items
 * pre[s*EL] .. pre[(s+1)*EL], item i at row i - pre[s*EL]. The whole block
 * calls it.
 */
__device__ __noinline__ void moe_prefix(const app_u64* counts, unsigned m, unsigned* pre)
{
    __shared__ unsigned warp_sum[MOE_THREADS / 32];
    /* Each thread sums a run of consecutive entries, the block scans the
     * runs' sums, then each thread writes its run's prefixes. */
    const unsigned per = (m + blockDim.x - 1) / blockDim.x;
    const unsigned a = threadIdx.x * per, b = a + per < m ? a + per : m;
    unsigned local = 0;
    for (unsigned i = a; i < b; ++i) {
        const unsigned c = (unsigned)cpnet_ld_acquire_sys_u64((const uint64_t*)(counts + i));
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

/** Copy one row of `bytes` (a multiple of 2) within this GPU, the whole
 *  block: 16 bytes a thread where both ends allow it. */
__device__ __forceinline__ void moe_copy_row(void* dst, const void* src, app_u64 bytes)
{
    if (((bytes | (app_u64)dst | (app_u64)src) & 15) == 0) {
        for (app_u64 i = threadIdx.x; i < bytes / 16; i += blockDim.x) ((uint4*)dst)[i] = ((const uint4*)src)[i];
    } else {
        for (app_u64 i = threadIdx.x; i < bytes / 2; i += blockDim.x)
            ((unsigned short*)dst)[i] = ((const unsigned short*)src)[i];
    }
}

/** Whether this kernel stores into PE d's heap itself (cpnet_ptr). */
__device__ __forceinline__ bool moe_direct(const cpnet_ctx_t* ctx, const moe_params& p, int d)
{
    return cpnet_ptr(ctx, (const void*)p.recv, d) != nullptr;
}

/**
 * This block's share of the bulk puts: for every PE d that moe_direct does
 * not reach, the run `rows(d)` rows long at `src + d * src_stride` goes to
 * `dst` on d, cut into pieces of at least p.bulk_min bytes, piece c of all
 * of them (over every d, in order) to block c % gridDim.x. The whole block
 * calls it; errors surface at the next cpnet_quiet.
 */
template <typename Rows>
__device__ void moe_bulk(cpnet_ctx_t* ctx, const moe_params& p, app_u64 src, app_u64 src_stride, app_u64 dst, Rows rows)
{
    const app_u64 hb = (app_u64)p.hidden * 2;
    app_u64 c = 0;
    for (int d = 0; d < (int)p.n_pes; ++d) {
        if (moe_direct(ctx, p, d)) continue;
        const app_u64 bytes = (app_u64)rows(d) * hb;
        if (bytes == 0) continue;
        app_u64 piece = (bytes + gridDim.x - 1) / gridDim.x;
        piece = piece < (app_u64)p.bulk_min ? (app_u64)p.bulk_min : (piece + 63) / 64 * 64;
        for (app_u64 off = 0; off < bytes; off += piece, ++c) {
            if (c % gridDim.x != blockIdx.x) continue;
            const app_u64 len = bytes - off < piece ? bytes - off : piece;
            cpnet_putmem_nbi(ctx, (void*)(dst + off), (const void*)(src + (app_u64)d * src_stride + off), len, d);
        }
    }
}

extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_run(cpnet_handle_t h, moe_params p)
{
    __shared__ cpnet_ctx_t ctx;
    __shared__ unsigned pre[MOE_MAX_EXPERTS + 1];
    app_u64* ctl = (app_u64*)p.ctl;
    const int me = (int)p.me;
    const app_i64 n = p.n_pes, T = p.tokens, H = p.hidden, K = p.topk, EL = p.experts / p.n_pes;
    const app_u64 hb = (app_u64)H * 2, run = (app_u64)(T * K) * hb;
    if (app_call_failed(p.ctl, cpnet_ctx_create(&h, &ctx), APP_OP_CTX_CREATE, 0, me)) return;
    const unsigned* route_e = (const unsigned*)p.route_e;
    const float* route_w = (const float*)p.route_w;
    const unsigned* pos = (const unsigned*)p.pos;
    const unsigned* send_rows = (const unsigned*)p.send_rows;
    bool bulk = false; /* some PE on the network path */
    for (int d = 0; d < (int)n; ++d) bulk = bulk || !moe_direct(&ctx, p, d);
    app_u64 gen = 0, disp_ns = 0, exp_ns = 0, comb_ns = 0;
    int fail = 0;
    const app_i64 total = p.warmup + p.iters;
    for (app_i64 it = 0; it < total && fail == 0; ++it) {
        const app_u64 epoch = (app_u64)it + 1;
        if ((fail = app_grid_sync(&h, ctl, ++gen, it)) != 0) break;
        const app_u64 t0 = cpnet_globaltimer_ns();
        /* Dispatch: every (token, j) pair's row to its position in the
         * expert PE's run for this PE: a put where the kernel reaches the
         * PE, else packed into send[d] for the bulk puts. */
        for (app_i64 i = blockIdx.x; i < T * K; i += gridDim.x) {
            const app_i64 t = i / K;
            const int d = (int)(route_e[i] / EL);
            const app_u64 at = pos[i] * hb;
            const void* row = (const void*)(p.x + (app_u64)t * hb);
            if (moe_direct(&ctx, p, d))
                cpnet_putmem_nbi(&ctx, (void*)(p.recv + (app_u64)me * run + at), row, hb, d);
            else
                moe_copy_row((void*)(p.send + (app_u64)d * run + at), row, hb);
        }
        if (app_call_failed(p.ctl, cpnet_quiet(&ctx), MOE_OP_DISPATCH, it, me)) { fail = 1; break; }
        if ((fail = app_grid_sync(&h, ctl, ++gen, it)) != 0) break;
        if (bulk) {
            moe_bulk(&ctx, p, p.send, run, p.recv + (app_u64)me * run, [&](int d) { return send_rows[d]; });
            if (app_call_failed(p.ctl, cpnet_quiet(&ctx), MOE_OP_DISPATCH, it, me)) { fail = 1; break; }
            if ((fail = app_grid_sync(&h, ctl, ++gen, it)) != 0) break;
        }
        /* Per destination one put: its counts, with the dispatch signal. */
        const app_u64 cb = (app_u64)EL * 8;
        for (app_i64 d = blockIdx.x; d < n; d += gridDim.x)
            cpnet_putmem_signal_nbi(&ctx, (void*)(p.counts + (app_u64)me * cb), (const void*)(p.counts_out + (app_u64)d * cb), cb,
                                    (uint64_t*)(p.disp_sig + (app_u64)me * 8), epoch, CPNET_SIGNAL_SET, (int)d);
        for (app_i64 s = 0; s < n && fail == 0; ++s)
            fail = app_wait_ge(&h, ctl, (const app_u64*)(p.disp_sig + (app_u64)s * 8), epoch, MOE_OP_DISPATCH, it);
        if (fail != 0) break;
        const app_u64 t1 = cpnet_globaltimer_ns();
        /* Experts (pass 0: every received row, round-robin over the
         * blocks, the output replacing the input), a grid barrier, then the
         * combine (pass 1: each output home to the same position of the
         * source's combine buffer, by row where the kernel reaches the
         * source, else the source's whole run in bulk). Timed apart, as
         * DeepEP times its combine kernel without the experts' GEMMs. */
        app_u64 te = 0;
        const unsigned m = (unsigned)(n * EL);
        moe_prefix((const app_u64*)p.counts, m, pre);
        for (int pass = 0; pass < 2; ++pass) {
            for (unsigned item = blockIdx.x; item < pre[m]; item += gridDim.x) {
                const unsigned jx = moe_find(pre, m, item);
                const app_i64 s = jx / EL, el = jx % EL;
                const app_u64 at = (app_u64)(item - pre[s * EL]) * hb;
                unsigned short* y = (unsigned short*)(p.recv + (app_u64)s * run + at);
                if (pass == 0) {
                    const app_i64 e = (app_i64)me * EL + el;
                    for (app_i64 i = threadIdx.x; i < H; i += blockDim.x) y[i] = moe_expert(e, p.experts, y[i]);
                } else if (moe_direct(&ctx, p, (int)s)) {
                    cpnet_putmem_nbi(&ctx, (void*)(p.comb + (app_u64)me * run + at), (const void*)y, hb, (int)s);
                }
            }
            if (pass == 0) {
                if ((fail = app_grid_sync(&h, ctl, ++gen, it)) != 0) break;
                te = cpnet_globaltimer_ns();
            }
        }
        if (fail != 0) break;
        if (bulk) moe_bulk(&ctx, p, p.recv, run, p.comb + (app_u64)me * run, [&](int s) { return pre[(s + 1) * EL] - pre[s * EL]; });
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
                        const app_u64 d = route_e[t * K + j] / EL;
                        const unsigned short yb =
                            *(volatile const unsigned short*)(p.comb + d * run + (app_u64)pos[t * K + j] * hb + (app_u64)i * 2);
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
