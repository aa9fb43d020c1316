//! Loopback tests: two endpoints (two domains of one fabric) in this process, for each
//! provider cpnet supports without hardware (`shm`, `tcp;ofi_rxm`).
//!
//! Every wait is bounded by [`TIMEOUT`] and names the provider and the operation when
//! it expires. Both completion queues are polled in every wait: with manual progress the
//! target only executes emulated operations (rxm atomics) while its queue is polled.

use std::rc::Rc;
use std::time::{Duration, Instant};

use cpnet_fabric_sys as sys;

use super::*;

/// Longest any single operation may take before the test fails.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Words in each side's registered heap.
const HEAP_WORDS: usize = 64;
/// First word of the scratch area (local operands and results); words below it are
/// the area peers target.
const SCRATCH: usize = 32;
/// Scratch word holding an atomic operand.
const OPERAND: usize = SCRATCH;
/// Scratch word holding a compare value.
const COMPARE: usize = SCRATCH + 1;
/// Scratch word receiving a fetched value.
const RESULT: usize = SCRATCH + 2;
/// Scratch words read back into.
const READ_BACK: usize = SCRATCH + 8;
/// Scratch words written from.
const WRITE_SRC: usize = SCRATCH + 16;

/// A heap of `u64` words that the fabric reads and writes behind Rust's back, so it is
/// only touched through raw pointers.
struct Heap {
    ptr: *mut u64,
    words: usize,
}

impl Heap {
    fn new(words: usize) -> Heap {
        let b: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        Heap {
            ptr: Box::into_raw(b).cast(),
            words,
        }
    }

    fn get(&self, i: usize) -> u64 {
        assert!(i < self.words);
        // SAFETY: in bounds, aligned, and the allocation lives as long as `self`; the
        // fabric only writes during CQ polls on this thread (manual progress), never
        // concurrently with this read.
        unsafe { self.ptr.add(i).read_volatile() }
    }

    fn set(&self, i: usize, v: u64) {
        assert!(i < self.words);
        // SAFETY: as in `get`.
        unsafe { self.ptr.add(i).write_volatile(v) }
    }

    fn bytes(&self) -> usize {
        self.words * 8
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`words` came from Box::into_raw of a boxed slice of that length;
        // the region registered over it was dropped first (field order in `Side`).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.words)) });
    }
}

/// One PE: a domain with its CQ, AV, endpoint and registered heap. Fields drop in
/// order: the region before the endpoint before the heap.
struct Side {
    mr: MemoryRegion,
    ep: Rc<Endpoint>,
    cq: Rc<CompletionQueue>,
    av: Rc<AddressVector>,
    heap: Heap,
    /// The other side, in our AV.
    peer: FiAddr,
    /// The other side's heap.
    peer_mem: RemoteMemory,
}

impl Side {
    fn open(fabric: &Rc<Fabric>) -> Side {
        let domain = Domain::open(fabric).expect("fi_domain");
        let cq = CompletionQueue::open(&domain, 128).expect("fi_cq_open");
        let av = AddressVector::open(&domain, 2).expect("fi_av_open");
        let ep = Endpoint::open(&domain, &cq, &av).expect("endpoint");
        let heap = Heap::new(HEAP_WORDS);
        // SAFETY: the heap outlives the region (field order) and is only accessed
        // through raw pointers.
        let mr =
            unsafe { MemoryRegion::register(&domain, heap.ptr.cast(), heap.bytes(), Some(&ep)) }
                .expect("fi_mr_reg");
        Side {
            mr,
            ep,
            cq,
            av,
            heap,
            peer: FiAddr(sys::FI_ADDR_NOTAVAIL),
            peer_mem: RemoteMemory {
                base: 0,
                len: 0,
                key: MrKey(0),
            },
        }
    }

    fn local(&self, word: usize) -> LocalBuf {
        self.mr.local(word * 8)
    }

    fn local_mut(&self, word: usize) -> LocalBufMut {
        self.mr.local_mut(word * 8)
    }

    /// The peer's heap at `word`, for `len` bytes.
    fn target(&self, word: usize, len: usize) -> RemoteTarget {
        self.peer_mem
            .target(self.peer, (word * 8) as u64, len as u64)
            .expect("inside heap")
    }
}

/// Two connected sides; `a` initiates, `b` is the target.
struct Pair {
    a: Side,
    b: Side,
    provider: String,
    info: Info,
    next_ctx: std::cell::Cell<u64>,
}

impl Pair {
    fn new(req: InfoRequest) -> Pair {
        let info = Info::get(&req).unwrap_or_else(|e| panic!("fi_getinfo for {req:?}: {e}"));
        let fabric = Fabric::open(&info).expect("fi_fabric");
        let mut a = Side::open(&fabric);
        let mut b = Side::open(&fabric);
        a.peer = a.av.insert(b.ep.name()).expect("insert b into a's AV");
        b.peer = b.av.insert(a.ep.name()).expect("insert a into b's AV");
        a.peer_mem = b.mr.remote();
        b.peer_mem = a.mr.remote();
        Pair {
            a,
            b,
            provider: info.provider_name(),
            info,
            next_ctx: std::cell::Cell::new(0x100),
        }
    }

    fn ctx(&self) -> u64 {
        let c = self.next_ctx.get();
        self.next_ctx.set(c + 1);
        c
    }

    /// Posts (retrying on `Again` while progressing both queues) and waits for the
    /// completion of `ctx` on `a`'s queue.
    fn run(&self, what: &str, ctx: u64, post: impl Fn() -> Result<Post>) -> Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        while post()? == Post::Again {
            self.progress_target()?;
            let mut buf = [0u64; 8];
            let n = self.a.cq.poll(&mut buf)?;
            assert_eq!(
                n,
                0,
                "{}: unexpected completions {:?} while retrying {what}",
                self.provider,
                &buf[..n]
            );
            assert!(
                Instant::now() < deadline,
                "{}: {what} stayed -FI_EAGAIN for {TIMEOUT:?}",
                self.provider
            );
        }
        let mut buf = [0u64; 8];
        loop {
            self.progress_target()?;
            let n = self.a.cq.poll(&mut buf)?;
            if n > 0 {
                assert_eq!(
                    &buf[..n],
                    &[ctx],
                    "{}: {what}: wrong completion",
                    self.provider
                );
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what} (context {ctx:#x}) did not complete within {TIMEOUT:?}",
                self.provider
            );
        }
    }

    /// Polls `b`'s queue, which drives target-side progress; `b` posts nothing, so
    /// any completion there is a bug.
    fn progress_target(&self) -> Result<()> {
        let mut buf = [0u64; 8];
        let n = self.b.cq.poll(&mut buf)?;
        assert_eq!(
            n,
            0,
            "{}: completions {:?} on the target's queue",
            self.provider,
            &buf[..n]
        );
        Ok(())
    }

    fn atomic(&self, op: AtomicOp, ty: AtomicType, word: usize, operand: u64) {
        self.a.heap.set(OPERAND, operand);
        let ctx = self.ctx();
        let what = format!("fi_atomic {op:?} {ty:?}");
        self.run(&what, ctx, || {
            // SAFETY: operand word is in a's registered heap and untouched until the
            // completion; the peer address came from a's AV.
            unsafe {
                self.a.ep.atomic(
                    op,
                    ty,
                    self.a.local(OPERAND),
                    1,
                    self.a.target(word, ty.size()),
                    ctx,
                )
            }
        })
        .unwrap_or_else(|e| panic!("{}: {what}: {e}", self.provider));
    }

    /// Fetching atomic on `word` of `b`; returns the fetched (old) value.
    fn fetch(&self, op: AtomicOp, ty: AtomicType, word: usize, operand: u64) -> u64 {
        self.a.heap.set(OPERAND, operand);
        self.a.heap.set(RESULT, 0xdead_beef_dead_beef);
        let ctx = self.ctx();
        let what = format!("fi_fetch_atomic {op:?} {ty:?}");
        self.run(&what, ctx, || {
            // SAFETY: operand and result words are in a's registered heap, untouched
            // until the completion; the peer address came from a's AV.
            unsafe {
                self.a.ep.fetch_atomic(
                    op,
                    ty,
                    self.a.local(OPERAND),
                    self.a.local_mut(RESULT),
                    1,
                    self.a.target(word, ty.size()),
                    ctx,
                )
            }
        })
        .unwrap_or_else(|e| panic!("{}: {what}: {e}", self.provider));
        self.a.heap.get(RESULT)
    }

    /// `FI_CSWAP` on `word` of `b`; returns the fetched (old) value.
    fn cswap(&self, ty: AtomicType, word: usize, compare: u64, new: u64) -> u64 {
        self.a.heap.set(OPERAND, new);
        self.a.heap.set(COMPARE, compare);
        self.a.heap.set(RESULT, 0xdead_beef_dead_beef);
        let ctx = self.ctx();
        self.run("fi_compare_atomic FI_CSWAP", ctx, || {
            // SAFETY: operand, compare and result words are in a's registered heap,
            // untouched until the completion; the peer address came from a's AV.
            unsafe {
                self.a.ep.compare_atomic(
                    AtomicOp::Cswap,
                    ty,
                    self.a.local(OPERAND),
                    self.a.local(COMPARE),
                    self.a.local_mut(RESULT),
                    1,
                    self.a.target(word, ty.size()),
                    ctx,
                )
            }
        })
        .unwrap_or_else(|e| panic!("{}: fi_compare_atomic: {e}", self.provider));
        self.a.heap.get(RESULT)
    }

    /// Writes `a`'s WRITE_SRC words to `dst` and returns the result of waiting.
    fn write_to(&self, dst: RemoteTarget, len: usize) -> Result<()> {
        let ctx = self.ctx();
        self.run("fi_write", ctx, || {
            // SAFETY: the source words are in a's registered heap, untouched until the
            // completion; the peer address came from a's AV.
            unsafe { self.a.ep.write(self.a.local(WRITE_SRC), len, dst, ctx) }
        })
        .inspect_err(|e| {
            if let Some(c) = e.op_context() {
                assert_eq!(
                    c, ctx,
                    "{}: error completion carries the wrong context",
                    self.provider
                );
            }
        })
    }
}

fn i32_lo(w: u64) -> i32 {
    (w & 0xffff_ffff) as u32 as i32
}

fn with_i32_lo(w: u64, v: i32) -> u64 {
    (w & !0xffff_ffff) | u64::from(v as u32)
}

fn write_then_read_round_trips(req: InfoRequest) {
    let p = Pair::new(req);
    for i in 0..8 {
        p.a.heap
            .set(WRITE_SRC + i, 0x0101_0101_0101_0101 * (i as u64 + 1));
    }
    p.write_to(p.a.target(0, 64), 64).unwrap();
    for i in 0..8 {
        assert_eq!(
            p.b.heap.get(i),
            0x0101_0101_0101_0101 * (i as u64 + 1),
            "{}: word {i}",
            p.provider
        );
    }
    p.b.heap.set(3, 0xfeed_face_cafe_f00d);
    let ctx = p.ctx();
    p.run("fi_read", ctx, || {
        // SAFETY: read-back words are in a's registered heap and not touched until the
        // completion; the peer address came from a's AV.
        unsafe {
            p.a.ep
                .read(p.a.local_mut(READ_BACK), 64, p.a.target(0, 64), ctx)
        }
    })
    .unwrap();
    for i in 0..8 {
        assert_eq!(
            p.a.heap.get(READ_BACK + i),
            p.b.heap.get(i),
            "{}: read word {i}",
            p.provider
        );
    }
    assert_eq!(p.a.heap.get(READ_BACK + 3), 0xfeed_face_cafe_f00d);
}

/// `fi_inject_write` lands (while the target progresses) and writes no
/// completion on the initiator's queue.
fn inject_write_lands_without_a_completion(req: InfoRequest) {
    let p = Pair::new(req);
    assert!(p.info.inject_size() >= 16, "{}: inject size {}", p.provider, p.info.inject_size());
    for (i, v) in [0x1122_3344_5566_7788u64, 0x99aa_bbcc_ddee_ff00].into_iter().enumerate() {
        let mut bytes = v.to_le_bytes();
        let t = p.a.target(4 + i, 8);
        let deadline = Instant::now() + TIMEOUT;
        // SAFETY: 8 bytes fit the inject size; the target is b's registered heap
        // (RemoteMemory::target), the peer came from a's AV.
        while unsafe { p.a.ep.inject_write(&bytes, t) }.unwrap() == Post::Again {
            p.progress_target().unwrap();
            assert!(Instant::now() < deadline, "{}: fi_inject_write stayed -FI_EAGAIN", p.provider);
        }
        // The buffer is ours again at once.
        bytes.fill(0);
        let mut buf = [0u64; 8];
        while p.b.heap.get(4 + i) != v {
            p.progress_target().unwrap();
            assert_eq!(p.a.cq.poll(&mut buf).unwrap(), 0, "{}: an injected write completed", p.provider);
            assert!(Instant::now() < deadline, "{}: the injected write never landed", p.provider);
        }
    }
}

fn zero_length_write_completes(req: InfoRequest) {
    let p = Pair::new(req);
    p.b.heap.set(0, 77);
    p.write_to(p.a.target(0, 0), 0).unwrap();
    assert_eq!(p.b.heap.get(0), 77);
}

fn writemsg_with_delivery_complete_lands(req: InfoRequest) {
    let p = Pair::new(req);
    p.a.heap.set(WRITE_SRC, 0x1234_5678_9abc_def0);
    let ctx = p.ctx();
    p.run("fi_writemsg FI_DELIVERY_COMPLETE", ctx, || {
        // SAFETY: the source word is in a's registered heap, untouched until the
        // completion; the peer address came from a's AV.
        unsafe {
            p.a.ep.writemsg(
                p.a.local(WRITE_SRC),
                8,
                p.a.target(5, 8),
                ctx,
                sys::FI_DELIVERY_COMPLETE,
            )
        }
    })
    .unwrap();
    assert_eq!(p.b.heap.get(5), 0x1234_5678_9abc_def0);
}

fn atomic_sum_u64_and_i32(req: InfoRequest) {
    let p = Pair::new(req);
    p.b.heap.set(8, 40);
    p.atomic(AtomicOp::Sum, AtomicType::U64, 8, 2);
    assert_eq!(p.b.heap.get(8), 42, "{}", p.provider);
    p.atomic(AtomicOp::Sum, AtomicType::U64, 8, u64::MAX); // wraps: 42 - 1
    assert_eq!(p.b.heap.get(8), 41, "{}", p.provider);

    // Low i32 of word 9 (little endian); the high half must not change.
    p.b.heap.set(9, with_i32_lo(0x7fff_ffff_0000_0000, -5));
    p.atomic(AtomicOp::Sum, AtomicType::I32, 9, u64::from(7i32 as u32));
    assert_eq!(i32_lo(p.b.heap.get(9)), 2, "{}", p.provider);
    p.atomic(
        AtomicOp::Sum,
        AtomicType::I32,
        9,
        u64::from((-10i32) as u32),
    );
    assert_eq!(i32_lo(p.b.heap.get(9)), -8, "{}", p.provider);
    assert_eq!(
        p.b.heap.get(9) >> 32,
        0x7fff_ffff,
        "{}: neighbour i32 changed",
        p.provider
    );
}

fn fetch_atomic_ops_return_old_values(req: InfoRequest) {
    let p = Pair::new(req);
    let (w, u) = (10, AtomicType::U64);
    p.b.heap.set(w, 100);
    assert_eq!(p.fetch(AtomicOp::Sum, u, w, 5), 100);
    assert_eq!(p.b.heap.get(w), 105);
    assert_eq!(p.fetch(AtomicOp::Read, u, w, 999), 105);
    assert_eq!(
        p.b.heap.get(w),
        105,
        "{}: FI_ATOMIC_READ changed the target",
        p.provider
    );
    assert_eq!(p.fetch(AtomicOp::Write, u, w, 0b0111), 105); // swap
    assert_eq!(p.b.heap.get(w), 0b0111);
    assert_eq!(p.fetch(AtomicOp::Band, u, w, 0b0110), 0b0111);
    assert_eq!(p.b.heap.get(w), 0b0110);
    assert_eq!(p.fetch(AtomicOp::Bor, u, w, 0b1000), 0b0110);
    assert_eq!(p.b.heap.get(w), 0b1110);
    assert_eq!(p.fetch(AtomicOp::Bxor, u, w, 0b0011), 0b1110);
    assert_eq!(p.b.heap.get(w), 0b1101);

    // Signed 64-bit sum going negative.
    assert_eq!(
        p.fetch(AtomicOp::Sum, AtomicType::I64, w, (-20i64) as u64),
        13
    );
    assert_eq!(p.b.heap.get(w) as i64, -7);

    // 32-bit fetch-add only touches its own half.
    p.b.heap.set(12, 0xaaaa_aaaa_0000_0010);
    let old = p.fetch(AtomicOp::Sum, AtomicType::U32, 12, 0x20);
    assert_eq!(old & 0xffff_ffff, 0x10, "{}", p.provider);
    assert_eq!(p.b.heap.get(12), 0xaaaa_aaaa_0000_0030, "{}", p.provider);
}

fn compare_atomic_cswap(req: InfoRequest) {
    let p = Pair::new(req);
    let w = 11;
    p.b.heap.set(w, 5);
    assert_eq!(
        p.cswap(AtomicType::U64, w, 4, 9),
        5,
        "{}: failed cswap returns old",
        p.provider
    );
    assert_eq!(p.b.heap.get(w), 5, "{}: failed cswap wrote", p.provider);
    assert_eq!(p.cswap(AtomicType::U64, w, 5, 9), 5, "{}", p.provider);
    assert_eq!(p.b.heap.get(w), 9, "{}: cswap did not write", p.provider);
    p.b.heap.set(w, 0xffff_ffff_8000_0000);
    assert_eq!(
        p.cswap(AtomicType::I32, w, 0x8000_0000, 1) & 0xffff_ffff,
        0x8000_0000
    );
    assert_eq!(p.b.heap.get(w), 0xffff_ffff_0000_0001, "{}", p.provider);
}

/// Posts each operation that waits for the target's answer (read, fetching atomic,
/// write with `FI_DELIVERY_COMPLETE`) at a target the peer must reject (`bad` turns a
/// good target into such a one), each on a fresh pair, and checks it comes back as an
/// error completion carrying its context, in bounded time. Then checks that a plain
/// write there is dropped: it completes (the initiator is not told) and nothing lands.
///
/// rxm over tcp drops the connection after such an error, so later operations to the
/// same peer fail too (`-FI_ENOTCONN`); each case therefore gets its own pair.
fn rejected_target_is_an_error_not_a_hang(
    req: impl Fn() -> InfoRequest,
    bad: impl Fn(&Pair, RemoteTarget) -> RemoteTarget,
    what: &str,
) {
    for kind in [
        "fi_read",
        "fi_fetch_atomic",
        "fi_writemsg FI_DELIVERY_COMPLETE",
    ] {
        let p = Pair::new(req());
        p.b.heap.set(0, 1);
        let dst = bad(&p, p.a.target(0, 8));
        let ctx = p.ctx();
        let r = p.run(kind, ctx, || {
            // SAFETY: all local buffers are in a's registered heap and untouched until
            // the completion; the peer address came from a's AV; the remote address is
            // wrong on purpose, and this provider checks it at the target.
            unsafe {
                match kind {
                    "fi_read" => p.a.ep.read(p.a.local_mut(READ_BACK), 8, dst, ctx),
                    "fi_fetch_atomic" => p.a.ep.fetch_atomic(
                        AtomicOp::Sum,
                        AtomicType::U64,
                        p.a.local(OPERAND),
                        p.a.local_mut(RESULT),
                        1,
                        dst,
                        ctx,
                    ),
                    _ => p.a.ep.writemsg(
                        p.a.local(WRITE_SRC),
                        8,
                        dst,
                        ctx,
                        sys::FI_DELIVERY_COMPLETE,
                    ),
                }
            }
        });
        let e = r.expect_err(&format!("{}: {kind} with {what} succeeded", p.provider));
        eprintln!("{}: {kind} with {what} -> {e}", p.provider);
        assert_eq!(e.op_context(), Some(ctx), "{}: {kind}: {e}", p.provider);
        assert!(
            matches!(e, FabricError::Completion { .. }),
            "{}: {kind}: {e}",
            p.provider
        );
        assert_eq!(
            p.b.heap.get(0),
            1,
            "{}: {kind} with {what} changed the target",
            p.provider
        );
    }
    // A plain write completes at the initiator before the target checks it; the target
    // drops it and nobody is told.
    let p = Pair::new(req());
    p.b.heap.set(0, 1);
    p.a.heap.set(WRITE_SRC, 2);
    p.write_to(bad(&p, p.a.target(0, 8)), 8)
        .expect("plain write completes locally");
    // Let the target see it, then check it did not land.
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        let _ = p.progress_target();
    }
    assert_eq!(
        p.b.heap.get(0),
        1,
        "{}: plain write with {what} landed",
        p.provider
    );
}

/// Prints what the provider granted (run with `--nocapture`) and checks the basics.
fn reports_granted_attributes(req: InfoRequest) {
    let p = Pair::new(req.clone());
    let info = &p.info;
    eprintln!("{req:?} -> {info:?}");
    assert!(info.has_atomics());
    assert_eq!(
        info.mr_mode() & !MR_MODE_SUPPORTED,
        0,
        "granted an mr_mode we cannot honour"
    );
    assert_eq!(
        info.mode() & !MODE_SUPPORTED,
        0,
        "granted a mode we cannot honour"
    );
    assert_ne!(
        info.msg_order() & sys::FI_ORDER_SAS,
        0,
        "FI_ORDER_SAS not granted"
    );
    let ops = [
        AtomicOp::Sum,
        AtomicOp::Min,
        AtomicOp::Max,
        AtomicOp::Band,
        AtomicOp::Bor,
        AtomicOp::Bxor,
        AtomicOp::Read,
        AtomicOp::Write,
        AtomicOp::Cswap,
        AtomicOp::Mswap,
    ];
    let types = [
        AtomicType::I32,
        AtomicType::U32,
        AtomicType::I64,
        AtomicType::U64,
    ];
    for class in [AtomicClass::Plain, AtomicClass::Fetch, AtomicClass::Compare] {
        let mut line = format!("{:>8} {class:?}:", info.provider_name());
        for op in ops {
            let ok = types
                .iter()
                .all(|&ty| p.a.ep.atomic_valid(class, op, ty).unwrap().is_some());
            if ok {
                line.push_str(&format!(" {op:?}"));
            }
        }
        eprintln!("{line}");
    }
    for ty in types {
        assert!(
            p.a.ep
                .atomic_valid(AtomicClass::Plain, AtomicOp::Sum, ty)
                .unwrap()
                .is_some()
        );
        assert!(
            p.a.ep
                .atomic_valid(AtomicClass::Compare, AtomicOp::Cswap, ty)
                .unwrap()
                .is_some()
        );
    }
}

/// `fi_av_straddr` prints both endpoints' addresses, distinct, in the
/// provider's URI form; tcp's carry the address the endpoint was bound to.
fn prints_addresses(req: InfoRequest) {
    let p = Pair::new(req.clone());
    let a = p.a.av.straddr(p.a.ep.name()).expect("straddr of a");
    let b = p.a.av.straddr(p.b.ep.name()).expect("straddr of b");
    eprintln!("{}: {a} {b}", p.provider);
    assert_ne!(a, b, "two endpoints, two addresses");
    for s in [&a, &b] {
        assert!(s.starts_with("fi_") && s.contains("://"), "{s}");
    }
    if let Some(node) = &req.src_node {
        assert!(a.contains(&format!("://{node}:")), "{a} is not bound to {node}");
    }
}

macro_rules! provider_tests {
    ($name:ident, $req:expr) => {
        mod $name {
            use super::*;

            fn req() -> InfoRequest {
                $req
            }

            #[test]
            fn write_then_read_round_trips() {
                super::write_then_read_round_trips(req());
            }

            #[test]
            fn inject_write_lands_without_a_completion() {
                super::inject_write_lands_without_a_completion(req());
            }

            #[test]
            fn zero_length_write_completes() {
                super::zero_length_write_completes(req());
            }

            #[test]
            fn writemsg_with_delivery_complete_lands() {
                super::writemsg_with_delivery_complete_lands(req());
            }

            #[test]
            fn atomic_sum_u64_and_i32() {
                super::atomic_sum_u64_and_i32(req());
            }

            #[test]
            fn fetch_atomic_ops_return_old_values() {
                super::fetch_atomic_ops_return_old_values(req());
            }

            #[test]
            fn compare_atomic_cswap() {
                super::compare_atomic_cswap(req());
            }

            #[test]
            fn reports_granted_attributes() {
                super::reports_granted_attributes(req());
            }

            #[test]
            fn prints_addresses() {
                super::prints_addresses(req());
            }
        }
    };
}

provider_tests!(shm, InfoRequest::provider("shm"));
provider_tests!(tcp_rxm, tcp_loopback());

/// tcp binds to the first usable interface by default; 127.0.0.1 keeps the tests on
/// loopback without `FI_TCP_IFACE=lo`.
fn tcp_loopback() -> InfoRequest {
    InfoRequest::provider("tcp;ofi_rxm").with_src_node("127.0.0.1")
}

/// Wrong keys and addresses. Only `tcp;ofi_rxm` is tested: shm 1.17 does not check
/// them (a plain write with a wrong key lands, and a fetching atomic or a
/// delivery-complete write with one never completes), so a wrong address there would
/// corrupt the target; callers must bounds-check with [`RemoteMemory::target`].
mod tcp_rxm_errors {
    use super::*;

    #[test]
    fn bad_key_is_an_error_not_a_hang() {
        rejected_target_is_an_error_not_a_hang(
            tcp_loopback,
            |_, t| RemoteTarget {
                key: MrKey(t.key.0 ^ 0x5a5a_5a5a_0000_0077),
                ..t
            },
            "a bad key",
        );
    }

    #[test]
    fn out_of_range_address_is_an_error_not_a_hang() {
        rejected_target_is_an_error_not_a_hang(
            tcp_loopback,
            |p, t| RemoteTarget {
                addr: t.addr + p.b.heap.bytes() as u64 + (1 << 20),
                ..t
            },
            "an out-of-range address",
        );
    }
}

#[test]
fn unknown_provider_is_enodata() {
    let e = Info::get(&InfoRequest::provider("no-such-provider")).unwrap_err();
    assert_eq!(e.code(), -sys::FI_ENODATA, "{e}");
    assert!(e.to_string().starts_with("fi_getinfo failed"), "{e}");
}

#[test]
fn endpoint_rejects_queue_of_another_domain() {
    let info = Info::get(&InfoRequest::provider("shm")).unwrap();
    let fabric = Fabric::open(&info).unwrap();
    let d1 = Domain::open(&fabric).unwrap();
    let d2 = Domain::open(&fabric).unwrap();
    let cq = CompletionQueue::open(&d2, 8).unwrap();
    let av = AddressVector::open(&d1, 2).unwrap();
    let e = Endpoint::open(&d1, &cq, &av).unwrap_err();
    assert!(matches!(e, FabricError::Invalid { .. }), "{e}");
}

#[test]
fn boxed_op_context_round_trips() {
    // The FI_CONTEXT path is not exercised by shm or tcp (neither asks for it), so
    // check the context encoding on its own.
    for boxed in [false, true] {
        for user in [0, 1, 0x100, u64::MAX >> 1] {
            let raw = super::cq::OpContext::into_raw(user, boxed);
            // SAFETY: `raw` came from into_raw with the same `boxed`, released once.
            assert_eq!(unsafe { super::cq::OpContext::from_raw(raw, boxed) }, user);
        }
    }
}

/// libfabric 1.17 (Debian 12, Ubuntu 24.04) has a native TCP RDM endpoint,
/// the `net` provider, which GPU PEs use between hosts; it gives messages
/// and validates no atomic (what makes CPU PEs refuse it).
#[test]
fn native_tcp_rdm_is_net_on_libfabric_1_17() {
    // SAFETY: fi_version(3) has no preconditions.
    let v = unsafe { sys::fi_version() };
    let found = native_tcp_rdm();
    if (v >> 16, v & 0xffff) != (1, 17) {
        eprintln!("libfabric {}.{}: native TCP RDM endpoint {found:?}", v >> 16, v & 0xffff);
        return;
    }
    assert_eq!(found, Some("net"));
    let info = Info::get(&InfoRequest::provider("net").with_caps(MSG_CAPS).with_src_node("127.0.0.1")).unwrap();
    assert_eq!(info.protocol(), sys::FI_PROTO_XNET);
    let fabric = Fabric::open(&info).unwrap();
    let domain = Domain::open(&fabric).unwrap();
    let cq = CompletionQueue::open(&domain, 8).unwrap();
    let av = AddressVector::open(&domain, 2).unwrap();
    let ep = Endpoint::open(&domain, &cq, &av).unwrap();
    assert!(
        !ep.atomic_supported(AtomicClass::Fetch, AtomicOp::Sum, AtomicType::U64),
        "{:?}",
        ep.atomic_valid(AtomicClass::Fetch, AtomicOp::Sum, AtomicType::U64)
    );
}
