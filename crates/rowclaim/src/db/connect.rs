//! How [`Db::connect`](super::Db::connect) reaches each database: its URL read into the
//! driver's options, the pool opened (`open.rs`: the first connection kept, and why a server
//! cannot be reached), and the endpoint messages name it by (never with a password). A database
//! whose driver the build left out is an error naming its cargo feature.

#[cfg(any(feature = "mysql", feature = "sqlite"))]
use std::str::FromStr;

#[cfg(feature = "mysql")]
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
#[cfg(feature = "sqlite")]
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::open::{self, open_pool};
use super::{redact, ConnectOptions};
#[cfg(feature = "mysql")]
use crate::backend::mysql::{self, My};
#[cfg(feature = "postgres")]
use crate::backend::postgres::{self, Pg};
#[cfg(feature = "sqlite")]
use crate::backend::sqlite::{self, Lite};
use crate::backend::Backend;
use crate::error::{Error, Result};

/// A connection's error as PostgreSQL's driver sorts it, where a server that does not speak
/// PostgreSQL's protocol (another database's port) is said to be none.
#[cfg(feature = "postgres")]
fn pg_connect_sorted(e: sqlx::Error) -> crate::error::DatabaseError {
    match e {
        sqlx::Error::Protocol(why) => {
            // sqlx ends it with where in its source it was raised: "(sqlx_postgres::…:95)".
            let why = why.rfind(" (sqlx_").map_or(why.as_str(), |at| &why[..at]);
            postgres::sorted(sqlx::Error::Protocol(format!(
                "not a PostgreSQL server: it does not answer as one ({why}); is this port \
                 another database's, e.g. MySQL/MariaDB's?"
            )))
        }
        e => postgres::sorted(e),
    }
}

#[cfg(feature = "postgres")]
pub(super) fn pg_endpoint(o: &PgConnectOptions) -> String {
    // The socket file, as libpq names it: a directory alone does not say which server.
    match pg_address(o) {
        open::ServerAddress::Socket(file) => format!("PostgreSQL on socket {}", file.display()),
        open::ServerAddress::Tcp(host, port) => format!("PostgreSQL at {host}:{port}"),
    }
}

/// Where the server takes connections, for a knock: libpq's socket file in the socket
/// directory.
#[cfg(feature = "postgres")]
fn pg_address(o: &PgConnectOptions) -> open::ServerAddress {
    let file = format!(".s.PGSQL.{}", o.get_port());
    match o.get_socket() {
        Some(dir) => open::ServerAddress::Socket(dir.join(file)),
        // A host that is a path names the socket directory too (as in libpq).
        None if o.get_host().starts_with('/') => {
            open::ServerAddress::Socket(std::path::Path::new(o.get_host()).join(file))
        }
        None => open::ServerAddress::Tcp(o.get_host().to_owned(), o.get_port()),
    }
}

#[cfg(feature = "mysql")]
pub(super) fn my_endpoint(o: &MySqlConnectOptions) -> String {
    match o.get_socket() {
        Some(path) => format!("MySQL/MariaDB on socket {}", path.display()),
        None => format!("MySQL/MariaDB at {}:{}", o.get_host(), o.get_port()),
    }
}

#[cfg(feature = "mysql")]
fn my_address(o: &MySqlConnectOptions) -> open::ServerAddress {
    match o.get_socket() {
        Some(path) => open::ServerAddress::Socket(path.to_owned()),
        None => open::ServerAddress::Tcp(o.get_host().to_owned(), o.get_port()),
    }
}

#[cfg(feature = "sqlite")]
pub(super) fn sqlite_endpoint(o: &SqliteConnectOptions) -> String {
    format!("SQLite file {}", o.get_filename().display())
}

/// A URL the driver could not read.
fn bad_url(url: &str, e: sqlx::Error) -> Error {
    Error::InvalidInput(format!(
        "database URL {}: {}",
        redact(url),
        crate::error::describe_plain(&e)
    ))
}

/// A URL for a database whose driver this build left out.
#[cfg(not(all(feature = "postgres", feature = "mysql", feature = "sqlite")))]
fn not_built(url: &str, feature: &str, database: &str) -> Error {
    Error::Unsupported(format!(
        "database URL {}: this rowclaim was built without {database} support (cargo feature \"{feature}\")",
        redact(url)
    ))
}

#[cfg(feature = "postgres")]
pub(super) async fn connect_postgres(
    url: &str,
    opts: &ConnectOptions,
) -> Result<(Backend, String)> {
    use crate::backend::postgres::route::{first_wanted, Route};
    use crate::backend::postgres::target::Target;
    let bad = |why: String| Error::InvalidInput(format!("database URL {}: {why}", redact(url)));
    let mut target = Target::parse(url).map_err(bad)?;
    if target.pooled && opts.async_commit {
        return Err(bad(
            "async commit cannot be set through a transaction-mode pooler (pgbouncer=true): \
             set it for the role instead (ALTER ROLE … SET synchronous_commit = off)"
                .to_owned(),
        ));
    }
    for (_, options) in &mut target.hosts {
        if target.pooled {
            // PgBouncer refuses startup parameters it does not track, such as this one.
            *options = options.clone().extra_float_digits(None);
        }
        if opts.async_commit {
            *options = options.clone().options([("synchronous_commit", "off")]);
        }
    }
    let listen = match &opts.listen_database {
        // One connection, opened when a worker first listens.
        Some(listen_url) => Some(
            PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy_with(listen_options(listen_url)?),
        ),
        None => None,
    };
    let pool_options = PgPoolOptions::new()
        .max_connections(opts.max_connections)
        .acquire_timeout(opts.acquire_timeout);
    let (route, endpoint) = if target.hosts.len() == 1 {
        let options = target.hosts[0].1.clone();
        let endpoint = pg_endpoint(&options);
        let address = pg_address(&options);
        let pool = open_pool(
            pool_options,
            options,
            &endpoint,
            address,
            opts.connect_timeout,
            pg_connect_sorted,
        )
        .await?;
        (Route::single(pool, target.pooled, listen), endpoint)
    } else {
        let endpoint = format!("PostgreSQL at {}", target.label());
        let first = first_wanted(&target.hosts, target.wanted, opts.connect_timeout)
            .await
            .map_err(|why| Error::Connect {
                endpoint: endpoint.clone(),
                source: postgres::sorted(sqlx::Error::Io(std::io::Error::other(why))),
            })?;
        let route = Route::with_hosts(target, first, pool_options, opts.connect_timeout, listen);
        (route, endpoint)
    };
    Ok((
        Backend::Postgres(Pg::routed(route, opts.async_commit)),
        endpoint,
    ))
}

/// The direct URL LISTEN connects to when the pool goes through a pooler.
#[cfg(feature = "postgres")]
fn listen_options(listen_url: &str) -> Result<PgConnectOptions> {
    use crate::backend::postgres::target::Target;
    let bad = |why: &str| {
        Error::InvalidInput(format!("listen database URL {}: {why}", redact(listen_url)))
    };
    if !listen_url.starts_with("postgres://") && !listen_url.starts_with("postgresql://") {
        return Err(bad("wake-ups need a postgres:// URL"));
    }
    let mut t = Target::parse(listen_url).map_err(|e| bad(&e))?;
    if t.pooled || t.hosts.len() != 1 {
        return Err(bad(
            "LISTEN needs one server reached directly (one host, no pgbouncer=true)",
        ));
    }
    Ok(t.hosts.remove(0).1)
}

#[cfg(not(feature = "postgres"))]
pub(super) async fn connect_postgres(url: &str, _: &ConnectOptions) -> Result<(Backend, String)> {
    Err(not_built(url, "postgres", "PostgreSQL"))
}

#[cfg(feature = "mysql")]
pub(super) async fn connect_mysql(url: &str, opts: &ConnectOptions) -> Result<(Backend, String)> {
    let bad_url = |e: sqlx::Error| bad_url(url, e);
    let url = url.replacen("mariadb:", "mysql:", 1);
    let options = MySqlConnectOptions::from_str(&url).map_err(bad_url)?;
    let endpoint = my_endpoint(&options);
    let pool_options = MySqlPoolOptions::new()
        .max_connections(opts.max_connections)
        .acquire_timeout(opts.acquire_timeout);
    let address = my_address(&options);
    let pool = open_pool(
        pool_options,
        options,
        &endpoint,
        address,
        opts.connect_timeout,
        mysql::sorted,
    )
    .await?;
    Ok((Backend::MySql(My::new(pool)), endpoint))
}

#[cfg(not(feature = "mysql"))]
pub(super) async fn connect_mysql(url: &str, _: &ConnectOptions) -> Result<(Backend, String)> {
    Err(not_built(url, "mysql", "MySQL/MariaDB"))
}

/// Rows a SQLite connection's thread may hand over before the reader takes them (see
/// [`connect_sqlite`]): more than the largest claim the Worker makes.
#[cfg(feature = "sqlite")]
const SQLITE_ROWS_BUFFERED: usize = 4096;

#[cfg(feature = "sqlite")]
pub(super) async fn connect_sqlite(url: &str, opts: &ConnectOptions) -> Result<(Backend, String)> {
    let bad_url = |e: sqlx::Error| bad_url(url, e);
    let options = SqliteConnectOptions::from_str(url).map_err(bad_url)?;
    // `mode=ro` (a pool that only looks) creates nothing, and leaves the journal mode alone below.
    let read_only = url.contains("mode=ro");
    // SQLite's own error for both is "unable to open database file", which names neither.
    let in_memory = url.contains(":memory:") || url.contains("mode=memory");
    let path = options.get_filename();
    if !in_memory && !path.exists() {
        let directory_missing = path
            .parent()
            .is_some_and(|dir| !dir.as_os_str().is_empty() && !dir.is_dir());
        if directory_missing || read_only || !opts.sqlite_create_if_missing {
            return Err(Error::NoSqliteFile {
                path: path.to_owned(),
                directory_missing,
            });
        }
    }
    let options = options
        .create_if_missing(opts.sqlite_create_if_missing)
        .busy_timeout(opts.sqlite_busy_timeout)
        // sqlx runs each SQLite connection on a thread of its own and hands rows over through a
        // channel; at its default of 50 rows that thread stops every 50 rows of a claim until
        // the worker's task has taken them, two thread wake-ups each time. A claim's rows (up
        // to a flush of 1,000) now pass without a stop: the Worker drains no-op jobs about 10 %
        // faster here (BENCHMARKS.md).
        .row_buffer_size(SQLITE_ROWS_BUFFERED);
    // Switching the journal mode is a write, which a file this user may only read refuses: a
    // read-only pool keeps the mode the file has.
    let options = if read_only {
        options
    } else {
        // WAL lets readers run beside the one writer; NORMAL sync is durable in WAL.
        options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
    };
    let endpoint = sqlite_endpoint(&options);
    let pool = SqlitePoolOptions::new()
        .max_connections(opts.max_connections)
        .acquire_timeout(opts.acquire_timeout)
        .connect_with(options)
        .await
        .map_err(|e| Error::Connect {
            endpoint: endpoint.clone(),
            source: sqlite::sorted(e),
        })?;
    Ok((Backend::Sqlite(Lite::new(pool)), endpoint))
}

#[cfg(not(feature = "sqlite"))]
pub(super) async fn connect_sqlite(url: &str, _: &ConnectOptions) -> Result<(Backend, String)> {
    Err(not_built(url, "sqlite", "SQLite"))
}
