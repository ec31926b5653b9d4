//! Supervision of one running job: its handler runs on the supervisor's task under a time limit,
//! watched for stop requests (lost lease, shutdown); a panic becomes a failure, a stop a
//! cancellation; then how it ended becomes the outcome to record.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::held::Held;
use super::tally::Counter;
use super::{sleep_until, Finished, Shared};
use crate::backend::Outcome;
use crate::claim::ClaimedRow;
use crate::error::Error;
use crate::id::RowId;
use crate::metrics::{secs, JobSeries, Running};
use crate::queue::{backoff, Job};
use crate::worker::handler::{StopReason, Task, TaskFuture, TaskResult};

type Switch = watch::Sender<Option<StopReason>>;

/// How a supervisor ended: the result to record, if any, and how long the handler ran when it
/// ended by itself (the claiming [`Pace`](super::pace::Pace) follows it).
pub(super) struct Ran {
    pub(super) finished: Option<Finished>,
    pub(super) took: Option<Duration>,
    /// The line the row ran in, if any (see `waiting.rs`): set by the dispatch.
    pub(super) line: Option<Arc<str>>,
}

/// Runs one row: the handler on this task, watched for its time limit and for stop requests.
pub(super) async fn supervise(sh: Arc<Shared>, held: Arc<Held>, row: ClaimedRow) -> Ran {
    let mut took = None;
    let finished = run_row(sh, held, row, &mut took).await;
    Ran {
        finished,
        took,
        line: None,
    }
}

/// Runs one row; returns the result to record, if any.
async fn run_row(
    sh: Arc<Shared>,
    held: Arc<Held>,
    mut row: ClaimedRow,
    took: &mut Option<Duration>,
) -> Option<Finished> {
    let id = row.id.clone();
    let job = match job_of(sh.managed, &mut row) {
        Ok(job) => job,
        Err(outcome) => {
            let series = sh.metrics.job(job_labels(&row));
            return finish(held, id, outcome, Counter::Dead, series);
        }
    };
    let series = sh
        .metrics
        .job(job.as_ref().map(|j| (j.queue.as_str(), j.kind.as_str())));
    let (switch, stop) = watch::channel(None);
    held.running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), switch.clone());
    // Checked after registering, so that no stop can fall between the check and the start.
    if !held.claim.is_open(&id) {
        unregister(&held, &id);
        sh.tally.gone(&held.lease, std::slice::from_ref(&id));
        return None;
    }
    if sh.closing.load(Ordering::SeqCst) {
        unregister(&held, &id);
        return finish(held, id, Outcome::Ready, Counter::Released, series);
    }
    let limit = job.as_ref().and_then(|j| j.timeout).or(sh.cfg.timeout);
    let task = Task {
        row,
        job: job.clone(),
        token: *held.claim.token(),
        stop: stop.clone(),
    };
    let ended = run_handler(&sh, &series, task, limit, &switch, stop, took).await;
    unregister(&held, &id);
    conclude(&sh, held, id, job.as_ref(), ended, series)
}

fn finish(
    held: Arc<Held>,
    id: RowId,
    outcome: Outcome,
    counter: Counter,
    series: Arc<JobSeries>,
) -> Option<Finished> {
    Some(Finished {
        held,
        id,
        outcome,
        counter,
        series,
    })
}

/// The queue and kind a row of the managed queue names, read as they are (for a row that is
/// no readable job, which still counts in its queue's series).
fn job_labels(row: &ClaimedRow) -> Option<(&str, &str)> {
    let text = |c: &str| row.data.get(c).and_then(serde_json::Value::as_str);
    Some((text("queue")?, text("kind").unwrap_or("")))
}

/// Removes the row's stop switch: its handler no longer runs.
fn unregister(held: &Held, id: &RowId) {
    held.running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(id);
}

/// The job a row of the managed queue holds (`None` for the rows of a table of one's own), or
/// the outcome to record instead of running it: it is no job, or it has no attempts left.
fn job_of(managed: bool, row: &mut ClaimedRow) -> Result<Option<Job>, Outcome> {
    if !managed {
        return Ok(None);
    }
    let job = Job::take_from_row(row).map_err(|e| Outcome::Failed(Some(e.to_string())))?;
    let span = tracing::Span::current();
    span.record("queue", job.queue.as_str());
    span.record("kind", job.kind.as_str());
    span.record("attempt", job.attempt);
    // A job whose lease ran out on its last attempt (its worker died) must not run again.
    if job.exhausted() {
        let why = format!("no attempts left after {} runs", job.max_attempts);
        return Err(Outcome::Failed(Some(why)));
    }
    Ok(Some(job))
}

/// How a started row ended.
#[derive(Debug)]
enum Ended {
    Result(TaskResult),
    Panicked(String),
    Stopped(StopReason),
}

/// Runs the handler until it ends, is asked to stop (it then gets its stop grace), or passes
/// its time limit.
async fn run_handler(
    sh: &Shared,
    series: &JobSeries,
    task: Task,
    limit: Option<Duration>,
    switch: &Switch,
    mut stop: watch::Receiver<Option<StopReason>>,
    took: &mut Option<Duration>,
) -> Ended {
    // The handler runs inside this task (dropping its future stops it); a panic, also one in
    // the call that makes the future, is caught and becomes the job's failure.
    let mut run = CatchUnwind(
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sh.handler.run(task)))
            .map_err(panic_message),
    );
    let deadline = limit.map(|l| Instant::now() + l);
    let started = Instant::now();
    let running = Running::start(&series.in_flight, &sh.running);
    let ended = tokio::select! {
        // A result that is there wins over a stop that came at the same moment.
        biased;
        r = &mut run => {
            *took = Some(started.elapsed());
            with_stop(ended_as(r), *switch.borrow())
        }
        reason = async { stop.wait_for(Option::is_some).await.ok().and_then(|r| *r) } => {
            wind_down(sh, run).await;
            Ended::Stopped(reason.unwrap_or(StopReason::Shutdown))
        }
        () = sleep_until(deadline) => {
            let reason = StopReason::TimedOut(limit.unwrap_or_default());
            let _ = switch.send(Some(reason));
            wind_down(sh, run).await;
            Ended::Stopped(reason)
        }
    };
    drop(running);
    series.job_seconds.record(secs(started.elapsed()));
    ended
}

/// A handler that stops itself may end before the supervisor sees the stop: what it says then
/// is about the stop, unless it finished the work anyway.
fn with_stop(ended: Ended, stop: Option<StopReason>) -> Ended {
    match (ended, stop) {
        (ended @ Ended::Result(TaskResult::Done | TaskResult::Output(_)), _) | (ended, None) => {
            ended
        }
        (_, Some(reason)) => Ended::Stopped(reason),
    }
}

/// Says what needs saying about how the job ended, and returns the result to record (`None`:
/// the row is no longer this worker's, nothing to record).
fn conclude(
    sh: &Shared,
    held: Arc<Held>,
    id: RowId,
    job: Option<&Job>,
    ended: Ended,
    series: Arc<JobSeries>,
) -> Option<Finished> {
    match &ended {
        Ended::Panicked(message) => {
            series.panics.increment(1);
            tracing::warn!("row {id}: the handler panicked: {message}");
        }
        Ended::Stopped(reason @ StopReason::TimedOut(_)) => {
            series.timeouts.increment(1);
            tracing::warn!("row {id}: stopped: {reason}");
        }
        _ => {}
    }
    let ended = match ended {
        Ended::Result(TaskResult::Snooze(_)) if !sh.claimer.snoozes() => {
            let why = format!(
                "the handler asked to run row {id} again later (a snooze, exit 75), which {} \
                 cannot keep: it has no lease column to hold the row back in (strategy {}), so \
                 the row is failed instead; map one with --lease-column",
                sh.claimer.table_name(),
                sh.claimer.strategy()
            );
            if !sh
                .snooze_warned
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!("{why}");
            }
            Ended::Result(TaskResult::Failed(why))
        }
        ended => ended,
    };
    let (outcome, counter) = match verdict(ended, job) {
        Verdict::Record(outcome, counter) => (outcome, counter),
        Verdict::Abort(why) => {
            sh.abort(Error::HandlerAborted(why));
            (Outcome::Ready, Counter::Released)
        }
        Verdict::Lost => {
            held.claim.forget(&id);
            if !held.lease.abandoned() {
                tracing::warn!(
                    "row {id}: stopped: its lease was lost (another worker holds it now, or it \
                     was cancelled)"
                );
            }
            sh.tally.gone(&held.lease, std::slice::from_ref(&id));
            return None;
        }
    };
    finish(held, id, outcome, counter, series)
}

/// What becomes of a row whose job ended.
#[derive(Debug)]
enum Verdict {
    Record(Outcome, Counter),
    /// The handler cannot run at all: the row goes back, and the worker stops with this.
    Abort(String),
    /// The row is no longer this worker's.
    Lost,
}

/// The outcome of a job that ended so: a failure is retried while a managed job has attempts
/// left, then it is dead; a row of a table of one's own is marked failed.
fn verdict(ended: Ended, job: Option<&Job>) -> Verdict {
    let failure = |why: String| match job {
        Some(job) if job.attempt < job.max_attempts => Verdict::Record(
            Outcome::Retry {
                after: backoff(job.attempt),
                error: Some(why),
            },
            Counter::Retried,
        ),
        Some(_) => Verdict::Record(Outcome::Failed(Some(why)), Counter::Dead),
        None => Verdict::Record(Outcome::Failed(Some(why)), Counter::Failed),
    };
    match ended {
        Ended::Result(TaskResult::Done) => Verdict::Record(Outcome::Done(None), Counter::Completed),
        Ended::Result(TaskResult::Output(v)) => {
            Verdict::Record(Outcome::Done(Some(v.to_string())), Counter::Completed)
        }
        Ended::Result(TaskResult::Snooze(after)) => {
            Verdict::Record(Outcome::Snooze { after }, Counter::Snoozed)
        }
        Ended::Result(TaskResult::Failed(why)) => failure(why),
        Ended::Result(TaskResult::Dead(why)) => {
            let counter = if job.is_some() {
                Counter::Dead
            } else {
                Counter::Failed
            };
            Verdict::Record(Outcome::Failed(Some(why)), counter)
        }
        Ended::Result(TaskResult::Abort(why)) => Verdict::Abort(why),
        Ended::Panicked(message) => failure(format!("panicked: {message}")),
        Ended::Stopped(reason @ StopReason::TimedOut(_)) => failure(reason.to_string()),
        Ended::Stopped(StopReason::LeaseLost) => Verdict::Lost,
        Ended::Stopped(StopReason::Shutdown) => Verdict::Record(Outcome::Ready, Counter::Released),
    }
}

fn ended_as(r: std::result::Result<TaskResult, String>) -> Ended {
    match r {
        Ok(result) => Ended::Result(result),
        Err(message) => Ended::Panicked(message),
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// A handler's future, polled so that a panic inside it becomes `Err(message)`.
struct CatchUnwind(std::result::Result<TaskFuture, String>);

impl Future for CatchUnwind {
    type Output = std::result::Result<TaskResult, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = match &mut self.0 {
            Ok(fut) => fut,
            Err(message) => return Poll::Ready(Err(std::mem::take(message))),
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(result)) => Poll::Ready(Ok(result)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(panic_message(payload))),
        }
    }
}

/// After a stop request: lets the handler wind down for its stop grace, then drops it.
async fn wind_down(sh: &Shared, mut run: CatchUnwind) {
    let grace = sh.handler.stop_grace();
    if !grace.is_zero() {
        let _ = tokio::time::timeout(grace, &mut run).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(attempt: i64, max_attempts: i64) -> Job {
        Job {
            id: 1,
            queue: "q".into(),
            kind: "k".into(),
            payload: serde_json::Value::Null,
            attempt,
            max_attempts,
            timeout: None,
        }
    }

    fn failed(why: &str) -> Ended {
        Ended::Result(TaskResult::Failed(why.into()))
    }

    #[test]
    fn a_failure_is_retried_while_attempts_are_left_then_dead() {
        let retried = verdict(failed("no"), Some(&job(1, 3)));
        assert!(
            matches!(&retried, Verdict::Record(Outcome::Retry { error: Some(e), .. }, Counter::Retried) if e == "no"),
            "{retried:?}"
        );
        let last = verdict(failed("no"), Some(&job(3, 3)));
        assert!(
            matches!(&last, Verdict::Record(Outcome::Failed(Some(e)), Counter::Dead) if e == "no"),
            "{last:?}"
        );
        // A row of a table of one's own has no attempts: it is marked failed.
        let own = verdict(failed("no"), None);
        assert!(
            matches!(
                &own,
                Verdict::Record(Outcome::Failed(Some(_)), Counter::Failed)
            ),
            "{own:?}"
        );
    }

    #[test]
    fn panics_and_time_limits_are_failures_dead_is_final() {
        let panicked = verdict(Ended::Panicked("boom".into()), Some(&job(1, 3)));
        assert!(
            matches!(&panicked, Verdict::Record(Outcome::Retry { error: Some(e), .. }, _) if e == "panicked: boom"),
            "{panicked:?}"
        );
        let timed_out = Ended::Stopped(StopReason::TimedOut(Duration::from_secs(5)));
        let timed_out = verdict(timed_out, None);
        assert!(
            matches!(&timed_out, Verdict::Record(Outcome::Failed(Some(e)), Counter::Failed) if e == "timed out after 5s"),
            "{timed_out:?}"
        );
        let dead = Ended::Result(TaskResult::Dead("bad".into()));
        let dead = verdict(dead, Some(&job(1, 3)));
        assert!(
            matches!(
                &dead,
                Verdict::Record(Outcome::Failed(Some(_)), Counter::Dead)
            ),
            "{dead:?}"
        );
    }

    #[test]
    fn results_and_stops_map_to_their_outcomes() {
        let out = Ended::Result(TaskResult::Output(serde_json::json!({ "a": 1 })));
        assert!(matches!(
            verdict(out, None),
            Verdict::Record(Outcome::Done(Some(v)), Counter::Completed) if v == r#"{"a":1}"#
        ));
        let snooze = Ended::Result(TaskResult::Snooze(Duration::from_secs(9)));
        assert!(matches!(
            verdict(snooze, Some(&job(3, 3))),
            Verdict::Record(Outcome::Snooze { after }, Counter::Snoozed) if after == Duration::from_secs(9)
        ));
        let shutdown = Ended::Stopped(StopReason::Shutdown);
        assert!(matches!(
            verdict(shutdown, Some(&job(1, 3))),
            Verdict::Record(Outcome::Ready, Counter::Released)
        ));
        let lost = Ended::Stopped(StopReason::LeaseLost);
        assert!(matches!(verdict(lost, None), Verdict::Lost));
        let abort = Ended::Result(TaskResult::Abort("no such command".into()));
        assert!(matches!(verdict(abort, None), Verdict::Abort(w) if w == "no such command"));
    }

    #[test]
    fn a_stop_wins_over_what_a_stopped_handler_says_unless_it_finished() {
        let stop = Some(StopReason::Shutdown);
        assert!(matches!(
            with_stop(failed("killed"), stop),
            Ended::Stopped(StopReason::Shutdown)
        ));
        assert!(matches!(
            with_stop(Ended::Result(TaskResult::Done), stop),
            Ended::Result(TaskResult::Done)
        ));
        assert!(matches!(
            with_stop(Ended::Panicked("x".into()), stop),
            Ended::Stopped(_)
        ));
        assert!(matches!(
            with_stop(failed("no"), None),
            Ended::Result(TaskResult::Failed(_))
        ));
    }

    #[tokio::test]
    async fn a_panic_inside_a_handler_future_becomes_its_message() {
        let fut: TaskFuture = Box::pin(async {
            if std::hint::black_box(true) {
                panic!("boom");
            }
            TaskResult::Done
        });
        assert_eq!(CatchUnwind(Ok(fut)).await, Err("boom".to_owned()));
        let made = CatchUnwind(Err("in the call".into())).await;
        assert_eq!(made, Err("in the call".to_owned()));
    }
}
