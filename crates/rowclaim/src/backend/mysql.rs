//! MySQL 8 and MariaDB 10.6+: all of rowclaim's SQL for them.
//!
//! Leases are `DATETIME(6)` holding UTC, computed from `UTC_TIMESTAMP(6)`; rows come back as
//! `CAST(JSON_OBJECT(…) AS CHAR)`; id lists are `IN (?, ?, …)`. Neither server has
//! `UPDATE … RETURNING`, so a claim marks rows and then reads them back (by token, or by id inside
//! the claiming transaction). Placeholders are positional, so every statement binds its values in
//! the order its text uses them.
//!
//! Where MySQL 8 and MariaDB differ (only `FOR SHARE` so far), the code branches on
//! [`ServerKind`], detected once per pool from `SELECT VERSION()`.
//!
//! Every transaction opened here runs at READ COMMITTED, as PostgreSQL's do: a locking read then
//! keeps locks on the rows it returns only, with no gap locks, so a claim held open (transaction
//! strategy, locking reads) does not block inserts or the claims and settles of other rows.

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{MySql, MySqlPool, Row};
use tokio::sync::OnceCell;

use super::{
    Binder, ClaimArgs, Claimed, ColType, Column, Driver, Held, Outcome, ServerInfo, ServerKind,
    Target,
};
use crate::queue::{Admin, Enqueued, JobParts, NewJob, QueueStats};
use crate::source::status_literal;
use crate::source::{Mapping, TableName};
use crate::value::IdList;
use crate::{Error, LockMode, LockWait, Result, RowId, Stats, Strategy};

type B = Binder<MySql>;

#[derive(Clone, Debug)]
pub(crate) struct My {
    pool: MySqlPool,
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
const BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// A lease in whole microseconds (at least 1), for `INTERVAL ? MICROSECOND`.
fn lease_us(lease: Duration) -> i64 {
    i64::try_from(lease.as_micros()).unwrap_or(i64::MAX).max(1)
}

/// A lease in whole seconds, rounded up (at least 1): the unit of `wait_timeout`.
fn lease_secs(lease: Duration) -> i64 {
    let secs = lease
        .as_secs()
        .saturating_add(u64::from(lease.subsec_nanos() > 0));
    i64::try_from(secs).unwrap_or(i64::MAX).max(1)
}

/// `UTC_TIMESTAMP(6) + lease`, by the server's clock.
fn lease_until(b: &mut B, lease: Duration) -> String {
    format!(
        "UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND",
        b.bind(lease_us(lease))
    )
}

fn is_empty(list: &IdList) -> bool {
    match list {
        IdList::Int(v) => v.is_empty(),
        IdList::Text(v) => v.is_empty(),
    }
}

/// `expr IN (?, ?, …)` over the ids as the id column's type (`FALSE` for no ids: `IN ()` is not
/// SQL).
fn in_ids(b: &mut B, expr: &str, list: &IdList) -> String {
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
fn row_json(m: &Mapping) -> String {
    json_of(&m.columns)
}

/// A claimed row as JSON text: the whole row of a user's table, the job's own columns for the
/// managed queue (`Mapping::claim_columns`).
fn claimed_json(m: &Mapping) -> String {
    json_of(&m.claim_columns)
}

fn json_of(columns: &[String]) -> String {
    let pairs: Vec<String> = columns
        .iter()
        .map(|c| format!("'{c}', t.{}", super::Dialect::MySql.quote(c)))
        .collect();
    format!("CAST(JSON_OBJECT({}) AS CHAR)", pairs.join(", "))
}

fn parse_rows(texts: Vec<String>) -> Result<Vec<serde_json::Value>> {
    texts.iter().map(|t| super::parse_row(t)).collect()
}

/// The server's clock, in UTC.
const NOW: &str = "UTC_TIMESTAMP(6)";

/// Rows a claim may take (see [`super::claimable`]).
fn claimable(m: &Mapping, b: &mut B) -> String {
    super::claimable(m, b, NOW)
}

/// Up to `limit` rows a claim may take (see [`super::candidates`]).
fn candidates(m: &Mapping, b: &mut B, select: &str, limit: i64, expired: bool) -> String {
    super::candidates(m, b, NOW, select, limit, expired)
}

/// The SET list that marks rows claimed by `token` (see [`super::claim_set`]).
fn claim_set(m: &Mapping, b: &mut B, token: &str, lease: Duration) -> String {
    super::claim_set(m, b, token, lease, lease_until)
}

/// The condition "`token` holds this row" for strategies that mark rows in the table itself.
fn held_by(m: &Mapping, b: &mut B, token: &str, target: &Target<'_>) -> Result<String> {
    super::held_by(m, b, token, target, in_ids)
}

/// The id column as text, aliased so that an `ORDER BY` on the id column still sorts by the
/// column and not by its text.
fn id_text(m: &Mapping) -> String {
    format!("CAST(t.{} AS CHAR) AS rowclaim_id", m.id)
}

fn parse_ids(m: &Mapping, texts: &[String]) -> Result<Vec<RowId>> {
    texts.iter().map(|t| m.id_kind.parse(t, "row id")).collect()
}

/// The ids of a list, as row ids.
fn list_ids(list: &IdList) -> Vec<RowId> {
    match list {
        IdList::Int(v) => v.iter().map(|i| RowId::Int(*i)).collect(),
        IdList::Text(v) => v.iter().map(|t| RowId::Text(t.clone())).collect(),
    }
}

fn id_list(m: &Mapping, texts: &[String]) -> Result<IdList> {
    IdList::new(m.id_kind, &parse_ids(m, texts)?)
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

fn other_database() -> Error {
    Error::InvalidInput("transaction of another database".into())
}

/// MySQL's error number, if `e` is a MySQL/MariaDB error.
fn error_number(e: &sqlx::Error) -> Option<u16> {
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
const CREATE_COUNTERS: &str = "CREATE TABLE IF NOT EXISTS rowclaim_counters (
    name VARCHAR(255) NOT NULL PRIMARY KEY,
    value BIGINT NOT NULL
) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

impl My {
    async fn begin(&self) -> Result<sqlx::Transaction<'static, MySql>> {
        Ok(self.pool.begin_with(BEGIN).await?)
    }

    /// Runs a statement that changes rows; with several named rows it commits only if all of them
    /// changed (all or nothing). The count is of rows matched: sqlx connects with
    /// `CLIENT_FOUND_ROWS`.
    async fn change_all_or_nothing(&self, sql: String, b: B, target: &Target<'_>) -> Result<u64> {
        match target {
            Target::Ids(_, n) if *n > 1 => {
                let mut tx = self.begin().await?;
                let changed = b.query(sql)?.execute(&mut *tx).await?.rows_affected();
                if changed == *n as u64 {
                    tx.commit().await?;
                } else {
                    tx.rollback().await?;
                }
                Ok(changed)
            }
            _ => Ok(b.query(sql)?.execute(&self.pool).await?.rows_affected()),
        }
    }

    async fn claimable_exists(&self, m: &Mapping) -> Result<bool> {
        let mut b = B::new();
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM ({}) AS c)",
            candidates(m, &mut b, "1 AS one", 1, true)
        );
        Ok(b.scalar::<bool>(sql)?.fetch_one(&self.pool).await?)
    }

    /// The rows `token` marked in the table, as JSON, in the source's order.
    async fn rows_of_owner(&self, m: &Mapping, token: &str) -> Result<Vec<serde_json::Value>> {
        let Some(ow) = &m.owner else {
            return Ok(vec![]);
        };
        let mut b = B::new();
        let tok = b.bind(token.to_owned());
        let claimed = status_literal(&m.claimed);
        let sql = format!(
            "SELECT {} FROM {} AS t WHERE t.{ow} = {tok} AND t.{} = {claimed} ORDER BY {}",
            claimed_json(m),
            m.table,
            m.status,
            m.order_by
        );
        parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)
    }
}

/// The claimed rows `list` as JSON, in the source's order.
fn rows_sql(m: &Mapping, b: &mut B, list: &IdList) -> String {
    let which = in_ids(b, &format!("t.{}", m.id), list);
    let claimed = status_literal(&m.claimed);
    format!(
        "SELECT {} FROM {} AS t WHERE {which} AND t.{} = {claimed} ORDER BY {}",
        claimed_json(m),
        m.table,
        m.status,
        m.order_by
    )
}

fn nothing() -> Claimed {
    Claimed {
        rows: vec![],
        held: None,
        position: None,
        lost_race: false,
    }
}

impl Driver for My {
    async fn server(&self) -> Result<ServerInfo> {
        let info = self
            .server
            .get_or_try_init(|| async {
                let v: String = sqlx::query_scalar("SELECT CAST(VERSION() AS CHAR)")
                    .fetch_one(&self.pool)
                    .await?;
                // `10.11.6-MariaDB-0+deb12u1` or `8.0.36`.
                let kind = if v.contains("MariaDB") {
                    ServerKind::MariaDb
                } else {
                    ServerKind::MySql
                };
                Ok::<_, Error>(ServerInfo::new(kind, &v))
            })
            .await?;
        Ok(info.clone())
    }

    async fn columns(&self, table: &TableName) -> Result<Vec<Column>> {
        // MariaDB returns some information_schema columns as binary strings: cast them to text.
        let rows = sqlx::query(
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR), CAST(DATA_TYPE AS CHAR),
                    CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED)
             FROM information_schema.COLUMNS
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?
             ORDER BY ORDINAL_POSITION",
        )
        .bind(table.schema.clone())
        .bind(table.name.clone())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let data_type: String = r.try_get(2)?;
                let len: Option<i64> = r.try_get(3)?;
                let ty = match data_type.to_ascii_lowercase().as_str() {
                    "tinyint" | "smallint" | "mediumint" | "int" | "bigint" => ColType::Int,
                    "char" | "varchar" | "text" | "tinytext" | "mediumtext" | "longtext" => {
                        ColType::Text {
                            max_len: len.and_then(|l| u32::try_from(l).ok()),
                        }
                    }
                    "datetime" | "timestamp" => ColType::Timestamp,
                    _ => ColType::Other,
                };
                Ok(Column {
                    name: r.try_get(0)?,
                    sql_type: r.try_get(1)?,
                    ty,
                })
            })
            .collect()
    }

    async fn table_key(&self, table: &TableName) -> Result<String> {
        let key: Option<String> = sqlx::query_scalar(
            "SELECT CAST(CONCAT(TABLE_SCHEMA, '.', TABLE_NAME) AS CHAR) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
        )
        .bind(table.schema.clone())
        .bind(table.name.clone())
        .fetch_optional(&self.pool)
        .await?;
        key.ok_or_else(|| Error::MissingTable {
            table: table.display.clone(),
        })
    }

    async fn ensure_lease_table(&self) -> Result<()> {
        if let Err(e) = sqlx::query(CREATE_LEASES).execute(&self.pool).await {
            // Two processes creating it at once: one of them may fail, and the table is there
            // all the same.
            let exists: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'rowclaim_leases'",
            )
            .fetch_one(&self.pool)
            .await?;
            if exists == 0 {
                return Err(e.into());
            }
        }
        Ok(())
    }

    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed> {
        let (m, t, id, order, filter) = (a.m, &a.m.table, &a.m.id, &a.m.order_by, &a.m.filter);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        match a.strategy {
            // One transaction: lock the first unlocked candidates, mark them ours, read them back.
            // Expired leases first, then ready rows, each arm its own locking read so each walks
            // its own index; the arms may lock up to twice the batch for the moment of this
            // transaction when leases have expired.
            Strategy::SkipLocked => {
                let arm = |b: &mut B, cond: String| {
                    format!(
                        "(SELECT {} FROM {t} AS t WHERE {cond}{filter} ORDER BY {order} \
                         LIMIT {} FOR UPDATE SKIP LOCKED)",
                        id_text(m),
                        b.bind(batch)
                    )
                };
                let sql = match a
                    .expired
                    .then(|| super::expired_arm(m, &mut b, NOW))
                    .flatten()
                {
                    Some(expired) => {
                        let e = arm(&mut b, expired);
                        let ready = super::ready_arm(m, &mut b, NOW);
                        let r = arm(&mut b, ready);
                        format!("{e} UNION ALL {r} LIMIT {}", b.bind(batch))
                    }
                    None => {
                        let ready = super::ready_arm(m, &mut b, NOW);
                        arm(&mut b, ready)
                    }
                };
                let mut tx = self.begin().await?;
                let found: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
                if found.is_empty() {
                    tx.rollback().await?;
                    return Ok(nothing());
                }
                let list = id_list(m, &found)?;
                let mut b = B::new();
                let set = claim_set(m, &mut b, a.token, a.lease);
                let which = in_ids(&mut b, id, &list);
                let sql = format!("UPDATE {t} SET {set} WHERE {which}");
                b.query(sql)?.execute(&mut *tx).await?;
                let mut b = B::new();
                let sql = rows_sql(m, &mut b, &list);
                let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
                tx.commit().await?;
                Ok(Claimed {
                    rows,
                    held: None,
                    position: None,
                    lost_race: false,
                })
            }
            // Mark the first candidates with the token (the candidates come from a derived table,
            // which MySQL materialises, so the UPDATE may name its own table there), then read the
            // rows that carry it. The condition is checked again after
            // waiting for another claimer's row lock, so a row is never taken twice; a claimer
            // that lost every row to others gets none and tries again.
            Strategy::Token => {
                let set = claim_set(m, &mut b, a.token, a.lease);
                let pick = candidates(m, &mut b, id, batch, a.expired);
                let cond = claimable(m, &mut b);
                let sql = format!(
                    "UPDATE {t} SET {set} WHERE {id} IN (SELECT {id} FROM ({pick}) AS c) \
                     AND {cond}{filter}"
                );
                let changed = b.query(sql)?.execute(&self.pool).await?.rows_affected();
                if changed == 0 {
                    return Ok(Claimed {
                        rows: vec![],
                        held: None,
                        position: None,
                        lost_race: self.claimable_exists(m).await?,
                    });
                }
                Ok(Claimed {
                    rows: self.rows_of_owner(m, a.token).await?,
                    held: None,
                    position: None,
                    lost_race: false,
                })
            }
            // Read candidates without locks; the update wins only the rows still claimable.
            Strategy::Optimistic => {
                let pick = candidates(
                    m,
                    &mut b,
                    &format!("CAST({id} AS CHAR) AS rowclaim_id"),
                    batch,
                    a.expired,
                );
                let sql = format!("SELECT rowclaim_id FROM ({pick}) AS c");
                let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
                if found.is_empty() {
                    return Ok(nothing());
                }
                let rows = if m.owner.is_some() {
                    // One statement for all candidates; the token tells which it won.
                    let list = id_list(m, &found)?;
                    let mut b = B::new();
                    let set = claim_set(m, &mut b, a.token, a.lease);
                    let which = in_ids(&mut b, id, &list);
                    let cond = claimable(m, &mut b);
                    let sql = format!("UPDATE {t} SET {set} WHERE {which} AND {cond}{filter}");
                    b.query(sql)?.execute(&self.pool).await?;
                    self.rows_of_owner(m, a.token).await?
                } else {
                    // Without an owner column only the affected-row count tells who won: one
                    // statement per candidate.
                    let mut won = Vec::new();
                    for row in parse_ids(m, &found)? {
                        let mut b = B::new();
                        let set = claim_set(m, &mut b, a.token, a.lease);
                        let key = b.value(&row);
                        let cond = claimable(m, &mut b);
                        let sql =
                            format!("UPDATE {t} SET {set} WHERE {id} = {key} AND {cond}{filter}");
                        if b.query(sql)?.execute(&self.pool).await?.rows_affected() == 1 {
                            won.push(row);
                        }
                    }
                    if won.is_empty() {
                        vec![]
                    } else {
                        let list = IdList::new(m.id_kind, &won)?;
                        let mut b = B::new();
                        let sql = rows_sql(m, &mut b, &list);
                        parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)?
                    }
                };
                Ok(Claimed {
                    lost_race: rows.is_empty(),
                    rows,
                    held: None,
                    position: None,
                })
            }
            // Candidates are rows without a live lease; inserting the lease key is the claim (an
            // expired lease is taken over in the same statement), then the rows are marked, all in
            // one transaction.
            Strategy::LeaseTable => {
                let st = &m.status;
                let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
                let source = b.bind(m.source_key.clone());
                let limit = b.bind(batch);
                let sql = format!(
                    "SELECT {} FROM {t} AS t WHERE ({st} = {ready} OR {st} = {claimed}){filter} \
                     AND NOT EXISTS (SELECT 1 FROM rowclaim_leases l WHERE l.source = {source} \
                     AND l.row_id = CAST(t.{id} AS CHAR) AND l.lease_until >= UTC_TIMESTAMP(6)) \
                     ORDER BY {order} LIMIT {limit}",
                    id_text(m)
                );
                let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
                if found.is_empty() {
                    return Ok(nothing());
                }
                // On a duplicate key the assignments run left to right, so the second one sees
                // the token the first one wrote: an expired lease changes hands, a live one stays.
                // (`VALUES(col)` is deprecated from MySQL 8.0.20 in favour of a row alias, which
                // MariaDB lacks; both still accept it.)
                let mut b = B::new();
                let mut values = Vec::with_capacity(found.len());
                for key in &found {
                    let source = b.bind(m.source_key.clone());
                    let key = b.bind(key.clone());
                    let token = b.bind(a.token.to_owned());
                    let until = lease_until(&mut b, a.lease);
                    values.push(format!("({source}, {key}, {token}, {until})"));
                }
                let sql = format!(
                    "INSERT INTO rowclaim_leases (source, row_id, token, lease_until) VALUES {} \
                     ON DUPLICATE KEY UPDATE \
                     token = IF(lease_until < UTC_TIMESTAMP(6), VALUES(token), token), \
                     lease_until = IF(token = VALUES(token), VALUES(lease_until), lease_until)",
                    values.join(", ")
                );
                let mut tx = self.begin().await?;
                b.query(sql)?.execute(&mut *tx).await?;
                let mut b = B::new();
                let source = b.bind(m.source_key.clone());
                let token = b.bind(a.token.to_owned());
                let sql = format!(
                    "SELECT row_id FROM rowclaim_leases WHERE source = {source} AND token = {token}"
                );
                let won: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
                if won.is_empty() {
                    tx.rollback().await?;
                    return Ok(Claimed {
                        rows: vec![],
                        held: None,
                        position: None,
                        lost_race: true,
                    });
                }
                let list = id_list(m, &won)?;
                // A lease won for a row that was finished meanwhile stays until it expires; it
                // blocks nothing, since only ready and claimed rows are candidates.
                let mut b = B::new();
                let set = claim_set(m, &mut b, a.token, a.lease);
                let which = in_ids(&mut b, id, &list);
                let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
                let sql = format!(
                    "UPDATE {t} SET {set} WHERE {which} AND ({st} = {ready} OR {st} = {claimed})"
                );
                b.query(sql)?.execute(&mut *tx).await?;
                let mut b = B::new();
                let sql = rows_sql(m, &mut b, &list);
                let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
                tx.commit().await?;
                Ok(Claimed {
                    lost_race: rows.is_empty(),
                    rows,
                    held: None,
                    position: None,
                })
            }
            // Lock the rows in a transaction that stays open; the session's idle timeout
            // (`wait_timeout`, whole seconds) is the lease: past it the server closes the
            // connection, the transaction rolls back and the rows are free again.
            Strategy::Transaction => {
                let ready = status_literal(&m.ready);
                let limit = b.bind(batch);
                let sql = format!(
                    "SELECT {} FROM {t} AS t WHERE {} = {ready}{filter} \
                     ORDER BY {order} LIMIT {limit} FOR UPDATE SKIP LOCKED",
                    claimed_json(m),
                    m.status
                );
                let mut tx = self.begin().await?;
                let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
                if rows.is_empty() {
                    tx.rollback().await?;
                    return Ok(nothing());
                }
                // The lease starts now. `@rowclaim_open` counts the rows still to settle, so that
                // the last settle gives the pooled connection its usual timeout back.
                sqlx::query("SET SESSION wait_timeout = ?, @rowclaim_open = ?")
                    .bind(lease_secs(a.lease))
                    .bind(rows.len() as i64)
                    .execute(&mut *tx)
                    .await?;
                Ok(Claimed {
                    rows,
                    held: Some(Held::MySql(tx)),
                    position: None,
                    lost_race: false,
                })
            }
            Strategy::Auto => Err(Error::InvalidInput("strategy auto was not resolved".into())),
        }
    }

    async fn settle(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        outcome: Outcome,
    ) -> Result<u64> {
        let t = &m.table;
        if strategy != Strategy::LeaseTable {
            let mut b = B::new();
            let set = (!outcome.deletes(m))
                .then(|| super::outcome_set(m, &mut b, &outcome, NOW, lease_until));
            let cond = held_by(m, &mut b, token, &target)?;
            let sql = super::change_sql(m, set.as_deref(), &cond);
            return self.change_all_or_nothing(sql, b, &target).await;
        }
        // Lock and delete the token's leases, then settle their rows. (MariaDB could do the first
        // two in one `DELETE … RETURNING`; MySQL 8 cannot, so both servers take two statements.)
        let mut tx = self.begin().await?;
        let mut b = B::new();
        let mine = leases_of(m, &mut b, token, &target);
        let sql = format!("SELECT row_id FROM rowclaim_leases WHERE {mine} FOR UPDATE");
        let gone: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
        if gone.is_empty() {
            tx.rollback().await?;
            return Ok(0);
        }
        let mut b = B::new();
        let mine = leases_of(m, &mut b, token, &target);
        b.query(format!("DELETE FROM rowclaim_leases WHERE {mine}"))?
            .execute(&mut *tx)
            .await?;
        let list = id_list(m, &gone)?;
        let mut b = B::new();
        let set = super::outcome_set(m, &mut b, &outcome, "UTC_TIMESTAMP(6)", lease_until);
        let which = in_ids(&mut b, &m.id, &list);
        let claimed = status_literal(&m.claimed);
        let sql = format!(
            "UPDATE {t} SET {set} WHERE {which} AND {} = {claimed}",
            m.status
        );
        let changed = b.query(sql)?.execute(&mut *tx).await?.rows_affected();
        match target {
            Target::Ids(_, n) if changed != n as u64 => tx.rollback().await?,
            _ => tx.commit().await?,
        }
        Ok(changed)
    }

    /// MySQL has no `UPDATE … RETURNING`. A completed or failed row keeps its owner, so one
    /// `UPDATE` suffices when it matched every named row (the common case), and a short count is
    /// followed by a read of which rows now carry the token in their new state. A row given back
    /// (owner cleared) or deleted leaves no such trace: for those the caller settles all or
    /// nothing and narrows down.
    async fn settle_each(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<RowId>>> {
        let keeps_owner = matches!(outcome, Outcome::Done | Outcome::Failed(_));
        let Some(owner) = m.owner.as_ref() else {
            return Ok(None);
        };
        if strategy == Strategy::LeaseTable || !keeps_owner || outcome.deletes(m) {
            return Ok(None);
        }
        let n = list.len();
        let mut b = B::new();
        let set = super::outcome_set(m, &mut b, &outcome, NOW, lease_until);
        let cond = held_by(m, &mut b, token, &Target::Ids(list, n))?;
        let sql = super::change_sql(m, Some(&set), &cond);
        let changed = b.query(sql)?.execute(&self.pool).await?.rows_affected();
        if changed == n as u64 {
            return Ok(Some(list_ids(list)));
        }
        let mut b = B::new();
        let which = in_ids(&mut b, &m.id, list);
        let sql = format!(
            "SELECT CAST({} AS CHAR) FROM {} WHERE {which} AND {owner} = {} AND {} = {}",
            m.id,
            m.table,
            b.bind(token.to_owned()),
            m.status,
            status_literal(outcome.status(m))
        );
        let ours: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
        Ok(Some(parse_ids(m, &ours)?))
    }

    async fn extend(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        lease: Duration,
    ) -> Result<u64> {
        let mut b = B::new();
        let sql = if strategy == Strategy::LeaseTable {
            let until = lease_until(&mut b, lease);
            let mine = leases_of(m, &mut b, token, &target);
            format!("UPDATE rowclaim_leases SET lease_until = {until} WHERE {mine}")
        } else {
            let Some(le) = &m.lease else {
                return Err(Error::Unsupported(format!(
                    "{} has no lease column mapped, so its claims cannot be extended",
                    m.table_display
                )));
            };
            let until = lease_until(&mut b, lease);
            let cond = held_by(m, &mut b, token, &target)?;
            format!("UPDATE {} SET {le} = {until} WHERE {cond}", m.table)
        };
        self.change_all_or_nothing(sql, b, &target).await
    }

    async fn still_held(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
    ) -> Result<Vec<RowId>> {
        let mut b = B::new();
        let target = Target::Ids(list, 0);
        let sql = if strategy == Strategy::LeaseTable {
            let mine = leases_of(m, &mut b, token, &target);
            format!("SELECT row_id FROM rowclaim_leases WHERE {mine}")
        } else {
            let cond = held_by(m, &mut b, token, &target)?;
            format!("SELECT {} FROM {} AS t WHERE {cond}", id_text(m), m.table)
        };
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
        parse_ids(m, &found)
    }

    async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<()> {
        let Held::MySql(tx) = held else {
            return Err(other_database());
        };
        if !matches!(outcome, Outcome::Ready) {
            // A released row is still ready in the table; its lock goes at commit.
            let mut b = B::new();
            let st = status_literal(outcome.status(m));
            let which = in_ids(&mut b, &m.id, list);
            let sql = format!("UPDATE {} SET {} = {st} WHERE {which}", m.table, m.status);
            b.query(sql)?.execute(&mut **tx).await?;
        }
        // After the last row the facade commits and the connection goes back to the pool: give
        // it the server's idle timeout again. Both expressions read the variables' old values
        // (whichever order the server evaluates them in), so this is one round trip.
        let n = match list {
            IdList::Int(v) => v.len(),
            IdList::Text(v) => v.len(),
        } as i64;
        sqlx::query(
            "SET SESSION wait_timeout = IF(@rowclaim_open <= ?, @@GLOBAL.wait_timeout, \
             @@SESSION.wait_timeout), @rowclaim_open = @rowclaim_open - ?",
        )
        .bind(n)
        .bind(n)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        let Held::MySql(tx) = held else {
            return Err(other_database());
        };
        sqlx::query("SET SESSION wait_timeout = ?")
            .bind(lease_secs(lease))
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn lock_rows(
        &self,
        m: &Mapping,
        list: Option<&IdList>,
        limit: Option<u32>,
        mode: LockMode,
        wait: LockWait,
    ) -> Result<(Held, Vec<serde_json::Value>)> {
        let kind = self.server().await?.kind;
        let mut b = B::new();
        let which = match list {
            Some(l) => in_ids(&mut b, &format!("t.{}", m.id), l),
            None => "TRUE".to_owned(),
        };
        let limit = limit
            .map(|n| format!(" LIMIT {}", b.bind(i64::from(n))))
            .unwrap_or_default();
        let lock = match (mode, kind) {
            (LockMode::Update, _) => "FOR UPDATE",
            // MariaDB has no FOR SHARE; MySQL 8 has both and takes NOWAIT / SKIP LOCKED after
            // either, MariaDB after LOCK IN SHARE MODE.
            (LockMode::Share, ServerKind::MariaDb) => "LOCK IN SHARE MODE",
            (LockMode::Share, _) => "FOR SHARE",
        };
        let wait = match wait {
            LockWait::Wait => "",
            LockWait::NoWait => " NOWAIT",
            LockWait::SkipLocked => " SKIP LOCKED",
        };
        let sql = format!(
            "SELECT {} FROM {} AS t WHERE {which}{} ORDER BY {}{limit} {lock}{wait}",
            row_json(m),
            m.table,
            m.filter,
            m.order_by
        );
        let mut tx = self.begin().await?;
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
        Ok((Held::MySql(tx), rows))
    }

    async fn counter_next(&self, name: &str) -> Result<i64> {
        // `LAST_INSERT_ID(expr)` makes the statement report the new value as its insert id, for
        // a new counter and an existing one alike: no second round trip to read it.
        let next = || {
            sqlx::query(
                "INSERT INTO rowclaim_counters (name, value) VALUES (?, LAST_INSERT_ID(1)) \
                 ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1)",
            )
            .bind(name.to_owned())
        };
        let done = match next().execute(&self.pool).await {
            Err(e) if error_number(&e) == Some(NO_SUCH_TABLE) => {
                if let Err(e) = sqlx::query(CREATE_COUNTERS).execute(&self.pool).await {
                    tracing::debug!(error = %e, "creating rowclaim_counters raced");
                }
                next().execute(&self.pool).await?
            }
            other => other?,
        };
        i64::try_from(done.last_insert_id())
            .map_err(|_| Error::InvalidInput(format!("counter {name} is out of range")))
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<Stats> {
        let q = super::stats_queries::<MySql>(m, strategy, "UTC_TIMESTAMP(6)", "CHAR");
        let (sql, b) = q.by_status;
        let by_status = b.query_as(sql)?.fetch_all(&self.pool).await?;
        let (sql, b) = q.by_owner;
        let by_owner = b.query_as(sql)?.fetch_all(&self.pool).await?;
        let expired = match q.expired {
            Some((sql, b)) => b.scalar(sql)?.fetch_one(&self.pool).await?,
            None => 0,
        };
        Ok(super::stats_from(by_status, by_owner, expired))
    }

    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64)> {
        let mut counts = [0u64; 2];
        for (claimed, n) in [false, true].into_iter().zip(counts.iter_mut()) {
            let mut b = B::new();
            let sql = super::backlog_sql(m, claimed, &mut b, "UTC_TIMESTAMP(6)");
            let c: i64 = b.scalar(sql)?.fetch_one(&self.pool).await?;
            *n = c as u64;
        }
        Ok((counts[0], counts[1]))
    }

    async fn list_rows(
        &self,
        m: &Mapping,
        id: Option<i64>,
        status: Option<&str>,
        limit: u32,
    ) -> Result<Vec<serde_json::Value>> {
        let mut b = B::new();
        let sql = super::list_sql(m, &mut b, &row_json(m), id, status, limit);
        parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)
    }

    async fn queue_init(&self) -> Result<()> {
        // A named lock belongs to a session, so the lock, the migrations and the release all run
        // on this one connection. Should this future be dropped halfway, or the release fail, the
        // connection is closed instead of going back to the pool still holding the lock: the
        // server frees a session's locks when it ends. (Init is rare; the reconnect is cheap.)
        let mut conn = self.pool.acquire().await?;
        conn.close_on_drop();
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(INIT_LOCK)
            .bind(INIT_LOCK_WAIT_SECS)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            // 0: another process held it for the whole wait; NULL: the server refused.
            return Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "could not take the lock {INIT_LOCK} within {INIT_LOCK_WAIT_SECS} s: \
                     another `rowclaim init` is still running"
                ),
            ))));
        }
        let migrated = migrate(&mut conn).await;
        if let Err(e) = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(INIT_LOCK)
            .execute(&mut *conn)
            .await
        {
            // Closing the connection (on drop, above) releases it all the same.
            tracing::debug!(error = %e, "releasing {INIT_LOCK} failed");
        }
        migrated
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(vec![]);
        }
        let parts: Vec<JobParts<'_>> = jobs.iter().map(NewJob::parts).collect();
        for p in &parts {
            check_times(p)?;
        }
        let mut tx = self.begin().await?;
        let mut out = Vec::with_capacity(parts.len());
        // Jobs without a unique key go in multi-row INSERTs; a job with one goes alone, in its
        // place, so that ids follow the order the jobs were given in (the id breaks ties in the
        // claim order).
        let mut run: Vec<&JobParts<'_>> = Vec::new();
        let mut run_bytes = 0;
        let mut step = None;
        for p in &parts {
            if p.unique_key.is_some() {
                insert_run(&mut tx, &mut run, &mut step, &mut out).await?;
                run_bytes = 0;
                out.push(enqueue_one(&mut tx, p).await?);
                continue;
            }
            if run.len() == BULK_ROWS
                || (!run.is_empty() && run_bytes + p.payload.len() > BULK_BYTES)
            {
                insert_run(&mut tx, &mut run, &mut step, &mut out).await?;
                run_bytes = 0;
            }
            run_bytes += p.payload.len();
            run.push(p);
        }
        insert_run(&mut tx, &mut run, &mut step, &mut out).await?;
        super::commit(tx, || super::enqueue_what(parts.len())).await?;
        Ok(out)
    }

    async fn queue_admin(&self, op: Admin) -> Result<u64> {
        let done = match op {
            // A running job's claimer is fenced out: its token no longer owns the row.
            Admin::Cancel(id) => {
                sqlx::query(
                    "UPDATE rowclaim_jobs SET status = 'cancelled', owner = NULL, \
                     lease_until = NULL, finished_at = UTC_TIMESTAMP(6) \
                     WHERE id = ? AND status IN ('ready', 'running')",
                )
                .bind(id)
                .execute(&self.pool)
                .await
            }
            Admin::Retry(id) => {
                let retried = sqlx::query(
                    "UPDATE rowclaim_jobs SET status = 'ready', attempts = 0, \
                     run_at = UTC_TIMESTAMP(6), owner = NULL, lease_until = NULL, finished_at = NULL \
                     WHERE id = ? AND status IN ('dead', 'cancelled')",
                )
                .bind(id)
                .execute(&self.pool)
                .await;
                // Ready again, the job's unique key counts as pending: it collides when another
                // job with that key was enqueued meanwhile and is pending still.
                if let Err(e) = &retried {
                    if error_number(e) == Some(DUPLICATE_KEY) {
                        return Err(Error::InvalidInput(format!(
                            "job {id} cannot run again while another job with its unique key \
                             is ready or running"
                        )));
                    }
                }
                retried
            }
            Admin::Prune(age) => {
                sqlx::query(
                    "DELETE FROM rowclaim_jobs WHERE status IN ('completed', 'dead', 'cancelled') \
                     AND finished_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND",
                )
                .bind(lease_us(age).min(MAX_SPAN_US))
                .execute(&self.pool)
                .await
            }
        };
        Ok(done?.rows_affected())
    }

    async fn queue_stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        let mut stats = QueueStats::default();
        let only = |b: &mut B| match queue {
            Some(q) => format!(" AND queue = {}", b.bind(q.to_owned())),
            None => String::new(),
        };

        let mut b = B::new();
        let sql = format!(
            "SELECT CAST(queue AS CHAR), CAST(status AS CHAR), COUNT(*) FROM rowclaim_jobs \
             WHERE TRUE{} GROUP BY queue, status",
            only(&mut b)
        );
        for r in b.query(sql)?.fetch_all(&self.pool).await? {
            let (q, status, n): (String, String, i64) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            stats
                .by_queue
                .entry(q)
                .or_default()
                .insert(status, n as u64);
        }

        // Microseconds, so that a wait under a second is not rounded away.
        let mut b = B::new();
        let sql = format!(
            "SELECT CAST(queue AS CHAR), TIMESTAMPDIFF(MICROSECOND, MIN(run_at), UTC_TIMESTAMP(6)) \
             FROM rowclaim_jobs WHERE status = 'ready' AND run_at <= UTC_TIMESTAMP(6){} \
             GROUP BY queue",
            only(&mut b)
        );
        for r in b.query(sql)?.fetch_all(&self.pool).await? {
            let (q, us): (String, Option<i64>) = (r.try_get(0)?, r.try_get(1)?);
            stats
                .oldest_ready_secs
                .insert(q, us.unwrap_or(0).max(0) as f64 / 1e6);
        }

        let mut b = B::new();
        let sql = format!(
            "SELECT CAST(queue AS CHAR), COUNT(*) FROM rowclaim_jobs WHERE status = 'completed' \
             AND finished_at >= UTC_TIMESTAMP(6) - INTERVAL 60 SECOND{} GROUP BY queue",
            only(&mut b)
        );
        for r in b.query(sql)?.fetch_all(&self.pool).await? {
            let (q, n): (String, i64) = (r.try_get(0)?, r.try_get(1)?);
            stats.completed_last_minute.insert(q, n as u64);
        }
        Ok(stats)
    }
}

// ---- The managed queue ----

/// The named lock `rowclaim init` runs under. Named locks are server-wide, so inits of different
/// databases on one server take turns too; they are short.
const INIT_LOCK: &str = "rowclaim_init";
const INIT_LOCK_WAIT_SECS: i64 = 60;

/// The schema component the managed queue's migrations are versioned under.
const JOBS_COMPONENT: &str = "jobs";

const CREATE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS rowclaim_schema (
    component VARCHAR(64) PRIMARY KEY,
    version INT NOT NULL
)";

/// The managed queue's migrations: entry `i` brings the schema from version `i` to `i + 1`.
/// MySQL commits DDL at once, so each one must be safe to run again (after a crash between it and
/// the version update).
///
/// v1: the jobs table. MySQL has no partial indexes: the stored generated `pending_key` holds the
/// unique key only while the job is ready or running, and NULLs do not collide in a unique index,
/// so a key is unique among pending jobs only. Times are UTC.
const MIGRATIONS: &[&str] = &["CREATE TABLE IF NOT EXISTS rowclaim_jobs (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue VARCHAR(255) NOT NULL DEFAULT 'default',
    kind VARCHAR(255) NOT NULL DEFAULT '',
    payload LONGTEXT NOT NULL,
    status VARCHAR(16) NOT NULL DEFAULT 'ready',
    priority INT NOT NULL DEFAULT 0,
    run_at DATETIME(6) NOT NULL,
    attempts INT NOT NULL DEFAULT 0,
    max_attempts INT NOT NULL DEFAULT 25,
    owner VARCHAR(36) NULL,
    lease_until DATETIME(6) NULL,
    unique_key VARCHAR(255) NULL,
    pending_key VARCHAR(255) AS (CASE WHEN status IN ('ready', 'running') THEN unique_key END) STORED,
    last_error TEXT NULL,
    created_at DATETIME(6) NOT NULL,
    finished_at DATETIME(6) NULL,
    UNIQUE KEY rowclaim_jobs_pending_key (pending_key),
    KEY rowclaim_jobs_claim (status, queue, priority, run_at),
    KEY rowclaim_jobs_owner (owner),
    KEY rowclaim_jobs_finished (status, finished_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    // v2: the claim index in the claim's own order (priority DESC, run_at, id), so a claim reads
    // the first rows of its queue and stops, instead of sorting every ready job of the queue.
    // (MariaDB before 10.8 reads DESC and builds the index ascending, so there a claim still sorts.)
    "ALTER TABLE rowclaim_jobs DROP KEY rowclaim_jobs_claim, \
     ADD KEY rowclaim_jobs_claim (status, queue, priority DESC, run_at, id)",
    // v3: a job's own time limit (NULL: the worker's).
    "ALTER TABLE rowclaim_jobs ADD COLUMN IF NOT EXISTS timeout_ms BIGINT NULL",
];

/// Runs the migrations above the recorded version, recording each as it is done. The caller holds
/// the init lock.
async fn migrate(conn: &mut sqlx::MySqlConnection) -> Result<()> {
    sqlx::query(CREATE_SCHEMA).execute(&mut *conn).await?;
    let version: Option<i32> =
        sqlx::query_scalar("SELECT version FROM rowclaim_schema WHERE component = ?")
            .bind(JOBS_COMPONENT)
            .fetch_optional(&mut *conn)
            .await?;
    let version = usize::try_from(version.unwrap_or(0)).unwrap_or(0);
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        sqlx::query(*sql).execute(&mut *conn).await?;
        let to = i as i64 + 1;
        sqlx::query(
            "INSERT INTO rowclaim_schema (component, version) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE version = ?",
        )
        .bind(JOBS_COMPONENT)
        .bind(to)
        .bind(to)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// 1062: duplicate entry for a unique key.
const DUPLICATE_KEY: u16 = 1062;

/// Rows per multi-row INSERT: 500 rows of 9 values stay far below the 65,535 placeholders of one
/// statement.
const BULK_ROWS: usize = 500;

/// Payload bytes per multi-row INSERT, well below the smallest default `max_allowed_packet`
/// (16 MiB on MariaDB, 64 MiB on MySQL 8), which a statement with its values must fit in.
const BULK_BYTES: usize = 4 << 20;

/// How often a unique job is inserted again when its pending twin finished between the failed
/// insert and the look-up.
const UNIQUE_TRIES: usize = 5;

/// 900 years in microseconds: the longest delay, and the longest prune age that is computed (an
/// older cut-off would prune nothing more). `DATETIME` holds the years 1000 to 9999 only, and
/// arithmetic past them gives NULL or, in strict mode, an error rather than a date.
const MAX_SPAN_US: i64 = 900 * 31_556_952 * 1_000_000;

/// `DATETIME`'s range in unix epoch milliseconds: 1000-01-01 to 9999-12-31 23:59:59.999.
const DATETIME_MS: std::ops::RangeInclusive<i64> = -30_610_224_000_000..=253_402_300_799_999;

/// Refuses run-at times `DATETIME` cannot hold. Past the range the server's date arithmetic gives
/// NULL, which `COALESCE` would quietly turn into "now" (or, outside strict mode, the zero date).
fn check_times(job: &JobParts<'_>) -> Result<()> {
    if job.run_at_ms.is_some_and(|ms| !DATETIME_MS.contains(&ms)) {
        return Err(Error::InvalidInput(
            "run-at time is outside the years 1000 to 9999 that MySQL's DATETIME holds".into(),
        ));
    }
    if job.delay_ms.saturating_mul(1000) > MAX_SPAN_US {
        return Err(Error::InvalidInput(
            "a delay of more than 900 years is beyond what MySQL's DATETIME holds".into(),
        ));
    }
    Ok(())
}

/// `INSERT INTO rowclaim_jobs … VALUES (…), (…)` for these jobs. The run-at is absolute epoch
/// milliseconds when given, else now + the delay. `TIMESTAMPADD` on the epoch as a `DATETIME`
/// literal is plain calendar arithmetic: unlike `FROM_UNIXTIME`, no session time zone is involved.
fn insert_sql(b: &mut B, jobs: &[&JobParts<'_>]) -> Result<String> {
    let mut rows = Vec::with_capacity(jobs.len());
    for j in jobs {
        let delay_us = j
            .delay_ms
            .checked_mul(1000)
            .ok_or_else(|| Error::InvalidInput("delay is too long".into()))?;
        rows.push(format!(
            "({}, {}, {}, {}, COALESCE(TIMESTAMPADD(MICROSECOND, {} * 1000, \
             TIMESTAMP '1970-01-01 00:00:00'), UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND), \
             {}, {}, {}, UTC_TIMESTAMP(6))",
            b.bind(j.queue.to_owned()),
            b.bind(j.kind.to_owned()),
            b.bind(j.payload.clone()),
            b.bind(j.priority),
            b.bind(j.run_at_ms),
            b.bind(delay_us),
            b.bind(j.max_attempts),
            b.bind(j.unique_key.map(str::to_owned)),
            b.bind(j.timeout_ms),
        ));
    }
    Ok(format!(
        "INSERT INTO rowclaim_jobs (queue, kind, payload, priority, run_at, max_attempts, \
         unique_key, timeout_ms, created_at) VALUES {}",
        rows.join(", ")
    ))
}

/// Inserts jobs in one statement; returns the first one's id.
async fn insert_jobs(conn: &mut sqlx::MySqlConnection, jobs: &[&JobParts<'_>]) -> Result<i64> {
    let mut b = B::new();
    let sql = insert_sql(&mut b, jobs)?;
    let done = b.query(sql)?.execute(&mut *conn).await?;
    i64::try_from(done.last_insert_id())
        .map_err(|_| Error::InvalidInput("job id is out of range".into()))
}

/// Inserts a run of jobs without unique keys in one statement, adds their ids to `out` and
/// empties the run.
///
/// One multi-row `INSERT … VALUES` is a "simple insert" (its row count is known up front), for
/// which InnoDB reserves all its auto-increment values at once, under
/// `innodb_autoinc_lock_mode` 0, 1 and 2 alike: the ids are the first one
/// (`last_insert_id`) plus `i × auto_increment_increment`. The increment is 1 unless set, as
/// Galera does (the cluster's size), so it is asked once per transaction; `step` caches it.
async fn insert_run(
    conn: &mut sqlx::MySqlConnection,
    run: &mut Vec<&JobParts<'_>>,
    step: &mut Option<i64>,
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    if run.is_empty() {
        return Ok(());
    }
    let first = insert_jobs(conn, run).await?;
    let step = match *step {
        Some(s) => s,
        None if run.len() == 1 => 1,
        None => {
            let s: i64 =
                sqlx::query_scalar("SELECT CAST(@@SESSION.auto_increment_increment AS SIGNED)")
                    .fetch_one(&mut *conn)
                    .await?;
            *step = Some(s);
            s
        }
    };
    out.extend((0..run.len() as i64).map(|i| Enqueued {
        id: first + i * step,
        existing: false,
    }));
    run.clear();
    Ok(())
}

/// Enqueues one job on a connection (in the caller's transaction when they hold one; this neither
/// begins nor commits). With a unique key that a ready or running job has already, returns that
/// job.
pub(crate) async fn enqueue_one(
    conn: &mut sqlx::MySqlConnection,
    job: &JobParts<'_>,
) -> Result<Enqueued> {
    check_times(job)?;
    let Some(key) = job.unique_key else {
        let id = insert_jobs(conn, &[job]).await?;
        return Ok(Enqueued {
            id,
            existing: false,
        });
    };
    for _ in 0..UNIQUE_TRIES {
        // The insert itself is the uniqueness check: it waits for a twin another transaction is
        // inserting, and fails with a duplicate key once that one commits. A failed statement
        // undoes only itself in MySQL, so the caller's transaction goes on.
        match insert_jobs(conn, &[job]).await {
            Ok(id) => {
                return Ok(Enqueued {
                    id,
                    existing: false,
                })
            }
            Err(Error::Database(e)) if error_number(&e) == Some(DUPLICATE_KEY) => {}
            Err(e) => return Err(e),
        }
        // A locking read sees the latest committed rows, also in a caller's REPEATABLE READ
        // transaction whose snapshot predates the twin. (The failed insert holds a shared lock on
        // the twin's key already.) `LOCK IN SHARE MODE` is understood by MySQL 8 and MariaDB.
        let twin: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM rowclaim_jobs WHERE pending_key = ? LOCK IN SHARE MODE",
        )
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(id) = twin {
            return Ok(Enqueued { id, existing: true });
        }
        // The twin completed, died or was cancelled in between: the key is free again.
    }
    Err(Error::InvalidInput(format!(
        "could not enqueue the job with unique key {key:?}: other jobs with that key kept \
         starting and finishing; try again"
    )))
}
