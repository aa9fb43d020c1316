//! The Graph500 output block (specification v2.0 §9, "Computing and
//! Outputting Performance Information"): for the times, edge counts and
//! TEPS of the searches, the minimum, first quartile, median, third
//! quartile, maximum, mean and standard deviation, as the reference code
//! computes them; for TEPS the harmonic mean and its standard deviation
//! (`(sqrt(sum((1/TEPS - mean(1/TEPS))^2)) / (N - 1)) * hmean^2`).

/// The seven statistics of §9, in its order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Minimum.
    pub min: f64,
    /// First quartile.
    pub q1: f64,
    /// Median.
    pub median: f64,
    /// Third quartile.
    pub q3: f64,
    /// Maximum.
    pub max: f64,
    /// Mean (harmonic mean for TEPS).
    pub mean: f64,
    /// Standard deviation (harmonic for TEPS).
    pub stddev: f64,
}

/// The statistics of `x` (not empty); `harmonic`: mean and deviation are
/// harmonic (TEPS).
///
/// # Panics
/// If `x` is empty.
pub fn summary(x: &[f64], harmonic: bool) -> Summary {
    assert!(!x.is_empty(), "statistics of nothing");
    let mut s = x.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    // The reference's quartiles: the mean of the two middle candidates.
    let q = |a: usize, b: usize| (s[a] + s[b]) * 0.5;
    let (mean, stddev) = if harmonic {
        let inv: Vec<f64> = s.iter().map(|t| 1.0 / t).collect();
        let mi = inv.iter().sum::<f64>() / n as f64;
        let hm = 1.0 / mi;
        let d = inv.iter().map(|v| (v - mi) * (v - mi)).sum::<f64>();
        (hm, if n > 1 { d.sqrt() / (n - 1) as f64 * hm * hm } else { 0.0 })
    } else {
        let m = s.iter().sum::<f64>() / n as f64;
        let d = s.iter().map(|v| (v - m) * (v - m)).sum::<f64>();
        (m, if n > 1 { (d / (n - 1) as f64).sqrt() } else { 0.0 })
    };
    Summary {
        min: s[0],
        q1: q((n - 1) / 4, n / 4),
        median: q((n - 1) / 2, n / 2),
        q3: q(n - 1 - (n - 1) / 4, n - 1 - n / 4),
        max: s[n - 1],
        mean,
        stddev,
    }
}

/// The §9 block for one kernel (`prefix`: "bfs" or "sssp"): times (s),
/// edge counts and TEPS of each search, as `name: value` lines.
pub fn kernel_block(prefix: &str, times: &[f64], nedges: &[f64]) -> String {
    let mut o = String::new();
    let t = summary(times, false);
    let teps: Vec<f64> = nedges.iter().zip(times).map(|(e, t)| e / t).collect();
    let e = summary(nedges, false);
    let r = summary(&teps, true);
    let names = ["min", "firstquartile", "median", "thirdquartile", "max", "mean", "stddev"];
    let vals = |s: Summary| [s.min, s.q1, s.median, s.q3, s.max, s.mean, s.stddev];
    for (n, v) in names.iter().zip(vals(t)) {
        o.push_str(&format!("{prefix}_{n}_time: {v:.17e}\n"));
    }
    for (n, v) in names.iter().zip(vals(e)) {
        o.push_str(&format!("{prefix}_{n}_nedge: {v:.17e}\n"));
    }
    let tn = ["min", "firstquartile", "median", "thirdquartile", "max", "harmonic_mean", "harmonic_stddev"];
    for (n, v) in tn.iter().zip(vals(r)) {
        o.push_str(&format!("{prefix}_{n}_TEPS: {v:.17e}\n"));
    }
    o
}

/// The head of the §9 block: `SCALE`, `edgefactor`, the search count
/// (`count_name`: "NBFS" or "NSSSP"), `graph_generation`,
/// `num_mpi_processes`, `construction_time` (s). For a file, SCALE is
/// `ceil(log2 n)` and the edge factor `m / n`.
pub fn header(input: &crate::graph::build::Input, kron_scale: Option<u32>, count_name: &str, count: usize, n_pes: i32, construction: f64) -> String {
    let (scale, ef) = match kron_scale {
        Some(s) => (s, 16.0),
        None => ((input.n() as f64).log2().ceil() as u32, input.m() as f64 / input.n() as f64),
    };
    format!(
        "SCALE: {scale}\nedgefactor: {ef}\n{count_name}: {count}\ngraph_generation: {}\nnum_mpi_processes: {n_pes}\nconstruction_time: {construction:.17e}\n",
        input.name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_and_harmonic_mean_follow_the_reference() {
        let s = summary(&[4.0, 1.0, 3.0, 2.0], false);
        assert_eq!((s.min, s.q1, s.median, s.q3, s.max, s.mean), (1.0, 1.5, 2.5, 3.5, 4.0, 2.5));
        assert!((s.stddev - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        let h = summary(&[1.0, 2.0, 4.0], true);
        assert!((h.mean - 3.0 / 1.75).abs() < 1e-12, "harmonic mean {}", h.mean);
        let b = kernel_block("bfs", &[1.0, 2.0], &[10.0, 10.0]);
        assert!(b.contains("bfs_harmonic_mean_TEPS: 6.66666666666666"), "{b}");
        assert!(b.contains("bfs_max_time: 2.00000000000000000e0"), "{b}");
    }
}
