//! The Prometheus recorder of the `rowclaim` process, where the library's metrics
//! ([`rowclaim::metrics`]) land: installed once, by `work --metrics`, the dashboard, or
//! `bench worker --metrics` (which measures what recording costs). Here because both binaries
//! (`rowclaim` and `rowclaim-bench`) set their process up from this crate, as with logging.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Buckets of the latency histograms, in seconds: a claim or settle statement takes
/// milliseconds when healthy, seconds under contention or an outage; jobs take anything.
const SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];
/// Buckets of how long jobs ran: up to an hour (a job may run that long; past the last bucket
/// only `+Inf` would tell).
const JOB_SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1200.0, 1800.0, 3600.0,
];
const ROWS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

/// How often histogram samples are folded into their buckets. The recorder keeps every sample
/// until then, so without this a worker that is never scraped grows by each job's samples for
/// as long as it runs.
pub const UPKEEP: Duration = Duration::from_secs(5);

/// The process's recorder, installed at the first call (which must be inside a tokio runtime:
/// it starts the upkeep task).
pub fn prometheus_recorder() -> std::result::Result<&'static PrometheusHandle, String> {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    if let Some(h) = HANDLE.get() {
        return Ok(h);
    }
    // A full name is matched before a suffix.
    let job = Matcher::Full(rowclaim::metrics::JOB_SECONDS.into());
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(job, JOB_SECONDS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_rows".into()), ROWS))
        .map_err(|e| e.to_string())?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| e.to_string())?;
    rowclaim::metrics::describe();
    let handle = HANDLE.get_or_init(|| handle);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(UPKEEP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
    Ok(handle)
}
