//! PostgreSQL's schema of the managed queue: every version's DDL. DDL is transactional here,
//! so an init's steps and their version's record commit together.

use super::Schema;
use crate::backend::postgres::Sql;
use crate::backend::sql::Binder;

type B = Binder<Sql>;

impl Schema for Sql {
    const SCHEMA_TABLE: &'static str = "CREATE TABLE IF NOT EXISTS rowclaim_schema \
         (component text PRIMARY KEY, version integer NOT NULL)";
    const JOBS: &'static [&'static [&'static str]] = QUEUE_MIGRATIONS;
    const SCHEDULES: &'static [&'static [&'static str]] = SCHEDULE_MIGRATIONS;
    const ENQUEUE: &'static [&'static [&'static str]] = crate::queue::enqueue_sql::POSTGRES;
    /// No JIT compilation for a limited claim's statements: their plans' estimates (a walk of
    /// the keys, which the planner guesses at 100, each reading a run) pass `jit_above_cost`,
    /// and compiling took 5 ms of a claim that runs in 2 (10 keys, runs of 125: 390 functions
    /// in 56 claims, 289 ms). For this transaction only; a server without the setting (before
    /// PostgreSQL 11) is left alone rather than refused.
    const LIMITED_CLAIM_SETUP: Option<&'static str> = Some(
        "SELECT set_config('jit', 'off', true) WHERE current_setting('jit', true) IS NOT NULL",
    );

    fn set_version(_: &mut B, _: i32) -> String {
        "ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version".to_owned()
    }

    /// A row comparison over the limit index's `(status, id)`, which only that index can read.
    /// Written `o.id < j.id`, PostgreSQL walked the primary key from its start instead once it
    /// knew the keys were few: it expected a job of the key within a few rows, but the first
    /// ids were long finished (a claim of 10 keys, 20,000 jobs, 2,000 completed: 240 ms, 438,000
    /// buffers; as a row comparison 7 ms).
    fn ahead_in_line(status: &str) -> String {
        format!("(o.{}, o.id) < ({status}, j.id)", Self::LINE_STATUS)
    }
}

/// The managed queue's schema, one list of statements per version. Append, never edit; a new
/// version is checked by `init_concurrently` (`tests/queue.rs`), which names the latest.
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
    // v5: limits (see `limits/`): a job's limit key and when its latest attempt started; a
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
    // v6: a job's failed attempts, each with its error and times (the last 20; see
    // `outcome_set`).
    &["ALTER TABLE rowclaim_jobs ADD COLUMN IF NOT EXISTS errors jsonb"],
    // v7: jobs that wait for other jobs (`after.rs`): what each waits for, and whether it runs
    // anyway when one of those ends dead or cancelled. A waiting job's status is 'waiting',
    // which no claim reads.
    &[
        "CREATE TABLE IF NOT EXISTS rowclaim_waits \
         (job bigint NOT NULL, waits_for bigint NOT NULL, PRIMARY KEY (job, waits_for))",
        "CREATE INDEX IF NOT EXISTS rowclaim_waits_for ON rowclaim_waits (waits_for)",
        "ALTER TABLE rowclaim_jobs ADD COLUMN IF NOT EXISTS if_failed text",
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
        name text PRIMARY KEY,
        queue text NOT NULL,
        kind text NOT NULL,
        expression text NOT NULL,
        zone text,
        catch_up text NOT NULL,
        fingerprint text NOT NULL,
        next_tick timestamptz NOT NULL,
        last_tick timestamptz,
        last_job bigint,
        updated_at timestamptz NOT NULL DEFAULT now())"]];
