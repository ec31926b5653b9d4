//! Typed handlers: [`Worker::register`] runs the jobs of a [`JobArgs`] type's kind with a
//! handler that gets the job's value as that type, and its [`JobContext`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::handler::{stopped, JobFn, StopSignal};
use super::{StopReason, TaskResult, Worker};
use crate::queue::{Job, JobArgs};
use crate::shape::{from_json, type_name};

/// What a typed handler knows of its job besides its value: which job it is, which run, and
/// whether the runtime wants it stopped.
#[derive(Debug)]
#[non_exhaustive]
pub struct JobContext {
    /// The job's id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its kind (its type's [`JobArgs::KIND`]).
    pub kind: String,
    /// This run's number: 1 on the first run.
    pub attempt: i64,
    /// Runs it may have in all.
    pub max_attempts: i64,
    /// Its own time limit per run, if it was enqueued with one.
    pub timeout: Option<Duration>,
    stop: StopSignal,
}

impl JobContext {
    /// Whether a failure of this run makes the job dead (no attempts left after it).
    pub fn last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }

    /// Why the runtime wants this job stopped, once it does: its time limit passed, its row is
    /// no longer this worker's (cancelled, or its lease lost), or the worker is shutting down.
    /// An async handler is stopped by having its future dropped; work it handed elsewhere
    /// (a blocking thread, a process) can look here, or wait on [`JobContext::stopped`].
    pub fn stop_reason(&self) -> Option<StopReason> {
        *self.stop.borrow()
    }

    /// A future that resolves when the runtime wants this job stopped, with the reason.
    pub fn stopped(&self) -> impl Future<Output = StopReason> + Send + 'static {
        stopped(&self.stop)
    }
}

impl Worker {
    /// Runs the jobs of `T`'s kind ([`JobArgs::KIND`]) with `handler`, which gets each job's
    /// payload as a `T` and its [`JobContext`]. The type is the contract: a handler for one
    /// type cannot be given another's jobs, and what it enqueues with [`crate::Queue::enqueue`]
    /// has the same kind and fields.
    ///
    /// A payload that does not read as a `T` (enqueued by hand, or before a field changed)
    /// makes the job dead at once, without running the handler or using another attempt: its
    /// `last_error` names the kind, the type, the field and serde's complaint. What the handler
    /// returns is taken as by [`Worker::handle`]: an `Err` is retried with backoff until the
    /// last attempt; `Ok` of any serde value completes the job and keeps the value as its
    /// output (`()` keeps none); `Ok(TaskResult::Snooze(d))` runs it again after `d`. A later
    /// handler for the same kind (typed or not) replaces this one.
    ///
    /// ```no_run
    /// # async fn demo(db: rowclaim::Db) -> rowclaim::Result<()> {
    /// use rowclaim::{JobArgs, JobContext, Worker};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Welcome {
    ///     to: String,
    /// }
    ///
    /// impl JobArgs for Welcome {
    ///     const KIND: &'static str = "welcome";
    /// }
    ///
    /// async fn welcome(email: Welcome, job: JobContext) -> Result<(), std::io::Error> {
    ///     println!("attempt {} of job {}: welcome {}", job.attempt, job.id, email.to);
    ///     Ok(())
    /// }
    ///
    /// Worker::new(&db)
    ///     .register(welcome) // or .register::<Welcome, _>(|email, job| async move { … })
    ///     .run(async { let _ = tokio::signal::ctrl_c().await; })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// A handler of one type given as the handler of another does not compile:
    ///
    /// ```compile_fail,E0631
    /// # use rowclaim::{JobArgs, JobContext, Worker};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize)] struct Welcome { to: String }
    /// # impl JobArgs for Welcome { const KIND: &'static str = "welcome"; }
    /// # #[derive(Serialize, Deserialize)] struct Invoice { number: u64 }
    /// # impl JobArgs for Invoice { const KIND: &'static str = "invoice"; }
    /// # fn demo(db: rowclaim::Db) {
    /// Worker::new(&db).register::<Invoice, _>(|email: Welcome, _job: JobContext| async move {
    ///     Ok::<_, String>(email.to)
    /// });
    /// # }
    /// ```
    ///
    /// nor does a handler function of one type registered for another:
    ///
    /// ```compile_fail,E0631
    /// # use rowclaim::{JobArgs, JobContext, Worker};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize)] struct Welcome { to: String }
    /// # impl JobArgs for Welcome { const KIND: &'static str = "welcome"; }
    /// # #[derive(Serialize, Deserialize)] struct Invoice { number: u64 }
    /// # impl JobArgs for Invoice { const KIND: &'static str = "invoice"; }
    /// async fn welcome(email: Welcome, _job: JobContext) -> Result<(), String> {
    ///     Ok(())
    /// }
    /// # fn demo(db: rowclaim::Db) {
    /// Worker::new(&db).register::<Invoice, _>(welcome);
    /// # }
    /// ```
    pub fn register<T, Fut>(
        mut self,
        handler: impl Fn(T, JobContext) -> Fut + Send + Sync + 'static,
    ) -> Self
    where
        T: JobArgs + Send + 'static,
        Fut: Future<Output: Into<TaskResult>> + Send + 'static,
    {
        self.kinds
            .kinds
            .insert(T::KIND.to_owned(), typed_fn::<T, _>(handler));
        self
    }
}

/// `handler` as a handler of jobs: the payload read as a `T` (a job whose payload does not
/// read is dead), then the handler with its context.
fn typed_fn<T, Fut>(handler: impl Fn(T, JobContext) -> Fut + Send + Sync + 'static) -> JobFn
where
    T: JobArgs + Send + 'static,
    Fut: Future<Output: Into<TaskResult>> + Send + 'static,
{
    Arc::new(move |job: Job, stop| {
        let Job {
            id,
            queue,
            kind,
            payload,
            attempt,
            max_attempts,
            timeout,
            ..
        } = job;
        let args = from_json::<T, _>(payload, || {
            format!(
                "the payload of job {id} (kind {kind:?}) does not read as {}",
                type_name::<T>()
            )
        });
        let args = match args {
            Ok(args) => args,
            Err(e) => {
                // It will never read, however often it runs: dead now, not after its retries.
                let why = e.to_string();
                tracing::warn!("{why}: the job is dead");
                return Box::pin(async move { TaskResult::Dead(why) });
            }
        };
        let cx = JobContext {
            id,
            queue,
            kind,
            attempt,
            max_attempts,
            timeout,
            stop,
        };
        let fut = handler(args, cx);
        Box::pin(async move { fut.await.into() })
    })
}
