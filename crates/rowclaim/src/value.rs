//! The kinds of ids and values rowclaim binds to its statements (status values, ids,
//! settings), and times as the database's clock gives them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::id::RowId;

/// Whether a column holds integers or text: decides how ids and status values are bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Int,
    Text,
}

impl Kind {
    /// Parses `text` (from the command line or a config file) as a value of this kind.
    pub(crate) fn parse(self, text: &str, what: &str) -> crate::error::Result<RowId> {
        match self {
            Kind::Text => Ok(RowId::Text(text.to_owned())),
            Kind::Int => text.trim().parse::<i64>().map(RowId::Int).map_err(|_| {
                crate::error::Error::InvalidInput(format!(
                    "{what} {text:?} is not an integer, but its column holds integers"
                ))
            }),
        }
    }

    /// Reads an id out of a row's JSON form.
    pub(crate) fn id_from_json(self, v: &serde_json::Value) -> Option<RowId> {
        match (self, v) {
            (Kind::Int, serde_json::Value::Number(n)) => n.as_i64().map(RowId::Int),
            (Kind::Int, serde_json::Value::String(s)) => s.parse().ok().map(RowId::Int),
            (Kind::Text, serde_json::Value::String(s)) => Some(RowId::Text(s.clone())),
            (Kind::Text, serde_json::Value::Number(n)) => Some(RowId::Text(n.to_string())),
            _ => None,
        }
    }
}

/// Ids split by kind, ready to bind as one array or list.
pub(crate) enum IdList {
    Int(Vec<i64>),
    Text(Vec<String>),
}

impl IdList {
    pub(crate) fn len(&self) -> usize {
        match self {
            IdList::Int(v) => v.len(),
            IdList::Text(v) => v.len(),
        }
    }

    pub(crate) fn new(kind: Kind, ids: &[RowId]) -> crate::error::Result<IdList> {
        match kind {
            Kind::Int => ids
                .iter()
                .map(|id| match id {
                    RowId::Int(i) => Ok(*i),
                    RowId::Text(t) => t.parse().map_err(|_| {
                        crate::error::Error::InvalidInput(format!(
                            "row id {t:?} is not an integer, but the id column holds integers"
                        ))
                    }),
                })
                .collect::<crate::error::Result<_>>()
                .map(IdList::Int),
            Kind::Text => Ok(IdList::Text(ids.iter().map(ToString::to_string).collect())),
        }
    }

    /// The ids as row ids, in their order.
    pub(crate) fn row_ids(&self) -> Vec<RowId> {
        match self {
            IdList::Int(v) => v.iter().map(|i| RowId::Int(*i)).collect(),
            IdList::Text(v) => v.iter().map(|t| RowId::Text(t.clone())).collect(),
        }
    }

    /// The ids as a JSON array, for SQLite's `json_each(?)`.
    pub(crate) fn to_json(&self) -> String {
        match self {
            IdList::Int(v) => serde_json::Value::from(v.clone()).to_string(),
            IdList::Text(v) => serde_json::Value::from(v.clone()).to_string(),
        }
    }
}

/// A value bound to a statement.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    Int(i64),
    OptInt(Option<i64>),
    I32(i32),
    Float(f64),
    OptFloat(Option<f64>),
    Text(String),
    OptText(Option<String>),
    /// PostgreSQL arrays (`= ANY($n)`, `unnest($n)`).
    Ints(Vec<i64>),
    OptInts(Vec<Option<i64>>),
    I32s(Vec<i32>),
    Texts(Vec<String>),
    OptTexts(Vec<Option<String>>),
}

macro_rules! value_from {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$v(v)
            }
        }
    )*};
}
value_from!(i64 => Int, Option<i64> => OptInt, i32 => I32, f64 => Float, Option<f64> => OptFloat, String => Text,
    Option<String> => OptText, Vec<i64> => Ints, Vec<Option<i64>> => OptInts, Vec<i32> => I32s,
    Vec<String> => Texts, Vec<Option<String>> => OptTexts);

impl Value {
    /// The integer it holds, if any.
    pub(crate) fn int(self) -> Option<i64> {
        match self {
            Value::Int(i) | Value::OptInt(Some(i)) => Some(i),
            Value::I32(i) => Some(i64::from(i)),
            _ => None,
        }
    }

    /// The text it holds, if any.
    pub(crate) fn text(self) -> Option<String> {
        match self {
            Value::Text(t) | Value::OptText(Some(t)) => Some(t),
            _ => None,
        }
    }
}

/// A time in epoch milliseconds (as the database's clock gives it) as a `SystemTime`.
pub(crate) fn at_ms(ms: i64) -> SystemTime {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}
