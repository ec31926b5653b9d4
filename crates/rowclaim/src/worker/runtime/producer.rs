//! The claim loop, the producer: claims rows ahead into the local queue while there is room and
//! few rows wait, backs off (growing, jittered pauses) while claims fail, and idles after an
//! empty claim until the poll interval passes or a notification wakes it. Between claims it
//! hands slots to [`dispatch`](super::dispatch) and results to the recorders.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::Instrument;

use super::dispatch::{Local, Paused};
use super::heartbeat::heartbeat;
use super::{sleep_until, AbortOnDrop, Phase, Shared};
use crate::claim::{Claim, Token};
use crate::error::{Error, Result};
use crate::metrics::secs;
use crate::queue::Wakeups;
use crate::strategy::Strategy;
use crate::worker::outage::pause;

/// A claim statement under way (`None`: no answer in time).
pub(super) type Claiming = Pin<Box<dyn Future<Output = Option<Result<Claim>>> + Send>>;

/// A claim statement under way, with the rows it asked for, the results through when it
/// started ([`Results::so_far`](super::results::Results::so_far)) and its number
/// (`Local::claim_starts`).
type Asked = Pin<Box<dyn Future<Output = (usize, u64, u64, Option<Result<Claim>>)> + Send>>;

/// Claim statements a worker has under way at once, with the skip-locked strategy on a database
/// server. A claim costs the server more per row than short jobs cost the worker, so with one
/// at a time the worker ran dry before every answer (no-op jobs on PostgreSQL: every answer
/// found no row waiting and every slot free). A second claim, started while the first is under
/// way, keeps rows coming on another connection; it skips the rows the first one locked. Both
/// count against the prefetch. Other strategies claim one at a time: two claims of one worker
/// would race for the same rows (token, optimistic, lease table), and a claim of the
/// transaction strategy holds a connection until its rows are settled. SQLite has no
/// skip-locked claim (it has one writer, at which claims take turns anyway). A worker whose
/// claims take runs of keys' lines also claims one at a time (see `claim_if_wanted`).
const CLAIMS_AT_ONCE: usize = 2;

/// The claim loop's own state.
pub(super) struct Producer {
    claiming: FuturesUnordered<Asked>,
    /// Claims it may have under way at once (see [`CLAIMS_AT_ONCE`]).
    at_once: usize,
    /// Rows the claims under way asked for.
    coming: usize,
    /// The numbers of the claims under way.
    numbers: Vec<u64>,
    /// Claims failed in a row, and since when.
    failures: u32,
    failing_since: Option<Instant>,
    /// After a failed claim: claim again at this time.
    retry_at: Option<Instant>,
    /// The last claim came back empty: look again at this time, or at a wake-up.
    idle_until: Option<Instant>,
    /// The last claim answered brought rows (or none was answered yet): only then may a turn
    /// start a second claim beside the first (an idle worker polling an empty queue sends one
    /// claim a poll, not two).
    rows_came: bool,
    paused: watch::Receiver<Paused>,
    wake: Arc<Notify>,
}

impl Producer {
    pub(super) fn new(sh: &Shared, paused: watch::Receiver<Paused>, wake: Arc<Notify>) -> Producer {
        let two = sh.claimer.strategy() == Strategy::SkipLocked && !sh.one_writer();
        Producer {
            claiming: FuturesUnordered::new(),
            at_once: if two { CLAIMS_AT_ONCE } else { 1 },
            coming: 0,
            numbers: Vec::new(),
            failures: 0,
            failing_since: None,
            retry_at: None,
            idle_until: None,
            rows_came: true,
            paused,
            wake,
        }
    }

    /// The claim statements still under way, for shutdown to finish.
    pub(super) fn under_way(&mut self) -> Vec<Claiming> {
        self.coming = 0;
        self.numbers.clear();
        std::mem::take(&mut self.claiming)
            .into_iter()
            .map(|asked| -> Claiming { Box::pin(asked.map(|(_, _, _, got)| got)) })
            .collect()
    }

    /// Runs until `--until-empty` finds nothing left, the phase leaves [`Phase::Run`], or a
    /// handler aborts (`Ok`), or until claims fail for good (`Err`).
    pub(super) async fn run(
        &mut self,
        sh: &Arc<Shared>,
        local: &mut Local,
        phase: &mut watch::Receiver<Phase>,
    ) -> Result<()> {
        loop {
            if *phase.borrow() != Phase::Run || sh.aborted() {
                return Ok(());
            }
            local.start_waiting(sh, &self.paused);
            local.tidy();
            self.claim_if_wanted(sh, local);
            if let ControlFlow::Break(end) = self.next(sh, local, phase).await {
                return end;
            }
        }
    }

    /// Starts the claims the worker wants now, up to as many at once as it may have under way
    /// (an idle worker's first claim is short: the second, for the rest of its room, starts
    /// beside it at once where the last claim brought rows; see [`super::pace::Pace::wants`]).
    fn claim_if_wanted(&mut self, sh: &Arc<Shared>, local: &mut Local) {
        let quiet = self.idle_until.is_none() && self.retry_at.is_none();
        if !quiet {
            return;
        }
        // Where claims take runs of keys' lines, one at a time: a claim beside another finds
        // every line taken by the other's token, which it did not know as the worker's own when
        // it started (`Local::claim_starts`), and comes back empty, while the first, asking for
        // part of the room only, takes small runs (10 keys one at a time, no-op jobs: 34,000
        // jobs/s with two, 38,300 with one).
        let at_once = if local.pace.takes_runs() {
            1
        } else {
            self.at_once
        };
        while self.claiming.len() < at_once {
            let Some(most) = local.wants(sh, self.coming) else {
                return;
            };
            self.coming += most;
            let since = sh.results.so_far();
            let (number, own) = local.claim_starts();
            self.numbers.push(number);
            let claim = claim_rows(sh.clone(), most as u32, own);
            let claim = if sh.claimer.limited() {
                Box::pin(claim)
            } else {
                on_its_own_task(claim)
            };
            self.claiming
                .push(Box::pin(claim.map(move |got| (most, since, number, got))));
            if !self.rows_came {
                return;
            }
        }
    }

    /// Waits for the next thing to happen and acts on it.
    async fn next(
        &mut self,
        sh: &Arc<Shared>,
        local: &mut Local,
        phase: &mut watch::Receiver<Phase>,
    ) -> ControlFlow<Result<()>> {
        tokio::select! {
            biased;
            _ = phase.changed() => {}
            () = sh.fatal_set.notified() => {}
            Some(ended) = local.jobs.next(), if !local.jobs.is_empty() => {
                local.job_ended(sh, ended);
            }
            // Not only while results are open: all of them may go through between the last
            // look at the room and this wait, and a claim waits for that (a stored wake-up
            // makes a spare turn at most).
            () = sh.results.one_through() => {
                if looks_again_after_results(sh) {
                    self.idle_until = None;
                }
            }
            Some((asked, since, number, got)) = self.claiming.next(), if !self.claiming.is_empty() => {
                self.coming = self.coming.saturating_sub(asked);
                self.numbers.retain(|n| *n != number);
                return self.answered(sh, local, got, since, number).await;
            }
            Ok(()) = self.paused.changed(), if sh.managed => {
                let now_paused = self.paused.borrow_and_update().clone();
                local.give_back_paused(sh, &now_paused);
            }
            () = sleep_until(self.retry_at), if self.retry_at.is_some() => self.retry_at = None,
            () = self.wake.notified(), if self.idle_until.is_some() => self.idle_until = None,
            () = sleep_until(self.idle_until), if self.idle_until.is_some() => {
                self.idle_until = None;
            }
        }
        ControlFlow::Continue(())
    }

    /// Acts on a claim's answer: its rows go into the local queue; an empty claim idles the loop
    /// (or ends it under `--until-empty`), unless results went through while it ran (`since`:
    /// those through when it started) that may have freed what it could not see; a failure
    /// backs off. `number`: the claim's (`Local::claim_starts`).
    async fn answered(
        &mut self,
        sh: &Arc<Shared>,
        local: &mut Local,
        got: Option<Result<Claim>>,
        since: u64,
        number: u64,
    ) -> ControlFlow<Result<()>> {
        match got {
            Some(Ok(claim)) => {
                sh.health.claims_work();
                // Only a claim changes whether claims take runs (a lock on the claimer's state:
                // not once per job).
                local.pace.claims_take_runs(sh.claimer.takes_runs());
                (self.failures, self.failing_since, self.retry_at) = (0, None, None);
                self.rows_came = !claim.is_empty();
                if claim.is_empty() {
                    if looks_again_after_results(sh) && sh.results.so_far() != since {
                        // Its statement may have run before those results were written: claim
                        // again rather than wait for the poll (their wake-ups went by while it
                        // ran), also where the other claim under way came back empty before.
                        self.idle_until = None;
                        return ControlFlow::Continue(());
                    }
                    // Another claim still under way may bring rows: its answer decides (the
                    // count would see its rows too, claimed or not; this saves the count).
                    let last = self.claiming.is_empty();
                    if sh.cfg.until_empty && last && local.is_idle(sh) && no_work_left(sh).await {
                        return ControlFlow::Break(Ok(()));
                    }
                    self.idle_until = Some(Instant::now() + sh.cfg.poll);
                    return ControlFlow::Continue(());
                }
                // Rows came (another claim may have come back empty beside this one).
                self.idle_until = None;
                let oldest = self.numbers.iter().min().copied();
                let held = local.hold(sh, claim, number, oldest);
                if sh.renews {
                    local.beats.spawn(heartbeat(sh.clone(), held));
                }
                ControlFlow::Continue(())
            }
            // Input or configuration to fix (a missing privilege among them) stops the worker:
            // waiting would not mend it. Other database errors are retried like an outage.
            Some(Err(e)) if stops(&e) => ControlFlow::Break(Err(e)),
            failed => self.failed(sh, failed),
        }
    }

    /// A claim failed or went unanswered: try again after a pause, or give up once the outage
    /// has lasted `give_up_after`.
    fn failed(&mut self, sh: &Shared, failed: Option<Result<Claim>>) -> ControlFlow<Result<()>> {
        self.rows_came = false;
        let why = match &failed {
            Some(Err(e)) => {
                sh.health.failed("claiming rows", e);
                e.to_string()
            }
            _ => {
                sh.health.no_answer("claiming rows");
                format!(
                    "no answer within {}",
                    humantime::format_duration(sh.claim_timeout())
                )
            }
        };
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        let lasted = since.elapsed();
        if sh.cfg.give_up_after.is_some_and(|limit| lasted >= limit) {
            return ControlFlow::Break(Err(Error::GaveUp { lasted, last: why }));
        }
        self.retry_at = Some(Instant::now() + pause(self.failures));
        self.failures += 1;
        ControlFlow::Continue(())
    }
}

/// Whether a result written may make rows claimable that were not, so that the claim loop looks
/// again rather than idle until the poll: under limits (a job's result frees its place under
/// the queue's and its key's concurrency), and under `--until-empty` (a result may have put
/// its row back: a retry, a release; and the loop must see the queue empty to end).
fn looks_again_after_results(sh: &Shared) -> bool {
    sh.cfg.until_empty || sh.claimer.limited()
}

/// Whether a claim's error stops the worker rather than being retried: anything but a lost
/// connection or a database error. A missing privilege arrives explained
/// ([`Error::MissingPrivilege`], by the claimer) and so stops the worker too.
fn stops(e: &Error) -> bool {
    !(e.is_connection() || matches!(e, Error::Database(_)))
}

/// One claim statement of up to `most` rows, within the claim's time limit (`None`: no answer
/// in time), measured and traced. `own`: the tokens of the claims whose lines the worker runs
/// whole (see `Claimer::claim_behind`).
async fn claim_rows(sh: Arc<Shared>, most: u32, own: Vec<Token>) -> Option<Result<Claim>> {
    let span = tracing::debug_span!(
        "claim",
        source = %sh.claimer.source_name(),
        strategy = %sh.claimer.strategy(),
        most,
        rows = tracing::field::Empty,
        token = tracing::field::Empty,
    );
    let started = Instant::now();
    // SQLite always answers (a lock wait ends at its busy timeout), and a claim cut short
    // there may still commit after its answer was given up on: its rows would be claimed by
    // nobody until their lease ends. So it is never cut short. A server's claim is: its
    // connection may be gone without a word.
    let got = if sh.one_writer() {
        // In its turn at the write lock (see `turns`), until the claim has committed: the
        // reading of its rows lets the next flush go first.
        let turn = std::sync::Mutex::new(sh.turns.take().await);
        let let_go = || {
            let guard = turn.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(guard);
        };
        let claim = sh
            .claimer
            .claim_behind(most, sh.cfg.lease, &own, Some(&let_go));
        Some(claim.instrument(span.clone()).await)
    } else {
        let claim = sh.claimer.claim_behind(most, sh.cfg.lease, &own, None);
        tokio::time::timeout(sh.claim_timeout(), claim.instrument(span.clone()))
            .await
            .ok()
    };
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

/// Runs a claim on a task of its own, so that its statements go on while the claim loop's task
/// drives the running jobs (on another thread, where the runtime has one), not in that task's
/// turns between them. Not for claims under limits: those are bound by their round trips (each
/// claim takes the queue's turn), and each answer crossing threads cost them 10–25 %, where
/// ordinary claims gained 3–12 % (BENCHMARKS.md). Limits are the claimer's, as last read: a
/// worker of several queues of which one has limits claims on the loop's task. Dropping the
/// answer's future aborts the task, as dropping the claim itself would stop it.
fn on_its_own_task(
    claim: impl Future<Output = Option<Result<Claim>>> + Send + 'static,
) -> Claiming {
    // In the claim loop's span, as it was on the loop's own task.
    let mut task = AbortOnDrop(tokio::spawn(claim.in_current_span()));
    Box::pin(async move {
        match (&mut task.0).await {
            Ok(got) => got,
            // A panic in the claim is the claim loop's, as it was before it had a task.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Aborted: only by dropping this future, which then is not polled again.
            Err(_) => None,
        }
    })
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
            sh.health.no_answer("counting the rows left");
            false
        }
    }
}

/// Wakes the claim loop when a job is enqueued (PostgreSQL LISTEN). After the listening
/// connection broke and came back, jobs may have been missed: it wakes the loop then too.
pub(super) async fn listen(mut wakeups: Wakeups, wake: Arc<Notify>) {
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
