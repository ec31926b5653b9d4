//! The managed queue's SQL on SQLite: its schema, enqueue, admin, stats and records. Every
//! statement goes through the driver's [`Run`]; times are epoch milliseconds here.

use sqlx::Sqlite;

use super::counts::Counting;
use super::incoming::{pieces, Piece};
use super::migrate::{migrate, Component, Schema};
use super::record::{records_sql, RecordRow};
use super::store::{admin_stmt, insert_unless_pending};
use super::{
    Admin, Enqueued, Incoming, JobFilter, JobParts, JobRecord, Listener, NewJob, QueueStats,
    QueueStore,
};
use crate::backend::run::{Col, Finish, InTx, OnConn, Run, Transact};
use crate::backend::sql::{self, Binder, Stmt};
use crate::backend::sqlite::{Lite, Sql, NOW};
use crate::error::Result;

type B = Binder<Sql>;

#[async_trait::async_trait]
impl QueueStore for Lite {
    /// No LISTEN here: workers poll.
    async fn listen(&self) -> Result<Option<Listener>> {
        Ok(None)
    }

    async fn wake(&self, _queue: &str) -> Result<()> {
        Ok(())
    }

    async fn init(&self) -> Result<()> {
        for component in Component::ALL {
            // The write lock makes concurrent inits take turns; DDL is transactional here.
            let tx = self.transaction(true).await?;
            migrate(&tx, component).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    async fn enqueue(&self, jobs: &mut Incoming<'_>, _ids: bool) -> Result<Vec<Enqueued>> {
        let tx = self.transaction(true).await?;
        let mut out = Vec::new();
        while let Some((_, chunk)) = jobs.next().await? {
            insert_jobs(&tx, chunk, &mut out).await?;
        }
        super::after::hold(&tx, jobs.handed(), &out).await?;
        let n = jobs.count();
        tx.commit_as(|| super::job::enqueue_what(n)).await?;
        Ok(out)
    }

    async fn admin(&self, op: Admin) -> Result<u64> {
        self.execute(admin_stmt(op, |b: &mut B, age| {
            format!("{NOW} - {}", b.bind(sql::lease_ms(age)))
        }))
        .await
    }

    async fn stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        super::counts::stats(self, &COUNTING, queue).await
    }

    async fn records(&self, filter: &JobFilter, id: Option<i64>) -> Result<Vec<JobRecord>> {
        // Times are epoch milliseconds here already.
        let columns = "id, queue, kind, payload, status, priority, attempts, max_attempts, \
                       run_at, created_at, finished_at, lease_until, owner, unique_key, \
                       last_error, timeout_ms, output, limit_key, attempted_at, errors";
        let mut b = B::new();
        let sql = records_sql(&mut b, columns, filter, id);
        let rows: Vec<RecordRow> = self.fetch_all(Stmt::new(sql, b)).await?;
        Ok(rows.into_iter().map(JobRecord::from_row).collect())
    }
}

super::store::enqueue_one_by!(
    InTx<'_, Lite, Sqlite>,
    OnConn<'_, Sqlite>,
    #[cfg(test)]
    super::script::Step<'_, Sql>,
);

impl Schema for Sql {
    const SCHEMA_TABLE: &'static str = "CREATE TABLE IF NOT EXISTS rowclaim_schema \
         (component TEXT PRIMARY KEY, version INTEGER NOT NULL)";
    const JOBS: &'static [&'static [&'static str]] = QUEUE_MIGRATIONS;
    const SCHEDULES: &'static [&'static [&'static str]] = SCHEDULE_MIGRATIONS;
    const ENQUEUE: &'static [&'static [&'static str]] = super::enqueue_sql::SQLITE;

    fn set_version(_: &mut B, _: i32) -> String {
        "ON CONFLICT (component) DO UPDATE SET version = excluded.version".to_owned()
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
    // v4: what a completed job produced; per-queue settings (paused since when, epoch ms).
    &[
        "ALTER TABLE rowclaim_jobs ADD COLUMN output TEXT",
        "CREATE TABLE IF NOT EXISTS rowclaim_queues (name TEXT PRIMARY KEY, paused_at INTEGER)",
    ],
    // v5: limits (see `limits/`): a job's limit key and when its latest attempt started; a
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
    // v6: a job's failed attempts, each with its error and times (the last 20; see
    // `outcome_set`), as JSON text.
    &["ALTER TABLE rowclaim_jobs ADD COLUMN errors TEXT"],
    // v7: jobs that wait for other jobs (`after.rs`): what each waits for, and whether it runs
    // anyway when one of those ends dead or cancelled. A waiting job's status is 'waiting',
    // which no claim reads.
    &[
        "CREATE TABLE IF NOT EXISTS rowclaim_waits (job INTEGER NOT NULL, \
         waits_for INTEGER NOT NULL, PRIMARY KEY (job, waits_for)) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS rowclaim_waits_for ON rowclaim_waits (waits_for)",
        "ALTER TABLE rowclaim_jobs ADD COLUMN if_failed TEXT",
        "CREATE INDEX IF NOT EXISTS rowclaim_jobs_waiting ON rowclaim_jobs (id) \
         WHERE status = 'waiting'",
    ],
    // v8: dead and cancelled jobs by queue, so that stats count them per queue without
    // reading the other finished jobs (`counts/`). A completion writes no entry here.
    &["CREATE INDEX IF NOT EXISTS rowclaim_jobs_failed ON rowclaim_jobs (status, queue) \
       WHERE status IN ('dead', 'cancelled')"],
];

/// The schedules' schema, one list of statements per version. Append, never edit.
const SCHEDULE_MIGRATIONS: &[&[&str]] = &[&["CREATE TABLE IF NOT EXISTS rowclaim_schedules (
        name TEXT PRIMARY KEY,
        queue TEXT NOT NULL,
        kind TEXT NOT NULL,
        expression TEXT NOT NULL,
        zone TEXT,
        catch_up TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        next_tick INTEGER NOT NULL,
        last_tick INTEGER,
        last_job INTEGER,
        updated_at INTEGER NOT NULL)"]];

/// Enqueues one job on a connection (in the caller's transaction when they hold one). A unique
/// key that is pending already returns that job.
pub(crate) async fn enqueue_one<R: Run<Sql = Sql>>(r: &R, job: &JobParts<'_>) -> Result<Enqueued> {
    insert_unless_pending(r, job, insert_one).await
}

/// Jobs in one multi-row INSERT: 10 values each, well under SQLite's 32,766 bound values.
const BULK_ROWS: usize = 1_000;

/// The columns an enqueue writes.
const INSERT_INTO: &str = "INSERT INTO rowclaim_jobs \
     (queue, kind, payload, priority, run_at, max_attempts, unique_key, timeout_ms, limit_key, \
     created_at) VALUES ";

/// One job's row of values in an enqueue's INSERT.
fn job_values(b: &mut B, job: &JobParts<'_>) -> String {
    let (queue, kind) = (b.bind(job.queue.to_owned()), b.bind(job.kind.to_owned()));
    let (payload, priority) = (b.bind(job.payload.clone()), b.bind(job.priority));
    let (at, delay) = (b.bind(job.run_at_ms), b.bind(job.delay_ms));
    format!(
        "({queue}, {kind}, json({payload}), {priority}, COALESCE({at}, {NOW} + {delay}), {}, {}, \
         {}, {}, {NOW})",
        b.bind(job.max_attempts),
        b.bind(job.unique_key.map(str::to_owned)),
        b.bind(job.timeout_ms),
        b.bind(job.limit_key.map(str::to_owned)),
    )
}

/// Inserts one job unless its unique key is pending; returns its id if it was inserted.
pub(crate) fn insert_one(job: &JobParts<'_>) -> Stmt<Sql> {
    let mut b = B::new();
    let values = job_values(&mut b, job);
    let sql = format!(
        "{INSERT_INTO}{values} \
         ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('ready', 'running') \
         DO NOTHING RETURNING id"
    );
    Stmt::new(sql, b)
}

/// Inserts `jobs` (one chunk of an enqueue) piece by piece ([`pieces`]; each statement is a
/// round trip to the database's thread), their ids to `out` in order.
async fn insert_jobs<R: Run<Sql = Sql>>(
    r: &R,
    jobs: &[NewJob],
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    out.reserve(jobs.len());
    for piece in pieces(jobs.iter().map(NewJob::parts), BULK_ROWS, usize::MAX) {
        match piece {
            Piece::Keyed(job) => out.push(enqueue_one(r, &job).await?),
            Piece::Bulk(bulk) => insert_bulk(r, &bulk, out).await?,
        }
    }
    Ok(())
}

/// Inserts `run` (jobs without a unique key) in one statement; their ids go to `out` in the
/// order of `run`. The write transaction is this process's alone and a new row's
/// id is the largest so far plus one, so the ids ascend in the order of the VALUES; RETURNING
/// promises no order, hence the sort.
async fn insert_bulk<R: Run<Sql = Sql>>(
    r: &R,
    run: &[JobParts<'_>],
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    let mut b = B::new();
    let rows: Vec<String> = run.iter().map(|job| job_values(&mut b, job)).collect();
    let sql = format!("{INSERT_INTO}{} RETURNING id", rows.join(", "));
    let mut ids: Vec<i64> = r
        .values(Stmt::new(sql, b), &[Col::Int])
        .await?
        .into_iter()
        .filter_map(|row| row.into_iter().next().and_then(|v| v.int()))
        .collect();
    if ids.len() != run.len() {
        return Err(crate::error::Error::Internal(format!(
            "an enqueue of {} jobs returned {} ids",
            run.len(),
            ids.len()
        )));
    }
    ids.sort_unstable();
    out.extend(ids.into_iter().map(|id| Enqueued {
        id,
        existing: false,
    }));
    Ok(())
}

/// How stats count here: ready jobs through the ready index, dead and cancelled through theirs
/// (v8), each by queue; SQLite keeps no statistics to estimate from, so above the cap a figure
/// is the cap, a lower bound.
const COUNTING: Counting = Counting {
    per_queue: &["ready", "dead", "cancelled"],
    estimate: None,
    recursive_scan: true,
};
