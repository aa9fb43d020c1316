/*
 * cpnet/cmd.h -- the one definition of every layout that the GPU (or a CPU
 * work-group) and the proxy share: the 64-byte command slot, the queue's
 * control and producer blocks, the kernel handle, and every opcode, flag,
 * type, operation and error code carried in them.
 *
 * This header is the source of truth. It is valid C11, C++11, CUDA and NVRTC.
 * The Rust mirror (device-lib/src/layout.rs) is generated from the `#define`s
 * below by device-lib/build.rs and asserts, at compile time, the size and every
 * offset of each struct against the same numbers; this header `static_assert`s
 * them too. Change a number here and both sides follow or fail to build.
 *
 * The queue protocol (who writes what, with which ordering) is written once, in
 * the block comment "THE QUEUE PROTOCOL" below; producer and consumer code refer
 * to it by the names P0..P4 and C1..C5.
 */
#ifndef CPNET_CMD_H
#define CPNET_CMD_H

#if defined(__CUDACC_RTC__)
/* NVRTC has no <stdint.h> of its own: define the fixed-width types we use. */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define CPNET_STATIC_ASSERT(c, m) static_assert(c, m)
/* NVRTC has no <cstddef>; __builtin_offsetof is accepted from NVRTC 13.5
 * (13.0 rejects it: "type name is not allowed", seen on the H200 machine).
 * Older NVRTC checks the sizes only; every C/C++ compile (build.rs compiles
 * this header with the host compiler at each build) checks the offsets too. */
#if (__CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__) >= 1305
#define CPNET_OFFSETOF(t, f) __builtin_offsetof(t, f)
#else
#define CPNET_NO_OFFSET_CHECKS 1
#endif
#elif defined(__cplusplus)
#include <cstddef>
#include <cstdint>
#define CPNET_STATIC_ASSERT(c, m) static_assert(c, m)
#define CPNET_OFFSETOF(t, f) offsetof(t, f)
#else
#include <stddef.h>
#include <stdint.h>
#define CPNET_STATIC_ASSERT(c, m) _Static_assert(c, m)
#define CPNET_OFFSETOF(t, f) offsetof(t, f)
#endif

/* ------------------------------------------------------------------------ */
/* Sizes and limits                                                         */
/* ------------------------------------------------------------------------ */

/** Bytes in one command slot: one cache line. */
#define CPNET_SLOT_BYTES 64
/** Default ring depth in slots (ComP-Net paper, Sec. 4.2.1). */
#define CPNET_DEFAULT_DEPTH 64
/** Smallest and largest accepted ring depth (slots, powers of two). */
#define CPNET_MIN_DEPTH 2
#define CPNET_MAX_DEPTH 65536
/** Largest payload carried inline in a slot (bytes). */
#define CPNET_INLINE_MAX 8

/* ------------------------------------------------------------------------ */
/* Opcodes (cpnet_cmd_t.opcode)                                             */
/* ------------------------------------------------------------------------ */

/** No operation: completes as soon as the proxy sees it (round-trip probe). */
#define CPNET_OP_NOP 0
/** Put `size` bytes from local heap offset `src` (or inline `value`) to `dst` at `pe`. */
#define CPNET_OP_PUT 1
/** Get `size` bytes from heap offset `src` at `pe` to local heap offset `dst`
 *  (or, with CPNET_F_INLINE, into the control block's `result`). */
#define CPNET_OP_GET 2
/** PUT, then update the signal word at heap offset `sig` of `pe` with `cond`
 *  by `subop` (CPNET_SIGNAL_SET/ADD); the signal is visible only after the data. */
#define CPNET_OP_PUT_SIGNAL 3
/** Atomic memory operation `subop` (CPNET_AMO_*) of type `dtype` on heap
 *  offset `dst` at `pe`, operand `value`, compare `cond`. Fetching AMOs return
 *  the old value in the control block's `result`. */
#define CPNET_OP_AMO 4
/** Order: every earlier PUT/PUT_SIGNAL/AMO of this queue to each PE is
 *  delivered before any later one to the same PE (OpenSHMEM 1.5 sec. 9.9.1). */
#define CPNET_OP_FENCE 5
/** Complete every earlier operation of this queue (OpenSHMEM 1.5 sec. 9.9.2).
 *  The producer also waits on `completed`; the command lets the proxy flush. */
#define CPNET_OP_QUIET 6
/** quiet, then a barrier across all PEs (OpenSHMEM 1.5 sec. 9.8.2). */
#define CPNET_OP_BARRIER_ALL 7
/** One past the last opcode. */
#define CPNET_OP_COUNT 8

/* ------------------------------------------------------------------------ */
/* Flags (cpnet_cmd_t.flags, bit set)                                       */
/* ------------------------------------------------------------------------ */

/** The producer waits for this command's completion (blocking call). */
#define CPNET_F_BLOCKING 1
/** Payload inline: PUT/PUT_SIGNAL data is in `value` (size <= 8); GET
 *  returns its data in the control block's `result` (size <= 8). */
#define CPNET_F_INLINE 2
/** Payload staged: PUT/PUT_SIGNAL data is in the queue's payload slot for
 *  this command's seq (P0 below; size <= handle.payload_bytes), not in the
 *  heap; `src` is zero. Never together with CPNET_F_INLINE. */
#define CPNET_F_PAYLOAD 4
/** Every flag bit defined; any other bit set is a malformed command. */
#define CPNET_F_ALL 7

/* ------------------------------------------------------------------------ */
/* AMO element types (cpnet_cmd_t.dtype)                                    */
/* ------------------------------------------------------------------------ */

#define CPNET_T_NONE 0
#define CPNET_T_INT32 1
#define CPNET_T_UINT32 2
#define CPNET_T_INT64 3
#define CPNET_T_UINT64 4
#define CPNET_T_COUNT 5

/* ------------------------------------------------------------------------ */
/* AMO operations (cpnet_cmd_t.subop when opcode == CPNET_OP_AMO)           */
/* OpenSHMEM 1.5 sec. 9.7                                                   */
/* ------------------------------------------------------------------------ */

#define CPNET_AMO_FETCH 0
#define CPNET_AMO_SET 1
#define CPNET_AMO_SWAP 2
#define CPNET_AMO_COMPARE_SWAP 3
#define CPNET_AMO_FETCH_ADD 4
#define CPNET_AMO_ADD 5
#define CPNET_AMO_FETCH_AND 6
#define CPNET_AMO_AND 7
#define CPNET_AMO_FETCH_OR 8
#define CPNET_AMO_OR 9
#define CPNET_AMO_FETCH_XOR 10
#define CPNET_AMO_XOR 11
/* cpnet extension to OpenSHMEM 1.5 (which has no minimum AMO): the word
 * becomes min(word, value), compared as `dtype` says (signed for
 * CPNET_T_INT32/INT64, unsigned for CPNET_T_UINT32/UINT64). FETCH_MIN
 * returns the old value. Floats travel as ORDERED INTEGERS (cpnet_f32_ord /
 * cpnet_f64_ord in device.cuh, cpnet_device::ordered in Rust): the bit
 * pattern with the sign bit flipped for x >= +0 and every bit flipped for
 * x < 0 (and -0.0 mapped to +0.0), so unsigned min of the encodings is the
 * float min (NaNs excluded); use CPNET_T_UINT32 / CPNET_T_UINT64 for them. */
#define CPNET_AMO_FETCH_MIN 12
#define CPNET_AMO_MIN 13
#define CPNET_AMO_COUNT 14

/* ------------------------------------------------------------------------ */
/* Signal operations (cpnet_cmd_t.subop when opcode == CPNET_OP_PUT_SIGNAL) */
/* OpenSHMEM 1.5 sec. 9.8.1: SHMEM_SIGNAL_SET / SHMEM_SIGNAL_ADD            */
/* ------------------------------------------------------------------------ */

#define CPNET_SIGNAL_SET 0
#define CPNET_SIGNAL_ADD 1
#define CPNET_SIGNAL_COUNT 2

/* ------------------------------------------------------------------------ */
/* Point-to-point comparisons (wait_until / test), OpenSHMEM 1.5 sec. 9.10  */
/* ------------------------------------------------------------------------ */

#define CPNET_CMP_EQ 0
#define CPNET_CMP_NE 1
#define CPNET_CMP_GT 2
#define CPNET_CMP_GE 3
#define CPNET_CMP_LT 4
#define CPNET_CMP_LE 5
#define CPNET_CMP_COUNT 6

/* ------------------------------------------------------------------------ */
/* Error codes (cpnet_queue_ctl_t.error; also the host API's error kinds)   */
/* ------------------------------------------------------------------------ */

#define CPNET_E_OK 0
/** The target PE is outside 0..n_pes. */
#define CPNET_E_BAD_PE 1
/** An address (offset + size) is outside the symmetric heap. */
#define CPNET_E_BAD_ADDR 2
/** An AMO or signal address is not aligned to its element size. */
#define CPNET_E_BAD_ALIGN 3
/** A size is invalid: inline payload over 8 bytes, AMO size mismatch. */
#define CPNET_E_BAD_SIZE 4
/** Unknown opcode, flag, type or sub-operation. */
#define CPNET_E_BAD_OP 5
/** The target PE died or left. */
#define CPNET_E_PEER_DEAD 6
/** A wait passed its timeout. */
#define CPNET_E_TIMEOUT 7
/** The fabric reported an error for this operation. */
#define CPNET_E_FABRIC 8
/** The job is ending (another error, a dead peer, finalize): abort waits. */
#define CPNET_E_ABORTED 9
/** ctx_create found no free queue in the pool. */
#define CPNET_E_NO_QUEUE 10
/** A team handle that names no live team (never created, destroyed,
 *  CPNET_TEAM_INVALID), or a team collective called by a PE outside the team. */
#define CPNET_E_BAD_TEAM 11
#define CPNET_E_COUNT 12

/* ------------------------------------------------------------------------ */
/* THE QUEUE PROTOCOL                                                       */
/* ------------------------------------------------------------------------ */
/*
 * One queue = one work-group context = one single-producer single-consumer
 * ring. In memory (host-pinned and mapped into the GPU by default):
 *
 *   +0                      cpnet_queue_ctl_t   written by the consumer only
 *   +64                     cpnet_queue_prod_t  written by the producer only
 *   +128 + i*64, i<depth    cpnet_cmd_t slot[i]
 *
 * Sequence numbers. The producer numbers its commands 0, 1, 2, ... (seq); the
 * command seq lives in slot[seq & (depth-1)]. Its commit word is seq + 1, so a
 * zeroed slot (commit 0) is never valid and a slot still holding the previous
 * lap (commit seq + 1 - depth) is never taken as new: the commit word carries
 * the lap, lap = seq >> log2(depth).
 *
 * Producer (one thread of the work-group, or a CPU work-group):
 *   P1  Space. It may write seq when seq - cached_consumed < depth. Otherwise
 *       it re-reads ctl.consumed with ACQUIRE (pairs with C3) and retries with
 *       backoff; the acquire makes the consumer's reads of that slot happen
 *       before the producer's overwrite.
 *   P2  Fill. It writes words 0..6 of the slot with plain/relaxed stores.
 *   P3  Publish. It writes the commit word (word 7) = seq + 1 with RELEASE at
 *       system scope (st.release.sys.global.u64 on the GPU, Ordering::Release
 *       on the CPU); pairs with C1. Everything in P2 is visible before it.
 *   P4  Completion. A blocking call waits until ctl.completed > seq, loaded
 *       with ACQUIRE at system scope (pairs with C4); then ctl.result, and
 *       ctl.error / ctl.error_seq, are valid for it. quiet waits until
 *       ctl.completed >= the producer's write index, the same way.
 *       A blocking call may instead wait until ctl.reply >> 8 == seq + 1,
 *       loaded with ACQUIRE at system scope (pairs with C5): one word says
 *       both "complete" and its CPNET_E_* (reply & 0xff), and ctl.result is
 *       then valid for it. That saves the GPU a dependent PCIe read per
 *       blocking call; the GPU producer (queue.cuh) does this. Only one
 *       blocking command per queue is ever outstanding (its producer waits),
 *       so the word is never overwritten before it is read.
 *
 * Payload slots (GPU PEs whose handle has payload_bytes != 0). Queue q owns
 * depth payload slots of payload_bytes each in pinned host memory, at
 * handle.payload + ((q << log2_depth) + i) * payload_bytes, i < depth; the
 * command seq may carry its put data in slot i = seq & (depth-1)
 * (CPNET_F_PAYLOAD), so a small put leaves the GPU with the command and the
 * proxy sends it from host memory without a copy out of the heap:
 *   P0  Payload. Before writing payload slot i for seq, the producer waits
 *       until ctl.completed >= seq + 1 - depth, loaded with ACQUIRE (pairs
 *       with C4): the proxy has finished with the slot's previous command
 *       (sent or copied its data) before the overwrite. It writes the data
 *       (any threads of the work-group, plain stores) before P3; P3's release
 *       (cumulative over the block's stores ordered by a block barrier)
 *       makes the data visible with the command. The slot belongs to the
 *       proxy from C1 until that command completes (C4), not only until C3.
 *
 * Consumer (the proxy service thread owning the queue):
 *   C1  Poll. It loads slot[next & mask].commit with ACQUIRE (pairs with P3).
 *       Equal to next + 1: the slot is published and its words 0..6 are
 *       visible. Anything else: nothing new.
 *   C2  Take. It copies the slot out and validates it.
 *   C3  Free. It stores ctl.consumed = next + 1 with RELEASE (pairs with P1),
 *       after C2's reads: the producer may now overwrite the slot.
 *   C4  Complete. Operations finish out of order; the consumer keeps the
 *       watermark "every command below `completed` is complete". Before it
 *       advances the watermark past a command it writes that command's
 *       result / result_seq (fetching ops) and error / error_seq (rejected
 *       ops) with relaxed stores, then stores ctl.completed with RELEASE
 *       (pairs with P4). A rejected command still completes, so no producer
 *       waits forever on bad input; the proxy also reports it to the host.
 *   C5  Reply. For a command flagged CPNET_F_BLOCKING, after C4's relaxed
 *       stores of its result / error, the consumer stores ctl.reply =
 *       (seq + 1) << 8 | its CPNET_E_* (0: success) with RELEASE (pairs with
 *       P4's reply variant), before it advances `completed`.
 *
 * Scopes. Producer and consumer are different agents (GPU and CPU), so every
 * ordered access above is at system scope; on the CPU, Acquire/Release are
 * enough on x86-64 and AArch64 for host-pinned memory written by the GPU over
 * PCIe/NVLink-C2C, which is coherent. No access relies on volatile alone.
 *
 * A context claims a queue with an atomic compare-and-swap of prod.in_use from
 * 0 to 1 (ctx_create) and returns it with a release store of 0 (ctx_destroy,
 * after quiet). write_idx and cached_consumed persist in the producer block
 * across destroy/create, so sequence numbers never restart on a live queue.
 *
 * Claim signal. After setting prod.in_use = 1, a claiming GPU context adds 1
 * to status.claim_gen with a release RMW (where the handle has a status
 * block). A proxy thread loads claim_gen with acquire each pass and rereads
 * the in_use words of its queues when it moved: the acquire pairs with that
 * release, so the reread sees in_use = 1. Without it the proxy rereads them
 * on a slow timer only, and a first command waits for that.
 */

/* ------------------------------------------------------------------------ */
/* The command slot                                                         */
/* ------------------------------------------------------------------------ */

#define CPNET_CMD_OFF_OPCODE 0
#define CPNET_CMD_OFF_FLAGS 1
#define CPNET_CMD_OFF_DTYPE 2
#define CPNET_CMD_OFF_SUBOP 3
#define CPNET_CMD_OFF_PE 4
#define CPNET_CMD_OFF_SIZE 8
#define CPNET_CMD_OFF_DST 16
#define CPNET_CMD_OFF_SRC 24
#define CPNET_CMD_OFF_VALUE 32
#define CPNET_CMD_OFF_COND 40
#define CPNET_CMD_OFF_SIG 48
#define CPNET_CMD_OFF_COMMIT 56
/** The commit word's index in the slot, counted in 8-byte words. */
#define CPNET_CMD_COMMIT_WORD 7

/** One command: 64 bytes, one cache line. Offsets are heap offsets (bytes
 *  from the start of the symmetric heap), never raw pointers. */
typedef struct cpnet_cmd {
    uint8_t opcode;   /**< CPNET_OP_* */
    uint8_t flags;    /**< CPNET_F_* bits */
    uint8_t dtype;    /**< CPNET_T_* for AMOs, CPNET_T_NONE otherwise */
    uint8_t subop;    /**< CPNET_AMO_* or CPNET_SIGNAL_* */
    int32_t pe;       /**< target PE (rank), 0 <= pe < n_pes */
    uint64_t size;    /**< payload bytes (PUT, GET, PUT_SIGNAL); element bytes for AMO */
    uint64_t dst;     /**< heap offset written: at `pe` (PUT, AMO), local (GET) */
    uint64_t src;     /**< heap offset read: local (PUT), at `pe` (GET) */
    uint64_t value;   /**< inline payload (little-endian, low `size` bytes) or AMO operand */
    uint64_t cond;    /**< AMO compare value (COMPARE_SWAP) or signal value (PUT_SIGNAL) */
    uint64_t sig;     /**< heap offset of the signal word at `pe` (PUT_SIGNAL) */
    uint64_t commit;  /**< seq + 1, written last with release (see THE QUEUE PROTOCOL) */
} cpnet_cmd_t;

/* ------------------------------------------------------------------------ */
/* The queue's control block: written by the consumer (proxy) only         */
/* ------------------------------------------------------------------------ */

#define CPNET_CTL_BYTES 64
#define CPNET_CTL_OFF_CONSUMED 0
#define CPNET_CTL_OFF_COMPLETED 8
#define CPNET_CTL_OFF_RESULT 16
#define CPNET_CTL_OFF_RESULT_SEQ 24
#define CPNET_CTL_OFF_ERROR_SEQ 32
#define CPNET_CTL_OFF_ERROR 40
#define CPNET_CTL_OFF_ABORT 48
#define CPNET_CTL_OFF_REPLY 56

typedef struct cpnet_queue_ctl {
    uint64_t consumed;    /**< commands taken; slots below are free (C3, release) */
    uint64_t completed;   /**< every command with seq < completed is complete (C4, release) */
    uint64_t result;      /**< fetched value of the blocking command result_seq - 1 */
    uint64_t result_seq;  /**< seq + 1 of the command whose result is in `result` */
    uint64_t error_seq;   /**< seq + 1 of the last rejected command, 0 if none */
    int32_t error;        /**< CPNET_E_* of that command (the word at 40 is written whole, 8 bytes) */
    uint32_t error_pad;   /**< zero */
    uint64_t abort;       /**< nonzero (a CPNET_E_*): the job is ending, every wait on this queue stops */
    uint64_t reply;       /**< (seq + 1) << 8 | CPNET_E_* of the last completed BLOCKING command (C5, release) */
} cpnet_queue_ctl_t;

/* ------------------------------------------------------------------------ */
/* The queue's producer block: written by the producer only                 */
/* ------------------------------------------------------------------------ */

#define CPNET_PROD_BYTES 64
#define CPNET_PROD_OFF_WRITE_IDX 0
#define CPNET_PROD_OFF_CACHED_CONSUMED 8
#define CPNET_PROD_OFF_IN_USE 16
#define CPNET_PROD_OFF_OWNER 20

typedef struct cpnet_queue_prod {
    uint64_t write_idx;        /**< seq of the next command (persisted across contexts) */
    uint64_t cached_consumed;  /**< last ctl.consumed the producer read (P1) */
    uint32_t in_use;           /**< 1 while a context owns the queue (CAS in ctx_create) */
    uint32_t owner;            /**< work-group id of the owner, for error reports */
    uint64_t reserved[5];
} cpnet_queue_prod_t;

/** Bytes before slot 0 in a queue. */
#define CPNET_QUEUE_HEADER_BYTES 128
#define CPNET_QUEUE_OFF_CTL 0
#define CPNET_QUEUE_OFF_PROD 64
#define CPNET_QUEUE_OFF_SLOTS 128

/* ------------------------------------------------------------------------ */
/* The handle a kernel receives (passed by value)                           */
/* ------------------------------------------------------------------------ */

#define CPNET_HANDLE_BYTES 96
#define CPNET_HANDLE_OFF_MY_PE 0
#define CPNET_HANDLE_OFF_N_PES 4
#define CPNET_HANDLE_OFF_HEAP_BASE 8
#define CPNET_HANDLE_OFF_HEAP_SIZE 16
#define CPNET_HANDLE_OFF_QUEUES 24
#define CPNET_HANDLE_OFF_N_QUEUES 32
#define CPNET_HANDLE_OFF_LOG2_DEPTH 36
#define CPNET_HANDLE_OFF_WAIT_TIMEOUT_NS 40
#define CPNET_HANDLE_OFF_STATUS 48
#define CPNET_HANDLE_OFF_CLAIMS 56
#define CPNET_HANDLE_OFF_PEERS 64
#define CPNET_HANDLE_OFF_PAYLOAD 72
#define CPNET_HANDLE_OFF_PAYLOAD_BYTES 80
#define CPNET_HANDLE_OFF_N_TEAMS 84
#define CPNET_HANDLE_OFF_TEAMS 88

/* handle.claims: words [0, n_queues) are the queues' claim words; after
 * them, at n_queues + CPNET_CLAIM_AFTER_*, the status report's claim word and
 * the abort mirror (a CPNET_E_*, 0: none); CPNET_CLAIM_EXTRA words in all. */
#define CPNET_CLAIM_AFTER_REPORT 0
#define CPNET_CLAIM_AFTER_ABORT 1
#define CPNET_CLAIM_EXTRA 2
/** Index of the status report's claim word in handle.claims. */
#define CPNET_CLAIM_REPORT(n_queues) ((n_queues) + CPNET_CLAIM_AFTER_REPORT)
/** Index of the abort mirror in handle.claims. */
#define CPNET_CLAIM_ABORT(n_queues) ((n_queues) + CPNET_CLAIM_AFTER_ABORT)
/** uint32 words at handle.claims for n_queues queues. */
#define CPNET_CLAIM_WORDS(n_queues) ((n_queues) + CPNET_CLAIM_EXTRA)

typedef struct cpnet_handle {
    int32_t my_pe;             /**< this PE */
    int32_t n_pes;             /**< number of PEs */
    uint64_t heap_base;        /**< address of this PE's symmetric heap, as the kernel sees it */
    uint64_t heap_size;        /**< bytes in the symmetric heap (same on every PE) */
    uint64_t queues;           /**< address of queue 0 of the pool, as the kernel sees it */
    uint32_t n_queues;         /**< queues in the pool; queue i starts at queues + i * stride */
    uint32_t log2_depth;       /**< slots per queue = 1 << log2_depth */
    uint64_t wait_timeout_ns;  /**< device-side wait timeout in ns (0: wait forever) */
    uint64_t status;           /**< address of the cpnet_status_t the proxy keeps, as the kernel sees it */
    uint64_t claims;           /**< address of CPNET_CLAIM_WORDS(n_queues) zeroed uint32 words in GPU
                                    memory: the queues' claim words, the status report's claim word
                                    (CPNET_CLAIM_REPORT), and the abort mirror (CPNET_CLAIM_ABORT): the host
                                    copies status.abort there when it sets it, so that waits poll GPU memory
                                    instead of one host cache line shared by every block; 0: claim with
                                    prod.in_use and status.dev_error and read aborts from host memory instead
                                    (system-scope atomics on mapped host memory, which GPUs on PCIe without
                                    host-native atomics do not support) */
    uint64_t peers;            /**< address of n_pes uint64 words in GPU memory, the peer-to-peer
                                    table: word i is where this kernel reaches PE i's symmetric heap
                                    with its own loads and stores (its own heap for i == my_pe; a CUDA
                                    IPC mapping, over NVLink or PCIe, for a PE on this host), 0 where
                                    it cannot (another host); operations to such a PE go through the
                                    queue. 0: no table, every operation goes through the queue (CPU
                                    PEs, CPNET_GPU_P2P=0) */
    uint64_t payload;          /**< address of the payload slots (P0), as the kernel sees it: pinned host
                                    memory, n_queues * depth * payload_bytes bytes; 0: none */
    uint32_t payload_bytes;    /**< bytes per payload slot (a power of two >= 16; 0: no payload slots,
                                    puts over CPNET_INLINE_MAX bytes are read from the heap) */
    uint32_t n_teams;          /**< entries of the team table at `teams` (CPNET_MAX_TEAMS; 0: no table,
                                    every team collective fails with CPNET_E_BAD_TEAM) */
    uint64_t teams;            /**< address of the team table, as the kernel sees it: n_teams
                                    cpnet_team_desc_t in GPU memory, entry t describing team handle t
                                    (CPNET_TEAM_WORLD = 0, CPNET_TEAM_NODE = 1); the host rewrites an
                                    entry only while no kernel uses that team (create, destroy) */
} cpnet_handle_t;

/* ------------------------------------------------------------------------ */
/* The PE-wide status word block: written by the host/proxy, read by kernels */
/* and written by kernels to report a device-side error (timeout)            */
/* ------------------------------------------------------------------------ */

#define CPNET_STATUS_BYTES 64
#define CPNET_STATUS_OFF_ABORT 0
#define CPNET_STATUS_OFF_DEV_ERROR 4
#define CPNET_STATUS_OFF_DEV_PE 8
#define CPNET_STATUS_OFF_DEV_WG 12
#define CPNET_STATUS_OFF_DEV_ADDR 16
#define CPNET_STATUS_OFF_DEV_EXPECTED 24
#define CPNET_STATUS_OFF_DEV_FOUND 32
#define CPNET_STATUS_OFF_DEV_CMP 40
#define CPNET_STATUS_OFF_CLAIM_GEN 44

typedef struct cpnet_status {
    uint32_t abort;        /**< nonzero (a CPNET_E_*): every device wait returns at once */
    uint32_t dev_error;    /**< first device-side error (CPNET_E_*), claimed by CAS from 0 */
    int32_t dev_pe;        /**< the PE the failed wait/operation concerned */
    uint32_t dev_wg;       /**< the work-group (block id, linear) that reported it */
    uint64_t dev_addr;     /**< heap offset it waited on */
    uint64_t dev_expected; /**< value it waited for */
    uint64_t dev_found;    /**< value it last saw */
    uint32_t dev_cmp;      /**< CPNET_CMP_* of the wait */
    uint32_t claim_gen;    /**< bumped (release, after prod.in_use = 1) by every queue claim, so
                                the proxy rereads the queues' in_use words only when it moved */
    uint32_t reserved[4];
} cpnet_status_t;

/* ------------------------------------------------------------------------ */
/* Teams (OpenSHMEM 1.5 §9.4) and the scratch of their collectives (§9.9)   */
/* ------------------------------------------------------------------------ */
/*
 * A team is a strided set of PEs: team PE i (0 <= i < size) is world PE
 * start + i * stride (every OpenSHMEM split, strided or 2D, of a strided team
 * is strided). A team handle (cpnet_team_t, an int) indexes the PE's team
 * table: the handle's `teams` for kernels, the runtime's registry for CPU
 * work-groups. Handles agree on every member (team creation is collective
 * over the parent and picks the lowest table entry free on all its members).
 *
 * Each team owns `scratch_bytes` of the symmetric heap at the same offset on
 * every member (`scratch`, reserved by the runtime past the allocator's end):
 *
 *   +CPNET_TEAM_SCR_SEQ    u64  collectives this PE has entered on the team
 *                               (the epoch; written only by this PE)
 *   +CPNET_TEAM_SCR_ROUND  u64  rounds through the data buffers so far (round
 *                               r uses buffer r % 2; written only by this PE)
 *   +CPNET_TEAM_SCR_XCHG   u64 x3  the split agreement's source and result, and
 *                               the error code of a GPU PE's team-creation kernel
 *   +CPNET_TEAM_SCR_SYNC   u64 x CPNET_TEAM_SYNC_ROUNDS  sync round k: set to
 *                               the epoch by team PE (me - 2^k) mod size
 *   +CPNET_TEAM_SCR_SIG    u64 x size  signal of team PE j's data for this PE:
 *                               set to the epoch (or chunk epoch) after it
 *   +data_off              2 buffers x size senders x chunk bytes: buffer b,
 *                               sender j at data_off + (b * size + j) * chunk
 *   +data_off + 2*size*chunk   2 LL buffers, the same shape (LL buffer b is
 *                               buffer 2 + b): a reduction round of at most
 *                               team_ll_max bytes (team.cuh) between two GPU work-groups
 *                               whose PEs map each other's heap travels as
 *                               8-byte words {4 data bytes, epoch's low 32
 *                               bits} (cpnet/team.cuh); only such rounds
 *                               write them, so a word of an older epoch is
 *                               never taken for the current one
 *
 * Only all-to-all rounds (every member sends to and waits for every other)
 * use the data and LL buffers (round r: buffer r % 2 of either kind), so a member that writes buffer r % 2 of a peer in
 * round r has seen that peer's data of round r - 1, sent after the peer
 * finished reading round r - 2's: no buffer is overwritten while read.
 *
 * Signals are only ever SET to a growing epoch, so no word is reset between
 * collectives; a slot reused after destroy is zeroed by its new members
 * before the creating collective's closing sync.
 */

/** A team handle. */
typedef int32_t cpnet_team_t;
/** Every PE of the job (OpenSHMEM SHMEM_TEAM_WORLD). */
#define CPNET_TEAM_WORLD 0
/** The PEs of this host (SHMEM_TEAM_SHARED, NVSHMEMX_TEAM_NODE): strided
 *  when the launcher placed ranks in blocks or round-robin; else this PE alone. */
#define CPNET_TEAM_NODE 1
/** No team (a split this PE is not part of). */
#define CPNET_TEAM_INVALID -1
/** Entries of a PE's team table. */
#define CPNET_MAX_TEAMS 64
/** Dissemination rounds a team sync can take: teams of up to 2^32 PEs. */
#define CPNET_TEAM_SYNC_ROUNDS 32

#define CPNET_TEAM_SCR_SEQ 0
#define CPNET_TEAM_SCR_ROUND 8
#define CPNET_TEAM_SCR_XCHG 16
#define CPNET_TEAM_SCR_SYNC 64
#define CPNET_TEAM_SCR_SIG 320
/** Alignment of the data area and of `chunk`, bytes. */
#define CPNET_TEAM_CHUNK_ALIGN 64

#define CPNET_TEAM_DESC_BYTES 32
#define CPNET_TEAM_DESC_OFF_START 0
#define CPNET_TEAM_DESC_OFF_STRIDE 4
#define CPNET_TEAM_DESC_OFF_SIZE 8
#define CPNET_TEAM_DESC_OFF_MY_IDX 12
#define CPNET_TEAM_DESC_OFF_SCRATCH 16
#define CPNET_TEAM_DESC_OFF_CHUNK 24
#define CPNET_TEAM_DESC_OFF_DATA_OFF 28

/** One entry of the team table. An entry with size 0 names no team. */
typedef struct cpnet_team_desc {
    int32_t start;     /**< world PE of team PE 0 */
    int32_t stride;    /**< world-PE distance between consecutive team PEs (>= 1) */
    int32_t size;      /**< team PEs; 0: the entry is free (CPNET_E_BAD_TEAM) */
    int32_t my_idx;    /**< this PE's number in the team; -1: not a member */
    uint64_t scratch;  /**< heap offset of the team's scratch (layout above) */
    uint32_t chunk;    /**< bytes per sender per data buffer (a multiple of CPNET_TEAM_CHUNK_ALIGN) */
    uint32_t data_off; /**< offset of the data area in the scratch */
} cpnet_team_desc_t;

/* ------------------------------------------------------------------------ */
/* The grid forms of the on-stream collectives (cpnet/grid.cuh, issue 22)    */
/* ------------------------------------------------------------------------ */

/** Most team members a grid form takes (its argument holds one address per
 *  member and buffer). */
#define CPNET_GRID_MAX_MEMBERS 32
/** Threads per block of a grid form. */
#define CPNET_GRID_THREADS 256
/** Zeroed 8-byte words of device memory each grid launch gets: go, done
 *  (cpnet/grid.cuh), then the alltoall's piece counter, or the network-path
 *  forms' mask of blocks without a context, first error and (the reduce
 *  with an entry epoch) the word that lets the movers start. */
#define CPNET_GRID_WORDS 8
/** Bytes of the array from which the on-stream reduce to all runs on a
 *  grid where every other member is peer-mapped (docs/collectives.md). */
#define CPNET_REDUCE_GRID_MIN_BYTES 65536
/** Most blocks of the reduce's grid. */
#define CPNET_REDUCE_GRID_MAX_BLOCKS 128
/** Bytes of this member's part per block of the reduce's grid:
 *  ceil(part / this) blocks, at most CPNET_REDUCE_GRID_MAX_BLOCKS. */
#define CPNET_REDUCE_GRID_BYTES_PER_BLOCK 16384
/** Most chunks of a call through the pair staging (cpnet/pair.cuh): its
 *  producers count in one byte per chunk of a 64-bit launch word. */
#define CPNET_PAIR_MAX_CHUNKS 8
/** Most producer blocks of a call through the pair staging (a chunk's
 *  count fits its byte). */
#define CPNET_PAIR_MAX_PRODUCERS 255

/** The reduction operators (team.cuh's enum reduce_op, team.rs's ReduceOp,
 *  in that order), as libcpnet's cpnet_gpu_reduce_on_stream_net takes them
 *  from nvshmem.h. */
#define CPNET_RED_AND 0
#define CPNET_RED_OR 1
#define CPNET_RED_XOR 2
#define CPNET_RED_MIN 3
#define CPNET_RED_MAX 4
#define CPNET_RED_SUM 5
#define CPNET_RED_PROD 6
/** Element kinds of cpnet_gpu_reduce_on_stream_net, with the element's
 *  size in bytes: two's-complement signed and unsigned integers, IEEE
 *  binary floats (4 and 8 bytes), half and bfloat16. */
#define CPNET_KIND_SIGNED 0
#define CPNET_KIND_UNSIGNED 1
#define CPNET_KIND_FLOAT 2
#define CPNET_KIND_HALF 3
#define CPNET_KIND_BFLOAT16 4

#define CPNET_REDUCE_GRID_ARGS_BYTES 552
#define CPNET_REDUCE_GRID_ARGS_OFF_DEST 0
#define CPNET_REDUCE_GRID_ARGS_OFF_SOURCE 8
#define CPNET_REDUCE_GRID_ARGS_OFF_N 16
#define CPNET_REDUCE_GRID_ARGS_OFF_WORDS 24
#define CPNET_REDUCE_GRID_ARGS_OFF_SRC 32
#define CPNET_REDUCE_GRID_ARGS_OFF_DST 288
#define CPNET_REDUCE_GRID_ARGS_OFF_MY_IDX 544
#define CPNET_REDUCE_GRID_ARGS_OFF_SIZE 548

/** The reduce grid kernel's argument (passed by value). */
typedef struct cpnet_reduce_grid_args {
    uint64_t dest;   /**< this PE's dest (device address) */
    uint64_t source; /**< this PE's source (device address) */
    uint64_t n;      /**< elements */
    uint64_t words;  /**< CPNET_GRID_WORDS zeroed 8-byte words of this launch (grid.cuh) */
    uint64_t src[CPNET_GRID_MAX_MEMBERS]; /**< member j's source as mapped in this process */
    uint64_t dst[CPNET_GRID_MAX_MEMBERS]; /**< member j's dest as mapped in this process */
    int32_t my_idx;  /**< this PE's number in the team */
    int32_t size;    /**< team members (at most CPNET_GRID_MAX_MEMBERS) */
} cpnet_reduce_grid_args_t;

/* ------------------------------------------------------------------------ */
/* Compile-time checks of every size and offset above                       */
/* ------------------------------------------------------------------------ */

#if defined(CPNET_NO_OFFSET_CHECKS)
#define CPNET_CHECK_OFF(t, f, off) /* offsets checked by the host compiler */
#else
#define CPNET_CHECK_OFF(t, f, off) \
    CPNET_STATIC_ASSERT(CPNET_OFFSETOF(t, f) == (off), #t "." #f " offset")
#endif

CPNET_STATIC_ASSERT(sizeof(cpnet_cmd_t) == CPNET_SLOT_BYTES, "cpnet_cmd_t size");
CPNET_CHECK_OFF(cpnet_cmd_t, opcode, CPNET_CMD_OFF_OPCODE);
CPNET_CHECK_OFF(cpnet_cmd_t, flags, CPNET_CMD_OFF_FLAGS);
CPNET_CHECK_OFF(cpnet_cmd_t, dtype, CPNET_CMD_OFF_DTYPE);
CPNET_CHECK_OFF(cpnet_cmd_t, subop, CPNET_CMD_OFF_SUBOP);
CPNET_CHECK_OFF(cpnet_cmd_t, pe, CPNET_CMD_OFF_PE);
CPNET_CHECK_OFF(cpnet_cmd_t, size, CPNET_CMD_OFF_SIZE);
CPNET_CHECK_OFF(cpnet_cmd_t, dst, CPNET_CMD_OFF_DST);
CPNET_CHECK_OFF(cpnet_cmd_t, src, CPNET_CMD_OFF_SRC);
CPNET_CHECK_OFF(cpnet_cmd_t, value, CPNET_CMD_OFF_VALUE);
CPNET_CHECK_OFF(cpnet_cmd_t, cond, CPNET_CMD_OFF_COND);
CPNET_CHECK_OFF(cpnet_cmd_t, sig, CPNET_CMD_OFF_SIG);
CPNET_CHECK_OFF(cpnet_cmd_t, commit, CPNET_CMD_OFF_COMMIT);
CPNET_STATIC_ASSERT(CPNET_CMD_OFF_COMMIT == CPNET_CMD_COMMIT_WORD * 8, "commit word index");

CPNET_STATIC_ASSERT(sizeof(cpnet_queue_ctl_t) == CPNET_CTL_BYTES, "cpnet_queue_ctl_t size");
CPNET_CHECK_OFF(cpnet_queue_ctl_t, consumed, CPNET_CTL_OFF_CONSUMED);
CPNET_CHECK_OFF(cpnet_queue_ctl_t, completed, CPNET_CTL_OFF_COMPLETED);
CPNET_CHECK_OFF(cpnet_queue_ctl_t, result, CPNET_CTL_OFF_RESULT);
CPNET_CHECK_OFF(cpnet_queue_ctl_t, result_seq, CPNET_CTL_OFF_RESULT_SEQ);
CPNET_CHECK_OFF(cpnet_queue_ctl_t, reply, CPNET_CTL_OFF_REPLY);
CPNET_CHECK_OFF(cpnet_queue_ctl_t, error_seq, CPNET_CTL_OFF_ERROR_SEQ);
CPNET_CHECK_OFF(cpnet_queue_ctl_t, error, CPNET_CTL_OFF_ERROR);
CPNET_CHECK_OFF(cpnet_queue_ctl_t, abort, CPNET_CTL_OFF_ABORT);

CPNET_STATIC_ASSERT(sizeof(cpnet_queue_prod_t) == CPNET_PROD_BYTES, "cpnet_queue_prod_t size");
CPNET_CHECK_OFF(cpnet_queue_prod_t, write_idx, CPNET_PROD_OFF_WRITE_IDX);
CPNET_CHECK_OFF(cpnet_queue_prod_t, cached_consumed, CPNET_PROD_OFF_CACHED_CONSUMED);
CPNET_CHECK_OFF(cpnet_queue_prod_t, in_use, CPNET_PROD_OFF_IN_USE);
CPNET_CHECK_OFF(cpnet_queue_prod_t, owner, CPNET_PROD_OFF_OWNER);

CPNET_STATIC_ASSERT(CPNET_QUEUE_OFF_PROD == CPNET_CTL_BYTES, "prod block follows ctl");
CPNET_STATIC_ASSERT(CPNET_QUEUE_OFF_SLOTS == CPNET_CTL_BYTES + CPNET_PROD_BYTES, "slots follow prod");
CPNET_STATIC_ASSERT(CPNET_QUEUE_HEADER_BYTES == CPNET_QUEUE_OFF_SLOTS, "header bytes");

CPNET_STATIC_ASSERT(sizeof(cpnet_handle_t) == CPNET_HANDLE_BYTES, "cpnet_handle_t size");
CPNET_CHECK_OFF(cpnet_handle_t, my_pe, CPNET_HANDLE_OFF_MY_PE);
CPNET_CHECK_OFF(cpnet_handle_t, n_pes, CPNET_HANDLE_OFF_N_PES);
CPNET_CHECK_OFF(cpnet_handle_t, heap_base, CPNET_HANDLE_OFF_HEAP_BASE);
CPNET_CHECK_OFF(cpnet_handle_t, heap_size, CPNET_HANDLE_OFF_HEAP_SIZE);
CPNET_CHECK_OFF(cpnet_handle_t, queues, CPNET_HANDLE_OFF_QUEUES);
CPNET_CHECK_OFF(cpnet_handle_t, n_queues, CPNET_HANDLE_OFF_N_QUEUES);
CPNET_CHECK_OFF(cpnet_handle_t, log2_depth, CPNET_HANDLE_OFF_LOG2_DEPTH);
CPNET_CHECK_OFF(cpnet_handle_t, wait_timeout_ns, CPNET_HANDLE_OFF_WAIT_TIMEOUT_NS);
CPNET_CHECK_OFF(cpnet_handle_t, status, CPNET_HANDLE_OFF_STATUS);
CPNET_CHECK_OFF(cpnet_handle_t, claims, CPNET_HANDLE_OFF_CLAIMS);
CPNET_CHECK_OFF(cpnet_handle_t, peers, CPNET_HANDLE_OFF_PEERS);
CPNET_CHECK_OFF(cpnet_handle_t, payload, CPNET_HANDLE_OFF_PAYLOAD);
CPNET_CHECK_OFF(cpnet_handle_t, payload_bytes, CPNET_HANDLE_OFF_PAYLOAD_BYTES);
CPNET_CHECK_OFF(cpnet_handle_t, n_teams, CPNET_HANDLE_OFF_N_TEAMS);
CPNET_CHECK_OFF(cpnet_handle_t, teams, CPNET_HANDLE_OFF_TEAMS);

CPNET_STATIC_ASSERT(sizeof(cpnet_team_desc_t) == CPNET_TEAM_DESC_BYTES, "cpnet_team_desc_t size");
CPNET_CHECK_OFF(cpnet_team_desc_t, start, CPNET_TEAM_DESC_OFF_START);
CPNET_CHECK_OFF(cpnet_team_desc_t, stride, CPNET_TEAM_DESC_OFF_STRIDE);
CPNET_CHECK_OFF(cpnet_team_desc_t, size, CPNET_TEAM_DESC_OFF_SIZE);
CPNET_CHECK_OFF(cpnet_team_desc_t, my_idx, CPNET_TEAM_DESC_OFF_MY_IDX);
CPNET_CHECK_OFF(cpnet_team_desc_t, scratch, CPNET_TEAM_DESC_OFF_SCRATCH);
CPNET_CHECK_OFF(cpnet_team_desc_t, chunk, CPNET_TEAM_DESC_OFF_CHUNK);
CPNET_CHECK_OFF(cpnet_team_desc_t, data_off, CPNET_TEAM_DESC_OFF_DATA_OFF);

CPNET_STATIC_ASSERT(sizeof(cpnet_reduce_grid_args_t) == CPNET_REDUCE_GRID_ARGS_BYTES, "cpnet_reduce_grid_args_t size");
CPNET_CHECK_OFF(cpnet_reduce_grid_args_t, dest, CPNET_REDUCE_GRID_ARGS_OFF_DEST);
CPNET_CHECK_OFF(cpnet_reduce_grid_args_t, source, CPNET_REDUCE_GRID_ARGS_OFF_SOURCE);
CPNET_CHECK_OFF(cpnet_reduce_grid_args_t, n, CPNET_REDUCE_GRID_ARGS_OFF_N);
CPNET_CHECK_OFF(cpnet_reduce_grid_args_t, words, CPNET_REDUCE_GRID_ARGS_OFF_WORDS);
CPNET_CHECK_OFF(cpnet_reduce_grid_args_t, src, CPNET_REDUCE_GRID_ARGS_OFF_SRC);
CPNET_CHECK_OFF(cpnet_reduce_grid_args_t, dst, CPNET_REDUCE_GRID_ARGS_OFF_DST);
CPNET_CHECK_OFF(cpnet_reduce_grid_args_t, my_idx, CPNET_REDUCE_GRID_ARGS_OFF_MY_IDX);
CPNET_CHECK_OFF(cpnet_reduce_grid_args_t, size, CPNET_REDUCE_GRID_ARGS_OFF_SIZE);
CPNET_STATIC_ASSERT(CPNET_REDUCE_GRID_ARGS_OFF_DST == CPNET_REDUCE_GRID_ARGS_OFF_SRC + 8 * CPNET_GRID_MAX_MEMBERS,
                    "reduce grid args: one source address per member");

CPNET_STATIC_ASSERT(sizeof(cpnet_status_t) == CPNET_STATUS_BYTES, "cpnet_status_t size");
CPNET_CHECK_OFF(cpnet_status_t, abort, CPNET_STATUS_OFF_ABORT);
CPNET_CHECK_OFF(cpnet_status_t, dev_error, CPNET_STATUS_OFF_DEV_ERROR);
CPNET_CHECK_OFF(cpnet_status_t, dev_pe, CPNET_STATUS_OFF_DEV_PE);
CPNET_CHECK_OFF(cpnet_status_t, dev_wg, CPNET_STATUS_OFF_DEV_WG);
CPNET_CHECK_OFF(cpnet_status_t, dev_addr, CPNET_STATUS_OFF_DEV_ADDR);
CPNET_CHECK_OFF(cpnet_status_t, dev_expected, CPNET_STATUS_OFF_DEV_EXPECTED);
CPNET_CHECK_OFF(cpnet_status_t, dev_found, CPNET_STATUS_OFF_DEV_FOUND);
CPNET_CHECK_OFF(cpnet_status_t, dev_cmp, CPNET_STATUS_OFF_DEV_CMP);
CPNET_CHECK_OFF(cpnet_status_t, claim_gen, CPNET_STATUS_OFF_CLAIM_GEN);

/* ------------------------------------------------------------------------ */
/* THE LANDING AGENT (the device-side receive agent of the network path)    */
/* ------------------------------------------------------------------------ */
/*
 * A GPU PE's proxy cannot store into GPU memory itself, and a CUDA copy per
 * incoming message costs a driver call and an event (~10-20 us of one proxy
 * thread). So each proxy thread of a GPU PE owns a *landing ring* in pinned
 * host memory mapped into the GPU, and a one-block kernel, the landing agent
 * (cpnet/agent.cuh), applies what the proxy writes there to the GPU heap:
 * received puts (and their signals), every AMO and ADD signal on this PE's
 * heap, and copies out of the heap into host staging (a get's reply, a
 * remote put's source). One driver call starts the agent; it then serves
 * records until it has been idle for `idle_ns` and exits on its own.
 *
 *   +0                          cpnet_agent_ctl_t   (64 bytes)
 *   +64 + i*128, i<depth        slot[i]: the record seq (i = seq & (depth-1))
 *                               in LL form (below), then its result word
 *
 * LL form (after NCCL's low-latency protocol): a record's words 0..6 (the
 * cpnet_agent_rec_t fields before `reserved`, 56 bytes) travel as 14 32-bit
 * halves, half h (little-endian order) in slot word h, whose high 32 bits
 * carry the tag (uint32_t)(seq + 1). Each slot word is written and read as
 * one 8-byte single-copy-atomic access, so a reader that finds the tag in
 * all 14 words has the whole record, with no separate commit word to poll
 * first and read after: one PCIe round trip instead of two. Slot word 14 is
 * the record's result (an AMO's old value, A5); word 15 is zero.
 *
 * Producer (the proxy thread, the only writer of records):
 *   A1  Space. Record seq may be written when seq - done < depth (done
 *       loaded with ACQUIRE, pairs with A5).
 *   A2  Fill. Slot words 0..13 (tagged halves) with RELEASE stores, in any
 *       order, after whatever the record points at (host staging data):
 *       each store pairs with the agent's acquire of that word (A4).
 *   A6  Wake. If ctl.running (ACQUIRE, pairs with A7) is 0 while done is
 *       below the published count, store running = 1 and launch the agent on
 *       the thread's agent stream (kernels on one stream never overlap, so
 *       at most one agent serves a ring).
 * Consumer (the agent: threads 0..13 of its block):
 *   A4  Poll. Thread h loads slot word h with ACQUIRE at system scope
 *       (ld.acquire.sys), all 14 at once (one warp, one coalesced read);
 *       when every tag equals seq + 1 (a block-wide count), the record is
 *       complete, and what the proxy wrote before it (staging data) is
 *       visible to the block after the barrier that counted. A torn view
 *       (some tags old) is simply polled again.
 *   A5  Done. After the block applied it (block barrier, then a system-scope
 *       fence: the heap writes and, for AMOs, the result word are visible),
 *       stores ctl.done = seq + 1 with RELEASE at system scope. The proxy's
 *       ACQUIRE load of done (A1, and its completion scan) pairs with it: a
 *       record below done is applied, its result word holds an AMO's old
 *       value.
 *   A7  Exit. After `idle_ns` with nothing new, or when ctl.stop is set, the
 *       agent stores running = 0 with RELEASE as its last action.
 *
 * Atomicity: every cpnet AMO and ADD signal on this PE's heap is executed
 * by one of its agents with device-scope atomics, so they are atomic with
 * respect to each other (OpenSHMEM 1.5 sec. 9.7), and also with respect to
 * atomics a kernel of this GPU makes on the same word; not with respect to
 * plain stores, puts or SET signals.
 */

#define CPNET_AGENT_REC_BYTES 64
/** Bytes of one landing-ring slot: the record in LL form, its result word, a zero word. */
#define CPNET_AGENT_SLOT_BYTES 128
/** Tagged 32-bit halves of a record in its slot (words 0..6 of cpnet_agent_rec_t). */
#define CPNET_AGENT_LL_WORDS 14
/** Byte offset of the result word in a slot. */
#define CPNET_AGENT_SLOT_OFF_RESULT 112
/** Default landing-ring depth (records, power of two). */
#define CPNET_AGENT_DEFAULT_DEPTH 1024
/** Threads in the agent's block. */
#define CPNET_AGENT_THREADS 256

/** Copy `size` bytes from device-visible address `src` (or the inline
 *  `value`, with CPNET_AGENT_F_INLINE) to heap offset `dst`; then, with
 *  CPNET_AGENT_F_SIGNAL, update the u64 at heap offset `sig` with `signal`
 *  by `sub` (CPNET_SIGNAL_SET: a release store; CPNET_SIGNAL_ADD: an atomic
 *  add), after the data. */
#define CPNET_AGENT_K_PUT 1
/** AMO `sub` (CPNET_AMO_*) of type `ty` on heap offset `dst`, operand
 *  `value`, compare `signal`; the old value goes to the slot's result word (A5). */
#define CPNET_AGENT_K_AMO 2
/** Copy `size` bytes from heap offset `dst` to device-visible address `src`
 *  (host staging). */
#define CPNET_AGENT_K_COPY_OUT 3

#define CPNET_AGENT_F_INLINE 1
#define CPNET_AGENT_F_SIGNAL 2

#define CPNET_AGENT_REC_OFF_KIND 0
#define CPNET_AGENT_REC_OFF_SUB 1
#define CPNET_AGENT_REC_OFF_TY 2
#define CPNET_AGENT_REC_OFF_FLAGS 3
#define CPNET_AGENT_REC_OFF_DST 8
#define CPNET_AGENT_REC_OFF_SIZE 16
#define CPNET_AGENT_REC_OFF_SRC 24
#define CPNET_AGENT_REC_OFF_SIG 32
#define CPNET_AGENT_REC_OFF_SIGNAL 40
#define CPNET_AGENT_REC_OFF_VALUE 48
#define CPNET_AGENT_REC_OFF_RESERVED 56

/** One landing record: 64 bytes (words 0..6 travel in LL form, see above). */
typedef struct cpnet_agent_rec {
    uint8_t kind;     /**< CPNET_AGENT_K_* */
    uint8_t sub;      /**< CPNET_SIGNAL_* (PUT with signal) or CPNET_AMO_* */
    uint8_t ty;       /**< CPNET_T_* (AMO) */
    uint8_t flags;    /**< CPNET_AGENT_F_* */
    uint32_t pad;     /**< zero */
    uint64_t dst;     /**< heap offset written (PUT, AMO) or read (COPY_OUT) */
    uint64_t size;    /**< bytes (PUT, COPY_OUT) */
    uint64_t src;     /**< device-visible address of host staging: read (PUT) or written (COPY_OUT) */
    uint64_t sig;     /**< heap offset of the signal word (PUT with signal) */
    uint64_t signal;  /**< signal operand (PUT); compare value (AMO compare_swap) */
    uint64_t value;   /**< inline data (PUT) or AMO operand */
    uint64_t reserved; /**< not sent (the LL tags carry the seq) */
} cpnet_agent_rec_t;

#define CPNET_AGENT_CTL_BYTES 64
#define CPNET_AGENT_CTL_OFF_DONE 0
#define CPNET_AGENT_CTL_OFF_RUNNING 8
#define CPNET_AGENT_CTL_OFF_STOP 12
#define CPNET_AGENT_CTL_OFF_BAD 16
#define CPNET_AGENT_CTL_OFF_LAUNCHES 24
#define CPNET_AGENT_CTL_OFF_T_READ 32
#define CPNET_AGENT_CTL_OFF_T_APPLY 40
#define CPNET_AGENT_CTL_OFF_T_PUBLISH 48

/** The landing ring's control block. */
typedef struct cpnet_agent_ctl {
    uint64_t done;      /**< records applied (A5, agent, release) */
    uint32_t running;   /**< 1 from launch (proxy) until the agent's exit (A7, release) */
    uint32_t stop;      /**< nonzero: exit now (proxy, at teardown) */
    uint64_t bad;       /**< records refused by the agent (range outside the heap): a proxy bug */
    uint64_t launches;  /**< agent launches (proxy; for the docs' idle figures) */
    uint64_t t_read;    /**< ns (%globaltimer) from a record's first tagged word seen to all 14 (torn reads), summed */
    uint64_t t_apply;   /**< ns spent applying records (copies, signals, AMOs), summed */
    uint64_t t_publish; /**< ns spent publishing `done` (the system-scope release), summed */
    uint64_t reserved;  /**< zero */
} cpnet_agent_ctl_t;

CPNET_STATIC_ASSERT(sizeof(cpnet_agent_rec_t) == CPNET_AGENT_REC_BYTES, "cpnet_agent_rec_t size");
CPNET_CHECK_OFF(cpnet_agent_rec_t, kind, CPNET_AGENT_REC_OFF_KIND);
CPNET_CHECK_OFF(cpnet_agent_rec_t, sub, CPNET_AGENT_REC_OFF_SUB);
CPNET_CHECK_OFF(cpnet_agent_rec_t, ty, CPNET_AGENT_REC_OFF_TY);
CPNET_CHECK_OFF(cpnet_agent_rec_t, flags, CPNET_AGENT_REC_OFF_FLAGS);
CPNET_CHECK_OFF(cpnet_agent_rec_t, dst, CPNET_AGENT_REC_OFF_DST);
CPNET_CHECK_OFF(cpnet_agent_rec_t, size, CPNET_AGENT_REC_OFF_SIZE);
CPNET_CHECK_OFF(cpnet_agent_rec_t, src, CPNET_AGENT_REC_OFF_SRC);
CPNET_CHECK_OFF(cpnet_agent_rec_t, sig, CPNET_AGENT_REC_OFF_SIG);
CPNET_CHECK_OFF(cpnet_agent_rec_t, signal, CPNET_AGENT_REC_OFF_SIGNAL);
CPNET_CHECK_OFF(cpnet_agent_rec_t, value, CPNET_AGENT_REC_OFF_VALUE);
CPNET_CHECK_OFF(cpnet_agent_rec_t, reserved, CPNET_AGENT_REC_OFF_RESERVED);
CPNET_STATIC_ASSERT(CPNET_AGENT_LL_WORDS * 4 == CPNET_AGENT_REC_OFF_RESERVED, "LL halves cover words 0..6");
CPNET_STATIC_ASSERT(CPNET_AGENT_SLOT_OFF_RESULT == CPNET_AGENT_LL_WORDS * 8, "result after the LL words");
CPNET_STATIC_ASSERT(CPNET_AGENT_SLOT_OFF_RESULT + 16 == CPNET_AGENT_SLOT_BYTES, "slot bytes");
CPNET_STATIC_ASSERT(sizeof(cpnet_agent_ctl_t) == CPNET_AGENT_CTL_BYTES, "cpnet_agent_ctl_t size");
CPNET_CHECK_OFF(cpnet_agent_ctl_t, done, CPNET_AGENT_CTL_OFF_DONE);
CPNET_CHECK_OFF(cpnet_agent_ctl_t, running, CPNET_AGENT_CTL_OFF_RUNNING);
CPNET_CHECK_OFF(cpnet_agent_ctl_t, stop, CPNET_AGENT_CTL_OFF_STOP);
CPNET_CHECK_OFF(cpnet_agent_ctl_t, bad, CPNET_AGENT_CTL_OFF_BAD);
CPNET_CHECK_OFF(cpnet_agent_ctl_t, launches, CPNET_AGENT_CTL_OFF_LAUNCHES);
CPNET_CHECK_OFF(cpnet_agent_ctl_t, t_read, CPNET_AGENT_CTL_OFF_T_READ);
CPNET_CHECK_OFF(cpnet_agent_ctl_t, t_apply, CPNET_AGENT_CTL_OFF_T_APPLY);
CPNET_CHECK_OFF(cpnet_agent_ctl_t, t_publish, CPNET_AGENT_CTL_OFF_T_PUBLISH);

#endif /* CPNET_CMD_H */
