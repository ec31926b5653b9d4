//! The managed queue's SQL on MySQL/MariaDB (its schema: `migrate/mysql.rs`): enqueue
//! (`mysql/enqueue.rs`), admin, stats and records. Every statement goes through the driver's
//! [`Run`], but for the two things only MySQL has: an insert's first id (`last_insert_id`,
//! [`InsertId`](enqueue::InsertId)) and the named lock concurrent inits take turns on, which
//! belongs to one connection (`My::init_once`).

use sqlx::MySql;

use super::counts::{Counting, Estimate};
use super::migrate::{migrate, Component};
use super::record::{records_sql, RecordRow};
use super::store::{admin_stmt, first_int};
use super::{Admin, Enqueued, Incoming, JobFilter, JobRecord, Listener, QueueStats, QueueStore};
use crate::backend::mysql::{error_number, lease_us, My, Sql, NOW};
use crate::backend::run::{Finish, OnConn, Run, Transact};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::backend::ServerKind;
use crate::error::{Error, Result};

mod enqueue;

use enqueue::{insert_jobs, Carry, Terms};

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

    async fn enqueue(&self, jobs: &mut Incoming<'_>, ids: bool) -> Result<Vec<Enqueued>> {
        let tx = self.transaction(true).await?;
        let terms = Terms {
            ids,
            runs: self.server_via(&tx).await?.kind == ServerKind::MariaDb,
        };
        let mut out = Vec::new();
        let mut carry = Carry::default();
        while let Some((before, chunk)) = jobs.next().await? {
            insert_jobs(&tx, chunk, before, terms, &mut carry, &mut out).await?;
        }
        carry.finish(&tx, &mut out).await?;
        super::after::hold(&tx, jobs.to_hold(), &out).await?;
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

/// The named lock `rowclaim init` runs under. Named locks are server-wide, so inits of different
/// databases on one server take turns too; they are short.
const INIT_LOCK: &str = "rowclaim_init";

const INIT_LOCK_WAIT_SECS: i64 = 60;

/// 1062: duplicate entry for a unique key.
pub(super) const DUPLICATE_KEY: u16 = 1062;

/// 900 years in microseconds: the longest delay, and the longest prune age that is computed (an
/// older cut-off would prune nothing more). `DATETIME` holds the years 1000 to 9999 only, and
/// arithmetic past them gives NULL or, in strict mode, an error rather than a date.
pub(super) const MAX_SPAN_US: i64 = 900 * 31_556_952 * 1_000_000;

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
