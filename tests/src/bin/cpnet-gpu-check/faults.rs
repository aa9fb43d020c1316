//! `cpnet-gpu-check`'s fault scenarios: bad calls of the device API from
//! kernels (each returns its code, is reported, writes nothing) and a
//! device-side wait that times out with its report.

use super::*;

/// Each bad call returns its code, is reported by the proxy naming PE,
/// work-group, op and address, writes nothing, and the context goes on.
pub(super) fn bad_input(pe: &GpuPe, wgs: u32, threads: u32) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let right = (me + 1) % n;
    let nb = u64::from(wgs);
    let ncases = gpu::BAD_CASES.len() as u64;
    let k = build(pe, "bad-input", "bad_input", gpu::BAD_INPUT)?;
    let guard = pe.shmalloc(4096)?;
    let src = pe.shmalloc(64 * nb)?;
    let scratch = pe.shmalloc(8 * nb)?;
    let codes = pe.shmalloc(nb * ncases * 3 * 8)?;
    let logs = pe.shmalloc(nb * LOG_WORDS as u64 * 8)?;
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + me as u32) as u8).collect();
    pe.write_heap(guard, &pattern)?;
    pe.write_heap(src, &vec![0x5a; 64 * wgs as usize])?;
    let heap_size = pe.handle().0.heap_size;
    pe.barrier_all()?;

    let h = pe.handle();
    let (p_guard, p_src, p_scratch, p_codes, p_logs) =
        (pe.dev_ptr(guard), pe.dev_ptr(src), pe.dev_ptr(scratch), pe.dev_ptr(codes), pe.dev_ptr(logs));
    let mut b = pe.stream().launch_builder(&k.func);
    b.arg(&h).arg(&p_guard).arg(&p_src).arg(&p_scratch).arg(&p_codes).arg(&p_logs);
    // SAFETY: the arguments match `bad_input` in cpnet_tests::gpu::BAD_INPUT;
    // the kernel only forms out-of-heap pointers to send them as (rejected)
    // addresses, never dereferences them; synchronized below.
    unsafe { b.launch(grid(wgs, threads)) }.context("launch bad_input")?;
    pe.synchronize().context("the bad-input kernel must end without a device-side error")?;
    pe.barrier_all()?;

    let mut fails = Vec::new();
    if let Err(e) = check_logs(pe, &k, logs, wgs) {
        fails.push(e.to_string());
    }
    let got = read_u64s(pe, codes, (nb * ncases * 3) as usize)?;
    let errors = pe.command_errors();
    if errors.is_empty() {
        fails.push(format!(
            "PE {me}: pe.command_errors() is empty after the kernel got {} rejections (are the proxy threads' errors published only when they stop?)",
            nb * ncases
        ));
    }
    // Each case's report is its own: matched on the operation's name too
    // (a putmem and a getmem past the heap end share PE, address and code)
    // and taken from the pool once (a blocking case and its nbi twin share
    // everything else).
    let mut pool: Vec<Option<&cpnet::proxy::service::CommandError>> = errors.iter().map(Some).collect();
    for w in 0..wgs {
        for (c, &(what, blocking, code)) in gpu::BAD_CASES.iter().enumerate() {
            let at = ((u64::from(w) * ncases + c as u64) * 3) as usize;
            let (call, quiet, good) = (got[at] as i64, got[at + 1] as i64, got[at + 2] as i64);
            let want_call = if blocking { code as i64 } else { -1 };
            if (call, quiet, good) != (want_call, code as i64, 0) {
                fails.push(format!(
                    "PE {me} block {w}: {what}: codes (call, quiet, quiet after a good put) = ({call}, {quiet}, {good}), expected ({want_call}, {}, 0) [{code:?} = {}]",
                    code as i64, code as i64
                ));
            }
            let (to, addr) = match c {
                0 | 1 | 10 => (n, guard.0),
                2 | 3 => (-1, guard.0),
                4 | 5 | 11 => (right, heap_size + 64),
                6 | 7 => (right, heap_size - 8),
                _ => (right, guard.0 + 4),
            };
            let op = gpu::bad_case_op(what);
            let hit = pool.iter_mut().find(|e| {
                e.is_some_and(|e| e.my_pe == me && e.wg == w && e.code == code && e.pe == to && e.addr == addr && e.op == op)
            });
            match hit.and_then(Option::take) {
                Some(e) => println!("bad-input PE {me} wg {w}: {what}: {e}"),
                None if errors.is_empty() => {}
                None => fails.push(format!(
                    "PE {me} block {w}: {what}: no proxy report of {op} {code:?} for PE {to} at heap+{addr:#x} (each used once) among {} command errors: {errors:?}",
                    errors.len()
                )),
            }
        }
    }
    let now = read(pe, guard, 4096)?;
    if let Err(e) = check_eq(&now, &pattern, || format!("PE {me}: guard region after bad input")) {
        fails.push(e);
    }
    let tail = read(pe, SymAddr(heap_size - 64), 64)?;
    if tail.iter().any(|&b| b != 0) {
        fails.push(format!("PE {me}: the heap's last 64 bytes were written: {tail:02x?}"));
    }
    let sc = read_u64s(pe, scratch, wgs as usize)?;
    if sc.iter().any(|&v| v != ncases) {
        fails.push(format!("PE {me}: the good puts' words are {sc:?}, expected {ncases} each"));
    }
    verdict(fails)
}

/// Block 1 waits for a word that never changes; synchronize must report the
/// timeout with PE, work-group, address, expected and found value.
pub(super) fn stuck_wait(pe: &GpuPe, threads: u32) -> Result<()> {
    const WAITER: u32 = 1;
    let me = pe.my_pe();
    let h = pe.handle();
    let timeout = h.0.wait_timeout_ns;
    ensure!(
        timeout != 0 && timeout <= 30_000_000_000,
        "stuck-wait needs a small CPNET_WAIT_TIMEOUT (e.g. 1 second); it is {} ns",
        timeout
    );
    let k = build(pe, "stuck-wait", "stuck", gpu::STUCK_WAIT)?;
    let word = pe.shmalloc(64)?;
    let code = pe.shmalloc(64)?;
    let logs = pe.shmalloc(3 * LOG_WORDS as u64 * 8)?;
    pe.write_heap(word, &7u64.to_le_bytes())?;
    pe.write_heap(code, &u64s_bytes(&[u64::MAX, u64::MAX]))?;
    pe.barrier_all()?;

    let (p_word, p_code, p_logs) = (pe.dev_ptr(word), pe.dev_ptr(code), pe.dev_ptr(logs));
    let mut b = pe.stream().launch_builder(&k.func);
    b.arg(&h).arg(&p_word).arg(&p_code).arg(&p_logs).arg(&WAITER);
    let t = Instant::now();
    // SAFETY: the arguments match `stuck` in cpnet_tests::gpu::STUCK_WAIT;
    // synchronized below.
    unsafe { b.launch(grid(3, threads)) }.context("launch stuck")?;
    let r = pe.synchronize();
    let took = t.elapsed();
    let msg = match r {
        Err(e @ cpnet::pe::Error::Device { .. }) => e.to_string(),
        Err(e) => bail!("PE {me}: synchronize failed, but not with the device-side timeout report: {e}"),
        Ok(()) => bail!("PE {me}: the kernel ended without a device-side error although nobody wrote the word"),
    };
    println!("stuck-wait PE {me}: {msg} (after {:.2} s)", took.as_secs_f64());
    let mut fails = Vec::new();
    for part in [format!("PE {me}"), format!("work-group {WAITER}"), format!("heap+{:#x}", word.0), "42".into(), "found 7".into()] {
        if !msg.contains(&part) {
            fails.push(format!("PE {me}: the report does not name `{part}`: {msg}"));
        }
    }
    let s = pe.status();
    let want = (ErrorCode::Timeout as u32, me, WAITER, word.0, 42u64, 7u64, Cmp::Eq as u32);
    let got = (s.dev_error, s.dev_pe, s.dev_wg, s.dev_addr, s.dev_expected, s.dev_found, s.dev_cmp);
    if got != want {
        fails.push(format!(
            "PE {me}: status block (error, pe, wg, addr, expected, found, cmp) = {got:?}, expected {want:?}"
        ));
    }
    let c = read_u64s(pe, code, 2)?;
    let (wait, destroy) = (c[0] as i64, c[1] as i64);
    if wait != ErrorCode::Timeout as i64 {
        fails.push(format!("PE {me}: the wait returned {wait}, expected CPNET_E_TIMEOUT ({})", ErrorCode::Timeout as i64));
    }
    if destroy != 0 && destroy != ErrorCode::Timeout as i64 {
        fails.push(format!("PE {me}: the waiter's ctx_destroy returned {destroy}, expected 0 or CPNET_E_TIMEOUT"));
    }
    if let Err(e) = check_logs(pe, &k, logs, 3) {
        fails.push(e.to_string());
    }
    pe.barrier_all()?;
    verdict(fails)
}
