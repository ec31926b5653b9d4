//! Line charts as inline SVG, drawn on the server from the sampler's history: no script, and
//! every label goes through maud's escaping like any other text.

use std::time::SystemTime;

use maud::{html, Markup};

const W: f64 = 560.0;
const H: f64 = 120.0;
const PAD: f64 = 4.0;

/// One line: its name (for the legend), colour and points (time, value).
pub struct Line {
    pub name: String,
    pub colour: &'static str,
    pub points: Vec<(SystemTime, f64)>,
}

/// Colours of lines by status, the same on every chart.
pub fn colour_of(status: &str) -> &'static str {
    match status {
        "ready" => "#3b7dd8",
        "running" | "claimed" => "#e0a000",
        "completed" | "done" => "#2e9e4f",
        "dead" | "failed" => "#c83737",
        "cancelled" => "#888888",
        _ => "#7a4fbf",
    }
}

/// A chart titled `title` of `lines` over their common time span, `unit` after the largest value.
pub fn chart(title: &str, unit: &str, lines: &[Line]) -> Markup {
    let all: Vec<&(SystemTime, f64)> = lines.iter().flat_map(|l| &l.points).collect();
    let (Some(start), Some(end)) = (all.iter().map(|p| p.0).min(), all.iter().map(|p| p.0).max())
    else {
        return html! {
            figure.chart { figcaption { (title) } p.muted { "No samples yet: the chart fills as the dashboard samples." } }
        };
    };
    let span = end
        .duration_since(start)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
        .max(1.0);
    let top = all.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(1.0);
    let x = |t: SystemTime| {
        PAD + (W - 2.0 * PAD)
            * t.duration_since(start)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0)
            / span
    };
    let y = |v: f64| H - PAD - (H - 2.0 * PAD) * v / top;
    // Under two minutes of history, seconds say more than "0 min".
    let over = if span < 120.0 {
        format!("{span:.0} s")
    } else {
        format!("{:.0} min", span / 60.0)
    };
    html! {
        figure.chart {
            figcaption {
                (title) " "
                span.muted { "(last " (over) "; top " (format!("{top:.0}")) " " (unit) ")" }
            }
            svg xmlns="http://www.w3.org/2000/svg" width=(W) height=(H) viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(title) {
                rect x="0" y="0" width=(W) height=(H) fill="#fafafa" stroke="#ddd" {}
                @for line in lines {
                    @let pts: Vec<String> = line.points.iter().map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v))).collect();
                    polyline points=(pts.join(" ")) fill="none" stroke=(line.colour) stroke-width="2" {}
                }
            }
            div.legend {
                @for line in lines {
                    span { span.swatch style=(format!("background:{}", line.colour)) {} (line.name) }
                }
            }
        }
    }
}
