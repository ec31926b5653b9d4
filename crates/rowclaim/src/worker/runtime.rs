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

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// The worker stops its jobs: a supervisor that starts after this gives its row back.
    closing: AtomicBool,
    /// Stopping now: a result gets one try, not retries until its lease ends.
    hurry: AtomicBool,
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
    /// Stop switches of the claim's rows whose handler is running.
    running: Mutex<HashMap<RowId, watch::Sender<Option<StopReason>>>>,
    /// The heartbeat gave the whole claim up (its lease could not be renewed in time).
    abandoned: AtomicBool,
}

impl Held {
    fn new(claim: Claim) -> Arc<Held> {
        Arc::new(Held {
            lease: claim.lease(),
            confirmed: Mutex::new(claim.claimed_at().into()),
            running: Mutex::default(),
            abandoned: AtomicBool::new(false),
            claim,
        })
    }

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

    /// Stops every running job whose row the claim no longer looks after (lost, given up, or
    /// dropped with a broken transaction). A switch is removed before its result is recorded,
    /// so a registered switch always belongs to a handler still running.
    fn stop_forgotten(&self) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for (id, switch) in running.iter() {
            if !self.claim.is_open(id) {
                let _ = switch.send(Some(StopReason::LeaseLost));
            }
        }
    }

    /// Gives rows up: this worker stops looking after them (they come back when their lease
    /// ends) and stops their jobs, if running.
    fn give_up(self: &Arc<Self>, ids: &[RowId]) {
        ids.iter().for_each(|id| self.claim.forget(id));
        self.stop(ids, StopReason::LeaseLost);
        if self.claim.open_count() == 0 {
            let me = self.clone();
            tokio::spawn(async move { me.claim.commit_if_done().await });
        }
    }

    /// Whether rows of this claim that are gone were given up by this worker, not taken by
    /// another.
    fn lost_counter<'t>(&self, t: &'t Tally) -> &'t AtomicU64 {
        if self.abandoned.load(Ordering::Relaxed) {
            &t.given_up
        } else {
            &t.lost
        }
    }
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
        closing: AtomicBool::new(false),
        hurry: AtomicBool::new(false),
    });
    let wake = Arc::new(Notify::new());
    let _listener = wakeups
        .filter(Wakeups::listening)
        .map(|w| AbortOnDrop(tokio::spawn(listen(w, wake.clone()))));

    let mut waiting: VecDeque<(Arc<Held>, ClaimedRow)> = VecDeque::new();
    // Supervisors of started rows, and heartbeats of claims: dropping these sets aborts them.
    let mut jobs: JoinSet<()> = JoinSet::new();
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
                add(held.lost_counter(&sh.tally));
                continue;
            }
            if !held.may_start(sh.renews) {
                // Its lease could not be confirmed in time: another worker may hold it by now.
                tracing::debug!("row {}: not started, its lease may have ended", row.id);
                held.give_up(std::slice::from_ref(&row.id));
                add(&sh.tally.given_up);
                continue;
            }
            jobs.spawn(supervise(sh.clone(), held, row));
        }
        helds.retain(|h| h.claim.open_count() > 0);
        while beats.try_join_next().is_some() {}

        let room = sh
            .cfg
            .most
            .saturating_sub(jobs.len() + waiting.len())
            .min(sh.cfg.batch as usize);
        if claiming.is_none() && room > 0 && idle_until.is_none() && retry_at.is_none() {
            let (claimer, lease, limit) = (sh.claimer.clone(), sh.cfg.lease, sh.claim_timeout());
            claiming = Some(Box::pin(async move {
                tokio::time::timeout(limit, claimer.claim(room as u32, lease))
                    .await
                    .ok()
            }));
        }

        tokio::select! {
            biased;
            _ = phase.changed() => {}
            () = sh.fatal_set.notified() => {}
            Some(_) = jobs.join_next(), if !jobs.is_empty() => {
                if sh.cfg.until_empty {
                    // A finished job may have put its row back (a retry, a release): look again.
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
                            let nothing_running = jobs.is_empty() && waiting.is_empty();
                            if sh.cfg.until_empty && nothing_running && no_work_left(&sh).await {
                                break;
                            }
                            idle_until = Some(Instant::now() + sh.cfg.poll);
                            continue;
                        }
                        let held = Held::new(claim);
                        for row in held.claim.rows() {
                            waiting.push_back((held.clone(), row.clone()));
                        }
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
                got = claiming => if let Some(Ok(claim)) = got {
                    let held = Held::new(claim);
                    for row in held.claim.rows() {
                        waiting.push_back((held.clone(), row.clone()));
                    }
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
                r = jobs.join_next() => if r.is_none() { break },
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
        while jobs.join_next().await.is_some() {}
    })
    .await;
    jobs.abort_all();
    beats.abort_all();

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
        interrupted,
    })
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
        Ok(Ok(backlog)) => !backlog.has_work(),
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
                sh.tally
                    .released
                    .fetch_add(released as u64, Ordering::Relaxed);
                sh.tally
                    .lost
                    .fetch_add(lost.len() as u64, Ordering::Relaxed);
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
                sh.tally
                    .given_up
                    .fetch_add(ids.len() as u64, Ordering::Relaxed);
            }
        }
    }
}

/// Renews one claim's lease every third of it until every row is settled or given up. A row it
/// finds lost is stopped; when renewals keep failing until the lease may soon end, every row of
/// the claim is given up and its running jobs stopped, early enough for the handler to stop
/// before the lease ends (a quarter of the lease at most).
async fn heartbeat(sh: Arc<Shared>, held: Arc<Held>) {
    let every = held.lease / 3;
    let early = sh.handler.stop_grace().min(held.lease / 4);
    let mut failures = 0u32;
    loop {
        let next = if failures == 0 {
            held.lease_end() - held.lease + every
        } else {
            Instant::now() + pause(failures - 1)
        };
        let give_up_at = held.lease_end() - early;
        tokio::select! {
            () = tokio::time::sleep_until(next.min(give_up_at)) => {}
            () = held.claim.all_settled() => {}
        }
        held.stop_forgotten();
        if held.claim.open_count() == 0 {
            return;
        }
        if failures > 0 && Instant::now() >= give_up_at {
            // From now on another worker may soon hold these rows: stop their jobs, give them up.
            held.abandoned.store(true, Ordering::Relaxed);
            let rows = held.claim.open_rows();
            tracing::debug!(
                "claim {}: lease not renewed in time, {} row(s) given up",
                held.claim.token(),
                rows.len()
            );
            held.give_up(&rows);
            return;
        }
        let sent = Instant::now();
        let limit = sh.attempt_timeout(give_up_at);
        match tokio::time::timeout(limit, held.claim.beat()).await {
            Ok(Ok(beat)) => {
                sh.health.answered();
                held.stop(&beat.lost, StopReason::LeaseLost);
                if beat.renewed {
                    held.confirm(sent);
                    failures = 0;
                } else {
                    failures += 1;
                }
            }
            Ok(Err(e)) => {
                sh.health.failed("renewing leases", &e);
                failures += 1;
            }
            Err(_) => {
                sh.health
                    .unreachable("renewing leases", &"no answer in time");
                failures += 1;
            }
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
    let t = &sh.tally;
    let job = if sh.managed {
        match Job::from_row(&row) {
            Ok(job) => Some(job),
            Err(e) => {
                let outcome = Outcome::Failed(Some(e.to_string()));
                return record(&sh, &held, &id, outcome, &t.dead).await;
            }
        }
    } else {
        None
    };
    // A job whose lease ran out on its last attempt (its worker died) must not run again.
    if let Some(job) = job.as_ref().filter(|j| j.exhausted()) {
        let why = format!("no attempts left after {} runs", job.max_attempts);
        return record(&sh, &held, &id, Outcome::Failed(Some(why)), &t.dead).await;
    }

    let (switch, mut stop) = watch::channel(None);
    held.running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), switch.clone());
    // Checked after registering, so that no stop can fall between the check and the start.
    let unregister = || {
        held.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    };
    if !held.claim.is_open(&id) {
        unregister();
        return add(held.lost_counter(t));
    }
    if sh.closing.load(Ordering::SeqCst) {
        unregister();
        return record(&sh, &held, &id, Outcome::Ready, &t.released).await;
    }
    let limit = job.as_ref().and_then(|j| j.timeout).or(sh.cfg.timeout);
    let task = Task {
        row,
        job: job.clone(),
        token: *held.claim.token(),
        stop: stop.clone(),
    };
    let handler = sh.handler.clone();
    let mut run = AbortOnDrop(tokio::spawn(async move { handler.run(task).await }));
    let deadline = limit.map(|l| Instant::now() + l);
    let ended = tokio::select! {
        // A result that is there wins over a stop that came at the same moment.
        biased;
        r = &mut run.0 => {
            let stop = *switch.borrow();
            match (joined(r), stop) {
                // A handler that stops itself may end before this select sees the stop: what
                // it says then is about the stop, unless it finished the work anyway.
                (ended @ Ended::Result(TaskResult::Done), _) | (ended, None) => ended,
                (_, Some(reason)) => Ended::Stopped(reason),
            }
        }
        reason = async { stop.wait_for(Option::is_some).await.ok().and_then(|r| *r) } => {
            wind_down(&sh, run).await;
            Ended::Stopped(reason.unwrap_or(StopReason::Shutdown))
        }
        () = sleep_until(deadline) => {
            let reason = StopReason::TimedOut(limit.unwrap_or_default());
            let _ = switch.send(Some(reason));
            wind_down(&sh, run).await;
            Ended::Stopped(reason)
        }
    };
    unregister();

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
        Ended::Result(TaskResult::Dead(why)) => {
            let counter = if job.is_some() { &t.dead } else { &t.failed };
            (Outcome::Failed(Some(why)), counter)
        }
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
            if !held.abandoned.load(Ordering::Relaxed) {
                tracing::warn!(
                    "row {id}: stopped: its lease was lost (another worker holds it now, or it \
                     was cancelled)"
                );
            }
            return add(held.lost_counter(t));
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
async fn wind_down(sh: &Shared, mut run: AbortOnDrop<TaskResult>) {
    let grace = sh.handler.stop_grace();
    if !grace.is_zero() && tokio::time::timeout(grace, &mut run.0).await.is_ok() {
        return;
    }
    run.0.abort();
    let _ = (&mut run.0).await;
}

/// Records a row's outcome, retrying while the database fails, until the lease would end (a
/// source whose claims never expire: until the worker stops now); then gives the row up, and
/// it comes back through its lease.
async fn record(sh: &Shared, held: &Arc<Held>, id: &RowId, outcome: Outcome, counter: &AtomicU64) {
    let mut failures = 0u32;
    // A try whose answer was lost may have gone through: a refusal after it proves nothing.
    let mut uncertain = false;
    let most = (sh.cfg.lease / 3).max(Duration::from_secs(2));
    let give_up = || {
        if sh.renews {
            tracing::debug!("row {id}: result not recorded before its lease may end; given up");
        } else {
            tracing::warn!(
                "row {id}: its result could not be recorded, and without a lease column it stays \
                 claimed: give it back with `rowclaim release`"
            );
        }
        held.give_up(std::slice::from_ref(id));
        add(&sh.tally.given_up);
    };
    loop {
        let deadline = sh.renews.then(|| held.lease_end());
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return give_up();
        }
        let limit = deadline.map_or(most, |d| sh.attempt_timeout(d));
        match tokio::time::timeout(limit, held.claim.settle_keep(id, outcome.clone())).await {
            Ok(Ok(())) => {
                sh.health.answered();
                return add(counter);
            }
            Ok(Err(Error::LeaseLost { ids, .. })) => {
                // With the transaction strategy a broken transaction loses every row at once:
                // stop the jobs of the others too.
                held.stop(&ids, StopReason::LeaseLost);
                if uncertain {
                    tracing::debug!(
                        "row {id}: its result was most likely recorded before the connection broke"
                    );
                    return add(&sh.tally.unconfirmed);
                }
                if !held.abandoned.load(Ordering::Relaxed) {
                    tracing::warn!(
                        "row {id}: its result was refused: the row is no longer this worker's \
                         (its lease expired and another worker took it, or it was cancelled)"
                    );
                }
                return add(held.lost_counter(&sh.tally));
            }
            Ok(Err(e)) if e.is_connection() || matches!(e, Error::Database(_)) => {
                uncertain |= matches!(e, Error::OutcomeUnknown { .. });
                sh.health.failed("recording results", &e);
            }
            Ok(Err(e)) => {
                tracing::warn!("row {id}: its result could not be recorded: {e}");
                held.give_up(std::slice::from_ref(id));
                return add(&sh.tally.given_up);
            }
            Err(_) => {
                uncertain = true;
                if sh.claimer.strategy() == Strategy::Transaction {
                    // The held transaction is in an unknown state: give the whole claim up.
                    held.abandoned.store(true, Ordering::Relaxed);
                    held.claim.abandon().await;
                    held.stop_all(StopReason::LeaseLost);
                    return add(&sh.tally.given_up);
                }
                sh.health
                    .unreachable("recording results", &"no answer in time");
            }
        }
        let wait = pause(failures);
        failures += 1;
        if sh.hurry.load(Ordering::SeqCst) || deadline.is_some_and(|d| Instant::now() + wait >= d) {
            return give_up();
        }
        tokio::time::sleep(wait).await;
    }
}
