//! A searchable list of jobs, with what may be done to them: `GET /jobs` (every queue) and the
//! list on a queue's page. Its form narrows the jobs (queue, status, kind, a search of id,
//! kind, status, payload and last error); pages go both ways (newer and older); on a narrowed
//! list the actions take every matching job ("retry all 300 matching") or the rows selected.

use crate::cmd::dashboard::layout::{action_button, layout, when, LIMITS};
use crate::cmd::dashboard::search::{given, JobSearch};
use crate::cmd::dashboard::state::{Dashboard, State as St, Who};
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup};
use rowclaim::{BulkAction, JobRecord, JOB_STATUSES};

/// `GET /jobs`: the jobs of every queue, searched.
pub async fn jobs(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Query(search): Query<JobSearch>,
) -> Response {
    let body = job_list(&state, &who, &search, None).await;
    layout(&state, &who, "Jobs", true, body).into_response()
}

/// The list: its form, the actions on all matching jobs, the table with a checkbox per row, and
/// the pages. `queue`: the queue whose page it is on (its form then asks no queue).
pub async fn job_list(
    state: &Dashboard,
    who: &Who,
    search: &JobSearch,
    queue: Option<&str>,
) -> Markup {
    let mut search = search.clone();
    if let Some(q) = queue {
        search.queue = Some(q.to_owned());
    }
    let limit = search.limit.filter(|l| LIMITS.contains(l)).unwrap_or(50);
    // One more than a page, to know whether there is more in the direction read.
    let mut f = search.filter().limit(limit + 1);
    let upwards = search.before.is_none() && search.after.is_some();
    if let Some(b) = search.before {
        f = f.before_id(b);
    } else if let Some(a) = search.after {
        f = f.after_id(a);
    }
    let (mut jobs, problem) = match state.db.queue().list(&f).await {
        Ok(jobs) => (jobs, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let more = jobs.len() > limit as usize;
    if more && upwards {
        // Newest first: the one too many is the newest.
        jobs.remove(0);
    }
    jobs.truncate(limit as usize);
    let here = format!("?limit={limit}{}", search.query());
    let newer = (search.before.is_some() || (upwards && more))
        .then(|| jobs.first().map(|j| format!("{here}&after={}", j.id)))
        .flatten();
    let older = (upwards || more)
        .then(|| jobs.last().map(|j| format!("{here}&before={}", j.id)))
        .flatten();
    let acts = !state.read_only && !jobs.is_empty();
    html! {
        (search_form(&search, queue.is_none(), limit))
        @if let Some(p) = problem { p.problem { (p) } }
        @if acts && search.filter().narrows() { (all_matching(state, who, &search).await) }
        @if jobs.is_empty() { p.muted { "No jobs." } } @else {
            @if acts {
                form #selected method="post" action="/jobs/bulk" {
                    input type="hidden" name="csrf" value=(who.session.csrf);
                    p {
                        "Selected jobs: "
                        @for a in [BulkAction::Retry, BulkAction::Cancel, BulkAction::Delete] {
                            button.danger[a != BulkAction::Retry] type="submit" name="action" value=(a.verb())
                                onclick="var n=this.form.querySelectorAll('input[name=id]:checked').length;return n>0&&confirm(this.textContent+': '+n+' selected job(s)?')" {
                                (capital(a.verb())) " selected"
                            }
                            " "
                        }
                    }
                    (job_rows(&jobs, true))
                }
            } @else {
                (job_rows(&jobs, false))
            }
        }
        p.pages {
            @if let Some(n) = newer { a #newer href=(n) { "← Newer jobs" } " " }
            @if let Some(o) = older { a #older href=(o) { "Older jobs →" } }
        }
    }
}

/// The form that narrows the list (a queue field only where the list is of every queue).
fn search_form(search: &JobSearch, ask_queue: bool, limit: u32) -> Markup {
    let status = given(&search.status);
    html! {
        form #search method="get" {
            @if ask_queue {
                label { "queue " input name="queue" size="12" value=(given(&search.queue).unwrap_or_default()); } " "
            }
            label { "status " select name="status" {
                option value="" { "any" }
                @for s in JOB_STATUSES { option value=(s) selected[status.as_deref() == Some(*s)] { (s) } }
            } }
            " " label { "kind " input name="kind" size="12" value=(given(&search.kind).unwrap_or_default()); }
            " " label { "search " input name="q" size="24" placeholder="id, kind, payload or error text" value=(given(&search.q).unwrap_or_default()); }
            " " label { "per page " select name="limit" {
                @for l in LIMITS { option value=(l) selected[l == limit] { (l) } }
            } }
            " " button type="submit" { "Search" }
        }
    }
}

/// "Retry all N matching" (and cancel, delete), each with the count of matching jobs in a
/// state it takes, asked again with that count before it is sent.
async fn all_matching(state: &Dashboard, who: &Who, search: &JobSearch) -> Markup {
    let filter = search.filter();
    let said = search.said();
    let fields = search.fields();
    let mut offered = Vec::new();
    // With a status, every action offered takes the same jobs: one count serves them all.
    // Counting stops past the cap ("more than 10000"): the action still takes every match.
    let cap = rowclaim::COUNT_CAP;
    let mut same = None;
    for a in [BulkAction::Retry, BulkAction::Cancel, BulkAction::Delete] {
        let counted = match (&filter.status, same) {
            (Some(s), _) if !a.takes().contains(&s.as_str()) => continue,
            (Some(_), Some(n)) => Ok(n),
            (Some(_), None) => state.db.queue().count_at_most(&filter, None, cap).await,
            (None, _) => state.db.queue().count_at_most(&filter, Some(a), cap).await,
        };
        if let Ok(n) = counted {
            same = filter.status.as_ref().map(|_| n);
            let n = match n {
                Some(0) => continue,
                Some(n) => n.to_string(),
                None => format!("(more than {cap})"),
            };
            offered.push((a, n));
        }
    }
    let buttons: Vec<Markup> = offered
        .iter()
        .map(|(a, n)| {
            let verb = capital(a.verb());
            let mut sent: Vec<(&str, &str)> =
                fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            sent.push(("action", a.verb()));
            // With a status the jobs are in it; without, say which states the action takes.
            let which = match (&filter.status, a) {
                (Some(_), _) => String::new(),
                (None, BulkAction::Delete) => " that are not running".to_owned(),
                (None, _) => format!(" that are {}", a.takes().join(" or ")),
            };
            let question = format!("{verb} all {n} jobs matching {said}{which}?");
            let label = format!("{verb} all {n} matching");
            action_button(
                who,
                "/jobs/bulk",
                &sent,
                &label,
                &question,
                *a != BulkAction::Retry,
            )
        })
        .collect();
    html! {
        @if !buttons.is_empty() {
            div #all-matching { @for b in buttons { (b) " " } }
        }
    }
}

/// `retry` as `Retry`.
fn capital(verb: &str) -> String {
    let mut c = verb.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// Jobs as a table, each linked to its page; with a checkbox per row when `ticks`.
pub fn job_rows(jobs: &[JobRecord], ticks: bool) -> Markup {
    html! {
        table #jobs {
            tr {
                @if ticks { th { input type="checkbox" title="select every job on this page" onclick="for(const b of this.form.querySelectorAll('input[name=id]'))b.checked=this.checked"; } }
                th { "id" } th { "queue" } th { "kind" } th { "status" } th.num { "attempts" } th { "run at" } th { "last error" }
            }
            @for j in jobs {
                tr data-job=(j.id) {
                    @if ticks { td { input type="checkbox" name="id" value=(j.id); } }
                    td { a href=(format!("/jobs/{}", j.id)) { (j.id) } }
                    td { (j.queue) }
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
