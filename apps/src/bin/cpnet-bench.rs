//! `cpnet-bench`: point-to-point microbenchmarks between PE 0 and PE 1 from
//! CPU work-groups, through the queue, the proxy and the libfabric provider.
//!
//! ```text
//! cpnet-run -n 2 -- cpnet-bench                          # shm (one host)
//! CPNET_PROVIDER='tcp;ofi_rxm' cpnet-run -n 2 -- cpnet-bench
//! ```
//!
//! Prints, like the OSU/OpenSHMEM benchmarks, one row per size:
//! blocking put latency, blocking get latency (median and mean of `iters`
//! round trips, microseconds) and put bandwidth (MB/s, 10^6 bytes/s); then
//! AMO latency and the message rate of 8-byte `putmem_nbi` (Mops/s) with 1
//! and several work-groups. PE 1 only serves (its proxy progresses).
//!
//! First, the provider's own floor on the same two PEs, provider and
//! endpoint type (`cpnet_apps::floor`: raw libfabric through the crate's
//! safe layer, endpoints of their own), printed as `# floor:` lines next to
//! the cpnet numbers they bound: the 8-byte write ping-pong's one-way
//! latency before the latency table, the 8-byte write rates before the
//! message rates, and the provider's message ping-pong and two-way
//! exchange (`fi_send` into posted `fi_recv`s, both PEs sending at once) at
//! 8 B, 4 KiB and 16 KiB. `--floor-iters 0` leaves it out.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use clap::Parser;
use cpnet::Pe;
use cpnet::device::cpu::SymAddr;
use cpnet_apps::floor;

#[derive(Parser)]
#[command(about = "cpnet point-to-point microbenchmarks (run under cpnet-run -n 2)")]
struct Cli {
    /// Smallest message, bytes.
    #[arg(long, default_value_t = 8)]
    min: u64,
    /// Largest message, bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max: u64,
    /// Round trips per size for small messages (fewer for large ones).
    #[arg(long, default_value_t = 2000)]
    iters: u64,
    /// 8-byte nbi puts per work-group in the message-rate test.
    #[arg(long, default_value_t = 200_000)]
    rate_msgs: u64,
    /// Work-group counts for the message-rate test.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    rate_wgs: Vec<u32>,
    /// Ping-pongs of the raw libfabric floor (0: no floor).
    #[arg(long, default_value_t = 10_000)]
    floor_iters: u64,
    /// 8-byte writes per rate loop of the raw libfabric floor.
    #[arg(long, default_value_t = 400_000)]
    floor_msgs: u64,
    /// Print CSV instead of a table.
    #[arg(long)]
    csv: bool,
    /// Wake-up test: 8-byte blocking puts, each after this many
    /// milliseconds without any operation (long enough for the proxies to
    /// go idle and, with `CPNET_PROXY_IDLE=park`, to sleep: they do after
    /// 5 ms); 0 (the default) skips it.
    #[arg(long, default_value_t = 0)]
    wake_gap_ms: u64,
    /// Puts of the wake-up test.
    #[arg(long, default_value_t = 200)]
    wake_iters: u64,
    /// Only the wake-up test (with --wake-gap-ms).
    #[arg(long)]
    wake_only: bool,
}

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let med = v[v.len() / 2].as_secs_f64() * 1e6;
    let mean = v.iter().map(Duration::as_secs_f64).sum::<f64>() / v.len() as f64 * 1e6;
    (med, mean)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let pe = Pe::init()?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    ensure!(n >= 2, "cpnet-bench needs 2 PEs (cpnet-run -n 2 -- cpnet-bench)");
    let max = cli.max.next_power_of_two();
    let buf = pe.shmalloc(max)?;
    let dst = pe.shmalloc(max)?;
    let words = pe.shmalloc(64 * 64)?;
    pe.heap().write_bytes(buf, &vec![0x5a; max as usize])?;
    let floor = if cli.floor_iters > 0 { floor::measure(&pe, cli.floor_iters, cli.floor_msgs)? } else { None };
    let msg_rounds = (cli.floor_iters / 5).max(1);
    let msg_floor = if cli.floor_iters > 0 { floor::messages(&pe, &[8, 4096, 16384], msg_rounds)? } else { None };
    pe.barrier_all()?;
    if me == 0 {
        println!(
            "# cpnet-bench: PE 0 -> PE 1, provider {}, {} PEs, CPU work-groups",
            pe.provider(),
            n
        );
        if let Some(f) = &floor {
            println!(
                "# floor: raw libfabric {} 8 B write ping-pong one-way {:.2} us (median of {} round trips / 2)",
                f.provider, f.pingpong_us, cli.floor_iters
            );
        }
        for m in msg_floor.iter().flatten() {
            println!(
                "# floor: raw libfabric fi_send/fi_recv {} B: ping-pong one-way {:.2} us, two-way exchange {:.2} us per round (means of {} rounds)",
                m.size,
                m.one_way_us,
                m.exchange_us,
                msg_rounds
            );
        }
        if cli.csv {
            println!("size_bytes,put_lat_us_median,put_lat_us_mean,get_lat_us_median,get_lat_us_mean,put_bw_MBps");
        } else {
            println!(
                "{:>10} {:>14} {:>12} {:>14} {:>12} {:>12}",
                "size(B)", "put med(us)", "put avg(us)", "get med(us)", "get avg(us)", "put MB/s"
            );
        }
        if cli.wake_gap_ms > 0 {
            let gap = Duration::from_millis(cli.wake_gap_ms);
            let lat = pe.with_ctx(0, |wg| {
                let mut v = Vec::with_capacity(cli.wake_iters as usize);
                for _ in 0..cli.wake_iters {
                    std::thread::sleep(gap);
                    let t = Instant::now();
                    wg.putmem(dst, buf, 8, 1)?;
                    v.push(t.elapsed());
                }
                Ok(v)
            })?;
            let (med, mean) = stats(lat);
            println!(
                "# wake-up: 8-byte blocking put after {} ms idle: {med:.2} us median, {mean:.2} us mean ({} puts)",
                cli.wake_gap_ms, cli.wake_iters
            );
        }
        let mut size = if cli.wake_only { max + 1 } else { cli.min.max(1) };
        while size <= max {
            let iters = cli.iters.min((256 << 20) / size).max(20);
            let warm = (iters / 10).max(2);
            let (put, get, bw) = pe.with_ctx(0, |wg| {
                let mut put = Vec::with_capacity(iters as usize);
                let mut get = Vec::with_capacity(iters as usize);
                for i in 0..iters + warm {
                    let t = Instant::now();
                    wg.putmem(dst, buf, size, 1)?;
                    if i >= warm {
                        put.push(t.elapsed());
                    }
                }
                for i in 0..iters + warm {
                    let t = Instant::now();
                    wg.getmem(dst, buf, size, 1)?;
                    if i >= warm {
                        get.push(t.elapsed());
                    }
                }
                // Bandwidth: a window of nbi puts, then quiet.
                let window = 64u64;
                let reps = (iters / window).max(1);
                let t = Instant::now();
                for _ in 0..reps {
                    for _ in 0..window {
                        wg.putmem_nbi(dst, buf, size, 1)?;
                    }
                    wg.quiet()?;
                }
                let bw = (reps * window * size) as f64 / t.elapsed().as_secs_f64() / 1e6;
                Ok((put, get, bw))
            })?;
            let (pm, pa) = stats(put);
            let (gm, ga) = stats(get);
            if cli.csv {
                println!("{size},{pm:.2},{pa:.2},{gm:.2},{ga:.2},{bw:.1}");
            } else {
                println!("{size:>10} {pm:>14.2} {pa:>12.2} {gm:>14.2} {ga:>12.2} {bw:>12.1}");
            }
            size *= 2;
        }
        if cli.wake_only {
            pe.barrier_all()?;
            pe.finalize()?;
            return Ok(());
        }
        // AMO latency.
        let amo = pe.with_ctx(0, |wg| {
            let mut fadd = Vec::new();
            let mut cswap = Vec::new();
            let mut add_quiet = Vec::new();
            for i in 0..cli.iters + 100 {
                let t = Instant::now();
                wg.atomic_fetch_add::<u64>(words, 1, 1)?;
                let a = t.elapsed();
                let t = Instant::now();
                wg.atomic_compare_swap::<u64>(SymAddr(words.0 + 8), i, i + 1, 1)?;
                let b = t.elapsed();
                let t = Instant::now();
                wg.atomic_add::<u64>(SymAddr(words.0 + 16), 1, 1)?;
                wg.quiet()?;
                let c = t.elapsed();
                if i >= 100 {
                    fadd.push(a);
                    cswap.push(b);
                    add_quiet.push(c);
                }
            }
            Ok((stats(fadd), stats(cswap), stats(add_quiet)))
        })?;
        println!(
            "# AMO latency (us, median / mean): fetch_add u64 {:.2} / {:.2}, compare_swap u64 {:.2} / {:.2}, add + quiet {:.2} / {:.2}",
            amo.0.0, amo.0.1, amo.1.0, amo.1.1, amo.2.0, amo.2.1
        );
        // Message rate of 8-byte nbi puts, after the provider's.
        if let Some(f) = &floor {
            let order = if f.rma_raw { "FI_ORDER_RMA_RAW" } else { "no FI_ORDER_RMA_RAW" };
            match f.inject_rate {
                Some(r) => println!(
                    "# floor: raw libfabric {} 8-byte write rate {r:.3} M/s (fi_inject_write x {}, then one fi_read; {order})",
                    f.provider, cli.floor_msgs
                ),
                None => println!("# floor: raw libfabric {} injects nothing (inject_size 0)", f.provider),
            }
            println!(
                "# floor: raw libfabric {} 8-byte write rate {:.3} M/s (fi_write, {} in flight, a completion each)",
                f.provider,
                f.write_rate,
                floor::WINDOW
            );
            println!(
                "# floor: raw libfabric {} 8-byte write rate {:.3} M/s (fi_writemsg FI_DELIVERY_COMPLETE, {} in flight)",
                f.provider,
                f.write_dc_rate,
                floor::WINDOW
            );
        }
        for &wgs in &cli.rate_wgs {
            let t = Instant::now();
            pe.run_work_groups(wgs, |wg| {
                let w = u64::from(wg.wg());
                for i in 0..cli.rate_msgs {
                    wg.putmem_nbi(SymAddr(words.0 + 64 * (w % 64)), SymAddr(buf.0 + 8 * (i % 64)), 8, 1)?;
                }
                wg.quiet()
            })?;
            let dt = t.elapsed().as_secs_f64();
            println!(
                "# message rate, 8-byte putmem_nbi, {wgs} work-group(s): {:.3} Mops/s ({} puts in {:.3} s)",
                (u64::from(wgs) * cli.rate_msgs) as f64 / dt / 1e6,
                u64::from(wgs) * cli.rate_msgs,
                dt
            );
        }
    }
    pe.barrier_all()?;
    pe.finalize()?;
    Ok(())
}
