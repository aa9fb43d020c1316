//! `cpnet-gpu-check on-stream`: the host-side `_on_stream` team collectives
//! of a GPU PE (`GpuPe::team_*_on_stream`, issue 22), each enqueued on the
//! PE's stream behind the copy that writes its source, on the world team and
//! on an even-PE split, every element checked against what the PEs' inputs
//! determine.

use anyhow::{Context, Result, ensure};
use cpnet::GpuPe;
use cpnet::device::cpu::{ReduceOp, ReduceType, SymAddr};
use cpnet::team::Team;

use crate::heap_words::{bytes_u64s, u64s_bytes};

/// Elements (and bytes per PE for the byte collectives) each case moves:
/// odd, and more than one round of the team scratch's chunk for the
/// reductions' u64 case.
const N: usize = 1001;

/// PE `pe`'s value `i` (a deterministic pattern the checks recompute).
fn val(pe: i32, i: usize) -> u64 {
    (pe as u64 + 1) * 1_000_003 + i as u64 * 7919
}

fn f64s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// Run every form on `team` (this PE a member) with `src` and `dst` (each
/// `N` x 8 x the team's size bytes, allocated by every PE) and check it.
/// **Collective** over the team.
fn check_team(pe: &GpuPe, team: &Team, name: &str, src: SymAddr, dst: SymAddr) -> Result<()> {
    let (me, n) = (team.my_pe(), team.n_pes());
    let world = |i: i32| team.world_pe(i).expect("a member index of the team");
    let bytes = (N * 8) as u64;
    let s = pe.stream();
    let mine: Vec<u8> = (0..N * n as usize).flat_map(|i| val(pe.my_pe(), i).to_le_bytes()).collect();
    pe.write_heap(src, &mine)?;
    let mut got = vec![0u8; (bytes * n as u64) as usize];
    // A collective returns when this PE's part is done, not the others'
    // (docs/collectives.md): a member that moved on to the next one may
    // already put into our `dest` while we read the last result. So, as
    // OpenSHMEM asks of a program that reuses `dest`, the team syncs after
    // each check (a run of 3 PEs on the network path once failed a check
    // without it).
    let settle = || -> Result<()> {
        pe.team_sync_on_stream(team, false, s)?;
        pe.synchronize().context("sync after a check")
    };

    // u64 sum and xor, f64 min.
    pe.team_reduce_on_stream::<u64>(team, ReduceOp::Sum, dst, src, N, s)?;
    pe.synchronize()?;
    pe.read_heap(dst, &mut got[..N * 8])?;
    let want: Vec<u64> = (0..N).map(|i| (0..n).fold(0u64, |a, p| a.wrapping_add(val(world(p), i)))).collect();
    ensure!(bytes_u64s(&got[..N * 8]) == want, "{name}: u64 sum reduce on a stream differs");
    settle()?;
    pe.team_reduce_on_stream::<u64>(team, ReduceOp::Xor, dst, src, N, s)?;
    pe.synchronize()?;
    pe.read_heap(dst, &mut got[..N * 8])?;
    let want: Vec<u64> = (0..N).map(|i| (0..n).fold(0u64, |a, p| a ^ val(world(p), i))).collect();
    ensure!(bytes_u64s(&got[..N * 8]) == want, "{name}: u64 xor reduce on a stream differs");
    settle()?;
    let fl: Vec<u8> = (0..N).flat_map(|i| (val(pe.my_pe(), i) as f64 * 0.5).to_le_bytes()).collect();
    pe.write_heap(src, &fl)?;
    pe.team_reduce_on_stream::<f64>(team, ReduceOp::Min, dst, src, N, s)?;
    pe.synchronize()?;
    pe.read_heap(dst, &mut got[..N * 8])?;
    let want: Vec<f64> = (0..N).map(|i| (0..n).map(|p| val(world(p), i) as f64 * 0.5).fold(f64::INFINITY, f64::min)).collect();
    ensure!(f64s(&got[..N * 8]) == want, "{name}: f64 min reduce on a stream differs");
    settle()?;
    pe.write_heap(src, &mine)?;

    // broadcast from the last member, fcollect, alltoall.
    let root = n - 1;
    pe.team_broadcast_on_stream(team, dst, src, N * 8, root, s)?;
    pe.synchronize()?;
    pe.read_heap(dst, &mut got[..N * 8])?;
    let want: Vec<u64> = (0..N).map(|i| val(world(root), i)).collect();
    ensure!(bytes_u64s(&got[..N * 8]) == want, "{name}: broadcast on a stream differs");
    settle()?;
    pe.team_fcollect_on_stream(team, dst, src, N * 8, s)?;
    pe.synchronize()?;
    pe.read_heap(dst, &mut got)?;
    let want: Vec<u64> = (0..n).flat_map(|p| (0..N).map(move |i| val(world(p), i))).collect();
    ensure!(bytes_u64s(&got) == want, "{name}: fcollect on a stream differs");
    settle()?;
    pe.team_alltoall_on_stream(team, dst, src, N * 8, s)?;
    pe.synchronize()?;
    pe.read_heap(dst, &mut got)?;
    // Block i of my dest is block `me` of member i's source.
    let want: Vec<u64> = (0..n).flat_map(|p| (0..N).map(move |i| val(world(p), me as usize * N + i))).collect();
    ensure!(bytes_u64s(&got) == want, "{name}: alltoall on a stream differs");
    settle()?;

    // sync and barrier, twice each.
    for quiet in [false, true, false, true] {
        pe.team_sync_on_stream(team, quiet, s)?;
    }
    pe.synchronize()?;
    Ok(())
}

/// Bytes per pair of the large alltoall: above the grid form's 512 KiB
/// (`runtime/src/gpu/alltoall_grid.rs`, taken where the members map each
/// other's heaps), and not a multiple of 16, so the last block's run ends
/// in a partial word.
const BIG: usize = cpnet::gpu::ALLTOALL_GRID_MIN_BYTES as usize + 24;

/// This member's `dst` after an alltoall of [`BIG`] bytes per pair on
/// `team` in which member p's source word i was `v(world PE of p, i)`:
/// every word checked; the error names the first wrong one.
fn check_alltoall_dest(pe: &GpuPe, team: &Team, dst: SymAddr, v: impl Fn(i32, usize) -> u64) -> Result<()> {
    let (me, n) = (team.my_pe() as usize, team.n_pes() as usize);
    let world = |i: usize| team.world_pe(i as i32).expect("a member index of the team");
    let words = BIG / 8;
    let mut got = vec![0u8; BIG * n];
    pe.read_heap(dst, &mut got)?;
    let got = bytes_u64s(&got);
    let want = |i: usize| v(world(i / words), me * words + i % words);
    if let Some(i) = (0..words * n).find(|&i| got[i] != want(i)) {
        anyhow::bail!("word {i} (from member {}) is {:#x}, expected {:#x}", i / words, got[i], want(i));
    }
    Ok(())
}

/// The large alltoall on `team` (the grid form on peer stores, one block
/// otherwise), twice (the second's data differs), every word checked.
/// **Collective** over the team.
fn check_big_alltoall(pe: &GpuPe, team: &Team, name: &str, src: SymAddr, dst: SymAddr) -> Result<()> {
    let n = team.n_pes() as usize;
    let s = pe.stream();
    let words = BIG / 8;
    for round in 0..2u64 {
        let v = |p: i32, i: usize| val(p, i) ^ (round << 60);
        let mine: Vec<u8> = (0..words * n).flat_map(|i| v(pe.my_pe(), i).to_le_bytes()).collect();
        pe.write_heap(src, &mine)?;
        pe.team_alltoall_on_stream(team, dst, src, BIG, s)?;
        pe.synchronize()?;
        check_alltoall_dest(pe, team, dst, v).with_context(|| format!("{name}: alltoall of {BIG} bytes per pair, round {round}"))?;
        pe.team_sync_on_stream(team, false, s)?;
        pe.synchronize()?;
    }
    Ok(())
}

/// The large alltoall captured in a CUDA graph on a stream of its own
/// (after `check_big_alltoall` built its kernel) and the graph replayed
/// three times, each replay checked word by word: a grid form's launch
/// under capture takes words of its own (`fresh_words` in the runtime's
/// grid.rs) instead of a set of the PE's ring, and the team's epochs are
/// taken on the device, so every replay pairs with the peers'.
/// **Collective** over the team.
fn check_captured_alltoall(pe: &GpuPe, team: &Team, name: &str, src: SymAddr, dst: SymAddr) -> Result<()> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let n = team.n_pes() as usize;
    let s = pe.cuda().new_stream()?;
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = pe.team_alltoall_on_stream(team, dst, src, BIG, &s);
    let graph = s.end_capture(CUgraphInstantiate_flags(0))?;
    captured.with_context(|| format!("{name}: alltoall of {BIG} bytes per pair under CUDA graph capture"))?;
    let graph = graph.with_context(|| format!("{name}: the captured alltoall made no graph"))?;
    let words = BIG / 8;
    for round in 0..3u64 {
        let v = |p: i32, i: usize| val(p, i) ^ ((round + 7) << 56);
        let mine: Vec<u8> = (0..words * n).flat_map(|i| v(pe.my_pe(), i).to_le_bytes()).collect();
        pe.write_heap(src, &mine)?;
        graph.launch()?;
        s.synchronize()?;
        pe.synchronize()?;
        check_alltoall_dest(pe, team, dst, v).with_context(|| format!("{name}: captured alltoall of {BIG} bytes per pair, replay {round}"))?;
        // Every member has read its dest before the next replay writes it.
        pe.team_sync_on_stream(team, false, pe.stream())?;
        pe.synchronize()?;
    }
    Ok(())
}

/// Bytes of the large reductions' buffers: a u64 case of 1 Mi + 1
/// elements, so the grid form's blocks each take a long run.
const BIG_REDUCE: usize = (1 << 20) * 8 + 8;

/// One reduction of `n` elements of `T` with `op` on `team` (`dest` ==
/// `source` when `in_place`), PE p's element i being `v(p, i)`, every
/// element checked against the fold in team order that the library
/// promises (`ReduceType::combine`, so half and bfloat16 round as it does).
/// **Collective** over the team.
#[allow(clippy::too_many_arguments)]
fn check_reduce<T: ReduceType>(
    pe: &GpuPe,
    team: &Team,
    name: &str,
    op: ReduceOp,
    (src, dst): (SymAddr, SymAddr),
    n: usize,
    in_place: bool,
    v: impl Fn(i32, usize) -> T,
) -> Result<()> {
    let world = |i: i32| team.world_pe(i).expect("a member index of the team");
    let dst = if in_place { src } else { dst };
    let mut mine = vec![0u8; n * T::SIZE];
    for (i, b) in mine.chunks_exact_mut(T::SIZE).enumerate() {
        v(pe.my_pe(), i).write(b);
    }
    pe.write_heap(src, &mine)?;
    pe.team_reduce_on_stream::<T>(team, op, dst, src, n, pe.stream())?;
    pe.synchronize()?;
    let mut got = vec![0u8; n * T::SIZE];
    pe.read_heap(dst, &mut got)?;
    for (i, g) in got.chunks_exact(T::SIZE).enumerate() {
        let want = (1..team.n_pes()).fold(v(world(0), i), |a, p| T::combine(op, a, v(world(p), i)));
        let g = T::read(g);
        ensure!(g == want, "{name}: {} {} reduce of {n} elements on a stream{}: element {i} is {g:?}, expected {want:?}",
            T::NAME, op.name(), if in_place { " (in place)" } else { "" });
    }
    pe.team_sync_on_stream(team, false, pe.stream())?;
    pe.synchronize().context("sync after a check")
}

/// The large reductions on `team` (the grid form on peer stores from
/// `REDUCE_GRID_MIN_BYTES`, one block otherwise): float sum just above the
/// threshold and odd (also 4 bytes off 16-byte alignment, float max),
/// int32 min, bfloat16 sum (rounded per step), u64 xor
/// of 1 Mi + 1 elements out of place and in place. **Collective** over the
/// team.
fn check_big_reduce(pe: &GpuPe, team: &Team, name: &str, bufs: (SymAddr, SymAddr)) -> Result<()> {
    let near = cpnet::gpu::REDUCE_GRID_MIN_BYTES as usize / 4 + 5;
    check_reduce::<f32>(pe, team, name, ReduceOp::Sum, bufs, near, false, |p, i| ((p as usize * 7 + i) % 1000) as f32 * 0.25)?;
    // 4 bytes past 16-byte alignment: the grid's element-by-element loop.
    let off = (SymAddr(bufs.0.0 + 4), SymAddr(bufs.1.0 + 4));
    check_reduce::<f32>(pe, team, name, ReduceOp::Max, off, near, false, |p, i| ((p as usize * 13 + i) % 977) as f32 - 400.0)?;
    check_reduce::<i32>(pe, team, name, ReduceOp::Min, bufs, near * 2, false, |p, i| (val(p, i) % 100_003) as i32 - 50_000)?;
    check_reduce::<half::bf16>(pe, team, name, ReduceOp::Sum, bufs, near * 2, false, |p, i| half::bf16::from_f32(((p as usize + i) % 300) as f32 * 1.5))?;
    let words = BIG_REDUCE / 8;
    check_reduce::<u64>(pe, team, name, ReduceOp::Xor, bufs, words, false, val)?;
    check_reduce::<u64>(pe, team, name, ReduceOp::Sum, bufs, words, true, |p, i| val(p, i) ^ 0x5555)?;
    check_chained_reduce(pe, team, name, bufs, words)?;
    check_chained_reduce(pe, team, name, bufs, 12_289)?;
    // In place, each call from the last one's result in the same buffer
    // (the network path: through the reduce scratch).
    let name = format!("{name}, in place");
    check_chained_reduce(pe, team, &name, (bufs.0, bufs.0), words)?;
    check_chained_reduce(pe, team, &name, (bufs.0, bufs.0), 12_289)
}

/// Reductions back to back on one stream, with no synchronize between
/// them, each from the one before (b = sum(a), a = sum(b), ...), u64 sums
/// of `n` elements: a member that runs ahead into the next call must not
/// write a buffer a peer still reads or folds in the last one (the network
/// path's forms put into the members' `dest`). With `a == b`, in place:
/// b = sum(b) each time (a member's copy into its reduce scratch must not
/// meet a peer's put). Every element of the last result checked.
/// **Collective** over the team.
fn check_chained_reduce(pe: &GpuPe, team: &Team, name: &str, (a, b): (SymAddr, SymAddr), n: usize) -> Result<()> {
    const CALLS: u32 = 6;
    let world = |i: i32| team.world_pe(i).expect("a member index of the team");
    let mine: Vec<u64> = (0..n).map(|i| val(pe.my_pe(), i)).collect();
    pe.write_heap(a, &u64s_bytes(&mine))?;
    pe.team_sync_on_stream(team, false, pe.stream())?;
    for k in 0..CALLS {
        let (src, dst) = if k % 2 == 0 { (a, b) } else { (b, a) };
        pe.team_reduce_on_stream::<u64>(team, ReduceOp::Sum, dst, src, n, pe.stream())?;
    }
    pe.synchronize()?;
    let last = if CALLS.is_multiple_of(2) { a } else { b };
    let mut got = vec![0u8; n * 8];
    pe.read_heap(last, &mut got)?;
    // After the first call every member holds the sum; each later call
    // multiplies it by the team's size.
    let scale = (team.n_pes() as u64).wrapping_pow(CALLS - 1);
    for (i, g) in bytes_u64s(&got).into_iter().enumerate() {
        let want = (0..team.n_pes()).fold(0u64, |acc, p| acc.wrapping_add(val(world(p), i))).wrapping_mul(scale);
        ensure!(g == want, "{name}: {CALLS} u64 sum reduces of {n} elements back to back on a stream: element {i} is {g}, expected {want}");
    }
    pe.team_sync_on_stream(team, false, pe.stream())?;
    pe.synchronize().context("sync after the chained reduces")
}

/// Three reductions of 100,003 elements, each of a type and operator no
/// other check uses (so each builds its kernel on first use), enqueued back
/// to back with no synchronize between them, then every element of all
/// three checked: a kernel built and loaded while the one before still
/// runs must not stall it (loading may wait for the context to go idle,
/// and the one before waits for what the proxy lands). **Collective** over
/// the team.
fn check_first_use(pe: &GpuPe, team: &Team, (src, dst): (SymAddr, SymAddr)) -> Result<()> {
    const N: usize = 100_003;
    let world = |i: i32| team.world_pe(i).expect("a member index of the team");
    let at = |b: SymAddr, k: u64| SymAddr(b.0 + (k << 20));
    let v16 = |p: i32, i: usize| (val(p, i) % 30_011) as i16;
    let v32 = |p: i32, i: usize| (val(p, i) % 1_000_003) as u32;
    let v64 = |p: i32, i: usize| 1.0 + ((p as usize * 3 + i) % 7) as f64 * 0.5;
    let bytes = |f: &dyn Fn(usize, &mut [u8]), size: usize| {
        let mut b = vec![0u8; N * size];
        for (i, c) in b.chunks_exact_mut(size).enumerate() {
            f(i, c);
        }
        b
    };
    let me = pe.my_pe();
    pe.write_heap(at(src, 0), &bytes(&|i, c| v16(me, i).write(c), 2))?;
    pe.write_heap(at(src, 1), &bytes(&|i, c| v32(me, i).write(c), 4))?;
    pe.write_heap(at(src, 2), &bytes(&|i, c| v64(me, i).write(c), 8))?;
    pe.team_sync_on_stream(team, false, pe.stream())?;
    pe.team_reduce_on_stream::<i16>(team, ReduceOp::Sum, at(dst, 0), at(src, 0), N, pe.stream())?;
    pe.team_reduce_on_stream::<u32>(team, ReduceOp::Max, at(dst, 1), at(src, 1), N, pe.stream())?;
    pe.team_reduce_on_stream::<f64>(team, ReduceOp::Prod, at(dst, 2), at(src, 2), N, pe.stream())?;
    pe.synchronize().context("sync after three reductions built on first use")?;
    fn check<T: ReduceType>(pe: &GpuPe, team: &Team, op: ReduceOp, dst: SymAddr, v: impl Fn(i32, usize) -> T, world: impl Fn(i32) -> i32) -> Result<()> {
        let mut got = vec![0u8; N * T::SIZE];
        pe.read_heap(dst, &mut got)?;
        for (i, g) in got.chunks_exact(T::SIZE).enumerate() {
            let want = (1..team.n_pes()).fold(v(world(0), i), |a, p| T::combine(op, a, v(world(p), i)));
            let g = T::read(g);
            ensure!(g == want, "{} {} reduce of {N} elements built on first use behind another: element {i} is {g:?}, expected {want:?}", T::NAME, op.name());
        }
        Ok(())
    }
    check::<i16>(pe, team, ReduceOp::Sum, at(dst, 0), v16, world)?;
    check::<u32>(pe, team, ReduceOp::Max, at(dst, 1), v32, world)?;
    check::<f64>(pe, team, ReduceOp::Prod, at(dst, 2), v64, world)?;
    pe.team_sync_on_stream(team, false, pe.stream())?;
    pe.synchronize().context("sync after the first-use check")
}

/// The scenario: the world team, then the even PEs' split (its members
/// only; the others wait at the world barrier). **Collective.**
///
/// # Errors
/// A wrong element, naming the team and the form; runtime errors.
pub fn on_stream(pe: &GpuPe) -> Result<()> {
    let world = pe.team_world();
    // Allocation is collective over every PE: once, sized for the world.
    let bytes = (N * 8) as u64 * pe.n_pes() as u64;
    let (src, dst) = (pe.shmalloc(bytes)?, pe.shmalloc(bytes)?);
    let big = (BIG * pe.n_pes() as usize) as u64;
    let (bsrc, bdst) = (pe.shmalloc(big)?, pe.shmalloc(big)?);
    let (rsrc, rdst) = (pe.shmalloc(BIG_REDUCE as u64)?, pe.shmalloc(BIG_REDUCE as u64)?);
    check_first_use(pe, &world, (rsrc, rdst)).context("team world, kernels built on first use")?;
    check_team(pe, &world, "world", src, dst).context("team world")?;
    check_big_alltoall(pe, &world, "world", bsrc, bdst).context("team world")?;
    check_captured_alltoall(pe, &world, "world", bsrc, bdst).context("team world")?;
    check_big_reduce(pe, &world, "world", (rsrc, rdst)).context("team world")?;
    println!("on-stream PE {}: world team ({} PEs): reduce (also up to {BIG_REDUCE} B), broadcast, fcollect, alltoall (also {BIG} B per pair, and captured in a CUDA graph), sync, barrier OK", pe.my_pe(), world.n_pes());
    let even = pe.team_split_strided(&world, 0, 2, (pe.n_pes() + 1) / 2)?;
    if let Some(t) = &even {
        check_team(pe, t, "even PEs", src, dst).context("team of the even PEs")?;
        check_big_alltoall(pe, t, "even PEs", bsrc, bdst).context("team of the even PEs")?;
        check_big_reduce(pe, t, "even PEs", (rsrc, rdst)).context("team of the even PEs")?;
        println!("on-stream PE {}: even-PE team ({} PEs) OK", pe.my_pe(), t.n_pes());
    }
    pe.barrier_all()?;
    pe.shfree(rdst)?;
    pe.shfree(rsrc)?;
    pe.shfree(bdst)?;
    pe.shfree(bsrc)?;
    pe.shfree(dst)?;
    pe.shfree(src)?;
    Ok(())
}
