//! MySQL's and MariaDB's schema of the managed queue: every version's DDL. DDL commits at
//! once here: a step may run again, and must pass when it does (see [`MIGRATIONS`]).

use super::Schema;
use crate::backend::mysql::{error_number, Sql};
use crate::backend::sql::Binder;
use crate::error::Error;

type B = Binder<Sql>;

impl Schema for Sql {
    const SCHEMA_TABLE: &'static str = "CREATE TABLE IF NOT EXISTS rowclaim_schema (
    component VARCHAR(64) PRIMARY KEY,
    version INT NOT NULL
)";
    const JOBS: &'static [&'static [&'static str]] = MIGRATIONS;
    const SCHEDULES: &'static [&'static [&'static str]] = SCHEDULE_MIGRATIONS;
    const ENQUEUE: &'static [&'static [&'static str]] = crate::queue::enqueue_sql::MYSQL;
    const LINE_STATUS: &'static str = "limit_status";

    /// Never backwards: a slower init that ran the same migration again must not undo a later
    /// one's record (inits on two Galera nodes run at once).
    fn set_version(b: &mut B, to: i32) -> String {
        format!(
            "ON DUPLICATE KEY UPDATE version = GREATEST(version, {})",
            b.bind(to)
        )
    }

    /// A step of a migration that ran before (see [`MIGRATIONS`]), or, for a routine, that
    /// another node's init created between this one's `DROP … IF EXISTS` and its `CREATE` (the
    /// same version's routine): the one error that says so for that kind of step.
    fn made_already(step: &str, e: &Error) -> bool {
        let Error::Database(d) = e else {
            return false;
        };
        error_number(d.sqlx()).is_some_and(|n| made_already_by(step) == Some(n))
    }
}

/// The error that says `step`'s change is there already: 1060 a column of that name exists
/// (`ADD COLUMN`), 1061 a key of that name exists (`ADD KEY`), 1091 the key to drop is not there
/// (a `DROP KEY` alone), 1304 a routine of that name exists (`CREATE PROCEDURE`). None for any
/// other step: a key dropped and added again in one `ALTER` (v2, v16) fails with 1091 only when
/// the key was never made, which is not "made already".
fn made_already_by(step: &str) -> Option<u16> {
    let words: Vec<&str> = step.split_whitespace().take(5).collect();
    match words.as_slice() {
        ["ALTER", "TABLE", _, "ADD", "COLUMN"] => Some(1060),
        ["ALTER", "TABLE", _, "ADD", "KEY"] => Some(1061),
        ["ALTER", "TABLE", _, "DROP", "KEY"] if !drops_and_adds_again(step) => Some(1091),
        ["CREATE", "PROCEDURE", ..] => Some(1304),
        _ => None,
    }
}

/// Whether `step` drops a key and adds it again in one `ALTER` (v2, v16): run again, it makes
/// the same key once more, so it needs no "made already" error.
fn drops_and_adds_again(step: &str) -> bool {
    let words: Vec<&str> = step.split_whitespace().take(5).collect();
    matches!(words.as_slice(), ["ALTER", "TABLE", _, "DROP", "KEY"]) && step.contains(',')
}

/// The managed queue's migrations: version `i + 1` is entry `i`.
/// MySQL commits DDL at once, so each statement must be safe to run again (after a crash between
/// it and the version update, or beside another Galera node's init). MySQL 8 has no `IF [NOT]
/// EXISTS` for columns and keys (MariaDB has): each `ALTER` makes one change, and the error that
/// says it is made already ([`made_already_by`]) counts as done.
///
/// A new version is checked by two tests that name the latest version: `init_concurrently`
/// (`tests/queue.rs`) and the Galera test (`rowclaim-cli/tests/galera.rs`).
///
/// v1: the jobs table. MySQL has no partial indexes: the stored generated `pending_key` holds the
/// unique key only while the job is ready or running, and NULLs do not collide in a unique index,
/// so a key is unique among pending jobs only. Times are UTC.
const MIGRATIONS: &[&[&str]] = &[&["CREATE TABLE IF NOT EXISTS rowclaim_jobs (
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
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"],
    // v2: the claim index in the claim's own order (priority DESC, run_at, id), so a claim reads
    // the first rows of its queue and stops, instead of sorting every ready job of the queue.
    // (MariaDB before 10.8 reads DESC and builds the index ascending, so there a claim still sorts.)
    &["ALTER TABLE rowclaim_jobs DROP KEY rowclaim_jobs_claim, \
     ADD KEY rowclaim_jobs_claim (status, queue, priority DESC, run_at, id)"],
    // v3: a job's own time limit (NULL: the worker's).
    &["ALTER TABLE rowclaim_jobs ADD COLUMN timeout_ms BIGINT NULL"],
    // v4: what a completed job produced.
    &["ALTER TABLE rowclaim_jobs ADD COLUMN output LONGTEXT NULL"],
    // v5: per-queue settings (paused since when).
    &["CREATE TABLE IF NOT EXISTS rowclaim_queues (name VARCHAR(255) NOT NULL PRIMARY KEY, \
     paused_at DATETIME(6) NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"],
    // v6–v9: limits (see `limits/`): a job's limit key and when its latest attempt started; a
    // queue's limits, and the turns its limited claims take on its row (on Galera, the write
    // that makes two nodes' limited claims of one queue conflict); the starts a rate limit
    // counts (a primary key, as Galera needs).
    &[
        "ALTER TABLE rowclaim_jobs ADD COLUMN limit_key VARCHAR(255) NULL",
        "ALTER TABLE rowclaim_jobs ADD COLUMN attempted_at DATETIME(6) NULL",
    ],
    &[
        "ALTER TABLE rowclaim_queues ADD COLUMN concurrency BIGINT NULL",
        "ALTER TABLE rowclaim_queues ADD COLUMN key_concurrency BIGINT NULL",
        "ALTER TABLE rowclaim_queues ADD COLUMN rate BIGINT NULL",
        "ALTER TABLE rowclaim_queues ADD COLUMN rate_period_ms BIGINT NULL",
        "ALTER TABLE rowclaim_queues ADD COLUMN key_rate BIGINT NULL",
        "ALTER TABLE rowclaim_queues ADD COLUMN key_rate_period_ms BIGINT NULL",
        "ALTER TABLE rowclaim_queues ADD COLUMN claim_turns BIGINT NOT NULL DEFAULT 0",
    ],
    &["CREATE TABLE IF NOT EXISTS rowclaim_starts (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
     queue VARCHAR(255) NOT NULL, limit_key VARCHAR(255) NULL, started_ms BIGINT NOT NULL, \
     KEY rowclaim_starts_queue (queue, started_ms), \
     KEY rowclaim_starts_key (queue, limit_key, started_ms)) \
     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"],
    // v9: a keyed job's place in its key's line, read job by job by a limited claim.
    &["ALTER TABLE rowclaim_jobs ADD KEY rowclaim_jobs_limit (queue, limit_key, status, id)"],
    // v10: a job's failed attempts, each with its error and times (the last 20; see
    // `outcome_set`), as JSON text.
    &["ALTER TABLE rowclaim_jobs ADD COLUMN errors LONGTEXT NULL"],
    // v11, v12: jobs that wait for other jobs (`after.rs`): what each waits for, and whether it
    // runs anyway when one of those ends dead or cancelled. A waiting job's status is
    // 'waiting', which no claim reads (the claim index, led by status, finds waiting jobs too).
    &["CREATE TABLE IF NOT EXISTS rowclaim_waits (job BIGINT NOT NULL, waits_for BIGINT NOT NULL, \
     PRIMARY KEY (job, waits_for), KEY rowclaim_waits_for (waits_for)) \
     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"],
    &["ALTER TABLE rowclaim_jobs ADD COLUMN if_failed VARCHAR(16) NULL"],
    // v13: the finished index by finish time alone. Led by status, it took an entry out and
    // put one in at every change of status, a claim's among them; InnoDB leaves an index alone
    // when none of its columns change, and a claim leaves finished_at NULL. A prune reads it
    // as a range of times and checks the status of each row; stats read finished jobs by
    // status through the claim index, which status leads. (The new index first: the old one
    // serves until it is built.)
    &[
        "ALTER TABLE rowclaim_jobs ADD KEY rowclaim_jobs_finished_at (finished_at)",
        "ALTER TABLE rowclaim_jobs DROP KEY rowclaim_jobs_finished",
    ],
    // v14: the limit index by a status of keyed jobs only (`Schema::LINE_STATUS`). Over
    // `status`, every job's claim and settle moved its entry, a job without a key's too (MySQL
    // has no partial index); `limit_status` stays NULL for those, and InnoDB leaves an index
    // alone when none of its columns change.
    &[
        "ALTER TABLE rowclaim_jobs ADD COLUMN limit_status VARCHAR(16) \
         AS (CASE WHEN limit_key IS NOT NULL THEN status END) VIRTUAL",
        "ALTER TABLE rowclaim_jobs ADD KEY rowclaim_jobs_line (queue, limit_key, limit_status, id)",
        "ALTER TABLE rowclaim_jobs DROP KEY rowclaim_jobs_limit",
    ],
    // v15: no owner index. A claim sets `owner`, so each claim put an entry in it (and kept
    // jobs kept theirs). Every look-up by token also asks for status 'running', which leads the
    // claim index: it reads the running jobs only (as on PostgreSQL and SQLite since their v2).
    &["ALTER TABLE rowclaim_jobs DROP KEY rowclaim_jobs_owner"],
    // v16: the claim index holds the lease too. A claim's look for expired leases reads every
    // running job of its queues (no partial index here); with the lease in the index it reads
    // the index alone, without locks, and locks only the expired jobs it found (`skip_locked`'s
    // expired arm). A claim and a settle move the entry anyway (they change `status`); only a
    // lease extension moves it now too.
    &["ALTER TABLE rowclaim_jobs DROP KEY rowclaim_jobs_claim, \
     ADD KEY rowclaim_jobs_claim (status, queue, priority DESC, run_at, id, lease_until)"],
];

/// The schedules' migrations: version `i + 1` is entry `i`. MySQL
/// commits DDL at once, so each must be safe to run again.
const SCHEDULE_MIGRATIONS: &[&[&str]] = &[&["CREATE TABLE IF NOT EXISTS rowclaim_schedules (
    name VARCHAR(100) NOT NULL PRIMARY KEY,
    queue VARCHAR(255) NOT NULL,
    kind VARCHAR(255) NOT NULL,
    expression VARCHAR(255) NOT NULL,
    zone VARCHAR(64) NULL,
    catch_up VARCHAR(16) NOT NULL,
    fingerprint VARCHAR(32) NOT NULL,
    next_tick DATETIME(6) NOT NULL,
    last_tick DATETIME(6) NULL,
    last_job BIGINT NULL,
    updated_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"]];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every step of every component, in order.
    fn all_steps() -> impl Iterator<Item = &'static str> {
        [
            MIGRATIONS,
            SCHEDULE_MIGRATIONS,
            crate::queue::enqueue_sql::MYSQL,
        ]
        .into_iter()
        .flatten()
        .flat_map(|steps| steps.iter().copied())
    }

    /// MySQL 8 has no `IF [NOT] EXISTS` for a column or a key, and a step that ran before is
    /// known by its error alone ([`made_already_by`]): so each `ALTER` makes one change (its
    /// clauses split at the commas outside parentheses), or drops a key and adds it again
    /// (which runs twice as it is). No step uses what only MariaDB has (`IF [NOT] EXISTS` but
    /// for tables and routines, `OR REPLACE`, `RETURNING`).
    #[test]
    fn steps_are_mysql_8s_and_alters_make_one_change_each() {
        let allowed = ["CREATE TABLE IF NOT EXISTS ", "DROP PROCEDURE IF EXISTS "];
        let mut alters = 0;
        for step in all_steps() {
            let head = step.split('(').next().unwrap_or(step);
            assert!(
                !head.contains(" IF ") || allowed.iter().any(|a| head.starts_with(a)),
                "MySQL 8 refuses it: {step}"
            );
            assert!(
                !step.contains("OR REPLACE") && !step.contains("RETURNING"),
                "{step}"
            );
            if !step.starts_with("ALTER TABLE") {
                continue;
            }
            alters += 1;
            assert!(!step.contains(" IF "), "MySQL 8 refuses it: {step}");
            let (mut depth, mut clauses) = (0, vec![String::new()]);
            for c in step.chars() {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    ',' if depth == 0 => {
                        clauses.push(String::new());
                        continue;
                    }
                    _ => {}
                }
                if let Some(clause) = clauses.last_mut() {
                    clause.push(c);
                }
            }
            let words: Vec<&str> = clauses[0].split_whitespace().collect();
            let again = match (words.as_slice(), clauses.get(1)) {
                (["ALTER", "TABLE", _, "DROP", "KEY", key], Some(add)) => {
                    clauses.len() == 2 && add.trim().starts_with(&format!("ADD KEY {key} "))
                }
                _ => false,
            };
            assert!(clauses.len() == 1 || again, "more than one change: {step}");
        }
        assert!(alters > 10, "{alters} ALTERs");
    }

    /// Each step that changes the jobs table has the one error that says its change is there
    /// already, but v2 and v16, a key dropped and added again, whose 1091 would say the key was
    /// never made (a table `init` did not make): that fails the init as it should.
    #[test]
    fn made_already_fits_the_step() {
        for again in [MIGRATIONS[1][0], MIGRATIONS[15][0]] {
            assert!(again.contains("DROP KEY rowclaim_jobs_claim, ADD KEY rowclaim_jobs_claim"));
            assert!(drops_and_adds_again(again), "{again}");
            assert_eq!(made_already_by(again), None, "{again}");
        }
        let by = |text: &str| {
            let step = all_steps().find(|s| s.contains(text));
            made_already_by(step.unwrap_or_else(|| panic!("no step has {text:?}")))
        };
        assert_eq!(by("ADD COLUMN timeout_ms"), Some(1060));
        assert_eq!(by("ADD COLUMN limit_status"), Some(1060));
        assert_eq!(by("ADD KEY rowclaim_jobs_line"), Some(1061));
        assert_eq!(by("DROP KEY rowclaim_jobs_owner"), Some(1091));
        assert_eq!(by("CREATE TABLE IF NOT EXISTS rowclaim_waits"), None);
        assert_eq!(by("CREATE PROCEDURE rowclaim_enqueue"), Some(1304));
        for step in MIGRATIONS.iter().flat_map(|v| v.iter()) {
            let creates = step.starts_with("CREATE TABLE IF NOT EXISTS");
            assert!(
                creates || drops_and_adds_again(step) || made_already_by(step).is_some(),
                "{step}"
            );
        }
    }
}
