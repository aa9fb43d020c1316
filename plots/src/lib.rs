//! `cpnet-plot`: the figures of the paper's evaluation (ComP-Net, PACT 2018)
//! drawn from the CSV files cpnet's benchmarks write.
//!
//! ```text
//! cpnet-plot --data docs/data --out docs/figs [--machine "2 H200"]
//! ```
//!
//! [`data`] defines each CSV schema, [`figures`] which rows make which
//! figure, [`render`] draws them (PNG, plotters' bitmap backend, text from a
//! TrueType font read at run time). [`plot_all`] draws every figure whose
//! CSV exists in the data directory:
//!
//! | CSV | figures |
//! |---|---|
//! | `fig4-service.csv` | `fig4a.png`, `fig4b.png`, `fig4b-cpu.png`, `fig8b.png` |
//! | `p2p-ipc.csv`, `p2p-staged.csv` | `fig8a.png` |
//! | `fig9.csv` | `fig9.png` |
//! | `fig10.csv` | `fig10.png`, `fig10-scaling.png` |
//! | `proxy-cost.csv` | `proxy-cost.png` |
#![warn(missing_docs)]

pub mod data;
pub mod figures;
pub mod render;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use data::{
    CostRow, Fig9Row, Fig10Row, P2P_STAGED_FILE, P2pRow, Schema, ServiceRow, load, load_file,
};
use figures::{Built, Figure};

/// What [`plot_all`] did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The PNG files written.
    pub written: Vec<PathBuf>,
    /// One line per figure not drawn: its file and why.
    pub skipped: Vec<String>,
}

/// Every figure file [`plot_all`] can write, in order.
pub const FIGURES: &[&str] = &[
    "fig4a.png",
    "fig4b.png",
    "fig4b-cpu.png",
    "fig8a.png",
    "fig8b.png",
    "fig9.png",
    "fig10.png",
    "fig10-scaling.png",
    "proxy-cost.png",
];

/// Reads the CSVs in `data_dir` and writes each figure they allow into
/// `out_dir` (created if missing). A missing CSV, or one without the rows a
/// figure needs, skips that figure (listed in [`Outcome::skipped`]);
/// `machine`, if given, goes into every title in parentheses. Call
/// [`render::load_font`] first.
///
/// # Errors
/// A CSV that exists but is malformed (the message names the file and
/// line), or an image that cannot be written.
pub fn plot_all(data_dir: &Path, out_dir: &Path, machine: Option<&str>) -> Result<Outcome> {
    let service = load::<ServiceRow>(data_dir)?;
    let ipc = load::<P2pRow>(data_dir)?;
    let staged = load_file::<P2pRow>(&data_dir.join(P2P_STAGED_FILE))?;
    let fig9 = load::<Fig9Row>(data_dir)?;
    let fig10 = load::<Fig10Row>(data_dir)?;
    let cost = load::<CostRow>(data_dir)?;

    let missing =
        |files: &str| -> Built { Err(format!("{files} not found in {}", data_dir.display())) };
    let mut todo: Vec<(&str, Built)> = Vec::new();
    match &service {
        Some(rows) => {
            todo.push(("fig4a.png", figures::fig4a(rows, machine)));
            todo.push(("fig4b.png", figures::fig4b(rows, "host", machine)));
            todo.push(("fig4b-cpu.png", figures::fig4b(rows, "cpu", machine)));
            todo.push(("fig8b.png", figures::fig8b(rows, machine)));
        }
        None => {
            for f in ["fig4a.png", "fig4b.png", "fig4b-cpu.png", "fig8b.png"] {
                todo.push((f, missing(ServiceRow::FILE)));
            }
        }
    }
    todo.push((
        "fig8a.png",
        if ipc.is_none() && staged.is_none() {
            missing(&format!("{} and {P2P_STAGED_FILE}", P2pRow::FILE))
        } else {
            figures::fig8a(ipc.as_deref(), staged.as_deref(), machine)
        },
    ));
    todo.push((
        "fig9.png",
        fig9.as_deref()
            .map_or_else(|| missing(Fig9Row::FILE), |r| figures::fig9(r, machine)),
    ));
    match &fig10 {
        Some(rows) => {
            todo.push(("fig10.png", figures::fig10(rows, machine)));
            todo.push(("fig10-scaling.png", figures::fig10_scaling(rows, machine)));
        }
        None => {
            todo.push(("fig10.png", missing(Fig10Row::FILE)));
            todo.push(("fig10-scaling.png", missing(Fig10Row::FILE)));
        }
    }
    todo.push((
        "proxy-cost.png",
        cost.as_deref().map_or_else(
            || missing(CostRow::FILE),
            |r| figures::proxy_cost(r, machine),
        ),
    ));

    let mut out = Outcome::default();
    if todo.iter().any(|(_, b)| b.is_ok()) {
        std::fs::create_dir_all(out_dir)
            .with_context(|| format!("creating {}", out_dir.display()))?;
    }
    for (file, built) in todo {
        match built {
            Ok(fig) => {
                let path = out_dir.join(file);
                match &fig {
                    Figure::One(chart) => render::draw_png(&path, chart),
                    Figure::Panels {
                        title,
                        width,
                        panels,
                    } => render::draw_panels_png(&path, title, *width, panels),
                }
                .with_context(|| format!("drawing {}", path.display()))?;
                out.written.push(path);
            }
            Err(why) => out.skipped.push(format!("{file}: skipped: {why}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICE: &str = "queue_mem,wgs,threads,iters,rt_us,rate_mops
host,1,1,1000,3.1,0.32
host,16,1,1000,4.0,4.0
host,1024,1,1000,120.0,8.5
host,1,4,1000,3.0,0.33
host,16,4,1000,3.5,4.6
host,1024,4,1000,40.0,25.6
device,1,1,1000,5.0,0.2
device,1024,1,1000,300.0,3.4
cpu,1,1,1000,0.5,2.0
cpu,4,1,1000,1.5,2.6
cpu,4,2,1000,1.2,3.3
";
    const P2P: &str = "size_B,put_lat_us,get_lat_us,put_bw_GBps,get_bw_GBps
8,10.9,14.3,0.002,0.002
4096,12.1,12.2,1.09,1.08
4194304,22.4,24.5,301.9,288.4
8388608,34.7,34.7,330.1,324.1
";
    const FIG9: &str = "variant,nx,ny,pes,niter,elements_per_pe,seconds
intra-kernel,1024,1024,2,1000,524288,0.10
inter-kernel,1024,1024,2,1000,524288,0.15
cpu,1024,1024,2,1000,524288,2.0
intra-kernel,4096,4096,2,1000,8388608,1.0
inter-kernel,4096,4096,2,1000,8388608,1.05
intra-kernel,4096,4096,4,1000,4194304,0.6
inter-kernel,4096,4096,4,1000,4194304,0.7
nccl,4096,4096,4,1000,4194304,0.65
";
    const FIG10: &str = "variant,pes,bytes,time_us,busbw_GBps
cpu,2,8,20.5,0.0
cpu,2,65536,80.0,0.8
cpu,2,67108864,30000,2.2
intra-kernel,2,8,12.0,0.0
intra-kernel,2,67108864,400,167
intra-kernel,4,67108864,700,143
";
    const COST: &str = "source,threads,state,commands,wall_s,proxy_cpu_s
cpu,1,busy,100000,0.5,0.45
cpu,2,busy,100000,0.4,0.7
cpu,1,idle,0,1.0,0.99
cpu,2,idle,0,1.0,1.98
gpu,4,busy,1000000,1.0,3.9
gpu,4,idle,0,1.0,3.95
";

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cpnet-plots-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn renders_every_figure() {
        render::load_font(None).expect("a TrueType font (apt-get install fonts-dejavu-core)");
        let data = temp_dir("data");
        for (file, text) in [
            (ServiceRow::FILE, SERVICE),
            (P2pRow::FILE, P2P),
            (P2P_STAGED_FILE, P2P),
            (Fig9Row::FILE, FIG9),
            (Fig10Row::FILE, FIG10),
            (CostRow::FILE, COST),
        ] {
            std::fs::write(data.join(file), text).unwrap();
        }
        let out = data.join("figs");
        let r = plot_all(&data, &out, Some("test machine")).unwrap();
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        for f in FIGURES {
            let png = std::fs::read(out.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
            assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{f} is not a PNG");
            assert!(png.len() > 5000, "{f}: only {} bytes", png.len());
        }
        assert_eq!(r.written.len(), FIGURES.len());
        let _ = std::fs::remove_dir_all(&data);
    }

    #[test]
    fn missing_files_and_rows_are_skipped() {
        render::load_font(None).unwrap();
        let data = temp_dir("partial");
        // Only CPU service rows and one PE count in fig10.
        std::fs::write(
            data.join(ServiceRow::FILE),
            "queue_mem,wgs,threads,iters,rt_us,rate_mops\ncpu,1,1,10,1.0,1.0\ncpu,2,1,10,1.5,1.3\n",
        )
        .unwrap();
        std::fs::write(
            data.join(Fig10Row::FILE),
            "variant,pes,bytes,time_us,busbw_GBps\ncpu,2,8,20,0\ncpu,2,67108864,3000,2\n",
        )
        .unwrap();
        let out = data.join("figs");
        let r = plot_all(&data, &out, None).unwrap();
        let names: Vec<String> = r
            .written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["fig4b-cpu.png", "fig8b.png", "fig10.png"]);
        let skipped = r.skipped.join("\n");
        for f in [
            "fig4a.png",
            "fig4b.png",
            "fig8a.png",
            "fig9.png",
            "fig10-scaling.png",
            "proxy-cost.png",
        ] {
            assert!(skipped.contains(f), "{f} not in {skipped}");
        }
        assert!(skipped.contains("fig9.csv not found"), "{skipped}");
        let _ = std::fs::remove_dir_all(&data);
    }

    #[test]
    fn malformed_csv_names_file_and_line() {
        let data = temp_dir("bad");
        std::fs::write(
            data.join(Fig10Row::FILE),
            "variant,pes,bytes,time_us,busbw_GBps\ncpu,2,8,20,0\ncpu,2,16,20\n",
        )
        .unwrap();
        let e = format!(
            "{:#}",
            plot_all(&data, &data.join("figs"), None).unwrap_err()
        );
        assert!(e.contains("fig10.csv:3"), "{e}");
        assert!(!data.join("figs").exists());
        let _ = std::fs::remove_dir_all(&data);
    }
}
