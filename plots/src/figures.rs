//! The figures: which rows of which CSV become which lines of which chart.
//!
//! Each builder returns the figure, or why it cannot be drawn from the data
//! given (no rows of the kind it needs), which [`crate::plot_all`] reports
//! as a skipped figure. When a CSV holds the same point twice (a benchmark
//! appended twice), the later row wins.

use std::collections::BTreeSet;

use crate::data::{CostRow, Fig9Row, Fig10Row, P2pRow, ServiceRow};
use crate::render::{Chart, LegendAt, Scale, Series, Ticks};

/// A figure to draw: one chart, or panels side by side under one title.
#[derive(Debug, Clone)]
pub enum Figure {
    /// One chart, [`crate::render::WIDTH`] x [`crate::render::HEIGHT`] pixels.
    One(Chart),
    /// Panels side by side, `width` x [`crate::render::HEIGHT`] pixels.
    Panels {
        /// The title over all panels.
        title: String,
        /// Image width, pixels.
        width: u32,
        /// The panels, left to right.
        panels: Vec<Chart>,
    },
}

/// A figure, or why it was skipped.
pub type Built = Result<Figure, String>;

/// Smallest payload of Fig. 8a, bytes.
pub const FIG8A_MIN_BYTES: u64 = 8;
/// Largest payload of Fig. 8a, bytes (4 MiB, as in the paper).
pub const FIG8A_MAX_BYTES: u64 = 4 << 20;
/// Allreduce size of the Fig. 10 scaling plot, bytes (64 MiB).
pub const FIG10_SCALING_BYTES: u64 = 64 << 20;

/// `" (machine)"`, or nothing.
fn on(machine: Option<&str>) -> String {
    match machine {
        Some(m) if !m.trim().is_empty() => format!(" ({})", m.trim()),
        _ => String::new(),
    }
}

/// Adds `p` to `points`, replacing a point with the same x (later rows win).
fn put(points: &mut Vec<(f64, f64)>, p: (f64, f64)) {
    match points.iter_mut().find(|q| q.0 == p.0) {
        Some(q) => *q = p,
        None => points.push(p),
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Service time vs work-groups for rows of `queue_mem`, one series per
/// proxy thread count; `dashed` marks every series; colours by thread count
/// index in `all_threads`.
fn service_series(
    rows: &[ServiceRow],
    queue_mem: &str,
    all_threads: &[u64],
    label: &dyn Fn(u64) -> String,
    dashed: bool,
) -> Vec<Series> {
    let mut out = Vec::new();
    for (i, &t) in all_threads.iter().enumerate() {
        let mut points = Vec::new();
        for r in rows
            .iter()
            .filter(|r| r.queue_mem == queue_mem && r.threads == t)
        {
            put(&mut points, (r.wgs as f64, r.rt_us));
        }
        if !points.is_empty() {
            out.push(Series {
                label: label(t),
                points,
                dashed,
                color: i,
            });
        }
    }
    out
}

fn threads_of(rows: &[ServiceRow], kinds: &[&str]) -> Vec<u64> {
    rows.iter()
        .filter(|r| kinds.contains(&r.queue_mem.as_str()))
        .map(|r| r.threads)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

const SERVICE_Y: &str = "service time: round trip of a blocking command (µs)";

/// Fig. 4a: service time vs work-groups with the queues in host memory
/// (solid) and in device memory (dashed), per proxy thread count.
pub fn fig4a(rows: &[ServiceRow], machine: Option<&str>) -> Built {
    let threads = threads_of(rows, &["host", "device"]);
    let mut series = Vec::new();
    for (mem, dashed) in [("host", false), ("device", true)] {
        series.extend(service_series(
            rows,
            mem,
            &threads,
            &|t| {
                format!(
                    "{mem} queues, {}",
                    plural(t, "proxy thread", "proxy threads")
                )
            },
            dashed,
        ));
    }
    if series.is_empty() {
        return Err("no rows with queue_mem host or device".into());
    }
    let mut c = Chart::new(
        format!(
            "Fig. 4a: service time vs work-groups, host vs device queues{}",
            on(machine)
        ),
        "work-groups issuing blocking commands",
        SERVICE_Y,
    );
    c.x_scale = Scale::Log2;
    c.y_scale = Scale::Auto;
    c.legend = LegendAt::LowerRight;
    c.series = series;
    Ok(Figure::One(c))
}

/// Fig. 4b: service time vs work-groups, one series per proxy thread
/// count, for `queue_mem` `host` (GPU work-groups) or `cpu` (CPU
/// work-groups, the `fig4b-cpu.png` variant).
pub fn fig4b(rows: &[ServiceRow], queue_mem: &str, machine: Option<&str>) -> Built {
    let threads = threads_of(rows, &[queue_mem]);
    let mut series = service_series(
        rows,
        queue_mem,
        &threads,
        &|t| plural(t, "proxy thread", "proxy threads"),
        false,
    );
    if series.is_empty() {
        return Err(format!("no rows with queue_mem {queue_mem}"));
    }
    if queue_mem == "host" {
        // The hardware floor (`cpnet-gpu-bench --raw slot`: 64-byte request
        // lines answered by one CPU thread, no queue or proxy), dashed.
        series.extend(service_series(rows, "raw", &[1], &|_| "floor: raw lines, 1 CPU thread".to_string(), true));
    }
    let what = if queue_mem == "cpu" {
        " (CPU work-groups)"
    } else {
        ""
    };
    let mut c = Chart::new(
        format!(
            "Fig. 4b{what}: queue service time vs work-groups{}",
            on(machine)
        ),
        "work-groups issuing blocking commands",
        SERVICE_Y,
    );
    c.x_scale = Scale::Log2;
    c.y_scale = Scale::Auto;
    c.legend = LegendAt::LowerRight;
    c.series = series;
    Ok(Figure::One(c))
}

/// Fig. 8b: aggregate command rate vs proxy threads at the largest
/// work-group count present, for GPU work-groups with host queues and for
/// CPU work-groups when present.
pub fn fig8b(rows: &[ServiceRow], machine: Option<&str>) -> Built {
    let mut series = Vec::new();
    for (i, (mem, who)) in [
        ("host", "GPU work-groups, host queues"),
        ("cpu", "CPU work-groups"),
    ]
    .into_iter()
    .enumerate()
    {
        let Some(max_wgs) = rows
            .iter()
            .filter(|r| r.queue_mem == mem)
            .map(|r| r.wgs)
            .max()
        else {
            continue;
        };
        let mut points = Vec::new();
        for r in rows
            .iter()
            .filter(|r| r.queue_mem == mem && r.wgs == max_wgs)
        {
            put(&mut points, (r.threads as f64, r.rate_mops));
        }
        series.push(Series {
            label: format!("{who}, {}", plural(max_wgs, "work-group", "work-groups")),
            points,
            dashed: false,
            color: i,
        });
    }
    if series.is_empty() {
        return Err("no rows with queue_mem host or cpu".into());
    }
    let mut c = Chart::new(
        format!(
            "Fig. 8b: command rate vs proxy threads, fully loaded{}",
            on(machine)
        ),
        "proxy service threads",
        "commands served (millions per second)",
    );
    c.x_scale = Scale::Log2;
    c.series = series;
    Ok(Figure::One(c))
}

/// Fig. 8a: get latency (solid) and put latency (dashed) vs payload, one
/// colour per data path (`ipc`, `staged`), payloads
/// [`FIG8A_MIN_BYTES`]..=[`FIG8A_MAX_BYTES`].
pub fn fig8a(ipc: Option<&[P2pRow]>, staged: Option<&[P2pRow]>, machine: Option<&str>) -> Built {
    let mut series = Vec::new();
    for (i, (name, rows)) in [("ipc", ipc), ("staged", staged)].into_iter().enumerate() {
        let Some(rows) = rows else { continue };
        let (mut get, mut put_) = (Vec::new(), Vec::new());
        for r in rows
            .iter()
            .filter(|r| (FIG8A_MIN_BYTES..=FIG8A_MAX_BYTES).contains(&r.size_b))
        {
            put(&mut get, (r.size_b as f64, r.get_lat_us));
            put(&mut put_, (r.size_b as f64, r.put_lat_us));
        }
        if !get.is_empty() {
            series.push(Series {
                label: format!("{name}: get"),
                points: get,
                dashed: false,
                color: i,
            });
            series.push(Series {
                label: format!("{name}: put"),
                points: put_,
                dashed: true,
                color: i,
            });
        }
    }
    if series.is_empty() {
        return Err("no p2p-ipc.csv or p2p-staged.csv rows between 8 B and 4 MiB".into());
    }
    let mut c = Chart::new(
        format!(
            "Fig. 8a: GPU-initiated get/put latency vs payload{}",
            on(machine)
        ),
        "payload",
        "latency of a blocking call (µs)",
    );
    c.x_scale = Scale::Log2;
    c.x_ticks = Ticks::Bytes;
    c.y_scale = Scale::Log10;
    c.series = series;
    Ok(Figure::One(c))
}

/// Fig. 9: Jacobi speedup of `intra-kernel` over each other variant
/// (seconds(other) / seconds(intra-kernel) at the same nx, ny, pes,
/// niter) vs grid points per PE, one series per (variant, pes); a line at 1.
pub fn fig9(rows: &[Fig9Row], machine: Option<&str>) -> Built {
    let others: Vec<&str> = {
        let mut v: Vec<&str> = rows
            .iter()
            .map(|r| r.variant.as_str())
            .filter(|v| *v != "intra-kernel")
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // The paper's baselines first, anchors after.
        v.sort_by_key(|v| {
            (
                !matches!(*v, "inter-kernel" | "cpu"),
                *v != "inter-kernel",
                v.to_string(),
            )
        });
        v
    };
    let pes: Vec<u64> = rows
        .iter()
        .map(|r| r.pes)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut series = Vec::new();
    for (vi, other) in others.iter().enumerate() {
        for (pi, &p) in pes.iter().enumerate() {
            let mut points = Vec::new();
            for o in rows.iter().filter(|r| r.variant == *other && r.pes == p) {
                let intra = rows.iter().rev().find(|r| {
                    r.variant == "intra-kernel"
                        && (r.nx, r.ny, r.pes, r.niter) == (o.nx, o.ny, o.pes, o.niter)
                });
                if let Some(i) = intra
                    && i.seconds > 0.0
                {
                    put(&mut points, (i.elements_per_pe, o.seconds / i.seconds));
                }
            }
            if !points.is_empty() {
                series.push(Series {
                    label: format!("over {other}, {} PEs", p),
                    points,
                    dashed: pi % 2 == 1,
                    color: vi,
                });
            }
        }
    }
    if series.is_empty() {
        return Err(
            "no intra-kernel row with a matching row of another variant (same nx, ny, pes, niter)"
                .into(),
        );
    }
    let mut c = Chart::new(
        format!(
            "Fig. 9: Jacobi speedup of intra-kernel communication{}",
            on(machine)
        ),
        "grid points per PE",
        "speedup (time of other / time of intra-kernel)",
    );
    c.x_scale = Scale::Log10;
    c.hline = Some((1.0, "1 (no speedup)".into()));
    c.legend = LegendAt::UpperRight;
    c.series = series;
    Ok(Figure::One(c))
}

fn variants(rows: &[Fig10Row]) -> Vec<&str> {
    let order = ["intra-kernel", "inter-kernel", "cpu", "nccl"];
    let mut v: Vec<&str> = rows
        .iter()
        .map(|r| r.variant.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    v.sort_by_key(|x| {
        (
            order.iter().position(|o| o == x).unwrap_or(order.len()),
            x.to_string(),
        )
    });
    v
}

/// Fig. 10: allreduce time vs size, one series per variant, for 2 PEs if
/// present, else the smallest PE count.
pub fn fig10(rows: &[Fig10Row], machine: Option<&str>) -> Built {
    let pes = if rows.iter().any(|r| r.pes == 2) {
        2
    } else {
        rows.iter().map(|r| r.pes).min().ok_or("no rows")?
    };
    let mut series = Vec::new();
    for (i, v) in variants(rows).into_iter().enumerate() {
        let mut points = Vec::new();
        for r in rows.iter().filter(|r| r.variant == v && r.pes == pes) {
            put(&mut points, (r.bytes as f64, r.time_us));
        }
        if !points.is_empty() {
            series.push(Series {
                label: v.to_owned(),
                points,
                dashed: false,
                color: i,
            });
        }
    }
    let mut c = Chart::new(
        format!(
            "Fig. 10: allreduce time vs size, {} PEs{}",
            pes,
            on(machine)
        ),
        "buffer size",
        "time per allreduce (µs)",
    );
    c.x_scale = Scale::Log2;
    c.x_ticks = Ticks::Bytes;
    c.y_scale = Scale::Log10;
    c.series = series;
    Ok(Figure::One(c))
}

/// Fig. 10 scaling: time of a [`FIG10_SCALING_BYTES`] allreduce vs PEs,
/// one series per variant; needs that size at 2 or more PE counts.
pub fn fig10_scaling(rows: &[Fig10Row], machine: Option<&str>) -> Built {
    let big: Vec<&Fig10Row> = rows
        .iter()
        .filter(|r| r.bytes == FIG10_SCALING_BYTES)
        .collect();
    let n_pes = big.iter().map(|r| r.pes).collect::<BTreeSet<_>>().len();
    if n_pes < 2 {
        return Err(format!(
            "rows with bytes={FIG10_SCALING_BYTES} at {n_pes} PE count(s), need 2 or more"
        ));
    }
    let mut series = Vec::new();
    for (i, v) in variants(rows).into_iter().enumerate() {
        let mut points = Vec::new();
        for r in big.iter().filter(|r| r.variant == v) {
            put(&mut points, (r.pes as f64, r.time_us));
        }
        if !points.is_empty() {
            series.push(Series {
                label: v.to_owned(),
                points,
                dashed: false,
                color: i,
            });
        }
    }
    let mut c = Chart::new(
        format!("Fig. 10: 64 MiB allreduce time vs PEs{}", on(machine)),
        "PEs",
        "time per allreduce (µs)",
    );
    c.x_scale = Scale::Log2;
    c.y_scale = Scale::Auto;
    c.series = series;
    Ok(Figure::One(c))
}

/// Proxy CPU cost: left, busy: proxy CPU seconds per million commands vs
/// proxy threads; right, idle: CPU cores the proxy threads keep busy
/// (proxy_cpu_s / wall_s) vs proxy threads; one series per source.
pub fn proxy_cost(rows: &[CostRow], machine: Option<&str>) -> Built {
    let mut busy = Vec::new();
    let mut idle = Vec::new();
    for (i, (src, who)) in [("gpu", "GPU work-groups"), ("cpu", "CPU work-groups")]
        .into_iter()
        .enumerate()
    {
        let (mut b, mut d) = (Vec::new(), Vec::new());
        for r in rows.iter().filter(|r| r.source == src) {
            if r.state == "busy" && r.commands > 0 {
                put(
                    &mut b,
                    (r.threads as f64, r.proxy_cpu_s / (r.commands as f64 / 1e6)),
                );
            } else if r.state == "idle" && r.wall_s > 0.0 {
                put(&mut d, (r.threads as f64, r.proxy_cpu_s / r.wall_s));
            }
        }
        if !b.is_empty() {
            busy.push(Series {
                label: who.into(),
                points: b,
                dashed: false,
                color: i,
            });
        }
        if !d.is_empty() {
            idle.push(Series {
                label: who.into(),
                points: d,
                dashed: false,
                color: i,
            });
        }
    }
    let mut panels = Vec::new();
    if !busy.is_empty() {
        let mut c = Chart::new(
            "busy",
            "proxy service threads",
            "proxy CPU seconds per million commands",
        );
        c.x_scale = Scale::Log2;
        c.series = busy;
        panels.push(c);
    }
    if !idle.is_empty() {
        let mut c = Chart::new(
            "idle (PE up, no commands)",
            "proxy service threads",
            "CPU cores used by the proxy threads",
        );
        c.x_scale = Scale::Log2;
        c.series = idle;
        panels.push(c);
    }
    if panels.is_empty() {
        return Err("no busy row with commands > 0 and no idle row with wall_s > 0".into());
    }
    Ok(Figure::Panels {
        title: format!("Proxy CPU cost{}", on(machine)),
        width: 1000,
        panels,
    })
}
