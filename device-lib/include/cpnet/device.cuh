/*
 * cpnet/device.cuh -- the cpnet device API: OpenSHMEM-style one-sided
 * communication issued from inside a running CUDA kernel.
 *
 *     #include <cpnet/device.cuh>
 *
 *     extern "C" __global__ void kernel(cpnet_handle_t h, int* data)
 *     {
 *         __shared__ cpnet_ctx_t ctx;
 *         if (cpnet_ctx_create(&h, &ctx) != CPNET_E_OK) return;   // every thread
 *         int peer = (cpnet_my_pe(&ctx) + 1) % cpnet_n_pes(&ctx);
 *         data[threadIdx.x] = threadIdx.x;                          // local heap
 *         cpnet_putmem_nbi(&ctx, data, data, blockDim.x * sizeof(int), peer);
 *         int err = cpnet_quiet(&ctx);                              // every thread
 *         cpnet_ctx_destroy(&ctx);
 *     }
 *
 * THE RULES (ComP-Net paper §4.1: work-group granularity)
 *
 *  - Every call taking a cpnet_ctx_t* is COLLECTIVE OVER THE WORK-GROUP (the
 *    CUDA thread block): every thread of the block makes the same call with
 *    the same arguments, in the same order, from converged control flow (it
 *    contains __syncthreads()). The leader thread (linear thread index 0)
 *    issues the command and waits; the call ends with a block barrier, and its
 *    result is returned to every thread. Exceptions, callable by any thread at
 *    any time after create: cpnet_my_pe, cpnet_n_pes, cpnet_ctx_last_error.
 *  - Before the leader publishes a command, a block barrier makes every
 *    thread's earlier writes (a put source) part of what the command sends.
 *    After a call returns, data it delivered locally (a blocking get) is
 *    visible to every thread of the block.
 *  - With respect to other PEs and other work-groups the calls are ONE-SIDED,
 *    as in OpenSHMEM: nothing is required of the target.
 *  - Addresses are SYMMETRIC addresses of this PE's heap (handle.heap_base ..
 *    + heap_size): the remote address is the same offset in the target PE's
 *    heap. They travel as heap offsets, never as pointers; the proxy rejects
 *    an offset outside the heap with CPNET_E_BAD_ADDR. An inline put source
 *    (<= 8 bytes) and an inline get destination are read/written by the
 *    device itself and may be any device-accessible memory.
 *  - Blocking calls return int: CPNET_E_OK or a CPNET_E_* code (cmd.h).
 *    Non-blocking (_nbi) and fire-and-forget calls return void; their errors
 *    surface at the next cpnet_quiet / cpnet_barrier_all / cpnet_ctx_destroy.
 *    Calls that return a value (_g, fetching atomics, signal_wait_until)
 *    return 0 on failure; cpnet_ctx_last_error() gives the code.
 *  - No device wait hangs forever: every spin gives up with CPNET_E_TIMEOUT
 *    after handle.wait_timeout_ns (0: never) and reports itself in the PE's
 *    cpnet_status_t, and returns at once (the abort code) once the host sets
 *    cpnet_status_t.abort or the queue's ctl.abort.
 *
 * OpenSHMEM sections cited are those of OpenSHMEM 1.5 (June 2020).
 */
#ifndef CPNET_DEVICE_CUH
#define CPNET_DEVICE_CUH

#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "cpnet/device.cuh is CUDA device code: compile it with nvcc or NVRTC"
#endif

#include <cpnet/cmd.h>
#include <cpnet/ptx.cuh>
#include <cpnet/queue.cuh>

/** size_t and ptrdiff_t as the compiler sees them (NVRTC ships no <cstddef>). */
typedef decltype(sizeof(0)) cpnet_size_t;
typedef decltype((char*)0 - (char*)0) cpnet_ptrdiff_t;

/* ------------------------------------------------------------------------ */
/* Type lists (X-macros; usable by callers to enumerate the typed API)      */
/* ------------------------------------------------------------------------ */

/** OpenSHMEM 1.5 standard RMA types that fit in 8 bytes (Table 5, without
 *  longdouble): X(NAME, TYPE). Generates cpnet_NAME_put/_put_nbi/_get/_get_nbi
 *  /_p/_g. */
#define CPNET_RMA_TYPES(X)                                                                      \
    X(char, char) X(schar, signed char) X(short, short) X(int, int) X(long, long)              \
    X(longlong, long long) X(uchar, unsigned char) X(ushort, unsigned short)                   \
    X(uint, unsigned int) X(ulong, unsigned long) X(ulonglong, unsigned long long)             \
    X(int8, int8_t) X(int16, short) X(int32, int32_t) X(int64, int64_t) X(uint8, uint8_t)      \
    X(uint16, unsigned short) X(uint32, uint32_t) X(uint64, uint64_t) X(size, cpnet_size_t)    \
    X(ptrdiff, cpnet_ptrdiff_t) X(float, float) X(double, double)

/** The largest put or get, in bytes per thread of the calling block, that
 *  goes over the peer-to-peer path (the block's own loads and stores); a
 *  larger one goes through the proxy, whose copy engine moves it at link
 *  speed however few threads the block has. 0: no limit. Measured with a
 *  32-thread block on two H200s (docs/results.md, session 7): its own
 *  stores or loads move 64 KiB in 2.4 us, but 128 KiB in 13.6 us (put) and
 *  60 us (get); the proxy's copy takes 12-14 us up to 256 KiB and reaches
 *  300 GB/s from 4 MiB. Define it before including this header to change it. */
#ifndef CPNET_P2P_BYTES_PER_THREAD
#define CPNET_P2P_BYTES_PER_THREAD 2048
#endif

/** OpenSHMEM 1.5 point-to-point synchronization types (§9.10, without the
 *  deprecated short/ushort): X(NAME, TYPE). Generates cpnet_NAME_wait_until
 *  and cpnet_NAME_test. */
#define CPNET_P2P_TYPES(X)                                                                      \
    X(int, int) X(long, long) X(longlong, long long) X(uint, unsigned int)                     \
    X(ulong, unsigned long) X(ulonglong, unsigned long long) X(int32, int32_t)                 \
    X(int64, int64_t) X(uint32, uint32_t) X(uint64, uint64_t) X(size, cpnet_size_t)            \
    X(ptrdiff, cpnet_ptrdiff_t)

/** OpenSHMEM 1.5 standard AMO types (§9.7): X(NAME, TYPE, CPNET_T_*). Generates
 *  fetch, set, swap, compare_swap, fetch_add, add, fetch_inc, inc. */
#define CPNET_AMO_STANDARD_TYPES(X)                                                             \
    X(int, int, CPNET_T_INT32) X(long, long, CPNET_T_INT64)                                    \
    X(longlong, long long, CPNET_T_INT64) X(uint, unsigned int, CPNET_T_UINT32)                \
    X(ulong, unsigned long, CPNET_T_UINT64) X(ulonglong, unsigned long long, CPNET_T_UINT64)   \
    X(int32, int32_t, CPNET_T_INT32) X(int64, int64_t, CPNET_T_INT64)                          \
    X(uint32, uint32_t, CPNET_T_UINT32) X(uint64, uint64_t, CPNET_T_UINT64)                    \
    X(size, cpnet_size_t, CPNET_T_UINT64) X(ptrdiff, cpnet_ptrdiff_t, CPNET_T_INT64)

/** The extended AMO types beyond the standard ones (§9.7: fetch, set, swap
 *  only): X(NAME, TYPE, CPNET_T_*). They travel as their bit pattern in the
 *  unsigned integer type of the same size; fetch/set/swap are bitwise. */
#define CPNET_AMO_EXTENDED_ONLY_TYPES(X) X(float, float, CPNET_T_UINT32) X(double, double, CPNET_T_UINT64)

/** OpenSHMEM 1.5 bitwise AMO types (§9.7): X(NAME, TYPE, CPNET_T_*). Generates
 *  fetch_and, and, fetch_or, or, fetch_xor, xor. */
#define CPNET_AMO_BITWISE_TYPES(X)                                                              \
    X(uint, unsigned int, CPNET_T_UINT32) X(ulong, unsigned long, CPNET_T_UINT64)              \
    X(ulonglong, unsigned long long, CPNET_T_UINT64) X(int32, int32_t, CPNET_T_INT32)          \
    X(int64, int64_t, CPNET_T_INT64) X(uint32, uint32_t, CPNET_T_UINT32)                       \
    X(uint64, uint64_t, CPNET_T_UINT64)

/* ------------------------------------------------------------------------ */
/* Internals shared by the typed API                                         */
/* ------------------------------------------------------------------------ */

namespace cpnet_detail {

/** `n` (<= 8) bytes at `src`, little-endian, zero-extended to 64 bits. */
__device__ __forceinline__ uint64_t read_inline(const void* src, uint64_t n)
{
    const uint8_t* s = (const uint8_t*)src;
    uint64_t v = 0;
    for (uint64_t i = 0; i < n; ++i) v |= (uint64_t)s[i] << (8 * i);
    return v;
}

/** Store the low `n` (<= 8) bytes of `v` at `dst`, little-endian. */
__device__ __forceinline__ void write_inline(void* dst, uint64_t v, uint64_t n)
{
    uint8_t* d = (uint8_t*)dst;
    for (uint64_t i = 0; i < n; ++i) d[i] = (uint8_t)(v >> (8 * i));
}

/** A PUT (or the data part of a PUT_SIGNAL): inline when nbytes <= 8. */
__device__ __forceinline__ cpnet_cmd_t put_cmd(const cpnet_ctx_t* ctx, void* dest, const void* source,
                                               uint64_t nbytes, int pe)
{
    cpnet_cmd_t c = {};
    c.opcode = CPNET_OP_PUT;
    c.pe = pe;
    c.size = nbytes;
    c.dst = heap_offset(ctx, dest);
    if (nbytes <= CPNET_INLINE_MAX) {
        c.flags = CPNET_F_INLINE;
        c.value = read_inline(source, nbytes);
    } else {
        c.src = heap_offset(ctx, source);
    }
    return c;
}

/** A GET into the local heap (`inl` false) or into ctl.result (`inl` true). */
__device__ __forceinline__ cpnet_cmd_t get_cmd(const cpnet_ctx_t* ctx, void* dest, const void* source,
                                               uint64_t nbytes, int pe, bool inl)
{
    cpnet_cmd_t c = {};
    c.opcode = CPNET_OP_GET;
    c.pe = pe;
    c.size = nbytes;
    c.src = heap_offset(ctx, source);
    if (inl)
        c.flags = CPNET_F_INLINE;
    else
        c.dst = heap_offset(ctx, dest);
    return c;
}

/** A PUT_SIGNAL: the put part as put_cmd, signal value in `cond`, the
 *  signal word's heap offset in `sig`, the operation in `subop`. */
__device__ __forceinline__ cpnet_cmd_t put_signal_cmd(const cpnet_ctx_t* ctx, void* dest,
                                                      const void* source, uint64_t nbytes,
                                                      const uint64_t* sig_addr, uint64_t signal,
                                                      int sig_op, int pe)
{
    cpnet_cmd_t c = put_cmd(ctx, dest, source, nbytes, pe);
    c.opcode = CPNET_OP_PUT_SIGNAL;
    c.subop = (uint8_t)sig_op;
    c.cond = signal;
    c.sig = heap_offset(ctx, sig_addr);
    return c;
}

/** An AMO on `dest` at `pe`; operand and compare zero-extended from T. */
template <typename T>
__device__ __forceinline__ cpnet_cmd_t amo_cmd(const cpnet_ctx_t* ctx, const T* dest, int subop,
                                               int dtype, T value, T cond, int pe)
{
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "cpnet: AMOs are on 32- or 64-bit words");
    cpnet_cmd_t c = {};
    c.opcode = CPNET_OP_AMO;
    c.dtype = (uint8_t)dtype;
    c.subop = (uint8_t)subop;
    c.pe = pe;
    c.size = sizeof(T);
    c.dst = heap_offset(ctx, dest);
    c.value = to_bits<T>(value);
    c.cond = to_bits<T>(cond);
    return c;
}

/* ------------------------------------------------------------------------ */
/* The peer-to-peer path: the kernel's own loads and stores (handle.peers)   */
/* ------------------------------------------------------------------------ */

/** Where this kernel reaches PE `pe`'s heap with its own loads and stores,
 *  or 0 when the operation goes through the queue: no table (CPU PEs,
 *  CPNET_GPU_P2P=0), no queue (a failed create, which the queue path
 *  reports), `pe` out of range (the proxy reports CPNET_E_BAD_PE) or a PE of
 *  another host. The same in every thread of the block: ctx fields change
 *  only inside collective calls, between their barriers, and the table does
 *  not change while kernels run. */
__device__ __forceinline__ uint64_t p2p_base(const cpnet_ctx_t* ctx, int pe)
{
    if (ctx->peers == nullptr || ctx->ctl == nullptr || pe < 0 || pe >= ctx->n_pes) return 0;
    return ctx->peers[pe];
}

/** True when [ptr, ptr + n) lies in this PE's heap, n > 0 (the decoder's
 *  check, overflow-safe). */
__device__ __forceinline__ bool in_heap(const cpnet_ctx_t* ctx, const void* ptr, uint64_t n)
{
    const uint64_t off = heap_offset(ctx, ptr);
    return off < ctx->heap_size && n <= ctx->heap_size - off;
}

/** The local side's part of p2p_remote's choice: at most
 *  CPNET_P2P_BYTES_PER_THREAD bytes per thread of the block, and `local`
 *  in the heap unless the access is inline (at most CPNET_INLINE_MAX
 *  bytes). team_round_direct asks the same. */
__device__ __forceinline__ bool p2p_local_ok(const cpnet_ctx_t* ctx, const void* local, uint64_t nbytes)
{
    if (CPNET_P2P_BYTES_PER_THREAD != 0 &&
        nbytes > (uint64_t)CPNET_P2P_BYTES_PER_THREAD * blockDim.x * blockDim.y * blockDim.z)
        return false;
    return nbytes <= CPNET_INLINE_MAX || in_heap(ctx, local, nbytes);
}

/** Where at `pe` the symmetric object `remote` (a put's `dest`, a get's
 *  `source`) is, for an access of `nbytes` (> 0) whose other side is `local`
 *  (the put's source, the get's destination), or nullptr when the access
 *  goes through the queue: no peer-to-peer mapping of `pe`; more than
 *  CPNET_P2P_BYTES_PER_THREAD bytes per thread of the block (the proxy's
 *  copy engine then moves it faster than the block's own stores); or an
 *  argument the proxy rejects (`remote` outside the heap; a `local` of more
 *  than 8 bytes outside it), so that bad input gets the same error on both
 *  paths. */
__device__ __forceinline__ uint8_t* p2p_remote(const cpnet_ctx_t* ctx, const void* remote, const void* local,
                                               uint64_t nbytes, int pe)
{
    const uint64_t base = p2p_base(ctx, pe);
    if (base == 0 || !in_heap(ctx, remote, nbytes) || !p2p_local_ok(ctx, local, nbytes)) return nullptr;
    return (uint8_t*)(base + heap_offset(ctx, remote));
}

/** Route a put-with-signal: true when it goes on the peer-to-peer path --
 *  `pe` is mapped, the data range (if any) passes p2p_remote's checks, and
 *  the signal word is in the heap, 8-aligned, with a known sig_op
 *  (otherwise the queue path reports the error). Then `*remote` is where
 *  the data goes (nullptr for nbytes 0) and `*sig_remote` where the kernel
 *  stores a SET signal (nullptr for ADD, which is queued). */
__device__ __forceinline__ bool p2p_put_signal_route(const cpnet_ctx_t* ctx, const void* dest, const void* source,
                                                     uint64_t nbytes, const uint64_t* sig_addr, int sig_op, int pe,
                                                     uint8_t** remote, uint64_t** sig_remote)
{
    const uint64_t base = p2p_base(ctx, pe);
    if (base == 0 || (sig_op != CPNET_SIGNAL_SET && sig_op != CPNET_SIGNAL_ADD)) return false;
    if (!in_heap(ctx, sig_addr, 8) || (heap_offset(ctx, sig_addr) & 7) != 0) return false;
    *remote = nbytes == 0 ? nullptr : p2p_remote(ctx, dest, source, nbytes, pe);
    if (nbytes != 0 && *remote == nullptr) return false;
    *sig_remote = sig_op == CPNET_SIGNAL_SET ? (uint64_t*)(base + heap_offset(ctx, sig_addr)) : nullptr;
    return true;
}

/** Copy `n` words of T with every thread of the block, four loads in flight
 *  per thread before their stores. Plain loads and stores: ordering comes
 *  from the calls' barriers and fences. */
template <typename T>
__device__ __forceinline__ void block_copy_words(T* dst, const T* src, uint64_t n)
{
    const uint64_t nt = (uint64_t)blockDim.x * blockDim.y * blockDim.z;
    uint64_t i = thread_rank();
    for (; i + 3 * nt < n; i += 4 * nt) {
        const T a = src[i], b = src[i + nt], c = src[i + 2 * nt], d = src[i + 3 * nt];
        dst[i] = a;
        dst[i + nt] = b;
        dst[i + 2 * nt] = c;
        dst[i + 3 * nt] = d;
    }
    for (; i < n; i += nt) dst[i] = src[i];
}

/** Copy `nbytes` with every thread of the block, in 16-, 8- or 4-byte
 *  words as far as both addresses are aligned, the rest in bytes. */
__device__ __forceinline__ void block_copy(void* dst, const void* src, uint64_t nbytes)
{
    uint8_t* d = (uint8_t*)dst;
    const uint8_t* s = (const uint8_t*)src;
    const uint64_t a = (uint64_t)d | (uint64_t)s;
    uint64_t done = 0;
    if ((a & 15) == 0) {
        done = nbytes & ~(uint64_t)15;
        block_copy_words<uint4>((uint4*)d, (const uint4*)s, nbytes / 16);
    } else if ((a & 7) == 0) {
        done = nbytes & ~(uint64_t)7;
        block_copy_words<uint2>((uint2*)d, (const uint2*)s, nbytes / 8);
    } else if ((a & 3) == 0) {
        done = nbytes & ~(uint64_t)3;
        block_copy_words<uint32_t>((uint32_t*)d, (const uint32_t*)s, nbytes / 4);
    }
    if (done < nbytes) block_copy_words<uint8_t>(d + done, s + done, nbytes - done);
}

/**
 * p2p_enter's leader part: wait until the commands a cpnet_fence ordered
 * before the next peer-to-peer access (ctx->fence_idx) are complete, then
 * forget the fence. Returns CPNET_E_OK (also when there was none) or the
 * wait's failure; the caller records it.
 */
__device__ __forceinline__ int fence_wait_leader(cpnet_ctx_t* ctx)
{
    if (ctx->fence_idx == 0) return CPNET_E_OK;
    cpnet_cmd_t c = {};
    c.opcode = CPNET_OP_FENCE;
    const int e = wait_completed(ctx, ctx->fence_idx, c);
    ctx->fence_idx = 0;
    return e;
}

/**
 * Start a peer-to-peer access (collective). If a cpnet_fence came after
 * queued commands (ctx->fence_idx), first wait until they are complete: the
 * queue cannot order the kernel's own stores, so the fence is kept by
 * waiting. Ends with a block barrier: every thread's earlier writes (a put
 * source) are visible to every thread of the block, which copy them.
 * Returns CPNET_E_OK or the wait's failure (remembered for quiet; the access
 * is then skipped).
 */
__device__ __forceinline__ int p2p_enter(cpnet_ctx_t* ctx)
{
    if (ctx->fence_idx == 0) {
        __syncthreads();
        return CPNET_E_OK;
    }
    return collective(ctx, [&]() -> int {
        const int e = fence_wait_leader(ctx);
        note_error(ctx, e);
        return e;
    });
}

/** End a peer-to-peer call with result `e` (collective): the leader records
 *  it for cpnet_ctx_last_error, then a block barrier, after which every
 *  thread's loads of the source are done (the source may be reused) and
 *  data a get loaded is visible to every thread. */
__device__ __forceinline__ int p2p_leave(cpnet_ctx_t* ctx, int e)
{
    if (is_leader()) ctx->ret = e;
    __syncthreads();
    return e;
}

/** A put or get on the peer-to-peer path (collective): the block copies
 *  `nbytes` from `src` to `dst`, one of them at the other PE. Complete when
 *  it returns as far as this block goes (a put's source may be reused, a
 *  get's data is visible to every thread); a put is visible at the target
 *  after a fence or quiet (or a signal, which is issued after a fence). */
__device__ __forceinline__ int p2p_copy(cpnet_ctx_t* ctx, void* dst, const void* src, uint64_t nbytes)
{
    const int e = p2p_enter(ctx);
    if (e == CPNET_E_OK) block_copy(dst, src, nbytes);
    return p2p_leave(ctx, e);
}

/** A get of `nbytes` (<= 8) on the peer-to-peer path whose value every
 *  thread receives (collective; cpnet_<T>_g): the leader loads it, the value
 *  is broadcast through ctx->val. */
__device__ __forceinline__ uint64_t p2p_get_value(cpnet_ctx_t* ctx, const uint8_t* remote, uint64_t nbytes)
{
    const int e = p2p_enter(ctx);
    if (is_leader()) ctx->val = e == CPNET_E_OK ? read_inline(remote, nbytes) : 0;
    p2p_leave(ctx, e);
    return ctx->val;
}

/**
 * A put-with-signal whose data goes on the peer-to-peer path (collective):
 * the block stores the data at `remote`; after a block barrier the leader
 * either stores the signal itself with st.release.sys (`sig_remote`: SET;
 * the release is cumulative over the block's stores, and pairs with the
 * target's acquire load in wait_until_leader), or (ADD, so that it stays
 * atomic with respect to the AMOs the proxy's executor applies) makes the
 * data visible at system scope with fence.acq_rel.sys and queues `sig_cmd`
 * (the put-with-signal's command) without its data. `blocking` waits for a
 * queued signal.
 */
__device__ __forceinline__ int p2p_put_signal(cpnet_ctx_t* ctx, uint8_t* remote, const void* source,
                                              uint64_t nbytes, uint64_t* sig_remote, cpnet_cmd_t sig_cmd,
                                              bool blocking)
{
    /* The queued signal carries no data (size 0). */
    sig_cmd.size = 0;
    sig_cmd.flags &= (uint8_t)~CPNET_F_INLINE;
    sig_cmd.src = 0;
    sig_cmd.value = 0;
    int e = p2p_enter(ctx);
    if (e == CPNET_E_OK && nbytes != 0) block_copy(remote, source, nbytes);
    __syncthreads();
    if (is_leader() && e == CPNET_E_OK) {
        if (sig_remote != nullptr) {
            /* Release, cumulative over the block's stores ordered before it
             * by the barrier above; pairs with the target's acquire load in
             * wait_until_leader. */
            cpnet_st_release_sys_u64(sig_remote, sig_cmd.cond);
        } else {
            /* The data at system scope before the proxy (and the target's
             * executor, through copy engines) acts on the queued signal. */
            cpnet_fence_acq_rel_sys();
            if (blocking)
                e = call_blocking(ctx, sig_cmd, false, nullptr);
            else
                call_nbi(ctx, sig_cmd);
        }
    }
    if (is_leader()) ctx->ret = e;
    __syncthreads();
    return ctx->ret;
}

/**
 * Queue the PUT or PUT_SIGNAL `c` of `nbytes` from `source` (collective),
 * blocking or not. Over CPNET_INLINE_MAX and up to the context's payload
 * slot size, the block first copies the data into the queue's payload slot
 * for the command (P0: the leader reserves it, every thread copies) and the
 * command carries CPNET_F_PAYLOAD instead of the heap offset of `source`, so
 * the proxy sends from host memory without copying out of the GPU heap; the
 * caller may then reuse `source` at once, also after an _nbi call. A failed
 * reservation (abort, timeout) is returned (blocking) or remembered for quiet.
 */
__device__ __forceinline__ int queued_put(cpnet_ctx_t* ctx, cpnet_cmd_t c, const void* source,
                                          uint64_t nbytes, bool blocking)
{
    int reserved = CPNET_E_OK;
    if (nbytes > CPNET_INLINE_MAX && nbytes <= ctx->payload_bytes) {
        /* Every thread has read the previous call's broadcast, and the
         * block's writes of `source` happen before the copy below. */
        __syncthreads();
        if (is_leader()) {
            uint8_t* slot = nullptr;
            ctx->ret = reserve_payload(ctx, c, &slot);
            ctx->val = (uint64_t)slot;
        }
        __syncthreads();
        reserved = ctx->ret;
        if (reserved == CPNET_E_OK) {
            /* Plain stores into mapped host memory; the collective's entry
             * barrier orders them before the leader's release of the commit
             * word (P3), which is cumulative over them (P0). */
            block_copy((void*)ctx->val, source, nbytes);
            c.flags = (uint8_t)((c.flags & ~CPNET_F_INLINE) | CPNET_F_PAYLOAD);
            c.src = 0;
        }
    }
    return collective(ctx, [&]() -> int {
        if (reserved != CPNET_E_OK) {
            note_error(ctx, reserved);
            return reserved;
        }
        if (blocking) return call_blocking(ctx, c, false, nullptr);
        call_nbi(ctx, c);
        return CPNET_E_OK;
    });
}

/** Blocking put of nbytes (collective). */
__device__ __forceinline__ int putmem(cpnet_ctx_t* ctx, void* dest, const void* source,
                                      uint64_t nbytes, int pe)
{
    if (nbytes != 0)
        if (uint8_t* r = p2p_remote(ctx, dest, source, nbytes, pe)) return p2p_copy(ctx, r, source, nbytes);
    if (nbytes == 0) return collective(ctx, [&]() -> int { return CPNET_E_OK; });
    return queued_put(ctx, put_cmd(ctx, dest, source, nbytes, pe), source, nbytes, true);
}

/** Non-blocking put of nbytes (collective). */
__device__ __forceinline__ void putmem_nbi(cpnet_ctx_t* ctx, void* dest, const void* source,
                                           uint64_t nbytes, int pe)
{
    if (nbytes != 0)
        if (uint8_t* r = p2p_remote(ctx, dest, source, nbytes, pe)) {
            p2p_copy(ctx, r, source, nbytes);
            return;
        }
    if (nbytes == 0) {
        collective(ctx, [&]() -> int { return CPNET_E_OK; });
        return;
    }
    queued_put(ctx, put_cmd(ctx, dest, source, nbytes, pe), source, nbytes, false);
}

/** Blocking get of nbytes (collective); <= 8 bytes travel inline. */
__device__ __forceinline__ int getmem(cpnet_ctx_t* ctx, void* dest, const void* source,
                                      uint64_t nbytes, int pe)
{
    if (nbytes != 0)
        if (const uint8_t* r = p2p_remote(ctx, source, dest, nbytes, pe)) return p2p_copy(ctx, dest, r, nbytes);
    return collective(ctx, [&]() -> int {
        if (nbytes == 0) return CPNET_E_OK;
        if (nbytes <= CPNET_INLINE_MAX) {
            uint64_t r = 0;
            const int e = call_blocking(ctx, get_cmd(ctx, dest, source, nbytes, pe, true), true, &r);
            if (e == CPNET_E_OK) write_inline(dest, r, nbytes);
            return e;
        }
        return call_blocking(ctx, get_cmd(ctx, dest, source, nbytes, pe, false), false, nullptr);
    });
}

/** Non-blocking get of nbytes into the local heap (collective). */
__device__ __forceinline__ void getmem_nbi(cpnet_ctx_t* ctx, void* dest, const void* source,
                                           uint64_t nbytes, int pe)
{
    if (nbytes != 0)
        if (const uint8_t* r = p2p_remote(ctx, source, dest, nbytes, pe)) {
            p2p_copy(ctx, dest, r, nbytes);
            return;
        }
    collective(ctx, [&]() -> int {
        if (nbytes != 0) call_nbi(ctx, get_cmd(ctx, dest, source, nbytes, pe, false));
        return CPNET_E_OK;
    });
}

/** Blocking fetch of a command's 64-bit result (collective); the value is
 *  broadcast through ctx->val (0 on failure). */
__device__ __forceinline__ uint64_t fetch_blocking(cpnet_ctx_t* ctx, const cpnet_cmd_t& c)
{
    collective(ctx, [&]() -> int {
        uint64_t r = 0;
        const int e = call_blocking(ctx, c, true, &r);
        ctx->val = e == CPNET_E_OK ? r : 0;
        return e;
    });
    return ctx->val;
}

/** Fire-and-forget enqueue of one command (collective). */
__device__ __forceinline__ void enqueue_nbi(cpnet_ctx_t* ctx, const cpnet_cmd_t& c)
{
    collective(ctx, [&]() -> int {
        call_nbi(ctx, c);
        return CPNET_E_OK;
    });
}

/** Acquire system-scope load of a 4- or 8-byte T: pairs with the release
 *  (or fence + store) that wrote the word, so what was written before it is
 *  visible after the load. ld.acquire, not "relaxed load + fence.acq_rel":
 *  a fence.acq_rel.sys is a full system-scope barrier (it waits for this
 *  SM's outstanding stores), an acquire load only orders what follows. */
template <typename T>
__device__ __forceinline__ T load_acquire(const T* p)
{
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "cpnet: waits are on 32- or 64-bit words");
    if constexpr (sizeof(T) == 8)
        return from_bits<T>(cpnet_ld_acquire_sys_u64((const uint64_t*)p));
    else
        return from_bits<T>((uint64_t)cpnet_ld_acquire_sys_u32((const uint32_t*)p));
}

/** `v cmp c` for a CPNET_CMP_* (false for an unknown one). */
template <typename T>
__device__ __forceinline__ bool compare(T v, int cmp, T c)
{
    switch (cmp) {
    case CPNET_CMP_EQ: return v == c;
    case CPNET_CMP_NE: return v != c;
    case CPNET_CMP_GT: return v > c;
    case CPNET_CMP_GE: return v >= c;
    case CPNET_CMP_LT: return v < c;
    case CPNET_CMP_LE: return v <= c;
    default: return false;
    }
}

/**
 * Poll the local word `ivar` until `*ivar cmp cmp_value` (leader only). The
 * word is written by the proxy (an incoming put/signal/AMO applied to this
 * PE's heap, or a peer kernel's peer-to-peer store) and polled with
 * acquire system-scope loads, so data delivered before the word
 * (put-with-signal: "the signal is visible only after the data", cmd.h
 * CPNET_OP_PUT_SIGNAL) is visible after the call. `*seen` gets the last
 * value read. The word is in GPU memory (the heap), so the backoff is
 * capped at CPNET_LOCAL_BACKOFF_MAX_NS. Fails with CPNET_E_BAD_OP for an
 * unknown cmp, the abort code, or CPNET_E_TIMEOUT (reported with dev_pe =
 * my_pe, dev_addr = the heap offset of ivar, dev_expected = cmp_value,
 * dev_found = the last value, dev_cmp = cmp; values zero-extended).
 */
template <typename T>
__device__ __forceinline__ int wait_until_leader(cpnet_ctx_t* ctx, const T* ivar, int cmp,
                                                 T cmp_value, T* seen)
{
    if (cmp < 0 || cmp >= CPNET_CMP_COUNT) return CPNET_E_BAD_OP;
    spin sp(CPNET_LOCAL_BACKOFF_MAX_NS);
    for (;;) {
        /* Acquire: pairs with the writer's release (the proxy's store after
         * its copies, or a peer kernel's st.release.sys of a signal). */
        const T v = load_acquire<T>(ivar);
        *seen = v;
        if (compare<T>(v, cmp, cmp_value)) return CPNET_E_OK;
        const int e = sp.pause(ctx);
        if (e != CPNET_E_OK) {
            if (e == CPNET_E_TIMEOUT)
                report_dev_error(ctx, e, ctx->my_pe, heap_offset(ctx, ivar), to_bits<T>(cmp_value),
                                 to_bits<T>(v), (uint32_t)cmp);
            return e;
        }
    }
}

/** wait_until as a collective call returning the CPNET_E_* (value in ctx->val). */
template <typename T>
__device__ __forceinline__ int wait_until(cpnet_ctx_t* ctx, const T* ivar, int cmp, T cmp_value)
{
    return collective(ctx, [&]() -> int {
        T seen = T();
        const int e = wait_until_leader<T>(ctx, ivar, cmp, cmp_value, &seen);
        ctx->val = to_bits<T>(seen);
        return e;
    });
}

/** One test of `*ivar cmp cmp_value` (collective): 1 or 0. */
template <typename T>
__device__ __forceinline__ int test(cpnet_ctx_t* ctx, const T* ivar, int cmp, T cmp_value)
{
    collective(ctx, [&]() -> int {
        if (cmp < 0 || cmp >= CPNET_CMP_COUNT) {
            ctx->val = 0;
            return CPNET_E_BAD_OP;
        }
        const bool hit = compare<T>(load_acquire<T>(ivar), cmp, cmp_value); /* as in wait_until_leader */
        ctx->val = hit ? 1 : 0;
        return CPNET_E_OK;
    });
    return (int)ctx->val;
}

} /* namespace cpnet_detail */

/* ======================================================================== */
/* Contexts and PE queries                                                   */
/* ======================================================================== */

/**
 * Create the work-group's context: claim a free queue of the handle's pool.
 * OpenSHMEM 1.5 §9.5.1 (shmem_ctx_create), one context per work-group.
 *
 * Collective over the work-group. `h` is the kernel's handle (pass the kernel
 * parameter's address); `ctx` is a `__shared__ cpnet_ctx_t` of the block.
 * The queue tried first is (linear block id) % handle.n_queues, then the
 * following ones; each claim is an atomic compare-and-swap of the queue's
 * prod.in_use from 0 to 1, so blocks of one launch, or of several concurrent
 * launches sharing the pool, never share a queue.
 *
 * Returns CPNET_E_OK; CPNET_E_NO_QUEUE when every queue of the pool is owned
 * (size the pool for the number of co-resident blocks, or destroy contexts
 * before others create theirs); CPNET_E_BAD_ADDR / CPNET_E_BAD_SIZE when the
 * handle is unusable (no pool or a misaligned one; log2_depth outside 1..16).
 * After a failure every communication call on `ctx` fails with
 * CPNET_E_NO_QUEUE instead of touching memory.
 */
__device__ inline int cpnet_ctx_create(const cpnet_handle_t* h, cpnet_ctx_t* ctx)
{
    return cpnet_detail::collective(ctx, [&]() -> int { return cpnet_detail::create(h, ctx); });
}

/**
 * Destroy the context: quiet (every operation issued on it completes), then
 * hand the queue back (its sequence numbers persist for the next owner).
 * OpenSHMEM 1.5 §9.5.3 (shmem_ctx_destroy).
 *
 * Collective over the work-group. Returns what the final quiet returns
 * (CPNET_E_OK or the error of an earlier non-blocking operation; see
 * cpnet_quiet), CPNET_E_NO_QUEUE if the context holds no queue. OpenSHMEM's
 * shmem_ctx_destroy returns nothing; ignoring the result is fine, but it is
 * the last chance to see an _nbi error on this context.
 */
__device__ inline int cpnet_ctx_destroy(cpnet_ctx_t* ctx)
{
    /* Complete this thread's peer-to-peer stores first (see cpnet_quiet). */
    if (ctx->peers != nullptr) cpnet_fence_acq_rel_sys();
    return cpnet_detail::collective(ctx, [&]() -> int { return cpnet_detail::destroy(ctx); });
}

/**
 * This PE's number, 0 <= my_pe < n_pes. OpenSHMEM 1.5 §9.1.2 (shmem_my_pe).
 * Not collective: any thread may call it after cpnet_ctx_create returned
 * (also after a failed create).
 */
__device__ inline int cpnet_my_pe(const cpnet_ctx_t* ctx) { return ctx->my_pe; }

/**
 * The number of PEs of the job. OpenSHMEM 1.5 §9.1.3 (shmem_n_pes).
 * Not collective: any thread may call it after cpnet_ctx_create returned.
 */
__device__ inline int cpnet_n_pes(const cpnet_ctx_t* ctx) { return ctx->n_pes; }

/**
 * The address at which this kernel can load and store the symmetric object
 * `dest` of PE `pe` directly, or NULL. OpenSHMEM 1.5 §9.2.8 (shmem_ptr). Not
 * NULL for this PE and for the PEs of this host whose heap is mapped (the
 * handle's peer-to-peer table, CPNET_GPU_P2P=1 and CPNET_GPU_IPC=1); NULL for
 * a PE of another host, a `pe` out of range, `dest` outside the heap, no
 * table, or a context without a queue. Loads and stores through the pointer
 * are the kernel's own: order them with the CUDA memory model (e.g. a
 * st.release.sys of a flag after the data; the target reads the flag with
 * cpnet_<T>_wait_until, which acquires). Not collective: any thread, any
 * time after cpnet_ctx_create.
 */
__device__ inline void* cpnet_ptr(const cpnet_ctx_t* ctx, const void* dest, int pe)
{
    const uint64_t base = cpnet_detail::p2p_base(ctx, pe);
    if (base == 0 || !cpnet_detail::in_heap(ctx, dest, 1)) return nullptr;
    return (void*)(base + cpnet_detail::heap_offset(ctx, dest));
}

/**
 * The abort code the host has set for this PE (CPNET_E_OK: none), for a
 * kernel's own waits (a grid barrier, a flag in its own memory), so that
 * they end with the job like cpnet's waits do. Reads the abort mirror in GPU
 * memory when the handle has claim words, and the status block's word in
 * pinned host memory (a PCIe read: keep it rare when many blocks wait, e.g.
 * once in 64 checks) when it has none or `host`. Not collective; no
 * context needed. A cpnet extension (OpenSHMEM has no abort query).
 */
__device__ inline int cpnet_abort_code(const cpnet_handle_t* h, bool host = true)
{
    return cpnet_detail::abort_word_code(cpnet_detail::pe_abort_word(
        (const uint32_t*)h->claims, h->n_queues, (const cpnet_status_t*)h->status, host));
}

/**
 * The CPNET_E_* of the last collective call on `ctx` -- the way to see the
 * error of a call that returns a value or void (cpnet_<T>_g, fetching
 * atomics, cpnet_signal_wait_until, cpnet_<T>_test; for _nbi calls it is
 * CPNET_E_OK, their errors surface at quiet). Not collective; valid in every
 * thread until the block's next collective call. cpnet extension.
 */
__device__ inline int cpnet_ctx_last_error(const cpnet_ctx_t* ctx) { return ctx->ret; }

/**
 * A blocking no-op: one command that the proxy completes as soon as it sees
 * it; the round-trip probe of the queue (latency benchmark). cpnet extension.
 * Collective over the work-group. Returns CPNET_E_OK or a wait failure
 * (abort code, CPNET_E_TIMEOUT).
 */
__device__ inline int cpnet_nop(cpnet_ctx_t* ctx)
{
    return cpnet_detail::collective(ctx, [&]() -> int {
        cpnet_cmd_t c = {};
        c.opcode = CPNET_OP_NOP;
        return cpnet_detail::call_blocking(ctx, c, false, nullptr);
    });
}

/* The rest of the API, one file per subject, each included here (and each
 * includable alone: it includes this file first). */
#include <cpnet/rma.cuh>
#include <cpnet/amo.cuh>
/* Teams and team collectives (OpenSHMEM 1.5 §9.4, §9.9): a separate file. */
#include <cpnet/team.cuh>

#endif /* CPNET_DEVICE_CUH */
