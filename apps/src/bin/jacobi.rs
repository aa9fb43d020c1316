//! `jacobi`: Jacobi 2D as NVIDIA's multi-gpu-programming-models runs it,
//! with the halo exchange and the norm reduction issued from inside the
//! work-groups through cpnet. See [`cpnet_apps::jacobi`] for the algorithm.
//!
//! ```text
//! cpnet-run -n 2 -- jacobi -nx 1024 -ny 1024 -niter 1000 -wgs 2 -verify
//! cpnet-run -n 2 -- jacobi -nx 1024 -ny 1024 -niter 1000 -csv
//! ```

use std::process::ExitCode;

use cpnet_apps::cli::{error_text, parse_args};
use cpnet_apps::jacobi::{Args, run};

fn main() -> ExitCode {
    let args: Args = parse_args();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("jacobi: error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}
