//! Enqueue: the `Queue` API that adds jobs (one, many, a stream of chunks, or one inside the
//! caller's transaction; each job checked first, `job.rs`), and the one path every call but the
//! in-transaction ones takes to its database's store (`enqueue_incoming`: the transaction, the
//! replay after a transient failure, then the look of the jobs that wait).

use super::after::{self, Scope};
use super::incoming::Incoming;
use super::job::check_jobs;
use super::store::store;
use super::{not_initialised, Enqueued, NewJob, Queue, ToNewJob};
use crate::backend::retry_transient;
use crate::backend::run::OnConn;
use crate::error::{Error, Result};

impl Queue {
    /// Enqueues one job: a [`NewJob`], or a value of a [`JobArgs`] type (its kind, queue and
    /// settings from its type). With a unique key that is pending already, returns that job
    /// instead.
    ///
    /// [`JobArgs`]: crate::JobArgs
    pub async fn enqueue(&self, job: &impl ToNewJob) -> Result<Enqueued> {
        let job = job.to_new_job()?;
        job.check()?;
        let mut got = self.enqueue_jobs(std::slice::from_ref(&*job), true).await?;
        got.pop()
            .ok_or_else(|| Error::InvalidInput("enqueue returned nothing".into()))
    }

    /// Enqueues many jobs ([`NewJob`]s, or values of one [`JobArgs`] type) in one
    /// transaction: all of them or, on any error, none. Returns how many new jobs were added
    /// (jobs whose unique key was pending already are not added).
    ///
    /// [`JobArgs`]: crate::JobArgs
    pub async fn enqueue_many<J: ToNewJob>(&self, jobs: &[J]) -> Result<u64> {
        let jobs = J::to_new_jobs(jobs)?;
        check_jobs(&jobs)?;
        let got = self.enqueue_jobs(&jobs, false).await?;
        Ok(got.iter().filter(|e| !e.existing).count() as u64)
    }

    /// [`Queue::enqueue_many`], returning one [`Enqueued`] per job given (`existing` for a
    /// job whose unique key was pending already: the id is that job's).
    pub async fn enqueue_all<J: ToNewJob>(&self, jobs: &[J]) -> Result<Vec<Enqueued>> {
        let jobs = J::to_new_jobs(jobs)?;
        check_jobs(&jobs)?;
        self.enqueue_jobs(&jobs, true).await
    }

    /// Enqueues the jobs of a stream of chunks in one transaction, all or none: for jobs made
    /// as they are read (the `rowclaim enqueue` command parses its input so). Returns one
    /// [`Enqueued`] per job, in order, as [`Queue::enqueue_all`] does. An `Err` from the stream
    /// ends the enqueue: nothing is written, and that error is returned.
    ///
    /// The next chunk is asked for once the one before is written: to make chunks while the
    /// database writes, make them ahead (threads sending down a channel, as the command does).
    /// The transaction stays open while the stream is asked, so the stream should not write to
    /// the same database (on SQLite it would wait for this enqueue's write lock). The chunks are
    /// kept until the commit: a transient failure of the database (a deadlock, say) enqueues
    /// them all again; one of the stream's own is returned, whatever its kind.
    ///
    /// ```no_run
    /// # async fn f(queue: rowclaim::Queue) -> rowclaim::Result<()> {
    /// use rowclaim::NewJob;
    /// let chunks = (0..10).map(|c| {
    ///     Ok((0..1_000).map(|i| NewJob::new(serde_json::json!({"n": c * 1_000 + i}))).collect())
    /// });
    /// let done = queue.enqueue_stream(futures_util::stream::iter(chunks)).await?;
    /// assert_eq!(done.len(), 10_000);
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_stream<S>(&self, chunks: S) -> Result<Vec<Enqueued>>
    where
        S: futures_util::Stream<Item = Result<Vec<NewJob>>> + Send,
    {
        self.enqueue_incoming(Incoming::stream(Box::pin(chunks)), true)
            .await
    }

    /// Enqueues a job ([`NewJob`] or [`JobArgs`] value) inside the caller's PostgreSQL
    /// transaction: it exists only if that transaction commits. Pass `&mut tx`. Its statements
    /// are not kept prepared, so this also works through a transaction-mode pooler (PgBouncer).
    ///
    /// A job that waits ([`NewJob::after`]) follows the rules of [`Queue::enqueue`]: an id of
    /// no job is an error naming it, and then nothing was written in the transaction; jobs
    /// completed already count as done; one dead or cancelled cancels the job at once, naming
    /// it (unless it [`NewJob::run_anyway`]); otherwise it is `waiting`. Since the commit is
    /// yours, nothing looks after it: a job it waits for that finishes between this call and
    /// your commit leaves it waiting until a worker's sweep (once a lease) or until you call
    /// [`Queue::release_waiting`] after your commit.
    ///
    /// [`JobArgs`]: crate::JobArgs
    #[cfg(feature = "postgres")]
    pub async fn enqueue_postgres(
        conn: &mut sqlx::PgConnection,
        job: &impl ToNewJob,
    ) -> Result<Enqueued> {
        let job = job.to_new_job()?;
        job.check()?;
        after::enqueue_in(&OnConn::<sqlx::Postgres>::new(conn, false), &job).await
    }

    /// Enqueues a job ([`NewJob`] or [`JobArgs`] value) inside the caller's MySQL/MariaDB
    /// transaction. Pass `&mut tx`. A job that waits ([`NewJob::after`]): as
    /// [`Queue::enqueue_postgres`] says (call [`Queue::release_waiting`] after your commit, or
    /// leave it to the workers' sweep).
    ///
    /// [`JobArgs`]: crate::JobArgs
    #[cfg(feature = "mysql")]
    pub async fn enqueue_mysql(
        conn: &mut sqlx::MySqlConnection,
        job: &impl ToNewJob,
    ) -> Result<Enqueued> {
        let job = job.to_new_job()?;
        job.check()?;
        after::enqueue_in(&OnConn::<sqlx::MySql>::new(conn, true), &job).await
    }

    /// Enqueues a job ([`NewJob`] or [`JobArgs`] value) inside the caller's SQLite
    /// transaction. Pass `&mut tx`. A job that waits ([`NewJob::after`]): as
    /// [`Queue::enqueue_postgres`] says (call [`Queue::release_waiting`] after your commit, or
    /// leave it to the workers' sweep).
    ///
    /// [`JobArgs`]: crate::JobArgs
    #[cfg(feature = "sqlite")]
    pub async fn enqueue_sqlite(
        conn: &mut sqlx::SqliteConnection,
        job: &impl ToNewJob,
    ) -> Result<Enqueued> {
        let job = job.to_new_job()?;
        job.check()?;
        after::enqueue_in(&OnConn::<sqlx::Sqlite>::new(conn, true), &job).await
    }

    /// Enqueues `jobs` in one transaction; then the jobs among them that wait look once at
    /// what they wait for (a job that finished while the transaction was open is seen there).
    pub(super) async fn enqueue_jobs(&self, jobs: &[NewJob], ids: bool) -> Result<Vec<Enqueued>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        // A job that waits needs the ids of the jobs it waits for, and its own.
        let jobs = Incoming::slice(jobs);
        let ids = ids || jobs.waits();
        self.enqueue_incoming(jobs, ids).await
    }

    /// [`Queue::enqueue_jobs`] for jobs as they come (chunks of a stream): with their ids.
    async fn enqueue_incoming(&self, mut jobs: Incoming<'_>, ids: bool) -> Result<Vec<Enqueued>> {
        // An error of the caller's stream is final whatever its kind: a replay would read the
        // stream past it.
        let got = retry_transient!(
            {
                jobs.rewind();
                store(&self.db).enqueue(&mut jobs, ids).await
            },
            if !jobs.failed()
        )
        .map_err(not_initialised)?;
        let waiting: Vec<i64> = jobs
            .to_hold()
            .zip(&got)
            .filter(|(j, _)| j.waits())
            .map(|(_, e)| e.id)
            .collect();
        let kept = jobs.into_kept();
        if kept.len() > 1 {
            // A million jobs take about a fifth of a second to free: not the caller's wait.
            tokio::task::spawn_blocking(move || drop(kept));
        }
        if !waiting.is_empty() {
            self.resolve(Scope::Jobs(waiting)).await?;
        }
        Ok(got)
    }
}
