//! `cpnet-gpu-check collectives` (every device collective on every check
//! team, values checked element by element, and their bad input) and the
//! collectives' benchmarks (`a2a-bench`, `coll-bench`).

use super::*;

/// A run of the collectives check: the team the cases run on (`id`; -1 and
/// no cases where this PE is not a member), its entry, and the team
/// argument of the bad-input calls.
struct CheckTeam {
    name: String,
    id: i32,
    desc: Option<TeamDesc>,
    bad_team: i32,
}

/// Heap bytes of the region the collectives' cases use (reused by each team).
const COLL_REGION: u64 = 24 << 20;

/// Run `f` on each team of the collectives check, in order: the runtime's
/// CPNET_TEAM_WORLD and CPNET_TEAM_NODE, a split of every world PE (not
/// world: its own handle and scratch), the strided split of world PEs 1..
/// (size n - 1; world itself on one PE), which leaves PE 0 out (its bad
/// calls then use -1), and that split's handle after team_destroy (every
/// call on it must be CPNET_E_BAD_TEAM). Collective.
fn with_check_teams(pe: &GpuPe, mut f: impl FnMut(&CheckTeam) -> Result<()>) -> Result<()> {
    let n = pe.n_pes();
    let (s_start, s_size) = if n > 1 { (1, n - 1) } else { (0, 1) };
    let world = pe.team_world();
    let node = pe.team_node();
    for (name, t) in [("world", &world), ("node", &node)] {
        f(&CheckTeam { name: name.into(), id: t.id(), desc: Some(*t.desc()), bad_team: -1 })?;
    }
    let all = pe.team_split_strided(&world, 0, 1, n)?.context("a split of every PE has every PE")?;
    f(&CheckTeam { name: format!("split(0, 1, {n})"), id: all.id(), desc: Some(*all.desc()), bad_team: -1 })?;
    pe.team_destroy(all)?;
    let split = pe.team_split_strided(&world, s_start, 1, s_size)?;
    let name = format!("split({s_start}, 1, {s_size})");
    let (id, desc) = split.as_ref().map(|t| (t.id(), Some(*t.desc()))).unwrap_or((-1, None));
    f(&CheckTeam { name: name.clone(), id, desc, bad_team: -1 })?;
    if let Some(t) = split {
        pe.team_destroy(t)?;
    }
    f(&CheckTeam { name: format!("{name} after destroy"), id: -1, desc: None, bad_team: id })
}

/// Every collective of team.cuh on each team of `check_teams`, checked
/// element by element.
pub(super) fn collectives(pe: &GpuPe, threads: u32) -> Result<()> {
    use cpnet_tests::gpu_coll::{self, BAD_AT, BAD_CALLS, BAD_ROOT_CALLS, CASE_WORDS, CODE_WORDS, GUARD_BYTES, MAX_TRANSLATE};
    let me = pe.my_pe();
    let k = build(pe, "collectives", "coll", gpu_coll::COLL)?;
    let h = pe.handle();
    let region = pe.shmalloc(COLL_REGION)?;
    let logs = pe.shmalloc(LOG_WORDS as u64 * 8)?;
    let guard = pe.shmalloc(GUARD_BYTES)?;
    let max_cases = 512u64;
    let table = pe.shmalloc(max_cases * CASE_WORDS as u64 * 8)?;
    let codes = pe.shmalloc((max_cases * CODE_WORDS as u64 + 64) * 8)?;
    let guard_bytes = gpu::pattern(me as u32, 9, 9, GUARD_BYTES);
    let mut fails = Vec::new();
    with_check_teams(pe, |t| {
        let (cases, need) = match &t.desc {
            Some(d) => gpu_coll::cases(d.size, d.chunk),
            None => (Vec::new(), 0),
        };
        ensure!(need <= COLL_REGION, "{}: the cases need {need} bytes, the region has {COLL_REGION}", t.name);
        ensure!(cases.len() as u64 <= max_cases, "{}: {} cases", t.name, cases.len());
        // Sources, zeroed destinations, the case table, the guard.
        let mut img = vec![0u8; need as usize];
        if let Some(d) = &t.desc {
            for (c, case) in cases.iter().enumerate() {
                let s = gpu_coll::source(case, c, d, d.my_idx);
                img[case.src as usize..case.src as usize + s.len()].copy_from_slice(&s);
            }
        }
        pe.write_heap(region, &img)?;
        let words: Vec<u64> = cases.iter().flat_map(|c| c.words(region.0)).collect();
        pe.write_heap(table, &u64s_bytes(&words))?;
        pe.write_heap(codes, &vec![0xEEu8; (max_cases as usize * CODE_WORDS + 64) * 8])?;
        pe.write_heap(guard, &guard_bytes)?;
        pe.write_heap(logs, &vec![0u8; LOG_WORDS * 8])?;
        pe.barrier_all()?;

        let bad_team = t.bad_team;
        let t0 = Instant::now();
        let (p_table, p_codes, p_logs, p_guard) = (pe.dev_ptr(table), pe.dev_ptr(codes), pe.dev_ptr(logs), pe.dev_ptr(guard));
        let ncases = cases.len() as u32;
        let mut b = pe.stream().launch_builder(&k.func);
        b.arg(&h).arg(&t.id).arg(&p_table).arg(&ncases).arg(&p_codes).arg(&p_logs).arg(&p_guard).arg(&bad_team);
        // SAFETY: the arguments match `coll` in cpnet_tests::gpu_coll::COLL;
        // one block per PE (team collectives take one work-group per PE);
        // synchronized below.
        unsafe { b.launch(grid(1, threads)) }.context("launch coll")?;
        pe.synchronize()?;
        pe.barrier_all()?;
        let secs = t0.elapsed().as_secs_f64();

        let before = fails.len();
        if let Err(e) = check_logs(pe, &k, logs, 1) {
            fails.push(format!("{}: {e}", t.name));
        }
        let cw = read_u64s(pe, codes, cases.len() * CODE_WORDS + BAD_AT + BAD_CALLS.len() + BAD_ROOT_CALLS.len())?;
        let got = read(pe, region, need)?;
        if let Some(d) = &t.desc {
            for (c, case) in cases.iter().enumerate() {
                let what = || format!("PE {me} team {} ({}, team PE {}): case {c} {}", t.name, d.size, d.my_idx, case.describe());
                let code = cw[CODE_WORDS * c] as i64;
                if code != 0 {
                    fails.push(format!("{}: returned {code}", what()));
                    continue;
                }
                if case.kind == gpu_coll::Kind::Collect {
                    let total = cw[CODE_WORDS * c + 1];
                    if total != case.dst_bytes {
                        fails.push(format!("{}: total {total}, expected {}", what(), case.dst_bytes));
                    }
                }
                if let Some(want) = gpu_coll::expect(case, c, d, d.my_idx) {
                    let at = case.dst as usize;
                    if let Some(m) = gpu_coll::compare(case, &got[at..at + want.len()], &want) {
                        fails.push(format!("{}: {m}", what()));
                    }
                }
                // The 64 bytes after each region stay zero.
                let end = (case.dst + case.dst_bytes) as usize;
                if got[end..end + 64].iter().any(|&b| b != 0) {
                    fails.push(format!("{}: written past the destination", what()));
                }
            }
        }
        let q = cases.len() * CODE_WORDS;
        let (want_me, want_n) = t.desc.map(|d| (i64::from(d.my_idx), i64::from(d.size))).unwrap_or((-1, -1));
        if cw[q] as i64 != want_me || cw[q + 1] as i64 != want_n {
            fails.push(format!("PE {me} team {}: team_my_pe {} / team_n_pes {}, expected {want_me} / {want_n}", t.name, cw[q] as i64, cw[q + 1] as i64));
        }
        if let Some(d) = &t.desc {
            for j in 0..MAX_TRANSLATE {
                let want = if (j as i32) < d.size { d.world_pe(j as i32) as i64 } else { -1 };
                if cw[q + 2 + j] as i64 != want {
                    fails.push(format!("PE {me} team {}: translate_pe({j} -> world) = {}, expected {want}", t.name, cw[q + 2 + j] as i64));
                }
            }
        }
        let bad: Vec<(&str, i64)> =
            BAD_CALLS.iter().chain(if t.desc.is_some() { BAD_ROOT_CALLS } else { &[] }).copied().collect();
        for (i, &(what, want)) in bad.iter().enumerate() {
            let got = cw[q + BAD_AT + i] as i64;
            if got != want {
                fails.push(format!("PE {me} team {}: bad input `{what}` returned {got}, expected {want}", t.name));
            }
        }
        if read(pe, guard, GUARD_BYTES)? != guard_bytes {
            fails.push(format!("PE {me} team {}: the bad calls wrote into the guard", t.name));
        }
        if fails.len() == before {
            println!("collectives PE {me} team {}: {} cases OK ({secs:.3} s)", t.name, cases.len());
        }
        pe.barrier_all()?;
        Ok(())
    })?;
    verdict(fails)
}

/// Alltoall latency on CPNET_TEAM_WORLD, 1 KiB to `max` bytes per pair.
pub(super) fn a2a_bench(pe: &GpuPe, threads: u32, min: u64, iters: u64, max: u64) -> Result<()> {
    use cpnet_tests::gpu_coll;
    let me = pe.my_pe();
    let n = pe.n_pes() as u64;
    let (sizes, counts) = a2a_sizes(min, iters, max);
    let span = n * sizes.last().copied().unwrap_or(1024);
    // Built for this block size (`__launch_bounds__`), as coll-bench is: at
    // 1024 threads the default bounds gave CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.
    let defines = format!("#define COLL_BENCH_THREADS {threads}\n");
    let k = build_with(pe, "a2a-bench", "a2a_bench", &defines, gpu_coll::COLL_BENCH)?;
    let need = 2 * span;
    let alloc = |what: &str, bytes: u64| {
        pe.shmalloc(bytes).with_context(|| format!("a2a-bench {what}: {bytes} bytes (both buffers need {need}: raise CPNET_HEAP_SIZE)"))
    };
    let sz = alloc("sizes", 8 * sizes.len() as u64)?;
    let it = alloc("counts", 8 * sizes.len() as u64)?;
    let src = alloc("source", span)?;
    let dst = alloc("dest", span)?;
    let out = alloc("times", 8 * sizes.len() as u64)?;
    let logs = alloc("logs", LOG_WORDS as u64 * 8)?;
    pe.write_heap(sz, &u64s_bytes(&sizes))?;
    pe.write_heap(it, &u64s_bytes(&counts))?;
    pe.barrier_all()?;
    let (p_sz, p_it, p_src, p_dst, p_out, p_logs) =
        (pe.dev_ptr(sz), pe.dev_ptr(it), pe.dev_ptr(src), pe.dev_ptr(dst), pe.dev_ptr(out), pe.dev_ptr(logs));
    let nsizes = sizes.len() as u32;
    let team = pe.team_world().id();
    let h = pe.handle();
    let mut b = pe.stream().launch_builder(&k.func);
    b.arg(&h).arg(&team).arg(&p_sz).arg(&p_it).arg(&nsizes).arg(&p_src).arg(&p_dst).arg(&p_out).arg(&p_logs);
    // SAFETY: the arguments match `a2a_bench` in cpnet_tests::gpu_coll::COLL_BENCH;
    // src and dst hold n_pes x the largest size; one block per PE;
    // synchronized below.
    unsafe { b.launch(grid(1, threads)) }.context("launch a2a_bench")?;
    pe.synchronize()?;
    pe.barrier_all()?;
    check_logs(pe, &k, logs, 1)?;
    let ns = read_u64s(pe, out, sizes.len())?;
    if me == 0 {
        let path = if h.0.peers != 0 { "p2p stores" } else { "queue (network path)" };
        print_a2a(&format!("{n} PEs, team world, cpnet_alltoallmem, 1 block x {threads} threads, {path}"), n, &sizes, &counts, &ns);
    }
    Ok(())
}

/// Barrier, sync and float sum reduce latency on CPNET_TEAM_WORLD.
pub(super) fn coll_bench(pe: &GpuPe, threads: u32, iters: u32, small_max: Option<u64>) -> Result<()> {
    use cpnet_tests::gpu_coll;
    let me = pe.my_pe();
    let mut defines = format!("#define COLL_BENCH_THREADS {threads}\n");
    if let Some(w) = small_max {
        defines += &format!("#define CPNET_TEAM_SMALL_MAX_BYTES {w}ull\n");
    }
    let k = build_with(pe, "coll-bench", "coll_bench", &defines, gpu_coll::COLL_BENCH)?;
    let h = pe.handle();
    let sizes: Vec<u64> = vec![8, 64, 512, 1024, 2048, 4096, 8192];
    let sz = pe.shmalloc(8 * sizes.len() as u64)?;
    let src = pe.shmalloc(8192)?;
    let dst = pe.shmalloc(8192)?;
    let out = pe.shmalloc(8 * (2 + sizes.len() as u64))?;
    let logs = pe.shmalloc(LOG_WORDS as u64 * 8)?;
    pe.write_heap(sz, &u64s_bytes(&sizes))?;
    pe.barrier_all()?;
    let (p_sz, p_src, p_dst, p_out, p_logs) = (pe.dev_ptr(sz), pe.dev_ptr(src), pe.dev_ptr(dst), pe.dev_ptr(out), pe.dev_ptr(logs));
    let nsizes = sizes.len() as u32;
    let team = pe.team_world().id();
    let mut b = pe.stream().launch_builder(&k.func);
    b.arg(&h).arg(&team).arg(&iters).arg(&p_sz).arg(&nsizes).arg(&p_src).arg(&p_dst).arg(&p_out).arg(&p_logs);
    // SAFETY: the arguments match `coll_bench` in cpnet_tests::gpu_coll::COLL_BENCH;
    // one block per PE; synchronized below.
    unsafe { b.launch(grid(1, threads)) }.context("launch coll_bench")?;
    pe.synchronize()?;
    pe.barrier_all()?;
    check_logs(pe, &k, logs, 1)?;
    let ns = read_u64s(pe, out, 2 + sizes.len())?;
    if me == 0 {
        let path = if h.0.peers != 0 { "p2p stores" } else { "queue (network path)" };
        let small = small_max.map_or_else(|| "default".to_string(), |w| format!("{w} B"));
        println!(
            "coll-bench: {} PEs, team world, 1 block x {threads} threads, {iters} calls each, {path}, short reductions up to {small}",
            pe.n_pes()
        );
        println!("coll-bench: {:>10} {:>8} {:>10}", "op", "bytes", "time(us)");
        println!("coll-bench: {:>10} {:>8} {:>10.2}", "barrier", 0, ns[0] as f64 / 1e3);
        println!("coll-bench: {:>10} {:>8} {:>10.2}", "sync", 0, ns[1] as f64 / 1e3);
        for (i, s) in sizes.iter().enumerate() {
            println!("coll-bench: {:>10} {:>8} {:>10.2}", "reduce", s, ns[2 + i] as f64 / 1e3);
        }
    }
    Ok(())
}
