//! `moe`: expert-parallel MoE dispatch and combine in the style of DeepEP's
//! low-latency kernels, over cpnet (issue 22). See [`cpnet_apps::moe`].
//!
//! ```text
//! cpnet-run -n 2 -- moe -verify                                  # T=128, H=7168, k=8, E=256
//! cpnet-run -n 4 -- moe -tokens 32 -hidden 256 -k 4 -experts 16 -skew 1.2 -verify
//! ```

use std::process::ExitCode;

use cpnet_apps::cli::{error_text, init_pe, parse_args};
use cpnet_apps::moe::{Args, bytes_moved, heap_bytes};

fn main() -> ExitCode {
    let a: Args = parse_args();
    let r = (|| -> anyhow::Result<u64> {
        let (pe, raised) = init_pe(|n| heap_bytes(&a, n as usize))?;
        let (me, n) = (pe.my_pe(), pe.n_pes());
        cpnet_apps::moe::check(&a, n as usize)?;
        if me == 0 {
            println!(
                "# cpnet moe: {n} PEs, {} CPU work-group(s) each; T={} tokens/PE, H={}, k={}, E={} ({} per PE), {} routing (seed {}), provider {}{}",
                a.wgs,
                a.tokens,
                a.hidden,
                a.topk,
                a.experts,
                a.experts / n.max(1) as usize,
                if a.skew > 0.0 { format!("skewed (Zipf s={})", a.skew) } else { "uniform".to_owned() },
                a.seed,
                pe.provider(),
                raised.map(|b| format!(", heap raised to {b} bytes")).unwrap_or_default()
            );
        }
        let (t, wrong) = cpnet_apps::moe::run_cpu(&pe, &a)?;
        let (db, cb) = bytes_moved(&a);
        let all = pe.allgather_bytes(&[t.dispatch_us.to_le_bytes(), t.combine_us.to_le_bytes(), (wrong as f64).to_le_bytes()].concat())?;
        if me == 0 {
            println!("#   PE   dispatch_us   combine_us   dispatch_GB/s   combine_GB/s   #wrong");
            for (p, b) in all.iter().enumerate() {
                let f = |i: usize| f64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
                let (d, c, w) = (f(0), f(1), f(2));
                println!("{p:>6} {d:>13.1} {c:>12.1} {:>15.3} {:>14.3} {w:>8}", db as f64 / d / 1e3, cb as f64 / c / 1e3);
            }
            let total: f64 = all.iter().map(|b| f64::from_le_bytes(b[16..24].try_into().expect("8 bytes"))).sum();
            if a.verify {
                println!("# Out of bounds values : {total} {}", if total == 0.0 { "OK" } else { "FAILED" });
            }
        }
        pe.finalize()?;
        Ok(wrong)
    })();
    match r {
        Ok(0) => ExitCode::SUCCESS,
        Ok(w) => {
            eprintln!("moe: {w} wrong element(s)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("moe: error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}
