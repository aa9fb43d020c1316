//! CPU queue demo: CPU work-groups issue real commands through cpnet's
//! command queues to a real proxy service thread, on one PE (the loopback
//! transport executes on the local symmetric heap). Every work-group
//! hammers one shared counter with fetch-add, passes a token around a ring
//! of work-groups with put-with-signal, and checks what it reads back; the
//! program verifies exact final values and prints the command rate.
//!
//! `cargo run --release -p cpnet-apps --bin cpnet-queue-demo -- --work-groups 8 --iters 20000`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use cpnet_device::cpu::{CpuCtx, HostHeap, PeInfo, SymAddr};
use cpnet_device::layout::{Cmp, SignalOp};
use cpnet_device::ring::{QueueGeometry, QueuePool};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::{LoopbackTransport, Service};

#[derive(Parser)]
#[command(about = "CPU work-groups through cpnet's command queues and proxy (one PE)")]
struct Args {
    /// CPU work-groups (threads), each with its own queue.
    #[arg(long, default_value_t = 8)]
    work_groups: u32,
    /// Iterations per work-group (each issues 4 commands).
    #[arg(long, default_value_t = 20_000)]
    iters: u64,
    /// Queue depth in slots (power of two, 2..=65536).
    #[arg(long, default_value_t = 64)]
    depth: u32,
}

const COUNTER: SymAddr = SymAddr(0);
fn signal(wg: u32) -> SymAddr {
    SymAddr(64 + 8 * u64::from(wg))
}
fn mailbox(wg: u32) -> SymAddr {
    SymAddr(4096 + 64 * u64::from(wg))
}
fn scratch(wg: u32) -> SymAddr {
    SymAddr(65536 + 64 * u64::from(wg))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let geom = QueueGeometry::new(args.depth)?;
    let wgs = args.work_groups;
    if wgs == 0 || wgs > 512 {
        bail!("--work-groups must be 1..=512");
    }
    let heap_size = 1 << 20;
    let heap = HostHeap::new(heap_size);
    let pe = PeInfo { my_pe: 0, n_pes: 1, heap: heap.view(), wait_timeout: Some(Duration::from_secs(30)) };
    let pool = QueuePool::new_host(wgs as usize, geom);
    let stop = Arc::new(AtomicBool::new(false));
    let mut svc =
        Service::new((0..wgs as usize).map(|i| pool.queue(i)).collect(), LoopbackTransport::new(pe.heap), Limits { n_pes: 1, heap_size }, 0);
    let s = stop.clone();
    let proxy = std::thread::Builder::new().name("cpnet-proxy-0".into()).spawn(move || {
        svc.run(|| s.load(Ordering::Acquire));
        svc.take_errors()
    })?;

    let start = Instant::now();
    let results: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..wgs)
            .map(|wg| {
                let mut c = CpuCtx::create(&pool, pe, wg).expect("one queue per work-group");
                scope.spawn(move || -> anyhow::Result<()> {
                    let next = (wg + 1) % wgs;
                    for i in 1..=args.iters {
                        c.atomic_fetch_add::<u64>(COUNTER, 1, 0)?;
                        // Hand token i to the next work-group: data, then signal.
                        c.heap().write_bytes(scratch(wg), &(u64::from(wg) << 32 | i).to_le_bytes())?;
                        c.putmem_signal_nbi(mailbox(next), scratch(wg), 8, signal(next), 1, SignalOp::Add, 0)?;
                        // Wait for the token from the previous work-group.
                        c.signal_wait_until(signal(wg), Cmp::Ge, i)?;
                        let prev = (wg + wgs - 1) % wgs;
                        let got = c.g::<u64>(mailbox(wg), 0)?;
                        if got >> 32 != u64::from(prev) {
                            bail!("work-group {wg}: token from {} instead of {prev}", got >> 32);
                        }
                        c.quiet()?;
                    }
                    c.destroy().context("destroy")?;
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("work-group thread")).collect()
    });
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Release);
    let errors = proxy.join().expect("proxy thread");
    for r in results {
        r?;
    }
    if !errors.is_empty() {
        bail!("proxy reported {} errors, first: {}", errors.len(), errors[0]);
    }
    let counter = pe.heap.atomic_u64(COUNTER).map_err(|e| anyhow::anyhow!("{e}"))?.load(Ordering::Acquire);
    let expect = u64::from(wgs) * args.iters;
    if counter != expect {
        bail!("counter is {counter}, expected {expect}");
    }
    // fetch_add, put_signal, g, quiet per iteration.
    let commands = expect * 4;
    println!(
        "cpnet-queue-demo: {wgs} work-groups x {} iterations, depth {}: {commands} commands in {:.3} s = {:.2} Mcmd/s; counter = {counter} (exact); token ring verified",
        args.iters,
        args.depth,
        elapsed.as_secs_f64(),
        commands as f64 / elapsed.as_secs_f64() / 1e6
    );
    Ok(())
}
