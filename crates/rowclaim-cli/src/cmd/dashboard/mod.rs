//! `rowclaim dashboard`: a web page of the managed queue and the recorded own tables, with the
//! few actions an operator needs (retry, cancel, delete a job, or every job a list matches;
//! give a held row back).
//!
//! From the top down (each file uses only those under it):
//! - `server.rs`: [`server::router`], where every route is added;
//! - `pages/`: the pages, one file for what each shows (every GET only reads);
//! - `actions.rs`: the POSTs that change something (`run_now.rs`: run a schedule now);
//! - `search.rs`: what a list of jobs is narrowed to, for the list and its bulk actions;
//! - `auth.rs`: logging in and out, and the checks every request passes;
//! - `sampler.rs`: the task that samples the history the charts draw;
//! - `layout.rs`: what every page has (its frame, the problem page, how values are written);
//! - `charts.rs`: inline SVG line charts;
//! - `state.rs`: what the handlers share (the [`state::Dashboard`]) and who asked;
//! - `sessions.rs`, `action_log.rs`, `history.rs`: the start token and the sessions, the log of
//!   the actions, the charts' history: parts of that shared state; `throttle.rs`: the wrong
//!   logins per address.

mod action_log;
mod actions;
mod auth;
mod charts;
mod history;
mod layout;
mod pages;
mod run_now;
mod sampler;
mod search;
mod server;
mod sessions;
mod state;
mod throttle;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rowclaim::{ConnectOptions, Db};

use crate::error::CliError;
use crate::secret::{random_hex, read_token_file, same_secret};

#[derive(Args, Debug)]
pub struct DashboardArgs {
    /// Address and port to serve on; port 0 picks a free one (the start line says which). Only
    /// a loopback address unless --behind-tls-proxy.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Read the login token from this file (its first line) instead of making a random one; the
    /// start line then names the address without it.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Read the token a scraper presents for /metrics (`Authorization: Bearer …`) from this file
    /// instead of making a random one. It opens /metrics only, never a session.
    #[arg(long, value_name = "PATH")]
    pub metrics_token_file: Option<PathBuf>,
    /// TLS is terminated by a proxy in front of the dashboard: allows a non-loopback --listen,
    /// and marks the session cookie Secure.
    #[arg(long)]
    pub behind_tls_proxy: bool,
    /// Only look: no action is offered, and every POST is refused (403).
    #[arg(long)]
    pub read_only: bool,
    /// How often the charts' history is sampled (one cheap query per queue table and source).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = super::values::duration, allow_hyphen_values = true)]
    pub sample_every: Duration,
}

pub async fn run(url: &str, a: DashboardArgs) -> Result<(), CliError> {
    if !a.listen.ip().is_loopback() && !a.behind_tls_proxy {
        return Err(CliError::BadInput(format!(
            "--listen {}: not a loopback address, and the dashboard speaks plain HTTP; serve it \
             on 127.0.0.1 (or ::1), or give --behind-tls-proxy when a proxy in front of it \
             terminates TLS",
            a.listen
        )));
    }
    let token = token_from(a.token_file.as_deref(), "--token-file")?;
    let metrics_token = token_from(a.metrics_token_file.as_deref(), "--metrics-token-file")?;
    if same_secret(&token, &metrics_token) {
        return Err(CliError::BadInput(
            "--metrics-token-file: the metrics token must differ from the login token (it \
             would open a session)"
                .into(),
        ));
    }
    // A port in use is the user's to change, as for `work --metrics`: exit 2, flag and port named.
    let listener = tokio::net::TcpListener::bind(a.listen).await.map_err(|e| {
        CliError::BadInput(format!("--listen {}: cannot listen there: {e}", a.listen))
    })?;
    let at = listener
        .local_addr()
        .map_err(CliError::io("listening on --listen"))?;
    let db = Db::connect_with(url, ConnectOptions::default().max_connections(4)).await?;
    let state = Arc::new(state::Dashboard::new(
        db.clone(),
        sessions::Auth::new(token.clone(), metrics_token.clone(), a.behind_tls_proxy, at),
        a.read_only,
        history::History::load(&db).await,
    ));
    tokio::spawn(sampler::run(state.clone(), a.sample_every));
    let metrics = crate::prometheus::Endpoint::new(
        &state.db,
        crate::prometheus::Watched {
            queue: Some(state.db.queue()),
            sources: recorded_sources(state.clone()),
        },
    )?;
    let app = server::router(state, metrics);
    // The start lines, on stdout for the operator (and tests) to open. A token the operator
    // chose (a file) is theirs to know already: it is never printed, so that stdout kept in a
    // journal holds no lasting credential.
    let login = match &a.token_file {
        None => {
            let query: String = form_urlencoded::byte_serialize(token.as_bytes()).collect();
            format!("dashboard at http://{at}/login?token={query}")
        }
        Some(path) => format!(
            "dashboard at http://{at}/login (the token is in {})",
            path.display()
        ),
    };
    let metrics_line = match &a.metrics_token_file {
        None => format!("metrics at http://{at}/metrics (Authorization: Bearer {metrics_token})"),
        Some(path) => format!(
            "metrics at http://{at}/metrics (Authorization: Bearer, the token in {})",
            path.display()
        ),
    };
    // Whoever reads stdout may have gone (a closed pipe): the dashboard serves on regardless.
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{login}\n{metrics_line}").and_then(|()| out.flush());
    }
    crate::say::say!(
        "serving the dashboard on {at}{}; Ctrl-C stops it",
        if a.read_only { " (read-only)" } else { "" }
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(CliError::io("serving the dashboard"))
}

/// Every recorded own table, for `/metrics`, by the dashboard's cached claimers.
fn recorded_sources(state: state::State) -> crate::prometheus::SourceList {
    Box::new(move || {
        let state = state.clone();
        Box::pin(async move {
            let mut claimers = Vec::new();
            let records = match state.db.recorded_sources().await {
                Ok(records) => records,
                Err(e) => {
                    tracing::warn!("metrics: listing the recorded tables: {e}");
                    return claimers;
                }
            };
            for record in records {
                if let Ok((_, claimer)) = state.claimer_of(record).await {
                    claimers.push(claimer);
                }
            }
            claimers
        })
    })
}

/// The token in `path` (`flag`'s file, see [`read_token_file`]), or a random one without a file.
fn token_from(path: Option<&std::path::Path>, flag: &str) -> Result<String, CliError> {
    match path {
        Some(path) => read_token_file(path, flag),
        None => random_hex(32).map_err(|e| CliError::Io {
            what: "making a token from the operating system's random numbers",
            source: std::io::Error::other(e.to_string()),
        }),
    }
}
