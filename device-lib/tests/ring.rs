//! Tests of the command ring, each named after the protocol edge it pins.

use std::time::Duration;

use cpnet_device::cmd::InlineTooLarge;
use cpnet_device::layout::*;
use cpnet_device::ring::{Consumer, Outcome, Producer, QueueGeometry, QueuePool, RingError};
use cpnet_device::sync::Deadline;

fn pool(depth: u32) -> QueuePool {
    QueuePool::new_host(1, QueueGeometry::new(depth).unwrap())
}

fn short() -> Deadline {
    Deadline::after(Some(Duration::from_millis(50)))
}

#[test]
fn bad_depth_rejected() {
    for bad in [0, 1, 3, 6, 100, 131072, u32::MAX] {
        assert_eq!(QueueGeometry::new(bad), Err(RingError::BadDepth(bad)), "depth {bad}");
    }
    let msg = QueueGeometry::new(3).unwrap_err().to_string();
    assert!(msg.contains("power of two"), "{msg}");
    for good in [2, 4, 64, 65536] {
        let g = QueueGeometry::new(good).unwrap();
        assert_eq!(g.depth(), good);
        assert_eq!(g.bytes(), 128 + 64 * good as usize);
    }
    assert_eq!(QueueGeometry::default().depth(), 64);
}

#[test]
fn oversize_inline_payload_rejected() {
    assert_eq!(Cmd::put_inline(0, 0, &[0u8; 9]), Err(InlineTooLarge(9)));
    assert_eq!(Cmd::get_inline(0, 0, 9), Err(InlineTooLarge(9)));
    assert_eq!(Cmd::put_signal_inline(0, 0, &[1u8; 16], 8, 1, SignalOp::Set), Err(InlineTooLarge(16)));
    let ok = Cmd::put_inline(1, 64, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    assert_eq!(ok.value, u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
    assert_eq!(ok.flags & CPNET_F_INLINE, CPNET_F_INLINE);
}

#[test]
fn zero_length_put_travels_and_completes() {
    let p = pool(4);
    let mut prod = Producer::new(p.queue(0));
    let mut cons = Consumer::new(p.queue(0));
    let seq = prod.try_push(&Cmd::put(0, 4096, 0, 0).blocking()).unwrap();
    let (s, cmd) = cons.poll().unwrap();
    assert_eq!((s, cmd.size, cmd.dst, cmd.opcode), (seq, 0, 4096, CPNET_OP_PUT));
    cons.complete(s, Outcome::Done);
    assert_eq!(prod.wait_complete(seq, false, &short()), Ok(0));
}

#[test]
fn exact_whole_lap_wrap() {
    let depth = 4u64;
    let p = pool(depth as u32);
    let mut prod = Producer::new(p.queue(0));
    let mut cons = Consumer::new(p.queue(0));
    // Lap 0 fills the ring exactly.
    for i in 0..depth {
        assert_eq!(prod.try_push(&Cmd::put(0, i, 0, 8)), Some(i));
    }
    assert_eq!(prod.try_push(&Cmd::put(0, 99, 0, 8)), None, "a full ring takes no more");
    for i in 0..depth {
        let (s, c) = cons.poll().unwrap();
        assert_eq!((s, c.dst, c.commit), (i, i, i + 1));
        cons.complete(s, Outcome::Done);
    }
    // The slots still hold lap 0's commit words: not new for seq 4..7.
    assert!(cons.poll().is_none(), "a stale slot of the previous lap is not taken");
    // Lap 1 lands exactly on the same slots; commit words carry the lap.
    for i in depth..2 * depth {
        assert_eq!(prod.try_push(&Cmd::put(0, i, 0, 8)), Some(i));
    }
    for i in depth..2 * depth {
        let (s, c) = cons.poll().unwrap();
        assert_eq!((s, c.dst, c.commit), (i, i, i + 1));
        cons.complete(s, Outcome::Done);
    }
    assert!(cons.poll().is_none());
    prod.quiet(&short()).unwrap();
    assert_eq!(p.queue(0).ctl_snapshot().completed, 2 * depth);
}

#[test]
fn full_ring_backpressure_times_out_then_resumes() {
    let p = pool(2);
    let mut prod = Producer::new(p.queue(0));
    let mut cons = Consumer::new(p.queue(0));
    prod.try_push(&Cmd::nop()).unwrap();
    prod.try_push(&Cmd::nop()).unwrap();
    match prod.push(&Cmd::nop(), &short()) {
        Err(RingError::Timeout { what, seq, consumed, completed, written }) => {
            assert_eq!((what, seq, consumed, completed, written), ("a free slot", 2, 0, 0, 2));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    // One slot freed: the next push goes through.
    let (s, _) = cons.poll().unwrap();
    assert_eq!(prod.push(&Cmd::nop(), &short()), Ok(2));
    cons.complete(s, Outcome::Done);
}

#[test]
fn full_ring_backpressure_concurrent_no_loss_no_reorder() {
    const N: u64 = 200_000;
    let p = pool(2);
    let q = p.queue(0);
    let consumer = std::thread::spawn(move || {
        let mut cons = Consumer::new(q);
        let mut next = 0;
        while next < N {
            if let Some((s, c)) = cons.poll() {
                assert_eq!(s, next);
                assert_eq!((c.dst, c.src, c.size), (s, !s, s % 4096), "payload of seq {s}");
                cons.complete(s, Outcome::Done);
                next += 1;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut prod = Producer::new(p.queue(0));
    for i in 0..N {
        let seq = prod.push(&Cmd::put(1, i, !i, i % 4096), &Deadline::never()).unwrap();
        assert_eq!(seq, i);
    }
    prod.quiet(&Deadline::after(Some(Duration::from_secs(30)))).unwrap();
    consumer.join().unwrap();
}

#[test]
fn out_of_order_completion_advances_watermark_over_prefix() {
    let p = pool(8);
    let mut prod = Producer::new(p.queue(0));
    let mut cons = Consumer::new(p.queue(0));
    for _ in 0..4 {
        prod.try_push(&Cmd::nop()).unwrap();
    }
    for _ in 0..4 {
        cons.poll().unwrap();
    }
    cons.complete(2, Outcome::Done);
    cons.complete(1, Outcome::Done);
    assert_eq!(cons.completed(), 0);
    assert_eq!(prod.completed(), 0);
    cons.complete(0, Outcome::Done);
    assert_eq!(cons.completed(), 3);
    assert!(prod.quiet(&short()).is_err(), "seq 3 still outstanding");
    cons.complete(3, Outcome::Done);
    prod.quiet(&short()).unwrap();
}

#[test]
fn consumer_takes_past_the_depth_while_earlier_commands_are_in_flight() {
    // Depth 2, but taking frees slots (C3) before completing (C4): the
    // consumer can hold more outstanding commands than the ring has slots,
    // and its per-command flags must survive that (and a growth with
    // wrapped indices), blocking flags included.
    let p = pool(2);
    let mut prod = Producer::new(p.queue(0));
    let mut cons = Consumer::new(p.queue(0));
    let mut taken = Vec::new();
    for k in 0..7u64 {
        // One blocking command (a blocking producer has at most one), taken
        // before both growths of the flags ring.
        let cmd = if k == 3 { Cmd::nop().blocking() } else { Cmd::nop() };
        prod.try_push(&cmd).unwrap();
        taken.push(cons.poll().unwrap().0);
        if k == 1 {
            // Complete 0 and 1 first so the flags ring's indices wrap.
            cons.complete(0, Outcome::Done);
            cons.complete(1, Outcome::Done);
        }
    }
    assert_eq!(taken, (0..7).collect::<Vec<_>>());
    assert_eq!(cons.outstanding(), 5, "seqs 2..=6 in flight, past depth 2");
    for seq in [6, 4, 3] {
        cons.complete(seq, Outcome::Done);
    }
    assert_eq!(cons.completed(), 2);
    // Seq 3's blocking flag survived the growths: its reply came with its
    // completion, before the watermark reached it.
    assert_eq!(prod.wait_reply(3, false, &short()), Ok(0));
    cons.complete(2, Outcome::Done);
    assert_eq!(cons.completed(), 5, "the prefix 2, 3, 4");
    cons.complete(5, Outcome::Done);
    assert_eq!(cons.completed(), 7);
    prod.quiet(&short()).unwrap();
}

#[test]
fn blocking_completion_returns_its_own_value() {
    let p = pool(4);
    let mut prod = Producer::new(p.queue(0));
    let mut cons = Consumer::new(p.queue(0));
    let s0 = prod.try_push(&Cmd::amo(1, AmoType::Uint64, AmoOp::FetchAdd, 8, 1, 0)).unwrap();
    let (s, c) = cons.poll().unwrap();
    assert_eq!(c.flags & CPNET_F_BLOCKING, CPNET_F_BLOCKING, "fetching AMOs are blocking");
    cons.complete(s, Outcome::Value(41));
    assert_eq!(prod.wait_complete(s0, true, &short()), Ok(41));
    // A value for another command is a protocol violation, not a silent mix-up.
    let s1 = prod.try_push(&Cmd::nop().blocking()).unwrap();
    let (s, _) = cons.poll().unwrap();
    cons.complete(s, Outcome::Done);
    assert_eq!(prod.wait_complete(s1, true, &short()), Err(RingError::Protocol { expected: s1, found: s0 }));
}

#[test]
fn rejected_nbi_command_reported_at_quiet() {
    let p = pool(4);
    let mut prod = Producer::new(p.queue(0));
    let mut cons = Consumer::new(p.queue(0));
    prod.try_push(&Cmd::put(7, 0, 0, 8)).unwrap();
    prod.try_push(&Cmd::put(0, 0, 0, 8)).unwrap();
    let (a, _) = cons.poll().unwrap();
    let (b, _) = cons.poll().unwrap();
    cons.complete(a, Outcome::Failed(ErrorCode::BadPe));
    cons.complete(b, Outcome::Done);
    assert_eq!(prod.quiet(&short()), Err(RingError::Rejected { seq: 0, code: ErrorCode::BadPe }));
    // Reported once; the queue goes on.
    assert_eq!(prod.quiet(&short()), Ok(()));
}

#[test]
fn abort_stops_every_wait() {
    let p = pool(2);
    let mut prod = Producer::new(p.queue(0));
    let seq = prod.try_push(&Cmd::nop().blocking()).unwrap();
    prod.try_push(&Cmd::nop()).unwrap();
    p.queue(0).set_abort(ErrorCode::PeerDead);
    let forever = Deadline::never();
    assert_eq!(prod.wait_complete(seq, false, &forever), Err(RingError::Aborted(ErrorCode::PeerDead)));
    assert_eq!(prod.push(&Cmd::nop(), &forever), Err(RingError::Aborted(ErrorCode::PeerDead)));
    assert_eq!(prod.quiet(&forever), Err(RingError::Aborted(ErrorCode::PeerDead)));
}

#[test]
fn sequence_persists_across_context_destroy_and_create() {
    let p = pool(4);
    let q = p.queue(0);
    assert!(q.try_claim(3));
    assert!(!q.try_claim(4), "a claimed queue is not handed out twice");
    assert_eq!(q.owner(), 3);
    let mut prod = Producer::new(q.clone());
    let mut cons = Consumer::new(q.clone());
    for _ in 0..3 {
        prod.try_push(&Cmd::nop()).unwrap();
        let (s, _) = cons.poll().unwrap();
        cons.complete(s, Outcome::Done);
    }
    prod.quiet(&short()).unwrap();
    prod.detach().release();
    assert!(q.try_claim(5));
    let mut prod = Producer::new(q);
    assert_eq!(prod.write_idx(), 3, "the sequence continues");
    assert_eq!(prod.try_push(&Cmd::nop()), Some(3));
    assert_eq!(cons.poll().map(|(s, _)| s), Some(3));
}
