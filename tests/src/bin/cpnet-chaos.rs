//! `cpnet-chaos`: peer-death trials. Runs `cpnet-run -n PES -- PROGRAM
//! ARGS` TRIALS times, SIGKILLs a random PE at a random moment of each run,
//! and checks that every other PE exits non-zero by itself with a message
//! naming the dead PE, that the job is over within `--end-within` seconds of
//! the kill, and that no process is left (see [`cpnet_tests::chaos`]).
//!
//! ```text
//! cpnet-chaos --trials 100 --pes 4 --kill-min 0.2 --kill-max 4 -- \
//!     target/release/allreduce -variant cpu -b 8 -e 16M -f 2 -iters 1000
//! ```
//!
//! One line per trial (`trial 7: PE 2 killed after 1.31 s, job over 0.42 s
//! later: ok`), the output of failed trials, and a summary line
//! (`cpnet-chaos: 100 of 100 trials passed ...`). Trials in which the job
//! ended before the kill, or every other PE exited with status 0 (they
//! passed the collective finalize with the victim, which died in its
//! teardown), do not count and are run again. Exit status 0 when
//! every counted trial passed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cpnet_tests::Rng;
use cpnet_tests::chaos::{Limits, Trial, run_trial};

#[derive(Parser, Debug)]
#[command(name = "cpnet-chaos", about = "Kill a random PE of a running cpnet job, many times, and check the others end cleanly")]
struct Args {
    /// Trials to count.
    #[arg(long, default_value_t = 10)]
    trials: u32,
    /// PEs per job.
    #[arg(long, default_value_t = 3)]
    pes: u32,
    /// Earliest kill, seconds after every PE process is running.
    #[arg(long, default_value_t = 0.1)]
    kill_min: f64,
    /// Latest kill, seconds after every PE process is running.
    #[arg(long, default_value_t = 3.0)]
    kill_max: f64,
    /// The job must be over this many seconds after the kill.
    #[arg(long, default_value_t = 30.0)]
    end_within: f64,
    /// Seed of the victims and kill times.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The launcher (default: `cpnet-run` beside this binary).
    #[arg(long)]
    launcher: Option<PathBuf>,
    /// The program every PE runs, and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let launcher = a.launcher.clone().unwrap_or_else(|| {
        std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join("cpnet-run"))).unwrap_or_else(|| "cpnet-run".into())
    });
    let (program, args) = a.command.split_first().expect("clap requires a command");
    let trial = Trial { launcher, pes: a.pes, program: program.into(), args: args.to_vec(), env: Vec::new() };
    let lim = Limits { end_within: Duration::from_secs_f64(a.end_within), ..Limits::default() };
    let mut rng = Rng::new(a.seed);
    let (mut passed, mut counted, mut missed) = (0u32, 0u32, 0u32);
    let mut worst: f64 = 0.0;
    while counted < a.trials {
        let victim = rng.below(u64::from(a.pes)) as u32;
        let frac = rng.below(1_000_001) as f64 / 1e6;
        let kill_after = Duration::from_secs_f64(a.kill_min + frac * (a.kill_max - a.kill_min).max(0.0));
        let o = match run_trial(&trial, victim, kill_after, lim) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("cpnet-chaos: trial {}: could not run: {e}", counted + 1);
                return ExitCode::from(2);
            }
        };
        if o.missed {
            missed += 1;
            println!(
                "(PE {} killed at {:.2} s: the job had ended, or every other PE had finalized with it; not counted)",
                o.victim, o.kill_after
            );
            if missed > 3 * a.trials.max(10) {
                eprintln!("cpnet-chaos: the job keeps ending before the kill; lower --kill-max");
                return ExitCode::from(2);
            }
            continue;
        }
        counted += 1;
        worst = worst.max(o.ended_after);
        if o.passed() {
            passed += 1;
            println!("trial {counted}: PE {} killed after {:.2} s, job over {:.2} s later: ok", o.victim, o.kill_after, o.ended_after);
        } else {
            println!(
                "trial {counted}: PE {} killed after {:.2} s, job over {:.2} s later: FAILED: {}",
                o.victim,
                o.kill_after,
                o.ended_after,
                o.failures.join("; ")
            );
            println!("--- output of trial {counted} ---\n{}--- end ---", o.output);
        }
    }
    println!(
        "cpnet-chaos: {passed} of {counted} trials passed ({} PEs, kills at {:.1}-{:.1} s, slowest end {worst:.2} s after the kill, \
         limit {:.0} s; {missed} runs ended before their kill and were not counted): {} {}",
        a.pes,
        a.kill_min,
        a.kill_max,
        a.end_within,
        program,
        args.join(" ")
    );
    if passed == counted { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
