//! The managed queue's store on SQLite: its tables and migrations, enqueue, admin, stats.

use super::record::{records_sql, scheduled_sql, RecordRow, Scheduled};
use super::{
    Admin, Enqueued, JobFilter, JobParts, JobRecord, Listener, NewJob, QueueStats, QueueStore,
    StatsRow,
};
use crate::backend::sql::{self};
use crate::backend::sqlite::*;

use crate::{Error, Result};

impl QueueStore for Lite {
    /// No LISTEN here: workers poll.
    async fn listen(&self) -> Result<Option<Listener>> {
        Ok(None)
    }

    async fn wake(&self, _queue: &str) -> Result<()> {
        Ok(())
    }

    async fn init(&self) -> Result<()> {
        migrate(self, "jobs", QUEUE_MIGRATIONS).await
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        // One writer at a time: inserting row by row inside one write transaction is as fast as
        // a multi-row statement here, and keeps unique keys simple.
        let mut tx = self.write().await?;
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            out.push(enqueue_one(&mut tx, &job.parts()).await?);
        }
        crate::backend::commit(
            tx,
            || super::job::enqueue_what(jobs.len()),
            crate::backend::sqlite::sorted,
        )
        .await?;
        Ok(out)
    }

    async fn admin(&self, op: Admin) -> Result<u64> {
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
            Admin::Delete(id) => (
                "DELETE FROM rowclaim_jobs WHERE id = ? AND status <> 'running'".to_owned(),
                id,
            ),
            Admin::Prune(age) => (
                format!(
                    "DELETE FROM rowclaim_jobs WHERE status IN ('completed', 'dead', 'cancelled') \
                     AND finished_at < {NOW} - ?"
                ),
                sql::lease_ms(age),
            ),
        };
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(arg)
            .execute(&self.pool)
            .await
            .map_err(crate::backend::sqlite::error)?;
        Ok(done.rows_affected())
    }

    async fn stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        // One statement, so that a dashboard or a metrics scrape costs one query.
        let sql = format!(
            "SELECT queue, status, COUNT(*), \
               SUM(status = 'ready' AND run_at <= {NOW}), \
               ({NOW} - MIN(CASE WHEN status = 'ready' AND run_at <= {NOW} THEN run_at END)) \
                 / 1000.0, \
               SUM(status = 'running' AND lease_until < {NOW}), \
               SUM(status = 'completed' AND finished_at > {NOW} - 60000) \
             FROM rowclaim_jobs WHERE ?1 IS NULL OR queue = ?1 GROUP BY 1, 2"
        );
        let rows: Vec<StatsRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(queue.map(str::to_owned))
            .fetch_all(&self.pool)
            .await
            .map_err(crate::backend::sqlite::error)?;
        Ok(QueueStats::from_rows(rows))
    }

    async fn records(&self, filter: &JobFilter, id: Option<i64>) -> Result<Vec<JobRecord>> {
        // Times are epoch milliseconds here already.
        let columns = "id, queue, kind, payload, status, priority, attempts, max_attempts, \
                       run_at, created_at, finished_at, lease_until, owner, unique_key, \
                       last_error, timeout_ms, output, limit_key, attempted_at";
        let mut b = sql::Binder::<Sql>::new();
        let sql = records_sql(&mut b, columns, filter, id);
        let rows: Vec<RecordRow> = b
            .query_as(sql)?
            .fetch_all(&self.pool)
            .await
            .map_err(crate::backend::sqlite::error)?;
        Ok(rows.into_iter().map(JobRecord::from_row).collect())
    }

    async fn scheduled(&self, filter: &JobFilter) -> Result<Scheduled> {
        let mut b = sql::Binder::<Sql>::new();
        let sql = scheduled_sql(&mut b, "MIN(run_at)", filter);
        let (n, first): (i64, Option<i64>) = b
            .query_as(sql)?
            .fetch_one(&self.pool)
            .await
            .map_err(crate::backend::sqlite::error)?;
        Ok(Scheduled::new(n, first))
    }
}

/// The managed queue's schema, one list of statements per version. Append, never edit.
/// Brings `component`'s tables to the last of `migrations` (one list of statements per version),
/// recording the version in `rowclaim_schema`: the managed queue's and the schedules' schemas.
/// The write lock makes concurrent inits take turns; DDL is transactional here.
pub(super) async fn migrate(
    lite: &Lite,
    component: &str,
    migrations: &[&[&'static str]],
) -> Result<()> {
    let mut tx = lite.write().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS rowclaim_schema \
         (component TEXT PRIMARY KEY, version INTEGER NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .map_err(crate::backend::sqlite::error)?;
    let version: Option<i64> =
        sqlx::query_scalar("SELECT version FROM rowclaim_schema WHERE component = ?")
            .bind(component.to_owned())
            .fetch_optional(&mut *tx)
            .await
            .map_err(crate::backend::sqlite::error)?;
    let version = version.unwrap_or(0);
    for (i, steps) in migrations.iter().enumerate() {
        let to = i as i64 + 1;
        if to <= version {
            continue;
        }
        for step in *steps {
            sqlx::query(*step)
                .execute(&mut *tx)
                .await
                .map_err(crate::backend::sqlite::error)?;
        }
        sqlx::query(
            "INSERT INTO rowclaim_schema (component, version) VALUES (?, ?) \
             ON CONFLICT (component) DO UPDATE SET version = excluded.version",
        )
        .bind(component.to_owned())
        .bind(to)
        .execute(&mut *tx)
        .await
        .map_err(crate::backend::sqlite::error)?;
    }
    tx.commit().await.map_err(crate::backend::sqlite::error)?;
    Ok(())
}

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
    // v4: what a completed job produced; per-queue settings (paused since when, epoch ms).
    &[
        "ALTER TABLE rowclaim_jobs ADD COLUMN output TEXT",
        "CREATE TABLE IF NOT EXISTS rowclaim_queues (name TEXT PRIMARY KEY, paused_at INTEGER)",
    ],
    // v5: limits (see `limits.rs`): a job's limit key and when its latest attempt started; a
    // queue's limits, and the turns its limited claims take on its row; the starts a rate
    // limit counts.
    &[
        "ALTER TABLE rowclaim_jobs ADD COLUMN limit_key TEXT",
        "ALTER TABLE rowclaim_jobs ADD COLUMN attempted_at INTEGER",
        "ALTER TABLE rowclaim_queues ADD COLUMN concurrency INTEGER",
        "ALTER TABLE rowclaim_queues ADD COLUMN key_concurrency INTEGER",
        "ALTER TABLE rowclaim_queues ADD COLUMN rate INTEGER",
        "ALTER TABLE rowclaim_queues ADD COLUMN rate_period_ms INTEGER",
        "ALTER TABLE rowclaim_queues ADD COLUMN key_rate INTEGER",
        "ALTER TABLE rowclaim_queues ADD COLUMN key_rate_period_ms INTEGER",
        "ALTER TABLE rowclaim_queues ADD COLUMN claim_turns INTEGER NOT NULL DEFAULT 0",
        "CREATE TABLE IF NOT EXISTS rowclaim_starts \
         (queue TEXT NOT NULL, limit_key TEXT, started_ms INTEGER NOT NULL)",
        "CREATE INDEX IF NOT EXISTS rowclaim_starts_queue ON rowclaim_starts (queue, started_ms)",
        "CREATE INDEX IF NOT EXISTS rowclaim_starts_key \
         ON rowclaim_starts (queue, limit_key, started_ms) WHERE limit_key IS NOT NULL",
        // A keyed job's place in its key's line, read job by job by a limited claim. (Not
        // partial on status: SQLite uses a partial index only for queries that repeat its
        // condition, and `status = 'ready'` does not repeat `status IN (…)`.)
        "CREATE INDEX IF NOT EXISTS rowclaim_jobs_limit ON rowclaim_jobs (queue, limit_key, status, id) \
         WHERE limit_key IS NOT NULL",
    ],
];

/// Enqueues one job on a connection (in the caller's transaction when they hold one). A unique key
/// that is pending already returns that job.
pub(crate) async fn enqueue_one(
    conn: &mut sqlx::SqliteConnection,
    job: &JobParts<'_>,
) -> Result<Enqueued> {
    let insert = format!(
        "INSERT INTO rowclaim_jobs \
         (queue, kind, payload, priority, run_at, max_attempts, unique_key, timeout_ms, limit_key, \
         created_at) VALUES (?, ?, json(?), ?, COALESCE(?, {NOW} + ?), ?, ?, ?, ?, {NOW}) \
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
            .fetch_optional(&mut *conn)
            .await
            .map_err(crate::backend::sqlite::error)?;
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
        .await
        .map_err(crate::backend::sqlite::error)?;
        if let Some(id) = existing {
            return Ok(Enqueued { id, existing: true });
        }
    }
    Err(Error::InvalidInput(format!(
        "unique key {:?} keeps changing hands; try again",
        job.unique_key.unwrap_or_default()
    )))
}
