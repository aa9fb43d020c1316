//! `cpnet-service-bench` as `scripts/figures.sh cpu` runs it, with tiny
//! sizes: one PE per proxy thread count in one process, rows appended to
//! the two CSVs (header only once) in the schemas `cpnet-plot` reads.

use std::path::Path;
use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_cpnet-service-bench");

fn run(csv: &Path, cost: &Path) -> String {
    let out = Command::new(BENCH)
        .args(["--threads", "1,2", "--wgs", "1,3", "--iters", "200", "--reps", "1", "--idle-secs", "0.05"])
        .arg("--csv")
        .arg(csv)
        .arg("--cost-csv")
        .arg(cost)
        .env_remove("CPNET_PE")
        .env_remove("CPNET_N_PES")
        .output()
        .expect("run cpnet-service-bench");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "cpnet-service-bench failed:\n{text}");
    text
}

/// The rows of `path` after checking its header, each split on commas.
fn rows(path: &Path, header: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(header), "{}", path.display());
    lines
        .map(|l| {
            let f: Vec<String> = l.split(',').map(str::to_owned).collect();
            assert_eq!(f.len(), header.split(',').count(), "{l}");
            f
        })
        .collect()
}

#[test]
fn appends_service_and_cost_rows() {
    let dir = std::env::temp_dir().join(format!("cpnet-service-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (csv, cost) = (dir.join("fig4-service.csv"), dir.join("proxy-cost.csv"));
    let out = run(&csv, &cost);
    assert!(out.contains("rt med(us)") && out.contains("CPU s per million commands"), "{out}");
    run(&csv, &cost);

    let service = rows(&csv, "queue_mem,wgs,threads,iters,rt_us,rate_mops");
    assert_eq!(service.len(), 2 * 4, "two runs of 2 thread counts x 2 work-group counts");
    for r in &service {
        assert_eq!((r[0].as_str(), r[3].as_str()), ("cpu", "200"));
        assert!(["1", "3"].contains(&r[1].as_str()) && ["1", "2"].contains(&r[2].as_str()), "{r:?}");
        let (rt, rate): (f64, f64) = (r[4].parse().unwrap(), r[5].parse().unwrap());
        assert!(rt > 0.0 && rate > 0.0, "{r:?}");
    }

    let cost_rows = rows(&cost, "source,threads,state,commands,wall_s,proxy_cpu_s");
    assert_eq!(cost_rows.len(), 2 * 4, "two runs of 2 thread counts x (idle, busy)");
    for r in &cost_rows {
        assert_eq!(r[0], "cpu");
        let commands: u64 = r[3].parse().unwrap();
        match r[2].as_str() {
            "idle" => assert_eq!(commands, 0),
            // (1 + 3) work-groups x 200 no-ops x 1 repetition.
            "busy" => assert_eq!(commands, 800),
            other => panic!("state {other}"),
        }
        let (wall, cpu): (f64, f64) = (r[4].parse().unwrap(), r[5].parse().unwrap());
        assert!(wall > 0.0 && cpu >= 0.0, "{r:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
