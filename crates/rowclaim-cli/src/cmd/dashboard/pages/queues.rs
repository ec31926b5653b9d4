//! `GET /queues/{queue}`: one managed queue's counts, charts, holders, running jobs, and a search
//! of its jobs; with what the overview shows of the queues too (pauses, schedules).

use std::collections::BTreeMap;
use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup};
use rowclaim::{JobFilter, JobRecord, ScheduleStatus, JOB_STATUSES};

use super::job_list::job_list;
use crate::cmd::dashboard::charts::{chart, colour_of, Line};
use crate::cmd::dashboard::history::QueueSample;
use crate::cmd::dashboard::layout::{
    action_button, expired, layout, path_segment, secs, trouble, when,
};
use crate::cmd::dashboard::search::JobSearch;
use crate::cmd::dashboard::state::{Dashboard, State as St, Who};

/// `GET /queues/{queue}`: counts, charts, holders, running jobs, and a search of its jobs.
pub async fn queue(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path(name): Path<String>,
    Query(search): Query<JobSearch>,
) -> Response {
    let queue = state.db.queue();
    let stats = match queue.stats(Some(&name)).await {
        Ok(s) => s,
        Err(e) => {
            return trouble(
                &state,
                &who,
                StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
            )
        }
    };
    let counts = stats.by_queue.get(&name).cloned().unwrap_or_default();
    let paused_at = paused_queues(&state).await.get(&name).copied();
    let limits = queue_limits(&state, &name).await;
    let (schedules, _) = schedules(&state, Some(&name)).await;
    let running = running(&state, Some(&name), 1000).await;
    let holders = super::workers::holders(&state, &running).await;
    let jobs = job_list(&state, &who, &search, Some(&name)).await;
    let samples = state.history.samples();
    let series = |f: &dyn Fn(&QueueSample) -> f64| -> Vec<(SystemTime, f64)> {
        samples
            .iter()
            .filter_map(|s| s.queues.get(&name).map(|q| (s.at, f(q))))
            .collect()
    };
    let throughput = [Line {
        name: "completed in the last minute".into(),
        colour: colour_of("completed"),
        points: series(&|q| q.completed_last_minute as f64),
    }];
    let wait = [Line {
        name: "oldest due job's wait (s)".into(),
        colour: colour_of("ready"),
        points: series(&|q| q.oldest_wait_secs),
    }];
    let by_status: Vec<Line> = ["ready", "running", "dead"]
        .into_iter()
        .map(|st| Line {
            name: st.to_owned(),
            colour: colour_of(st),
            points: series(&|q| q.by_status.get(st).copied().unwrap_or(0) as f64),
        })
        .collect();
    let control = format!("/queues/{}", path_segment(&name));
    let body = html! {
        p #state {
            @match paused_at {
                Some(t) => {
                    span.badge { "paused" } " since " (when(t)) ": workers start none of its jobs. "
                    @if !state.read_only {
                        (action_button(&who, &format!("{control}/resume"), &[], "Resume", &format!("Resume queue {name}?"), false))
                    }
                }
                None => {
                    "Running. "
                    @if !state.read_only {
                        (action_button(&who, &format!("{control}/pause"), &[], "Pause", &format!("Pause queue {name}? Workers start none of its jobs until it is resumed; running jobs finish."), true))
                    }
                }
            }
        }
        p #limits {
            @match limits.as_ref().and_then(crate::cmd::queue::describe) {
                Some(l) => { "Limits, across all workers: " strong { (l) } "." }
                None => { "No limits. Set them with " code { "rowclaim queue limit " (name) } "." }
            }
        }
        table #counts {
            tr { @for s in JOB_STATUSES { th.num { (s) } } th.num { "waiting for a retry" } th.num { "oldest wait" } th.num { "completed last min" } }
            tr {
                @for s in JOB_STATUSES { td.num data-status=(s) { (stats.shown(&name, s, counts.get(*s).copied().unwrap_or(0))) } }
                @let retrying = stats.retrying.get(&name).copied().unwrap_or(0);
                td.num.problem[retrying > 0] data-retrying { (stats.shown(&name, "retrying", retrying)) }
                td.num { (secs(stats.oldest_ready_secs.get(&name).copied().unwrap_or(0.0))) }
                td.num { (stats.shown(&name, "completed_last_minute", stats.completed_last_minute.get(&name).copied().unwrap_or(0))) }
            }
        }
        @if stats.estimated.contains_key(&name) || stats.at_least.contains_key(&name) {
            p.muted { "≈: the database's estimate; +: at least. Counts stop at " (rowclaim::COUNT_CAP) " jobs of a status." }
        }
        // The list before the charts: what an operator searches and acts on comes first.
        h2 { "Jobs" }
        (jobs)
        @if !schedules.is_empty() {
            h2 { "Schedules" }
            (schedule_table(&schedules, run_now(&state, &who)))
        }
        (chart("Throughput", "jobs/min", &throughput))
        (chart("Wait", "s", &wait))
        (chart("Jobs by status", "jobs", &by_status))
        h2 { "Workers holding jobs" }
        (super::workers::holders_table(&holders))
        h2 { "Running" }
        @if running.is_empty() { p.muted { "Nothing is running." } } @else {
            table #running {
                tr { th { "id" } th { "kind" } th { "owner" } th { "lease end" } th.num { "attempt" } }
                @for j in &running {
                    tr {
                        td { a href=(format!("/jobs/{}", j.id)) { (j.id) } }
                        td { (j.kind) }
                        td { code { (j.owner.as_deref().unwrap_or("")) } }
                        td.problem[expired(j.lease_until)] { (j.lease_until.map(when).unwrap_or_default()) @if expired(j.lease_until) { " expired" } }
                        td.num { (j.attempts) "/" (j.max_attempts) }
                    }
                }
            }
        }
    };
    layout(&state, &who, &format!("Queue {name}"), true, body).into_response()
}

/// The queue's running jobs (up to `limit`), or none when there is no managed queue.
async fn running(state: &Dashboard, queue: Option<&str>, limit: u32) -> Vec<JobRecord> {
    let mut f = JobFilter::new().status("running").limit(limit);
    if let Some(q) = queue {
        f = f.queues([q]);
    }
    state.db.queue().list(&f).await.unwrap_or_default()
}

/// Whether an error says there is no managed queue here (not a failure for the overview): the
/// queue's reads answer bad input, "run `rowclaim init` first", where it is missing or old.
pub fn no_queue(e: &rowclaim::Error) -> bool {
    matches!(
        e.kind(),
        rowclaim::ErrorKind::BadInput | rowclaim::ErrorKind::NotInitialised
    )
}

/// The paused queues and since when; none where they cannot be read (no managed queue, or one
/// older than pausing).
pub async fn paused_queues(state: &Dashboard) -> BTreeMap<String, SystemTime> {
    state
        .db
        .queue()
        .settings()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter_map(|s| Some((s.name, s.paused_at?)))
        .collect()
}

/// The limits of `queue`; None where there are none or they cannot be read (no managed queue,
/// or one older than limits).
async fn queue_limits(state: &Dashboard, queue: &str) -> Option<rowclaim::QueueLimits> {
    state
        .db
        .queue()
        .settings()
        .await
        .ok()?
        .into_iter()
        .find(|s| s.name == queue)
        .map(|s| s.limits)
}

/// The stored schedules (of `queue`, or all), or why they could not be read. None is no
/// problem where the managed queue or its schedules' table does not exist yet.
pub async fn schedules(
    state: &Dashboard,
    queue: Option<&str>,
) -> (Vec<ScheduleStatus>, Option<String>) {
    match state.db.queue().schedules().await {
        Ok(mut list) => {
            list.retain(|s| queue.is_none_or(|q| s.queue == q));
            (list, None)
        }
        Err(e) if no_queue(&e) => (Vec::new(), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    }
}

/// The session that may run a schedule now: none on a read-only dashboard.
pub fn run_now<'a>(state: &Dashboard, who: &'a Who) -> Option<&'a Who> {
    (!state.read_only).then_some(who)
}

/// Schedules as a table: overdue ones (no scheduler runs them) marked; with a "run now" button
/// each when `run_now` gives the session to post it in.
pub fn schedule_table(schedules: &[ScheduleStatus], run_now: Option<&Who>) -> Markup {
    html! {
        table #schedules {
            tr { th { "schedule" } th { "expression" } th { "zone" } th { "queue" } th { "last tick" } th { "next tick" } @if run_now.is_some() { th { "" } } }
            @for s in schedules {
                tr data-schedule=(s.name) {
                    td { (s.name) }
                    td { code { (s.expression) } }
                    td { (s.zone.as_deref().unwrap_or("")) }
                    td { a href=(format!("/queues/{}", path_segment(&s.queue))) { (s.queue) } }
                    td {
                        @match (s.last_tick, s.last_job) {
                            (Some(t), Some(job)) => { a href=(format!("/jobs/{job}")) { (when(t)) } }
                            (Some(t), None) => { (when(t)) }
                            (None, _) => { span.muted { "never" } }
                        }
                    }
                    td.problem[s.overdue] {
                        (when(s.next_tick))
                        @if s.overdue { " overdue: no scheduler runs it" }
                    }
                    @if let Some(who) = run_now {
                        td { (action_button(who, &format!("/schedules/{}/run", path_segment(&s.name)), &[], "Run now",
                            &format!("Enqueue schedule {}'s job now, once (its ticks stay as they are)?", s.name), false)) }
                    }
                }
            }
        }
    }
}
