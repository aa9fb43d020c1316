//! The claim signal (cmd.h, "Claim signal"): a service given the status
//! block's `claim_gen` starts polling a newly claimed queue on the first pass
//! after the word moves, and not before; without it, on its periodic
//! rebuild of the active list.

use cpnet_device::cpu::HostHeap;
use cpnet_device::layout::{CPNET_STATUS_BYTES, CPNET_STATUS_OFF_CLAIM_GEN, Cmd};
use cpnet_device::ring::{Producer, QueueGeometry, QueuePool};
use cpnet_device::sync::{Ordering, Words};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::{ACTIVE_REFRESH_PASSES, LoopbackTransport, Service};

/// A status block in host memory, 8-aligned.
struct StatusBlock(Box<[u64; CPNET_STATUS_BYTES / 8]>);

impl StatusBlock {
    fn new() -> StatusBlock {
        StatusBlock(Box::new([0; CPNET_STATUS_BYTES / 8]))
    }

    fn words(&mut self) -> Words {
        // SAFETY: the box is 8-aligned, CPNET_STATUS_BYTES long and outlives
        // every use in the test (it is dropped last); only atomics touch it
        // once the view exists.
        unsafe { Words::from_raw(self.0.as_mut_ptr(), CPNET_STATUS_BYTES / 8) }
    }
}

fn service(pool: &QueuePool, heap: &HostHeap) -> Service<LoopbackTransport> {
    let queues = (0..pool.len()).map(|i| pool.queue(i)).collect();
    Service::new(queues, LoopbackTransport::new(heap.view()), Limits { n_pes: 1, heap_size: 4096 }, 0)
}

#[test]
fn a_claimed_queue_is_polled_the_pass_after_the_signal_and_not_before() {
    let heap = HostHeap::new(4096);
    let pool = QueuePool::new_host(8, QueueGeometry::new(4).unwrap());
    let mut status = StatusBlock::new();
    let words = status.words();
    let mut svc = service(&pool, &heap);
    svc.set_claim_signal(words);
    for _ in 0..3 {
        assert_eq!(svc.poll_once(), 0, "nothing claimed yet");
    }

    // A work-group claims queue 5 and publishes a no-op, without the signal.
    let q = pool.queue(5);
    assert!(q.try_claim(7));
    let mut p = Producer::new(q);
    p.try_push(&Cmd::nop()).expect("room");
    // Passes 3..=62: none is a multiple of ACTIVE_REFRESH_PASSES, so no
    // periodic rebuild (with a signal, also at most every 1 ms) can run:
    // the queue is not polled.
    for _ in 0..ACTIVE_REFRESH_PASSES - 4 {
        assert_eq!(svc.poll_once(), 0, "polled before the signal");
    }
    assert_eq!(p.completed(), 0);

    // The claimer's signal (the GPU does this with red.release.sys.add).
    // Release: pairs with the service's acquire load of claim_gen.
    words.word32(CPNET_STATUS_OFF_CLAIM_GEN).fetch_add(1, Ordering::Release);
    assert!(svc.poll_once() > 0, "the pass after the signal takes the command");
    assert_eq!(p.completed(), 1);
}

#[test]
fn without_a_signal_a_claim_is_seen_at_the_periodic_rebuild() {
    let heap = HostHeap::new(4096);
    let pool = QueuePool::new_host(8, QueueGeometry::new(4).unwrap());
    let mut svc = service(&pool, &heap);
    assert_eq!(svc.poll_once(), 0);
    let q = pool.queue(2);
    assert!(q.try_claim(1));
    let mut p = Producer::new(q);
    p.try_push(&Cmd::nop()).expect("room");
    let passes = (1..=ACTIVE_REFRESH_PASSES).find(|_| svc.poll_once() > 0);
    assert!(passes.is_some(), "taken within {ACTIVE_REFRESH_PASSES} passes");
    assert_eq!(p.completed(), 1);
}
