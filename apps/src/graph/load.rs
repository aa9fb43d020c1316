//! Graph files: Matrix Market coordinate files (`.mtx`), DIMACS
//! shortest-path files (`.gr`, 9th DIMACS Implementation Challenge) and
//! SNAP-style edge lists (anything else: `u v [w]` per line, 0-based ids,
//! `#` or `%` comments). Every PE reads the file before the job starts
//! (before `Pe::init`), so bad input stops every PE with the same message
//! before any work; each error names the file, the line and the reason.
//!
//! Every entry is an undirected edge (a `general` Matrix Market matrix or a
//! DIMACS arc list is read as the undirected graph of its entries, the
//! reading Graph500 uses for its directed edge tuples). Vertex ids become
//! 0-based.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// A graph read from a file.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeList {
    /// Vertices (ids are `0..n`).
    pub n: u64,
    /// Edges `(u, v, weight)`; the weight is `None` where the file has none.
    pub edges: Vec<(u64, u64, Option<f64>)>,
}

/// The format of a graph file, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Matrix Market coordinate (`.mtx`): 1-based, a size line, `nnz` entries.
    MatrixMarket,
    /// DIMACS shortest path (`.gr`): `p sp n m`, then `a u v w`, 1-based.
    Dimacs,
    /// SNAP edge list: `u v [w]`, 0-based.
    EdgeList,
}

impl Format {
    /// The format of `path` by its extension.
    pub fn of(path: &Path) -> Format {
        match path.extension().and_then(|e| e.to_str()) {
            Some("mtx") => Format::MatrixMarket,
            Some("gr") => Format::Dimacs,
            _ => Format::EdgeList,
        }
    }
}

/// Read `path` (format by [`Format::of`]). `weights_needed`: the run uses
/// weights (SSSP), so a negative or non-finite weight is an error.
///
/// # Errors
/// The file cannot be read; a malformed header, size line or entry; a
/// truncated file (fewer entries than announced); a vertex id out of range;
/// a negative weight when `weights_needed`; an empty graph. Each names the
/// file and the line.
pub fn read(path: &Path, weights_needed: bool) -> Result<EdgeList> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read graph file {}", path.display()))?;
    parse(&text, Format::of(path), &path.display().to_string(), weights_needed)
}

/// Sides of [`road_grid`] it accepts: 2 ..= 2^14 (268 M vertices).
pub const ROAD_SIDES: std::ops::RangeInclusive<u64> = 2..=1 << 14;

/// A road-like graph: a `side` x `side` grid, vertex `r * side + c` joined
/// to its right and lower neighbours (`2 side (side - 1)` edges, degree at
/// most 4), without weights (the builder gives them Graph500 kernel 3's,
/// uniform in `[0, 1)` from the seed). It has what sets road networks
/// (DIMACS USA-road) apart from Kronecker graphs for delta-stepping: low,
/// even degree and a diameter of `2 (side - 1)` hops, so that a search
/// takes thousands of buckets instead of tens. Ids follow the rows, so a
/// 1D partition gives each PE a strip and exchanges cross only its edges.
///
/// # Errors
/// `side` outside [`ROAD_SIDES`].
pub fn road_grid(side: u64) -> Result<EdgeList> {
    if !ROAD_SIDES.contains(&side) {
        bail!("-road {side}: the grid's side must be in {}..={}", ROAD_SIDES.start(), ROAD_SIDES.end());
    }
    let mut edges = Vec::with_capacity((2 * side * (side - 1)) as usize);
    for r in 0..side {
        for c in 0..side {
            let v = r * side + c;
            if c + 1 < side {
                edges.push((v, v + 1, None));
            }
            if r + 1 < side {
                edges.push((v, v + side, None));
            }
        }
    }
    Ok(EdgeList { n: side * side, edges })
}

fn id(tok: &str, at: &str, what: &str) -> Result<u64> {
    match tok.parse::<i64>() {
        Ok(v) if v >= 0 => Ok(v as u64),
        Ok(v) => bail!("{at}: vertex id {v} ({what}) is negative"),
        Err(_) => bail!("{at}: '{tok}' is not a vertex id ({what})"),
    }
}

fn weight(tok: &str, at: &str, needed: bool) -> Result<f64> {
    let w: f64 = tok.parse().map_err(|_| anyhow::anyhow!("{at}: '{tok}' is not a number (weight)"))?;
    if needed && !(w.is_finite() && w >= 0.0) {
        bail!("{at}: weight {tok} is negative or not finite; SSSP needs weights >= 0");
    }
    Ok(w)
}

/// Parse `text` as `format`; `name` is the file name for messages.
///
/// # Errors
/// As [`read`].
pub fn parse(text: &str, format: Format, name: &str, weights_needed: bool) -> Result<EdgeList> {
    match format {
        Format::MatrixMarket => mtx(text, name, weights_needed),
        Format::Dimacs => dimacs(text, name, weights_needed),
        Format::EdgeList => snap(text, name, weights_needed),
    }
}

fn mtx(text: &str, name: &str, wn: bool) -> Result<EdgeList> {
    let mut lines = text.lines().enumerate();
    let Some((_, header)) = lines.next() else { bail!("{name}:1: empty file (expected a %%MatrixMarket header)") };
    let h: Vec<String> = header.split_whitespace().map(str::to_ascii_lowercase).collect();
    if h.first().map(String::as_str) != Some("%%matrixmarket") || h.len() != 5 || h[1] != "matrix" {
        bail!("{name}:1: not a Matrix Market header ('{header}'; expected '%%MatrixMarket matrix coordinate <field> <symmetry>')");
    }
    if h[2] != "coordinate" {
        bail!("{name}:1: '{}' format is not supported (a graph needs 'coordinate')", h[2]);
    }
    let has_value = match h[3].as_str() {
        "real" | "integer" | "double" => true,
        "pattern" => false,
        f => bail!("{name}:1: field '{f}' is not supported (real, integer or pattern)"),
    };
    if !matches!(h[4].as_str(), "general" | "symmetric") {
        bail!("{name}:1: symmetry '{}' is not supported (general or symmetric)", h[4]);
    }
    let mut size = None;
    let mut edges = Vec::new();
    let mut last = 1;
    for (i, line) in lines {
        let at = format!("{name}:{}", i + 1);
        last = i + 1;
        let t = line.trim();
        if t.is_empty() || t.starts_with('%') {
            continue;
        }
        let tok: Vec<&str> = t.split_whitespace().collect();
        let Some((rows, cols, nnz)) = size else {
            if tok.len() != 3 {
                bail!("{at}: size line must be 'rows cols entries', found '{t}'");
            }
            let num = |s: &str| s.parse::<u64>().map_err(|_| anyhow::anyhow!("{at}: '{s}' in the size line is not a count"));
            size = Some((num(tok[0])?, num(tok[1])?, num(tok[2])?));
            edges.reserve(num(tok[2])?.min(1 << 26) as usize);
            continue;
        };
        if edges.len() as u64 == nnz {
            bail!("{at}: more entries than the {nnz} the size line announced");
        }
        let want = if has_value { 3 } else { 2 };
        if tok.len() != want {
            bail!("{at}: entry must be 'row col{}', found '{t}'", if has_value { " value" } else { "" });
        }
        let (r, c) = (id(tok[0], &at, "row")?, id(tok[1], &at, "column")?);
        if r == 0 || r > rows || c == 0 || c > cols {
            bail!("{at}: entry ({r}, {c}) is outside the {rows} x {cols} matrix (ids are 1-based)");
        }
        let w = if has_value { Some(weight(tok[2], &at, wn)?) } else { None };
        edges.push((r - 1, c - 1, w));
    }
    let Some((rows, cols, nnz)) = size else { bail!("{name}:{last}: no size line (file truncated after the header?)") };
    if (edges.len() as u64) < nnz {
        bail!("{name}:{last}: truncated: {} of the {nnz} entries the size line announced", edges.len());
    }
    finish(name, rows.max(cols), edges)
}

fn dimacs(text: &str, name: &str, wn: bool) -> Result<EdgeList> {
    let mut size: Option<(u64, u64)> = None;
    let mut edges = Vec::new();
    let mut last = 0;
    for (i, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", i + 1);
        last = i + 1;
        let t = line.trim();
        let tok: Vec<&str> = t.split_whitespace().collect();
        match tok.first().copied() {
            None | Some("c") => {}
            Some("p") => {
                if size.is_some() {
                    bail!("{at}: a second problem line");
                }
                if tok.len() != 4 || tok[1] != "sp" {
                    bail!("{at}: problem line must be 'p sp <vertices> <arcs>', found '{t}'");
                }
                let num = |s: &str| s.parse::<u64>().map_err(|_| anyhow::anyhow!("{at}: '{s}' is not a count"));
                size = Some((num(tok[2])?, num(tok[3])?));
            }
            Some("a") => {
                let Some((n, m)) = size else { bail!("{at}: arc before the problem line 'p sp n m'") };
                if edges.len() as u64 == m {
                    bail!("{at}: more arcs than the {m} the problem line announced");
                }
                if tok.len() != 4 {
                    bail!("{at}: arc must be 'a <from> <to> <weight>', found '{t}'");
                }
                let (u, v) = (id(tok[1], &at, "from")?, id(tok[2], &at, "to")?);
                if u == 0 || u > n || v == 0 || v > n {
                    bail!("{at}: arc ({u}, {v}) has a vertex outside 1..={n}");
                }
                edges.push((u - 1, v - 1, Some(weight(tok[3], &at, wn)?)));
            }
            Some(k) => bail!("{at}: unknown line kind '{k}' (expected c, p or a)"),
        }
    }
    let Some((n, m)) = size else { bail!("{name}:{last}: no problem line 'p sp n m'") };
    if (edges.len() as u64) < m {
        bail!("{name}:{last}: truncated: {} of the {m} arcs the problem line announced", edges.len());
    }
    finish(name, n, edges)
}

fn snap(text: &str, name: &str, wn: bool) -> Result<EdgeList> {
    let mut edges = Vec::new();
    let mut n = 0u64;
    let mut weighted = None;
    for (i, line) in text.lines().enumerate() {
        let at = format!("{name}:{}", i + 1);
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with('%') {
            continue;
        }
        let tok: Vec<&str> = t.split_whitespace().collect();
        if !(2..=3).contains(&tok.len()) {
            bail!("{at}: edge must be 'u v' or 'u v weight', found '{t}'");
        }
        let has_w = tok.len() == 3;
        if *weighted.get_or_insert(has_w) != has_w {
            bail!("{at}: some edges have a weight and some do not");
        }
        let (u, v) = (id(tok[0], &at, "u")?, id(tok[1], &at, "v")?);
        let w = if has_w { Some(weight(tok[2], &at, wn)?) } else { None };
        n = n.max(u + 1).max(v + 1);
        edges.push((u, v, w));
    }
    finish(name, n, edges)
}

fn finish(name: &str, n: u64, edges: Vec<(u64, u64, Option<f64>)>) -> Result<EdgeList> {
    if n == 0 || edges.is_empty() {
        bail!("{name}: the graph has no edges");
    }
    Ok(EdgeList { n, edges })
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_road_grid_has_the_lattice_shape() {
        let g = road_grid(5).unwrap();
        assert_eq!((g.n, g.edges.len()), (25, 2 * 5 * 4));
        let mut deg = [0; 25];
        for &(u, v, w) in &g.edges {
            assert!(w.is_none() && u < v && (v == u + 1 || v == u + 5), "{u} {v}");
            deg[u as usize] += 1;
            deg[v as usize] += 1;
        }
        assert_eq!((deg[0], deg[12], deg[2]), (2, 4, 3), "corner, inside, edge");
        assert!(road_grid(1).unwrap_err().to_string().contains("-road 1"));
        assert!(road_grid(1 << 15).is_err());
    }

    use super::*;

    /// The Hartford drug-user network that Debian's python3-networkx ships
    /// (scripts/setup.sh installs it): a real graph, SNAP-style edge list.
    pub const HARTFORD: &str = "/usr/share/doc/python3-networkx/examples/algorithms/hartford_drug.edgelist";

    #[test]
    fn reads_a_real_graph_shipped_by_a_package() {
        let g = read(Path::new(HARTFORD), false).expect("scripts/setup.sh installs python3-networkx");
        assert_eq!(g.edges.len(), 337, "one edge per non-comment line");
        assert_eq!(g.n, 294, "ids 0..=293 (the largest id in the file is 293)");
        assert!(g.edges.contains(&(1, 2, None)) && g.edges.contains(&(1, 10, None)));
        // The same graph as Matrix Market and DIMACS reads the same.
        let mut mm = format!("%%MatrixMarket matrix coordinate pattern general\n% hartford\n{} {} {}\n", g.n, g.n, g.edges.len());
        let mut gr = format!("c hartford\np sp {} {}\n", g.n, g.edges.len());
        for &(u, v, _) in &g.edges {
            mm.push_str(&format!("{} {}\n", u + 1, v + 1));
            gr.push_str(&format!("a {} {} 1\n", u + 1, v + 1));
        }
        assert_eq!(parse(&mm, Format::MatrixMarket, "h.mtx", false).unwrap(), g);
        let d = parse(&gr, Format::Dimacs, "h.gr", true).unwrap();
        assert_eq!(d.edges.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>(), g.edges.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>());
    }

    fn err(text: &str, f: Format, w: bool) -> String {
        format!("{:#}", parse(text, f, "g", w).unwrap_err())
    }

    #[test]
    fn bad_files_name_the_line_and_the_reason() {
        use Format::*;
        let h = "%%MatrixMarket matrix coordinate real symmetric\n";
        assert_eq!(err(&format!("{h}3 3 2\n1 2 0.5\n"), MatrixMarket, false), "g:3: truncated: 1 of the 2 entries the size line announced");
        assert_eq!(err(&format!("{h}3 3 1\n1 4 0.5\n"), MatrixMarket, false), "g:3: entry (1, 4) is outside the 3 x 3 matrix (ids are 1-based)");
        assert_eq!(err(&format!("{h}3 3 1\n1 2 -0.5\n"), MatrixMarket, true), "g:3: weight -0.5 is negative or not finite; SSSP needs weights >= 0");
        assert!(parse(&format!("{h}3 3 1\n1 2 -0.5\n"), MatrixMarket, "g", false).is_ok(), "BFS ignores weights");
        assert_eq!(err(&format!("{h}3 3 1\n1 x 0.5\n"), MatrixMarket, false), "g:3: 'x' is not a vertex id (column)");
        assert_eq!(err(&format!("{h}3 3 1\n1 2\n"), MatrixMarket, false), "g:3: entry must be 'row col value', found '1 2'");
        assert_eq!(err(&format!("{h}3 3 1\n1 2 1\n2 3 1\n"), MatrixMarket, false), "g:4: more entries than the 1 the size line announced");
        assert_eq!(err(h, MatrixMarket, false), "g:1: no size line (file truncated after the header?)");
        assert!(err("%%MatrixMarket matrix array real general\n", MatrixMarket, false).contains("'array' format is not supported"));
        assert!(err("1 2\n", MatrixMarket, false).starts_with("g:1: not a Matrix Market header"));
        assert_eq!(err("p sp 3 2\na 1 2 5\n", Dimacs, true), "g:2: truncated: 1 of the 2 arcs the problem line announced");
        assert_eq!(err("p sp 3 1\na 1 9 5\n", Dimacs, true), "g:2: arc (1, 9) has a vertex outside 1..=3");
        assert_eq!(err("a 1 2 5\n", Dimacs, true), "g:1: arc before the problem line 'p sp n m'");
        assert_eq!(err("0 1\n1 -2\n", EdgeList, false), "g:2: vertex id -2 (v) is negative");
        assert_eq!(err("0 1 1.0\n1 2\n", EdgeList, false), "g:2: some edges have a weight and some do not");
        assert_eq!(err("0 1 2 3\n", EdgeList, false), "g:1: edge must be 'u v' or 'u v weight', found '0 1 2 3'");
        assert_eq!(err("# nothing\n", EdgeList, false), "g: the graph has no edges");
        let e = format!("{:#}", read(Path::new("/nonexistent/g.mtx"), false).unwrap_err());
        assert!(e.starts_with("cannot read graph file /nonexistent/g.mtx"), "{e}");
    }
}
