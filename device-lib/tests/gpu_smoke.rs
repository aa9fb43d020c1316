//! GPU smoke test of the device API against the Rust consumer: real thread
//! blocks produce into host-pinned queues mapped into the GPU, a host thread
//! consumes with `cpnet_device::ring::Consumer`, checks every field of every
//! command against a model of the kernel, and completes them (out of order
//! within each run of non-blocking commands), answering fetches.
//!
//! Runs only where there is a CUDA driver, a GPU and libnvrtc; elsewhere each
//! test prints "SKIPPED" and passes, unless `CPNET_REQUIRE_GPU=1`, which makes
//! a missing GPU a failure (set it on the GPU machine).
//!
//! Covered: lap wraps (1000+ commands through 64 slots), full-ring
//! backpressure (depth 2), sequence numbers persisting across
//! ctx_destroy/ctx_create (a second launch on the same pool), inline and
//! heap-referenced puts, put-with-signal, fence, blocking nop, fetch-add and
//! inline get results broadcast to every thread, quiet; and, separately, that
//! device waits end on a timeout (reported in cpnet_status_t), on the queue's
//! abort word and on the status block's abort word.
#![cfg(feature = "nvrtc")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cpnet_device::layout::*;
use cpnet_device::nvrtc::{self, BuildOptions};
use cpnet_device::ring::{Consumer, Outcome, QueueGeometry, QueueMem};
use cudarc::driver::{CudaContext, CudaModule, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::driver::{result as cu, sys as cusys};

const BLOCKS: u32 = 8;
const THREADS: u32 = 128;
const N_QUEUES: usize = 8;
const N_CMDS: u32 = 1000;
const HEAP_BYTES: usize = 1 << 20;

// ---------------------------------------------------------------------------
// The kernel, and its model on the host (keep the two in step)
// ---------------------------------------------------------------------------

const KERNELS: &str = r#"
#include <cpnet/device.cuh>

#define HEAP_SRC(b)    ((unsigned long long)(b) * 4096ull)
#define HEAP_DST(b, i) (262144ull + (unsigned long long)(b) * 8192ull + ((i) % 32u) * 128ull)
#define HEAP_P(b, i)   (524288ull + (unsigned long long)(b) * 1024ull + ((i) % 64u) * 4ull)
#define HEAP_CTR(b)    (786432ull + (unsigned long long)(b) * 8ull)
#define HEAP_G(i)      (786432ull + 4096ull + ((i) % 16u) * 8ull)
#define HEAP_SIG(b)    (786432ull + 8192ull + (unsigned long long)(b) * 8ull)

__device__ unsigned kind_of(unsigned b, unsigned i) { return (i * 7u + b) % 10u; }
__device__ unsigned long long put_size(unsigned b, unsigned i) { return 1ull + (i * 13u + b * 5u) % 300u; }
__device__ unsigned src_off(unsigned i) { return i % 64u; }
__device__ unsigned char src_byte(unsigned b, unsigned k) { return (unsigned char)(b * 31u + k * 7u + 1u); }

/* results[4b..4b+4] = { 1 if passed, first failing i + 1, error code, qid } */
extern "C" __global__ void smoke(cpnet_handle_t h, unsigned char* heap, int* results, unsigned n_cmds)
{
    __shared__ cpnet_ctx_t ctx;
    __shared__ int fail;
    __shared__ int fail_code;
    const unsigned b = blockIdx.x;
    const unsigned t = threadIdx.x;
    if (t == 0) { fail = 0; fail_code = 0; }
    /* Every thread writes part of the block's source bytes: the collective
     * calls' entry barrier must make them part of what the leader sends. */
    for (unsigned k = t; k < 4096u; k += blockDim.x) heap[HEAP_SRC(b) + k] = src_byte(b, k);

    const int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) {
        if (t == 0) { results[4 * b] = 0; results[4 * b + 1] = 0; results[4 * b + 2] = e; results[4 * b + 3] = -1; }
        return;
    }
    unsigned long long ctr = 0; /* every thread tracks the expected counter */
    for (unsigned i = 0; i < n_cmds; ++i) {
        unsigned char* dst = heap + HEAP_DST(b, i);
        const unsigned char* src = heap + HEAP_SRC(b) + src_off(i);
        int r = CPNET_E_OK;
        bool ok = true;
        switch (kind_of(b, i)) {
        case 0: case 1: case 2: case 3:
            cpnet_putmem_nbi(&ctx, dst, src, put_size(b, i), 0);
            break;
        case 4:
            cpnet_uint32_p(&ctx, (uint32_t*)(heap + HEAP_P(b, i)), (i * 2654435761u) ^ b, 0);
            break;
        case 5:
            r = cpnet_nop(&ctx);
            break;
        case 6: {
            const unsigned long long add = 1u + i % 5u;
            const unsigned long long old =
                cpnet_uint64_atomic_fetch_add(&ctx, (uint64_t*)(heap + HEAP_CTR(b)), add, 0);
            r = cpnet_ctx_last_error(&ctx);
            ok = old == ctr; /* checked in every thread: the broadcast */
            ctr += add;
            break;
        }
        case 7: {
            const uint64_t v = cpnet_uint64_g(&ctx, (const uint64_t*)(heap + HEAP_G(i)), 0);
            r = cpnet_ctx_last_error(&ctx);
            ok = v == (((uint64_t)b << 32) | i);
            break;
        }
        case 8:
            cpnet_fence(&ctx);
            break;
        default:
            cpnet_putmem_signal_nbi(&ctx, dst, src, (i % 3u) * 8u, (uint64_t*)(heap + HEAP_SIG(b)), i,
                                    CPNET_SIGNAL_ADD, 0);
            break;
        }
        if (r != CPNET_E_OK || !ok) {
            atomicCAS(&fail, 0, (int)i + 1);
            atomicCAS(&fail_code, 0, r != CPNET_E_OK ? r : -1);
        }
    }
    const unsigned qid = ctx.qid;
    const int q = cpnet_quiet(&ctx);
    const int d = cpnet_ctx_destroy(&ctx);
    __syncthreads();
    if (t == 0) {
        results[4 * b + 0] = (fail == 0 && q == CPNET_E_OK && d == CPNET_E_OK) ? 1 : 0;
        results[4 * b + 1] = fail;
        results[4 * b + 2] = fail_code != 0 ? fail_code : (q != CPNET_E_OK ? q : d);
        results[4 * b + 3] = (int)qid;
    }
}

/* No consumer answers: every wait must end by timeout or abort.
 * results = { nop, wait_until, signal_wait_until's error, its value } */
extern "C" __global__ void stuck(cpnet_handle_t h, unsigned char* heap, int* results)
{
    __shared__ cpnet_ctx_t ctx;
    const int e = cpnet_ctx_create(&h, &ctx);
    const int r1 = e == CPNET_E_OK ? cpnet_nop(&ctx) : 100 + e;
    const int r2 = cpnet_uint64_wait_until(&ctx, (uint64_t*)(heap + 64), CPNET_CMP_EQ, 42);
    const uint64_t s = cpnet_signal_wait_until(&ctx, (uint64_t*)(heap + 64), CPNET_CMP_GE, 1);
    const int r3 = cpnet_ctx_last_error(&ctx);
    if (threadIdx.x == 0) { results[0] = r1; results[1] = r2; results[2] = r3; results[3] = (int)s; }
}
"#;

const fn heap_src(b: u32) -> u64 {
    b as u64 * 4096
}
const fn heap_dst(b: u32, i: u32) -> u64 {
    262144 + b as u64 * 8192 + (i % 32) as u64 * 128
}
const fn heap_p(b: u32, i: u32) -> u64 {
    524288 + b as u64 * 1024 + (i % 64) as u64 * 4
}
const fn heap_ctr(b: u32) -> u64 {
    786432 + b as u64 * 8
}
const fn heap_g(i: u32) -> u64 {
    786432 + 4096 + (i % 16) as u64 * 8
}
const fn heap_sig(b: u32) -> u64 {
    786432 + 8192 + b as u64 * 8
}
fn kind_of(b: u32, i: u32) -> u32 {
    (i.wrapping_mul(7).wrapping_add(b)) % 10
}
fn put_size(b: u32, i: u32) -> u64 {
    1 + (i.wrapping_mul(13).wrapping_add(b.wrapping_mul(5)) % 300) as u64
}
fn src_off(i: u32) -> u64 {
    (i % 64) as u64
}
fn src_byte(b: u32, k: u64) -> u8 {
    (b.wrapping_mul(31).wrapping_add((k as u32).wrapping_mul(7)).wrapping_add(1)) as u8
}
/// The inline payload: `n` bytes at offset `off` of block b's source region.
fn src_inline(b: u32, off: u64, n: u64) -> u64 {
    (0..n).fold(0u64, |v, k| v | (src_byte(b, off + k) as u64) << (8 * k))
}

/// A put (or the put part of a put-with-signal) as the kernel must send it.
fn put_fields(c: &mut Cmd, b: u32, i: u32, size: u64) {
    c.size = size;
    c.dst = heap_dst(b, i);
    if size <= CPNET_INLINE_MAX as u64 {
        c.flags = CPNET_F_INLINE;
        c.value = src_inline(b, src_off(i), size);
    } else {
        c.src = heap_src(b) + src_off(i);
    }
}

/// Command `i` of block `b` (i == N_CMDS, N_CMDS + 1: the two quiets) and
/// how the consumer answers it. `ctr` is block b's fetch-add counter.
fn expected(b: u32, i: u32, n_cmds: u32, ctr: &mut u64) -> (Cmd, Outcome) {
    let mut c = Cmd::default();
    if i >= n_cmds {
        c.opcode = CPNET_OP_QUIET;
        c.flags = CPNET_F_BLOCKING;
        return (c, Outcome::Done);
    }
    match kind_of(b, i) {
        0..=3 => {
            c.opcode = CPNET_OP_PUT;
            put_fields(&mut c, b, i, put_size(b, i));
        }
        4 => {
            c.opcode = CPNET_OP_PUT;
            c.flags = CPNET_F_INLINE;
            c.size = 4;
            c.dst = heap_p(b, i);
            c.value = (i.wrapping_mul(2654435761) ^ b) as u64; // zero-extended
        }
        5 => {
            c.opcode = CPNET_OP_NOP;
            c.flags = CPNET_F_BLOCKING;
        }
        6 => {
            let add = 1 + (i % 5) as u64;
            c.opcode = CPNET_OP_AMO;
            c.flags = CPNET_F_BLOCKING;
            c.dtype = CPNET_T_UINT64;
            c.subop = CPNET_AMO_FETCH_ADD;
            c.size = 8;
            c.dst = heap_ctr(b);
            c.value = add;
            let old = *ctr;
            *ctr += add;
            return (c, Outcome::Value(old));
        }
        7 => {
            c.opcode = CPNET_OP_GET;
            c.flags = CPNET_F_INLINE | CPNET_F_BLOCKING;
            c.size = 8;
            c.src = heap_g(i);
            return (c, Outcome::Value(((b as u64) << 32) | i as u64));
        }
        8 => c.opcode = CPNET_OP_FENCE,
        _ => {
            c.opcode = CPNET_OP_PUT_SIGNAL;
            put_fields(&mut c, b, i, (i % 3) as u64 * 8);
            c.subop = CPNET_SIGNAL_ADD;
            c.cond = i as u64;
            c.sig = heap_sig(b);
        }
    }
    (c, Outcome::Done)
}

// ---------------------------------------------------------------------------
// GPU plumbing
// ---------------------------------------------------------------------------

/// The GPU, or None after a loud skip (a failure with CPNET_REQUIRE_GPU=1).
fn gpu_or_skip(test: &str) -> Option<Arc<CudaContext>> {
    let why = if !unsafe_is_libcuda_present() {
        "libcuda (the CUDA driver) not found".to_owned()
    } else if !nvrtc::is_available() {
        nvrtc::version().err().map(|e| e.to_string()).unwrap_or_default()
    } else {
        match CudaContext::new(0) {
            Ok(ctx) => return Some(ctx),
            Err(e) => format!("no usable CUDA device ({e:?})"),
        }
    };
    if std::env::var("CPNET_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("CPNET_REQUIRE_GPU=1 but {why}");
    }
    // Straight to the stderr handle: libtest captures eprintln! of passing
    // tests, and a skip must be seen.
    let line = format!("\n*** SKIPPED {test}: {why}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    None
}

fn unsafe_is_libcuda_present() -> bool {
    // SAFETY: only dlopens the candidate names and closes them again.
    unsafe { cusys::is_culib_present() }
}

/// The kernel handle as a kernel argument (passed by value, 64 bytes).
#[repr(transparent)]
struct KernelHandle(Handle);
// SAFETY: Handle is repr(C), plain integers, laid out as cpnet_handle_t
// (layout.rs asserts every offset against cmd.h).
unsafe impl DeviceRepr for KernelHandle {}

/// Host-pinned memory mapped into the device (cuMemHostAlloc with
/// DEVICEMAP | PORTABLE), zeroed.
struct Mapped {
    host: *mut u8,
    dev: u64,
}

impl Mapped {
    fn new(bytes: usize) -> Mapped {
        // SAFETY: a CUDA context is current on this thread (CudaContext::new
        // binds it); the memory is initialized right below.
        let host = unsafe {
            cu::malloc_host(bytes, cusys::CU_MEMHOSTALLOC_DEVICEMAP | cusys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .expect("cuMemHostAlloc")
        .cast::<u8>();
        // SAFETY: `host` is a fresh allocation of `bytes` bytes.
        unsafe { std::ptr::write_bytes(host, 0, bytes) };
        let mut dev: cusys::CUdeviceptr = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        unsafe { cusys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0) }
            .result()
            .expect("cuMemHostGetDevicePointer");
        assert_eq!(dev % 64, 0, "mapped memory is page aligned");
        Mapped { host, dev }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once; no kernel uses it
        // any more (every test synchronizes before dropping).
        let _ = unsafe { cu::free_host(self.host.cast()) };
    }
}

// SAFETY: the pointers are only used through atomics or after the kernel ended.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

/// A pool of queues plus a status block, both in mapped pinned memory.
struct Pool {
    queues: Mapped,
    status: Mapped,
    geom: QueueGeometry,
    n: usize,
}

impl Pool {
    fn new(n: usize, depth: u32) -> Pool {
        let geom = QueueGeometry::new(depth).expect("depth");
        Pool { queues: Mapped::new(n * geom.bytes()), status: Mapped::new(CPNET_STATUS_BYTES), geom, n }
    }

    fn queue(&self, i: usize) -> QueueMem {
        assert!(i < self.n);
        // SAFETY: inside the pool's mapped allocation (page aligned, each
        // queue geom.bytes() long), zeroed before first use, alive until the
        // pool drops, which happens after the kernels and the consumer ended;
        // the GPU side follows THE QUEUE PROTOCOL (queue.cuh).
        unsafe { QueueMem::from_raw(self.queues.host.add(i * self.geom.bytes()), self.geom) }
    }

    fn status_word(&self, byte: usize) -> &AtomicU32 {
        assert!(byte.is_multiple_of(4) && byte + 4 <= CPNET_STATUS_BYTES);
        // SAFETY: 4-byte aligned, inside the status allocation, which lives
        // as long as &self; the GPU accesses it with atomics / strong ops.
        unsafe { AtomicU32::from_ptr(self.status.host.add(byte).cast::<u32>()) }
    }

    /// The status block (only while no kernel runs, or racy but harmless).
    fn status(&self) -> Status {
        Status::from_words(|off| self.status_word(off).load(Ordering::Acquire))
    }

    fn handle(&self, heap_base: u64, wait_timeout_ns: u64) -> Handle {
        Handle {
            my_pe: 0,
            n_pes: 1,
            heap_base,
            heap_size: HEAP_BYTES as u64,
            queues: self.queues.dev,
            n_queues: self.n as u32,
            log2_depth: self.geom.log2_depth(),
            wait_timeout_ns,
            status: self.status.dev,
            claims: 0,
            peers: 0,
            ..Handle::default()
        }
    }
}

/// Ends the process if a test hangs (a device wait that never ends would
/// otherwise block `synchronize` forever).
fn watchdog(test: &'static str, limit: Duration) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let start = Instant::now();
        while !d.load(Ordering::Acquire) {
            if start.elapsed() > limit {
                eprintln!("{test}: still running after {limit:?}: a device wait did not end; aborting");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    done
}

fn compile(ctx: &Arc<CudaContext>) -> Arc<CudaModule> {
    let (major, minor) = ctx.compute_capability().expect("compute capability");
    let opts = BuildOptions {
        name: "gpu_smoke.cu".into(),
        ..BuildOptions::for_compute_capability(major as u32, minor as u32)
    };
    let image = nvrtc::compile_kernel(KERNELS, &opts).unwrap_or_else(|e| panic!("{e}"));
    ctx.load_module(image).expect("load module")
}

// ---------------------------------------------------------------------------
// The consumer
// ---------------------------------------------------------------------------

/// What the consumer saw on one queue.
#[derive(Debug, Default)]
struct QueueReport {
    block: Option<u32>,
    taken: u64,
    first_seq: u64,
    mismatches: Vec<String>,
}

/// Consume every queue of `pool` until `stop` (set after the kernel ended)
/// and nothing is left; check each command against the model, complete each
/// (non-blocking ones in reverse order, in runs), answer fetches.
fn consume(pool: &Pool, n_cmds: u32, stop: &AtomicBool) -> Vec<QueueReport> {
    let mut cons: Vec<Consumer> = (0..pool.n).map(|i| Consumer::new(pool.queue(i))).collect();
    let mut reports: Vec<QueueReport> =
        cons.iter().map(|c| QueueReport { first_seq: c.next_seq(), ..Default::default() }).collect();
    let mut pending: Vec<Vec<u64>> = vec![Vec::new(); pool.n];
    let mut counters = vec![0u64; pool.n];
    let mut last_progress = Instant::now();
    loop {
        let mut progressed = false;
        for q in 0..pool.n {
            while let Some((seq, cmd)) = cons[q].poll() {
                progressed = true;
                let rep = &mut reports[q];
                // The owner is stored before the first commit (release), so
                // it is visible once a command of this context is.
                let b = *rep.block.get_or_insert_with(|| cons[q].mem().owner());
                let i = (seq - rep.first_seq) as u32;
                rep.taken += 1;
                let (mut want, outcome) = if b < BLOCKS && i < n_cmds + 2 {
                    expected(b, i, n_cmds, &mut counters[b as usize])
                } else {
                    (Cmd::default(), Outcome::Done)
                };
                want.commit = seq + 1;
                if want != cmd && rep.mismatches.len() < 10 {
                    rep.mismatches.push(format!("queue {q} block {b} cmd {i} (seq {seq}):\n  got  {cmd:?}\n  want {want:?}"));
                }
                if cmd.flags & CPNET_F_BLOCKING != 0 {
                    // Everything before a blocking command completes first,
                    // newest first, to exercise the watermark.
                    for s in pending[q].drain(..).rev() {
                        cons[q].complete(s, Outcome::Done);
                    }
                    cons[q].complete(seq, outcome);
                } else {
                    pending[q].push(seq);
                    if pending[q].len() >= 5 {
                        for s in pending[q].drain(..).rev() {
                            cons[q].complete(s, Outcome::Done);
                        }
                    }
                }
            }
        }
        if progressed {
            last_progress = Instant::now();
        } else if stop.load(Ordering::Acquire) {
            break;
        } else {
            if last_progress.elapsed() > Duration::from_secs(20) {
                // Make every device wait end, so the kernel (and the test) ends.
                pool.status_word(CPNET_STATUS_OFF_ABORT).store(CPNET_E_ABORTED as u32, Ordering::Release);
                for r in reports.iter_mut() {
                    r.mismatches.push("no progress for 20 s: aborted the kernel".into());
                }
                last_progress = Instant::now();
            }
            std::hint::spin_loop();
        }
    }
    for q in 0..pool.n {
        for s in pending[q].drain(..).rev() {
            cons[q].complete(s, Outcome::Done);
        }
        assert_eq!(cons[q].outstanding(), 0);
    }
    reports
}

/// Launch `smoke` on `pool` with a consumer running, and check everything.
fn run_smoke(stream: &Arc<CudaStream>, module: &Arc<CudaModule>, pool: &Pool, label: &str) {
    let heap = stream.alloc_zeros::<u8>(HEAP_BYTES).expect("heap");
    let results_buf = stream.alloc_zeros::<i32>(4 * BLOCKS as usize).expect("results");
    let heap_base = heap.device_ptr(stream).0;
    let handle = KernelHandle(pool.handle(heap_base, 10_000_000_000));
    let func = module.load_function("smoke").expect("smoke");
    let written_before: Vec<u64> = (0..pool.n).map(|i| pool.queue(i).written()).collect();

    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let reports = std::thread::scope(|s| {
        let consumer = s.spawn(|| consume(pool, N_CMDS, &stop));
        let mut launch = stream.launch_builder(&func);
        launch.arg(&handle).arg(&heap).arg(&results_buf).arg(&N_CMDS);
        let cfg = LaunchConfig { grid_dim: (BLOCKS, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match `smoke`'s parameters (handle by value,
        // two device pointers, an unsigned); the pool and the status block
        // outlive the kernel (synchronized below before anything drops).
        unsafe { launch.launch(cfg) }.expect("launch");
        stream.synchronize().expect("kernel");
        stop.store(true, Ordering::Release);
        consumer.join().expect("consumer thread")
    });
    let elapsed = start.elapsed();
    let results = stream.clone_dtoh(&results_buf).expect("results");

    let per_block = N_CMDS as u64 + 2; // + cpnet_quiet + ctx_destroy's quiet
    let mut problems = Vec::new();
    for b in 0..BLOCKS as usize {
        let r = &results[4 * b..4 * b + 4];
        if r[0] != 1 {
            problems.push(format!("block {b} failed: first failing command {} (index+1), code {}, queue {}", r[1], r[2], r[3]));
        }
    }
    let mut total = 0;
    for (q, rep) in reports.iter().enumerate() {
        problems.extend(rep.mismatches.iter().cloned());
        total += rep.taken;
        if rep.taken != per_block {
            problems.push(format!("queue {q} (block {:?}): consumer took {} commands, expected {per_block}", rep.block, rep.taken));
        }
        let mem = pool.queue(q);
        let ctl = mem.ctl_snapshot();
        if rep.first_seq != written_before[q] {
            problems.push(format!("queue {q}: consumer started at {} but the producer block said {}", rep.first_seq, written_before[q]));
        }
        let end = written_before[q] + per_block;
        if ctl.consumed != end || ctl.completed != end || mem.written() != end {
            problems.push(format!(
                "queue {q}: consumed {} completed {} write_idx {} (expected {end} each)",
                ctl.consumed,
                ctl.completed,
                mem.written()
            ));
        }
    }
    let st = pool.status();
    if st.dev_error != 0 {
        problems.push(format!("device reported error {}: {st:?}", st.dev_error));
    }
    println!(
        "{label}: {BLOCKS} blocks x {THREADS} threads, {total} commands through {} queues of depth {} in {elapsed:?} ({:.2} M cmds/s)",
        pool.n,
        pool.geom.depth(),
        total as f64 / elapsed.as_secs_f64() / 1e6
    );
    assert!(problems.is_empty(), "{label}:\n{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn gpu_blocks_drive_the_ring_through_laps_backpressure_and_reuse() {
    let Some(ctx) = gpu_or_skip("gpu_blocks_drive_the_ring_through_laps_backpressure_and_reuse") else {
        return;
    };
    let done = watchdog("gpu_smoke", Duration::from_secs(240));
    let stream = ctx.default_stream();
    let module = compile(&ctx);

    // Depth 64: 1002 commands per queue wrap the ring ~15 times.
    let pool = Pool::new(N_QUEUES, CPNET_DEFAULT_DEPTH);
    run_smoke(&stream, &module, &pool, "depth 64");
    // The same pool again: contexts are created anew, sequence numbers continue.
    run_smoke(&stream, &module, &pool, "depth 64, second launch (seq continues)");
    for q in 0..N_QUEUES {
        assert_eq!(pool.queue(q).written(), 2 * (N_CMDS as u64 + 2), "queue {q} write_idx persisted");
    }
    // Depth 2: the ring is full all the time (P1 re-reads consumed).
    let tiny = Pool::new(N_QUEUES, CPNET_MIN_DEPTH);
    run_smoke(&stream, &module, &tiny, "depth 2 (backpressure)");
    done.store(true, Ordering::Release);
}

#[test]
fn device_waits_end_on_timeout_and_on_abort() {
    let Some(ctx) = gpu_or_skip("device_waits_end_on_timeout_and_on_abort") else {
        return;
    };
    let done = watchdog("device_waits_end_on_timeout_and_on_abort", Duration::from_secs(120));
    let stream = ctx.default_stream();
    let module = compile(&ctx);
    let func = module.load_function("stuck").expect("stuck");
    let heap = stream.alloc_zeros::<u8>(HEAP_BYTES).expect("heap");
    let heap_base = heap.device_ptr(&stream).0;

    // (how the waits end, timeout ns, abort through: 0 none, 1 ctl.abort, 2 status.abort)
    for (label, timeout_ns, via) in [("timeout", 20_000_000u64, 0), ("ctl.abort", 0, 1), ("status.abort", 0, 2)] {
        let pool = Pool::new(1, CPNET_DEFAULT_DEPTH);
        let results = stream.alloc_zeros::<i32>(4).expect("results");
        let handle = KernelHandle(pool.handle(heap_base, timeout_ns));
        let start = Instant::now();
        std::thread::scope(|s| {
            if via != 0 {
                let pool = &pool;
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(100));
                    if via == 1 {
                        pool.queue(0).set_abort(ErrorCode::Aborted);
                    } else {
                        pool.status_word(CPNET_STATUS_OFF_ABORT).store(CPNET_E_ABORTED as u32, Ordering::Release);
                    }
                });
            }
            let mut launch = stream.launch_builder(&func);
            launch.arg(&handle).arg(&heap).arg(&results);
            let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (64, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: arguments match `stuck`; the pool outlives the kernel.
            unsafe { launch.launch(cfg) }.expect("launch");
            stream.synchronize().expect("kernel");
        });
        let r = stream.clone_dtoh(&results).expect("results");
        let st = pool.status();
        println!("{label}: kernel ended after {:?}; results {r:?}; status {st:?}", start.elapsed());
        let want = if via == 0 { CPNET_E_TIMEOUT } else { CPNET_E_ABORTED };
        assert_eq!(&r[..3], &[want, want, want], "{label}: nop, wait_until, signal_wait_until");
        assert_eq!(r[3], 0, "{label}: signal_wait_until returns the last value seen");
        if via == 0 {
            // The first timeout (the nop's completion wait) is the one reported.
            assert_eq!(st.dev_error, CPNET_E_TIMEOUT as u32, "{st:?}");
            assert_eq!((st.dev_pe, st.dev_wg, st.dev_addr), (0, 0, 0), "{st:?}");
            assert_eq!((st.dev_expected, st.dev_found), (1, 0), "completed > seq 0 awaited: {st:?}");
            assert_eq!(st.dev_cmp, CPNET_CMP_GE as u32, "{st:?}");
        } else {
            assert_eq!(st.dev_error, 0, "an abort is not a device error: {st:?}");
        }
        // The nop was published and is visible to a consumer that comes late.
        let mut c = Consumer::new(pool.queue(0));
        let (seq, cmd) = c.poll().expect("the nop is in the ring");
        assert_eq!((seq, cmd.opcode, cmd.flags), (0, CPNET_OP_NOP, CPNET_F_BLOCKING));
    }
    done.store(true, Ordering::Release);
}
