//! The managed queue's SQL on MySQL/MariaDB (its schema: `migrate/mysql.rs`): enqueue (multi-row
//! inserts), admin, stats and records. Every statement goes through the driver's [`Run`], but for
//! the two things only MySQL has: an insert's first id (`last_insert_id`, [`InsertId`]) and the
//! named lock concurrent inits take turns on, which belongs to one connection (`My::init_once`).

use futures_util::future::join;
use sqlx::MySql;

use super::counts::{Counting, Estimate};
use super::incoming::{pieces, Piece};
use super::migrate::{migrate, Component};
use super::record::{records_sql, RecordRow};
use super::store::{admin_stmt, first_int, UNIQUE_TRIES};
use super::{
    Admin, Enqueued, Incoming, JobFilter, JobParts, JobRecord, Listener, NewJob, QueueStats,
    QueueStore,
};
use crate::backend::mysql::{error_number, lease_us, My, Sql, NOW};
use crate::backend::run::{Finish, InTx, OnConn, Run, Transact};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::{Error, Result};

type B = Binder<Sql>;

#[async_trait::async_trait]
impl QueueStore for My {
    /// No LISTEN here: workers poll.
    async fn listen(&self) -> Result<Option<Listener>> {
        Ok(None)
    }

    async fn wake(&self, _queue: &str) -> Result<()> {
        Ok(())
    }

    async fn init(&self) -> Result<()> {
        for component in Component::ALL {
            // On a Galera cluster the named lock is one node's only: inits on other nodes run
            // their migrations at the same time, and a write that collides with theirs fails
            // its certification (1213). Every step is idempotent, so the whole init runs again.
            crate::backend::retry_transient!(self.init_once(component).await)?;
        }
        Ok(())
    }

    async fn enqueue(&self, jobs: &mut Incoming<'_>, _ids: bool) -> Result<Vec<Enqueued>> {
        let tx = self.transaction(true).await?;
        let mut out = Vec::new();
        let mut step = None;
        while let Some((before, chunk)) = jobs.next().await? {
            insert_jobs(&tx, chunk, before, &mut step, &mut out).await?;
        }
        super::after::hold(&tx, jobs.handed(), &out).await?;
        let n = jobs.count();
        tx.commit_as(|| super::job::enqueue_what(n)).await?;
        Ok(out)
    }

    async fn admin(&self, op: Admin) -> Result<u64> {
        let done = self
            .execute(admin_stmt(op, |b: &mut B, age| {
                // Capped: an older cut-off would prune nothing more, and `DATETIME` arithmetic
                // past its years gives NULL or an error.
                let us = b.bind(lease_us(age).min(MAX_SPAN_US));
                format!("{NOW} - INTERVAL {us} MICROSECOND")
            }))
            .await;
        // Ready again, the job's unique key counts as pending: it collides when another job
        // with that key was enqueued meanwhile and is pending still.
        if let (Admin::Retry(id), Err(Error::Database(e))) = (op, &done) {
            if error_number(e.sqlx()) == Some(DUPLICATE_KEY) {
                return Err(Error::InvalidInput(format!(
                    "job {id} cannot run again while another job with its unique key is ready \
                     or running"
                )));
            }
        }
        done
    }

    async fn stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        super::counts::stats_in_one(self, &COUNTING, queue).await
    }

    async fn records(&self, filter: &JobFilter, id: Option<i64>) -> Result<Vec<JobRecord>> {
        // DATETIME(6) holds UTC here (see `Sql::epoch_ms`). `pending_key` is the unique index's
        // helper column, not the job's: it is not shown.
        let ms = Sql::epoch_ms;
        let text = |c: &str| format!("CAST({c} AS CHAR)");
        let columns = format!(
            "id, {}, {}, {}, {}, CAST(priority AS SIGNED), CAST(attempts AS SIGNED), \
             CAST(max_attempts AS SIGNED), {}, {}, {}, {}, {}, {}, {}, timeout_ms, {}, {}, {}, {}",
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
            text("errors"),
        );
        let mut b = B::new();
        let sql = records_sql(&mut b, &columns, filter, id);
        let rows: Vec<RecordRow> = self.fetch_all(Stmt::new(sql, b)).await?;
        Ok(rows.into_iter().map(JobRecord::from_row).collect())
    }
}

impl My {
    /// One try of an init of `component`, under this node's init lock.
    async fn init_once(&self, component: Component) -> Result<()> {
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
        let on = OnConn::<MySql>::new(&mut *conn, true);
        let mut b = B::new();
        let sql = format!(
            "SELECT GET_LOCK({}, {})",
            b.bind(INIT_LOCK.to_owned()),
            b.bind(INIT_LOCK_WAIT_SECS)
        );
        if first_int(&on, Stmt::new(sql, b)).await? != Some(1) {
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
        let migrated = migrate(&on, component).await;
        let mut b = B::new();
        let release = format!("SELECT RELEASE_LOCK({})", b.bind(INIT_LOCK.to_owned()));
        if let Err(e) = on.execute(Stmt::new(release, b)).await {
            // Closing the connection (on drop, above) releases it all the same.
            tracing::debug!(error = %e, "releasing {INIT_LOCK} failed");
        }
        migrated
    }
}

/// A runner on one connection that says which id an insert gave its first row: MySQL tells it
/// with the statement's result (`last_insert_id`), which [`Run::execute`] does not carry (the
/// other databases say `RETURNING id`). The statement goes to the transaction's or the caller's
/// connection itself.
pub(crate) trait InsertId: Run<Sql = Sql> {
    /// Runs an `INSERT`; returns the id of its first row.
    async fn insert_id(&self, s: Stmt<Sql>) -> Result<i64>;
}

impl InsertId for InTx<'_, My, MySql> {
    async fn insert_id(&self, s: Stmt<Sql>) -> Result<i64> {
        let q = s.binder.query(s.sql)?;
        let mut tx = self.tx.lock().await;
        id_of(
            q.execute(&mut **tx)
                .await
                .map_err(crate::backend::mysql::error)?
                .last_insert_id(),
        )
    }
}

impl InsertId for OnConn<'_, MySql> {
    async fn insert_id(&self, s: Stmt<Sql>) -> Result<i64> {
        let q = s.binder.query(s.sql)?;
        let mut conn = self.conn.lock().await;
        id_of(
            q.persistent(self.keep)
                .execute(&mut **conn)
                .await
                .map_err(crate::backend::mysql::error)?
                .last_insert_id(),
        )
    }
}

fn id_of(id: u64) -> Result<i64> {
    i64::try_from(id).map_err(|_| Error::InvalidInput("job id is out of range".into()))
}

super::store::enqueue_one_by!(
    InTx<'_, My, MySql>,
    OnConn<'_, MySql>,
    #[cfg(test)]
    super::script::Step<'_, Sql>,
);

/// The stand-in database of the snapshots gives every insert the id 1.
#[cfg(test)]
impl InsertId for super::script::Step<'_, Sql> {
    async fn insert_id(&self, s: Stmt<Sql>) -> Result<i64> {
        self.0.keep(s);
        Ok(1)
    }
}

/// The named lock `rowclaim init` runs under. Named locks are server-wide, so inits of different
/// databases on one server take turns too; they are short.
const INIT_LOCK: &str = "rowclaim_init";

const INIT_LOCK_WAIT_SECS: i64 = 60;

/// 1062: duplicate entry for a unique key.
const DUPLICATE_KEY: u16 = 1062;

/// Rows per multi-row INSERT: 500 rows of 9 values stay far below the 65,535 placeholders of one
/// statement.
const BULK_ROWS: usize = 500;

/// Payload bytes per multi-row INSERT, well below the smallest default `max_allowed_packet`
/// (16 MiB on MariaDB, 64 MiB on MySQL 8), which a statement with its values must fit in.
const BULK_BYTES: usize = 4 << 20;

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
/// `before`: the jobs of the same call before these (a job is named by its place in the call).
async fn check_packet<R: Run<Sql = Sql>>(
    r: &R,
    jobs: &[JobParts<'_>],
    before: usize,
) -> Result<()> {
    if jobs.iter().all(|j| j.payload.len() <= SMALL_PAYLOAD) {
        return Ok(());
    }
    let sql = "SELECT CAST(@@max_allowed_packet AS SIGNED)";
    let limit = r.count(Stmt::new(sql.to_owned(), B::new())).await?;
    let limit = u64::try_from(limit).unwrap_or(0);
    for (i, j) in jobs.iter().enumerate() {
        let bytes = j.payload.len();
        if (bytes + STATEMENT_ROOM) as u64 > limit {
            return Err(Error::PayloadTooLarge {
                job: before + i + 1,
                bytes,
                limit,
            });
        }
    }
    Ok(())
}

/// Inserts `jobs` (one chunk of an enqueue, after `before` others) piece by piece
/// ([`pieces`]), their ids to `out` in order. `step`: the server's id increment, once asked.
/// Each piece's statement is built while the server runs the one before.
async fn insert_jobs<R: InsertId>(
    r: &R,
    jobs: &[NewJob],
    before: usize,
    step: &mut Option<i64>,
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    let parts: Vec<JobParts<'_>> = jobs.iter().map(NewJob::parts).collect();
    for p in &parts {
        check_times(p)?;
    }
    check_packet(r, &parts, before).await?;
    out.reserve(parts.len());
    let mut pieces = pieces(parts, BULK_ROWS, BULK_BYTES);
    let mut built = None;
    loop {
        // `join` polls in order: the insert built before goes to the server first, and the
        // next piece is made ready while the server runs it (or, for a statement of a row
        // count not run before on this connection, while the server prepares it).
        let next = async {
            pieces.next().map(|piece| -> Result<Ready<'_>> {
                Ok(match piece {
                    Piece::Bulk(bulk) => Ready::Bulk(insert_stmt(&bulk)?, bulk.len()),
                    Piece::Keyed(job) => Ready::Keyed(job),
                })
            })
        };
        let (ran, next) = join(insert_bulk(r, built.take(), step, out), next).await;
        ran?;
        match next.transpose()? {
            None => return Ok(()),
            Some(Ready::Bulk(insert, n)) => built = Some((insert, n)),
            Some(Ready::Keyed(job)) => out.push(enqueue_one(r, &job).await?),
        }
    }
}

/// A piece of an enqueue ready to go: a bulk insert of so many jobs, built ahead of its turn,
/// or a job with a unique key.
enum Ready<'a> {
    Bulk(Stmt<Sql>, usize),
    Keyed(JobParts<'a>),
}

/// `INSERT INTO rowclaim_jobs … VALUES (…), (…)` for these jobs. The run-at is absolute epoch
/// milliseconds when given, else now + the delay (see `Sql::at_ms`: no session time zone is
/// involved).
pub(crate) fn insert_stmt(jobs: &[JobParts<'_>]) -> Result<Stmt<Sql>> {
    let mut b = B::new();
    let mut rows = Vec::with_capacity(jobs.len());
    for j in jobs {
        let delay_us = j
            .delay_ms
            .checked_mul(1000)
            .ok_or_else(|| Error::InvalidInput("delay is too long".into()))?;
        let (queue, kind) = (b.bind(j.queue.to_owned()), b.bind(j.kind.to_owned()));
        let (payload, priority) = (b.bind(j.payload.to_string()), b.bind(j.priority));
        let at = Sql::at_ms(&b.bind(j.run_at_ms));
        rows.push(format!(
            "({queue}, {kind}, {payload}, {priority}, COALESCE({at}, \
             {NOW} + INTERVAL {} MICROSECOND), {}, {}, {}, {}, {NOW})",
            b.bind(delay_us),
            b.bind(j.max_attempts),
            b.bind(j.unique_key.map(str::to_owned)),
            b.bind(j.timeout_ms),
            b.bind(j.limit_key.map(str::to_owned)),
        ));
    }
    let sql = format!(
        "INSERT INTO rowclaim_jobs (queue, kind, payload, priority, run_at, max_attempts, \
         unique_key, timeout_ms, limit_key, created_at) VALUES {}",
        rows.join(", ")
    );
    Ok(Stmt::new(sql, b))
}

/// Runs `insert`, if there is one: `n` jobs without unique keys in one statement; adds their
/// ids to `out`.
///
/// One multi-row `INSERT … VALUES` is a "simple insert" (its row count is known up front), for
/// which InnoDB reserves all its auto-increment values at once, under
/// `innodb_autoinc_lock_mode` 0, 1 and 2 alike: the ids are the first one
/// (`last_insert_id`) plus `i × auto_increment_increment`. The increment is 1 unless set, as
/// Galera does (the cluster's size), so it is asked once per transaction; `step` caches it.
async fn insert_bulk<R: InsertId>(
    r: &R,
    insert: Option<(Stmt<Sql>, usize)>,
    step: &mut Option<i64>,
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    let Some((insert, n)) = insert else {
        return Ok(());
    };
    let first = r.insert_id(insert).await?;
    let step = match *step {
        Some(s) => s,
        None if n == 1 => 1,
        None => {
            let sql = "SELECT CAST(@@SESSION.auto_increment_increment AS SIGNED)";
            let s = r.count(Stmt::new(sql.to_owned(), B::new())).await?;
            *step = Some(s);
            s
        }
    };
    out.extend((0..n as i64).map(|i| Enqueued {
        id: first + i * step,
        existing: false,
    }));
    Ok(())
}

/// Enqueues one job on a connection (in the caller's transaction when they hold one; this neither
/// begins nor commits). With a unique key that a ready or running job has already, returns that
/// job.
pub(crate) async fn enqueue_one<R: InsertId>(r: &R, job: &JobParts<'_>) -> Result<Enqueued> {
    check_times(job)?;
    check_packet(r, std::slice::from_ref(job), 0).await?;
    let Some(key) = job.unique_key else {
        let id = r.insert_id(insert_stmt(std::slice::from_ref(job))?).await?;
        return Ok(Enqueued {
            id,
            existing: false,
        });
    };
    for _ in 0..UNIQUE_TRIES {
        // The insert itself is the uniqueness check: it waits for a twin another transaction is
        // inserting, and fails with a duplicate key once that one commits. A failed statement
        // undoes only itself in MySQL, so the caller's transaction goes on.
        match r.insert_id(insert_stmt(std::slice::from_ref(job))?).await {
            Ok(id) => {
                return Ok(Enqueued {
                    id,
                    existing: false,
                })
            }
            Err(Error::Database(e)) if error_number(e.sqlx()) == Some(DUPLICATE_KEY) => {}
            Err(e) => return Err(e),
        }
        if let Some(id) = first_int(r, twin(key)).await? {
            return Ok(Enqueued { id, existing: true });
        }
        // The twin completed, died or was cancelled in between: the key is free again.
    }
    Err(Error::InvalidInput(format!(
        "could not enqueue the job with unique key {key:?}: other jobs with that key kept \
         starting and finishing; try again"
    )))
}

/// The pending job with unique key `key`. A locking read sees the latest committed rows, also
/// in a caller's REPEATABLE READ transaction whose snapshot predates the twin. (The failed
/// insert holds a shared lock on the twin's key already.) `LOCK IN SHARE MODE` is understood by
/// MySQL 8 and MariaDB.
fn twin(key: &str) -> Stmt<Sql> {
    let mut b = B::new();
    let sql = format!(
        "SELECT id FROM rowclaim_jobs WHERE pending_key = {} LOCK IN SHARE MODE",
        b.bind(key.to_owned())
    );
    Stmt::new(sql, b)
}

/// How stats count here: every status by queue through the claim index (status, queue, …);
/// above the cap, the optimizer's estimate.
const COUNTING: Counting = Counting {
    per_queue: super::JOB_STATUSES,
    estimate: Some(Estimate {
        explain: "EXPLAIN FORMAT=JSON",
        rows: explained_rows,
    }),
    recursive_scan: false,
};

/// The rows `EXPLAIN FORMAT=JSON` expects of the one table: the rows it reads (`rows` on
/// MariaDB, `rows_examined_per_scan` on MySQL) times the share of them left after the rest
/// of the condition (`filtered`, a percentage).
fn explained_rows(lines: &[String]) -> Option<u64> {
    let plan: serde_json::Value = serde_json::from_str(lines.first()?).ok()?;
    let table = find(&plan, "table")?;
    let rows = ["rows", "rows_examined_per_scan"]
        .iter()
        .find_map(|k| number(table.get(*k)?))?;
    let filtered = table.get("filtered").and_then(number).unwrap_or(100.0);
    Some((rows * filtered / 100.0).round() as u64)
}

/// The first value named `key` in a JSON document, depth first.
fn find<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(o) => {
            o.get(key).or_else(|| o.values().find_map(|v| find(v, key)))
        }
        serde_json::Value::Array(a) => a.iter().find_map(|v| find(v, key)),
        _ => None,
    }
}

/// A JSON number, or a number written as a string (MySQL writes `"filtered": "100.00"`).
fn number(v: &serde_json::Value) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str()?.parse().ok())
}
