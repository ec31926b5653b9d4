//! The managed queue's store on PostgreSQL: its tables and migrations, enqueue, admin, stats.

use super::record::{records_sql, scheduled_sql, RecordRow, Scheduled};
use super::{
    Admin, Enqueued, JobFilter, JobParts, JobRecord, Listener, NewJob, QueueStats, QueueStore,
    StatsRow,
};
use crate::backend::postgres::*;
use crate::backend::sql::Binder;
use sqlx::PgConnection;

use crate::{Error, Result};

impl Pg {
    /// A connection listening on the enqueue channel: on the pool's server, or on the direct
    /// URL given for it; None through a pooler without one.
    pub(crate) async fn listener(&self) -> Result<Option<sqlx::postgres::PgListener>> {
        let Some(pool) = self.route().listen_pool() else {
            return Ok(None);
        };
        let mut l = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .map_err(crate::backend::postgres::error)?;
        l.listen(super::CHANNEL)
            .await
            .map_err(crate::backend::postgres::error)?;
        Ok(Some(l))
    }
}

impl QueueStore for Pg {
    async fn listen(&self) -> Result<Option<Listener>> {
        match self.listener().await? {
            Some(l) => Ok(Some(Listener::Postgres(l, self.clone()))),
            None => {
                tracing::warn!(
                    "LISTEN cannot pass a transaction-mode pooler (pgbouncer=true): idle \
                     workers poll for new jobs; give a direct URL for wake-ups \
                     (--listen-database)"
                );
                Ok(None)
            }
        }
    }

    async fn wake(&self, queue: &str) -> Result<()> {
        sqlx::query("SELECT pg_notify('rowclaim_jobs', $1)") // crate::queue::CHANNEL
            .bind(queue.to_owned())
            .execute(self.exec())
            .await
            .map_err(crate::backend::postgres::error)?;
        Ok(())
    }

    async fn init(&self) -> Result<()> {
        migrate(self, "jobs", QUEUE_MIGRATIONS).await
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        let mut tx = self.durable().await?;
        let keep = !self.route().pooled();
        let mut out = Vec::with_capacity(jobs.len());
        // Jobs without a unique key go in bulk, many rows per statement; the others one by one.
        let mut bulk: Vec<JobParts<'_>> = Vec::new();
        for job in jobs {
            let parts = job.parts();
            if parts.unique_key.is_some() {
                out.extend(insert_bulk(&mut tx, std::mem::take(&mut bulk), keep).await?);
                out.push(enqueue_one(&mut tx, &parts, keep).await?);
            } else {
                bulk.push(parts);
                if bulk.len() >= 5000 {
                    out.extend(insert_bulk(&mut tx, std::mem::take(&mut bulk), keep).await?);
                }
            }
        }
        out.extend(insert_bulk(&mut tx, bulk, keep).await?);
        crate::backend::commit(
            tx,
            || super::job::enqueue_what(jobs.len()),
            crate::backend::postgres::sorted,
        )
        .await?;
        Ok(out)
    }

    async fn admin(&self, op: Admin) -> Result<u64> {
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
            Admin::Delete(id) => {
                sqlx::query("DELETE FROM rowclaim_jobs WHERE id = $1 AND status <> 'running'")
                    .bind(id)
            }
            Admin::Prune(age) => sqlx::query(
                "DELETE FROM rowclaim_jobs WHERE status IN ('completed', 'dead', 'cancelled') \
                 AND finished_at < now() - make_interval(secs => $1)",
            )
            .bind(age.as_secs_f64()),
        };
        let mut tx = self.durable().await?;
        let changed = q
            .execute(self.on(&mut tx))
            .await
            .map_err(crate::backend::postgres::error)?
            .rows_affected();
        tx.commit().await.map_err(crate::backend::postgres::error)?;
        Ok(changed)
    }

    async fn stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        // One statement, so that a dashboard or a metrics scrape costs one query.
        let rows: Vec<StatsRow> = sqlx::query_as(
            "SELECT queue, status, count(*)::int8, \
               count(*) FILTER (WHERE status = 'ready' AND run_at <= now())::int8, \
               extract(epoch FROM now() - min(run_at) \
                 FILTER (WHERE status = 'ready' AND run_at <= now()))::float8, \
               count(*) FILTER (WHERE status = 'running' AND lease_until < now())::int8, \
               count(*) FILTER (WHERE status = 'completed' \
                 AND finished_at > now() - interval '1 minute')::int8 \
             FROM rowclaim_jobs WHERE ($1::text IS NULL OR queue = $1) GROUP BY 1, 2",
        )
        .bind(queue)
        .fetch_all(self.exec())
        .await
        .map_err(crate::backend::postgres::error)?;
        Ok(QueueStats::from_rows(rows))
    }

    async fn records(&self, filter: &JobFilter, id: Option<i64>) -> Result<Vec<JobRecord>> {
        // Epoch milliseconds, whatever the session's time zone.
        let ms = |c: &str| format!("floor(extract(epoch FROM {c}) * 1000)::int8");
        let columns = format!(
            "id, queue, kind, payload::text, status, priority::int8, attempts::int8, \
             max_attempts::int8, {}, {}, {}, {}, owner, unique_key, last_error, timeout_ms, \
             output::text, limit_key, {}",
            ms("run_at"),
            ms("created_at"),
            ms("finished_at"),
            ms("lease_until"),
            ms("attempted_at")
        );
        let mut b = Binder::<Sql>::new();
        let sql = records_sql(&mut b, &columns, filter, id);
        let rows: Vec<RecordRow> = b
            .query_as(sql)?
            .fetch_all(self.exec())
            .await
            .map_err(crate::backend::postgres::error)?;
        Ok(rows.into_iter().map(JobRecord::from_row).collect())
    }

    async fn scheduled(&self, filter: &JobFilter) -> Result<Scheduled> {
        let mut b = Binder::<Sql>::new();
        let first = "floor(extract(epoch FROM min(run_at)) * 1000)::int8";
        let sql = scheduled_sql(&mut b, first, filter);
        let (n, first): (i64, Option<i64>) = b
            .query_as(sql)?
            .fetch_one(self.exec())
            .await
            .map_err(crate::backend::postgres::error)?;
        Ok(Scheduled::new(n, first))
    }
}

/// Brings `component`'s tables to the last of `migrations` (one list of statements per version),
/// recording the version in `rowclaim_schema`: the managed queue's and the schedules' schemas.
/// Concurrent inits take turns on one lock; DDL is transactional here, so a failed step leaves
/// nothing.
pub(super) async fn migrate(
    pg: &Pg,
    component: &str,
    migrations: &[&[&'static str]],
) -> Result<()> {
    let mut tx = pg.durable().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('rowclaim_init'))")
        .execute(pg.on(&mut tx))
        .await
        .map_err(crate::backend::postgres::error)?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS rowclaim_schema \
         (component text PRIMARY KEY, version integer NOT NULL)",
    )
    .execute(pg.on(&mut tx))
    .await
    .map_err(crate::backend::postgres::error)?;
    let version: Option<i32> =
        sqlx::query_scalar("SELECT version FROM rowclaim_schema WHERE component = $1")
            .bind(component.to_owned())
            .fetch_optional(pg.on(&mut tx))
            .await
            .map_err(crate::backend::postgres::error)?;
    let version = version.unwrap_or(0);
    for (i, steps) in migrations.iter().enumerate() {
        let to = i as i32 + 1;
        if to <= version {
            continue;
        }
        for step in *steps {
            sqlx::query(*step)
                .execute(pg.on(&mut tx))
                .await
                .map_err(crate::backend::postgres::error)?;
        }
        sqlx::query(
            "INSERT INTO rowclaim_schema (component, version) VALUES ($1, $2) \
             ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
        )
        .bind(component.to_owned())
        .bind(to)
        .execute(pg.on(&mut tx))
        .await
        .map_err(crate::backend::postgres::error)?;
    }
    tx.commit().await.map_err(crate::backend::postgres::error)?;
    Ok(())
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
    // v4: what a completed job produced; per-queue settings (paused since when).
    &[
        "ALTER TABLE rowclaim_jobs ADD COLUMN IF NOT EXISTS output jsonb",
        "CREATE TABLE IF NOT EXISTS rowclaim_queues (name text PRIMARY KEY, paused_at timestamptz)",
    ],
    // v5: limits (see `limits.rs`): a job's limit key and when its latest attempt started; a
    // queue's limits, and the turns its limited claims take on its row; the starts a rate
    // limit counts.
    &[
        "ALTER TABLE rowclaim_jobs ADD COLUMN IF NOT EXISTS limit_key text, \
         ADD COLUMN IF NOT EXISTS attempted_at timestamptz",
        "ALTER TABLE rowclaim_queues ADD COLUMN IF NOT EXISTS concurrency bigint, \
         ADD COLUMN IF NOT EXISTS key_concurrency bigint, ADD COLUMN IF NOT EXISTS rate bigint, \
         ADD COLUMN IF NOT EXISTS rate_period_ms bigint, ADD COLUMN IF NOT EXISTS key_rate bigint, \
         ADD COLUMN IF NOT EXISTS key_rate_period_ms bigint, \
         ADD COLUMN IF NOT EXISTS claim_turns bigint NOT NULL DEFAULT 0",
        "CREATE TABLE IF NOT EXISTS rowclaim_starts \
         (queue text NOT NULL, limit_key text, started_ms bigint NOT NULL)",
        "CREATE INDEX IF NOT EXISTS rowclaim_starts_queue ON rowclaim_starts (queue, started_ms)",
        "CREATE INDEX IF NOT EXISTS rowclaim_starts_key \
         ON rowclaim_starts (queue, limit_key, started_ms) WHERE limit_key IS NOT NULL",
        // A keyed job's place in its key's line, read job by job by a limited claim.
        "CREATE INDEX IF NOT EXISTS rowclaim_jobs_limit ON rowclaim_jobs (queue, limit_key, status, id) \
         WHERE limit_key IS NOT NULL AND status IN ('ready', 'running')",
    ],
];

/// When a job runs: at its absolute time (epoch ms) if it has one, else now + its delay.
const RUN_AT: &str = "COALESCE(to_timestamp({at}::float8 / 1000), now() + make_interval(secs => {delay}::float8 / 1000))";

/// Enqueues one job on a connection (in the caller's transaction when they hold one). A unique key
/// that is pending already returns that job; a partial unique index makes this hold under
/// concurrent enqueues (a second insert waits for the first to commit, then conflicts).
/// `keep`: let sqlx keep the statements prepared (not behind a transaction-mode pooler).
pub(crate) async fn enqueue_one(
    conn: &mut PgConnection,
    job: &JobParts<'_>,
    keep: bool,
) -> Result<Enqueued> {
    let run_at = RUN_AT.replace("{at}", "$5").replace("{delay}", "$6");
    let insert = format!(
        "INSERT INTO rowclaim_jobs \
         (queue, kind, payload, priority, run_at, max_attempts, unique_key, timeout_ms, limit_key) \
         VALUES ($1, $2, $3::jsonb, $4, {run_at}, $7, $8, $9, $10) \
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
            .bind(job.limit_key.map(str::to_owned))
            .persistent(keep)
            .fetch_optional(&mut *conn)
            .await
            .map_err(crate::backend::postgres::error)?;
        if let Some(id) = id {
            notify(conn, job.queue, keep).await?;
            return Ok(Enqueued {
                id,
                existing: false,
            });
        }
        let existing: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM rowclaim_jobs WHERE unique_key = $1 AND status IN ('ready', 'running')",
        )
        .bind(job.unique_key.map(str::to_owned))
        .persistent(keep)
        .fetch_optional(&mut *conn)
        .await
        .map_err(crate::backend::postgres::error)?;
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
async fn insert_bulk(
    conn: &mut PgConnection,
    jobs: Vec<JobParts<'_>>,
    keep: bool,
) -> Result<Vec<Enqueued>> {
    if jobs.is_empty() {
        return Ok(vec![]);
    }
    let run_at = RUN_AT.replace("{at}", "j.at").replace("{delay}", "j.delay");
    let sql = format!(
        "INSERT INTO rowclaim_jobs \
         (queue, kind, payload, priority, run_at, max_attempts, timeout_ms, limit_key) \
         SELECT j.queue, j.kind, j.payload::jsonb, j.priority, {run_at}, j.max_attempts, j.timeout_ms, \
         j.limit_key \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::int8[], $6::int8[], $7::int4[], \
         $8::int8[], $9::text[]) \
         AS j(queue, kind, payload, priority, at, delay, max_attempts, timeout_ms, limit_key) \
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
        .bind(
            jobs.iter()
                .map(|j| j.limit_key.map(str::to_owned))
                .collect::<Vec<_>>(),
        )
        .persistent(keep)
        .fetch_all(&mut *conn)
        .await
        .map_err(crate::backend::postgres::error)?;
    queues.sort_unstable();
    queues.dedup();
    for q in queues {
        notify(conn, q, keep).await?;
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
async fn notify(conn: &mut PgConnection, queue: &str, keep: bool) -> Result<()> {
    sqlx::query("SELECT pg_notify('rowclaim_jobs', $1)") // crate::queue::CHANNEL
        .bind(queue.to_owned())
        .persistent(keep)
        .execute(conn)
        .await
        .map_err(crate::backend::postgres::error)?;
    Ok(())
}
