/*
 * cpnet/grid.cuh -- the grid forms of the on-stream collectives (issue 22):
 * one collective of a team run by many blocks of one launch, where every
 * other member's heap is mapped (peer-to-peer stores). The runtime's
 * NVRTC kernels (runtime/src/gpu/reduce_grid.rs, alltoall_grid.rs) and
 * nvshmem.h's `nvshmemx_TYPENAME_OP_reduce_on_stream` build on it.
 *
 * THE PROTOCOL. Block 0 speaks for the PE: it opens a context, checks the
 * team and takes the team's next epochs (the same on every member: every
 * member enters the team's collectives in the same order). The other
 * blocks only move data. Two words of device memory of this launch, zero
 * when it starts (the runtime hands each launch a set of CPNET_GRID_WORDS
 * words that the last block of the set's previous launch zeroed on its way
 * out, grid_exit), join them:
 *
 *  - words[0], `go`: with an entry epoch (a form that loads the other
 *    members' buffers), block 0 SETs SIG[my_idx] = e at every other member,
 *    waits for every member's SIG[j] >= e (their sources are written, their
 *    destinations free), then stores 1 with a release the other blocks
 *    acquire before they start; 2 if it failed, and they leave. Without
 *    one, the blocks start at once.
 *  - words[1], `done`: each block fences its stores (fence.sc.sys) and
 *    counts itself; block 0 waits for the count, then runs the exit epoch
 *    (SET and wait, as above): the data is visible before the signals, and
 *    after it no member still touches this PE's buffers. It closes its
 *    context (a quiet).
 *
 * Signals are SET with st.release.sys on the peer path (team.cuh's
 * team_signal_leader) and polled with acquire loads (team_wait_all). A
 * failure goes to the status block (cpnet_abort_code; the host's
 * synchronize reports it).
 *
 * THE REDUCE TO ALL (reduce_grid): a reduce-scatter then an allgather,
 * both in place over the peer mappings, with no scratch. Member k owns
 * part k of the array (ceil(n / size) elements rounded up to whole 16-byte
 * words, the last part shorter). Each of its blocks takes a run of that
 * part, loads the run from every member's source, folds it in team order
 * (every element gets the bits the one-block form gives it) and stores the
 * result into every member's dest: 16-byte loads and stores where every
 * buffer is 16-byte aligned, element by element otherwise and for the
 * array's last partial word. Each member's links carry 2 (size - 1) / size
 * of the array each way, a ring allreduce's traffic without a ring's steps.
 * Every member takes the grid form or none: the choice depends on the size,
 * the team and the peer table, the same on every member.
 */
#ifndef CPNET_GRID_CUH
#define CPNET_GRID_CUH

#include <cpnet/device.cuh>

namespace cpnet_detail {

/** A grid collective's state, in block shared memory. */
struct grid_state {
    cpnet_ctx_t ctx;
    cpnet_team_desc_t d;
    uint64_t epoch; /* the first epoch taken */
    int go;         /* words[0] as this block saw it */
    int err;        /* block 0: why grid_open stopped (CPNET_E_*) */
    int quiet;      /* block 0: 1 once grid_quiet_post began the close's quiet */
    split_quiet q;  /* block 0: that quiet (rma.cuh) */
};

/** Report `e` through the status block (thread 0), with or without a context. */
__device__ inline void grid_fail(cpnet_handle_t* h, cpnet_ctx_t* ctx, int e)
{
    if (threadIdx.x != 0) return;
    cpnet_ctx_t bare = {};
    bare.status = (cpnet_status_t*)h->status;
    report_dev_error(ctx != nullptr ? ctx : &bare, e, h->my_pe, 0, 0, 0, CPNET_CMP_EQ);
}

/** Block 0, whole block: SIG[my_idx] = e at every other member, then wait
 *  for every member's SIG[j] >= e. */
__device__ inline int grid_epoch(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t e)
{
    const int r = collective(ctx, [&]() -> int {
        for (int k = 1; k < d.size; ++k) {
            const int j = (d.my_idx + k) % d.size;
            const int s = team_signal_leader(ctx, team_sig(ctx, d, d.my_idx), e, team_world_pe(d, j));
            if (s != CPNET_E_OK) return s;
        }
        return CPNET_E_OK;
    });
    return r != CPNET_E_OK ? r : team_wait_all(ctx, d, e);
}

/** Thread 0 of a block: fence this block's stores (a block barrier
 *  ordered its threads' before) and count the block in `*count`, which
 *  block 0 acquires (grid_wait_count). */
__device__ inline void grid_arrive(unsigned long long* count)
{
    __threadfence_system();
    atomicAdd(count, 1ull);
}

/** Every block, whole block: its run of the `nbytes` at `from` into `to`
 *  (block b copies bytes [b run, (b + 1) run), run a 256-byte multiple, so
 *  the addresses' alignment is kept), then every block but 0 counts itself
 *  in `*count` (grid_arrive); block 0 waits for gridDim.x - 1 there before
 *  it reads `to`. The in-place reduce's copy of its array into the reduce
 *  scratch (reduce_net.rs), on the grid instead of a copy on the stream. */
__device__ inline void grid_copy_in(void* to, const void* from, uint64_t nbytes, unsigned long long* count)
{
    const uint64_t run = ((nbytes + gridDim.x - 1) / gridDim.x + 255) / 256 * 256;
    const uint64_t lo = (uint64_t)blockIdx.x * run;
    if (lo < nbytes) block_copy((uint8_t*)to + lo, (const uint8_t*)from + lo, lo + run < nbytes ? run : nbytes - lo);
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x != 0) grid_arrive(count);
}

/** Thread 0: wait until `*count` reaches `want` or the job aborts; returns
 *  CPNET_E_OK or the abort code. The acquire load pairs with the blocks'
 *  fenced counts (grid_arrive). */
__device__ inline int grid_wait_count(cpnet_handle_t* h, const unsigned long long* count, unsigned long long want)
{
    unsigned polls = 0;
    while (cpnet_ld_acquire_sys_u64((const uint64_t*)count) < want)
        if ((++polls & 1023) == 0) {
            const int ab = cpnet_abort_code(h);
            if (ab != CPNET_E_OK) return ab;
        }
    return CPNET_E_OK;
}

/** Thread 0 of a block other than 0: wait while `*word` holds `from`, or
 *  until the job aborts; returns the value it saw next (2 on abort: block
 *  0 failed). The acquire load pairs with block 0's release store of the
 *  word (go, the reduce's `entered`). */
__device__ inline int grid_wait_word(cpnet_handle_t* h, const unsigned long long* word, unsigned long long from)
{
    unsigned polls = 0;
    unsigned long long v;
    while ((v = cpnet_ld_acquire_sys_u64((const uint64_t*)word)) == from)
        if ((++polls & 1023) == 0 && cpnet_abort_code(h) != CPNET_E_OK) return 2;
    return (int)v;
}

/** Every block, whole block: block 0 opens its context, checks `team`
 *  against (my_idx, size) and takes `epochs` epochs (the first in
 *  st->epoch); with `entry` it runs the first as the entry epoch and then
 *  releases the other blocks through words[0], which they wait for.
 *  Returns whether this block goes on (the same in all its threads); where
 *  block 0 does not, st->err says why. */
__device__ inline bool grid_open(cpnet_handle_t* h, int team, int my_idx, int size, unsigned long long* words,
                                 int epochs, bool entry, grid_state* st)
{
    if (blockIdx.x != 0) {
        if (!entry) return true;
        if (threadIdx.x == 0) st->go = grid_wait_word(h, &words[0], 0);
        __syncthreads();
        return st->go == 1;
    }
    int e = cpnet_ctx_create(h, &st->ctx);
    if (threadIdx.x == 0) st->err = e;
    if (e != CPNET_E_OK) {
        grid_fail(h, nullptr, e);
        if (threadIdx.x == 0 && entry) cpnet_st_release_gpu_u64((uint64_t*)&words[0], 2);
        __syncthreads(); /* st->err for every thread */
        return false;
    }
    if (threadIdx.x == 0) {
        st->quiet = 0;
        cpnet_team_desc_t t;
        e = team_get(&st->ctx, team, &t);
        if (e == CPNET_E_OK && (t.my_idx != my_idx || t.size != size)) e = CPNET_E_BAD_TEAM;
        st->d = t;
        st->ctx.ret = e;
        if (e == CPNET_E_OK) {
            st->epoch = team_next_leader(&st->ctx, t, false) >> 1;
            for (int k = 1; k < epochs; ++k) (void)team_next_leader(&st->ctx, t, false);
        }
    }
    __syncthreads();
    e = st->ctx.ret;
    if (e == CPNET_E_OK && entry) e = grid_epoch(&st->ctx, st->d, st->epoch);
    /* Release: what block 0 acquired from the members' signals, before the
     * other blocks' loads of their buffers. */
    if (threadIdx.x == 0 && entry) cpnet_st_release_gpu_u64((uint64_t*)&words[0], e == CPNET_E_OK ? 1 : 2);
    if (e != CPNET_E_OK) {
        if (threadIdx.x == 0) st->err = e;
        grid_fail(h, &st->ctx, e);
        cpnet_ctx_destroy(&st->ctx);
        __syncthreads(); /* st->err for every thread */
        return false;
    }
    return true;
}

/** Block 0, whole block, after its last command: post the quiet that
 *  grid_close (without an exit epoch) would send, so the proxy completes
 *  the queue -- the target's ACK of the puts -- while the blocks wait for
 *  the peers' data and fold; grid_close then only waits for it. Nothing
 *  may go into the context's queue after it. */
__device__ inline void grid_quiet_post(grid_state* st)
{
    quiet_post(&st->ctx, &st->q);
    if (threadIdx.x == 0) st->quiet = 1;
    __syncthreads();
}

/** Block 0, whole block: grid_close's quiet: the one grid_quiet_post began,
 *  finished, else a whole cpnet_quiet. */
__device__ inline int grid_quiet(grid_state* st)
{
    return st->quiet ? quiet_finish(&st->ctx, &st->q) : cpnet_quiet(&st->ctx);
}

/** Every block that went on, whole block: fence this block's stores and
 *  count it in words[1]; block 0 waits for the count, runs exit epoch `e`
 *  (with `exit_epoch`; else a quiet: its context's puts have landed) and
 *  closes its context. Returns block 0's result (CPNET_E_OK in the other
 *  blocks). */
__device__ inline int grid_close(cpnet_handle_t* h, unsigned long long* words, uint64_t e, grid_state* st,
                                 bool exit_epoch = true)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        /* Every thread's stores of this block (ordered by the barrier),
         * then the count; block 0's acquire below pairs with it. */
        __threadfence_system();
        if (blockIdx.x != 0) atomicAdd(&words[1], 1ull);
    }
    if (blockIdx.x != 0) return CPNET_E_OK;
    if (threadIdx.x == 0) st->ctx.ret = grid_wait_count(h, &words[1], gridDim.x - 1);
    __syncthreads();
    int r = st->ctx.ret;
    if (r == CPNET_E_OK) r = exit_epoch ? grid_epoch(&st->ctx, st->d, e) : grid_quiet(st);
    if (r != CPNET_E_OK) grid_fail(h, &st->ctx, r);
    const int d = cpnet_ctx_destroy(&st->ctx);
    return r != CPNET_E_OK ? r : d;
}

/** The launch word grid_exit counts the blocks in: the last of the
 *  CPNET_GRID_WORDS, which no form uses otherwise. */
#define CPNET_GRID_WORD_EXIT (CPNET_GRID_WORDS - 1)

/** Every block, whole block, as the very last thing a grid kernel does
 *  (after the form returned, on every path): count the block out in
 *  words[CPNET_GRID_WORD_EXIT]; the last block to leave zeroes all
 *  CPNET_GRID_WORDS words, so the next launch that gets them (the
 *  runtime's ring of word sets, runtime/src/gpu/grid.rs) finds them zeroed
 *  with no memset between kernels. Each block's accesses to the words come
 *  before its count (the barrier, then a device-scope fence); the last
 *  block's fence after the count orders its zeroing after all of them, and
 *  the kernel's end publishes the zeros to later launches. */
__device__ inline void grid_exit(unsigned long long* words)
{
    __syncthreads();
    if (threadIdx.x != 0) return;
    __threadfence();
    if (atomicAdd(&words[CPNET_GRID_WORD_EXIT], 1ull) != gridDim.x - 1) return;
    __threadfence();
    for (int i = 0; i < CPNET_GRID_WORDS; ++i) atomicExch(&words[i], 0ull);
}

/** The element type T of a team.cuh reduction `cpnet_NAME_OP_reduce`,
 *  from its signature: `reduce_elem<decltype(&cpnet_float_sum_reduce)>::type`
 *  is float. The runtime's grid kernels (reduce_grid.rs, reduce_net.rs)
 *  name their type this way. */
template <typename F> struct reduce_elem;
template <typename T> struct reduce_elem<int (*)(cpnet_ctx_t*, cpnet_team_t, T*, const T*, cpnet_size_t)> {
    typedef T type;
};

/** Worker i's run [*lo, *hi) of [plo, phi), which `cnt` workers share in
 *  runs of whole q-unit words (the last run shorter, runs past the end
 *  empty). */
__device__ __forceinline__ void grid_run(uint64_t plo, uint64_t phi, uint64_t q, uint64_t i, uint64_t cnt, uint64_t* lo,
                                         uint64_t* hi)
{
    const uint64_t per = ((phi - plo + cnt - 1) / cnt + q - 1) / q * q;
    *lo = plo + i * per < phi ? plo + i * per : phi;
    *hi = *lo + per < phi ? *lo + per : phi;
}

/** This block's run [*lo, *hi) of elements [plo, phi), which the grid's
 *  blocks share in runs of whole q-element words: reduce_grid_block's. */
__device__ __forceinline__ void grid_block_run(uint64_t plo, uint64_t phi, uint64_t q, uint64_t* lo, uint64_t* hi)
{
    grid_run(plo, phi, q, blockIdx.x, gridDim.x, lo, hi);
}

/** The reduce grid's words in flight per thread: 8 elements, or 4 16-byte
 *  words, from every member at once. */
#define CPNET_REDUCE_GRID_UNROLL 8
#define CPNET_REDUCE_GRID_VEC_UNROLL 4

/** Words [0, nw) of type W (sizeof(W) / sizeof(T) elements each) from
 *  element `lo` on (whole block): each thread takes U words at a time (w,
 *  w + nt, ...), loads them from every member's source together (U loads
 *  in flight per member), folds in team order and stores the result into
 *  the dest of `stores` members from this one on (every member's: a.size;
 *  this member's alone: 1). */
template <typename W, bool CV>
__device__ __forceinline__ W grid_load(const W* p)
{
    if constexpr (!CV) {
        return *p;
    } else {
        /* ld.global.cv, as the landing agent reads host staging: a half in
         * host memory is rewritten by the peer's GPU between two calls, so
         * a line cached from the last use must not serve this one. */
        W w;
        if constexpr (sizeof(W) == 16) {
            const uint4 v = __ldcv((const uint4*)p);
            memcpy(&w, &v, 16);
        } else if constexpr (sizeof(W) == 8) {
            const unsigned long long v = __ldcv((const unsigned long long*)p);
            memcpy(&w, &v, 8);
        } else if constexpr (sizeof(W) == 4) {
            const unsigned int v = __ldcv((const unsigned int*)p);
            memcpy(&w, &v, 4);
        } else if constexpr (sizeof(W) == 2) {
            const unsigned short v = __ldcv((const unsigned short*)p);
            memcpy(&w, &v, 2);
        } else {
            static_assert(sizeof(W) == 1, "grid_load: words of 1, 2, 4, 8 or 16 bytes");
            const unsigned char v = __ldcv((const unsigned char*)p);
            memcpy(&w, &v, 1);
        }
        return w;
    }
}

/** With CV, every load is grid_load's ld.global.cv (a member's array in
 *  host memory: the pair staging, cpnet/pair.cuh). */
template <typename T, int OP, typename W, int U, bool CV = false>
__device__ __forceinline__ void reduce_grid_run(const cpnet_reduce_grid_args_t& a, uint64_t lo, uint64_t nw, int stores)
{
    constexpr int V = sizeof(W) / sizeof(T);
    const uint64_t nt = blockDim.x;
    for (uint64_t w = threadIdx.x; w < nw; w += U * nt) {
        T acc[U][V];
        for (int j = 0; j < a.size; ++j) {
            const W* sj = (const W*)((const T*)a.src[j] + lo);
            W x[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (w + u * nt < nw) x[u] = grid_load<W, CV>(sj + w + u * nt);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (w + u * nt >= nw) continue;
                T e[V];
                memcpy(e, &x[u], sizeof(W));
#pragma unroll
                for (int k = 0; k < V; ++k) acc[u][k] = j == 0 ? e[k] : combiner<T, OP>::apply(acc[u][k], e[k]);
            }
        }
        for (int k = 0; k < stores; ++k) {
            W* dj = (W*)((T*)a.dst[(a.my_idx + k) % a.size] + lo);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (w + u * nt >= nw) continue;
                W v;
                memcpy(&v, acc[u], sizeof(W));
                dj[w + u * nt] = v;
            }
        }
    }
}

/** Elements [lo, hi) by the whole block (lo a multiple of q): in 16-byte
 *  words, U of them per thread in flight from each member, where q is 16
 *  bytes of T (every buffer 16-byte aligned), then element by element (the
 *  unaligned case, and the array's last partial word); `stores` and CV as
 *  reduce_grid_run's. */
template <typename T, int OP, bool CV = false>
__device__ __forceinline__ void reduce_grid_span(const cpnet_reduce_grid_args_t& a, uint64_t lo, uint64_t hi, uint64_t q,
                                                 int stores)
{
    constexpr uint64_t V = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
    const uint64_t nw = q == V && V > 1 ? (hi - lo) / V : 0;
    if (nw > 0) reduce_grid_run<T, OP, uint4, CPNET_REDUCE_GRID_VEC_UNROLL, CV>(a, lo, nw, stores);
    reduce_grid_run<T, OP, T, CPNET_REDUCE_GRID_UNROLL, CV>(a, lo + nw * V, hi - lo - nw * V, stores);
}

/** This block's run of elements [plo, phi), which the grid's blocks share
 *  in runs of whole q-element words (q: 16 bytes of T where every buffer
 *  allows it, else 1): reduce_grid_run over it in 16-byte words, U of them
 *  per thread in flight from each member, then element by element (the
 *  unaligned case, and the array's last partial word); `stores` as there. */
template <typename T, int OP, bool CV = false>
__device__ __forceinline__ void reduce_grid_block(const cpnet_reduce_grid_args_t& a, uint64_t plo, uint64_t phi,
                                                  uint64_t q, int stores)
{
    uint64_t lo, hi;
    grid_block_run(plo, phi, q, &lo, &hi);
    reduce_grid_span<T, OP, CV>(a, lo, hi, q, stores);
}

/** The reduce to all of `a.n` elements of T with operator OP (enum
 *  reduce_op) on `team`, by every block of the grid (the protocol and the
 *  algorithm above). Every block of the launch calls it with the same
 *  arguments; `a.words` are zeroed words of this launch alone (go, done;
 *  a launch gets CPNET_GRID_WORDS). Dealing the part out in pieces from a
 *  counter, as the alltoall does, was no faster here (docs/results.md,
 *  "Session 22").
 *  Returns, in block 0, CPNET_E_OK or the failure it also reported to the
 *  status block; CPNET_E_OK in the others (they leave early when block 0
 *  failed to open). */
template <typename T, int OP>
__device__ inline int reduce_grid(cpnet_handle_t* h, int team, const cpnet_reduce_grid_args_t& a)
{
    __shared__ grid_state st;
    unsigned long long* words = (unsigned long long*)a.words;
    /* Entry and exit epochs: loads of every member's source. */
    if (!grid_open(h, team, a.my_idx, a.size, words, 2, true, &st))
        return blockIdx.x == 0 ? st.err : CPNET_E_OK;
    /* This member's part, and this block's run of it: whole 16-byte words
     * (V elements) where every buffer is 16-byte aligned, so that a run
     * moves in uint4 loads and stores; only the array's last run ends in a
     * partial word. */
    constexpr uint64_t V = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
    uint64_t any = a.dest | a.source;
    for (int j = 0; j < a.size; ++j) any |= a.src[j] | a.dst[j];
    const uint64_t q = (any & 15) == 0 ? V : 1;
    const uint64_t part = ((a.n + (uint64_t)a.size - 1) / (uint64_t)a.size + q - 1) / q * q;
    const uint64_t plo = (uint64_t)a.my_idx * part < a.n ? (uint64_t)a.my_idx * part : a.n;
    const uint64_t phi = plo + part < a.n ? plo + part : a.n;
    reduce_grid_block<T, OP>(a, plo, phi, q, a.size);
    return grid_close(h, words, st.epoch + 1, &st);
}

/** Blocks other than 0, thread 0: wait for words[0] (block 0's release)
 *  or the abort code; returns what it saw (1: go, 2: block 0 failed). */
__device__ inline int grid_wait_go(cpnet_handle_t* h, unsigned long long* words)
{
    return grid_wait_word(h, &words[0], 0);
}

/** Block 0, whole block: a fence (the puts and signals so far are
 *  delivered before any later one to the same member: a SET of a later
 *  epoch never lands before an earlier one), then epoch `e` (grid_epoch). */
__device__ inline int grid_fenced_epoch(cpnet_ctx_t* ctx, const cpnet_team_desc_t& d, uint64_t e)
{
    cpnet_fence(ctx);
    return grid_epoch(ctx, d, e);
}

/** The reduce to all over the network path (runtime/src/gpu/reduce_net.rs):
 *  `n` = size x m elements, member k owning part k (elements k m ..
 *  (k + 1) m). Blocks 0 .. comm - 1 move the data, each with a context of
 *  its own (so its own queue and proxy thread), run c of every part; every
 *  block folds. Three epochs e, e + 1, e + 2, taken by block 0:
 *
 *   1. the reduce-scatter: part j of this member's source goes into member
 *      j's dest at part my_idx (every dest has room: part j of member j's
 *      dest is the only one the reduce-scatter does not fill there). With
 *      one mover, block 0 puts each part with SIG[my_idx] = e; with more,
 *      each puts its runs, quiets and counts itself, and block 0 then SETs
 *      e at every member. Block 0 waits for every member's e and releases
 *      the blocks (words[0] = 1);
 *   2. every block folds its run of this member's part in team order (its
 *      own part from source, member j's from dest part j) into dest part
 *      my_idx, and counts itself; block 0 waits for the count and runs
 *      epoch e + 1 after a fence (every member has folded: its dest parts
 *      are free again), then releases the movers (words[0] = 3);
 *   3. the allgather: dest part my_idx into every member's dest part
 *      my_idx, as in 1 with e + 2; block 0 waits for every member's e + 2
 *      and closes its context (a quiet).
 *
 *  Each member's links carry (size - 1) / size of the array each way twice,
 *  a ring's traffic, in three signal rounds and no team scratch. dest and
 *  source must not overlap (the runtime takes the one-block form then). A
 *  mover that gets no context is marked in words[2] and block 0 moves its
 *  runs; the first error a mover meets is in words[3]; words[1] counts
 *  arrivals over the whole launch.
 *
 *  With `entry` (the runtime's in-place reduce, reduce_net.rs), every
 *  block first copies its run of dest into `source` (this PE's reduce
 *  scratch; grid_copy_in, counted in words[5]); block 0 waits for the
 *  copies, runs an entry epoch, so no member puts into a dest whose member
 *  has not copied it out yet, and releases the movers through words[4] (1;
 *  2: block 0 failed, move nothing); the three epochs above follow it.
 *  Returns as reduce_grid. */
template <typename T, int OP>
__device__ inline int reduce_net(cpnet_handle_t* h, int team, uint64_t dest, uint64_t source, uint64_t n,
                                 unsigned long long* words, int my_idx, int size, int comm, bool entry)
{
    __shared__ grid_state st;
    __shared__ int has_ctx;
    unsigned long long* const go = &words[0];
    unsigned long long* const count = &words[1];
    unsigned long long* const missing = &words[2];
    unsigned long long* const first_err = &words[3];
    unsigned long long* const entered = &words[4];
    if (entry) grid_copy_in((void*)source, (const void*)dest, n * sizeof(T), &words[5]);
    const uint64_t m = n / (uint64_t)(size > 0 ? size : 1);
    const uint64_t pbytes = m * sizeof(T);
    const unsigned C = comm < 1 ? 1u : ((unsigned)comm > gridDim.x ? gridDim.x : (unsigned)comm);
    const unsigned B = gridDim.x;
    const bool mover = blockIdx.x < C;
    /* Run c of a part: bytes [c run, (c + 1) run) of it. */
    const uint64_t run = ((pbytes + C - 1) / C + 255) / 256 * 256;
    uint8_t* const mine = (uint8_t*)dest + (uint64_t)my_idx * pbytes;
    /* Run c of every part to its member: the reduce-scatter's (from
     * source part j) or the allgather's (from dest part my_idx). */
    auto move = [&](unsigned c, bool gather) {
        const uint64_t lo = (uint64_t)c * run;
        if (lo >= pbytes) return;
        const uint64_t len = lo + run < pbytes ? run : pbytes - lo;
        for (int k = 1; k < st.d.size; ++k) {
            const int j = (st.d.my_idx + k) % st.d.size;
            const uint8_t* from = gather ? mine : (const uint8_t*)source + (uint64_t)j * pbytes;
            cpnet_putmem_nbi(&st.ctx, mine + lo, from + lo, len, team_world_pe(st.d, j));
        }
    };
    /* Block 0, whole block: the movers' runs of one direction, then the
     * epoch that says they landed (with one mover, the puts carry it). */
    auto phase = [&](bool gather, uint64_t e, unsigned long long want) -> int {
        if (C == 1) {
            uint64_t* const sig_me = team_sig(&st.ctx, st.d, st.d.my_idx);
            for (int k = 1; k < st.d.size; ++k) {
                const int j = (st.d.my_idx + k) % st.d.size;
                const uint8_t* from = gather ? mine : (const uint8_t*)source + (uint64_t)j * pbytes;
                cpnet_putmem_signal_nbi(&st.ctx, mine, from, pbytes, sig_me, e, CPNET_SIGNAL_SET, team_world_pe(st.d, j));
            }
            /* The allgather's puts are block 0's last commands: the close's
             * quiet now, so their ACKs come back while it waits. */
            if (gather) grid_quiet_post(&st);
            return team_wait_all(&st.ctx, st.d, e);
        }
        move(0, gather);
        if (threadIdx.x == 0) st.err = grid_wait_count(h, count, want);
        __syncthreads();
        int r = st.err;
        const unsigned long long miss = *(volatile unsigned long long*)missing;
        for (unsigned c = 1; c < C && r == CPNET_E_OK; ++c)
            if (miss & (1ull << c)) move(c, gather);
        const int q = cpnet_quiet(&st.ctx);
        if (r == CPNET_E_OK) r = q;
        if (r == CPNET_E_OK) r = (int)*(volatile unsigned long long*)first_err;
        /* The quiets (ours and the movers') put the data in the members'
         * memory before these signals. */
        return r != CPNET_E_OK ? r : grid_epoch(&st.ctx, st.d, e);
    };

    if (blockIdx.x == 0) {
        if (!grid_open(h, team, my_idx, size, words, entry ? 4 : 3, false, &st)) {
            if (threadIdx.x == 0) {
                cpnet_st_release_gpu_u64((uint64_t*)go, 2);
                cpnet_st_release_gpu_u64((uint64_t*)entered, 2);
            }
            return st.err;
        }
        if (entry) {
            if (threadIdx.x == 0) st.err = grid_wait_count(h, &words[5], gridDim.x - 1);
            __syncthreads();
            int r = st.err;
            if (r == CPNET_E_OK) r = grid_epoch(&st.ctx, st.d, st.epoch);
            /* Release: pairs with the movers' acquire below; every member
             * has entered (its dest is in its scratch) before any put. */
            if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)entered, r == CPNET_E_OK ? 1 : 2);
            if (r != CPNET_E_OK) {
                if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)go, 2);
                grid_fail(h, &st.ctx, r);
                cpnet_ctx_destroy(&st.ctx);
                return r;
            }
            if (threadIdx.x == 0) st.epoch += 1;
            /* The entry's SETs land before any later epoch's. */
            cpnet_fence(&st.ctx);
            __syncthreads();
        }
    } else if (mover) {
        const int created = cpnet_ctx_create(h, &st.ctx);
        int e = created;
        if (e == CPNET_E_OK && threadIdx.x == 0) {
            cpnet_team_desc_t t;
            e = team_get(&st.ctx, team, &t);
            if (e == CPNET_E_OK && (t.my_idx != my_idx || t.size != size)) e = CPNET_E_BAD_TEAM;
            st.d = t;
            st.ctx.ret = e;
        }
        __syncthreads();
        if (e == CPNET_E_OK) e = st.ctx.ret;
        if (e != CPNET_E_OK && threadIdx.x == 0) atomicOr(missing, 1ull << blockIdx.x);
        if (threadIdx.x == 0) has_ctx = e == CPNET_E_OK;
        __syncthreads();
        /* A context on a team that does not check out goes back at once. */
        if (!has_ctx && created == CPNET_E_OK) cpnet_ctx_destroy(&st.ctx);
        if (has_ctx && entry) {
            /* Block 0's release of `entered`: every member copied its chunk. */
            if (threadIdx.x == 0) st.go = grid_wait_word(h, entered, 0);
            __syncthreads();
        }
        if (has_ctx && (!entry || st.go == 1)) {
            move(blockIdx.x, false);
            const int q = cpnet_quiet(&st.ctx);
            if (q != CPNET_E_OK && threadIdx.x == 0) atomicCAS(first_err, 0ull, (unsigned long long)(unsigned)q);
        }
        if (threadIdx.x == 0) grid_arrive(count);
    }

    /* 1. The reduce-scatter (block 0), then the release of the folders. */
    if (blockIdx.x == 0) {
        const int e = phase(false, st.epoch, C - 1);
        if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)go, e == CPNET_E_OK ? 1 : 2);
        if (e != CPNET_E_OK) {
            grid_fail(h, &st.ctx, e);
            cpnet_ctx_destroy(&st.ctx);
            return e;
        }
    } else {
        if (threadIdx.x == 0) st.go = grid_wait_go(h, words);
        __syncthreads();
        if (st.go != 1) {
            if (mover && has_ctx) cpnet_ctx_destroy(&st.ctx);
            return CPNET_E_OK;
        }
    }

    /* 2. The fold: this block's run of part my_idx, in 16-byte words where
     * every address and the part's length allow. Member j's contribution
     * is dest part j (source part my_idx for this member), seen through
     * src[j] at the offsets of part my_idx. */
    {
        cpnet_reduce_grid_args_t b;
        for (int j = 0; j < size && j < CPNET_GRID_MAX_MEMBERS; ++j)
            b.src[j] = j == my_idx ? source : dest + (uint64_t)((int64_t)(j - my_idx) * (int64_t)pbytes);
        b.dst[my_idx] = dest;
        b.my_idx = my_idx;
        b.size = size;
        constexpr uint64_t V = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
        const uint64_t q = ((dest | source | pbytes) & 15) == 0 ? V : 1;
        reduce_grid_block<T, OP>(b, (uint64_t)my_idx * m, (uint64_t)(my_idx + 1) * m, q, 1);
        __syncthreads();
    }
    if (blockIdx.x != 0) {
        if (threadIdx.x == 0) grid_arrive(count);
        if (!mover) return CPNET_E_OK;
        /* 3. A mover's runs of the allgather, once block 0 says every
         * member has folded. */
        /* Block 0's release of go = 3 (or 2). */
        if (threadIdx.x == 0) st.go = grid_wait_word(h, go, 1);
        __syncthreads();
        if (st.go == 3 && has_ctx) {
            move(blockIdx.x, true);
            const int q = cpnet_quiet(&st.ctx);
            if (q != CPNET_E_OK && threadIdx.x == 0) atomicCAS(first_err, 0ull, (unsigned long long)(unsigned)q);
        }
        if (threadIdx.x == 0 && st.go == 3) grid_arrive(count);
        if (has_ctx) cpnet_ctx_destroy(&st.ctx);
        return CPNET_E_OK;
    }

    /* Block 0: every block folded, then epoch e + 1, then the allgather. */
    if (threadIdx.x == 0) st.ctx.ret = grid_wait_count(h, count, (unsigned long long)(C - 1) + (B - 1));
    __syncthreads();
    int r = st.ctx.ret;
    if (r == CPNET_E_OK) r = grid_fenced_epoch(&st.ctx, st.d, st.epoch + 1);
    if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)go, r == CPNET_E_OK ? 3 : 2);
    if (r == CPNET_E_OK) {
        /* After the e + 1 signals, as in grid_fenced_epoch. */
        cpnet_fence(&st.ctx);
        r = phase(true, st.epoch + 2, 2ull * (C - 1) + (B - 1));
    }
    /* The quiet phase() posted (one mover), finished before the destroy,
     * which then has nothing to drain. */
    if (r == CPNET_E_OK && st.quiet) r = grid_quiet(&st);
    if (r != CPNET_E_OK) grid_fail(h, &st.ctx, r);
    const int d = cpnet_ctx_destroy(&st.ctx);
    return r != CPNET_E_OK ? r : d;
}

/** The reduce to all of a team of two over the network path
 *  (runtime/src/gpu/reduce_net.rs, with the shm provider's staging zones):
 *  one exchange of the whole array instead of a reduce-scatter, a sync and
 *  an allgather, each of which costs a round through both proxies. Epochs
 *  e, e + 1, taken by block 0:
 *
 *   1. entry epoch e (grid_epoch): the peer has entered this reduce, so it
 *      has folded its previous one and its dest is free;
 *   2. block 0 puts this member's whole source into the peer's dest with
 *      SIG[my_idx] = e + 1 and waits for the peer's e + 1: its source is in
 *      this member's dest; then it releases the blocks (words[0] = 1);
 *   3. every block folds its run of the array in team order (member 0's
 *      contribution first: this member's from source, the peer's from
 *      dest) into dest, fences and counts itself (words[1]); block 0 waits
 *      for the count and closes its context (a quiet: its put has landed,
 *      so source may change once the kernel ends).
 *
 *  Each link carries the array once each way, as the reduce-scatter and
 *  allgather together do, in two signal rounds instead of three, and the
 *  fold reads twice the array. dest and source must not overlap. With
 *  `copy_in` (the runtime's in-place reduce, reduce_net.rs), every block
 *  first copies its run of dest into `source` (this PE's reduce scratch;
 *  grid_copy_in, counted in words[5]) and block 0 waits for the copies
 *  before the entry epoch.
 *
 *  With `land` (a landing half of this PE's reduce scratch, at the same
 *  heap offset on the peer; the runtime alternates two per call, so the
 *  peer puts call k + 2 there only after this member's call k + 1 put
 *  reached it, which it issued after call k's fold), block 0 takes one
 *  epoch e and runs no entry epoch: it puts its source into the peer's
 *  `land` with SIG[my_idx] = e, waits for the peer's e, and the fold reads
 *  the peer's array from `land`. (The pair staging's form, through halves
 *  in host memory, is cpnet/pair.cuh's reduce_staged.) Returns, in block
 *  0, CPNET_E_OK or the failure it also reported. */
template <typename T, int OP>
__device__ inline int reduce_pair(cpnet_handle_t* h, int team, uint64_t dest, uint64_t source, uint64_t n,
                                  unsigned long long* words, int my_idx, bool copy_in = false, uint64_t land = 0)
{
    __shared__ grid_state st;
    constexpr uint64_t V = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
    const uint64_t q = ((dest | source | land) & 15) == 0 ? V : 1;
    cpnet_reduce_grid_args_t b;
    b.src[my_idx] = source;
    b.src[1 - my_idx] = land != 0 ? land : dest;
    b.dst[my_idx] = dest;
    b.my_idx = my_idx;
    b.size = 2;
    if (copy_in) grid_copy_in((void*)source, (const void*)dest, n * sizeof(T), &words[5]);
    if (blockIdx.x == 0) {
        if (!grid_open(h, team, my_idx, 2, words, land != 0 ? 1 : 2, false, &st)) {
            if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)&words[0], 2);
            return st.err;
        }
        const int peer = 1 - my_idx;
        if (copy_in) {
            if (threadIdx.x == 0) st.err = grid_wait_count(h, &words[5], gridDim.x - 1);
            __syncthreads();
        }
        int r = copy_in ? st.err : CPNET_E_OK;
        /* Into the peer's landing half with e, or into its dest after entry
         * epoch e with e + 1. */
        const uint64_t e = land != 0 ? st.epoch : st.epoch + 1;
        if (r == CPNET_E_OK && land == 0) {
            r = grid_epoch(&st.ctx, st.d, st.epoch);
            /* The SET of e + 1 never lands before that of e. */
            cpnet_fence(&st.ctx);
        }
        if (r == CPNET_E_OK) {
            cpnet_putmem_signal_nbi(&st.ctx, (void*)(land != 0 ? land : dest), (const void*)source, n * sizeof(T),
                                    team_sig(&st.ctx, st.d, my_idx), e, CPNET_SIGNAL_SET, team_world_pe(st.d, peer));
            /* The close's quiet now: the peer's ACK of the put comes back
             * while this member waits for the peer's data and folds. */
            grid_quiet_post(&st);
            r = team_wait_all(&st.ctx, st.d, e);
        }
        /* Release: what block 0 acquired with the peer's signal (its data in
         * land or dest), before the other blocks' loads of it. */
        if (threadIdx.x == 0) cpnet_st_release_gpu_u64((uint64_t*)&words[0], r == CPNET_E_OK ? 1 : 2);
        if (threadIdx.x == 0) st.err = r;
        __syncthreads();
        if (st.err != CPNET_E_OK) {
            grid_fail(h, &st.ctx, st.err);
            cpnet_ctx_destroy(&st.ctx);
            return st.err;
        }
    } else {
        if (threadIdx.x == 0) st.go = grid_wait_go(h, words);
        __syncthreads();
        if (st.go != 1) return CPNET_E_OK;
    }
    /* The fold: this block's run of [0, n), in 16-byte words where every
     * address allows. */
    reduce_grid_block<T, OP>(b, 0, n, q, 1);
    /* Every block counts itself; block 0 waits for the count and quiets.
     * The quiet is needed even where source is a copy: a later collective's
     * SET to the peer goes through another queue and could land before
     * this put's, so the peer would fold before the data (session 26 tried
     * a copy half per call and no quiet: coll.cu's large reductions came out
     * wrong, and 1-4 MiB got slower). */
    return grid_close(h, words, 0, &st, false);
}

/** Fill `a` for a reduce grid of `n` elements from `source` to `dest` (this
 *  PE's device addresses) on `team`, from the handle's team table and peer
 *  table: false (and the one-block form) when the team is unknown, has more
 *  than CPNET_GRID_MAX_MEMBERS members, or a member's heap is not mapped
 *  here. The same answer on every member where the heaps are mapped both
 *  ways or not at all. What the runtime computes on the host
 *  (GpuPe::member_ptrs); nvshmem.h's grid kernel computes it here. */
__device__ inline bool reduce_grid_args(const cpnet_handle_t* h, int team, uint64_t dest, uint64_t source, uint64_t n,
                                        uint64_t words, cpnet_reduce_grid_args_t* a)
{
    if (h->teams == 0 || h->peers == 0 || team < 0 || (uint32_t)team >= h->n_teams) return false;
    const cpnet_team_desc_t d = ((const cpnet_team_desc_t*)h->teams)[team];
    if (d.size <= 0 || d.size > CPNET_GRID_MAX_MEMBERS || d.my_idx < 0 || d.my_idx >= d.size) return false;
    const uint64_t* peers = (const uint64_t*)h->peers;
    const uint64_t doff = dest - h->heap_base, soff = source - h->heap_base;
    for (int j = 0; j < d.size; ++j) {
        if (j == d.my_idx) {
            a->src[j] = source;
            a->dst[j] = dest;
            continue;
        }
        const int pe = d.start + j * d.stride;
        if (pe < 0 || pe >= h->n_pes || peers[pe] == 0) return false;
        a->src[j] = peers[pe] + soff;
        a->dst[j] = peers[pe] + doff;
    }
    a->dest = dest;
    a->source = source;
    a->n = n;
    a->words = words;
    a->my_idx = d.my_idx;
    a->size = d.size;
    return true;
}

} /* namespace cpnet_detail */

#endif /* CPNET_GRID_CUH */
