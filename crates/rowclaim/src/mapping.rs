//! A source as the drivers see it: the [`Mapping`] of a checked source (every identifier
//! validated and quoted, status values parsed), table names, and the catalog's columns. The
//! bottom layer: it depends on nothing but values and errors.

use crate::value::Kind;
use crate::{Error, Result, RowId};

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
    /// The columns a claimed row's JSON holds: all of them for a user's table; for the managed
    /// queue the job's own (not the claim's bookkeeping: status, owner, lease, …), which keeps
    /// a claim of many jobs cheap to build and to read.
    pub claim_columns: Vec<String>,
    /// Managed queue: a completed job is deleted, not kept as `completed`.
    pub delete_done: bool,
    /// Managed queue: rows are claimable once their run-at has come.
    pub run_at: Option<String>,
    /// Managed queue: the priority column. Claims take jobs by priority (descending), run-at and
    /// id, and PostgreSQL's resume after a [`crate::backend::Position`] in that order.
    pub priority: Option<String>,
    /// Managed queue: the queue column and the queue names to claim from (bound, never pasted).
    pub queues: Option<(String, Vec<String>)>,
    /// Managed queue: the kind column and the kinds to claim (all when empty; bound).
    pub kinds: Option<(String, Vec<String>)>,
    /// Managed queue: where a failure's error goes.
    pub error_column: Option<String>,
    /// Managed queue: when a job completed or died.
    pub finished_column: Option<String>,
    /// Managed queue: what a completed job's handler produced (JSON).
    pub output_column: Option<String>,
    /// Managed queue: when its latest attempt started (set by every claim, by the database's
    /// clock).
    pub started_column: Option<String>,
}

impl Mapping {
    /// Row ids read back as text (from `RETURNING`, the lease table, a candidate query), as the
    /// id column's kind.
    pub(crate) fn parse_ids(&self, texts: &[String]) -> Result<Vec<RowId>> {
        texts
            .iter()
            .map(|t| self.id_kind.parse(t, "row id"))
            .collect()
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
