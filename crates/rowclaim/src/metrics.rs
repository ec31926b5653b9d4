//! What a worker reports through the [`metrics`] facade, and under which names.
//!
//! The library only records; an application installs the exporter it wants (the `rowclaim`
//! command serves Prometheus text with `work --metrics ADDR` and on the dashboard's `/metrics`).
//! Without an installed recorder every call here costs next to nothing.
//!
//! Every worker metric carries two labels:
//! - `source`: the table as the catalog names it ([`crate::Claimer::source_name`], e.g.
//!   `public.rowclaim_jobs`), so that a worker's series and the table's gauges join;
//! - `strategy`: the claim strategy in use (never `auto`).
//!
//! What happens to one job (its outcome, how long it ran, whether it runs now) also carries
//! `queue` and `kind`, the job's own, for jobs of the managed queue: a worker serving several
//! queues records each queue apart, and the series join the per-queue gauges. Kinds are the
//! application's names, meant to be few; past [`MOST_SERIES`] queue/kind pairs in one worker,
//! further kinds are recorded as `kind="other"`, so a runaway kind cannot grow the scrape
//! without bound. Claims, settles, renewals and outages are the worker's, not one queue's, and
//! carry neither.
//!
//! Counters end in `_total`, durations are histograms in seconds. [`describe`] registers the
//! help text of each, for exporters that show it, and sets [`BUILD_INFO`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::metrics::{Counter, Gauge, Histogram, Label};

/// Claim statements sent, by `result`: `rows` (claimed some), `empty` or `failed`.
pub const CLAIMS: &str = "rowclaim_claims_total";
/// Rows claimed.
pub const CLAIMED_ROWS: &str = "rowclaim_claimed_rows_total";
/// How long a claim statement took, retries of deadlocks and lost races included.
pub const CLAIM_SECONDS: &str = "rowclaim_claim_duration_seconds";
/// Jobs (rows) completed: their result was recorded as done.
pub const COMPLETED: &str = "rowclaim_jobs_completed_total";
/// Runs that failed: a row of a table of your own marked with the source's failed value, or a
/// managed-queue job's attempt that failed (then also counted as retried or dead).
pub const FAILED: &str = "rowclaim_jobs_failed_total";
/// Managed-queue jobs that failed with attempts left: scheduled again with backoff.
pub const RETRIED: &str = "rowclaim_jobs_retried_total";
/// Managed-queue jobs that failed their last attempt (or had none left): dead.
pub const DEAD: &str = "rowclaim_jobs_dead_total";
/// Rows given back unprocessed (shutdown, a handler that asked to abort).
pub const RELEASED: &str = "rowclaim_rows_released_total";
/// Rows whose handler asked to run them again later (a snooze: no attempt used).
pub const SNOOZED: &str = "rowclaim_jobs_snoozed_total";
/// Rows this worker held whose lease another worker (or a cancel) took over: their result, if
/// any, was refused by fencing.
pub const LEASES_LOST: &str = "rowclaim_leases_lost_total";
/// Rows this worker gave up because it could not renew or record in time (a database outage);
/// they come back to a worker when their lease ends.
pub const GIVEN_UP: &str = "rowclaim_rows_given_up_total";
/// Results sent whose answer was lost with the connection (most likely recorded).
pub const UNCONFIRMED: &str = "rowclaim_results_unconfirmed_total";
/// Handlers that panicked (each becomes its job's failure).
pub const PANICS: &str = "rowclaim_handler_panics_total";
/// Handlers stopped at their time limit.
pub const TIMEOUTS: &str = "rowclaim_jobs_timed_out_total";
/// Times the database stopped answering (one per outage, however long).
pub const OUTAGES: &str = "rowclaim_outages_total";
/// How long recording a batch of results took (one statement per claim and outcome).
pub const SETTLE_SECONDS: &str = "rowclaim_settle_duration_seconds";
/// Results recorded per settle statement.
pub const SETTLE_ROWS: &str = "rowclaim_settle_batch_rows";
/// How long handlers ran.
pub const JOB_SECONDS: &str = "rowclaim_job_duration_seconds";
/// Handlers running now.
pub const IN_FLIGHT: &str = "rowclaim_jobs_in_flight";
/// How late a lease renewal was confirmed, after the moment it was due (a third of the lease
/// after the previous confirmation): near zero when healthy, growing towards the lease when the
/// database is slow or away.
pub const HEARTBEAT_LAG_SECONDS: &str = "rowclaim_heartbeat_lag_seconds";
/// Lease renewals, by `result`: `renewed` or `failed`.
pub const RENEWALS: &str = "rowclaim_lease_renewals_total";
/// Always 1, with the library's version in the `version` label.
pub const BUILD_INFO: &str = "rowclaim_build_info";

/// The most queue/kind pairs one worker records apart; later kinds are `kind="other"`.
pub const MOST_SERIES: usize = 200;

/// Registers the help text of every metric above with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        CLAIMS,
        "Claim statements sent, by result (rows, empty, failed)."
    );
    describe_counter!(CLAIMED_ROWS, "Rows claimed.");
    describe_histogram!(
        CLAIM_SECONDS,
        Unit::Seconds,
        "How long a claim statement took."
    );
    describe_counter!(COMPLETED, "Jobs (rows) whose result was recorded as done.");
    describe_counter!(
        FAILED,
        "Failed runs: own-table rows marked failed, queue jobs' failed attempts."
    );
    describe_counter!(RETRIED, "Queue jobs that failed with attempts left.");
    describe_counter!(DEAD, "Queue jobs that failed their last attempt.");
    describe_counter!(RELEASED, "Rows given back unprocessed.");
    describe_counter!(SNOOZED, "Rows whose handler asked to run them again later.");
    describe_counter!(
        LEASES_LOST,
        "Rows whose lease another worker took over (their result was refused)."
    );
    describe_counter!(
        GIVEN_UP,
        "Rows given up because renewing or recording failed in time."
    );
    describe_counter!(
        UNCONFIRMED,
        "Results whose answer was lost (most likely recorded)."
    );
    describe_counter!(PANICS, "Handlers that panicked.");
    describe_counter!(TIMEOUTS, "Handlers stopped at their time limit.");
    describe_counter!(OUTAGES, "Times the database stopped answering.");
    describe_histogram!(
        SETTLE_SECONDS,
        Unit::Seconds,
        "How long one settle statement took."
    );
    describe_histogram!(SETTLE_ROWS, Unit::Count, "Results per settle statement.");
    describe_histogram!(JOB_SECONDS, Unit::Seconds, "How long handlers ran.");
    describe_gauge!(IN_FLIGHT, "Handlers running now.");
    describe_histogram!(
        HEARTBEAT_LAG_SECONDS,
        Unit::Seconds,
        "How late a lease renewal was confirmed after it was due."
    );
    describe_counter!(RENEWALS, "Lease renewals, by result (renewed, failed).");
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version of rowclaim in its label."
    );
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// One worker's metric handles, registered once with its labels (a handle is cheap to use;
/// registering is a map lookup).
#[derive(Clone)]
pub(crate) struct WorkerMetrics {
    pub claims_rows: Counter,
    pub claims_empty: Counter,
    pub claims_failed: Counter,
    pub claimed_rows: Counter,
    pub claim_seconds: Histogram,
    pub released: Counter,
    pub leases_lost: Counter,
    pub given_up: Counter,
    pub unconfirmed: Counter,
    pub outages: Counter,
    pub settle_seconds: Histogram,
    pub settle_rows: Histogram,
    pub heartbeat_lag: Histogram,
    pub renewed: Counter,
    pub renewal_failed: Counter,
    /// The series of jobs, by queue and kind (one set for a table of your own).
    jobs: Arc<JobSeriesSet>,
}

/// The handles of what happens to one job, for one queue and kind (or a table of your own).
pub(crate) struct JobSeries {
    pub completed: Counter,
    pub failed: Counter,
    pub retried: Counter,
    pub dead: Counter,
    pub snoozed: Counter,
    pub panics: Counter,
    pub timeouts: Counter,
    pub job_seconds: Histogram,
    pub in_flight: Gauge,
}

impl JobSeries {
    fn with(labels: &[Label]) -> JobSeries {
        let counter = |name: &'static str| metrics::counter!(name, labels.to_vec());
        JobSeries {
            completed: counter(COMPLETED),
            failed: counter(FAILED),
            retried: counter(RETRIED),
            dead: counter(DEAD),
            snoozed: counter(SNOOZED),
            panics: counter(PANICS),
            timeouts: counter(TIMEOUTS),
            job_seconds: metrics::histogram!(JOB_SECONDS, labels.to_vec()),
            in_flight: metrics::gauge!(IN_FLIGHT, labels.to_vec()),
        }
    }
}

/// A worker's job series, made as queue/kind pairs first show up (at most [`MOST_SERIES`]).
struct JobSeriesSet {
    /// `source` and `strategy`.
    base: Vec<Label>,
    /// The series of rows that are no job: a table of your own, or a row not read as a job
    /// (made at first use, so that a queue's worker shows none).
    plain: std::sync::OnceLock<Arc<JobSeries>>,
    /// Queue → kind → series (looked up without allocating: this runs for every job).
    by_job: Mutex<HashMap<String, HashMap<String, Arc<JobSeries>>>>,
}

impl JobSeriesSet {
    fn of(&self, queue: &str, kind: &str) -> Arc<JobSeries> {
        let mut map = self.by_job.lock().unwrap_or_else(|p| p.into_inner());
        let known = |map: &HashMap<String, HashMap<String, Arc<JobSeries>>>, kind: &str| {
            map.get(queue).and_then(|kinds| kinds.get(kind)).cloned()
        };
        if let Some(series) = known(&map, kind) {
            return series;
        }
        let pairs: usize = map.values().map(HashMap::len).sum();
        let kind = if pairs < MOST_SERIES { kind } else { "other" };
        if let Some(series) = known(&map, kind) {
            return series;
        }
        let mut labels = self.base.clone();
        labels.push(Label::new("queue", queue.to_owned()));
        labels.push(Label::new("kind", kind.to_owned()));
        let series = Arc::new(JobSeries::with(&labels));
        map.entry(queue.to_owned())
            .or_default()
            .insert(kind.to_owned(), series.clone());
        series
    }
}

impl WorkerMetrics {
    /// The handles of a worker on `claimer`.
    pub(crate) fn of(claimer: &crate::claim::Claimer) -> WorkerMetrics {
        let labels = vec![
            Label::new("source", claimer.source_name().to_owned()),
            Label::new("strategy", claimer.strategy().to_string()),
        ];
        let with = |key: &'static str, value: &'static str| {
            let mut l = labels.clone();
            l.push(Label::new(key, value));
            l
        };
        let counter = |name: &'static str| metrics::counter!(name, labels.clone());
        let histogram = |name: &'static str| metrics::histogram!(name, labels.clone());
        WorkerMetrics {
            claims_rows: metrics::counter!(CLAIMS, with("result", "rows")),
            claims_empty: metrics::counter!(CLAIMS, with("result", "empty")),
            claims_failed: metrics::counter!(CLAIMS, with("result", "failed")),
            claimed_rows: counter(CLAIMED_ROWS),
            claim_seconds: histogram(CLAIM_SECONDS),
            released: counter(RELEASED),
            leases_lost: counter(LEASES_LOST),
            given_up: counter(GIVEN_UP),
            unconfirmed: counter(UNCONFIRMED),
            outages: counter(OUTAGES),
            settle_seconds: histogram(SETTLE_SECONDS),
            settle_rows: histogram(SETTLE_ROWS),
            heartbeat_lag: histogram(HEARTBEAT_LAG_SECONDS),
            renewed: metrics::counter!(RENEWALS, with("result", "renewed")),
            renewal_failed: metrics::counter!(RENEWALS, with("result", "failed")),
            jobs: Arc::new(JobSeriesSet {
                plain: std::sync::OnceLock::new(),
                base: labels,
                by_job: Mutex::default(),
            }),
        }
    }

    /// The series a job of `queue` and `kind` records to; `None`: a row that is no job.
    pub(crate) fn job(&self, job: Option<(&str, &str)>) -> Arc<JobSeries> {
        match job {
            Some((queue, kind)) => self.jobs.of(queue, kind),
            None => self
                .jobs
                .plain
                .get_or_init(|| Arc::new(JobSeries::with(&self.jobs.base)))
                .clone(),
        }
    }
}

/// Counts a handler as running while it lives: dropped on every way out of a job (end, stop,
/// panic, the worker aborting it), so the in-flight gauge never drifts.
pub(crate) struct Running(Gauge, Arc<AtomicUsize>);

impl Running {
    /// Counts a handler as running in `gauge` and in `count` (what the worker registry's
    /// heartbeat reports) until dropped.
    pub(crate) fn start(gauge: &Gauge, count: &Arc<AtomicUsize>) -> Running {
        gauge.increment(1.0);
        count.fetch_add(1, Ordering::Relaxed);
        Running(gauge.clone(), count.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.decrement(1.0);
        self.1.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Seconds as the histograms take them.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_past_the_most_series_are_recorded_as_other() {
        let set = JobSeriesSet {
            base: Vec::new(),
            plain: std::sync::OnceLock::new(),
            by_job: Mutex::default(),
        };
        for k in 0..MOST_SERIES + 10 {
            set.of("q", &format!("kind{k}"));
        }
        // A pair seen before keeps its own series.
        set.of("q", "kind0");
        let map = set.by_job.lock().unwrap();
        let kinds = &map["q"];
        assert_eq!(kinds.len(), MOST_SERIES + 1, "{} pairs", kinds.len());
        assert!(kinds.contains_key("other"));
        assert!(kinds.contains_key("kind0"));
        assert!(!kinds.contains_key(&format!("kind{MOST_SERIES}")));
    }
}
