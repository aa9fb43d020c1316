/*
 * Device helpers shared by the apps' GPU kernels (jacobi.cu, allreduce.cu).
 * Prepended to each kernel source by apps/src/gpu.rs, after the #defines it
 * generates (APP_CTL_*, APP_OP_*: the one definition is in that file).
 *
 * - The kernel's control block: u64 words in device memory (not the
 *   symmetric heap), zeroed by the host before each launch. It holds the
 *   grid barrier's arrival counter, the first failure of any block (code,
 *   block, iteration, operation, PE, heap address, expected and found value:
 *   what the host prints), and app words from APP_CTL_APP on.
 * - Waits that a failing block of the same grid can interrupt (the cpnet
 *   waits cannot: they end on their timeout or on an abort), bounded by the
 *   handle's wait timeout and ended by the PE's abort word, like cpnet's own.
 * - A grid barrier for cooperative (co-resident) launches.
 *
 * Every function whose name ends in _leader runs on thread 0 of the block
 * only; the others are called by every thread of the block (converged).
 */
#include <cpnet/device.cuh>

typedef unsigned long long app_u64;
typedef long long app_i64;

/** Poll a word this many times before the first sleep. */
#define APP_TIGHT_POLLS 16
/** Sleep between later polls (ns). */
#define APP_POLL_SLEEP_NS 64
/** Read the grid's failure word every this many polls (power of two): it
 *  is one more L2 round trip after each poll, which doubled the period of a
 *  grid barrier's tight polls (session 20: the barrier was about 4.5 of a
 *  single-GPU Jacobi iteration's 7.4-7.9 µs). */
#define APP_FAIL_CHECK_EVERY 8
/** Check the clock every this many polls (power of two). */
#define APP_CHECK_EVERY 64
/** Read the abort word only once a wait has lasted this long. */
#define APP_ABORT_CHECK_AFTER_NS 20000ull
/** With the handle's abort mirror in GPU memory (handle.claims), every check
 *  reads the mirror and only one in APP_ABORT_HOST_EVERY (a power of two) the
 *  host's abort word. The host word is one line of pinned host memory: every
 *  block of a full GPU reading it every few microseconds saturates the GPU's
 *  PCIe reads, and with them the command queues, and a full grid of waiting
 *  blocks (a grid barrier behind a halo wait) slowed each Jacobi iteration
 *  from tens of microseconds to milliseconds. */
#define APP_ABORT_HOST_EVERY 64

/** Relaxed load of a control word (gpu scope: only this GPU writes them). */
__device__ __forceinline__ app_u64 app_ld_relaxed_gpu(const app_u64* p)
{
    app_u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/** Relaxed store of a control word (gpu scope). */
__device__ __forceinline__ void app_st_relaxed_gpu(app_u64* p, app_u64 v)
{
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/** A full fence at gpu scope: after a relaxed load that observed a value,
 *  an acquire pattern; before a relaxed store, a release pattern. */
__device__ __forceinline__ void app_fence_gpu(void)
{
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

/** Record the first failure of the grid (leader only): claims
 *  ctl[APP_CTL_FAIL] 0 -> code, then fills the details. `code` != 0. */
__device__ __noinline__ void app_fail_leader(app_u64* ctl, int code, app_u64 op, app_u64 iter, int pe,
                                             app_u64 addr, app_u64 expected, app_u64 found)
{
    if (code == CPNET_E_OK) code = CPNET_E_BAD_OP;
    if (atomicCAS(&ctl[APP_CTL_FAIL], 0ull, (app_u64)code) != 0ull) return;
    app_st_relaxed_gpu(&ctl[APP_CTL_FAIL_WG], (app_u64)blockIdx.x);
    app_st_relaxed_gpu(&ctl[APP_CTL_FAIL_ITER], iter);
    app_st_relaxed_gpu(&ctl[APP_CTL_FAIL_OP], op);
    app_st_relaxed_gpu(&ctl[APP_CTL_FAIL_PE], (app_u64)(app_i64)pe);
    app_st_relaxed_gpu(&ctl[APP_CTL_FAIL_ADDR], addr);
    app_st_relaxed_gpu(&ctl[APP_CTL_FAIL_EXPECTED], expected);
    app_st_relaxed_gpu(&ctl[APP_CTL_FAIL_FOUND], found);
    __threadfence();
}

/** Record a failed cpnet call (its code `e`, operation, iteration; the
 *  block's leader records it) and say whether to stop: false for
 *  CPNET_E_OK. `ctl` is the app's control block (a kernel parameter). */
__device__ __forceinline__ bool app_call_failed(app_u64 ctl, int e, app_u64 op, app_u64 iter, app_i64 pe)
{
    if (e == CPNET_E_OK) return false;
    if (threadIdx.x == 0) app_fail_leader((app_u64*)ctl, e, op, iter, (int)pe, ~0ull, 0, 0);
    return true;
}

/** The receive slot of source PE `src` for round `seq` of an app whose
 *  parameters `p` have `recv` (the slots' address), `n_pes` and `slot`
 *  (words per slot): two alternating sets of n_pes slots, so a round's
 *  messages never land on the previous round's while they are read. */
template <typename P>
__device__ __forceinline__ app_u64* app_recv_slot(const P& p, app_u64 seq, app_i64 src)
{
    return (app_u64*)p.recv + ((seq & 1ull) * (app_u64)p.n_pes + (app_u64)src) * (app_u64)p.slot;
}

/** Whether some block of the grid has failed. */
__device__ __forceinline__ bool app_failed(const app_u64* ctl)
{
    return app_ld_relaxed_gpu(&ctl[APP_CTL_FAIL]) != 0ull;
}

/** The bounded poll of every app wait (leader only): call `pause` after each
 *  poll that found nothing. Returns 0 to go on, -1 when another block failed
 *  (already recorded; seen within APP_FAIL_CHECK_EVERY polls), or a
 *  CPNET_E_* (abort code, CPNET_E_TIMEOUT) that the caller records. */
struct app_spin {
    app_u64 start;
    unsigned polls;

    __device__ __forceinline__ app_spin() : start(cpnet_globaltimer_ns()), polls(0) {}

    __device__ __forceinline__ int pause(const cpnet_handle_t* h, const app_u64* ctl)
    {
        ++polls;
        if ((polls & (APP_FAIL_CHECK_EVERY - 1)) == 0 && app_failed(ctl)) return -1;
        if ((polls & (APP_CHECK_EVERY - 1)) == 0) {
            const app_u64 waited = cpnet_globaltimer_ns() - start;
            if (waited > APP_ABORT_CHECK_AFTER_NS) {
                const bool host = (polls & (APP_CHECK_EVERY * APP_ABORT_HOST_EVERY - 1)) == 0;
                const int a = cpnet_abort_code(h, host);
                if (a != CPNET_E_OK) return a;
            }
            if (h->wait_timeout_ns != 0 && waited > h->wait_timeout_ns) return CPNET_E_TIMEOUT;
        }
        if (polls > APP_TIGHT_POLLS) __nanosleep(APP_POLL_SLEEP_NS);
        return 0;
    }

    /** Nanoseconds since the spin started. */
    __device__ __forceinline__ app_u64 elapsed() const { return cpnet_globaltimer_ns() - start; }
};

/** Leader only: poll the word `word` (a heap word written by the proxy or
 *  a peer kernel, or a control word of this launch) with system-scope
 *  acquire loads until it is >= `value`, so data delivered before the word
 *  (put-with-signal) is visible; `*seen` (if given) gets the value that
 *  ended the wait, or the last one read. Returns 0, -1 (another block
 *  failed) or the recorded failure, whose report gives the word's heap
 *  offset (~0 outside the heap). */
__device__ __noinline__ int app_wait_ge_leader(const cpnet_handle_t* h, app_u64* ctl, const app_u64* word,
                                               app_u64 value, app_u64 op, app_u64 iter, app_u64* seen = nullptr)
{
    app_spin sp;
    for (;;) {
        const app_u64 v = cpnet_ld_acquire_sys_u64((const uint64_t*)word);
        if (seen != nullptr) *seen = v;
        if (v >= value) return 0;
        const int e = sp.pause(h, ctl);
        if (e != 0) {
            if (e > 0) {
                const app_u64 off = (app_u64)word - h->heap_base;
                app_fail_leader(ctl, e, op, iter, h->my_pe, off < h->heap_size ? off : ~0ull, value, v);
            }
            return e;
        }
    }
}

/** app_wait_ge_leader for the whole block: returns the same result, and
 *  `*seen` (if given) the same value, in every thread; on success the data
 *  is visible to every thread. */
__device__ __forceinline__ int app_wait_ge(const cpnet_handle_t* h, app_u64* ctl, const app_u64* word,
                                           app_u64 value, app_u64 op, app_u64 iter, app_u64* seen = nullptr)
{
    __shared__ int app_wait_result;
    __shared__ app_u64 app_wait_seen;
    __syncthreads();
    if (threadIdx.x == 0) app_wait_result = app_wait_ge_leader(h, ctl, word, value, op, iter, &app_wait_seen);
    __syncthreads();
    const int r = app_wait_result;
    if (seen != nullptr) *seen = app_wait_seen;
    __syncthreads();
    return r;
}

/**
 * Grid barrier number `gen` (1, 2, ...) of a cooperative launch: every block
 * calls it the same number of times; it returns once all gridDim.x blocks
 * have arrived `gen` times. Everything any block wrote before it is visible
 * to every block after it. Returns 0 in every thread, or nonzero when a
 * block failed, the host aborted, or the wait timed out (recorded).
 */
__device__ __noinline__ int app_grid_sync_of(const cpnet_handle_t* h, app_u64* ctl, app_u64 gen, app_u64 iter,
                                             app_u64 blocks);
__device__ __forceinline__ int app_grid_sync(const cpnet_handle_t* h, app_u64* ctl, app_u64 gen, app_u64 iter)
{
    return app_grid_sync_of(h, ctl, gen, iter, gridDim.x);
}

/** app_grid_sync among `blocks` blocks of the grid (those that call it; the
 *  others may wait for the same count, ctl[APP_CTL_BARRIER] >= gen * blocks,
 *  with app_wait_ge, without arriving). */
__device__ __noinline__ int app_grid_sync_of(const cpnet_handle_t* h, app_u64* ctl, app_u64 gen, app_u64 iter,
                                             app_u64 blocks)
{
    __shared__ int app_sync_result;
    __syncthreads();
    if (threadIdx.x == 0) {
        /* Release: this block's writes (ordered before by the block barrier)
         * before the arrival. */
        __threadfence();
        atomicAdd(&ctl[APP_CTL_BARRIER], 1ull);
        const app_u64 target = gen * blocks;
        app_spin sp;
        int r = 0;
        for (;;) {
            const app_u64 v = app_ld_relaxed_gpu(&ctl[APP_CTL_BARRIER]);
            if (v >= target) {
                app_fence_gpu(); /* acquire: every block's writes before its arrival */
                break;
            }
            r = sp.pause(h, ctl);
            if (r != 0) {
                if (r > 0) app_fail_leader(ctl, r, APP_OP_GRID_BARRIER, iter, h->my_pe, ~0ull, target, v);
                break;
            }
        }
        app_sync_result = r;
    }
    __syncthreads();
    const int r = app_sync_result;
    __syncthreads();
    return r;
}

/** Sum of `v` over the block (every thread passes its value; the result is
 *  valid in thread 0). A fixed order for a given blockDim.x (a multiple of
 *  32, at most 1024), so a run is reproducible. */
__device__ __noinline__ double app_block_sum(double v)
{
    __shared__ double app_red[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) app_red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const unsigned nwarps = (blockDim.x + 31u) >> 5;
        v = lane < nwarps ? app_red[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    }
    __syncthreads();
    return v;
}

/* -------------------------------------------- a round's big vertices (graphs) */

/* bfs and sssp hand a frontier vertex of many arcs to the whole grid: a
 * warp appends it to the round's big list (app_big_push), and after a grid
 * barrier every warp takes equal chunks of the list's arcs (app_big_walk).
 * The list is a packed word, count << APP_BIG_SHIFT | arcs so far, and
 * u64 [2][cap]: each entry's first arc in the list, then its local id. */
#define APP_BIG_SHIFT 38
#define APP_BIG_ARCS_MASK ((1ull << APP_BIG_SHIFT) - 1ull)

/** Append local vertex `ul` of `deg` arcs (one thread): one atomic on the
 *  packed word gives the entry and its first arc in the list, so the
 *  offsets grow with the entries. */
__device__ __forceinline__ void app_big_push(app_u64* packed, app_u64* big, app_u64 cap, app_u64 ul, app_u64 deg)
{
    const app_u64 old = atomicAdd(packed, (1ull << APP_BIG_SHIFT) | deg);
    const app_u64 j = old >> APP_BIG_SHIFT;
    big[j] = old & APP_BIG_ARCS_MASK;
    big[cap + j] = ul;
}

/** After a grid barrier: whether the round has a big list (the same
 *  answer in every block, nobody writes the word until the next barrier). */
__device__ __forceinline__ bool app_big_any(const app_u64* packed) { return app_ld_relaxed_gpu(packed) != 0; }

/** Every arc of the list (after a grid barrier), in chunks of `chunk` per
 *  warp (warp gw of nw): visit(ul, a) for arc index `a` of local vertex
 *  `ul` in the CSR `rows`. The list was written by other blocks before the
 *  barrier: read through L2. */
template <typename V>
__device__ __forceinline__ void app_big_walk(const app_u64* packed, const app_u64* big, app_u64 cap,
                                             const app_u64* rows, app_u64 chunk, app_u64 gw, app_u64 nw, V&& visit)
{
    const app_u64 word = app_ld_relaxed_gpu(packed);
    const app_u64 count = word >> APP_BIG_SHIFT, total = word & APP_BIG_ARCS_MASK;
    const app_u64* off = big;
    const app_u64* ids = big + cap;
    const unsigned lane = threadIdx.x & 31u;
    for (app_u64 c = gw * chunk; c < total; c += nw * chunk) {
        /* The entry holding arc c: the last j with off[j] <= c (off[0] = 0). */
        app_u64 j = 0, hi = count;
        while (hi - j > 1) {
            const app_u64 mid = (j + hi) / 2;
            if (__ldcg(&off[mid]) <= c) j = mid;
            else hi = mid;
        }
        const app_u64 stop = c + chunk < total ? c + chunk : total;
        for (app_u64 q = c + lane; q < stop; q += 32) {
            while (j + 1 < count && __ldcg(&off[j + 1]) <= q) ++j;
            const app_u64 ul = __ldcg(&ids[j]);
            visit(ul, rows[ul] + (q - __ldcg(&off[j])));
        }
    }
}
