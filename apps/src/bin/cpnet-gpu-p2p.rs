//! `cpnet-gpu-p2p`: GPU-initiated point-to-point latency and bandwidth
//! between two GPU PEs (ComP-Net paper Fig. 8a).
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

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use cpnet::GpuPe;
use cpnet::gpu::GpuError;
use cpnet_apps::gpu_p2p::{KERNEL, P2pArgs, heap_needed, run};

#[derive(Parser)]
#[command(about = "GPU-initiated put/get latency and bandwidth between two GPU PEs (run under cpnet-run -n 2)")]
struct Cli {
    #[command(flatten)]
    p2p: P2pArgs,
    /// Only compile the kernel with NVRTC for sm_90 and exit (no GPU
    /// needed).
    #[arg(long, hide = true)]
    compile_only: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.compile_only {
        let opts = cpnet::device::nvrtc::BuildOptions { name: "p2p.cu".into(), ..Default::default() };
        return match cpnet::device::nvrtc::compile(KERNEL, &opts) {
            Ok(c) => {
                println!("cpnet-gpu-p2p: kernel compiled for {} ({} bytes of PTX){}", c.arch, c.ptx.len(), if c.log.trim().is_empty() { String::new() } else { format!("\n{}", c.log) });
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cpnet-gpu-p2p: {e}\n{}", e.log().unwrap_or_default());
                ExitCode::from(1)
            }
        };
    }
    if std::env::var_os(cpnet::env::HEAP_SIZE).is_none() {
        let need = heap_needed(cli.p2p.max);
        // SAFETY: no other thread exists yet (nothing has been started), so
        // nobody reads the environment concurrently.
        unsafe { std::env::set_var(cpnet::env::HEAP_SIZE, need.to_string()) };
    }
    let pe = match GpuPe::init() {
        Ok(pe) => pe,
        Err(cpnet::pe::Error::Gpu(e @ (GpuError::NoDriver | GpuError::NoDevice { .. }))) => {
            println!("cpnet-gpu-p2p: SKIPPED: {e}");
            return if std::env::var("CPNET_REQUIRE_GPU").as_deref() == Ok("1") { ExitCode::from(1) } else { ExitCode::SUCCESS };
        }
        Err(e) => {
            eprintln!("cpnet-gpu-p2p: init failed: {e}");
            return ExitCode::from(2);
        }
    };
    let me = pe.my_pe();
    match run(&pe, &cli.p2p).and_then(|()| pe.finalize().context("finalize")) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cpnet-gpu-p2p: PE {me}: {e:#}");
            ExitCode::from(1)
        }
    }
}

