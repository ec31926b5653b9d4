//! The id of one row.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The id of one row: an integer or a text key, as the id column holds it.
///
/// Serialized as a JSON number or string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RowId {
    /// An integer id (`INTEGER`, `BIGINT`, …).
    Int(i64),
    /// A text id (`TEXT`, `VARCHAR`, …).
    Text(String),
}

impl fmt::Display for RowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowId::Int(i) => write!(f, "{i}"),
            RowId::Text(s) => f.write_str(s),
        }
    }
}

impl From<i64> for RowId {
    fn from(v: i64) -> Self {
        RowId::Int(v)
    }
}

impl From<&str> for RowId {
    fn from(v: &str) -> Self {
        RowId::Text(v.to_owned())
    }
}

impl From<String> for RowId {
    fn from(v: String) -> Self {
        RowId::Text(v)
    }
}
