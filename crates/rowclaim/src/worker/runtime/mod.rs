//! The runtime under [`crate::Worker`] and `rowclaim work`.
//!
//! One loop claims rows ahead into a local queue and starts them as slots free up. Each claim
//! has a heartbeat that renews its lease; each started row has a supervisor that runs the
//! handler, stops it on timeout, lost lease or shutdown, and hands the result to the settler.
//! The supervisors are futures the claim loop's task drives side by side ([`dispatch::Jobs`]),
//! not tasks: a job costs no spawn and no wake-up of another thread. Everything that talks to the database treats a failure as weather: it waits (growing,
//! jittered pauses) and tries again, reporting through one [`Health`].
//!
//! Its roles, one module each, in the order a row meets them:
//! - [`producer`]: the claim loop. Claims rows ahead into the local queue while there is room
//!   (up to two skip-locked claims under way at once on a server), backs off while claims
//!   fail, idles after an empty claim until the poll interval passes or a notification wakes
//!   it.
//! - [`dispatch`]: starts waiting rows in free slots ([`waiting`]: in the claims' order, a
//!   line's rows one after another); rows of a queue paused since they were claimed go back
//!   unstarted, rows whose lease may have ended are given up.
//! - [`supervise`]: one running job: its handler under a time limit and stop requests, its end
//!   turned into the outcome to record.
//! - [`heartbeat`]: renews one claim's lease while it has open rows.
//! - [`settle`]: results written in batches by one settler, each retried until its lease would
//!   end; written against the small [`settle::Settle`] trait, which [`Held`] implements.
//! - [`shutdown`]: drain, grace period, stop now, rows not started given back.
//!
//! [`held`] is one claim as the runtime looks after it, [`tally`] the report's counts, [`pace`]
//! how far ahead it claims.
//!
//! Time rules, all by this process's monotonic clock:
//! - a claim's lease is *confirmed* at the moment the claim (or the last successful renewal) was
//!   sent; the database computed the lease end later than that, so `confirmed + lease` is never
//!   later than the database's own deadline;
//! - a waiting row is started only while `confirmed + lease - margin` is still ahead; otherwise
//!   another worker may already hold it, and it is given up;
//! - renewals are retried until a little before `confirmed + lease` (the time the handler needs
//!   to stop), results until `confirmed + lease`; then the rows are given up (they come back
//!   through their lease) and their running jobs stopped.
//!
//! Rows are given up only through [`Held::give_up`], which also stops their jobs; and every
//! heartbeat stops any running job whose row its claim no longer looks after, however it got
//! there. So a job never runs on for a row this worker let go.

mod breaks;
mod dispatch;
mod heartbeat;
mod held;
mod lease;
mod pace;
mod producer;
mod results;
mod settle;
mod shutdown;
mod supervise;
mod tally;
mod turns;
mod waiting;

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::handler::Handler;
use super::outage::Health;
use super::WorkerReport;
use crate::backend::Outcome;
use crate::claim::Claimer;
use crate::error::{Error, Result};
use crate::id::RowId;
use crate::metrics::{JobSeries, WorkerMetrics};
use crate::queue::Wakeups;
use crate::strategy::Strategy;
use dispatch::{watch_paused, Local, Paused};
use held::Held;
use producer::{listen, Producer};
use results::Results;
use settle::{settler, FlushMetrics, Recorder, Settling};
use tally::{Counter, Tally};
use turns::WriteTurns;

/// What the runtime was asked to do.
pub(crate) struct Config {
    pub concurrency: usize,
    /// Rows claimed ahead of the running ones: set, or `None` to adapt (see [`pace`]).
    pub prefetch: Option<usize>,
    /// Most rows per claim statement: set, or `None` for the room left.
    pub batch: Option<u32>,
    pub lease: Duration,
    pub poll: Duration,
    pub grace: Duration,
    pub timeout: Option<Duration>,
    pub give_up_after: Option<Duration>,
    pub until_empty: bool,
    /// With `until_empty`: jobs scheduled for later are work left too.
    pub wait_scheduled: bool,
    /// How long the settler waits for more results after the first of a batch.
    pub settle_delay: Duration,
}

/// Where the worker is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Run,
    /// Claim nothing more; running jobs get the grace period.
    Drain,
    /// Stop every job now.
    Now,
}

/// A row whose job is over, with the outcome to record.
struct Finished {
    held: Arc<Held>,
    id: RowId,
    outcome: Outcome,
    counter: Counter,
    /// The series of the job's queue and kind, where its outcome is recorded.
    series: Arc<JobSeries>,
}

/// What every task of one worker shares.
struct Shared {
    claimer: Claimer,
    handler: Arc<dyn Handler>,
    cfg: Config,
    health: Health,
    tally: Tally,
    metrics: WorkerMetrics,
    /// The rows are jobs of the managed queue (retries with backoff, dead after the last attempt).
    managed: bool,
    /// Claims have leases to renew.
    renews: bool,
    /// Set when a handler aborted: the worker stops with this error.
    fatal: Mutex<Option<Error>>,
    fatal_set: Notify,
    /// The worker stops its jobs: a supervisor that starts after this gives its row back.
    closing: AtomicBool,
    /// Stopping now: a result gets one try, not retries until its lease ends.
    hurry: AtomicBool,
    /// A snooze this source cannot keep has been warned of (once per worker).
    snooze_warned: AtomicBool,
    /// Results on their way to the database.
    results: Results,
    /// Results go to the settler, which writes them in batches.
    settles: mpsc::UnboundedSender<Settling<Held>>,
    /// Handlers running now, for the worker registry's heartbeat.
    running: Arc<AtomicUsize>,
    /// Its claims' and flushes' turns at the write lock (SQLite).
    turns: WriteTurns,
}

impl Shared {
    fn new(
        claimer: Claimer,
        handler: Arc<dyn Handler>,
        cfg: Config,
        settles: mpsc::UnboundedSender<Settling<Held>>,
        running: Arc<AtomicUsize>,
    ) -> Shared {
        let metrics = WorkerMetrics::of(&claimer);
        // A claim of the transaction strategy holds the write lock until its rows are settled,
        // through its own transaction: a claim waiting its turn would hold up that settle.
        let turns = WriteTurns::new(
            claimer.db().backend.one_writer() && claimer.strategy() != Strategy::Transaction,
        );
        Shared {
            settles,
            health: Health::new(
                claimer.db().endpoint(),
                claimer.db().backend.one_writer(),
                metrics.outages.clone(),
            ),
            managed: crate::queue::served(&claimer).is_some(),
            renews: claimer.claims_expire() || claimer.strategy() == Strategy::Transaction,
            claimer,
            handler,
            cfg,
            tally: Tally::new(&metrics),
            metrics,
            fatal: Mutex::new(None),
            fatal_set: Notify::new(),
            closing: AtomicBool::new(false),
            hurry: AtomicBool::new(false),
            snooze_warned: AtomicBool::new(false),
            results: Results::default(),
            running,
            turns,
        }
    }

    /// The longest one renewal, result or flush may take before it counts as lost and is tried
    /// again: a third of the lease, at least 2 s. On SQLite, the lease: a statement there is
    /// never lost, only waiting for the write lock, and one cut short may still go through
    /// after its answer was given up on (a result then looks refused when tried again). The
    /// lease's end still bounds every try.
    fn attempt_most(&self) -> Duration {
        if self.one_writer() {
            return self.cfg.lease.max(Duration::from_secs(2));
        }
        (self.cfg.lease / 3).max(Duration::from_secs(2))
    }

    /// Whether the database is SQLite (see [`crate::backend::Backend::one_writer`]).
    fn one_writer(&self) -> bool {
        self.claimer.db().backend.one_writer()
    }

    /// How long one renewal or result may take: [`Shared::attempt_most`], and never past
    /// `until`.
    fn attempt_timeout(&self, until: Instant) -> Duration {
        until
            .saturating_duration_since(Instant::now())
            .min(self.attempt_most())
    }

    /// How long a claim may take (claims retry deadlocks and lost races inside). Rows claimed
    /// after longer than their lease would come back already expired.
    fn claim_timeout(&self) -> Duration {
        self.cfg
            .lease
            .clamp(Duration::from_secs(2), Duration::from_secs(30))
    }

    /// Whether claims of this worker hold a transaction each.
    fn holds_transactions(&self) -> bool {
        self.claimer.strategy() == Strategy::Transaction
    }

    /// How results are recorded.
    fn recorder(&self) -> Recorder<'_, Held> {
        Recorder {
            settles: &self.settles,
            tally: &self.tally,
            health: &self.health,
            hurry: &self.hurry,
            renews: self.renews,
            attempt_most: self.attempt_most(),
        }
    }

    fn abort(&self, e: Error) {
        let mut fatal = self.fatal.lock().unwrap_or_else(|p| p.into_inner());
        fatal.get_or_insert(e);
        self.fatal_set.notify_one();
    }

    fn aborted(&self) -> bool {
        self.fatal.lock().map(|f| f.is_some()).unwrap_or(true)
    }

    fn take_fatal(&self) -> Option<Error> {
        self.fatal.lock().map(|mut f| f.take()).unwrap_or(None)
    }
}

/// A task that is aborted when this handle is dropped, so that nothing outlives the worker.
pub(super) struct AbortOnDrop<T>(pub(super) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs the worker until `--until-empty` finds nothing left, the phase leaves [`Phase::Run`], or
/// a handler aborts; then shuts down as the phase says.
pub(crate) async fn run(
    claimer: Claimer,
    handler: Arc<dyn Handler>,
    cfg: Config,
    wakeups: Option<Wakeups>,
    mut phase: watch::Receiver<Phase>,
    running: Arc<AtomicUsize>,
) -> Result<WorkerReport> {
    let (settles, results) = mpsc::unbounded_channel();
    let sh = Arc::new(Shared::new(claimer, handler, cfg, settles, running));
    // Results wait for company unless written results free room for the next claim: under
    // limits, or where a claim holds its transaction until its rows are written.
    let claimer = sh.claimer.clone();
    let holds_transactions = sh.holds_transactions();
    let _settler = AbortOnDrop(tokio::spawn(settler(
        results,
        sh.cfg.settle_delay,
        sh.attempt_most(),
        FlushMetrics::of(&sh.metrics),
        sh.turns.clone(),
        move || !holds_transactions && !claimer.limited(),
    )));
    let wake = Arc::new(Notify::new());
    let _listener = wakeups
        .filter(Wakeups::listening)
        .map(|w| AbortOnDrop(tokio::spawn(listen(w, wake.clone()))));
    // The paused queues, looked at every heartbeat: claims skip them by themselves, and rows
    // claimed ahead of a pause are given back instead of started.
    let (paused_tx, paused) = watch::channel(Paused::default());
    let _paused_watch = sh
        .managed
        .then(|| AbortOnDrop(tokio::spawn(watch_paused(sh.clone(), paused_tx))));

    let mut local = Local::new(&sh);
    let mut producer = Producer::new(&sh, paused, wake);
    let outcome = producer.run(&sh, &mut local, &mut phase).await;
    let under_way = producer.under_way();
    let interrupted = shutdown::shutdown(&sh, local, under_way, &phase, outcome.is_ok()).await;

    if let Some(e) = sh.take_fatal() {
        return Err(e);
    }
    outcome?;
    let mut report = sh.tally.report(sh.health.outages(), interrupted);
    if sh.cfg.until_empty && !interrupted {
        report.finished_later = finished_later(&sh).await;
    }
    if sh.managed && report.lost > 0 {
        report.cancelled = cancelled(&sh).await;
    }
    Ok(report)
}

/// Of the jobs this worker lost, how many were cancelled (not taken by another worker). A look
/// that fails counts none: they stay counted as lost.
async fn cancelled(sh: &Shared) -> u64 {
    let ids = sh.tally.lost_ids();
    let look = async {
        let mut n = 0;
        for id in &ids {
            let row = sh.claimer.row(id).await?;
            n += u64::from(row.is_some_and(|r| r.status == "cancelled"));
        }
        Ok::<u64, Error>(n)
    };
    match tokio::time::timeout(sh.claim_timeout(), look).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            tracing::warn!("looking at which lost jobs were cancelled: {e}");
            0
        }
        Err(_) => 0,
    }
}

/// After an `--until-empty` run found nothing left: how many of the rows this worker gave up or
/// lost ended done all the same. Nothing is ready or claimed any more, so each has ended. A
/// look that fails counts none (the run then reports them as not known to be done).
async fn finished_later(sh: &Shared) -> u64 {
    let ids = sh.tally.let_go();
    if ids.is_empty() {
        return 0;
    }
    let why = match tokio::time::timeout(sh.claim_timeout(), sh.claimer.ended_done(&ids)).await {
        Ok(Ok(n)) => return n,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer in time".to_owned(),
    };
    tracing::warn!(
        "looking at how the {} row(s) given up or lost ended: {why}",
        ids.len()
    );
    0
}
