//! The worker runtime for the managed queue: async handlers per job kind, a concurrency limit,
//! heartbeats that keep long jobs' leases, retries with backoff, dead jobs, wake-ups on new jobs,
//! and a graceful shutdown.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::{Claim, ClaimedRow, Db, Error, Job, JobFailure, Queue, Result};

type JobFuture = Pin<Box<dyn Future<Output = std::result::Result<(), String>> + Send>>;
type Handler = Arc<dyn Fn(Job) -> JobFuture + Send + Sync>;

/// Runs jobs of the managed queue with async handlers.
///
/// ```no_run
/// # async fn demo(db: rowclaim::Db) -> rowclaim::Result<()> {
/// use rowclaim::Worker;
/// let report = Worker::new(&db)
///     .queue("mail")
///     .handle("welcome", |job| async move {
///         println!("welcome {}", job.payload["to"]);
///         Ok::<_, String>(())
///     })
///     .concurrency(8)
///     .run(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// println!("{} jobs completed", report.completed);
/// # Ok(()) }
/// ```
pub struct Worker {
    queue: Queue,
    queues: Vec<String>,
    handlers: HashMap<String, Handler>,
    fallback: Option<Handler>,
    concurrency: usize,
    lease: Duration,
    poll: Duration,
    grace: Duration,
}

/// What a worker did, from [`Worker::run`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Jobs completed.
    pub completed: u64,
    /// Failures that will run again later.
    pub retried: u64,
    /// Jobs that failed their last attempt, or had no handler.
    pub dead: u64,
    /// Jobs given back unfinished at shutdown.
    pub released: u64,
    /// Jobs whose lease was lost to another worker (their results were refused).
    pub lost: u64,
}

#[derive(Default)]
struct Tally {
    completed: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    released: AtomicU64,
    lost: AtomicU64,
}

impl Worker {
    /// A worker of `db`'s managed queue: all queues, concurrency 1, lease 30 s, polling every
    /// second (on PostgreSQL new jobs wake it at once), 30 s grace at shutdown.
    pub fn new(db: &Db) -> Worker {
        Worker {
            queue: db.queue(),
            queues: Vec::new(),
            handlers: HashMap::new(),
            fallback: None,
            concurrency: 1,
            lease: Duration::from_secs(30),
            poll: Duration::from_secs(1),
            grace: Duration::from_secs(30),
        }
    }

    /// Takes jobs from this queue (call again for more; none means all queues).
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queues.push(name.into());
        self
    }

    /// Runs jobs of `kind` with `handler`. An `Err` is retried with backoff until the job's last
    /// attempt, then the job is dead with the error kept.
    pub fn handle<F, Fut, E>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Display,
    {
        self.handlers.insert(kind.into(), boxed(handler));
        self
    }

    /// Runs jobs of every kind that has no handler of its own. Without it such jobs are dead.
    pub fn handle_any<F, Fut, E>(mut self, handler: F) -> Self
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
        E: Display,
    {
        self.fallback = Some(boxed(handler));
        self
    }

    /// Jobs run at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// How long a job is held without a heartbeat (heartbeats extend it every third).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long to wait before looking again when no job was due.
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// At shutdown, how long running jobs may take to finish before they are given back.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Runs until `shutdown` completes; then claims nothing more, lets running jobs finish within
    /// the grace period, and gives back the rest.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<WorkerReport> {
        if self.lease.is_zero() {
            return Err(Error::InvalidInput("lease must be longer than zero".into()));
        }
        let claimer = self.queue.claimer(&self.queues).await?;
        // Listen before the first claim, so that no job enqueued in between is missed.
        let mut wakeups = self.queue.wakeups(&self.queues).await?;
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let tally = Arc::new(Tally::default());
        let handlers = Arc::new((self.handlers, self.fallback));
        let mut tasks = JoinSet::new();
        let mut claims: Vec<Arc<Claim>> = Vec::new();
        tokio::pin!(shutdown);
        loop {
            let first = tokio::select! {
                p = slots.clone().acquire_owned() => p.map_err(|_| Error::InvalidInput("worker closed".into()))?,
                () = &mut shutdown => break,
            };
            while tasks.try_join_next().is_some() {}
            claims.retain(|c| !c.open_rows().is_empty());
            let free = 1 + slots.available_permits();
            let claim = claimer.claim(free as u32, self.lease).await?;
            if claim.is_empty() {
                drop(first);
                tokio::select! {
                    _ = wakeups.wait(self.poll) => {}
                    () = &mut shutdown => break,
                }
                continue;
            }
            let claim = Arc::new(claim);
            claims.push(claim.clone());
            let (beating, lease) = (claim.clone(), self.lease);
            tasks.spawn(async move { beating.keep_alive(lease).await });
            let mut permits = vec![first];
            for _ in 1..claim.len() {
                // We claimed no more rows than there were free slots, and only this loop takes them.
                if let Ok(p) = slots.clone().try_acquire_owned() {
                    permits.push(p);
                }
            }
            for (row, permit) in claim.rows().iter().zip(permits) {
                let (claim, row, handlers, tally) =
                    (claim.clone(), row.clone(), handlers.clone(), tally.clone());
                tasks.spawn(async move {
                    run_job(&claim, &row, &handlers, &tally).await;
                    drop(permit);
                });
            }
        }
        // Shutdown: running jobs get the grace period; whatever is left is given back.
        let drained = tokio::time::timeout(self.grace, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
            for claim in claims {
                for id in claim.open_rows() {
                    if claim.release(&id).await.is_ok() {
                        tally.released.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Ok(WorkerReport {
            completed: n(&tally.completed),
            retried: n(&tally.retried),
            dead: n(&tally.dead),
            released: n(&tally.released),
            lost: n(&tally.lost),
        })
    }
}

fn boxed<F, Fut, E>(handler: F) -> Handler
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<(), E>> + Send + 'static,
    E: Display,
{
    Arc::new(move |job| {
        let fut = handler(job);
        Box::pin(async move { fut.await.map_err(|e| e.to_string()) }) as JobFuture
    })
}

async fn run_job(
    claim: &Claim,
    row: &ClaimedRow,
    handlers: &(HashMap<String, Handler>, Option<Handler>),
    tally: &Tally,
) {
    let (counter, settled) = match Job::from_row(row) {
        Err(e) => (&tally.dead, claim.fail_with(&row.id, e.to_string()).await),
        Ok(job) if job.exhausted() => {
            let why = format!("no attempts left after {} runs", job.max_attempts);
            (&tally.dead, claim.fail_with(&row.id, why).await)
        }
        Ok(job) => match handlers.0.get(&job.kind).or(handlers.1.as_ref()) {
            None => {
                let why = format!("no handler for kind {:?}", job.kind);
                (&tally.dead, claim.fail_with(&row.id, why).await)
            }
            Some(handler) => match handler(job.clone()).await {
                Ok(()) => (&tally.completed, claim.complete(&row.id).await),
                Err(e) => match claim.fail_job(&job, e).await {
                    Ok(JobFailure::Retried) => (&tally.retried, Ok(())),
                    Ok(_) => (&tally.dead, Ok(())),
                    Err(e) => (&tally.dead, Err(e)),
                },
            },
        },
    };
    match settled {
        Ok(()) => {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Err(Error::LeaseLost { .. }) => {
            tally.lost.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => tracing::warn!("settling job {}: {e}", row.id),
    }
}
