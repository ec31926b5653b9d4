//! The dashboard's state and routes: [`router`] is the one place a route is added (the
//! Prometheus exporter's `/metrics`, for the token as a bearer token or a session, among them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::routing::{get, post};
use axum::Router;
use rowclaim::registry::RecordedSource;
use rowclaim::{Claimer, Db};

use super::actions::ActionLog;
use super::sampler::History;
use super::{actions, auth, pages};

/// Everything the handlers share.
pub struct Dashboard {
    pub db: Db,
    /// Where the database is, without a password ([`Db::endpoint`]): all a page ever says of it.
    pub endpoint: String,
    pub auth: auth::Auth,
    /// Actions are not offered, and every POST is refused.
    pub read_only: bool,
    pub actions: ActionLog,
    pub history: History,
    /// Claimers of recorded sources, made once per record (making one asks the catalog).
    claimers: Mutex<HashMap<String, (RecordedSource, Claimer)>>,
}

/// The state handlers get.
pub type State = Arc<Dashboard>;

impl Dashboard {
    pub fn new(db: Db, auth: auth::Auth, read_only: bool, history: History) -> Dashboard {
        Dashboard {
            endpoint: db.endpoint().to_owned(),
            db,
            auth,
            read_only,
            actions: ActionLog::default(),
            history,
            claimers: Mutex::default(),
        }
    }

    /// The recorded source of `table` and a claimer for it (which records nothing, and is
    /// never asked to claim), or `None` when the table has no record.
    pub async fn source(&self, table: &str) -> rowclaim::Result<Option<(RecordedSource, Claimer)>> {
        let records = self.db.recorded_sources().await?;
        let Some(record) = records.into_iter().find(|r| r.table == table) else {
            return Ok(None);
        };
        self.claimer_of(record).await.map(Some)
    }

    /// A claimer for `record`, made again when the record changed (`rowclaim source replace`).
    pub async fn claimer_of(
        &self,
        record: RecordedSource,
    ) -> rowclaim::Result<(RecordedSource, Claimer)> {
        let cached = self
            .claimers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&record.table)
            .filter(|(r, _)| *r == record)
            .cloned();
        if let Some(found) = cached {
            return Ok(found);
        }
        let claimer = self.db.claimer(record.source(), record.strategy).await?;
        self.claimers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(record.table.clone(), (record.clone(), claimer.clone()));
        Ok((record, claimer))
    }
}

/// The dashboard's routes, over `state`. Every route but the login page (and `/metrics`, which
/// asks for the metrics token or a session) asks for a session
/// (see `auth::require_session`); every POST also for the session's CSRF token, a matching
/// origin, and a dashboard that is not read-only. A route merged in here (`.merge(…)`) before
/// the session layer is applied gets the same protection; see `with_session`.
pub fn router(state: State, metrics: Arc<crate::prometheus::Endpoint>) -> Router {
    let pages = Router::new()
        .route("/", get(pages::overview))
        .route("/queues/{queue}", get(pages::queue))
        .route("/jobs/{id}", get(pages::job))
        .route("/sources/{table}", get(pages::source))
        .route("/sources/{table}/rows/{id}", get(pages::row))
        .route("/actions", get(pages::actions))
        .route("/jobs/{id}/{action}", post(actions::job))
        .route("/queues/{queue}/{action}", post(actions::queue))
        .route(
            "/sources/{table}/rows/{id}/release",
            post(actions::release_row),
        )
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
