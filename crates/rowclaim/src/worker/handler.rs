//! What the runtime hands a handler ([`Task`]), what a handler answers ([`TaskResult`]), and the
//! [`Handler`] seam through which both kinds of work run: async functions (the library `Worker`)
//! and commands (`rowclaim work`).

use std::any::Any;
use std::collections::HashMap;
use std::fmt::{self, Display};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;

use crate::claim::{ClaimedRow, Token};
use crate::id::RowId;
use crate::queue::Job;

/// A boxed handler future.
pub type TaskFuture = Pin<Box<dyn Future<Output = TaskResult> + Send + 'static>>;

/// Why the runtime stops a running job before it finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// It ran past its time limit (the job's own, else the worker's).
    TimedOut(Duration),
    /// Its row is no longer this worker's: the lease expired and another worker took it, the
    /// job was cancelled, or the lease could not be renewed before it ended. Its result would be
    /// refused, so there is no point in finishing.
    LeaseLost,
    /// The worker is shutting down and the grace period is over (or a second signal came).
    Shutdown,
}

impl Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::TimedOut(d) => {
                write!(f, "timed out after {}", humantime::format_duration(*d))
            }
            StopReason::LeaseLost => f.write_str("its lease was lost"),
            StopReason::Shutdown => f.write_str("the worker is shutting down"),
        }
    }
}

/// One claimed row handed to a [`Handler`]: the row, the job it holds (managed queue only), and
/// a way to learn that the runtime wants the work stopped.
#[derive(Debug)]
pub struct Task {
    pub(crate) row: ClaimedRow,
    pub(crate) job: Option<Job>,
    pub(crate) token: Token,
    pub(crate) stop: watch::Receiver<Option<StopReason>>,
}

impl Task {
    /// The row's id.
    pub fn id(&self) -> &RowId {
        &self.row.id
    }

    /// The claimed row, all its columns as JSON.
    pub fn row(&self) -> &ClaimedRow {
        &self.row
    }

    /// The job, when the row is one of the managed queue.
    pub fn job(&self) -> Option<&Job> {
        self.job.as_ref()
    }

    /// The token of the claim that holds the row.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// A future that resolves when the runtime wants this job stopped, with the reason. A
    /// handler that stops itself (a command that must be signalled, not just dropped) waits on
    /// it; see [`Handler::stop_grace`].
    pub fn stopped(&self) -> impl Future<Output = StopReason> + Send + 'static {
        stopped(&self.stop)
    }
}

/// A future that resolves when `stop` says the runtime wants the job stopped, with the reason.
pub(crate) fn stopped(stop: &StopSignal) -> impl Future<Output = StopReason> + Send + 'static {
    let mut stop = stop.clone();
    async move {
        match stop.wait_for(Option::is_some).await {
            Ok(reason) => reason.unwrap_or(StopReason::Shutdown),
            // The runtime is gone: nothing will ever record this job's result.
            Err(_) => StopReason::Shutdown,
        }
    }
}

/// What a handler says about one row.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskResult {
    /// It worked: the row is completed.
    Done,
    /// It worked and produced this: the row is completed, and a managed job keeps it as its
    /// output (`jobs show`; gone with the job when completed jobs are deleted). A table of your
    /// own has nowhere to keep it: the row is just completed.
    Output(serde_json::Value),
    /// Not now: run it again after this long, without using an attempt (a managed job's run-at
    /// moves on; a row of your own table, which has no run-at, is ready again at once, its
    /// attempts column taken back).
    Snooze(Duration),
    /// It failed. A managed job runs again after a backoff while it has attempts left, then is
    /// dead; a row of your own table is marked failed.
    Failed(String),
    /// It failed and must not run again (dead, or failed), whatever attempts are left.
    Dead(String),
    /// The handler cannot run at all (for `rowclaim work`: the command cannot be started): the
    /// row goes back, and the worker stops with [`crate::Error::HandlerAborted`].
    Abort(String),
}

/// What a handler's `Ok` means: `()` is [`TaskResult::Done`], a JSON value is
/// [`TaskResult::Output`], any other serde value is kept as its JSON (one that writes as
/// `null`, as `()` and `None` do, is just done), and a [`TaskResult`] says itself (e.g.
/// `Ok(TaskResult::Snooze(d))`).
pub trait IntoTaskResult {
    /// The result this `Ok` value stands for.
    fn into_task_result(self) -> TaskResult;
}

impl<T: Serialize + 'static> IntoTaskResult for T {
    fn into_task_result(self) -> TaskResult {
        // A JSON value is kept as it is: moved, not written out again.
        let mut own = Some(self);
        if let Some(value) = (&mut own as &mut dyn Any).downcast_mut::<Option<serde_json::Value>>()
        {
            return TaskResult::Output(value.take().unwrap_or_default());
        }
        let Some(output) = own else {
            return TaskResult::Done;
        };
        let written = crate::shape::to_json(&output, || {
            format!("the handler's output ({})", crate::shape::type_name::<T>())
        });
        match written {
            Ok(serde_json::Value::Null) => TaskResult::Done,
            Ok(value) => TaskResult::Output(value),
            // The work is done, but what it says cannot be kept; running it again would do
            // the work again and fail the same way.
            Err(e) => TaskResult::Dead(e.to_string()),
        }
    }
}

impl IntoTaskResult for TaskResult {
    fn into_task_result(self) -> TaskResult {
        self
    }
}

impl<T: IntoTaskResult, E: Display> From<Result<T, E>> for TaskResult {
    fn from(r: Result<T, E>) -> TaskResult {
        match r {
            Ok(done) => done.into_task_result(),
            Err(e) => TaskResult::Failed(e.to_string()),
        }
    }
}

/// Runs claimed rows. The worker runtime calls [`Handler::run`] once per row, on a task of its
/// own, and records the result.
///
/// When the runtime must stop a job (timeout, lost lease, shutdown) it signals
/// [`Task::stopped`], waits [`Handler::stop_grace`] for the future to end, then drops it. A
/// panic inside the handler is caught and becomes a failure of that job (`panicked: …`).
pub trait Handler: Send + Sync + 'static {
    /// Runs one row.
    fn run(&self, task: Task) -> TaskFuture;

    /// How long a stopped job's future may take to wind down by itself before it is dropped.
    /// Zero (the default): dropped at once, which is right for async code. A handler that runs
    /// a process answers the time it needs to terminate it.
    fn stop_grace(&self) -> Duration {
        Duration::ZERO
    }
}

/// A handler made of an async function of the whole [`Task`].
pub(crate) struct TaskFn<F>(pub F);

impl<F, Fut, T, E> Handler for TaskFn<F>
where
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: IntoTaskResult,
    E: Display,
{
    fn run(&self, task: Task) -> TaskFuture {
        let fut = (self.0)(task);
        Box::pin(async move { fut.await.into() })
    }
}

/// A job's stop signal, as the runtime hands it to a handler of the managed queue.
pub(crate) type StopSignal = watch::Receiver<Option<StopReason>>;

/// A handler of one kind of job (or of any kind): the job, and its stop signal.
pub(crate) type JobFn = Arc<dyn Fn(Job, StopSignal) -> TaskFuture + Send + Sync>;

pub(crate) fn job_fn<F, Fut, T, E>(handler: F) -> JobFn
where
    F: Fn(Job) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: IntoTaskResult,
    E: Display,
{
    Arc::new(move |job, _stop| {
        let fut = handler(job);
        Box::pin(async move { fut.await.into() })
    })
}

/// The managed queue's handlers: one per job kind, and one for every other kind.
#[derive(Default)]
pub(crate) struct ByKind {
    pub kinds: HashMap<String, JobFn>,
    pub fallback: Option<JobFn>,
}

impl Handler for ByKind {
    fn run(&self, task: Task) -> TaskFuture {
        let Task { job, stop, .. } = task;
        let Some(job) = job else {
            let why = "not a job of the managed queue: give this worker a row handler";
            return Box::pin(async move { TaskResult::Dead(why.into()) });
        };
        match self.kinds.get(&job.kind).or(self.fallback.as_ref()) {
            Some(handler) => handler(job, stop),
            None => {
                let why = format!("no handler for kind {:?}", job.kind);
                Box::pin(async move { TaskResult::Dead(why) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Serialize)]
    struct Sent {
        id: u32,
    }

    #[test]
    fn any_serde_value_is_an_output_and_null_is_none() {
        assert_eq!(().into_task_result(), TaskResult::Done);
        assert_eq!(None::<Sent>.into_task_result(), TaskResult::Done);
        assert_eq!(
            Sent { id: 3 }.into_task_result(),
            TaskResult::Output(json!({"id": 3}))
        );
        assert_eq!(
            Some(vec![1, 2]).into_task_result(),
            TaskResult::Output(json!([1, 2]))
        );
        // A JSON value is kept as it is, null too (as before typed handlers).
        assert_eq!(
            json!({"a": 1}).into_task_result(),
            TaskResult::Output(json!({"a": 1}))
        );
        assert_eq!(
            serde_json::Value::Null.into_task_result(),
            TaskResult::Output(serde_json::Value::Null)
        );
        let snooze = TaskResult::Snooze(Duration::from_secs(1));
        assert_eq!(snooze.clone().into_task_result(), snooze);
    }

    #[test]
    fn an_output_that_is_no_json_makes_the_job_dead() {
        let odd: HashMap<(u8, u8), u8> = [((1, 2), 3)].into_iter().collect();
        match odd.into_task_result() {
            TaskResult::Dead(why) => assert!(
                why.starts_with("the handler's output (HashMap<(u8, u8), u8>): key must be"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
