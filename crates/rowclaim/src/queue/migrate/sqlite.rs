//! SQLite's schema of the managed queue: every version's DDL. DDL is transactional here, so an
//! init's steps and their version's record commit together.

use super::Schema;
use crate::backend::sql::Binder;
use crate::backend::sqlite::Sql;

type B = Binder<Sql>;

impl Schema for Sql {
    const SCHEMA_TABLE: &'static str = "CREATE TABLE IF NOT EXISTS rowclaim_schema \
         (component TEXT PRIMARY KEY, version INTEGER NOT NULL)";
    const JOBS: &'static [&'static [&'static str]] = QUEUE_MIGRATIONS;
    const SCHEDULES: &'static [&'static [&'static str]] = SCHEDULE_MIGRATIONS;
    const ENQUEUE: &'static [&'static [&'static str]] = crate::queue::enqueue_sql::SQLITE;

    fn set_version(_: &mut B, _: i32) -> String {
        "ON CONFLICT (component) DO UPDATE SET version = excluded.version".to_owned()
    }
}

/// The managed queue's schema, one list of statements per version. Append, never edit; a new
/// version is checked by `init_concurrently` (`tests/queue.rs`), which names the latest.
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
