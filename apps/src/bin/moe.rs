//! `moe`: expert-parallel MoE dispatch and combine in the style of DeepEP's
//! low-latency kernels, over cpnet (issue 22). See [`cpnet_apps::moe`].
//!
//! ```text
//! cpnet-run -n 2 -- moe -verify                                  # T=128, H=7168, k=8, E=256, CPU work-groups
//! cpnet-run -n 2 -- moe -variant intra-kernel -verify            # one persistent kernel per PE (GPU)
//! cpnet-run -n 4 -- moe -tokens 32 -hidden 256 -k 4 -experts 16 -skew 1.2 -verify
//! ```

use std::process::ExitCode;

use cpnet_apps::cli::{Variant, error_text, init_pe, parse_args};
use cpnet_apps::moe::{Args, Timing, bytes_moved, check, gpu, heap_bytes, print_header, run_cpu};

/// Every PE's timing and wrong count to PE 0, which prints the table.
fn report(a: &Args, me: i32, all: &[Vec<u8>]) {
    if me != 0 {
        return;
    }
    let (db, cb) = bytes_moved(a);
    println!("#   PE   dispatch_us   combine_us   dispatch_GB/s   combine_GB/s   experts_us   #wrong");
    let mut total = 0.0;
    for (p, b) in all.iter().enumerate() {
        let f = |i: usize| f64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let (d, c, w, x) = (f(0), f(1), f(2), f(3));
        total += w;
        println!("{p:>6} {d:>13.1} {c:>12.1} {:>15.3} {:>14.3} {x:>12.1} {w:>8}", db as f64 / d / 1e3, cb as f64 / c / 1e3);
    }
    if a.verify {
        println!("# Out of bounds values : {total} {}", if total == 0.0 { "OK" } else { "FAILED" });
    }
}

fn row(t: Timing, wrong: u64) -> Vec<u8> {
    [t.dispatch_us.to_le_bytes(), t.combine_us.to_le_bytes(), (wrong as f64).to_le_bytes(), t.experts_us.to_le_bytes()].concat()
}

fn main() -> ExitCode {
    let a: Args = parse_args();
    let r = (|| -> anyhow::Result<u64> {
        match a.variant {
            Variant::Cpu => {
                let (pe, raised) = init_pe(|n| heap_bytes(&a, n as usize))?;
                check(&a, pe.n_pes() as usize)?;
                if pe.my_pe() == 0 {
                    print_header(&a, pe.n_pes(), pe.provider(), raised, "cpu", &format!("{} CPU work-group(s)", a.wgs()));
                }
                let (t, wrong) = run_cpu(&pe, &a)?;
                let all = pe.allgather_bytes(&row(t, wrong))?;
                report(&a, pe.my_pe(), &all);
                pe.finalize()?;
                Ok(wrong)
            }
            _ => {
                check(&a, 1)?;
                let (t, wrong, pe) = gpu::run(&a)?;
                let all = pe.allgather_bytes(&row(t, wrong))?;
                report(&a, pe.my_pe(), &all);
                pe.finalize()?;
                Ok(wrong)
            }
        }
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
