//! `GET /`, the overview: every managed queue, the schedules and every recorded source, problem
//! ones first.

use std::collections::BTreeMap;
use std::time::SystemTime;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;
use rowclaim::JOB_STATUSES;

use super::queues::{no_queue, paused_queues, run_now, schedule_table, schedules};
use crate::cmd::dashboard::layout::{layout, path_segment, secs};
use crate::cmd::dashboard::state::{State as St, Who};

struct QueueLine {
    name: String,
    /// Since when it is paused, if it is.
    paused: Option<SystemTime>,
    by_status: BTreeMap<String, u64>,
    oldest_wait: f64,
    completed_last_minute: u64,
    expired: u64,
    /// Ready jobs that failed before, waiting for a retry.
    retrying: u64,
}

impl QueueLine {
    fn dead(&self) -> u64 {
        self.by_status.get("dead").copied().unwrap_or(0)
    }
    /// Problem queues first: dead jobs, expired leases or retries, then the longest wait.
    fn rank(&self) -> (bool, u64) {
        (
            self.dead() > 0 || self.expired > 0 || self.retrying > 0,
            (self.oldest_wait * 1000.0) as u64,
        )
    }
}

struct SourceLine {
    record: rowclaim::registry::RecordedSource,
    stats: Result<rowclaim::Stats, String>,
}

impl SourceLine {
    fn rank(&self) -> (bool, u64, u64) {
        match &self.stats {
            Err(_) => (true, u64::MAX, 0),
            Ok(s) => (
                s.expired_leases > 0,
                s.expired_leases,
                s.by_status.get(&self.record.claimed).copied().unwrap_or(0),
            ),
        }
    }
}

/// `GET /`: every managed queue and every recorded source, problem ones first.
pub async fn overview(State(state): State<St>, Extension(who): Extension<Who>) -> Response {
    let paused = paused_queues(&state).await;
    // Kept to say which figures are estimates or lower bounds (above the count cap).
    let mut counted = rowclaim::QueueStats::default();
    let (queues, queue_problem) = match state.db.queue().stats(None).await {
        Ok(stats) => {
            let mut lines: Vec<QueueLine> = stats
                .by_queue
                .clone()
                .into_iter()
                .map(|(name, by_status)| QueueLine {
                    oldest_wait: stats.oldest_ready_secs.get(&name).copied().unwrap_or(0.0),
                    completed_last_minute: stats
                        .completed_last_minute
                        .get(&name)
                        .copied()
                        .unwrap_or(0),
                    // By the database's clock, which decides when a lease ends.
                    expired: stats.expired_leases.get(&name).copied().unwrap_or(0),
                    retrying: stats.retrying.get(&name).copied().unwrap_or(0),
                    paused: paused.get(&name).copied(),
                    by_status,
                    name,
                })
                .collect();
            lines.sort_by(|a, b| b.rank().cmp(&a.rank()).then(a.name.cmp(&b.name)));
            counted = stats;
            (lines, None)
        }
        Err(e) if no_queue(&e) => (Vec::new(), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let (mut sources, source_problem) = match state.db.recorded_sources().await {
        Ok(records) => {
            let mut lines = Vec::new();
            for record in records {
                let stats = match state.claimer_of(record.clone()).await {
                    Ok((_, c)) => c.stats().await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                lines.push(SourceLine { record, stats });
            }
            (lines, None)
        }
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    sources.sort_by(|a, b| {
        b.rank()
            .cmp(&a.rank())
            .then(a.record.table.cmp(&b.record.table))
    });
    let (schedules, schedule_problem) = schedules(&state, None).await;
    let body = html! {
        h2 { "Managed queues" }
        @if let Some(p) = queue_problem { p.problem { (p) } }
        @if queues.is_empty() {
            p.muted { "No jobs in a managed queue here (rowclaim_jobs is missing or empty)." }
        } @else {
            @if !counted.estimated.is_empty() || !counted.at_least.is_empty() {
                p.muted { "≈: the database's estimate; +: at least. Counts stop at " (rowclaim::COUNT_CAP) " jobs of a queue and status." }
            }
            table #queues {
                tr {
                    th { "queue" }
                    @for s in JOB_STATUSES { th.num { (s) } }
                    th.num { "waiting for a retry" } th.num { "expired leases" } th.num { "oldest wait" } th.num { "completed last min" }
                }
                @for q in &queues {
                    tr data-queue=(q.name) {
                        td {
                            a href=(format!("/queues/{}", path_segment(&q.name))) { (q.name) }
                            @if q.paused.is_some() { " " span.badge.paused { "paused" } }
                        }
                        @for s in JOB_STATUSES {
                            @let n = q.by_status.get(*s).copied().unwrap_or(0);
                            td.num.problem[*s == "dead" && n > 0] data-status=(s) { (counted.shown(&q.name, s, n)) }
                        }
                        td.num.problem[q.retrying > 0] data-retrying { (counted.shown(&q.name, "retrying", q.retrying)) }
                        td.num.problem[q.expired > 0] { (counted.shown(&q.name, "expired_leases", q.expired)) }
                        td.num { (secs(q.oldest_wait)) }
                        td.num { (counted.shown(&q.name, "completed_last_minute", q.completed_last_minute)) }
                    }
                }
            }
        }
        @if !schedules.is_empty() || schedule_problem.is_some() {
            h2 { "Schedules" }
            @if let Some(p) = schedule_problem { p.problem { (p) } }
            (schedule_table(&schedules, run_now(&state, &who)))
        }
        h2 { "Own tables" }
        @if let Some(p) = source_problem { p.problem { (p) } }
        @if sources.is_empty() {
            p.muted { "No table has been claimed here yet (rowclaim_sources records each table's first claim)." }
        } @else {
            table #sources {
                tr { th { "table" } th { "strategy" } th { "rows by status" } th.num { "claimed" } th.num { "holders" } th.num { "expired leases" } }
                @for s in &sources {
                    tr data-source=(s.record.table) {
                        td { a href=(format!("/sources/{}", path_segment(&s.record.table))) { (s.record.table) } }
                        td { (s.record.strategy) }
                        @match &s.stats {
                            Ok(st) => {
                                td { @for (status, n) in &st.by_status { span data-status=(status) { (status) ": " (n) } " " } }
                                td.num { (st.by_status.get(&s.record.claimed).copied().unwrap_or(0)) }
                                td.num { (st.claimed_by_owner.len()) }
                                td.num.problem[st.expired_leases > 0] { (st.expired_leases) }
                            }
                            Err(e) => { td.problem colspan="4" { (e) } }
                        }
                    }
                }
            }
        }
    };
    layout(&state, &who, "Overview", true, body).into_response()
}
