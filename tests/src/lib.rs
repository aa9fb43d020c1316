//! # cpnet-tests
//!
//! Multi-PE integration tests: `cpnet-check` (src/bin) holds the scenarios,
//! each run as N real processes under the launcher by `tests/multi_pe.rs`,
//! over the real libfabric providers (`shm`, `tcp;ofi_rxm`).
//!
//! `cpnet-gpu-check` (src/bin) is the same matrix for GPU PEs, its kernels
//! in [`gpu`], run by `tests/gpu_multi_pe.rs`.
//!
//! This library holds what the scenarios share.
#![warn(missing_docs)]

pub mod chaos;
pub mod collectives;
pub mod copy_floor;
pub mod gpu;
pub mod gpu_coll;
pub mod gpu_on_stream;
pub mod gpu_on_stream_bench;
pub mod gpu_sync;
pub mod heap_words;
pub mod isolation;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// A seeded random stream for the stress scenarios (reproducible per seed,
/// PE and work-group).
pub struct Rng(StdRng);

impl Rng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }

    /// 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0.random()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }
}

/// Compare two byte strings; on mismatch a message with the first differing
/// offset and both values, prefixed by `what()`.
///
/// # Errors
/// The message, when they differ.
pub fn check_eq(got: &[u8], want: &[u8], what: impl FnOnce() -> String) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    if got.len() != want.len() {
        return Err(format!("{}: {} bytes, expected {}", what(), got.len(), want.len()));
    }
    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
    Err(format!("{}: {bad} of {} bytes differ, first at offset {i}: {:#04x}, expected {:#04x}", what(), got.len(), got[i], want[i]))
}

/// The processes of this machine, as tests look for their leftovers.
pub mod procs {
    use std::path::Path;

    /// Pids of the live processes (zombies left out) for which `pred(pid,
    /// /proc/<pid>)` holds, this test process excepted.
    pub fn pids_where(pred: impl Fn(u32, &Path) -> bool) -> Vec<u32> {
        let me = std::process::id();
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path())))
            .filter(|(pid, dir)| {
                *pid != me
                    && !std::fs::read_to_string(dir.join("stat")).unwrap_or_default().contains(") Z ")
                    && pred(*pid, dir)
            })
            .map(|(pid, _)| pid)
            .collect()
    }

    /// `/proc/<pid>/cmdline` or `environ` as text, NULs made spaces (empty
    /// if unreadable).
    pub fn read(dir: &Path, file: &str) -> String {
        String::from_utf8_lossy(&std::fs::read(dir.join(file)).unwrap_or_default()).replace('\0', " ")
    }
}

/// Running a program as N PEs under `cpnet-run`, for multi-process tests
/// (this crate's and the apps').
pub mod launch {
    use std::path::{Path, PathBuf};
    use std::process::{Command, ExitStatus, Stdio};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// One job at a time per test process: timing checks (a dead peer seen
    /// within 30 s) must not compete with each other on a 2-core CI machine.
    static ONE_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// The `cpnet-run` binary in `bin_dir` (the directory of the calling
    /// package's binaries), built with `cargo` (pass `env!("CARGO")`) if the
    /// `cpnet` package's binaries were not built in this run.
    ///
    /// # Panics
    /// If cargo cannot build it.
    pub fn cpnet_run(bin_dir: &Path, cargo: &str) -> PathBuf {
        let run = bin_dir.join("cpnet-run");
        if !run.exists() {
            let release = if bin_dir.ends_with("release") { &["--release"][..] } else { &[][..] };
            let st = Command::new(cargo)
                .args(["build", "-q", "-p", "cpnet", "--bin", "cpnet-run"])
                .args(release)
                .status()
                .expect("run cargo to build cpnet-run");
            assert!(st.success(), "building cpnet-run failed");
        }
        run
    }

    /// [`job`] under the `cpnet-run` beside `program` (a binary of the
    /// calling package, `env!("CARGO_BIN_EXE_...")`), built if missing
    /// ([`cpnet_run`]).
    ///
    /// # Panics
    /// As [`job`] and [`cpnet_run`].
    pub fn run(program: &Path, n: u32, provider: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Job {
        let launcher = cpnet_run(program.parent().expect("bin dir"), env!("CARGO"));
        job(&launcher, n, provider, program, args, env, limit)
    }

    /// What a job printed and how it ended.
    #[derive(Debug)]
    pub struct Job {
        /// The launcher's exit status.
        pub status: ExitStatus,
        /// Every PE's standard output.
        pub stdout: String,
        /// Standard output, then standard error.
        pub all: String,
        /// Wall time of the whole job.
        pub elapsed: Duration,
    }

    impl Job {
        /// Fail the test unless the launcher succeeded and each of the `n`
        /// PEs printed `PE k: OK` followed by `ok_suffix`; `what` (the
        /// command, provider, environment) names the job in the message.
        ///
        /// # Panics
        /// On either failure, with the job's whole output.
        pub fn assert_every_pe_ok(&self, n: u32, what: &str, ok_suffix: &str) {
            assert!(self.status.success(), "{what} failed ({}):\n{}", self.status, self.all);
            for pe in 0..n {
                assert!(self.all.contains(&format!("PE {pe}: OK{ok_suffix}")), "PE {pe} did not report OK:\n{}", self.all);
            }
        }
    }

    /// `cpnet-run -n n --grace 25 -- program args` with `CPNET_PROVIDER =
    /// provider`, `CPNET_WAIT_TIMEOUT = 60` and `RUST_LOG = warn` (`env`
    /// overrides any of them); SIGTERM to the launcher, and a panic, after
    /// `limit`.
    ///
    /// # Panics
    /// If the launcher cannot start or the job outlives `limit`.
    pub fn job(
        launcher: &Path,
        n: u32,
        provider: &str,
        program: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        limit: Duration,
    ) -> Job {
        let _one = ONE_JOB_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut cmd = Command::new(launcher);
        cmd.args(["-n", &n.to_string(), "--grace", "25", "--"])
            .arg(program)
            .args(args)
            .env("CPNET_PROVIDER", provider)
            .env("CPNET_WAIT_TIMEOUT", "60")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let t = Instant::now();
        let child = cmd.spawn().expect("start cpnet-run");
        let what = || format!("cpnet-run -n {n} {} {args:?} over {provider}", program.display());
        finish(child, t, limit, &what())
    }

    /// Waits for a started launcher (`child`, its output piped, started at
    /// `t`) for at most `limit` from now: what it printed and how it ended.
    ///
    /// # Panics
    /// After SIGTERM to the launcher (which kills its PEs), if it outlives
    /// `limit`; `what` names it in the message.
    pub fn finish(child: std::process::Child, t: Instant, limit: Duration, what: &str) -> Job {
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(limit) {
            Ok(r) => r.expect("wait for cpnet-run"),
            Err(_) => {
                // SAFETY: kill(2) on the launcher we started; it kills its
                // PEs when it gets SIGTERM.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                panic!("{what} did not finish within {limit:?}");
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let all = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
        Job { status: out.status, stdout, all, elapsed: t.elapsed() }
    }
}
