//! The host-side collectives' benchmarks of `cpnet-gpu-check`
//! (`a2a-bench --on-stream`, `reduce-bench`): `GpuPe::team_*_on_stream`
//! launched back to back on the PE's stream, the host's clock around them
//! and the synchronize, as scripts/nccl_alltoall.py and
//! scripts/nccl_allreduce.py time NCCL's calls (CUDA events around the
//! loop); the last call's result is checked element by element. PE 0
//! prints.

use anyhow::{Context, Result, ensure};
use cpnet::GpuPe;
use cpnet::device::cpu::ReduceOp;

use crate::heap_words::{read_u64s, u64s_bytes};

/// A benchmark's sizes (`first`, x4, up to `max`) and calls per size
/// (`iters` up to 1 MiB, then about as many bytes in all, at least
/// `min_calls`).
pub fn sizes_and_calls(first: u64, iters: u64, max: u64, min_calls: u64) -> (Vec<u64>, Vec<u64>) {
    let sizes: Vec<u64> = std::iter::successors(Some(first), |s| Some(s * 4)).take_while(|&s| s <= max.max(first)).collect();
    let counts = sizes.iter().map(|&s| if s <= 1 << 20 { iters } else { (iters * (1 << 20) / s).max(min_calls) }).collect();
    (sizes, counts)
}

/// The alltoall benchmarks' sizes per pair (`min`, x4, up to `max`) and
/// calls per size (at least 20 above 1 MiB: with 5, the PEs' skew after
/// the host barrier moved 64 MiB per pair between 263 and 377 µs a call
/// from run to run on two H200s, docs/results.md "Session 22").
pub fn a2a_sizes(min: u64, iters: u64, max: u64) -> (Vec<u64>, Vec<u64>) {
    sizes_and_calls(min, iters, max, 20)
}

/// One size's time per call (ns): a warm-up `call`, then `calls` of them
/// back to back on the PE's stream, from a host barrier (the PEs start
/// together) to the synchronize after the last; a barrier after it, so the
/// last result may be read. **Collective.**
fn time_calls(pe: &GpuPe, calls: u64, mut call: impl FnMut() -> Result<()>) -> Result<u64> {
    call()?;
    pe.synchronize()?;
    pe.barrier_all()?;
    let t = std::time::Instant::now();
    for _ in 0..calls {
        call()?;
    }
    pe.synchronize()?;
    let ns = t.elapsed().as_nanos() as u64 / calls.max(1);
    pe.barrier_all()?;
    Ok(ns)
}

/// PE 0's alltoall table: `title`, then per size the calls, ns per call
/// (`ns`) in µs, and algbw as nccl_alltoall.py computes it (the bytes this
/// PE sends to the others per second).
pub fn print_a2a(title: &str, n: u64, sizes: &[u64], counts: &[u64], ns: &[u64]) {
    println!("a2a-bench: {title}");
    println!("a2a-bench: {:>10} {:>8} {:>10} {:>10}", "bytes/pair", "calls", "time(us)", "algbw(GB/s)");
    for ((s, c), t) in sizes.iter().zip(counts).zip(ns) {
        let bw = (n - 1) as f64 * *s as f64 / (*t as f64).max(1.0);
        println!("a2a-bench: {s:>10} {c:>8} {:>10.2} {bw:>10.2}", *t as f64 / 1e3);
    }
}

/// Alltoall through `GpuPe::team_alltoall_on_stream` on CPNET_TEAM_WORLD,
/// 1 KiB to `max` bytes per pair: per size a warm-up call, then `iters`
/// (fewer above 1 MiB) back to back on the PE's stream, timed on the host
/// from the first launch to the end of the synchronize, as
/// scripts/nccl_alltoall.py times NCCL's (CUDA events around the loop).
/// The last call's result is checked word by word. PE 0 prints.
pub fn alltoall(pe: &GpuPe, min: u64, iters: u64, max: u64) -> Result<()> {
    let me = pe.my_pe();
    let n = pe.n_pes() as u64;
    let (sizes, counts) = a2a_sizes(min, iters, max);
    let span = n * sizes.last().copied().unwrap_or(1024);
    let alloc = |what: &str, bytes: u64| {
        pe.shmalloc(bytes).with_context(|| format!("a2a-bench {what}: {bytes} bytes (both buffers need {}: raise CPNET_HEAP_SIZE)", 2 * span))
    };
    let (src, dst) = (alloc("source", span)?, alloc("dest", span)?);
    // Word i of this PE's source: its number and i, so every word of a
    // result names where it came from.
    let words = (span / 8) as usize;
    pe.write_heap(src, &u64s_bytes(&(0..words as u64).map(|i| (me as u64) << 48 | i).collect::<Vec<_>>()))?;
    let world = pe.team_world();
    let s = pe.stream();
    let mut ns = Vec::new();
    for (&size, &c) in sizes.iter().zip(&counts) {
        ns.push(time_calls(pe, c, || Ok(pe.team_alltoall_on_stream(&world, dst, src, size as usize, s)?))?);
        let got = read_u64s(pe, dst, (n * size / 8) as usize)?;
        let per = (size / 8) as usize;
        for (i, &g) in got.iter().enumerate() {
            // Block j of my dest is block `me` of PE j's source.
            let (j, k) = ((i / per) as u64, (me as u64 * size / 8) + (i % per) as u64);
            ensure!(g == j << 48 | k, "a2a-bench --on-stream: {size} B per pair: word {i} is {g:#x}, expected {:#x}", j << 48 | k);
        }
        pe.barrier_all()?;
    }
    if me == 0 {
        let path = if pe.handle().0.peers != 0 { "p2p stores" } else { "queue (network path)" };
        let grid = cpnet::gpu::ALLTOALL_GRID_MIN_BYTES;
        let title = format!("{n} PEs, team world, team_alltoall_on_stream (a grid from {grid} B per pair where heaps are mapped; on the network path a job of two's pair zone, CPNET_PAIR_STAGE, where it takes the size; else one block), {path}");
        print_a2a(&title, n, &sizes, &counts, &ns);
    }
    pe.barrier_all()?;
    pe.shfree(dst)?;
    pe.shfree(src)?;
    Ok(())
}

/// Float sum reduce to all through `GpuPe::team_reduce_on_stream` on
/// CPNET_TEAM_WORLD, `min` (at least 4 KiB) to `max` bytes (x4): per size a
/// warm-up call, then `iters` (fewer above 1 MiB, at least 20) back to
/// back, timed on the host from the first launch to the end of the
/// synchronize. Element i of PE p is `(p + i) mod 1000` (small integers:
/// every sum is exact in any order), so the last result is checked element
/// by element. With `in_place` (`dest == source`, as PyTorch's allreduce
/// runs NCCL's) each call reduces the last one's result, so the check
/// writes the array again and runs one more call. PE 0 prints one row per
/// size: bytes, calls, µs per call, busbw as nccl-tests computes it (`bytes
/// / time x 2 (n - 1) / n`) and the form
/// (`GpuPe::team_reduce_on_stream_form`).
///
/// # Errors
/// A wrong element, naming size and index; the heap too small (the buffers
/// need 2 x `max` bytes, `max` in place: CPNET_HEAP_SIZE); runtime errors.
pub fn reduce(pe: &GpuPe, iters: u64, min: u64, max: u64, in_place: bool) -> Result<()> {
    let me = pe.my_pe();
    let n = pe.n_pes();
    // At least 20 calls (nccl_allreduce.py's count from 16 MiB): with 12,
    // the PEs' skew after the host barrier added 10-20 µs a call at 16 MiB.
    let (sizes, counts) = sizes_and_calls(min.max(4096), iters, max, 20);
    let span = sizes.last().copied().unwrap_or(4096);
    let need = if in_place { span } else { 2 * span };
    let alloc = |what: &str| pe.shmalloc(span).with_context(|| format!("reduce-bench {what}: {span} bytes (the buffers need {need}: raise CPNET_HEAP_SIZE)"));
    let src = alloc("source")?;
    let dst = if in_place { src } else { alloc("dest")? };
    let elems = (span / 4) as usize;
    let v = |p: i32, i: usize| ((p as usize + i) % 1000) as f32;
    let init = || -> Result<()> { Ok(pe.write_heap(src, &(0..elems).flat_map(|i| v(me, i).to_le_bytes()).collect::<Vec<u8>>())?) };
    init()?;
    let world = pe.team_world();
    let s = pe.stream();
    let mut ns = Vec::new();
    for (&size, &c) in sizes.iter().zip(&counts) {
        let count = (size / 4) as usize;
        let call = || Ok(pe.team_reduce_on_stream::<f32>(&world, ReduceOp::Sum, dst, src, count, s)?);
        ns.push(time_calls(pe, c, call)?);
        if in_place {
            // The timed calls doubled (n-folded) the array each time; start
            // it again and check one call. The barrier: no member's call
            // may reach a member still writing its array.
            pe.synchronize()?;
            init()?;
            pe.barrier_all()?;
            call()?;
            pe.synchronize()?;
        }
        let mut got = vec![0u8; size as usize];
        pe.read_heap(dst, &mut got)?;
        for (i, g) in got.chunks_exact(4).enumerate() {
            let g = f32::from_le_bytes(g.try_into().expect("4 bytes"));
            let want: f32 = (0..n).map(|p| v(p, i)).sum();
            ensure!(g == want, "reduce-bench: {size} B: element {i} is {g}, expected {want}");
        }
        pe.barrier_all()?;
        if in_place {
            init()?;
            pe.barrier_all()?;
        }
    }
    if me == 0 {
        let path = if pe.handle().0.peers != 0 { "p2p stores" } else { "queue (network path)" };
        let place = if in_place { "in place" } else { "dest apart from source" };
        println!("reduce-bench: {n} PEs, team world, float sum, team_reduce_on_stream, {place}, {path}");
        println!("reduce-bench: {:>10} {:>8} {:>10} {:>10} {:>15}", "bytes", "calls", "time(us)", "busbw(GB/s)", "form");
        for ((s, c), t) in sizes.iter().zip(&counts).zip(&ns) {
            let bw = *s as f64 / (*t as f64).max(1.0) * 2.0 * f64::from(n - 1) / f64::from(n);
            let form = pe.team_reduce_on_stream_form(&world, *s, 4, in_place);
            println!("reduce-bench: {s:>10} {c:>8} {:>10.2} {bw:>10.2} {form:>15}", *t as f64 / 1e3);
        }
    }
    pe.barrier_all()?;
    if !in_place {
        pe.shfree(dst)?;
    }
    pe.shfree(src)?;
    Ok(())
}
