/*
 * cpnet/ptx.cuh -- the memory-model primitives the device API is built on.
 *
 * Every protocol word of a queue (cpnet/cmd.h, "THE QUEUE PROTOCOL") and every
 * word the proxy writes for the kernel to see is read and written here, with
 * explicit PTX that names its semantics and its scope. Producer (GPU) and
 * consumer (proxy CPU thread) are different agents, so every ordered access is
 * at system scope (.sys). Nothing relies on `volatile` alone: a relaxed access
 * below is a *strong* access in the PTX memory model (it cannot be torn, cached
 * away or elided), and every ordering comes from a release, an acquire or a
 * fence that is written out.
 *
 * The `.global` state space is right for every address we touch: the queues and
 * the status block are host-pinned memory mapped into the GPU (generic addresses
 * in the global window), the symmetric heap is device memory. On every
 * architecture cpnet supports (sm_70 and newer) a generic address in the global
 * window is the global address itself.
 *
 * All functions here are `__device__ __forceinline__` and have no side effect
 * besides the one access they name. Include <cpnet/device.cuh>, not this file.
 */
#ifndef CPNET_PTX_CUH
#define CPNET_PTX_CUH

#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "cpnet/ptx.cuh is CUDA device code: compile it with nvcc or NVRTC"
#endif

#include <cpnet/cmd.h>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 700)
#error "cpnet needs sm_70 or newer (scoped acquire/release PTX, __nanosleep)"
#endif

/* ------------------------------------------------------------------------ */
/* Loads                                                                    */
/* ------------------------------------------------------------------------ */

/** Load a 64-bit word with ACQUIRE semantics at system scope.
 *  Later loads and stores of this thread are ordered after it, and every write
 *  that happened before the matching system-scope release (by the CPU or a copy
 *  engine) is visible to them. Used for ctl.consumed (P1, pairs with C3) and
 *  ctl.completed (P4, pairs with C4). */
__device__ __forceinline__ uint64_t cpnet_ld_acquire_sys_u64(const uint64_t* p)
{
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/** Load a 32-bit word with ACQUIRE semantics at system scope (see the u64 form). */
__device__ __forceinline__ uint32_t cpnet_ld_acquire_sys_u32(const uint32_t* p)
{
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/** Load a 64-bit word RELAXED at system scope: a strong load (never torn, never
 *  served from a stale L1 line) with no ordering of its own. Used for the abort
 *  words, for fields that a preceding acquire already ordered (ctl.result,
 *  ctl.error, ...) and for polling heap words before one acquire fence. */
__device__ __forceinline__ uint64_t cpnet_ld_relaxed_sys_u64(const uint64_t* p)
{
    uint64_t v;
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/** Load a 32-bit word RELAXED at system scope (see the u64 form). */
__device__ __forceinline__ uint32_t cpnet_ld_relaxed_sys_u32(const uint32_t* p)
{
    uint32_t v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* ------------------------------------------------------------------------ */
/* Stores                                                                   */
/* ------------------------------------------------------------------------ */

/** Store a 64-bit word with RELEASE semantics at system scope.
 *  Every earlier load and store of this thread -- and, through cumulativity,
 *  every write this thread has observed, including other threads' writes
 *  ordered before it by a block barrier -- is visible to an agent that reads
 *  this value with acquire before it reads anything else. PTX defines
 *  st.release as fence.acq_rel + st.relaxed at the same scope, so no separate
 *  fence is needed in front of it. Used for the commit word (P3, pairs with C1)
 *  and for returning a queue (prod.in_use = 0). */
__device__ __forceinline__ void cpnet_st_release_sys_u64(uint64_t* p, uint64_t v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/** Store a 64-bit word with RELEASE semantics at GPU scope: for a word only
 *  threads of this GPU wait on (a signal in this PE's heap, which waits poll
 *  with ld.acquire.sys: both scopes include both threads, so they pair).
 *  Orders the thread's earlier accesses (and, cumulatively, those it observed,
 *  e.g. through a block barrier) at GPU scope only, without a system-scope
 *  membar: used by the landing agent's SET signal. */
__device__ __forceinline__ void cpnet_st_release_gpu_u64(uint64_t* p, uint64_t v)
{
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/** Store a 32-bit word with RELEASE semantics at system scope (see the u64 form). */
__device__ __forceinline__ void cpnet_st_release_sys_u32(uint32_t* p, uint32_t v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/** Store a 64-bit word RELAXED at system scope (strong, unordered). */
__device__ __forceinline__ void cpnet_st_relaxed_sys_u64(uint64_t* p, uint64_t v)
{
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/** Store a 32-bit word RELAXED at system scope (strong, unordered). */
__device__ __forceinline__ void cpnet_st_relaxed_sys_u32(uint32_t* p, uint32_t v)
{
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/** Store two 64-bit words (16 bytes, `p` 16-byte aligned) with one weak vector
 *  store. Used to fill a slot's words 0..6 (P2): they need no ordering of their
 *  own, the release store of the commit word (P3) orders them. */
__device__ __forceinline__ void cpnet_st_v2_u64(uint64_t* p, uint64_t a, uint64_t b)
{
    asm volatile("st.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

/** Store one 64-bit word with a weak store (ordered by a later release). */
__device__ __forceinline__ void cpnet_st_weak_u64(uint64_t* p, uint64_t v)
{
    asm volatile("st.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* ------------------------------------------------------------------------ */
/* Read-modify-write and fences                                             */
/* ------------------------------------------------------------------------ */

/** Compare-and-swap a 32-bit word with ACQUIRE semantics at system scope;
 *  returns the old value (the swap happened iff it equals `expected`). Used to
 *  claim a queue (prod.in_use 0 -> 1): the acquire pairs with the previous
 *  owner's release store of in_use = 0, so its stores of write_idx and
 *  cached_consumed are visible to the new owner. */
__device__ __forceinline__ uint32_t cpnet_atom_cas_acquire_sys_u32(uint32_t* p, uint32_t expected,
                                                                  uint32_t desired)
{
    uint32_t old;
    asm volatile("atom.cas.acquire.sys.global.b32 %0, [%1], %2, %3;"
                 : "=r"(old)
                 : "l"(p), "r"(expected), "r"(desired)
                 : "memory");
    return old;
}

/** Add 1 to a 32-bit word with RELEASE semantics at system scope, result
 *  unused. Signals a queue claim (cpnet_status_t.claim_gen): the release
 *  orders the store of prod.in_use = 1 before it; pairs with the proxy's
 *  acquire load of claim_gen. */
__device__ __forceinline__ void cpnet_red_add_release_sys_u32(uint32_t* p, uint32_t v)
{
    asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/** Compare-and-swap a 32-bit word with ACQ_REL semantics at system scope;
 *  returns the old value. Used to claim cpnet_status_t.dev_error (0 -> code):
 *  exactly one reporter wins. */
__device__ __forceinline__ uint32_t cpnet_atom_cas_acq_rel_sys_u32(uint32_t* p, uint32_t expected,
                                                                  uint32_t desired)
{
    uint32_t old;
    asm volatile("atom.cas.acq_rel.sys.global.b32 %0, [%1], %2, %3;"
                 : "=r"(old)
                 : "l"(p), "r"(expected), "r"(desired)
                 : "memory");
    return old;
}

/** A full ACQ_REL fence at system scope. After a relaxed load that observed a
 *  value, this fence makes the pair an acquire pattern (PTX memory model:
 *  "relaxed read; fence.acq_rel" synchronizes with a release); before relaxed
 *  stores it makes them a release pattern. */
__device__ __forceinline__ void cpnet_fence_acq_rel_sys(void)
{
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}

/** A full ACQ_REL fence at GPU scope (see the sys form): orders the thread's
 *  accesses for the other threads of this GPU, without a system-scope membar. */
__device__ __forceinline__ void cpnet_fence_acq_rel_gpu(void)
{
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

/* ------------------------------------------------------------------------ */
/* Time and backoff                                                          */
/* ------------------------------------------------------------------------ */

/** Nanoseconds from the GPU's global timer (%globaltimer). Monotonic, shared by
 *  all SMs; its resolution is 32 ns to 1 us depending on the GPU, plenty for
 *  wait timeouts of milliseconds and more. */
__device__ __forceinline__ uint64_t cpnet_globaltimer_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/** Sleep this thread for about `ns` nanoseconds (0 .. ~1 ms; hardware may
 *  shorten it). Used as the backoff of every spin. */
__device__ __forceinline__ void cpnet_sleep_ns(uint32_t ns)
{
    __nanosleep(ns);
}

/** Copy `n` bytes from `src` to `dst` with every thread of the block, in the
 *  widest unit both addresses allow. Loads use the cache-volatile form
 *  (ld.global.cv: fetched again, never served from a stale cached line),
 *  because a host staging buffer is rewritten by the NIC or the CPU between
 *  two uses (the landing agent; the pair staging, cpnet/pair.cuh). In
 *  the 16-byte case each thread has four loads in flight
 *  before it stores (256 threads: 16 KiB per PCIe round trip from host
 *  staging, where one load at a time took a round trip per 4 KiB: a 16 KiB
 *  halo landed in ~3 µs at best, session 14). */
__device__ __forceinline__ void cpnet_block_copy_cv(uint8_t* dst, const uint8_t* src, uint64_t n)
{
    const uint64_t t = threadIdx.x, nt = blockDim.x;
    const uint64_t a = (uint64_t)dst | (uint64_t)src;
    if ((a & 15) == 0) {
        const uint64_t w = n / 16;
        uint4* d = (uint4*)dst;
        const uint4* s = (const uint4*)src;
        uint64_t i = t;
        for (; i + 3 * nt < w; i += 4 * nt) {
            const uint4 v0 = __ldcv(s + i), v1 = __ldcv(s + i + nt), v2 = __ldcv(s + i + 2 * nt),
                        v3 = __ldcv(s + i + 3 * nt);
            d[i] = v0;
            d[i + nt] = v1;
            d[i + 2 * nt] = v2;
            d[i + 3 * nt] = v3;
        }
        for (; i < w; i += nt) d[i] = __ldcv(s + i);
        for (uint64_t i = w * 16 + t; i < n; i += nt) dst[i] = (uint8_t)__ldcv((const unsigned char*)src + i);
    } else if ((a & 7) == 0) {
        const uint64_t w = n / 8;
        unsigned long long* d = (unsigned long long*)dst;
        const unsigned long long* s = (const unsigned long long*)src;
        for (uint64_t i = t; i < w; i += nt) d[i] = __ldcv(s + i);
        for (uint64_t i = w * 8 + t; i < n; i += nt) dst[i] = (uint8_t)__ldcv((const unsigned char*)src + i);
    } else {
        for (uint64_t i = t; i < n; i += nt) dst[i] = (uint8_t)__ldcv((const unsigned char*)src + i);
    }
}

#endif /* CPNET_PTX_CUH */
