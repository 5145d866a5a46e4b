//! Line charts as SVG, with no font or image dependency: the training curves of a run
//! directory, and the benchmark suite's plots.

use std::fmt::Write;

/// One named line of (x, y) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// Its points, in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// Series with more points than this are drawn without a marker at each point.
const MARKED: usize = 50;
/// More distinct x values than this get evenly spaced tick labels instead of one each.
const LABELLED: usize = 12;

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// A line chart (a complete `<svg>` element, 640 × 400) with a logarithmic x axis when
/// `log_x`; the y axis starts at 0.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    log_x: bool,
    series: &[Series],
) -> String {
    let (w, h, left, right, top, bottom) = (640.0, 400.0, 70.0, 160.0, 40.0, 50.0);
    let fx = |x: f64| if log_x { x.max(1e-12).log10() } else { x };
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|&(x, y)| (fx(x), y)))
        .collect();
    let (mut x0, mut x1) = all
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let y1 = all.iter().fold(0.0f64, |m, p| m.max(p.1)) * 1.1;
    if x0 >= x1 {
        x0 -= 1.0;
        x1 += 1.0;
    }
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 };
    let px = |x: f64| left + (fx(x) - x0) / (x1 - x0) * (w - left - right);
    let py = |y: f64| h - bottom - y / y1 * (h - top - bottom);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{title}</text>"#,
        w / 2.0
    );
    let _ = writeln!(
        svg,
        r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        h - bottom,
        w - right,
        h - bottom
    );
    let _ = writeln!(
        svg,
        r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"#,
        h - bottom
    );
    for i in 0..=4 {
        let y = y1 * i as f64 / 4.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{:.3}</text>"#,
            left - 6.0,
            py(y) + 4.0,
            y
        );
    }
    for x in x_ticks(series, log_x, (x0, x1)) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{x}</text>"#,
            px(x),
            h - bottom + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#,
        (left + w - right) / 2.0,
        h - 10.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{y_label}</text>"#,
        h / 2.0,
        h / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = s
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        for &(x, y) in s.points.iter().filter(|_| s.points.len() <= MARKED) {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                px(x),
                py(y)
            );
        }
        let ly = top + 18.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/>"#,
            w - right + 10.0,
            w - right + 30.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}">{}</text>"#,
            w - right + 36.0,
            ly + 4.0,
            s.name
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The x values labelled: every distinct one, or for dense data on a linear axis (a
/// training run's steps) six evenly spaced, rounded ones across `span`.
fn x_ticks(series: &[Series], log_x: bool, span: (f64, f64)) -> Vec<f64> {
    let mut ticks: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    if ticks.len() > LABELLED && !log_x {
        let (x0, x1) = span;
        ticks = (0..=5)
            .map(|i| (x0 + (x1 - x0) * i as f64 / 5.0).round())
            .collect();
        ticks.dedup();
    }
    ticks
}

/// Several charts of [`line_chart`] stacked vertically in one SVG.
pub fn stacked(charts: &[String]) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="640" height="{}">"#,
        400 * charts.len()
    );
    for (i, chart) in charts.iter().enumerate() {
        // A nested <svg> placed by its own y; the inner element keeps its size.
        let placed = chart.replacen("<svg ", &format!(r#"<svg y="{}" "#, 400 * i), 1);
        svg.push_str(&placed);
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_series_are_marked_and_labelled_dense_ones_are_not() {
        let sparse = Series {
            name: "bench".into(),
            points: vec![(1.0, 2.0), (2.0, 3.0), (4.0, 1.0)],
        };
        let svg = line_chart("t", "x", "y", false, std::slice::from_ref(&sparse));
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains(">bench</text>") && svg.contains("<polyline"));
        let dense = Series {
            name: "loss".into(),
            points: (0..1000)
                .map(|i| (f64::from(i), 1.0 / f64::from(i + 1)))
                .collect(),
        };
        let svg = line_chart("t", "step", "loss", false, &[dense]);
        assert_eq!(svg.matches("<circle").count(), 0);
        let labels = svg.matches(r#"text-anchor="middle">"#).count();
        assert!(labels < 12, "{labels} labels");
        let both = stacked(&[svg.clone(), svg]);
        assert_eq!(both.matches("<svg ").count(), 3);
        assert!(both.contains(r#"<svg y="400" "#));
    }
}
