//! `cpnet-check`'s fault scenarios: bad input rejected with the right
//! error and nothing written, a wait that times out, a PE late to a barrier,
//! and a peer killed mid-job.

use std::time::Instant;

use anyhow::{Result, bail, ensure};
use cpnet::Pe;
use cpnet::device::cpu::SymAddr;
use cpnet::device::layout::{Cmp, ErrorCode};
use cpnet_tests::check_eq;

use super::op_err;

/// One bad call of the device API.
type BadCall = Box<dyn Fn(&mut cpnet::WorkGroup) -> cpnet::device::cpu::Result<()>>;

/// Each bad input gives a clear error naming PE, work-group, op and address;
/// nothing else is corrupted; the context keeps working.
pub(super) fn bad_input(pe: &Pe, wgs: u32) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let heap_size = pe.heap().size();
    let guard = pe.shmalloc(4096)?;
    let heap = *pe.heap();
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + me as u32) as u8).collect();
    heap.write_bytes(guard, &pattern).ok();
    pe.barrier_all()?;
    let right = (me + 1) % n;
    pe.run_work_groups(wgs, |wg| {
        let cases: Vec<(&str, BadCall, ErrorCode)> = vec![
            ("PE out of range", Box::new(move |wg| wg.putmem(guard, guard, 8, n)), ErrorCode::BadPe),
            ("negative PE", Box::new(move |wg| wg.p::<u64>(guard, 1, -1)), ErrorCode::BadPe),
            ("address outside the heap", Box::new(move |wg| wg.p::<u64>(SymAddr(heap_size + 64), 1, right)), ErrorCode::BadAddr),
            ("get outside the heap", Box::new(move |wg| wg.getmem(guard, SymAddr(heap_size), 8, right)), ErrorCode::BadAddr),
            ("misaligned atomic", Box::new(move |wg| wg.atomic_add::<u64>(SymAddr(guard.0 + 4), 1, right).and_then(|_| wg.quiet())), ErrorCode::BadAlign),
            ("size past the end", Box::new(move |wg| wg.putmem(SymAddr(heap_size - 8), guard, 64, right)), ErrorCode::BadAddr),
            ("nbi past the end", Box::new(move |wg| wg.putmem_nbi(SymAddr(heap_size - 8), guard, 64, right).and_then(|_| wg.quiet())), ErrorCode::BadAddr),
        ];
        for (what, f, code) in &cases {
            match f(wg) {
                Ok(()) => return Err(op_err(wg, format!("{what}: accepted"))),
                Err(e) => {
                    let msg = e.to_string();
                    let names = msg.contains(&format!("PE {me}")) && msg.contains(&format!("work-group {}", wg.wg()));
                    if e.code() != *code || !names {
                        return Err(op_err(wg, format!("{what}: wrong error {e:?}")));
                    }
                    println!("bad-input PE {me} wg {}: {what}: {msg}", wg.wg());
                }
            }
            // The context still works afterwards.
            wg.p::<u64>(SymAddr(guard.0 + 4096 - 8 * (1 + u64::from(wg.wg()))), 0, right)?;
        }
        Ok(())
    })?;
    pe.barrier_all()?;
    let mut now = vec![0u8; 4096 - 64];
    heap.read_bytes(guard, &mut now)?;
    check_eq(&now[..], &pattern[..4096 - 64], || format!("PE {me}: guard region after bad input")).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// A wait_until nobody satisfies: must end with a timeout report.
pub(super) fn stuck_wait(pe: &Pe) -> Result<()> {
    let me = pe.my_pe();
    let w = pe.shmalloc(64)?;
    pe.heap().write_bytes(w, &7u64.to_le_bytes())?;
    pe.barrier_all()?;
    let r = pe.run_work_groups(1, |wg| wg.wait_until::<u64>(w, Cmp::Eq, 42));
    match r {
        Err(cpnet::pe::Error::WorkGroup(e)) if e.code() == ErrorCode::Timeout => {
            println!("stuck-wait PE {me}: {e}");
            let s = e.to_string();
            ensure!(s.contains("42") && s.contains('7') && s.contains(&format!("PE {me}")), "report lacks detail: {s}");
            Ok(())
        }
        Err(e) => bail!("wrong error: {e}"),
        Ok(()) => bail!("the wait returned although nobody wrote the word"),
    }
}

/// PE `late` comes `sleep` seconds late to a host barrier.
pub(super) fn stuck_barrier(pe: &Pe, late: i32, sleep: f64) -> Result<()> {
    let me = pe.my_pe();
    if me == late {
        std::thread::sleep(std::time::Duration::from_secs_f64(sleep));
    }
    let t = Instant::now();
    match pe.barrier_all() {
        Ok(()) => {
            println!("stuck-barrier PE {me}: barrier passed after {:.3} s", t.elapsed().as_secs_f64());
            Ok(())
        }
        Err(e) => {
            println!("stuck-barrier PE {me}: {e}");
            bail!("barrier_all failed after {:.3} s (the report is above)", t.elapsed().as_secs_f64())
        }
    }
}

/// The victim kills itself with SIGKILL while the others wait for data from
/// it; the others must fail (non-zero) promptly, naming the victim.
pub(super) fn peer_death(pe: &Pe, victim: i32) -> Result<()> {
    let me = pe.my_pe();
    let w = pe.shmalloc(64)?;
    pe.heap().write_bytes(w, &0u64.to_le_bytes())?;
    pe.barrier_all()?;
    if me == victim {
        std::thread::sleep(std::time::Duration::from_millis(300));
        kill_self();
    }
    // Everyone else waits for a value the victim would have sent.
    pe.run_work_groups(1, |wg| {
        loop {
            wg.p::<u64>(SymAddr(w.0 + 8), 1, victim)?;
            if wg.test::<u64>(w, Cmp::Eq, 1)? {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    })?;
    bail!("PE {me}: the victim never died?")
}

/// Ends the process with SIGKILL, as a crash or the OOM killer would.
fn kill_self() -> ! {
    // SAFETY: getpid and kill have no preconditions and touch no memory.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL cannot be caught")
}
