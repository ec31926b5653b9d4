//! Who may look and act: the start token, sessions, and the checks every POST passes.
//!
//! The token printed at start (or read from `--token-file`) is exchanged once, at
//! `/login?token=…`, for a session cookie (HttpOnly, SameSite=Strict, Secure behind a TLS
//! proxy). A session carries its own CSRF token, which every form posts back. Tokens are
//! compared in constant time, so that response times do not spell them out.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use rowclaim_bench::AUDIT;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::pages::layout_bare;
use super::server::State as St;

/// The session cookie's name.
const COOKIE: &str = "rowclaim_session";

/// Largest form a POST may send: the dashboard's forms hold a CSRF token and little else.
const FORM_LIMIT: usize = 16 * 1024;

/// A session unused this long is closed.
const IDLE: Duration = Duration::from_secs(12 * 3600);

/// Most sessions open at once; opening one more closes the least recently used.
const MOST_SESSIONS: usize = 256;

/// The start token and the sessions it opened.
pub struct Auth {
    token: String,
    /// What a scraper presents for `/metrics` (a bearer token): not the start token, so that a
    /// Prometheus configuration holds no credential that can log in and act.
    metrics_token: String,
    /// Session id → the session and when it was last used.
    sessions: Mutex<HashMap<String, (Session, Instant)>>,
    /// Behind a TLS proxy the cookie is marked Secure.
    secure_cookie: bool,
}

/// One browser's login.
#[derive(Clone, Debug)]
pub struct Session {
    /// A short name for the logs and the actions page; not the cookie, which is secret.
    pub name: String,
    /// What every form of this session posts back.
    pub csrf: String,
}

/// The session of the request, and where it came from: what the actions log says of who.
#[derive(Clone, Debug)]
pub struct Who {
    pub session: Session,
    pub peer: Option<SocketAddr>,
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.peer {
            Some(p) => write!(f, "session {} from {}", self.session.name, p.ip()),
            None => write!(f, "session {}", self.session.name),
        }
    }
}

impl Auth {
    pub fn new(token: String, metrics_token: String, secure_cookie: bool) -> Auth {
        Auth {
            token,
            metrics_token,
            sessions: Mutex::default(),
            secure_cookie,
        }
    }

    fn open_session(&self) -> Result<(String, Session), getrandom::Error> {
        let id = random_hex(32)?;
        let session = Session {
            name: random_hex(3)?,
            csrf: random_hex(32)?,
        };
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|_, (_, used)| used.elapsed() < IDLE);
        while sessions.len() >= MOST_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(old) => sessions.remove(&old),
                None => break,
            };
        }
        sessions.insert(id.clone(), (session.clone(), Instant::now()));
        Ok((id, session))
    }

    fn session(&self, headers: &HeaderMap) -> Option<(String, Session)> {
        let id = cookie(headers, COOKIE)?;
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        // The map is looked up by the cookie's value; a guessed id only ever misses.
        match sessions.get_mut(id) {
            Some((session, used)) if used.elapsed() < IDLE => {
                *used = Instant::now();
                Some((id.to_owned(), session.clone()))
            }
            Some(_) => {
                sessions.remove(id);
                None
            }
            None => None,
        }
    }

    fn close_session(&self, id: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }
}

/// `n` random bytes from the operating system, as hex.
pub fn random_hex(n: usize) -> Result<String, getrandom::Error> {
    let mut bytes = vec![0u8; n];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether two secrets are equal, taking as long whatever the first difference and whatever
/// their lengths: their digests are compared (a comparison of the texts themselves would end at
/// once on a length mismatch, telling the length of an operator's token).
pub fn same_secret(a: &str, b: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    a[..].ct_eq(&b[..]).into()
}

fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

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
    Query(q): Query<LoginQuery>,
) -> Response {
    match q.token.filter(|t| !t.is_empty()) {
        None => (StatusCode::OK, login_page(None)).into_response(),
        Some(given) => log_in(&state, peer, &given),
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
        Some(given) => log_in(&state, peer, &given),
    }
}

/// Opens a session for the right start token.
fn log_in(state: &St, peer: SocketAddr, given: &str) -> Response {
    if !same_secret(given.trim(), &state.auth.token) {
        tracing::warn!(target: AUDIT, peer = %peer.ip(), "dashboard: a login with a wrong token was refused");
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
    let secure = if state.auth.secure_cookie {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict{secure}");
    // 303: the browser follows with a GET, and a reload of the overview posts nothing again.
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// `POST /logout`: ends the session (behind the same checks as any POST).
pub async fn logout(State(state): State<St>, headers: HeaderMap) -> Response {
    if let Some((id, session)) = state.auth.session(&headers) {
        state.auth.close_session(&id);
        tracing::info!(target: AUDIT, session = %session.name, "dashboard: logged out");
    }
    let gone = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, gone)], Redirect::to("/login")).into_response()
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
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| same_secret(t.trim(), &state.auth.metrics_token));
    if req.method() != Method::GET {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    if bearer || state.auth.session(req.headers()).is_some() {
        return next.run(req).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "the dashboard's metrics token is required: Authorization: Bearer <metrics token>\n",
    )
        .into_response()
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

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "ab"));
        assert_eq!(random_hex(32).unwrap().len(), 64);
    }
}
