//! A first GPU PE program: every work-group of every PE puts a block of
//! data with a signal into its right neighbour, waits for its left
//! neighbour's, gets it back from the right neighbour, and adds 1 to a
//! counter on PE 0 with `fetch_add`. The host checks every value.
//!
//! ```text
//! cargo build --release --example gpu_ring
//! target/release/cpnet-run -n 2 -- target/release/examples/gpu_ring
//! ```
//! Exits 0 with "SKIP: ..." on a machine without a GPU.

use cpnet::GpuPe;
use cpnet::pe::Error;
use cudarc::driver::{LaunchConfig, PushKernelArg};

const WGS: u32 = 8;
const N: usize = 1000; // ints per work-group (4000 bytes: not inline)

const SRC: &str = r#"
#include <cpnet/device.cuh>
extern "C" __global__ void ring(cpnet_handle_t h, int* src, int* dst, int* back, unsigned long long* sig,
                                unsigned long long* counter, unsigned long long* fetched, int* codes, int n)
{
    __shared__ cpnet_ctx_t ctx;
    const int b = blockIdx.x;
    const int me = h.my_pe, npes = h.n_pes, right = (me + 1) % npes;
    for (int i = threadIdx.x; i < n; i += blockDim.x) src[b * n + i] = me * 1000000 + b * 10000 + i;
    __syncthreads();
    int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) { if (threadIdx.x == 0) codes[b] = 100 + e; return; }
    e = cpnet_putmem_signal(&ctx, dst + b * n, src + b * n, n * sizeof(int), sig + b, 1, CPNET_SIGNAL_SET, right);
    if (e == CPNET_E_OK) { cpnet_signal_wait_until(&ctx, sig + b, CPNET_CMP_EQ, 1); e = cpnet_ctx_last_error(&ctx); }
    if (e == CPNET_E_OK) e = cpnet_getmem(&ctx, back + b * n, dst + b * n, n * sizeof(int), right);
    unsigned long long f = 0;
    if (e == CPNET_E_OK) { f = cpnet_uint64_atomic_fetch_add(&ctx, (uint64_t*)counter, 1, 0); e = cpnet_ctx_last_error(&ctx); }
    if (e == CPNET_E_OK) e = cpnet_quiet(&ctx);
    const int d = cpnet_ctx_destroy(&ctx);
    if (threadIdx.x == 0) { codes[b] = e != CPNET_E_OK ? e : d; fetched[b] = f; }
}
"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pe = match GpuPe::init() {
        Ok(pe) => pe,
        Err(Error::Gpu(e)) => {
            println!("SKIP: {e}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let (me, npes) = (pe.my_pe(), pe.n_pes());
    let ints = (WGS as usize * N) as u64 * 4;
    let (src, dst, back) = (pe.shmalloc(ints)?, pe.shmalloc(ints)?, pe.shmalloc(ints)?);
    let (sig, counter, fetched, codes) = (pe.shmalloc(8 * 64)?, pe.shmalloc(8)?, pe.shmalloc(8 * 64)?, pe.shmalloc(4 * 64)?);
    let m = pe.build_module("gpu_ring", SRC)?;
    let f = m.load_function("ring")?;
    let h = pe.handle();
    let ptrs = [src, dst, back, sig, counter, fetched, codes].map(|a| pe.dev_ptr(a));
    let n = N as i32;
    let mut b = pe.stream().launch_builder(&f);
    b.arg(&h);
    for p in &ptrs {
        b.arg(p);
    }
    b.arg(&n);
    let t = std::time::Instant::now();
    // SAFETY: the kernel's signature matches the arguments pushed above.
    unsafe { b.launch(LaunchConfig { grid_dim: (WGS, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 }) }?;
    pe.synchronize()?;
    let took = t.elapsed();
    pe.barrier_all()?;
    let read_i32 = |a: cpnet::device::cpu::SymAddr, k: usize| -> Result<Vec<i32>, Box<Error>> {
        let mut v = vec![0u8; 4 * k];
        pe.read_heap(a, &mut v)?;
        Ok(v.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect())
    };
    let mut bad = 0;
    let c = read_i32(codes, WGS as usize)?;
    for (w, &code) in c.iter().enumerate() {
        if code != 0 {
            eprintln!("PE {me} work-group {w}: code {code}");
            bad += 1;
        }
    }
    let left = (me + npes - 1) % npes;
    let right = (me + 1) % npes;
    let d = read_i32(dst, WGS as usize * N)?;
    let bk = read_i32(back, WGS as usize * N)?;
    for w in 0..WGS as usize {
        for i in 0..N {
            let want_d = left * 1_000_000 + w as i32 * 10_000 + i as i32;
            let want_b = me * 1_000_000 + w as i32 * 10_000 + i as i32; // right's dst holds my data
            let _ = right;
            if d[w * N + i] != want_d || bk[w * N + i] != want_b {
                if bad < 10 {
                    eprintln!("PE {me} wg {w} [{i}]: dst {} (want {want_d}), back {} (want {want_b})", d[w * N + i], bk[w * N + i]);
                }
                bad += 1;
            }
        }
    }
    if me == 0 {
        let mut v = [0u8; 8];
        pe.read_heap(counter, &mut v)?;
        let total = u64::from_le_bytes(v);
        let want = u64::from(WGS) * npes as u64;
        if total != want {
            eprintln!("PE 0: counter {total}, want {want}");
            bad += 1;
        }
    }
    println!(
        "PE {me}/{npes} ({}, CUDA IPC peers {:?}): kernel {:.1} us, {} errors",
        pe.provider(),
        pe.peer_path(),
        took.as_secs_f64() * 1e6,
        bad
    );
    for e in pe.command_errors() {
        eprintln!("  {e}");
    }
    pe.finalize()?;
    if bad > 0 {
        std::process::exit(1);
    }
    Ok(())
}
