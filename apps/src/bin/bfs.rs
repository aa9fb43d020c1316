//! `bfs`: the Graph500 breadth-first search over cpnet. See
//! [`cpnet_apps::bfs`] for the algorithm, the protocol and the output.
//!
//! ```text
//! cpnet-run -n 2 -- bfs -scale 16 -verify
//! cpnet-run -n 4 -- bfs -scale 16 -direction top-down
//! cpnet-run -n 2 -- bfs -file graph.mtx -root 0 -verify
//! cpnet-run -n 2 -- bfs -variant intra-kernel -scale 20 -verify
//! cpnet-run -n 2 -- bfs -variant inter-kernel -scale 20
//! ```

use std::process::ExitCode;

use cpnet_apps::bfs::{Args, run};
use cpnet_apps::cli::{error_text, parse_args};

fn main() -> ExitCode {
    let args: Args = parse_args();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bfs: error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}
