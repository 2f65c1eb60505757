//! PNG plots (plotters, with the DejaVu Sans font built in, so no system fonts are needed).

use super::maps::Map;
use plotters::prelude::*;
use plotters::style::colors::colormaps::ViridisRGB;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// A plot that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the plot {path}: {reason}")]
pub struct PlotError {
    /// The PNG file.
    pub path: PathBuf,
    /// What went wrong.
    pub reason: String,
}

/// Size of line charts in pixels.
pub const CHART_SIZE: (u32, u32) = (800, 600);
/// Size of face-on map images in pixels (the map and its colour bar).
pub const MAP_SIZE: (u32, u32) = (760, 640);
/// Size of edge-on map images in pixels: a wide strip, the vertical axis on its own scale.
pub const EDGE_ON_SIZE: (u32, u32) = (760, 400);

/// One named curve of a line chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// (x, y) points; non-finite ones are left out.
    pub points: Vec<(f64, f64)>,
}

fn register_font() {
    static FONT: Once = Once::new();
    FONT.call_once(|| {
        // The bytes are a valid TTF shipped by the dejavu crate; failure would leave text
        // undrawn, which plotters then reports as a drawing error.
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

fn fail(path: &Path, e: impl std::fmt::Display) -> PlotError {
    PlotError {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// [lo, hi] of `values` with 5% padding (a unit-wide range around a single value).
/// A tick label: at most three decimals and no trailing zeros (`20`, `0.25`, `-1.5`), the
/// exponent form only for very large or small values.
fn tick(v: f64) -> String {
    if v != 0.0 && !(1e-3..1e6).contains(&v.abs()) {
        return format!("{v:.1e}");
    }
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.into()
    }
}

fn padded_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo <= f64::EPSILON * lo.abs().max(1.0) {
        return (lo - 0.5 * lo.abs().max(1.0), hi + 0.5 * hi.abs().max(1.0));
    }
    let pad = 0.05 * (hi - lo);
    (lo - pad, hi + pad)
}

/// Writes a line chart of `series` with a title, axis labels (with units) and a legend.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> Result<(), PlotError> {
    register_font();
    let points = || series.iter().flat_map(|s| s.points.iter());
    let x = padded_range(points().map(|p| p.0));
    let y = padded_range(points().map(|p| p.1));
    // Headroom above the data for the legend (upper right), one row per series.
    let y = (y.0, y.1 + (0.08 * series.len() as f64 + 0.04) * (y.1 - y.0));
    let root = BitMapBackend::new(path, CHART_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(x.0..x.1, y.0..y.1)
        .map_err(|e| fail(path, e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(|e| fail(path, e))?;
    for (k, s) in series.iter().enumerate() {
        let colour = Palette99::pick(k).to_rgba();
        // A non-finite point is a gap (say, a pattern speed not measured there): the line
        // breaks at it, and a point alone between gaps is drawn as a dot.
        let finite = |p: &(f64, f64)| p.0.is_finite() && p.1.is_finite();
        let segments: Vec<&[(f64, f64)]> = s
            .points
            .split(|p| !finite(p))
            .filter(|seg| !seg.is_empty())
            .collect();
        let first = segments.first().map(|seg| seg.to_vec()).unwrap_or_default();
        chart
            .draw_series(LineSeries::new(first, colour.stroke_width(2)))
            .map_err(|e| fail(path, e))?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], colour.stroke_width(2))
            });
        for seg in segments.iter().skip(1) {
            chart
                .draw_series(LineSeries::new(seg.to_vec(), colour.stroke_width(2)))
                .map_err(|e| fail(path, e))?;
        }
        let alone = segments
            .iter()
            .filter(|seg| seg.len() == 1)
            .map(|seg| seg[0]);
        chart
            .draw_series(alone.map(|p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| fail(path, e))?;
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| fail(path, e))?;
    root.present().map_err(|e| fail(path, e))
}

/// Writes `map` as a `size` image on a log scale with a colour bar, physical axes and a
/// title.
pub fn map_image(
    path: &Path,
    size: (u32, u32),
    title: &str,
    map: &Map,
    x_label: &str,
    y_label: &str,
    bar_label: &str,
) -> Result<(), PlotError> {
    register_font();
    let logs: Vec<f64> = map
        .density
        .iter()
        .map(|&d| if d > 0.0 { d.log10() } else { f64::NAN })
        .collect();
    let (mut lo, hi) = padded_range(logs.iter().copied());
    // Four decades below the peak are enough to see a disk's structure.
    lo = lo.max(hi - 4.0);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(path, e))?;
    let (left, right) = root.split_horizontally(size.0 - 130);
    let (w, h) = (map.frame.half_width, map.frame.half_height);
    let mut chart = ChartBuilder::on(&left)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(-w..w, -h..h)
        .map_err(|e| fail(path, e))?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 18))
        .draw()
        .map_err(|e| fail(path, e))?;
    let (columns, rows) = (map.frame.columns, map.frame.rows);
    let (dx, dy) = (2.0 * w / columns as f64, 2.0 * h / rows as f64);
    let background = ViridisRGB::get_color_normalized(lo, lo, hi);
    chart
        .draw_series((0..columns * rows).map(|k| {
            let (i, j) = (k % columns, k / columns);
            let (x0, y0) = (-w + i as f64 * dx, -h + j as f64 * dy);
            let v = logs[k];
            let colour = if v.is_finite() {
                ViridisRGB::get_color_normalized(v.max(lo), lo, hi)
            } else {
                background
            };
            Rectangle::new([(x0, y0), (x0 + dx, y0 + dy)], colour.filled())
        }))
        .map_err(|e| fail(path, e))?;
    let mut bar = ChartBuilder::on(&right)
        .margin_top(56)
        .margin_bottom(64)
        .margin_right(8)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..1.0, lo..hi)
        .map_err(|e| fail(path, e))?;
    bar.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_desc(bar_label)
        .y_label_formatter(&|v| tick(*v))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(|e| fail(path, e))?;
    let steps = 200;
    let dv = (hi - lo) / steps as f64;
    bar.draw_series((0..steps).map(|k| {
        let v = lo + k as f64 * dv;
        let colour = ViridisRGB::get_color_normalized(v, lo, hi);
        Rectangle::new([(0.0, v), (1.0, v + dv)], colour.filled())
    }))
    .map_err(|e| fail(path, e))?;
    root.present().map_err(|e| fail(path, e))
}

#[cfg(test)]
mod tests {
    use super::tick;

    #[test]
    fn tick_labels_have_no_spurious_decimals() {
        assert_eq!(tick(20.0), "20");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(-1.5), "-1.5");
        assert_eq!(tick(-0.0001), "-1.0e-4");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(2.0e7), "2.0e7");
    }
}
