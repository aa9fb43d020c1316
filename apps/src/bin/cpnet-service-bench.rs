//! `cpnet-service-bench`: the command queue's service time and command rate
//! with CPU work-groups on one PE (the CPU-only shape of the paper's Fig. 4b
//! and Fig. 8b), and the CPU time the proxy threads use, busy and idle.
//!
//! ```text
//! cpnet-service-bench --threads 1,2,4 --wgs 1,2,4,8,16 --iters 20000 \
//!     --csv docs/data/cpu/fig4-service.csv --cost-csv docs/data/cpu/proxy-cost.csv
//! ```
//!
//! One PE (run it alone or under `cpnet-run -n 1`). For each proxy thread
//! count in `--threads`, one PE is initialized with that many proxy threads
//! (the other tuning comes from the `CPNET_*` variables, e.g.
//! `CPNET_PROXY_IDLE_SLEEP`); first it stays idle for `--idle-secs` (no
//! commands) while the proxy threads' CPU time is measured; then for each
//! work-group count in `--wgs`, that many CPU work-groups each issue
//! `--iters` blocking no-ops (`ctx.nop()`: one round trip through the queue
//! and a proxy thread), after a short warm-up and a common start, `--reps`
//! times; the run with the median rate is reported. Reported per
//! configuration: the service time (each work-group's mean round trip, i.e.
//! the time from the common start to its last completion over `--iters`,
//! microseconds; the median over work-groups, with the smallest and
//! largest) and the aggregate rate (all commands over the time from the
//! common start to the last work-group's end, millions per second). With
//! more threads (work-groups + proxy threads) than cores the OS time-slices
//! them, and both numbers show it. The
//! proxy threads' CPU time is measured over the whole work-group sweep of a
//! thread count. The PE is finalized before the next thread count.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use clap::Parser;
use cpnet::Pe;
use cpnet::env::{Launch, Tuning};
use cpnet_apps::figure_csv::{COST_HEADER, SERVICE_HEADER, open_append};
use cpnet_apps::proxy_cpu::Meter;

#[derive(Parser)]
#[command(
    about = "Queue service time and command rate with CPU work-groups on one PE, and the proxy threads' CPU time"
)]
struct Cli {
    /// Proxy service thread counts, one PE each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    threads: Vec<usize>,
    /// Work-group counts (each at most CPNET_QUEUES).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    wgs: Vec<u32>,
    /// Blocking no-ops per work-group per configuration.
    #[arg(long, default_value_t = 20_000)]
    iters: u64,
    /// Runs per configuration; the one with the median rate is reported
    /// (time-slicing on a machine with few cores makes single runs noisy).
    #[arg(long, default_value_t = 3)]
    reps: u32,
    /// Idle period per PE for the idle proxy CPU time, seconds (0: skip).
    #[arg(long, default_value_t = 1.0)]
    idle_secs: f64,
    /// Append rows to this CSV (fig4-service.csv schema, queue_mem=cpu).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Append rows to this CSV (proxy-cost.csv schema, source=cpu).
    #[arg(long)]
    cost_csv: Option<PathBuf>,
}

/// Appends `rows` to the CSV at `path` (`header` first when the file is
/// new or empty).
fn append_csv(path: &Path, header: &str, rows: &[String]) -> Result<()> {
    let mut f = open_append(path, header)?;
    for r in rows {
        writeln!(f, "{r}").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One configuration's result.
struct Point {
    /// Median over work-groups of each one's mean round trip, µs.
    rt_us: f64,
    /// Smallest and largest per-work-group mean round trip, µs.
    rt_range_us: (f64, f64),
    /// All commands / time from the common start to the last end, Mops/s.
    rate_mops: f64,
    /// That time, seconds.
    wall_s: f64,
}

/// Runs `wgs` work-groups of `iters` blocking no-ops each. A work-group's
/// mean round trip is the time from the common start (the first
/// work-group through the start barrier) to its last completion, over
/// `iters`: a work-group that the OS runs later than the others (more
/// threads than cores) counts that delay as service time; the rate is then
/// `wgs / largest round trip`.
fn run_point(pe: &Pe, wgs: u32, iters: u64) -> Result<Point> {
    let warm = (iters / 20).clamp(10, 1000);
    let start = Barrier::new(wgs as usize);
    let spans: Mutex<Vec<(Instant, Instant)>> = Mutex::new(Vec::new());
    pe.run_work_groups(wgs, |ctx| {
        for _ in 0..warm {
            ctx.nop()?;
        }
        start.wait();
        let t0 = Instant::now();
        for _ in 0..iters {
            ctx.nop()?;
        }
        let t1 = Instant::now();
        spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((t0, t1));
        Ok(())
    })?;
    let spans = spans
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    ensure!(
        spans.len() == wgs as usize,
        "{} of {wgs} work-groups reported",
        spans.len()
    );
    let first = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one work-group");
    let mut rts: Vec<f64> = spans
        .iter()
        .map(|s| s.1.duration_since(first).as_secs_f64() * 1e6 / iters as f64)
        .collect();
    rts.sort_by(f64::total_cmp);
    let wall_s = rts[rts.len() - 1] * iters as f64 / 1e6;
    let rt_us = rts[rts.len() / 2];
    let rate_mops = (u64::from(wgs) * iters) as f64 / wall_s.max(1e-9) / 1e6;
    Ok(Point {
        rt_us,
        rt_range_us: (rts[0], rts[rts.len() - 1]),
        rate_mops,
        wall_s,
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    ensure!(
        cli.iters > 0 && cli.reps > 0,
        "--iters and --reps must be > 0"
    );
    ensure!(
        !cli.threads.is_empty() && !cli.wgs.is_empty(),
        "--threads and --wgs need at least one value"
    );
    ensure!(
        cli.idle_secs.is_finite() && cli.idle_secs >= 0.0,
        "--idle-secs must be >= 0"
    );
    let launch = Launch::from_env()?;
    ensure!(
        launch.n_pes == 1,
        "cpnet-service-bench is one PE: run it alone or under cpnet-run -n 1 (this job has {} PEs)",
        launch.n_pes
    );
    let base = Tuning::from_env()?;
    for &w in &cli.wgs {
        ensure!(
            w >= 1 && w as usize <= base.queues,
            "--wgs {w}: must be 1..={} (CPNET_QUEUES)",
            base.queues
        );
    }
    for &t in &cli.threads {
        ensure!(
            (1..=cpnet::env::MAX_PROXY_THREADS).contains(&t),
            "--threads {t}: must be 1..={}",
            cpnet::env::MAX_PROXY_THREADS
        );
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "# cpnet-service-bench: 1 PE, CPU work-groups, blocking no-ops, {} per work-group, median-rate run of {}; {} CPU core(s); queue depth {}",
        cli.iters, cli.reps, cores, base.queue_depth
    );
    println!(
        "{:>8} {:>4} {:>10} {:>12} {:>20} {:>12} {:>8}",
        "threads", "wgs", "commands", "rt med(us)", "rt min..max(us)", "rate(Mops)", "wall(s)"
    );
    let mut service_rows = Vec::new();
    let mut cost_rows = Vec::new();
    let mut summaries = Vec::new();
    for &threads in &cli.threads {
        let tuning = Tuning {
            proxy_threads: threads,
            ..base.clone()
        };
        let pe = Pe::init_with(launch.clone(), tuning)
            .with_context(|| format!("initializing a PE with {threads} proxy thread(s)"))?;
        let idle = if cli.idle_secs > 0.0 {
            let m = Meter::start()?;
            std::thread::sleep(Duration::from_secs_f64(cli.idle_secs));
            let u = m.stop()?;
            ensure!(
                u.threads == threads,
                "found {} cpnet-proxy-* thread(s), expected {threads}",
                u.threads
            );
            cost_rows.push(format!(
                "cpu,{threads},idle,0,{:.4},{:.4}",
                u.wall_s, u.cpu_s
            ));
            Some(u)
        } else {
            None
        };
        let busy = Meter::start()?;
        let mut commands = 0u64;
        for &wgs in &cli.wgs {
            let mut runs = Vec::new();
            for _ in 0..cli.reps {
                runs.push(run_point(&pe, wgs, cli.iters)?);
            }
            runs.sort_by(|a, b| a.rate_mops.total_cmp(&b.rate_mops));
            let p = runs.swap_remove(runs.len() / 2);
            commands += u64::from(wgs) * cli.iters * u64::from(cli.reps);
            println!(
                "{:>8} {:>4} {:>10} {:>12.3} {:>20} {:>12.3} {:>8.3}",
                threads,
                wgs,
                u64::from(wgs) * cli.iters,
                p.rt_us,
                format!("{:.3}..{:.3}", p.rt_range_us.0, p.rt_range_us.1),
                p.rate_mops,
                p.wall_s
            );
            service_rows.push(format!(
                "cpu,{wgs},{threads},{},{:.4},{:.4}",
                cli.iters, p.rt_us, p.rate_mops
            ));
        }
        let b = busy.stop()?;
        cost_rows.push(format!(
            "cpu,{threads},busy,{commands},{:.4},{:.4}",
            b.wall_s, b.cpu_s
        ));
        summaries.push((threads, idle, b, commands));
        pe.finalize()?;
    }
    println!("# proxy threads' CPU time (user + system, /proc/self/task/*/stat):");
    for (threads, idle, b, commands) in &summaries {
        let idle = idle.map_or_else(
            || "idle not measured".to_owned(),
            |u| {
                format!(
                    "idle {:.3} CPU s in {:.3} s = {:.2} cores",
                    u.cpu_s,
                    u.wall_s,
                    u.cores()
                )
            },
        );
        println!(
            "#   {threads} thread(s): {idle}; busy {:.3} CPU s in {:.3} s = {:.2} cores, {:.3} CPU s per million commands",
            b.cpu_s,
            b.wall_s,
            b.cores(),
            b.cpu_s / (*commands as f64 / 1e6)
        );
    }
    if let Some(path) = &cli.csv {
        append_csv(path, SERVICE_HEADER, &service_rows)?;
        println!(
            "# appended {} row(s) to {}",
            service_rows.len(),
            path.display()
        );
    }
    if let Some(path) = &cli.cost_csv {
        append_csv(path, COST_HEADER, &cost_rows)?;
        println!(
            "# appended {} row(s) to {}",
            cost_rows.len(),
            path.display()
        );
    }
    Ok(())
}
