//! `GET /jobs/{id}`: one job as stored, its timeline and what may be done to it.

use std::time::SystemTime;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;

use crate::cmd::dashboard::layout::{action_button, layout, path_segment, trouble, when};
use crate::cmd::dashboard::state::{State as St, Who};

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
    // What it waits for and what waits for it (nothing to show before the queue's schema has
    // waits, or when they cannot be read: the job itself still shows).
    let links = state.db.queue().links(id).await.unwrap_or_default();
    let payload = serde_json::to_string_pretty(&job.payload).unwrap_or_default();
    let mut timeline: Vec<(SystemTime, String)> = vec![(job.created_at, "enqueued".to_owned())];
    timeline.push((
        job.run_at,
        match job.status.as_str() {
            "ready" => "due to run",
            "waiting" => "due once its wait is over",
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
    for a in state.actions.newest_first().await {
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
        @if !links.waits_for.is_empty() {
            h2 { "Waits for" }
            (linked("waits-for", &links.waits_for))
            @if links.run_anyway {
                p #run-anyway { "Runs anyway: also when one of these ends dead or cancelled." }
            }
        }
        @if !links.waited_by.is_empty() {
            h2 { "Waited for by" }
            (linked("waited-by", &links.waited_by))
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
        @if !job.errors.is_empty() {
            h2 { "Failed attempts" }
            table #attempts {
                tr { th { "attempt" } th { "started" } th { "failed" } th { "error" } }
                @for a in &job.errors {
                    tr {
                        td.num { (a.attempt.map(|n| n.to_string()).unwrap_or_default()) }
                        td { @if let Some(t) = a.started_at { (when(t)) } }
                        td { @if let Some(t) = a.ended_at { (when(t)) } }
                        td { pre { (a.error) } }
                    }
                }
            }
        }
        @if !state.read_only {
            h2 { "Actions" }
            p #actions {
                @if st == "dead" || st == "cancelled" {
                    (action_button(&who, &format!("/jobs/{id}/retry"), &[], "Retry", &format!("Retry job {id} (ready again, attempts reset)?"), false)) " "
                }
                @if st == "waiting" || st == "ready" || st == "running" {
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

/// Jobs linked to this one by a wait, each a link to its page with its status (a job that is
/// gone, deleted when it completed or pruned, has no page).
fn linked(id: &str, jobs: &[rowclaim::Link]) -> maud::Markup {
    html! {
        ul id=(id) {
            @for j in jobs {
                li {
                    @match &j.status {
                        Some(s) => {
                            a href=(format!("/jobs/{}", j.id)) { "job " (j.id) } " — "
                            span.problem[s == "dead" || s == "cancelled"] { (s) }
                        }
                        None => { "job " (j.id) " — " span.muted { "gone (deleted or pruned)" } }
                    }
                }
            }
        }
    }
}
