//! The changes the dashboard makes: retry, cancel or delete a job, pause or resume a queue, give
//! a held row back. Each arrives as a POST that passed the session, CSRF, origin and read-only
//! checks (`auth::require_session`); each is logged and kept in the
//! [`ActionLog`](super::action_log::ActionLog) for the actions page, whatever its outcome.

use std::time::SystemTime;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};

use super::action_log::Action;
use super::layout::path_segment;
use super::state::{State as St, Who};

/// `POST /jobs/{id}/{retry|cancel|delete}`.
pub async fn job(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path((id, action)): Path<(i64, String)>,
) -> Response {
    let queue = state.db.queue();
    let (what, result, not_in_state) = match action.as_str() {
        "retry" => (
            "retry job",
            queue.retry(id).await,
            "not dead or cancelled (only those can be retried)",
        ),
        "cancel" => (
            "cancel job",
            queue.cancel(id).await,
            "not ready or running (only those can be cancelled)",
        ),
        "delete" => (
            "delete job",
            queue.delete(id).await,
            "no such job, or it is running (cancel it first)",
        ),
        _ => return (StatusCode::NOT_FOUND, "no such action\n").into_response(),
    };
    let outcome = match &result {
        Ok(true) => "done".to_owned(),
        Ok(false) => not_in_state.to_owned(),
        Err(e) => format!("failed: {e}"),
    };
    state.actions.push(Action {
        at: SystemTime::now(),
        who: who.to_string(),
        what: what.to_owned(),
        target: format!("job {id}"),
        outcome,
    });
    let back = match (action.as_str(), &result) {
        ("delete", Ok(true)) => "/actions".to_owned(),
        _ => format!("/jobs/{id}"),
    };
    Redirect::to(&back).into_response()
}

/// `POST /queues/{queue}/{pause|resume}`.
pub async fn queue(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path((name, action)): Path<(String, String)>,
) -> Response {
    let queue = state.db.queue();
    let (what, result, unchanged) = match action.as_str() {
        "pause" => ("pause queue", queue.pause(&name).await, "paused already"),
        "resume" => ("resume queue", queue.resume(&name).await, "not paused"),
        _ => return (StatusCode::NOT_FOUND, "no such action\n").into_response(),
    };
    let outcome = match &result {
        Ok(true) => "done".to_owned(),
        Ok(false) => unchanged.to_owned(),
        Err(e) => format!("failed: {e}"),
    };
    state.actions.push(Action {
        at: SystemTime::now(),
        who: who.to_string(),
        what: what.to_owned(),
        target: format!("queue {}", shown(&name)),
        outcome,
    });
    Redirect::to(&format!("/queues/{}", path_segment(&name))).into_response()
}

/// The release form: the holder the row's page showed, so that a row another claim took since
/// is not given back in its place.
#[derive(serde::Deserialize)]
pub struct ReleaseForm {
    #[serde(default)]
    holder: String,
}

/// `POST /sources/{table}/rows/{id}/release`: gives a claimed row back, if the holder the page
/// showed still holds it.
pub async fn release_row(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    Path((table, id)): Path<(String, String)>,
    Form(form): Form<ReleaseForm>,
) -> Response {
    let holder = Some(form.holder.trim()).filter(|h| !h.is_empty());
    let outcome = match state.source(&table).await {
        Ok(Some((_, claimer))) => match claimer.parse_id(&id) {
            Ok(row) => match claimer.release_row(&row, holder).await {
                Ok(true) => "done".to_owned(),
                Ok(false) if holder.is_some() => {
                    "not held by that claim any more (nothing given back)".to_owned()
                }
                Ok(false) => "not claimed (nothing to give back)".to_owned(),
                Err(e) if e.kind() == rowclaim::ErrorKind::LockConflict => {
                    "locked by an open transaction (a transaction-strategy claimer): it comes \
                     back when that transaction ends"
                        .to_owned()
                }
                Err(e) => format!("failed: {e}"),
            },
            Err(e) => format!("failed: {e}"),
        },
        Ok(None) => "no such source".to_owned(),
        Err(e) => format!("failed: {e}"),
    };
    state.actions.push(Action {
        at: SystemTime::now(),
        who: who.to_string(),
        what: "release row".to_owned(),
        target: format!("{} row {}", shown(&table), shown(&id)),
        outcome,
    });
    Redirect::to(&format!(
        "/sources/{}/rows/{}",
        path_segment(&table),
        path_segment(&id)
    ))
    .into_response()
}

/// A name from the request's path as the log and the actions page show it: quoted, with control
/// characters escaped (no forged log lines), and cut short.
pub(super) fn shown(text: &str) -> String {
    const MOST: usize = 80;
    let mut quoted = format!("{text:?}");
    if let Some((cut, _)) = quoted.char_indices().nth(MOST) {
        quoted.truncate(cut);
        quoted.push('…');
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn path_names_are_escaped_and_cut() {
        assert_eq!(shown("jobs"), "\"jobs\"");
        assert_eq!(shown("a\nb\u{1b}[31m"), "\"a\\nb\\u{1b}[31m\"");
        assert!(shown(&"x".repeat(500)).chars().count() <= 81);
    }
}
