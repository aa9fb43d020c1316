//! `cpnet-gpu-check copy-floor`: the floor under the staged transport's
//! copies (`proxy/src/staged`), as its proxy threads make them: one copy
//! on a non-blocking stream between the device and pinned host memory, an
//! event recorded after it and polled with `cuEventQuery` until it passes
//! (never waited on). Beside it, a copy followed by the 8-byte signal a
//! put-with-signal's target writes, as a second copy or as a
//! `cuStreamWriteValue64` (a stream memory operation: no copy engine).
//! Median wall time of `iters` rounds per size, in µs; no PE traffic, one
//! process (PE 0 prints; other PEs do nothing).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use cpnet_proxy::cuda::{EventPool, EventState, Pinned, Stream};
use cudarc::driver::CudaContext;
use cudarc::driver::sys as cusys;

/// Device memory of `len` bytes, freed on drop.
struct DevBuf(u64);

impl DevBuf {
    fn new(len: usize) -> Result<DevBuf> {
        let mut p = 0u64;
        // SAFETY: cuMemAlloc writes the new allocation's address into `p`;
        // the caller's context is current.
        let r = unsafe { cusys::cuMemAlloc_v2(&mut p, len) };
        ensure!(r == cusys::CUresult::CUDA_SUCCESS, "cuMemAlloc of {len} bytes: {r:?}");
        Ok(DevBuf(p))
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc above, freed once, after the
        // rounds that use it were polled to completion.
        let _ = unsafe { cusys::cuMemFree_v2(self.0) };
    }
}

/// Record an event on `s` and poll it until it passes.
fn settle(events: &mut EventPool, s: &Stream) -> Result<()> {
    let ev = events.record(s)?;
    while events.query(ev)? == EventState::Pending {}
    events.release(ev);
    Ok(())
}

fn median_us(mut ns: Vec<u64>) -> f64 {
    ns.sort_unstable();
    ns[ns.len() / 2] as f64 / 1e3
}

/// Print the floor for sizes `min`, x4, up to `max` bytes (PE 0 only).
pub fn copy_floor(me: i32, cuda: &Arc<CudaContext>, min: u64, max: u64, iters: u32) -> Result<()> {
    if me != 0 {
        return Ok(());
    }
    cuda.bind_to_thread().context("cuCtxSetCurrent")?;
    let max = max.max(min) as usize;
    let host = Pinned::new(max + 64)?;
    let dev = DevBuf::new(max + 64)?;
    let s = Stream::new()?;
    let mut events = EventPool::default();
    // The signal word: host side at `host + max`, device side at `dev + max`.
    // SAFETY: both allocations have max + 64 bytes.
    let sig_host = unsafe { host.ptr().add(max) };
    let sig_dev = dev.0 + max as u64;
    println!("# copy-floor: one copy on a non-blocking stream, an event recorded and polled (cuEventQuery) until it passes; median of {iters} rounds, us");
    println!("# out: device -> pinned host; in: pinned host -> device; +sig copy: in, then an 8-byte copy; +sig write: in, then cuStreamWriteValue64; call: the cuMemcpyDtoHAsync call alone; sig copy / sig write alone: the 8-byte signal alone");
    println!("{:>10} {:>8} {:>8} {:>12} {:>12} {:>8} {:>10} {:>11}", "size_B", "out", "in", "in+sig_copy", "in+sig_write", "call", "sig_copy", "sig_write");
    // The three copies of a round: `host` is pinned and `dev` device memory
    // of this context, both max + 64 bytes, so every range below is inside
    // them, and each round's copies are polled to completion (`settle`)
    // before the next round reuses the buffers.
    let out = |n: usize| -> Result<()> {
        // SAFETY: as above (n <= max).
        Ok(unsafe { s.dtoh(host.ptr(), dev.0, n) }?)
    };
    let inn = |n: usize| -> Result<()> {
        // SAFETY: as above (n <= max).
        Ok(unsafe { s.htod(dev.0, host.ptr(), n) }?)
    };
    let sig_copy = || -> Result<()> {
        // SAFETY: as above (the word past `max`).
        Ok(unsafe { s.htod(sig_dev, sig_host, 8) }?)
    };
    let mut size = min as usize;
    while size <= max {
        let mut t = [const { Vec::new() }; 7];
        for round in 0..iters + 10 {
            let keep = round >= 10;
            let mut time = |k: usize, f: &mut dyn FnMut() -> Result<()>| -> Result<u64> {
                let a = Instant::now();
                f()?;
                let call = a.elapsed().as_nanos() as u64;
                settle(&mut events, &s)?;
                let all = a.elapsed().as_nanos() as u64;
                if keep {
                    t[k].push(all);
                }
                Ok(call)
            };
            let call = time(0, &mut || out(size))?;
            time(1, &mut || inn(size))?;
            time(2, &mut || {
                inn(size)?;
                sig_copy()
            })?;
            time(3, &mut || {
                inn(size)?;
                write_value(&s, sig_dev, round as u64)
            })?;
            time(5, &mut || sig_copy())?;
            time(6, &mut || write_value(&s, sig_dev, round as u64))?;
            if keep {
                t[4].push(call);
            }
        }
        let m: Vec<f64> = t.into_iter().map(median_us).collect();
        println!("{:>10} {:>8.2} {:>8.2} {:>12.2} {:>12.2} {:>8.2} {:>10.2} {:>11.2}", size, m[0], m[1], m[2], m[3], m[4], m[5], m[6]);
        size *= 4;
    }
    s.synchronize()?;
    Ok(())
}

/// `cuStreamWriteValue64` of `value` to device word `addr` after the work
/// queued on `s` (default flags: a memory barrier first, so the earlier
/// copies' data is visible before the word).
fn write_value(s: &Stream, addr: u64, value: u64) -> Result<()> {
    // SAFETY: `addr` is an 8-byte-aligned word of device memory of the
    // current context (the floor's buffer), alive until the stream drains.
    let r = unsafe { cusys::cuStreamWriteValue64_v2(s.raw(), addr, value, 0) };
    ensure!(r == cusys::CUresult::CUDA_SUCCESS, "cuStreamWriteValue64: {r:?}");
    Ok(())
}
