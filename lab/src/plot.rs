//! PNG charts for `farvm-lab bench remote` (plotters, bitmap backend). Text is rendered with a
//! TrueType font found on the host (DejaVu Sans or Liberation Sans, as Debian's fonts-dejavu-core
//! / fonts-liberation install them); without one the charts are skipped with a clear message,
//! the table and JSON are still written.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers a host font as "sans-serif" once; the error says what to install.
pub fn ensure_font() -> Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        for p in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(p) {
                // The font must live as long as the process (plotters keeps a reference).
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no TrueType font found (looked for {}); install fonts-dejavu-core to get PNG charts",
            FONT_PATHS.join(", ")
        ))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// One bar series of a grouped bar chart.
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
    /// Per value, a label for a value that failed (e.g. "failed: checksum"): drawn as an × with
    /// that label where its bar would stand, so that a failure does not read as a missing bar.
    /// Shorter than `values` (or empty) where nothing failed.
    pub failed: Vec<Option<String>>,
}

/// A horizontal reference line.
pub struct RefLine {
    pub label: String,
    pub value: f64,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x4c, 0x72, 0xb0),
    RGBColor(0xdd, 0x84, 0x52),
    RGBColor(0x55, 0xa8, 0x68),
    RGBColor(0xc4, 0x4e, 0x52),
    RGBColor(0x81, 0x72, 0xb3),
    RGBColor(0x93, 0x78, 0x60),
    RGBColor(0xda, 0x8b, 0xc3),
    RGBColor(0x8c, 0x8c, 0x8c),
];

/// The ticks of a log-scale axis over [lo, hi]: 1, 2 and 5 times each power of ten in it
/// (…, 0.2, 0.5, 1, 2, 5, 10, …), so that every decade is labelled and a reader can place a bar
/// between two labels. Each is the double nearest its decimal value.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
        return Vec::new();
    }
    let mut ticks = Vec::new();
    for exp in (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32) {
        for m in [1, 2, 5] {
            if let Ok(v) = format!("{m}e{exp}").parse::<f64>() {
                if v >= lo && v <= hi {
                    ticks.push(v);
                }
            }
        }
    }
    ticks
}

/// A log-scale tick's label: as many decimals as its power of ten needs (0.05, 0.2, 1, 50).
pub fn log_tick_label(v: f64) -> String {
    let decimals = (-(v.log10() + 1e-9).floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// Grouped bars: one group per category, one bar per series; optional log scale (ticks at
/// [`log_ticks`]) and reference lines. Non-finite values are drawn as missing, unless the
/// series marks them failed ([`Series::failed`]).
pub fn grouped_bars(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[Series],
    lines: &[RefLine],
    log_y: bool,
) -> Result<()> {
    ensure_font()?;
    let finite = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .chain(lines.iter().map(|l| l.value))
        .filter(|v| v.is_finite() && (!log_y || *v > 0.0));
    let (lo, hi) = finite.fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    let hi = match (hi > 0.0, log_y) {
        (false, _) => 1.0,
        (true, true) => hi * 4.0,
        (true, false) => hi * 1.25,
    };
    let lo = if log_y {
        if lo.is_finite() {
            (lo / 2.0).max(1e-6)
        } else {
            0.1
        }
    } else {
        0.0
    };
    let w = (160 + categories.len() * (series.len() * 14 + 30)).max(900) as u32;
    let root = BitMapBackend::new(path, (w, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = categories.len() as f64;
    let ns = series.len().max(1) as f64;
    let mut b = ChartBuilder::on(&root);
    b.caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(80);
    // Where a failed value's × stands: a little above the axis's foot.
    let mark_y = if log_y {
        lo * (hi / lo).powf(0.04)
    } else {
        lo + (hi - lo) * 0.04
    };
    macro_rules! body {
        // $mesh: more of the mesh's configuration (the y axis's ticks), spliced into its chain.
        ($chart:expr, $y:expr; $($mesh:tt)*) => {{
            let mut chart = $chart;
            let cats = categories.to_vec();
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(categories.len() * 2 + 1)
                .x_label_formatter(&|x: &f64| {
                    let i = x.floor();
                    if (x - i - 0.5).abs() < 0.01 && i >= 0.0 && (i as usize) < cats.len() {
                        cats[i as usize].clone()
                    } else {
                        String::new()
                    }
                })
                $($mesh)*
                .y_desc(y_label)
                .label_style(("sans-serif", 14))
                .draw()?;
            for (si, s) in series.iter().enumerate() {
                let color = COLORS[si % COLORS.len()];
                let bw = 0.8 / ns;
                let rects: Vec<_> = s
                    .values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_finite() && (!log_y || **v > 0.0))
                    .map(|(ci, v)| {
                        let x0 = ci as f64 + 0.1 + si as f64 * bw;
                        Rectangle::new([(x0, $y(lo)), (x0 + bw * 0.9, $y(*v))], color.filled())
                    })
                    .collect();
                chart
                    .draw_series(rects)?
                    .label(s.name.clone())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                    });
                // A failed value: an × in the series' colour where the bar would stand, and
                // its label read upwards from it.
                let label_font = ("sans-serif", 12)
                    .into_font()
                    .transform(FontTransform::Rotate270)
                    .color(&BLACK);
                let marks = s.failed.iter().enumerate().filter_map(|(ci, label)| {
                    let x = ci as f64 + 0.1 + si as f64 * bw + bw * 0.45;
                    Some(
                        EmptyElement::at((x, $y(mark_y)))
                            + Cross::new((0, 0), 5, color.stroke_width(3))
                            + Text::new(label.clone()?, (-6, -10), label_font.clone()),
                    )
                });
                chart.draw_series(marks)?;
            }
            for (li, l) in lines.iter().enumerate() {
                let style = BLACK.stroke_width(if li == 0 { 2 } else { 1 });
                chart
                    .draw_series(LineSeries::new(
                        vec![(0.0, $y(l.value)), (n, $y(l.value))],
                        style,
                    ))?
                    .label(l.label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], style));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .position(SeriesLabelPosition::UpperRight)
                .draw()?;
        }};
    }
    if log_y {
        let ticks = log_ticks(lo, hi);
        let count = ticks.len();
        let chart = b.build_cartesian_2d(0f64..n, (lo..hi).log_scale().with_key_points(ticks))?;
        body!(chart, |v: f64| v;
            .y_labels(count)
            .y_label_formatter(&|v: &f64| log_tick_label(*v)));
    } else {
        let chart = b.build_cartesian_2d(0f64..n, lo..hi)?;
        body!(chart, |v: f64| v;);
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{log_tick_label, log_ticks};

    #[test]
    fn log_ticks_label_every_decade_and_its_halves_and_fifths() {
        assert_eq!(log_ticks(0.15, 12.0), vec![0.2, 0.5, 1.0, 2.0, 5.0, 10.0]);
        assert_eq!(
            log_ticks(1.0, 100.0),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(log_ticks(0.004, 0.06), vec![0.005, 0.01, 0.02, 0.05]);
        // A range inside one decade still gets the ticks in it.
        assert_eq!(log_ticks(1.5, 4.0), vec![2.0]);
        assert!(log_ticks(0.0, 1.0).is_empty());
        assert!(log_ticks(f64::NAN, 1.0).is_empty());
    }

    #[test]
    fn log_tick_labels_have_the_decimals_their_decade_needs() {
        let labels: Vec<String> = log_ticks(0.04, 600.0)
            .into_iter()
            .map(log_tick_label)
            .collect();
        assert_eq!(
            labels,
            ["0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10", "20", "50", "100", "200", "500"]
        );
    }
}
