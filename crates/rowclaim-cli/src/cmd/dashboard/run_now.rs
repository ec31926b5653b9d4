//! `POST /schedules/{name}/run`: runs a schedule once now, as its tick would (a copy of its latest
//! tick's job, to run now; see [`rowclaim::Queue::run_schedule_now`]). Like every POST it passed
//! the session, CSRF, origin and read-only checks; it is logged and kept in the actions' log,
//! whatever its outcome.

use std::time::SystemTime;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;

use super::action_log::Action;
use super::actions::shown;
use super::state::{State as St, Who};

/// `POST /schedules/{name}/run`: enqueues the schedule's job now; back to the new job's page,
/// or to the actions page when nothing was enqueued (it says why).
pub async fn run_now(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path(name): Path<String>,
) -> Response {
    let result = state.db.queue().run_schedule_now(&name).await;
    let outcome = match &result {
        Ok(Some(id)) => format!("done: job {id}"),
        Ok(None) => "no such schedule".to_owned(),
        Err(e) => format!("failed: {e}"),
    };
    state.actions.push(Action {
        at: SystemTime::now(),
        who: who.to_string(),
        what: "run schedule now".to_owned(),
        target: format!("schedule {}", shown(&name)),
        outcome,
    });
    let back = match result {
        Ok(Some(id)) => format!("/jobs/{id}"),
        _ => "/actions".to_owned(),
    };
    Redirect::to(&back).into_response()
}
