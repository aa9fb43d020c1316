//! GPU-initiated point-to-point latency and bandwidth between two GPU PEs
//! (ComP-Net paper Fig. 8a): the body of `cpnet-gpu-p2p`, also run by
//! `cpnet-gpu-bench --suite`.
//!
//! Run as two PEs (`cpnet-run -n 2`); a kernel on PE 0 targets PE 1, whose
//! proxy serves it (PE 1 runs no kernel). For each size from `--min` to
//! `--max` by powers of 2:
//!
//! - latency: one work-group issues blocking `cpnet_putmem` (then
//!   `cpnet_getmem`) `--iters` times after a warm-up; each call is timed
//!   inside the kernel with `%globaltimer` (`cpnet_globaltimer_ns`); the
//!   median is reported;
//! - bandwidth: `--wgs` work-groups each issue `--iters` windows of
//!   `--window` `cpnet_putmem_nbi` (then `cpnet_getmem_nbi`) followed by
//!   `cpnet_quiet`, after one warm-up window; bytes moved by all of them /
//!   (last end - first start), in GB/s (10^9 B/s).
//!
//! Above 1 MiB the iterations scale down (`iters * 1 MiB / size`, at least
//! 3) and a window moves at most 64 MiB. After each size PE 1 checks the
//! put destination and PE 0 the get destination against the source pattern.
//!
//! ```text
//! cpnet-run -n 2 -- cpnet-gpu-p2p
//! cpnet-run -n 2 -- cpnet-gpu-p2p --min 8 --max 1M --iters 200 --wgs 4 --csv p2p.csv
//! ```
//!
//! Same-host PEs reach each other through CUDA IPC peer copies unless
//! `CPNET_GPU_IPC=0` (then through the staged path over the provider); the
//! header says which. The symmetric heap must hold three buffers of `--max`
//! bytes; when `CPNET_HEAP_SIZE` is not set this program sets it. Without a
//! GPU it says `SKIPPED` and exits 0 (1 with `CPNET_REQUIRE_GPU=1`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use cpnet::GpuPe;
use cpnet::device::cpu::SymAddr;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The benchmark kernels (`p2p`, `pingpong`, `pingpong_raw`), built with
/// the NVRTC helper after `bounds`' line: each has `__launch_bounds__`
/// of the block size it runs with (`--threads`), so that up to 1024 fit
/// (without bounds, 1024 threads failed to launch: too many registers).
pub const KERNEL: &str = r#"
#include <cpnet/device.cuh>
#ifndef P2P_THREADS
#define P2P_THREADS 1024
#endif

/* mode 0: blocking putmem latency, 1: blocking getmem latency: times[i] =
 * duration of timed call i (ns), block 0 only.
 * mode 2: putmem_nbi bandwidth, 3: getmem_nbi bandwidth: `warmup` then
 * `iters` windows of `window` calls + quiet; times[2b], times[2b+1] = start
 * and end (globaltimer ns) of block b's timed windows.
 * status[b] = the first CPNET_E_* of block b (0: none). */
extern "C" __global__ void __launch_bounds__(P2P_THREADS) p2p(cpnet_handle_t h, unsigned char* local, unsigned char* remote,
                               unsigned long long size, int peer, int mode, unsigned iters,
                               unsigned warmup, unsigned window, unsigned long long* times, int* status)
{
    __shared__ cpnet_ctx_t ctx;
    const unsigned b = blockIdx.x;
    int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) {
        if (threadIdx.x == 0) status[b] = e;
        return;
    }
    if (mode < 2) {
        for (unsigned i = 0; i < warmup + iters && e == CPNET_E_OK; ++i) {
            const unsigned long long t0 = cpnet_globaltimer_ns();
            e = mode == 0 ? cpnet_putmem(&ctx, remote, local, size, peer)
                          : cpnet_getmem(&ctx, local, remote, size, peer);
            const unsigned long long t1 = cpnet_globaltimer_ns();
            if (threadIdx.x == 0 && i >= warmup) times[i - warmup] = t1 - t0;
        }
    } else {
        unsigned long long t0 = cpnet_globaltimer_ns();
        for (unsigned r = 0; r < warmup + iters && e == CPNET_E_OK; ++r) {
            if (r == warmup) t0 = cpnet_globaltimer_ns();
            for (unsigned j = 0; j < window; ++j) {
                if (mode == 2)
                    cpnet_putmem_nbi(&ctx, remote, local, size, peer);
                else
                    cpnet_getmem_nbi(&ctx, local, remote, size, peer);
            }
            e = cpnet_quiet(&ctx);
        }
        const unsigned long long t1 = cpnet_globaltimer_ns();
        if (threadIdx.x == 0) {
            times[2 * b] = t0;
            times[2 * b + 1] = t1;
        }
    }
    const int d = cpnet_ctx_destroy(&ctx);
    if (threadIdx.x == 0) status[b] = e != CPNET_E_OK ? e : d;
}

/* Ping-pong between PE 0 and PE 1, one block each: round i, PE 0 puts
 * `size` bytes with signal i (SET) into `buf` and `sig` at PE 1 and waits
 * for its own `sig` to reach i; PE 1 waits for i and answers the same way.
 * With `exchange`, both PEs put first and then wait (a halo exchange).
 * times[0] = duration of the `iters` timed rounds (ns, after `warmup`). */
extern "C" __global__ void __launch_bounds__(P2P_THREADS) pingpong(cpnet_handle_t h, unsigned char* buf, const unsigned char* src,
                                    unsigned long long* sig, unsigned long long size, unsigned iters,
                                    unsigned warmup, int exchange, unsigned long long* times, int* status)
{
    __shared__ cpnet_ctx_t ctx;
    int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) {
        if (threadIdx.x == 0) status[0] = e;
        return;
    }
    const int me = cpnet_my_pe(&ctx), peer = 1 - me;
    uint64_t* const word = (uint64_t*)sig;
    unsigned long long t0 = cpnet_globaltimer_ns();
    for (unsigned long long i = 1; i <= (unsigned long long)warmup + iters && e == CPNET_E_OK; ++i) {
        if (i == (unsigned long long)warmup + 1) t0 = cpnet_globaltimer_ns();
        if (me == 0 || exchange) {
            cpnet_putmem_signal_nbi(&ctx, buf, src, size, word, i, CPNET_SIGNAL_SET, peer);
            cpnet_signal_wait_until(&ctx, word, CPNET_CMP_GE, i);
        } else {
            cpnet_signal_wait_until(&ctx, word, CPNET_CMP_GE, i);
            cpnet_putmem_signal_nbi(&ctx, buf, src, size, word, i, CPNET_SIGNAL_SET, peer);
        }
        e = cpnet_ctx_last_error(&ctx);
    }
    const unsigned long long t1 = cpnet_globaltimer_ns();
    const int d = cpnet_ctx_destroy(&ctx);
    if (threadIdx.x == 0) {
        times[0] = t1 - t0;
        status[0] = e != CPNET_E_OK ? e : d;
    }
}

/* The floor of the ping-pong above where PE 1's heap is mapped: the same
 * rounds with the kernel's own stores through cpnet_ptr and no cpnet call.
 * mode 0: the flag alone (thread 0: st.relaxed.sys of i; poll
 *   ld.relaxed.sys): one store's flight, the least any signal costs;
 * mode 1: put-with-signal inlined (the block stores `size` bytes, block
 *   barrier, st.release.sys of the flag; poll ld.acquire.sys): what
 *   cpnet_putmem_signal_nbi does on this path, without its checks;
 * mode 2: LL words (each 4 data bytes and the round's number in one 8-byte
 *   st.relaxed.sys, every thread its words; each thread polls its own): no
 *   release and no separate flag, 2 x size bytes on the wire.
 * status[0] = 0, -2 if PE 1's heap is not mapped here, -3 if a round did not
 * arrive within 10 s. */
extern "C" __global__ void __launch_bounds__(P2P_THREADS) pingpong_raw(cpnet_handle_t h, unsigned char* buf, const unsigned char* src,
                                        unsigned long long* sig, unsigned long long size, unsigned iters,
                                        unsigned warmup, int mode, unsigned long long* times, int* status)
{
    __shared__ cpnet_ctx_t ctx;
    __shared__ int late;
    int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) {
        if (threadIdx.x == 0) status[0] = e;
        return;
    }
    const int me = cpnet_my_pe(&ctx), peer = 1 - me;
    unsigned char* rbuf = (unsigned char*)cpnet_ptr(&ctx, buf, peer);
    uint64_t* rsig = (uint64_t*)cpnet_ptr(&ctx, sig, peer);
    if (threadIdx.x == 0) late = 0;
    __syncthreads();
    if (rbuf == nullptr || rsig == nullptr) {
        cpnet_ctx_destroy(&ctx);
        if (threadIdx.x == 0) status[0] = -2;
        return;
    }
    const unsigned long long deadline = cpnet_globaltimer_ns() + 10000000000ull;
    const unsigned long long words = size / 4;
    unsigned long long t0 = cpnet_globaltimer_ns();
    for (unsigned long long i = 1; i <= (unsigned long long)warmup + iters; ++i) {
        if (i == (unsigned long long)warmup + 1) t0 = cpnet_globaltimer_ns();
        for (int step = 0; step < 2; ++step) {
            const bool send = (step == 0) == (me == 0);
            if (send) {
                if (mode == 0) {
                    if (threadIdx.x == 0) cpnet_st_relaxed_sys_u64(rsig, i);
                } else if (mode == 1) {
                    cpnet_detail::block_copy(rbuf, src, size);
                    __syncthreads();
                    if (threadIdx.x == 0) cpnet_st_release_sys_u64(rsig, i);
                } else {
                    for (unsigned long long w = threadIdx.x; w < words; w += blockDim.x)
                        cpnet_st_relaxed_sys_u64((uint64_t*)rbuf + w, (i << 32) | ((const unsigned*)src)[w]);
                }
            } else if (mode < 2) {
                if (threadIdx.x == 0) {
                    while ((mode == 0 ? cpnet_ld_relaxed_sys_u64((const uint64_t*)sig)
                                      : cpnet_ld_acquire_sys_u64((const uint64_t*)sig)) != i) {
                        if (cpnet_globaltimer_ns() > deadline) { late = 1; break; }
                    }
                }
            } else {
                for (unsigned long long w = threadIdx.x; w < words; w += blockDim.x) {
                    while ((cpnet_ld_relaxed_sys_u64((const uint64_t*)buf + w) >> 32) != (i & 0xffffffffull)) {
                        if (cpnet_globaltimer_ns() > deadline) { late = 1; break; }
                    }
                }
            }
            __syncthreads();
            if (late) break;
        }
        if (late) break;
    }
    const unsigned long long t1 = cpnet_globaltimer_ns();
    const int d = cpnet_ctx_destroy(&ctx);
    if (threadIdx.x == 0) {
        times[0] = t1 - t0;
        status[0] = late ? -3 : d;
    }
}
"#;

pub use crate::cli::parse_size;

/// What to measure (the flags of `cpnet-gpu-p2p`, and of `cpnet-gpu-bench
/// --suite` for its Fig. 8a part).
#[derive(clap::Args, Clone, Debug)]
pub struct P2pArgs {
    /// Smallest message (bytes; K, M, G suffixes). With `--pingpong`, 0
    /// adds a row of the signal alone (`nbytes` 0: what MSCCL++ and NCCL
    /// call a semaphore) before the sizes from 8 bytes.
    #[arg(long, default_value = "8", value_parser = parse_size)]
    pub min: u64,
    /// Largest message (bytes; K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub max: u64,
    /// Timed calls per size for latency, timed windows per size for
    /// bandwidth (scaled down above 1 MiB, at least 3).
    #[arg(long, default_value_t = 100)]
    pub iters: u32,
    /// Non-blocking calls per bandwidth window (fewer where a window would
    /// move more than 64 MiB).
    #[arg(long, default_value_t = 64)]
    pub window: u32,
    /// Work-groups issuing concurrently in the bandwidth runs.
    #[arg(long, default_value_t = 1)]
    pub wgs: u32,
    /// Threads per work-group, 1-1024.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// Also write the table to this CSV file (PE 0).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Measure instead the one-way latency of a put-with-signal between
    /// kernels on both PEs: a ping-pong of `cpnet_putmem_signal_nbi` (SET)
    /// and `cpnet_signal_wait_until`, one work-group each, half the round
    /// trip (µs, mean over `--iters` rounds after 20 warm-up ones); then an
    /// exchange (both put, then both wait: a halo exchange's round, µs); and
    /// beside them the provider's own message ping-pong and exchange at the
    /// same size (`cpnet_apps::floor::messages`).
    #[arg(long)]
    pub pingpong: bool,
    /// Rounds of the provider's message floor printed beside `--pingpong`
    /// (0: none).
    #[arg(long, default_value_t = 2000)]
    pub floor_iters: u64,
}

/// What a size's runs measured.
struct Row {
    size: u64,
    put_lat_us: f64,
    get_lat_us: f64,
    put_bw: f64,
    get_bw: f64,
}

/// How one kernel run is set up.
struct Run {
    mode: i32,
    size: u64,
    blocks: u32,
    pub iters: u32,
    warmup: u32,
    pub window: u32,
}

const MIB: u64 = 1 << 20;

/// Heap bytes for three buffers of `max` bytes, plus room.
pub fn heap_needed(max: u64) -> u64 {
    3 * max.next_multiple_of(MIB) + 16 * MIB
}

/// Byte `i` of the source pattern.
fn pat(i: u64) -> u8 {
    (i.wrapping_mul(131).wrapping_add(17) ^ (i >> 9)) as u8
}

/// Run every size (**collective**: both PEs call it; PE 0 prints the table
/// and writes `--csv`). Errors: fewer than 2 PEs, a heap smaller than
/// [`heap_needed`], a kernel or CUDA failure, a wrong byte at the target.
pub fn run(pe: &GpuPe, cli: &P2pArgs) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    ensure!(n >= 2, "needs 2 PEs (cpnet-run -n 2 -- cpnet-gpu-p2p); this job has {n}");
    ensure!(
        (cli.min >= 1 || cli.pingpong) && cli.min <= cli.max,
        "--min must be at most --max, and at least 1 without --pingpong"
    );
    ensure!(cli.iters >= 1 && cli.window >= 1 && cli.wgs >= 1, "--iters, --window and --wgs must be at least 1");
    let heap = pe.handle().0.heap_size;
    ensure!(
        heap >= heap_needed(cli.max),
        "--max {} needs a symmetric heap of at least {} bytes (CPNET_HEAP_SIZE is {heap})",
        cli.max,
        heap_needed(cli.max)
    );
    // --min 0 (ping-pong only): the signal alone, then from 8 bytes.
    let first = if cli.min == 0 { 8 } else { cli.min };
    let sizes: Vec<u64> = (cli.min == 0)
        .then_some(0)
        .into_iter()
        .chain(std::iter::successors(Some(first), |&s| s.checked_mul(2)).take_while(|&s| s <= cli.max))
        .collect();
    if cli.pingpong {
        return pingpong(pe, cli, &sizes);
    }
    let module = pe.build_module("p2p.cu", &(bounds(cli.threads) + KERNEL))?;
    let func = module.load_function("p2p").context("load kernel p2p")?;
    let src = pe.shmalloc(cli.max)?; // PE 0: the put source
    let dst = pe.shmalloc(cli.max)?; // PE 1: the put destination and get source
    let back = pe.shmalloc(cli.max)?; // PE 0: the get destination
    if me == 0 {
        let p: Vec<u8> = (0..cli.max).map(pat).collect();
        pe.write_heap(src, &p)?;
    }
    let names = pe.allgather_bytes(pe.cuda().name().unwrap_or_default().as_bytes())?;
    let name = |p: usize| String::from_utf8_lossy(&names[p]).into_owned();
    let mut csv = match (&cli.csv, me) {
        (Some(path), 0) => {
            let mut f = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
            writeln!(f, "size_B,put_lat_us,get_lat_us,put_bw_GBps,get_bw_GBps")?;
            Some(f)
        }
        _ => None,
    };
    if me == 0 {
        let ipc = cpnet::env::Tuning::from_env().map(|t| t.gpu_ipc).unwrap_or(true);
        println!(
            "# cpnet-gpu-p2p: PE 0 -> PE 1, provider {}, path {}; PE 0: {} (device {}), PE 1: {}",
            pe.provider(),
            if ipc { "CUDA IPC peer copies (CPNET_GPU_IPC=1; AMOs and ADD signals staged)" } else { "staged (CPNET_GPU_IPC=0)" },
            name(0),
            pe.cuda().ordinal(),
            name(1)
        );
        println!(
            "# latency: blocking putmem/getmem from 1 work-group x {} threads, median of {} timed calls; bandwidth: {} work-group(s), {} windows of {} putmem_nbi/getmem_nbi + quiet (both fewer above 1 MiB)",
            cli.threads, cli.iters, cli.wgs, cli.iters, cli.window
        );
        println!("{:>12} {:>12} {:>12} {:>12} {:>12}", "size_B", "put_lat_us", "get_lat_us", "put_bw_GBps", "get_bw_GBps");
    }
    pe.barrier_all()?;
    for &size in &sizes {
        if me == 0 {
            let iters = if size <= MIB { cli.iters } else { (u64::from(cli.iters) * MIB / size).clamp(3, u64::from(cli.iters).max(3)) as u32 };
            let window = cli.window.min((64 * MIB / size).max(1) as u32);
            let lat = |mode| Run { mode, size, blocks: 1, iters, warmup: 5, window: 1 };
            let bw = |mode| Run { mode, size, blocks: cli.wgs, iters, warmup: 1, window };
            let put_lat_us = median(&launch(pe, &func, cli, src, dst, &lat(0))?) / 1e3;
            let get_lat_us = median(&launch(pe, &func, cli, back, dst, &lat(1))?) / 1e3;
            let put_bw = bandwidth(&launch(pe, &func, cli, src, dst, &bw(2))?, &bw(2));
            let get_bw = bandwidth(&launch(pe, &func, cli, back, dst, &bw(3))?, &bw(3));
            let r = Row { size, put_lat_us, get_lat_us, put_bw, get_bw };
            println!("{:>12} {:>12.2} {:>12.2} {:>12.3} {:>12.3}", r.size, r.put_lat_us, r.get_lat_us, r.put_bw, r.get_bw);
            if let Some(f) = csv.as_mut() {
                writeln!(f, "{},{:.3},{:.3},{:.4},{:.4}", r.size, r.put_lat_us, r.get_lat_us, r.put_bw, r.get_bw)?;
            }
        }
        pe.barrier_all()?;
        // Both directions moved the source pattern: PE 1 got it by put, PE 0 by get.
        let check = match me {
            0 => Some((back, "get destination on PE 0")),
            1 => Some((dst, "put destination on PE 1")),
            _ => None,
        };
        if let Some((a, what)) = check {
            let mut got = vec![0u8; size as usize];
            pe.read_heap(a, &mut got)?;
            if let Some(i) = (0..size).find(|&i| got[i as usize] != pat(i)) {
                bail!("{what} after the {size}-byte runs: byte {i} is {:#04x}, expected {:#04x}", got[i as usize], pat(i));
            }
        }
    }
    pe.barrier_all()?;
    if let (Some(path), 0) = (&cli.csv, me) {
        println!("# wrote {}", path.display());
    }
    Ok(())
}

/// The line before [`KERNEL`] that sets its launch bounds to `threads`.
fn bounds(threads: u32) -> String {
    format!("#define P2P_THREADS {threads}\n")
}

/// `--pingpong` (**collective**: PEs 0 and 1 run the `pingpong` kernel at
/// once, the others wait in the barriers; PE 0 prints one line per size).
fn pingpong(pe: &GpuPe, cli: &P2pArgs, sizes: &[u64]) -> Result<()> {
    let me = pe.my_pe();
    let module = pe.build_module("p2p.cu", &(bounds(cli.threads) + KERNEL))?;
    let func = module.load_function("pingpong").context("load kernel pingpong")?;
    let raw = module.load_function("pingpong_raw").context("load kernel pingpong_raw")?;
    let src = pe.shmalloc(cli.max)?;
    // Twice the largest size: the raw LL rounds send 8 bytes per 4.
    let buf = pe.shmalloc(2 * cli.max)?;
    let sig = pe.shmalloc(8)?;
    // The provider's own floor first, on endpoints of its own, while no
    // kernel runs.
    // (Messages of at least one byte: the signal-only row has no floor.)
    let msg_sizes: Vec<u64> = sizes.iter().copied().filter(|&s| s > 0).collect();
    let floor = if cli.floor_iters > 0 && !msg_sizes.is_empty() {
        crate::floor::messages(pe, &msg_sizes, cli.floor_iters)?
    } else {
        None
    };
    if me == 0 {
        let p2p = cpnet::env::Tuning::from_env().map(|t| t.gpu_p2p).unwrap_or(true);
        println!(
            "# cpnet-gpu-p2p --pingpong: PE 0 <-> PE 1, cpnet_putmem_signal_nbi (SET) + cpnet_signal_wait_until, 1 work-group x {} threads each, {} rounds; {}",
            cli.threads,
            cli.iters,
            if p2p { "peer-to-peer stores (CPNET_GPU_P2P=1)" } else { "through the queues and the proxy (CPNET_GPU_P2P=0)" }
        );
        println!(
            "# one_way: half a ping-pong round; exchange: one round of both PEs putting, then waiting; floor_*: the provider's {} fi_send/fi_recv at the same size ({} rounds{})",
            pe.provider(),
            cli.floor_iters,
            if floor.is_some() { "" } else { ", off" }
        );
        println!(
            "# raw_*: the ping-pong's floor where PE 1's heap is mapped, the kernel's own stores and no cpnet call (one way, µs): the flag alone (raw_flag), put-with-signal inlined (raw_put_signal: stores, block barrier, st.release.sys of the flag), LL words (raw_ll: 4 data bytes and the round in each 8-byte store, no flag); - where not mapped"
        );
        println!(
            "{:>12} {:>12} {:>12} {:>16} {:>16} {:>10} {:>15} {:>10}",
            "size_B", "one_way_us", "exchange_us", "floor_one_way_us", "floor_exchange_us", "raw_flag", "raw_put_signal", "raw_ll"
        );
    }
    for &size in sizes {
        // Ping-pong first, then the exchange, on every PE alike (collective).
        let one_way = pingpong_run(pe, &func, cli, (buf, src, sig), size, 0)?;
        let round = pingpong_run(pe, &func, cli, (buf, src, sig), size, 1)?;
        let mut raws = [None; 3];
        for (mode, r) in raws.iter_mut().enumerate() {
            // LL words carry 4 bytes each: whole words only, at least one.
            if mode < 2 || (size > 0 && size.is_multiple_of(4)) {
                *r = pingpong_run(pe, &raw, cli, (buf, src, sig), size, 2 + mode as i32)?;
            }
        }
        if me == 0 {
            let row = msg_sizes.iter().position(|&s| s == size).and_then(|k| floor.as_ref().map(|f| &f[k]));
            let (fo, fe) = row.map_or((f64::NAN, f64::NAN), |f| (f.one_way_us, f.exchange_us));
            let [a, b, c] = raws.map(|r| r.map_or("-".to_owned(), |v| format!("{v:.2}")));
            println!("{size:>12} {:>12.2} {:>12.2} {fo:>16.2} {fe:>16.2} {a:>10} {b:>15} {c:>10}", one_way.unwrap_or(f64::NAN), round.unwrap_or(f64::NAN));
        }
    }
    Ok(())
}

/// One run on PEs 0 and 1 at `size` bytes (**collective**): `kind` 0 the
/// `pingpong` kernel's ping-pong, 1 its exchange, 2 + m `pingpong_raw` in
/// mode m. µs per one-way (per round for the exchange) on PE 0, `None` on
/// the other PEs and where a raw run finds PE 1's heap not mapped.
fn pingpong_run(
    pe: &GpuPe,
    func: &cudarc::driver::CudaFunction,
    cli: &P2pArgs,
    (buf, src, sig): (SymAddr, SymAddr, SymAddr),
    size: u64,
    kind: i32,
) -> Result<Option<f64>> {
    let me = pe.my_pe();
    let mut out = None;
    if me < 2 {
        pe.write_heap(sig, &[0u8; 8])?;
        if kind == 4 {
            // The LL words of the last size carry round numbers too.
            pe.write_heap(buf, &vec![0u8; 2 * size as usize])?;
        }
    }
    pe.barrier_all()?;
    if me < 2 {
        let stream = pe.stream();
        let times = stream.alloc_zeros::<u64>(1)?;
        let status = stream.clone_htod(&[-1i32])?;
        let (h, b_, s_, g_) = (pe.handle(), pe.dev_ptr(buf), pe.dev_ptr(src), pe.dev_ptr(sig));
        let (warmup, iters) = (20u32, cli.iters);
        let mode = if kind >= 2 { kind - 2 } else { kind };
        let mut b = stream.launch_builder(func);
        b.arg(&h).arg(&b_).arg(&s_).arg(&g_).arg(&size).arg(&iters).arg(&warmup).arg(&mode).arg(&times).arg(&status);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (cli.threads, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match `pingpong` and `pingpong_raw` (handle
        // by value, three device pointers into this PE's heap: `2 * size`
        // bytes, `size` bytes and one u64, u64, two u32, i32, the times and
        // status buffers of one element); the kernel has ended when
        // synchronize returns.
        unsafe { b.launch(cfg) }.context("launch pingpong")?;
        pe.synchronize()?;
        let st = stream.clone_dtoh(&status)?;
        let what = ["ping-pong", "exchange", "raw flag ping-pong", "raw put-with-signal ping-pong", "raw LL ping-pong"][kind as usize];
        if st[0] != -2 {
            ensure!(st[0] != -3, "{what} of {size} bytes on PE {me}: a round did not arrive within 10 s");
            ensure!(st[0] == 0, "{what} of {size} bytes failed on PE {me}: CPNET_E_* {}", st[0]);
            let t = stream.clone_dtoh(&times)?[0];
            let per = if kind == 1 { f64::from(iters) } else { 2.0 * f64::from(iters) };
            out = Some(t as f64 / 1e3 / per).filter(|_| me == 0);
        }
    }
    pe.barrier_all()?;
    Ok(out)
}

/// Launch one run of the `p2p` kernel on PE 0 towards PE 1 (`local` and
/// `remote` are symmetric addresses) and return its per-block times.
fn launch(
    pe: &GpuPe,
    func: &cudarc::driver::CudaFunction,
    cli: &P2pArgs,
    local: SymAddr,
    remote: SymAddr,
    r: &Run,
) -> Result<Vec<u64>> {
    let stream = pe.stream();
    let slots = if r.mode < 2 { r.iters as usize } else { 2 * r.blocks as usize };
    let times = stream.alloc_zeros::<u64>(slots)?;
    let status = stream.clone_htod(&vec![-1i32; r.blocks as usize])?;
    let (h, l, rem, peer) = (pe.handle(), pe.dev_ptr(local), pe.dev_ptr(remote), 1i32);
    let mut b = stream.launch_builder(func);
    b.arg(&h).arg(&l).arg(&rem).arg(&r.size).arg(&peer).arg(&r.mode).arg(&r.iters).arg(&r.warmup).arg(&r.window);
    b.arg(&times).arg(&status);
    let cfg = LaunchConfig { grid_dim: (r.blocks, 1, 1), block_dim: (cli.threads, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match `p2p` (handle by value, two device
    // pointers into this PE's heap with `size` bytes each, u64, i32, i32,
    // three u32, the times and status buffers sized for `mode`); the kernel
    // has ended when synchronize returns.
    unsafe { b.launch(cfg) }.context("launch p2p")?;
    pe.synchronize()?;
    let st = stream.clone_dtoh(&status)?;
    let bad: Vec<(usize, i32)> = st.iter().copied().enumerate().filter(|&(_, s)| s != 0).collect();
    ensure!(bad.is_empty(), "mode {} size {}: work-groups failed (block, CPNET_E_* or -1 if it never ran): {bad:?}", r.mode, r.size);
    Ok(stream.clone_dtoh(&times)?)
}

/// Median of the durations, in ns.
fn median(v: &[u64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s[s.len() / 2] as f64
}

/// GB/s of a bandwidth run: all blocks' bytes over first start to last end.
fn bandwidth(t: &[u64], r: &Run) -> f64 {
    let start = t.chunks(2).map(|c| c[0]).min().unwrap_or(0);
    let end = t.chunks(2).map(|c| c[1]).max().unwrap_or(0);
    let bytes = u64::from(r.blocks) * u64::from(r.iters) * u64::from(r.window) * r.size;
    bytes as f64 / (end.saturating_sub(start).max(1)) as f64
}

#[cfg(test)]
mod tests {
    /// The benchmark kernels (p2p, pingpong, pingpong_raw) compile with
    /// NVRTC, without a warning or a non-coherent load.
    #[test]
    fn kernels_compile() {
        crate::gpu::check_kernels_compile("gpu_p2p kernels_compile", super::KERNEL);
    }
}
