//! A self-contained SVG line chart, written by hand: x on a log2 axis (worker counts), y linear
//! from zero, one coloured line with dots per series, a legend, ticks and labels.

use std::fmt::Write;

use crate::short_count;

/// One line of the chart.
pub(crate) struct Series {
    pub name: String,
    /// (x, y) points; x must be above zero (log axis).
    pub points: Vec<(f64, f64)>,
}

pub(crate) struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

const W: f64 = 820.0;
const H: f64 = 480.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 640.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 410.0;

impl Chart {
    pub(crate) fn render(&self) -> String {
        let mut xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .filter(|x| *x > 0.0)
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let (lo, hi) = match (xs.first(), xs.last()) {
            (Some(a), Some(b)) if a < b => (a.log2(), b.log2()),
            (Some(a), _) => (a.log2() - 1.0, a.log2() + 1.0),
            _ => (0.0, 1.0),
        };
        // A little room at both ends, so that no dot sits on an axis.
        let pad = (hi - lo) * 0.04;
        let (lo, hi) = (lo - pad, hi + pad);
        let x_at = |x: f64| LEFT + (x.log2() - lo) / (hi - lo) * (RIGHT - LEFT);
        let y_max = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0_f64, f64::max);
        let (step, top) = nice_scale(y_max * 1.05);
        let y_at = |y: f64| BOTTOM - y / top * (BOTTOM - TOP);

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="30" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
            (LEFT + RIGHT) / 2.0,
            esc(&self.title)
        );
        // Y grid, ticks and labels.
        let mut y = 0.0;
        while y <= top + step / 2.0 {
            let py = y_at(y);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{py:.1}" x2="{RIGHT}" y2="{py:.1}" stroke="#e0e0e0"/>"##
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 8.0,
                py + 4.0,
                short_count(y)
            );
            y += step;
        }
        // X ticks and labels at every x that has a point.
        for &x in &xs {
            let px = x_at(x);
            let _ = writeln!(
                s,
                r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{BOTTOM}" stroke="#f0f0f0"/>"##
            );
            let _ = writeln!(
                s,
                r##"<line x1="{px:.1}" y1="{BOTTOM}" x2="{px:.1}" y2="{}" stroke="#333"/>"##,
                BOTTOM + 5.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"#,
                BOTTOM + 20.0,
                short_count(x)
            );
        }
        // Axes and their labels.
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{BOTTOM}" x2="{RIGHT}" y2="{BOTTOM}" stroke="#333"/>"##
        );
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{BOTTOM}" stroke="#333"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (LEFT + RIGHT) / 2.0,
            BOTTOM + 45.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="20" y="{0}" text-anchor="middle" transform="rotate(-90 20 {0})">{1}</text>"#,
            (TOP + BOTTOM) / 2.0,
            esc(&self.y_label)
        );
        // One line per series, with its dots, and its legend entry.
        for (i, series) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut points: Vec<(f64, f64)> = series
                .points
                .iter()
                .copied()
                .filter(|p| p.0 > 0.0)
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let coords: Vec<String> = points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", x_at(x), y_at(y)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
                coords.join(" "),
                esc(&series.name)
            );
            for &(x, y) in &points {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{colour}"><title>{}: {} workers, {:.0} jobs/s</title></circle>"#,
                    x_at(x),
                    y_at(y),
                    esc(&series.name),
                    x,
                    y
                );
            }
            let ly = TOP + 10.0 + 22.0 * i as f64;
            let lx = RIGHT + 25.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="3"/>"#,
                lx + 24.0
            );
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" class="legend">{}</text>"#,
                lx + 32.0,
                ly + 4.0,
                esc(&series.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// A tick step of 1, 2 or 5 × 10^k giving about five ticks, and the axis top (a multiple of it).
fn nice_scale(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 5.0);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (step, (max / step).ceil() * step)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_scales() {
        assert_eq!(nice_scale(9500.0), (2000.0, 10000.0));
        assert_eq!(nice_scale(100.0), (20.0, 100.0));
        assert_eq!(nice_scale(0.0), (1.0, 5.0));
    }

    #[test]
    fn one_line_and_legend_per_series() {
        let chart = Chart {
            title: "A & B".into(),
            x_label: "workers".into(),
            y_label: "jobs/s".into(),
            series: vec![
                Series {
                    name: "token".into(),
                    points: vec![(1.0, 100.0), (4.0, 300.0), (2.0, 200.0)],
                },
                Series {
                    name: "<odd>".into(),
                    points: vec![(1.0, 50.0)],
                },
            ],
        };
        let svg = chart.render();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">token</text>"));
        assert!(svg.contains("&lt;odd&gt;"));
        assert!(svg.contains("A &amp; B"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }
}
