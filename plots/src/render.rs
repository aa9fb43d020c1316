//! Line charts drawn with plotters into PNG files: a small description of a
//! chart ([`Chart`]) and the code that draws it, so that each figure is only
//! data selection.
//!
//! Text is drawn with plotters' `ab_glyph` backend from a TrueType font
//! read at run time ([`load_font`]): no fontconfig or freetype is needed,
//! only a font file (Debian: `fonts-dejavu-core`).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{
    AsRangedCoord, DefaultFormatting, KeyPointHint, KeyPointWeight, Ranged, ValueFormatter,
};
use plotters::prelude::*;
use plotters::style::FontStyle;

/// Width of a one-panel figure, pixels.
pub const WIDTH: u32 = 800;
/// Height of a figure, pixels.
pub const HEIGHT: u32 = 500;

/// Where [`load_font`] looks for a TrueType font, in order.
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

static FONT: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Registers the font every chart's text uses, once per process: the file
/// at `explicit` if given, else the first of [`FONT_PATHS`] that exists.
/// Later calls return the first call's result (the font stays registered).
///
/// # Errors
/// No font file found (install `fonts-dejavu-core` or pass a path), or the
/// file is not a TrueType/OpenType font.
pub fn load_font(explicit: Option<&Path>) -> Result<PathBuf> {
    let r = FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = match explicit {
            Some(p) => vec![p.to_path_buf()],
            None => FONT_PATHS.iter().map(PathBuf::from).collect(),
        };
        let Some(path) = candidates.into_iter().find(|p| p.is_file()) else {
            return Err(match explicit {
                Some(p) => format!("font file {} not found", p.display()),
                None => format!(
                    "no TrueType font found (looked at {}); install one (Debian/Ubuntu: apt-get install fonts-dejavu-core) or pass --font FILE.ttf",
                    FONT_PATHS.join(", ")
                ),
            });
        };
        let bytes = std::fs::read(&path).map_err(|e| format!("reading font {}: {e}", path.display()))?;
        // plotters keeps fonts for the whole process: leak the bytes once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        for family in ["sans-serif", "serif", "monospace"] {
            plotters::style::register_font(family, FontStyle::Normal, bytes)
                .map_err(|_| format!("{} is not a TrueType/OpenType font", path.display()))?;
        }
        Ok(path)
    });
    r.clone().map_err(|e| anyhow!(e))
}

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// Linear, from 0 (or below the smallest value if it is negative).
    Linear,
    /// Logarithmic with ticks at powers of 2 (sizes, counts).
    Log2,
    /// Logarithmic with ticks at powers of 10.
    Log10,
    /// [`Scale::Log10`] when the values are positive and span at least a
    /// factor 20, else [`Scale::Linear`].
    Auto,
}

/// How tick labels are written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ticks {
    /// Numbers: integers as integers, others with up to 3 significant digits.
    Number,
    /// Byte counts: `8 B`, `4 KiB`, `2 MiB`.
    Bytes,
}

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// The points, in any order (drawn sorted by x).
    pub points: Vec<(f64, f64)>,
    /// Dashed line instead of solid.
    pub dashed: bool,
    /// Index into the palette; series with the same index share a colour.
    pub color: usize,
}

/// Where the legend goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LegendAt {
    /// Upper left corner of the plot.
    UpperLeft,
    /// Upper right corner.
    UpperRight,
    /// Lower left corner.
    LowerLeft,
    /// Lower right corner.
    LowerRight,
}

/// A line chart: what [`draw_png`] and [`draw_panels_png`] draw.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Caption above the plot.
    pub title: String,
    /// X axis label, with its unit.
    pub x_label: String,
    /// Y axis label, with its unit.
    pub y_label: String,
    /// X axis mapping.
    pub x_scale: Scale,
    /// Y axis mapping.
    pub y_scale: Scale,
    /// X tick labels.
    pub x_ticks: Ticks,
    /// The lines.
    pub series: Vec<Series>,
    /// A horizontal reference line at this y, with its legend text.
    pub hline: Option<(f64, String)>,
    /// Legend position.
    pub legend: LegendAt,
}

impl Chart {
    /// A chart with linear axes, numeric ticks, no series, legend upper left.
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Chart {
        Chart {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            x_ticks: Ticks::Number,
            series: Vec::new(),
            hline: None,
            legend: LegendAt::UpperLeft,
        }
    }
}

/// Line colours, colour-blind friendly (Okabe-Ito), then black.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];

/// Draws `chart` into a new [`WIDTH`] x [`HEIGHT`] PNG at `path`.
///
/// # Errors
/// No font ([`load_font`] not called successfully), a chart without points,
/// or the file cannot be written.
pub fn draw_png(path: &Path, chart: &Chart) -> Result<()> {
    {
        let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        draw_chart(&root, chart, title_size(&chart.title, WIDTH))?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    check_written(path)
}

/// Draws the `panels` side by side under one `title` into a `width` x
/// [`HEIGHT`] pixel PNG at `path`.
///
/// # Errors
/// As [`draw_png`].
pub fn draw_panels_png(path: &Path, title: &str, width: u32, panels: &[Chart]) -> Result<()> {
    {
        let root = BitMapBackend::new(path, (width, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let root = root
            .titled(title, ("sans-serif", title_size(title, width)))
            .map_err(|e| anyhow!("{e}"))?;
        let areas = root.split_evenly((1, panels.len().max(1)));
        for (area, chart) in areas.iter().zip(panels) {
            draw_chart(area, chart, 17.0)?;
        }
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    check_written(path)
}

fn check_written(path: &Path) -> Result<()> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("{} was not written", path.display()))?;
    if meta.len() == 0 {
        bail!("{} is empty", path.display());
    }
    Ok(())
}

/// A caption size that fits `title` in `width` pixels (about 0.55 em per
/// character), at most 22 px.
fn title_size(title: &str, width: u32) -> f64 {
    let chars = title.chars().count().max(1) as f64;
    (f64::from(width) * 0.95 / (0.55 * chars)).min(22.0)
}

/// The axis range for `values` on `scale` (after [`Scale::Auto`] is
/// resolved): some room around the data, from 0 on linear axes.
fn axis_range(values: &[f64], scale: Scale) -> Range<f64> {
    let lo = values
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f64::INFINITY, f64::min);
    let hi = values
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    match scale {
        Scale::Log2 | Scale::Log10 | Scale::Auto => {
            let lo = if lo > 0.0 { lo } else { hi.max(1.0) * 1e-3 };
            let hi = hi.max(lo);
            lo / 1.2..hi * 1.2
        }
        Scale::Linear => {
            let lo = lo.min(0.0);
            let hi = if hi > lo { hi } else { lo + 1.0 };
            lo..hi + (hi - lo) * 0.08
        }
    }
}

/// A logarithmic axis with ticks chosen here: powers of 2 (base 2), or
/// powers of 10, 1-2-5 or 1..9 per decade, whichever is the densest that
/// fits the number of labels plotters asks for (base 10). Minor grid lines
/// at every power of 2, or at 1..9 per decade.
#[derive(Debug, Clone)]
struct LogAxis {
    lo: f64,
    hi: f64,
    base2: bool,
}

impl LogAxis {
    /// Every `mantissa * base^e` in range.
    fn ticks(&self, mantissas: &[f64]) -> Vec<f64> {
        let (base, first, last) = if self.base2 {
            (
                2f64,
                self.lo.log2().floor() as i32,
                self.hi.log2().ceil() as i32,
            )
        } else {
            (
                10f64,
                self.lo.log10().floor() as i32,
                self.hi.log10().ceil() as i32,
            )
        };
        let mut v = Vec::new();
        let mut e = first;
        while e <= last {
            for m in mantissas {
                let t = m * base.powi(e);
                if t >= self.lo * (1.0 - 1e-9) && t <= self.hi * (1.0 + 1e-9) {
                    v.push(t);
                }
            }
            e += 1;
        }
        v
    }
}

/// Every `k`-th of `t`, for the smallest `k` that leaves at most `max`.
fn thin(t: Vec<f64>, max: usize) -> Vec<f64> {
    let k = t.len().div_ceil(max.max(1)).max(1);
    t.into_iter().step_by(k).collect()
}

impl Ranged for LogAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let v = value.max(self.lo * 1e-6);
        let f = (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln());
        limit.0 + (f * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        let max = hint.max_num_points().max(1);
        let light = matches!(hint.weight(), KeyPointWeight::Any);
        const ALL: [f64; 9] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
        if self.base2 {
            let t = self.ticks(&[1.0]);
            return if light { t } else { thin(t, max.min(10)) };
        }
        if light {
            return self.ticks(&ALL);
        }
        let max = max.min(10);
        let t125 = self.ticks(&[1.0, 2.0, 5.0]);
        if t125.len() < 3 {
            let t19 = self.ticks(&ALL);
            if t19.len() <= max {
                return t19;
            }
        }
        if t125.len() <= max {
            return t125;
        }
        thin(self.ticks(&[1.0]), max)
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// [`Scale::Auto`] resolved for `values`.
fn resolve(scale: Scale, values: &[f64]) -> Scale {
    if scale != Scale::Auto {
        return scale;
    }
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if lo > 0.0 && hi / lo >= 20.0 {
        Scale::Log10
    } else {
        Scale::Linear
    }
}

/// Tick label for `v`.
pub fn tick_label(v: f64, ticks: Ticks) -> String {
    match ticks {
        Ticks::Bytes => {
            let units = [("GiB", 30), ("MiB", 20), ("KiB", 10)];
            for (name, shift) in units {
                let unit = (1u64 << shift) as f64;
                if v >= unit {
                    return format!("{} {name}", number(v / unit));
                }
            }
            format!("{} B", number(v))
        }
        Ticks::Number => number(v),
    }
}

/// Integers as integers (`1024`), from 10^5 up with an SI suffix
/// (`500k`, `2M`, `1.5G`), others with 3 significant digits.
fn number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    if v.abs() >= 1e5 {
        for (name, unit) in [("G", 1e9), ("M", 1e6), ("k", 1e3)] {
            if v.abs() >= unit {
                return format!("{}{name}", number(v / unit));
            }
        }
    }
    if (v - v.round()).abs() < 1e-9 * v.abs().max(1.0) && v.abs() < 1e15 {
        return format!("{}", v.round() as i64);
    }
    let digits = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

fn draw_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    chart: &Chart,
    caption: f64,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let xs: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let mut ys: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .collect();
    if xs.is_empty() {
        bail!("{}: no data points", chart.title);
    }
    if let Some((y, _)) = &chart.hline {
        ys.push(*y);
    }
    let xscale = resolve(chart.x_scale, &xs);
    let yscale = resolve(chart.y_scale, &ys);
    let xr = axis_range(&xs, xscale);
    let yr = axis_range(&ys, yscale);
    let ax = Axes {
        chart,
        caption,
        xr: xr.clone(),
    };
    let log = |r: Range<f64>, s: Scale| LogAxis {
        lo: r.start,
        hi: r.end,
        base2: s == Scale::Log2,
    };
    match (xscale, yscale) {
        (Scale::Linear, Scale::Linear) => ax.draw(area, xr, yr),
        (Scale::Linear, _) => ax.draw(area, xr, log(yr, yscale)),
        (_, Scale::Linear) => ax.draw(area, log(xr, xscale), yr),
        _ => ax.draw(area, log(xr, xscale), log(yr, yscale)),
    }
}

struct Axes<'c> {
    chart: &'c Chart,
    caption: f64,
    xr: Range<f64>,
}

impl Axes<'_> {
    fn draw<DB, X, Y>(&self, area: &DrawingArea<DB, Shift>, x: X, y: Y) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        let err =
            |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing {:?}: {e}", self.chart.title);
        let c = self.chart;
        let mut ctx = ChartBuilder::on(area)
            .caption(&c.title, ("sans-serif", self.caption))
            .margin(12)
            .margin_right(28)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        let x_fmt = |v: &f64| tick_label(*v, c.x_ticks);
        let y_fmt = |v: &f64| tick_label(*v, Ticks::Number);
        ctx.configure_mesh()
            .x_desc(&c.x_label)
            .y_desc(&c.y_label)
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .max_light_lines(2)
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(200, 200, 200))
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        if let Some((yv, label)) = &c.hline {
            let style = ShapeStyle {
                color: BLACK.mix(0.6),
                filled: false,
                stroke_width: 1,
            };
            ctx.draw_series(DashedLineSeries::new(
                [(self.xr.start, *yv), (self.xr.end, *yv)],
                6,
                4,
                style,
            ))
            .map_err(err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        for s in &c.series {
            let color = PALETTE[s.color % PALETTE.len()];
            let mut pts = s.points.clone();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let style = ShapeStyle {
                color: color.to_rgba(),
                filled: false,
                stroke_width: 2,
            };
            let dashed = s.dashed;
            let anno = if dashed {
                ctx.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
                    .map_err(err)?
            } else {
                ctx.draw_series(LineSeries::new(pts.clone(), style))
                    .map_err(err)?
            };
            anno.label(s.label.as_str()).legend(move |(x, y)| {
                if dashed {
                    PathElement::new(vec![(x, y), (x + 7, y)], style)
                } else {
                    PathElement::new(vec![(x, y), (x + 20, y)], style)
                }
            });
            let marker = ShapeStyle {
                color: color.to_rgba(),
                filled: !dashed,
                stroke_width: 1,
            };
            ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 3, marker)))
                .map_err(err)?;
        }
        let pos = match c.legend {
            LegendAt::UpperLeft => SeriesLabelPosition::UpperLeft,
            LegendAt::UpperRight => SeriesLabelPosition::UpperRight,
            LegendAt::LowerLeft => SeriesLabelPosition::LowerLeft,
            LegendAt::LowerRight => SeriesLabelPosition::LowerRight,
        };
        ctx.configure_series_labels()
            .position(pos)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::coord::ranged1d::BoldPoints;

    #[test]
    fn tick_labels() {
        assert_eq!(tick_label(8.0, Ticks::Bytes), "8 B");
        assert_eq!(tick_label(4096.0, Ticks::Bytes), "4 KiB");
        assert_eq!(tick_label(4194304.0, Ticks::Bytes), "4 MiB");
        assert_eq!(tick_label(1536.0, Ticks::Bytes), "1.5 KiB");
        assert_eq!(tick_label(1024.0, Ticks::Number), "1024");
        assert_eq!(tick_label(30000.0, Ticks::Number), "30000");
        assert_eq!(tick_label(500000.0, Ticks::Number), "500k");
        assert_eq!(tick_label(2e6, Ticks::Number), "2M");
        assert_eq!(tick_label(16777216.0, Ticks::Number), "16.8M");
        assert_eq!(tick_label(0.25, Ticks::Number), "0.25");
        assert_eq!(tick_label(12.345, Ticks::Number), "12.3");
        assert_eq!(tick_label(0.0012345, Ticks::Number), "0.00123");
    }

    #[test]
    fn ranges() {
        let r = axis_range(&[3.0, 40.0], Scale::Log10);
        assert!(r.start < 3.0 && r.end > 40.0);
        let a = LogAxis {
            lo: r.start,
            hi: r.end,
            base2: false,
        };
        assert_eq!(a.key_points(BoldPoints(10)), vec![5.0, 10.0, 20.0]);
        let a = LogAxis {
            lo: 9.5,
            hi: 30.0,
            base2: false,
        };
        assert_eq!(a.key_points(BoldPoints(10)), vec![10.0, 20.0, 30.0]);
        let a = LogAxis {
            lo: 0.5,
            hi: 5000.0,
            base2: false,
        };
        assert_eq!(a.key_points(BoldPoints(10)), vec![1.0, 10.0, 100.0, 1000.0]);
        let a = LogAxis {
            lo: 8.0 / 1.2,
            hi: 4194304.0 * 1.2,
            base2: true,
        };
        assert_eq!(
            a.key_points(BoldPoints(10)),
            vec![
                8.0, 32.0, 128.0, 512.0, 2048.0, 8192.0, 32768.0, 131072.0, 524288.0, 2097152.0
            ]
        );
        assert_eq!(
            a.key_points(BoldPoints(5)),
            vec![8.0, 128.0, 2048.0, 32768.0, 524288.0]
        );
        let r = axis_range(&[2.0, 10.0], Scale::Linear);
        assert_eq!(r.start, 0.0);
        assert!(r.end > 10.0);
        assert_eq!(resolve(Scale::Auto, &[1.0, 19.0]), Scale::Linear);
        assert_eq!(resolve(Scale::Auto, &[1.0, 20.0]), Scale::Log10);
    }
}
