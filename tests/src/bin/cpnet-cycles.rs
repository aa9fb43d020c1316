//! `cpnet-cycles`: init/finalize again and again in one process, checking
//! that nothing leaks (issue 7, "100 init/finalize cycles in one process
//! without growth of memory or file descriptors"). Run under `cpnet-run`
//! (or mpirun: PE 0 then hosts a new rendezvous each cycle).
//!
//! ```text
//! cpnet-run -n 2 -- cpnet-cycles --cycles 100
//! CPNET_PROVIDER='tcp;ofi_rxm' cpnet-run -n 2 -- cpnet-cycles --cycles 100
//! cpnet-run -n 2 -- cpnet-cycles --gpu --cycles 100      # GPU PEs (GpuPe)
//! ```
//!
//! Every cycle: `init`, `shmalloc`, work-groups that put a pattern that
//! depends on the cycle to the right neighbour, read it back, and add to
//! and compare-and-swap a counter on every PE; a barrier from a
//! work-group (through the proxy) and one from the host; every byte and
//! counter checked; `shfree`; `finalize`. (`--gpu`: a kernel that puts,
//! adds and barriers from the GPU, `cpnet_tests::gpu::BARRIER`, checked
//! alike.) After each finalize the PE samples itself:
//!
//! * RSS: `/proc/self/statm` (resident pages x page size), in KiB, after
//!   `malloc_trim(0)` (glibc keeps freed pages of fragmented arenas
//!   resident; the untrimmed value is printed too). The process fixes
//!   glibc's mmap and trim thresholds at 128 KiB (`mallopt`) first, so
//!   that freed memory goes back to the kernel instead of staying resident
//!   in thread arenas;
//! * malloc in use: bytes glibc's malloc handed out and did not get back
//!   (`mallinfo2`, every arena), in KiB: a leak of Rust or C (libfabric)
//!   allocations shows here first;
//! * open file descriptors: the entries of `/proc/self/fd`;
//! * threads: the entries of `/proc/self/task`;
//! * `/dev/shm` files of this process (`<pid>:*`, libfabric shm's regions).
//!
//! The first `--warmup` cycles may grow all of them (allocator arenas of
//! threads, libfabric's one-time set-up). After the warm-up the check
//! fails if RSS or malloc in use at the last cycle exceed their values at
//! the end of the warm-up by more than `--rss-bound-kib` or
//! `--malloc-bound-kib`, or if the fds, threads or `/dev/shm` files at any
//! later cycle outnumber those at the end of the warm-up; the message
//! gives the numbers (and the new fds' targets). Each PE prints its
//! samples before the first init, after cycle 1, at the end of the warm-up
//! and after the last cycle, the growth after the warm-up, then
//! `PE k: OK (...)`.
//!
//! `--leave-after K` (fault injection) makes PE `--leaver` exit (or kill
//! itself) after K cycles while the others init again: their next init
//! must fail at once, naming it.
//!
//! Exit status: 0 when every check passed; 1 when a check failed (data,
//! growth, or an error in a cycle, named with its cycle); 2 when the first
//! init failed. Without a GPU, `--gpu` prints `SKIP: <why>` and exits 0
//! (1 with `CPNET_REQUIRE_GPU=1`).

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use cpnet::device::cpu::SymAddr;
use cpnet::gpu::GpuError;
use cpnet::{GpuPe, Pe};
use cpnet_tests::check_eq;

#[derive(Parser)]
#[command(about = "cpnet init/finalize cycles in one process, checked for leaks (run under cpnet-run)")]
struct Cli {
    /// Init/finalize cycles.
    #[arg(long, default_value_t = 100)]
    cycles: u32,
    /// Cycles after which the samples must stop growing.
    #[arg(long, default_value_t = 10)]
    warmup: u32,
    /// Allowed RSS growth from the end of the warm-up to the last cycle, KiB
    /// (RSS after `malloc_trim`; measured growth over 90 cycles is at most
    /// ~0.4 MiB, from heap fragmentation).
    #[arg(long, default_value_t = 2048)]
    rss_bound_kib: u64,
    /// Allowed growth of the bytes malloc has handed out (`mallinfo2`) from
    /// the end of the warm-up to the last cycle, KiB. The main thread's
    /// glibc tcache (freed chunks it keeps, counted as in use) fills by up
    /// to ~235 KiB on its own; libfabric 1.17's shm provider leaks 280 B
    /// per endpoint (one per proxy thread and cycle).
    #[arg(long, default_value_t = 512)]
    malloc_bound_kib: u64,
    /// CPU work-groups per PE (CPU PEs).
    #[arg(long, default_value_t = 2)]
    wgs: u32,
    /// Use GPU PEs (`GpuPe`) instead of CPU PEs.
    #[arg(long)]
    gpu: bool,
    /// Print every cycle's sample, not only the first, warm and last.
    #[arg(long, short)]
    verbose: bool,
    /// Fault injection: PE `--leaver` leaves after this many cycles (see
    /// `--leave-by`) while the others go on; their next init must fail,
    /// naming it.
    #[arg(long, value_name = "CYCLES", value_parser = clap::value_parser!(u32).range(1..))]
    leave_after: Option<u32>,
    /// The PE that leaves (`--leave-after`).
    #[arg(long, default_value_t = 1)]
    leaver: i32,
    /// How it leaves: `exit` (status 0) or `kill` (SIGKILL to itself).
    #[arg(long, default_value = "exit", value_parser = ["exit", "kill"])]
    leave_by: String,
}

/// One line to stderr in one write (PEs share the terminal).
fn say(line: String) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

/// What a process holds, sampled after a finalize: the numbers. One is
/// kept per cycle, so it allocates nothing (the samples must not grow the
/// heap they measure).
#[derive(Clone, Copy, Debug)]
struct Counts {
    /// Resident set as the process left it, KiB.
    raw_rss_kib: u64,
    /// Resident set after `malloc_trim(0)` gave the allocator's free pages
    /// back, KiB: what the process still uses.
    rss_kib: u64,
    /// Virtual size, KiB.
    vsz_kib: u64,
    /// Bytes glibc's malloc has handed out and not had back (every arena,
    /// `mallinfo2`: `uordblks + hblkhd`), in KiB: a leak of Rust or C
    /// (libfabric) allocations shows here, free of fragmentation.
    malloc_kib: u64,
    /// Open file descriptors.
    fds: usize,
    /// Threads of the process.
    threads: usize,
    /// `/dev/shm` files named after this process (`<pid>:...`).
    shm: usize,
}

impl Counts {
    fn line(&self) -> String {
        format!(
            "rss {} KiB (untrimmed {} KiB), vsz {} KiB, malloc in use {} KiB, fds {}, threads {}, /dev/shm files {}",
            self.rss_kib, self.raw_rss_kib, self.vsz_kib, self.malloc_kib, self.fds, self.threads, self.shm
        )
    }
}

/// A sample with the names behind its counts (for messages).
#[derive(Clone, Debug)]
struct Sample {
    counts: Counts,
    /// Open file descriptors, by number, with what they point to.
    fds: Vec<(u32, String)>,
    /// The `/dev/shm` files of this process.
    shm: Vec<String>,
}

impl Sample {
    fn take() -> Result<Sample> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page_kib = u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096) / 1024;
        let (_, raw) = statm()?;
        // SAFETY: malloc_trim only returns free memory of glibc's arenas to
        // the kernel; it is thread-safe and touches no live allocation.
        unsafe { libc::malloc_trim(0) };
        let (size, resident) = statm()?;
        // SAFETY: mallinfo2 only reads glibc's arena statistics.
        let mi = unsafe { libc::mallinfo2() };
        let malloc_kib = ((mi.uordblks + mi.hblkhd) / 1024) as u64;
        let mut fds = Vec::new();
        for e in std::fs::read_dir("/proc/self/fd").context("list /proc/self/fd")? {
            let e = e?;
            let Ok(n) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            if let Ok(t) = std::fs::read_link(e.path()) {
                fds.push((n, t.to_string_lossy().into_owned()));
            }
        }
        fds.sort();
        let threads = std::fs::read_dir("/proc/self/task").context("list /proc/self/task")?.count();
        let prefix = format!("{}:", std::process::id());
        let mut shm: Vec<String> = std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(&prefix)).collect()
            })
            .unwrap_or_default();
        shm.sort();
        let counts = Counts {
            raw_rss_kib: raw * page_kib,
            rss_kib: resident * page_kib,
            vsz_kib: size * page_kib,
            malloc_kib,
            fds: fds.len(),
            threads,
            shm: shm.len(),
        };
        Ok(Sample { counts, fds, shm })
    }
}

/// The `n` mappings of this process with the most resident memory
/// (`/proc/self/smaps`), for messages: `"7f.. rw-p [heap] 12 MiB, ..."`.
fn top_mappings(n: usize) -> String {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return "unknown (no /proc/self/smaps)".into() };
    let mut maps: Vec<(u64, String)> = Vec::new();
    let mut current = String::new();
    for l in smaps.lines() {
        if let Some(kib) = l.strip_prefix("Rss:") {
            let kib = kib.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0);
            maps.push((kib, current.clone()));
        } else if l.split_whitespace().next().is_some_and(|f| f.contains('-') && f.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')) {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = f.get(5..).map(|x| x.join(" ")).filter(|x| !x.is_empty()).unwrap_or_else(|| "[anon]".into());
            current = format!("{} {} {name}", f[0], f.get(1).unwrap_or(&""));
        }
    }
    maps.sort_by_key(|m| std::cmp::Reverse(m.0));
    maps.iter().take(n).map(|(k, m)| format!("{m} {k} KiB")).collect::<Vec<_>>().join(", ")
}

/// `/proc/self/statm`: (virtual size, resident) in pages.
fn statm() -> Result<(u64, u64)> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("read /proc/self/statm")?;
    let mut f = statm.split_whitespace().map(|x| x.parse::<u64>());
    let (Some(Ok(size)), Some(Ok(resident))) = (f.next(), f.next()) else {
        bail!("cannot parse /proc/self/statm: {statm:?}");
    };
    Ok((size, resident))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let me = std::env::var("CPNET_PE").unwrap_or_else(|_| "?".into());
    let t = Instant::now();
    match run(&cli) {
        Ok(Outcome::Done { me, report }) => {
            for l in report {
                println!("PE {me}: {l}");
            }
            let per = t.elapsed().as_secs_f64() / f64::from(cli.cycles.max(1));
            println!("PE {me}: OK ({} cycles, {:.3} s, {:.1} ms per cycle)", cli.cycles, t.elapsed().as_secs_f64(), per * 1e3);
            ExitCode::SUCCESS
        }
        Ok(Outcome::Skip(why)) => {
            println!("SKIP: {why}");
            if std::env::var("CPNET_REQUIRE_GPU").as_deref() == Ok("1") {
                say("cpnet-cycles: CPNET_REQUIRE_GPU=1 but there is no usable GPU".into());
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(Failure::FirstInit(e)) => {
            say(format!("cpnet-cycles: PE {me}: init failed: {e:#}"));
            ExitCode::from(2)
        }
        Err(Failure::Check(e)) => {
            say(format!("cpnet-cycles: PE {me}: FAILED: {e:#}"));
            ExitCode::from(1)
        }
    }
}

enum Outcome {
    /// Every cycle ran and checked; the summary lines.
    Done { me: i32, report: Vec<String> },
    /// `--gpu` without a GPU.
    Skip(String),
}

enum Failure {
    /// The first init: the job could not start.
    FirstInit(anyhow::Error),
    /// A cycle or the leak check.
    Check(anyhow::Error),
}

/// glibc's threshold for serving an allocation with its own mmap, fixed
/// (see [`fix_malloc_thresholds`]).
const MMAP_THRESHOLD: i32 = 128 * 1024;

/// Fixes glibc's mmap and trim thresholds at their defaults (128 KiB).
/// Left dynamic, glibc raises them (up to 32 and 64 MiB) once a large
/// block is freed, and a thread arena then keeps tens of MiB of freed
/// memory resident that `malloc_trim` does not return (seen with GPU PEs
/// over tcp;ofi_rxm: RSS between 60 and 200 MiB from one cycle to the next
/// with the bytes in use flat). Fixed, RSS follows what is in use.
fn fix_malloc_thresholds() {
    for (param, name) in [(libc::M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD"), (libc::M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD")] {
        // SAFETY: mallopt only sets glibc's allocator parameters.
        if unsafe { libc::mallopt(param, MMAP_THRESHOLD) } != 1 {
            say(format!("cpnet-cycles: mallopt({name}) failed; RSS may include freed memory glibc keeps"));
        }
    }
}

fn run(cli: &Cli) -> std::result::Result<Outcome, Failure> {
    fix_malloc_thresholds();
    let mut log = Log::new(cli, Sample::take().map_err(Failure::FirstInit)?);
    let mut me = -1;
    let mut gpu_image = None;
    for c in 0..cli.cycles {
        if cli.leave_after == Some(c) && me == cli.leaver {
            leave(cli, me, c);
        }
        let r = if cli.gpu { gpu_cycle(c, &mut gpu_image) } else { cpu_cycle(c, cli) };
        match r {
            Ok(pe) => me = pe,
            Err(CycleError::NoGpu(why)) => return Ok(Outcome::Skip(why)),
            Err(CycleError::Init(e)) if c == 0 => return Err(Failure::FirstInit(e)),
            Err(CycleError::Init(e) | CycleError::Other(e)) => {
                return Err(Failure::Check(e.context(format!("cycle {} of {}", c + 1, cli.cycles))));
            }
        }
        let s = Sample::take().map_err(Failure::Check)?;
        if cli.verbose {
            println!("PE {me}: cycle {}: {}", c + 1, s.counts.line());
        }
        log.add(s);
    }
    let report = log.check(cli).map_err(Failure::Check)?;
    Ok(Outcome::Done { me, report })
}

/// `--leave-after`: end this process between cycles, as asked.
fn leave(cli: &Cli, me: i32, done: u32) -> ! {
    println!("PE {me}: leaving after {done} cycles ({})", cli.leave_by);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    if cli.leave_by == "kill" {
        // SAFETY: raise has no memory-safety preconditions; SIGKILL ends
        // the process here.
        unsafe { libc::raise(libc::SIGKILL) };
    }
    std::process::exit(0)
}

/// The samples of a run: every cycle's counts (preallocated), and the few
/// full samples the report needs.
struct Log {
    warmup: usize,
    before: Sample,
    counts: Vec<Counts>,
    first: Option<Sample>,
    warm: Option<Sample>,
    last: Option<Sample>,
    /// The first sample after the warm-up with more fds than `warm`.
    more_fds: Option<(usize, Sample)>,
    /// The first sample after the warm-up with more /dev/shm files.
    more_shm: Option<(usize, Sample)>,
}

impl Log {
    fn new(cli: &Cli, before: Sample) -> Log {
        Log {
            warmup: cli.warmup as usize,
            before,
            counts: Vec::with_capacity(cli.cycles as usize),
            first: None,
            warm: None,
            last: None,
            more_fds: None,
            more_shm: None,
        }
    }

    fn add(&mut self, s: Sample) {
        self.counts.push(s.counts);
        let c = self.counts.len();
        if c == 1 {
            self.first = Some(s.clone());
        }
        if c == self.warmup {
            self.warm = Some(s.clone());
        }
        if let Some(w) = &self.warm
            && c > self.warmup
        {
            if self.more_fds.is_none() && s.counts.fds > w.counts.fds {
                self.more_fds = Some((c, s.clone()));
            }
            if self.more_shm.is_none() && s.counts.shm > w.counts.shm {
                self.more_shm = Some((c, s.clone()));
            }
        }
        self.last = Some(s);
    }

    /// The summary, or why the samples after the warm-up grew.
    fn check(&self, cli: &Cli) -> Result<Vec<String>> {
        let (Some(first), Some(last)) = (&self.first, &self.last) else { return Ok(vec!["no cycles".into()]) };
        let n = self.counts.len();
        let (first, last) = (first.counts, last.counts);
        let mut report = vec![format!("before init: {}", self.before.counts.line()), format!("cycle 1: {}", first.line())];
        let Some(warm) = self.warm.as_ref().filter(|_| n > self.warmup && self.warmup > 0) else {
            report.push(format!("cycle {n}: {}", last.line()));
            report.push(format!("growth not checked: {n} cycles are not more than the warm-up of {}", self.warmup));
            return Ok(report);
        };
        let w = self.warmup;
        let after = &self.counts[w..];
        let warm_c = warm.counts;
        report.push(format!("cycle {w} (end of warm-up): {}", warm_c.line()));
        report.push(format!("cycle {n}: {}", last.line()));
        let max_rss = after.iter().map(|s| s.rss_kib).max().unwrap_or(0);
        let growth = last.rss_kib.saturating_sub(warm_c.rss_kib);
        let malloc_growth = last.malloc_kib as f64 - warm_c.malloc_kib as f64;
        report.push(format!(
            "after the warm-up ({} cycles): RSS {} -> {} KiB (growth {growth} KiB, max {max_rss} KiB, bound {} KiB; \
             untrimmed {} -> {} KiB); malloc in use {} -> {} KiB ({:.2} KiB per cycle, bound {} KiB); fds {} -> {}; \
             threads {} -> {}; /dev/shm files {} -> {}",
            n - w,
            warm_c.rss_kib,
            last.rss_kib,
            cli.rss_bound_kib,
            warm_c.raw_rss_kib,
            last.raw_rss_kib,
            warm_c.malloc_kib,
            last.malloc_kib,
            malloc_growth / (n - w) as f64,
            cli.malloc_bound_kib,
            warm_c.fds,
            last.fds,
            warm_c.threads,
            last.threads,
            warm_c.shm,
            last.shm
        ));
        let mut fails = Vec::new();
        let malloc_up = last.malloc_kib.saturating_sub(warm_c.malloc_kib);
        if malloc_up > cli.malloc_bound_kib {
            fails.push(format!(
                "malloc in use grew by {malloc_up} KiB from cycle {w} ({} KiB) to cycle {n} ({} KiB), more than the bound \
                 of {} KiB: a leak",
                warm_c.malloc_kib, last.malloc_kib, cli.malloc_bound_kib
            ));
        }
        if growth > cli.rss_bound_kib {
            fails.push(format!(
                "RSS grew by {growth} KiB from cycle {w} ({} KiB) to cycle {n} ({} KiB), more than the bound of {} KiB \
                 (largest resident mappings now: {})",
                warm_c.rss_kib,
                last.rss_kib,
                cli.rss_bound_kib,
                top_mappings(6)
            ));
        }
        if let Some((c, s)) = &self.more_fds {
            let had: BTreeSet<&(u32, String)> = warm.fds.iter().collect();
            let new: Vec<String> =
                s.fds.iter().filter(|f| !had.contains(f)).take(16).map(|(n, t)| format!("{n} -> {t}")).collect();
            fails.push(format!(
                "open fds grew from {} after cycle {w} to {} after cycle {c} (new: {})",
                warm_c.fds,
                s.counts.fds,
                new.join(", ")
            ));
        }
        if let Some((i, t)) = after.iter().enumerate().find(|(_, s)| s.threads > warm_c.threads) {
            fails.push(format!("threads grew from {} after cycle {w} to {} after cycle {}", warm_c.threads, t.threads, w + i + 1));
        }
        if let Some((c, s)) = &self.more_shm {
            fails.push(format!(
                "/dev/shm files of this process grew from {} after cycle {w} to {} after cycle {c} ({})",
                warm_c.shm,
                s.counts.shm,
                s.shm.iter().take(8).cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        ensure!(fails.is_empty(), "{}", fails.join("; "));
        Ok(report)
    }
}

enum CycleError {
    NoGpu(String),
    Init(anyhow::Error),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for CycleError {
    fn from(e: anyhow::Error) -> CycleError {
        CycleError::Other(e)
    }
}

impl From<cpnet::pe::Error> for CycleError {
    fn from(e: cpnet::pe::Error) -> CycleError {
        CycleError::Other(e.into())
    }
}

/// Bytes each work-group puts to its right neighbour per cycle.
const LANE: u64 = 8192;

/// The pattern PE `pe`'s work-group `w` puts in cycle `c`.
fn pattern(pe: i32, w: u32, c: u32) -> Vec<u8> {
    (0..LANE).map(|i| (i as u8).wrapping_mul(7) ^ (pe as u8).wrapping_mul(31) ^ (w as u8).wrapping_mul(3) ^ (c as u8)).collect()
}

/// One CPU cycle; returns this PE's number.
fn cpu_cycle(c: u32, cli: &Cli) -> std::result::Result<i32, CycleError> {
    let pe = Pe::init().map_err(|e| CycleError::Init(e.into()))?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let wgs = cli.wgs.max(1);
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let src = pe.shmalloc(LANE * u64::from(wgs))?;
    let inbox = pe.shmalloc(LANE * u64::from(wgs))?;
    let back = pe.shmalloc(LANE * u64::from(wgs))?;
    // Word 0: fetch_add by every work-group of every PE; word 1: a CAS
    // counter, same; word 2: set by the left neighbour.
    let words = pe.shmalloc(64)?;
    let heap = *pe.heap();
    heap.write_bytes(words, &[0u8; 64]).context("clear the counters")?;
    for w in 0..wgs {
        heap.write_bytes(SymAddr(src.0 + u64::from(w) * LANE), &pattern(me, w, c)).context("write the source")?;
    }
    pe.barrier_all()?;
    pe.run_work_groups(wgs, |wg| {
        let w = u64::from(wg.wg());
        let (s, d) = (SymAddr(src.0 + w * LANE), SymAddr(inbox.0 + w * LANE));
        wg.putmem(d, s, LANE, right)?;
        wg.getmem(SymAddr(back.0 + w * LANE), d, LANE, right)?;
        for t in 0..n {
            wg.atomic_fetch_add::<u64>(words, 1, t)?;
            let cas = SymAddr(words.0 + 8);
            let mut cur = wg.atomic_fetch::<u64>(cas, t)?;
            loop {
                let old = wg.atomic_compare_swap::<u64>(cas, cur, cur + 1, t)?;
                if old == cur {
                    break;
                }
                cur = old;
            }
        }
        if w == 0 {
            wg.atomic_set::<u64>(SymAddr(words.0 + 16), u64::from(c) << 32 | me as u64, right)?;
        }
        wg.quiet()
    })?;
    // A barrier through the proxy (fabric), then one through the rendezvous.
    pe.with_ctx(0, |wg| wg.barrier_all())?;
    pe.barrier_all()?;
    let k = u64::from(wgs) * n as u64;
    for w in 0..wgs {
        let mut got = vec![0u8; LANE as usize];
        heap.read_bytes(SymAddr(inbox.0 + u64::from(w) * LANE), &mut got).context("read the inbox")?;
        check_eq(&got, &pattern(left, w, c), || format!("PE {me} wg {w}: data put by PE {left}")).map_err(anyhow::Error::msg)?;
        heap.read_bytes(SymAddr(back.0 + u64::from(w) * LANE), &mut got).context("read back")?;
        check_eq(&got, &pattern(me, w, c), || format!("PE {me} wg {w}: data read back from PE {right}")).map_err(anyhow::Error::msg)?;
    }
    let mut word = [0u8; 8];
    for (i, want) in [(0u64, k), (8, k), (16, u64::from(c) << 32 | left as u64)] {
        heap.read_bytes(SymAddr(words.0 + i), &mut word).context("read the counters")?;
        let got = u64::from_le_bytes(word);
        if got != want {
            return Err(anyhow::anyhow!("PE {me}: counter word {} is {got:#x}, expected {want:#x}", i / 8).into());
        }
    }
    for a in [words, back, inbox, src] {
        pe.shfree(a)?;
    }
    pe.finalize().context("finalize")?;
    Ok(me)
}

/// One GPU cycle: `cpnet_tests::gpu::BARRIER` (puts, adds and barriers
/// from the GPU), checked; the kernel image is compiled in the first cycle
/// and loaded into each cycle's context. Returns this PE's number.
fn gpu_cycle(c: u32, image: &mut Option<cudarc::nvrtc::Ptx>) -> std::result::Result<i32, CycleError> {
    use cpnet_tests::gpu::{self, BARRIER_BYTES, LOG_WORDS};
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let pe = match GpuPe::init() {
        Ok(pe) => pe,
        Err(cpnet::pe::Error::Gpu(e @ (GpuError::NoDriver | GpuError::NoDevice { .. }))) => {
            return Err(CycleError::NoGpu(e.to_string()));
        }
        Err(e) => return Err(CycleError::Init(e.into())),
    };
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let nn = n as u64;
    let src = gpu::source(gpu::BARRIER);
    if image.is_none() {
        let (major, minor) = pe.cuda().compute_capability().map_err(|e| anyhow::anyhow!("compute capability: {e:?}"))?;
        let opts = cpnet::device::nvrtc::BuildOptions {
            name: "barrier.cu".into(),
            ..cpnet::device::nvrtc::BuildOptions::for_compute_capability(major as u32, minor as u32)
        };
        *image = Some(cpnet::device::nvrtc::compile_kernel(&src, &opts).map_err(anyhow::Error::from)?);
    }
    let module = pe
        .cuda()
        .load_module(image.clone().expect("compiled above"))
        .map_err(|e| anyhow::anyhow!("cuModuleLoadData: {e:?}"))?;
    let func = module.load_function("barrier").context("load kernel barrier")?;
    let rounds: u32 = 3;
    let slots = pe.shmalloc(8 * nn)?;
    let ctr = pe.shmalloc(8)?;
    let data = pe.shmalloc(nn * BARRIER_BYTES)?;
    let bsrc = pe.shmalloc(BARRIER_BYTES)?;
    let logs = pe.shmalloc(LOG_WORDS as u64 * 8)?;
    // The heap is zeroed at init only: clear what an earlier use of it holds.
    pe.write_heap(slots, &vec![0; 8 * nn as usize])?;
    pe.write_heap(ctr, &[0; 8])?;
    pe.write_heap(logs, &vec![0; LOG_WORDS * 8])?;
    pe.barrier_all()?;
    let h = pe.handle();
    let (p_slots, p_ctr, p_data, p_bsrc, p_logs) =
        (pe.dev_ptr(slots), pe.dev_ptr(ctr), pe.dev_ptr(data), pe.dev_ptr(bsrc), pe.dev_ptr(logs));
    let mut b = pe.stream().launch_builder(&func);
    b.arg(&h).arg(&p_slots).arg(&p_ctr).arg(&p_data).arg(&p_bsrc).arg(&p_logs).arg(&rounds);
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: the arguments match `barrier` in cpnet_tests::gpu::BARRIER
    // (handle, five heap pointers, rounds); one block (the device barrier
    // counts one work-group per PE); synchronized below, before the heap
    // and the module are freed.
    unsafe { b.launch(cfg) }.context("launch barrier")?;
    pe.synchronize()?;
    pe.barrier_all()?;
    let mut words = vec![0u8; LOG_WORDS * 8];
    pe.read_heap(logs, &mut words)?;
    let words: Vec<u64> = words.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect();
    gpu::check_logs(&words, 1, &src, &format!("PE {me} cycle {}", c + 1)).map_err(anyhow::Error::msg)?;
    let mut w = [0u8; 8];
    pe.read_heap(ctr, &mut w)?;
    let r = u64::from(rounds);
    if u64::from_le_bytes(w) != r * nn {
        return Err(anyhow::anyhow!("PE {me}: counter {} after {rounds} rounds, expected {}", u64::from_le_bytes(w), r * nn).into());
    }
    let mut got = vec![0u8; (nn * BARRIER_BYTES) as usize];
    pe.read_heap(data, &mut got)?;
    for s in 0..n {
        let at = (s as u64 * BARRIER_BYTES) as usize;
        check_eq(&got[at..at + BARRIER_BYTES as usize], &gpu::pattern(s as u32, 0, rounds, BARRIER_BYTES), || {
            format!("PE {me}: bytes from PE {s}")
        })
        .map_err(anyhow::Error::msg)?;
    }
    for a in [logs, bsrc, data, ctr, slots] {
        pe.shfree(a)?;
    }
    drop(func);
    drop(module);
    pe.finalize().context("finalize")?;
    Ok(me)
}
