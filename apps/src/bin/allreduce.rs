//! `allreduce`: the multi-ring allreduce of ComP-Net §5.4 from inside the
//! work-groups, printed as nccl-tests' `all_reduce_perf` prints it. See
//! [`cpnet_apps::allreduce`] for the algorithm.
//!
//! ```text
//! cpnet-run -n 2 -- allreduce -b 8 -e 256M -f 2 -wgs 4
//! cpnet-run -n 4 -- allreduce -b 8 -e 4M -f 4 -type double -iters 5 -warmup 1
//! ```

use std::process::ExitCode;

use cpnet_apps::allreduce::{Args, run};
use cpnet_apps::cli::error_text;

fn main() -> ExitCode {
    let args = Args::from_command_line();
    match run(&args) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(wrong) => {
            eprintln!("allreduce: {wrong} wrong element(s)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("allreduce: error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}
