//! Rendering a [`Fragment`] a layer above hands down into a dialect's SQL: its text as written,
//! its columns quoted, its values bound, its times in the dialect's time type.

use super::{Binder, Dialect};
use crate::mapping::{Fragment, Piece};

/// `f` as SQL text of dialect `D`, its values bound to `b` in the order the text has them.
pub(crate) fn render<D: Dialect>(f: &Fragment, b: &mut Binder<D>) -> String {
    let mut out = String::new();
    for piece in &f.0 {
        match piece {
            Piece::Sql(text) => out.push_str(text),
            Piece::Column(name) => out.push_str(&D::quote(name)),
            Piece::Value(v) => out.push_str(&b.bind(v.clone())),
            Piece::AtMicros(us) => out.push_str(&D::at_micros(b, *us)),
            Piece::MicrosOf(name) => out.push_str(&D::micros_of(&format!("t.{}", D::quote(name)))),
        }
    }
    out
}

/// ` AND (…)` for each of `conditions`, rendered.
pub(crate) fn and_each<D: Dialect>(conditions: &[Fragment], b: &mut Binder<D>) -> String {
    conditions
        .iter()
        .map(|c| format!(" AND ({})", render(c, b)))
        .collect()
}
