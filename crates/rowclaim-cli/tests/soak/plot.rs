//! The soak's plot: jobs completed (bars) and enqueued (line) per minute, the faults marked; an
//! SVG written by hand (no plotting library).

use std::fmt::Write;

use crate::report::Soak;
use crate::rig::FaultKind;

impl Soak {
    /// Jobs completed and enqueued per minute, with the faults marked: an SVG written by hand.
    pub fn svg(&self) -> String {
        let minutes = self.minutes();
        let (w, h) = (900.0, 420.0);
        let (left, right, top, bottom) = (70.0, 860.0, 50.0, 340.0);
        let n = minutes.len().max(1) as f64;
        let max = minutes
            .iter()
            .map(|m| m.completed.max(m.enqueued))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let y_max = nice_ceiling(max * 1.1);
        let x = |m: f64| left + (right - left) * m / n;
        let y = |v: f64| bottom - (bottom - top) * v / y_max;
        let mut s = String::new();
        writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        )
        .unwrap();
        writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#).unwrap();
        writeln!(
            s,
            r#"<text x="{}" y="24" text-anchor="middle" font-size="15">rowclaim soak ({}): jobs per minute, faults marked</text>"#,
            w / 2.0,
            self.backend
        )
        .unwrap();
        // Grid and y ticks.
        for i in 0..=4 {
            let v = y_max * i as f64 / 4.0;
            let yy = y(v);
            writeln!(
                s,
                r##"<line x1="{left}" y1="{yy:.1}" x2="{right}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
                left - 6.0,
                yy + 4.0
            )
            .unwrap();
        }
        // Bars: completed.
        let bw = (right - left) / n * 0.7;
        for m in &minutes {
            let x0 = x(m.minute as f64) + (right - left) / n * 0.15;
            let y0 = y(m.completed as f64);
            writeln!(
                s,
                r##"<rect x="{x0:.1}" y="{y0:.1}" width="{bw:.1}" height="{:.1}" fill="#1f77b4"><title>minute {}: {} completed, {} enqueued</title></rect>"##,
                bottom - y0,
                m.minute,
                m.completed,
                m.enqueued
            )
            .unwrap();
        }
        // Line: enqueued.
        let pts: Vec<String> = minutes
            .iter()
            .map(|m| {
                format!(
                    "{:.1},{:.1}",
                    x(m.minute as f64 + 0.5),
                    y(m.enqueued as f64)
                )
            })
            .collect();
        writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#ff7f0e" stroke-width="2"/>"##,
            pts.join(" ")
        )
        .unwrap();
        // Faults: a red tick at their start, with the kind as a tooltip and a short letter.
        for f in &self.faults {
            let at = f.start.saturating_sub(self.t0) as f64 / 60e6;
            let xx = x(at);
            writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{bottom}" stroke="#d62728" stroke-dasharray="3,3"><title>{}</title></line><text x="{xx:.1}" y="{}" fill="#d62728" text-anchor="middle" font-size="10">{}</text>"##,
                f.describe(self.t0),
                top - 4.0,
                letter(f.kind)
            )
            .unwrap();
        }
        // Axes and x ticks.
        writeln!(
            s,
            r#"<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="black"/>"#
        )
        .unwrap();
        let step = (minutes.len() / 12).max(1);
        for m in (0..=minutes.len()).step_by(step) {
            writeln!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{m}</text>"#,
                x(m as f64),
                bottom + 16.0
            )
            .unwrap();
        }
        writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">minute of the run</text>"#,
            (left + right) / 2.0,
            bottom + 34.0
        )
        .unwrap();
        writeln!(
            s,
            r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">jobs per minute</text>"#,
            (top + bottom) / 2.0
        )
        .unwrap();
        // Legend.
        let ly = h - 30.0;
        writeln!(
            s,
            r##"<rect x="{left}" y="{:.1}" width="12" height="12" fill="#1f77b4"/><text x="{}" y="{ly}">completed</text><line x1="{}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="#ff7f0e" stroke-width="2"/><text x="{}" y="{ly}">enqueued</text><text x="{}" y="{ly}" fill="#d62728">faults: R restart, C cut, B black hole, K SIGKILL, S SIGSTOP, P PgBouncer, F failover</text>"##,
            ly - 10.0,
            left + 16.0,
            left + 100.0,
            ly - 4.0,
            left + 124.0,
            ly - 4.0,
            left + 130.0,
            left + 220.0
        )
        .unwrap();
        s.push_str("</svg>\n");
        s
    }
}

fn letter(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Restart => "R",
        FaultKind::Cut => "C",
        FaultKind::BlackHole => "B",
        FaultKind::KillWorker => "K",
        FaultKind::StopWorker => "S",
        FaultKind::PgBouncerRestart => "P",
        FaultKind::Promote => "F",
    }
}

fn nice_ceiling(v: f64) -> f64 {
    let mag = 10f64.powf(v.max(1.0).log10().floor());
    for m in [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}
