//! `cpnet-check stress` and `backpressure`: random mixed operations from
//! every work-group checked against a local model, and producers held up
//! by a full ring (small `CPNET_QUEUE_DEPTH`) checked by counts.

use std::time::Instant;

use anyhow::{Result, ensure};
use cpnet::Pe;
use cpnet::device::cpu::SymAddr;
use cpnet::device::layout::SignalOp;
use cpnet_tests::{Rng, check_eq};

use super::op_err;

/// Random mixed operations per work-group, each in its own lane at every
/// target PE, checked against a local model of every lane.
pub(super) fn stress(pe: &Pe, wgs: u32, total_ops: u64, seed: u64) -> Result<()> {
    const LANE: u64 = 8192;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let lanes = pe.shmalloc(LANE * u64::from(wgs) * n as u64)?;
    let scratch = pe.shmalloc(LANE * u64::from(wgs))?;
    let shared = pe.shmalloc(64)?;
    let heap = *pe.heap();
    heap.write_bytes(lanes, &vec![0; (LANE * u64::from(wgs) * n as u64) as usize]).ok();
    heap.write_bytes(shared, &[0; 64]).ok();
    pe.barrier_all()?;
    let per_wg = total_ops.div_ceil(u64::from(wgs) * n as u64);
    let counted = std::sync::atomic::AtomicU64::new(0);
    pe.run_work_groups(wgs, |wg| {
        let w = u64::from(wg.wg());
        // Our lane at every PE: index (me, w).
        let lane = lanes.0 + LANE * (me as u64 * u64::from(wgs) + w);
        let scr = scratch.0 + LANE * w;
        let mut model = vec![vec![0u8; LANE as usize]; n as usize];
        let mut rng = Rng::new(seed ^ ((me as u64) << 32) ^ w);
        let mut dirty = vec![false; n as usize];
        let mut adds = 0u64;
        let mut done = 0u64;
        while done < per_wg {
            let t = rng.below(n as u64) as i32;
            let m = &mut model[t as usize];
            match rng.below(100) {
                // nbi put of 1..=512 bytes (heap source or inline p)
                0..=39 => {
                    let size = 1 + rng.below(512);
                    let off = rng.below(LANE - 64 - size + 1);
                    let bytes: Vec<u8> = (0..size).map(|_| rng.bits() as u8).collect();
                    heap.write_bytes(SymAddr(scr), &bytes).expect("write");
                    if size <= 8 && rng.below(2) == 0 {
                        let mut b = [0u8; 8];
                        b[..size as usize].copy_from_slice(&bytes);
                        match size {
                            1 => wg.p::<u8>(SymAddr(lane + off), b[0], t)?,
                            2 => wg.p::<u16>(SymAddr(lane + off), u16::from_le_bytes([b[0], b[1]]), t)?,
                            _ => wg.putmem(SymAddr(lane + off), SymAddr(scr), size, t)?,
                        }
                    } else {
                        wg.putmem_nbi(SymAddr(lane + off), SymAddr(scr), size, t)?;
                        // The source is reused by the next op: quiet when
                        // we overwrite it (every op writes scratch), unless
                        // it is an inline-size put (copied into the slot).
                        if size > 8 {
                            wg.quiet()?;
                            dirty.iter_mut().for_each(|d| *d = false);
                        } else {
                            dirty[t as usize] = true;
                        }
                    }
                    m[off as usize..(off + size) as usize].copy_from_slice(&bytes);
                }
                // get and compare
                40..=59 => {
                    if dirty[t as usize] {
                        wg.quiet()?;
                        dirty.iter_mut().for_each(|d| *d = false);
                    }
                    let size = 1 + rng.below(1024);
                    let off = rng.below(LANE - 64 - size + 1);
                    let inline_get = size <= 8 && rng.below(2) == 0;
                    let got = if inline_get {
                        wg.g::<u64>(SymAddr(lane + (off & !7)), t)?.to_le_bytes()[..].to_vec()
                    } else {
                        wg.getmem(SymAddr(scr), SymAddr(lane + off), size, t)?;
                        let mut v = vec![0u8; size as usize];
                        heap.read_bytes(SymAddr(scr), &mut v).expect("read");
                        v
                    };
                    let (o, l) = if inline_get { (off & !7, 8) } else { (off, size) };
                    check_eq(&got[..], &m[o as usize..(o + l) as usize], || {
                        format!("PE {me} wg {w}: get {l} B at lane+{o} of PE {t} (op {done})")
                    })
                    .map_err(|e| op_err(wg, e))?;
                }
                // fetching AMO on the lane's last 64 bytes, checked
                60..=79 => {
                    if dirty[t as usize] {
                        wg.quiet()?;
                        dirty.iter_mut().for_each(|d| *d = false);
                    }
                    let word = LANE - 64 + 8 * rng.below(8);
                    let cur = u64::from_le_bytes(m[word as usize..word as usize + 8].try_into().unwrap());
                    let a = SymAddr(lane + word);
                    let x = rng.bits();
                    let (old, new) = match rng.below(4) {
                        0 => (wg.atomic_fetch_add::<u64>(a, x, t)?, cur.wrapping_add(x)),
                        1 => (wg.atomic_fetch_xor::<u64>(a, x, t)?, cur ^ x),
                        2 => (wg.atomic_swap::<u64>(a, x, t)?, x),
                        _ => {
                            let c = if rng.below(2) == 0 { cur } else { x };
                            (wg.atomic_compare_swap::<u64>(a, c, x, t)?, if c == cur { x } else { cur })
                        }
                    };
                    ensure_wg!(wg, old == cur, &format!("PE {me} wg {w}: AMO at lane+{word} of PE {t}: old {old:#x}, model {cur:#x}"))?;
                    m[word as usize..word as usize + 8].copy_from_slice(&new.to_le_bytes());
                }
                // non-fetching AMO (nbi-like)
                80..=89 => {
                    let word = LANE - 64 + 8 * rng.below(8);
                    let cur = u64::from_le_bytes(m[word as usize..word as usize + 8].try_into().unwrap());
                    let x = rng.bits();
                    let new = if rng.below(2) == 0 {
                        wg.atomic_add::<u64>(SymAddr(lane + word), x, t)?;
                        cur.wrapping_add(x)
                    } else {
                        wg.atomic_xor::<u64>(SymAddr(lane + word), x, t)?;
                        cur ^ x
                    };
                    m[word as usize..word as usize + 8].copy_from_slice(&new.to_le_bytes());
                    dirty[t as usize] = true;
                }
                // shared counter, contended by everyone
                90..=94 => {
                    wg.atomic_add::<u64>(shared, 1, t)?;
                    adds += 1;
                    dirty[t as usize] = true;
                }
                // fence / quiet
                _ => {
                    if rng.below(2) == 0 {
                        wg.fence()?;
                    } else {
                        wg.quiet()?;
                        dirty.iter_mut().for_each(|d| *d = false);
                    }
                }
            }
            done += 1;
        }
        wg.quiet()?;
        // Final sweep: every lane at every PE equals the model.
        for t in 0..n {
            wg.getmem(SymAddr(scr), SymAddr(lane), LANE, t)?;
            let mut v = vec![0u8; LANE as usize];
            heap.read_bytes(SymAddr(scr), &mut v).expect("read");
            check_eq(&v[..], &model[t as usize][..], || format!("PE {me} wg {w}: final lane at PE {t}"))
                .map_err(|e| op_err(wg, e))?;
        }
        counted.fetch_add(adds, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    })?;
    pe.barrier_all()?;
    // Shared counters: the sum over all PEs equals all adds.
    let mine = heap.atomic_u64(shared)?.load(std::sync::atomic::Ordering::Acquire);
    let adds = counted.load(std::sync::atomic::Ordering::Relaxed);
    let all = pe.allgather_bytes(&[mine.to_le_bytes(), adds.to_le_bytes()].concat())?;
    let (sum_ctr, sum_adds) = all.iter().fold((0u64, 0u64), |(c, a), b| {
        (c + u64::from_le_bytes(b[..8].try_into().unwrap()), a + u64::from_le_bytes(b[8..].try_into().unwrap()))
    });
    ensure!(sum_ctr == sum_adds, "shared counters sum to {sum_ctr}, expected {sum_adds}");
    if me == 0 {
        println!("stress: {} ops over {n} PEs x {wgs} work-groups checked against the model", per_wg * u64::from(wgs) * n as u64);
    }
    Ok(())
}

/// Backpressure, end to end: work-group `w` of PE `p` owns lane `(p, w)`
/// (64 bytes) at every PE: a counter (+0), a signal word (+8) and a data
/// word (+16). It visits the PEs in turn (itself included); one round to
/// target `t` is four queue commands:
///
/// 1. `atomic_add(counter, 1)` (non-blocking, non-fetching),
/// 2. `putmem_signal_nbi(data <- k, signal += 1)`, `k` the round number to `t`,
/// 3. `atomic_add(counter, 1)` again,
/// 4. `fence`.
///
/// Every `check_every` rounds to `t` it checks, after the fence, with
/// blocking fetches: `atomic_fetch_add(counter, 1)` returns exactly the adds
/// issued so far, `atomic_fetch(signal)` the put-signals so far, and
/// `atomic_fetch(data)` the last round number (fenced puts land in order).
/// After quiet and a barrier every PE checks every lane it holds against
/// the counts the sources report (allgather): counter == adds, signal ==
/// put-signals, data == the last round number. With CPNET_QUEUE_DEPTH=2 or 4
/// the producers spend most of their time waiting for a free slot.
pub(super) fn backpressure(pe: &Pe, wgs: u32, total_ops: u64, check_every: u64) -> Result<()> {
    const LANE: u64 = 64;
    ensure!(check_every > 0, "--check-every must be at least 1");
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let (nu, wu) = (n as u64, u64::from(wgs));
    let lanes = pe.shmalloc(LANE * wu * nu)?;
    let scratch = pe.shmalloc(LANE * wu)?;
    let heap = *pe.heap();
    heap.write_bytes(lanes, &vec![0; (LANE * wu * nu) as usize]).ok();
    pe.barrier_all()?;
    let per_wg = total_ops.div_ceil(wu * nu);
    // What work-group w sent to target t: [adds, put-signals] at 2 * (w * n
    // + t); and the commands issued by all.
    let sent: Vec<std::sync::atomic::AtomicU64> = (0..wu * nu * 2).map(|_| Default::default()).collect();
    let issued = std::sync::atomic::AtomicU64::new(0);
    let t0 = Instant::now();
    pe.run_work_groups(wgs, |wg| {
        let w = u64::from(wg.wg());
        let lane = lanes.0 + LANE * (me as u64 * wu + w);
        let (counter, sig, data) = (SymAddr(lane), SymAddr(lane + 8), SymAddr(lane + 16));
        let scr = SymAddr(scratch.0 + LANE * w);
        let mut adds = vec![0u64; n as usize];
        let mut rounds = vec![0u64; n as usize];
        let (mut done, mut i) = (0u64, 0u64);
        while done < per_wg {
            let t = ((me as u64 + w + i) % nu) as i32;
            let ti = t as usize;
            let k = rounds[ti];
            wg.atomic_add::<u64>(counter, 1, t)?;
            // 8 bytes travel inline (copied into the slot now), so the
            // scratch word can be rewritten next round without a quiet.
            heap.write_bytes(scr, &k.to_le_bytes()).expect("local write");
            wg.putmem_signal_nbi(data, scr, 8, sig, 1, SignalOp::Add, t)?;
            wg.atomic_add::<u64>(counter, 1, t)?;
            wg.fence()?;
            adds[ti] += 2;
            rounds[ti] += 1;
            done += 4;
            if rounds[ti].is_multiple_of(check_every) {
                let c = wg.atomic_fetch_add::<u64>(counter, 1, t)?;
                eq_wg!(wg, c, adds[ti], &format!("round {k} to PE {t}: fetch_add of the counter (adds so far)"))?;
                adds[ti] += 1;
                let s = wg.atomic_fetch::<u64>(sig, t)?;
                eq_wg!(wg, s, rounds[ti], &format!("round {k} to PE {t}: signal (put-signals so far)"))?;
                let d = wg.atomic_fetch::<u64>(data, t)?;
                eq_wg!(wg, d, k, &format!("round {k} to PE {t}: data word (last fenced sequence number)"))?;
                done += 3;
            }
            i += 1;
        }
        wg.quiet()?;
        // Relaxed: read on the host after run_work_groups has joined this
        // thread; the join orders these stores before those loads.
        for t in 0..n as usize {
            let at = 2 * (w as usize * n as usize + t);
            sent[at].store(adds[t], std::sync::atomic::Ordering::Relaxed);
            sent[at + 1].store(rounds[t], std::sync::atomic::Ordering::Relaxed);
        }
        issued.fetch_add(done + 1, std::sync::atomic::Ordering::Relaxed); // + the quiet
        Ok(())
    })?;
    let secs = t0.elapsed().as_secs_f64();
    pe.barrier_all()?;
    // Everyone learns what everyone sent; the slice from PE p holds
    // [adds, put-signals] for each (w, target) of p.
    // Relaxed: the work-group threads that stored these were joined.
    let mine: Vec<u8> = sent
        .iter()
        .flat_map(|x| x.load(std::sync::atomic::Ordering::Relaxed).to_le_bytes())
        .chain(issued.load(std::sync::atomic::Ordering::Relaxed).to_le_bytes())
        .collect();
    let all = pe.allgather_bytes(&mine)?;
    let word = |b: &[u8], j: usize| u64::from_le_bytes(b[8 * j..8 * j + 8].try_into().expect("8 bytes"));
    // Acquire: pairs with the release of the proxy's local AMOs (and orders
    // after the barrier, before which every source's quiet completed its
    // remote writes).
    let r64 = |a: u64| heap.atomic_u64(SymAddr(a)).map(|x| x.load(std::sync::atomic::Ordering::Acquire));
    for (p, b) in all.iter().enumerate() {
        for w in 0..wu {
            let at = 2 * (w as usize * n as usize + me as usize);
            let (adds, sigs) = (word(b, at), word(b, at + 1));
            let lane = lanes.0 + LANE * (p as u64 * wu + w);
            let (c, s, d) = (r64(lane)?, r64(lane + 8)?, r64(lane + 16)?);
            let what = format!("PE {me}: lane of PE {p} work-group {w}");
            ensure!(c == adds, "{what}: counter {c}, expected {adds} atomic adds");
            ensure!(s == sigs, "{what}: signal {s}, expected {sigs} put-signals");
            ensure!(d == sigs.saturating_sub(1), "{what}: data word {d}, expected the last sequence number {}", sigs.saturating_sub(1));
        }
    }
    if me == 0 {
        let total: u64 = all.iter().map(|b| word(b, 2 * wgs as usize * n as usize)).sum();
        let depth = std::env::var("CPNET_QUEUE_DEPTH").unwrap_or_else(|_| "default".into());
        println!(
            "backpressure: {total} ops over {n} PEs x {wgs} work-groups, queue depth {depth}, in {secs:.2} s on PE 0: counters, signals and fenced sequence numbers exact"
        );
    }
    Ok(())
}
