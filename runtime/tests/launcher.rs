//! `cpnet-run`, run as a real process: environment of the PEs, exit status,
//! failure propagation, signals, cleanup of the PEs' processes.
//!
//! Some tests use this test binary itself as the PE program: run with
//! `CPNET_TEST_PE_MODE` set, the `pe_program` test below acts as a PE
//! (bootstrap, allgather, finalize) instead of doing nothing.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use cpnet::bootstrap::Bootstrap;
use cpnet::env::{Launch, Launcher};

const CPNET_RUN: &str = env!("CARGO_BIN_EXE_cpnet-run");
const PE_MODE: &str = "CPNET_TEST_PE_MODE";

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "cpnet-launcher-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs `cpnet-run args...` with output to files (so that a leftover PE
/// holding a pipe cannot block the test), killing it after `limit`.
fn cpnet_run(scratch: &Scratch, args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Outcome {
    let (out, err) = (scratch.path("stdout"), scratch.path("stderr"));
    let mut cmd = Command::new(CPNET_RUN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "cpnet-run {args:?} still running after {limit:?}; stderr:\n{}",
                fs::read_to_string(&err).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(10));
    };
    Outcome {
        status,
        stdout: fs::read_to_string(&out).unwrap(),
        stderr: fs::read_to_string(&err).unwrap(),
        elapsed: t0.elapsed(),
    }
}

/// Whether `pid` is gone (or a zombie nobody reaped: it runs nothing).
fn process_gone(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

fn wait_gone(pid: i32, limit: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if process_gone(pid) {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    false
}

fn read_pid(p: &Path) -> i32 {
    fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn three_pes_get_their_environment() {
    let s = Scratch::new("env");
    let o = cpnet_run(
        &s,
        &[
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            r#"test "$CPNET_N_PES" = 3 && test "$CPNET_LOCAL_PE" = "$CPNET_PE" &&
               test "$CPNET_LOCAL_SIZE" = 3 && test -n "$CPNET_BOOTSTRAP_ADDR" &&
               echo pe=$CPNET_PE"#,
        ],
        &[],
        Duration::from_secs(20),
    );
    assert!(o.status.success(), "{:?}\n{}", o.status, o.stderr);
    let mut lines: Vec<&str> = o.stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, ["pe=0", "pe=1", "pe=2"]);
    assert_eq!(o.stderr, "");
}

#[test]
fn transport_map_flag_sets_the_variable_for_every_pe() {
    let s = Scratch::new("map");
    let show = ["sh", "-c", r#"echo "pe=$CPNET_PE map=${CPNET_TRANSPORT_MAP-unset}""#];
    let o = cpnet_run(&s, &[&["-n", "2", "--transport-map", "--"][..], &show].concat(), &[], Duration::from_secs(20));
    assert!(o.status.success(), "{:?}\n{}", o.status, o.stderr);
    let mut lines: Vec<&str> = o.stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, ["pe=0 map=1", "pe=1 map=1"]);
    // Without the flag the PEs inherit what cpnet-run was given.
    let o = cpnet_run(&s, &[&["-n", "1", "--"][..], &show].concat(), &[("CPNET_TRANSPORT_MAP", "0")], Duration::from_secs(20));
    assert!(o.status.success(), "{:?}\n{}", o.status, o.stderr);
    assert_eq!(o.stdout, "pe=0 map=0\n");
}

#[test]
fn program_arguments_pass_through_untouched() {
    let s = Scratch::new("args");
    let o = cpnet_run(
        &s,
        &[
            "-n",
            "1",
            "sh",
            "-c",
            r#"echo "$@""#,
            "sh",
            "--grace",
            "-n",
            "x y",
        ],
        &[],
        Duration::from_secs(20),
    );
    assert!(o.status.success(), "{}", o.stderr);
    assert_eq!(o.stdout, "--grace -n x y\n");
}

#[test]
fn failing_pe_sets_the_exit_status() {
    let s = Scratch::new("exit3");
    let o = cpnet_run(
        &s,
        &[
            "-n",
            "3",
            "--",
            "sh",
            "-c",
            r#"[ "$CPNET_PE" = 1 ] && exit 3; exit 0"#,
        ],
        &[],
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(3), "{}", o.stderr);
    assert!(
        o.stderr.contains("cpnet-run: PE 1 (pid ") && o.stderr.contains("exited with status 3"),
        "{}",
        o.stderr
    );
}

#[test]
fn killed_pe_takes_the_job_down_after_the_grace_and_leaves_no_process() {
    let s = Scratch::new("kill9");
    let dir = s.0.display().to_string();
    // Every PE records its shell's pid and its `sleep`'s pid; PE 1 then
    // kills itself with SIGKILL; PE 0 would sleep for a minute.
    let script = format!(
        r#"echo $$ > {dir}/sh$CPNET_PE
           if [ "$CPNET_PE" = 1 ]; then kill -9 $$; fi
           sleep 60 & echo $! > {dir}/sleep$CPNET_PE
           wait"#
    );
    let o = cpnet_run(
        &s,
        &["-n", "2", "--grace", "2", "--", "sh", "-c", &script],
        &[],
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(128 + 9), "{}", o.stderr);
    assert!(o.elapsed < Duration::from_secs(5), "{:?}", o.elapsed);
    assert!(o.elapsed >= Duration::from_millis(1900), "{:?}", o.elapsed);
    let pe1 = read_pid(&s.path("sh1"));
    assert!(
        o.stderr.contains(&format!(
            "cpnet-run: PE 1 (pid {pe1}) killed by signal 9 (SIGKILL)"
        )),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("killing PEs 0 (pid"), "{}", o.stderr);
    // PE 0's shell and the sleep it started are gone.
    for f in ["sh0", "sleep0"] {
        let pid = read_pid(&s.path(f));
        assert!(
            wait_gone(pid, Duration::from_secs(2)),
            "{f} (pid {pid}) still runs"
        );
    }
}

#[test]
fn program_that_cannot_start_gives_127() {
    let s = Scratch::new("enoent");
    let o = cpnet_run(
        &s,
        &["-n", "2", "--", "/nonexistent/cpnet-test-program"],
        &[],
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(127));
    assert!(
        o.stderr
            .contains("cannot start /nonexistent/cpnet-test-program (PE 0)"),
        "{}",
        o.stderr
    );
}

#[test]
fn usage_errors() {
    let s = Scratch::new("usage");
    for args in [
        &["-n", "0", "true"][..],
        &["-n", "2"],
        &["true"],
        &["-n", "2", "--grace", "-1", "true"],
        &["-n", "2", "--transport-map=1", "true"],
        &["-n", "2", "--transport-map=yes", "true"],
    ] {
        let o = cpnet_run(&s, args, &[], Duration::from_secs(20));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", o.stderr);
    }
}

#[test]
fn sigterm_is_forwarded_to_every_pe() {
    let s = Scratch::new("sigterm");
    let (out, err) = (s.path("stdout"), s.path("stderr"));
    let mut child = Command::new(CPNET_RUN)
        .args([
            "-n",
            "2",
            "--grace",
            "10",
            "--",
            "sh",
            "-c",
            r#"trap 'echo term$CPNET_PE; exit 0' TERM; echo ready; while :; do sleep 0.05; done"#,
        ])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while fs::read_to_string(&out).unwrap().matches("ready").count() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "PEs did not start");
        thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t1 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t1.elapsed() > Duration::from_secs(8) {
            let _ = child.kill();
            panic!("cpnet-run did not end after SIGTERM");
        }
        thread::sleep(Duration::from_millis(10));
    };
    let stdout = fs::read_to_string(&out).unwrap();
    let stderr = fs::read_to_string(&err).unwrap();
    // The PEs exited 0 from their trap; cpnet-run reports the signal it got.
    assert_eq!(status.code(), Some(128 + 15), "{stderr}");
    assert!(
        stdout.contains("term0") && stdout.contains("term1"),
        "{stdout}"
    );
    assert!(stderr.contains("got SIGTERM; sending SIGTERM"), "{stderr}");
}

// ---------------------------------------------------------------------------
// This test binary as a PE program
// ---------------------------------------------------------------------------

/// Runs as a PE when `CPNET_TEST_PE_MODE` is set (by the tests below,
/// through cpnet-run); a no-op otherwise.
///
/// Modes: `ok`: allgather of the PE number, barrier, finalize; prints
/// `PE p got [..]`. `die1`: PE 1 SIGKILLs itself after joining; the others
/// print `PE p saw: <error>` from their barrier and exit 1. `skip1`: PE 1
/// exits 0 without joining; the others do as in `die1`.
#[test]
fn pe_program() {
    let Ok(mode) = std::env::var(PE_MODE) else {
        return;
    };
    let launch = Launch::from_env().unwrap();
    if mode == "skip1" && launch.pe == 1 {
        return; // ends with status 0 without ever joining
    }
    assert_eq!(launch.launcher, Launcher::CpnetRun);
    let me = launch.pe;
    let boot = match Bootstrap::connect(&launch, Duration::from_secs(10)) {
        Ok(b) => b,
        // In `skip1`, PE 1 may have exited before we joined: the rendezvous
        // answers our Hello with the failure.
        Err(e) => {
            println!("PE {me} saw: {e}");
            std::process::exit(1);
        }
    };
    match mode.as_str() {
        "ok" => {
            let all = boot.allgather(&[me as u8]).unwrap();
            boot.barrier().unwrap();
            println!("PE {me} got {:?}", all.concat());
            boot.finalize().unwrap();
        }
        "skip1" => match boot.barrier() {
            Ok(()) => println!("PE {me} barrier passed?!"),
            Err(e) => {
                println!("PE {me} saw: {e}");
                std::process::exit(1);
            }
        },
        "die1" => {
            boot.barrier().unwrap(); // everyone joined
            if me == 1 {
                // SAFETY: raise has no memory-safety preconditions.
                unsafe { libc::raise(libc::SIGKILL) };
            }
            match boot.barrier() {
                Ok(()) => println!("PE {me} barrier passed?!"),
                Err(e) => println!("PE {me} saw: {e}"),
            }
            std::process::exit(1);
        }
        other => panic!("unknown {PE_MODE}={other}"),
    }
}

fn run_pe_program(s: &Scratch, n: &str, mode: &str) -> Outcome {
    let me = std::env::current_exe().unwrap();
    let me = me.to_str().unwrap();
    cpnet_run(
        s,
        &[
            "-n",
            n,
            "--grace",
            "5",
            "--",
            me,
            "pe_program",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ],
        &[(PE_MODE, mode)],
        Duration::from_secs(30),
    )
}

#[test]
fn pes_bootstrap_through_cpnet_run() {
    let s = Scratch::new("boot-ok");
    let o = run_pe_program(&s, "4", "ok");
    assert!(
        o.status.success(),
        "{:?}\n{}\n{}",
        o.status,
        o.stdout,
        o.stderr
    );
    for pe in 0..4 {
        assert!(
            o.stdout.contains(&format!("PE {pe} got [0, 1, 2, 3]")),
            "{}",
            o.stdout
        );
    }
}

#[test]
fn pes_learn_the_exit_status_of_a_killed_peer() {
    let s = Scratch::new("boot-die");
    let o = run_pe_program(&s, "3", "die1");
    // The first failure is PE 1's SIGKILL; the others exit 1 on their own,
    // well within the grace, after their barrier failed.
    assert_eq!(o.status.code(), Some(137), "{}\n{}", o.stdout, o.stderr);
    assert!(o.elapsed < Duration::from_secs(5), "{:?}", o.elapsed);
    for pe in [0, 2] {
        // The test harness may have printed "test pe_program ... " first.
        let tag = format!("PE {pe} saw: ");
        let line = o
            .stdout
            .lines()
            .find_map(|l| l.find(&tag).map(|i| &l[i..]))
            .unwrap_or_else(|| panic!("no line from PE {pe}:\n{}", o.stdout));
        assert!(
            line.contains("PE 1 failed: process (pid ")
                && line.contains("killed by signal 9 (SIGKILL)"),
            "{line}"
        );
    }
    assert!(o.stderr.contains("also failed: PE "), "{}", o.stderr);
}

#[test]
fn pe_that_exits_without_joining_fails_the_job_at_once() {
    let s = Scratch::new("boot-skip");
    // The rendezvous connect timeout is 60 s: the job must not wait for it.
    let o = run_pe_program(&s, "2", "skip1");
    assert_eq!(o.status.code(), Some(1), "{}\n{}", o.stdout, o.stderr);
    assert!(o.elapsed < Duration::from_secs(5), "{:?}", o.elapsed);
    assert!(
        o.stdout.contains("PE 0 saw: PE 1 failed: process (pid ")
            && o.stdout
                .contains("exited with status 0 without joining the rendezvous"),
        "{}",
        o.stdout
    );
}

#[test]
fn pes_die_with_a_killed_launcher() {
    let s = Scratch::new("pdeathsig");
    let dir = s.0.display().to_string();
    // Each PE *is* the sleep (exec), so PR_SET_PDEATHSIG applies to it.
    let script = format!("echo $$ > {dir}/pe$CPNET_PE; exec sleep 60");
    let mut child = Command::new(CPNET_RUN)
        .args(["-n", "2", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !(s.path("pe0").exists() && s.path("pe1").exists()) {
        assert!(t0.elapsed() < Duration::from_secs(10), "PEs did not start");
        thread::sleep(Duration::from_millis(10));
    }
    thread::sleep(Duration::from_millis(50)); // let the pid files be written
    child.kill().unwrap(); // SIGKILL: cpnet-run cannot clean up itself
    child.wait().unwrap();
    for f in ["pe0", "pe1"] {
        let pid = read_pid(&s.path(f));
        assert!(
            wait_gone(pid, Duration::from_secs(3)),
            "{f} (pid {pid}) outlived cpnet-run"
        );
    }
}
