//! A paced service ([`GPU_PACING`]: pauses after empty polls, prefetches
//! ahead while its queues are busy) takes and completes the same commands
//! as an unpaced one: the pacing is timing only.

use cpnet_device::cpu::HostHeap;
use cpnet_device::layout::Cmd;
use cpnet_device::ring::{Producer, QueueGeometry, QueuePool};
use cpnet_device::sync::Deadline;
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::{GPU_PACING, LoopbackTransport, Pacing, Service};

/// `n` queues, `rounds` rounds of one blocking no-op and one put per queue
/// (the put writes the round into the queue's word of the heap); returns
/// the passes it took.
fn serve(n: usize, rounds: u64, pacing: Pacing) -> u64 {
    let pool = QueuePool::new_host(n, QueueGeometry::new(8).unwrap());
    let heap = HostHeap::new(8 * n as u64);
    let queues: Vec<_> = (0..n).map(|i| pool.queue(i)).collect();
    let mut producers: Vec<Producer> = queues
        .iter()
        .enumerate()
        .map(|(i, q)| {
            assert!(q.try_claim(i as u32));
            Producer::new(q.clone())
        })
        .collect();
    let limits = Limits { n_pes: 1, heap_size: 8 * n as u64 };
    let mut service = Service::new(queues, LoopbackTransport::new(heap.view()), limits, 0);
    service.set_pacing(pacing);
    let mut passes = 0;
    for round in 1..=rounds {
        let mut seqs = Vec::new();
        for (i, p) in producers.iter_mut().enumerate() {
            let put = Cmd::put_inline(0, 8 * i as u64, &round.to_le_bytes()).unwrap();
            p.try_push(&put).expect("room for the put");
            seqs.push(p.try_push(&Cmd::nop().blocking()).expect("room for the no-op"));
        }
        // Round 1 finds every queue busy only from its second pass on; the
        // later rounds run with the prefetch on (saturated passes).
        let mut done = 0;
        while done < 2 * n {
            done += service.poll_once();
            passes += 1;
            assert!(passes < 100 * rounds, "the service stalled");
        }
        for (p, seq) in producers.iter_mut().zip(seqs) {
            p.wait_reply(seq, false, &Deadline::never()).expect("the no-op completes");
        }
        for i in 0..n {
            assert_eq!(heap.view().atomic_u64(cpnet_device::cpu::SymAddr(8 * i as u64)).unwrap().load(std::sync::atomic::Ordering::Relaxed), round, "queue {i}'s put of round {round}");
        }
    }
    passes
}

#[test]
fn a_paced_service_completes_what_an_unpaced_one_does() {
    // More queues than GPU_PACING looks ahead, so the prefetch runs.
    const { assert!(64 > GPU_PACING.prefetch_ahead) };
    let (paced, plain) = (serve(64, 50, GPU_PACING), serve(64, 50, Pacing::default()));
    assert_eq!(paced, plain, "the same passes: pacing changes timing, not what a pass takes");
}

#[test]
fn a_paced_service_with_one_queue_completes_its_commands() {
    serve(1, 200, GPU_PACING);
}
