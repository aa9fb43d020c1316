//! The CSV files the benchmarks append for the figures (docs/figures.md
//! "CSV schemas"; `cpnet-plot` reads them).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

/// Header of `fig4-service.csv`: queue service time (µs) and command rate
/// (M commands/s) per queue placement, work-groups and proxy threads.
pub const SERVICE_HEADER: &str = "queue_mem,wgs,threads,iters,rt_us,rate_mops";

/// Header of `proxy-cost.csv`: CPU seconds of the proxy threads, busy or idle.
pub const COST_HEADER: &str = "source,threads,state,commands,wall_s,proxy_cpu_s";

/// `path` opened for appending (its directory created if missing), with
/// `header` written first when the file is new or empty.
///
/// # Errors
/// Creating the directory, opening or writing the file.
pub fn open_append(path: &Path, header: &str) -> Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if f.metadata().map(|m| m.len() == 0).unwrap_or(true) {
        writeln!(f, "{header}").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(f)
}
