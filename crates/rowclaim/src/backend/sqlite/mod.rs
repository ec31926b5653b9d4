//! SQLite: rowclaim's claim SQL for SQLite (the managed queue's is in `queue/sqlite.rs`).
//!
//! SQLite has one writer at a time and no row locks, so a claim that takes the write lock
//! (`BEGIN IMMEDIATE`) is alone: no `SKIP LOCKED` is needed, and none exists. Leases are `INTEGER`
//! unix epoch milliseconds from `unixepoch('subsec')`; rows come back as `json_object(…)`; id lists
//! are bound as one JSON array (`IN (SELECT value FROM json_each(?))`), so statement texts are stable.
//! Placeholders are positional `?`: every statement binds in the order its text uses them.

mod catalog;
mod check;
pub(crate) mod claim;
pub(crate) mod store;

use std::time::Duration;

use super::once;
use super::run::binder_queries;
use super::sql::{self, Binder, Dialect, Stmt, Value};
use super::{
    Catalog, ClaimArgs, ClaimStore, Claimed, Claims, Held, Outcome, Resolved, ServerInfo,
    ServerKind, Target,
};
use crate::error::{DbKind, Error, Result};
use crate::id::RowId;
use crate::locking::{LockMode, LockWait};
use crate::mapping::{status_literal, ColType, Column, Mapping, TableName};
use crate::strategy::Strategy;
use crate::value::{IdList, Kind};
use sqlx::{Row, Sqlite, SqlitePool};

type B = Binder<Sql>;

/// The open transaction of this driver's transaction strategy and locking reads.
type Tx = LiteHeld;

/// SQLite's SQL.
pub(crate) struct Sql;

impl Dialect for Sql {
    const SKIP_SCAN: bool = false;
    type DB = Sqlite;
    const NOW: &'static str = NOW;
    const EPOCH_SECONDS: &'static str = "unixepoch()";
    const TEXT: &'static str = "TEXT";
    const ONE_WRITER: bool = true;
    const NOWAIT: Option<&'static str> = None;
    const LEASE_COLUMN: ColType = ColType::Int;
    const LEASE_TYPE: &'static str = "INTEGER (unix epoch milliseconds)";

    fn quote(ident: &str) -> String {
        format!("\"{ident}\"")
    }

    /// Times are epoch milliseconds here already.
    fn epoch_ms(expr: &str) -> String {
        expr.to_owned()
    }

    /// Times are epoch milliseconds here.
    fn micros_of(expr: &str) -> String {
        format!("({expr} * 1000)")
    }

    fn at_micros(b: &mut B, us: i64) -> String {
        format!("({} / 1000)", b.bind(us))
    }

    /// Times are epoch milliseconds here already.
    fn at_ms(ms: &str) -> String {
        ms.to_owned()
    }

    fn keep_existing(key: &str) -> String {
        format!("ON CONFLICT ({key}) DO NOTHING")
    }

    fn placeholder(_: usize) -> String {
        "?".to_owned()
    }

    fn later(b: &mut B, after: Duration) -> String {
        format!("{NOW} + {}", b.bind(sql::lease_ms(after)))
    }

    /// One bound JSON array for any number of ids (a stable statement text).
    fn id_in(b: &mut B, column: &str, list: &IdList) -> String {
        format!("{column} {}", in_ids(b, list))
    }

    fn row_json(m: &Mapping) -> String {
        claimed_json(m)
    }

    type Claimed = sql::JsonText;

    fn appended(list: &str, entry: &[(&str, String)]) -> String {
        let fields: Vec<String> = entry.iter().map(|(k, v)| format!("'{k}', {v}")).collect();
        let had = format!("COALESCE({list}, '[]')");
        let kept = format!(
            "CASE WHEN json_array_length({had}) >= {} THEN json_remove({had}, '$[0]') \
             ELSE {had} END",
            sql::ATTEMPTS_KEPT
        );
        format!(
            "json_insert({kept}, '$[#]', json_object({}))",
            fields.join(", ")
        )
    }

    fn arguments(values: Vec<Value>) -> Result<<Sqlite as sqlx::Database>::Arguments> {
        sql::arguments::<Sqlite>(values, |_, _| {
            Err(Error::Internal("SQLite has no array parameters".into()))
        })
    }
}

binder_queries!(Sql, Sqlite, Lite, sorted);

/// Now, in unix epoch milliseconds, by SQLite's clock.
pub(crate) const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// A transaction holding SQLite's write lock. SQLite cannot time a lease out on its own, so
/// the deadline (database clock, ms) is checked before each write.
pub(crate) struct LiteHeld {
    pub(super) tx: sqlx::Transaction<'static, Sqlite>,
    deadline_ms: i64,
}

#[derive(Clone, Debug)]
pub(crate) struct Lite {
    pub(crate) pool: SqlitePool,
}

impl Lite {
    pub(crate) fn new(pool: SqlitePool) -> Lite {
        Lite { pool }
    }
}

/// A row as a JSON object; only plainly named columns, so their names are safe as literals.
pub(crate) fn row_json(m: &Mapping) -> String {
    json_of(&m.columns)
}

/// A claimed row as JSON text: the columns it carries (`Mapping::carried`).
fn claimed_json(m: &Mapping) -> String {
    json_of(m.carried())
}

pub(crate) fn json_of(columns: &[String]) -> String {
    let pairs: Vec<String> = columns.iter().map(|c| format!("'{c}', \"{c}\"")).collect();
    format!("json_object({})", pairs.join(", "))
}

/// `IN (…)` over a bound JSON array of ids.
pub(crate) fn in_ids(b: &mut B, list: &IdList) -> String {
    format!(
        "IN (SELECT value FROM json_each({}))",
        b.bind(list.to_json())
    )
}

/// The ids as a JSON array of text, to match the lease table's `row_id`.
fn in_text_ids(b: &mut B, list: &IdList) -> String {
    let texts: Vec<String> = match list {
        IdList::Int(v) => v.iter().map(ToString::to_string).collect(),
        IdList::Text(v) => v.clone(),
    };
    in_ids(b, &IdList::Text(texts))
}

fn row_id_as_id(m: &Mapping, expr: &str) -> String {
    match m.id_kind {
        Kind::Int => format!("CAST({expr} AS INTEGER)"),
        Kind::Text => expr.to_owned(),
    }
}

pub(crate) fn parse_rows(texts: Vec<String>) -> Result<Vec<serde_json::Value>> {
    texts.iter().map(|t| sql::parse_row(t)).collect()
}

/// The error a held transaction reports once its deadline has passed; the facade fills in the
/// token and rows.
fn expired() -> Error {
    Error::LeaseLost {
        token: String::new(),
        ids: vec![],
    }
}

const CREATE_LEASES: &str = "CREATE TABLE IF NOT EXISTS rowclaim_leases (
    source TEXT NOT NULL,
    row_id TEXT NOT NULL,
    token TEXT NOT NULL,
    lease_until INTEGER NOT NULL,
    PRIMARY KEY (source, row_id)) WITHOUT ROWID";

const CREATE_LEASES_TOKEN: &str =
    "CREATE INDEX IF NOT EXISTS rowclaim_leases_token ON rowclaim_leases (token)";

const CREATE_SOURCES: &str = "CREATE TABLE IF NOT EXISTS rowclaim_sources (
    source TEXT PRIMARY KEY,
    mapping TEXT NOT NULL,
    recorded_at INTEGER NOT NULL)";

const CREATE_COUNTERS: &str = "CREATE TABLE IF NOT EXISTS rowclaim_counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL)";

impl Lite {
    /// A write transaction: takes the write lock at once (waiting up to the busy timeout), so a
    /// read inside it can never be outdated by another writer.
    pub(crate) async fn write(&self) -> Result<sqlx::Transaction<'static, Sqlite>> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(error)
    }

    /// One file, one writer: every committed write is seen at once.
    pub(crate) async fn applies_others_late(&self) -> Result<bool> {
        Ok(false)
    }

    /// A transaction for [`run::Transact`]: a write transaction (every commit here is durable).
    pub(crate) async fn open_transaction(
        &self,
        _durable: bool,
    ) -> Result<sqlx::Transaction<'static, Sqlite>> {
        self.write().await
    }

    async fn deadline_passed(
        tx: &mut sqlx::Transaction<'static, Sqlite>,
        deadline_ms: i64,
    ) -> Result<bool> {
        let sql = format!("SELECT {NOW} > ?");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(deadline_ms)
            .fetch_one(&mut **tx)
            .await
            .map_err(error)
    }
}

/// Sorts an SQLite error by its (extended) result code; SQLite has no code for a missing table
/// or column, only the message.
fn classify(e: &dyn sqlx::error::DatabaseError) -> Option<DbKind> {
    e.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    let code: i64 = e.code().and_then(|c| c.parse().ok()).unwrap_or(0);
    match code & 0xff {
        // SQLITE_BUSY itself: the busy handler waited its time for another connection's lock.
        _ if code == 5 => Some(DbKind::LockWait),
        // SQLITE_BUSY_RECOVERY and _SNAPSHOT (no wait: the read is outdated), SQLITE_LOCKED.
        5 | 6 => Some(DbKind::Transient),
        // SQLITE_READONLY (the file, its directory or a `mode=ro` URL), SQLITE_AUTH.
        8 | 23 => Some(DbKind::PermissionDenied),
        _ if e.message().contains("no such table") => Some(DbKind::MissingTable),
        _ if e.message().contains("has no column named")
            || e.message().contains("no such column") =>
        {
            Some(DbKind::MissingColumn)
        }
        _ => None,
    }
}

/// SQLite's errors are worded well by the driver.
fn describe(e: &dyn sqlx::error::DatabaseError) -> Option<String> {
    let e = e.try_downcast_ref::<sqlx::sqlite::SqliteError>()?;
    let code = sqlx::error::DatabaseError::code(e)?;
    // SQLITE_READONLY and its extended codes: say whose file it is about, not only that it is.
    let hint = match code.as_ref() {
        // SQLITE_READONLY_DIRECTORY
        "1544" => concat!(
            "; the SQLite file is in WAL mode and this user cannot write its directory, where ",
            "SQLite must create the file's -shm and -wal companions even to read it: let this ",
            "user write the directory, or switch the file to journal_mode=DELETE"
        ),
        // SQLITE_READONLY
        "8" => concat!(
            "; the SQLite file is read-only for this user: commands that change rows need write ",
            "access to it and its directory (stats, jobs list/show and source list only read)"
        ),
        _ => return None,
    };
    Some(format!(
        "{} (code {code}){hint}",
        sqlx::error::DatabaseError::message(e)
    ))
}

/// This driver's errors, sorted where they are made: what its server's codes mean to rowclaim
/// ([`classify`]) and how to word them ([`describe`]).
pub(crate) fn sorted(e: sqlx::Error) -> crate::error::DatabaseError {
    crate::error::DatabaseError::sorted(e, |db| (classify(db), describe(db)))
}

/// What `e` means to rowclaim, as this driver sorts it (for an error it handles itself).
pub(crate) fn error_kind(e: &sqlx::Error) -> Option<DbKind> {
    crate::error::kind_of(e, classify)
}

/// [`sorted`], as the crate's error.
pub(crate) fn error(e: sqlx::Error) -> Error {
    Error::Database(sorted(e))
}

impl crate::error::DatabaseError {
    /// An error of sqlx's SQLite driver, sorted as rowclaim's SQLite driver sorts its own:
    /// for code that talks to the database itself and asks what an error means
    /// ([`crate::Error::kind`] of `Error::Database` of it).
    pub fn sqlite(e: sqlx::Error) -> crate::error::DatabaseError {
        sorted(e)
    }
}
