//! The runtime under [`crate::Worker`] and `rowclaim work`.
//!
//! One loop claims rows ahead into a local queue and starts them as slots free up. Each claim
//! has a heartbeat that renews its lease; each started row has a supervisor that runs the
//! handler on a task of its own, stops it on timeout, lost lease or shutdown, and records the
//! result. Everything that talks to the database treats a failure as weather: it waits (growing,
//! jittered pauses) and tries again, reporting through one [`Health`].
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

mod held;
mod settle;
mod supervise;
mod tally;

use held::Held;
use settle::{settler, FlushMetrics, Recorder, Settling};
use supervise::{heartbeat, supervise};
use tally::{add, Counter, Tally};

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::Instrument;

use super::handler::{Handler, StopReason, Task, TaskResult};
use super::outage::{pause, Health};
use super::WorkerReport;
use crate::backend::Outcome;
use crate::metrics::{secs, Running, WorkerMetrics};
use crate::{backoff, Claim, ClaimedRow, Claimer, Error, Job, Result, RowId, Strategy, Wakeups};

/// What the runtime was asked to do.
pub(crate) struct Config {
    pub concurrency: usize,
    /// Most rows per claim statement.
    pub batch: u32,
    /// Most rows held at once: running plus waiting for a slot.
    pub most: usize,
    /// Claim again only once the rows waiting for a slot are this few (half the prefetch), so
    /// that claims come in batches rather than a row each time a job ends.
    pub refill: usize,
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
    /// Results go to the settler, which writes them in batches.
    settles: mpsc::UnboundedSender<Settling<Held>>,
}

impl Shared {
    /// How long one renewal or result may take before it counts as lost and is tried again:
    /// a third of the lease (at least 2 s), and never past `until`.
    fn attempt_timeout(&self, until: Instant) -> Duration {
        let most = (self.cfg.lease / 3).max(Duration::from_secs(2));
        until.saturating_duration_since(Instant::now()).min(most)
    }

    /// How long a claim may take (claims retry deadlocks and lost races inside). Rows claimed
    /// after longer than their lease would come back already expired.
    fn claim_timeout(&self) -> Duration {
        self.cfg
            .lease
            .clamp(Duration::from_secs(2), Duration::from_secs(30))
    }

    /// How results are recorded.
    fn recorder(&self) -> Recorder<'_, Held> {
        Recorder {
            settles: &self.settles,
            tally: &self.tally,
            health: &self.health,
            hurry: &self.hurry,
            renews: self.renews,
            attempt_most: (self.cfg.lease / 3).max(Duration::from_secs(2)),
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
}

/// Records a finished row's result (see [`Recorder::record`]).
async fn record(sh: Arc<Shared>, finished: Finished) {
    let Finished {
        held,
        id,
        outcome,
        counter,
    } = finished;
    let counter = sh.tally.of(counter);
    sh.recorder().record(&held, &id, outcome, counter).await;
}

/// A task that is aborted when this handle is dropped, so that nothing outlives the worker.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type Claiming = Pin<Box<dyn Future<Output = Option<Result<Claim>>> + Send>>;

/// Runs the worker until `--until-empty` finds nothing left, the phase leaves [`Phase::Run`], or
/// a handler aborts; then shuts down as the phase says.
pub(crate) async fn run(
    claimer: Claimer,
    handler: Arc<dyn Handler>,
    cfg: Config,
    wakeups: Option<Wakeups>,
    mut phase: watch::Receiver<Phase>,
) -> Result<WorkerReport> {
    let (settles, results) = mpsc::unbounded_channel();
    let flush_limit = (cfg.lease / 3).max(Duration::from_secs(2));
    let metrics = WorkerMetrics::of(&claimer);
    let _settler = AbortOnDrop(tokio::spawn(settler(
        results,
        cfg.settle_delay,
        flush_limit,
        FlushMetrics::of(&metrics),
    )));
    let sh = Arc::new(Shared {
        settles,
        health: Health::new(claimer.db().endpoint(), metrics.outages.clone()),
        managed: claimer.managed_queues().is_some(),
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
    });
    let wake = Arc::new(Notify::new());
    let _listener = wakeups
        .filter(Wakeups::listening)
        .map(|w| AbortOnDrop(tokio::spawn(listen(w, wake.clone()))));
    // The paused queues, looked at every heartbeat: claims skip them by themselves, and rows
    // claimed ahead of a pause are given back instead of started.
    let (paused_tx, mut paused) = watch::channel(Paused::default());
    let _paused_watch = sh
        .managed
        .then(|| AbortOnDrop(tokio::spawn(watch_paused(sh.clone(), paused_tx))));

    let mut waiting: VecDeque<(Arc<Held>, ClaimedRow)> = VecDeque::new();
    // Supervisors of started rows, results being recorded, heartbeats of claims: dropping these
    // sets aborts them. A job's slot is free once its handler ended; its result is recorded in
    // the background, in batches, and counts against the rows the worker may hold.
    let mut jobs: JoinSet<Option<Finished>> = JoinSet::new();
    let mut records: JoinSet<()> = JoinSet::new();
    let mut beats: JoinSet<()> = JoinSet::new();
    let mut helds: Vec<Arc<Held>> = Vec::new();
    let mut claiming: Option<Claiming> = None;
    let mut failures = 0u32;
    let mut failing_since: Option<Instant> = None;
    let mut retry_at: Option<Instant> = None;
    // The last claim came back empty: look again at this time, or at a wake-up.
    let mut idle_until: Option<Instant> = None;
    let mut outcome: Result<()> = Ok(());

    loop {
        if *phase.borrow() != Phase::Run || sh.aborted() {
            break;
        }
        // Start waiting rows while slots are free.
        while jobs.len() < sh.cfg.concurrency {
            let Some((held, row)) = waiting.pop_front() else {
                break;
            };
            if !held.claim.is_open(&row.id) {
                // A heartbeat found it taken over, or gave it up, before it started.
                add(sh.tally.gone(&held.lease));
                continue;
            }
            if paused.borrow().holds(&row) {
                records.spawn(record(sh.clone(), unstarted(held, &row)));
                continue;
            }
            if !held.lease.may_start(sh.renews) {
                // Its lease could not be confirmed in time: another worker may hold it by now.
                tracing::debug!("row {}: not started, its lease may have ended", row.id);
                held.give_up(std::slice::from_ref(&row.id));
                add(&sh.tally.given_up);
                continue;
            }
            let span = tracing::info_span!(
                "job",
                id = %row.id,
                token = %held.claim.token(),
                source = %sh.claimer.source_name(),
                queue = tracing::field::Empty,
                kind = tracing::field::Empty,
                attempt = tracing::field::Empty,
            );
            jobs.spawn(supervise(sh.clone(), held, row).instrument(span));
        }
        helds.retain(|h| h.claim.open_count() > 0);
        while beats.try_join_next().is_some() {}

        let room = sh
            .cfg
            .most
            .saturating_sub(jobs.len() + waiting.len() + records.len())
            .min(sh.cfg.batch as usize);
        let wanted = room > 0 && waiting.len() <= sh.cfg.refill;
        if claiming.is_none() && wanted && idle_until.is_none() && retry_at.is_none() {
            claiming = Some(Box::pin(claim_rows(sh.clone(), room as u32)));
        }

        tokio::select! {
            biased;
            _ = phase.changed() => {}
            () = sh.fatal_set.notified() => {}
            Some(ended) = jobs.join_next(), if !jobs.is_empty() => {
                if let Ok(Some(finished)) = ended {
                    records.spawn(record(sh.clone(), finished));
                }
            }
            Some(_) = records.join_next(), if !records.is_empty() => {
                if sh.cfg.until_empty {
                    // A recorded result may have put its row back (a retry, a release): look
                    // again.
                    idle_until = None;
                }
            }
            got = async {
                match claiming.as_mut() {
                    Some(c) => c.await,
                    None => std::future::pending().await,
                }
            }, if claiming.is_some() => {
                claiming = None;
                match got {
                    Some(Ok(claim)) => {
                        sh.health.claims_work();
                        (failures, failing_since) = (0, None);
                        if claim.is_empty() {
                            let nothing_running =
                                jobs.is_empty() && waiting.is_empty() && records.is_empty();
                            if sh.cfg.until_empty && nothing_running && no_work_left(&sh).await {
                                break;
                            }
                            idle_until = Some(Instant::now() + sh.cfg.poll);
                            continue;
                        }
                        let mut claim = claim;
                        let rows = claim.take_rows();
                        let held = Held::new(claim, sh.claimer.strategy() == Strategy::Transaction);
                        waiting.extend(rows.into_iter().map(|row| (held.clone(), row)));
                        if sh.renews {
                            beats.spawn(heartbeat(sh.clone(), held.clone()));
                        }
                        helds.push(held);
                    }
                    Some(Err(e)) if !e.is_connection() && !matches!(e, Error::Database(_)) => {
                        outcome = Err(e);
                        break;
                    }
                    failed => {
                        let why = match &failed {
                            Some(Err(e)) => {
                                sh.health.failed("claiming rows", e);
                                e.to_string()
                            }
                            _ => {
                                let why = format!(
                                    "no answer within {}",
                                    humantime::format_duration(sh.claim_timeout())
                                );
                                sh.health.unreachable("claiming rows", &why);
                                why
                            }
                        };
                        let since = *failing_since.get_or_insert_with(Instant::now);
                        let lasted = since.elapsed();
                        if sh.cfg.give_up_after.is_some_and(|limit| lasted >= limit) {
                            outcome = Err(Error::GaveUp { lasted, last: why });
                            break;
                        }
                        retry_at = Some(Instant::now() + pause(failures));
                        failures += 1;
                    }
                }
            }
            Ok(()) = paused.changed(), if sh.managed => {
                // Rows of a queue paused since they were claimed go back, not started.
                let now_paused = paused.borrow_and_update().clone();
                let (back, keep): (Vec<_>, Vec<_>) =
                    waiting.drain(..).partition(|(_, row)| now_paused.holds(row));
                waiting.extend(keep);
                for (held, row) in back {
                    records.spawn(record(sh.clone(), unstarted(held, &row)));
                }
            }
            () = sleep_until(retry_at), if retry_at.is_some() => retry_at = None,
            () = wake.notified(), if idle_until.is_some() => idle_until = None,
            () = sleep_until(idle_until), if idle_until.is_some() => idle_until = None,
        }
    }

    // ---- Shutdown: rows not started go back; running jobs get the grace period (none when
    // stopping now), then are stopped, and their supervisors give their rows back.
    let stopping_now = |p: &watch::Receiver<Phase>| *p.borrow() == Phase::Now;
    let mut wait_for_now = phase.clone();
    let now = async move {
        // The switch outlives this function (the caller holds it), so this only ends on Now.
        if wait_for_now.wait_for(|p| *p == Phase::Now).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(now);
    if let Some(claiming) = claiming.take() {
        // A claim under way finishes, so that its rows go back now rather than at lease end.
        if !stopping_now(&phase) && outcome.is_ok() {
            tokio::select! {
                got = claiming => if let Some(Ok(mut claim)) = got {
                    let rows = claim.take_rows();
                    let held = Held::new(claim, sh.claimer.strategy() == Strategy::Transaction);
                    waiting.extend(rows.into_iter().map(|row| (held.clone(), row)));
                    helds.push(held);
                },
                () = &mut now => {}
            }
        }
    }
    tokio::select! {
        () = release_waiting(&sh, waiting) => {}
        () = &mut now => {}
    }
    if !stopping_now(&phase) && outcome.is_ok() && !sh.aborted() {
        let grace = tokio::time::sleep(sh.cfg.grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                ended = jobs.join_next() => match ended {
                    Some(Ok(Some(finished))) => { records.spawn(record(sh.clone(), finished)); }
                    Some(_) => {}
                    None => break,
                },
                () = &mut grace => break,
                () = &mut now => break,
            }
        }
    }
    let interrupted = stopping_now(&phase);
    sh.hurry
        .store(interrupted || outcome.is_err(), Ordering::SeqCst);
    sh.closing.store(true, Ordering::SeqCst);
    for held in &helds {
        held.stop_all(StopReason::Shutdown);
    }
    // Supervisors end soon after a stop: the handler's wind-down, then giving the row back.
    // Past that, whatever is left comes back through its lease.
    let wind_down = sh.handler.stop_grace() + Duration::from_secs(10);
    let _ = tokio::time::timeout(wind_down, async {
        while let Some(ended) = jobs.join_next().await {
            if let Ok(Some(finished)) = ended {
                records.spawn(record(sh.clone(), finished));
            }
        }
        while records.join_next().await.is_some() {}
    })
    .await;
    jobs.abort_all();
    records.abort_all();
    beats.abort_all();

    let fatal = sh.fatal.lock().map(|mut f| f.take()).unwrap_or(None);
    if let Some(e) = fatal {
        return Err(e);
    }
    outcome?;
    Ok(sh.tally.report(sh.health.outages(), interrupted))
}

/// One claim statement of up to `most` rows, within the claim's time limit (`None`: no answer
/// in time), measured and traced.
async fn claim_rows(sh: Arc<Shared>, most: u32) -> Option<Result<Claim>> {
    let span = tracing::debug_span!(
        "claim",
        source = %sh.claimer.source_name(),
        strategy = %sh.claimer.strategy(),
        most,
        rows = tracing::field::Empty,
        token = tracing::field::Empty,
    );
    let started = Instant::now();
    let claim = sh
        .claimer
        .claim(most, sh.cfg.lease)
        .instrument(span.clone());
    let got = tokio::time::timeout(sh.claim_timeout(), claim).await.ok();
    let m = &sh.metrics;
    m.claim_seconds.record(secs(started.elapsed()));
    match &got {
        Some(Ok(claim)) if claim.is_empty() => m.claims_empty.increment(1),
        Some(Ok(claim)) => {
            m.claims_rows.increment(1);
            m.claimed_rows.increment(claim.len() as u64);
            span.record("rows", claim.len());
            span.record("token", tracing::field::display(claim.token()));
        }
        _ => m.claims_failed.increment(1),
    }
    got
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Under `--until-empty`, after an empty claim with nothing running: whether no row is left
/// that could still need a worker. When the count fails, the answer is "some may be".
async fn no_work_left(sh: &Shared) -> bool {
    match tokio::time::timeout(sh.claim_timeout(), sh.claimer.backlog()).await {
        Ok(Ok(backlog)) => {
            let scheduled = sh.cfg.wait_scheduled && backlog.scheduled > 0;
            !(backlog.has_work() || scheduled)
        }
        Ok(Err(e)) => {
            sh.health.failed("counting the rows left", &e);
            false
        }
        Err(_) => {
            sh.health
                .unreachable("counting the rows left", &"no answer in time");
            false
        }
    }
}

/// Gives back rows that never started, one statement per claim, all claims at once. One try
/// each, within a few seconds: at shutdown there is no time to wait out an outage; rows not
/// given back come back through their lease.
async fn release_waiting(sh: &Shared, waiting: VecDeque<(Arc<Held>, ClaimedRow)>) {
    let mut by_claim: Vec<(Arc<Held>, Vec<RowId>)> = Vec::new();
    for (held, row) in waiting {
        match by_claim.iter_mut().find(|(h, _)| Arc::ptr_eq(h, &held)) {
            Some((_, ids)) => ids.push(row.id),
            None => by_claim.push((held, vec![row.id])),
        }
    }
    let mut releases = JoinSet::new();
    for (held, ids) in by_claim {
        releases.spawn(async move {
            let limit = Duration::from_secs(5);
            let result = tokio::time::timeout(limit, held.claim.release_rows(&ids)).await;
            (held, ids, result)
        });
    }
    while let Some(Ok((held, ids, result))) = releases.join_next().await {
        match result {
            Ok(Ok(lost)) => {
                let released = ids.len() - lost.len();
                sh.tally.released.add(released as u64);
                sh.tally.lost.add(lost.len() as u64);
            }
            failed => {
                if let Ok(Err(e)) = failed {
                    tracing::warn!(
                        "giving back {} unstarted row(s): {e}; they come back when their lease \
                         ends",
                        ids.len()
                    );
                }
                held.give_up(&ids);
                sh.tally.given_up.add(ids.len() as u64);
            }
        }
    }
}

/// The managed queues that are paused, as a worker last looked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Paused(std::collections::HashSet<String>);

impl Paused {
    /// Whether `row`, a managed job, is of a paused queue.
    fn holds(&self, row: &ClaimedRow) -> bool {
        !self.0.is_empty()
            && row
                .data
                .get("queue")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|q| self.0.contains(q))
    }
}

/// A row claimed but not started, given back: its queue was paused meanwhile.
fn unstarted(held: Arc<Held>, row: &ClaimedRow) -> Finished {
    tracing::debug!(
        "row {}: its queue is paused; given back, not started",
        row.id
    );
    Finished {
        held,
        id: row.id.clone(),
        outcome: Outcome::Unstarted,
        counter: Counter::Released,
    }
}

/// Looks at the paused queues every third of the lease (as often as heartbeats renew it), for
/// as long as the worker runs. A look that fails keeps the last answer.
async fn watch_paused(sh: Arc<Shared>, paused: watch::Sender<Paused>) {
    let every = (sh.cfg.lease / 3).max(Duration::from_millis(100));
    let queue = sh.claimer.db().queue();
    loop {
        match queue.paused().await {
            Ok(names) => {
                let now = Paused(names.into_iter().collect());
                paused.send_if_modified(|p| {
                    let changed = *p != now;
                    *p = now;
                    changed
                });
            }
            Err(e) => tracing::debug!("looking at the paused queues: {e}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// Wakes the claim loop when a job is enqueued (PostgreSQL LISTEN). After the listening
/// connection broke and came back, jobs may have been missed: it wakes the loop then too.
async fn listen(mut wakeups: Wakeups, wake: Arc<Notify>) {
    let mut failures = 0u32;
    loop {
        match wakeups.next().await {
            Ok(()) => failures = 0,
            Err(e) => {
                tracing::debug!("listening for new jobs: {e}");
                tokio::time::sleep(pause(failures)).await;
                failures += 1;
            }
        }
        wake.notify_one();
    }
}
