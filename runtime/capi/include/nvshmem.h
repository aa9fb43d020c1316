/*
 * nvshmem.h -- NVSHMEM's names on cpnet, for CUDA C++ compiled with nvcc
 * (issue 21 item 3). An NVSHMEM program builds against cpnet by changing its
 * include and link lines only:
 *
 *     nvcc -arch=sm_90 -I$PREFIX/include prog.cu -L$PREFIX/lib -lcpnet -lcuda
 *     cpnet-run -n 2 -- ./prog
 *
 * Device code is header-only: no -rdc, no device link step. Each
 * translation unit keeps its own copy of the kernel handle in a
 * `static __device__` variable, registered from a static initializer and
 * filled by nvshmem_init (libcpnet's cpnet_gpu_publish).
 *
 * What maps onto what (docs/c-api.md, "CUDA C++ and NVSHMEM names"):
 *
 *  - Host: nvshmem_init / nvshmemx_init_attr (the launcher's ranks: with
 *    NVSHMEMX_INIT_WITH_MPI_COMM the communicator must be MPI_COMM_WORLD of
 *    the same launch), finalize, my_pe / n_pes, team_my_pe / team_n_pes
 *    (NVSHMEM_TEAM_WORLD, NVSHMEMX_TEAM_NODE), malloc / calloc / align /
 *    free, barrier_all, barrier_all_on_stream, quiet_on_stream,
 *    collective_launch (with collective_launch_query_gridsize: the grid
 *    leaves room for the proxy's landing agents), global_exit.
 *  - Device, thread scope: my_pe, n_pes, team_my_pe, team_n_pes, ptr, typed
 *    p / g / put / get (+ _nbi), putmem / getmem, putmem_signal(_nbi),
 *    signal_op, signal_wait_until, typed wait_until, quiet, fence,
 *    barrier_all, and the AMOs (TYPENAME_atomic_{fetch, set, swap,
 *    compare_swap, fetch_inc, inc, fetch_add, add} for the standard AMO
 *    types, fetch / set / swap for float and double, fetch_and / and /
 *    fetch_or / or / fetch_xor / xor for the bitwise ones: system-scope
 *    atomics on the peer's word). These are the GPU's own loads and stores to a PE whose
 *    heap it maps (same host, CPNET_GPU_IPC=1 and CPNET_GPU_P2P=1, the
 *    defaults): a thread cannot use a work-group's command queue alone, so a
 *    thread-scope operation to a PE of another host stops the kernel
 *    (__trap) after printing which call and PE; use the _block forms there.
 *  - Device, warp scope (nvshmemx_*_warp, every lane of the warp calls):
 *    typed put / get (+ _nbi), putmem / getmem (+ _nbi),
 *    putmem_signal(_nbi): the warp's loads and stores, to a PE whose heap
 *    this GPU maps only (as the thread-scope calls).
 *  - Device, block scope (nvshmemx_*_block, every thread of the block
 *    calls): typed put / get (+ _nbi), putmem / getmem, putmem_signal(_nbi),
 *    barrier_all; team collectives over cpnet/team.cuh: barrier, team_sync,
 *    typed broadcast / fcollect / alltoall, and TYPENAME_OP_reduce (half and
 *    bfloat16 as cpnet_half_t / cpnet_bfloat16_t: cast a __half*).
 *  - sync_all (host, device, _block, _on_stream): the barrier_all forms.
 *  - Host, on a stream: barrier_all_on_stream, barrier_on_stream(team),
 *    team_sync_on_stream(team), TYPENAME_{broadcast,fcollect,alltoall}_on_stream
 *    and TYPENAME_OP_reduce_on_stream (one-block kernels running the block
 *    forms; loaded by nvshmem_init; the alltoall of large blocks on the
 *    world or node team runs the runtime's forms through libcpnet,
 *    cpnet_gpu_alltoall_on_stream_large: a grid from 512 KiB per pair where
 *    every heap is mapped, a block per proxy thread from 128 KiB on the
 *    network path without staging zones; the reduce from CPNET_REDUCE_GRID_MIN_BYTES
 *    on a team whose members are all peer-mapped runs on a grid of up to
 *    CPNET_REDUCE_GRID_MAX_BLOCKS blocks, cpnet/grid.cuh, as the runtime's
 *    team_reduce_on_stream, with launch words from the PE's ring through
 *    libcpnet, cpnet_gpu_grid_launch; on the world or node team where some member is
 *    not, the runtime's network-path forms take it through libcpnet,
 *    cpnet_gpu_reduce_on_stream_net, in place too: their kernels are built
 *    with NVRTC at first use, which then waits for this PE's kernels to
 *    end). Peer-to-peer where mapped; otherwise through a command
 *    queue and the proxy (cpnet's network path), claimed for the call and
 *    quieted before it returns, so the _nbi forms complete on return there.
 *
 * Ordering: peer-to-peer stores are complete at nvshmem_quiet (a system
 * fence); queued operations are complete when their call returns. So
 * quiet, fence and barrier_all keep their NVSHMEM meaning on both paths.
 */
#ifndef CPNET_NVSHMEM_H
#define CPNET_NVSHMEM_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include <vector>
#include <cpnet/cpnet.h>
#include <cpnet/device.cuh>
#include <cpnet/grid.cuh>

typedef int32_t nvshmem_team_t;
#define NVSHMEM_TEAM_WORLD CPNET_TEAM_WORLD
#define NVSHMEMX_TEAM_NODE CPNET_TEAM_NODE
#define NVSHMEM_TEAM_SHARED CPNET_TEAM_NODE
#define NVSHMEM_TEAM_INVALID CPNET_TEAM_INVALID

#define NVSHMEM_CMP_EQ CPNET_CMP_EQ
#define NVSHMEM_CMP_NE CPNET_CMP_NE
#define NVSHMEM_CMP_GT CPNET_CMP_GT
#define NVSHMEM_CMP_GE CPNET_CMP_GE
#define NVSHMEM_CMP_LT CPNET_CMP_LT
#define NVSHMEM_CMP_LE CPNET_CMP_LE
#define NVSHMEM_SIGNAL_SET CPNET_SIGNAL_SET
#define NVSHMEM_SIGNAL_ADD CPNET_SIGNAL_ADD

#define NVSHMEMX_SUCCESS 0
#define NVSHMEMX_ERROR_INVALID_VALUE 2
#define NVSHMEMX_ERROR_INTERNAL 7
#define NVSHMEMX_INIT_WITH_MPI_COMM 1
typedef struct {
    void* mpi_comm; /**< pointer to an MPI_Comm; must be MPI_COMM_WORLD's ranks */
} nvshmemx_init_attr_t;
#define NVSHMEMX_INIT_ATTR_INITIALIZER {0}

namespace cpnet_nv {

/** This translation unit's copy of the kernel handle. */
static __device__ cpnet_handle_t handle;

static void upload(const void* h, size_t bytes)
{
    const cudaError_t e = cudaMemcpyToSymbol(handle, h, bytes);
    if (e != cudaSuccess) {
        fprintf(stderr, "cpnet: nvshmem.h: uploading the kernel handle: %s\n", cudaGetErrorString(e));
        exit(1);
    }
}

__attribute__((unused)) static const int registered = cpnet_gpu_register_upload(&upload);

/** Stop the kernel with a message naming the call (errors are fatal, as in
 *  NVSHMEM). */
__device__ inline void fail(const char* routine, int pe, const char* why)
{
    printf("cpnet: nvshmem.h: PE %d block %d thread %d: %s (PE %d): %s\n", handle.my_pe,
           (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)), (int)threadIdx.x, routine, pe, why);
    __trap();
}

/** Where this kernel reaches `p` (a symmetric address) of PE `pe` with its
 *  own loads and stores; nullptr where it does not. */
__device__ inline char* remote(const void* p, int pe)
{
    if (handle.peers == 0 || pe < 0 || pe >= handle.n_pes) return nullptr;
    const uint64_t base = ((const uint64_t*)handle.peers)[pe];
    const uint64_t off = (uint64_t)p - handle.heap_base;
    if (base == 0 || off >= handle.heap_size) return nullptr;
    return (char*)(base + off);
}

__device__ inline char* remote_or_fail(const char* routine, const void* p, int pe)
{
    char* r = remote(p, pe);
    if (r == nullptr)
        fail(routine, pe,
             "thread-scope operation to a PE whose heap this GPU does not map (another host, or "
             "CPNET_GPU_IPC/CPNET_GPU_P2P off): use the nvshmemx_*_block form");
    return r;
}

/** Every PE's heap mapped: the barrier takes peer stores. The same answer on
 *  every PE of a host whose IPC mappings all opened. */
__device__ inline bool all_mapped()
{
    if (handle.peers == 0) return false;
    for (int p = 0; p < handle.n_pes; ++p)
        if (((const uint64_t*)handle.peers)[p] == 0) return false;
    return true;
}

__device__ inline const cpnet_team_desc_t* team_desc(nvshmem_team_t t)
{
    if (handle.teams == 0 || t < 0 || (uint32_t)t >= handle.n_teams) return nullptr;
    const cpnet_team_desc_t* d = (const cpnet_team_desc_t*)handle.teams + t;
    return d->size > 0 ? d : nullptr;
}

/** Spin until `*p cmp v` (acquire load, device.cuh's comparison: false for
 *  an unknown cmp), or fail after handle.wait_timeout_ns naming `routine`;
 *  returns the value seen. */
template <typename T>
__device__ inline T wait_until(const char* routine, const T* p, int cmp, T v)
{
    const uint64_t t0 = cpnet_globaltimer_ns();
    for (;;) {
        const T x = cpnet_detail::load_acquire(p);
        if (cpnet_detail::compare(x, cmp, v)) return x;
        if (handle.wait_timeout_ns != 0 && cpnet_globaltimer_ns() - t0 > handle.wait_timeout_ns)
            fail(routine, handle.my_pe, "timed out (CPNET_WAIT_TIMEOUT)");
    }
}

/** The world team's sync by one thread over peer stores: the protocol of
 *  cpnet_team_sync (cmd.h "Teams": epoch from SEQ, dissemination rounds on
 *  SYNC[k]), so the two may be mixed. */
__device__ inline void barrier_p2p(const char* routine)
{
    const cpnet_team_desc_t* w = team_desc(NVSHMEM_TEAM_WORLD);
    if (w == nullptr) fail(routine, handle.my_pe, "no team table (libcpnet older than nvshmem.h?)");
    __threadfence_system(); /* quiet: this thread's peer stores */
    char* scratch = (char*)(handle.heap_base + w->scratch);
    uint64_t* seq = (uint64_t*)(scratch + CPNET_TEAM_SCR_SEQ);
    const uint64_t e = *seq + 1;
    *seq = e;
    const int n = w->size, me = w->my_idx;
    for (int k = 0; (1LL << k) < n; ++k) {
        uint64_t* mine = (uint64_t*)(scratch + CPNET_TEAM_SCR_SYNC + 8 * k);
        const int partner = (int)((me + (1LL << k)) % n);
        uint64_t* theirs = (uint64_t*)remote_or_fail(routine, mine, w->start + partner * w->stride);
        cpnet_st_release_sys_u64(theirs, e);
        wait_until<uint64_t>(routine, mine, CPNET_CMP_GE, e);
    }
}

/** Run `f(ctx)` on a command queue claimed for the call, then quiet and
 *  release it. Every thread of the block calls it. */
template <typename F>
__device__ inline void with_queue(const char* routine, int pe, F f)
{
    __shared__ cpnet_ctx_t ctx;
    int e;
    const uint64_t t0 = cpnet_globaltimer_ns();
    while ((e = cpnet_ctx_create(&handle, &ctx)) == CPNET_E_NO_QUEUE) {
        if (handle.wait_timeout_ns != 0 && cpnet_globaltimer_ns() - t0 > handle.wait_timeout_ns) break;
        cpnet_sleep_ns(1000);
    }
    if (e != CPNET_E_OK) fail(routine, pe, "no command queue (raise CPNET_QUEUES)");
    e = f(&ctx);
    const int d = cpnet_ctx_destroy(&ctx);
    if (e == CPNET_E_OK) e = d;
    if (e != CPNET_E_OK) {
        if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
            printf("cpnet: nvshmem.h: PE %d: %s to PE %d failed: cpnet error %d\n", handle.my_pe, routine, pe, e);
        __trap();
    }
}

/** Thread `t` of `nt` copies its share of the bytes (16-byte words where
 *  everything is 16-byte aligned). */
__device__ inline void strided_copy(char* dst, const char* src, size_t n, size_t t, size_t nt)
{
    if ((((uintptr_t)dst | (uintptr_t)src | n) & 15) == 0) {
        for (size_t i = t; i < n / 16; i += nt) ((int4*)dst)[i] = ((const int4*)src)[i];
    } else {
        for (size_t i = t; i < n; i += nt) dst[i] = src[i];
    }
}

/** The copy of a block: every thread of it calls. */
__device__ inline void block_copy(char* dst, const char* src, size_t n)
{
    strided_copy(dst, src, n, cpnet_detail::thread_rank(), (size_t)blockDim.x * blockDim.y * blockDim.z);
}

/** The copy of a warp, then __syncwarp: every lane of the warp calls. */
__device__ inline void warp_copy(char* dst, const char* src, size_t n)
{
    strided_copy(dst, src, n, cpnet_detail::thread_rank() & 31u, 32);
    __syncwarp();
}

__device__ inline void put_block(const char* routine, void* dest, const void* src, size_t n, int pe)
{
    char* r = remote(dest, pe);
    if (r != nullptr) {
        block_copy(r, (const char*)src, n);
        __syncthreads();
        return;
    }
    with_queue(routine, pe, [&](cpnet_ctx_t* c) { return cpnet_putmem(c, dest, src, n, pe); });
}

__device__ inline void get_block(const char* routine, void* dest, const void* src, size_t n, int pe)
{
    const char* r = remote(src, pe);
    if (r != nullptr) {
        block_copy((char*)dest, r, n);
        __syncthreads();
        return;
    }
    with_queue(routine, pe, [&](cpnet_ctx_t* c) { return cpnet_getmem(c, dest, src, n, pe); });
}

__device__ inline void signal_p2p(const char* routine, uint64_t* sig, uint64_t v, int op, int pe)
{
    uint64_t* r = (uint64_t*)remote_or_fail(routine, sig, pe);
    if (op == NVSHMEM_SIGNAL_SET)
        cpnet_st_release_sys_u64(r, v);
    else {
        __threadfence_system();
        atomicAdd_system((unsigned long long*)r, (unsigned long long)v);
    }
}

static __global__ void barrier_all_kernel();
static __global__ void barrier_kernel(nvshmem_team_t team);
static __global__ void team_sync_kernel(nvshmem_team_t team);

/* The header's kernels that nvshmem_init loads (preload_kernels): the fixed
 * ones below, and each _on_stream collective's kernel that the program
 * instantiates (registered at program start by its `preload<Op>`). */
inline std::vector<const void*>& preload_list()
{
    static std::vector<const void*> kernels;
    return kernels;
}
inline int register_preload(const void* kernel)
{
    preload_list().push_back(kernel);
    return 0;
}

/* Reference this header's own kernels now, so that the CUDA runtime loads
 * them at init. Under lazy loading (CUDA_MODULE_LOADING=LAZY, the default
 * since CUDA 12.2) it loads a kernel when the program first references it
 * (CUDA C++ Programming Guide, "Lazy Loading"), and that load may wait for
 * every kernel of the context to end. nvshmemx_barrier_on_stream right
 * after a kernel that waits on the network would then wait for that
 * kernel, and hold the context while it does, so that the proxy's own
 * driver calls (the landing agent that would apply the kernel's messages)
 * wait too: a hang, seen on the network path before this. */
static inline void preload_kernels(const char* routine)
{
    std::vector<const void*> kernels = preload_list();
    kernels.push_back((const void*)barrier_all_kernel);
    kernels.push_back((const void*)barrier_kernel);
    kernels.push_back((const void*)team_sync_kernel);
    for (const void* k : kernels) {
        cudaFuncAttributes a;
        const cudaError_t e = cudaFuncGetAttributes(&a, k);
        if (e != cudaSuccess) {
            fprintf(stderr, "cpnet: %s: cudaFuncGetAttributes (load nvshmem.h's kernels): %s\n", routine,
                    cudaGetErrorString(e));
            exit(1);
        }
    }
}

} /* namespace cpnet_nv */

/* ------------------------------------------------------------------------ */
/* Setup and queries (host; my_pe / n_pes / team queries also on the device) */
/* ------------------------------------------------------------------------ */

/** Start the PE (collective; nvshmem_init): cpnet's GPU PE on device
 *  local rank % device count, made the CUDA runtime's current device. */
static inline void nvshmem_init(void)
{
    cpnet_gpu_init("nvshmem_init");
    const cudaError_t e = cudaSetDevice(cpnet_gpu_device("nvshmem_init"));
    if (e != cudaSuccess) {
        fprintf(stderr, "cpnet: nvshmem_init: cudaSetDevice: %s\n", cudaGetErrorString(e));
        exit(1);
    }
    cpnet_gpu_publish("nvshmem_init");
    cpnet_nv::preload_kernels("nvshmem_init");
}

/** nvshmemx_init_attr: as nvshmem_init; the PEs are the launcher's ranks
 *  (an MPI communicator in `attr` must span them all, as MPI_COMM_WORLD). */
static inline int nvshmemx_init_attr(unsigned int flags, nvshmemx_init_attr_t* attr)
{
    (void)flags;
    (void)attr;
    nvshmem_init();
    return NVSHMEMX_SUCCESS;
}

/** End the PE (collective; nvshmem_finalize). */
static inline void nvshmem_finalize(void) { cpnet_gpu_finalize("nvshmem_finalize"); }

__host__ __device__ inline int nvshmem_my_pe(void)
{
#ifdef __CUDA_ARCH__
    return cpnet_nv::handle.my_pe;
#else
    return cpnet_gpu_my_pe();
#endif
}

__host__ __device__ inline int nvshmem_n_pes(void)
{
#ifdef __CUDA_ARCH__
    return cpnet_nv::handle.n_pes;
#else
    return cpnet_gpu_n_pes();
#endif
}

/** This PE's number in `team`, -1 if not a member or not a team. */
__host__ __device__ inline int nvshmem_team_my_pe(nvshmem_team_t team)
{
#ifdef __CUDA_ARCH__
    const cpnet_team_desc_t* d = cpnet_nv::team_desc(team);
    return d ? d->my_idx : -1;
#else
    return cpnet_gpu_team_my_pe("nvshmem_team_my_pe", team);
#endif
}

/** PEs in `team`, -1 if not a team. */
__host__ __device__ inline int nvshmem_team_n_pes(nvshmem_team_t team)
{
#ifdef __CUDA_ARCH__
    const cpnet_team_desc_t* d = cpnet_nv::team_desc(team);
    return d ? d->size : -1;
#else
    return cpnet_gpu_team_n_pes("nvshmem_team_n_pes", team);
#endif
}

/** Symmetric GPU memory (collective): the same offset on every PE, zeroed. */
static inline void* nvshmem_malloc(size_t bytes) { return cpnet_gpu_malloc("nvshmem_malloc", bytes, 1); }
static inline void* nvshmem_calloc(size_t count, size_t size) { return cpnet_gpu_malloc("nvshmem_calloc", count * size, 1); }
static inline void* nvshmem_align(size_t alignment, size_t bytes) { return cpnet_gpu_malloc("nvshmem_align", bytes, alignment); }
static inline void nvshmem_free(void* p) { cpnet_gpu_free("nvshmem_free", p); }


/** A one-block barrier kernel on `stream` (collective: every PE calls it). */
static inline void nvshmemx_barrier_all_on_stream(cudaStream_t stream)
{
    cpnet_nv::barrier_all_kernel<<<1, 32, 0, stream>>>();
}

/** Operations of kernels earlier on `stream` are complete when they end
 *  (peer stores at kernel end; queued ones within their calls): nothing to
 *  add. */
static inline void nvshmemx_quiet_on_stream(cudaStream_t stream) { (void)stream; }

/** The largest grid (blocks) nvshmemx_collective_launch takes for `func`
 *  with `block` threads and `shmem` bytes of dynamic shared memory per
 *  block, in `*gridsize`: this PE's share of the blocks that fit on the GPU
 *  at once (the GPU's PEs under MPS share it), less room for the proxy's
 *  landing agents, without which a kernel that waits on the network never
 *  sees its first message land (cpnet_gpu_persistent_blocks); gives `func`
 *  the agents' shared-memory carveout. `args` is not read. NVSHMEMX_ERROR_INVALID_VALUE (with a message) when the agents
 *  leave no room; NVSHMEMX_ERROR_INTERNAL when the CUDA queries fail. */
static inline int nvshmemx_collective_launch_query_gridsize(const void* func, dim3 block, void** args, size_t shmem,
                                                            int* gridsize)
{
    (void)args;
    const int threads = (int)(block.x * block.y * block.z);
    int per_sm = 0;
    cudaFuncAttributes a;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, func, threads, shmem) != cudaSuccess ||
        cudaFuncGetAttributes(&a, func) != cudaSuccess)
        return NVSHMEMX_ERROR_INTERNAL;
    int carveout = 0;
    const int n = cpnet_gpu_persistent_blocks("nvshmemx_collective_launch_query_gridsize", per_sm, threads, a.numRegs,
                                              a.sharedSizeBytes + shmem, &carveout);
    if (n < 0) return NVSHMEMX_ERROR_INVALID_VALUE;
    /* The same L1/shared split as the proxy's landing agents: an SM runs
     * blocks of one split at a time, and an agent that cannot start beside
     * this kernel never applies its messages (cpnet_gpu_persistent_blocks). */
    if (cudaFuncSetAttribute(func, cudaFuncAttributePreferredSharedMemoryCarveout, carveout) != cudaSuccess)
        return NVSHMEMX_ERROR_INTERNAL;
    *gridsize = n;
    return NVSHMEMX_SUCCESS;
}

/** Launch `func` with every block resident at once (cudaLaunchCooperativeKernel),
 *  as kernels that wait on each other need. A grid larger than
 *  nvshmemx_collective_launch_query_gridsize gives is refused with a message
 *  (NVSHMEMX_ERROR_INVALID_VALUE): its blocks would fit but leave the
 *  proxy's landing agents no room, and it would hang on its first message. */
static inline int nvshmemx_collective_launch(const void* func, dim3 grid, dim3 block, void** args, size_t shmem,
                                             cudaStream_t stream)
{
    /* The query's answer for the last kernel shape this thread launched: a
     * launch per iteration pays it once. */
    static thread_local const void* last_func = nullptr;
    static thread_local unsigned last_threads = 0;
    static thread_local size_t last_shmem = 0;
    static thread_local int most = 0;
    const unsigned threads = block.x * block.y * block.z;
    if (func != last_func || threads != last_threads || shmem != last_shmem) {
        const int q = nvshmemx_collective_launch_query_gridsize(func, block, args, shmem, &most);
        if (q != NVSHMEMX_SUCCESS) return q;
        last_func = func;
        last_threads = threads;
        last_shmem = shmem;
    }
    const long long blocks = (long long)grid.x * grid.y * grid.z;
    if (blocks > most) {
        fprintf(stderr,
                "cpnet: nvshmemx_collective_launch: %lld blocks of %u threads: at most %d fit on this PE's share of "
                "the GPU beside the proxy's landing agents (nvshmemx_collective_launch_query_gridsize)\n",
                blocks, threads, most);
        return NVSHMEMX_ERROR_INVALID_VALUE;
    }
    return cudaLaunchCooperativeKernel(func, grid, block, args, shmem, stream) == cudaSuccess
               ? NVSHMEMX_SUCCESS
               : NVSHMEMX_ERROR_INTERNAL;
}

/** Tell every PE this one is failing and exit with `status`. */
static inline void nvshmem_global_exit(int status)
{
    fprintf(stderr, "cpnet: PE %d: nvshmem_global_exit(%d)\n", cpnet_gpu_my_pe(), status);
    exit(status);
}

/* ------------------------------------------------------------------------ */
/* Device: thread scope                                                       */
/* ------------------------------------------------------------------------ */

/** The address of `dest` of PE `pe` as this kernel's loads and stores reach
 *  it, or NULL. */
__device__ inline void* nvshmem_ptr(const void* dest, int pe) { return cpnet_nv::remote(dest, pe); }

/** Complete this thread's peer stores (device; queued operations are
 *  complete when their calls return). On the host there is nothing to
 *  complete: the host issues no operations. */
__host__ __device__ inline void nvshmem_quiet(void)
{
#ifdef __CUDA_ARCH__
    __threadfence_system();
#endif
}
__host__ __device__ inline void nvshmem_fence(void)
{
#ifdef __CUDA_ARCH__
    __threadfence_system();
#endif
}

__device__ inline void nvshmem_putmem(void* dest, const void* source, size_t nbytes, int pe)
{
    char* r = cpnet_nv::remote_or_fail("nvshmem_putmem", dest, pe);
    for (size_t i = 0; i < nbytes; ++i) r[i] = ((const char*)source)[i];
}
__device__ inline void nvshmem_putmem_nbi(void* dest, const void* source, size_t nbytes, int pe)
{
    nvshmem_putmem(dest, source, nbytes, pe);
}
__device__ inline void nvshmem_getmem(void* dest, const void* source, size_t nbytes, int pe)
{
    const char* r = cpnet_nv::remote_or_fail("nvshmem_getmem", source, pe);
    for (size_t i = 0; i < nbytes; ++i) ((char*)dest)[i] = r[i];
}
__device__ inline void nvshmem_getmem_nbi(void* dest, const void* source, size_t nbytes, int pe)
{
    nvshmem_getmem(dest, source, nbytes, pe);
}

/** Put then signal (SET or ADD), the signal visible after the data. */
__device__ inline void nvshmem_putmem_signal(void* dest, const void* source, size_t nbytes, uint64_t* sig_addr,
                                             uint64_t signal, int sig_op, int pe)
{
    nvshmem_putmem(dest, source, nbytes, pe);
    cpnet_nv::signal_p2p("nvshmem_putmem_signal", sig_addr, signal, sig_op, pe);
}
__device__ inline void nvshmem_putmem_signal_nbi(void* dest, const void* source, size_t nbytes, uint64_t* sig_addr,
                                                 uint64_t signal, int sig_op, int pe)
{
    nvshmem_putmem_signal(dest, source, nbytes, sig_addr, signal, sig_op, pe);
}
__device__ inline void nvshmemx_signal_op(uint64_t* sig_addr, uint64_t signal, int sig_op, int pe)
{
    cpnet_nv::signal_p2p("nvshmemx_signal_op", sig_addr, signal, sig_op, pe);
}

/** Wait until the local signal word satisfies `cmp` against `value`;
 *  returns the value seen. */
__device__ inline uint64_t nvshmem_signal_wait_until(uint64_t* sig_addr, int cmp, uint64_t value)
{
    if (cmp < 0 || cmp >= CPNET_CMP_COUNT)
        cpnet_nv::fail("nvshmem_signal_wait_until", nvshmem_my_pe(), "unknown comparison");
    return cpnet_nv::wait_until<uint64_t>("nvshmem_signal_wait_until", sig_addr, cmp, value);
}

/** Every PE reached it, and every operation issued before it is complete.
 *  Host (collective): waits for this GPU's work first. Device: one thread
 *  per PE calls it, over peer stores (every PE's heap must be mapped). */
__host__ __device__ inline void nvshmem_barrier_all(void)
{
#ifdef __CUDA_ARCH__
    cpnet_nv::barrier_p2p("nvshmem_barrier_all");
#else
    cpnet_gpu_barrier_all("nvshmem_barrier_all");
#endif
}

/* Warp scope (nvshmemx_*_warp: every lane of the warp calls, with the same
 * arguments): the warp's own loads and stores into a peer's mapped heap,
 * then __syncwarp; as the thread-scope calls, a PE whose heap this GPU
 * does not map stops the kernel (a warp cannot use a work-group's command
 * queue either: use the _block form there). The _nbi forms are the same
 * calls (complete at nvshmem_quiet, as peer stores are). */
__device__ inline void nvshmemx_putmem_warp(void* dest, const void* source, size_t nbytes, int pe)
{
    cpnet_nv::warp_copy(cpnet_nv::remote_or_fail("nvshmemx_putmem_warp", dest, pe), (const char*)source, nbytes);
}
__device__ inline void nvshmemx_putmem_nbi_warp(void* dest, const void* source, size_t nbytes, int pe)
{
    cpnet_nv::warp_copy(cpnet_nv::remote_or_fail("nvshmemx_putmem_nbi_warp", dest, pe), (const char*)source, nbytes);
}
__device__ inline void nvshmemx_getmem_warp(void* dest, const void* source, size_t nbytes, int pe)
{
    cpnet_nv::warp_copy((char*)dest, cpnet_nv::remote_or_fail("nvshmemx_getmem_warp", source, pe), nbytes);
}
__device__ inline void nvshmemx_getmem_nbi_warp(void* dest, const void* source, size_t nbytes, int pe)
{
    cpnet_nv::warp_copy((char*)dest, cpnet_nv::remote_or_fail("nvshmemx_getmem_nbi_warp", source, pe), nbytes);
}
/** Put then signal, warp scope: the warp's stores, __syncwarp, then lane 0
 *  fences (system scope) and signals, so the signal follows the data. */
__device__ inline void nvshmemx_putmem_signal_warp(void* dest, const void* source, size_t nbytes, uint64_t* sig_addr,
                                                   uint64_t signal, int sig_op, int pe)
{
    cpnet_nv::warp_copy(cpnet_nv::remote_or_fail("nvshmemx_putmem_signal_warp", dest, pe), (const char*)source, nbytes);
    if ((cpnet_detail::thread_rank() & 31u) == 0) {
        __threadfence_system();
        cpnet_nv::signal_p2p("nvshmemx_putmem_signal_warp", sig_addr, signal, sig_op, pe);
    }
    __syncwarp();
}
__device__ inline void nvshmemx_putmem_signal_nbi_warp(void* dest, const void* source, size_t nbytes, uint64_t* sig_addr,
                                                       uint64_t signal, int sig_op, int pe)
{
    nvshmemx_putmem_signal_warp(dest, source, nbytes, sig_addr, signal, sig_op, pe);
}
#define CPNET_NV_RMA_WARP(NAME, TYPE)                                                                   \
    __device__ inline void nvshmemx_##NAME##_put_warp(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        nvshmemx_putmem_warp(dest, source, nelems * sizeof(TYPE), pe);                                  \
    }                                                                                                   \
    __device__ inline void nvshmemx_##NAME##_put_nbi_warp(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        nvshmemx_putmem_nbi_warp(dest, source, nelems * sizeof(TYPE), pe);                              \
    }                                                                                                   \
    __device__ inline void nvshmemx_##NAME##_get_warp(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        nvshmemx_getmem_warp(dest, source, nelems * sizeof(TYPE), pe);                                  \
    }                                                                                                   \
    __device__ inline void nvshmemx_##NAME##_get_nbi_warp(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        nvshmemx_getmem_nbi_warp(dest, source, nelems * sizeof(TYPE), pe);                              \
    }
CPNET_RMA_TYPES(CPNET_NV_RMA_WARP)
#undef CPNET_NV_RMA_WARP

/* Typed thread-scope RMA and waits: nvshmem_TYPENAME_{p,g,put,get,put_nbi,get_nbi}. */
#define CPNET_NV_RMA(NAME, TYPE)                                                                        \
    __device__ inline void nvshmem_##NAME##_p(TYPE* dest, TYPE value, int pe)                           \
    {                                                                                                   \
        *(volatile TYPE*)cpnet_nv::remote_or_fail("nvshmem_" #NAME "_p", dest, pe) = value;            \
    }                                                                                                   \
    __device__ inline TYPE nvshmem_##NAME##_g(const TYPE* source, int pe)                               \
    {                                                                                                   \
        return *(volatile const TYPE*)cpnet_nv::remote_or_fail("nvshmem_" #NAME "_g", source, pe);     \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_put(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        nvshmem_putmem(dest, source, nelems * sizeof(TYPE), pe);                                        \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_put_nbi(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        nvshmem_putmem(dest, source, nelems * sizeof(TYPE), pe);                                        \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_get(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        nvshmem_getmem(dest, source, nelems * sizeof(TYPE), pe);                                        \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_get_nbi(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        nvshmem_getmem(dest, source, nelems * sizeof(TYPE), pe);                                        \
    }                                                                                                   \
    __device__ inline void nvshmemx_##NAME##_put_block(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        cpnet_nv::put_block("nvshmemx_" #NAME "_put_block", dest, source, nelems * sizeof(TYPE), pe);  \
    }                                                                                                   \
    __device__ inline void nvshmemx_##NAME##_put_nbi_block(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        cpnet_nv::put_block("nvshmemx_" #NAME "_put_nbi_block", dest, source, nelems * sizeof(TYPE), pe); \
    }                                                                                                   \
    __device__ inline void nvshmemx_##NAME##_get_block(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        cpnet_nv::get_block("nvshmemx_" #NAME "_get_block", dest, source, nelems * sizeof(TYPE), pe);  \
    }                                                                                                   \
    __device__ inline void nvshmemx_##NAME##_get_nbi_block(TYPE* dest, const TYPE* source, size_t nelems, int pe) \
    {                                                                                                   \
        cpnet_nv::get_block("nvshmemx_" #NAME "_get_nbi_block", dest, source, nelems * sizeof(TYPE), pe); \
    }
CPNET_RMA_TYPES(CPNET_NV_RMA)
#undef CPNET_NV_RMA

/* Thread-scope AMOs (OpenSHMEM 1.5 §9.7, NVSHMEM's nvshmem_TYPENAME_atomic_*):
 * system-scope atomics on the target's word through the peer mapping, so
 * they are atomic with the target GPU's own atomics and with every other
 * PE's. The operand and result travel as the bit pattern of the unsigned
 * integer of TYPE's size (two's complement: an add of that pattern is the
 * signed add, wrapping). A PE whose heap this GPU does not map stops the
 * kernel as the other thread-scope calls do. Unordered with puts until
 * nvshmem_fence / nvshmem_quiet, as in NVSHMEM. */
namespace cpnet_nv {
template <int N> struct amo_word;
template <> struct amo_word<4> { typedef unsigned int t; };
template <> struct amo_word<8> { typedef unsigned long long t; };
template <typename T> using amo_u = typename amo_word<sizeof(T)>::t;

template <typename T> __device__ inline amo_u<T> amo_bits(T v)
{
    amo_u<T> u;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <typename T> __device__ inline T amo_value(amo_u<T> u)
{
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}
/** The target's word, through the peer mapping (fails otherwise). */
template <typename T> __device__ inline amo_u<T>* amo_word_at(const char* routine, const T* dest, int pe)
{
    return (amo_u<T>*)remote_or_fail(routine, dest, pe);
}
template <typename T> __device__ inline T amo_fetch(const char* routine, const T* source, int pe)
{
    return amo_value<T>(atomicOr_system(amo_word_at(routine, source, pe), (amo_u<T>)0));
}
template <typename T> __device__ inline T amo_swap(const char* routine, T* dest, T value, int pe)
{
    return amo_value<T>(atomicExch_system(amo_word_at(routine, dest, pe), amo_bits(value)));
}
template <typename T> __device__ inline T amo_compare_swap(const char* routine, T* dest, T cond, T value, int pe)
{
    return amo_value<T>(atomicCAS_system(amo_word_at(routine, dest, pe), amo_bits(cond), amo_bits(value)));
}
template <typename T> __device__ inline T amo_fetch_add(const char* routine, T* dest, T value, int pe)
{
    return amo_value<T>(atomicAdd_system(amo_word_at(routine, dest, pe), amo_bits(value)));
}
template <typename T> __device__ inline T amo_fetch_and(const char* routine, T* dest, T value, int pe)
{
    return amo_value<T>(atomicAnd_system(amo_word_at(routine, dest, pe), amo_bits(value)));
}
template <typename T> __device__ inline T amo_fetch_or(const char* routine, T* dest, T value, int pe)
{
    return amo_value<T>(atomicOr_system(amo_word_at(routine, dest, pe), amo_bits(value)));
}
template <typename T> __device__ inline T amo_fetch_xor(const char* routine, T* dest, T value, int pe)
{
    return amo_value<T>(atomicXor_system(amo_word_at(routine, dest, pe), amo_bits(value)));
}
} // namespace cpnet_nv

#define CPNET_NV_AMO_FSS(NAME, TYPE, DT)                                                                \
    __device__ inline TYPE nvshmem_##NAME##_atomic_fetch(const TYPE* source, int pe)                    \
    {                                                                                                   \
        return cpnet_nv::amo_fetch<TYPE>("nvshmem_" #NAME "_atomic_fetch", source, pe);                 \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_atomic_set(TYPE* dest, TYPE value, int pe)                  \
    {                                                                                                   \
        cpnet_nv::amo_swap<TYPE>("nvshmem_" #NAME "_atomic_set", dest, value, pe);                      \
    }                                                                                                   \
    __device__ inline TYPE nvshmem_##NAME##_atomic_swap(TYPE* dest, TYPE value, int pe)                 \
    {                                                                                                   \
        return cpnet_nv::amo_swap<TYPE>("nvshmem_" #NAME "_atomic_swap", dest, value, pe);              \
    }
#define CPNET_NV_AMO_STD(NAME, TYPE, DT)                                                                \
    CPNET_NV_AMO_FSS(NAME, TYPE, DT)                                                                    \
    __device__ inline TYPE nvshmem_##NAME##_atomic_compare_swap(TYPE* dest, TYPE cond, TYPE value, int pe) \
    {                                                                                                   \
        return cpnet_nv::amo_compare_swap<TYPE>("nvshmem_" #NAME "_atomic_compare_swap", dest, cond, value, pe); \
    }                                                                                                   \
    __device__ inline TYPE nvshmem_##NAME##_atomic_fetch_add(TYPE* dest, TYPE value, int pe)            \
    {                                                                                                   \
        return cpnet_nv::amo_fetch_add<TYPE>("nvshmem_" #NAME "_atomic_fetch_add", dest, value, pe);    \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_atomic_add(TYPE* dest, TYPE value, int pe)                  \
    {                                                                                                   \
        cpnet_nv::amo_fetch_add<TYPE>("nvshmem_" #NAME "_atomic_add", dest, value, pe);                 \
    }                                                                                                   \
    __device__ inline TYPE nvshmem_##NAME##_atomic_fetch_inc(TYPE* dest, int pe)                        \
    {                                                                                                   \
        return cpnet_nv::amo_fetch_add<TYPE>("nvshmem_" #NAME "_atomic_fetch_inc", dest, (TYPE)1, pe);  \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_atomic_inc(TYPE* dest, int pe)                              \
    {                                                                                                   \
        cpnet_nv::amo_fetch_add<TYPE>("nvshmem_" #NAME "_atomic_inc", dest, (TYPE)1, pe);               \
    }
#define CPNET_NV_AMO_BIT(NAME, TYPE, DT)                                                                \
    __device__ inline TYPE nvshmem_##NAME##_atomic_fetch_and(TYPE* dest, TYPE value, int pe)            \
    {                                                                                                   \
        return cpnet_nv::amo_fetch_and<TYPE>("nvshmem_" #NAME "_atomic_fetch_and", dest, value, pe);    \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_atomic_and(TYPE* dest, TYPE value, int pe)                  \
    {                                                                                                   \
        cpnet_nv::amo_fetch_and<TYPE>("nvshmem_" #NAME "_atomic_and", dest, value, pe);                 \
    }                                                                                                   \
    __device__ inline TYPE nvshmem_##NAME##_atomic_fetch_or(TYPE* dest, TYPE value, int pe)             \
    {                                                                                                   \
        return cpnet_nv::amo_fetch_or<TYPE>("nvshmem_" #NAME "_atomic_fetch_or", dest, value, pe);      \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_atomic_or(TYPE* dest, TYPE value, int pe)                   \
    {                                                                                                   \
        cpnet_nv::amo_fetch_or<TYPE>("nvshmem_" #NAME "_atomic_or", dest, value, pe);                   \
    }                                                                                                   \
    __device__ inline TYPE nvshmem_##NAME##_atomic_fetch_xor(TYPE* dest, TYPE value, int pe)            \
    {                                                                                                   \
        return cpnet_nv::amo_fetch_xor<TYPE>("nvshmem_" #NAME "_atomic_fetch_xor", dest, value, pe);    \
    }                                                                                                   \
    __device__ inline void nvshmem_##NAME##_atomic_xor(TYPE* dest, TYPE value, int pe)                  \
    {                                                                                                   \
        cpnet_nv::amo_fetch_xor<TYPE>("nvshmem_" #NAME "_atomic_xor", dest, value, pe);                 \
    }
CPNET_AMO_STANDARD_TYPES(CPNET_NV_AMO_STD)
CPNET_AMO_EXTENDED_ONLY_TYPES(CPNET_NV_AMO_FSS)
CPNET_AMO_BITWISE_TYPES(CPNET_NV_AMO_BIT)
#undef CPNET_NV_AMO_FSS
#undef CPNET_NV_AMO_STD
#undef CPNET_NV_AMO_BIT

#define CPNET_NV_WAIT(NAME, TYPE)                                                                       \
    __device__ inline void nvshmem_##NAME##_wait_until(TYPE* ivar, int cmp, TYPE value)                 \
    {                                                                                                   \
        cpnet_nv::wait_until<TYPE>("nvshmem_" #NAME "_wait_until", ivar, cmp, value);                   \
    }
CPNET_P2P_TYPES(CPNET_NV_WAIT)
#undef CPNET_NV_WAIT

/* ------------------------------------------------------------------------ */
/* Device: block scope (every thread of the block calls)                      */
/* ------------------------------------------------------------------------ */

__device__ inline void nvshmemx_putmem_block(void* dest, const void* source, size_t nbytes, int pe)
{
    cpnet_nv::put_block("nvshmemx_putmem_block", dest, source, nbytes, pe);
}
__device__ inline void nvshmemx_putmem_nbi_block(void* dest, const void* source, size_t nbytes, int pe)
{
    cpnet_nv::put_block("nvshmemx_putmem_nbi_block", dest, source, nbytes, pe);
}
__device__ inline void nvshmemx_getmem_block(void* dest, const void* source, size_t nbytes, int pe)
{
    cpnet_nv::get_block("nvshmemx_getmem_block", dest, source, nbytes, pe);
}
__device__ inline void nvshmemx_getmem_nbi_block(void* dest, const void* source, size_t nbytes, int pe)
{
    cpnet_nv::get_block("nvshmemx_getmem_nbi_block", dest, source, nbytes, pe);
}

/** Put then signal, block scope: peer stores, a block barrier, the signal
 *  by one thread after a system fence; or one queued put-with-signal. */
__device__ inline void nvshmemx_putmem_signal_block(void* dest, const void* source, size_t nbytes, uint64_t* sig_addr,
                                                    uint64_t signal, int sig_op, int pe)
{
    if (cpnet_nv::remote(dest, pe) != nullptr && cpnet_nv::remote(sig_addr, pe) != nullptr) {
        cpnet_nv::put_block("nvshmemx_putmem_signal_block", dest, source, nbytes, pe);
        if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
            __threadfence_system();
            cpnet_nv::signal_p2p("nvshmemx_putmem_signal_block", sig_addr, signal, sig_op, pe);
        }
        __syncthreads();
        return;
    }
    cpnet_nv::with_queue("nvshmemx_putmem_signal_block", pe, [&](cpnet_ctx_t* c) {
        return cpnet_putmem_signal(c, dest, source, nbytes, sig_addr, signal, sig_op, pe);
    });
}
__device__ inline void nvshmemx_putmem_signal_nbi_block(void* dest, const void* source, size_t nbytes,
                                                        uint64_t* sig_addr, uint64_t signal, int sig_op, int pe)
{
    nvshmemx_putmem_signal_block(dest, source, nbytes, sig_addr, signal, sig_op, pe);
}

/** Barrier of every PE by one block per PE: peer stores where every heap
 *  is mapped (cpnet_team_sync's protocol on the world team), else the
 *  proxy's barrier. */
__device__ inline void nvshmemx_barrier_all_block(void)
{
    if (cpnet_nv::all_mapped()) {
        __syncthreads();
        if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) cpnet_nv::barrier_p2p("nvshmemx_barrier_all_block");
        __syncthreads();
        return;
    }
    cpnet_nv::with_queue("nvshmemx_barrier_all_block", nvshmem_my_pe(),
                         [&](cpnet_ctx_t* c) { return cpnet_barrier_all(c); });
}

namespace cpnet_nv {
static __global__ void barrier_all_kernel() { nvshmemx_barrier_all_block(); }
}

/* nvshmem_sync_all (OpenSHMEM 1.5 §9.9.4 shmem_sync_all: every PE reached
 * it; it need not complete earlier operations) in its host, device, block
 * and stream forms: the corresponding barrier_all, which also completes
 * them, so every guarantee of sync_all holds. */
__host__ __device__ inline void nvshmem_sync_all(void) { nvshmem_barrier_all(); }
__device__ inline void nvshmemx_sync_all_block(void) { nvshmemx_barrier_all_block(); }
static inline void nvshmemx_sync_all_on_stream(cudaStream_t stream) { nvshmemx_barrier_all_on_stream(stream); }

/* Team collectives, block scope, and their stream forms: cpnet/nvshmem_coll.h
 * (split out of this header for its size; it needs everything above). */
#include <cpnet/nvshmem_coll.h>

#endif /* CPNET_NVSHMEM_H */
