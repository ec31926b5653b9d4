//! PostgreSQL: rowclaim's claim SQL for PostgreSQL (the managed queue's is in `queue/postgres.rs`).
//!
//! Leases are `timestamptz` computed from `now()`; rows come back as `to_jsonb(t)` (a managed
//! queue's jobs as plain columns, [`claimed_columns`]); id lists are
//! bound as one array (`= ANY($n)`), so every statement's text is stable and prepared once.

mod catalog;
mod check;
pub(crate) mod claim;
pub(crate) mod route;
pub(crate) mod store;
pub(crate) mod target;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use route::Route;

use super::once;
use super::run::binder_queries;
use super::run::{Finish, Run, Transact};
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
use sqlx::{PgPool, Postgres, Row};

type B = Binder<Sql>;

/// The open transaction of this driver's transaction strategy and locking reads.
type Tx = sqlx::Transaction<'static, Postgres>;

/// PostgreSQL's SQL.
pub(crate) struct Sql;

impl Dialect for Sql {
    type DB = Postgres;
    const NOW: &'static str = "now()";
    const EPOCH_SECONDS: &'static str = "CAST(floor(extract(epoch FROM now())) AS bigint)";
    const TEXT: &'static str = "text";
    const LEASE_COLUMN: ColType = ColType::Timestamp;
    const LEASE_TYPE: &'static str = "timestamptz";

    fn quote(ident: &str) -> String {
        format!("\"{ident}\"")
    }

    fn keep_existing(key: &str) -> String {
        format!("ON CONFLICT ({key}) DO NOTHING")
    }

    fn placeholder(n: usize) -> String {
        format!("${n}")
    }

    fn later(b: &mut B, after: Duration) -> String {
        format!(
            "now() + make_interval(secs => {})",
            b.bind(after.as_secs_f64())
        )
    }

    /// One array for any number of ids, so the statement's text (and its prepared plan) is the
    /// same for every batch.
    fn id_in(b: &mut B, column: &str, list: &IdList) -> String {
        format!("{column} = ANY({})", ids(b, list))
    }

    fn row_json(m: &Mapping) -> String {
        claimed_json(m)
    }

    type Claimed = Columns;

    /// Plain columns, each read by its type ([`Columns`]): as a JSON object, the server spent
    /// 3.5 µs a row building it, as much again as the rest of the read.
    fn claimed_select(m: &Mapping) -> String {
        claimed_columns(m)
    }

    fn epoch_ms(expr: &str) -> String {
        format!("floor(extract(epoch FROM {expr}) * 1000)::int8")
    }

    fn micros_of(expr: &str) -> String {
        format!("(extract(epoch FROM {expr}) * 1000000)::int8")
    }

    fn at_micros(b: &mut B, us: i64) -> String {
        format!(
            "(timestamptz 'epoch' + {} * interval '1 microsecond')",
            b.bind(us)
        )
    }

    /// Exact for whole milliseconds: a float8 holds them exactly, and `to_timestamp` keeps
    /// microseconds.
    fn at_ms(ms: &str) -> String {
        format!("to_timestamp({ms}::float8 / 1000)")
    }

    fn json(b: &mut B, text: String) -> String {
        format!("CAST({} AS jsonb)", b.bind(text))
    }

    fn appended(list: &str, entry: &[(&str, String)]) -> String {
        let fields: Vec<String> = entry.iter().map(|(k, v)| format!("'{k}', {v}")).collect();
        // Lax mode clamps `last - n` at the list's start, so a short list is kept whole.
        format!(
            "jsonb_path_query_array(COALESCE({list}, '[]'::jsonb) || \
             jsonb_build_array(jsonb_build_object({})), '$[last - {} to last]')",
            fields.join(", "),
            sql::ATTEMPTS_KEPT - 1
        )
    }

    fn arguments(values: Vec<Value>) -> Result<sqlx::postgres::PgArguments> {
        sql::arguments::<Postgres>(values, |args, v| match v {
            Value::Ints(v) => sql::add::<Postgres, _>(args, v),
            Value::OptInts(v) => sql::add::<Postgres, _>(args, v),
            Value::I32s(v) => sql::add::<Postgres, _>(args, v),
            Value::Texts(v) => sql::add::<Postgres, _>(args, v),
            Value::OptTexts(v) => sql::add::<Postgres, _>(args, v),
            _ => Err(Error::Internal("a scalar was taken for an array".into())),
        })
    }
}

binder_queries!(Sql, Postgres, Pg, exec, sorted);

#[derive(Clone, Debug)]
pub(crate) struct Pg {
    /// Where statements go: one server, a pooler, or the writable one of several hosts.
    route: Arc<Route>,
    /// The pool's sessions commit without waiting for the WAL flush
    /// ([`crate::ConnectOptions::async_commit`]); enqueues, counters and admin changes then ask
    /// for a durable commit in their own transaction.
    async_commit: bool,
}

impl Pg {
    pub(crate) fn new(pool: PgPool) -> Pg {
        Pg::routed(Route::single(pool, false, None), false)
    }

    pub(crate) fn routed(route: Route, async_commit: bool) -> Pg {
        Pg {
            route: Arc::new(route),
            async_commit,
        }
    }

    /// An executor for one statement outside a transaction.
    pub(crate) fn exec(&self) -> route::Exec {
        self.route.exec()
    }

    /// An executor for statements inside a transaction of [`Pg::begin`].
    pub(crate) fn on<'c>(&'c self, conn: &'c mut sqlx::PgConnection) -> route::On<'c> {
        self.route.on(conn)
    }

    /// Starts a transaction.
    pub(crate) async fn begin(&self) -> Result<sqlx::Transaction<'static, Postgres>> {
        self.route.begin().await
    }

    /// Another server's writes reach this one only through failover, never while it writes.
    pub(crate) async fn applies_others_late(&self) -> Result<bool> {
        Ok(false)
    }

    /// A transaction for [`run::Transact`]: durable, or as the pool's sessions commit.
    pub(crate) async fn open_transaction(
        &self,
        durable: bool,
    ) -> Result<sqlx::Transaction<'static, Postgres>> {
        if durable {
            self.durable().await
        } else {
            self.begin().await
        }
    }

    /// A transaction whose commit waits for the WAL flush, whatever the session's setting.
    pub(crate) async fn durable(&self) -> Result<sqlx::Transaction<'static, Postgres>> {
        let mut tx = self.begin().await?;
        if self.async_commit {
            sqlx::query("SET LOCAL synchronous_commit = on")
                .execute(self.on(&mut tx))
                .await
                .map_err(error)?;
        }
        Ok(tx)
    }

    pub(crate) fn route(&self) -> &Route {
        &self.route
    }
}

pub(crate) fn ids(b: &mut B, list: &IdList) -> String {
    match list {
        IdList::Int(v) => b.bind(v.clone()),
        IdList::Text(v) => b.bind(v.clone()),
    }
}

/// A claimed row as JSON: the whole row of a user's table; for a source a layer above completes,
/// the columns it carries (`Mapping::carried`), cheaper to build and to read than the whole row,
/// those it carries as text (a job's payload) cast to text: read back as JSON the same way on
/// every database (as jsonb, a payload that is a JSON string such as "123" could not be told
/// from text to parse, and reached the handler as the number 123).
pub(crate) fn claimed_json(m: &Mapping) -> String {
    let Some(l) = &m.lifecycle else {
        return "to_jsonb(t)".to_owned();
    };
    let pairs: Vec<String> = l
        .carried
        .iter()
        .map(|c| match l.as_text.contains(c) {
            true => format!("'{c}', t.{}::text", Sql::quote(c)),
            false => format!("'{c}', t.{}", Sql::quote(c)),
        })
        .collect();
    format!("jsonb_build_object({})", pairs.join(", "))
}

/// [`claimed_json`] as plain columns, each under its name (read as [`Columns`]), those carried
/// as text cast to text: what a claim of the managed queue returns (its skip-locked claim adds
/// its extra values, `claim.rs`). A source no layer completes (never claimed this way) selects
/// every column of its mapping.
pub(crate) fn claimed_columns(m: &Mapping) -> String {
    let (columns, as_text) = match &m.lifecycle {
        Some(l) => (&l.carried, l.as_text.as_slice()),
        None => (&m.columns, &[][..]),
    };
    let cols: Vec<String> = columns
        .iter()
        .map(|c| {
            let q = Sql::quote(c);
            match as_text.contains(c) {
                true => format!("t.{q}::text AS {q}"),
                false => format!("t.{q}"),
            }
        })
        .collect();
    cols.join(", ")
}

/// The rows a statement returns as `jsonb` objects (one column).
pub(crate) async fn json_rows<R: Run<Sql = Sql> + ?Sized>(
    r: &R,
    s: Stmt<Sql>,
) -> Result<Vec<serde_json::Value>> {
    let rows: Vec<(sqlx::types::Json<serde_json::Value>,)> = r.fetch_all(s).await?;
    Ok(rows.into_iter().map(|(j,)| j.0).collect())
}

/// A row that came back as plain columns, read by their types into the JSON object a claimed
/// row carries, each under its column's name.
pub(crate) struct Columns(pub serde_json::Value);

impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for Columns {
    fn from_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Columns> {
        use serde_json::Value;
        use sqlx::{Column, Row, TypeInfo, ValueRef};
        let mut columns = Vec::with_capacity(r.len());
        for (i, column) in r.columns().iter().enumerate() {
            let raw = r.try_get_raw(i)?;
            let v = if raw.is_null() {
                Value::Null
            } else {
                match column.type_info().name() {
                    "INT8" => Value::from(r.try_get::<i64, _>(i)?),
                    "INT4" => Value::from(r.try_get::<i32, _>(i)?),
                    "INT2" => Value::from(r.try_get::<i16, _>(i)?),
                    "JSONB" | "JSON" => r.try_get::<sqlx::types::Json<Value>, _>(i)?.0,
                    "BOOL" => Value::from(r.try_get::<bool, _>(i)?),
                    _ => Value::from(r.try_get::<String, _>(i)?),
                }
            };
            columns.push((column.name().to_owned(), v));
        }
        // Made from all its entries at once, the object's map sorts them and builds its nodes
        // in one go; inserted one by one, each searched and split nodes (perf, tuned Worker:
        // reading the claimed rows 18 % of the worker's CPU before, 15 % after).
        Ok(Columns(Value::Object(columns.into_iter().collect())))
    }
}

impl sql::IntoRow for Columns {
    fn into_row(self) -> Result<serde_json::Value> {
        Ok(self.0)
    }
}

/// Casts a lease table's text `row_id` back to the id column's type.
fn row_id_as_id(m: &Mapping, expr: &str) -> String {
    match m.id_kind {
        Kind::Int => format!("{expr}::int8"),
        Kind::Text => expr.to_owned(),
    }
}

const CREATE_LEASES: &str = "CREATE TABLE IF NOT EXISTS rowclaim_leases (
    source text NOT NULL,
    row_id text NOT NULL,
    token text NOT NULL,
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (source, row_id))";

const CREATE_LEASES_TOKEN: &str =
    "CREATE INDEX IF NOT EXISTS rowclaim_leases_token ON rowclaim_leases (token)";

const CREATE_SOURCES: &str = "CREATE TABLE IF NOT EXISTS rowclaim_sources (
    source text PRIMARY KEY,
    mapping text NOT NULL,
    recorded_at bigint NOT NULL)";

const CREATE_COUNTERS: &str = "CREATE TABLE IF NOT EXISTS rowclaim_counters (
    name text PRIMARY KEY,
    value bigint NOT NULL)";

/// A row id from a row's JSON, as the lease table's text `row_id`.
fn json_key(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The condition "`token` holds the lease" on `rowclaim_leases`, for all its rows or the named
/// ones.
fn held_leases(b: &mut B, m: &Mapping, token: &str, target: &Target<'_>) -> String {
    let source = b.bind(m.source_key.clone());
    let tok = b.bind(token.to_owned());
    match target {
        Target::All => format!("source = {source} AND token = {tok}"),
        Target::Ids(list, _) => format!(
            "source = {source} AND token = {tok} AND row_id = ANY({}::text[])",
            text_ids(b, list)
        ),
    }
}

/// Ids as a text array, to match the lease table's `row_id`.
fn text_ids(b: &mut B, list: &IdList) -> String {
    match list {
        IdList::Int(v) => b.bind(v.iter().map(ToString::to_string).collect::<Vec<_>>()),
        IdList::Text(v) => b.bind(v.clone()),
    }
}

/// Sorts a PostgreSQL error by its SQLSTATE.
fn classify(e: &dyn sqlx::error::DatabaseError) -> Option<DbKind> {
    let pg = e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?;
    match pg.code() {
        "40001" | "40P01" => Some(DbKind::Transient),
        "55P03" => Some(DbKind::LockConflict),
        "42P01" => Some(DbKind::MissingTable),
        "42703" => Some(DbKind::MissingColumn),
        // 08xxx connection exceptions; 57P01 admin shutdown (also pg_terminate_backend), 57P02
        // crash shutdown, 57P03 cannot connect now, 57P05 idle-session timeout, 25P03
        // idle-in-transaction timeout.
        c if c.starts_with("08") => Some(DbKind::ConnectionGone),
        "57P01" | "57P02" | "57P03" | "57P05" | "25P03" => Some(DbKind::ConnectionGone),
        // read_only_sql_transaction: a standby, or the old primary after a failover.
        "25006" => Some(DbKind::ReadOnly),
        // insufficient_privilege.
        "42501" => Some(DbKind::PermissionDenied),
        _ => None,
    }
}

const POOLER_HINT: &str =
    "; is a transaction-mode pooler (PgBouncer) in between? add pgbouncer=true to the URL";

/// A PostgreSQL error with its SQLSTATE and detail, without the server's source positions.
fn describe(e: &dyn sqlx::error::DatabaseError) -> Option<String> {
    let pg = e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()?;
    let mut text = format!("{} (SQLSTATE {})", pg.message(), pg.code());
    if let Some(detail) = pg.detail() {
        text.push_str(&format!("; {detail}"));
    }
    match pg.code() {
        "25006" => text.push_str(
            "; this server takes no writes (a standby?): rowclaim needs the primary; to follow \
             failovers, list every host in the URL (postgres://u@h1:5432,h2:5432/db)",
        ),
        // A named statement met one of another client's (42P05), or a statement's second round
        // trip reached another server connection (26000): a transaction-mode pooler.
        "42P05" | "26000" => text.push_str(POOLER_HINT),
        // PgBouncer refuses the startup parameters it does not track when a client connects.
        _ if pg.message().starts_with("unsupported startup parameter") => {
            text.push_str(POOLER_HINT)
        }
        _ => {}
    }
    Some(text)
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
    /// An error of sqlx's PostgreSQL driver, sorted as rowclaim's PostgreSQL driver sorts its own:
    /// for code that talks to the database itself and asks what an error means
    /// ([`crate::Error::kind`] of `Error::Database` of it).
    pub fn postgres(e: sqlx::Error) -> crate::error::DatabaseError {
        sorted(e)
    }
}
