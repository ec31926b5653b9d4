//! MySQL 8 and MariaDB 10.6+: rowclaim's claim SQL for them (the managed queue's is in
//! `queue/mysql.rs`).
//!
//! Leases are `DATETIME(6)` holding UTC, computed from `UTC_TIMESTAMP(6)`; rows come back as
//! `CAST(JSON_OBJECT(…) AS CHAR)`; id lists are `IN (?, ?, …)`. Neither server has
//! `UPDATE … RETURNING`, so a claim marks rows and then reads them back (by token, or by id inside
//! the claiming transaction; on a Galera cluster always by token after the commit). Placeholders
//! are positional, so every statement binds its values in the order its text uses them.
//!
//! Where MySQL 8 and MariaDB differ (only `FOR SHARE` so far), the code branches on
//! [`ServerKind`], detected once per pool from `SELECT VERSION()` (and a Galera node from
//! `wsrep_on`, asked as [`crate::Capability::RowLocksSeenByAllWriters`]).
//!
//! Every transaction opened here runs at READ COMMITTED, as PostgreSQL's do: a locking read then
//! keeps locks on the rows it returns only, with no gap locks, so a claim held open (transaction
//! strategy, locking reads) does not block inserts or the claims and settles of other rows.

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
use crate::value::IdList;
use std::sync::Arc;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{MySql, MySqlPool, Row};
use tokio::sync::OnceCell;

type B = Binder<Sql>;

/// The open transaction of this driver's transaction strategy and locking reads.
type Tx = sqlx::Transaction<'static, MySql>;

/// The server's clock, in the UTC that lease columns hold.
pub(crate) const NOW: &str = "UTC_TIMESTAMP(6)";

/// MySQL's and MariaDB's SQL.
pub(crate) struct Sql;

impl Dialect for Sql {
    const SKIP_SCAN: bool = false;
    type DB = MySql;
    const NOW: &'static str = NOW;
    const EPOCH_SECONDS: &'static str = "UNIX_TIMESTAMP()";
    const TEXT: &'static str = "CHAR";
    const LEASE_COLUMN: ColType = ColType::Timestamp;
    const LEASE_TYPE: &'static str = "DATETIME(6) (holding UTC)";

    fn quote(ident: &str) -> String {
        format!("`{ident}`")
    }

    /// A UTC `DATETIME` as epoch milliseconds: calendar arithmetic from the epoch, so no
    /// session time zone is involved (unlike `UNIX_TIMESTAMP`).
    fn epoch_ms(expr: &str) -> String {
        format!(
            "CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', {expr}) DIV 1000 \
             AS SIGNED)"
        )
    }

    fn micros_of(expr: &str) -> String {
        format!(
            "CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', {expr}) AS SIGNED)"
        )
    }

    fn at_micros(b: &mut B, us: i64) -> String {
        format!(
            "TIMESTAMPADD(MICROSECOND, {}, TIMESTAMP '1970-01-01 00:00:00')",
            b.bind(us)
        )
    }

    /// A UTC `DATETIME(6)` by calendar arithmetic from the epoch: unlike `FROM_UNIXTIME`, no
    /// session time zone is involved.
    fn at_ms(ms: &str) -> String {
        format!("TIMESTAMPADD(MICROSECOND, {ms} * 1000, TIMESTAMP '1970-01-01 00:00:00')")
    }

    fn keep_existing(key: &str) -> String {
        format!("ON DUPLICATE KEY UPDATE {key} = {key}")
    }

    fn placeholder(_: usize) -> String {
        "?".to_owned()
    }

    fn later(b: &mut B, after: Duration) -> String {
        format!("{NOW} + INTERVAL {} MICROSECOND", b.bind(lease_us(after)))
    }

    fn id_in(b: &mut B, column: &str, list: &IdList) -> String {
        in_ids(b, column, list)
    }

    fn row_json(m: &Mapping) -> String {
        claimed_json(m)
    }

    type Claimed = sql::JsonText;

    fn appended(list: &str, entry: &[(&str, String)]) -> String {
        let fields: Vec<String> = entry.iter().map(|(k, v)| format!("'{k}', {v}")).collect();
        let had = format!("COALESCE({list}, JSON_ARRAY())");
        let kept = format!(
            "IF(JSON_LENGTH({had}) >= {}, JSON_REMOVE({had}, '$[0]'), {had})",
            sql::ATTEMPTS_KEPT
        );
        format!(
            "JSON_ARRAY_APPEND({kept}, '$', JSON_OBJECT({}))",
            fields.join(", ")
        )
    }

    fn arguments(values: Vec<Value>) -> Result<<MySql as sqlx::Database>::Arguments> {
        sql::arguments::<MySql>(values, |_, _| {
            Err(Error::Internal("MySQL has no array parameters".into()))
        })
    }
}

binder_queries!(Sql, MySql, My, sorted);

#[derive(Clone, Debug)]
pub(crate) struct My {
    pub(crate) pool: MySqlPool,
    /// The server, asked once and shared by the clones of this driver.
    server: Arc<OnceCell<ServerInfo>>,
}

impl My {
    pub(crate) fn new(pool: MySqlPool) -> My {
        My {
            pool,
            server: Arc::new(OnceCell::new()),
        }
    }
}

/// Starts every transaction of this driver (see the module docs). `SET TRANSACTION` without
/// `SESSION` applies to the next transaction only, so the pooled connection keeps its defaults.
pub(crate) const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// A lease in whole microseconds (at least 1), for `INTERVAL ? MICROSECOND`.
pub(crate) fn lease_us(lease: Duration) -> i64 {
    i64::try_from(lease.as_micros()).unwrap_or(i64::MAX).max(1)
}

/// A lease in whole seconds, rounded up (at least 1): the unit of `wait_timeout`.
pub(crate) fn lease_secs(lease: Duration) -> i64 {
    let secs = lease
        .as_secs()
        .saturating_add(u64::from(lease.subsec_nanos() > 0));
    i64::try_from(secs).unwrap_or(i64::MAX).max(1)
}

fn is_empty(list: &IdList) -> bool {
    match list {
        IdList::Int(v) => v.is_empty(),
        IdList::Text(v) => v.is_empty(),
    }
}

/// `expr IN (?, ?, …)` over the ids as the id column's type (`FALSE` for no ids: `IN ()` is not
/// SQL).
pub(crate) fn in_ids(b: &mut B, expr: &str, list: &IdList) -> String {
    if is_empty(list) {
        return "FALSE".to_owned();
    }
    format!("{expr} IN ({})", b.list(list))
}

/// `expr IN (?, ?, …)` over the ids as text, to match the lease table's `row_id`.
fn in_texts(b: &mut B, expr: &str, list: &IdList) -> String {
    let texts: Vec<String> = match list {
        IdList::Int(v) => v.iter().map(ToString::to_string).collect(),
        IdList::Text(v) => v.clone(),
    };
    if texts.is_empty() {
        return "FALSE".to_owned();
    }
    let marks: Vec<String> = texts.into_iter().map(|t| b.bind(t)).collect();
    format!("{expr} IN ({})", marks.join(", "))
}

/// A row as JSON text: `CAST(JSON_OBJECT('col', t.`col`, …) AS CHAR)`. The table must be aliased
/// `t`. Only plainly named columns are listed, so their names are safe as string literals.
pub(crate) fn row_json(m: &Mapping) -> String {
    json_of(&m.columns)
}

/// A claimed row as JSON text: the columns it carries (`Mapping::carried`).
fn claimed_json(m: &Mapping) -> String {
    json_of(m.carried())
}

pub(crate) fn json_of(columns: &[String]) -> String {
    let pairs: Vec<String> = columns
        .iter()
        .map(|c| format!("'{c}', t.{}", Sql::quote(c)))
        .collect();
    format!("CAST(JSON_OBJECT({}) AS CHAR)", pairs.join(", "))
}

pub(crate) fn parse_rows(texts: Vec<String>) -> Result<Vec<serde_json::Value>> {
    texts.iter().map(|t| sql::parse_row(t)).collect()
}

/// The id column as text, aliased so that an `ORDER BY` on the id column still sorts by the
/// column and not by its text.
fn id_text(m: &Mapping) -> String {
    format!("CAST(t.{} AS CHAR) AS rowclaim_id", m.id)
}

fn id_list(m: &Mapping, texts: &[String]) -> Result<IdList> {
    IdList::new(m.id_kind, &m.parse_ids(texts)?)
}

/// The lease table's condition "these leases belong to `token`" (all of them, or those of `ids`).
fn leases_of(m: &Mapping, b: &mut B, token: &str, target: &Target<'_>) -> String {
    let source = b.bind(m.source_key.clone());
    let tok = b.bind(token.to_owned());
    let only = match target {
        Target::All => String::new(),
        Target::Ids(list, _) => format!(" AND {}", in_texts(b, "row_id", list)),
    };
    format!("source = {source} AND token = {tok}{only}")
}

/// MySQL's error number, if `e` is a MySQL/MariaDB error.
pub(crate) fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// 1146: the table does not exist.
const NO_SUCH_TABLE: u16 = 1146;

const CREATE_LEASES: &str = "CREATE TABLE IF NOT EXISTS rowclaim_leases (
    source VARCHAR(255) NOT NULL,
    row_id VARCHAR(255) NOT NULL,
    token CHAR(36) NOT NULL,
    lease_until DATETIME(6) NOT NULL,
    PRIMARY KEY (source, row_id),
    KEY rowclaim_leases_token (token)
) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

const CREATE_SOURCES: &str = "CREATE TABLE IF NOT EXISTS rowclaim_sources (
    source VARCHAR(255) NOT NULL PRIMARY KEY,
    mapping TEXT NOT NULL,
    recorded_at BIGINT NOT NULL)";

const CREATE_COUNTERS: &str = "CREATE TABLE IF NOT EXISTS rowclaim_counters (
    name VARCHAR(255) NOT NULL PRIMARY KEY,
    value BIGINT NOT NULL
) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

impl My {
    pub(crate) async fn begin(&self) -> Result<sqlx::Transaction<'static, MySql>> {
        let pool = self.pool.clone();
        super::retry::begin_whole(async move { pool.begin_with(BEGIN).await })
            .await
            .map_err(error)
    }

    /// A transaction for [`run::Transact`] (every commit here is durable).
    pub(crate) async fn open_transaction(
        &self,
        _durable: bool,
    ) -> Result<sqlx::Transaction<'static, MySql>> {
        self.begin().await
    }

    /// Whether another node's committed writes may not be seen here yet: on a Galera node.
    pub(crate) async fn applies_others_late(&self) -> Result<bool> {
        self.verify_after_commit().await
    }

    /// Whether a claim transaction is to be trusted only by what reads back after its COMMIT.
    /// On a Galera cluster a row lock is seen by this node only: another node's claim of the same
    /// rows shows up when one of the two commits, and the other is rolled back, possibly after it
    /// read its rows back inside the transaction. (The token strategy and optimistic claims commit
    /// each statement on its own and read back afterwards anyway.)
    pub(crate) async fn verify_after_commit(&self) -> Result<bool> {
        let server = self.server().await?;
        Ok(!server.supports(crate::backend::Capability::RowLocksSeenByAllWriters))
    }

    /// The rows `token` marked in the table, as JSON, in the source's order.
    async fn rows_of_owner(&self, m: &Mapping, token: &str) -> Result<Vec<serde_json::Value>> {
        let Some(ow) = &m.owner else {
            return Ok(vec![]);
        };
        let Stmt { sql, binder } = rows_of_owner_sql(m, ow, token);
        parse_rows(
            binder
                .scalar(sql)?
                .fetch_all(&self.pool)
                .await
                .map_err(error)?,
        )
    }
}

/// The claimed rows `list` as JSON, in the source's order.
pub(super) fn rows_sql(m: &Mapping, list: &IdList) -> Stmt<Sql> {
    let mut b = B::new();
    let which = in_ids(&mut b, &format!("t.{}", m.id), list);
    let claimed = status_literal(&m.claimed);
    let sql = format!(
        "SELECT {} FROM {} AS t WHERE {which} AND t.{} = {claimed} ORDER BY {}",
        claimed_json(m),
        m.table,
        m.status,
        m.order_by
    );
    Stmt::new(sql, b)
}

/// The rows `token` marked in the table, as JSON, in the source's order.
pub(super) fn rows_of_owner_sql(m: &Mapping, owner: &str, token: &str) -> Stmt<Sql> {
    let mut b = B::new();
    let tok = b.bind(token.to_owned());
    let claimed = status_literal(&m.claimed);
    let sql = format!(
        "SELECT {} FROM {} AS t WHERE t.{owner} = {tok} AND t.{} = {claimed} ORDER BY {}",
        claimed_json(m),
        m.table,
        m.status,
        m.order_by
    );
    Stmt::new(sql, b)
}

/// Sorts a MySQL/MariaDB error by its number.
fn classify(e: &dyn sqlx::error::DatabaseError) -> Option<DbKind> {
    let my = e.try_downcast_ref::<MySqlDatabaseError>()?;
    match my.number() {
        // 1213 deadlock (also a Galera certification failure or brute-force abort: the whole
        // transaction is rolled back), 1205 lock wait timeout (MariaDB also answers NOWAIT with
        // it: a caller that asked for NOWAIT reads it as a conflict), 1047 a Galera node that is
        // not synced with its cluster for the moment ("WSREP has not yet prepared node"), 1317
        // a statement interrupted: on Galera a replicated DDL brute-force aborts the local
        // statement in its way (seen with three `init`s at once); otherwise a KILL QUERY, which
        // rolls the statement back as well, so running it again is as safe.
        1213 | 1205 | 1047 | 1317 => Some(DbKind::Transient),
        // MySQL's ER_LOCK_NOWAIT.
        3572 => Some(DbKind::LockConflict),
        NO_SUCH_TABLE => Some(DbKind::MissingTable),
        1054 => Some(DbKind::MissingColumn),
        // 1053 server shutdown, 1927 connection killed, 2006/2013 server gone or lost, 4031
        // disconnected for inactivity, 1040 too many connections.
        1040 | 1053 | 1927 | 2006 | 2013 | 4031 => Some(DbKind::ConnectionGone),
        // 1142 a table privilege, 1143 a column privilege, 1044 the database, 1227 a global one
        // (SUPER, …) missing.
        1142 | 1143 | 1044 | 1227 => Some(DbKind::PermissionDenied),
        _ => None,
    }
}

/// A MySQL/MariaDB error with its number.
fn describe(e: &dyn sqlx::error::DatabaseError) -> Option<String> {
    let my = e.try_downcast_ref::<MySqlDatabaseError>()?;
    Some(format!("{} (error {})", my.message(), my.number()))
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
    /// An error of sqlx's MySQL/MariaDB driver, sorted as rowclaim's MySQL/MariaDB driver sorts its own:
    /// for code that talks to the database itself and asks what an error means
    /// ([`crate::Error::kind`] of `Error::Database` of it).
    pub fn mysql(e: sqlx::Error) -> crate::error::DatabaseError {
        sorted(e)
    }
}
