//! Ring throughput: one CPU producer thread to one CPU consumer thread.
//!
//! `cargo bench -p cpnet-device --bench ring` prints, per depth, the time per
//! command and the throughput in elements (commands) per second (criterion's
//! `thrpt`, read as Mops/s), for nbi commands (producer never waits except
//! for a free slot) and for blocking round trips (push, consumer completes,
//! producer sees it).

use std::time::{Duration, Instant};

use cpnet_device::layout::Cmd;
use cpnet_device::ring::{Consumer, Outcome, Producer, QueueGeometry, QueuePool};
use cpnet_device::sync::Deadline;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// Consume exactly `n` commands, completing each at once.
fn consume(pool: QueuePool, n: u64) {
    let mut c = Consumer::new(pool.queue(0));
    let mut done = 0;
    while done < n {
        if let Some((seq, _)) = c.poll() {
            c.complete(seq, Outcome::Done);
            done += 1;
        } else {
            std::hint::spin_loop();
        }
    }
}

fn nbi_throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_nbi_1p1c");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(3));
    for depth in [2u32, 8, 64, 1024] {
        g.bench_with_input(BenchmarkId::from_parameter(depth), &depth, |b, &depth| {
            b.iter_custom(|iters| {
                let pool = QueuePool::new_host(1, QueueGeometry::new(depth).unwrap());
                let cp = pool.clone();
                let consumer = std::thread::spawn(move || consume(cp, iters));
                let mut p = Producer::new(pool.queue(0));
                let cmd = Cmd::put(1, 0, 64, 8);
                let never = Deadline::never();
                let start = Instant::now();
                for _ in 0..iters {
                    p.push(&cmd, &never).unwrap();
                }
                p.quiet(&never).unwrap();
                let t = start.elapsed();
                consumer.join().unwrap();
                t
            });
        });
    }
    g.finish();
}

fn blocking_round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("ring_blocking_round_trip");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("depth64", |b| {
        b.iter_custom(|iters| {
            let pool = QueuePool::new_host(1, QueueGeometry::default());
            let cp = pool.clone();
            let consumer = std::thread::spawn(move || consume(cp, iters));
            let mut p = Producer::new(pool.queue(0));
            let never = Deadline::never();
            let start = Instant::now();
            for _ in 0..iters {
                let seq = p.push(&Cmd::nop().blocking(), &never).unwrap();
                p.wait_complete(seq, false, &never).unwrap();
            }
            let t = start.elapsed();
            consumer.join().unwrap();
            t
        });
    });
    g.finish();
}

criterion_group!(benches, nbi_throughput, blocking_round_trip);
criterion_main!(benches);
