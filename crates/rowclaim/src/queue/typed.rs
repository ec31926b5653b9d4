//! Typed jobs: a Rust type names its kind ([`JobArgs`]), enqueue takes a value of it
//! ([`ToNewJob`]), and the worker hands its handler the value back
//! ([`crate::Worker::register`]).

use std::borrow::Cow;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{NewJob, DEFAULT_MAX_ATTEMPTS};
use crate::error::Result;
use crate::shape::{to_json, type_name};

/// A job as a Rust type: its value is the payload, `KIND` the kind it is enqueued under and its
/// handler registered for ([`crate::Worker::register`]), so a renamed field or a mistyped kind
/// is a compile error on both sides instead of a job that fails or never runs.
///
/// ```
/// use rowclaim::{JobArgs, NewJob};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Welcome {
///     to: String,
/// }
///
/// impl JobArgs for Welcome {
///     const KIND: &'static str = "welcome";
///     const QUEUE: &'static str = "mail"; // the other settings keep their defaults
///
///     fn unique_key(&self) -> Option<String> {
///         Some(format!("welcome:{}", self.to)) // one pending welcome per address
///     }
/// }
///
/// // queue.enqueue(&Welcome { to: "ada@example.com".into() }) enqueues this:
/// let job = NewJob::of(&Welcome { to: "ada@example.com".into() })?;
/// assert_eq!(job.queue_name(), "mail");
/// # Ok::<(), rowclaim::Error>(())
/// ```
///
/// Only a `JobArgs` type (or a [`NewJob`]) can be enqueued: a plain serde type has no kind.
///
/// ```compile_fail,E0277
/// # async fn demo(queue: rowclaim::Queue) -> rowclaim::Result<()> {
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Untyped {
///     to: String,
/// }
/// queue.enqueue(&Untyped { to: "ada@example.com".into() }).await?;
/// # Ok(()) }
/// ```
///
/// The value is written as JSON with serde when it is enqueued and read back when its job runs;
/// a payload that does not read back as the type (enqueued by hand, or before a field changed)
/// makes the job dead at once, the error naming its kind and the field. For settings that vary
/// per enqueue (a delay, a time to run at), start from [`NewJob::of`].
pub trait JobArgs: Serialize + DeserializeOwned {
    /// The kind its jobs are enqueued under, and that its handler is registered for.
    const KIND: &'static str;
    /// The queue its jobs go to. Default `default`.
    const QUEUE: &'static str = "default";
    /// Higher runs first. Default 0.
    const PRIORITY: i32 = 0;
    /// How many times one of its jobs may run before it is dead. Default
    /// [`DEFAULT_MAX_ATTEMPTS`].
    const MAX_ATTEMPTS: i32 = DEFAULT_MAX_ATTEMPTS;
    /// The time limit of one run ([`NewJob::timeout`]). Default: none (the worker's own).
    const TIMEOUT: Option<Duration> = None;

    /// The job's unique key, from its value ([`NewJob::unique_key`]). Default: none.
    fn unique_key(&self) -> Option<String> {
        None
    }

    /// The key its queue's per-key limits count it under, from its value
    /// ([`NewJob::limit_key`]). Default: none.
    fn limit_key(&self) -> Option<String> {
        None
    }
}

impl NewJob {
    /// The job that enqueuing `args` makes: its value as the payload, its type's kind, queue,
    /// priority, attempts, time limit and keys. Change what varies from one enqueue to the
    /// next on it (`.delay(…)`, `.run_at(…)`). Fails with [`crate::error::Error::Shape`] when the value
    /// cannot be written as JSON (a map whose keys are not strings, say).
    pub fn of<T: JobArgs>(args: &T) -> Result<NewJob> {
        let payload = to_json(args, || {
            format!("a job of kind {:?} ({})", T::KIND, type_name::<T>())
        })?;
        let mut job = NewJob::new(payload)
            .kind(T::KIND)
            .queue(T::QUEUE)
            .priority(T::PRIORITY)
            .max_attempts(T::MAX_ATTEMPTS);
        if let Some(limit) = T::TIMEOUT {
            job = job.timeout(limit);
        }
        if let Some(key) = args.unique_key() {
            job = job.unique_key(key);
        }
        if let Some(key) = args.limit_key() {
            job = job.limit_key(key);
        }
        Ok(job)
    }
}

/// What [`super::Queue::enqueue`] and its kin take: a [`NewJob`] (the dynamic form: any kind,
/// any JSON), or a value of a [`JobArgs`] type. Not for implementing: implement [`JobArgs`].
pub trait ToNewJob: sealed::Sealed {
    /// The job to enqueue (a `NewJob` as it is, a typed one as [`NewJob::of`] makes it).
    fn to_new_job(&self) -> Result<Cow<'_, NewJob>>;

    /// [`ToNewJob::to_new_job`] of each of `jobs` (`NewJob`s are not copied).
    fn to_new_jobs(jobs: &[Self]) -> Result<Cow<'_, [NewJob]>>
    where
        Self: Sized;
}

impl ToNewJob for NewJob {
    fn to_new_job(&self) -> Result<Cow<'_, NewJob>> {
        Ok(Cow::Borrowed(self))
    }

    fn to_new_jobs(jobs: &[NewJob]) -> Result<Cow<'_, [NewJob]>> {
        Ok(Cow::Borrowed(jobs))
    }
}

impl<T: JobArgs> ToNewJob for T {
    fn to_new_job(&self) -> Result<Cow<'_, NewJob>> {
        NewJob::of(self).map(Cow::Owned)
    }

    fn to_new_jobs(jobs: &[T]) -> Result<Cow<'_, [NewJob]>> {
        jobs.iter()
            .enumerate()
            .map(|(i, job)| {
                NewJob::of(job).map_err(|e| match e {
                    // Which one, among many.
                    crate::error::Error::Shape {
                        what,
                        field,
                        source,
                    } => crate::error::Error::Shape {
                        what: format!("job {}: {what}", i + 1),
                        field,
                        source,
                    },
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Cow::Owned)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::NewJob {}
    impl<T: super::JobArgs> Sealed for T {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize)]
    struct Report {
        customer: u32,
    }

    impl JobArgs for Report {
        const KIND: &'static str = "report";
        const QUEUE: &'static str = "reports";
        const PRIORITY: i32 = 5;
        const MAX_ATTEMPTS: i32 = 3;
        const TIMEOUT: Option<Duration> = Some(Duration::from_secs(60));

        fn unique_key(&self) -> Option<String> {
            Some(format!("report:{}", self.customer))
        }

        fn limit_key(&self) -> Option<String> {
            Some(format!("customer:{}", self.customer))
        }
    }

    #[derive(Serialize, Deserialize)]
    struct Plain {
        n: u8,
    }

    impl JobArgs for Plain {
        const KIND: &'static str = "plain";
    }

    #[test]
    fn a_typed_job_brings_its_settings() {
        let job = NewJob::of(&Report { customer: 7 }).unwrap();
        let want = NewJob::new(serde_json::json!({"customer": 7}))
            .kind("report")
            .queue("reports")
            .priority(5)
            .max_attempts(3)
            .timeout(Duration::from_secs(60))
            .unique_key("report:7")
            .limit_key("customer:7");
        assert_eq!(job, want);
        let plain = NewJob::of(&Plain { n: 1 }).unwrap();
        assert_eq!(
            plain,
            NewJob::new(serde_json::json!({"n": 1})).kind("plain")
        );
    }

    #[test]
    fn new_jobs_are_not_copied() {
        let jobs = vec![NewJob::new(serde_json::json!(1))];
        assert!(matches!(
            NewJob::to_new_jobs(&jobs).unwrap(),
            Cow::Borrowed(_)
        ));
        assert!(matches!(jobs[0].to_new_job().unwrap(), Cow::Borrowed(_)));
    }

    #[derive(Serialize, Deserialize)]
    struct Odd {
        by_pair: std::collections::HashMap<(u8, u8), u8>,
    }

    impl JobArgs for Odd {
        const KIND: &'static str = "odd";
    }

    #[test]
    fn a_value_that_is_no_json_is_refused_naming_its_kind() {
        let odd = Odd {
            by_pair: [((1, 2), 3)].into_iter().collect(),
        };
        let e = NewJob::of(&odd).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("a job of kind \"odd\" (Odd): by_pair: "),
            "{text}"
        );
        assert_eq!(e.kind(), crate::error::ErrorKind::BadInput);
        let e = Odd::to_new_jobs(&[
            Odd {
                by_pair: Default::default(),
            },
            odd,
        ])
        .unwrap_err();
        assert!(e.to_string().starts_with("job 2: a job of kind"), "{e}");
    }
}
