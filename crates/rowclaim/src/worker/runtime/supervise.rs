//! One job's life: its handler run under a timeout and a lease that heartbeats keep alive, a
//! panic turned into a failure, a lost lease or a stop turned into a cancellation.

use super::*;

/// Renews one claim's lease every third of it until every row is settled or given up. A row it
/// finds lost is stopped; when renewals keep failing until the lease may soon end, every row of
/// the claim is given up and its running jobs stopped, early enough for the handler to stop
/// before the lease ends (a quarter of the lease at most).
pub(super) async fn heartbeat(sh: Arc<Shared>, held: Arc<Held>) {
    let every = held.lease.length() / 3;
    let early = sh.handler.stop_grace().min(held.lease.length() / 4);
    let mut failures = 0u32;
    loop {
        let next = if failures == 0 {
            held.lease.end() - held.lease.length() + every
        } else {
            Instant::now() + pause(failures - 1)
        };
        let give_up_at = held.lease.end() - early;
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
            held.lease.abandon();
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
        // When this renewal was due: a third of the lease after the last confirmation.
        let due = held.lease.end() - held.lease.length() + every;
        let limit = sh.attempt_timeout(give_up_at);
        let m = &sh.metrics;
        match tokio::time::timeout(limit, held.claim.beat()).await {
            Ok(Ok(beat)) => {
                sh.health.answered();
                held.stop(&beat.lost, StopReason::LeaseLost);
                if beat.renewed {
                    held.lease.confirm(sent);
                    m.renewed.increment(1);
                    m.heartbeat_lag
                        .record(secs(Instant::now().saturating_duration_since(due)));
                    failures = 0;
                } else {
                    m.renewal_failed.increment(1);
                    failures += 1;
                }
            }
            Ok(Err(e)) => {
                sh.health.failed("renewing leases", &e);
                m.renewal_failed.increment(1);
                failures += 1;
            }
            Err(_) => {
                sh.health
                    .unreachable("renewing leases", &"no answer in time");
                m.renewal_failed.increment(1);
                failures += 1;
            }
        }
    }
}

/// How a started row ended.
pub(super) enum Ended {
    Result(TaskResult),
    Panicked(String),
    Stopped(StopReason),
}

/// Runs one row: the handler on a task of its own, watched for its time limit and for stop
/// requests; then records the result.
pub(super) async fn supervise(
    sh: Arc<Shared>,
    held: Arc<Held>,
    mut row: ClaimedRow,
) -> Option<Finished> {
    let id = row.id.clone();
    let t = &sh.tally;
    let finished = |held: Arc<Held>, outcome, counter| {
        Some(Finished {
            held,
            id: id.clone(),
            outcome,
            counter,
        })
    };
    let job = if sh.managed {
        match Job::take_from_row(&mut row) {
            Ok(job) => Some(job),
            Err(e) => {
                let outcome = Outcome::Failed(Some(e.to_string()));
                return finished(held, outcome, Counter::Dead);
            }
        }
    } else {
        None
    };
    if let Some(job) = &job {
        let span = tracing::Span::current();
        span.record("queue", job.queue.as_str());
        span.record("kind", job.kind.as_str());
        span.record("attempt", job.attempt);
    }
    // A job whose lease ran out on its last attempt (its worker died) must not run again.
    if let Some(job) = job.as_ref().filter(|j| j.exhausted()) {
        let why = format!("no attempts left after {} runs", job.max_attempts);
        return finished(held, Outcome::Failed(Some(why)), Counter::Dead);
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
        add(t.gone(&held.lease));
        return None;
    }
    if sh.closing.load(Ordering::SeqCst) {
        unregister();
        return finished(held, Outcome::Ready, Counter::Released);
    }
    let limit = job.as_ref().and_then(|j| j.timeout).or(sh.cfg.timeout);
    let task = Task {
        row,
        job: job.clone(),
        token: *held.claim.token(),
        stop: stop.clone(),
    };
    // The handler runs inside this task (dropping its future stops it); a panic, also one in
    // the call that makes the future, is caught and becomes the job's failure.
    let mut run = CatchUnwind(
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sh.handler.run(task)))
            .map_err(panic_message),
    );
    let deadline = limit.map(|l| Instant::now() + l);
    let started = Instant::now();
    let running = Running::start(&sh.metrics.in_flight);
    let ended = tokio::select! {
        // A result that is there wins over a stop that came at the same moment.
        biased;
        r = &mut run => {
            let stop = *switch.borrow();
            match (ended_as(r), stop) {
                // A handler that stops itself may end before this select sees the stop: what
                // it says then is about the stop, unless it finished the work anyway.
                (ended @ Ended::Result(TaskResult::Done | TaskResult::Output(_)), _)
                | (ended, None) => ended,
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
    drop(running);
    sh.metrics.job_seconds.record(secs(started.elapsed()));
    unregister();

    let failure = |why: String| match &job {
        Some(job) if job.attempt < job.max_attempts => (
            Outcome::Retry {
                after: backoff(job.attempt),
                error: Some(why),
            },
            Counter::Retried,
        ),
        Some(_) => (Outcome::Failed(Some(why)), Counter::Dead),
        None => (Outcome::Failed(Some(why)), Counter::Failed),
    };
    let (outcome, counter) = match ended {
        Ended::Result(TaskResult::Done) => (Outcome::Done(None), Counter::Completed),
        Ended::Result(TaskResult::Output(v)) => {
            (Outcome::Done(Some(v.to_string())), Counter::Completed)
        }
        Ended::Result(TaskResult::Snooze(after)) => (Outcome::Snooze { after }, Counter::Snoozed),
        Ended::Result(TaskResult::Failed(why)) => failure(why),
        Ended::Result(TaskResult::Dead(why)) => {
            let counter = if job.is_some() {
                Counter::Dead
            } else {
                Counter::Failed
            };
            (Outcome::Failed(Some(why)), counter)
        }
        Ended::Result(TaskResult::Abort(why)) => {
            sh.abort(Error::HandlerAborted(why));
            (Outcome::Ready, Counter::Released)
        }
        Ended::Panicked(message) => {
            sh.metrics.panics.increment(1);
            tracing::warn!("row {id}: the handler panicked: {message}");
            failure(format!("panicked: {message}"))
        }
        Ended::Stopped(reason @ StopReason::TimedOut(_)) => {
            sh.metrics.timeouts.increment(1);
            tracing::warn!("row {id}: stopped: {reason}");
            failure(reason.to_string())
        }
        Ended::Stopped(StopReason::LeaseLost) => {
            held.claim.forget(&id);
            if !held.lease.abandoned() {
                tracing::warn!(
                    "row {id}: stopped: its lease was lost (another worker holds it now, or it \
                     was cancelled)"
                );
            }
            add(t.gone(&held.lease));
            return None;
        }
        Ended::Stopped(StopReason::Shutdown) => (Outcome::Ready, Counter::Released),
    };
    finished(held, outcome, counter)
}

pub(super) fn ended_as(r: std::result::Result<TaskResult, String>) -> Ended {
    match r {
        Ok(result) => Ended::Result(result),
        Err(message) => Ended::Panicked(message),
    }
}

pub(super) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// A handler's future, polled so that a panic inside it becomes `Err(message)`.
pub(super) struct CatchUnwind(std::result::Result<crate::worker::handler::TaskFuture, String>);

impl Future for CatchUnwind {
    type Output = std::result::Result<TaskResult, String>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let fut = match &mut self.0 {
            Ok(fut) => fut,
            Err(message) => return std::task::Poll::Ready(Err(std::mem::take(message))),
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(result)) => std::task::Poll::Ready(Ok(result)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(payload) => std::task::Poll::Ready(Err(panic_message(payload))),
        }
    }
}

/// After a stop request: lets the handler wind down for its stop grace, then drops it.
pub(super) async fn wind_down(sh: &Shared, mut run: CatchUnwind) {
    let grace = sh.handler.stop_grace();
    if !grace.is_zero() {
        let _ = tokio::time::timeout(grace, &mut run).await;
    }
}
