//! The device team collectives' check and benchmark (`cpnet-gpu-check
//! collectives`, `cpnet-gpu-check coll-bench`): the kernels, the case list
//! and the host-side expectations.
//!
//! One block per PE runs a list of cases ([`Case`], 8 `u64` words each in
//! the heap) on one team: every reduction type and operator, broadcast,
//! fcollect, collect (sizes differing per member), alltoall, their typed
//! forms, barrier and sync; then the bad-input calls. The host fills every
//! source, and after the kernel compares every destination element by
//! element with what it computes itself ([`expect`]), folding with the CPU
//! work-group's `ReduceType::combine` in team order.

use cpnet_device::cpu::{ReduceOp, ReduceType};
use cpnet_device::layout::TeamDesc;

use crate::gpu::pattern;

/// Words per case in the kernel's case table.
pub const CASE_WORDS: usize = 8;
/// Words the kernel writes per case: the call's CPNET_E_* and an aux value
/// (collect: the total bytes).
pub const CODE_WORDS: usize = 2;
/// Words after the cases' codes: my_pe, n_pes, translate(j -> world) for
/// j < [`MAX_TRANSLATE`], then the bad-input codes ([`BAD_CALLS`]).
pub const MAX_TRANSLATE: usize = 8;
/// Offset (in code words after the cases) of the bad-input codes.
pub const BAD_AT: usize = 2 + MAX_TRANSLATE;
/// Bytes of the guard region the bad calls point at (must stay as filled).
pub const GUARD_BYTES: u64 = 256;

/// What a case does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `cpnet_<T>_<op>_reduce`.
    Reduce = 0,
    /// `cpnet_broadcastmem` (`root`).
    Broadcast = 1,
    /// `cpnet_fcollectmem`.
    Fcollect = 2,
    /// `cpnet_collectmem`: team PE j contributes `n + 3 j` bytes.
    Collect = 3,
    /// `cpnet_alltoallmem`.
    Alltoall = 4,
    /// `cpnet_<T>_broadcast`.
    TBroadcast = 5,
    /// `cpnet_<T>_fcollect`.
    TFcollect = 6,
    /// `cpnet_<T>_alltoall`.
    TAlltoall = 7,
    /// `cpnet_<T>_collect` (`n + 3 j` elements from team PE j).
    TCollect = 8,
    /// `n` rounds of: a word to every member, `cpnet_team_barrier`, check
    /// every member's word, `cpnet_team_sync`.
    Barrier = 9,
}

/// The element types the check uses: (type code of the kernel, name, bytes,
/// integer).
pub const TYPES: &[(u32, &str, u64, bool)] = &[
    (0, "int8", 1, true),
    (1, "uint16", 2, true),
    (2, "int32", 4, true),
    (3, "uint64", 8, true),
    (4, "float", 4, false),
    (5, "double", 8, false),
    (6, "half", 2, false),
    (7, "bfloat16", 2, false),
];

/// One case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Case {
    /// What it does.
    pub kind: Kind,
    /// Element type code ([`TYPES`]); 0 for the *mem forms.
    pub tc: u32,
    /// Reduce operator.
    pub op: ReduceOp,
    /// Elements (bytes for the *mem forms; rounds for Barrier).
    pub n: u64,
    /// Heap offset (from the region's start) of the source.
    pub src: u64,
    /// Heap offset (from the region's start) of the destination.
    pub dst: u64,
    /// Broadcast root (team PE).
    pub root: i32,
    /// Bytes of the destination region (checked whole, zero beyond the
    /// data).
    pub dst_bytes: u64,
    /// Bytes of the source region.
    pub src_bytes: u64,
}

fn op_code(op: ReduceOp) -> u64 {
    ReduceOp::ALL.iter().position(|&o| o == op).expect("an operator") as u64
}

impl Case {
    /// The kernel's 8 words, with offsets made absolute (`base` = the
    /// region's heap offset).
    pub fn words(&self, base: u64) -> [u64; CASE_WORDS] {
        [self.kind as u64, u64::from(self.tc), op_code(self.op), self.n, base + self.src, base + self.dst, self.root as u64, 0]
    }

    /// Element size in bytes (1 for the *mem forms).
    pub fn elem(&self) -> u64 {
        match self.kind {
            Kind::Broadcast | Kind::Fcollect | Kind::Collect | Kind::Alltoall | Kind::Barrier => 1,
            _ => TYPES[self.tc as usize].2,
        }
    }

    /// A short description for failure messages.
    pub fn describe(&self) -> String {
        let t = TYPES[self.tc as usize].1;
        match self.kind {
            Kind::Reduce => format!("{t}_{}_reduce n={}", self.op.name(), self.n),
            Kind::Broadcast => format!("broadcastmem {} B root {}", self.n, self.root),
            Kind::Fcollect => format!("fcollectmem {} B", self.n),
            Kind::Collect => format!("collectmem {} B + 3 j", self.n),
            Kind::Alltoall => format!("alltoallmem {} B", self.n),
            Kind::TBroadcast => format!("{t}_broadcast n={} root {}", self.n, self.root),
            Kind::TFcollect => format!("{t}_fcollect n={}", self.n),
            Kind::TAlltoall => format!("{t}_alltoall n={}", self.n),
            Kind::TCollect => format!("{t}_collect n={} + 3 j", self.n),
            Kind::Barrier => format!("barrier + sync, {} rounds", self.n),
        }
    }
}

/// The case list for a team of `size` PEs whose reductions run in rounds of
/// `chunk` bytes, and the bytes of heap it needs. The same on every member.
pub fn cases(size: i32, chunk: u32) -> (Vec<Case>, u64) {
    let sz = size as u64;
    let mut v = Vec::new();
    let mut at = 0u64;
    let mut alloc = |bytes: u64| {
        let a = at;
        at += (bytes + 64).next_multiple_of(64); // 64 zero bytes after each region
        a
    };
    let mut push = |kind: Kind, tc: u32, op: ReduceOp, n: u64, root: i32, src_bytes: u64, dst_bytes: u64| {
        let src = alloc(src_bytes);
        let dst = alloc(dst_bytes);
        v.push(Case { kind, tc, op, n, src, dst, root, dst_bytes, src_bytes });
    };
    for &(tc, _, es, int) in TYPES {
        // 1, 7, 1000 and more than two rounds of `chunk` bytes.
        let multi = 2 * u64::from(chunk) / es + 3;
        for op in ReduceOp::ALL {
            if op.bitwise() && !int {
                continue;
            }
            // Several rounds for sum and min of every type (the rounds'
            // protocol does not depend on the operator).
            let several = matches!(op, ReduceOp::Sum | ReduceOp::Min);
            for n in [1, 7, 1000, multi] {
                if n == multi && !several {
                    continue;
                }
                push(Kind::Reduce, tc, op, n, 0, n * es, n * es);
            }
        }
    }
    let last = size - 1;
    for n in [1u64, 7, 1000, 300_000] {
        push(Kind::Broadcast, 0, ReduceOp::And, n, 0, n, n);
        push(Kind::Broadcast, 0, ReduceOp::And, n, last, n, n);
        push(Kind::Fcollect, 0, ReduceOp::And, n, 0, n, n * sz);
        let total: u64 = (0..sz).map(|j| n + 3 * j).sum();
        push(Kind::Collect, 0, ReduceOp::And, n, 0, n + 3 * (sz - 1), total);
        push(Kind::Alltoall, 0, ReduceOp::And, n, 0, n * sz, n * sz);
    }
    // Typed forms: int32 broadcast from the last member, double fcollect,
    // uint16 alltoall, int8 collect, uint64 broadcast of one element.
    push(Kind::TBroadcast, 2, ReduceOp::And, 7, last, 28, 28);
    push(Kind::TBroadcast, 3, ReduceOp::And, 1, 0, 8, 8);
    push(Kind::TFcollect, 5, ReduceOp::And, 1000, 0, 8000, 8000 * sz);
    push(Kind::TAlltoall, 1, ReduceOp::And, 7, 0, 14 * sz, 14 * sz);
    let total: u64 = (0..sz).map(|j| 1000 + 3 * j).sum();
    push(Kind::TCollect, 0, ReduceOp::And, 1000, 0, 1000 + 3 * (sz - 1), total);
    push(Kind::Barrier, 0, ReduceOp::And, 20, 0, 0, 8 * sz);
    (v, at)
}

/// The bad-input calls each PE makes (after its cases), with what each must
/// return; `team` is the team the cases ran on (or INVALID), `n` its size.
/// (description, expected CPNET_E_* or query result.)
pub const BAD_CALLS: &[(&str, i64)] = &[
    ("int32_sum_reduce on team -1", 11),
    ("int32_sum_reduce on team CPNET_MAX_TEAMS", 11),
    ("int32_sum_reduce on a free entry (63)", 11),
    ("int32_sum_reduce on the bad team argument", 11),
    ("team_sync on the bad team argument", 11),
    ("team_barrier on the bad team argument", 11),
    ("broadcastmem on the bad team argument", 11),
    ("alltoallmem on team -1", 11),
    ("team_my_pe(-1)", -1),
    ("team_n_pes(-1)", -1),
    ("team_translate_pe(world, n_pes, world)", -1),
    ("team_translate_pe(-1, 0, world)", -1),
];

/// The bad calls that only run where `team` is a team of this PE: root out
/// of range (BAD_PE).
pub const BAD_ROOT_CALLS: &[(&str, i64)] = &[("broadcastmem with root = size", 1), ("broadcastmem with root -1", 1)];

/// Element generator of the check's reduction sources.
pub trait Gen: ReduceType {
    /// The value for hash `h`.
    fn make(h: u64) -> Self;
}

macro_rules! gen_int {
    ($($t:ty),*) => {$(impl Gen for $t { fn make(h: u64) -> Self { h as $t } })*};
}
gen_int!(i8, u16, i32, u64);

/// Small multiples of 1/4 in -8..8: exact in every float type, with sums
/// and products that do round in half and bfloat16.
fn small(h: u64) -> f64 {
    ((h % 61) as f64 - 30.0) * 0.25 + if h.is_multiple_of(7) { 0.0 } else { 0.125 * ((h >> 8) % 3) as f64 }
}
impl Gen for f32 {
    fn make(h: u64) -> Self {
        small(h) as f32 * (1.0 + 1.0 / 1024.0)
    }
}
impl Gen for f64 {
    fn make(h: u64) -> Self {
        small(h) * 1.000_000_119_209_289_6
    }
}
impl Gen for half::f16 {
    fn make(h: u64) -> Self {
        half::f16::from_f64(small(h) * 1.0009765625)
    }
}
impl Gen for half::bf16 {
    fn make(h: u64) -> Self {
        half::bf16::from_f64(small(h) * 1.0078125)
    }
}

/// The hash of element `i` of world PE `pe`'s source in case `c`.
pub fn hash(pe: i32, c: usize, i: u64) -> u64 {
    let mut x = (pe as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (c as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F) ^ i;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

fn values<T: Gen>(pe: i32, c: usize, n: u64) -> Vec<u8> {
    let mut out = vec![0u8; n as usize * T::SIZE];
    for i in 0..n {
        T::make(hash(pe, c, i)).write(&mut out[i as usize * T::SIZE..]);
    }
    out
}

fn fold<T: Gen>(members: &[i32], c: usize, op: ReduceOp, n: u64) -> Vec<u8> {
    let mut out = vec![0u8; n as usize * T::SIZE];
    for i in 0..n {
        let mut acc = T::make(hash(members[0], c, i));
        for &p in &members[1..] {
            acc = T::combine(op, acc, T::make(hash(p, c, i)));
        }
        acc.write(&mut out[i as usize * T::SIZE..]);
    }
    out
}

macro_rules! by_type {
    ($tc:expr, $f:ident, $($a:expr),*) => {
        match $tc {
            0 => $f::<i8>($($a),*),
            1 => $f::<u16>($($a),*),
            2 => $f::<i32>($($a),*),
            3 => $f::<u64>($($a),*),
            4 => $f::<f32>($($a),*),
            5 => $f::<f64>($($a),*),
            6 => $f::<half::f16>($($a),*),
            _ => $f::<half::bf16>($($a),*),
        }
    };
}

/// What world PE `pe` (team PE `me`; team `d`) writes into case `c`'s
/// source before the kernel.
pub fn source(case: &Case, c: usize, d: &TeamDesc, me: i32) -> Vec<u8> {
    let pe = d.world_pe(me);
    let (n, es) = (case.n, case.elem());
    let sz = d.size as u64;
    let mut s = match case.kind {
        Kind::Reduce => by_type!(case.tc, values, pe, c, n),
        Kind::Broadcast | Kind::Fcollect | Kind::TBroadcast | Kind::TFcollect => pattern(pe as u32, 0, c as u32, n * es),
        Kind::Collect | Kind::TCollect => pattern(pe as u32, 0, c as u32, (n + 3 * me as u64) * es),
        Kind::Alltoall | Kind::TAlltoall => (0..sz).flat_map(|j| pattern(pe as u32, j as u32, c as u32, n * es)).collect(),
        Kind::Barrier => Vec::new(),
    };
    s.resize(case.src_bytes as usize, 0);
    s
}

/// What case `c`'s destination holds on team PE `me` of `d` afterwards
/// (`dst_bytes` bytes), or `None` for Barrier (checked by the kernel).
pub fn expect(case: &Case, c: usize, d: &TeamDesc, me: i32) -> Option<Vec<u8>> {
    let members: Vec<i32> = (0..d.size).map(|j| d.world_pe(j)).collect();
    let (n, es) = (case.n, case.elem());
    let mut e = match case.kind {
        Kind::Reduce => by_type!(case.tc, fold, &members, c, case.op, n),
        Kind::Broadcast | Kind::TBroadcast => pattern(members[case.root as usize] as u32, 0, c as u32, n * es),
        Kind::Fcollect | Kind::TFcollect => members.iter().flat_map(|&p| pattern(p as u32, 0, c as u32, n * es)).collect(),
        Kind::Collect | Kind::TCollect => {
            members.iter().enumerate().flat_map(|(j, &p)| pattern(p as u32, 0, c as u32, (n + 3 * j as u64) * es)).collect()
        }
        Kind::Alltoall | Kind::TAlltoall => members.iter().flat_map(|&p| pattern(p as u32, me as u32, c as u32, n * es)).collect(),
        Kind::Barrier => return None,
    };
    e.resize(case.dst_bytes as usize, 0);
    Some(e)
}

/// Compare a destination element by element: `None` when equal, else a
/// message with the number of differing elements and the first few (index,
/// got, expected), decoded as the case's type.
pub fn compare(case: &Case, got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None;
    }
    let es = case.elem() as usize;
    let show = |b: &[u8]| -> String {
        if case.kind == Kind::Reduce || !matches!(case.kind, Kind::Broadcast | Kind::Fcollect | Kind::Collect | Kind::Alltoall) {
            match TYPES[case.tc as usize].0 {
                0 => format!("{}", b[0] as i8),
                1 => format!("{}", u16::from_le_bytes([b[0], b[1]])),
                2 => format!("{}", i32::from_le_bytes(b[..4].try_into().expect("4"))),
                3 => format!("{:#x}", u64::from_le_bytes(b[..8].try_into().expect("8"))),
                4 => format!("{:?}", f32::from_le_bytes(b[..4].try_into().expect("4"))),
                5 => format!("{:?}", f64::from_le_bytes(b[..8].try_into().expect("8"))),
                6 => format!("{:?}", half::f16::from_le_bytes([b[0], b[1]])),
                _ => format!("{:?}", half::bf16::from_le_bytes([b[0], b[1]])),
            }
        } else {
            format!("{:#04x}", b[0])
        }
    };
    let bad: Vec<usize> = (0..got.len() / es).filter(|&i| got[i * es..(i + 1) * es] != want[i * es..(i + 1) * es]).collect();
    let first: Vec<String> = bad
        .iter()
        .take(4)
        .map(|&i| format!("[{i}] got {} expected {}", show(&got[i * es..]), show(&want[i * es..])))
        .collect();
    Some(format!("{} of {} elements differ: {}", bad.len(), got.len() / es, first.join(", ")))
}

/// The device side of the check: `coll` runs the cases on `team`, then the
/// bad-input calls.
pub const COLL: &str = r#"
/* A case (8 u64): kind, type code, op, n, src heap offset, dst heap offset, root, unused. */
__device__ __noinline__ int red_(cpnet_ctx_t* c, int t, unsigned tc, unsigned op, void* d, const void* s, u64 n)
{
#define RB_(NAME, TYPE) switch (op) { \
    case 0: return cpnet_##NAME##_and_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 1: return cpnet_##NAME##_or_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 2: return cpnet_##NAME##_xor_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 3: return cpnet_##NAME##_min_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 4: return cpnet_##NAME##_max_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 5: return cpnet_##NAME##_sum_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 6: return cpnet_##NAME##_prod_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    default: return -2; }
#define RF_(NAME, TYPE) switch (op) { \
    case 3: return cpnet_##NAME##_min_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 4: return cpnet_##NAME##_max_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 5: return cpnet_##NAME##_sum_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 6: return cpnet_##NAME##_prod_reduce(c, t, (TYPE*)d, (const TYPE*)s, n); \
    default: return -2; }
    switch (tc) {
    case 0: RB_(int8, int8_t)
    case 1: RB_(uint16, unsigned short)
    case 2: RB_(int32, int32_t)
    case 3: RB_(uint64, uint64_t)
    case 4: RF_(float, float)
    case 5: RF_(double, double)
    case 6: RF_(half, cpnet_half_t)
    case 7: RF_(bfloat16, cpnet_bfloat16_t)
    default: return -3;
    }
}

/* The typed forms the cases use (type code: 0 int8, 1 uint16, 2 int32, 3 uint64, 5 double). */
__device__ __noinline__ int typed_(cpnet_ctx_t* c, int t, unsigned kind, unsigned tc, void* d, const void* s, u64 n, int root)
{
#define TY_(NAME, TYPE) switch (kind) { \
    case 5: return cpnet_##NAME##_broadcast(c, t, (TYPE*)d, (const TYPE*)s, n, root); \
    case 6: return cpnet_##NAME##_fcollect(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 7: return cpnet_##NAME##_alltoall(c, t, (TYPE*)d, (const TYPE*)s, n); \
    case 8: return cpnet_##NAME##_collect(c, t, (TYPE*)d, (const TYPE*)s, n); \
    default: return -2; }
    switch (tc) {
    case 0: TY_(int8, int8_t)
    case 1: TY_(uint16, unsigned short)
    case 2: TY_(int32, int32_t)
    case 3: TY_(uint64, uint64_t)
    case 5: TY_(double, double)
    default: return -3;
    }
}

/* codes: 2 words per case (code, aux), then my_pe, n_pes, translate(j -> world) x 8, then the bad calls.
 * guard: GUARD_BYTES the host filled; the bad calls point at it. bad_team: the team argument of the bad calls. */
extern "C" __global__ void coll(cpnet_handle_t h, int team, const u64* cases, unsigned ncases, long long* codes,
                                u64* logs, u8* guard, int bad_team)
{
    BEGIN(h, logs);
    const int tme = cpnet_team_my_pe(&ctx, team), tn = cpnet_team_n_pes(&ctx, team);
    for (unsigned k = 0; k < ncases; ++k) {
        const u64* cs = cases + 8 * k;
        const unsigned kind = (unsigned)cs[0], tc = (unsigned)cs[1], op = (unsigned)cs[2];
        const u64 n = cs[3];
        void* const dst = (void*)(h.heap_base + cs[5]);
        const void* const src = (const void*)(h.heap_base + cs[4]);
        const int root = (int)cs[6];
        int r = -1;
        u64 aux = 0;
        switch (kind) {
        case 0: r = red_(&ctx, team, tc, op, dst, src, n); break;
        case 1: r = cpnet_broadcastmem(&ctx, team, dst, src, n, root); break;
        case 2: r = cpnet_fcollectmem(&ctx, team, dst, src, n); break;
        case 3: {
            __shared__ cpnet_size_t total;
            r = cpnet_collectmem(&ctx, team, dst, src, n + 3 * (u64)tme, &total);
            aux = total;
            break;
        }
        case 4: r = cpnet_alltoallmem(&ctx, team, dst, src, n); break;
        case 5: case 6: case 7: r = typed_(&ctx, team, kind, tc, dst, src, n, root); break;
        case 8: r = typed_(&ctx, team, kind, tc, dst, src, n + 3 * (u64)tme, root); break;
        case 9: {
            u64* const slots = (u64*)dst;
            for (unsigned rd = 1; rd <= n; ++rd) {
                for (int j = 0; j < tn; ++j)
                    cpnet_uint64_p(&ctx, slots + tme, (u64)rd * 1000 + tme, cpnet_team_translate_pe(&ctx, team, j, CPNET_TEAM_WORLD));
                EXPECT_EQ(cpnet_team_barrier(&ctx, team), CPNET_E_OK, rd);
                for (int j = 0; j < tn; ++j) EXPECT_WORD(slots + j, (u64)rd * 1000 + j, ((u64)rd << 8) | j);
                EXPECT_EQ(cpnet_team_sync(&ctx, team), CPNET_E_OK, rd);
            }
            r = CPNET_E_OK;
            break;
        }
        default: break;
        }
        if (leader_()) { codes[2 * k] = r; codes[2 * k + 1] = (long long)aux; }
        __syncthreads();
    }
    long long* const q = codes + 2 * (u64)ncases;
    if (leader_()) {
        q[0] = tme;
        q[1] = tn;
        for (int j = 0; j < 8; ++j) q[2 + j] = cpnet_team_translate_pe(&ctx, team, j, CPNET_TEAM_WORLD);
    }
    /* The bad calls: every one refused, the guard untouched. */
    long long* const b = q + 2 + 8;
    int* const gi = (int*)guard;
    unsigned k = 0;
#define BAD_(call) do { const long long r_ = (call); if (leader_()) b[k] = r_; ++k; __syncthreads(); } while (0)
    BAD_(cpnet_int32_sum_reduce(&ctx, -1, gi, gi + 16, 4));
    BAD_(cpnet_int32_sum_reduce(&ctx, CPNET_MAX_TEAMS, gi, gi + 16, 4));
    BAD_(cpnet_int32_sum_reduce(&ctx, 63, gi, gi + 16, 4));
    BAD_(cpnet_int32_sum_reduce(&ctx, bad_team, gi, gi + 16, 4));
    BAD_(cpnet_team_sync(&ctx, bad_team));
    BAD_(cpnet_team_barrier(&ctx, bad_team));
    BAD_(cpnet_broadcastmem(&ctx, bad_team, guard, guard + 64, 64, 0));
    BAD_(cpnet_alltoallmem(&ctx, -1, guard, guard + 64, 64));
    BAD_(cpnet_team_my_pe(&ctx, -1));
    BAD_(cpnet_team_n_pes(&ctx, -1));
    BAD_(cpnet_team_translate_pe(&ctx, CPNET_TEAM_WORLD, cpnet_n_pes(&ctx), CPNET_TEAM_WORLD));
    BAD_(cpnet_team_translate_pe(&ctx, -1, 0, CPNET_TEAM_WORLD));
    if (tme >= 0) {
        BAD_(cpnet_broadcastmem(&ctx, team, guard, guard + 64, 64, tn));
        BAD_(cpnet_broadcastmem(&ctx, team, guard, guard + 64, 64, -1));
    }
    END();
}

"#;

/// The device side of the benchmarks (`coll_bench`: barrier, sync and float
/// sum reductions; `a2a_bench`: alltoall), apart from [`COLL`] so that they
/// compile in seconds (the check's 44 reductions take most of a minute).
pub const COLL_BENCH: &str = r#"
/* out[0..]: ns per call, averaged over iters: barrier, sync, then float sum reduce of each size of sizes[0..nsizes). */
#ifndef COLL_BENCH_THREADS
#define COLL_BENCH_THREADS 1024
#endif
extern "C" __global__ void __launch_bounds__(COLL_BENCH_THREADS) coll_bench(cpnet_handle_t h, int team, unsigned iters, const u64* sizes, unsigned nsizes,
                                      float* src, float* dst, u64* out, u64* logs)
{
    BEGIN(h, logs);
    EXPECT_EQ(cpnet_team_sync(&ctx, team), CPNET_E_OK, 0);
    for (unsigned w = 0; w < 2 + nsizes; ++w) {
        for (unsigned i = 0; i < 10; ++i) /* warm-up */
            if (w == 0) cpnet_team_barrier(&ctx, team);
            else if (w == 1) cpnet_team_sync(&ctx, team);
            else cpnet_float_sum_reduce(&ctx, team, dst, src, sizes[w - 2] / 4);
        EXPECT_EQ(cpnet_team_sync(&ctx, team), CPNET_E_OK, w);
        const u64 t0 = cpnet_globaltimer_ns();
        int bad = 0;
        for (unsigned i = 0; i < iters; ++i) {
            int r;
            if (w == 0) r = cpnet_team_barrier(&ctx, team);
            else if (w == 1) r = cpnet_team_sync(&ctx, team);
            else r = cpnet_float_sum_reduce(&ctx, team, dst, src, sizes[w - 2] / 4);
            bad |= r;
        }
        const u64 t1 = cpnet_globaltimer_ns();
        EXPECT_EQ(bad, CPNET_E_OK, w);
        if (leader_()) out[w] = (t1 - t0) / iters;
        __syncthreads();
    }
    END();
}

/* cpnet_alltoallmem of sizes[w] bytes per pair, iters[w] calls each after 3
 * warm-ups (every call returns with this PE's dest complete); out[w] = ns per
 * call. src and dst hold n_pes * the largest size. */
extern "C" __global__ void __launch_bounds__(COLL_BENCH_THREADS) a2a_bench(cpnet_handle_t h, int team, const u64* sizes, const u64* iters, unsigned nsizes,
                                     u8* src, u8* dst, u64* out, u64* logs)
{
    BEGIN(h, logs);
    for (unsigned w = 0; w < nsizes; ++w) {
        for (unsigned i = 0; i < 3; ++i) cpnet_alltoallmem(&ctx, team, dst, src, sizes[w]);
        EXPECT_EQ(cpnet_team_sync(&ctx, team), CPNET_E_OK, w);
        const u64 t0 = cpnet_globaltimer_ns();
        int bad = 0;
        for (u64 i = 0; i < iters[w]; ++i) bad |= cpnet_alltoallmem(&ctx, team, dst, src, sizes[w]);
        const u64 t1 = cpnet_globaltimer_ns();
        EXPECT_EQ(bad, CPNET_E_OK, w);
        if (leader_()) out[w] = (t1 - t0) / iters[w];
        __syncthreads();
    }
    END();
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_and_cover_two_reduce_rounds() {
        let (cs, total) = cases(3, 16_256);
        let mut spans: Vec<(u64, u64)> = cs.iter().flat_map(|c| [(c.src, c.src_bytes), (c.dst, c.dst_bytes)]).collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 + 64 <= w[1].0, "{w:?}");
        }
        assert!(spans.last().map(|s| s.0 + s.1).unwrap_or(0) <= total);
        assert!(cs.iter().any(|c| c.kind == Kind::Reduce && c.n * c.elem() > 2 * 16_256));
        // and/or/xor only on integers: 4 integer types x 7 ops + 4 float types x 4 ops, 3 sizes each,
        // and the several-round size for sum and min of each type.
        assert_eq!(cs.iter().filter(|c| c.kind == Kind::Reduce).count(), (4 * 7 + 4 * 4) * 3 + 8 * 2);
    }

    #[test]
    fn expectations_fold_in_team_order() {
        let d = TeamDesc::new(1, 2, 2, 3, 0, 1 << 16).expect("a team");
        let (cs, _) = cases(d.size, d.chunk);
        let c = cs.iter().position(|c| c.kind == Kind::Reduce && c.tc == 4 && c.op == ReduceOp::Sum && c.n == 7).expect("float sum 7");
        let e = expect(&cs[c], c, &d, 1).expect("a reduce");
        let a = values::<f32>(1, c, 7);
        let b = values::<f32>(3, c, 7);
        for i in 0..7 {
            let x = f32::from_le_bytes(a[4 * i..4 * i + 4].try_into().unwrap()) + f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap());
            assert_eq!(&e[4 * i..4 * i + 4], &x.to_le_bytes());
        }
        // alltoall: block j of member me's dest is member j's block me.
        let a2a = cs.iter().position(|c| c.kind == Kind::Alltoall && c.n == 7).expect("alltoall 7");
        let src1 = source(&cs[a2a], a2a, &d, 1);
        let dst0 = expect(&cs[a2a], a2a, &d, 0).expect("alltoall");
        assert_eq!(&dst0[7..14], &src1[0..7]);
    }
}
