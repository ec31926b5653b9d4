//! Who may look and act: logging in and out, and the checks every request passes (a session;
//! for a POST also its CSRF token, this dashboard's origin, and a dashboard that is not
//! read-only). The start token and the sessions themselves are `sessions.rs`'s.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use rowclaim_bench::AUDIT;
use serde::Deserialize;

use super::layout::layout_bare;
use super::state::{State as St, Who};
use crate::secret::{bearer_of, bearer_refused, same_secret};

/// Largest form a POST may send: the dashboard's forms hold a CSRF token and little else.
const FORM_LIMIT: usize = 16 * 1024;

#[derive(Deserialize)]
pub struct LoginQuery {
    token: Option<String>,
}

/// `GET /login?token=…`, the address printed at start: a right token opens a session and goes
/// to the overview (out of the address bar, so the token is not kept in history as the page's
/// address); without one, the login form; a wrong one, the form again with 401.
pub async fn login_link(
    State(state): State<St>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Query(q): Query<LoginQuery>,
) -> Response {
    match q.token.filter(|t| !t.is_empty()) {
        None => (StatusCode::OK, login_page(None)).into_response(),
        Some(given) => log_in(&state, peer, &headers, &given),
    }
}

/// `POST /login` from the login form: the token in the body, so that a pasted token never
/// stands in an address (a proxy's access log, the browser's history). Only from this
/// dashboard's own page (Origin or Referer), so another site cannot log a browser in.
pub async fn login_form(
    State(state): State<St>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !same_origin(&headers) {
        tracing::warn!(target: AUDIT, peer = %peer.ip(), "dashboard: refused a login form from another site");
        return (
            StatusCode::FORBIDDEN,
            "refused: it came from another site\n",
        )
            .into_response();
    }
    match form_field(&body, "token").filter(|t| !t.is_empty()) {
        None => (StatusCode::OK, login_page(None)).into_response(),
        Some(given) => log_in(&state, peer, &headers, &given),
    }
}

/// Opens a session for the right start token; an address that sent too many wrong ones waits
/// (429) before its token is even looked at.
fn log_in(state: &St, peer: SocketAddr, headers: &HeaderMap, given: &str) -> Response {
    let client = state.auth.throttle.client(peer, headers);
    if let Some(wait) = state.auth.throttle.wait(client) {
        let secs = wait.as_secs().max(1);
        let page = login_page(Some(&format!(
            "Too many wrong tokens from this address: try again in {secs} s."
        )));
        let retry = [(header::RETRY_AFTER, secs.to_string())];
        return (StatusCode::TOO_MANY_REQUESTS, retry, page).into_response();
    }
    if !state.auth.is_token(given.trim()) {
        tracing::warn!(target: AUDIT, peer = %client, "dashboard: a login with a wrong token was refused");
        if state.auth.throttle.wrong(client) {
            tracing::warn!(
                target: AUDIT,
                peer = %client,
                "dashboard: {} wrong tokens from this address: its logins wait {} s",
                super::throttle::FREE_TRIES,
                super::throttle::WINDOW.as_secs()
            );
        }
        return (
            StatusCode::UNAUTHORIZED,
            login_page(Some("That token is not this dashboard's.")),
        )
            .into_response();
    }
    let (id, session) = match state.auth.open_session() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("dashboard: no random bytes for a session: {e}");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    tracing::info!(target: AUDIT, session = %session.name, peer = %peer.ip(), "dashboard: logged in");
    let cookie = state.auth.session_cookie(&id);
    // 303: the browser follows with a GET, and a reload of the overview posts nothing again.
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// `POST /logout`: ends the session (behind the same checks as any POST).
pub async fn logout(State(state): State<St>, headers: HeaderMap) -> Response {
    if let Some((id, session)) = state.auth.session(&headers) {
        state.auth.close_session(&id);
        tracing::info!(target: AUDIT, session = %session.name, "dashboard: logged out");
    }
    (
        [(header::SET_COOKIE, state.auth.ended_cookie())],
        Redirect::to("/login"),
    )
        .into_response()
}

fn login_page(problem: Option<&str>) -> maud::Markup {
    layout_bare(
        "Log in",
        html! {
            h1 { "rowclaim dashboard" }
            @if let Some(p) = problem { p.problem { (p) } }
            p { "Open the address " code { "rowclaim dashboard" } " printed when it started, or paste its token:" }
            form method="post" action="/login" {
                input type="password" name="token" autocomplete="off" placeholder="token" autofocus;
                " "
                button type="submit" { "Log in" }
            }
        },
    )
}

/// Lets through only requests of a session; a POST also only with the session's CSRF token,
/// from this dashboard's own pages (Origin or Referer naming this host, when sent), and not in
/// read-only mode. The session is handed on to the handler as [`Who`].
pub async fn require_session(State(state): State<St>, req: Request, next: Next) -> Response {
    let Some((_, session)) = state.auth.session(req.headers()) else {
        return (StatusCode::UNAUTHORIZED, login_page(Some("Log in first."))).into_response();
    };
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let who = Who { session, peer };
    let mut req = if req.method() == Method::POST {
        match checked_post(&state, &who, req).await {
            Ok(req) => req,
            Err(refusal) => return refusal,
        }
    } else {
        req
    };
    req.extensions_mut().insert(who);
    next.run(req).await
}

/// For `/metrics`, which a scraper reads without a browser: the metrics token as a bearer token
/// (Prometheus' `authorization` in a scrape config), or a session. Never a POST.
pub async fn require_bearer_or_session(
    State(state): State<St>,
    req: Request,
    next: Next,
) -> Response {
    let bearer = bearer_of(req.headers()).is_some_and(|t| state.auth.is_metrics_token(t));
    if req.method() != Method::GET {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    if bearer || state.auth.session(req.headers()).is_some() {
        return next.run(req).await;
    }
    bearer_refused(
        "the dashboard's metrics token is required: Authorization: Bearer <metrics token>\n",
    )
}

/// The POST checks; the request comes back with its body read (to find the CSRF token) and put
/// back for the handler.
async fn checked_post(state: &St, who: &Who, req: Request) -> Result<Request, Response> {
    let refuse = |why: &str| {
        tracing::warn!(target: AUDIT, who = %who, path = %req.uri().path(), "dashboard: refused a POST: {why}");
        (StatusCode::FORBIDDEN, format!("refused: {why}\n")).into_response()
    };
    // Logging out changes no data: read-only dashboards allow it.
    if state.read_only && req.uri().path() != "/logout" {
        return Err(refuse("the dashboard is read-only (--read-only)"));
    }
    if !same_origin(req.headers()) {
        return Err(refuse("it came from another site (Origin or Referer)"));
    }
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, FORM_LIMIT)
        .await
        .map_err(|_| (StatusCode::PAYLOAD_TOO_LARGE, "form too large\n").into_response())?;
    let sent = form_field(&bytes, "csrf");
    let req = Request::from_parts(parts, Body::from(bytes));
    match sent {
        Some(t) if same_secret(&t, &who.session.csrf) => Ok(req),
        _ => {
            let why = "no or a wrong CSRF token";
            tracing::warn!(target: AUDIT, who = %who, path = %req.uri().path(), "dashboard: refused a POST: {why}");
            Err((StatusCode::FORBIDDEN, format!("refused: {why}\n")).into_response())
        }
    }
}

/// One field of an urlencoded form.
pub fn form_field(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// Whether the Origin (or, without one, the Referer) names the host the request was sent to.
/// A browser sends at least one of them with a form's POST, so a POST with neither is refused
/// too (the CSRF token would still stop it; this is the second lock).
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |h| headers.get(h).and_then(|v| v.to_str().ok());
    let Some(host) = text(header::HOST) else {
        return false;
    };
    let from = text(header::ORIGIN).or_else(|| text(header::REFERER));
    match from {
        None => false,
        Some(url) => authority(url).is_some_and(|a| a.eq_ignore_ascii_case(host)),
    }
}

/// `host[:port]` of an absolute URL.
fn authority(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    Some(rest.split(['/', '?', '#']).next().unwrap_or(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_must_name_this_host() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        assert!(!same_origin(&h), "neither header: refused too");
        h.insert(header::ORIGIN, "http://127.0.0.1:8080".parse().unwrap());
        assert!(same_origin(&h));
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(!same_origin(&h));
        h.remove(header::ORIGIN);
        h.insert(
            header::REFERER,
            "http://127.0.0.1:8080/jobs/3".parse().unwrap(),
        );
        assert!(same_origin(&h));
        h.insert(
            header::REFERER,
            "http://127.0.0.1:9999/jobs/3".parse().unwrap(),
        );
        assert!(!same_origin(&h));
    }
}
