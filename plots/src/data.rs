//! The CSV files the benchmarks write and `cpnet-plot` reads, one type per
//! schema.
//!
//! Every file is plain comma-separated text: the first line that is not
//! blank and does not start with `#` is the header and must be exactly the
//! schema's header ([`ServiceRow::HEADER`], ...); every later line that is
//! not blank or a `#` comment is one row with exactly as many fields.
//! Numbers must be finite and not negative. A file that breaks a rule is an
//! error naming the file, the 1-based line and what is wrong.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// A table of one schema: its file name, header and row parser.
pub trait Schema: Sized {
    /// The file name in the data directory, e.g. `fig4-service.csv`.
    const FILE: &'static str;
    /// The header line, exactly.
    const HEADER: &'static str;
    /// One row from its fields (as many as [`Self::HEADER`] names).
    ///
    /// # Errors
    /// A field that is not of its column's type, with the column named.
    fn from_fields(f: &Fields<'_>) -> Result<Self>;
}

/// The fields of one CSV row with the header's column names, for typed
/// access that names the column on error.
pub struct Fields<'a> {
    names: Vec<&'static str>,
    values: Vec<&'a str>,
}

impl Fields<'_> {
    fn raw(&self, i: usize) -> &str {
        self.values[i].trim()
    }

    /// Field `i` as a non-empty string.
    ///
    /// # Errors
    /// The field is empty.
    pub fn text(&self, i: usize) -> Result<String> {
        let v = self.raw(i);
        if v.is_empty() {
            bail!("column {} is empty", self.names[i]);
        }
        Ok(v.to_owned())
    }

    /// Field `i` as one of `allowed`.
    ///
    /// # Errors
    /// Any other value.
    pub fn one_of(&self, i: usize, allowed: &[&str]) -> Result<String> {
        let v = self.raw(i);
        if !allowed.contains(&v) {
            bail!(
                "column {} is {v:?}, expected one of {}",
                self.names[i],
                allowed.join("|")
            );
        }
        Ok(v.to_owned())
    }

    /// Field `i` as an unsigned integer.
    ///
    /// # Errors
    /// Not a non-negative integer.
    pub fn uint(&self, i: usize) -> Result<u64> {
        let v = self.raw(i);
        v.parse::<u64>().with_context(|| {
            format!(
                "column {} is {v:?}, expected a non-negative integer",
                self.names[i]
            )
        })
    }

    /// Field `i` as a finite, non-negative number.
    ///
    /// # Errors
    /// Not a number, negative, NaN or infinite.
    pub fn num(&self, i: usize) -> Result<f64> {
        let v = self.raw(i);
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => bail!(
                "column {} is {v:?}, expected a finite number >= 0",
                self.names[i]
            ),
        }
    }
}

/// Parses `text`, the contents of a file named `file`, as schema `T`.
///
/// # Errors
/// A missing or different header, a row with the wrong number of fields or
/// a bad value: the message names `file` and the 1-based line.
pub fn parse<T: Schema>(text: &str, file: &str) -> Result<Vec<T>> {
    let names: Vec<&'static str> = T::HEADER.split(',').collect();
    let mut rows = Vec::new();
    let mut header_seen = false;
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if !header_seen {
            if line != T::HEADER {
                bail!(
                    "{file}:{line_no}: header is {line:?}, expected {:?}",
                    T::HEADER
                );
            }
            header_seen = true;
            continue;
        }
        let values: Vec<&str> = line.split(',').collect();
        if values.len() != names.len() {
            bail!(
                "{file}:{line_no}: {} field(s), expected {} ({}): {line:?}",
                values.len(),
                names.len(),
                T::HEADER
            );
        }
        let fields = Fields {
            names: names.clone(),
            values,
        };
        let row = T::from_fields(&fields).with_context(|| format!("{file}:{line_no}: {line:?}"))?;
        rows.push(row);
    }
    if !header_seen {
        bail!("{file}: empty, expected the header {:?}", T::HEADER);
    }
    Ok(rows)
}

/// Reads `dir/T::FILE`: `Ok(None)` when the file does not exist.
///
/// # Errors
/// The file exists but cannot be read or parsed (see [`parse`]).
pub fn load<T: Schema>(dir: &Path) -> Result<Option<Vec<T>>> {
    load_file(&dir.join(T::FILE))
}

/// Reads the file at `path` as schema `T`: `Ok(None)` when it does not exist.
///
/// # Errors
/// As [`load`].
pub fn load_file<T: Schema>(path: &Path) -> Result<Option<Vec<T>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    parse(&text, &path.display().to_string()).map(Some)
}

/// `fig4-service.csv`: the command queue's service time and command rate
/// (paper Fig. 4 and Fig. 8b).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceRow {
    /// Where the queues live: `host` (pinned host memory, GPU work-groups),
    /// `device` (GPU memory, GPU work-groups) or `cpu` (CPU work-groups).
    pub queue_mem: String,
    /// Work-groups issuing commands at the same time.
    pub wgs: u64,
    /// Proxy service threads of the PE.
    pub threads: u64,
    /// Blocking commands per work-group.
    pub iters: u64,
    /// Mean round trip of one blocking command seen by a work-group
    /// ("service time"), microseconds.
    pub rt_us: f64,
    /// Aggregate commands per second of all work-groups, millions (Mops/s).
    pub rate_mops: f64,
}

impl Schema for ServiceRow {
    const FILE: &'static str = "fig4-service.csv";
    const HEADER: &'static str = "queue_mem,wgs,threads,iters,rt_us,rate_mops";
    fn from_fields(f: &Fields<'_>) -> Result<Self> {
        Ok(ServiceRow {
            queue_mem: f.one_of(0, &["host", "device", "cpu", "raw"])?,
            wgs: f.uint(1)?,
            threads: f.uint(2)?,
            iters: f.uint(3)?,
            rt_us: f.num(4)?,
            rate_mops: f.num(5)?,
        })
    }
}

/// `p2p-ipc.csv`, `p2p-staged.csv`: GPU-initiated put/get between two GPUs
/// (paper Fig. 8a), one row per payload size.
#[derive(Debug, Clone, PartialEq)]
pub struct P2pRow {
    /// Payload, bytes.
    pub size_b: u64,
    /// Blocking put latency, microseconds.
    pub put_lat_us: f64,
    /// Blocking get latency, microseconds.
    pub get_lat_us: f64,
    /// Put bandwidth, GB/s (10^9 bytes/s).
    pub put_bw_gbps: f64,
    /// Get bandwidth, GB/s (10^9 bytes/s).
    pub get_bw_gbps: f64,
}

impl Schema for P2pRow {
    /// The IPC (peer copy) file; the staged one is [`P2P_STAGED_FILE`].
    const FILE: &'static str = "p2p-ipc.csv";
    const HEADER: &'static str = "size_B,put_lat_us,get_lat_us,put_bw_GBps,get_bw_GBps";
    fn from_fields(f: &Fields<'_>) -> Result<Self> {
        Ok(P2pRow {
            size_b: f.uint(0)?,
            put_lat_us: f.num(1)?,
            get_lat_us: f.num(2)?,
            put_bw_gbps: f.num(3)?,
            get_bw_gbps: f.num(4)?,
        })
    }
}

/// The staged-path file of the [`P2pRow`] schema.
pub const P2P_STAGED_FILE: &str = "p2p-staged.csv";

/// `fig9.csv`: Jacobi run times per variant (paper Fig. 9).
#[derive(Debug, Clone, PartialEq)]
pub struct Fig9Row {
    /// `intra-kernel`, `inter-kernel`, `cpu`, or an anchor such as `nccl`,
    /// `nvshmem`, `nccl-overlap`.
    pub variant: String,
    /// Grid columns.
    pub nx: u64,
    /// Grid rows.
    pub ny: u64,
    /// PEs (GPUs or processes).
    pub pes: u64,
    /// Jacobi iterations.
    pub niter: u64,
    /// Grid points per PE (`nx * ny / pes`).
    pub elements_per_pe: f64,
    /// Wall time of the `niter` iterations, seconds.
    pub seconds: f64,
}

impl Schema for Fig9Row {
    const FILE: &'static str = "fig9.csv";
    const HEADER: &'static str = "variant,nx,ny,pes,niter,elements_per_pe,seconds";
    fn from_fields(f: &Fields<'_>) -> Result<Self> {
        Ok(Fig9Row {
            variant: f.text(0)?,
            nx: f.uint(1)?,
            ny: f.uint(2)?,
            pes: f.uint(3)?,
            niter: f.uint(4)?,
            elements_per_pe: f.num(5)?,
            seconds: f.num(6)?,
        })
    }
}

/// `fig10.csv`: allreduce time per size and variant (paper Fig. 10).
#[derive(Debug, Clone, PartialEq)]
pub struct Fig10Row {
    /// `intra-kernel`, `inter-kernel`, `cpu` or `nccl`.
    pub variant: String,
    /// PEs in the allreduce.
    pub pes: u64,
    /// Buffer size, bytes.
    pub bytes: u64,
    /// Time of one allreduce, microseconds.
    pub time_us: f64,
    /// Bus bandwidth as nccl-tests define it, GB/s (10^9 bytes/s).
    pub busbw_gbps: f64,
}

impl Schema for Fig10Row {
    const FILE: &'static str = "fig10.csv";
    const HEADER: &'static str = "variant,pes,bytes,time_us,busbw_GBps";
    fn from_fields(f: &Fields<'_>) -> Result<Self> {
        Ok(Fig10Row {
            variant: f.text(0)?,
            pes: f.uint(1)?,
            bytes: f.uint(2)?,
            time_us: f.num(3)?,
            busbw_gbps: f.num(4)?,
        })
    }
}

/// `proxy-cost.csv`: CPU time the proxy threads used, busy and idle.
#[derive(Debug, Clone, PartialEq)]
pub struct CostRow {
    /// Who issued the commands: `gpu` (GPU work-groups) or `cpu`.
    pub source: String,
    /// Proxy service threads.
    pub threads: u64,
    /// `busy` (while commands were issued) or `idle` (PE up, no commands).
    pub state: String,
    /// Commands served during the measurement (0 when idle).
    pub commands: u64,
    /// Wall time of the measurement, seconds.
    pub wall_s: f64,
    /// User + system CPU time of all proxy threads during it, seconds.
    pub proxy_cpu_s: f64,
}

impl Schema for CostRow {
    const FILE: &'static str = "proxy-cost.csv";
    const HEADER: &'static str = "source,threads,state,commands,wall_s,proxy_cpu_s";
    fn from_fields(f: &Fields<'_>) -> Result<Self> {
        Ok(CostRow {
            source: f.one_of(0, &["gpu", "cpu"])?,
            threads: f.uint(1)?,
            state: f.one_of(2, &["busy", "idle"])?,
            commands: f.uint(3)?,
            wall_s: f.num(4)?,
            proxy_cpu_s: f.num(5)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comments_blank_lines_and_rows() {
        let text = "# made by hand\n\nqueue_mem,wgs,threads,iters,rt_us,rate_mops\nhost,1,1,100,2.5,0.4\n\ncpu,2,4,100,3,0.66\n";
        let rows: Vec<ServiceRow> = parse(text, "x.csv").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].queue_mem, "cpu");
        assert_eq!((rows[1].wgs, rows[1].threads), (2, 4));
        assert_eq!(rows[0].rt_us, 2.5);
    }

    #[test]
    fn errors_name_file_and_line() {
        let bad_value =
            "variant,pes,bytes,time_us,busbw_GBps\ncpu,2,8,1.0,0.1\ncpu,2,16,fast,0.1\n";
        let e = format!(
            "{:#}",
            parse::<Fig10Row>(bad_value, "fig10.csv").unwrap_err()
        );
        assert!(e.contains("fig10.csv:3") && e.contains("time_us"), "{e}");

        let short = "source,threads,state,commands,wall_s,proxy_cpu_s\ncpu,1,busy,10,1.0\n";
        let e = format!(
            "{:#}",
            parse::<CostRow>(short, "proxy-cost.csv").unwrap_err()
        );
        assert!(
            e.contains("proxy-cost.csv:2") && e.contains("5 field(s), expected 6"),
            "{e}"
        );

        let header = "size,put\n8,1\n";
        let e = format!("{:#}", parse::<P2pRow>(header, "p2p-ipc.csv").unwrap_err());
        assert!(e.contains("p2p-ipc.csv:1") && e.contains("header"), "{e}");

        let kind = "queue_mem,wgs,threads,iters,rt_us,rate_mops\ngpu,1,1,1,1,1\n";
        let e = format!("{:#}", parse::<ServiceRow>(kind, "s.csv").unwrap_err());
        assert!(
            e.contains("s.csv:2") && e.contains("host|device|cpu|raw"),
            "{e}"
        );

        for bad in ["-1", "nan", "inf", ""] {
            let t =
                format!("variant,nx,ny,pes,niter,elements_per_pe,seconds\ncpu,8,8,2,10,32,{bad}\n");
            let e = format!("{:#}", parse::<Fig9Row>(&t, "fig9.csv").unwrap_err());
            assert!(
                e.contains("fig9.csv:2") && e.contains("seconds"),
                "{bad}: {e}"
            );
        }

        let e = format!(
            "{:#}",
            parse::<Fig9Row>("# nothing\n", "fig9.csv").unwrap_err()
        );
        assert!(e.contains("fig9.csv") && e.contains("empty"), "{e}");
    }

    #[test]
    fn missing_file_is_none() {
        let dir = std::env::temp_dir().join(format!("cpnet-plots-missing-{}", std::process::id()));
        assert!(load::<Fig9Row>(&dir).unwrap().is_none());
    }
}
