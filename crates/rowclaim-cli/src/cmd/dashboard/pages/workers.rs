//! `GET /workers`: the workers the registry lists (running, stopped and gone), and the holders'
//! table of the queue page, which names each worker holding jobs by its process (host, pid,
//! worker id) instead of by claim token: a worker's claims' tokens end in its id
//! ([`rowclaim::WorkerEntry::holds`]), so one process with several claims is one holder.

use std::time::SystemTime;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::{html, Markup};
use rowclaim::{JobRecord, WorkerEntry, WorkerState};

use crate::cmd::dashboard::layout::{expired, layout, when};
use crate::cmd::dashboard::state::{Dashboard, State as St, Who};
use crate::cmd::workers::work_of;

/// `GET /workers`: every listed worker, gone ones first.
pub async fn workers(State(state): State<St>, Extension(who): Extension<Who>) -> Response {
    let (mut list, problem) = match state.db.workers().await {
        Ok(list) => (list, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    list.sort_by_key(|w| (order(w.state), std::cmp::Reverse(w.started_at)));
    let count = |s: WorkerState| list.iter().filter(|w| w.state == s).count();
    let body = html! {
        @if let Some(p) = problem { p.problem { (p) } }
        p {
            (count(WorkerState::Active)) " active, "
            (count(WorkerState::Gone)) " gone, "
            (count(WorkerState::Stopped)) " stopped "
            span.muted { "(a worker is gone when it has not heartbeated for its lease; stopped and gone workers are listed for a day)" }
        }
        @if list.is_empty() { p.muted { "No worker has registered." } } @else {
            table #workers {
                tr {
                    th { "state" } th { "host" } th.num { "pid" } th { "works on" }
                    th.num { "running" } th { "last heartbeat" } th { "started" } th { "version" } th { "worker id" }
                }
                @for w in &list {
                    tr data-pid=(w.pid) data-state=(w.state.as_str()) {
                        td.problem[w.state == WorkerState::Gone] { (w.state.as_str()) }
                        td { (w.host) }
                        td.num { (w.pid) }
                        td { (work_of(w)) }
                        td.num { (w.running) "/" (w.concurrency) }
                        td { (when(w.heartbeat_at)) }
                        td { (when(w.started_at)) }
                        td { (w.version) }
                        td { code { (w.id) } }
                    }
                }
            }
        }
    };
    layout(&state, &who, "Workers", true, body).into_response()
}

/// Gone workers first (they need a look), then active, then stopped.
fn order(s: WorkerState) -> u8 {
    match s {
        WorkerState::Gone => 0,
        WorkerState::Active => 1,
        _ => 2,
    }
}

/// The holders of running jobs: one per worker process (its claims' tokens told apart by the
/// worker id they end in), or per token where no listed worker claims it.
pub struct Holder {
    pub worker: Option<WorkerEntry>,
    /// The token, for a holder no listed worker claims.
    pub token: String,
    pub jobs: u64,
    pub claims: usize,
    pub first_lease: Option<SystemTime>,
}

/// The holders of `running`, by process.
pub async fn holders(state: &Dashboard, running: &[JobRecord]) -> Vec<Holder> {
    // Without the registry (none yet, no privilege), holders are shown by token as before.
    let workers = state.db.workers().await.unwrap_or_default();
    let mut out: Vec<Holder> = Vec::new();
    let mut tokens: Vec<(usize, String)> = Vec::new();
    for job in running {
        let token = job.owner.clone().unwrap_or_else(|| "(no owner)".into());
        let worker = workers.iter().find(|w| w.holds(&token));
        let at = out.iter().position(|h| match (&h.worker, worker) {
            (Some(a), Some(b)) => a.id == b.id,
            (None, None) => h.token == token,
            _ => false,
        });
        let i = at.unwrap_or_else(|| {
            out.push(Holder {
                worker: worker.cloned(),
                token: token.clone(),
                jobs: 0,
                claims: 0,
                first_lease: None,
            });
            out.len() - 1
        });
        if !tokens.iter().any(|(j, t)| *j == i && *t == token) {
            tokens.push((i, token));
            out[i].claims += 1;
        }
        let h = &mut out[i];
        h.jobs += 1;
        h.first_lease = match (h.first_lease, job.lease_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    out
}

/// The holders as the queue page's table.
pub fn holders_table(holders: &[Holder]) -> Markup {
    html! {
        @if holders.is_empty() { p.muted { "None." } } @else {
            table #holders {
                tr { th { "worker (host, pid)" } th { "state" } th.num { "jobs" } th.num { "claims" } th { "first lease end" } }
                @for h in holders {
                    tr {
                        @match &h.worker {
                            Some(w) => {
                                td { a href="/workers" { (w.host) " pid " (w.pid) } br; code.muted { (w.id) } }
                                td.problem[w.state == WorkerState::Gone] { (w.state.as_str()) }
                            }
                            None => {
                                td { "claim " code { (h.token) } br; span.muted { "no registered worker" } }
                                td { "" }
                            }
                        }
                        td.num { (h.jobs) }
                        td.num { (h.claims) }
                        td.problem[expired(h.first_lease)] { (h.first_lease.map(when).unwrap_or_default()) }
                    }
                }
            }
        }
    }
}

/// The worker a claim's token names, as a holders' table shows it: host and pid, or a note
/// that no registered worker claims it (another program's claim, or the CLI's `claim`).
pub fn worker_of(workers: &[WorkerEntry], token: &str) -> Markup {
    match workers.iter().find(|w| w.holds(token)) {
        Some(w) => html! {
            a href="/workers" { (w.host) " pid " (w.pid) }
            @if w.state != WorkerState::Active { " " span.problem { (w.state.as_str()) } }
        },
        None => html! { span.muted { "no registered worker" } },
    }
}
