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
//! - renewals and results are retried until `confirmed + lease`; then the row is given up (it
//!   comes back through its lease), and its job, if still running, is stopped.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::handler::{Handler, StopReason, Task, TaskResult};
use super::outage::{pause, Health};
use super::WorkerReport;
use crate::backend::Outcome;
use crate::{backoff, Claim, ClaimedRow, Claimer, Error, Job, Result, RowId, Strategy, Wakeups};

/// What the runtime was asked to do.
pub(crate) struct Config {
    pub concurrency: usize,
    /// Most rows per claim statement.
    pub batch: u32,
    /// Most rows held at once: running plus waiting for a slot.
    pub most: usize,
    pub lease: Duration,
    pub poll: Duration,
    pub grace: Duration,
    pub timeout: Option<Duration>,
    pub give_up_after: Option<Duration>,
    pub until_empty: bool,
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

#[derive(Default)]
struct Tally {
    completed: AtomicU64,
    retried: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    released: AtomicU64,
    lost: AtomicU64,
    given_up: AtomicU64,
    unconfirmed: AtomicU64,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What every task of one worker shares.
struct Shared {
    claimer: Claimer,
    handler: Arc<dyn Handler>,
    cfg: Config,
    health: Health,
    tally: Tally,
    /// The rows are jobs of the managed queue (retries with backoff, dead after the last attempt).
    managed: bool,
    /// Claims have leases to renew.
    renews: bool,
    /// Set when a handler aborted: the worker stops with this error.
    fatal: Mutex<Option<Error>>,
    fatal_set: Notify,
}

impl Shared {
    /// How long one renewal or result may take before it counts as lost and is tried again:
    /// a third of the lease (at least 2 s), and never past the end of the lease.
    fn attempt_timeout(&self, lease_end: Instant) -> Duration {
        let most = (self.cfg.lease / 3).max(Duration::from_secs(2));
        lease_end
            .saturating_duration_since(Instant::now())
            .min(most)
    }

    /// How long a claim may take: claims retry deadlocks and lost races inside, so be generous.
    fn claim_timeout(&self) -> Duration {
        self.cfg.lease.max(Duration::from_secs(10))
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

/// One claim, as the runtime looks after it.
struct Held {
    claim: Claim,
    lease: Duration,
    /// When the database last confirmed the lease (see the module docs).
    confirmed: Mutex<Instant>,
    /// Stop switches of the claim's rows that are running.
    running: Mutex<HashMap<RowId, watch::Sender<Option<StopReason>>>>,
    /// The heartbeat gave the whole claim up (its lease could not be renewed in time).
    abandoned: std::sync::atomic::AtomicBool,
}

impl Held {
    fn lease_end(&self) -> Instant {
        *self.confirmed.lock().unwrap_or_else(|p| p.into_inner()) + self.lease
    }

    fn confirm(&self, sent: Instant) {
        let mut c = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        *c = (*c).max(sent);
    }

    /// Whether a waiting row may start: its lease is known to last a while yet. The margin (a
    /// quarter of the lease) leaves the heartbeat, which renews every third, time to act.
    fn may_start(&self, renews: bool) -> bool {
        !renews || Instant::now() + self.lease / 4 < self.lease_end()
    }

    fn stop(&self, ids: &[RowId], reason: StopReason) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            if let Some(switch) = running.get(id) {
                let _ = switch.send(Some(reason));
            }
        }
    }

    fn stop_all(&self, reason: StopReason) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for switch in running.values() {
            let _ = switch.send(Some(reason));
        }
    }
}

type Claiming = Pin<Box<dyn Future<Output = (Instant, Option<Result<Claim>>)> + Send>>;

/// Runs the worker until `--until-empty` finds nothing left, the phase leaves [`Phase::Run`], or
/// a handler aborts; then shuts down as the phase says.
pub(crate) async fn run(
    claimer: Claimer,
    handler: Arc<dyn Handler>,
    cfg: Config,
    wakeups: Option<Wakeups>,
    mut phase: watch::Receiver<Phase>,
) -> Result<WorkerReport> {
    let sh = Arc::new(Shared {
        health: Health::new(claimer.db().endpoint()),
        managed: claimer.managed_queues().is_some(),
        renews: claimer.claims_expire() || claimer.strategy() == Strategy::Transaction,
        claimer,
        handler,
        cfg,
        tally: Tally::default(),
        fatal: Mutex::new(None),
        fatal_set: Notify::new(),
    });
    let wake = Arc::new(Notify::new());
    let listener = wakeups
        .filter(Wakeups::listening)
        .map(|w| tokio::spawn(listen(w, wake.clone())));

    let mut waiting: VecDeque<(Arc<Held>, ClaimedRow)> = VecDeque::new();
    let mut jobs: JoinSet<()> = JoinSet::new();
    let mut helds: Vec<Arc<Held>> = Vec::new();
    let mut claiming: Option<Claiming> = None;
    let mut failures = 0u32;
    let mut retry_at: Option<Instant> = None;
    // The last claim came back empty: wait for a wake-up, the poll interval or a job's end.
    let mut idle = false;
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
                add(if held.abandoned.load(Ordering::Relaxed) {
                    &sh.tally.given_up
                } else {
                    &sh.tally.lost
                });
                continue;
            }
            if !held.may_start(sh.renews) {
                // Its lease could not be confirmed in time: another worker may hold it by now.
                held.claim.forget(&row.id);
                add(&sh.tally.given_up);
                tracing::debug!("row {}: not started, its lease may have ended", row.id);
                continue;
            }
            jobs.spawn(supervise(sh.clone(), held, row));
        }
        helds.retain(|h| h.claim.open_count() > 0);

        let room = sh
            .cfg
            .most
            .saturating_sub(jobs.len() + waiting.len())
            .min(sh.cfg.batch as usize);
        if claiming.is_none() && room > 0 && !idle && retry_at.is_none() {
            let (claimer, lease, limit) = (sh.claimer.clone(), sh.cfg.lease, sh.claim_timeout());
            claiming = Some(Box::pin(async move {
                let sent = Instant::now();
                let got = tokio::time::timeout(limit, claimer.claim(room as u32, lease)).await;
                (sent, got.ok())
            }));
        }

        tokio::select! {
            biased;
            _ = phase.changed() => {}
            () = sh.fatal_set.notified() => {}
            Some(_) = jobs.join_next(), if !jobs.is_empty() => {
                // Under --until-empty a finished job may have put its row back: look again.
                idle &= !sh.cfg.until_empty;
            }
            (sent, got) = async {
                match claiming.as_mut() {
                    Some(c) => c.await,
                    None => std::future::pending().await,
                }
            }, if claiming.is_some() => {
                claiming = None;
                match got {
                    Some(Ok(claim)) if claim.is_empty() => {
                        sh.health.answered();
                        failures = 0;
                        if sh.cfg.until_empty && jobs.is_empty() && waiting.is_empty() {
                            match sh.claimer.backlog().await {
                                Ok(b) if !b.has_work() => break,
                                Ok(_) => {}
                                Err(e) => {
                                    sh.health.failed("counting the rows left", &e);
                                }
                            }
                        }
                        idle = true;
                    }
                    Some(Ok(claim)) => {
                        sh.health.answered();
                        failures = 0;
                        let held = Arc::new(Held {
                            lease: claim.lease(),
                            confirmed: Mutex::new(sent),
                            running: Mutex::default(),
                            abandoned: Default::default(),
                            claim,
                        });
                        for row in held.claim.rows() {
                            waiting.push_back((held.clone(), row.clone()));
                        }
                        if sh.renews {
                            tokio::spawn(heartbeat(sh.clone(), held.clone()));
                        }
                        helds.push(held);
                    }
                    Some(Err(e)) if !e.is_connection() && !matches!(e, Error::Database(_)) => {
                        outcome = Err(e);
                        break;
                    }
                    failed => {
                        let why = match &failed {
                            Some(Err(e)) => e.to_string(),
                            _ => format!("no answer within {}", humantime::format_duration(sh.claim_timeout())),
                        };
                        let lasted = sh.health.failed("claiming rows", &why);
                        if sh.cfg.give_up_after.is_some_and(|limit| lasted >= limit) {
                            outcome = Err(Error::GaveUp { lasted, last: why });
                            break;
                        }
                        retry_at = Some(Instant::now() + pause(failures));
                        failures += 1;
                    }
                }
            }
            () = sleep_until(retry_at), if retry_at.is_some() => retry_at = None,
            () = wake.notified(), if idle => idle = false,
            () = tokio::time::sleep(sh.cfg.poll), if idle => idle = false,
        }
    }

    let stop_now = *phase.borrow() == Phase::Now || outcome.is_err();
    // A claim under way finishes (its rows are given back below), unless stopping now: then its
    // rows, if it got any, come back through their lease.
    if let Some(claiming) = claiming.take() {
        if !stop_now {
            if let (sent, Some(Ok(claim))) = claiming.await {
                let held = Arc::new(Held {
                    lease: claim.lease(),
                    confirmed: Mutex::new(sent),
                    running: Mutex::default(),
                    abandoned: Default::default(),
                    claim,
                });
                for row in held.claim.rows() {
                    waiting.push_back((held.clone(), row.clone()));
                }
                helds.push(held);
            }
        }
    }
    release_waiting(&sh, waiting).await;

    // Running jobs get the grace period (none when stopping now), then are stopped; their
    // supervisors give their rows back.
    if !stop_now && !jobs.is_empty() {
        let grace = tokio::time::sleep(sh.cfg.grace);
        tokio::pin!(grace);
        let now = async {
            // The switch outlives this function (the caller holds it), so this only ends on Now.
            if phase.wait_for(|p| *p == Phase::Now).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(now);
        loop {
            tokio::select! {
                r = jobs.join_next() => if r.is_none() { break },
                () = &mut grace => break,
                () = &mut now => break,
            }
        }
    }
    for held in &helds {
        held.stop_all(StopReason::Shutdown);
    }
    // Supervisors end soon after a stop: the handler's wind-down, then one try to give the row
    // back. Past that, whatever is left comes back through its lease.
    let wind_down = sh.handler.stop_grace() + Duration::from_secs(10);
    let _ = tokio::time::timeout(wind_down, async {
        while jobs.join_next().await.is_some() {}
    })
    .await;
    jobs.abort_all();
    if let Some(l) = listener {
        l.abort();
    }

    let fatal = sh.fatal.lock().map(|mut f| f.take()).unwrap_or(None);
    if let Some(e) = fatal {
        return Err(e);
    }
    outcome?;
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let t = &sh.tally;
    Ok(WorkerReport {
        completed: n(&t.completed),
        retried: n(&t.retried),
        failed: n(&t.failed),
        dead: n(&t.dead),
        released: n(&t.released),
        lost: n(&t.lost),
        given_up: n(&t.given_up),
        unconfirmed: n(&t.unconfirmed),
        outages: sh.health.outages(),
        interrupted: *phase.borrow() == Phase::Now,
    })
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Gives back rows that never started, one statement per claim. One try each, bounded: at
/// shutdown there is no time to wait out an outage, and unreleased rows come back through their
/// lease anyway.
async fn release_waiting(sh: &Shared, waiting: VecDeque<(Arc<Held>, ClaimedRow)>) {
    let mut by_claim: Vec<(Arc<Held>, Vec<RowId>)> = Vec::new();
    for (held, row) in waiting {
        match by_claim.iter_mut().find(|(h, _)| Arc::ptr_eq(h, &held)) {
            Some((_, ids)) => ids.push(row.id),
            None => by_claim.push((held, vec![row.id])),
        }
    }
    for (held, ids) in by_claim {
        let limit = Duration::from_secs(5).min(sh.claim_timeout());
        match tokio::time::timeout(limit, held.claim.release_rows(&ids)).await {
            Ok(Ok(lost)) => {
                let released = ids.len() - lost.len();
                sh.tally
                    .released
                    .fetch_add(released as u64, Ordering::Relaxed);
                sh.tally
                    .lost
                    .fetch_add(lost.len() as u64, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    "giving back {} unstarted row(s): {e}; they come back when their lease ends",
                    ids.len()
                );
                held.claim.abandon().await;
            }
            Err(_) => {
                held.claim.abandon().await;
            }
        }
    }
}

/// Renews one claim's lease every third of it until every row is settled or given up. A row it
/// finds lost is stopped; when renewals keep failing until the lease may have ended, every row
/// of the claim is given up and its running jobs stopped.
async fn heartbeat(sh: Arc<Shared>, held: Arc<Held>) {
    let every = held.lease / 3;
    let mut failures = 0u32;
    loop {
        let next = if failures == 0 {
            held.lease_end() - held.lease + every
        } else {
            Instant::now() + pause(failures - 1)
        };
        tokio::select! {
            () = tokio::time::sleep_until(next.min(held.lease_end())) => {}
            () = held.claim.all_settled() => {}
        }
        if held.claim.open_rows().is_empty() {
            return;
        }
        let sent = Instant::now();
        let limit = sh.attempt_timeout(held.lease_end());
        match tokio::time::timeout(limit, held.claim.beat()).await {
            Ok(Ok(lost)) => {
                sh.health.answered();
                held.confirm(sent);
                failures = 0;
                held.stop(&lost, StopReason::LeaseLost);
            }
            Ok(Err(e)) => {
                sh.health.failed("renewing leases", &e);
                failures += 1;
            }
            Err(_) => {
                sh.health.failed("renewing leases", &"no answer in time");
                failures += 1;
            }
        }
        if failures > 0 && Instant::now() >= held.lease_end() {
            // From now on another worker may hold these rows: stop their jobs, give them up.
            held.abandoned.store(true, Ordering::Relaxed);
            let rows = held.claim.abandon().await;
            tracing::debug!(
                "claim {}: lease not renewed in time, {} row(s) given up",
                held.claim.token(),
                rows.len()
            );
            held.stop_all(StopReason::LeaseLost);
            return;
        }
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

/// How a started row ended.
enum Ended {
    Result(TaskResult),
    Panicked(String),
    Stopped(StopReason),
}

/// Runs one row: the handler on a task of its own, watched for its time limit and for stop
/// requests; then records the result.
async fn supervise(sh: Arc<Shared>, held: Arc<Held>, row: ClaimedRow) {
    let id = row.id.clone();
    let job = if sh.managed {
        match Job::from_row(&row) {
            Ok(job) => Some(job),
            Err(e) => {
                let outcome = Outcome::Failed(Some(e.to_string()));
                return record(&sh, &held, &id, outcome, &sh.tally.dead).await;
            }
        }
    } else {
        None
    };
    // A job whose lease ran out on its last attempt (its worker died) must not run again.
    if let Some(job) = job.as_ref().filter(|j| j.exhausted()) {
        let why = format!("no attempts left after {} runs", job.max_attempts);
        return record(&sh, &held, &id, Outcome::Failed(Some(why)), &sh.tally.dead).await;
    }

    let (switch, stop) = watch::channel(None);
    held.running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), switch.clone());
    if !held.claim.is_open(&id) {
        // Lost between leaving the queue and now.
        held.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        return add(&sh.tally.lost);
    }
    let limit = job.as_ref().and_then(|j| j.timeout).or(sh.cfg.timeout);
    let task = Task {
        row,
        job: job.clone(),
        token: *held.claim.token(),
        stop: stop.clone(),
    };
    let handler = sh.handler.clone();
    let mut run = tokio::spawn(async move { handler.run(task).await });
    let deadline = limit.map(|l| Instant::now() + l);
    let mut stop_rx = stop;
    let ended = tokio::select! {
        r = &mut run => joined(r),
        () = sleep_until(deadline) => {
            let reason = StopReason::TimedOut(limit.unwrap_or_default());
            let _ = switch.send(Some(reason));
            wind_down(&sh, run).await;
            Ended::Stopped(reason)
        }
        reason = async { stop_rx.wait_for(Option::is_some).await.ok().and_then(|r| *r) } => {
            wind_down(&sh, run).await;
            Ended::Stopped(reason.unwrap_or(StopReason::Shutdown))
        }
    };
    held.running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);

    let t = &sh.tally;
    let failure = |why: String| match &job {
        Some(job) if job.attempt < job.max_attempts => (
            Outcome::Retry {
                after: backoff(job.attempt),
                error: Some(why),
            },
            &t.retried,
        ),
        Some(_) => (Outcome::Failed(Some(why)), &t.dead),
        None => (Outcome::Failed(Some(why)), &t.failed),
    };
    let (outcome, counter) = match ended {
        Ended::Result(TaskResult::Done) => (Outcome::Done, &t.completed),
        Ended::Result(TaskResult::Failed(why)) => failure(why),
        Ended::Result(TaskResult::Dead(why)) => (
            Outcome::Failed(Some(why)),
            if job.is_some() { &t.dead } else { &t.failed },
        ),
        Ended::Result(TaskResult::Abort(why)) => {
            sh.abort(Error::HandlerAborted(why));
            (Outcome::Ready, &t.released)
        }
        Ended::Panicked(message) => {
            tracing::warn!("row {id}: the handler panicked: {message}");
            failure(format!("panicked: {message}"))
        }
        Ended::Stopped(reason @ StopReason::TimedOut(_)) => {
            tracing::warn!("row {id}: stopped: {reason}");
            failure(reason.to_string())
        }
        Ended::Stopped(StopReason::LeaseLost) => {
            held.claim.forget(&id);
            tracing::warn!(
                "row {id}: stopped: its lease was lost (another worker holds it now, or it was \
                 cancelled)"
            );
            return add(&t.lost);
        }
        Ended::Stopped(StopReason::Shutdown) => (Outcome::Ready, &t.released),
    };
    record(&sh, &held, &id, outcome, counter).await;
}

fn joined(r: std::result::Result<TaskResult, tokio::task::JoinError>) -> Ended {
    match r {
        Ok(result) => Ended::Result(result),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            Ended::Panicked(message)
        }
        // Only the runtime aborts these tasks, after a stop.
        Err(_) => Ended::Stopped(StopReason::Shutdown),
    }
}

/// After a stop request: lets the handler wind down for its stop grace, then drops it.
async fn wind_down(sh: &Shared, mut run: JoinHandle<TaskResult>) {
    let grace = sh.handler.stop_grace();
    if !grace.is_zero() && tokio::time::timeout(grace, &mut run).await.is_ok() {
        return;
    }
    run.abort();
    let _ = run.await;
}

/// Records a row's outcome, retrying while the database cannot be reached, until the lease
/// may end; then gives the row up (it comes back through its lease).
async fn record(sh: &Shared, held: &Held, id: &RowId, outcome: Outcome, counter: &AtomicU64) {
    let mut failures = 0u32;
    // A try whose answer was lost may have gone through: a refusal after it proves nothing.
    let mut uncertain = false;
    loop {
        let limit = sh
            .attempt_timeout(held.lease_end())
            .max(Duration::from_millis(500));
        let why =
            match tokio::time::timeout(limit, held.claim.settle_keep(id, outcome.clone())).await {
                Ok(Ok(())) => {
                    sh.health.answered();
                    return add(counter);
                }
                Ok(Err(Error::LeaseLost { .. })) if uncertain => {
                    tracing::debug!(
                        "row {id}: its result was most likely recorded before the connection broke"
                    );
                    return add(&sh.tally.unconfirmed);
                }
                Ok(Err(Error::LeaseLost { .. })) => {
                    tracing::warn!(
                        "row {id}: its result was refused: the row is no longer this worker's \
                     (its lease expired and another worker took it, or it was cancelled)"
                    );
                    return add(&sh.tally.lost);
                }
                Ok(Err(e)) if e.is_connection() || matches!(e, Error::Database(_)) => {
                    if let Error::Database(d) = &e {
                        uncertain |= crate::error::may_have_happened(d);
                    }
                    e.to_string()
                }
                Ok(Err(e)) => {
                    tracing::warn!("row {id}: its result could not be recorded: {e}");
                    held.claim.forget(id);
                    return add(&sh.tally.given_up);
                }
                Err(_) => {
                    uncertain = true;
                    if sh.claimer.strategy() == Strategy::Transaction {
                        // The held transaction is in an unknown state: give the whole claim up.
                        held.claim.abandon().await;
                        held.stop_all(StopReason::LeaseLost);
                        return add(&sh.tally.given_up);
                    }
                    "no answer in time".to_owned()
                }
            };
        sh.health.failed("recording results", &why);
        let wait = pause(failures);
        failures += 1;
        if Instant::now() + wait >= held.lease_end() {
            tracing::debug!("row {id}: result not recorded before its lease may end; given up");
            held.claim.forget(id);
            return add(&sh.tally.given_up);
        }
        tokio::time::sleep(wait).await;
    }
}
