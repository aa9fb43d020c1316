//! `cpnet-proxyd`: the proxy daemon (DESIGN.md "The proxy daemon"; see
//! [`cpnet::daemon`] for the socket, the security model, the shared memory
//! and the faults).
//!
//! ```text
//! cpnet-proxyd [--dir DIR] [--gpu UUID] [--linger SECS] [--persistent]
//! ```
//!
//! With `--gpu UUID` (`GPU-…`, as `nvidia-smi -L` prints it) it is the
//! daemon of that GPU, on `DIR/proxyd-UUID.sock`: it serves the GPU PEs of
//! that GPU (their queues in shared memory, their heaps through CUDA IPC)
//! and CPU PEs too. GPU PEs start it themselves (one per GPU).
//!
//! Serves every PE of this user that attaches on `DIR/proxyd.sock` (`DIR`:
//! `CPNET_PROXYD_DIR`, default `$XDG_RUNTIME_DIR/cpnet` or
//! `/tmp/cpnet-<uid>`), until nothing has been attached for `--linger`
//! seconds (`CPNET_PROXYD_LINGER`, default 10) unless `--persistent`, or
//! SIGINT/SIGTERM. Exits 0 at once when another daemon holds the directory's
//! lock. PEs start it by themselves (CPU PEs with `CPNET_PROXY=daemon`, GPU PEs under MPS);
//! start it by hand for a node-wide service: `cpnet-proxyd --persistent &`.
//! Logs go to stderr (`RUST_LOG`, default `info`).
//!
//! Exit status: 0, or 1 when the directory is unsafe or the socket cannot be
//! bound (the message says which), 2 on usage errors.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cpnet::daemon::{DaemonOptions, DaemonPaths, serve};
use cpnet::env::Tuning;

#[derive(Parser, Debug)]
#[command(name = "cpnet-proxyd", about = "cpnet's proxy daemon: serves the command queues of the PEs attached to it")]
struct Args {
    /// The daemon's directory (socket, lock, log); default CPNET_PROXYD_DIR,
    /// else `$XDG_RUNTIME_DIR/cpnet`, else `/tmp/cpnet-<uid>`.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Serve this GPU (UUID as `nvidia-smi -L` prints it, `GPU-…`).
    #[arg(long)]
    gpu: Option<String>,
    /// Seconds to stay with nothing attached (default CPNET_PROXYD_LINGER, else 10).
    #[arg(long)]
    linger: Option<f64>,
    /// Never exit for lack of PEs.
    #[arg(long)]
    persistent: bool,
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Plain text into a log file; colours only on a terminal.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
    let args = Args::parse();
    let tuning = match Tuning::from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cpnet-proxyd: {e}");
            return ExitCode::from(2);
        }
    };
    let linger = match args.linger {
        None => tuning.proxyd_linger,
        Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s),
        Some(s) => {
            eprintln!("cpnet-proxyd: --linger {s}: expected seconds >= 0");
            return ExitCode::from(2);
        }
    };
    let dir = args.dir.as_deref().unwrap_or(&tuning.proxyd_dir);
    let paths = match &args.gpu {
        Some(u) if u.starts_with("GPU-") && u.len() == 40 && u[4..].chars().all(|c| c.is_ascii_hexdigit() || c == '-') => DaemonPaths::for_gpu(dir, u),
        Some(u) => {
            eprintln!("cpnet-proxyd: --gpu {u}: expected a GPU UUID as nvidia-smi -L prints it (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)");
            return ExitCode::from(2);
        }
        None => DaemonPaths::in_dir(dir),
    };
    match serve(DaemonOptions { paths, linger, persistent: args.persistent }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("cpnet-proxyd: {e}");
            ExitCode::from(1)
        }
    }
}
