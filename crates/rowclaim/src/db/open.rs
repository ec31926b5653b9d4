//! Opening a pool: its first connection, the reason a server cannot be reached, and the one
//! URL parameter rowclaim reads itself (`connect_timeout`).
#![cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]

use std::time::Duration;

use sqlx::pool::{Pool, PoolOptions};

use super::redact;
use crate::error::{DatabaseError, Error, Result};

/// The URL without its `connect_timeout` parameter (which the drivers ignore), and its value:
/// whole seconds as libpq reads them, 0 for no limit (the pool's acquire timeout still is one).
pub(super) fn take_connect_timeout(url: &str) -> Result<(String, Option<Duration>)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut timeout = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("connect_timeout", value)) => {
                let secs: u64 = value.parse().map_err(|_| {
                    Error::InvalidInput(format!(
                        "database URL {}: connect_timeout={value} is not a whole number of seconds",
                        redact(url)
                    ))
                })?;
                // No limit: a century.
                timeout = Some(Duration::from_secs(if secs == 0 {
                    3_155_760_000
                } else {
                    secs
                }));
            }
            _ => kept.push(pair),
        }
    }
    if kept.is_empty() {
        return Ok((base.to_owned(), timeout));
    }
    Ok((format!("{base}?{}", kept.join("&")), timeout))
}

/// How long the pool's first connection may take before rowclaim knocks on the server's port
/// to see whether anything listens there: the pool quietly retries a refused connection until
/// its timeout.
const KNOCK_AFTER: Duration = Duration::from_millis(200);

/// How long the pool's first connection may take, when something does listen, before a session
/// of rowclaim's own looks for the reason: the pool also retries a server that says it is
/// starting up or has too many clients. Long enough that a server merely slow to answer (a
/// loaded machine) is not sent a second session; at most half the wait, so that the reason is
/// heard within a short `connect_timeout` too.
const PROBE_AFTER: Duration = Duration::from_secs(2);

/// Where a server takes connections, for a knock that opens no session: a TCP port or a Unix
/// socket.
pub(super) enum ServerAddress {
    Tcp(String, u16),
    #[cfg_attr(not(unix), allow(dead_code))]
    Socket(std::path::PathBuf),
}

impl ServerAddress {
    /// Connects and closes at once, sending nothing, so the server starts no session: only
    /// whether the operating system refuses the connection. (MySQL/MariaDB count such a
    /// connection as aborted, towards `max_connect_errors` of a remote host; the session that
    /// follows clears that count.)
    async fn knock(&self) -> std::io::Result<()> {
        match self {
            ServerAddress::Tcp(host, port) => {
                // An IPv6 literal as URLs write it, `[::1]`.
                let host = host.trim_start_matches('[').trim_end_matches(']');
                tokio::net::TcpStream::connect((host, *port)).await?;
            }
            #[cfg(unix)]
            ServerAddress::Socket(path) => {
                tokio::net::UnixStream::connect(path).await?;
            }
            #[cfg(not(unix))]
            ServerAddress::Socket(_) => {}
        }
        Ok(())
    }
}

/// Opens the pool with its first connection in it, the one a one-shot command then runs on (a
/// second connection would cost another TCP, TLS and session start). An unreachable server is
/// reported with what was dialled and what the operating system said: a refused connection
/// after [`KNOCK_AFTER`] (a knock at `address` finds it), a server that refuses sessions after
/// [`PROBE_AFTER`] or half of `wait` (a session of our own hears why), a server that never
/// answers after `wait`.
pub(super) async fn open_pool<DB: sqlx::Database>(
    pool_options: PoolOptions<DB>,
    options: ConnectionOptions<DB>,
    endpoint: &str,
    address: ServerAddress,
    wait: Duration,
    sort: fn(sqlx::Error) -> DatabaseError,
) -> Result<Pool<DB>> {
    let wait = wait.min(pool_options.get_acquire_timeout());
    let start = tokio::time::Instant::now();
    let deadline = start + wait;
    let opened = tokio::time::timeout_at(deadline, pool_options.connect_with(options.clone()));
    tokio::pin!(opened);
    let settle = |opened: std::result::Result<sqlx::Result<Pool<DB>>, _>| match opened {
        Ok(Ok(pool)) => Ok(pool),
        Ok(Err(sqlx::Error::PoolTimedOut)) | Err(_) => Err(no_answer(endpoint, wait, sort)),
        Ok(Err(e)) => Err(connect_failed(endpoint, sort(e))),
    };
    tokio::select! {
        opened = &mut opened => return settle(opened),
        () = tokio::time::sleep_until(start + KNOCK_AFTER) => {}
    }
    tokio::select! {
        opened = &mut opened => return settle(opened),
        knocked = tokio::time::timeout_at(deadline, address.knock()) => match knocked {
            Err(_) => return Err(no_answer(endpoint, wait, sort)),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(connect_failed(endpoint, sort(sqlx::Error::Io(e))));
            }
            // Something listens, or the knock failed in a way the pool does not retry (and so
            // reports itself).
            Ok(_) => {}
        }
    }
    tokio::select! {
        opened = &mut opened => return settle(opened),
        () = tokio::time::sleep_until(start + PROBE_AFTER.min(wait / 2)) => {}
    }
    tokio::select! {
        opened = &mut opened => settle(opened),
        looked = tokio::time::timeout_at(deadline, probe(&options, endpoint, sort)) => {
            looked.map_err(|_| no_answer(endpoint, wait, sort))??;
            settle(opened.await)
        }
    }
}

type ConnectionOptions<DB> = <<DB as sqlx::Database>::Connection as sqlx::Connection>::Options;

/// Opens one connection straight away, not through a pool (which would keep retrying a refused
/// connection until its timeout), and closes it: the reason an unreachable server is unreachable.
async fn probe<O>(options: &O, endpoint: &str, sort: fn(sqlx::Error) -> DatabaseError) -> Result<()>
where
    O: sqlx::ConnectOptions,
    O::Connection: Sized,
{
    match options.connect().await {
        Ok(conn) => {
            // Only a look; a failed goodbye changes nothing.
            let _ = sqlx::Connection::close(conn).await;
            Ok(())
        }
        Err(e) => Err(connect_failed(endpoint, sort(e))),
    }
}

fn connect_failed(endpoint: &str, source: DatabaseError) -> Error {
    Error::Connect {
        endpoint: endpoint.to_owned(),
        source,
    }
}

/// The server took the connection (or did not refuse it) and said nothing within `wait`.
fn no_answer(endpoint: &str, wait: Duration, sort: fn(sqlx::Error) -> DatabaseError) -> Error {
    let timed_out = std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer within {}", humantime::format_duration(wait)),
    );
    connect_failed(endpoint, sort(sqlx::Error::Io(timed_out)))
}
