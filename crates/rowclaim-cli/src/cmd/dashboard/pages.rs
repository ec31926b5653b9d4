//! The pages: the overview, a queue, a job, a source, a row, the actions. Every GET only reads.
//! Every value reaches the page through maud, which escapes it; the database is named only by
//! its endpoint (no password).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use rowclaim::{JobFilter, JobRecord, RowFilter, ScheduleStatus, JOB_STATUSES};
use serde::Deserialize;

use super::charts::{chart, colour_of, Line};
use super::history::QueueSample;
use super::state::{Dashboard, State as St, Who};

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}\
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}\
header a{color:#fff}header .grow{flex:1}main{padding:8px 16px}\
table{border-collapse:collapse;margin:8px 0}td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}\
td.num,th.num{text-align:right}.problem{color:#b00020;font-weight:600}.muted{color:#777}\
pre{background:#f4f4f4;padding:8px;overflow:auto;max-height:30em}.badge{background:#b00020;color:#fff;padding:1px 6px;border-radius:3px}\
figure.chart{margin:8px 0}.legend span{margin-right:12px}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}\
form.inline{display:inline}button.danger{color:#b00020}.badge.paused{background:#8a6d00}";

/// Reloads the page every 10 s, unless the user is typing in it or has changed a field (a
/// page being filled in is never reloaded away).
const REFRESH: &str = "(function(){var dirty=false;document.addEventListener('input',function(){dirty=true;});\
setInterval(function(){var a=document.activeElement;if(dirty||(a&&/^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName)))return;location.reload();},10000);})();";

/// The `<head>` of every page.
fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width";
            title { (title) " · rowclaim" }
            style { (PreEscaped(CSS)) }
        }
    }
}

/// A page without the navigation (the login page).
pub fn layout_bare(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body { main { (body) } }
        }
    }
}

/// A page of a logged-in session: navigation, the database's endpoint, and the refresh.
fn layout(state: &Dashboard, who: &Who, title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header {
                    strong { "rowclaim" }
                    a href="/" { "Overview" }
                    a href="/actions" { "Actions" }
                    span.grow { span.muted { (state.endpoint) } }
                    @if state.read_only { span.badge { "read-only" } }
                    form.inline method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(who.session.csrf);
                        button type="submit" { "Log out" }
                    }
                }
                main { h1 { (title) } (body) }
                @if refresh { script { (PreEscaped(REFRESH)) } }
            }
        }
    }
}

/// A page saying what went wrong, with its status.
/// The record of `table` and a claimer for it, or the page that says why there is none.
async fn recorded(
    state: &Dashboard,
    who: &Who,
    table: &str,
) -> Result<(rowclaim::registry::RecordedSource, rowclaim::Claimer), Response> {
    match state.source(table).await {
        Ok(Some(found)) => Ok(found),
        Ok(None) => Err(trouble(
            state,
            who,
            StatusCode::NOT_FOUND,
            &format!("No recorded source {table}."),
        )),
        Err(e) => Err(trouble(
            state,
            who,
            StatusCode::INTERNAL_SERVER_ERROR,
            &e.to_string(),
        )),
    }
}

fn trouble(state: &Dashboard, who: &Who, status: StatusCode, what: &str) -> Response {
    let page = layout(state, who, "Problem", false, html! { p.problem { (what) } });
    (status, page).into_response()
}

/// `text` as one segment of a path (percent-encoded past the unreserved characters).
pub fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `text` as a query value.
fn query_value(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A time as RFC 3339 (UTC, seconds) and how far from now.
fn when(t: SystemTime) -> String {
    let Ok(since_epoch) = t.duration_since(UNIX_EPOCH) else {
        return "before 1970".to_owned();
    };
    // RFC 3339 stops at the year 9999 (humantime panics past it); a job may be put that far.
    if since_epoch.as_secs() >= 253_402_300_800 {
        return "after the year 9999".to_owned();
    }
    let at = humantime::format_rfc3339_seconds(UNIX_EPOCH + since_epoch);
    let now = SystemTime::now();
    let rel = match t.duration_since(now) {
        Ok(ahead) => format!("in {}", short(ahead)),
        Err(e) => format!("{} ago", short(e.duration())),
    };
    format!("{at} ({rel})")
}

fn short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

fn secs(s: f64) -> String {
    short(Duration::from_secs_f64(s.max(0.0)))
}

/// Whether a lease has ended, by this machine's clock (the database's decides for claims).
fn expired(lease: Option<SystemTime>) -> bool {
    lease.is_some_and(|l| l < SystemTime::now())
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
fn no_queue(e: &rowclaim::Error) -> bool {
    e.kind() == rowclaim::ErrorKind::BadInput
}

struct QueueLine {
    name: String,
    /// Since when it is paused, if it is.
    paused: Option<SystemTime>,
    by_status: BTreeMap<String, u64>,
    oldest_wait: f64,
    completed_last_minute: u64,
    expired: u64,
}

impl QueueLine {
    fn dead(&self) -> u64 {
        self.by_status.get("dead").copied().unwrap_or(0)
    }
    /// Problem queues first: dead jobs or expired leases, then the longest wait.
    fn rank(&self) -> (bool, u64) {
        (
            self.dead() > 0 || self.expired > 0,
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
    let (queues, queue_problem) = match state.db.queue().stats(None).await {
        Ok(stats) => {
            let mut lines: Vec<QueueLine> = stats
                .by_queue
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
                    paused: paused.get(&name).copied(),
                    by_status,
                    name,
                })
                .collect();
            lines.sort_by(|a, b| b.rank().cmp(&a.rank()).then(a.name.cmp(&b.name)));
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
            table #queues {
                tr {
                    th { "queue" }
                    @for s in JOB_STATUSES { th.num { (s) } }
                    th.num { "expired leases" } th.num { "oldest wait" } th.num { "completed last min" }
                }
                @for q in &queues {
                    tr data-queue=(q.name) {
                        td {
                            a href=(format!("/queues/{}", path_segment(&q.name))) { (q.name) }
                            @if q.paused.is_some() { " " span.badge.paused { "paused" } }
                        }
                        @for s in JOB_STATUSES {
                            @let n = q.by_status.get(*s).copied().unwrap_or(0);
                            td.num.problem[*s == "dead" && n > 0] data-status=(s) { (n) }
                        }
                        td.num.problem[q.expired > 0] { (q.expired) }
                        td.num { (secs(q.oldest_wait)) }
                        td.num { (q.completed_last_minute) }
                    }
                }
            }
        }
        @if !schedules.is_empty() || schedule_problem.is_some() {
            h2 { "Schedules" }
            @if let Some(p) = schedule_problem { p.problem { (p) } }
            (schedule_table(&schedules))
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

#[derive(Deserialize, Default)]
pub struct JobSearch {
    status: Option<String>,
    kind: Option<String>,
    id: Option<String>,
    before: Option<i64>,
    limit: Option<u32>,
}

/// Page sizes offered.
const LIMITS: [u32; 4] = [25, 50, 100, 500];

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
    let mut holders: BTreeMap<String, (u64, Option<SystemTime>)> = BTreeMap::new();
    for job in &running {
        let h = holders
            .entry(job.owner.clone().unwrap_or_else(|| "(no owner)".into()))
            .or_default();
        h.0 += 1;
        h.1 = match (h.1, job.lease_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let limit = search.limit.filter(|l| LIMITS.contains(l)).unwrap_or(50);
    let status = search
        .status
        .clone()
        .filter(|s| JOB_STATUSES.contains(&s.as_str()));
    let kind = search.kind.clone().filter(|k| !k.trim().is_empty());
    let wanted_id = search
        .id
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let (jobs, search_problem) = match wanted_id {
        Some(text) => match text.parse::<i64>() {
            Ok(id) => match queue.get(id).await {
                Ok(job) => (job.into_iter().filter(|j| j.queue == name).collect(), None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            },
            Err(_) => (Vec::new(), Some(format!("id {text:?} is not a number"))),
        },
        None => {
            let mut f = JobFilter::new().queues([name.clone()]).limit(limit);
            if let Some(s) = &status {
                f = f.status(s.clone());
            }
            if let Some(k) = &kind {
                f = f.kinds([k.trim().to_owned()]);
            }
            if let Some(b) = search.before {
                f = f.before_id(b);
            }
            match queue.list(&f).await {
                Ok(jobs) => (jobs, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            }
        }
    };
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
    let next = (jobs.len() as u32 == limit && wanted_id.is_none())
        .then(|| jobs.last().map(|j| j.id))
        .flatten()
        .map(|last| {
            let mut q = format!("?before={last}&limit={limit}");
            if let Some(s) = &status {
                q.push_str(&format!("&status={}", query_value(s)));
            }
            if let Some(k) = &kind {
                q.push_str(&format!("&kind={}", query_value(k)));
            }
            q
        });
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
            tr { @for s in JOB_STATUSES { th.num { (s) } } th.num { "oldest wait" } th.num { "completed last min" } }
            tr {
                @for s in JOB_STATUSES { td.num data-status=(s) { (counts.get(*s).copied().unwrap_or(0)) } }
                td.num { (secs(stats.oldest_ready_secs.get(&name).copied().unwrap_or(0.0))) }
                td.num { (stats.completed_last_minute.get(&name).copied().unwrap_or(0)) }
            }
        }
        @if !schedules.is_empty() {
            h2 { "Schedules" }
            (schedule_table(&schedules))
        }
        (chart("Throughput", "jobs/min", &throughput))
        (chart("Wait", "s", &wait))
        (chart("Jobs by status", "jobs", &by_status))
        h2 { "Workers holding jobs" }
        @if holders.is_empty() { p.muted { "None." } } @else {
            table #holders {
                tr { th { "owner (claim token)" } th.num { "jobs" } th { "first lease end" } }
                @for (owner, (n, lease)) in &holders {
                    tr { td { code { (owner) } } td.num { (n) } td.problem[expired(*lease)] { (lease.map(when).unwrap_or_default()) } }
                }
            }
        }
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
        h2 { "Jobs" }
        form method="get" {
            label { "status " select name="status" {
                option value="" { "any" }
                @for s in JOB_STATUSES { option value=(s) selected[status.as_deref() == Some(*s)] { (s) } }
            } }
            " " label { "kind " input name="kind" value=(kind.clone().unwrap_or_default()); }
            " " label { "id " input name="id" size="8" value=(wanted_id.unwrap_or_default()); }
            " " label { "per page " select name="limit" {
                @for l in LIMITS { option value=(l) selected[l == limit] { (l) } }
            } }
            " " button type="submit" { "Search" }
        }
        @if let Some(p) = search_problem { p.problem { (p) } }
        (job_table(&jobs))
        @if let Some(q) = next { p { a href=(q) { "Older jobs →" } } }
    };
    layout(&state, &who, &format!("Queue {name}"), true, body).into_response()
}

/// The paused queues and since when; none where they cannot be read (no managed queue, or one
/// older than pausing).
async fn paused_queues(state: &Dashboard) -> BTreeMap<String, SystemTime> {
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
async fn schedules(
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

/// Schedules as a table: overdue ones (no scheduler runs them) marked.
fn schedule_table(schedules: &[ScheduleStatus]) -> Markup {
    html! {
        table #schedules {
            tr { th { "schedule" } th { "expression" } th { "zone" } th { "queue" } th { "last tick" } th { "next tick" } }
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
                }
            }
        }
    }
}

fn job_table(jobs: &[JobRecord]) -> Markup {
    html! {
        @if jobs.is_empty() { p.muted { "No jobs." } } @else {
            table #jobs {
                tr { th { "id" } th { "kind" } th { "status" } th.num { "attempts" } th { "run at" } th { "last error" } }
                @for j in jobs {
                    tr data-job=(j.id) {
                        td { a href=(format!("/jobs/{}", j.id)) { (j.id) } }
                        td { (j.kind) }
                        td.problem[j.status == "dead"] { (j.status) }
                        td.num { (j.attempts) "/" (j.max_attempts) }
                        td { (when(j.run_at)) }
                        td { (j.last_error.as_deref().map(|e| e.chars().take(120).collect::<String>()).unwrap_or_default()) }
                    }
                }
            }
        }
    }
}

/// A form that POSTs `action` with the session's CSRF token (and the `fields`), after the
/// browser asks to confirm.
fn action_button(
    who: &Who,
    action: &str,
    fields: &[(&str, &str)],
    label: &str,
    confirm: &str,
    danger: bool,
) -> Markup {
    html! {
        form.inline method="post" action=(action) data-confirm=(confirm) onsubmit="return confirm(this.dataset.confirm)" {
            input type="hidden" name="csrf" value=(who.session.csrf);
            @for (name, value) in fields { input type="hidden" name=(name) value=(value); }
            button.danger[danger] type="submit" { (label) }
        }
    }
}

/// `GET /jobs/{id}`: the job as stored, its times and the dashboard's actions on it as a
/// timeline, and what may be done to it.
pub async fn job(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path(id): Path<i64>,
) -> Response {
    let job = match state.db.queue().get(id).await {
        Ok(Some(j)) => j,
        Ok(None) => {
            return trouble(
                &state,
                &who,
                StatusCode::NOT_FOUND,
                &format!("There is no job {id}."),
            )
        }
        Err(e) => {
            return trouble(
                &state,
                &who,
                StatusCode::INTERNAL_SERVER_ERROR,
                &e.to_string(),
            )
        }
    };
    let payload = serde_json::to_string_pretty(&job.payload).unwrap_or_default();
    let mut timeline: Vec<(SystemTime, String)> = vec![(job.created_at, "enqueued".to_owned())];
    timeline.push((
        job.run_at,
        match job.status.as_str() {
            "ready" => "due to run",
            _ => "last run due",
        }
        .to_owned(),
    ));
    // A finished job keeps its last lease in the row; only a running one's lease means anything.
    if let Some(l) = job.lease_until.filter(|_| job.status == "running") {
        timeline.push((l, "lease ends".to_owned()));
    }
    if let Some(f) = job.finished_at {
        timeline.push((
            f,
            match job.status.as_str() {
                "completed" => "completed",
                "dead" => "died (no attempts left)",
                "cancelled" => "cancelled",
                _ => "finished",
            }
            .to_owned(),
        ));
    }
    // What was done to it here (retries reset its attempts and times, so only this says so).
    let target = format!("job {id}");
    for a in state.actions.newest_first() {
        if a.target == target {
            timeline.push((
                a.at,
                format!("{} from the dashboard by {}: {}", a.what, a.who, a.outcome),
            ));
        }
    }
    timeline.sort_by_key(|(t, _)| *t);
    let st = job.status.as_str();
    let body = html! {
        table #job {
            tr { th { "queue" } td { a href=(format!("/queues/{}", path_segment(&job.queue))) { (job.queue) } } }
            tr { th { "kind" } td { (job.kind) } }
            tr { th { "status" } td.problem[st == "dead"] #status { (job.status) } }
            tr { th { "attempts" } td { (job.attempts) " of " (job.max_attempts) } }
            tr { th { "priority" } td { (job.priority) } }
            @if let Some(o) = &job.owner { tr { th { @if job.status == "running" { "owner" } @else { "last owner" } } td { code { (o) } } } }
            @if let Some(k) = &job.unique_key { tr { th { "unique key" } td { (k) } } }
            @if let Some(k) = &job.limit_key { tr { th { "limit key" } td { (k) } } }
            @if let Some(t) = job.attempted_at { tr { th { "last started" } td { (when(t)) } } }
            @if let Some(t) = job.timeout_ms { tr { th { "timeout" } td { (t) " ms" } } }
        }
        h2 { "Timeline" }
        ol #timeline { @for (t, what) in &timeline { li { (when(*t)) " — " (what) } } }
        h2 { "Payload" }
        pre #payload { (payload) }
        @if let Some(out) = &job.output {
            h2 { "Output" }
            pre #output { (serde_json::to_string_pretty(out).unwrap_or_default()) }
        }
        h2 { "Last error" }
        @match &job.last_error {
            Some(e) => pre #last-error { (e) },
            None => p.muted { "None." },
        }
        @if !state.read_only {
            h2 { "Actions" }
            p #actions {
                @if st == "dead" || st == "cancelled" {
                    (action_button(&who, &format!("/jobs/{id}/retry"), &[], "Retry", &format!("Retry job {id} (ready again, attempts reset)?"), false)) " "
                }
                @if st == "ready" || st == "running" {
                    (action_button(&who, &format!("/jobs/{id}/cancel"), &[], "Cancel", &format!("Cancel job {id}? A running job's result will be refused."), true)) " "
                }
                @if st != "running" {
                    (action_button(&who, &format!("/jobs/{id}/delete"), &[], "Delete", &format!("Delete job {id} for good?"), true))
                }
            }
        }
    };
    layout(&state, &who, &format!("Job {id}"), true, body).into_response()
}

#[derive(Deserialize, Default)]
pub struct RowSearch {
    status: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

/// `GET /sources/{table}`: a recorded table's counts, chart, holders and rows.
pub async fn source(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path(table): Path<String>,
    Query(search): Query<RowSearch>,
) -> Response {
    let (record, claimer) = match recorded(&state, &who, &table).await {
        Ok(found) => found,
        Err(page) => return page,
    };
    let stats = match claimer.stats().await {
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
    let limit = search.limit.filter(|l| LIMITS.contains(l)).unwrap_or(50);
    let status = search.status.clone().filter(|s| !s.is_empty());
    let mut f = RowFilter::new().limit(limit);
    if let Some(s) = &status {
        f = f.status(s.clone());
    }
    if let Some(a) = search.after.as_deref().filter(|a| !a.is_empty()) {
        f = f.after(a);
    }
    let (rows, rows_problem) = match claimer.rows(&f).await {
        Ok(r) => (r, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let samples = state.history.samples();
    let statuses: Vec<String> = stats.by_status.keys().cloned().collect();
    let lines: Vec<Line> = statuses
        .iter()
        .map(|st| Line {
            name: st.clone(),
            colour: colour_of(if *st == record.ready {
                "ready"
            } else if *st == record.claimed {
                "claimed"
            } else {
                st
            }),
            points: samples
                .iter()
                .filter_map(|s| {
                    s.sources
                        .get(&table)
                        .map(|c| (s.at, c.get(st).copied().unwrap_or(0) as f64))
                })
                .collect(),
        })
        .collect();
    let next = (rows.len() as u32 == limit)
        .then(|| rows.last().map(|r| r.id.to_string()))
        .flatten()
        .map(|last| {
            let mut q = format!("?after={}&limit={limit}", query_value(&last));
            if let Some(s) = &status {
                q.push_str(&format!("&status={}", query_value(s)));
            }
            q
        });
    let base = format!("/sources/{}", path_segment(&table));
    let body = html! {
        p.muted {
            "id " code { (record.id_column) } ", status " code { (record.status_column) }
            " (ready " code { (record.ready) } ", claimed " code { (record.claimed) } ")"
            @if let Some(o) = &record.owner_column { ", owner " code { (o) } }
            @if let Some(l) = &record.lease_column { ", lease " code { (l) } }
            "; claims kept " (record.claims) " by " (record.strategy)
        }
        table #counts {
            tr { @for (st, _) in &stats.by_status { th.num { (st) } } th.num { "expired leases" } }
            tr {
                @for (st, n) in &stats.by_status { td.num data-status=(st) { (n) } }
                td.num.problem[stats.expired_leases > 0] { (stats.expired_leases) }
            }
        }
        (chart("Rows by status", "rows", &lines))
        h2 { "Holders" }
        @if stats.claimed_by_owner.is_empty() { p.muted { "No row is claimed." } } @else {
            table #holders {
                tr { th { "owner (claim token)" } th.num { "rows" } }
                @for (owner, n) in &stats.claimed_by_owner { tr { td { code { (owner) } } td.num { (n) } } }
            }
        }
        h2 { "Rows" }
        form method="get" {
            label { "status " select name="status" {
                option value="" { "any" }
                @for st in &statuses { option value=(st) selected[status.as_deref() == Some(st.as_str())] { (st) } }
            } }
            " " label { "per page " select name="limit" {
                @for l in LIMITS { option value=(l) selected[l == limit] { (l) } }
            } }
            " " button type="submit" { "Search" }
        }
        @if let Some(p) = rows_problem { p.problem { (p) } }
        @if rows.is_empty() { p.muted { "No rows." } } @else {
            table #rows {
                tr { th { "id" } th { "status" } th { "owner" } th { "lease end" } }
                @for r in &rows {
                    @let id = r.id.to_string();
                    tr data-row=(id) {
                        td { a href=(format!("{base}/rows/{}", path_segment(&id))) { (id) } }
                        td { (r.status) }
                        td { code { (r.owner.as_deref().unwrap_or("")) } }
                        td.problem[expired(r.lease_until)] { (r.lease_until.map(when).unwrap_or_default()) }
                    }
                }
            }
        }
        @if let Some(q) = next { p { a href=(q) { "More rows →" } } }
    };
    layout(&state, &who, &format!("Table {table}"), true, body).into_response()
}

/// `GET /sources/{table}/rows/{id}`: one row's columns, status, holder and lease.
pub async fn row(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path((table, id)): Path<(String, String)>,
) -> Response {
    let (record, claimer) = match recorded(&state, &who, &table).await {
        Ok(found) => found,
        Err(page) => return page,
    };
    let found = match claimer.parse_id(&id) {
        Ok(row_id) => claimer.row(&row_id).await,
        Err(e) => Err(e),
    };
    let row = match found {
        Ok(Some(r)) => r,
        Ok(None) => {
            return trouble(
                &state,
                &who,
                StatusCode::NOT_FOUND,
                &format!("{table} has no row {id}."),
            )
        }
        Err(e) => return trouble(&state, &who, StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let held = row.status == record.claimed || row.owner.is_some();
    // Only where the holder can be fenced out (Claimer::release_row refuses elsewhere).
    let releasable = record.strategy != rowclaim::Strategy::Transaction
        && (record.owner_column.is_some() || record.strategy == rowclaim::Strategy::LeaseTable);
    let data = serde_json::to_string_pretty(&row.data).unwrap_or_default();
    let body = html! {
        p { a href=(format!("/sources/{}", path_segment(&table))) { "← " (table) } }
        table #row {
            tr { th { "status" } td #status { (row.status) } }
            tr { th { "owner" } td { code { (row.owner.as_deref().unwrap_or("")) } } }
            tr { th { "lease end" } td.problem[expired(row.lease_until)] { (row.lease_until.map(when).unwrap_or_default()) } }
        }
        h2 { "Columns" }
        pre #columns { (data) }
        @if !state.read_only && held && releasable {
            h2 { "Actions" }
            p #actions {
                (action_button(
                    &who,
                    &format!("/sources/{}/rows/{}/release", path_segment(&table), path_segment(&id)),
                    &[("holder", row.owner.as_deref().unwrap_or_default())],
                    "Release",
                    &format!("Give row {id} back (ready again)? Its holder's result will be refused."),
                    true,
                ))
            }
        }
    };
    layout(&state, &who, &format!("{table} row {id}"), true, body).into_response()
}

/// `GET /actions`: the last actions taken here, newest first.
pub async fn actions(State(state): State<St>, Extension(who): Extension<Who>) -> Response {
    let actions = state.actions.newest_first();
    let body = html! {
        @if actions.is_empty() { p.muted { "No actions yet." } } @else {
            table #actions {
                tr { th { "when" } th { "who" } th { "what" } th { "on" } th { "outcome" } }
                @for a in &actions {
                    tr {
                        td { (when(a.at)) }
                        td { (a.who) }
                        td { (a.what) }
                        td { (a.target) }
                        td.problem[a.outcome != "done"] { (a.outcome) }
                    }
                }
            }
        }
    };
    layout(&state, &who, "Actions", true, body).into_response()
}
