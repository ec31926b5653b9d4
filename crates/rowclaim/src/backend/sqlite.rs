//! SQLite: all of rowclaim's SQL for SQLite.
//!
//! SQLite has one writer at a time and no row locks, so a claim that takes the write lock
//! (`BEGIN IMMEDIATE`) is alone: no `SKIP LOCKED` is needed, and none exists. Leases are `INTEGER`
//! unix epoch milliseconds from `unixepoch('subsec')`; rows come back as `json_object(…)`; id lists
//! are bound as one JSON array (`IN (SELECT value FROM json_each(?))`), so statement texts are stable.
//! Placeholders are positional `?`: every statement binds in the order its text uses them.

use std::time::Duration;

use sqlx::{Row, Sqlite, SqlitePool};

use super::{
    lease_ms, parse_row, Binder, ClaimArgs, Claimed, ColType, Column, Driver, Held, Outcome,
    ServerInfo, ServerKind, Target,
};
use crate::queue::{Admin, Enqueued, JobParts, NewJob, QueueStats};
use crate::source::status_literal;
use crate::source::{Mapping, TableName};
use crate::value::{IdList, Kind};
use crate::{Error, LockMode, LockWait, Result, RowId, Stats, Strategy};

type B = Binder<Sqlite>;

/// Now, in unix epoch milliseconds, by SQLite's clock.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

#[derive(Clone, Debug)]
pub(crate) struct Lite {
    pool: SqlitePool,
}

impl Lite {
    pub(crate) fn new(pool: SqlitePool) -> Lite {
        Lite { pool }
    }
}

/// A row as a JSON object; only plainly named columns, so their names are safe as literals.
fn row_json(m: &Mapping) -> String {
    json_of(&m.columns)
}

/// A claimed row as JSON text: the whole row of a user's table, the job's own columns for the
/// managed queue (`Mapping::claim_columns`).
fn claimed_json(m: &Mapping) -> String {
    json_of(&m.claim_columns)
}

fn json_of(columns: &[String]) -> String {
    let pairs: Vec<String> = columns.iter().map(|c| format!("'{c}', \"{c}\"")).collect();
    format!("json_object({})", pairs.join(", "))
}

fn lease_until(b: &mut B, lease: Duration) -> String {
    format!("{NOW} + {}", b.bind(lease_ms(lease)))
}

/// `IN (…)` over a bound JSON array of ids.
fn in_ids(b: &mut B, list: &IdList) -> String {
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

fn held_by(m: &Mapping, b: &mut B, token: &str, target: &Target<'_>) -> Result<String> {
    super::held_by(m, b, token, target, |b, col, list| {
        format!("{col} {}", in_ids(b, list))
    })
}

fn row_id_as_id(m: &Mapping, expr: &str) -> String {
    match m.id_kind {
        Kind::Int => format!("CAST({expr} AS INTEGER)"),
        Kind::Text => expr.to_owned(),
    }
}

fn parse_ids(m: &Mapping, texts: Vec<String>) -> Result<Vec<RowId>> {
    texts.iter().map(|t| m.id_kind.parse(t, "row id")).collect()
}

fn parse_rows(texts: Vec<String>) -> Result<Vec<serde_json::Value>> {
    texts.iter().map(|t| parse_row(t)).collect()
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
const CREATE_COUNTERS: &str = "CREATE TABLE IF NOT EXISTS rowclaim_counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL)";

impl Lite {
    /// A write transaction: takes the write lock at once (waiting up to the busy timeout), so a
    /// read inside it can never be outdated by another writer.
    async fn write(&self) -> Result<sqlx::Transaction<'static, Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    async fn claimable_exists(&self, m: &Mapping) -> Result<bool> {
        let mut b = B::new();
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM ({}))",
            candidates(m, &mut b, "1 AS one", 1, true)
        );
        Ok(b.scalar::<bool>(sql)?.fetch_one(&self.pool).await?)
    }

    /// Runs one changing statement in a write transaction; with several named rows it commits
    /// only if all of them changed.
    async fn change_all_or_nothing(&self, sql: String, b: B, target: &Target<'_>) -> Result<u64> {
        let mut tx = self.write().await?;
        let changed = b.query(sql)?.execute(&mut *tx).await?.rows_affected();
        match target {
            Target::Ids(_, n) if changed != *n as u64 => tx.rollback().await?,
            _ => tx.commit().await?,
        }
        Ok(changed)
    }

    async fn deadline_passed(
        tx: &mut sqlx::Transaction<'static, Sqlite>,
        deadline_ms: i64,
    ) -> Result<bool> {
        let sql = format!("SELECT {NOW} > ?");
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(deadline_ms)
            .fetch_one(&mut **tx)
            .await?)
    }
}

impl Driver for Lite {
    async fn server(&self) -> Result<ServerInfo> {
        let v: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&self.pool)
            .await?;
        Ok(ServerInfo::new(ServerKind::Sqlite, &v))
    }

    async fn columns(&self, table: &TableName) -> Result<Vec<Column>> {
        let rows = sqlx::query("SELECT name, type FROM pragma_table_info(?, ?)")
            .bind(table.name.clone())
            .bind(table.schema.clone().unwrap_or_else(|| "main".into()))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let sql_type: String = r.try_get(1)?;
                // SQLite's type affinity rules.
                let upper = sql_type.to_ascii_uppercase();
                let ty = if upper.contains("INT") {
                    ColType::Int
                } else if ["CHAR", "CLOB", "TEXT"].iter().any(|t| upper.contains(t)) {
                    ColType::Text { max_len: None }
                } else {
                    ColType::Other
                };
                Ok(Column {
                    name: r.try_get(0)?,
                    sql_type,
                    ty,
                })
            })
            .collect()
    }

    async fn table_key(&self, table: &TableName) -> Result<String> {
        let schema = table.schema.clone().unwrap_or_else(|| "main".into());
        let key: Option<String> = sqlx::query_scalar(
            "SELECT schema || '.' || name FROM pragma_table_list \
             WHERE schema = ? COLLATE NOCASE AND name = ? COLLATE NOCASE",
        )
        .bind(schema)
        .bind(table.name.clone())
        .fetch_optional(&self.pool)
        .await?;
        key.ok_or_else(|| Error::MissingTable {
            table: table.display.clone(),
        })
    }

    async fn ensure_lease_table(&self) -> Result<()> {
        for sql in [CREATE_LEASES, CREATE_LEASES_TOKEN] {
            sqlx::query(sql).execute(&self.pool).await?;
        }
        Ok(())
    }

    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed> {
        let (m, t, id, order, filter) = (a.m, &a.m.table, &a.m.id, &a.m.order_by, &a.m.filter);
        let json = claimed_json(m);
        let batch = i64::from(a.batch);
        let mut b = B::new();
        match a.strategy {
            Strategy::SkipLocked => Err(Error::UnsupportedStrategy {
                strategy: Strategy::SkipLocked,
                reason: "SQLite has no SKIP LOCKED (it has one writer at a time)".into(),
            }),
            // One statement under the write lock: nobody else can take the same rows.
            Strategy::Token => {
                let set = claim_set(m, &mut b, a.token, a.lease);
                let pick = candidates(m, &mut b, id, batch, a.expired);
                let sql = format!(
                    "UPDATE {t} SET {set} WHERE {id} IN (SELECT {id} FROM ({pick})) RETURNING {json}"
                );
                let rows = parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)?;
                Ok(Claimed {
                    rows,
                    held: None,
                    position: None,
                    lost_race: false,
                })
            }
            // Candidates read without the write lock; the update wins only rows still claimable.
            Strategy::Optimistic => {
                let pick = candidates(
                    m,
                    &mut b,
                    &format!("CAST({id} AS TEXT) AS rowclaim_id"),
                    batch,
                    a.expired,
                );
                let sql = format!("SELECT rowclaim_id FROM ({pick})");
                let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
                if found.is_empty() {
                    return Ok(Claimed {
                        rows: vec![],
                        held: None,
                        position: None,
                        lost_race: false,
                    });
                }
                let list = IdList::new(m.id_kind, &parse_ids(m, found)?)?;
                let mut b = B::new();
                let set = claim_set(m, &mut b, a.token, a.lease);
                let ids = in_ids(&mut b, &list);
                let cond = claimable(m, &mut b);
                let sql = format!(
                    "UPDATE {t} SET {set} WHERE {id} {ids} AND {cond}{filter} RETURNING {json}"
                );
                let rows = parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)?;
                let lost_race = rows.is_empty() && self.claimable_exists(m).await?;
                Ok(Claimed {
                    rows,
                    held: None,
                    position: None,
                    lost_race,
                })
            }
            // Under the write lock: rows without a live lease, insert their lease keys (taking
            // over expired ones), mark the rows.
            Strategy::LeaseTable => {
                let mut tx = self.write().await?;
                let st = &m.status;
                let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
                let source = b.bind(m.source_key.clone());
                let limit = b.bind(batch);
                let sql = format!(
                    "SELECT CAST(t.{id} AS TEXT) AS rowclaim_id FROM {t} AS t \
                     WHERE ({st} = {ready} OR {st} = {claimed}){filter} \
                     AND NOT EXISTS (SELECT 1 FROM rowclaim_leases l WHERE l.source = {source} \
                     AND l.row_id = CAST(t.{id} AS TEXT) AND l.lease_until >= {NOW}) \
                     ORDER BY {order} LIMIT {limit}"
                );
                let found: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
                if found.is_empty() {
                    tx.rollback().await?;
                    return Ok(Claimed {
                        rows: vec![],
                        held: None,
                        position: None,
                        lost_race: false,
                    });
                }
                let mut b = B::new();
                let source = b.bind(m.source_key.clone());
                let token = b.bind(a.token.to_owned());
                let until = lease_until(&mut b, a.lease);
                let keys = b.bind(IdList::Text(found).to_json());
                let sql = format!(
                    "INSERT INTO rowclaim_leases (source, row_id, token, lease_until) \
                     SELECT {source}, value, {token}, {until} FROM json_each({keys}) WHERE true \
                     ON CONFLICT (source, row_id) DO UPDATE \
                     SET token = excluded.token, lease_until = excluded.lease_until \
                     WHERE rowclaim_leases.lease_until < {NOW} RETURNING row_id"
                );
                let won: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
                let won = IdList::new(m.id_kind, &parse_ids(m, won)?)?;
                let mut b = B::new();
                let set = claim_set(m, &mut b, a.token, a.lease);
                let ids = in_ids(&mut b, &won);
                let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
                let sql = format!(
                    "UPDATE {t} SET {set} WHERE {id} {ids} AND ({st} = {ready} OR {st} = {claimed}) \
                     RETURNING {json}"
                );
                let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
                tx.commit().await?;
                Ok(Claimed {
                    rows,
                    held: None,
                    position: None,
                    lost_race: false,
                })
            }
            // Hold the write lock while the rows are processed; SQLite cannot end the session on
            // its own, so the deadline is checked before each later write.
            Strategy::Transaction => {
                let mut tx = self.write().await?;
                let sql = format!("SELECT {NOW} + ?");
                let deadline_ms: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .bind(lease_ms(a.lease))
                    .fetch_one(&mut *tx)
                    .await?;
                let ready = status_literal(&m.ready);
                let limit = b.bind(batch);
                let sql = format!(
                    "SELECT {json} FROM {t} WHERE {} = {ready}{filter} ORDER BY {order} LIMIT {limit}",
                    m.status
                );
                let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
                let held = if rows.is_empty() {
                    tx.rollback().await?;
                    None
                } else {
                    Some(Held::Sqlite { tx, deadline_ms })
                };
                Ok(Claimed {
                    rows,
                    held,
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
        if strategy != Strategy::LeaseTable {
            let mut b = B::new();
            let set = (!outcome.deletes(m))
                .then(|| super::outcome_set(m, &mut b, &outcome, NOW, lease_until));
            let cond = held_by(m, &mut b, token, &target)?;
            let sql = super::change_sql(m, set.as_deref(), &cond);
            return self.change_all_or_nothing(sql, b, &target).await;
        }
        let mut tx = self.write().await?;
        let mut b = B::new();
        let source = b.bind(m.source_key.clone());
        let tok = b.bind(token.to_owned());
        let only = match &target {
            Target::All => String::new(),
            Target::Ids(list, _) => format!(" AND row_id {}", in_text_ids(&mut b, list)),
        };
        let sql = format!(
            "DELETE FROM rowclaim_leases WHERE source = {source} AND token = {tok}{only} RETURNING row_id"
        );
        let gone: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
        let mut b = B::new();
        let set = super::outcome_set(m, &mut b, &outcome, NOW, lease_until);
        let gone = b.bind(IdList::Text(gone).to_json());
        let claimed = status_literal(&m.claimed);
        let sql = format!(
            "UPDATE {} SET {set} WHERE {} IN (SELECT {} FROM json_each({gone})) AND {} = {claimed}",
            m.table,
            m.id,
            row_id_as_id(m, "value"),
            m.status,
        );
        let changed = b.query(sql)?.execute(&mut *tx).await?.rows_affected();
        match target {
            Target::Ids(_, n) if changed != n as u64 => tx.rollback().await?,
            _ => tx.commit().await?,
        }
        Ok(changed)
    }

    async fn settle_each(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<RowId>>> {
        if strategy == Strategy::LeaseTable || m.owner.is_none() {
            return Ok(None);
        }
        let mut b = B::new();
        let set = (!outcome.deletes(m))
            .then(|| super::outcome_set(m, &mut b, &outcome, NOW, lease_until));
        let cond = held_by(m, &mut b, token, &Target::Ids(list, list.len()))?;
        let sql = format!(
            "{} RETURNING CAST({} AS TEXT)",
            super::change_sql(m, set.as_deref(), &cond),
            m.id
        );
        let done: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
        Ok(Some(parse_ids(m, done)?))
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
            let source = b.bind(m.source_key.clone());
            let tok = b.bind(token.to_owned());
            let only = match &target {
                Target::All => String::new(),
                Target::Ids(list, _) => format!(" AND row_id {}", in_text_ids(&mut b, list)),
            };
            format!(
                "UPDATE rowclaim_leases SET lease_until = {until} \
                 WHERE source = {source} AND token = {tok}{only}"
            )
        } else {
            let le = m.lease.as_deref().unwrap_or_default();
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
        let sql = if strategy == Strategy::LeaseTable {
            let source = b.bind(m.source_key.clone());
            let tok = b.bind(token.to_owned());
            let keys = in_text_ids(&mut b, list);
            format!(
                "SELECT row_id FROM rowclaim_leases WHERE source = {source} AND token = {tok} \
                 AND row_id {keys}"
            )
        } else {
            let cond = held_by(m, &mut b, token, &Target::Ids(list, 0))?;
            format!(
                "SELECT CAST({} AS TEXT) AS rowclaim_id FROM {} WHERE {cond}",
                m.id, m.table
            )
        };
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
        parse_ids(m, found)
    }

    async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<()> {
        let Held::Sqlite { tx, deadline_ms } = held else {
            return Err(Error::InvalidInput(
                "transaction of another database".into(),
            ));
        };
        if Lite::deadline_passed(tx, *deadline_ms).await? {
            return Err(expired());
        }
        if matches!(outcome, Outcome::Ready) {
            return Ok(());
        }
        let mut b = B::new();
        let st = status_literal(outcome.status(m));
        let ids = in_ids(&mut b, list);
        let sql = format!(
            "UPDATE {} SET {} = {st} WHERE {} {ids}",
            m.table, m.status, m.id
        );
        b.query(sql)?.execute(&mut **tx).await?;
        Ok(())
    }

    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        let Held::Sqlite { tx, deadline_ms } = held else {
            return Err(Error::InvalidInput(
                "transaction of another database".into(),
            ));
        };
        if Lite::deadline_passed(tx, *deadline_ms).await? {
            return Err(expired());
        }
        let sql = format!("SELECT {NOW} + ?");
        *deadline_ms = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(lease_ms(lease))
            .fetch_one(&mut **tx)
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
        if wait == LockWait::SkipLocked {
            return Err(Error::Unsupported(
                "SQLite has no SKIP LOCKED: its locks cover the whole database, one writer at a time"
                    .into(),
            ));
        }
        // SQLite locks the database, not rows, and in WAL mode readers never block writers: the
        // only lock that keeps others from changing the rows is the write lock, for both modes.
        let _ = mode;
        let mut tx = match wait {
            LockWait::Wait => self.write().await?,
            _ => {
                // NOWAIT: ask for the write lock with no busy wait, then restore the timeout.
                let mut tx = self.pool.begin().await?;
                let timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
                    .fetch_one(&mut *tx)
                    .await?;
                sqlx::query("PRAGMA busy_timeout = 0")
                    .execute(&mut *tx)
                    .await?;
                // A write statement takes the write lock even when it changes nothing.
                let sql = format!("UPDATE {} SET {} = {} WHERE 0", m.table, m.id, m.id);
                let locked = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(&mut *tx)
                    .await;
                let restore = format!("PRAGMA busy_timeout = {timeout}");
                sqlx::query(sqlx::AssertSqlSafe(restore))
                    .execute(&mut *tx)
                    .await?;
                locked?;
                tx
            }
        };
        let mut b = B::new();
        let which = match list {
            Some(l) => format!("{} {}", m.id, in_ids(&mut b, l)),
            None => "1".to_owned(),
        };
        let limit = limit
            .map(|n| format!(" LIMIT {}", b.bind(i64::from(n))))
            .unwrap_or_default();
        let sql = format!(
            "SELECT {} FROM {} WHERE {which}{} ORDER BY {}{limit}",
            row_json(m),
            m.table,
            m.filter,
            m.order_by
        );
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
        Ok((
            Held::Sqlite {
                tx,
                deadline_ms: i64::MAX,
            },
            rows,
        ))
    }

    async fn counter_next(&self, name: &str) -> Result<i64> {
        let next = || {
            sqlx::query_scalar(
                "INSERT INTO rowclaim_counters (name, value) VALUES (?, 1) \
                 ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value",
            )
            .bind(name.to_owned())
        };
        match next().fetch_one(&self.pool).await {
            Err(sqlx::Error::Database(e)) if e.message().contains("no such table") => {
                sqlx::query(CREATE_COUNTERS).execute(&self.pool).await?;
                Ok(next().fetch_one(&self.pool).await?)
            }
            other => Ok(other?),
        }
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<Stats> {
        let q = super::stats_queries::<Sqlite>(m, strategy, NOW, "TEXT");
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
            let sql = super::backlog_sql(m, claimed, &mut b, NOW);
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
        // The write lock makes concurrent inits take turns; DDL is transactional here.
        let mut tx = self.write().await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS rowclaim_schema \
             (component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        let version: Option<i64> =
            sqlx::query_scalar("SELECT version FROM rowclaim_schema WHERE component = 'jobs'")
                .fetch_optional(&mut *tx)
                .await?;
        let version = version.unwrap_or(0);
        for (i, steps) in QUEUE_MIGRATIONS.iter().enumerate() {
            let to = i as i64 + 1;
            if to <= version {
                continue;
            }
            for step in *steps {
                sqlx::query(*step).execute(&mut *tx).await?;
            }
            sqlx::query(
                "INSERT INTO rowclaim_schema (component, version) VALUES ('jobs', ?) \
                 ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            )
            .bind(to)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        // One writer at a time: inserting row by row inside one write transaction is as fast as
        // a multi-row statement here, and keeps unique keys simple.
        let mut tx = self.write().await?;
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            out.push(enqueue_one(&mut tx, &job.parts()).await?);
        }
        super::commit(tx, || super::enqueue_what(jobs.len())).await?;
        Ok(out)
    }

    async fn queue_admin(&self, op: Admin) -> Result<u64> {
        let (sql, arg) = match op {
            Admin::Cancel(id) => (
                format!(
                    "UPDATE rowclaim_jobs SET status = 'cancelled', owner = NULL, lease_until = NULL, \
                     finished_at = {NOW} WHERE id = ? AND status IN ('ready', 'running')"
                ),
                id,
            ),
            Admin::Retry(id) => (
                format!(
                    "UPDATE rowclaim_jobs SET status = 'ready', attempts = 0, run_at = {NOW}, \
                     owner = NULL, lease_until = NULL, finished_at = NULL \
                     WHERE id = ? AND status IN ('dead', 'cancelled')"
                ),
                id,
            ),
            Admin::Prune(age) => (
                format!(
                    "DELETE FROM rowclaim_jobs WHERE status IN ('completed', 'dead', 'cancelled') \
                     AND finished_at < {NOW} - ?"
                ),
                lease_ms(age),
            ),
        };
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(arg)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn queue_stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        let mut stats = QueueStats::default();
        let queue = queue.map(str::to_owned);
        let rows = sqlx::query(
            "SELECT queue, status, COUNT(*) FROM rowclaim_jobs \
             WHERE ?1 IS NULL OR queue = ?1 GROUP BY 1, 2",
        )
        .bind(queue.clone())
        .fetch_all(&self.pool)
        .await?;
        for r in rows {
            let (q, st, n): (String, String, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            stats.by_queue.entry(q).or_default().insert(st, n as u64);
        }
        let sql = format!(
            "SELECT queue, ({NOW} - MIN(run_at)) / 1000.0 FROM rowclaim_jobs \
             WHERE status = 'ready' AND run_at <= {NOW} AND (?1 IS NULL OR queue = ?1) GROUP BY 1"
        );
        for r in sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(queue.clone())
            .fetch_all(&self.pool)
            .await?
        {
            stats.oldest_ready_secs.insert(r.try_get(0)?, r.try_get(1)?);
        }
        let sql = format!(
            "SELECT queue, COUNT(*) FROM rowclaim_jobs WHERE status = 'completed' \
             AND finished_at > {NOW} - 60000 AND (?1 IS NULL OR queue = ?1) GROUP BY 1"
        );
        for r in sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(queue)
            .fetch_all(&self.pool)
            .await?
        {
            let n: i64 = r.try_get(1)?;
            stats.completed_last_minute.insert(r.try_get(0)?, n as u64);
        }
        Ok(stats)
    }
}

/// The managed queue's schema, one list of statements per version. Append, never edit.
const QUEUE_MIGRATIONS: &[&[&str]] = &[&[
    "CREATE TABLE IF NOT EXISTS rowclaim_jobs (
        id INTEGER PRIMARY KEY,
        queue TEXT NOT NULL DEFAULT 'default',
        kind TEXT NOT NULL DEFAULT '',
        payload TEXT NOT NULL DEFAULT '{}',
        status TEXT NOT NULL DEFAULT 'ready',
        priority INTEGER NOT NULL DEFAULT 0,
        run_at INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        max_attempts INTEGER NOT NULL DEFAULT 25,
        owner TEXT,
        lease_until INTEGER,
        unique_key TEXT,
        last_error TEXT,
        created_at INTEGER NOT NULL,
        finished_at INTEGER)",
    "CREATE INDEX IF NOT EXISTS rowclaim_jobs_ready \
     ON rowclaim_jobs (queue, priority DESC, run_at, id) WHERE status = 'ready'",
    "CREATE INDEX IF NOT EXISTS rowclaim_jobs_running \
     ON rowclaim_jobs (lease_until) WHERE status = 'running'",
    "CREATE INDEX IF NOT EXISTS rowclaim_jobs_owner ON rowclaim_jobs (owner) WHERE status = 'running'",
    "CREATE UNIQUE INDEX IF NOT EXISTS rowclaim_jobs_unique ON rowclaim_jobs (unique_key) \
     WHERE unique_key IS NOT NULL AND status IN ('ready', 'running')",
    "CREATE INDEX IF NOT EXISTS rowclaim_jobs_finished ON rowclaim_jobs (finished_at) \
     WHERE status IN ('completed', 'dead', 'cancelled')",
],
    // v2: a claim looks for expired leases through the lease index. The owner index matched the
    // same rows, and the planner sometimes walked all of it (every job run since the last vacuum)
    // instead; lookups by token read the small set of running jobs through the lease index.
    &["DROP INDEX IF EXISTS rowclaim_jobs_owner"],
    // v3: a job's own time limit (NULL: the worker's).
    &["ALTER TABLE rowclaim_jobs ADD COLUMN timeout_ms INTEGER"],
];

/// Enqueues one job on a connection (in the caller's transaction when they hold one). A unique key
/// that is pending already returns that job.
pub(crate) async fn enqueue_one(
    conn: &mut sqlx::SqliteConnection,
    job: &JobParts<'_>,
) -> Result<Enqueued> {
    let insert = format!(
        "INSERT INTO rowclaim_jobs \
         (queue, kind, payload, priority, run_at, max_attempts, unique_key, timeout_ms, created_at) \
         VALUES (?, ?, json(?), ?, COALESCE(?, {NOW} + ?), ?, ?, ?, {NOW}) \
         ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('ready', 'running') \
         DO NOTHING RETURNING id"
    );
    for _ in 0..5 {
        let id: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(insert.clone()))
            .bind(job.queue.to_owned())
            .bind(job.kind.to_owned())
            .bind(job.payload.clone())
            .bind(job.priority)
            .bind(job.run_at_ms)
            .bind(job.delay_ms)
            .bind(job.max_attempts)
            .bind(job.unique_key.map(str::to_owned))
            .bind(job.timeout_ms)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(id) = id {
            return Ok(Enqueued {
                id,
                existing: false,
            });
        }
        let existing: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM rowclaim_jobs WHERE unique_key = ? AND status IN ('ready', 'running')",
        )
        .bind(job.unique_key.map(str::to_owned))
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(id) = existing {
            return Ok(Enqueued { id, existing: true });
        }
    }
    Err(Error::InvalidInput(format!(
        "unique key {:?} keeps changing hands; try again",
        job.unique_key.unwrap_or_default()
    )))
}
