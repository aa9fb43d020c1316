//! Loom model of THE QUEUE PROTOCOL (`include/cpnet/cmd.h`): one producer and
//! one consumer over a depth-2 ring, covering lap wrap, a full ring with
//! backpressure, blocking completion with a returned value (through the
//! `completed` watermark and through the `reply` word), and quiet.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p cpnet-device --test loom --release`
//! (CI runs it; see .ci/run). Slot payload words are relaxed atomics in the
//! model, so a missing Acquire/Release pair shows up as a stale payload.
#![cfg(loom)]

use cpnet_device::layout::Cmd;
use cpnet_device::ring::{Consumer, Outcome, Producer, QueueGeometry, QueueMem};
use cpnet_device::sync::Deadline;

fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// The consumer side: take `n` commands, check each payload against its seq,
/// complete them (blocking ones with a value derived from the seq).
fn consume(mem: QueueMem, n: u64) {
    let mut c = Consumer::new(mem);
    let mut taken = 0;
    while taken < n {
        match c.poll() {
            Some((seq, cmd)) => {
                assert_eq!(seq, taken, "commands arrive in order");
                // The payload must be the one written for this seq (P2/P3 vs C1).
                assert_eq!(cmd.dst, 1000 + seq, "stale or torn payload");
                assert_eq!(cmd.size, seq);
                let outcome = if cmd.flags & cpnet_device::layout::CPNET_F_BLOCKING != 0 {
                    Outcome::Value(seq * 7)
                } else {
                    Outcome::Done
                };
                c.complete(seq, outcome);
                taken += 1;
            }
            None => loom::thread::yield_now(),
        }
    }
}

fn cmd(seq: u64) -> Cmd {
    Cmd::put(0, 1000 + seq, 0, seq)
}

/// Three commands through a depth-2 ring: the third wraps to slot 0 (lap 1)
/// and must wait for the consumer to free it (full ring, backpressure).
#[test]
fn loom_lap_wrap_and_full_ring() {
    model(|| {
        let geom = QueueGeometry::new(2).unwrap();
        let mem = QueueMem::new_loom(geom);
        let cm = mem.clone();
        let consumer = loom::thread::spawn(move || consume(cm, 3));
        let mut p = Producer::new(mem);
        for seq in 0..3 {
            assert_eq!(p.push(&cmd(seq), &Deadline::never()).unwrap(), seq);
        }
        p.quiet(&Deadline::never()).unwrap();
        assert_eq!(p.completed(), 3);
        consumer.join().unwrap();
    });
}

/// A blocking command gets its own result (P4 vs C4), after an nbi one.
#[test]
fn loom_blocking_completion_returns_value() {
    model(|| {
        let geom = QueueGeometry::new(2).unwrap();
        let mem = QueueMem::new_loom(geom);
        let cm = mem.clone();
        let consumer = loom::thread::spawn(move || consume(cm, 2));
        let mut p = Producer::new(mem);
        p.push(&cmd(0), &Deadline::never()).unwrap();
        let seq = p.push(&cmd(1).blocking(), &Deadline::never()).unwrap();
        let v = p.wait_complete(seq, true, &Deadline::never()).unwrap();
        assert_eq!(v, 7);
        // Completion of seq 1 implies seq 0 is complete too (watermark).
        assert!(p.completed() >= 2);
        consumer.join().unwrap();
    });
}

/// The reply word (P4 reply variant vs C5, what the GPU producer waits
/// on): a blocking command after an nbi one gets its own value, with the
/// result ordered before the reply.
#[test]
fn loom_blocking_reply_carries_value() {
    model(|| {
        let geom = QueueGeometry::new(2).unwrap();
        let mem = QueueMem::new_loom(geom);
        let cm = mem.clone();
        let consumer = loom::thread::spawn(move || consume(cm, 2));
        let mut p = Producer::new(mem);
        p.push(&cmd(0), &Deadline::never()).unwrap();
        let seq = p.push(&cmd(1).blocking(), &Deadline::never()).unwrap();
        assert_eq!(p.wait_reply(seq, true, &Deadline::never()).unwrap(), 7);
        p.quiet(&Deadline::never()).unwrap();
        consumer.join().unwrap();
    });
}

/// Out-of-order completion: the watermark covers only the completed prefix,
/// and quiet sees both.
#[test]
fn loom_out_of_order_completion_and_quiet() {
    model(|| {
        let geom = QueueGeometry::new(2).unwrap();
        let mem = QueueMem::new_loom(geom);
        let cm = mem.clone();
        let consumer = loom::thread::spawn(move || {
            let mut c = Consumer::new(cm);
            let mut got = Vec::new();
            while got.len() < 2 {
                match c.poll() {
                    Some((seq, cmd)) => {
                        assert_eq!(cmd.dst, 1000 + seq);
                        got.push(seq)
                    }
                    None => loom::thread::yield_now(),
                }
            }
            c.complete(1, Outcome::Done);
            assert_eq!(c.completed(), 0, "seq 0 still outstanding");
            c.complete(0, Outcome::Done);
            assert_eq!(c.completed(), 2);
        });
        let mut p = Producer::new(mem);
        p.push(&cmd(0), &Deadline::never()).unwrap();
        p.push(&cmd(1), &Deadline::never()).unwrap();
        p.quiet(&Deadline::never()).unwrap();
        consumer.join().unwrap();
    });
}
