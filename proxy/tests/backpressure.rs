//! Backpressure (issue 7, reliability): rings of depth 2 and 4, each
//! written by its own work-group thread (a ring has one producer: one
//! context per queue), all consumed by one real [`Service`] on its own
//! thread. Every command carries its work-group and a per-work-group
//! sequence number in its payload; a recording [`Transport`] checks that
//! each work-group's numbers arrive exactly once and in order, while it
//! refuses some submissions (`Busy`, so the service must retry the same
//! command first) and finishes others a few polls later, in random order
//! (`Pending`, so completions come back out of order). The producers check
//! every fetched value, that every blocking wait and quiet returns, and that
//! the completed watermark ends equal to the number of commands pushed.
//!
//! The ignored test runs 10^7 commands (depth 2 and depth 4, 5 * 10^6
//! each): `cargo test --release -p cpnet-proxy --test backpressure -- --ignored --nocapture`
//! (18.9 s of test time on the 2-core CI machine while it ran other jobs).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cpnet_device::layout::{AmoOp, AmoType, Cmd, ErrorCode};
use cpnet_device::ring::{Outcome, Producer, QueueGeometry, QueuePool};
use cpnet_device::sync::Deadline;
use cpnet_proxy::decode::{Limits, Op, PutSrc};
use cpnet_proxy::service::{Finished, Service, Submit, Tag, Transport};

/// Heap the decoder checks against (the recording transport touches none).
const HEAP: u64 = 1 << 20;
/// Target PEs (the PE of a command cycles through them).
const N_PES: i32 = 4;
/// Bytes of the heap region a work-group's commands address: the
/// transport recovers the work-group from the address.
const LANE: u64 = 64;
/// How long any producer wait may take before the test fails (no hang).
const WAIT: Duration = Duration::from_secs(120);

/// splitmix64: a small seeded generator for the transport's choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The value a fetching command of work-group `wg` with sequence number
/// `n` returns, so the producer can tell it got its own result.
fn fetched(wg: u64, n: u64) -> u64 {
    (n.wrapping_mul(0x0100_0000_01B3)) ^ (wg << 56) ^ 0x5EED
}

/// What the recording transport saw, returned from the service thread.
#[derive(Debug, Default)]
struct Record {
    /// Per queue: the next sequence number expected (= commands received).
    next: Vec<u64>,
    /// Per queue: the ring seq of the last command received.
    last_seq: Vec<Option<u64>>,
    /// Submissions refused with `Busy` (each retried by the service).
    busy: u64,
    /// Submissions finished later through `progress`.
    pending: u64,
    /// Submissions finished at once.
    immediate: u64,
    /// Completions reported by `progress` in an order other than submission.
    reordered: u64,
    /// Violations (lost, duplicated, reordered, wrong queue), the first few.
    violations: Vec<String>,
    /// Violations in all.
    n_violations: u64,
}

/// A [`Transport`] that checks per-work-group order and exercises the
/// service's retry and out-of-order completion paths.
struct Recording {
    rng: Rng,
    rec: Record,
    /// Posted operations: (polls left, submission number, tag, op, outcome).
    posted: Vec<(u32, u64, Tag, Op, Outcome)>,
    submitted: u64,
    last_finished: u64,
}

impl Recording {
    fn new(queues: usize, seed: u64) -> Recording {
        let rec = Record { next: vec![0; queues], last_seq: vec![None; queues], ..Record::default() };
        Recording { rng: Rng(seed), rec, posted: Vec::new(), submitted: 0, last_finished: 0 }
    }

    fn violation(&mut self, what: String) {
        self.rec.n_violations += 1;
        if self.rec.violations.len() < 10 {
            self.rec.violations.push(what);
        }
    }

    /// Check and record an accepted command; its outcome.
    fn accept(&mut self, tag: Tag, op: &Op) -> Outcome {
        let q = tag.queue as usize;
        let (wg, n, outcome) = match *op {
            Op::Put { dst, src: PutSrc::Inline(n), .. } | Op::PutSignal { dst, src: PutSrc::Inline(n), .. } => {
                (dst / LANE, n, Outcome::Done)
            }
            Op::Amo { dst, value, op: amo, .. } => {
                let wg = dst / LANE;
                (wg, value, if amo.fetches() { Outcome::Value(fetched(wg, value)) } else { Outcome::Done })
            }
            _ => {
                self.violation(format!("queue {q}: unexpected operation {op:?}"));
                return Outcome::Failed(ErrorCode::BadOp);
            }
        };
        if wg != q as u64 {
            self.violation(format!("queue {q} seq {}: command of work-group {wg}", tag.seq));
        }
        let want = self.rec.next[q];
        if n != want {
            let kind = if n < want { "duplicated or reordered" } else { "lost (or reordered)" };
            self.violation(format!("queue {q} seq {}: sequence number {n}, expected {want}: {kind}", tag.seq));
        }
        self.rec.next[q] = n + 1; // resynchronise: one fault, one violation
        if self.rec.last_seq[q].is_some_and(|s| tag.seq <= s) {
            self.violation(format!("queue {q}: ring seq {} after {:?}", tag.seq, self.rec.last_seq[q]));
        }
        self.rec.last_seq[q] = Some(tag.seq);
        outcome
    }
}

impl Transport for Recording {
    fn submit(&mut self, tag: Tag, op: &Op) -> Submit {
        // 15 %: no room now. The service must submit this same command
        // again before any later one of its queue.
        if self.rng.below(100) < 15 {
            self.rec.busy += 1;
            return Submit::Busy;
        }
        let outcome = self.accept(tag, op);
        self.submitted += 1;
        if self.rng.below(100) < 40 {
            self.rec.immediate += 1;
            Submit::Done(outcome)
        } else {
            self.rec.pending += 1;
            let polls = 1 + self.rng.below(4) as u32;
            self.posted.push((polls, self.submitted, tag, *op, outcome));
            Submit::Pending
        }
    }

    fn progress(&mut self, done: &mut Vec<Finished>) {
        if self.posted.is_empty() || self.rng.below(10) == 0 {
            return; // a pass where the fabric reports nothing
        }
        let mut ready = Vec::new();
        self.posted.retain_mut(|p| {
            p.0 -= 1;
            if p.0 == 0 {
                ready.push(*p);
                false
            } else {
                true
            }
        });
        // Fisher-Yates: completions of one pass in random order.
        for i in (1..ready.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            ready.swap(i, j);
        }
        for (_, k, tag, op, outcome) in ready {
            if k < self.last_finished {
                self.rec.reordered += 1;
            }
            self.last_finished = k;
            done.push(Finished { tag, outcome, op });
        }
    }

    fn barrier(&mut self, _start: bool) -> Result<bool, ErrorCode> {
        Ok(true)
    }
}

/// One work-group: `n` sequence-numbered commands into its own ring (inline
/// puts and put-signals, non-fetching AMOs, and every 61st a blocking
/// fetch-add whose result is checked), a fence every 97 and a quiet every
/// 4096; returns the commands pushed, fences and quiets included.
fn work_group(pool: &QueuePool, wg: u32, n: u64) -> Result<u64, String> {
    let q = pool.queue(wg as usize);
    assert!(q.try_claim(wg));
    let mut p = Producer::new(q);
    let err = |what: &str, e: &dyn std::fmt::Debug| format!("work-group {wg}: {what}: {e:?}");
    let (w, base) = (u64::from(wg), u64::from(wg) * LANE);
    for k in 0..n {
        let pe = (k % N_PES as u64) as i32;
        let deadline = Deadline::after(Some(WAIT));
        if k % 61 == 60 {
            // Blocking, fetching: the result must be this command's.
            let seq = p.push(&Cmd::amo(pe, AmoType::Uint64, AmoOp::FetchAdd, base + 8, k, 0), &deadline).map_err(|e| err("push", &e))?;
            let got = if k % 2 == 0 { p.wait_complete(seq, true, &deadline) } else { p.wait_reply(seq, true, &deadline) };
            let got = got.map_err(|e| err("fetch-add", &e))?;
            if got != fetched(w, k) {
                return Err(format!("work-group {wg}: fetch-add {k} returned {got:#x}, expected {:#x}", fetched(w, k)));
            }
        } else {
            let cmd = match k % 4 {
                0 | 1 => Cmd::put_inline(pe, base, &k.to_le_bytes()).expect("8 bytes"),
                2 => Cmd::amo(pe, AmoType::Uint64, AmoOp::Add, base + 8, k, 0),
                _ => Cmd::put_signal_inline(pe, base, &k.to_le_bytes(), base + 16, 1, cpnet_device::layout::SignalOp::Add)
                    .expect("8 bytes"),
            };
            p.push(&cmd, &deadline).map_err(|e| err("push", &e))?;
        }
        if k % 97 == 96 {
            p.push(&Cmd::fence(), &deadline).map_err(|e| err("fence", &e))?;
        }
        if k % 4096 == 4095 {
            p.push(&Cmd::quiet(), &deadline).map_err(|e| err("quiet", &e))?;
            p.quiet(&deadline).map_err(|e| err("quiet", &e))?;
            if p.completed() != p.write_idx() {
                return Err(format!("work-group {wg}: after quiet completed {} != written {}", p.completed(), p.write_idx()));
            }
        }
    }
    p.quiet(&Deadline::after(Some(WAIT))).map_err(|e| err("final quiet", &e))?;
    let pushed = p.write_idx();
    if p.completed() != pushed {
        return Err(format!("work-group {wg}: completed watermark {} != {pushed} commands pushed", p.completed()));
    }
    let q = p.detach();
    q.release();
    Ok(pushed)
}

/// `total` sequence-numbered commands from `wgs` work-groups into rings of
/// `depth`, through one service; panics on any loss, duplicate or reorder.
fn run(depth: u32, wgs: u32, total: u64, seed: u64) {
    let per_wg = total / u64::from(wgs);
    let pool = QueuePool::new_host(wgs as usize, QueueGeometry::new(depth).expect("depth"));
    let stop = Arc::new(AtomicBool::new(false));
    let t = Instant::now();
    let proxy = {
        let queues: Vec<_> = (0..wgs as usize).map(|i| pool.queue(i)).collect();
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("proxy".into())
            .spawn(move || {
                // The service (and its transport) is built on its own thread.
                let transport = Recording::new(queues.len(), seed);
                let mut svc = Service::new(queues, transport, Limits { n_pes: N_PES, heap_size: HEAP }, 0);
                // Acquire pairs with the release store of `stop` below, after
                // every producer has seen its last completion.
                svc.run(|| stop.load(Ordering::Acquire));
                let outstanding = svc.outstanding();
                let errors = svc.take_errors();
                let t = svc.transport();
                (std::mem::take(&mut t.rec), t.posted.len(), outstanding, errors)
            })
            .expect("spawn the proxy thread")
    };
    let pushed: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let pool = &pool;
        let hs: Vec<_> = (0..wgs).map(|wg| s.spawn(move || work_group(pool, wg, per_wg))).collect();
        hs.into_iter().map(|h| h.join().expect("work-group thread")).collect()
    });
    // Release: pairs with the proxy's acquire load in `run`'s stop closure.
    stop.store(true, Ordering::Release);
    let (rec, posted, outstanding, errors) = proxy.join().expect("proxy thread");
    let secs = t.elapsed().as_secs_f64();
    let mut fails: Vec<String> = pushed.iter().filter_map(|r| r.clone().err()).collect();
    fails.extend(rec.violations.iter().cloned());
    assert!(fails.is_empty(), "depth {depth}: {} violations, first: {fails:#?}", rec.n_violations);
    assert!(errors.is_empty(), "the service reported errors: {errors:?}");
    assert_eq!((posted, outstanding), (0, 0), "operations left after every quiet");
    for (q, &n) in rec.next.iter().enumerate() {
        assert_eq!(n, per_wg, "queue {q}: {n} commands received, {per_wg} sent");
    }
    let commands: u64 = pushed.iter().map(|r| *r.as_ref().expect("checked")).sum();
    assert!(rec.busy > 0 && rec.pending > 0 && rec.reordered > 0, "retry and out-of-order paths not exercised: {rec:?}");
    println!(
        "backpressure depth {depth}: {wgs} work-groups x {per_wg} = {} sequence-numbered ops ({commands} commands with fences and quiets) in {secs:.2} s ({:.2} M ops/s); {} Busy retries, {} finished at once, {} later ({} out of order); none lost, duplicated or reordered",
        per_wg * u64::from(wgs),
        (per_wg * u64::from(wgs)) as f64 / secs / 1e6,
        rec.busy,
        rec.immediate,
        rec.pending,
        rec.reordered,
    );
}

/// 2 * 10^5 commands (CI).
#[test]
fn depth_2_and_4_no_loss_duplicate_or_reorder() {
    run(2, 16, 100_000, 1);
    run(4, 8, 100_000, 2);
}

/// 10^7 commands: 5 * 10^6 through depth-2 rings from 16 work-groups and
/// 5 * 10^6 through depth-4 rings from 8.
#[test]
#[ignore = "10^7 commands: run by hand (see the module docs)"]
fn ten_million_commands_depth_2_and_4() {
    run(2, 16, 5_000_000, 3);
    run(4, 8, 5_000_000, 4);
}
