//! The worker runtime: [`Worker`] runs claimed rows with handlers, keeps their leases alive,
//! records results, and rides out database outages. `rowclaim work` is the same runtime with a
//! handler that runs a command per row.

mod handler;
pub(crate) mod outage;
mod registration;
mod registry;
mod runtime;
mod typed;

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use handler::{Handler, IntoTaskResult, StopReason, Task, TaskFuture, TaskResult};
pub use registry::{WorkerEntry, WorkerState};
pub use typed::JobContext;

use crate::claim::{ClaimedRow, Claimer};
use crate::db::Db;
use crate::error::{Error, Result};
use crate::queue::{Job, Retention, Schedule, Scheduler};
use handler::{job_fn, ByKind, TaskFn};
use registration::Registration;
use runtime::{Config, Phase};

/// Runs claimed rows with async handlers: the jobs of the managed queue ([`Worker::new`]) or the
/// rows of any source ([`Worker::for_claimer`]).
///
/// ```no_run
/// # async fn demo(db: rowclaim::Db) -> rowclaim::Result<()> {
/// use rowclaim::Worker;
/// use std::time::Duration;
/// let report = Worker::new(&db)
///     .queue("mail")
///     .handle("welcome", |job| async move {
///         println!("welcome {}", job.payload["to"]);
///         Ok::<_, String>(())
///     })
///     .concurrency(8)
///     .timeout(Duration::from_secs(300))
///     .run(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// println!("{} jobs completed", report.completed);
/// # Ok(()) }
/// ```
///
/// What it promises:
/// - **Faults are weather.** A lost connection, a restarting or failed-over server, a killed
///   session: claims pause (100 ms growing to 5 s) and resume when the database answers; running
///   jobs keep running; lease renewals and results are retried until the lease would end. A
///   result that could not be recorded by then is given up, and its row comes back through its
///   lease. One warning when an outage starts, one line when it ends.
/// - **No job is held by a dead handler.** A panic is a failure of that job (`panicked: …`),
///   retried like any failure. A job past its time limit is stopped and fails
///   (`timed out after …`). A job whose row is no longer this worker's (lease lost, cancelled)
///   is stopped, since its result would be refused.
/// - **No row starts that may no longer be held.** A claimed row waits for a free slot only while
///   its lease is known to be alive; otherwise it is given up.
/// - **Shutdown**: when `run`'s future completes (or [`Shutdown::drain`]), nothing more is
///   claimed, rows not started go back at once, running jobs get the grace period, then are
///   stopped and their rows go back. [`Shutdown::now`] skips the grace period.
/// - **Listed**: it registers in `rowclaim_workers` ([`Db::workers`], `rowclaim workers`) as
///   it starts, heartbeats there every third of its lease, and is marked stopped when `run`
///   returns; its claims' tokens end in its id. A registry it may not write is said once and
///   does not stop it.
///
/// Its running jobs are futures of one task, the claim loop's, which polls each as it wakes: a
/// job costs no task and no hop between threads, so short jobs cost the runtime a few
/// microseconds each. The price: a handler that computes for long without reaching an `.await`
/// holds the other jobs and the claim loop up meanwhile (leases are renewed on tasks of their
/// own). Put such work on [`tokio::task::spawn_blocking`] and await it there.
pub struct Worker {
    target: Target,
    kinds: ByKind,
    handler: Option<Arc<dyn Handler>>,
    concurrency: usize,
    batch: Option<u32>,
    prefetch: Option<usize>,
    lease: Duration,
    poll: Duration,
    grace: Duration,
    timeout: Option<Duration>,
    give_up_after: Option<Duration>,
    until_empty: bool,
    wait_scheduled: bool,
    listen: bool,
    settle_delay: Duration,
    retention: Retention,
    schedules: Vec<Schedule>,
    phase: Arc<watch::Sender<Phase>>,
}

enum Target {
    Queue { db: Db, queues: Vec<String> },
    Claimer(Claimer),
}

/// What a worker did, from [`Worker::run`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Rows completed.
    pub completed: u64,
    /// Managed jobs that failed and will run again later.
    pub retried: u64,
    /// Rows of an own table marked failed.
    pub failed: u64,
    /// Managed jobs that failed their last attempt, or had no handler: dead.
    pub dead: u64,
    /// Rows given back unfinished at shutdown (or not started).
    pub released: u64,
    /// Rows whose handler asked to run them again later ([`TaskResult::Snooze`]).
    pub snoozed: u64,
    /// Rows that stopped being this worker's: their lease expired and another worker took them,
    /// or they were cancelled; their results, if any, were refused.
    pub lost: u64,
    /// Of the rows lost, jobs of the managed queue that were cancelled while this worker held
    /// them (looked at as the worker ends, for up to 1,000 lost rows); the others were taken
    /// by another worker.
    pub cancelled: u64,
    /// Rows given up: a result that could not be recorded before the lease would end (an
    /// outage, or a wait for a lock as long as the lease), or a claimed row not started because
    /// its lease could not be confirmed. They come back when their lease ends and run again.
    pub given_up: u64,
    /// Of the rows lost or given up, those that ended done all the same (another claim, or a
    /// later one of this worker, finished them). Looked at only by a worker that ran until
    /// nothing was left ([`Worker::until_empty`]), as it ends; 0 otherwise.
    pub finished_later: u64,
    /// Results sent just as the connection broke and refused when sent again: most likely
    /// recorded the first time. (If not, the row comes back through its lease.)
    pub unconfirmed: u64,
    /// How many times the database stopped answering for a while.
    pub outages: u64,
    /// The worker was told to stop at once ([`Shutdown::now`]).
    pub interrupted: bool,
}

impl WorkerReport {
    /// Rows that did not end well: failed, dead, or lost (not cancelled) or given up and not
    /// known to have been finished later ([`WorkerReport::finished_later`]).
    pub fn troubled(&self) -> u64 {
        let lost = self.lost.saturating_sub(self.cancelled);
        self.failed + self.dead + (lost + self.given_up).saturating_sub(self.finished_later)
    }
}

/// Stops a running [`Worker`] from elsewhere (a signal handler, say). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Shutdown(Arc<watch::Sender<Phase>>);

impl Shutdown {
    /// Stop claiming; rows not started go back; running jobs get the grace period.
    pub fn drain(&self) {
        self.0.send_if_modified(|p| {
            let changed = *p == Phase::Run;
            if changed {
                *p = Phase::Drain;
            }
            changed
        });
    }

    /// Stop running jobs now and give their rows back.
    pub fn now(&self) {
        self.0.send_replace(Phase::Now);
    }
}

impl Worker {
    /// A worker of `db`'s managed queue: all queues, concurrency 1, lease 30 s, polling every
    /// second (on PostgreSQL new jobs wake it at once), 30 s grace at shutdown, no time limit.
    pub fn new(db: &Db) -> Worker {
        Worker::with_target(Target::Queue {
            db: db.clone(),
            queues: Vec::new(),
        })
    }

    /// A worker of any source: the rows `claimer` claims (your own table, or the managed queue's
    /// claimer from [`crate::Queue::claimer`]). Give it a handler with [`Worker::handle_rows`]
    /// or [`Worker::handler`]; for the managed queue, [`Worker::handle`] works too.
    pub fn for_claimer(claimer: Claimer) -> Worker {
        Worker::with_target(Target::Claimer(claimer))
    }

    fn with_target(target: Target) -> Worker {
        Worker {
            target,
            kinds: ByKind::default(),
            handler: None,
            concurrency: 1,
            batch: None,
            prefetch: None,
            lease: Duration::from_secs(30),
            poll: Duration::from_secs(1),
            grace: Duration::from_secs(30),
            timeout: None,
            give_up_after: None,
            until_empty: false,
            wait_scheduled: false,
            listen: true,
            settle_delay: Duration::ZERO,
            retention: Retention::Keep,
            schedules: Vec::new(),
            phase: Arc::new(watch::channel(Phase::Run).0),
        }
    }

    /// Takes jobs from this queue (call again for more; none means all queues). Managed queue
    /// only.
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        if let Target::Queue { queues, .. } = &mut self.target {
            queues.push(name.into());
        }
        self
    }

    /// Runs jobs of `kind` with `handler`. An `Err` is retried with backoff until the job's last
    /// attempt, then the job is dead with the error kept. `Ok(())` completes the job; `Ok` of a
    /// JSON value completes it and keeps the value as its output; `Ok(TaskResult::Snooze(d))`
    /// runs it again after `d` without using an attempt ([`IntoTaskResult`]). For jobs of a
    /// type of your own, [`Worker::register`] hands the handler the payload as that type.
    pub fn handle<F, Fut, T, E>(mut self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'static,
        T: IntoTaskResult,
        E: Display,
    {
        self.kinds.kinds.insert(kind.into(), job_fn(handler));
        self
    }

    /// Runs jobs of every kind that has no handler of its own. Without it such jobs are dead.
    pub fn handle_any<F, Fut, T, E>(mut self, handler: F) -> Self
    where
        F: Fn(Job) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'static,
        T: IntoTaskResult,
        E: Display,
    {
        self.kinds.fallback = Some(job_fn(handler));
        self
    }

    /// Runs every row with `handler`, given the claimed row (all its columns as JSON). `Ok`
    /// completes the row; an `Err` fails it (a managed job is retried while it has attempts).
    pub fn handle_rows<F, Fut, T, E>(self, handler: F) -> Self
    where
        F: Fn(ClaimedRow) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<T, E>> + Send + 'static,
        T: IntoTaskResult + 'static,
        E: Display + 'static,
    {
        self.handler(TaskFn(move |task: Task| handler(task.row)))
    }

    /// Runs every row with a [`Handler`] of your own (one that needs the whole [`Task`], or
    /// stops itself when asked, as `rowclaim work`'s command handler does).
    pub fn handler(mut self, handler: impl Handler) -> Self {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// Jobs run at once. Default 1.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Most rows taken by one claim statement. Default: the free slots (concurrency plus
    /// prefetch, less what is held). A batch larger than that claims ahead. A worker that holds
    /// nothing claims no more than its concurrency first, so that its first jobs start after a
    /// short claim; the rest comes in the next claim (beside it, where claims go two at once).
    pub fn batch(mut self, n: u32) -> Self {
        self.batch = Some(n);
        self
    }

    /// Rows claimed ahead, beyond those running, to wait in a local queue for a free slot. Their
    /// leases are renewed like the running ones'. The worker claims again once half of them have
    /// started, so claims come in batches of about `n / 2` rows: the larger, the fewer statements
    /// per job, but the more rows one worker keeps from the others while they wait. Skip-locked
    /// claims on a database server go up to two at once (the rows both asked for count here);
    /// jobs that ended and whose results are still being written do not count, unless more
    /// of them than the worker may hold pile up.
    ///
    /// Default: about a second of work. The worker measures how long its jobs take and claims
    /// ahead as many rows as its slots get through in a second (a tenth of the lease, if that is
    /// shorter): 2,000 at most for jobs of a few milliseconds or less, one for jobs of a second
    /// or more; as many as the concurrency until the first job ended. With the transaction
    /// strategy, whose claims hold a connection while their rows wait: the concurrency.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// How long a row is held without a heartbeat (heartbeats renew it every third). Default 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long to wait before looking again when nothing was claimable. Default 1 s.
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// At shutdown, how long running jobs may take to finish before they are stopped and their
    /// rows given back. Default 30 s.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The time limit of one run: a job still running after `limit` is stopped and fails with
    /// "timed out after …". A managed job's own limit ([`crate::NewJob::timeout`]) wins.
    /// Default: none.
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// Stop with [`Error::GaveUp`] once the database has been unreachable for `outage`.
    /// Default: never; the worker waits for the database however long it takes.
    pub fn give_up_after(mut self, outage: Duration) -> Self {
        self.give_up_after = Some(outage);
        self
    }

    /// Return once no row is left to work on: none ready (or due), none claimed by a worker
    /// that might still die and give it back. Default: keep looking for new rows.
    pub fn until_empty(mut self, on: bool) -> Self {
        self.until_empty = on;
        self
    }

    /// With [`Worker::until_empty`]: jobs scheduled for later (a delay, a run-at) count as work
    /// left, so the worker waits for them and runs them too. Default: they do not.
    pub fn wait_scheduled(mut self, on: bool) -> Self {
        self.wait_scheduled = on;
        self
    }

    /// On PostgreSQL, wake up at once when a job is enqueued (LISTEN/NOTIFY) instead of only
    /// polling. Default on; turn it off behind a pooler in transaction mode.
    pub fn listen(mut self, on: bool) -> Self {
        self.listen = on;
        self
    }

    /// How long results wait for company before they are written. Results are written in
    /// batches (one statement per claim for all its rows done since the last write, up to 1,000
    /// rows): zero (the default) writes whatever has gathered as soon as the previous write
    /// returns, but while results come one by one (fewer than 32 waiting) at most one write
    /// starts every 5 ms, so jobs of a few milliseconds do not cost a commit each (not under
    /// queue limits nor with the transaction strategy, where a result written frees room for
    /// the next claim; jobs that wait on one may start up to 5 ms later); a delay waits that
    /// long after the first result of every batch instead. A job counts
    /// as done only once its batch is written; if the worker dies first, the job runs again.
    pub fn settle_delay(mut self, delay: Duration) -> Self {
        self.settle_delay = delay;
        self
    }

    /// What becomes of the jobs it completes: kept as `completed` (the default) or deleted. For a
    /// worker made with [`Worker::new`]; a claimer given to [`Worker::for_claimer`] brings its
    /// own ([`crate::Queue::claimer_with`]).
    pub fn retention(mut self, completed: Retention) -> Self {
        self.retention = completed;
        self
    }

    /// Runs `schedule` while the worker runs: its ticks' jobs are enqueued (into the schedule's
    /// own queue, whichever queues the worker takes jobs from), exactly once however many
    /// workers run the same schedule. Scheduling stops when the worker starts to drain or
    /// returns. See [`Scheduler`].
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// A handle that stops this worker once it runs.
    pub fn shutdown_handle(&self) -> Shutdown {
        Shutdown(self.phase.clone())
    }

    /// Runs until `shutdown` completes (then drains, as [`Shutdown::drain`]), until
    /// [`Shutdown::now`], or, with [`Worker::until_empty`], until no work is left.
    ///
    /// It returns an error only when it cannot start (bad settings, no such queue or table, the
    /// database unreachable at start), when a handler aborts ([`TaskResult::Abort`]), or when
    /// [`Worker::give_up_after`] ran out. Database trouble while running is waited out.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<WorkerReport> {
        let cfg = self.config()?;
        let claimer = match self.target {
            Target::Queue { db, queues } => {
                db.queue().claimer_with(&queues, self.retention).await?
            }
            Target::Claimer(c) => c,
        };
        let handler = handler_for(self.handler, self.kinds, &claimer)?;
        // Schedules are checked and registered before the first claim: a bad one stops the
        // worker before it takes any job.
        let scheduler = if self.schedules.is_empty() {
            None
        } else {
            let mut s = Scheduler::new(claimer.db());
            for schedule in self.schedules {
                s = s.schedule(schedule);
            }
            Some(s.start().await?)
        };
        // Listen before the first claim, so that no job enqueued in between is missed.
        let wakeups = match crate::queue::served(&claimer) {
            Some(queues) if self.listen => Some(claimer.db().queue().wakeups(queues).await?),
            _ => None,
        };
        // Its claims' tokens carry its id from here on; it is listed in the worker registry
        // beside its first claims (a registry that cannot be written is said once and does not
        // stop the worker).
        let queues = crate::queue::served(&claimer).map(<[String]>::to_vec);
        let (claimer, registration) = Registration::new(
            claimer,
            queues.unwrap_or_default(),
            cfg.concurrency,
            cfg.lease,
        );
        // The runtime runs a claim's lines as they say (`runtime/waiting.rs`).
        let claimer = claimer.running_lines(cfg.concurrency);
        let phase = self.phase;
        let running = registration.running.clone();
        let runner = runtime::run(claimer, handler, cfg, wakeups, phase.subscribe(), running);
        // The schedules run until the worker drains; when the worker returns they are dropped
        // mid-pass at worst, which the compare-and-set makes harmless (a pass's tick and its
        // job commit together or not at all).
        let mut drained = phase.subscribe();
        let scheduling = async move {
            if let Some(s) = scheduler {
                let report = s
                    .run(async move {
                        let _ = drained.wait_for(|p| *p != Phase::Run).await;
                    })
                    .await;
                tracing::debug!(enqueued = report.enqueued, "the worker's schedules stopped");
            }
            std::future::pending::<()>().await
        };
        let listing = registration.list();
        let report = run_beside(runner, scheduling, phase, shutdown).await;
        listing.end().await;
        report
    }

    /// The runtime's settings, once they are checked.
    fn config(&self) -> Result<Config> {
        if self.lease.is_zero() {
            return Err(Error::InvalidInput("lease must be longer than zero".into()));
        }
        if self.concurrency == 0 {
            return Err(Error::InvalidInput("concurrency must be at least 1".into()));
        }
        if self.batch == Some(0) {
            return Err(Error::InvalidInput("batch must be at least 1".into()));
        }
        if self.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::InvalidInput(
                "timeout must be longer than zero".into(),
            ));
        }
        Ok(Config {
            concurrency: self.concurrency,
            prefetch: self.prefetch,
            batch: self.batch,
            lease: self.lease,
            poll: self.poll,
            grace: self.grace,
            timeout: self.timeout,
            give_up_after: self.give_up_after,
            until_empty: self.until_empty,
            wait_scheduled: self.wait_scheduled,
            settle_delay: self.settle_delay,
        })
    }
}

/// The handler the worker runs: the one it was given, or its handlers by kind (managed jobs
/// only).
fn handler_for(
    handler: Option<Arc<dyn Handler>>,
    kinds: ByKind,
    claimer: &Claimer,
) -> Result<Arc<dyn Handler>> {
    match handler {
        Some(h) => Ok(h),
        None if kinds.kinds.is_empty() && kinds.fallback.is_none() => Err(Error::InvalidInput(
            "the worker has no handler: give it one with handle, handle_any, handle_rows or \
             handler"
                .into(),
        )),
        None if crate::queue::served(claimer).is_none() => Err(Error::InvalidInput(
            "handle and handle_any take jobs of the managed queue; for rows of your own table \
             use handle_rows or handler"
                .into(),
        )),
        None => Ok(Arc::new(kinds)),
    }
}

/// Runs the runtime with the worker's schedules beside it, and drains it when `shutdown`
/// completes.
async fn run_beside(
    runner: impl Future<Output = Result<WorkerReport>>,
    scheduling: impl Future<Output = ()>,
    phase: Arc<watch::Sender<Phase>>,
    shutdown: impl Future<Output = ()>,
) -> Result<WorkerReport> {
    tokio::pin!(runner);
    tokio::pin!(scheduling);
    tokio::pin!(shutdown);
    let mut asked = false;
    loop {
        tokio::select! {
            report = &mut runner => return report,
            () = &mut scheduling => {}
            () = &mut shutdown, if !asked => {
                asked = true;
                Shutdown(phase.clone()).drain();
            }
        }
    }
}
