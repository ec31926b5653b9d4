//! The changes the dashboard makes: retry, cancel or delete a job, pause or resume a queue, give
//! a held row back. Each arrives as a POST that passed the session, CSRF, origin and read-only
//! checks (`auth::require_session`); each is logged and kept in the
//! [`ActionLog`](super::action_log::ActionLog) for the actions page, whatever its outcome.

use std::time::SystemTime;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};

use rowclaim::BulkAction;

use super::action_log::Action;
use super::layout::path_segment;
use super::search::JobSearch;
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
            "not waiting, ready or running (only those can be cancelled)",
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

/// Most selected jobs one POST acts on (a page shows at most 500).
const MOST_SELECTED: usize = 500;

/// `POST /jobs/bulk`: `action` (retry, cancel, delete) on the selected jobs (`id`, repeated), or,
/// with none selected, on every job the list's fields (queue, status, kind, q) match, in the
/// library's batches. Logged as one action; answered with the actions page, which says how
/// many changed.
pub async fn bulk(
    State(state): State<St>,
    Extension(who): Extension<Who>,
    body: axum::body::Bytes,
) -> Response {
    let fields: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let action = match field("action").as_deref() {
        Some("retry") => BulkAction::Retry,
        Some("cancel") => BulkAction::Cancel,
        Some("delete") => BulkAction::Delete,
        _ => return (StatusCode::BAD_REQUEST, "no such action\n").into_response(),
    };
    let selected: Vec<&str> = fields
        .iter()
        .filter(|(k, _)| k == "id")
        .map(|(_, v)| v.as_str())
        .collect();
    let (what, target, result) = if selected.is_empty() {
        let search = JobSearch {
            queue: field("queue"),
            status: field("status"),
            kind: field("kind"),
            q: field("q"),
            ..JobSearch::default()
        };
        let filter = search.filter();
        let result = if filter.narrows() {
            state.db.queue().bulk(action, &filter).await
        } else {
            // As the CLI asks for --all: a form without any condition is no way to ask for it.
            Err(rowclaim::Error::InvalidInput(
                "no condition: narrow the list first".into(),
            ))
        };
        // The values are quoted with their control characters escaped (`said`); cut short.
        let said: String = search.said().chars().take(200).collect();
        let target = format!("all jobs matching {said}");
        (format!("{} all matching", action.verb()), target, result)
    } else {
        let result = selected_jobs(&state, action, &selected).await;
        let mut target = format!("jobs {}", selected.join(", "));
        target = shown(&target).trim_matches('"').to_owned();
        (format!("{} selected", action.verb()), target, result)
    };
    let outcome = match &result {
        Ok(0) => "none changed (none in a state it takes)".to_owned(),
        Ok(n) => format!("done: {n} job(s) changed"),
        Err(e) => format!("failed: {e}"),
    };
    state.actions.push(Action {
        at: SystemTime::now(),
        who: who.to_string(),
        what,
        target,
        outcome,
    });
    Redirect::to("/actions").into_response()
}

/// `action` on each selected job (ids as the form sent them); how many changed.
async fn selected_jobs(state: &St, action: BulkAction, selected: &[&str]) -> rowclaim::Result<u64> {
    if selected.len() > MOST_SELECTED {
        return Err(rowclaim::Error::InvalidInput(format!(
            "{} jobs selected; at most {MOST_SELECTED} at once",
            selected.len()
        )));
    }
    let queue = state.db.queue();
    let mut changed = 0;
    for text in selected {
        let id: i64 = text.trim().parse().map_err(|_| {
            rowclaim::Error::InvalidInput(format!("job id {} is not a number", shown(text)))
        })?;
        let did = match action {
            BulkAction::Retry => queue.retry(id).await?,
            BulkAction::Cancel => queue.cancel(id).await?,
            _ => queue.delete(id).await?,
        };
        changed += u64::from(did);
    }
    Ok(changed)
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
