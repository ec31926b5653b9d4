//! PostgreSQL: all of rowclaim's SQL for PostgreSQL.
//!
//! Leases are `timestamptz` computed from `now()`; rows come back as `to_jsonb(t)`; id lists are
//! bound as one array (`= ANY($n)`), so every statement's text is stable and prepared once.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Postgres, Row};

use super::{
    lease_ms, Binder, ClaimArgs, Claimed, ColType, Column, Driver, Held, Outcome, Position,
    ServerInfo, ServerKind, Target,
};
use crate::queue::{Admin, Enqueued, JobParts, NewJob, QueueStats};
use crate::source::status_literal;
use crate::source::{Mapping, TableName};
use crate::value::{IdList, Kind};
use crate::{Error, LockMode, LockWait, Result, RowId, Stats, Strategy};

type B = Binder<Postgres>;

#[derive(Clone, Debug)]
pub(crate) struct Pg {
    pool: PgPool,
    /// The pool's sessions commit without waiting for the WAL flush
    /// ([`crate::ConnectOptions::async_commit`]); enqueues, counters and admin changes then ask
    /// for a durable commit in their own transaction.
    async_commit: bool,
}

impl Pg {
    pub(crate) fn new(pool: PgPool) -> Pg {
        Pg {
            pool,
            async_commit: false,
        }
    }

    pub(crate) fn with_async_commit(pool: PgPool) -> Pg {
        Pg {
            pool,
            async_commit: true,
        }
    }

    /// A transaction whose commit waits for the WAL flush, whatever the session's setting.
    async fn durable(&self) -> Result<sqlx::Transaction<'static, Postgres>> {
        let mut tx = self.pool.begin().await?;
        if self.async_commit {
            sqlx::query("SET LOCAL synchronous_commit = on")
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx)
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// `now() + lease`, by the server's clock.
fn lease_until(b: &mut B, lease: Duration) -> String {
    format!(
        "now() + make_interval(secs => {})",
        b.bind(lease.as_secs_f64())
    )
}

fn ids(b: &mut B, list: &IdList) -> String {
    match list {
        IdList::Int(v) => b.bind(v.clone()),
        IdList::Text(v) => b.bind(v.clone()),
    }
}

/// A claimed row as JSON: the whole row of a user's table; for the managed queue the job's own
/// columns (`Mapping::claim_columns`), cheaper to build and to read than the whole row.
fn claimed_json(m: &Mapping) -> String {
    if m.queues.is_none() {
        return "to_jsonb(t)".to_owned();
    }
    let pairs: Vec<String> = m
        .claim_columns
        .iter()
        .map(|c| format!("'{c}', t.{}", super::Dialect::Postgres.quote(c)))
        .collect();
    format!("jsonb_build_object({})", pairs.join(", "))
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

/// Rows a claim may take (see [`super::claimable`]).
fn claimable(m: &Mapping, b: &mut B) -> String {
    super::claimable(m, b, "now()")
}

/// Up to `limit` rows a claim may take (see [`super::candidates`]).
fn candidates(m: &Mapping, b: &mut B, select: &str, limit: i64, expired: bool) -> String {
    super::candidates(m, b, "now()", select, limit, expired)
}

/// The SET list that marks rows claimed by `token` (see [`super::claim_set`]).
fn claim_set(m: &Mapping, b: &mut B, token: &str, lease: Duration) -> String {
    super::claim_set(m, b, token, lease, lease_until)
}

/// The condition "`token` holds this row" for strategies that mark rows in the table itself.
fn held_by(m: &Mapping, b: &mut B, token: &str, target: &Target<'_>) -> Result<String> {
    super::held_by(m, b, token, target, |b, col, list| {
        format!("{col} = ANY({})", ids(b, list))
    })
}

/// Casts a lease table's text `row_id` back to the id column's type.
fn row_id_as_id(m: &Mapping, expr: &str) -> String {
    match m.id_kind {
        Kind::Int => format!("{expr}::int8"),
        Kind::Text => expr.to_owned(),
    }
}

fn parse_ids(m: &Mapping, texts: Vec<String>) -> Result<Vec<RowId>> {
    texts.iter().map(|t| m.id_kind.parse(t, "row id")).collect()
}

const CREATE_LEASES: &str = "CREATE TABLE IF NOT EXISTS rowclaim_leases (
    source text NOT NULL,
    row_id text NOT NULL,
    token text NOT NULL,
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (source, row_id))";
const CREATE_LEASES_TOKEN: &str =
    "CREATE INDEX IF NOT EXISTS rowclaim_leases_token ON rowclaim_leases (token)";
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
                let mut tx = self.pool.begin().await?;
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
}

impl Driver for Pg {
    async fn server(&self) -> Result<ServerInfo> {
        let v: String = sqlx::query_scalar("SELECT current_setting('server_version')")
            .fetch_one(&self.pool)
            .await?;
        Ok(ServerInfo::new(ServerKind::Postgres, &v))
    }

    async fn columns(&self, table: &TableName) -> Result<Vec<Column>> {
        let rows = sqlx::query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typname::text,
                    CASE WHEN a.atttypmod > 4 THEN a.atttypmod - 4 END
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum",
        )
        .bind(table.quoted(super::Dialect::Postgres))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let typname: String = r.try_get(2)?;
                let len: Option<i32> = r.try_get(3)?;
                let ty = match typname.as_str() {
                    "int2" | "int4" | "int8" => ColType::Int,
                    "text" | "name" | "citext" => ColType::Text { max_len: None },
                    "varchar" | "bpchar" => ColType::Text {
                        max_len: len.and_then(|l| u32::try_from(l).ok()),
                    },
                    "timestamptz" => ColType::Timestamp,
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
            "SELECT n.nspname || '.' || c.relname FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
        )
        .bind(table.quoted(super::Dialect::Postgres))
        .fetch_optional(&self.pool)
        .await?;
        key.ok_or_else(|| Error::MissingTable {
            table: table.display.clone(),
        })
    }

    async fn ensure_lease_table(&self) -> Result<()> {
        // CREATE … IF NOT EXISTS is not safe against a concurrent create (a duplicate key in the
        // catalog): take turns on an advisory lock, in one transaction.
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('rowclaim_leases'))")
            .execute(&mut *tx)
            .await?;
        for sql in [CREATE_LEASES, CREATE_LEASES_TOKEN] {
            sqlx::query(sql).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed> {
        let (m, t, id, order, filter) = (a.m, &a.m.table, &a.m.id, &a.m.order_by, &a.m.filter);
        let row = claimed_json(a.m);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let json_rows = |rows: Vec<sqlx::types::Json<serde_json::Value>>| {
            rows.into_iter().map(|j| j.0).collect::<Vec<_>>()
        };
        match a.strategy {
            // One statement: lock the first unlocked candidates, mark them ours, return them.
            // Expired leases are taken first, then ready rows fill the batch; each arm walks its
            // own index (an OR of the two walks the primary key past every finished row). The
            // outer LIMIT on c keeps the planner's estimate of c small (a LIMIT computed from a
            // subquery alone is guessed at a tenth of the table, and then it hashes the whole
            // table instead of joining by the primary key). A managed-queue claim given a
            // position walks the ready rows in two arms that start there (the rest of its
            // priority, then lower priorities), each an index range: see `Position`.
            Strategy::SkipLocked => {
                let limit = b.bind(batch);
                let ready = super::ready_arm(m, &mut b, "now()");
                let mut arms: Vec<String> = Vec::new();
                if a.expired {
                    arms.extend(super::expired_arm(m, &mut b, "now()"));
                }
                match (a.after, &m.priority, &m.run_at) {
                    (Some(p), Some(prio), Some(run_at)) => {
                        let (pv, rv, iv) = (b.bind(p.priority), b.bind(p.run_at_us), b.bind(p.id));
                        arms.push(format!(
                            "{ready} AND {prio} = {pv} AND ({run_at}, {id}) > \
                             (timestamptz 'epoch' + {rv} * interval '1 microsecond', {iv})"
                        ));
                        arms.push(format!("{ready} AND {prio} < {pv}"));
                    }
                    _ => arms.push(ready),
                }
                // Each arm takes what the arms before it left of the batch.
                let mut ctes = Vec::new();
                let mut before: Vec<String> = Vec::new();
                for (n, cond) in arms.iter().enumerate() {
                    let left = before
                        .iter()
                        .map(|p| format!(" - (SELECT count(*) FROM {p})"))
                        .collect::<String>();
                    ctes.push(format!(
                        "a{n} AS (SELECT {id} FROM {t} WHERE {cond}{filter} ORDER BY {order} \
                         LIMIT {limit}{left} FOR UPDATE SKIP LOCKED)"
                    ));
                    before.push(format!("a{n}"));
                }
                let union = before
                    .iter()
                    .map(|p| format!("SELECT {id} FROM {p}"))
                    .collect::<Vec<_>>()
                    .join(" UNION ALL ");
                let set = claim_set(m, &mut b, a.token, a.lease);
                let sql = format!(
                    "WITH {}, c AS ({union} LIMIT {limit}) \
                     UPDATE {t} AS t SET {set} FROM c WHERE t.{id} = c.{id} RETURNING ",
                    ctes.join(", ")
                );
                // A managed job comes back as plain columns: building a JSON object per row
                // costs the server about as much as the rest of the claim (10 µs of 26 per job).
                let (Some(prio), Some(run_at)) = (&m.priority, &m.run_at) else {
                    let sql = sql + &row;
                    return Ok(Claimed {
                        rows: json_rows(b.scalar(sql)?.fetch_all(&self.pool).await?),
                        held: None,
                        lost_race: false,
                        position: None,
                    });
                };
                let cols: Vec<String> = m
                    .claim_columns
                    .iter()
                    .map(|c| format!("t.{}", super::Dialect::Postgres.quote(c)))
                    .collect();
                let sql = format!(
                    "{sql}{}, t.{prio}::int8 AS rowclaim_priority, \
                     (extract(epoch FROM t.{run_at}) * 1000000)::int8 AS rowclaim_run_at_us",
                    cols.join(", ")
                );
                let fetched = b.query(sql)?.fetch_all(&self.pool).await?;
                let mut position: Option<Position> = None;
                let mut rows = Vec::with_capacity(fetched.len());
                for r in &fetched {
                    let (row, p) = job_row(m, r)?;
                    position = Some(position.map_or(p, |q| q.later(p)));
                    rows.push(row);
                }
                Ok(Claimed {
                    rows,
                    held: None,
                    lost_race: false,
                    position,
                })
            }
            // Mark the first candidates with the token. The outer condition is checked again
            // after waiting for another claimer's row lock, so a row is never taken twice; a
            // claimer that lost every row to others gets none and tries again. The candidates are
            // locked in id order, as a settle locks its rows: a candidate that turned out taken
            // stays locked until this statement ends, and two statements that lock in different
            // orders deadlock.
            Strategy::Token => {
                let set = claim_set(m, &mut b, a.token, a.lease);
                let pick = candidates(m, &mut b, id, batch, a.expired);
                let outer = claimable(m, &mut b);
                let sql = format!(
                    "UPDATE {t} AS t SET {set} FROM (SELECT {id} AS rowclaim_id FROM {t} \
                     WHERE {id} IN (SELECT {id} FROM ({pick}) AS c) ORDER BY {id} FOR UPDATE) AS l \
                     WHERE t.{id} = l.rowclaim_id AND {outer}{filter} RETURNING {row}"
                );
                let rows = json_rows(b.scalar(sql)?.fetch_all(&self.pool).await?);
                let lost_race = rows.is_empty() && self.claimable_exists(m).await?;
                Ok(Claimed {
                    rows,
                    held: None,
                    position: None,
                    lost_race,
                })
            }
            // Read candidates without locks; the update wins only the rows still claimable.
            Strategy::Optimistic => {
                let pick = candidates(
                    m,
                    &mut b,
                    &format!("{id}::text AS rowclaim_id"),
                    batch,
                    a.expired,
                );
                let sql = format!("SELECT rowclaim_id FROM ({pick}) AS c");
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
                let any = ids(&mut b, &list);
                let cond = claimable(m, &mut b);
                let sql = format!(
                    "UPDATE {t} AS t SET {set} WHERE {id} = ANY({any}) AND {cond}{filter} \
                     RETURNING {row}"
                );
                let rows = json_rows(b.scalar(sql)?.fetch_all(&self.pool).await?);
                Ok(Claimed {
                    lost_race: rows.is_empty(),
                    rows,
                    held: None,
                    position: None,
                })
            }
            // Candidates are rows without a live lease; inserting the lease key is the claim (an
            // expired lease is taken over in the same statement), then the rows are marked.
            Strategy::LeaseTable => {
                let st = &m.status;
                let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
                let source = b.bind(m.source_key.clone());
                let limit = b.bind(batch);
                let sql = format!(
                    "SELECT t.{id}::text AS rowclaim_id FROM {t} AS t WHERE ({st} = {ready} OR {st} = {claimed}){filter} \
                     AND NOT EXISTS (SELECT 1 FROM rowclaim_leases l WHERE l.source = {source} \
                     AND l.row_id = t.{id}::text AND l.lease_until >= now()) \
                     ORDER BY {order} LIMIT {limit}"
                );
                let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
                if found.is_empty() {
                    return Ok(Claimed {
                        rows: vec![],
                        held: None,
                        position: None,
                        lost_race: false,
                    });
                }
                // One transaction: win the lease keys (taking over expired ones), mark the rows,
                // and drop leases won on rows that were finished meanwhile.
                let mut tx = self.pool.begin().await?;
                let mut b = B::new();
                let source = b.bind(m.source_key.clone());
                let token = b.bind(a.token.to_owned());
                let until = lease_until(&mut b, a.lease);
                let keys = b.bind(found);
                let sql = format!(
                    "INSERT INTO rowclaim_leases AS l (source, row_id, token, lease_until) \
                     SELECT {source}, k, {token}, {until} FROM unnest({keys}::text[]) AS k \
                     ON CONFLICT (source, row_id) DO UPDATE \
                     SET token = EXCLUDED.token, lease_until = EXCLUDED.lease_until \
                     WHERE l.lease_until < now() RETURNING row_id"
                );
                let won: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
                let mut b = B::new();
                let set = claim_set(m, &mut b, a.token, a.lease);
                let keys = b.bind(won.clone());
                let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
                let key_id = row_id_as_id(m, "k");
                let sql = format!(
                    "UPDATE {t} AS t SET {set} WHERE t.{id} IN (SELECT {key_id} FROM unnest({keys}::text[]) AS k) \
                     AND ({st} = {ready} OR {st} = {claimed}) RETURNING {row}"
                );
                let rows = json_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?);
                if rows.len() < won.len() {
                    sqlx::query(
                        "DELETE FROM rowclaim_leases WHERE source = $1 AND token = $2 \
                         AND row_id = ANY($3) AND row_id <> ALL($4)",
                    )
                    .bind(m.source_key.clone())
                    .bind(a.token.to_owned())
                    .bind(won)
                    .bind(
                        rows.iter()
                            .filter_map(|r| r.get(&m.id_name).map(json_key))
                            .collect::<Vec<_>>(),
                    )
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(Claimed {
                    lost_race: rows.is_empty(),
                    rows,
                    held: None,
                    position: None,
                })
            }
            // Lock the rows in a transaction that stays open; the session's idle timeout is the
            // lease: past it the server ends the session and the rows are free again.
            Strategy::Transaction => {
                let mut tx = self.pool.begin().await?;
                sqlx::query("SELECT set_config('idle_in_transaction_session_timeout', $1, true)")
                    .bind(lease_ms(a.lease).to_string())
                    .execute(&mut *tx)
                    .await?;
                let ready = status_literal(&m.ready);
                let limit = b.bind(batch);
                let sql = format!(
                    "SELECT {row} FROM {t} AS t WHERE {} = {ready}{filter} \
                     ORDER BY {order} LIMIT {limit} FOR UPDATE SKIP LOCKED",
                    m.status
                );
                let rows = json_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?);
                let held = if rows.is_empty() {
                    tx.rollback().await?;
                    None
                } else {
                    Some(Held::Postgres(tx))
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
        let t = &m.table;
        let mut b = B::new();
        if strategy != Strategy::LeaseTable {
            let set = (!outcome.deletes(m))
                .then(|| super::outcome_set(m, &mut b, &outcome, "now()", lease_until));
            let cond = held_by(m, &mut b, token, &target)?;
            let sql = super::change_sql(m, set.as_deref(), &cond);
            return self.change_all_or_nothing(sql, b, &target).await;
        }
        // The lease table says who holds a row: drop the token's leases, settle those rows.
        let held = held_leases(&mut b, m, token, &target);
        let set = super::outcome_set(m, &mut b, &outcome, "now()", lease_until);
        let claimed = status_literal(&m.claimed);
        let gone_id = row_id_as_id(m, "gone.row_id");
        let sql = format!(
            "WITH gone AS (DELETE FROM rowclaim_leases WHERE {held} RETURNING row_id) \
             UPDATE {t} AS t SET {set} FROM gone WHERE t.{} = {gone_id} AND t.{} = {claimed}",
            m.id, m.status
        );
        self.change_all_or_nothing(sql, b, &target).await
    }

    /// One statement, whatever is still held: the named ids are joined in from an array, so the
    /// rows are found through their key however many others the token holds.
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
            .then(|| super::outcome_set(m, &mut b, &outcome, "now()", lease_until));
        let cond = held_by(m, &mut b, token, &Target::Ids(list, list.len()))?;
        let sql = format!(
            "{} RETURNING {}::text",
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
        if strategy != Strategy::LeaseTable {
            let le = m.lease.as_deref().unwrap_or_default();
            let set = format!("{le} = {}", lease_until(&mut b, lease));
            let cond = held_by(m, &mut b, token, &target)?;
            let sql = super::change_sql(m, Some(&set), &cond);
            return self.change_all_or_nothing(sql, b, &target).await;
        }
        let until = lease_until(&mut b, lease);
        let held = held_leases(&mut b, m, token, &target);
        let sql = format!("UPDATE rowclaim_leases SET lease_until = {until} WHERE {held}");
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
            let held = held_leases(&mut b, m, token, &target);
            format!("SELECT row_id FROM rowclaim_leases WHERE {held}")
        } else {
            let cond = held_by(m, &mut b, token, &target)?;
            format!("SELECT {}::text FROM {} WHERE {cond}", m.id, m.table)
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
        let Held::Postgres(tx) = held else {
            return Err(Error::InvalidInput(
                "transaction of another database".into(),
            ));
        };
        if matches!(outcome, Outcome::Ready) {
            return Ok(()); // still ready in the table; the lock goes at commit
        }
        let mut b = B::new();
        let st = status_literal(outcome.status(m));
        let any = ids(&mut b, list);
        let sql = format!(
            "UPDATE {} SET {} = {st} WHERE {} = ANY({any})",
            m.table, m.status, m.id
        );
        b.query(sql)?.execute(&mut **tx).await?;
        Ok(())
    }

    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        let Held::Postgres(tx) = held else {
            return Err(Error::InvalidInput(
                "transaction of another database".into(),
            ));
        };
        sqlx::query("SELECT set_config('idle_in_transaction_session_timeout', $1, true)")
            .bind(lease_ms(lease).to_string())
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
        let mut b = B::new();
        let which = match list {
            Some(l) => format!("{} = ANY({})", m.id, ids(&mut b, l)),
            None => "true".to_owned(),
        };
        let limit = limit
            .map(|n| format!(" LIMIT {}", b.bind(i64::from(n))))
            .unwrap_or_default();
        let lock = match mode {
            LockMode::Share => "FOR SHARE",
            LockMode::Update => "FOR UPDATE",
        };
        let wait = match wait {
            LockWait::Wait => "",
            LockWait::NoWait => " NOWAIT",
            LockWait::SkipLocked => " SKIP LOCKED",
        };
        let sql = format!(
            "SELECT to_jsonb(t) FROM {} AS t WHERE {which}{} ORDER BY {}{limit} {lock}{wait}",
            m.table, m.filter, m.order_by
        );
        let mut tx = self.pool.begin().await?;
        let rows: Vec<sqlx::types::Json<serde_json::Value>> =
            b.scalar(sql)?.fetch_all(&mut *tx).await?;
        Ok((Held::Postgres(tx), rows.into_iter().map(|j| j.0).collect()))
    }

    async fn counter_next(&self, name: &str) -> Result<i64> {
        let next = || {
            sqlx::query_scalar(
                "INSERT INTO rowclaim_counters (name, value) VALUES ($1, 1) \
                 ON CONFLICT (name) DO UPDATE SET value = rowclaim_counters.value + 1 \
                 RETURNING value",
            )
            .bind(name.to_owned())
        };
        let first = if self.async_commit {
            // A number handed out must never be handed out again after a crash.
            let mut tx = self.durable().await?;
            let value = next().fetch_one(&mut *tx).await;
            if value.is_ok() {
                tx.commit().await?;
            }
            value
        } else {
            next().fetch_one(&self.pool).await
        };
        match first {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
                // Create the table and take the first number in one durable transaction.
                let mut tx = self.durable().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext('rowclaim_counters'))")
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(CREATE_COUNTERS).execute(&mut *tx).await?;
                let value = next().fetch_one(&mut *tx).await?;
                tx.commit().await?;
                Ok(value)
            }
            other => Ok(other?),
        }
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<Stats> {
        let q = super::stats_queries::<Postgres>(m, strategy, "now()", "text");
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
            let sql = super::backlog_sql(m, claimed, &mut b, "now()");
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
        let sql = super::list_sql(m, &mut b, "to_jsonb(t)", id, status, limit);
        let rows: Vec<sqlx::types::Json<serde_json::Value>> =
            b.scalar(sql)?.fetch_all(&self.pool).await?;
        Ok(rows.into_iter().map(|j| j.0).collect())
    }

    async fn queue_init(&self) -> Result<()> {
        let mut tx = self.durable().await?;
        // Concurrent inits take turns; DDL is transactional here, so a failed step leaves nothing.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('rowclaim_init'))")
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS rowclaim_schema \
             (component text PRIMARY KEY, version integer NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        let version: Option<i32> =
            sqlx::query_scalar("SELECT version FROM rowclaim_schema WHERE component = 'jobs'")
                .fetch_optional(&mut *tx)
                .await?;
        let version = version.unwrap_or(0);
        for (i, steps) in QUEUE_MIGRATIONS.iter().enumerate() {
            let to = i as i32 + 1;
            if to <= version {
                continue;
            }
            for step in *steps {
                sqlx::query(*step).execute(&mut *tx).await?;
            }
            sqlx::query(
                "INSERT INTO rowclaim_schema (component, version) VALUES ('jobs', $1) \
                 ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
            )
            .bind(to)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        let mut tx = self.durable().await?;
        let mut out = Vec::with_capacity(jobs.len());
        // Jobs without a unique key go in bulk, many rows per statement; the others one by one.
        let mut bulk: Vec<JobParts<'_>> = Vec::new();
        for job in jobs {
            let parts = job.parts();
            if parts.unique_key.is_some() {
                out.extend(insert_bulk(&mut tx, std::mem::take(&mut bulk)).await?);
                out.push(enqueue_one(&mut tx, &parts).await?);
            } else {
                bulk.push(parts);
                if bulk.len() >= 5000 {
                    out.extend(insert_bulk(&mut tx, std::mem::take(&mut bulk)).await?);
                }
            }
        }
        out.extend(insert_bulk(&mut tx, bulk).await?);
        super::commit(tx, || super::enqueue_what(jobs.len())).await?;
        Ok(out)
    }

    async fn queue_admin(&self, op: Admin) -> Result<u64> {
        let q = match op {
            Admin::Cancel(id) => sqlx::query(
                "UPDATE rowclaim_jobs SET status = 'cancelled', owner = NULL, lease_until = NULL, \
                 finished_at = now() WHERE id = $1 AND status IN ('ready', 'running')",
            )
            .bind(id),
            Admin::Retry(id) => sqlx::query(
                "UPDATE rowclaim_jobs SET status = 'ready', attempts = 0, run_at = now(), \
                 owner = NULL, lease_until = NULL, finished_at = NULL \
                 WHERE id = $1 AND status IN ('dead', 'cancelled')",
            )
            .bind(id),
            Admin::Prune(age) => sqlx::query(
                "DELETE FROM rowclaim_jobs WHERE status IN ('completed', 'dead', 'cancelled') \
                 AND finished_at < now() - make_interval(secs => $1)",
            )
            .bind(age.as_secs_f64()),
        };
        let mut tx = self.durable().await?;
        let changed = q.execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ok(changed)
    }

    async fn queue_stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        let mut stats = QueueStats::default();
        let queue = queue.map(str::to_owned);
        let rows = sqlx::query(
            "SELECT queue, status, count(*) FROM rowclaim_jobs \
             WHERE ($1::text IS NULL OR queue = $1) GROUP BY 1, 2",
        )
        .bind(queue.clone())
        .fetch_all(&self.pool)
        .await?;
        for r in rows {
            let (q, st, n): (String, String, i64) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            stats.by_queue.entry(q).or_default().insert(st, n as u64);
        }
        let rows = sqlx::query(
            "SELECT queue, extract(epoch FROM now() - min(run_at))::float8 FROM rowclaim_jobs \
             WHERE status = 'ready' AND run_at <= now() AND ($1::text IS NULL OR queue = $1) \
             GROUP BY 1",
        )
        .bind(queue.clone())
        .fetch_all(&self.pool)
        .await?;
        for r in rows {
            stats.oldest_ready_secs.insert(r.try_get(0)?, r.try_get(1)?);
        }
        let rows = sqlx::query(
            "SELECT queue, count(*) FROM rowclaim_jobs WHERE status = 'completed' \
             AND finished_at > now() - interval '1 minute' AND ($1::text IS NULL OR queue = $1) \
             GROUP BY 1",
        )
        .bind(queue)
        .fetch_all(&self.pool)
        .await?;
        for r in rows {
            let n: i64 = r.try_get(1)?;
            stats.completed_last_minute.insert(r.try_get(0)?, n as u64);
        }
        Ok(stats)
    }
}

/// A row id from a row's JSON, as the lease table's text `row_id`.
fn json_key(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The condition "`token` holds the lease" on `rowclaim_leases`, for all its rows or the named ones.
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

/// The managed queue's schema, one list of statements per version. Append, never edit.
const QUEUE_MIGRATIONS: &[&[&str]] = &[&[
    "CREATE TABLE IF NOT EXISTS rowclaim_jobs (
        id bigserial PRIMARY KEY,
        queue text NOT NULL DEFAULT 'default',
        kind text NOT NULL DEFAULT '',
        payload jsonb NOT NULL DEFAULT '{}',
        status text NOT NULL DEFAULT 'ready',
        priority integer NOT NULL DEFAULT 0,
        run_at timestamptz NOT NULL DEFAULT now(),
        attempts integer NOT NULL DEFAULT 0,
        max_attempts integer NOT NULL DEFAULT 25,
        owner text,
        lease_until timestamptz,
        unique_key text,
        last_error text,
        created_at timestamptz NOT NULL DEFAULT now(),
        finished_at timestamptz)",
    // Claims read only ready jobs of a queue in priority order: a partial index stays small
    // however many finished jobs the table keeps.
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
    &["ALTER TABLE rowclaim_jobs ADD COLUMN IF NOT EXISTS timeout_ms bigint"],
];

/// When a job runs: at its absolute time (epoch ms) if it has one, else now + its delay.
const RUN_AT: &str = "COALESCE(to_timestamp({at}::float8 / 1000), now() + make_interval(secs => {delay}::float8 / 1000))";

/// Enqueues one job on a connection (in the caller's transaction when they hold one). A unique key
/// that is pending already returns that job; a partial unique index makes this hold under
/// concurrent enqueues (a second insert waits for the first to commit, then conflicts).
pub(crate) async fn enqueue_one(conn: &mut PgConnection, job: &JobParts<'_>) -> Result<Enqueued> {
    let run_at = RUN_AT.replace("{at}", "$5").replace("{delay}", "$6");
    let insert = format!(
        "INSERT INTO rowclaim_jobs \
         (queue, kind, payload, priority, run_at, max_attempts, unique_key, timeout_ms) \
         VALUES ($1, $2, $3::jsonb, $4, {run_at}, $7, $8, $9) \
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
            notify(conn, job.queue).await?;
            return Ok(Enqueued {
                id,
                existing: false,
            });
        }
        let existing: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM rowclaim_jobs WHERE unique_key = $1 AND status IN ('ready', 'running')",
        )
        .bind(job.unique_key.map(str::to_owned))
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(id) = existing {
            return Ok(Enqueued { id, existing: true });
        }
        // The pending job finished between the two statements: try the insert again.
    }
    Err(Error::InvalidInput(format!(
        "unique key {:?} keeps changing hands; try again",
        job.unique_key.unwrap_or_default()
    )))
}

/// Inserts jobs without unique keys in one statement (arrays unnested into rows).
async fn insert_bulk(conn: &mut PgConnection, jobs: Vec<JobParts<'_>>) -> Result<Vec<Enqueued>> {
    if jobs.is_empty() {
        return Ok(vec![]);
    }
    let run_at = RUN_AT.replace("{at}", "j.at").replace("{delay}", "j.delay");
    let sql = format!(
        "INSERT INTO rowclaim_jobs (queue, kind, payload, priority, run_at, max_attempts, timeout_ms) \
         SELECT j.queue, j.kind, j.payload::jsonb, j.priority, {run_at}, j.max_attempts, j.timeout_ms \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int8[], $6::int8[], $7::int4[], \
         $8::int8[]) AS j(queue, kind, payload, priority, at, delay, max_attempts, timeout_ms) \
         RETURNING id"
    );
    let mut queues: Vec<&str> = jobs.iter().map(|j| j.queue).collect();
    let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(jobs.iter().map(|j| j.queue.to_owned()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.kind.to_owned()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.payload.clone()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.run_at_ms).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.delay_ms).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.max_attempts).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.timeout_ms).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await?;
    queues.sort_unstable();
    queues.dedup();
    for q in queues {
        notify(conn, q).await?;
    }
    Ok(ids
        .into_iter()
        .map(|id| Enqueued {
            id,
            existing: false,
        })
        .collect())
}

/// Wakes listening workers of `queue` when the enqueueing transaction commits.
async fn notify(conn: &mut PgConnection, queue: &str) -> Result<()> {
    sqlx::query("SELECT pg_notify('rowclaim_jobs', $1)") // crate::queue::CHANNEL
        .bind(queue.to_owned())
        .execute(conn)
        .await?;
    Ok(())
}
