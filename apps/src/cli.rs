//! What the apps share on the command line and at start-up.
//!
//! - Flags are spelled as the tools the apps are compared against spell
//!   them: `-nx -ny -niter` (multi-gpu-programming-models' Jacobi), `-b -e -f`
//!   (nccl-tests). Those tools take long names after a single dash, which
//!   clap does not; [`parse_args`] rewrites `-name` to `--name` for every
//!   long flag of the command, so both spellings work.
//! - [`Variant`] selects how the work-groups run: `cpu` (CPU threads as
//!   work-groups), `intra-kernel` and `inter-kernel` (GPU kernels; a
//!   machine without a GPU refuses them with a clear error).
//! - [`init_pe`] and [`init_gpu_pe`] start the PE with a symmetric heap
//!   large enough for the run, the way NVIDIA's Jacobi sets
//!   `NVSHMEM_SYMMETRIC_SIZE` for itself.

use std::ffi::OsString;

use anyhow::{Context, bail};
use clap::{CommandFactory, Parser, ValueEnum};
use cpnet::env::{HEAP_SIZE, Launch, QUEUES, Tuning};
use cpnet::gpu::GpuError;
use cpnet::{GpuPe, Pe};

/// How an app's work-groups run (ComP-Net §5: "CPU", "Intra-Kernel",
/// "Inter-Kernel").
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Variant {
    /// CPU threads are the work-groups and run the intra-kernel logic: the
    /// whole loop, communication issued from the work-groups themselves
    /// through cpnet's queues (the paper's "CPU" configuration; CI runs it).
    Cpu,
    /// One persistent GPU kernel runs the whole loop and communicates from
    /// inside (the paper's "Intra-Kernel").
    IntraKernel,
    /// A GPU kernel per step, the communication issued between kernels and
    /// synchronized at kernel boundaries (the paper's "Inter-Kernel"
    /// baseline; a GPU PE's heap is reachable only from its GPU, so the
    /// host issues it as a short communication kernel).
    InterKernel,
}

impl Variant {
    /// The flag value (`cpu`, `intra-kernel`, `inter-kernel`).
    pub fn name(self) -> &'static str {
        match self {
            Variant::Cpu => "cpu",
            Variant::IntraKernel => "intra-kernel",
            Variant::InterKernel => "inter-kernel",
        }
    }

    /// Whether the variant runs on a GPU.
    pub fn is_gpu(self) -> bool {
        self != Variant::Cpu
    }

    /// `Ok` for a variant this machine can run; otherwise an error that
    /// says why and what to use instead (no variant is ever faked by
    /// another). [`init_gpu_pe`] checks the device itself.
    ///
    /// # Errors
    /// For `intra-kernel` and `inter-kernel` where no CUDA driver is
    /// installed.
    pub fn require_available(self) -> anyhow::Result<()> {
        if self.is_gpu() && !cpnet::gpu::driver_present() {
            bail!(
                "-variant {} needs a GPU: {}; run -variant cpu on this machine",
                self.name(),
                GpuError::NoDriver
            );
        }
        Ok(())
    }
}

/// `args` with every `-name` (and `-name=value`) whose `name` is a long flag
/// of `P` rewritten to `--name`; everything else is left alone (short flags,
/// values, `--name`).
pub fn single_dash_to_long<P: CommandFactory>(
    args: impl IntoIterator<Item = OsString>,
) -> Vec<OsString> {
    let cmd = P::command();
    let longs: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect();
    args.into_iter()
        .enumerate()
        .map(|(i, a)| {
            let Some(s) = a.to_str() else { return a };
            if i == 0 || s.starts_with("--") || !s.starts_with('-') {
                return a;
            }
            let name = s[1..].split('=').next().unwrap_or("");
            if longs.iter().any(|l| l == name) {
                OsString::from(format!("-{s}"))
            } else {
                a
            }
        })
        .collect()
}

/// Parse the process's arguments as `P`, accepting single-dash long flags
/// (see [`single_dash_to_long`]). Exits with clap's message on bad input.
pub fn parse_args<P: Parser>() -> P {
    parse_args_and_matches::<P>().0
}

/// [`parse_args`], also returning clap's matches (to tell a value given on
/// the command line from a default: `ArgMatches::value_source`).
pub fn parse_args_and_matches<P: Parser>() -> (P, clap::ArgMatches) {
    let m = P::command().get_matches_from(single_dash_to_long::<P>(std::env::args_os()));
    let p = P::from_arg_matches(&m).unwrap_or_else(|e| e.exit());
    (p, m)
}

/// `e` and its causes on one line, skipping a cause whose text its parent
/// already includes (cpnet's errors print their source inside their own
/// message *and* expose it as `source()`, so `{:#}` would say it twice).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

/// A byte count with an optional `K`, `M` or `G` suffix (powers of 1024, as
/// nccl-tests reads `-b 8 -e 128M`); for clap's `value_parser`.
///
/// # Errors
/// A message naming the bad value.
pub fn parse_size(s: &str) -> Result<u64, String> {
    cpnet::env::parse_bytes(s)
        .ok_or_else(|| format!("'{s}' is not a byte count (e.g. 8, 64K, 256M, 1G)"))
}

/// Sets up `tracing` output on stderr (`RUST_LOG`, default `warn`), as
/// [`Pe::init`] does; [`Pe::init_with`] leaves it to the caller.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The launch facts and tuning of this PE, with a symmetric heap of at
/// least `need(n_pes)` bytes. When `CPNET_HEAP_SIZE` is unset and its
/// default is too small, the heap is raised to what the run needs and the
/// new size is returned (for the app to report); when the user set it too
/// small, this fails before any PE starts, naming both sizes.
///
/// # Errors
/// A malformed launch or tuning variable, a heap set too small.
fn sized_launch(need: impl FnOnce(i32) -> u64, min_queues: usize) -> anyhow::Result<(Launch, Tuning, Option<u64>)> {
    let launch = Launch::from_env()?;
    let mut tuning = Tuning::from_env()?;
    // A queue per work-group that communicates: raised when CPNET_QUEUES is
    // unset; when it is set too small the program's own check says so.
    // Set by the user: present and not blank (as Tuning::from_env reads it).
    let user_set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.to_string_lossy().trim().is_empty());
    if tuning.queues < min_queues && !user_set(QUEUES) {
        tuning.queues = min_queues;
    }
    let required = need(launch.n_pes);
    let mut raised = None;
    if tuning.heap_size < required {
        if user_set(HEAP_SIZE) {
            bail!(
                "{HEAP_SIZE} = {} bytes is too small: this run needs at least {required} bytes of symmetric \
                 heap per PE (unset {HEAP_SIZE} to size it automatically)",
                tuning.heap_size
            );
        }
        tuning.heap_size = required;
        raised = Some(required);
    }
    Ok((launch, tuning, raised))
}

/// Start this PE (**collective**, [`Pe::init_with`]) with a symmetric heap
/// of at least `need(n_pes)` bytes (sized as [`init_gpu_pe`] does).
///
/// # Errors
/// A malformed launch or tuning variable, a heap set too small, and every
/// error of [`Pe::init_with`].
pub fn init_pe(need: impl FnOnce(i32) -> u64) -> anyhow::Result<(Pe, Option<u64>)> {
    init_logging();
    let (launch, tuning, raised) = sized_launch(need, 0)?;
    let pe = Pe::init_with(launch, tuning).context("cpnet init")?;
    Ok((pe, raised))
}

/// Start this PE on its GPU (**collective**, [`GpuPe::init_with`]) for
/// `variant`, with a symmetric heap (GPU memory) of at least `need(n_pes)`
/// bytes: raised to it when `CPNET_HEAP_SIZE` is unset (the new size is
/// returned), an error when it is set too small; and at least `min_queues`
/// command queues when `CPNET_QUEUES` is unset.
///
/// # Errors
/// No GPU ("-variant ... needs a GPU: ..."), a malformed launch or tuning
/// variable, a heap set too small, and every error of [`GpuPe::init_with`].
pub fn init_gpu_pe(
    variant: Variant,
    need: impl FnOnce(i32) -> u64,
    min_queues: usize,
) -> anyhow::Result<(GpuPe, Option<u64>)> {
    variant.require_available()?;
    let (launch, tuning, raised) = sized_launch(need, min_queues)?;
    match GpuPe::init_with(launch, tuning) {
        Ok(pe) => Ok((pe, raised)),
        Err(cpnet::pe::Error::Gpu(e @ (GpuError::NoDriver | GpuError::NoDevice { .. }))) => bail!(
            "-variant {} needs a GPU: {e}; run -variant cpu on this machine",
            variant.name()
        ),
        Err(e) => Err(anyhow::Error::new(e).context("cpnet init (GPU PE)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser)]
    struct T {
        #[arg(long, default_value_t = 1)]
        nx: u32,
        #[arg(short = 'b', long = "minbytes", default_value_t = 0)]
        b: u32,
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn single_dash_long_flags_become_double_dash_and_nothing_else_changes() {
        let got = single_dash_to_long::<T>(os(&[
            "prog",
            "-nx",
            "5",
            "-b",
            "-7",
            "--nx",
            "-nx=3",
            "-minbytes",
            "-q",
        ]));
        assert_eq!(
            got,
            os(&[
                "prog",
                "--nx",
                "5",
                "-b",
                "-7",
                "--nx",
                "--nx=3",
                "--minbytes",
                "-q"
            ])
        );
        let t = T::parse_from(single_dash_to_long::<T>(os(&[
            "prog", "-nx", "5", "-b", "9",
        ])));
        assert_eq!((t.nx, t.b), (5, 9));
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert!(parse_size("12X").is_err());
    }

    #[test]
    fn gpu_variants_need_a_driver_and_say_so() {
        assert!(Variant::Cpu.require_available().is_ok());
        assert!(!Variant::Cpu.is_gpu());
        for v in [Variant::IntraKernel, Variant::InterKernel] {
            assert!(v.is_gpu());
            match v.require_available() {
                Ok(()) => assert!(
                    cpnet::gpu::driver_present(),
                    "{v:?} accepted without a driver"
                ),
                Err(e) => {
                    let e = e.to_string();
                    assert!(!cpnet::gpu::driver_present());
                    assert!(
                        e.contains(&format!("-variant {} needs a GPU", v.name()))
                            && e.contains("-variant cpu"),
                        "{e}"
                    );
                }
            }
        }
    }
}
