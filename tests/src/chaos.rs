//! Peer-death trials (issue 7): run a program as N PEs under `cpnet-run`,
//! SIGKILL one PE at a random moment, and check what a user of a 512-GPU
//! job needs: every other PE ends non-zero on its own, says which PE died,
//! the whole job is over within [`Limits::end_within`] (30 s), and no
//! process is left behind.
//!
//! `cpnet-chaos` (src/bin) runs many trials and prints one line each plus a
//! summary; `apps/tests/peer_death.rs` runs a few in CI.
//!
//! Which PE is which comes from `/proc`: the launcher's children and their
//! `CPNET_PE` variable. Each trial's verdict needs the launcher's closing
//! "cpnet-run: PE exit statuses:" line (printed when a job fails).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What a trial runs.
#[derive(Clone, Debug)]
pub struct Trial {
    /// The `cpnet-run` binary.
    pub launcher: PathBuf,
    /// PEs.
    pub pes: u32,
    /// The program every PE runs, and its arguments.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (`CPNET_PROVIDER`, ...).
    pub env: Vec<(String, String)>,
}

/// Bounds of a trial.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The job must be over this long after the kill (the 30 s).
    pub end_within: Duration,
    /// The PEs must all be running within this long of the start.
    pub start_within: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { end_within: Duration::from_secs(30), start_within: Duration::from_secs(60) }
    }
}

/// How a trial went.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The PE killed.
    pub victim: u32,
    /// Seconds from the moment every PE was running to the kill.
    pub kill_after: f64,
    /// Seconds from the kill to the launcher's exit (every PE gone).
    pub ended_after: f64,
    /// Every check that failed (empty: the trial passed).
    pub failures: Vec<String>,
    /// The job had finished before the kill: the trial does not count.
    /// Also set when the launcher exited with status 0 (the victim had
    /// exited by itself, unreaped, when the signal came), and when every
    /// other PE exited with status 0: they passed the collective finalize,
    /// which needs the victim's part, so the victim was killed after its
    /// last communication (in its teardown).
    pub missed: bool,
    /// Everything the job printed (stdout, then stderr).
    pub output: String,
}

impl Outcome {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        !self.missed && self.failures.is_empty()
    }
}

/// Run one trial: start the job, wait until all `pes` PE processes run,
/// sleep `kill_after`, SIGKILL PE `victim`, wait for the launcher, check.
///
/// # Errors
/// When the job cannot be started or its PEs do not appear in time (a
/// broken setup, not a failed trial).
pub fn run_trial(t: &Trial, victim: u32, kill_after: Duration, lim: Limits) -> Result<Outcome, String> {
    static TRIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    // Relaxed: a unique number for the log's name, nothing else.
    let n = TRIALS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out_path = std::env::temp_dir().join(format!("cpnet-chaos-{}-{n}.log", std::process::id()));
    let out_file = std::fs::File::create(&out_path).map_err(|e| format!("{}: {e}", out_path.display()))?;
    let err_file = out_file.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&t.launcher);
    cmd.args(["-n", &t.pes.to_string(), "--"]).arg(&t.program).args(&t.args).stdin(Stdio::null()).stdout(out_file).stderr(err_file);
    for (k, v) in &t.env {
        cmd.env(k, v);
    }
    let mut launcher = cmd.spawn().map_err(|e| format!("starting {}: {e}", t.launcher.display()))?;
    let pids = match wait_for_pes(&mut launcher, t.pes, lim.start_within) {
        Ok(p) => p,
        Err(e) => {
            let _ = launcher.kill();
            let _ = launcher.wait();
            return Err(format!("{e}\n{}", read(&out_path)));
        }
    };
    let up = Instant::now();
    std::thread::sleep(kill_after);
    let mut outcome = Outcome {
        victim,
        kill_after: up.elapsed().as_secs_f64(),
        ended_after: 0.0,
        failures: Vec::new(),
        missed: false,
        output: String::new(),
    };
    if launcher.try_wait().map_err(|e| e.to_string())?.is_some() {
        outcome.missed = true;
        outcome.output = read(&out_path);
        let _ = std::fs::remove_file(&out_path);
        return Ok(outcome);
    }
    let victim_pid = pids[&victim];
    // SAFETY: kill(2) with a pid of our launcher's child, read from /proc
    // just now; SIGKILL is the fault being injected.
    unsafe { libc::kill(victim_pid as libc::pid_t, libc::SIGKILL) };
    let killed = Instant::now();
    let status = loop {
        if let Some(st) = launcher.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        if killed.elapsed() > lim.end_within + Duration::from_secs(30) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    outcome.ended_after = killed.elapsed().as_secs_f64();
    let Some(status) = status else {
        outcome.failures.push(format!("the job had not ended {:.0} s after the kill; killing it", outcome.ended_after));
        // SAFETY: SIGTERM to our own child (the launcher): it kills its PEs.
        unsafe { libc::kill(launcher.id() as libc::pid_t, libc::SIGTERM) };
        let _ = launcher.wait();
        outcome.output = read(&out_path);
        return Ok(outcome);
    };
    outcome.output = read(&out_path);
    let _ = std::fs::remove_file(&out_path);
    // Nothing left: every PE pid is gone (the launcher reaped them). Checked
    // first: a process left behind fails even a late-kill trial.
    for (pe, pid) in &pids {
        if cmdline(*pid).is_some_and(|c| c.contains(&*t.program.to_string_lossy())) {
            outcome.failures.push(format!("PE {pe} (pid {pid}) is still running after the job ended"));
            // SAFETY: kill(2) of a process of this trial that outlived it.
            unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
        }
    }
    // A late kill: the launcher succeeded, so every PE, the victim
    // included, exited with status 0 -- the victim had exited (a zombie
    // not yet reaped) when the signal was sent; a PE killed by SIGKILL
    // makes the launcher fail. Or every other PE exited 0: they passed the
    // collective finalize with the victim.
    if outcome.failures.is_empty()
        && (status.success()
            || statuses(&outcome.output).is_some_and(|st| {
                (0..t.pes).filter(|&pe| pe != victim).all(|pe| st.get(&pe).is_some_and(|w| *w == "exited with status 0"))
            }))
    {
        outcome.missed = true;
        return Ok(outcome);
    }
    if outcome.ended_after > lim.end_within.as_secs_f64() {
        outcome.failures.push(format!("the job took {:.1} s to end after the kill (limit {:?})", outcome.ended_after, lim.end_within));
    }
    check_output(&outcome.output, t.pes, victim, &mut outcome.failures);
    Ok(outcome)
}

/// The checks on what the job printed: the launcher's status of every PE
/// (the victim killed by signal 9, every other PE exited non-zero by
/// itself, none killed by the launcher), and a line from every survivor
/// that names the dead PE.
pub fn check_output(out: &str, pes: u32, victim: u32, failures: &mut Vec<String>) {
    if out.lines().any(|l| l.starts_with("cpnet-run: killing PEs")) {
        failures.push("the launcher had to kill surviving PEs (they did not exit by themselves)".into());
    }
    let Some(statuses) = statuses(out) else {
        failures.push("no 'cpnet-run: PE exit statuses:' line".into());
        return;
    };
    for pe in 0..pes {
        let Some(what) = statuses.get(&pe) else {
            failures.push(format!("no exit status for PE {pe}"));
            continue;
        };
        if pe == victim {
            if !what.starts_with("killed by signal 9") {
                failures.push(format!("victim PE {pe}: {what}"));
            }
        } else if !what.starts_with("exited with status ") || what.starts_with("exited with status 0") {
            failures.push(format!("survivor PE {pe}: {what} (wanted a non-zero exit of its own)"));
        } else if !names_dead_pe(out, pe, victim) {
            failures.push(format!("PE {pe} printed no line naming the dead PE {victim}"));
        }
    }
}

/// The launcher's "cpnet-run: PE exit statuses: PE 0 exited with status
/// 1; PE 1 killed by signal 9 (SIGKILL); ..." line, by PE.
fn statuses(out: &str) -> Option<HashMap<u32, &str>> {
    let summary = out.lines().find_map(|l| l.strip_prefix("cpnet-run: PE exit statuses: "))?;
    Some(
        summary
            .split("; ")
            .filter_map(|s| {
                let s = s.strip_prefix("PE ")?;
                let (pe, what) = s.split_once(' ')?;
                Some((pe.parse().ok()?, what))
            })
            .collect(),
    )
}

/// Whether some line spoken by PE `pe` (`"... PE <pe>: ..."`) names PE
/// `dead` (`"PE <dead>"` not followed by a digit).
pub fn names_dead_pe(out: &str, pe: u32, dead: u32) -> bool {
    let speaker = format!("PE {pe}:");
    let named = format!("PE {dead}");
    out.lines().any(|l| {
        l.contains(&speaker)
            && l.match_indices(&named).any(|(i, m)| {
                let after = l[i + m.len()..].chars().next();
                !after.is_some_and(|c| c.is_ascii_digit())
            })
    })
}

/// Wait until `launcher` has `pes` children, each with `CPNET_PE` set;
/// their pids by PE.
fn wait_for_pes(launcher: &mut Child, pes: u32, within: Duration) -> Result<HashMap<u32, u32>, String> {
    let t0 = Instant::now();
    loop {
        if let Some(st) = launcher.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("cpnet-run ended ({st}) before all {pes} PEs were seen running"));
        }
        let mut found = HashMap::new();
        for pid in children(launcher.id()) {
            if let Some(pe) = env_pe(pid) {
                found.insert(pe, pid);
            }
        }
        if found.len() == pes as usize {
            return Ok(found);
        }
        if t0.elapsed() > within {
            return Err(format!("only {} of {pes} PEs running after {within:?}", found.len()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Pids whose parent is `ppid` (from `/proc/*/stat`).
fn children(ppid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "pid (comm) state ppid ...": comm may hold spaces; parse after ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        if rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(ppid) {
            out.push(pid);
        }
    }
    out
}

/// `CPNET_PE` of process `pid`, once its environment is the PE's (after exec).
fn env_pe(pid: u32) -> Option<u32> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| kv.strip_prefix(b"CPNET_PE=")).and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}

fn cmdline(pid: u32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline")).ok().map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn read(p: &Path) -> String {
    std::fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_reads_the_launcher_and_the_survivors() {
        let good = "cpnet: PE 0: PE 1 failed: process (pid 9) killed by signal 9 (SIGKILL); aborting this PE\n\
                    allreduce: error: PE 2: bootstrap: PE 1 failed: gone\n\
                    cpnet-run: PE 1 (pid 9) killed by signal 9 (SIGKILL)\n\
                    cpnet-run: PE exit statuses: PE 0 exited with status 1; PE 1 killed by signal 9 (SIGKILL); PE 2 exited with status 1\n";
        let mut f = Vec::new();
        check_output(good, 3, 1, &mut f);
        assert!(f.is_empty(), "{f:?}");

        // PE 2 exits 0; PE 0 never names PE 1 (only PE 10); the launcher killed someone.
        let bad = "cpnet: PE 0: PE 10 failed\ncpnet-run: killing PEs 2 (SIGKILL)\n\
                   cpnet-run: PE exit statuses: PE 0 exited with status 1; PE 1 killed by signal 9 (SIGKILL); PE 2 exited with status 0\n";
        let mut f = Vec::new();
        check_output(bad, 3, 1, &mut f);
        assert_eq!(f.len(), 3, "{f:?}");
        assert!(f[0].contains("launcher had to kill") && f[1].contains("PE 0 printed no line") && f[2].contains("survivor PE 2"), "{f:?}");

        let mut f = Vec::new();
        check_output("nothing", 2, 0, &mut f);
        assert_eq!(f, vec!["no 'cpnet-run: PE exit statuses:' line".to_owned()]);
    }
}
