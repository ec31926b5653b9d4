//! PostgreSQL: all of rowclaim's SQL for PostgreSQL.
//!
//! Leases are `timestamptz` computed from `now()`; rows come back as `to_jsonb(t)`; id lists are
//! bound as one array (`= ANY($n)`), so every statement's text is stable and prepared once.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Row};

use super::{
    lease_ms, Binder, ClaimArgs, Claimed, ColType, Column, Driver, Held, Outcome, ServerInfo,
    ServerKind, Target,
};
use crate::source::{Mapping, TableName};
use crate::value::{IdList, Kind};
use crate::{Error, LockMode, LockWait, Result, RowId, Stats, Strategy};

type B = Binder<Postgres>;

#[derive(Clone, Debug)]
pub(crate) struct Pg {
    pool: PgPool,
}

impl Pg {
    pub(crate) fn new(pool: PgPool) -> Pg {
        Pg { pool }
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

/// Rows a claim may take: ready, or claimed with an expired lease.
fn claimable(m: &Mapping, b: &mut B) -> String {
    let st = &m.status;
    let ready = b.value(&m.ready);
    // A scheduled row is ready once its run-at has come.
    let due = m
        .run_at
        .as_ref()
        .map(|r| format!(" AND {r} <= now()"))
        .unwrap_or_default();
    let mut cond = match &m.lease {
        Some(le) => format!(
            "(({st} = {ready}{due}) OR ({st} = {} AND {le} < now()))",
            b.value(&m.claimed)
        ),
        None => format!("({st} = {ready}{due})"),
    };
    cond.push_str(&super::queue_condition(m, b));
    cond
}

/// The SET list that marks rows claimed by `token`.
fn claim_set(m: &Mapping, b: &mut B, token: &str, lease: Duration) -> String {
    let mut set = vec![format!("{} = {}", m.status, b.value(&m.claimed))];
    if let Some(ow) = &m.owner {
        set.push(format!("{ow} = {}", b.bind(token.to_owned())));
    }
    if let Some(le) = &m.lease {
        set.push(format!("{le} = {}", lease_until(b, lease)));
    }
    if let Some(at) = &m.attempts {
        set.push(format!("{at} = COALESCE({at}, 0) + 1"));
    }
    set.join(", ")
}

/// The condition "`token` holds this row" for strategies that mark rows in the table itself.
fn held_by(m: &Mapping, b: &mut B, token: &str, target: &Target<'_>) -> Result<String> {
    let mut cond = format!("{} = {}", m.status, b.value(&m.claimed));
    match &m.owner {
        Some(ow) => cond.push_str(&format!(" AND {ow} = {}", b.bind(token.to_owned()))),
        None if matches!(target, Target::All) => return Err(super::no_owner(m)),
        None => {}
    }
    if let Target::Ids(list, _) = target {
        cond.push_str(&format!(" AND {} = ANY({})", m.id, ids(b, list)));
    }
    Ok(cond)
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

fn only_one(target: &Target<'_>) -> bool {
    matches!(target, Target::Ids(_, 1))
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
    /// changed (all or nothing).
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
            "SELECT EXISTS (SELECT 1 FROM {} WHERE {}{})",
            m.table,
            claimable(m, &mut b),
            m.filter
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
        for sql in [CREATE_LEASES, CREATE_LEASES_TOKEN] {
            if let Err(e) = sqlx::query(sql).execute(&self.pool).await {
                // Two processes creating it at once: one of them gets a duplicate-key error on
                // the catalog, and the table is there all the same.
                let exists: bool =
                    sqlx::query_scalar("SELECT to_regclass('rowclaim_leases_token') IS NOT NULL")
                        .fetch_one(&self.pool)
                        .await?;
                if !exists {
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed> {
        let (m, t, id, order, filter) = (a.m, &a.m.table, &a.m.id, &a.m.order_by, &a.m.filter);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let json_rows = |rows: Vec<sqlx::types::Json<serde_json::Value>>| {
            rows.into_iter().map(|j| j.0).collect::<Vec<_>>()
        };
        match a.strategy {
            // One statement: lock the first unlocked candidates, mark them ours, return them.
            Strategy::SkipLocked => {
                let cond = claimable(m, &mut b);
                let limit = b.bind(batch);
                let set = claim_set(m, &mut b, a.token, a.lease);
                let sql = format!(
                    "WITH c AS (SELECT {id} FROM {t} WHERE {cond}{filter} ORDER BY {order} \
                     LIMIT {limit} FOR UPDATE SKIP LOCKED) \
                     UPDATE {t} AS t SET {set} FROM c WHERE t.{id} = c.{id} RETURNING to_jsonb(t)"
                );
                let rows = b.scalar(sql)?.fetch_all(&self.pool).await?;
                Ok(Claimed {
                    rows: json_rows(rows),
                    held: None,
                    lost_race: false,
                })
            }
            // Mark the first candidates with the token. The outer condition is checked again
            // after waiting for another claimer's row lock, so a row is never taken twice; a
            // claimer that lost every row to others gets none and tries again.
            Strategy::Token => {
                let set = claim_set(m, &mut b, a.token, a.lease);
                let inner = claimable(m, &mut b);
                let limit = b.bind(batch);
                let outer = claimable(m, &mut b);
                let sql = format!(
                    "UPDATE {t} AS t SET {set} WHERE t.{id} IN (SELECT {id} FROM {t} \
                     WHERE {inner}{filter} ORDER BY {order} LIMIT {limit}) AND {outer}{filter} \
                     RETURNING to_jsonb(t)"
                );
                let rows = json_rows(b.scalar(sql)?.fetch_all(&self.pool).await?);
                let lost_race = rows.is_empty() && self.claimable_exists(m).await?;
                Ok(Claimed {
                    rows,
                    held: None,
                    lost_race,
                })
            }
            // Read candidates without locks; the update wins only the rows still claimable.
            Strategy::Optimistic => {
                let cond = claimable(m, &mut b);
                let limit = b.bind(batch);
                let sql = format!(
                    "SELECT {id}::text AS rowclaim_id FROM {t} WHERE {cond}{filter} \
                     ORDER BY {order} LIMIT {limit}"
                );
                let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
                if found.is_empty() {
                    return Ok(Claimed {
                        rows: vec![],
                        held: None,
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
                     RETURNING to_jsonb(t)"
                );
                let rows = json_rows(b.scalar(sql)?.fetch_all(&self.pool).await?);
                Ok(Claimed {
                    lost_race: rows.is_empty(),
                    rows,
                    held: None,
                })
            }
            // Candidates are rows without a live lease; inserting the lease key is the claim (an
            // expired lease is taken over in the same statement), then the rows are marked.
            Strategy::LeaseTable => {
                let st = &m.status;
                let (ready, claimed) = (b.value(&m.ready), b.value(&m.claimed));
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
                let (ready, claimed) = (b.value(&m.ready), b.value(&m.claimed));
                let key_id = row_id_as_id(m, "k");
                let sql = format!(
                    "UPDATE {t} AS t SET {set} WHERE t.{id} IN (SELECT {key_id} FROM unnest({keys}::text[]) AS k) \
                     AND ({st} = {ready} OR {st} = {claimed}) RETURNING to_jsonb(t)"
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
                let ready = b.value(&m.ready);
                let limit = b.bind(batch);
                let sql = format!(
                    "SELECT to_jsonb(t) FROM {t} AS t WHERE {} = {ready}{filter} \
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
        let sql = if strategy == Strategy::LeaseTable {
            let source = b.bind(m.source_key.clone());
            let tok = b.bind(token.to_owned());
            let only = match &target {
                Target::All => String::new(),
                Target::Ids(list, _) => {
                    format!(" AND row_id = ANY({}::text[])", text_ids(&mut b, list))
                }
            };
            let set = super::outcome_set(m, &mut b, &outcome, "now()", lease_until);
            let claimed = b.value(&m.claimed);
            let gone_id = row_id_as_id(m, "gone.row_id");
            format!(
                "WITH gone AS (DELETE FROM rowclaim_leases WHERE source = {source} AND token = {tok}{only} \
                 RETURNING row_id) UPDATE {t} AS t SET {set} FROM gone WHERE t.{} = {gone_id} \
                 AND t.{} = {claimed}",
                m.id, m.status
            )
        } else {
            let set = super::outcome_set(m, &mut b, &outcome, "now()", lease_until);
            let cond = held_by(m, &mut b, token, &target)?;
            format!("UPDATE {t} SET {set} WHERE {cond}")
        };
        if only_one(&target) {
            return Ok(b.query(sql)?.execute(&self.pool).await?.rows_affected());
        }
        self.change_all_or_nothing(sql, b, &target).await
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
                Target::Ids(list, _) => {
                    format!(" AND row_id = ANY({}::text[])", text_ids(&mut b, list))
                }
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
        let target = Target::Ids(list, 0);
        let sql = if strategy == Strategy::LeaseTable {
            let source = b.bind(m.source_key.clone());
            let tok = b.bind(token.to_owned());
            let keys = text_ids(&mut b, list);
            format!(
                "SELECT row_id FROM rowclaim_leases WHERE source = {source} AND token = {tok} \
                 AND row_id = ANY({keys}::text[])"
            )
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
        let st = b.value(outcome.status(m));
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
        match next().fetch_one(&self.pool).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
                if let Err(e) = sqlx::query(CREATE_COUNTERS).execute(&self.pool).await {
                    tracing::debug!(error = %e, "creating rowclaim_counters raced");
                }
                Ok(next().fetch_one(&self.pool).await?)
            }
            other => Ok(other?),
        }
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<Stats> {
        let (t, st, filter) = (&m.table, &m.status, &m.filter);
        let mut stats = Stats::default();
        let sql = format!("SELECT {st}::text, count(*) FROM {t} WHERE true{filter} GROUP BY 1");
        for r in sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?
        {
            let status: Option<String> = r.try_get(0)?;
            let n: i64 = r.try_get(1)?;
            stats
                .by_status
                .insert(status.unwrap_or_else(|| "(null)".into()), n as u64);
        }
        let mut b = B::new();
        let owners = if strategy == Strategy::LeaseTable {
            let s = b.bind(m.source_key.clone());
            format!(
                "SELECT token, count(*) FROM rowclaim_leases WHERE source = {s} \
                 AND lease_until >= now() GROUP BY 1"
            )
        } else {
            let owner = m.owner.as_deref().unwrap_or("NULL");
            let c = b.value(&m.claimed);
            format!("SELECT {owner}::text, count(*) FROM {t} WHERE {st} = {c}{filter} GROUP BY 1")
        };
        for r in b.query(owners)?.fetch_all(&self.pool).await? {
            let owner: Option<String> = r.try_get(0)?;
            let n: i64 = r.try_get(1)?;
            stats
                .claimed_by_owner
                .insert(owner.unwrap_or_else(|| "(no owner)".into()), n as u64);
        }
        let mut b = B::new();
        let expired = if strategy == Strategy::LeaseTable {
            let s = b.bind(m.source_key.clone());
            Some(format!(
                "SELECT count(*) FROM rowclaim_leases WHERE source = {s} AND lease_until < now()"
            ))
        } else {
            m.lease.as_ref().map(|le| {
                let c = b.value(&m.claimed);
                format!("SELECT count(*) FROM {t} WHERE {st} = {c} AND {le} < now(){filter}")
            })
        };
        if let Some(sql) = expired {
            let n: i64 = b.scalar(sql)?.fetch_one(&self.pool).await?;
            stats.expired_leases = n as u64;
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

/// Ids as a text array, to match the lease table's `row_id`.
fn text_ids(b: &mut B, list: &IdList) -> String {
    match list {
        IdList::Int(v) => b.bind(v.iter().map(ToString::to_string).collect::<Vec<_>>()),
        IdList::Text(v) => b.bind(v.clone()),
    }
}
