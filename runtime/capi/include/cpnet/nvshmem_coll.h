/*
 * cpnet/nvshmem_coll.h -- nvshmem.h's team collectives: the block-scope
 * barrier, sync, broadcast, fcollect, collect, alltoall and reductions on a
 * team (cpnet/team.cuh; one block per member), and their `_on_stream`
 * forms (one block, or the runtime's grid and network-path forms through
 * libcpnet). Part of nvshmem.h, which includes it after everything it
 * needs: include <nvshmem.h>, not this file.
 */
#ifndef CPNET_NVSHMEM_COLL_H
#define CPNET_NVSHMEM_COLL_H

#ifndef CPNET_NVSHMEM_H
#error "cpnet/nvshmem_coll.h is part of nvshmem.h: include <nvshmem.h>"
#endif

/* ------------------------------------------------------------------------ */
/* Team collectives, block scope (cpnet/team.cuh; one block per member)      */
/* ------------------------------------------------------------------------ */

/** Quiet, then sync `team` (nvshmemx_barrier_block). */
__device__ inline int nvshmemx_barrier_block(nvshmem_team_t team)
{
    cpnet_nv::with_queue("nvshmemx_barrier_block", nvshmem_my_pe(),
                         [&](cpnet_ctx_t* c) { return cpnet_team_barrier(c, team); });
    return 0;
}
/** Sync `team`: every member arrived (nvshmemx_team_sync_block). */
__device__ inline int nvshmemx_team_sync_block(nvshmem_team_t team)
{
    cpnet_nv::with_queue("nvshmemx_team_sync_block", nvshmem_my_pe(),
                         [&](cpnet_ctx_t* c) { return cpnet_team_sync(c, team); });
    return 0;
}

namespace cpnet_nv {
/* One block of CPNET_NV_STREAM_THREADS threads running the block-scope
 * collective `Op::run` on a stream (the _on_stream forms). The kernel of an
 * Op exists only where the program calls that form; its preload<Op>
 * registers it at program start so that nvshmem_init loads it (lazy
 * loading, preload_kernels). */
#define CPNET_NV_STREAM_THREADS 256
template <class Op>
__global__ void on_stream_kernel(nvshmem_team_t team, typename Op::type* dest, const typename Op::type* source,
                                 size_t nelems, int root)
{
    Op::run(team, dest, source, nelems, root);
}
template <class Op>
struct preload {
    static const int registered;
};
template <class Op>
const int preload<Op>::registered = register_preload((const void*)on_stream_kernel<Op>);

template <class Op>
static inline int launch_on_stream(const char* routine, cudaStream_t stream, nvshmem_team_t team,
                                   typename Op::type* dest, const typename Op::type* source, size_t nelems, int root)
{
    (void)preload<Op>::registered;
    on_stream_kernel<Op><<<1, CPNET_NV_STREAM_THREADS, 0, stream>>>(team, dest, source, nelems, root);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "cpnet: %s: launch: %s\n", routine, cudaGetErrorString(e));
        return NVSHMEMX_ERROR_INTERNAL;
    }
    return NVSHMEMX_SUCCESS;
}
} /* namespace cpnet_nv */

/* nvshmemx_TYPENAME_{broadcast,fcollect,alltoall}_block(team, dest, source, nelems[, root]) */
#define CPNET_NV_COLL(NAME, TYPE)                                                                       \
    __device__ inline int nvshmemx_##NAME##_broadcast_block(nvshmem_team_t team, TYPE* dest,            \
                                                           const TYPE* source, size_t nelems, int root) \
    {                                                                                                   \
        cpnet_nv::with_queue("nvshmemx_" #NAME "_broadcast_block", root, [&](cpnet_ctx_t* c) {          \
            return cpnet_##NAME##_broadcast(c, team, dest, source, nelems, root);                       \
        });                                                                                             \
        return 0;                                                                                       \
    }                                                                                                   \
    __device__ inline int nvshmemx_##NAME##_fcollect_block(nvshmem_team_t team, TYPE* dest,             \
                                                          const TYPE* source, size_t nelems)            \
    {                                                                                                   \
        cpnet_nv::with_queue("nvshmemx_" #NAME "_fcollect_block", nvshmem_my_pe(), [&](cpnet_ctx_t* c) { \
            return cpnet_##NAME##_fcollect(c, team, dest, source, nelems);                              \
        });                                                                                             \
        return 0;                                                                                       \
    }                                                                                                   \
    __device__ inline int nvshmemx_##NAME##_alltoall_block(nvshmem_team_t team, TYPE* dest,             \
                                                          const TYPE* source, size_t nelems)            \
    {                                                                                                   \
        cpnet_nv::with_queue("nvshmemx_" #NAME "_alltoall_block", nvshmem_my_pe(), [&](cpnet_ctx_t* c) { \
            return cpnet_##NAME##_alltoall(c, team, dest, source, nelems);                              \
        });                                                                                             \
        return 0;                                                                                       \
    }                                                                                                   \
    namespace cpnet_nv {                                                                                \
    struct NAME##_broadcast_op {                                                                        \
        typedef TYPE type;                                                                              \
        __device__ static void run(nvshmem_team_t t, TYPE* d, const TYPE* s, size_t n, int root)        \
        {                                                                                               \
            nvshmemx_##NAME##_broadcast_block(t, d, s, n, root);                                        \
        }                                                                                               \
    };                                                                                                  \
    struct NAME##_fcollect_op {                                                                         \
        typedef TYPE type;                                                                              \
        __device__ static void run(nvshmem_team_t t, TYPE* d, const TYPE* s, size_t n, int)             \
        {                                                                                               \
            nvshmemx_##NAME##_fcollect_block(t, d, s, n);                                               \
        }                                                                                               \
    };                                                                                                  \
    struct NAME##_alltoall_op {                                                                         \
        typedef TYPE type;                                                                              \
        __device__ static void run(nvshmem_team_t t, TYPE* d, const TYPE* s, size_t n, int)             \
        {                                                                                               \
            nvshmemx_##NAME##_alltoall_block(t, d, s, n);                                               \
        }                                                                                               \
    };                                                                                                  \
    }                                                                                                   \
    template <int CPNET_NV_LAZY = 0> /* instantiated (its kernel compiled) only where called */  \
    static inline int nvshmemx_##NAME##_broadcast_on_stream(nvshmem_team_t team, TYPE* dest,            \
                                                            const TYPE* source, size_t nelems, int root, \
                                                            cudaStream_t stream)                        \
    {                                                                                                   \
        return cpnet_nv::launch_on_stream<cpnet_nv::NAME##_broadcast_op>(                               \
            "nvshmemx_" #NAME "_broadcast_on_stream", stream, team, dest, source, nelems, root);         \
    }                                                                                                   \
    template <int CPNET_NV_LAZY = 0> /* instantiated (its kernel compiled) only where called */  \
    static inline int nvshmemx_##NAME##_fcollect_on_stream(nvshmem_team_t team, TYPE* dest,             \
                                                           const TYPE* source, size_t nelems,           \
                                                           cudaStream_t stream)                         \
    {                                                                                                   \
        return cpnet_nv::launch_on_stream<cpnet_nv::NAME##_fcollect_op>(                                \
            "nvshmemx_" #NAME "_fcollect_on_stream", stream, team, dest, source, nelems, 0);             \
    }                                                                                                   \
    template <int CPNET_NV_LAZY = 0> /* instantiated (its kernel compiled) only where called */  \
    static inline int nvshmemx_##NAME##_alltoall_on_stream(nvshmem_team_t team, TYPE* dest,             \
                                                           const TYPE* source, size_t nelems,           \
                                                           cudaStream_t stream)                         \
    {                                                                                                   \
        /* The runtime's grid or network-path form where one runs (large   \
         * blocks), else the one-block kernel. */                                                       \
        if (cpnet_gpu_alltoall_on_stream_large("nvshmemx_" #NAME "_alltoall_on_stream", (int)team,       \
                                               (void*)dest, (const void*)source, nelems * sizeof(TYPE), \
                                               (void*)stream))                                          \
            return NVSHMEMX_SUCCESS;                                                                    \
        return cpnet_nv::launch_on_stream<cpnet_nv::NAME##_alltoall_op>(                                \
            "nvshmemx_" #NAME "_alltoall_on_stream", stream, team, dest, source, nelems, 0);             \
    }
CPNET_RMA_TYPES(CPNET_NV_COLL)
#undef CPNET_NV_COLL

namespace cpnet_nv {
/* team.cuh's operator (enum reduce_op) of each OPNAME of CPNET_NV_REDUCE. */
enum {
    red_of_and_reduce = cpnet_detail::RED_AND,
    red_of_or_reduce = cpnet_detail::RED_OR,
    red_of_xor_reduce = cpnet_detail::RED_XOR,
    red_of_min_reduce = cpnet_detail::RED_MIN,
    red_of_max_reduce = cpnet_detail::RED_MAX,
    red_of_sum_reduce = cpnet_detail::RED_SUM,
    red_of_prod_reduce = cpnet_detail::RED_PROD,
};

/* The reduce to all on a grid (cpnet/grid.cuh, as the runtime's
 * GpuPe::team_reduce_on_stream): every block fills the arguments from the
 * handle's team and peer tables; where a member's heap is not mapped here
 * (another host, CPNET_GPU_P2P=0) or the team is unknown, block 0 runs the
 * one-block form instead (which reports a bad team) and the others leave.
 * The same choice on every member. Every block ends with grid_exit, so
 * `words` (a set of libcpnet's ring, cpnet_gpu_grid_launch) is zero again
 * when the kernel ends. */
template <class Op>
__global__ void __launch_bounds__(CPNET_GRID_THREADS)
reduce_grid_kernel(nvshmem_team_t team, typename Op::type* dest, const typename Op::type* source, size_t n,
                   unsigned long long* words)
{
    __shared__ cpnet_reduce_grid_args_t a;
    __shared__ int ok;
    if (threadIdx.x == 0)
        ok = cpnet_detail::reduce_grid_args(&handle, team, (uint64_t)dest, (uint64_t)source, (uint64_t)n,
                                             (uint64_t)words, &a);
    __syncthreads();
    if (!ok) {
        if (blockIdx.x == 0) Op::run(team, dest, source, n, 0);
    } else {
        const int e = cpnet_detail::reduce_grid<typename Op::type, Op::red>(&handle, team, a);
        if (e != CPNET_E_OK && threadIdx.x == 0) {
            printf("cpnet: nvshmem.h: PE %d: nvshmemx_*_reduce_on_stream (grid form) failed: cpnet error %d\n",
                   handle.my_pe, e);
            __trap();
        }
    }
    /* The words are zero again for the ring's next launch of this set
     * (cpnet_gpu_grid_launch). */
    cpnet_detail::grid_exit(words);
}
template <class Op>
struct preload_grid {
    static const int registered;
};
template <class Op>
const int preload_grid<Op>::registered = register_preload((const void*)reduce_grid_kernel<Op>);

/* The element kind libcpnet's cpnet_gpu_reduce_on_stream_net takes with
 * the size (cmd.h's CPNET_KIND_*). Its operator is Op::red, team.cuh's
 * enum reduce_op, whose values are cmd.h's CPNET_RED_*. */
template <class T>
static inline int reduce_kind()
{
    if (std::is_same<T, cpnet_half_t>::value) return CPNET_KIND_HALF;
    if (std::is_same<T, cpnet_bfloat16_t>::value) return CPNET_KIND_BFLOAT16;
    if (std::is_floating_point<T>::value) return CPNET_KIND_FLOAT;
    return std::is_signed<T>::value ? CPNET_KIND_SIGNED : CPNET_KIND_UNSIGNED;
}

/* reduce_grid_kernel's launch on the stream with the words libcpnet hands
 * it (cpnet_gpu_grid_launch's callback): the launch's cudaError_t. */
template <class Op>
struct grid_launch {
    nvshmem_team_t team;
    typename Op::type* dest;
    const typename Op::type* source;
    size_t n;
    unsigned blocks;
    cudaStream_t stream;
    static int run(void* arg, uint64_t* words)
    {
        const grid_launch* l = (const grid_launch*)arg;
        reduce_grid_kernel<Op><<<l->blocks, CPNET_GRID_THREADS, 0, l->stream>>>(l->team, l->dest, l->source, l->n,
                                                                              (unsigned long long*)words);
        return (int)cudaGetLastError();
    }
};

/* The _reduce_on_stream forms. Where some member's heap is not mapped here
 * (the network path), from 64 KiB the runtime's forms
 * (GpuPe::team_reduce_on_stream_net: puts into the members' dest with the
 * fold on a grid, in place through the reduce scratch) take the first
 * size x floor(n / size) elements; else a grid of up to
 * CPNET_REDUCE_GRID_MAX_BLOCKS blocks from CPNET_REDUCE_GRID_MIN_BYTES on
 * teams of at most CPNET_GRID_MAX_MEMBERS (reduce_grid_kernel); else, and
 * for what is left, one block. */
template <class Op>
static inline int launch_reduce_on_stream(const char* routine, cudaStream_t stream, nvshmem_team_t team,
                                          typename Op::type* dest, const typename Op::type* source, size_t n)
{
    typedef typename Op::type T;
    if (n * sizeof(T) >= CPNET_REDUCE_GRID_MIN_BYTES) {
        const size_t k = cpnet_gpu_reduce_on_stream_net(routine, (int)team, reduce_kind<T>(), sizeof(T), Op::red,
                                                        (void*)dest, (const void*)source, n, (void*)stream);
        if (k >= n) return NVSHMEMX_SUCCESS;
        if (k > 0) return launch_on_stream<Op>(routine, stream, team, dest + k, source + k, n - k, 0);
    }
    const size_t bytes = n * sizeof(typename Op::type);
    const int size = bytes >= CPNET_REDUCE_GRID_MIN_BYTES ? nvshmem_team_n_pes(team) : 0;
    if (size <= 0 || size > CPNET_GRID_MAX_MEMBERS) return launch_on_stream<Op>(routine, stream, team, dest, source, n, 0);
    (void)preload_grid<Op>::registered;
    const size_t part = (bytes + (size_t)size - 1) / (size_t)size;
    size_t blocks = (part + CPNET_REDUCE_GRID_BYTES_PER_BLOCK - 1) / CPNET_REDUCE_GRID_BYTES_PER_BLOCK;
    if (blocks < 1) blocks = 1;
    if (blocks > CPNET_REDUCE_GRID_MAX_BLOCKS) blocks = CPNET_REDUCE_GRID_MAX_BLOCKS;
    /* The launch's CPNET_GRID_WORDS words (the reduce uses go and done),
     * zero when it starts: the next set of the PE's ring, which the
     * kernel's grid_exit zeroes again (libcpnet's cpnet_gpu_grid_launch;
     * under graph capture words of the launch's own). */
    grid_launch<Op> l = {team, dest, source, n, (unsigned)blocks, stream};
    const cudaError_t e = (cudaError_t)cpnet_gpu_grid_launch(routine, (void*)stream, &grid_launch<Op>::run, &l);
    if (e != cudaSuccess) {
        fprintf(stderr, "cpnet: %s: grid launch: %s\n", routine, cudaGetErrorString(e));
        return NVSHMEMX_ERROR_INTERNAL;
    }
    return NVSHMEMX_SUCCESS;
}
} /* namespace cpnet_nv */

/* nvshmemx_TYPENAME_OP_reduce_block(team, dest, source, nreduce): reduce to all. */
#define CPNET_NV_REDUCE(NAME, TYPE, OPNAME)                                                             \
    __device__ inline int nvshmemx_##NAME##OPNAME##_block(nvshmem_team_t team, TYPE* dest,              \
                                                         const TYPE* source, size_t nreduce)            \
    {                                                                                                   \
        cpnet_nv::with_queue("nvshmemx_" #NAME #OPNAME "_block", nvshmem_my_pe(), [&](cpnet_ctx_t* c) { \
            return cpnet_##NAME##OPNAME(c, team, dest, source, nreduce);                                \
        });                                                                                             \
        return 0;                                                                                       \
    }                                                                                                   \
    namespace cpnet_nv {                                                                                \
    struct NAME##OPNAME##_op {                                                                          \
        typedef TYPE type;                                                                              \
        static const int red = red_of##OPNAME;                                                          \
        __device__ static void run(nvshmem_team_t t, TYPE* d, const TYPE* s, size_t n, int)             \
        {                                                                                               \
            nvshmemx_##NAME##OPNAME##_block(t, d, s, n);                                                \
        }                                                                                               \
    };                                                                                                  \
    }                                                                                                   \
    template <int CPNET_NV_LAZY = 0> /* instantiated (its kernel compiled) only where called */  \
    static inline int nvshmemx_##NAME##OPNAME##_on_stream(nvshmem_team_t team, TYPE* dest,              \
                                                          const TYPE* source, size_t nreduce,           \
                                                          cudaStream_t stream)                          \
    {                                                                                                   \
        return cpnet_nv::launch_reduce_on_stream<cpnet_nv::NAME##OPNAME##_op>(                          \
            "nvshmemx_" #NAME #OPNAME "_on_stream", stream, team, dest, source, nreduce);               \
    }
#define CPNET_NV_REDUCE_BITWISE(NAME, TYPE)                                                             \
    CPNET_NV_REDUCE(NAME, TYPE, _and_reduce) CPNET_NV_REDUCE(NAME, TYPE, _or_reduce)                    \
    CPNET_NV_REDUCE(NAME, TYPE, _xor_reduce)
#define CPNET_NV_REDUCE_ARITH(NAME, TYPE)                                                               \
    CPNET_NV_REDUCE(NAME, TYPE, _min_reduce) CPNET_NV_REDUCE(NAME, TYPE, _max_reduce)                   \
    CPNET_NV_REDUCE(NAME, TYPE, _sum_reduce) CPNET_NV_REDUCE(NAME, TYPE, _prod_reduce)
CPNET_REDUCE_BITWISE_TYPES(CPNET_NV_REDUCE_BITWISE)
CPNET_REDUCE_ARITH_TYPES(CPNET_NV_REDUCE_ARITH)
#undef CPNET_NV_REDUCE_ARITH
#undef CPNET_NV_REDUCE_BITWISE
#undef CPNET_NV_REDUCE

namespace cpnet_nv {
static __global__ void barrier_kernel(nvshmem_team_t team) { nvshmemx_barrier_block(team); }
static __global__ void team_sync_kernel(nvshmem_team_t team) { nvshmemx_team_sync_block(team); }
}

/** A one-block team barrier kernel on `stream` (every member calls it). */
static inline void nvshmemx_barrier_on_stream(nvshmem_team_t team, cudaStream_t stream)
{
    cpnet_nv::barrier_kernel<<<1, 128, 0, stream>>>(team);
}
/** A one-block team sync kernel on `stream` (every member calls it). */
static inline void nvshmemx_team_sync_on_stream(nvshmem_team_t team, cudaStream_t stream)
{
    cpnet_nv::team_sync_kernel<<<1, 128, 0, stream>>>(team);
}

#endif /* CPNET_NVSHMEM_COLL_H */
