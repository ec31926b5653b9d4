//! Prometheus text for `work --metrics ADDR` and the dashboard's `/metrics`.
//!
//! Two kinds of series: what this process's workers record through the library's metrics
//! ([`rowclaim::metrics`]: claims, completions, latencies…, kept by the installed recorder), and
//! gauges read from the database: jobs per queue and status, due jobs, the oldest due job's wait,
//! expired leases, and rows per status of tables of your own. The database gauges are read at
//! most once per [`REFRESH`], with one statement per queue table or source, however often
//! Prometheus scrapes; concurrent scrapes share one read.
//!
//! The database gauges describe the database, not this process, so of all the processes on one
//! database (workers, dashboards) one exports them: the holder of the database's turn for
//! them ([`rowclaim::Turns`], a lock its session holds: when it dies, the next scrape of
//! another process takes over). `sum(rowclaim_queue_jobs{status="completed"})` is then the
//! database's count however many processes Prometheus scrapes; `rowclaim_gauges_exporter`
//! says which process it is.

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use rowclaim::{Claimer, Queue};
use tokio::sync::Mutex;

use crate::error::CliError;
use crate::secret::Bearer;

/// The longest a scrape shows database gauges as they were (and the least time between two
/// reads of them).
pub const REFRESH: Duration = Duration::from_secs(5);

/// The process's recorder (installed once): the library's metrics land here.
fn recorder() -> Result<&'static PrometheusHandle, CliError> {
    rowclaim_bench::prometheus_recorder().map_err(CliError::Metrics)
}

/// What the database gauges are read from.
pub struct Watched {
    /// The managed queue (all its queues), if it is watched. A database without it (never
    /// `rowclaim init`ed) just has no queue gauges.
    pub queue: Option<Queue>,
    /// Tables of your own, each by a claimer that only reads (stats never claim), found anew
    /// at each read: the dashboard's list grows as tables are first claimed.
    pub sources: SourceList,
}

/// The claimers of the tables to read, at the time of a read.
pub type SourceList =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Vec<Claimer>> + Send>> + Send + Sync>;

/// A fixed list of tables.
pub fn fixed(claimers: Vec<Claimer>) -> SourceList {
    Box::new(move || {
        let claimers = claimers.clone();
        Box::pin(async move { claimers })
    })
}

/// A `/metrics` endpoint: the recorder's series plus the database gauges.
pub struct Endpoint {
    handle: &'static PrometheusHandle,
    /// The database, for what every worker on it shares (the worker registry).
    db: rowclaim::Db,
    watched: Watched,
    /// Which gauges this process exports (a turn per queue table and per source).
    turns: Mutex<rowclaim::Turns>,
    /// The last database read: when, and its text.
    cache: Mutex<Option<(Instant, String)>>,
}

impl Endpoint {
    /// Installs the recorder (once per process) and watches `watched` on `db`.
    pub fn new(db: &rowclaim::Db, watched: Watched) -> Result<Arc<Endpoint>, CliError> {
        Ok(Arc::new(Endpoint {
            handle: recorder()?,
            db: db.clone(),
            watched,
            turns: Mutex::new(db.turns()),
            cache: Mutex::new(None),
        }))
    }

    /// The whole scrape: database gauges (at most [`REFRESH`] old), then the recorder's series.
    pub async fn render(&self) -> String {
        let mut text = self.database_gauges().await;
        text.push_str(&self.handle.render());
        text
    }

    async fn database_gauges(&self) -> String {
        let mut cache = self.cache.lock().await;
        if let Some((at, text)) = cache.as_ref() {
            if at.elapsed() < REFRESH {
                return text.clone();
            }
        }
        let text = read_gauges(&self.db, &self.watched, &mut *self.turns.lock().await).await;
        *cache = Some((Instant::now(), text.clone()));
        text
    }
}

/// The router serving `GET /metrics` (the dashboard merges it into its own).
pub fn router(endpoint: Arc<Endpoint>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let endpoint = endpoint.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    endpoint.render().await,
                )
                    .into_response()
            }
        }),
    )
}

/// Serves `/metrics` on `addr` in the background (`work --metrics`), to requests with the
/// `bearer` token when there is one; the listener is bound before this returns, so a bad
/// address is an error now, naming the flag. Returns the address bound (port 0 picks one).
pub async fn serve(
    addr: SocketAddr,
    endpoint: Arc<Endpoint>,
    bearer: Option<Bearer>,
) -> Result<SocketAddr, CliError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::BadInput(format!("--metrics {addr}: cannot listen there: {e}")))?;
    let bound = listener.local_addr().unwrap_or(addr);
    let mut app = router(endpoint);
    if let Some(bearer) = bearer {
        let check = move |req: axum::extract::Request, next: axum::middleware::Next| {
            bearer.clone().require(req, next)
        };
        app = app.layer(axum::middleware::from_fn(check));
    }
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("serving metrics on {bound}: {e}");
        }
    });
    Ok(bound)
}

/// The turn of the managed queue's gauges.
const QUEUE_TURN: &str = "gauges:queue";

/// The turn of the worker registry's gauge: every process may export it, one does.
const WORKERS_TURN: &str = "gauges:workers";

/// Workers of the registry by state (`active`, `stopped`, `gone`): one per database.
fn worker_gauges(
    out: &mut String,
    counts: &std::collections::BTreeMap<rowclaim::WorkerState, u64>,
) {
    gauge_header(
        out,
        "rowclaim_workers",
        "Workers in the registry by state: active, stopped (shut down cleanly), gone (no \
         heartbeat for a lease).",
    );
    for (state, n) in counts {
        let _ = writeln!(out, "rowclaim_workers{{state=\"{}\"}} {n}", state.as_str());
    }
}

/// The turn of a table's gauges.
fn source_turn(claimer: &Claimer) -> String {
    format!("gauges:source:{}", claimer.source_name())
}

/// Reads the gauges this process exports (those whose turn it holds) from the database, as
/// Prometheus text. A read that fails is said in the text (`rowclaim_database_up 0`) and
/// logged, so a scrape still answers while the database is away.
async fn read_gauges(db: &rowclaim::Db, w: &Watched, turns: &mut rowclaim::Turns) -> String {
    let mut out = String::new();
    let mut up = true;
    let claimers = (w.sources)().await;
    let mut names: Vec<String> = claimers.iter().map(source_turn).collect();
    names.push(WORKERS_TURN.to_owned());
    if w.queue.is_some() {
        names.push(QUEUE_TURN.to_owned());
    }
    let held = match turns.hold(&names).await {
        Ok(held) => held,
        Err(e) => {
            // Better every process's gauges than none: a sum may double until it answers.
            tracing::warn!("metrics: asking which process exports the database gauges: {e}");
            names.iter().cloned().collect()
        }
    };
    if let Some(queue) = w.queue.as_ref().filter(|_| held.contains(QUEUE_TURN)) {
        match queue.stats(None).await {
            Ok(stats) => queue_gauges(&mut out, &stats),
            // Told to run `rowclaim init`: there is no queue here, which is no outage.
            Err(e) if e.kind() == rowclaim::ErrorKind::NotInitialised => {}
            Err(e) => {
                tracing::warn!("metrics: reading the queue's counts: {e}");
                up = false;
            }
        }
    }
    if held.contains(WORKERS_TURN) {
        match db.worker_counts().await {
            Ok(counts) => worker_gauges(&mut out, &counts),
            Err(e) => {
                tracing::warn!("metrics: reading the worker registry: {e}");
                up = false;
            }
        }
    }
    let mut sources = Vec::new();
    for claimer in claimers.iter().filter(|c| held.contains(&source_turn(c))) {
        match claimer.stats().await {
            Ok(stats) => sources.push((claimer.source_name().to_owned(), stats)),
            Err(e) => {
                tracing::warn!("metrics: reading {}'s counts: {e}", claimer.table_name());
                up = false;
            }
        }
    }
    source_gauges(&mut out, &sources);
    gauge_header(
        &mut out,
        "rowclaim_gauges_exporter",
        "1 in the process that exports the database gauges (one per database), else 0.",
    );
    let _ = writeln!(
        out,
        "rowclaim_gauges_exporter {}",
        u8::from(!held.is_empty())
    );
    gauge_header(
        &mut out,
        "rowclaim_database_up",
        "Whether the last read of the database gauges succeeded.",
    );
    let _ = writeln!(out, "rowclaim_database_up {}", u8::from(up));
    out
}

/// A gauge's value for one queue.
type PerQueue<'a> = dyn Fn(&String) -> f64 + 'a;

fn queue_gauges(out: &mut String, stats: &rowclaim::QueueStats) {
    let queues: Vec<&String> = stats.by_queue.keys().collect();
    gauge_header(
        out,
        "rowclaim_queue_jobs",
        "Jobs of the managed queue, by status.",
    );
    for q in &queues {
        for status in rowclaim::JOB_STATUSES {
            let n = stats.by_queue[*q].get(*status).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "rowclaim_queue_jobs{{queue=\"{}\",status=\"{status}\"}} {n}",
                escape(q)
            );
        }
    }
    gauge_header(
        out,
        "rowclaim_queue_jobs_estimated",
        "1 when rowclaim_queue_jobs of this queue and status is not a count: above the count \
         cap, the database's estimate (or on SQLite the cap, a lower bound).",
    );
    for q in &queues {
        for status in rowclaim::JOB_STATUSES {
            let inexact = stats.exactness(q, status) != rowclaim::Exactness::Exact;
            let _ = writeln!(
                out,
                "rowclaim_queue_jobs_estimated{{queue=\"{}\",status=\"{status}\"}} {}",
                escape(q),
                u8::from(inexact)
            );
        }
    }
    let per_queue: [(&str, &str, &PerQueue); 5] = [
        (
            "rowclaim_queue_due_jobs",
            "Ready jobs whose run-at has come.",
            &|q| stats.due.get(q).copied().unwrap_or(0) as f64,
        ),
        (
            "rowclaim_queue_retrying_jobs",
            "Ready jobs that failed before and wait for a retry (counted in ready too).",
            &|q| stats.retrying.get(q).copied().unwrap_or(0) as f64,
        ),
        (
            "rowclaim_queue_oldest_wait_seconds",
            "How long the oldest due job has waited.",
            &|q| stats.oldest_ready_secs.get(q).copied().unwrap_or(0.0),
        ),
        (
            "rowclaim_queue_expired_leases",
            "Running jobs whose lease has ended (their worker died or lost the database).",
            &|q| stats.expired_leases.get(q).copied().unwrap_or(0) as f64,
        ),
        (
            "rowclaim_queue_completed_last_minute",
            "Jobs completed in the last minute (kept completed jobs only).",
            &|q| stats.completed_last_minute.get(q).copied().unwrap_or(0) as f64,
        ),
    ];
    for (name, help, value) in per_queue {
        gauge_header(out, name, help);
        for q in &queues {
            let _ = writeln!(out, "{name}{{queue=\"{}\"}} {}", escape(q), value(q));
        }
    }
}

fn source_gauges(out: &mut String, sources: &[(String, rowclaim::Stats)]) {
    if sources.is_empty() {
        return;
    }
    gauge_header(
        out,
        "rowclaim_source_rows",
        "Rows of a table of your own, by status value.",
    );
    for (table, stats) in sources {
        for (status, n) in &stats.by_status {
            let _ = writeln!(
                out,
                "rowclaim_source_rows{{source=\"{}\",status=\"{}\"}} {n}",
                escape(table),
                escape(status)
            );
        }
    }
    gauge_header(
        out,
        "rowclaim_source_expired_leases",
        "Claimed rows whose lease has ended (claimable again).",
    );
    for (table, stats) in sources {
        let _ = writeln!(
            out,
            "rowclaim_source_expired_leases{{source=\"{}\"}} {}",
            escape(table),
            stats.expired_leases
        );
    }
}

fn gauge_header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
    }
}
