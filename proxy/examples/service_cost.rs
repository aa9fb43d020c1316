//! The proxy service loop's own cost per command, without a GPU or a
//! second thread: `queues` queues each get one blocking no-op, then one
//! service pass takes and completes them all (as when 1024 GPU work-groups
//! each wait on a blocking call), `rounds` times.
//!
//! ```text
//! cargo run --release -p cpnet-proxy --example service_cost -- 1024 2000
//! cargo run --release -p cpnet-proxy --example service_cost -- 1024 2000 paced
//! valgrind --tool=callgrind target/release/examples/service_cost 1024 50
//! ```
//!
//! `paced`: with a GPU PE's poll pacing (`GPU_PACING`: its prefetches run,
//! since every queue is busy).
//!
//! Prints the passes, the commands and the time per command (the time
//! includes writing the commands, which a GPU does in the real setting).
//! Under callgrind, `Service::poll_once`'s inclusive instruction count over
//! the commands is the service's instructions per command.

use cpnet_device::cpu::HostHeap;
use cpnet_device::layout::Cmd;
use cpnet_device::ring::{Producer, QueueGeometry, QueuePool};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::{GPU_PACING, LoopbackTransport, Service};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let paced = args.iter().any(|a| a == "paced");
    let mut args = args.iter().filter(|a| *a != "paced").map(|a| a.parse::<usize>().expect("usage: service_cost [queues] [rounds] [paced]"));
    let (n, rounds) = (args.next().unwrap_or(1024), args.next().unwrap_or(2000));
    let pool = QueuePool::new_host(n, QueueGeometry::default());
    let heap = HostHeap::new(4096);
    let queues: Vec<_> = (0..n).map(|i| pool.queue(i)).collect();
    let mut producers: Vec<Producer> = queues
        .iter()
        .enumerate()
        .map(|(i, q)| {
            assert!(q.try_claim(i as u32), "a fresh pool");
            Producer::new(q.clone())
        })
        .collect();
    let mut service = Service::new(queues, LoopbackTransport::new(heap.view()), Limits { n_pes: 1, heap_size: 4096 }, 0);
    if paced {
        service.set_pacing(GPU_PACING);
    }
    let (mut passes, mut commands) = (0u64, 0usize);
    let t0 = std::time::Instant::now();
    for _ in 0..rounds {
        for p in &mut producers {
            p.try_push(&Cmd::nop().blocking()).expect("the previous no-op was taken");
        }
        let mut taken = 0;
        while taken < n {
            taken += service.poll_once();
            passes += 1;
        }
        commands += taken;
    }
    let dt = t0.elapsed().as_secs_f64();
    let mode = if paced { ", paced" } else { "" };
    println!(
        "{n} queues, {rounds} rounds{mode}: {passes} passes, {commands} commands, {:.1} ns per command ({:.1} M/s)",
        dt / commands as f64 * 1e9,
        commands as f64 / dt / 1e6
    );
}
