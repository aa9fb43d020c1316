//! `sssp`: Graph500 shortest paths by delta-stepping over cpnet, remote
//! relaxations as remote atomic minimums. See [`cpnet_apps::sssp`].
//!
//! ```text
//! cpnet-run -n 2 -- sssp -scale 14 -verify
//! cpnet-run -n 2 -- sssp -scale 14 -controller fixed -delta 0.05
//! cpnet-run -n 2 -- sssp -file roads.gr -root 0 -verify
//! ```

use std::process::ExitCode;

use cpnet_apps::cli::{error_text, parse_args};
use cpnet_apps::sssp::{Args, run};

fn main() -> ExitCode {
    let args: Args = parse_args();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("sssp: error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}
