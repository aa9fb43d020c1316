//! What one 8-byte nbi put costs the proxies, initiator and target together,
//! on the real libfabric transport, without threads: two PEs in one process
//! and one thread. `queues` queues of PE 0 are filled with 8-byte
//! `putmem_nbi` commands to PE 1 (inline payloads, as a CPU or GPU
//! work-group writes them), then PE 0's service and PE 1's service each run
//! one pass, until `puts` puts are taken; then a quiet on every queue.
//!
//! ```text
//! cargo run --release -p cpnet-proxy --example put_cost -- shm 1 2000000
//! cargo run --release -p cpnet-proxy --example put_cost -- 'tcp;ofi_rxm' 4 2000000
//! ```
//!
//! Prints the passes, the puts and the CPU time per put (user and system,
//! which includes writing the commands), and the wall time per put. One
//! thread does what, in a job, three do on their own cores (the work-group,
//! PE 0's proxy, PE 1's proxy): the CPU time per put is their summed cost,
//! what bounds the rate on a machine without spare cores, and it has no
//! scheduling in it (on a shared machine the wall time does).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use cpnet_device::cpu::HostHeap;
use cpnet_device::layout::Cmd;
use cpnet_device::ring::{Producer, QueueGeometry, QueuePool};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::Service;
use cpnet_proxy::transport::{FabricConfig, FabricEndpoint, region_len};

const HEAP: u64 = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let provider = args.first().cloned().unwrap_or_else(|| "shm".to_owned());
    let queues: usize = args.get(1).map_or(1, |a| a.parse().expect("usage: put_cost [provider] [queues] [puts]"));
    let puts: u64 = args.get(2).map_or(2_000_000, |a| a.parse().expect("usage: put_cost [provider] [queues] [puts]"));
    let cfg = FabricConfig {
        src_node: (!provider.starts_with("shm")).then(|| "127.0.0.1".to_owned()),
        provider: provider.clone(),
        reach_timeout: None,
    };
    let heaps = [HostHeap::new(region_len(HEAP)), HostHeap::new(region_len(HEAP))];
    let eps: Vec<FabricEndpoint> = (0..2)
        .map(|pe| FabricEndpoint::open(&cfg, pe, heaps[pe as usize].view(), HEAP).expect("open the endpoint"))
        .collect();
    let cards: Vec<_> = eps.iter().map(FabricEndpoint::card).collect();
    let epoch = Arc::new(AtomicU64::new(0));
    let mut transports = eps.into_iter().map(|ep| ep.connect(&cards, Arc::clone(&epoch)).expect("connect"));
    let (t0, t1) = (transports.next().expect("PE 0"), transports.next().expect("PE 1"));
    let limits = Limits { n_pes: 2, heap_size: HEAP };
    let pool = QueuePool::new_host(queues, QueueGeometry::default());
    let qs: Vec<_> = (0..queues).map(|i| pool.queue(i)).collect();
    let mut producers: Vec<Producer> = qs
        .iter()
        .enumerate()
        .map(|(i, q)| {
            assert!(q.try_claim(i as u32), "a fresh pool");
            Producer::new(q.clone())
        })
        .collect();
    let mut pe0 = Service::new(qs, t0, limits, 0);
    let mut pe1 = Service::new(Vec::new(), t1, limits, 1);
    let (mut passes, mut written) = (0u64, 0u64);
    let (start, cpu0) = (std::time::Instant::now(), cpu_time());
    while written < puts {
        for (w, p) in producers.iter_mut().enumerate() {
            while written < puts {
                let dst = 64 * w as u64 + 8 * (written % 8);
                let cmd = Cmd::put_inline(1, dst, &written.to_le_bytes()).expect("8 bytes");
                if p.try_push(&cmd).is_none() {
                    break;
                }
                written += 1;
            }
        }
        pe0.poll_once();
        pe1.poll_once();
        passes += 1;
    }
    for p in &mut producers {
        while p.try_push(&Cmd::quiet()).is_none() {
            pe0.poll_once();
            pe1.poll_once();
        }
    }
    while producers.iter().any(|p| p.completed() < p.write_idx()) {
        pe0.poll_once();
        pe1.poll_once();
        passes += 1;
    }
    let (dt, cpu) = (start.elapsed().as_secs_f64(), cpu_time() - cpu0);
    println!(
        "{provider}, {queues} queue(s): {passes} passes, {puts} 8-byte nbi puts, {:.1} ns of CPU per put ({:.2} M/s on one core), {:.1} ns per put of wall time",
        cpu / puts as f64 * 1e9,
        puts as f64 / cpu / 1e6,
        dt / puts as f64 * 1e9
    );
}

/// CPU time of this process so far (user and system), seconds: unlike the
/// wall time, it does not count the time other programs had the core.
fn cpu_time() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the buffer we pass.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage");
    // SAFETY: initialized by the successful call above.
    let u = unsafe { u.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}
