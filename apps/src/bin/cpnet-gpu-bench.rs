//! `cpnet-gpu-bench`: how fast the proxy serves GPU work-groups' queues
//! (issue 4 items 1 and 2; ComP-Net paper Fig. 4b).
//!
//! One PE, one GPU. Each work-group (CUDA block of 32 threads) creates a
//! context and issues `iters` blocking `cpnet_nop`s: the leader thread
//! writes a 64-byte command into its queue in pinned host memory mapped
//! into the GPU (commit word last, `st.release.sys`), a proxy service thread
//! takes it (acquire), completes it (release), and the block sees the
//! completion (`ld.acquire.sys`) — the full round trip of every blocking
//! call, without a fabric operation. Queues are split over `T` proxy
//! threads (queue `q` to thread `q % T`).
//!
//! ```text
//! cpnet-gpu-bench                               # the default sweep
//! cpnet-gpu-bench --wgs 1,132 --threads 1,8 --iters 5000
//! ```
//!
//! Prints one row per (work-groups, proxy threads): the median round trip
//! seen by a block (from `%globaltimer`), and the aggregate rate (all
//! blocks' commands / kernel time). Skips with a message where there is no
//! GPU.
//!
//! `--suite` measures issue 4's four items in one run, as two PEs on two
//! GPUs (`cpnet-run -n 2 -- cpnet-gpu-bench --suite`): the put/get latency
//! and bandwidth GPU to GPU from 8 B to `--p2p-max` (Fig. 8a, both PEs,
//! [`cpnet_apps::gpu_p2p`]); then on PE 0's GPU the blocking round trip and
//! the command rate over `--wgs` x `--threads` with the queues in mapped host
//! memory (items 1 and 2, Fig. 4b), the same with the queues in GPU memory
//! over `--device-wgs` x `--device-threads` (item 3, Fig. 4a), and the
//! hardware floor (`--raw slot`). `--csv-file` appends every service row as
//! `queue_mem,wgs,threads,iters,rt_us,rate_mops` (docs/figures.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use cpnet::device::cpu::HostHeap;
use cpnet::device::ring::QueueGeometry;
use cpnet::env::QueuePlacement;
use cpnet::gpu::{GpuError, GpuQueues, KernelHandle, build_module, open_device};
use cpnet_apps::figure_csv::{COST_HEADER, SERVICE_HEADER, open_append};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::{LoopbackTransport, Service};
use cudarc::driver::{LaunchConfig, PushKernelArg};

const KERNEL: &str = r#"
#include <cpnet/device.cuh>

/* Every block: create a context, `iters` blocking no-ops, destroy.
 * times[2b] = first-to-last no-op time in ns (globaltimer), times[2b+1] = error. */
extern "C" __global__ void nop_loop(cpnet_handle_t h, unsigned iters, unsigned long long* times)
{
    __shared__ cpnet_ctx_t ctx;
    const unsigned b = blockIdx.x;
    int e = cpnet_ctx_create(&h, &ctx);
    if (e != CPNET_E_OK) { if (threadIdx.x == 0) { times[2 * b] = 0; times[2 * b + 1] = (unsigned long long)e; } return; }
    e = cpnet_nop(&ctx); /* warm-up */
    const unsigned long long t0 = cpnet_globaltimer_ns();
    for (unsigned i = 0; i < iters && e == CPNET_E_OK; ++i) e = cpnet_nop(&ctx);
    const unsigned long long t1 = cpnet_globaltimer_ns();
    const int d = cpnet_ctx_destroy(&ctx);
    if (threadIdx.x == 0) { times[2 * b] = t1 - t0; times[2 * b + 1] = (unsigned long long)(e != CPNET_E_OK ? e : d); }
}

/* The floor, without cpnet's queue: block b's thread 0 writes a request
 * word (line 8b of `lines`, preceded by 7 more 8-byte stores of that line
 * when mode >= 1, like a 64-byte slot), releases it at system scope and
 * polls its response word (line 8b+1) until the CPU answers.
 * mode 0 (`word`) and 1 (`slot`): one acquire load at a time.
 * mode 2 (`pipe`): RAW_PIPE relaxed loads of the response word in flight at
 * once, staggered, then an acquire fence (the acquire pattern of the PTX
 * memory model); mode 3 (`pipe-lines`): the same, load j reading line
 * 8b+1+j, which the CPU also writes. */
#define RAW_PIPE 4
extern "C" __global__ void raw_rt(unsigned long long* lines, unsigned iters, int mode, unsigned long long* times)
{
    if (threadIdx.x != 0) return;
    const unsigned b = blockIdx.x;
    unsigned long long* req = lines + 64ull * b;
    unsigned long long* resp = req + 8;
    const unsigned long long t0 = cpnet_globaltimer_ns();
    for (unsigned i = 1; i <= iters; ++i) {
        if (mode >= 1) for (int k = 1; k < 8; ++k) cpnet_st_weak_u64(req + k, i + k);
        cpnet_st_release_sys_u64(req, i);
        if (mode < 2) {
            while (cpnet_ld_acquire_sys_u64(resp) < i) { }
            continue;
        }
        const unsigned stride = mode == 3 ? 8 : 0;
        unsigned long long v[RAW_PIPE];
#pragma unroll
        for (int j = 0; j < RAW_PIPE; ++j) {
            v[j] = cpnet_ld_relaxed_sys_u64(resp + j * stride);
            if (j + 1 < RAW_PIPE) cpnet_sleep_ns(250);
        }
        for (bool seen = false; !seen;) {
#pragma unroll
            for (int j = 0; j < RAW_PIPE; ++j) {
                if (v[j] >= i) { seen = true; break; }
                v[j] = cpnet_ld_relaxed_sys_u64(resp + j * stride);
            }
        }
        cpnet_fence_acq_rel_sys();
    }
    times[2 * b] = cpnet_globaltimer_ns() - t0;
    times[2 * b + 1] = 0;
}
"#;

#[derive(Parser, Clone)]
#[command(about = "queue service time and command rate for GPU work-groups (one PE), or with --suite all of issue 4's GPU figures (two PEs)")]
struct Cli {
    /// Work-group counts to sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,132,264,1024")]
    wgs: Vec<u32>,
    /// Proxy thread counts to sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    threads: Vec<usize>,
    /// Blocking no-ops per work-group.
    #[arg(long, default_value_t = 2000)]
    iters: u32,
    /// Queue depth.
    #[arg(long, default_value_t = 64)]
    depth: u32,
    /// Threads per block.
    #[arg(long, default_value_t = 32)]
    block: u32,
    /// Print CSV.
    #[arg(long)]
    csv: bool,
    /// Device-side tuning, prepended to the kernel source as `#define`s
    /// (e.g. `CPNET_BACKOFF_MAX_NS=128`; see include/cpnet/queue.cuh).
    #[arg(long = "define", value_name = "NAME=VALUE")]
    defines: Vec<String>,
    /// Measure the floor instead: raw request/response words per block
    /// (`word`: one 8-byte store; `slot`: a 64-byte line of stores; `pipe`:
    /// a slot, with 4 staggered polls of the response in flight; `pipe-lines`:
    /// the same, each poll reading its own copy of the response, in its own
    /// line), CPU threads answering, no cpnet queue or proxy.
    #[arg(long, value_name = "word|slot|pipe|pipe-lines")]
    raw: Option<String>,

    /// Where the queues live: `host` (pinned, mapped into the GPU; the
    /// default) or `device` (GPU memory, served as a GPU PE with
    /// `CPNET_QUEUE_MEM=device` serves them: each proxy thread polls host
    /// shadows and its queue mirror copies slots in and control blocks out
    /// every pass; the paper's Fig. 4a comparison).
    #[arg(long, default_value = "host", value_name = "host|device")]
    queue_mem: String,
    /// Append each service row to this CSV file (header
    /// `queue_mem,wgs,threads,iters,rt_us,rate_mops` when the file is new;
    /// rt_us is the median round trip over blocks; `raw` rows for --raw).
    #[arg(long, value_name = "FILE")]
    csv_file: Option<PathBuf>,
    /// Measure everything of issue 4 in one run (two PEs under cpnet-run:
    /// Fig. 8a between the GPUs, then on PE 0 the host-queue sweep, the
    /// device-queue sweep and the raw floor).
    #[arg(long)]
    suite: bool,
    /// Append the proxy threads' CPU time to this CSV file
    /// (`source,threads,state,commands,wall_s,proxy_cpu_s`, source `gpu`):
    /// a `busy` row per host-queue sweep point, and with --suite an `idle`
    /// row for PE 0's GPU PE proxies over 2 s without commands.
    #[arg(long, value_name = "FILE")]
    cost_csv: Option<PathBuf>,
    /// --suite: work-group counts of the device-queue sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    device_wgs: Vec<u32>,
    /// --suite: proxy thread counts of the device-queue sweep.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    device_threads: Vec<usize>,
    /// --suite: blocking no-ops per work-group in the device-queue sweep.
    #[arg(long, default_value_t = 500)]
    device_iters: u32,
    /// --suite: largest put/get (bytes; K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = cpnet_apps::gpu_p2p::parse_size)]
    p2p_max: u64,
    /// --suite: write the put/get table to this CSV file too.
    #[arg(long, value_name = "FILE")]
    p2p_csv: Option<PathBuf>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.suite {
        return suite(&cli);
    }
    let ctx = match open_device(0) {
        Ok(c) => c,
        Err(e @ (GpuError::NoDriver | GpuError::NoDevice { .. })) => {
            eprintln!("cpnet-gpu-bench: SKIPPED: {e}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    sweep(&ctx, &cli)
}

/// `--suite`: issue 4's items 1-4 in one run of two PEs (see the module
/// documentation). **Collective.**
fn suite(cli: &Cli) -> Result<()> {
    use cpnet_apps::gpu_p2p;
    let p2p = gpu_p2p::P2pArgs {
        min: 8,
        max: cli.p2p_max,
        iters: 100,
        window: 64,
        wgs: 1,
        threads: 32,
        csv: cli.p2p_csv.clone(),
        pingpong: false,
        floor_iters: 0,
    };
    // SAFETY: no other thread exists yet (nothing has been started), so
    // nobody reads the environment concurrently.
    unsafe {
        if std::env::var_os(cpnet::env::HEAP_SIZE).is_none() {
            std::env::set_var(cpnet::env::HEAP_SIZE, gpu_p2p::heap_needed(p2p.max).to_string());
        }
        // PE 1 waits in a barrier while PE 0 runs the queue sweeps.
        if std::env::var_os(cpnet::env::WAIT_TIMEOUT).is_none() {
            std::env::set_var(cpnet::env::WAIT_TIMEOUT, "600");
        }
    }
    let pe = match cpnet::GpuPe::init() {
        Ok(pe) => pe,
        Err(cpnet::pe::Error::Gpu(e @ (GpuError::NoDriver | GpuError::NoDevice { .. }))) => {
            eprintln!("cpnet-gpu-bench: SKIPPED: {e}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    anyhow::ensure!(pe.n_pes() >= 2, "--suite needs two PEs: cpnet-run -n 2 -- cpnet-gpu-bench --suite");
    if pe.my_pe() == 0 {
        println!("## 4. put/get latency and bandwidth, GPU {} to GPU {} (Fig. 8a)", 0, 1);
    }
    gpu_p2p::run(&pe, &p2p)?;
    pe.barrier_all()?;
    if pe.my_pe() == 0 {
        if let Some(path) = &cli.cost_csv {
            let m = cpnet_apps::proxy_cpu::Meter::start()?;
            std::thread::sleep(std::time::Duration::from_secs(2));
            let u = m.stop()?;
            println!(
                "## proxy CPU time while idle: {} GPU PE proxy threads used {:.3} CPU s in {:.3} s ({:.2} cores)",
                u.threads,
                u.cpu_s,
                u.wall_s,
                u.cores()
            );
            let mut f = open_append(path, COST_HEADER)?;
            writeln!(f, "gpu,{},idle,0,{:.3},{:.3}", u.threads, u.wall_s, u.cpu_s)?;
        }
        let ctx = Arc::clone(pe.cuda());
        println!("## 1-2. blocking round trip and command rate, queues in mapped host memory (Fig. 4b)");
        sweep(&ctx, &Cli { queue_mem: "host".into(), raw: None, ..cli.clone() })?;
        println!("## 3. the same with the queues in GPU memory (Fig. 4a)");
        sweep(
            &ctx,
            &Cli {
                queue_mem: "device".into(),
                raw: None,
                wgs: cli.device_wgs.clone(),
                threads: cli.device_threads.clone(),
                iters: cli.device_iters,
                ..cli.clone()
            },
        )?;
        println!("## floor: raw 64-byte request lines answered by CPU threads, no cpnet queue or proxy");
        sweep(&ctx, &Cli { raw: Some("slot".into()), ..cli.clone() })?;
    }
    pe.barrier_all()?;
    pe.finalize()?;
    Ok(())
}

/// One sweep over `cli.threads` x `cli.wgs` on `ctx`'s GPU (one PE).
fn sweep(ctx: &Arc<cudarc::driver::CudaContext>, cli: &Cli) -> Result<()> {
    let ctx = Arc::clone(ctx);
    ctx.bind_to_thread().context("cuCtxSetCurrent")?;
    let mut csv_file = match &cli.csv_file {
        Some(path) => Some(open_append(path, SERVICE_HEADER)?),
        None => None,
    };
    let mut cost_file = match &cli.cost_csv {
        Some(path) => Some(open_append(path, COST_HEADER)?),
        None => None,
    };
    let kind = if cli.raw.is_some() { "raw" } else { cli.queue_mem.as_str() };
    let mut report = |cli: &Cli, w: u32, t: usize, v: &[u64], wall: f64| -> Result<()> {
        let (med, rate) = report(cli, w, t, v, wall);
        if let Some(f) = csv_file.as_mut() {
            writeln!(f, "{kind},{w},{t},{},{med:.3},{rate:.3}", cli.iters)?;
        }
        Ok(())
    };
    let mut source: String = cli.defines.iter().map(|d| format!("#define {}\n", d.replacen('=', " ", 1))).collect();
    source.push_str(KERNEL);
    let module = build_module(&ctx, "nop_loop.cu", &source)?;
    let func = module.load_function("nop_loop").context("nop_loop")?;
    let device_queues = cli.queue_mem == "device" && cli.raw.is_none();
    // With queues in GPU memory the services' mirror copies run beside the
    // kernel: launch it on a non-blocking stream, not the legacy default
    // stream those copies would wait for.
    let stream = if device_queues { ctx.new_stream().context("cuStreamCreate (non-blocking)")? } else { ctx.default_stream() };
    let max_wgs = *cli.wgs.iter().max().unwrap_or(&1) as usize;
    let placement = if device_queues { QueuePlacement::Device } else { QueuePlacement::Host };
    let queues = Arc::new(GpuQueues::with_placement(&ctx, max_wgs, QueueGeometry::new(cli.depth)?, placement)?);
    // NOPs touch no heap; the loopback transport gets a token host heap.
    let heap = HostHeap::new(4096);
    let heap_dev = stream.alloc_zeros::<u8>(4096)?;
    let handle = KernelHandle(queues.handle(0, 1, {
        use cudarc::driver::DevicePtr;
        heap_dev.device_ptr(&stream).0
    }, 4096, 30_000_000_000));
    let name = ctx.name().unwrap_or_default();
    println!(
        "# cpnet-gpu-bench: {name}, blocking cpnet_nop round trips, queues in {}, depth {}, {} threads/block{}",
        if device_queues { "GPU memory (the proxy serves host shadows through its queue mirror)" } else { "mapped pinned host memory" },
        cli.depth,
        cli.block,
        if cli.defines.is_empty() { String::new() } else { format!(", {}", cli.defines.join(" ")) }
    );
    if cli.csv {
        println!("work_groups,proxy_threads,rt_median_us,rt_p99_us,rate_Mops");
    } else {
        println!("{:>12} {:>14} {:>16} {:>14} {:>14}", "work-groups", "proxy threads", "RT median (us)", "RT p99 (us)", "rate (Mops/s)");
    }
    let raw_func = module.load_function("raw_rt").context("raw_rt")?;
    for &t in &cli.threads {
        for &w in &cli.wgs {
            if let Some(mode) = &cli.raw {
                let mode: i32 = match mode.as_str() {
                    "word" => 0,
                    "slot" => 1,
                    "pipe" => 2,
                    "pipe-lines" => 3,
                    m => anyhow::bail!("--raw {m}: expected word, slot, pipe or pipe-lines"),
                };
                // Lines per block: the request, then the response line(s).
                let lines = Arc::new(cpnet::gpu::MappedHost::new(512 * w as usize)?);
                let stop = Arc::new(AtomicBool::new(false));
                let responders: Vec<_> = (0..t)
                    .map(|k| {
                        let (lines, stop) = (Arc::clone(&lines), Arc::clone(&stop));
                        std::thread::spawn(move || {
                            let word = |i: usize| {
                                // SAFETY: inside the mapped allocation (512 B per
                                // block), 8-aligned, alive while `lines` is; the
                                // GPU accesses it with sys-scope atomics.
                                unsafe { std::sync::atomic::AtomicU64::from_ptr(lines.host().cast::<u64>().add(i)) }
                            };
                            let mine: Vec<usize> = (k..w as usize).step_by(t).collect();
                            let copies = if mode == 3 { 4 } else { 1 };
                            // Acquire/Release: pair with the kernel's release of
                            // the request and its acquire load (or fence) after
                            // reading the response.
                            while !stop.load(Ordering::Acquire) {
                                for &b in &mine {
                                    let r = word(64 * b).load(Ordering::Acquire);
                                    if r != word(64 * b + 8).load(Ordering::Relaxed) {
                                        for j in 0..copies {
                                            word(64 * b + 8 * (1 + j)).store(r, Ordering::Release);
                                        }
                                    }
                                }
                            }
                        })
                    })
                    .collect();
                let times = stream.alloc_zeros::<u64>(2 * w as usize)?;
                let dev_lines = lines.dev();
                let mut launch = stream.launch_builder(&raw_func);
                launch.arg(&dev_lines).arg(&cli.iters).arg(&mode).arg(&times);
                let cfg = LaunchConfig { grid_dim: (w, 1, 1), block_dim: (cli.block, 1, 1), shared_mem_bytes: 0 };
                let t0 = Instant::now();
                // SAFETY: arguments match raw_rt's; the mapped lines outlive
                // the kernel (synchronized below).
                unsafe { launch.launch(cfg) }.context("launch raw_rt")?;
                stream.synchronize().context("raw_rt")?;
                let wall = t0.elapsed().as_secs_f64();
                stop.store(true, Ordering::Release);
                for r in responders {
                    r.join().expect("responder");
                }
                let v = stream.clone_dtoh(&times)?;
                report(cli, w, t, &v, wall)?;
                continue;
            }
            let stop = Arc::new(AtomicBool::new(false));
            let view = heap.view();
            let services: Vec<_> = (0..t)
                .map(|k| {
                    let (q, stop, ctx) = (Arc::clone(&queues), Arc::clone(&stop), Arc::clone(&ctx));
                    // Named like the runtime's proxy threads, for proxy_cpu.
                    let b = std::thread::Builder::new().name(format!("{}b{k}", cpnet_apps::proxy_cpu::PROXY_THREAD_PREFIX));
                    b.spawn(move || -> Result<()> {
                        let mine: Vec<usize> = (k..q.len()).step_by(t).collect();
                        let (transport, limits) = (LoopbackTransport::new(view), Limits { n_pes: 1, heap_size: 4096 });
                        // As a GPU PE's proxy threads are built: over a mirror
                        // of the queues in GPU memory, or over the mapped
                        // queues, then configured as the runtime does.
                        let mut s = if device_queues {
                            ctx.bind_to_thread().context("bind context")?;
                            let m = q.mirror(&ctx, &mine)?.context("queues in GPU memory have a mirror")?;
                            Service::with_mirror(m, transport, limits, 0)
                        } else {
                            Service::new(mine.iter().map(|&i| q.queue(i)).collect(), transport, limits, 0)
                        };
                        q.configure_service(&mut s, &mine);
                        // Acquire: pairs with the Release store after the kernel.
                        s.run(|| stop.load(Ordering::Acquire));
                        Ok(())
                    })
                })
                .collect::<std::io::Result<Vec<_>>>()?;
            // Only this sweep's service threads (a GPU PE's own proxies may
            // be polling too, with --suite).
            let prefix = format!("{}b", cpnet_apps::proxy_cpu::PROXY_THREAD_PREFIX);
            let before = cpnet_apps::proxy_cpu::sample_prefix(&prefix)?;
            let t0 = Instant::now();
            let run = run_nop_loop(&stream, &func, &handle, cli, w);
            let (busy_cpu_s, busy_wall_s) =
                (cpnet_apps::proxy_cpu::sample_prefix(&prefix)?.since(&before), t0.elapsed().as_secs_f64());
            // Release: pairs with the services' Acquire load.
            stop.store(true, Ordering::Release);
            for s in services {
                s.join().expect("service thread")?;
            }
            let (v, wall) = run?;
            report(cli, w, t, &v, wall)?;
            if let Some(f) = cost_file.as_mut().filter(|_| !device_queues) {
                let commands = u64::from(w) * u64::from(cli.iters + 1);
                writeln!(f, "gpu,{t},busy,{commands},{busy_wall_s:.3},{busy_cpu_s:.3}")?;
            }
        }
    }
    Ok(())
}

/// Launch `nop_loop` on `w` blocks with `handle` and wait for it; the
/// per-block times (checked for errors) and the wall time in seconds. The
/// queues behind `handle` must outlive the call, and their proxy threads
/// must already run.
fn run_nop_loop(
    stream: &Arc<cudarc::driver::CudaStream>,
    func: &cudarc::driver::CudaFunction,
    handle: &KernelHandle,
    cli: &Cli,
    w: u32,
) -> Result<(Vec<u64>, f64)> {
    let times = stream.alloc_zeros::<u64>(2 * w as usize)?;
    let mut launch = stream.launch_builder(func);
    launch.arg(handle).arg(&cli.iters).arg(&times);
    let cfg = LaunchConfig { grid_dim: (w, 1, 1), block_dim: (cli.block, 1, 1), shared_mem_bytes: 0 };
    let t0 = Instant::now();
    // SAFETY: the arguments match nop_loop's (handle by value, an unsigned,
    // a device pointer to 2w u64); the caller keeps the queues alive, and
    // the kernel has ended when this returns (synchronized below).
    unsafe { launch.launch(cfg) }.context("launch nop_loop")?;
    stream.synchronize().context("nop_loop")?;
    let wall = t0.elapsed().as_secs_f64();
    let v = stream.clone_dtoh(&times)?;
    check_blocks(&v)?;
    Ok((v, wall))
}

/// Fail if any block reported an error (its CPNET_E_* in the odd words).
fn check_blocks(v: &[u64]) -> Result<()> {
    let errors: Vec<_> = v.chunks(2).enumerate().filter(|(_, c)| c[1] != 0).map(|(b, c)| (b, c[1])).collect();
    anyhow::ensure!(errors.is_empty(), "blocks failed (block, CPNET_E_*): {errors:?}");
    Ok(())
}

/// One row: per-block mean time per round trip (median and p99 over
/// blocks) and the aggregate rate.
/// Returns the median round trip (us) and the rate (Mops/s).
fn report(cli: &Cli, w: u32, t: usize, v: &[u64], wall: f64) -> (f64, f64) {
    let mut per: Vec<f64> = v.chunks(2).map(|c| c[0] as f64 / f64::from(cli.iters) / 1e3).collect();
    per.sort_by(f64::total_cmp);
    let med = per[per.len() / 2];
    let p99 = per[(per.len() * 99 / 100).min(per.len() - 1)];
    // Rate over the whole kernel (launch and setup included, so slightly
    // pessimistic for small iteration counts).
    let rate = f64::from(w) * f64::from(cli.iters + 1) / wall / 1e6;
    if cli.csv {
        println!("{w},{t},{med:.3},{p99:.3},{rate:.3}");
    } else {
        println!("{w:>12} {t:>14} {med:>16.3} {p99:>14.3} {rate:>14.3}");
    }
    (med, rate)
}
