//! CPU time used by this process's proxy service threads, read from Linux's
//! `/proc`: what the proxy costs the host, busy or idle (the `proxy-cost.csv`
//! data of `docs/figures.md`).
//!
//! The runtime names each proxy thread `cpnet-proxy-<t>` (CPU and GPU PEs
//! alike); [`sample`] finds them in `/proc/self/task/*/comm` and adds up
//! their user and system time from `/proc/self/task/<tid>/stat` (fields 14
//! and 15, in clock ticks of `sysconf(_SC_CLK_TCK)`, usually 10 ms: measure
//! over a second or more). [`Meter`] takes a sample at its start and one at
//! its end and reports the difference with the wall time between:
//!
//! ```no_run
//! let m = cpnet_apps::proxy_cpu::Meter::start()?;
//! // ... run commands, or sleep to measure an idle PE ...
//! let used = m.stop()?;
//! println!("{} proxy threads used {:.3} CPU s in {:.3} s", used.threads, used.cpu_s, used.wall_s);
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! A thread that exits between the two samples loses its time since the
//! first: measure while the PE is up (before `finalize`). On systems
//! without `/proc` the functions return an error.

use std::collections::BTreeMap;
use std::io;
use std::time::Instant;

/// The name prefix of the runtime's proxy service threads (`cpnet-proxy-0`, ...).
pub const PROXY_THREAD_PREFIX: &str = "cpnet-proxy-";

/// CPU time of the proxy threads alive at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Thread id → user + system CPU time since the thread started, seconds.
    pub per_thread_s: BTreeMap<u32, f64>,
}

impl Sample {
    /// Number of proxy threads seen.
    pub fn threads(&self) -> usize {
        self.per_thread_s.len()
    }

    /// Their total CPU time since they started, seconds.
    pub fn total_s(&self) -> f64 {
        self.per_thread_s.values().sum()
    }

    /// CPU seconds used from `earlier` to `self`: per thread, its time now
    /// minus its time then (a thread new since `earlier` counts in full).
    pub fn since(&self, earlier: &Sample) -> f64 {
        self.per_thread_s
            .iter()
            .map(|(tid, now)| now - earlier.per_thread_s.get(tid).copied().unwrap_or(0.0))
            .sum()
    }
}

/// Clock ticks per second of the `utime`/`stime` fields (`_SC_CLK_TCK`).
pub fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf only reads a configuration value; no pointers.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// User + system time in clock ticks from the text of a `/proc/.../stat`
/// file: fields 14 and 15, counted after the `)` that ends the command
/// name (which may itself hold spaces or parentheses).
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The CPU time of every thread of this process whose name starts with
/// `prefix`.
///
/// # Errors
/// `/proc/self/task` cannot be listed (not Linux). Threads that exit while
/// being read are skipped.
pub fn sample_prefix(prefix: &str) -> io::Result<Sample> {
    let tick = clock_ticks_per_s();
    let mut per_thread_s = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task")? {
        let Ok(e) = e else { continue };
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) else {
            continue;
        };
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        if let Some(ticks) = parse_stat_ticks(&stat) {
            per_thread_s.insert(tid, ticks as f64 / tick);
        }
    }
    Ok(Sample { per_thread_s })
}

/// The CPU time of this process's proxy threads ([`PROXY_THREAD_PREFIX`]).
///
/// # Errors
/// As [`sample_prefix`].
pub fn sample() -> io::Result<Sample> {
    sample_prefix(PROXY_THREAD_PREFIX)
}

/// What the proxy threads used over a [`Meter`]'s interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Wall time of the interval, seconds.
    pub wall_s: f64,
    /// User + system CPU time of the proxy threads in it, seconds.
    pub cpu_s: f64,
    /// Proxy threads seen at the end.
    pub threads: usize,
}

impl Usage {
    /// CPU cores kept busy on average: `cpu_s / wall_s`.
    pub fn cores(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.cpu_s / self.wall_s
        } else {
            0.0
        }
    }
}

/// Measures the proxy threads' CPU time over an interval: [`Meter::start`]
/// samples, [`Meter::stop`] samples again.
#[derive(Debug, Clone)]
pub struct Meter {
    start: Sample,
    t0: Instant,
}

impl Meter {
    /// Samples now.
    ///
    /// # Errors
    /// As [`sample`].
    pub fn start() -> io::Result<Meter> {
        let start = sample()?;
        Ok(Meter {
            start,
            t0: Instant::now(),
        })
    }

    /// Samples again and returns the usage since [`Meter::start`].
    ///
    /// # Errors
    /// As [`sample`].
    pub fn stop(&self) -> io::Result<Usage> {
        let wall_s = self.t0.elapsed().as_secs_f64();
        let end = sample()?;
        Ok(Usage {
            wall_s,
            cpu_s: end.since(&self.start),
            threads: end.threads(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn stat_fields_after_the_name() {
        let s = "1234 (cpnet-proxy-0) R 1 2 3 4 5 6 7 8 9 10 250 40 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat_ticks(s), Some(290));
        let odd = "77 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 3 4 0 0";
        assert_eq!(parse_stat_ticks(odd), Some(7));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn measures_a_spinning_named_thread() {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s2 = std::sync::Arc::clone(&stop);
        let h = std::thread::Builder::new()
            .name("cpnet-pxtest-0".into())
            .spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let a = sample_prefix("cpnet-pxtest-").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let b = sample_prefix("cpnet-pxtest-").unwrap();
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap();
        assert_eq!(b.threads(), 1);
        // A spinning thread gets most of a core even on a loaded 2-core box.
        assert!(b.since(&a) > 0.0, "{:?} -> {:?}", a, b);
        assert_eq!(sample_prefix("no-such-thread-").unwrap().threads(), 0);
    }
}
