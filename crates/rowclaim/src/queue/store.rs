//! The one door to the managed queue's store: [`store`] finds a database's store once, as a
//! `&dyn QueueStore`. What each database writes its own way is its [`QueueStore`] impl (one
//! file per database beside this one); what every database does alike is written once over
//! the driver's [`Run`]: [`Shared`] here, the schedules' `Schedules`.

use std::time::Duration;

use super::bulk::{change_sql, BulkAction};
use super::record::{scheduled_sql, Scheduled};
use super::QueueStore;
use super::{Admin, Enqueued, JobFilter, JobParts};
use crate::backend::run::{Col, Fetch, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::backend::Backend;
use crate::db::Db;
use crate::error::{Error, Result};

/// The store of `db`'s managed queue: the one place the queue matches on the database.
pub(crate) fn store(db: &Db) -> &dyn QueueStore {
    match &db.backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres(d) => d,
        #[cfg(feature = "mysql")]
        Backend::MySql(d) => d,
        #[cfg(feature = "sqlite")]
        Backend::Sqlite(d) => d,
    }
}

/// What the managed queue does alike on every database, written once over a driver's [`Run`]
/// (a queue's pauses and limits are the settings role's, `settings.rs`): the jobs scheduled for
/// later.
#[async_trait::async_trait]
pub(crate) trait Shared: Send + Sync {
    /// Ready jobs of `filter`'s queues and kinds scheduled for later that never ran.
    async fn scheduled(&self, filter: &JobFilter) -> Result<Scheduled>;
}

#[async_trait::async_trait]
impl<R: Run + Send + Sync> Shared for R
where
    (i64, Option<i64>): Fetch<R::Sql>,
{
    async fn scheduled(&self, filter: &JobFilter) -> Result<Scheduled> {
        scheduled(self, filter).await
    }
}

/// Ready jobs scheduled for later that never ran, and when the first is due.
async fn scheduled<R: Run>(r: &R, filter: &JobFilter) -> Result<Scheduled>
where
    (i64, Option<i64>): Fetch<R::Sql>,
{
    let mut b = Binder::new();
    let sql = scheduled_sql(&mut b, &R::Sql::epoch_ms("MIN(run_at)"), filter);
    let (jobs, first) = r.fetch_one(Stmt::new(sql, b)).await?;
    Ok(Scheduled::new(jobs, first))
}

/// A runner that holds one connection (a transaction, or a caller's connection) enqueueing one
/// job, each database its own way: a schedule's tick enqueues its jobs in the transaction of
/// its compare-and-set.
pub(crate) trait EnqueueOne: Run {
    /// Enqueues `job`; with a unique key that a ready or running job has, returns that job.
    async fn enqueue_one(&self, job: &JobParts<'_>) -> Result<Enqueued>;
}

/// [`EnqueueOne`] for each of a database's runners, by its module's `enqueue_one` (a free
/// function generic over the runner: the same statements in a transaction, on a caller's
/// connection, or in a test's script).
macro_rules! enqueue_one_by {
    ($($(#[$attr:meta])* $runner:ty),+ $(,)?) => {
        $(
            $(#[$attr])*
            impl $crate::queue::store::EnqueueOne for $runner {
                async fn enqueue_one(
                    &self,
                    job: &$crate::queue::JobParts<'_>,
                ) -> $crate::error::Result<$crate::queue::Enqueued> {
                    enqueue_one(self, job).await
                }
            }
        )+
    };
}
pub(crate) use enqueue_one_by;

/// How often a unique job is inserted again when its pending twin finished between the
/// insert that met it and the look-up.
pub(crate) const UNIQUE_TRIES: usize = 5;

/// Enqueues one job with `insert`, an `INSERT … ON CONFLICT DO NOTHING RETURNING id` that
/// skips a job whose unique key is pending (PostgreSQL's and SQLite's way: a partial unique
/// index makes this hold under concurrent enqueues, a second insert waiting for the first to
/// commit, then conflicting); then the pending job is the one returned.
pub(crate) async fn insert_unless_pending<R: Run + ?Sized>(
    r: &R,
    job: &JobParts<'_>,
    insert: fn(&JobParts<'_>) -> Stmt<R::Sql>,
) -> Result<Enqueued> {
    for _ in 0..UNIQUE_TRIES {
        if let Some(id) = first_int(r, insert(job)).await? {
            return Ok(Enqueued {
                id,
                existing: false,
            });
        }
        if let Some(id) = first_int(r, pending_stmt(job.unique_key)).await? {
            return Ok(Enqueued { id, existing: true });
        }
        // The pending job finished between the two statements: try the insert again.
    }
    Err(Error::InvalidInput(format!(
        "unique key {:?} keeps changing hands; try again",
        job.unique_key.unwrap_or_default()
    )))
}

/// The pending job (ready or running) with this unique key.
fn pending_stmt<D: Dialect>(key: Option<&str>) -> Stmt<D> {
    let mut b = Binder::new();
    let sql = format!(
        "SELECT id FROM rowclaim_jobs WHERE unique_key = {} AND status IN ('ready', 'running')",
        b.bind(key.map(str::to_owned))
    );
    Stmt::new(sql, b)
}

/// The first column of the first row a statement returns, as an integer: an id. (Read by
/// column kind, so that the statement snapshots' stand-in database can answer it.)
pub(crate) async fn first_int<R: Run + ?Sized>(r: &R, s: Stmt<R::Sql>) -> Result<Option<i64>> {
    let rows = r.values(s, &[Col::OptInt]).await?;
    Ok(rows
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next())
        .and_then(|v| v.int()))
}

/// The statement of an administrative change. `before` spells "now minus `age`" in the
/// database's time type (binding what it needs): the cut-off of a prune.
pub(crate) fn admin_stmt<D: Dialect>(
    op: Admin,
    before: impl FnOnce(&mut Binder<D>, Duration) -> String,
) -> Stmt<D> {
    let mut b = Binder::new();
    let sql = match op {
        Admin::Cancel(id) => change_sql::<D>(BulkAction::Cancel, &format!("id = {}", b.bind(id))),
        Admin::Retry(id) => change_sql::<D>(BulkAction::Retry, &format!("id = {}", b.bind(id))),
        Admin::Delete(id) => change_sql::<D>(BulkAction::Delete, &format!("id = {}", b.bind(id))),
        Admin::Prune(age) => format!(
            "DELETE FROM rowclaim_jobs WHERE status IN ('completed', 'dead', 'cancelled') \
             AND finished_at < {}",
            before(&mut b, age)
        ),
    };
    Stmt::new(sql, b)
}
