//! `cpnet-run`: starts the PEs of a cpnet job on this host, like
//! `mpirun -np N`.
//!
//! ```text
//! cpnet-run -n N [--grace SECS] [--transport-map] [--] PROGRAM [ARGS...]
//! ```
//!
//! It runs the job's rendezvous server ([`cpnet::bootstrap::Server`]) on
//! `127.0.0.1` and starts N copies of PROGRAM with `CPNET_PE`,
//! `CPNET_N_PES`, `CPNET_LOCAL_PE`, `CPNET_LOCAL_SIZE` and
//! `CPNET_BOOTSTRAP_ADDR` set (see [`cpnet::env`]), and with
//! `--transport-map` also `CPNET_TRANSPORT_MAP=1`: each PE then prints, after
//! init, the path to every PE and the provider ([`cpnet::transport_map`]).
//! The PEs inherit stdin, stdout and stderr.
//!
//! * When a PE exits with a non-zero status or is killed by a signal,
//!   cpnet-run prints one line saying so, tells the other PEs through the
//!   rendezvous (their collectives fail with that line's reason), gives them
//!   `--grace` seconds to exit, then kills what remains (SIGKILL).
//! * SIGINT or SIGTERM to cpnet-run sends SIGTERM to every PE, then SIGKILL
//!   after `--grace` seconds; a second SIGINT/SIGTERM kills at once.
//! * Each PE runs in its own process group, so "kill a PE" kills what it
//!   started too (e.g. the program a shell script runs). The flip side: a PE
//!   reading from a terminal is a background job and is stopped (SIGTTIN);
//!   redirect stdin from a file or pipe instead.
//! * Each PE gets `PR_SET_PDEATHSIG = SIGKILL`, so the PEs die with
//!   cpnet-run even if it is killed with SIGKILL.
//! * The rendezvous serves repeated init: a PE may call `init` ...
//!   `finalize` again and again, as long as every PE does the same; it runs
//!   until every PE process has ended. A PE that ends while the others
//!   start another cycle fails the job (see "Repeated init" in
//!   [`cpnet::bootstrap`]).
//!
//! * It gives the PEs the job's key for the proxy daemons
//!   (`CPNET_JOB_ID`, `CPNET_JOB_TOKEN`, drawn at random unless set;
//!   [`cpnet::daemon`]) and the daemon binary beside it (`CPNET_PROXYD`,
//!   unless set); the PEs start the daemons they need (the host's
//!   for CPU PEs with `CPNET_PROXY=daemon`, one per GPU for GPU PEs under
//!   MPS). After the job it removes what a daemon that died left behind
//!   (its socket file, libfabric shm regions).
//!
//! When a PE failed (or cpnet-run was interrupted), the last line is
//! `cpnet-run: PE exit statuses: PE 0 exited with status 1; PE 1 killed by
//! signal 9 (SIGKILL); ...`, every PE in order.
//!
//! Exit status: 0 when every PE exited with 0; otherwise the first failed
//! PE's exit status, or 128 + its signal; 127 when PROGRAM cannot be started;
//! 128 + signal when cpnet-run was interrupted and no PE failed; 1 on
//! cpnet-run's own errors; 2 on usage errors.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use cpnet::bootstrap::{Server, ServerHandle};
use cpnet::env;

/// How often the waiter looks at the PEs and the signal flag.
const POLL: Duration = Duration::from_millis(10);
/// How long the rendezvous holds back "connection to PE k lost" so that the
/// exit status (learned within `POLL`) is what the other PEs are told.
const LOST_PEER_DELAY: Duration = Duration::from_millis(250);

#[derive(Parser, Debug)]
#[command(
    name = "cpnet-run",
    version,
    about = "Start the PEs of a cpnet job on this host (like `mpirun -np N`)",
    after_help = "Each PE gets CPNET_PE, CPNET_N_PES, CPNET_LOCAL_PE, CPNET_LOCAL_SIZE and \
                  CPNET_BOOTSTRAP_ADDR (and CPNET_TRANSPORT_MAP=1 with --transport-map). \
                  Exit status: 0 if all PEs exit 0, else the first failed PE's status \
                  (128+signal if killed); 127 if PROGRAM cannot be started."
)]
struct Args {
    /// Number of PEs (processes) to start.
    #[arg(short = 'n', long = "np", value_name = "N", value_parser = clap::value_parser!(i32).range(1..))]
    n: i32,

    /// Seconds the other PEs get to exit after one failed (or after cpnet-run
    /// forwarded SIGTERM) before they are killed with SIGKILL.
    #[arg(long, value_name = "SECS", default_value = "20", value_parser = parse_grace)]
    grace: Duration,

    /// Every PE prints, after init, one line per PE on stderr: the path its
    /// operations take there and the provider (sets CPNET_TRANSPORT_MAP=1).
    #[arg(long)]
    transport_map: bool,

    /// The program to run as every PE, and its arguments.
    #[arg(
        value_name = "PROGRAM",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

fn parse_grace(s: &str) -> Result<Duration, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .and_then(|x| Duration::try_from_secs_f64(x).ok())
        .ok_or_else(|| format!("{s:?} is not a number of seconds >= 0"))
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .try_init();
    let args = Args::parse();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("cpnet-run: {e}");
            ExitCode::from(1)
        }
    }
}

/// The signal cpnet-run last received (SIGINT/SIGTERM), 0 if none since the
/// last look. Written only by [`on_signal`].
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: a lock-free atomic store, nothing else.
    SIGNAL.store(sig, Ordering::Relaxed);
}

/// One started PE.
struct Proc {
    pe: i32,
    child: Child,
    pid: u32,
    /// Set once reaped: after that its pid (and process group id) may be
    /// reused, so it is never signalled again.
    status: Option<ExitStatus>,
    /// cpnet-run sent it SIGTERM or SIGKILL (its death is not news).
    signalled_by_us: bool,
}

impl Proc {
    /// Sends `sig` to the PE's process group (it is the group leader), or to
    /// the PE alone if it left its group. Only while it is not reaped.
    fn signal(&mut self, sig: libc::c_int) {
        if self.status.is_some() {
            return;
        }
        self.signalled_by_us = true;
        let pid = self.pid as libc::pid_t;
        // SAFETY: kill has no memory-safety preconditions. `pid` is our
        // unreaped child, so neither it nor its group id can have been reused.
        if unsafe { libc::kill(-pid, sig) } != 0 {
            // SAFETY: as above.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

fn run(args: &Args) -> Result<u8, String> {
    let tuning = env::Tuning::from_env().map_err(|e| e.to_string())?;
    cpnet::signals::on_sigint_sigterm(on_signal).map_err(|e| format!("installing signal handlers: {e}"))?;

    let n = args.n;
    let server = Server::bind("127.0.0.1:0")
        .and_then(|s| {
            s.with_connect_timeout(tuning.connect_timeout)
                .with_lost_peer_delay(LOST_PEER_DELAY)
                .with_repeated_init(true)
                .spawn(n)
        })
        .map_err(|e| format!("cannot start the rendezvous: {e}"))?;
    let addr = server.local_addr().to_string();

    // The job's key for a proxy daemon, unless the environment has one:
    // drawn for every job, since GPU PEs may take their GPU's daemon without
    // CPNET_PROXY (under MPS). The PEs start the daemons they need (the CPU
    // PEs' one, or one per GPU): starting one here could only guess which.
    let key = match &tuning.job {
        Some(k) => k.clone(),
        None => cpnet::daemon::new_job_key().map_err(|e| format!("drawing the job's token: {e}"))?,
    };
    let job = Some(&key);

    let (program, rest) = args.command.split_first().ok_or("no program given")?;
    let mut procs: Vec<Proc> = Vec::with_capacity(n as usize);
    for pe in 0..n {
        match spawn_pe(program, rest, pe, n, &addr, args.transport_map, job) {
            Ok(child) => {
                let pid = child.id();
                tracing::debug!(pe, pid, "started");
                procs.push(Proc {
                    pe,
                    child,
                    pid,
                    status: None,
                    signalled_by_us: false,
                });
            }
            Err(e) => {
                eprintln!(
                    "cpnet-run: cannot start {} (PE {pe}): {e}",
                    program.to_string_lossy()
                );
                for p in &mut procs {
                    p.signal(libc::SIGKILL);
                }
                for p in &mut procs {
                    let _ = p.child.wait();
                }
                return Ok(127);
            }
        }
    }
    let code = supervise(procs, &server, args.grace);
    // A daemon that died during the job (the CPU PEs' one, or a GPU's,
    // which GPU PEs start by themselves) left its socket file and libfabric
    // shm regions: remove them (nothing, for one that lives).
    if tuning.proxyd_dir.is_dir() {
        let n = cpnet::daemon::DaemonPaths::clean_up_dead_daemons(&tuning.proxyd_dir);
        if n > 0 {
            tracing::debug!("removed what {n} dead cpnet-proxyd left in {}", tuning.proxyd_dir.display());
        }
    }
    Ok(code)
}

/// tcp;ofi_rxm's eager limit (`FI_OFI_RXM_BUFFER_SIZE`, fi_rxm(7)): a
/// message above it takes rxm's rendezvous protocol, one more round trip.
/// libfabric's default is 16 KiB, so a staged 16 KiB put (a Jacobi halo row of
/// 4096 floats) with cpnet's header went by rendezvous: 56 µs one-way
/// against 36 µs with 64 KiB (docs/results.md, session 14). The launcher
/// sets 64 KiB for its PEs unless the user set it; under mpirun or srun,
/// pass it the same way (`-x FI_OFI_RXM_BUFFER_SIZE=65536`). It is
/// libfabric's variable, read when the provider loads, so the launcher
/// (before the PE starts) is the only place it can be set safely.
const RXM_EAGER_VAR: &str = "FI_OFI_RXM_BUFFER_SIZE";
/// The eager limit the launcher gives its PEs, bytes.
const RXM_EAGER_BYTES: &str = "65536";

fn spawn_pe(
    program: &OsString,
    rest: &[OsString],
    pe: i32,
    n: i32,
    addr: &str,
    transport_map: bool,
    job: Option<&env::JobKey>,
) -> io::Result<Child> {
    let mut cmd = Command::new(program);
    if transport_map {
        cmd.env(env::TRANSPORT_MAP, "1");
    }
    if let Some(k) = job {
        cmd.env(env::JOB_ID, k.id.to_string()).env(env::JOB_TOKEN, k.token_hex());
    }
    if std::env::var_os(RXM_EAGER_VAR).is_none() {
        cmd.env(RXM_EAGER_VAR, RXM_EAGER_BYTES);
    }
    // The daemon the PEs start (CPNET_PROXYD): the one beside cpnet-run
    // unless set. A PE looks beside its own program, then on PATH; a C or
    // CUDA program built elsewhere would find neither.
    if std::env::var_os(env::PROXYD).is_none()
        && let Some(d) = std::env::current_exe().ok().and_then(|p| Some(p.parent()?.join("cpnet-proxyd"))).filter(|d| d.is_file())
    {
        cmd.env(env::PROXYD, d);
    }
    cmd.args(rest)
        .env(env::PE, pe.to_string())
        .env(env::N_PES, n.to_string())
        .env(env::LOCAL_PE, pe.to_string())
        .env(env::LOCAL_SIZE, n.to_string())
        .env(env::BOOTSTRAP_ADDR, addr)
        .process_group(0);
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let in_child = move || {
        // Die with cpnet-run. PDEATHSIG fires when the *thread* that forked
        // exits: every PE is started from the main thread, which lives until
        // cpnet-run exits.
        // SAFETY: prctl(PR_SET_PDEATHSIG) is a plain system call (async-signal-safe),
        // given integer arguments only.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        if rc == -1 {
            return Err(io::Error::last_os_error());
        }
        // cpnet-run may have died before the prctl: then no signal will come.
        // SAFETY: getppid is async-signal-safe and has no preconditions.
        if unsafe { libc::getppid() } != parent {
            // SAFETY: _exit is async-signal-safe; it ends the forked child
            // without running the parent's atexit handlers or destructors.
            unsafe { libc::_exit(1) };
        }
        Ok(())
    };
    // SAFETY: `in_child` runs between fork and exec; it calls only prctl,
    // getppid and _exit (async-signal-safe), allocates nothing, takes no
    // lock, and reads only `parent`, a copied integer.
    unsafe { cmd.pre_exec(in_child) };
    cmd.spawn()
}

/// "exited with status 3", "killed by signal 9 (SIGKILL)".
fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    match status.signal() {
        Some(sig) => {
            let core = if status.core_dumped() {
                ", core dumped"
            } else {
                ""
            };
            match signal_name(sig) {
                Some(name) => format!("killed by signal {sig} ({name}{core})"),
                None => format!("killed by signal {sig}{core}"),
            }
        }
        None => format!("ended with {status}"),
    }
}

/// What cpnet-run exits with for a failed PE's status.
fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1).max(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}

fn signal_name(sig: libc::c_int) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

fn pe_list(procs: &[&Proc]) -> String {
    let mut s: Vec<String> = procs
        .iter()
        .take(16)
        .map(|p| format!("{} (pid {})", p.pe, p.pid))
        .collect();
    if procs.len() > 16 {
        s.push("...".into());
    }
    s.join(", ")
}

/// Waits for every PE; returns cpnet-run's exit status.
fn supervise(mut procs: Vec<Proc>, server: &ServerHandle, grace: Duration) -> u8 {
    // The first PE that failed on its own, and its exit code.
    let mut first: Option<(i32, u8)> = None;
    // Later PEs that failed on their own: "PE 2 (exited with status 1)".
    let mut later: Vec<String> = Vec::new();
    // When the remaining PEs get SIGKILL, and why.
    let mut kill_at: Option<(Instant, String)> = None;
    let mut interrupted: Option<libc::c_int> = None;
    // SIGKILL was sent to whatever ran at the time.
    let mut killed = false;

    loop {
        let mut running = 0;
        for p in &mut procs {
            if p.status.is_some() {
                continue;
            }
            let status = match p.child.try_wait() {
                Ok(None) => {
                    running += 1;
                    continue;
                }
                Ok(Some(status)) => status,
                Err(e) => {
                    // Cannot happen for our own child; do not spin on it.
                    eprintln!("cpnet-run: waiting for PE {} (pid {}): {e}", p.pe, p.pid);
                    ExitStatus::from_raw(1 << 8)
                }
            };
            p.status = Some(status);
            let what = describe(status);
            // A PE that never joined the rendezvous fails the job now rather
            // than at the connect timeout (a no-op for non-cpnet programs:
            // nobody is connected to be told).
            server.notify_exit(p.pe, format!("process (pid {}) {what}", p.pid));
            if status.success() {
                tracing::debug!(pe = p.pe, "PE exited with status 0");
                continue;
            }
            if p.signalled_by_us {
                tracing::debug!(pe = p.pe, "PE {what} (signalled by cpnet-run)");
                continue;
            }
            if first.is_none() {
                eprintln!("cpnet-run: PE {} (pid {}) {what}", p.pe, p.pid);
                server.notify_failure(p.pe, format!("process (pid {}) {what}", p.pid));
                first = Some((p.pe, exit_code(status)));
                if kill_at.is_none() {
                    kill_at = Some((
                        Instant::now() + grace,
                        format!("{}s after PE {} failed", grace.as_secs_f64(), p.pe),
                    ));
                }
            } else {
                later.push(format!("PE {} ({what})", p.pe));
            }
        }
        if running == 0 {
            break;
        }

        let sig = SIGNAL.swap(0, Ordering::Relaxed);
        if sig != 0 {
            let name = signal_name(sig).unwrap_or("a signal");
            let alive: Vec<&Proc> = procs.iter().filter(|p| p.status.is_none()).collect();
            if interrupted.is_none() {
                eprintln!(
                    "cpnet-run: got {name}; sending SIGTERM to PEs {} (SIGKILL in {}s; repeat \
                     to kill at once)",
                    pe_list(&alive),
                    grace.as_secs_f64()
                );
                interrupted = Some(sig);
                for p in &mut procs {
                    p.signal(libc::SIGTERM);
                }
                let at = Instant::now() + grace;
                if kill_at.as_ref().is_none_or(|(t, _)| at < *t) {
                    kill_at = Some((at, format!("{}s after {name}", grace.as_secs_f64())));
                }
            } else if !killed {
                kill_at = Some((Instant::now(), format!("on a second {name}")));
            }
        }

        if let Some((at, why)) = &kill_at
            && !killed
            && Instant::now() >= *at
        {
            let alive: Vec<&Proc> = procs.iter().filter(|p| p.status.is_none()).collect();
            eprintln!(
                "cpnet-run: killing PEs {} (SIGKILL): still running {why}",
                pe_list(&alive)
            );
            for p in &mut procs {
                p.signal(libc::SIGKILL);
            }
            // They are reaped on the next rounds.
            killed = true;
        }
        std::thread::sleep(POLL);
    }

    if !later.is_empty() {
        let shown: Vec<&str> = later.iter().take(8).map(String::as_str).collect();
        let more = if later.len() > 8 { ", ..." } else { "" };
        eprintln!("cpnet-run: also failed: {}{more}", shown.join(", "));
    }
    if first.is_some() || interrupted.is_some() {
        // How every PE ended, in PE order, on one line (the reliability
        // trials, scripts/peer_death.sh, read it): "PE 0 exited with status
        // 1; PE 1 killed by signal 9 (SIGKILL); ...", a PE killed by
        // cpnet-run itself marked "(by cpnet-run)".
        let all: Vec<String> = procs
            .iter()
            .map(|p| {
                let what = p.status.map_or_else(|| "status unknown".to_owned(), describe);
                let by_us = if p.signalled_by_us { " (by cpnet-run)" } else { "" };
                format!("PE {} {what}{by_us}", p.pe)
            })
            .collect();
        eprintln!("cpnet-run: PE exit statuses: {}", all.join("; "));
    }
    match (first, interrupted) {
        (Some((_, code)), _) => code,
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 0,
    }
}
