//! The dashboard's routes: [`router`] is the one place a route is added (the Prometheus
//! exporter's `/metrics`, for the token as a bearer token or a session, among them).

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

use super::state::State;
use super::{actions, auth, pages, run_now};

/// The dashboard's routes, over `state`. Every route but the login page (and `/metrics`, which
/// asks for the metrics token or a session) asks for a session
/// (see `auth::require_session`); every POST also for the session's CSRF token, a matching
/// origin, and a dashboard that is not read-only. A route merged in here (`.merge(…)`) before
/// the session layer is applied gets the same protection; see `with_session`.
pub fn router(state: State, metrics: Arc<crate::prometheus::Endpoint>) -> Router {
    let pages = Router::new()
        .route("/", get(pages::overview::overview))
        .route("/queues/{queue}", get(pages::queues::queue))
        .route("/jobs", get(pages::job_list::jobs))
        .route("/jobs/bulk", post(actions::bulk))
        .route("/jobs/{id}", get(pages::jobs::job))
        .route("/sources/{table}", get(pages::sources::source))
        .route("/sources/{table}/rows/{id}", get(pages::sources::row))
        .route("/actions", get(pages::actions::actions))
        .route("/workers", get(pages::workers::workers))
        .route("/jobs/{id}/{action}", post(actions::job))
        .route("/queues/{queue}/{action}", post(actions::queue))
        .route(
            "/sources/{table}/rows/{id}/release",
            post(actions::release_row),
        )
        .route("/schedules/{name}/run", post(run_now::run_now))
        .route("/logout", post(auth::logout));
    // Prometheus text for a scraper: the metrics token as a bearer token, or a session.
    let metrics = crate::prometheus::router(metrics).layer(axum::middleware::from_fn_with_state(
        state.clone(),
        auth::require_bearer_or_session,
    ));
    with_session(pages, state.clone())
        .route("/login", get(auth::login_link).post(auth::login_form))
        .with_state(state)
        .merge(metrics)
        .layer(axum::middleware::map_response(guard_headers))
}

/// Headers on every answer: no framing (another local port is the same site for cookies and
/// could frame the page), no content sniffing, and no Referer to other sites (the login
/// address holds the token).
async fn guard_headers(mut res: axum::response::Response) -> axum::response::Response {
    use axum::http::{header, HeaderValue};
    let h = res.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

/// `routes` behind the session check (and, for POSTs, the CSRF, origin and read-only checks).
pub fn with_session(routes: Router<State>, state: State) -> Router<State> {
    routes.layer(axum::middleware::from_fn_with_state(
        state,
        auth::require_session,
    ))
}
