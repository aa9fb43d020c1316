//! `cpnet-check isolation`: what a PE of one job can reach when several jobs
//! share one proxy daemon (`CPNET_PROXY=daemon`; it runs without a daemon
//! too). Two jobs run it at once with different tags; each must see only its
//! own data, and its attempts at PEs past its job (the numbers another job's
//! PEs would have, were PEs numbered across jobs) and at memory past its heap
//! must be refused.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use cpnet::Pe;
use cpnet::device::cpu::SymAddr;
use cpnet::device::layout::ErrorCode;

/// Bytes of the buffer each PE fills for its right neighbour.
const LEN: usize = 64 << 10;

/// The byte at `i` of the buffer PE `writer` of the job tagged `tag` writes.
fn pattern(tag: u64, writer: i32, i: usize) -> u8 {
    (tag.wrapping_mul(131).wrapping_add(writer as u64 * 31).wrapping_add(i as u64 * 7) % 251) as u8
}

/// Every PE: try PEs `n`, `n + 1`, `n + 7` and an address past its heap
/// (each must fail with `BAD_PE` / `BAD_ADDR`), then for `hold` seconds put
/// its tagged pattern into its right neighbour's buffer, again and again;
/// after a barrier its own buffer must hold exactly its left neighbour's
/// pattern of the same tag. **Collective.**
///
/// # Errors
/// An attempt that was not refused, or a buffer holding anything else.
pub fn isolation(pe: &Pe, tag: u64, hold: f64) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let buf = pe.shmalloc(LEN as u64)?;
    let src = pe.shmalloc(LEN as u64)?;
    let heap = *pe.heap();
    let mine: Vec<u8> = (0..LEN).map(|i| pattern(tag, me, i)).collect();
    heap.write_bytes(src, &mine)?;
    heap.write_bytes(buf, &vec![0u8; LEN])?;
    pe.barrier_all()?;
    let heap_size = heap.size();
    let wrong = pe.with_ctx(0, |wg| {
        let mut wrong = Vec::new();
        for target in [n, n + 1, n + 7] {
            match wg.putmem(buf, src, 64, target) {
                Err(e) if e.code() == ErrorCode::BadPe => println!("isolation PE {me}: put to PE {target} (not in this job): refused: {e}"),
                other => wrong.push(format!("a put to PE {target}, past this job's {n} PEs, was not refused: {other:?}")),
            }
        }
        match wg.putmem(SymAddr(heap_size), src, 64, (me + 1) % n) {
            Err(e) if e.code() == ErrorCode::BadAddr => println!("isolation PE {me}: put past the heap: refused: {e}"),
            other => wrong.push(format!("a put past the heap was not refused: {other:?}")),
        }
        let t = Instant::now();
        let right = (me + 1) % n;
        while t.elapsed() < Duration::from_secs_f64(hold) {
            wg.putmem(buf, src, LEN as u64, right)?;
            std::thread::sleep(Duration::from_millis(5));
        }
        wg.putmem(buf, src, LEN as u64, right)?;
        wg.quiet()?;
        Ok(wrong)
    })?;
    ensure!(wrong.is_empty(), "PE {me}: {}", wrong.join("; "));
    pe.barrier_all()?;
    let left = (me + n - 1) % n;
    let mut got = vec![0u8; LEN];
    heap.read_bytes(buf, &mut got)?;
    if let Some(i) = (0..LEN).find(|&i| got[i] != pattern(tag, left, i)) {
        bail!("PE {me}: byte {i} of the buffer is {:#04x}, job {tag}'s PE {left} wrote {:#04x}: another job's data?", got[i], pattern(tag, left, i));
    }
    ensure!(pe.command_errors().len() >= 4, "PE {me}: the refused commands are missing from command_errors()");
    println!("isolation PE {me}: job {tag}: {LEN} bytes from PE {left}, all its own job's");
    Ok(())
}
