//! A source as the drivers see it: the [`Mapping`] of a checked source (every identifier
//! validated and quoted, status values parsed), table names, and the catalog's columns. The
//! bottom layer: it depends on nothing but values and errors.

use crate::error::{Error, Result};
use crate::id::RowId;
use crate::value::Kind;

/// What a column can be used for, from its declared type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ColType {
    Int,
    Text {
        max_len: Option<u32>,
    },
    /// A point in time the dialect's lease arithmetic works with (PostgreSQL `timestamptz`,
    /// MySQL `DATETIME`/`TIMESTAMP`).
    Timestamp,
    Other,
}

#[derive(Clone, Debug)]
pub(crate) struct Column {
    pub name: String,
    pub sql_type: String,
    pub ty: ColType,
}

/// How one database names things, for checking a source against its catalog.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Naming {
    /// Quotes a validated identifier.
    pub quote: fn(&str) -> String,
    /// The column type a lease column must have.
    pub lease_column: ColType,
    /// That type as the database calls it, for messages.
    pub lease_type: &'static str,
}

/// A checked source: every identifier validated and quoted for one dialect, status values parsed
/// to the status column's kind. The backends build all their SQL from this.
#[derive(Clone, Debug)]
pub(crate) struct Mapping {
    /// Quoted, possibly schema-qualified.
    pub table: String,
    /// As the user wrote it, for messages.
    pub table_display: String,
    /// The catalog's `schema.table`: keys the source's rows in the lease table.
    pub source_key: String,
    pub id: String,
    pub id_name: String,
    pub id_kind: Kind,
    pub status: String,
    pub ready: RowId,
    pub claimed: RowId,
    pub done: RowId,
    pub failed: RowId,
    pub owner: Option<String>,
    pub lease: Option<String>,
    pub attempts: Option<String>,
    /// `"col" ASC, "id" ASC`
    pub order_by: String,
    /// `" AND (<operator's condition>)"` or empty.
    pub filter: String,
    /// Every column with a plain name, unquoted, for building a row's JSON.
    pub columns: Vec<String>,
    /// What a layer above the claim core adds to this source (the managed queue does); none for
    /// a user's table.
    pub lifecycle: Option<Lifecycle>,
}

/// What a layer above the claim core keeps of each row besides its id, status, owner, lease and
/// attempts, and the conditions it puts on claims. The claim core keeps these columns up to
/// date and honours the conditions; it knows nothing else of them. All names quoted.
#[derive(Clone, Debug)]
pub(crate) struct Lifecycle {
    /// Rows are claimable once this time has come; a retry or a snooze moves it on.
    pub due: String,
    /// When a row's latest attempt started (set by every claim, by the database's clock).
    pub started: String,
    /// When a row completed or failed for good.
    pub finished: String,
    /// Where a failure's error goes.
    pub error: String,
    /// A JSON list of the row's failed attempts, each appended as it fails (the attempt, when
    /// it started and ended, its error), the last [`crate::backend::sql::ATTEMPTS_KEPT`] kept.
    pub history: String,
    /// What a completed row's handler produced (JSON).
    pub output: String,
    /// A completed row is deleted, not kept (less to write, a table that stays small).
    pub delete_done: bool,
    /// Conditions a row must also meet to be claimed.
    pub claimable: Vec<Fragment>,
    /// Conditions a row must also meet to count as work left (its backlog): the claimable
    /// rows and those another claim of the same layer takes.
    pub work: Vec<Fragment>,
    /// The columns a claimed row carries (unquoted), instead of all of them: fewer to build
    /// and to read.
    pub carried: Vec<String>,
    /// Of those, the ones carried as their JSON text (read back alike on every database).
    pub as_text: Vec<String>,
    /// Values a claim returns with each row besides its columns, by the field they come in.
    pub extra: Vec<(String, Fragment)>,
    /// How to make the indexes this layer's claims read through (for `check`).
    pub index_fix: &'static str,
}

/// A piece of SQL that a layer above the claim core hands to it (a condition on the rows it may
/// claim, an arm to look for ready rows in), with its values kept apart for binding and its
/// names for quoting: each driver renders it in its dialect (`sql::render`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Fragment(pub Vec<Piece>);

/// One piece of a [`Fragment`].
#[derive(Clone, Debug)]
pub(crate) enum Piece {
    /// SQL text, as written (keywords, operators, rowclaim's own table names).
    Sql(std::borrow::Cow<'static, str>),
    /// A column of the source's table, quoted.
    Column(&'static str),
    /// A value, bound.
    Value(crate::value::Value),
    /// A time given in microseconds since the Unix epoch, bound, as the column type of times.
    AtMicros(i64),
    /// A time column (of the claimed rows, alias `t`) in microseconds since the Unix epoch.
    MicrosOf(&'static str),
}

impl Fragment {
    /// An empty fragment, to add pieces to.
    pub(crate) fn new() -> Fragment {
        Fragment::default()
    }

    /// Adds SQL text.
    pub(crate) fn sql(mut self, text: impl Into<std::borrow::Cow<'static, str>>) -> Fragment {
        self.0.push(Piece::Sql(text.into()));
        self
    }

    /// Adds a column of the source's table.
    pub(crate) fn column(mut self, name: &'static str) -> Fragment {
        self.0.push(Piece::Column(name));
        self
    }

    /// Adds a bound value.
    pub(crate) fn value(mut self, v: impl Into<crate::value::Value>) -> Fragment {
        self.0.push(Piece::Value(v.into()));
        self
    }

    /// Adds bound values separated by `, ` (for `IN (…)`).
    pub(crate) fn values<V: Into<crate::value::Value>>(
        mut self,
        vs: impl IntoIterator<Item = V>,
    ) -> Fragment {
        for (i, v) in vs.into_iter().enumerate() {
            if i > 0 {
                self.0.push(Piece::Sql(", ".into()));
            }
            self.0.push(Piece::Value(v.into()));
        }
        self
    }

    /// Adds a piece.
    pub(crate) fn piece(mut self, p: Piece) -> Fragment {
        self.0.push(p);
        self
    }
}

impl Mapping {
    /// The columns a claimed row carries: all of them, unless a layer above says which.
    pub(crate) fn carried(&self) -> &[String] {
        self.lifecycle
            .as_ref()
            .map_or(&self.columns, |l| &l.carried)
    }

    /// Whether settling with `done` deletes rows instead of marking them.
    pub(crate) fn deletes_done(&self) -> bool {
        self.lifecycle.as_ref().is_some_and(|l| l.delete_done)
    }

    /// Row ids read back as text (from `RETURNING`, the lease table, a candidate query), as the
    /// id column's kind.
    pub(crate) fn parse_ids(&self, texts: &[String]) -> Result<Vec<RowId>> {
        texts
            .iter()
            .map(|t| self.id_kind.parse(t, "row id"))
            .collect()
    }

    /// The id of a row read as JSON (a claim's `row_json`), as the id column's kind.
    pub(crate) fn id_of(&self, row: &serde_json::Value) -> Result<RowId> {
        row.get(&self.id_name)
            .and_then(|v| self.id_kind.id_from_json(v))
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "claimed row has no usable {} in {row}",
                    self.id_name
                ))
            })
    }
}

/// A table name, optionally qualified by a schema (PostgreSQL) or database (MySQL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableName {
    pub schema: Option<String>,
    pub name: String,
    pub display: String,
}

impl TableName {
    pub(crate) fn parse(text: &str) -> Result<TableName> {
        let (schema, name) = match text.split_once('.') {
            Some((s, n)) => (Some(ident(s, "table schema")?), ident(n, "table")?),
            None => (None, ident(text, "table")?),
        };
        Ok(TableName {
            schema,
            name,
            display: text.to_owned(),
        })
    }

    pub(crate) fn quoted(&self, quote: fn(&str) -> String) -> String {
        match &self.schema {
            Some(s) => format!("{}.{}", quote(s), quote(&self.name)),
            None => quote(&self.name),
        }
    }
}

pub(crate) fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 63
}

/// Validates a plain identifier; the error names the setting it came from.
pub(crate) fn ident(s: &str, what: &'static str) -> Result<String> {
    if is_ident(s) {
        Ok(s.to_owned())
    } else {
        Err(Error::InvalidIdentifier {
            what,
            value: s.to_owned(),
        })
    }
}

/// A checked status value (see [`check_status_value`]) as an SQL literal.
pub(crate) fn status_literal(v: &RowId) -> String {
    match v {
        RowId::Int(i) => i.to_string(),
        RowId::Text(s) => format!("'{s}'"),
    }
}
