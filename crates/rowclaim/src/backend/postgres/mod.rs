//! PostgreSQL: rowclaim's claim SQL for PostgreSQL (the managed queue's is in `queue/postgres.rs`).
//!
//! Leases are `timestamptz` computed from `now()`; rows come back as `to_jsonb(t)`; id lists are
//! bound as one array (`= ANY($n)`), so every statement's text is stable and prepared once.

mod catalog;
mod check;
mod claim;
pub(crate) mod route;
mod store;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use route::Route;

use super::run;
use super::sql::{self, binder_queries, Binder, Dialect, Value};
use super::{
    Catalog, ClaimArgs, ClaimStore, Claimed, Outcome, Position, Resolved, ServerInfo, ServerKind,
    Target,
};
use crate::error::DbKind;
use crate::mapping::{status_literal, ColType, Column, Mapping, TableName};
use crate::value::{IdList, Kind};
use crate::{Error, LockMode, LockWait, Result, RowId, Strategy};
use sqlx::{PgPool, Postgres, Row};

type B = Binder<Sql>;

/// The open transaction of this driver's transaction strategy and locking reads.
type Held = <Pg as ClaimStore>::Held;

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

    fn epoch_ms(expr: &str) -> String {
        format!("floor(extract(epoch FROM {expr}) * 1000)::int8")
    }

    /// Exact for whole milliseconds: a float8 holds them exactly, and `to_timestamp` keeps
    /// microseconds.
    fn at_ms(ms: &str) -> String {
        format!("to_timestamp({ms}::float8 / 1000)")
    }

    fn json(b: &mut B, text: String) -> String {
        format!("CAST({} AS jsonb)", b.bind(text))
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

binder_queries!(Sql, Postgres, Pg, exec);

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
                .await?;
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

/// A claimed row as JSON: the whole row of a user's table; for the managed queue the job's own
/// columns (`Mapping::claim_columns`), cheaper to build and to read than the whole row. A job's
/// payload comes as its JSON text, as MySQL and SQLite store it: read back as JSON the same way
/// on every database (as jsonb, a payload that is a JSON string such as "123" could not be
/// told from text to parse, and reached the handler as the number 123).
pub(crate) fn claimed_json(m: &Mapping) -> String {
    if m.queues.is_none() {
        return "to_jsonb(t)".to_owned();
    }
    let pairs: Vec<String> = m
        .claim_columns
        .iter()
        .map(|c| match c.as_str() {
            "payload" => format!("'{c}', t.{}::text", Sql::quote(c)),
            _ => format!("'{c}', t.{}", Sql::quote(c)),
        })
        .collect();
    format!("jsonb_build_object({})", pairs.join(", "))
}

/// Rows that came back as `jsonb` objects.
fn json_rows(rows: Vec<sqlx::types::Json<serde_json::Value>>) -> Vec<serde_json::Value> {
    rows.into_iter().map(|j| j.0).collect()
}

/// A managed job's row as claimed (its columns, then `rowclaim_priority` and
/// `rowclaim_run_at_us`), read into the JSON object a claimed row carries, and its place in the
/// queue's order.
fn job_row(m: &Mapping, r: &sqlx::postgres::PgRow) -> Result<(serde_json::Value, Position)> {
    use serde_json::Value;
    use sqlx::{Column, Row, TypeInfo, ValueRef};
    let mut obj = serde_json::Map::with_capacity(m.claim_columns.len());
    for (i, name) in m.claim_columns.iter().enumerate() {
        let raw = r.try_get_raw(i)?;
        let v = if raw.is_null() {
            Value::Null
        } else {
            match r.column(i).type_info().name() {
                "INT8" => Value::from(r.try_get::<i64, _>(i)?),
                "INT4" => Value::from(r.try_get::<i32, _>(i)?),
                "INT2" => Value::from(r.try_get::<i16, _>(i)?),
                "JSONB" | "JSON" => r.try_get::<sqlx::types::Json<Value>, _>(i)?.0,
                "BOOL" => Value::from(r.try_get::<bool, _>(i)?),
                _ => Value::from(r.try_get::<String, _>(i)?),
            }
        };
        obj.insert(name.clone(), v);
    }
    let n = m.claim_columns.len();
    let position = Position {
        priority: r.try_get::<i64, _>(n)?,
        run_at_us: r.try_get::<i64, _>(n + 1)?,
        id: obj
            .get(&m.id_name)
            .and_then(Value::as_i64)
            .ok_or_else(|| Error::InvalidInput(format!("claimed job has no id in {obj:?}")))?,
    };
    Ok((Value::Object(obj), position))
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

impl Pg {
    /// Runs a statement that changes rows; with several named rows it commits only if all of them
    /// changed (all or nothing). A transaction of three round trips costs the server less than
    /// one statement that locks the rows first and then changes them (a lock is a WAL record of
    /// its own).
    async fn change_all_or_nothing(&self, sql: String, b: B, target: &Target<'_>) -> Result<u64> {
        match target {
            Target::Ids(_, n) if *n > 1 => {
                let mut tx = self.begin().await?;
                let changed = b
                    .query(sql)?
                    .execute(self.on(&mut tx))
                    .await?
                    .rows_affected();
                if changed == *n as u64 {
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
                Ok(changed)
            }
            _ => Ok(b.query(sql)?.execute(self.exec()).await?.rows_affected()),
        }
    }
}

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
pub(crate) fn classify(e: &dyn sqlx::error::DatabaseError) -> Option<DbKind> {
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
        _ => None,
    }
}

const POOLER_HINT: &str =
    "; is a transaction-mode pooler (PgBouncer) in between? add pgbouncer=true to the URL";

/// A PostgreSQL error with its SQLSTATE and detail, without the server's source positions.
pub(crate) fn describe(e: &dyn sqlx::error::DatabaseError) -> Option<String> {
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
