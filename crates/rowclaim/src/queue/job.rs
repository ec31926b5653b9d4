//! Jobs of the managed queue: what is enqueued ([`NewJob`]), what a handler gets ([`Job`]), how
//! a failure is retried, and what a queue reports.

use super::payload::Payload;
use super::*;
use std::borrow::Cow;
use std::collections::BTreeSet;

/// What becomes of a job that completed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retention {
    /// Kept, as `completed`, until `rowclaim jobs prune` deletes it. The default.
    #[default]
    Keep,
    /// Deleted at once. A completion then writes a row away instead of a new version of it
    /// (about a third less write-ahead log on PostgreSQL), and the table stays small; the job's
    /// history is gone, as in graphile-worker.
    Delete,
}

/// A job to enqueue.
///
/// ```
/// use rowclaim::NewJob;
/// use std::time::Duration;
/// let job = NewJob::new(serde_json::json!({"to": "ada@example.com"}))
///     .queue("mail")
///     .kind("welcome")
///     .priority(10)
///     .delay(Duration::from_secs(60))
///     .unique_key("welcome:ada");
/// assert_eq!(job.queue_name(), "mail");
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewJob {
    queue: String,
    kind: String,
    payload: Payload,
    priority: i32,
    delay: Duration,
    run_at_ms: Option<i64>,
    max_attempts: i32,
    unique_key: Option<String>,
    #[serde(default)]
    timeout_ms: Option<i64>,
    #[serde(default)]
    limit_key: Option<String>,
    /// The jobs it waits for ([`NewJob::after`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    after: Vec<i64>,
    /// It runs even when a job it waits for ends dead or cancelled.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    run_anyway: bool,
    /// It waits for every job enqueued before it in the same call (a group's last job).
    #[serde(skip)]
    after_prior: bool,
}

/// The attempts a job gets unless told otherwise.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 25;

impl NewJob {
    /// A job with this payload on queue `default`, kind `""`, priority 0, to run now, with
    /// [`DEFAULT_MAX_ATTEMPTS`] attempts.
    pub fn new(payload: serde_json::Value) -> NewJob {
        NewJob::with(Payload::Value(payload))
    }

    /// A job whose payload is the JSON text `json`, kept as given instead of parsed into a
    /// [`serde_json::Value`]: the quicker way to enqueue what is JSON text already (as
    /// `rowclaim enqueue` does with its lines). Fails with the parser's error when `json` is
    /// not one JSON value that [`serde_json::Value`] reads (a number past a float's range,
    /// nesting past 128 levels, an escaped lone surrogate). Whitespace around it is dropped.
    /// The text is what the database is given: PostgreSQL keeps its `jsonb` form, SQLite the
    /// text without its whitespace, MySQL/MariaDB the text as it is (a search of payloads by
    /// their text, `JobFilter`, sees it so). Its numbers are not rounded through a float.
    ///
    /// ```
    /// use rowclaim::NewJob;
    ///
    /// let job = NewJob::from_json(r#"{"to": "ada@example.com"}"#)?.queue("mail");
    /// assert_eq!(job, NewJob::new(serde_json::json!({"to": "ada@example.com"})).queue("mail"));
    /// assert!(NewJob::from_json("{\"to\":").is_err());
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn from_json(json: impl Into<String>) -> std::result::Result<NewJob, serde_json::Error> {
        Ok(NewJob::with(Payload::from_json(json.into())?))
    }

    fn with(payload: Payload) -> NewJob {
        NewJob {
            queue: "default".into(),
            kind: String::new(),
            payload,
            priority: 0,
            delay: Duration::ZERO,
            run_at_ms: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            unique_key: None,
            timeout_ms: None,
            limit_key: None,
            after: Vec::new(),
            run_anyway: false,
            after_prior: false,
        }
    }

    /// The queue it goes to.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// The queue's name.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// Its kind, for routing to a handler.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }

    /// Higher runs first. Default 0.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Run no earlier than `delay` from now (the database's now).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self.run_at_ms = None;
        self
    }

    /// Run no earlier than `at`.
    pub fn run_at(mut self, at: SystemTime) -> Self {
        let ms = match at.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
        };
        self.run_at_ms = Some(ms);
        self
    }

    /// How many times it may run before it is dead. Default [`DEFAULT_MAX_ATTEMPTS`].
    pub fn max_attempts(mut self, n: i32) -> Self {
        self.max_attempts = n;
        self
    }

    /// While a job with this key is ready or running, enqueueing another returns that job.
    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    /// How long one run may take: a run still going after `limit` is stopped and counts as a
    /// failure ("timed out after …"), retried like any other. Overrides the worker's own limit
    /// ([`crate::Worker::timeout`]). Needs the queue's schema version 3 (`rowclaim init`).
    pub fn timeout(mut self, limit: Duration) -> Self {
        self.timeout_ms = Some(i64::try_from(limit.as_millis()).unwrap_or(i64::MAX));
        self
    }

    /// The key its queue's per-key limits count it under ([`crate::QueueLimits`]): of the jobs
    /// with one key, at most the queue's per-key concurrency run at once, started in enqueue
    /// order, and at most its per-key rate start per period. Jobs without a key only count
    /// towards the queue's own limits; in a queue without limits a key changes nothing. Needs
    /// the queue's schema version 5 (`rowclaim init`).
    pub fn limit_key(mut self, key: impl Into<String>) -> Self {
        self.limit_key = Some(key.into());
        self
    }

    /// Waits for the jobs `ids`: it becomes claimable only when every one of them has
    /// completed. If one ends dead or cancelled, it is cancelled, its error naming that job
    /// (unless it [`NewJob::run_anyway`]). Jobs completed already count as done; an id of no
    /// job is an error naming it. Retries of a job it waits for keep it waiting. Its status
    /// meanwhile is `waiting`. Needs the queue's schema version 7 (`rowclaim init`; 12 on
    /// MySQL). A job that waits cannot have a unique key.
    ///
    /// ```
    /// use rowclaim::NewJob;
    /// let receipt = NewJob::new(serde_json::json!({"order": 7})).kind("receipt").after([41, 42]);
    /// assert_eq!(receipt.waits_for_ids(), &[41, 42]);
    /// ```
    pub fn after(mut self, ids: impl IntoIterator<Item = i64>) -> Self {
        self.after.extend(ids);
        self
    }

    /// The jobs it waits for, as given to [`NewJob::after`].
    pub fn waits_for_ids(&self) -> &[i64] {
        &self.after
    }

    /// Runs once every job it waits for has finished, also when one of them ended dead or
    /// cancelled (instead of being cancelled with it).
    pub fn run_anyway(mut self) -> Self {
        self.run_anyway = true;
        self
    }

    /// Waits for every job enqueued before it in the same call ([`crate::Queue::enqueue_group`]).
    pub(crate) fn after_prior(mut self) -> Self {
        self.after_prior = true;
        self
    }

    /// Whether it waits for other jobs.
    pub(crate) fn waits(&self) -> bool {
        !self.after.is_empty() || self.after_prior
    }

    pub(crate) fn runs_anyway(&self) -> bool {
        self.run_anyway
    }

    /// The ids it waits for, given the jobs enqueued before it in the same call: sorted, each
    /// once.
    pub(crate) fn waits_for(&self, prior: &[Enqueued]) -> Vec<i64> {
        let mut ids = self.after.clone();
        if self.after_prior {
            ids.extend(prior.iter().map(|e| e.id));
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    pub(crate) fn check(&self) -> Result<()> {
        if self.waits() && self.unique_key.is_some() {
            return Err(Error::InvalidInput(
                "a job that waits for other jobs (after) cannot have a unique key".into(),
            ));
        }
        if self.queue.is_empty() || self.queue.len() > 255 {
            return Err(Error::InvalidInput(
                "queue name must have 1 to 255 characters".into(),
            ));
        }
        if self.max_attempts < 1 {
            return Err(Error::InvalidInput(format!(
                "max attempts must be at least 1, not {}",
                self.max_attempts
            )));
        }
        if self.unique_key.as_ref().is_some_and(|k| k.len() > 255) {
            return Err(Error::InvalidInput(
                "unique key is longer than 255 characters".into(),
            ));
        }
        if self
            .limit_key
            .as_ref()
            .is_some_and(|k| k.is_empty() || k.len() > 255)
        {
            return Err(Error::InvalidInput(
                "limit key must have 1 to 255 characters".into(),
            ));
        }
        if self.timeout_ms.is_some_and(|ms| ms <= 0) {
            return Err(Error::InvalidInput(
                "timeout must be longer than zero".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn parts(&self) -> JobParts<'_> {
        JobParts {
            queue: &self.queue,
            kind: &self.kind,
            payload: self.payload.text(),
            priority: self.priority,
            delay_ms: crate::backend::sql::lease_ms(self.delay).min(i64::MAX / 1000)
                * i64::from(!self.delay.is_zero()),
            run_at_ms: self.run_at_ms,
            max_attempts: self.max_attempts,
            unique_key: self.unique_key.as_deref(),
            timeout_ms: self.timeout_ms,
            limit_key: self.limit_key.as_deref(),
        }
    }
}

/// A job's columns as the drivers bind them.
pub(crate) struct JobParts<'a> {
    pub queue: &'a str,
    pub kind: &'a str,
    /// The payload's JSON text.
    pub payload: Cow<'a, str>,
    pub priority: i32,
    pub delay_ms: i64,
    pub run_at_ms: Option<i64>,
    pub max_attempts: i32,
    pub unique_key: Option<&'a str>,
    pub timeout_ms: Option<i64>,
    pub limit_key: Option<&'a str>,
}

/// What enqueueing one job did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Enqueued {
    /// The job's id.
    pub id: i64,
    /// True when a job with the same unique key was pending already: `id` is that job's.
    pub existing: bool,
}

/// Counts of the managed queue, per queue and status.
///
/// Counted without reading the whole table (see `queue/counts/`): each figure is exact up to
/// [`COUNT_CAP`](crate::queue::COUNT_CAP) jobs; a larger one is the database's estimate
/// (PostgreSQL, MySQL/MariaDB; named in [`QueueStats::estimated`]) or, where the database keeps
/// no statistics to estimate from (SQLite), a lower bound (named in [`QueueStats::at_least`]).
/// A status counted in one sample for all queues (PostgreSQL and SQLite: running, waiting and
/// completed, which no index holds by queue) is exact while the status has at most the cap in
/// all queues together.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueStats {
    /// queue → status → jobs.
    pub by_queue: BTreeMap<String, BTreeMap<String, u64>>,
    /// How long the oldest due ready job has waited, in seconds, per queue.
    pub oldest_ready_secs: BTreeMap<String, f64>,
    /// Jobs completed in the last minute, per queue (above the cap, the rate of the latest
    /// completions over a minute: an estimate).
    pub completed_last_minute: BTreeMap<String, u64>,
    /// Ready jobs whose time has come, per queue (the rest of `ready` waits for its run-at).
    pub due: BTreeMap<String, u64>,
    /// Running jobs whose lease has ended, per queue: their worker died or lost the database,
    /// and the next claim takes them again.
    pub expired_leases: BTreeMap<String, u64>,
    /// Ready jobs that failed before and wait for a retry, per queue (counted in `ready` too):
    /// a queue whose ready jobs are all retries is failing, not healthy.
    pub retrying: BTreeMap<String, u64>,
    /// queue → the figures of that queue that are estimates, not counts: statuses of
    /// `by_queue`, or `due`, `retrying`, `completed_last_minute` (above the cap).
    pub estimated: BTreeMap<String, BTreeSet<String>>,
    /// queue → the figures of that queue that are lower bounds: counting stopped at the cap
    /// and the database has no estimate (SQLite), or too many leases had expired to count.
    pub at_least: BTreeMap<String, BTreeSet<String>>,
}

impl QueueStats {
    /// Whether `figure` of `queue` (a status, or `due`, `retrying`, `expired_leases`,
    /// `completed_last_minute`) is exact, an estimate, or a lower bound.
    pub fn exactness(&self, queue: &str, figure: &str) -> Exactness {
        let has = |m: &BTreeMap<String, BTreeSet<String>>| {
            m.get(queue).is_some_and(|s| s.contains(figure))
        };
        if has(&self.estimated) {
            Exactness::Estimate
        } else if has(&self.at_least) {
            Exactness::AtLeast
        } else {
            Exactness::Exact
        }
    }

    /// `n`, a figure of `queue`, as a person reads it: `1234`, `≈1234000` (an estimate) or
    /// `10000+` (a lower bound).
    pub fn shown(&self, queue: &str, figure: &str, n: u64) -> String {
        match self.exactness(queue, figure) {
            Exactness::Exact => n.to_string(),
            Exactness::Estimate => format!("≈{n}"),
            Exactness::AtLeast => format!("{n}+"),
        }
    }

    /// Sets the jobs of `queue` in `status` (counted, estimated or a lower bound: the marks say
    /// which).
    pub(crate) fn set_jobs(&mut self, queue: &str, status: &str, n: u64) {
        self.by_queue
            .entry(queue.to_owned())
            .or_default()
            .insert(status.to_owned(), n);
    }

    /// Marks `figure` of `queue` as the database's estimate.
    pub(crate) fn mark_estimated(&mut self, queue: &str, figure: &str) {
        self.estimated
            .entry(queue.to_owned())
            .or_default()
            .insert(figure.to_owned());
    }

    /// Marks `figure` of `queue` as a lower bound.
    pub(crate) fn mark_at_least(&mut self, queue: &str, figure: &str) {
        self.at_least
            .entry(queue.to_owned())
            .or_default()
            .insert(figure.to_owned());
    }
}

/// How a figure of [`QueueStats`] was had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Exactness {
    /// Counted.
    Exact,
    /// The database's estimate from its statistics (more jobs than the cap).
    Estimate,
    /// At least this many: counting stopped there.
    AtLeast,
}

/// A claimed job, read from its row.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Job {
    /// The job's id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// This run's number: 1 on the first run.
    pub attempt: i64,
    /// Runs it may have in all.
    pub max_attempts: i64,
    /// Its own time limit per run, if it was enqueued with one ([`NewJob::timeout`]).
    pub timeout: Option<Duration>,
}

impl Job {
    /// Whether the job has no attempts left: its lease ran out on its last attempt (the worker
    /// died), so it must not run again.
    pub fn exhausted(&self) -> bool {
        self.attempt > self.max_attempts
    }

    /// Reads a job out of a claimed row of `rowclaim_jobs`, moving its payload out of the row
    /// rather than copying it (the worker runtime's way: the row's data then lacks `payload`).
    pub(crate) fn take_from_row(row: &mut crate::claim::ClaimedRow) -> Result<Job> {
        let payload = match row.data.as_object_mut().and_then(|o| o.remove("payload")) {
            Some(serde_json::Value::String(s)) => {
                serde_json::from_str(&s).unwrap_or(serde_json::Value::String(s))
            }
            Some(v) => v,
            None => serde_json::Value::Null,
        };
        let mut job = Job::from_row(row)?;
        job.payload = payload;
        Ok(job)
    }

    /// Reads a job out of a claimed row of `rowclaim_jobs`.
    pub fn from_row(row: &crate::claim::ClaimedRow) -> Result<Job> {
        let d = &row.data;
        let id = match &row.id {
            RowId::Int(i) => *i,
            RowId::Text(t) => t
                .parse()
                .map_err(|_| Error::InvalidInput(format!("job id {t:?} is not an integer")))?,
        };
        let text = |k: &str| {
            d.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        let int = |k: &str| d.get(k).and_then(serde_json::Value::as_i64).unwrap_or(0);
        // Every database hands the payload over as its JSON text (see `claimed_json`).
        let payload = match d.get("payload") {
            Some(serde_json::Value::String(s)) => {
                serde_json::from_str(s).unwrap_or_else(|_| serde_json::Value::String(s.clone()))
            }
            Some(v) => v.clone(),
            None => serde_json::Value::Null,
        };
        Ok(Job {
            id,
            queue: text("queue"),
            kind: text("kind"),
            payload,
            attempt: int("attempts"),
            max_attempts: int("max_attempts"),
            timeout: d
                .get("timeout_ms")
                .and_then(serde_json::Value::as_i64)
                .filter(|ms| *ms > 0)
                .map(|ms| Duration::from_millis(ms as u64)),
        })
    }
}

/// What [`Claim::fail_job`] did with a failed job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobFailure {
    /// It runs again later.
    Retried,
    /// It had no attempts left: it is dead.
    Dead,
}

/// How long a failed job waits before its next run: exponential in the attempt (1 s, 2 s, 4 s …,
/// at most an hour), with ±25% jitter so that jobs that failed together do not retry together.
pub fn backoff(attempt: i64) -> Duration {
    let base = 2f64.powi(attempt.clamp(1, 30) as i32 - 1).min(3600.0);
    let jitter = f64::from(uuid::Uuid::now_v7().as_bytes()[15]) / 255.0; // 0..=1
    Duration::from_secs_f64(base * (0.75 + 0.5 * jitter))
}

impl Claim {
    /// Gives a row back to run again after `after`, keeping `error` (where the source has a
    /// run-at and an error column, as the managed queue does; elsewhere it is ready at once).
    pub async fn retry(&self, id: &RowId, after: Duration, error: impl Into<String>) -> Result<()> {
        self.settle_as(
            id,
            Outcome::Retry {
                after,
                error: Some(error.into()),
            },
        )
        .await
    }

    /// Settles a failed run of `job`: again after [`backoff`] while it has attempts left, else
    /// `dead`; the error is kept either way.
    pub async fn fail_job(&self, job: &Job, error: impl Into<String>) -> Result<JobFailure> {
        let id = RowId::Int(job.id);
        if job.attempt < job.max_attempts {
            self.retry(&id, backoff(job.attempt), error).await?;
            Ok(JobFailure::Retried)
        } else {
            self.fail_with(&id, error).await?;
            Ok(JobFailure::Dead)
        }
    }

    /// Marks a row failed for good (`dead` in the managed queue), keeping `error` where the source
    /// has a column for it.
    pub async fn fail_with(&self, id: &RowId, error: impl Into<String>) -> Result<()> {
        self.settle_as(id, Outcome::Failed(Some(error.into())))
            .await
    }
}

/// What an enqueue commits, for the message of a commit whose outcome is unknown.
pub(crate) fn enqueue_what(jobs: usize) -> String {
    match jobs {
        1 => "the enqueue of 1 job".to_owned(),
        n => format!("the enqueue of {n} jobs"),
    }
}

/// Checks every job before any is sent, naming the first bad one by its place (from 1).
pub(crate) fn check_jobs(jobs: &[NewJob]) -> Result<()> {
    check_jobs_from(jobs, 0).map(drop)
}

/// [`check_jobs`] for jobs that come after `before` others in the same call; says whether one
/// of them waits for others (read in the same pass).
pub(crate) fn check_jobs_from(jobs: &[NewJob], before: usize) -> Result<bool> {
    let mut waits = false;
    for (i, job) in jobs.iter().enumerate() {
        job.check()
            .map_err(|e| Error::InvalidInput(format!("job {}: {e}", before + i + 1)))?;
        waits |= job.waits();
    }
    Ok(waits)
}
