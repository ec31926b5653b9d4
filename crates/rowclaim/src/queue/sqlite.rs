//! The managed queue's SQL on SQLite (its schema: `migrate/sqlite.rs`): enqueue, admin, stats and
//! records. Every statement goes through the driver's [`Run`]; times are epoch milliseconds here.

use sqlx::Sqlite;

use super::counts::Counting;
use super::incoming::{pieces, Piece};
use super::migrate::{migrate, Component};
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
/// order of `run`. The write transaction is this process's alone and a new row's id is the
/// largest so far plus one, so the ids ascend in the order of the VALUES; RETURNING
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
