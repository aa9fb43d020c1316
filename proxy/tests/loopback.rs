//! CPU work-groups through the real queue and the real service loop, on one
//! PE (loopback transport): every operation of the device API, AMOs under
//! contention with exact final values, and bad input reported with names.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cpnet_device::cpu::{CpuCtx, Error, HostHeap, PeInfo, SymAddr};
use cpnet_device::layout::{Cmp, ErrorCode, SignalOp};
use cpnet_device::ring::{QueueGeometry, QueuePool};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::{CommandError, LoopbackTransport, Service};

const HEAP: u64 = 1 << 20;

struct Job {
    _heap: HostHeap,
    pe: PeInfo,
    pool: QueuePool,
    stop: Arc<AtomicBool>,
    proxy: Option<std::thread::JoinHandle<Vec<CommandError>>>,
}

impl Job {
    fn new(n_queues: usize, depth: u32) -> Job {
        let heap = HostHeap::new(HEAP);
        let pe = PeInfo { my_pe: 0, n_pes: 1, heap: heap.view(), wait_timeout: Some(Duration::from_secs(20)) };
        let pool = QueuePool::new_host(n_queues, QueueGeometry::new(depth).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let queues = (0..n_queues).map(|i| pool.queue(i)).collect();
        let mut svc = Service::new(queues, LoopbackTransport::new(pe.heap), Limits { n_pes: 1, heap_size: HEAP }, 0);
        let s = stop.clone();
        let proxy = std::thread::spawn(move || {
            svc.run(|| s.load(Ordering::Acquire));
            svc.take_errors()
        });
        Job { _heap: heap, pe, pool, stop, proxy: Some(proxy) }
    }

    fn ctx(&self, wg: u32) -> CpuCtx {
        CpuCtx::create(&self.pool, self.pe, wg).unwrap()
    }

    fn finish(mut self) -> Vec<CommandError> {
        self.stop.store(true, Ordering::Release);
        self.proxy.take().unwrap().join().unwrap()
    }
}

#[test]
fn ptr_reaches_only_the_own_heap() {
    let job = Job::new(1, 4);
    let mut c = job.ctx(0);
    let p = c.ptr(SymAddr(64), 0).expect("own heap");
    assert_eq!(p.as_ptr(), c.heap().base().wrapping_add(64));
    c.p::<u64>(SymAddr(64), 0x5a5a, 0).unwrap();
    c.quiet().unwrap();
    // SAFETY: 8 bytes inside this PE's heap, 8-aligned; the put is complete
    // (quiet) and nothing else writes the word.
    assert_eq!(unsafe { p.cast::<u64>().as_ptr().read_volatile() }, 0x5a5a);
    assert!(c.ptr(SymAddr(64), 1).is_none(), "another PE");
    assert!(c.ptr(SymAddr(HEAP), 0).is_none(), "past the heap");
    c.destroy().unwrap();
    assert!(job.finish().is_empty());
}

#[test]
fn every_operation_on_one_pe() {
    let job = Job::new(4, 64);
    let mut c = job.ctx(0);
    let h = *c.heap();
    // put / get, inline and not
    h.write_bytes(SymAddr(0), &(0..=255u8).collect::<Vec<_>>()).unwrap();
    c.putmem(SymAddr(4096), SymAddr(0), 256, 0).unwrap();
    c.putmem(SymAddr(8192), SymAddr(0), 5, 0).unwrap();
    c.putmem_nbi(SymAddr(8200), SymAddr(10), 100, 0).unwrap();
    c.putmem(SymAddr(9000), SymAddr(0), 0, 0).unwrap();
    c.quiet().unwrap();
    let mut out = [0u8; 256];
    h.read_bytes(SymAddr(4096), &mut out).unwrap();
    assert!(out.iter().enumerate().all(|(i, &b)| b == i as u8));
    c.getmem(SymAddr(12288), SymAddr(4096), 256, 0).unwrap();
    c.getmem_nbi(SymAddr(16384), SymAddr(8200), 100, 0).unwrap();
    c.quiet().unwrap();
    h.read_bytes(SymAddr(16384), &mut out[..100]).unwrap();
    assert!(out[..100].iter().enumerate().all(|(i, &b)| b == (i + 10) as u8));
    // typed p / g
    c.p(SymAddr(20000), -5i32, 0).unwrap();
    assert_eq!(c.g::<i32>(SymAddr(20000), 0).unwrap(), -5);
    c.p(SymAddr(20008), 2.5f64, 0).unwrap();
    assert_eq!(c.g::<f64>(SymAddr(20008), 0).unwrap(), 2.5);
    // put_signal + signal_wait_until
    c.putmem_signal(SymAddr(24576), SymAddr(0), 64, SymAddr(30000), 7, SignalOp::Set, 0).unwrap();
    assert_eq!(c.signal_wait_until(SymAddr(30000), Cmp::Eq, 7).unwrap(), 7);
    c.putmem_signal_nbi(SymAddr(24576), SymAddr(0), 4, SymAddr(30000), 3, SignalOp::Add, 0).unwrap();
    assert_eq!(c.signal_wait_until(SymAddr(30000), Cmp::Ge, 10).unwrap(), 10);
    // AMOs, all types
    let a = SymAddr(32768);
    c.atomic_set::<u64>(a, 10, 0).unwrap();
    c.fence().unwrap();
    assert_eq!(c.atomic_fetch::<u64>(a, 0).unwrap(), 10);
    assert_eq!(c.atomic_fetch_add::<u64>(a, 5, 0).unwrap(), 10);
    assert_eq!(c.atomic_swap::<u64>(a, 100, 0).unwrap(), 15);
    assert_eq!(c.atomic_compare_swap::<u64>(a, 1, 2, 0).unwrap(), 100, "failed compare leaves it");
    assert_eq!(c.atomic_compare_swap::<u64>(a, 100, 2, 0).unwrap(), 100);
    c.atomic_inc::<u64>(a, 0).unwrap();
    assert_eq!(c.atomic_fetch_inc::<u64>(a, 0).unwrap(), 3);
    assert_eq!(c.atomic_fetch_and::<u64>(a, 0b110, 0).unwrap(), 4);
    c.atomic_or::<u64>(a, 0b1001, 0).unwrap();
    c.atomic_xor::<u64>(a, 0b1, 0).unwrap();
    assert_eq!(c.atomic_fetch_or::<u64>(a, 0, 0).unwrap(), 0b1100);
    assert_eq!(c.atomic_fetch_xor::<u64>(a, 0b1100, 0).unwrap(), 0b1100);
    c.atomic_and::<u64>(a, 0, 0).unwrap();
    let b = SymAddr(32776);
    c.atomic_set::<i32>(b, -3, 0).unwrap();
    assert_eq!(c.atomic_fetch_add::<i32>(b, -4, 0).unwrap(), -3);
    assert_eq!(c.atomic_fetch::<i32>(b, 0).unwrap(), -7);
    c.atomic_add::<u32>(SymAddr(32780), u32::MAX, 0).unwrap();
    assert_eq!(c.atomic_fetch::<u32>(SymAddr(32780), 0).unwrap(), u32::MAX);
    c.atomic_add::<i64>(SymAddr(32784), -9, 0).unwrap();
    assert_eq!(c.atomic_fetch::<i64>(SymAddr(32784), 0).unwrap(), -9);
    c.wait_until::<i64>(SymAddr(32784), Cmp::Lt, 0).unwrap();
    assert!(c.test::<i32>(b, Cmp::Eq, -7).unwrap());
    c.nop().unwrap();
    c.barrier_all().unwrap();
    c.destroy().unwrap();
    assert!(job.finish().is_empty());
}

#[test]
fn amos_under_contention_exact_final_value() {
    const WG: u32 = 8;
    const N: u64 = 5_000;
    let job = Job::new(WG as usize, 8);
    std::thread::scope(|s| {
        for wg in 0..WG {
            let mut c = job.ctx(wg);
            s.spawn(move || {
                let mut seen = Vec::with_capacity(N as usize);
                for i in 0..N {
                    seen.push(c.atomic_fetch_add::<u64>(SymAddr(0), 1, 0).unwrap());
                    c.atomic_add::<i32>(SymAddr(8), -1, 0).unwrap();
                    c.atomic_xor::<u32>(SymAddr(12), 1 << (i % 32), 0).unwrap();
                }
                c.destroy().unwrap();
                seen
            });
        }
    });
    let h = job.pe.heap;
    assert_eq!(h.atomic_u64(SymAddr(0)).unwrap().load(Ordering::Acquire), u64::from(WG) * N);
    assert_eq!(h.atomic_u32(SymAddr(8)).unwrap().load(Ordering::Acquire) as i32, -((WG as u64 * N) as i32));
    // Each bit flipped WG * N / 32 times (N divisible by 32? 5000/32 not whole): compute exactly.
    let mut expect = 0u32;
    for _ in 0..WG {
        for i in 0..N {
            expect ^= 1 << (i % 32);
        }
    }
    assert_eq!(h.atomic_u32(SymAddr(12)).unwrap().load(Ordering::Acquire), expect);
    assert!(job.finish().is_empty());
}

#[test]
fn bad_input_gets_a_clear_error_and_corrupts_nothing() {
    let job = Job::new(2, 4);
    let mut c = job.ctx(1);
    let h = *c.heap();
    h.write_bytes(SymAddr(0), &[0xAB; 64]).unwrap();
    let e = c.putmem(SymAddr(0), SymAddr(0), 8, 3).unwrap_err();
    assert_eq!(e.code(), ErrorCode::BadPe);
    let msg = e.to_string();
    assert!(msg.contains("work-group 1") && msg.contains("PE 3") && msg.contains("putmem"), "{msg}");
    let e = c.putmem(SymAddr(HEAP - 8), SymAddr(0), 64, 0).unwrap_err();
    assert_eq!(e.code(), ErrorCode::BadAddr);
    assert!(e.to_string().contains(&format!("{:#x}", HEAP - 8)), "{e}");
    let e = c.atomic_fetch_add::<u64>(SymAddr(4), 1, 0).unwrap_err();
    assert_eq!(e.code(), ErrorCode::BadAlign);
    assert!(e.to_string().contains("atomic_fetch_add"), "{e}");
    // An nbi error surfaces at quiet, naming the operation.
    c.getmem_nbi(SymAddr(0), SymAddr(HEAP), 1, 0).unwrap();
    let e = c.quiet().unwrap_err();
    assert!(matches!(e, Error::Op { code: ErrorCode::BadAddr, op: "getmem", .. }), "{e}");
    // Nothing was written.
    let mut out = [0u8; 64];
    h.read_bytes(SymAddr(0), &mut out).unwrap();
    assert_eq!(out, [0xAB; 64]);
    // The context still works.
    c.p(SymAddr(64), 1u64, 0).unwrap();
    c.destroy().unwrap();
    let errors = job.finish();
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert!(errors[0].to_string().contains("work-group 1"), "{}", errors[0]);
}

#[test]
fn stuck_wait_reports_what_it_waits_for() {
    let job = Job::new(1, 4);
    let pe = PeInfo { wait_timeout: Some(Duration::from_millis(100)), ..job.pe };
    let c = CpuCtx::create(&job.pool, pe, 0).unwrap();
    let e = c.wait_until::<u64>(SymAddr(256), Cmp::Eq, 42).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("heap+0x100") && msg.contains("42") && msg.contains("found 0") && msg.contains("PE 0"), "{msg}");
    c.destroy().unwrap();
    job.finish();
}
