//! `GET /actions`: what was done through the dashboard, newest first.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;

use crate::cmd::dashboard::layout::{layout, when};
use crate::cmd::dashboard::state::{State as St, Who};

/// `GET /actions`: the last actions taken here, newest first.
pub async fn actions(State(state): State<St>, Extension(who): Extension<Who>) -> Response {
    let actions = state.actions.newest_first().await;
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
                        td.problem[!a.outcome.starts_with("done")] { (a.outcome) }
                    }
                }
            }
        }
    };
    layout(&state, &who, "Actions", true, body).into_response()
}
