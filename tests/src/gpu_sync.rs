//! The GPU operation matrix's ordering and failure scenarios (`order`,
//! `barrier`, `bad-input`, `stuck-wait`): their kernels (CUDA C++ for
//! NVRTC, after [`crate::gpu::PRELUDE`]) and the constants the host checks
//! them with. Re-exported by [`crate::gpu`], which lists every scenario
//! (`KERNELS`) and holds the prelude, the failure logs and the ops and amo
//! scenarios.

/// Bytes of one `order` data message (not a multiple of anything).
pub const ORDER_DATA: u64 = 8200;
/// Stride of the `order` data lanes.
pub const ORDER_DATA_STRIDE: u64 = 8448;
/// Pipeline slots of the `order` put-with-signal pipeline.
pub const ORDER_SLOTS: u64 = 8;
/// Bytes per pipeline slot.
pub const ORDER_SLOT_BYTES: u64 = 2048;
/// u64 words per `order` lane: 0 inline word, 1 flag, 2 ack, 3 pipeline
/// ack, 4 AMO counter, 5 its flag, 6 its ack, 8.. the pipeline slots'
/// signals, 16 the burst's flag ([`ORDER_BURST_FLAG`]).
pub const ORDER_WORDS: u64 = 64;
/// Word of an `order` lane that the burst's flag raises to 1.
pub const ORDER_BURST_FLAG: u64 = 16;

/// `order`: put, fence, flag (the target checks the data once it sees the
/// flag), then a put-with-signal pipeline through a ring of slots, each
/// message checked at the receiver as soon as its signal shows, then AMO,
/// fence, flag (the AMO goes through the proxy, the flag with peer-to-peer
/// stores on is the kernel's own store: the fence has to order the two
/// paths), then a burst of small nbi puts three times round the queue
/// (payload slots reused), fence, flag, every message checked.
pub const ORDER: &str = r#"
#define DATA 8200ull
#define DSTRIDE 8448ull
#define S 8u
#define SLOT 2048ull
#define NW 64ull
#define W_INL 0
#define W_FLAG 1
#define W_ACK 2
#define W_PACK 3
#define W_AMO 4
#define W_AFLAG 5
#define W_AACK 6
#define W_PSIG 8
#define W_BFLAG 16
#define BURST 192u
#define BSTRIDE 80ull

__device__ __forceinline__ u64 msg_size(unsigned i) { return 1000ull + (u64)((i * 37u) % 1000u); }
/* 16..80 bytes: over the inline 8, inside a payload slot. */
__device__ __forceinline__ u64 burst_size(unsigned i) { return 16ull + (u64)((i * 13u) % 65u); }

/* Block w of PE me, lane(pe, w) = pe * nb + w. Traffic goes to the right
 * neighbour and comes from the left one (both this PE when n == 1).
 * data  + lane(me, w) * DSTRIDE    : round r's message from us at the right (pattern (me, w, r))
 * words + lane(x, w) * NW          : at us, the words concerning PE x: x = left: its inline word,
 *                                    flag and pipeline signals; x = right: its acks to us
 * pipe  + (lane(me, w) * S + slot) * SLOT : pipeline message i in slot i % S (pattern (me, w, 1000 + i))
 * srcb  + w * (DSTRIDE + S * SLOT) : local sources */
extern "C" __global__ void order(cpnet_handle_t h, u8* data, u64* words, u8* pipe, u8* srcb, u64* logs,
                                 unsigned rounds, unsigned msgs)
{
    BEGIN(h, logs);
    const unsigned w = blockIdx.x, nb = gridDim.x;
    const int me = cpnet_my_pe(&ctx), n = cpnet_n_pes(&ctx);
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    const u64 mine = (u64)me * nb + w, from_left = (u64)left * nb + w, from_right = (u64)right * nb + w;
    u8* const src = srcb + (u64)w * (DSTRIDE + S * SLOT);
    u8* const psrc = src + DSTRIDE;

    /* Part 1: data (nbi), an inline word (p), fence (quiet every 4th round),
     * flag (p). The receiver waits for the flag, then the data and the word
     * must be those of the same round. Acks (atomic adds) keep the sender
     * from overwriting a round before the receiver checked it. */
    for (unsigned r = 1; r <= rounds; ++r) {
        EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_right * NW + W_ACK, CPNET_CMP_GE, (u64)(r - 1)),
                  CPNET_E_OK, r);
        EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, r); /* the source may be rewritten */
        fill(src, DATA, me, w, r);
        cpnet_putmem_nbi(&ctx, data + mine * DSTRIDE, src, DATA, right);
        cpnet_uint64_p(&ctx, words + mine * NW + W_INL, (u64)r, right);
        if (r % 4 == 3)
            EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, r);
        else
            cpnet_fence(&ctx);
        cpnet_uint64_p(&ctx, words + mine * NW + W_FLAG, (u64)r, right);

        EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_left * NW + W_FLAG, CPNET_CMP_GE, (u64)r), CPNET_E_OK, r);
        EXPECT_WORD(words + from_left * NW + W_FLAG, r, r);
        EXPECT_WORD(words + from_left * NW + W_INL, r, r);
        EXPECT_DATA(data + from_left * DSTRIDE, DATA, left, w, r, r);
        cpnet_uint64_atomic_add(&ctx, words + mine * NW + W_ACK, 1, left); /* at the left, our lane */
    }
    EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_right * NW + W_ACK, CPNET_CMP_GE, (u64)rounds), CPNET_E_OK, 0);

    /* Part 2: message i goes to slot i % S with its slot's signal raised to
     * i + 1, by SET or ADD, blocking or nbi (i % 4: blocking SET, nbi ADD,
     * nbi SET, blocking ADD). The receiver waits for the slot's signal and
     * checks message i at once. A slot is reused only after the receiver
     * acked the message before (window S); sources after a quiet. */
    for (unsigned i = 0; i < msgs; ++i) {
        const unsigned slot = i % S;
        if (i >= S)
            EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_right * NW + W_PACK, CPNET_CMP_GE, (u64)(i - S + 1)),
                      CPNET_E_OK, i);
        if (slot == 0 && i > 0) EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, i);
        u8* const ps = psrc + slot * SLOT;
        fill(ps, msg_size(i), me, w, 1000 + i);
        u8* const dd = pipe + (mine * S + slot) * SLOT;
        u64* const sig = words + mine * NW + W_PSIG + slot;
        const u64 prev = i >= S ? (u64)(i + 1 - S) : 0ull;
        switch (i % 4) {
        case 0: EXPECT_EQ(cpnet_putmem_signal(&ctx, dd, ps, msg_size(i), sig, i + 1, CPNET_SIGNAL_SET, right), CPNET_E_OK, i); break;
        case 1: cpnet_putmem_signal_nbi(&ctx, dd, ps, msg_size(i), sig, i + 1 - prev, CPNET_SIGNAL_ADD, right); break;
        case 2: cpnet_putmem_signal_nbi(&ctx, dd, ps, msg_size(i), sig, i + 1, CPNET_SIGNAL_SET, right); break;
        default: EXPECT_EQ(cpnet_putmem_signal(&ctx, dd, ps, msg_size(i), sig, i + 1 - prev, CPNET_SIGNAL_ADD, right), CPNET_E_OK, i); break;
        }

        const u64 v = cpnet_signal_wait_until(&ctx, words + from_left * NW + W_PSIG + slot, CPNET_CMP_GE, (u64)(i + 1));
        EXPECT_EQ(cpnet_ctx_last_error(&ctx), CPNET_E_OK, i);
        EXPECT_EQ(v, i + 1, i);
        EXPECT_DATA(pipe + (from_left * S + slot) * SLOT, msg_size(i), left, w, 1000 + i, i);
        cpnet_uint64_atomic_add(&ctx, words + mine * NW + W_PACK, 1, left);
    }
    EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_right * NW + W_PACK, CPNET_CMP_GE, (u64)msgs), CPNET_E_OK, 0);

    /* Part 3: an AMO (through the proxy's executor), fence, a flag (p). The
     * receiver waits for the flag; the AMO's result must be there. Acks (p)
     * keep the sender one round ahead at most. */
    for (unsigned r = 1; r <= rounds; ++r) {
        EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_right * NW + W_AACK, CPNET_CMP_GE, (u64)(r - 1)),
                  CPNET_E_OK, r);
        cpnet_uint64_atomic_add(&ctx, words + mine * NW + W_AMO, 1, right);
        cpnet_fence(&ctx);
        cpnet_uint64_p(&ctx, words + mine * NW + W_AFLAG, (u64)r, right);
        EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_left * NW + W_AFLAG, CPNET_CMP_GE, (u64)r), CPNET_E_OK, r);
        EXPECT_WORD(words + from_left * NW + W_AMO, r, r);
        cpnet_uint64_p(&ctx, words + mine * NW + W_AACK, (u64)r, left);
    }
    EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_right * NW + W_AACK, CPNET_CMP_GE, (u64)rounds), CPNET_E_OK, 0);

    /* Part 4: a burst of BURST nbi puts of 16..80 bytes from distinct
     * sources to distinct places (each in its queue's payload slot where
     * the queue has them, cmd.h P0: three laps of a 64-slot ring, so a slot
     * rewritten before the proxy sent its data shows), fence, flag (p). The
     * receiver checks every message once it sees the flag. The pipeline
     * lanes are free: part 2 ended when the right acked all our messages
     * and we checked all the left's. */
    EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, 0); /* psrc may be rewritten */
    for (unsigned i = 0; i < BURST; ++i) fill(psrc + i * BSTRIDE, burst_size(i), me, w, 5000 + i);
    for (unsigned i = 0; i < BURST; ++i)
        cpnet_putmem_nbi(&ctx, pipe + mine * S * SLOT + i * BSTRIDE, psrc + i * BSTRIDE, burst_size(i), right);
    cpnet_fence(&ctx);
    cpnet_uint64_p(&ctx, words + mine * NW + W_BFLAG, 1ull, right);
    EXPECT_EQ(cpnet_uint64_wait_until(&ctx, words + from_left * NW + W_BFLAG, CPNET_CMP_GE, 1ull), CPNET_E_OK, 0);
    for (unsigned i = 0; i < BURST; ++i)
        EXPECT_DATA(pipe + from_left * S * SLOT + i * BSTRIDE, burst_size(i), left, w, 5000 + i, 5000 + i);
    EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, 0);
    END();
}
"#;

/// Bytes each PE puts to every PE per `barrier` round.
pub const BARRIER_BYTES: u64 = 256;

/// `barrier`: one block per PE; every round it puts a word, a block of
/// bytes and an atomic add to every PE, calls `cpnet_barrier_all`, and
/// checks everything from every PE, and its own word at every PE through
/// `cpnet_ptr`; a second barrier ends the round.
pub const BARRIER: &str = r#"
#define BB 256ull
/* slots[s]: from PE s (r * 1000 + s); data + s * BB: from PE s (pattern (s, 0, r)); ctr: n per round. */
extern "C" __global__ void barrier(cpnet_handle_t h, u64* slots, u64* ctr, u8* data, u8* bsrc, u64* logs,
                                   unsigned rounds)
{
    BEGIN(h, logs);
    const int me = cpnet_my_pe(&ctx), n = cpnet_n_pes(&ctx);
    for (unsigned r = 1; r <= rounds; ++r) {
        fill(bsrc, BB, me, 0, r); /* the previous round's barrier completed its puts */
        for (int t = 0; t < n; ++t) {
            cpnet_uint64_p(&ctx, slots + me, (u64)r * 1000 + me, t);
            cpnet_putmem_nbi(&ctx, data + (u64)me * BB, bsrc, BB, t);
            cpnet_uint64_atomic_add(&ctx, ctr, 1, t);
        }
        EXPECT_EQ(cpnet_barrier_all(&ctx), CPNET_E_OK, r);
        for (int s = 0; s < n; ++s) {
            EXPECT_WORD(slots + s, (u64)r * 1000 + s, ((u64)r << 8) | s);
            EXPECT_DATA(data + (u64)s * BB, BB, s, 0, r, ((u64)r << 8) | s);
        }
        EXPECT_WORD(ctr, (u64)r * n, r);
        /* cpnet_ptr (shmem_ptr): a PE is reachable exactly when the handle
         * has a peer-to-peer table (CPNET_GPU_P2P=1) with an entry for it:
         * every PE of this one-host job with CPNET_GPU_IPC=1, this PE alone
         * with CPNET_GPU_IPC=0, none without a table; our word at PE t
         * reads back. */
        for (int t = 0; t < n; ++t) {
            const volatile u64* pt = (const volatile u64*)cpnet_ptr(&ctx, slots + me, t);
            const bool mapped = h.peers != 0 && ((const u64*)h.peers)[t] != 0;
            EXPECT_EQ(pt != nullptr, mapped, ((u64)r << 8) | t);
            if (pt != nullptr) EXPECT_EQ(*pt, (u64)r * 1000 + me, ((u64)r << 8) | t);
        }
        EXPECT_EQ(cpnet_ptr(&ctx, slots, n) == nullptr, 1, r);
        EXPECT_EQ(cpnet_ptr(&ctx, (const void*)(h.heap_base + h.heap_size), me) == nullptr, 1, r);
        EXPECT_EQ(cpnet_barrier_all(&ctx), CPNET_E_OK, r); /* nobody writes round r + 1 before all checked r */
    }
    END();
}
"#;

/// The `bad-input` cases: (what, blocking, expected code). Each case
/// records 3 codes: the call's own (blocking cases; -1 for nbi), the next
/// quiet's, and a quiet after a good put that follows (must be 0).
pub const BAD_CASES: &[(&str, bool, cpnet_device::layout::ErrorCode)] = {
    use cpnet_device::layout::ErrorCode::{BadAddr, BadAlign, BadPe};
    &[
        ("putmem to PE n_pes", true, BadPe),
        ("putmem_nbi to PE n_pes", false, BadPe),
        ("putmem to PE -1", true, BadPe),
        ("putmem_nbi to PE -1", false, BadPe),
        ("putmem past the heap end", true, BadAddr),
        ("putmem_nbi past the heap end", false, BadAddr),
        ("putmem running over the heap end", true, BadAddr),
        ("putmem_nbi running over the heap end", false, BadAddr),
        ("misaligned uint64 fetch_add", true, BadAlign),
        ("misaligned uint64 add", false, BadAlign),
        ("uint64_p to PE n_pes", false, BadPe),
        ("getmem from past the heap end", true, BadAddr),
    ]
};

/// The operation a [`BAD_CASES`] entry issues, as the proxy names it in its
/// report (`Cmd::op_name`): `uint64_p` travels as an inline put.
pub fn bad_case_op(what: &str) -> &'static str {
    if what.starts_with("getmem") {
        "getmem"
    } else if what.ends_with("fetch_add") {
        "atomic_fetch_add"
    } else if what.ends_with(" add") {
        "atomic_add"
    } else {
        "putmem"
    }
}

/// `bad-input`: every case of [`BAD_CASES`] in order from every block.
pub const BAD_INPUT: &str = r#"
#define NCASES 12
/* guard: 4096 bytes the host filled; src: 64 bytes per block; scratch: a word per block at the
 * right neighbour (the good put); codes + (w * NCASES + k) * 3: call, quiet, quiet after a good put. */
extern "C" __global__ void bad_input(cpnet_handle_t h, u8* guard, u8* src, u64* scratch, long long* codes, u64* logs)
{
    BEGIN(h, logs);
    const unsigned w = blockIdx.x;
    const int me = cpnet_my_pe(&ctx), n = cpnet_n_pes(&ctx);
    const int right = (me + 1) % n;
    u8* const s = src + (u64)w * 64;
    u8* const past_end = (u8*)(h.heap_base + h.heap_size + 64);
    u8* const over_end = (u8*)(h.heap_base + h.heap_size - 8);
    long long* const cw = codes + (u64)w * NCASES * 3;
    unsigned k = 0;
/* A blocking case: the call's code, then the quiet's (the rejection again). */
#define BLOCKING(call) do { const int c_ = (call); if (leader_()) cw[3 * k] = c_; \
        const int q_ = cpnet_quiet(&ctx); if (leader_()) cw[3 * k + 1] = q_; } while (0)
/* An nbi case: the quiet's code. */
#define NBI(call) do { call; if (leader_()) cw[3 * k] = -1; \
        const int q_ = cpnet_quiet(&ctx); if (leader_()) cw[3 * k + 1] = q_; } while (0)
/* Then the context must still work. */
#define GOOD() do { cpnet_uint64_p(&ctx, scratch + w, (u64)(k + 1), right); \
        const int g_ = cpnet_quiet(&ctx); if (leader_()) cw[3 * k + 2] = g_; ++k; } while (0)

    BLOCKING(cpnet_putmem(&ctx, guard, s, 64, n)); GOOD();
    NBI(cpnet_putmem_nbi(&ctx, guard, s, 64, n)); GOOD();
    BLOCKING(cpnet_putmem(&ctx, guard, s, 64, -1)); GOOD();
    NBI(cpnet_putmem_nbi(&ctx, guard, s, 64, -1)); GOOD();
    BLOCKING(cpnet_putmem(&ctx, past_end, s, 64, right)); GOOD();
    NBI(cpnet_putmem_nbi(&ctx, past_end, s, 64, right)); GOOD();
    BLOCKING(cpnet_putmem(&ctx, over_end, s, 64, right)); GOOD();
    NBI(cpnet_putmem_nbi(&ctx, over_end, s, 64, right)); GOOD();
    {
        const u64 v = cpnet_uint64_atomic_fetch_add(&ctx, (u64*)(guard + 4), 1, right);
        EXPECT_EQ(v, 0, 8);
        BLOCKING(cpnet_ctx_last_error(&ctx)); GOOD();
    }
    NBI(cpnet_uint64_atomic_add(&ctx, (u64*)(guard + 4), 1, right)); GOOD();
    NBI(cpnet_uint64_p(&ctx, (u64*)guard, 1, n)); GOOD();
    BLOCKING(cpnet_getmem(&ctx, s, past_end, 64, right)); GOOD();
    EXPECT_EQ(k, NCASES, 0);
    END();
}
"#;

/// `stuck-wait`: block `waiter` waits for a word to become 42 that stays 7.
pub const STUCK_WAIT: &str = r#"
/* code[0]: the wait's result; code[1]: the waiter's ctx_destroy (OK, or
 * the timeout again if quiet counts the failed wait). */
extern "C" __global__ void stuck(cpnet_handle_t h, u64* word, long long* code, u64* logs, unsigned waiter)
{
    BEGIN(h, logs);
    if (blockIdx.x == waiter) {
        const int e = cpnet_uint64_wait_until(&ctx, word, CPNET_CMP_EQ, 42ull);
        if (leader_()) code[0] = e;
        const int d = cpnet_ctx_destroy(&ctx);
        if (leader_()) { code[1] = d; LOG[1] = DONE_MAGIC; }
    } else {
        END();
    }
}
"#;
