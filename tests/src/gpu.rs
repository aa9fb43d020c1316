//! The GPU operation matrix's kernels and what the host needs to check them
//! (`cpnet-gpu-check`, `tests/gpu_multi_pe.rs`).
//!
//! Every kernel is CUDA C++ for NVRTC: [`source`] puts [`PRELUDE`] (the
//! device API, a failure log per block, the byte pattern) in front of a
//! scenario's kernel. A block records each failed check as (kernel source
//! line, got, expected, aux) in its log; [`check_logs`] turns the logs back
//! into messages that quote the failing source line. Data the kernels move
//! is checked byte for byte on the host as well, with [`pat`] and
//! [`rma_value_bytes`] mirroring the device's patterns.
//!
//! Every device call in these kernels is made by all threads of the block
//! with the same arguments from converged control flow (the device API's
//! rule); every branch around a call depends only on values that are the
//! same in every thread (block index, PE, broadcast results).

pub use crate::gpu_sync::*;

/// `u64` words of one block's failure log: count, done marker, the
/// `cpnet_ctx_create` error, a spare word, then [`LOG_MAX`] records of 4
/// words (source line, got, expected, aux).
pub const LOG_WORDS: usize = 4 + 4 * LOG_MAX;
/// Records a block's log keeps (later failures are only counted).
pub const LOG_MAX: usize = 64;
/// The log's word 1 once the block ran to its end.
pub const DONE_MAGIC: u64 = 0xD0D0_D0D0;

/// Shared by every kernel: the device API, the failure log and its
/// `EXPECT_*` macros, block-wide data checks and the byte pattern.
pub const PRELUDE: &str = r#"#include <cpnet/device.cuh>
typedef unsigned long long u64;
typedef unsigned char u8;

/* A block's failure log (LOG_WORDS u64 in the heap): [0] failures, [1]
 * DONE_MAGIC once the block reached its end, [2] cpnet_ctx_create's error,
 * then LOG_MAX records (source line, got, expected, aux). Written by the
 * leader thread only; read by the host after the kernel. */
#define LOG_MAX 64
#define LOG_WORDS (4 + 4 * LOG_MAX)
#define DONE_MAGIC 0xD0D0D0D0ull

__device__ __forceinline__ unsigned tid_(void) { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
__device__ __forceinline__ unsigned nthreads_(void) { return blockDim.x * blockDim.y * blockDim.z; }
__device__ __forceinline__ bool leader_(void) { return tid_() == 0; }

__device__ __noinline__ void log_fail(u64* log, unsigned line, u64 got, u64 want, u64 aux)
{
    if (!leader_()) return;
    const u64 n = log[0];
    if (n < LOG_MAX) {
        log[4 + 4 * n] = line;
        log[5 + 4 * n] = got;
        log[6 + 4 * n] = want;
        log[7 + 4 * n] = aux;
    }
    log[0] = n + 1;
}

/* Checks; `LOG` is the block's log. Values compare as 64-bit words. */
#define EXPECT_EQ(got, want, aux) do { \
    const u64 expect_got_ = (u64)(got); const u64 expect_want_ = (u64)(want); \
    if (expect_got_ != expect_want_) log_fail(LOG, __LINE__, expect_got_, expect_want_, (u64)(aux)); } while (0)
/* A u64 word of the local heap read with a plain load; on a mismatch aux
 * is the word read again with a volatile load (stale-cache diagnosis). */
#define EXPECT_WORD(ptr, want, aux) do { \
    const u64 expect_got_ = *(ptr); const u64 expect_want_ = (u64)(want); \
    if (expect_got_ != expect_want_) log_fail(LOG, __LINE__, expect_got_, expect_want_, *(const volatile u64*)(ptr)); } while (0)
/* n bytes of the local heap against pat(pe, w, c, i), by the whole block
 * (collective: every thread calls it). got = bytes differing with plain
 * loads; aux = (bytes differing with volatile loads) << 32 | aux. */
#define EXPECT_DATA(p, n, pe, w, c, aux) do { \
    const u64 expect_bad_ = count_bad((p), (n), (pe), (w), (c), false); \
    if (expect_bad_ != 0) { \
        const u64 expect_vbad_ = count_bad((p), (n), (pe), (w), (c), true); \
        log_fail(LOG, __LINE__, expect_bad_, 0, (expect_vbad_ << 32) | ((u64)(aux) & 0xffffffffull)); } } while (0)

/* Kernel entry and exit: the block's log, its context (one per block, in
 * shared memory), and the done marker after a clean ctx_destroy check. */
#define BEGIN(h, logs) \
    __shared__ cpnet_ctx_t ctx; \
    u64* const LOG = (logs) + (u64)blockIdx.x * LOG_WORDS; \
    { const int ce_ = cpnet_ctx_create(&(h), &ctx); \
      if (ce_ != CPNET_E_OK) { if (leader_()) LOG[2] = (u64)ce_; return; } }
#define END() do { \
    EXPECT_EQ(cpnet_ctx_destroy(&ctx), CPNET_E_OK, 0); \
    if (leader_()) LOG[1] = DONE_MAGIC; } while (0)

/* The byte pattern of (pe, w, c) at index i (mirrored by cpnet_tests::gpu::pat). */
__device__ __forceinline__ u8 pat(unsigned pe, unsigned w, unsigned c, u64 i)
{
    return (u8)((i * 151ull + c * 47ull + w * 29ull + pe * 101ull + 7ull) ^ (i >> 8));
}

/* Collective over the block: bytes of p[0..n) that differ from the pattern. */
__device__ __noinline__ u64 count_bad(const u8* p, u64 n, unsigned pe, unsigned w, unsigned c, bool vol)
{
    __shared__ u64 bad;
    __syncthreads();
    if (leader_()) bad = 0;
    __syncthreads();
    u64 mine = 0;
    for (u64 i = tid_(); i < n; i += nthreads_()) {
        const u8 v = vol ? *(const volatile u8*)(p + i) : p[i];
        mine += (v != pat(pe, w, c, i)) ? 1 : 0;
    }
    if (mine != 0) atomicAdd(&bad, mine);
    __syncthreads();
    const u64 r = bad;
    __syncthreads();
    return r;
}

/* Collective over the block: p[0..n) = pattern. */
__device__ __forceinline__ void fill(u8* p, u64 n, unsigned pe, unsigned w, unsigned c)
{
    for (u64 i = tid_(); i < n; i += nthreads_()) p[i] = pat(pe, w, c, i);
}

/* T's bit pattern, zero-extended. */
template <typename T>
__device__ __forceinline__ u64 bits_of(T v)
{
    const unsigned char* s = (const unsigned char*)&v;
    u64 b = 0;
    for (unsigned i = 0; i < sizeof(T); ++i) b |= (u64)s[i] << (8 * i);
    return b;
}
"#;

/// The full NVRTC source of a scenario's kernel: [`PRELUDE`] + `kernel`.
/// Source lines in failure logs count in this string.
pub fn source(kernel: &str) -> String {
    format!("{PRELUDE}{kernel}")
}

/// Byte `i` of the pattern of (`pe`, work-group `w`, case `c`), as the
/// device's `pat()` computes it.
pub fn pat(pe: u32, w: u32, c: u32, i: u64) -> u8 {
    (i.wrapping_mul(151).wrapping_add(u64::from(c) * 47 + u64::from(w) * 29 + u64::from(pe) * 101 + 7) ^ (i >> 8)) as u8
}

/// `n` bytes of the pattern of (`pe`, `w`, `c`).
pub fn pattern(pe: u32, w: u32, c: u32, n: u64) -> Vec<u8> {
    (0..n).map(|i| pat(pe, w, c, i)).collect()
}

/// Turn the blocks' failure logs (`blocks * LOG_WORDS` words) into one
/// message per failure, quoting the kernel's source line (`src` is the
/// string [`source`] returned); `Ok` when every block ran to its end
/// without a failure.
///
/// # Errors
/// The messages, one per line, each starting with `who` and the block.
pub fn check_logs(words: &[u64], blocks: usize, src: &str, who: &str) -> Result<(), String> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    for b in 0..blocks {
        let log = &words[b * LOG_WORDS..(b + 1) * LOG_WORDS];
        let n = log[0] as usize;
        for r in 0..n.min(LOG_MAX) {
            let rec = &log[4 + 4 * r..8 + 4 * r];
            let line = rec[0] as usize;
            let text = lines.get(line.wrapping_sub(1)).map_or("?", |l| l.trim());
            let mut msg = format!(
                "{who} block {b}: kernel line {line} `{text}`: got {} ({:#x}), expected {} ({:#x}), aux {:#x}",
                rec[1] as i64, rec[1], rec[2] as i64, rec[2], rec[3]
            );
            if text.starts_with("EXPECT_DATA") {
                msg.push_str(&format!(
                    " [{} bytes differ with plain loads, {} with volatile loads]",
                    rec[1],
                    rec[3] >> 32
                ));
            } else if text.starts_with("EXPECT_WORD") {
                msg.push_str(&format!(" [a volatile re-read gave {} ({:#x})]", rec[3] as i64, rec[3]));
            }
            out.push(msg);
        }
        if n > LOG_MAX {
            out.push(format!("{who} block {b}: {} more failures not recorded", n - LOG_MAX));
        }
        if log[1] != DONE_MAGIC {
            if log[2] != 0 {
                out.push(format!("{who} block {b}: cpnet_ctx_create failed with CPNET_E code {}", log[2]));
            } else {
                out.push(format!("{who} block {b}: did not reach the end of the kernel"));
            }
        }
    }
    if out.is_empty() { Ok(()) } else { Err(out.join("\n")) }
}

/// How a typed-RMA type's value becomes bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An integer type (two's complement, truncated).
    Int,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

/// `CPNET_RMA_TYPES` of device.cuh, in its order: (NAME, bytes, kind).
/// The `ops` kernel records `sizeof` of each and the host compares.
pub const RMA_TYPES: &[(&str, usize, Kind)] = &[
    ("char", 1, Kind::Int),
    ("schar", 1, Kind::Int),
    ("short", 2, Kind::Int),
    ("int", 4, Kind::Int),
    ("long", 8, Kind::Int),
    ("longlong", 8, Kind::Int),
    ("uchar", 1, Kind::Int),
    ("ushort", 2, Kind::Int),
    ("uint", 4, Kind::Int),
    ("ulong", 8, Kind::Int),
    ("ulonglong", 8, Kind::Int),
    ("int8", 1, Kind::Int),
    ("int16", 2, Kind::Int),
    ("int32", 4, Kind::Int),
    ("int64", 8, Kind::Int),
    ("uint8", 1, Kind::Int),
    ("uint16", 2, Kind::Int),
    ("uint32", 4, Kind::Int),
    ("uint64", 8, Kind::Int),
    ("size", 8, Kind::Int),
    ("ptrdiff", 8, Kind::Int),
    ("float", 4, Kind::F32),
    ("double", 8, Kind::F64),
];

/// The bytes of `pg_value<TYPE>(pe, w, k, j)` of the `ops` kernel for type
/// `k` of [`RMA_TYPES`]: `(TYPE)(long long)-(1 + k + 2w + 4pe + 50j)`.
pub fn rma_value_bytes(k: usize, pe: u32, w: u32, j: u32) -> Vec<u8> {
    let v = -(1 + k as i64 + 2 * i64::from(w) + 4 * i64::from(pe) + 50 * i64::from(j));
    let (_, size, kind) = RMA_TYPES[k];
    match kind {
        Kind::Int => v.to_le_bytes()[..size].to_vec(),
        Kind::F32 => (v as f32).to_le_bytes().to_vec(),
        Kind::F64 => (v as f64).to_le_bytes().to_vec(),
    }
}

/// The putmem/getmem sizes of the `ops` scenario.
pub const OPS_SIZES: &[u64] = &[1, 7, 8, 9, 64, 4096, 65536 + 3, 1 << 20];

/// The `ops` cases: case `c` is size `OPS_SIZES[c / 2]`, blocking when `c`
/// is even and `_nbi` + quiet when odd. Returns (sizes, offsets in a lane,
/// lane bytes); each case's slot leaves at least 64 zero bytes after its
/// data (a guard the host checks).
pub fn ops_cases() -> (Vec<u64>, Vec<u64>, u64) {
    let (mut sizes, mut offs, mut at) = (Vec::new(), Vec::new(), 0u64);
    for &s in OPS_SIZES {
        for _mode in 0..2 {
            sizes.push(s);
            offs.push(at);
            at += (s + 64).next_multiple_of(256);
        }
    }
    (sizes, offs, at)
}

/// Bytes per (source PE, work-group) of the `ops` typed-RMA area: `p`
/// slots (8 B per type) at 0, typed blocking puts (32 B per type) at 256,
/// typed `_nbi` puts at 1280.
pub const PG_LANE: u64 = 4096;
/// Bytes per (target, source PE, work-group) of the `ops` put-with-signal
/// data: 1000 B at 0 (SET 7, blocking), 8 B at 1024 (ADD 5, nbi), 4097 B at
/// 2048 (ADD 100, nbi), nothing (ADD 1000, blocking), 64 B at 8192 (SET
/// [`SIG2`] on the second word, nbi); pattern cases 100..=103.
pub const SIG_LANE: u64 = 16384;
/// The parts of a put-with-signal lane: (offset, bytes, pattern case).
pub const SIG_PARTS: &[(u64, u64, u32)] = &[(0, 1000, 100), (1024, 8, 101), (2048, 4097, 102), (8192, 64, 103)];
/// The first signal word's final value: 7 (SET) + 5 + 100 + 1000 (ADDs).
pub const SIG_TOTAL: u64 = 1112;
/// The second signal word's value (SET by an nbi put-with-signal).
pub const SIG2: u64 = 0x1234_5678_90AB_CDEF;

/// `ops`: every RMA and signal operation from every block to the right
/// neighbour (target index 0) and to this PE (target index 1).
pub const OPS: &str = r#"
#define PG_LANE 4096
#define SIG_LANE 16384
#define SIG_TOTAL 1112ull
#define SIG2 0x1234567890ABCDEFull

template <typename T>
__device__ __forceinline__ T pg_value(unsigned pe, unsigned w, unsigned k, unsigned j)
{
    return (T)(long long)(-(long long)(1 + k + 2 * w + 4 * pe + 50 * j));
}

#define AUX(ti, k, step) (((u64)(ti) << 16) | ((u64)(k) << 8) | (u64)(step))

/* One typed-RMA type (an X of CPNET_RMA_TYPES), type index k: p + quiet,
 * g, put/get of 3 elements blocking, put_nbi/get_nbi + quiet; everything
 * compared bitwise. One function per type (not inlined into the kernel:
 * keeps NVRTC fast). Failures are logged at the CPNET_RMA_TYPES(PG_FN) line
 * with aux = target index << 16 | type index << 8 | step. */
#define PG_FN(NAME, TYPE) \
__device__ __noinline__ void pg_##NAME(cpnet_ctx_t* cx, u64* LOG, unsigned k, unsigned ti, int target, int me, \
                                       unsigned w, u8* pg_dst, u8* pg_back, u8* pg_src, u64* typeinfo) \
{ \
    TYPE* const pslot = (TYPE*)(pg_dst + k * 8); \
    TYPE* const tput = (TYPE*)(pg_dst + 256 + k * 32); \
    TYPE* const tnbi = (TYPE*)(pg_dst + 1280 + k * 32); \
    TYPE* const tsrc = (TYPE*)(pg_src + k * 32); \
    TYPE* const bput = (TYPE*)(pg_back + 256 + k * 32); \
    TYPE* const bnbi = (TYPE*)(pg_back + 1280 + k * 32); \
    if (leader_()) { \
        typeinfo[k] = sizeof(TYPE); \
        for (unsigned j = 0; j < 3; ++j) tsrc[j] = pg_value<TYPE>(me, w, k, j); \
    } \
    const TYPE v_ = pg_value<TYPE>(me, w, k, 3); \
    cpnet_##NAME##_p(cx, pslot, v_, target); \
    EXPECT_EQ(cpnet_quiet(cx), CPNET_E_OK, AUX(ti, k, 0)); \
    const TYPE gv_ = cpnet_##NAME##_g(cx, pslot, target); \
    EXPECT_EQ(cpnet_ctx_last_error(cx), CPNET_E_OK, AUX(ti, k, 1)); \
    EXPECT_EQ(bits_of<TYPE>(gv_), bits_of<TYPE>(v_), AUX(ti, k, 2)); \
    EXPECT_EQ(cpnet_##NAME##_put(cx, tput, tsrc, 3, target), CPNET_E_OK, AUX(ti, k, 3)); \
    EXPECT_EQ(cpnet_##NAME##_get(cx, bput, tput, 3, target), CPNET_E_OK, AUX(ti, k, 4)); \
    cpnet_##NAME##_put_nbi(cx, tnbi, tsrc, 3, target); \
    EXPECT_EQ(cpnet_quiet(cx), CPNET_E_OK, AUX(ti, k, 5)); \
    cpnet_##NAME##_get_nbi(cx, bnbi, tnbi, 3, target); \
    EXPECT_EQ(cpnet_quiet(cx), CPNET_E_OK, AUX(ti, k, 6)); \
    for (unsigned j = 0; j < 3; ++j) { \
        EXPECT_EQ(bits_of<TYPE>(bput[j]), bits_of<TYPE>(pg_value<TYPE>(me, w, k, j)), AUX(ti, k, 7 + j)); \
        EXPECT_EQ(bits_of<TYPE>(bnbi[j]), bits_of<TYPE>(pg_value<TYPE>(me, w, k, j)), AUX(ti, k, 10 + j)); \
    } \
}
CPNET_RMA_TYPES(PG_FN) /* failures here: aux = target index << 16 | type index << 8 | step */
#define PG_CALL(NAME, TYPE) pg_##NAME(&ctx, LOG, k++, ti, target, me, w, pg_dst, pg_back, pg_src, typeinfo);

/* Block w of PE me; nb blocks; lane(pe, w) = pe * nb + w.
 * src    + w * lane_bytes            : case c's source at offs[c] (pattern (me, w, c))
 * dst    + lane(me, w) * lane_bytes  : where case c lands at the target (symmetric)
 * back   + (2w + ti) * lane_bytes    : getmem of it back from target ti
 * pg     + lane(me, w) * PG_LANE     : typed p / put slots at the target
 * pgback + (2w + ti) * PG_LANE       : typed get results from target ti
 * pgsrc  + w * PG_LANE               : typed put sources
 * typeinfo + w * 32                  : sizeof of each CPNET_RMA_TYPES type; [31] = count
 * sigsrc + w * SIG_LANE              : put-with-signal sources (cases 100..103)
 * sigdata + ((ti * n + me) * nb + w) * SIG_LANE, sigs + ((ti * n + me) * nb + w) * 2: at the target */
extern "C" __global__ void ops(cpnet_handle_t h, u8* src, u8* dst, u8* back, const u64* sizes, const u64* offs,
                               unsigned ncases, u64 lane_bytes, u8* pg, u8* pgback, u8* pgsrc, u64* typeinfo_all,
                               u8* sigsrc, u8* sigdata, u64* sigs, u64* logs)
{
    BEGIN(h, logs);
    const unsigned w = blockIdx.x, nb = gridDim.x;
    const int me = cpnet_my_pe(&ctx), n = cpnet_n_pes(&ctx);
    const int right = (me + 1) % n, left = (me + n - 1) % n;
    u64* const typeinfo = typeinfo_all + (u64)w * 32;

    /* Sources, written by every thread; each call's entry barrier makes
     * them part of what it sends. */
    u8* const s = src + (u64)w * lane_bytes;
    for (unsigned c = 0; c < ncases; ++c) fill(s + offs[c], sizes[c], me, w, c);
    u8* const ss = sigsrc + (u64)w * SIG_LANE;
    fill(ss + 0, 1000, me, w, 100);
    fill(ss + 1024, 8, me, w, 101);
    fill(ss + 2048, 4097, me, w, 102);
    fill(ss + 8192, 64, me, w, 103);

    for (unsigned ti = 0; ti < 2; ++ti) {
        const int target = ti == 0 ? right : me;
        u8* const d = dst + (u64)(me * nb + w) * lane_bytes;
        u8* const b = back + (u64)(2 * w + ti) * lane_bytes;
        for (unsigned c = 0; c < ncases; ++c) {
            const u64 o = offs[c], size = sizes[c];
            if ((c & 1) == 0) {
                EXPECT_EQ(cpnet_putmem(&ctx, d + o, s + o, size, target), CPNET_E_OK, (ti << 8) | c);
                EXPECT_EQ(cpnet_getmem(&ctx, b + o, d + o, size, target), CPNET_E_OK, (ti << 8) | c);
            } else {
                cpnet_putmem_nbi(&ctx, d + o, s + o, size, target);
                EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, (ti << 8) | c);
                cpnet_getmem_nbi(&ctx, b + o, d + o, size, target);
                EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, (ti << 8) | c);
            }
            /* The data is local now: every thread sees it (checked again on the host). */
            EXPECT_DATA(b + o, size, me, w, c, (ti << 8) | c);
        }

        u8* const pg_dst = pg + (u64)(me * nb + w) * PG_LANE;
        u8* const pg_back = pgback + (u64)(2 * w + ti) * PG_LANE;
        u8* const pg_src = pgsrc + (u64)w * PG_LANE;
        unsigned k = 0;
        CPNET_RMA_TYPES(PG_CALL)
        if (leader_()) typeinfo[31] = k;

        /* Put-with-signal: SET (blocking), ADD (nbi, inline), ADD (nbi),
         * ADD of a signal alone (blocking, 0 bytes), SET on a second word (nbi). */
        const u64 li = ((u64)ti * n + me) * nb + w;
        u8* const sd = sigdata + li * SIG_LANE;
        u64* const sg = sigs + li * 2;
        EXPECT_EQ(cpnet_putmem_signal(&ctx, sd + 0, ss + 0, 1000, sg, 7, CPNET_SIGNAL_SET, target), CPNET_E_OK, ti);
        cpnet_putmem_signal_nbi(&ctx, sd + 1024, ss + 1024, 8, sg, 5, CPNET_SIGNAL_ADD, target);
        cpnet_putmem_signal_nbi(&ctx, sd + 2048, ss + 2048, 4097, sg, 100, CPNET_SIGNAL_ADD, target);
        EXPECT_EQ(cpnet_putmem_signal(&ctx, sd, ss, 0, sg, 1000, CPNET_SIGNAL_ADD, target), CPNET_E_OK, ti);
        cpnet_putmem_signal_nbi(&ctx, sd + 8192, ss + 8192, 64, sg + 1, SIG2, CPNET_SIGNAL_SET, target);
        EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, ti);
    }

    /* Receive: from the left neighbour's block w (ti 0) and from ourselves
     * (ti 1). Once a signal shows its final value, the data sent before it
     * must be visible. */
    for (unsigned ti = 0; ti < 2; ++ti) {
        const int from = ti == 0 ? left : me;
        const u64 li = ((u64)ti * n + from) * nb + w;
        u8* const sd = sigdata + li * SIG_LANE;
        u64* const sg = sigs + li * 2;
        const u64 v = cpnet_signal_wait_until(&ctx, sg, CPNET_CMP_GE, SIG_TOTAL);
        EXPECT_EQ(cpnet_ctx_last_error(&ctx), CPNET_E_OK, ti);
        EXPECT_EQ(v, SIG_TOTAL, ti);
        const u64 v2 = cpnet_signal_wait_until(&ctx, sg + 1, CPNET_CMP_EQ, SIG2);
        EXPECT_EQ(cpnet_ctx_last_error(&ctx), CPNET_E_OK, ti);
        EXPECT_EQ(v2, SIG2, ti);
        EXPECT_EQ(cpnet_signal_fetch(&ctx, sg), SIG_TOTAL, ti);
        EXPECT_DATA(sd + 0, 1000, from, w, 100, ti);
        EXPECT_DATA(sd + 1024, 8, from, w, 101, ti);
        EXPECT_DATA(sd + 2048, 4097, from, w, 102, ti);
        EXPECT_DATA(sd + 8192, 64, from, w, 103, ti);
    }
    cpnet_fence(&ctx);
    EXPECT_EQ(cpnet_nop(&ctx), CPNET_E_OK, 0);
    END();
}
"#;

/// Words per type of the `amo` contention area (8 bytes each, also for
/// 32-bit types): see [`AMO`].
pub const AMO_WORDS: usize = 16;
/// Private sanity slots per (target, block id) in the `amo` scenario.
pub const AMO_PRIV_SLOTS: usize = 32;

/// `amo`: every AMO on int32/int64/uint32/uint64 under contention from
/// every block of every PE on words of PE 0 and PE n-1, plus a sanity
/// sequence of every AMO name device.cuh defines on private words.
pub const AMO: &str = r#"
#define A_WRAP(NAME, TYPE) \
__device__ __forceinline__ TYPE a_fetch(cpnet_ctx_t* c, TYPE* d, int pe) { return cpnet_##NAME##_atomic_fetch(c, d, pe); } \
__device__ __forceinline__ void a_set(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { cpnet_##NAME##_atomic_set(c, d, v, pe); } \
__device__ __forceinline__ TYPE a_swap(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { return cpnet_##NAME##_atomic_swap(c, d, v, pe); } \
__device__ __forceinline__ TYPE a_cswap(cpnet_ctx_t* c, TYPE* d, TYPE cond, TYPE v, int pe) { return cpnet_##NAME##_atomic_compare_swap(c, d, cond, v, pe); } \
__device__ __forceinline__ TYPE a_fetch_add(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { return cpnet_##NAME##_atomic_fetch_add(c, d, v, pe); } \
__device__ __forceinline__ void a_add(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { cpnet_##NAME##_atomic_add(c, d, v, pe); } \
__device__ __forceinline__ TYPE a_fetch_inc(cpnet_ctx_t* c, TYPE* d, int pe) { return cpnet_##NAME##_atomic_fetch_inc(c, d, pe); } \
__device__ __forceinline__ void a_inc(cpnet_ctx_t* c, TYPE* d, int pe) { cpnet_##NAME##_atomic_inc(c, d, pe); } \
__device__ __forceinline__ TYPE a_fetch_and(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { return cpnet_##NAME##_atomic_fetch_and(c, d, v, pe); } \
__device__ __forceinline__ void a_and(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { cpnet_##NAME##_atomic_and(c, d, v, pe); } \
__device__ __forceinline__ TYPE a_fetch_or(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { return cpnet_##NAME##_atomic_fetch_or(c, d, v, pe); } \
__device__ __forceinline__ void a_or(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { cpnet_##NAME##_atomic_or(c, d, v, pe); } \
__device__ __forceinline__ TYPE a_fetch_xor(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { return cpnet_##NAME##_atomic_fetch_xor(c, d, v, pe); } \
__device__ __forceinline__ void a_xor(cpnet_ctx_t* c, TYPE* d, TYPE v, int pe) { cpnet_##NAME##_atomic_xor(c, d, v, pe); }
A_WRAP(int32, int32_t)
A_WRAP(int64, int64_t)
A_WRAP(uint32, uint32_t)
A_WRAP(uint64, uint64_t)

/* The contention words of one type at a target (AMO_WORDS slots of 8 bytes):
 *  0 fetch_add 1 (fetched values recorded)   1 fetch_inc (recorded)
 *  2 add 3        3 inc        4 add -2       5 compare_swap increment loop
 *  6 one compare_swap attempt per iteration (successes counted)
 *  7 or own bit (iteration 0)      8 fetch_or own bit (iteration 0; own bit was clear)
 *  9 and ~own bit (iteration 0)   10 fetch_and ~own bit (iteration 0; own bit was set)
 * 11 xor own bit                  12 fetch_xor own bit (own bit = iteration parity)
 * 13 swap in (id << 16 | i + 1) (fetched values recorded)
 * Words 9 and 10 start all ones (the host sets them). */
template <typename T>
__device__ __noinline__ void contend(cpnet_ctx_t* ctx, u64* LOG, u8* words, int t, unsigned id, unsigned i, u64* rec,
                        u64 stride, u64* cas_ok, unsigned aux)
{
    T* const w0 = (T*)(words + 0 * 8);
    T* const w1 = (T*)(words + 1 * 8);
    T* const w2 = (T*)(words + 2 * 8);
    T* const w3 = (T*)(words + 3 * 8);
    T* const w4 = (T*)(words + 4 * 8);
    T* const w5 = (T*)(words + 5 * 8);
    T* const w6 = (T*)(words + 6 * 8);
    T* const w7 = (T*)(words + 7 * 8);
    T* const w8 = (T*)(words + 8 * 8);
    T* const w9 = (T*)(words + 9 * 8);
    T* const w10 = (T*)(words + 10 * 8);
    T* const w11 = (T*)(words + 11 * 8);
    T* const w12 = (T*)(words + 12 * 8);
    T* const w13 = (T*)(words + 13 * 8);
    const T bit = (T)(1ull << id);

    const T f0 = a_fetch_add(ctx, w0, (T)1, t);
    EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 0);
    if (leader_()) rec[0 * stride + i] = bits_of<T>(f0);
    const T f1 = a_fetch_inc(ctx, w1, t);
    EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 1);
    if (leader_()) rec[1 * stride + i] = bits_of<T>(f1);
    a_add(ctx, w2, (T)3, t);
    a_inc(ctx, w3, t);
    a_add(ctx, w4, (T)(long long)-2, t);

    T cur = a_fetch(ctx, w5, t);
    EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 5);
    for (unsigned tries = 0;; ++tries) {
        const T old = a_cswap(ctx, w5, cur, (T)(cur + (T)1), t);
        const int e = cpnet_ctx_last_error(ctx);
        if (e != CPNET_E_OK) { EXPECT_EQ(e, CPNET_E_OK, aux | 5); break; }
        if (old == cur) break;
        cur = old;
        if (tries > 100000) { EXPECT_EQ(tries, 0, aux | 5); break; }
    }

    const T c0 = a_fetch(ctx, w6, t);
    const T o0 = a_cswap(ctx, w6, c0, (T)(c0 + (T)1), t);
    EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 6);
    if (o0 == c0 && leader_()) cas_ok[0] += 1;

    if (i == 0) {
        a_or(ctx, w7, bit, t);
        const T fo = a_fetch_or(ctx, w8, bit, t);
        EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 8);
        EXPECT_EQ(bits_of<T>((T)(fo & bit)), 0, aux | 8);
        a_and(ctx, w9, (T)~bit, t);
        const T fa = a_fetch_and(ctx, w10, (T)~bit, t);
        EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 10);
        EXPECT_EQ(bits_of<T>((T)(fa & bit)), bits_of<T>(bit), aux | 10);
    }
    a_xor(ctx, w11, bit, t);
    const T fx = a_fetch_xor(ctx, w12, bit, t);
    EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 12);
    EXPECT_EQ(bits_of<T>((T)(fx & bit)), (i & 1) ? bits_of<T>(bit) : 0ull, aux | 12);
    const T fs = a_swap(ctx, w13, (T)(((u64)id << 16) | (u64)(i + 1)), t);
    EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 13);
    if (leader_()) rec[2 * stride + i] = bits_of<T>(fs);
}

/* Fetch/set/swap/compare_swap and the rest on a word only this block uses:
 * every fetched value is exact. Non-fetching AMOs are fenced before the
 * next AMO on the same word (they may complete in any order otherwise). */
template <typename T>
__device__ __noinline__ void sanity(cpnet_ctx_t* ctx, u64* LOG, T* p, int t, unsigned id, unsigned aux)
{
    const T v1 = (T)(id * 1000 + 11), v2 = (T)(long long)(-7 * (long long)(id + 1)), v3 = (T)(id * 3 + 100);
    a_set(ctx, p, v1, t);
    cpnet_fence(ctx);
    EXPECT_EQ(bits_of<T>(a_fetch(ctx, p, t)), bits_of<T>(v1), aux | 0);
    EXPECT_EQ(bits_of<T>(a_swap(ctx, p, v2, t)), bits_of<T>(v1), aux | 1);
    EXPECT_EQ(bits_of<T>(a_cswap(ctx, p, v1, v3, t)), bits_of<T>(v2), aux | 2);  /* miss */
    EXPECT_EQ(bits_of<T>(a_fetch(ctx, p, t)), bits_of<T>(v2), aux | 3);
    EXPECT_EQ(bits_of<T>(a_cswap(ctx, p, v2, v3, t)), bits_of<T>(v2), aux | 4);  /* hit */
    EXPECT_EQ(bits_of<T>(a_fetch_add(ctx, p, (T)5, t)), bits_of<T>(v3), aux | 5);
    a_add(ctx, p, (T)(long long)-3, t);
    cpnet_fence(ctx);
    a_inc(ctx, p, t);
    cpnet_fence(ctx);
    EXPECT_EQ(bits_of<T>(a_fetch_inc(ctx, p, t)), bits_of<T>((T)(v3 + (T)3)), aux | 6);
    T x = (T)(v3 + (T)4);
    const T m1 = (T)~(T)0x10, b2 = (T)0x300, b3 = (T)0x5005, m4 = (T)0xfff0ff;
    EXPECT_EQ(bits_of<T>(a_fetch_and(ctx, p, m1, t)), bits_of<T>(x), aux | 7);
    x = (T)(x & m1);
    a_or(ctx, p, b2, t);
    cpnet_fence(ctx);
    x = (T)(x | b2);
    EXPECT_EQ(bits_of<T>(a_fetch_or(ctx, p, (T)0, t)), bits_of<T>(x), aux | 8);
    a_xor(ctx, p, b3, t);
    cpnet_fence(ctx);
    x = (T)(x ^ b3);
    EXPECT_EQ(bits_of<T>(a_fetch_xor(ctx, p, (T)0, t)), bits_of<T>(x), aux | 9);
    a_and(ctx, p, m4, t);
    cpnet_fence(ctx);
    x = (T)(x & m4);
    EXPECT_EQ(bits_of<T>(a_fetch(ctx, p, t)), bits_of<T>(x), aux | 10);
    EXPECT_EQ(cpnet_ctx_last_error(ctx), CPNET_E_OK, aux | 11);
}

/* Every standard-type AMO name (CPNET_AMO_STANDARD_TYPES) once, on private
 * slot 4 + ks. One function per name; failures are logged at the
 * CPNET_AMO_STANDARD_TYPES(STD_FN) line: aux = target index << 16 | slot << 8 | step. */
#define STD_FN(NAME, TYPE, DT) \
__device__ __noinline__ void std_##NAME(cpnet_ctx_t* cx, u64* LOG, u8* pv, unsigned ks, unsigned ti, int t) \
{ \
    TYPE* const p_ = (TYPE*)(pv + (u64)(4 + ks) * 8); \
    const unsigned ax_ = (ti << 16) | ((4 + ks) << 8); \
    cpnet_##NAME##_atomic_set(cx, p_, (TYPE)7, t); \
    cpnet_fence(cx); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch_inc(cx, p_, t)), bits_of<TYPE>((TYPE)7), ax_ | 0); \
    cpnet_##NAME##_atomic_inc(cx, p_, t); \
    cpnet_fence(cx); \
    cpnet_##NAME##_atomic_add(cx, p_, (TYPE)10, t); \
    cpnet_fence(cx); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch_add(cx, p_, (TYPE)1, t)), bits_of<TYPE>((TYPE)19), ax_ | 1); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_compare_swap(cx, p_, (TYPE)20, (TYPE)(long long)-3, t)), bits_of<TYPE>((TYPE)20), ax_ | 2); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_swap(cx, p_, (TYPE)5, t)), bits_of<TYPE>((TYPE)(long long)-3), ax_ | 3); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch(cx, p_, t)), bits_of<TYPE>((TYPE)5), ax_ | 4); \
    EXPECT_EQ(cpnet_ctx_last_error(cx), CPNET_E_OK, ax_ | 5); \
    /* Minimum AMOs (cpnet extension): compared by TYPE's signedness. */ \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch_min(cx, p_, (TYPE)9, t)), bits_of<TYPE>((TYPE)5), ax_ | 6); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch_min(cx, p_, (TYPE)2, t)), bits_of<TYPE>((TYPE)5), ax_ | 7); \
    cpnet_##NAME##_atomic_min(cx, p_, (TYPE)(long long)-4, t); \
    cpnet_fence(cx); \
    { const TYPE m4_ = (TYPE)(long long)-4; \
      EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch(cx, p_, t)), bits_of<TYPE>(m4_ < (TYPE)2 ? m4_ : (TYPE)2), ax_ | 8); } \
    EXPECT_EQ(cpnet_ctx_last_error(cx), CPNET_E_OK, ax_ | 9); \
}

/* Every bitwise AMO name (CPNET_AMO_BITWISE_TYPES) once, on private slot
 * 18 + kb; failures at the CPNET_AMO_BITWISE_TYPES(BIT_FN) line, aux as STD_FN. */
#define BIT_FN(NAME, TYPE, DT) \
__device__ __noinline__ void bit_##NAME(cpnet_ctx_t* cx, u64* LOG, u8* pv, unsigned kb, unsigned ti, int t) \
{ \
    TYPE* const p_ = (TYPE*)(pv + (u64)(18 + kb) * 8); \
    const unsigned ax_ = (ti << 16) | ((18 + kb) << 8); \
    cpnet_##NAME##_atomic_set(cx, p_, (TYPE)0x0ff0, t); \
    cpnet_fence(cx); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch_and(cx, p_, (TYPE)0x00ff, t)), bits_of<TYPE>((TYPE)0x0ff0), ax_ | 0); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch_or(cx, p_, (TYPE)0x1100, t)), bits_of<TYPE>((TYPE)0x00f0), ax_ | 1); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch_xor(cx, p_, (TYPE)0x0101, t)), bits_of<TYPE>((TYPE)0x11f0), ax_ | 2); \
    cpnet_##NAME##_atomic_and(cx, p_, (TYPE)0xf0f0, t); \
    cpnet_fence(cx); \
    cpnet_##NAME##_atomic_or(cx, p_, (TYPE)0x0003, t); \
    cpnet_fence(cx); \
    cpnet_##NAME##_atomic_xor(cx, p_, (TYPE)0x1000, t); \
    cpnet_fence(cx); \
    EXPECT_EQ(bits_of<TYPE>(cpnet_##NAME##_atomic_fetch(cx, p_, t)), bits_of<TYPE>((TYPE)0x00f3), ax_ | 3); \
    EXPECT_EQ(cpnet_ctx_last_error(cx), CPNET_E_OK, ax_ | 4); \
}
CPNET_AMO_STANDARD_TYPES(STD_FN) /* failures here: aux = target index << 16 | slot << 8 | step */
CPNET_AMO_BITWISE_TYPES(BIT_FN) /* failures here: aux = target index << 16 | slot << 8 | step */
#define STD_CALL(NAME, TYPE, DT) std_##NAME(&ctx, LOG, pv, ks++, ti, t);
#define BIT_CALL(NAME, TYPE, DT) bit_##NAME(&ctx, LOG, pv, kb++, ti, t);

/* Block w of PE me, id = me * nb + w (< 32). Targets: PE 0 (ti 0) and PE
 * n-1 (ti 1, only when n > 1).
 * words + tyi * AMO_WORDS * 8         : contention words of type tyi (int32, int64, uint32, uint64)
 * priv + (id * 32 + slot) * 8         : this block's private words at each target: slots 0..3 the
 *                                       sanity sequence per type, 4..15 standard names (and their
 *                                       minimum AMOs), 16 float, 17 double, 18..24 bitwise names,
 *                                       25 a double as an ordered integer under the minimum AMO
 * fetched + (((ti * 4 + tyi) * 3 + op) * nb + w) * iters + i : fetched values (op 0 fetch_add,
 *                                       1 fetch_inc, 2 swap), local
 * cas_ok + (ti * 4 + tyi) * nb + w    : successful single compare_swap attempts, local */
extern "C" __global__ void amo(cpnet_handle_t h, u8* words, u8* priv, u64* fetched, u64* cas_ok, u64* logs,
                               unsigned iters)
{
    BEGIN(h, logs);
    const unsigned w = blockIdx.x, nb = gridDim.x;
    const int me = cpnet_my_pe(&ctx), n = cpnet_n_pes(&ctx);
    const unsigned id = (unsigned)me * nb + w;
    const unsigned n_targets = n > 1 ? 2 : 1;
    const u64 stride = (u64)nb * iters;

    for (unsigned ti = 0; ti < n_targets; ++ti) {
        const int t = ti == 0 ? 0 : n - 1;
        u8* const pv = priv + (u64)id * 32 * 8;
        sanity<int32_t>(&ctx, LOG, (int32_t*)(pv + 0), t, id, (ti << 16) | (0 << 8));
        sanity<int64_t>(&ctx, LOG, (int64_t*)(pv + 8), t, id, (ti << 16) | (1 << 8));
        sanity<uint32_t>(&ctx, LOG, (uint32_t*)(pv + 16), t, id, (ti << 16) | (2 << 8));
        sanity<uint64_t>(&ctx, LOG, (uint64_t*)(pv + 24), t, id, (ti << 16) | (3 << 8));
        unsigned ks = 0, kb = 0;
        CPNET_AMO_STANDARD_TYPES(STD_CALL)
        CPNET_AMO_BITWISE_TYPES(BIT_CALL)
        {
            float* const pf = (float*)(pv + 16 * 8);
            const float f1 = 1.5f + (float)id, f2 = -2.25f;
            cpnet_float_atomic_set(&ctx, pf, f1, t);
            cpnet_fence(&ctx);
            EXPECT_EQ(bits_of<float>(cpnet_float_atomic_fetch(&ctx, pf, t)), bits_of<float>(f1), (ti << 16) | 0x1000);
            EXPECT_EQ(bits_of<float>(cpnet_float_atomic_swap(&ctx, pf, f2, t)), bits_of<float>(f1), (ti << 16) | 0x1001);
            EXPECT_EQ(bits_of<float>(cpnet_float_atomic_fetch(&ctx, pf, t)), bits_of<float>(f2), (ti << 16) | 0x1002);
            double* const pd = (double*)(pv + 17 * 8);
            const double d1 = 12345.5 + (double)id, d2 = -3.125;
            cpnet_double_atomic_set(&ctx, pd, d1, t);
            cpnet_fence(&ctx);
            EXPECT_EQ(bits_of<double>(cpnet_double_atomic_fetch(&ctx, pd, t)), bits_of<double>(d1), (ti << 16) | 0x1100);
            EXPECT_EQ(bits_of<double>(cpnet_double_atomic_swap(&ctx, pd, d2, t)), bits_of<double>(d1), (ti << 16) | 0x1101);
            EXPECT_EQ(bits_of<double>(cpnet_double_atomic_fetch(&ctx, pd, t)), bits_of<double>(d2), (ti << 16) | 0x1102);
            EXPECT_EQ(cpnet_ctx_last_error(&ctx), CPNET_E_OK, (ti << 16) | 0x1103);
            /* Doubles as ordered integers under the minimum AMO (private slot 25). */
            uint64_t* const po = (uint64_t*)(pv + 25 * 8);
            cpnet_uint64_atomic_set(&ctx, po, cpnet_f64_ord(1.5 + (double)id), t);
            cpnet_fence(&ctx);
            EXPECT_EQ(bits_of<double>(cpnet_double_ord_atomic_fetch_min(&ctx, po, -2.25, t)), bits_of<double>(1.5 + (double)id), (ti << 16) | 0x1200);
            cpnet_double_ord_atomic_min(&ctx, po, 7.0, t);
            cpnet_fence(&ctx);
            EXPECT_EQ(cpnet_uint64_atomic_fetch(&ctx, po, t), cpnet_f64_ord(-2.25), (ti << 16) | 0x1201);
            EXPECT_EQ(cpnet_ctx_last_error(&ctx), CPNET_E_OK, (ti << 16) | 0x1202);
        }
        EXPECT_EQ(ks, 12, ti);
        EXPECT_EQ(kb, 7, ti);
    }
    EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, 0);

    for (unsigned i = 0; i < iters; ++i) {
        for (unsigned ti = 0; ti < n_targets; ++ti) {
            const int t = ti == 0 ? 0 : n - 1;
#define CONTEND(T, tyi) \
            contend<T>(&ctx, LOG, words + (tyi) * 16 * 8, t, id, i, \
                       fetched + ((u64)((ti * 4 + (tyi)) * 3) * nb + w) * iters, stride, \
                       cas_ok + (u64)(ti * 4 + (tyi)) * nb + w, (ti << 16) | ((tyi) << 8))
            CONTEND(int32_t, 0);
            CONTEND(int64_t, 1);
            CONTEND(uint32_t, 2);
            CONTEND(uint64_t, 3);
#undef CONTEND
        }
        EXPECT_EQ(cpnet_quiet(&ctx), CPNET_E_OK, i);
    }
    END();
}
"#;

/// Every scenario's kernel: (scenario, kernel function, kernel source
/// without the prelude).
pub const KERNELS: &[(&str, &str, &str)] = &[
    ("ops", "ops", OPS),
    ("amo", "amo", AMO),
    ("order", "order", ORDER),
    ("barrier", "barrier", BARRIER),
    ("bad-input", "bad_input", BAD_INPUT),
    ("stuck-wait", "stuck", STUCK_WAIT),
    ("collectives", "coll", crate::gpu_coll::COLL),
    ("coll-bench", "coll_bench", crate::gpu_coll::COLL_BENCH),
];

/// Whether this machine can run GPU PEs: `Ok(device count)`, or why not
/// (no CUDA driver, no device).
///
/// # Errors
/// Why not, in words.
pub fn gpu_available() -> Result<i32, String> {
    if !cpnet::gpu::driver_present() {
        return Err("no CUDA driver (libcuda) on this machine".into());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n),
        Ok(_) => Err("the CUDA driver reports 0 devices".into()),
        Err(e) => Err(format!("cuDeviceGetCount failed: {e:?}")),
    }
}

/// Whether a test that needs a GPU should run: true with one; without one
/// false, after a loud `SKIPPED test: why` on stderr (libtest captures
/// `eprintln!` of passing tests, so it goes straight to the stream), or a
/// panic when `CPNET_REQUIRE_GPU=1` (set it on the GPU machine).
///
/// # Panics
/// Without a GPU when `CPNET_REQUIRE_GPU=1`.
pub fn gpu_or_skip(test: &str) -> bool {
    match gpu_available() {
        Ok(_) => true,
        Err(why) => {
            assert!(std::env::var("CPNET_REQUIRE_GPU").as_deref() != Ok("1"), "CPNET_REQUIRE_GPU=1 but {why}");
            let line = format!("\n*** SKIPPED {test}: {why} (set CPNET_REQUIRE_GPU=1 to make this a failure)\n");
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bad case names the operation the proxy reports for it, and the
    /// cases that share PE, address and code differ in it or in being
    /// blocking.
    #[test]
    fn bad_cases_name_their_operation() {
        let ops: Vec<&str> = BAD_CASES.iter().map(|c| bad_case_op(c.0)).collect();
        assert_eq!(ops[8], "atomic_fetch_add");
        assert_eq!(ops[9], "atomic_add");
        assert_eq!(ops[11], "getmem");
        assert!(ops.iter().enumerate().all(|(i, op)| [8, 9, 11].contains(&i) || *op == "putmem"), "{ops:?}");
        let names: Vec<&str> = [cpnet_device::layout::AmoOp::FetchAdd, cpnet_device::layout::AmoOp::Add].iter().map(|o| o.shmem_name()).collect();
        assert_eq!(names, ["atomic_fetch_add", "atomic_add"]);
    }

    #[test]
    fn logs_quote_the_failing_kernel_line() {
        let src = source("extern \"C\" __global__ void k() {\n    EXPECT_EQ(a, 3, 9);\n}\n");
        let line = src.lines().position(|l| l.contains("EXPECT_EQ(a, 3, 9)")).expect("line") + 1;
        let mut words = vec![0u64; 2 * LOG_WORDS];
        words[1] = DONE_MAGIC;
        words[LOG_WORDS] = 1; // block 1: one failure, not done, ctx_create failed with 10
        words[LOG_WORDS + 2] = 10;
        words[LOG_WORDS + 4..LOG_WORDS + 8].copy_from_slice(&[line as u64, 2, 3, 9]);
        let e = check_logs(&words, 2, &src, "PE 0").expect_err("block 1 failed");
        assert!(e.contains(&format!("PE 0 block 1: kernel line {line} `EXPECT_EQ(a, 3, 9);`: got 2 (0x2), expected 3 (0x3), aux 0x9")), "{e}");
        assert!(e.contains("PE 0 block 1: cpnet_ctx_create failed with CPNET_E code 10"), "{e}");
        assert!(!e.contains("block 0"), "{e}");
        words[LOG_WORDS..].fill(0);
        words[LOG_WORDS + 1] = DONE_MAGIC;
        assert_eq!(check_logs(&words, 2, &src, "PE 0"), Ok(()));
    }

    #[test]
    fn ops_cases_leave_a_zero_guard_after_each_case() {
        let (sizes, offs, lane) = ops_cases();
        assert_eq!(sizes.len(), 2 * OPS_SIZES.len());
        for c in 0..sizes.len() {
            let end = offs.get(c + 1).copied().unwrap_or(lane);
            assert!(end - offs[c] >= sizes[c] + 64, "case {c}");
        }
    }

    #[test]
    fn rma_values_are_the_c_conversions() {
        // k = 0 (char), pe 0, w 0, j 0: -(1) -> 0xff.
        assert_eq!(rma_value_bytes(0, 0, 0, 0), vec![0xff]);
        // uint (k = 8): -(1 + 8 + 2 + 4) = -15 as a 4-byte two's complement.
        assert_eq!(rma_value_bytes(8, 1, 1, 0), (-15i32).to_le_bytes().to_vec());
        // double (k = 22): -(1 + 22 + 50) = -73.0.
        assert_eq!(rma_value_bytes(22, 0, 0, 1), (-73.0f64).to_le_bytes().to_vec());
        assert_eq!(RMA_TYPES.len(), 23);
    }

    #[test]
    fn every_kernel_uses_the_prelude_macros_consistently() {
        for (name, func, k) in KERNELS {
            // `extern "C" __global__ void [__launch_bounds__(N)] func(cpnet_handle_t h, ...`
            let at = k.find(&format!(" {func}(cpnet_handle_t h")).unwrap_or_else(|| panic!("{name}: no {func}(cpnet_handle_t h"));
            let line = k[..at].rsplit('\n').next().unwrap_or_default();
            assert!(line.contains("__global__ void"), "{name}: {line}");
            assert!(k.contains("BEGIN(h, logs);"), "{name}");
            assert!(k.contains("END();"), "{name}");
        }
        assert!(PRELUDE.contains(&format!("#define LOG_MAX {LOG_MAX}")));
        assert!(PRELUDE.contains(&format!("#define DONE_MAGIC {DONE_MAGIC:#X}ull").replace("0X", "0x")));
    }
}
