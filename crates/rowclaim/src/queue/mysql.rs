//! The managed queue's store on MySQL/MariaDB: its tables and migrations, enqueue, admin, stats.

use super::record::{records_sql, scheduled_sql, RecordRow, Scheduled};
use super::{
    Admin, Enqueued, JobFilter, JobParts, JobRecord, Listener, NewJob, QueueStats, QueueStore,
    StatsRow,
};
use crate::backend::mysql::*;
use crate::backend::sql::{Binder, Dialect};

use crate::{Error, Result};

type B = Binder<Sql>;

impl QueueStore for My {
    /// No LISTEN here: workers poll.
    async fn listen(&self) -> Result<Option<Listener>> {
        Ok(None)
    }

    async fn wake(&self, _queue: &str) -> Result<()> {
        Ok(())
    }

    async fn init(&self) -> Result<()> {
        // On a Galera cluster the named lock below is one node's only: inits on other nodes run
        // their migrations at the same time, and a write that collides with theirs fails its
        // certification (1213). Every step is idempotent, so the whole init simply runs again.
        crate::backend::retry_transient!(self.init_once(JOBS_COMPONENT, MIGRATIONS).await)
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
        check_packet(&mut tx, &parts).await?;
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
        crate::backend::commit(
            tx,
            || super::job::enqueue_what(parts.len()),
            crate::backend::mysql::sorted,
        )
        .await?;
        Ok(out)
    }

    async fn admin(&self, op: Admin) -> Result<u64> {
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
            Admin::Delete(id) => {
                sqlx::query("DELETE FROM rowclaim_jobs WHERE id = ? AND status <> 'running'")
                    .bind(id)
                    .execute(&self.pool)
                    .await
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
        Ok(done.map_err(crate::backend::mysql::error)?.rows_affected())
    }

    async fn stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        // One statement, so that a dashboard or a metrics scrape costs one query. The wait is
        // in microseconds, so that one under a second is not rounded away.
        let mut b = B::new();
        let only = match queue {
            Some(q) => format!(" AND queue = {}", b.bind(q.to_owned())),
            None => String::new(),
        };
        let sql = format!(
            "SELECT CAST(queue AS CHAR), CAST(status AS CHAR), COUNT(*), \
               CAST(SUM(status = 'ready' AND run_at <= UTC_TIMESTAMP(6)) AS SIGNED), \
               CAST(TIMESTAMPDIFF(MICROSECOND, \
                 MIN(CASE WHEN status = 'ready' AND run_at <= UTC_TIMESTAMP(6) THEN run_at END), \
                 UTC_TIMESTAMP(6)) / 1e6 AS DOUBLE), \
               CAST(SUM(status = 'running' AND lease_until < UTC_TIMESTAMP(6)) AS SIGNED), \
               CAST(SUM(status = 'completed' \
                 AND finished_at >= UTC_TIMESTAMP(6) - INTERVAL 60 SECOND) AS SIGNED) \
             FROM rowclaim_jobs WHERE TRUE{only} GROUP BY queue, status"
        );
        let rows: Vec<StatsRow> = b
            .query_as(sql)?
            .fetch_all(&self.pool)
            .await
            .map_err(crate::backend::mysql::error)?;
        Ok(QueueStats::from_rows(rows))
    }

    async fn records(&self, filter: &JobFilter, id: Option<i64>) -> Result<Vec<JobRecord>> {
        // DATETIME(6) holds UTC here (see `Sql::epoch_ms`). `pending_key` is the unique index's
        // helper column, not the job's: it is not shown.
        let ms = Sql::epoch_ms;
        let text = |c: &str| format!("CAST({c} AS CHAR)");
        let columns = format!(
            "id, {}, {}, {}, {}, CAST(priority AS SIGNED), CAST(attempts AS SIGNED), \
             CAST(max_attempts AS SIGNED), {}, {}, {}, {}, {}, {}, {}, timeout_ms, {}, {}, {}",
            text("queue"),
            text("kind"),
            text("payload"),
            text("status"),
            ms("run_at"),
            ms("created_at"),
            ms("finished_at"),
            ms("lease_until"),
            text("owner"),
            text("unique_key"),
            text("last_error"),
            text("output"),
            text("limit_key"),
            ms("attempted_at"),
        );
        let mut b = B::new();
        let sql = records_sql(&mut b, &columns, filter, id);
        let rows: Vec<RecordRow> = b
            .query_as(sql)?
            .fetch_all(&self.pool)
            .await
            .map_err(crate::backend::mysql::error)?;
        Ok(rows.into_iter().map(JobRecord::from_row).collect())
    }

    async fn scheduled(&self, filter: &JobFilter) -> Result<Scheduled> {
        let mut b = B::new();
        let sql = scheduled_sql(&mut b, &Sql::epoch_ms("MIN(run_at)"), filter);
        let (n, first): (i64, Option<i64>) = b
            .query_as(sql)?
            .fetch_one(&self.pool)
            .await
            .map_err(crate::backend::mysql::error)?;
        Ok(Scheduled::new(n, first))
    }
}

impl My {
    /// One try of an init: `component`'s `migrations` (the managed queue's, the schedules')
    /// under this node's init lock.
    pub(super) async fn init_once(
        &self,
        component: &str,
        migrations: &[&'static str],
    ) -> Result<()> {
        // A named lock belongs to a session, so the lock, the migrations and the release all run
        // on this one connection. Should this future be dropped halfway, or the release fail, the
        // connection is closed instead of going back to the pool still holding the lock: the
        // server frees a session's locks when it ends. (Init is rare; the reconnect is cheap.)
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(crate::backend::mysql::error)?;
        conn.close_on_drop();
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(INIT_LOCK)
            .bind(INIT_LOCK_WAIT_SECS)
            .fetch_one(&mut *conn)
            .await
            .map_err(crate::backend::mysql::error)?;
        if got != Some(1) {
            // 0: another process held it for the whole wait; NULL: the server refused.
            return Err(crate::backend::mysql::error(sqlx::Error::Io(
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "could not take the lock {INIT_LOCK} within {INIT_LOCK_WAIT_SECS} s: \
                     another `rowclaim init` is still running"
                    ),
                ),
            )));
        }
        let migrated = migrate(&mut conn, component, migrations).await;
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
    // v4: what a completed job produced.
    "ALTER TABLE rowclaim_jobs ADD COLUMN IF NOT EXISTS output LONGTEXT NULL",
    // v5: per-queue settings (paused since when).
    "CREATE TABLE IF NOT EXISTS rowclaim_queues (name VARCHAR(255) NOT NULL PRIMARY KEY, \
     paused_at DATETIME(6) NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    // v6–v9: limits (see `limits.rs`): a job's limit key and when its latest attempt started; a
    // queue's limits, and the turns its limited claims take on its row (on Galera, the write
    // that makes two nodes' limited claims of one queue conflict); the starts a rate limit
    // counts (a primary key, as Galera needs).
    "ALTER TABLE rowclaim_jobs ADD COLUMN IF NOT EXISTS limit_key VARCHAR(255) NULL, \
     ADD COLUMN IF NOT EXISTS attempted_at DATETIME(6) NULL",
    "ALTER TABLE rowclaim_queues ADD COLUMN IF NOT EXISTS concurrency BIGINT NULL, \
     ADD COLUMN IF NOT EXISTS key_concurrency BIGINT NULL, ADD COLUMN IF NOT EXISTS rate BIGINT NULL, \
     ADD COLUMN IF NOT EXISTS rate_period_ms BIGINT NULL, \
     ADD COLUMN IF NOT EXISTS key_rate BIGINT NULL, ADD COLUMN IF NOT EXISTS key_rate_period_ms BIGINT NULL, \
     ADD COLUMN IF NOT EXISTS claim_turns BIGINT NOT NULL DEFAULT 0",
    "CREATE TABLE IF NOT EXISTS rowclaim_starts (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
     queue VARCHAR(255) NOT NULL, limit_key VARCHAR(255) NULL, started_ms BIGINT NOT NULL, \
     KEY rowclaim_starts_queue (queue, started_ms), \
     KEY rowclaim_starts_key (queue, limit_key, started_ms)) \
     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    // v9: a keyed job's place in its key's line, read job by job by a limited claim.
    "ALTER TABLE rowclaim_jobs ADD KEY IF NOT EXISTS rowclaim_jobs_limit \
     (queue, limit_key, status, id)",
];

/// Runs the migrations above the recorded version, recording each as it is done. The caller holds
/// the init lock.
async fn migrate(
    conn: &mut sqlx::MySqlConnection,
    component: &str,
    migrations: &[&'static str],
) -> Result<()> {
    sqlx::query(CREATE_SCHEMA)
        .execute(&mut *conn)
        .await
        .map_err(crate::backend::mysql::error)?;
    let version: Option<i32> =
        sqlx::query_scalar("SELECT version FROM rowclaim_schema WHERE component = ?")
            .bind(component.to_owned())
            .fetch_optional(&mut *conn)
            .await
            .map_err(crate::backend::mysql::error)?;
    let version = usize::try_from(version.unwrap_or(0)).unwrap_or(0);
    for (i, sql) in migrations.iter().enumerate().skip(version) {
        sqlx::query(*sql)
            .execute(&mut *conn)
            .await
            .map_err(crate::backend::mysql::error)?;
        let to = i as i64 + 1;
        sqlx::query(
            // Never backwards: a slower init that ran the same migration again must not undo a
            // later one's record.
            "INSERT INTO rowclaim_schema (component, version) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE version = GREATEST(version, ?)",
        )
        .bind(component.to_owned())
        .bind(to)
        .bind(to)
        .execute(&mut *conn)
        .await
        .map_err(crate::backend::mysql::error)?;
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

/// Payloads below this size are sent without asking the server's packet limit (no server's
/// `max_allowed_packet` is smaller: its least is 1 KiB, its defaults 16 or 64 MiB).
const SMALL_PAYLOAD: usize = 1 << 20;

/// Room in a packet for the statement around a payload: its text and the other values.
const STATEMENT_ROOM: usize = 4096;

/// Refuses a payload bigger than one statement may carry to this server, before sending it: the
/// server would answer only "Got a packet bigger than 'max_allowed_packet'" (and, over some
/// proxies, close the connection), naming neither the job nor the limit. Asks the limit only
/// when a payload is large.
async fn check_packet(conn: &mut sqlx::MySqlConnection, jobs: &[JobParts<'_>]) -> Result<()> {
    if jobs.iter().all(|j| j.payload.len() <= SMALL_PAYLOAD) {
        return Ok(());
    }
    let limit: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
        .fetch_one(&mut *conn)
        .await
        .map_err(crate::backend::mysql::error)?;
    let limit = u64::try_from(limit).unwrap_or(0);
    for (i, j) in jobs.iter().enumerate() {
        let bytes = j.payload.len();
        if (bytes + STATEMENT_ROOM) as u64 > limit {
            return Err(Error::PayloadTooLarge {
                job: i + 1,
                bytes,
                limit,
            });
        }
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
             {}, {}, {}, {}, UTC_TIMESTAMP(6))",
            b.bind(j.queue.to_owned()),
            b.bind(j.kind.to_owned()),
            b.bind(j.payload.clone()),
            b.bind(j.priority),
            b.bind(j.run_at_ms),
            b.bind(delay_us),
            b.bind(j.max_attempts),
            b.bind(j.unique_key.map(str::to_owned)),
            b.bind(j.timeout_ms),
            b.bind(j.limit_key.map(str::to_owned)),
        ));
    }
    Ok(format!(
        "INSERT INTO rowclaim_jobs (queue, kind, payload, priority, run_at, max_attempts, \
         unique_key, timeout_ms, limit_key, created_at) VALUES {}",
        rows.join(", ")
    ))
}

/// Inserts jobs in one statement; returns the first one's id.
async fn insert_jobs(conn: &mut sqlx::MySqlConnection, jobs: &[&JobParts<'_>]) -> Result<i64> {
    let mut b = B::new();
    let sql = insert_sql(&mut b, jobs)?;
    let done = b
        .query(sql)?
        .execute(&mut *conn)
        .await
        .map_err(crate::backend::mysql::error)?;
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
                    .await
                    .map_err(crate::backend::mysql::error)?;
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
    check_packet(conn, std::slice::from_ref(job)).await?;
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
            Err(Error::Database(e)) if error_number(e.sqlx()) == Some(DUPLICATE_KEY) => {}
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
        .await
        .map_err(crate::backend::mysql::error)?;
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
