//! The start token and the sessions it opened.
//!
//! The token printed at start (or read from `--token-file`) is exchanged once, at
//! `/login?token=…`, for a session cookie (HttpOnly, SameSite=Strict, Secure behind a TLS
//! proxy). A session carries its own CSRF token, which every form posts back. Tokens are
//! compared in constant time (`crate::secret`), so that response times do not spell them out.
//! The routes that log in and out, and the checks every request passes, are `auth.rs`'s.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap};

use super::throttle::Throttle;
use crate::secret::{random_hex, same_secret};

/// The session cookie's name for a dashboard listening on `at`: its own, since a browser keeps
/// cookies per host, not per port, and two dashboards on one host must not overwrite (and so
/// log out) each other's sessions. The port says which it is; a hash of the whole address
/// tells apart two on one port of different addresses.
pub fn cookie_name(at: SocketAddr) -> String {
    let hash = at.to_string().bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("rowclaim_session_{}_{:08x}", at.port(), hash)
}

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
    /// The session cookie's name ([`cookie_name`]).
    cookie: String,
    /// Wrong logins per address.
    pub throttle: Throttle,
}

/// One browser's login.
#[derive(Clone, Debug)]
pub struct Session {
    /// A short name for the logs and the actions page; not the cookie, which is secret.
    pub name: String,
    /// What every form of this session posts back.
    pub csrf: String,
}

impl Auth {
    /// The sessions of a dashboard listening on `at` (which names its cookie).
    pub fn new(token: String, metrics_token: String, secure_cookie: bool, at: SocketAddr) -> Auth {
        Auth {
            token,
            metrics_token,
            sessions: Mutex::default(),
            secure_cookie,
            cookie: cookie_name(at),
            throttle: Throttle::new(secure_cookie),
        }
    }

    /// Whether `given` is the start token (in constant time).
    pub fn is_token(&self, given: &str) -> bool {
        same_secret(given, &self.token)
    }

    /// Whether `given` is the metrics token (in constant time).
    pub fn is_metrics_token(&self, given: &str) -> bool {
        same_secret(given, &self.metrics_token)
    }

    /// A new session, and its id (the cookie's value).
    pub fn open_session(&self) -> Result<(String, Session), getrandom::Error> {
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

    /// The open session whose cookie the request carries, and its id.
    pub fn session(&self, headers: &HeaderMap) -> Option<(String, Session)> {
        let id = cookie(headers, &self.cookie)?;
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

    pub fn close_session(&self, id: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// The `Set-Cookie` value that hands the browser session `id`.
    pub fn session_cookie(&self, id: &str) -> String {
        let secure = if self.secure_cookie { "; Secure" } else { "" };
        format!(
            "{}={id}; Path=/; HttpOnly; SameSite=Strict{secure}",
            self.cookie
        )
    }

    /// The `Set-Cookie` value that makes the browser forget its session.
    pub fn ended_cookie(&self) -> String {
        format!(
            "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
            self.cookie
        )
    }
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
