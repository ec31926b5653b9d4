//! What a worker reports through the [`metrics`] facade, and under which names.
//!
//! The library only records; an application installs the exporter it wants (the `rowclaim`
//! command serves Prometheus text with `work --metrics ADDR` and on the dashboard's `/metrics`).
//! Without an installed recorder every call here costs next to nothing.
//!
//! Every worker metric carries three labels:
//! - `source`: the table as the catalog names it ([`crate::Claimer::source_name`], e.g.
//!   `public.rowclaim_jobs`), so that a worker's series and the table's gauges join;
//! - `queue`: the managed queues the worker serves, comma-separated and sorted (empty for a
//!   table of your own);
//! - `strategy`: the claim strategy in use (never `auto`).
//!
//! Counters end in `_total`, durations are histograms in seconds. [`describe`] registers the
//! help text of each, for exporters that show it.

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
/// Rows of a table of your own that failed (marked with the source's failed value).
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
    describe_counter!(FAILED, "Rows of an own table marked failed.");
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
    pub completed: Counter,
    pub failed: Counter,
    pub retried: Counter,
    pub dead: Counter,
    pub released: Counter,
    pub snoozed: Counter,
    pub leases_lost: Counter,
    pub given_up: Counter,
    pub unconfirmed: Counter,
    pub panics: Counter,
    pub timeouts: Counter,
    pub outages: Counter,
    pub settle_seconds: Histogram,
    pub settle_rows: Histogram,
    pub job_seconds: Histogram,
    pub in_flight: Gauge,
    pub heartbeat_lag: Histogram,
    pub renewed: Counter,
    pub renewal_failed: Counter,
}

impl WorkerMetrics {
    /// The handles of a worker on `claimer`.
    pub(crate) fn of(claimer: &crate::claim::Claimer) -> WorkerMetrics {
        let queue = crate::queue::served(claimer)
            .map(|q| {
                let mut q = q.to_vec();
                q.sort();
                q.join(",")
            })
            .unwrap_or_default();
        let labels = vec![
            Label::new("source", claimer.source_name().to_owned()),
            Label::new("queue", queue),
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
            completed: counter(COMPLETED),
            failed: counter(FAILED),
            retried: counter(RETRIED),
            dead: counter(DEAD),
            released: counter(RELEASED),
            snoozed: counter(SNOOZED),
            leases_lost: counter(LEASES_LOST),
            given_up: counter(GIVEN_UP),
            unconfirmed: counter(UNCONFIRMED),
            panics: counter(PANICS),
            timeouts: counter(TIMEOUTS),
            outages: counter(OUTAGES),
            settle_seconds: histogram(SETTLE_SECONDS),
            settle_rows: histogram(SETTLE_ROWS),
            job_seconds: histogram(JOB_SECONDS),
            in_flight: metrics::gauge!(IN_FLIGHT, labels.clone()),
            heartbeat_lag: histogram(HEARTBEAT_LAG_SECONDS),
            renewed: metrics::counter!(RENEWALS, with("result", "renewed")),
            renewal_failed: metrics::counter!(RENEWALS, with("result", "failed")),
        }
    }
}

/// Counts a handler as running while it lives: dropped on every way out of a job (end, stop,
/// panic, the worker aborting it), so the in-flight gauge never drifts.
pub(crate) struct Running(Gauge);

impl Running {
    pub(crate) fn start(gauge: &Gauge) -> Running {
        gauge.increment(1.0);
        Running(gauge.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// Seconds as the histograms take them.
pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
