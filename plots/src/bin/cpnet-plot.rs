//! `cpnet-plot`: draws the paper's evaluation figures (PNG) from the CSVs
//! in a data directory; see the crate documentation for which CSV makes
//! which figure and `docs/figures.md` for how the CSVs are produced.
//!
//! ```text
//! cpnet-plot --data docs/data --out docs/figs --machine "2 H200"
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "cpnet-plot",
    about = "Draw the evaluation figures (PNG) from cpnet's benchmark CSVs"
)]
struct Cli {
    /// Directory with the CSVs (fig4-service.csv, p2p-ipc.csv, p2p-staged.csv, fig9.csv, fig10.csv, proxy-cost.csv).
    #[arg(long, default_value = "docs/data")]
    data: PathBuf,
    /// Directory for the PNGs (created if missing).
    #[arg(long, default_value = "docs/figs")]
    out: PathBuf,
    /// Machine or source of the data, shown in every title in parentheses (e.g. "2 H200").
    #[arg(long)]
    machine: Option<String>,
    /// TrueType font for the text (default: DejaVu Sans or Liberation Sans from the usual places).
    #[arg(long)]
    font: Option<PathBuf>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let font = cpnet_plots::render::load_font(cli.font.as_deref())?;
    let r = cpnet_plots::plot_all(&cli.data, &cli.out, cli.machine.as_deref())?;
    for p in &r.written {
        println!("wrote {}", p.display());
    }
    for s in &r.skipped {
        println!("{s}");
    }
    println!(
        "cpnet-plot: {} figure(s) written to {}, {} skipped (data {}, font {})",
        r.written.len(),
        cli.out.display(),
        r.skipped.len(),
        cli.data.display(),
        font.display()
    );
    Ok(())
}
