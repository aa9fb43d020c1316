//! `cpnet-check`: multi-PE scenarios for the integration tests, run under
//! `cpnet-run -n N` (or mpirun). Each scenario checks its own results and
//! exits non-zero with a message naming PE, work-group and what differed.
//!
//! ```text
//! cpnet-run -n 2 -- cpnet-check ops
//! CPNET_PROVIDER='tcp;ofi_rxm' cpnet-run -n 4 -- cpnet-check stress --ops 1000000
//! ```

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::{Parser, Subcommand};
use cpnet::Pe;
use cpnet::device::cpu::{AmoType, SymAddr};
use cpnet::device::layout::{Cmp, ErrorCode, SignalOp};
use cpnet_tests::check_eq;

/// `Ok(())` if `$ok`, else a check error naming the work-group (the
/// condition is evaluated before the work-group is borrowed).
macro_rules! ensure_wg {
    ($wg:expr, $ok:expr, $what:expr) => {{
        let ok: bool = $ok;
        if ok { Ok(()) } else { Err(op_err($wg, format!("check failed: {}", $what))) }
    }};
}

/// `Ok(())` if `$got == $want`, else a check error with both values.
macro_rules! eq_wg {
    ($wg:expr, $got:expr, $want:expr, $what:expr) => {{
        let (got, want) = ($got, $want);
        if got == want { Ok(()) } else { Err(op_err($wg, format!("check failed: {}: got {got}, expected {want}", $what))) }
    }};
}

mod faults;
mod load;

#[derive(Parser)]
#[command(about = "cpnet multi-PE checks (run under cpnet-run)")]
struct Cli {
    /// CPU work-groups per PE.
    #[arg(long, default_value_t = 2)]
    wgs: u32,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Every team collective (sync, barrier, broadcast, fcollect, collect,
    /// alltoall, reductions of every type and operator) on the world, node,
    /// strided and 2D-split teams, values checked; bad input; a split after
    /// a destroy.
    Collectives,
    /// Every operation of the device API, from every work-group, to the
    /// right neighbour and to this PE.
    Ops,
    /// All AMOs under contention from every PE and work-group; exact results.
    Amo {
        /// Iterations per work-group.
        #[arg(long, default_value_t = 200)]
        iters: u64,
    },
    /// putmem_signal(_nbi) pipelines with signal_wait_until at the receiver.
    Signal {
        /// Messages per work-group.
        #[arg(long, default_value_t = 200)]
        msgs: u64,
    },
    /// fence and quiet ordering: data before flag.
    Order {
        /// Rounds.
        #[arg(long, default_value_t = 100)]
        rounds: u64,
    },
    /// Streams of small nbi puts (which the proxy sends in batches) with
    /// what must stay behind them: a flag put after a fence, checked by the
    /// target; a larger put, a get and an AMO to the same words without a
    /// fence (one queue's operations to one PE take effect in issue order,
    /// docs/runtime.md "Ordering").
    PutOrder {
        /// Rounds.
        #[arg(long, default_value_t = 50)]
        rounds: u64,
        /// Small puts per round (300: more than one 4 KiB batch).
        #[arg(long, default_value_t = 300)]
        puts: u64,
    },
    /// barrier_all from a work-group and from the host.
    Barrier {
        /// Rounds.
        #[arg(long, default_value_t = 50)]
        rounds: u64,
    },
    /// Random mixed operations checked against a reference model.
    Stress {
        /// Operations in total over all PEs and work-groups.
        #[arg(long, default_value_t = 100_000)]
        ops: u64,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Backpressure: every work-group streams non-blocking AMOs and
    /// put-signals carrying sequence numbers to every PE in turn (run with a
    /// small CPNET_QUEUE_DEPTH); counts, signals and fenced sequence numbers
    /// must come out exact: nothing lost, duplicated or reordered.
    Backpressure {
        /// Operations (queue commands) in total over all PEs and work-groups.
        #[arg(long, default_value_t = 100_000)]
        ops: u64,
        /// Rounds to one target between two fenced checks (blocking fetches).
        #[arg(long, default_value_t = 64)]
        check_every: u64,
    },
    /// Bad PE, address outside the heap, misaligned atomic, size past the
    /// end: each a clear error, nothing else corrupted.
    BadInput,
    /// A wait nobody satisfies must time out with a report (set
    /// CPNET_COLLECTIVE_TIMEOUT small).
    StuckWait,
    /// PE `late` sleeps `sleep` seconds before barrier_all, the others call
    /// it at once: with CPNET_COLLECTIVE_TIMEOUT below `sleep` the barrier must
    /// fail on every PE with the rendezvous's report naming PE `late` as
    /// not arrived (each PE prints it and ends non-zero); with a larger one
    /// it must pass.
    StuckBarrier {
        /// The PE that comes late.
        #[arg(long, default_value_t = 1)]
        late: i32,
        /// Seconds it sleeps first.
        #[arg(long, default_value_t = 3.0)]
        sleep: f64,
    },
    /// With several jobs on one proxy daemon: PEs past this job and memory
    /// past the heap are refused, and each PE's buffer holds only its own
    /// job's data ([`cpnet_tests::isolation`]).
    Isolation {
        /// This job's tag (each job of a test its own).
        #[arg(long, default_value_t = 1)]
        tag: u64,
        /// Seconds to keep writing (while the other job runs).
        #[arg(long, default_value_t = 2.0)]
        hold: f64,
    },
    /// PE `victim` kills itself mid-run; the others must notice.
    PeerDeath {
        /// The PE that dies.
        #[arg(long, default_value_t = 1)]
        victim: i32,
    },
}

/// One line to stderr in one write (PEs share the terminal).
fn say(line: String) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let pe = match Pe::init() {
        Ok(pe) => pe,
        Err(e) => {
            say(format!("cpnet-check: init failed: {e}"));
            return ExitCode::from(2);
        }
    };
    let me = pe.my_pe();
    let t = Instant::now();
    let r = match cli.scenario {
        Scenario::Ops => ops(&pe, cli.wgs),
        Scenario::Amo { iters } => amo(&pe, cli.wgs, iters),
        Scenario::Signal { msgs } => signal(&pe, cli.wgs, msgs),
        Scenario::Order { rounds } => order(&pe, cli.wgs, rounds),
        Scenario::PutOrder { rounds, puts } => put_order(&pe, cli.wgs, rounds, puts),
        Scenario::Barrier { rounds } => barrier(&pe, cli.wgs, rounds),
        Scenario::Stress { ops, seed } => load::stress(&pe, cli.wgs, ops, seed),
        Scenario::Backpressure { ops, check_every } => load::backpressure(&pe, cli.wgs, ops, check_every),
        Scenario::BadInput => faults::bad_input(&pe, cli.wgs),
        Scenario::StuckWait => faults::stuck_wait(&pe),
        Scenario::StuckBarrier { late, sleep } => faults::stuck_barrier(&pe, late, sleep),
        Scenario::Isolation { tag, hold } => cpnet_tests::isolation::isolation(&pe, tag, hold),
        Scenario::PeerDeath { victim } => faults::peer_death(&pe, victim),
        Scenario::Collectives => cpnet_tests::collectives::collectives(&pe),
    };
    match r.and_then(|()| pe.finalize().context("finalize")) {
        Ok(()) => {
            println!("PE {me}: OK ({:.3} s)", t.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(format!("cpnet-check: PE {me}: FAILED: {e:#}"));
            ExitCode::from(1)
        }
    }
}

/// Every operation, from every work-group `w` of every PE, to the right
/// neighbour and to itself, each work-group in its own lane.
fn ops(pe: &Pe, wgs: u32) -> Result<()> {
    const LANE: u64 = 16 * 1024;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let src = pe.shmalloc(LANE * u64::from(wgs))?;
    // Every target-side area is indexed by (source PE, work-group), so no
    // two work-groups of the job ever write the same bytes.
    let lanes = u64::from(wgs) * n as u64;
    let dst = pe.shmalloc(LANE * lanes)?;
    let words = pe.shmalloc(4096 * lanes)?;
    let inbox = pe.shmalloc(2048 * lanes)?;
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let heap = *pe.heap();
    pe.run_work_groups(wgs, |wg| {
        let w = u64::from(wg.wg());
        let lane = |pe: i32| pe as u64 * u64::from(wgs) + w;
        let (s, d, a) = (SymAddr(src.0 + w * LANE), SymAddr(dst.0 + lane(me) * LANE), SymAddr(words.0 + lane(me) * 4096));
        let pattern: Vec<u8> = (0..LANE).map(|i| (i as u8) ^ (me as u8).wrapping_mul(31) ^ (w as u8)).collect();
        heap.write_bytes(s, &pattern).expect("local write");
        for target in [right, me] {
            // putmem: sizes 0, 1, 7, 8, 9, 4096, whole lane; blocking and nbi.
            for (k, &size) in [0u64, 1, 7, 8, 9, 4096, LANE].iter().enumerate() {
                if k % 2 == 0 {
                    wg.putmem(d, s, size, target)?;
                } else {
                    wg.putmem_nbi(d, s, size, target)?;
                    wg.quiet()?;
                }
                // getmem it back into our source's tail and compare.
                let mut back = vec![0u8; size as usize];
                let tmp = SymAddr(a.0 + 2048);
                for chunk in (0..size).step_by(1024) {
                    let c = (size - chunk).min(1024);
                    if chunk % 2048 == 0 {
                        wg.getmem(tmp, SymAddr(d.0 + chunk), c, target)?;
                    } else {
                        wg.getmem_nbi(tmp, SymAddr(d.0 + chunk), c, target)?;
                        wg.quiet()?;
                    }
                    heap.read_bytes(tmp, &mut back[chunk as usize..(chunk + c) as usize]).expect("local read");
                }
                check_eq(&back[..], &pattern[..size as usize], || format!("PE {me} wg {w}: putmem/getmem {size} B to PE {target}"))
                    .map_err(|e| op_err(wg, e))?;
            }
            // p / g for each element type.
            wg.p::<u8>(a, 0xab, target)?;
            ensure_wg!(wg, wg.g::<u8>(a, target)? == 0xab, "p/g u8")?;
            wg.p::<i16>(a, -1234, target)?;
            ensure_wg!(wg, wg.g::<i16>(a, target)? == -1234, "p/g i16")?;
            wg.p::<u32>(a, 0xdead_beef, target)?;
            ensure_wg!(wg, wg.g::<u32>(a, target)? == 0xdead_beef, "p/g u32")?;
            wg.p::<f32>(a, 1.5, target)?;
            ensure_wg!(wg, wg.g::<f32>(a, target)? == 1.5, "p/g f32")?;
            wg.p::<i64>(a, -(1 << 40), target)?;
            ensure_wg!(wg, wg.g::<i64>(a, target)? == -(1 << 40), "p/g i64")?;
            wg.p::<f64>(a, std::f64::consts::PI, target)?;
            ensure_wg!(wg, wg.g::<f64>(a, target)? == std::f64::consts::PI, "p/g f64")?;
            // Atomics, every op and type, on words a+64.. (own lane: exact).
            amo_sequence::<i32>(wg, SymAddr(a.0 + 64), target)?;
            amo_sequence::<u32>(wg, SymAddr(a.0 + 128), target)?;
            amo_sequence::<i64>(wg, SymAddr(a.0 + 192), target)?;
            amo_sequence::<u64>(wg, SymAddr(a.0 + 256), target)?;
        }
        // put_signal to the right neighbour: SET then ADD; the neighbour's
        // work-group w waits for them below (after the barrier).
        let sig = SymAddr(a.0 + 512);
        let ib = inbox.0 + 2048 * lane(me);
        wg.putmem_signal(SymAddr(ib), s, 1000, sig, 7, SignalOp::Set, right)?;
        wg.putmem_signal_nbi(SymAddr(ib + 1024), SymAddr(s.0 + 1000), 8, sig, 5, SignalOp::Add, right)?;
        wg.quiet()?;
        // Receive from the left neighbour (same work-group index).
        let (sig, ib) = (SymAddr(words.0 + lane(left) * 4096 + 512), inbox.0 + 2048 * lane(left));
        let v = wg.signal_wait_until(sig, Cmp::Ge, 12)?;
        ensure_wg!(wg, v == 12, &format!("signal from PE {left}: {v}, expected 12"))?;
        let mut got = vec![0u8; 1008];
        heap.read_bytes(SymAddr(ib), &mut got[..1000]).expect("read");
        heap.read_bytes(SymAddr(ib + 1024), &mut got[1000..]).expect("read");
        let want: Vec<u8> = (0..1008u64).map(|i| (i as u8) ^ (left as u8).wrapping_mul(31) ^ (w as u8)).collect();
        check_eq(&got[..], &want[..], || format!("PE {me} wg {w}: put_signal data from PE {left}")).map_err(|e| op_err(wg, e))?;
        wg.fence()?;
        wg.nop()?;
        Ok(())
    })?;
    pe.barrier_all()?;
    Ok(())
}

fn op_err(wg: &cpnet::WorkGroup, what: String) -> cpnet::device::cpu::Error {
    say(format!("cpnet-check: PE {} wg {}: {what}", wg.my_pe(), wg.wg()));
    cpnet::device::cpu::Error::Op { my_pe: wg.my_pe(), wg: wg.wg(), op: "check", pe: wg.my_pe(), addr: SymAddr(0), code: ErrorCode::BadOp }
}

/// Every AMO on one word of `target`, with each fetched value checked.
fn amo_sequence<T>(wg: &mut cpnet::WorkGroup, a: SymAddr, target: i32) -> cpnet::device::cpu::Result<()>
where
    T: AmoType + From<u8> + std::ops::BitAnd<Output = T> + std::ops::BitOr<Output = T> + std::ops::BitXor<Output = T>,
{
    let v = |x: u8| T::from(x);
    let name = format!("{} at PE {target}", std::any::type_name::<T>());
    wg.atomic_set::<T>(a, v(10), target)?;
    wg.fence()?;
    eq_wg!(wg, wg.atomic_fetch::<T>(a, target)?, v(10), &format!("{name} set/fetch"))?;
    eq_wg!(wg, wg.atomic_swap::<T>(a, v(20), target)?, v(10), &format!("{name} swap"))?;
    eq_wg!(wg, wg.atomic_compare_swap::<T>(a, v(99), v(30), target)?, v(20), &format!("{name} cswap miss"))?;
    eq_wg!(wg, wg.atomic_compare_swap::<T>(a, v(20), v(30), target)?, v(20), &format!("{name} cswap hit"))?;
    eq_wg!(wg, wg.atomic_fetch_add::<T>(a, v(5), target)?, v(30), &format!("{name} fetch_add"))?;
    wg.atomic_add::<T>(a, v(5), target)?;
    wg.atomic_inc::<T>(a, target)?;
    wg.fence()?; // non-fetching AMOs are ordered before later ones by fence (like nbi puts)
    eq_wg!(wg, wg.atomic_fetch_inc::<T>(a, target)?, v(41), &format!("{name} add/inc/fetch_inc"))?;
    eq_wg!(wg, wg.atomic_fetch_and::<T>(a, v(0x0f), target)?, v(42), &format!("{name} fetch_and"))?;
    wg.atomic_and::<T>(a, v(0x0e), target)?;
    wg.fence()?; // non-fetching AMOs are ordered before later ones by fence (like nbi puts)
    eq_wg!(wg, wg.atomic_fetch_or::<T>(a, v(0x30), target)?, v(42 & 0x0f & 0x0e), &format!("{name} and/fetch_or"))?;
    wg.atomic_or::<T>(a, v(0x40), target)?;
    wg.fence()?; // non-fetching AMOs are ordered before later ones by fence (like nbi puts)
    eq_wg!(wg, wg.atomic_fetch_xor::<T>(a, v(0xff), target)?, v(0x0a | 0x30 | 0x40), &format!("{name} or/fetch_xor"))?;
    wg.atomic_xor::<T>(a, v(0xff), target)?;
    wg.fence()?; // non-fetching AMOs are ordered before later ones by fence (like nbi puts)
    eq_wg!(wg, wg.atomic_fetch::<T>(a, target)?, v(0x7a), &format!("{name} xor/fetch"))?;
    Ok(())
}

/// All AMOs under contention: every work-group of every PE hits the same
/// words on every PE (local and remote mixed).
fn amo(pe: &Pe, wgs: u32, iters: u64) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let words = pe.shmalloc(4096)?;
    let heap = *pe.heap();
    heap.write_bytes(words, &[0u8; 4096]).ok();
    // Minimum words start at their type's maximum (u64: +inf, ordered).
    heap.write_bytes(SymAddr(words.0 + 80), &i64::MAX.to_le_bytes()).ok();
    heap.write_bytes(SymAddr(words.0 + 88), &u32::MAX.to_le_bytes()).ok();
    heap.write_bytes(SymAddr(words.0 + 92), &i32::MAX.to_le_bytes()).ok();
    heap.write_bytes(SymAddr(words.0 + 96), &cpnet::device::ordered::f64_ord(f64::INFINITY).to_le_bytes()).ok();
    pe.barrier_all()?;
    let total = u64::from(wgs) * n as u64;
    ensure!(total <= 32, "at most 32 work-groups in total (bit per work-group)");
    // Offsets: 0 fetch_add u64, 8 add i64, 16 inc u32 (+4 pad), 24 fetch_add i32,
    // 32 fetch_or u64 bits, 40 or u32 bits, 48 xor toggles, 56 cswap counter,
    // 64 swap chain, 72 and mask.
    pe.run_work_groups(wgs, |wg| {
        let id = me as u64 * u64::from(wgs) + u64::from(wg.wg());
        for i in 0..iters {
            for t in 0..n {
                let fa = wg.atomic_fetch_add::<u64>(words, 1, t)?;
                ensure_wg!(wg, fa < total * iters, "fetch_add result in range")?;
                wg.atomic_add::<i64>(SymAddr(words.0 + 8), -2, t)?;
                wg.atomic_inc::<u32>(SymAddr(words.0 + 16), t)?;
                wg.atomic_fetch_add::<i32>(SymAddr(words.0 + 24), 3, t)?;
                if i == 0 {
                    wg.atomic_fetch_or::<u64>(SymAddr(words.0 + 32), 1 << id, t)?;
                    wg.atomic_or::<u32>(SymAddr(words.0 + 40), 1 << id, t)?;
                    wg.atomic_and::<u64>(SymAddr(words.0 + 72), !(1u64 << id), t)?;
                }
                wg.atomic_xor::<u64>(SymAddr(words.0 + 48), 1 << id, t)?;
                // CAS increment loop.
                let c = SymAddr(words.0 + 56);
                let mut cur = wg.atomic_fetch::<u64>(c, t)?;
                loop {
                    let old = wg.atomic_compare_swap::<u64>(c, cur, cur + 1, t)?;
                    if old == cur {
                        break;
                    }
                    cur = old;
                }
                // Swap chain: unique values in, every value comes out once.
                let _ = wg.atomic_swap::<u64>(SymAddr(words.0 + 64), (id << 32) | (i + 1), t)?;
                // Minimum AMOs (cpnet extension): every work-group lowers the
                // words with values unique to it; the final minimum is exact.
                // 80 i64 (negative values: signed order), 88 u32 fetch_min,
                // 92 i32, 96 u64 (floats as ordered integers).
                let key = (i * total + id) as i64; // distinct per (wg, i)
                wg.atomic_min::<i64>(SymAddr(words.0 + 80), -key, t)?;
                let fm = wg.atomic_fetch_min::<u32>(SymAddr(words.0 + 88), (1000 + key) as u32, t)?;
                ensure_wg!(wg, fm >= 1000, "fetch_min u32 old value in range")?;
                wg.atomic_min::<i32>(SymAddr(words.0 + 92), (key as i32) - 5, t)?;
                let d = cpnet::device::ordered::f64_ord(0.5 + key as f64 * 0.25);
                wg.atomic_min::<u64>(SymAddr(words.0 + 96), d, t)?;
            }
        }
        wg.quiet()
    })?;
    pe.barrier_all()?;
    let r64 = |o: u64| heap.atomic_u64(SymAddr(words.0 + o)).map(|a| a.load(std::sync::atomic::Ordering::Acquire));
    let r32 = |o: u64| heap.atomic_u32(SymAddr(words.0 + o)).map(|a| a.load(std::sync::atomic::Ordering::Acquire));
    let k = total * iters;
    let all_bits = if total == 64 { u64::MAX } else { (1u64 << total) - 1 };
    let xor_want = if iters % 2 == 1 { all_bits } else { 0 };
    let checks: [(&str, u64, u64); 9] = [
        ("fetch_add u64", r64(0)?, k),
        ("add i64", r64(8)?, (-2i64 * k as i64) as u64),
        ("inc u32", u64::from(r32(16)?), k),
        ("fetch_add i32", u64::from(r32(24)?), 3 * k),
        ("fetch_or u64", r64(32)?, all_bits),
        ("or u32", u64::from(r32(40)?), all_bits & 0xffff_ffff),
        ("xor u64", r64(48)?, xor_want),
        ("cswap counter", r64(56)?, k),
        ("and u64", r64(72)?, 0),
    ];
    let kmax = (total * iters - 1) as i64;
    let mins: [(&str, u64, u64); 4] = [
        ("min i64", r64(80)?, (-kmax) as u64),
        ("fetch_min u32", u64::from(r32(88)?), 1000),
        ("min i32", u64::from(r32(92)?), u64::from(-5i32 as u32)),
        ("min u64 (ordered f64)", r64(96)?, cpnet::device::ordered::f64_ord(0.5)),
    ];
    for (what, got, want) in checks.into_iter().chain(mins) {
        ensure!(got == want, "PE {me}: {what} after contention: {got:#x}, expected {want:#x}");
    }
    let last = r64(64)?;
    ensure!(last & 0xffff_ffff == iters, "PE {me}: swap chain ends with {last:#x}, expected a last value (iteration {iters})");
    Ok(())
}

/// putmem_signal pipelines: each work-group streams `msgs` messages to the
/// same work-group of the right neighbour, each announced by a signal ADD;
/// the receiver checks each message when its signal arrives.
fn signal(pe: &Pe, wgs: u32, msgs: u64) -> Result<()> {
    const MSG: u64 = 512;
    const SLOTS: u64 = 8;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let per_wg = MSG * SLOTS + 64;
    let buf = pe.shmalloc(per_wg * u64::from(wgs))?;
    let src = pe.shmalloc(MSG * u64::from(wgs))?;
    let acks = pe.shmalloc(64 * u64::from(wgs))?;
    let heap = *pe.heap();
    heap.write_bytes(buf, &vec![0; (per_wg * u64::from(wgs)) as usize]).ok();
    heap.write_bytes(acks, &vec![0; (64 * u64::from(wgs)) as usize]).ok();
    pe.barrier_all()?;
    pe.run_work_groups(wgs, |wg| {
        let w = u64::from(wg.wg());
        let base = buf.0 + w * per_wg;
        let sig = SymAddr(base + MSG * SLOTS);
        let ack = SymAddr(acks.0 + 64 * w);
        let s = SymAddr(src.0 + w * MSG);
        let mut recv = 0u64;
        for m in 0..msgs {
            // Flow control: at most SLOTS messages ahead of the receiver's ack.
            if m >= SLOTS {
                wg.signal_wait_until(ack, Cmp::Ge, m - SLOTS + 1)?;
            }
            let data: Vec<u8> = (0..MSG).map(|i| (i ^ m ^ (me as u64) << 4) as u8).collect();
            heap.write_bytes(s, &data).expect("write");
            let slot = SymAddr(base + (m % SLOTS) * MSG);
            if m % 2 == 0 {
                wg.putmem_signal(slot, s, MSG, sig, 1, SignalOp::Add, right)?;
            } else {
                wg.putmem_signal_nbi(slot, s, MSG, sig, 1, SignalOp::Add, right)?;
                wg.quiet()?; // the source buffer is reused next
            }
            // Drain what has arrived from the left.
            while recv < msgs && wg.test::<u64>(sig, Cmp::Ge, recv + 1)? {
                recv = check_msg(wg, &heap, base, recv, left, sig, ack)?;
            }
        }
        while recv < msgs {
            wg.signal_wait_until(sig, Cmp::Ge, recv + 1)?;
            recv = check_msg(wg, &heap, base, recv, left, sig, ack)?;
        }
        Ok(())
    })?;
    pe.barrier_all()?;
    Ok(())
}

fn check_msg(
    wg: &mut cpnet::WorkGroup,
    heap: &cpnet::device::cpu::HeapView,
    base: u64,
    m: u64,
    left: i32,
    _sig: SymAddr,
    ack: SymAddr,
) -> cpnet::device::cpu::Result<u64> {
    const MSG: u64 = 512;
    let mut got = vec![0u8; MSG as usize];
    heap.read_bytes(SymAddr(base + (m % 8) * MSG), &mut got).expect("read");
    let want: Vec<u8> = (0..MSG).map(|i| (i ^ m ^ (left as u64) << 4) as u8).collect();
    check_eq(&got[..], &want[..], || format!("message {m} from PE {left}")).map_err(|e| op_err(wg, e))?;
    // Ack to the sender (it is our left neighbour): its ack word for this wg.
    wg.atomic_set::<u64>(ack, m + 1, left)?;
    Ok(m + 1)
}

/// Ordering: nbi puts, then fence (or quiet), then a flag put; whoever sees
/// the flag must see all the data. Also put-fence-put to one address.
fn order(pe: &Pe, wgs: u32, rounds: u64) -> Result<()> {
    const N: u64 = 64;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let per = N * 64 + 128;
    let area = pe.shmalloc(per * u64::from(wgs))?;
    let heap = *pe.heap();
    heap.write_bytes(area, &vec![0; (per * u64::from(wgs)) as usize]).ok();
    pe.barrier_all()?;
    pe.run_work_groups(wgs, |wg| {
        let base = area.0 + per * u64::from(wg.wg());
        let flag = SymAddr(base + N * 64);
        let same = SymAddr(base + N * 64 + 64);
        for r in 1..=rounds {
            for i in 0..N {
                wg.putmem_nbi(SymAddr(base + i * 64), SymAddr(0), 0, right)?; // zero-length in the mix
                wg.p::<u64>(SymAddr(base + i * 64), r * 1000 + i, right)?;
            }
            // Same address, fenced: the later value must win.
            wg.atomic_set::<u64>(same, 2 * r, right)?;
            wg.fence()?;
            wg.atomic_set::<u64>(same, 2 * r + 1, right)?;
            if r % 2 == 0 { wg.fence()? } else { wg.quiet()? }
            wg.atomic_set::<u64>(flag, r, right)?;
            // Receiver side: wait for the left's flag of round r.
            wg.wait_until::<u64>(flag, Cmp::Ge, r)?;
            for i in 0..N {
                let a = heap.atomic_u64(SymAddr(base + i * 64)).expect("word");
                let v = a.load(std::sync::atomic::Ordering::Acquire);
                ensure_wg!(wg, v >= r * 1000 + i, &format!("round {r}: word {i} from PE {left} is {v} after its flag"))?;
            }
            let v = heap.atomic_u64(same).expect("word").load(std::sync::atomic::Ordering::Acquire);
            ensure_wg!(wg, v > 2 * r, &format!("round {r}: fenced same-address puts from PE {left} ended at {v}"))?;
            wg.quiet()?;
        }
        Ok(())
    })?;
    pe.barrier_all()?;
    Ok(())
}

/// Small nbi puts and what must not overtake them. Per work-group and round
/// `r`, to the right neighbour, in the work-group's own area there:
///
/// 1. `puts` 8-byte nbi puts, `data[i] = r * 2^20 + i` (several batches);
/// 2. fence, then the flag `r` (odd rounds: an 8-byte nbi put, batched
///    like the data; even rounds: an atomic set): the neighbour waits for the
///    flag and finds every `data[i]` of round `r` or later;
/// 3. without a fence: an 8-byte nbi put of `2r` to `same`, then a 512-byte
///    nbi put (not batched) whose first word is `2r + 1`, then a 16-byte one
///    (batched again) of `2r + 1, 2r + 2`, then a `p` of `2r + 3` over the
///    second word (in the same batch); blocking gets read them back: `2r + 1`
///    and `2r + 3`, the later puts win;
/// 4. without a fence: an 8-byte nbi put of `5r` to `ctr`, then a fetch-add
///    of 1 returns `5r`.
fn put_order(pe: &Pe, wgs: u32, rounds: u64, puts: u64) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    // Per work-group: data words, the flag, `same` (512 bytes), `ctr`.
    let per = (8 * puts).next_multiple_of(64) + 64 + 512 + 64;
    let area = pe.shmalloc(per * u64::from(wgs))?;
    let src = pe.shmalloc(1024 * u64::from(wgs))?;
    let heap = *pe.heap();
    heap.write_bytes(area, &vec![0; (per * u64::from(wgs)) as usize]).ok();
    pe.barrier_all()?;
    pe.run_work_groups(wgs, |wg| {
        let w = u64::from(wg.wg());
        let base = area.0 + per * w;
        let data = |i: u64| SymAddr(base + 8 * i);
        let flag = SymAddr(base + (8 * puts).next_multiple_of(64));
        let same = SymAddr(flag.0 + 64);
        let ctr = SymAddr(same.0 + 512);
        let (big, small, back) = (SymAddr(src.0 + 1024 * w), SymAddr(src.0 + 1024 * w + 512), SymAddr(src.0 + 1024 * w + 768));
        for r in 1..=rounds {
            for i in 0..puts {
                let v = (r << 20) + i;
                heap.write_bytes(SymAddr(back.0), &v.to_le_bytes()).expect("local write");
                wg.putmem_nbi(data(i), SymAddr(back.0), 8, right)?;
            }
            wg.fence()?;
            if r % 2 == 1 {
                heap.write_bytes(SymAddr(back.0), &r.to_le_bytes()).expect("local write");
                wg.putmem_nbi(flag, SymAddr(back.0), 8, right)?;
            } else {
                wg.atomic_set::<u64>(flag, r, right)?;
            }
            // 3: same words, no fence.
            heap.write_bytes(SymAddr(back.0), &(2 * r).to_le_bytes()).expect("local write");
            wg.putmem_nbi(same, SymAddr(back.0), 8, right)?;
            let mut b = vec![0u8; 512];
            b[..8].copy_from_slice(&(2 * r + 1).to_le_bytes());
            heap.write_bytes(big, &b).expect("local write");
            wg.putmem_nbi(same, big, 512, right)?;
            let mut s16 = [0u8; 16];
            s16[..8].copy_from_slice(&(2 * r + 1).to_le_bytes());
            s16[8..].copy_from_slice(&(2 * r + 2).to_le_bytes());
            heap.write_bytes(small, &s16).expect("local write");
            wg.putmem_nbi(same, small, 16, right)?;
            wg.p::<u64>(SymAddr(same.0 + 8), 2 * r + 3, right)?;
            let got = wg.g::<u64>(same, right)?;
            eq_wg!(wg, got, 2 * r + 1, &format!("round {r}: word 0 of `same` at PE {right} read back right after an 8-, a 512- and a 16-byte put"))?;
            let got = wg.g::<u64>(SymAddr(same.0 + 8), right)?;
            eq_wg!(wg, got, 2 * r + 3, &format!("round {r}: word 1 of `same` at PE {right} read back after the 16-byte put and an 8-byte p over it"))?;
            // 4: an AMO behind a put of the same word.
            heap.write_bytes(SymAddr(back.0), &(5 * r).to_le_bytes()).expect("local write");
            wg.putmem_nbi(ctr, SymAddr(back.0), 8, right)?;
            let old = wg.atomic_fetch_add::<u64>(ctr, 1, right)?;
            eq_wg!(wg, old, 5 * r, &format!("round {r}: fetch_add at PE {right} right after a put of the word"))?;
            // 2, target side: the left neighbour's data behind its flag.
            wg.wait_until::<u64>(flag, Cmp::Ge, r)?;
            for i in 0..puts {
                let v = heap.atomic_u64(data(i)).expect("word").load(std::sync::atomic::Ordering::Acquire);
                ensure_wg!(wg, v >= (r << 20) + i, &format!("round {r}: data[{i}] from PE {left} is {v:#x} after its fenced flag"))?;
            }
            wg.quiet()?;
        }
        Ok(())
    })?;
    pe.barrier_all()?;
    Ok(())
}

/// barrier_all issued by work-group 0 of every PE, and from the host.
fn barrier(pe: &Pe, _wgs: u32, rounds: u64) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let ctr = pe.shmalloc(64)?;
    let heap = *pe.heap();
    heap.write_bytes(ctr, &[0; 8]).ok();
    pe.barrier_all()?;
    pe.run_work_groups(1, |wg| {
        for r in 1..=rounds {
            for t in 0..n {
                wg.atomic_add::<u64>(ctr, 1, t)?;
            }
            wg.barrier_all()?;
            let v = heap.atomic_u64(ctr).expect("word").load(std::sync::atomic::Ordering::Acquire);
            ensure_wg!(wg, v == r * n as u64, &format!("after barrier {r}: counter {v}, expected {}", r * n as u64))?;
            wg.barrier_all()?; // nobody adds for round r+1 before everyone checked round r
        }
        Ok(())
    })?;
    for _ in 0..rounds {
        pe.barrier_all()?;
    }
    let v = heap.atomic_u64(ctr)?.load(std::sync::atomic::Ordering::Acquire);
    ensure!(v == rounds * n as u64, "PE {me}: counter {v} after {rounds} rounds");
    Ok(())
}
