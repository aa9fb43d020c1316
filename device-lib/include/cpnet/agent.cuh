/*
 * cpnet/agent.cuh -- the landing agent: the device-side receive agent of a
 * GPU PE's network path (THE LANDING AGENT in cmd.h).
 *
 * A proxy thread cannot store into GPU memory, and a CUDA copy per message
 * costs it a driver call and an event. Instead it writes 64-byte records
 * into its landing ring (pinned host memory mapped into the GPU, in LL form:
 * every 8-byte word tagged with the record's seq) and this
 * one-block kernel applies them: received puts and their signals, AMOs and
 * ADD signals (with device atomics), and copies from the heap into host
 * staging. The runtime compiles it once per PE with NVRTC; the proxy thread
 * launches it when records wait and it is not running; it exits by itself
 * after `idle_ns` without records, so a device synchronize never waits on
 * it for long, and it holds one block of one SM only while traffic flows.
 *
 * Protocol steps A1..A7 are those of cmd.h. Include this header in exactly
 * one translation unit together with the kernel wrapper:
 *
 *     #include <cpnet/agent.cuh>
 *     extern "C" __global__ void __launch_bounds__(CPNET_AGENT_THREADS, 8)
 *     cpnet_agent(cpnet_agent_ctl_t* c, uint64_t* r, uint32_t l,
 *                 uint8_t* h, uint64_t s, uint64_t i)
 *     { cpnet_agent_run(c, r, l, h, s, i); }
 */
#ifndef CPNET_AGENT_CUH
#define CPNET_AGENT_CUH

#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "cpnet/agent.cuh is CUDA device code: compile it with nvcc or NVRTC"
#endif

#include <cpnet/cmd.h>
#include <cpnet/ptx.cuh>

namespace cpnet_agent_detail {

/** The minimum AMOs (a cpnet extension): atomicMin on the signed view of
 *  the word for CPNET_T_INT32/INT64, on the unsigned one otherwise. */
__device__ __forceinline__ unsigned int amo_min(unsigned int* p, bool is_signed, unsigned int v)
{
    return is_signed ? (unsigned int)atomicMin((int*)p, (int)v) : atomicMin(p, v);
}
__device__ __forceinline__ unsigned long long amo_min(unsigned long long* p, bool is_signed, unsigned long long v)
{
    return is_signed ? (unsigned long long)atomicMin((long long*)p, (long long)v) : atomicMin(p, v);
}

/** AMO `op` of 32- or 64-bit unsigned T at `p` (`is_signed`: the record's
 *  type is CPNET_T_INT32/INT64, which only the minimum reads); returns the
 *  old value. */
template <typename T>
__device__ __forceinline__ T amo(T* p, uint8_t op, T v, T cmp, bool is_signed)
{
    switch (op) {
        case CPNET_AMO_FETCH: return atomicAdd(p, (T)0);
        case CPNET_AMO_SET:
        case CPNET_AMO_SWAP: return atomicExch(p, v);
        case CPNET_AMO_COMPARE_SWAP: return atomicCAS(p, cmp, v);
        case CPNET_AMO_FETCH_ADD:
        case CPNET_AMO_ADD: return atomicAdd(p, v);
        case CPNET_AMO_FETCH_AND:
        case CPNET_AMO_AND: return atomicAnd(p, v);
        case CPNET_AMO_FETCH_OR:
        case CPNET_AMO_OR: return atomicOr(p, v);
        case CPNET_AMO_FETCH_XOR:
        case CPNET_AMO_XOR: return atomicXor(p, v);
        case CPNET_AMO_FETCH_MIN:
        case CPNET_AMO_MIN: return amo_min(p, is_signed, v);
        default: return 0;
    }
}

}  // namespace cpnet_agent_detail

/** The agent's loop (every thread of one block of CPNET_AGENT_THREADS).
 *  `ctl`/`ring`: the landing ring (device-visible addresses of pinned host
 *  memory), 1 << log2_depth slots of CPNET_AGENT_SLOT_BYTES (cmd.h, LL form); `heap`/`heap_size`: this PE's heap;
 *  `idle_ns`: exit after this long without a record. */
__device__ __forceinline__ void cpnet_agent_run(cpnet_agent_ctl_t* ctl, uint64_t* ring,
                                                uint32_t log2_depth, uint8_t* heap, uint64_t heap_size,
                                                uint64_t idle_ns)
{
    using namespace cpnet_agent_detail;
    __shared__ cpnet_agent_rec_t rec;
    __shared__ int quit;
    const bool leader = threadIdx.x == 0;
    const uint64_t mask = (1ull << log2_depth) - 1;
    const uint64_t slot_words = CPNET_AGENT_SLOT_BYTES / 8;
    // Only this agent writes `done`, and the one before it on the stream
    // has ended (kernels of one stream never overlap): a relaxed load sees
    // its last value.
    uint64_t next = cpnet_ld_relaxed_sys_u64(&ctl->done);
    // Time sums (leader only), flushed to the control block at exit.
    uint64_t t_read = 0, t_apply = 0, t_publish = 0, t1 = 0;
    for (;;) {
        uint64_t* const slot = ring + (next & mask) * slot_words;
        // A4: threads 0..13 poll the record's 14 tagged halves at once (one
        // coalesced read of 112 bytes per round); the block counts the
        // matching tags. All 14: the record is complete. A torn view (the
        // proxy's stores still arriving) is polled again.
        const uint32_t tag = (uint32_t)(next + 1);
        const uint64_t since = leader ? cpnet_globaltimer_ns() : 0;
        uint64_t first_seen = 0;
        uint32_t polls = 0;
        bool go = true;
        for (;;) {
            int ok = 0;
            if (threadIdx.x < CPNET_AGENT_LL_WORDS) {
                // Acquire, pairs with the proxy's release store of this word
                // (A2); the count's barrier below carries every thread's
                // acquire to the whole block.
                const uint64_t v = cpnet_ld_acquire_sys_u64(slot + threadIdx.x);
                ok = (uint32_t)(v >> 32) == tag;
                if (ok) ((uint32_t*)&rec)[threadIdx.x] = (uint32_t)v;
            }
            const int n = __syncthreads_count(ok);
            if (n == CPNET_AGENT_LL_WORDS) break;
            if (leader && n > 0 && first_seen == 0) first_seen = cpnet_globaltimer_ns();
            if ((++polls & 63) == 0) {
                // Every thread counts the same polls: the block decides together.
                if (leader)
                    quit = cpnet_ld_relaxed_sys_u32(&ctl->stop) != 0 || cpnet_globaltimer_ns() - since > idle_ns;
                __syncthreads();
                go = !quit;
                __syncthreads();
                if (!go) break;
            }
        }
        if (!go) break;
        if (leader) {
            t1 = cpnet_globaltimer_ns();
            if (first_seen != 0) t_read += t1 - first_seen;
        }
        const uint64_t size = rec.size, dst = rec.dst;
        bool ok = true;
        switch (rec.kind) {
            case CPNET_AGENT_K_PUT: {
                ok = dst <= heap_size && size <= heap_size - dst;
                if (ok && (rec.flags & CPNET_AGENT_F_SIGNAL))
                    ok = rec.sig <= heap_size - 8 && (rec.sig & 7) == 0;
                if (!ok) break;
                if (rec.flags & CPNET_AGENT_F_INLINE) {
                    if (leader)
                        for (uint64_t i = 0; i < size && i < 8; ++i) heap[dst + i] = (uint8_t)(rec.value >> (8 * i));
                } else if (size > 0) {
                    cpnet_block_copy_cv(heap + dst, (const uint8_t*)rec.src, size);
                }
                if (rec.flags & CPNET_AGENT_F_SIGNAL) {
                    // The block's data stores happen before the leader's
                    // signal: a block barrier, then a release at GPU scope
                    // (cumulative over what the barrier ordered). Only this
                    // GPU's kernels wait on a word of this heap, and their
                    // ld.acquire.sys pairs with it. GPU scope, not system:
                    // a system-scope membar costs microseconds here.
                    __syncthreads();
                    if (leader) {
                        uint64_t* s = (uint64_t*)(heap + rec.sig);
                        if (rec.sub == CPNET_SIGNAL_ADD) {
                            cpnet_fence_acq_rel_gpu();
                            atomicAdd((unsigned long long*)s, (unsigned long long)rec.signal);
                        } else {
                            cpnet_st_release_gpu_u64(s, rec.signal);
                        }
                    }
                }
                break;
            }
            case CPNET_AGENT_K_AMO: {
                const uint64_t es = (rec.ty == CPNET_T_INT64 || rec.ty == CPNET_T_UINT64) ? 8 : 4;
                ok = rec.ty > CPNET_T_NONE && rec.ty < CPNET_T_COUNT && dst <= heap_size - es && (dst & (es - 1)) == 0;
                if (ok && leader) {
                    uint64_t old;
                    const bool sgn = rec.ty == CPNET_T_INT32 || rec.ty == CPNET_T_INT64;
                    if (es == 8)
                        old = amo<unsigned long long>((unsigned long long*)(heap + dst), rec.sub, rec.value, rec.signal,
                                                      sgn);
                    else
                        old = amo<unsigned int>((unsigned int*)(heap + dst), rec.sub, (unsigned int)rec.value,
                                                (unsigned int)rec.signal, sgn);
                    // The old value goes to the slot's result word; A5's
                    // fence and release publish it with `done`.
                    cpnet_st_relaxed_sys_u64(slot + CPNET_AGENT_SLOT_OFF_RESULT / 8, old);
                }
                break;
            }
            case CPNET_AGENT_K_COPY_OUT:
                ok = dst <= heap_size && size <= heap_size - dst;
                if (ok && size > 0) cpnet_block_copy_cv((uint8_t*)rec.src, heap + dst, size);
                break;
            default:
                ok = false;
        }
        __syncthreads();
        if (leader) {
            const uint64_t t2 = cpnet_globaltimer_ns();
            t_apply += t2 - t1;
            // The leader is the only writer of `bad` (no system-scope atomics
            // on mapped host memory: PCIe GPUs may lack them).
            if (!ok) cpnet_st_relaxed_sys_u64(&ctl->bad, cpnet_ld_relaxed_sys_u64(&ctl->bad) + 1);
            // A5: every thread's stores (heap, host staging, the result word)
            // precede the barrier above; the leader's release store of
            // `done` at system scope (a fence plus the store, cumulative over
            // what the barrier ordered) publishes them to the proxy, whose
            // acquire load of `done` pairs with it. One system-scope membar
            // per record, the only one.
            cpnet_st_release_sys_u64(&ctl->done, next + 1);
            t_publish += cpnet_globaltimer_ns() - t2;
        }
        ++next;
    }
    if (leader) {
        cpnet_st_relaxed_sys_u64(&ctl->t_read, cpnet_ld_relaxed_sys_u64(&ctl->t_read) + t_read);
        cpnet_st_relaxed_sys_u64(&ctl->t_apply, cpnet_ld_relaxed_sys_u64(&ctl->t_apply) + t_apply);
        cpnet_st_relaxed_sys_u64(&ctl->t_publish, cpnet_ld_relaxed_sys_u64(&ctl->t_publish) + t_publish);
    }
    // A7: the last thing this agent does (pairs with the proxy's acquire
    // load of `running` before it launches another).
    if (leader) cpnet_st_release_sys_u32(&ctl->running, 0);
}

#endif /* CPNET_AGENT_CUH */
