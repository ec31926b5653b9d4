//! [`Db`]: a connection pool to one of the three databases, the entry point of the library.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "mysql")]
use sqlx::mysql::MySqlPool;
#[cfg(feature = "postgres")]
use sqlx::postgres::PgPool;
#[cfg(feature = "sqlite")]
use sqlx::sqlite::SqlitePool;

#[cfg(feature = "mysql")]
use crate::backend::mysql::My;
#[cfg(feature = "postgres")]
use crate::backend::postgres::Pg;
#[cfg(feature = "sqlite")]
use crate::backend::sqlite::Lite;
use crate::backend::{Backend, ServerInfo};
use crate::error::{Error, Result};

mod connect;
mod open;

#[cfg(feature = "mysql")]
use connect::my_endpoint;
#[cfg(feature = "postgres")]
use connect::pg_endpoint;
#[cfg(feature = "sqlite")]
use connect::sqlite_endpoint;
use connect::{connect_mysql, connect_postgres, connect_sqlite};
use open::take_connect_timeout;

/// A pool of connections to PostgreSQL, MySQL/MariaDB or SQLite.
///
/// Cheap to clone. Build one with [`Db::connect`], or wrap the sqlx pool your application already
/// has with `Db::from(pool)`.
///
/// ```no_run
/// # async fn demo() -> rowclaim::Result<()> {
/// use rowclaim::{Db, Source, Strategy};
/// use std::time::Duration;
///
/// let db = Db::connect("sqlite://work.db").await?;
/// let claimer = db.claimer(Source::new("emails"), Strategy::Auto).await?;
/// let mut claim = claimer.claim(10, Duration::from_secs(30)).await?;
/// for row in claim.rows().to_vec() {
///     println!("sending {}", row.data["address"]);
///     claim.complete(&row.id).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Db {
    pub(crate) backend: Backend,
    /// Where the pool connects, for messages: `PostgreSQL at host:port`, never a password.
    endpoint: Arc<str>,
}

/// How [`Db::connect_with`] opens its pool.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// The most connections the pool opens. Default 10.
    pub max_connections: u32,
    /// How long SQLite waits for another writer before reporting busy. Default 10 s.
    pub sqlite_busy_timeout: Duration,
    /// PostgreSQL: claims, settles and lease extensions commit without waiting for the WAL to
    /// reach the disk (`synchronous_commit = off` for this pool's sessions). Default off.
    ///
    /// A commit then returns in well under a millisecond instead of waiting for an fsync, which
    /// is most of a claim's latency tail. The price: a crash of the database server (not of a
    /// worker) can forget the last few hundred milliseconds of them. A forgotten claim leaves its
    /// rows claimable, and the worker that ran them gets `LeaseLost` when it settles; a forgotten
    /// settle leaves rows claimed until their lease expires. Either way the job runs again: still
    /// at-least-once, and no row is lost. Enqueues, counters and admin changes stay durable.
    /// Other databases ignore it.
    pub async_commit: bool,
    /// How long [`Db::connect_with`] waits for the first connection before it reports the server
    /// unreachable (at most [`ConnectOptions::acquire_timeout`]). Default 10 s, or
    /// `connect_timeout=SECONDS` in the URL. A refused connection is reported after about 0.2 s.
    pub connect_timeout: Duration,
    /// How long a statement waits for a connection from the pool (all busy, or the server
    /// unreachable) before it fails. Default 10 s.
    pub acquire_timeout: Duration,
    /// PostgreSQL behind a transaction-mode pooler (`pgbouncer=true`): a direct `postgres://`
    /// URL of the same database for `LISTEN`, which cannot pass the pooler. Without it, idle
    /// workers of the managed queue poll. Default none.
    pub listen_database: Option<String>,
    /// SQLite: create the database file when it is not there. Default on. Off, a missing file
    /// is an [`Error::NoSqliteFile`] and nothing is written: for tools that only look.
    pub sqlite_create_if_missing: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            max_connections: 10,
            sqlite_busy_timeout: Duration::from_secs(10),
            async_commit: false,
            connect_timeout: Duration::from_secs(10),
            acquire_timeout: Duration::from_secs(10),
            listen_database: None,
            sqlite_create_if_missing: true,
        }
    }
}

impl ConnectOptions {
    /// Sets [`ConnectOptions::max_connections`].
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Sets [`ConnectOptions::async_commit`].
    pub fn async_commit(mut self, on: bool) -> Self {
        self.async_commit = on;
        self
    }

    /// Sets [`ConnectOptions::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`ConnectOptions::listen_database`].
    pub fn listen_database(mut self, url: impl Into<String>) -> Self {
        self.listen_database = Some(url.into());
        self
    }

    /// Sets [`ConnectOptions::sqlite_create_if_missing`].
    pub fn sqlite_create_if_missing(mut self, create: bool) -> Self {
        self.sqlite_create_if_missing = create;
        self
    }

    /// Sets [`ConnectOptions::acquire_timeout`].
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }
}

impl Db {
    /// Connects to `postgres://…`, `mysql://…` (also MariaDB; `mariadb://` works too) or
    /// `sqlite://path` (created if missing unless
    /// [`ConnectOptions::sqlite_create_if_missing`] is off, in WAL mode; with `?mode=ro` only
    /// read, in whatever journal mode the file has).
    ///
    /// PostgreSQL URLs may list several hosts, libpq's way
    /// (`postgres://u@h1:5432,h2:5432/db`): rowclaim connects to the first that takes writes
    /// (`target_session_attrs=read-write`, the default here; `any` takes the first that answers)
    /// and, when that server goes away or turns read-only, moves to the one that takes writes
    /// then. `pgbouncer=true` says a transaction-mode pooler is in between (see DEPLOYING.md).
    pub async fn connect(url: &str) -> Result<Db> {
        Db::connect_with(url, ConnectOptions::default()).await
    }

    /// [`Db::connect`] with pool settings.
    ///
    /// A server that cannot be reached fails here at once, with an [`Error::Connect`] that names
    /// the host and port and says what the operating system reported.
    ///
    /// `connect_timeout=SECONDS` in a PostgreSQL or MySQL/MariaDB URL (libpq's name and unit)
    /// sets [`ConnectOptions::connect_timeout`]; 0 sets no limit of its own. The wait for the
    /// first connection is never longer than [`ConnectOptions::acquire_timeout`].
    pub async fn connect_with(url: &str, mut opts: ConnectOptions) -> Result<Db> {
        let scheme = url.split(':').next().unwrap_or_default();
        let url = &if scheme == "sqlite" {
            url.to_owned()
        } else {
            let (url, timeout) = take_connect_timeout(url)?;
            opts.connect_timeout = timeout.unwrap_or(opts.connect_timeout);
            url
        };
        let (backend, endpoint) = match scheme {
            "postgres" | "postgresql" => connect_postgres(url, &opts).await?,
            "mysql" | "mariadb" => connect_mysql(url, &opts).await?,
            "sqlite" => connect_sqlite(url, &opts).await?,
            _ => return Err(Error::InvalidUrl(redact(url))),
        };
        Ok(Db {
            backend,
            endpoint: endpoint.into(),
        })
    }

    /// Where this pool connects, for messages: `PostgreSQL at 127.0.0.1:5432`,
    /// `PostgreSQL on socket /run/postgresql/.s.PGSQL.5432`, `MySQL/MariaDB at db:3306`,
    /// `SQLite file ./work.db`. Never holds a password.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The turns this process may take on the database ([`Turns`](crate::backend::turn::Turns)): named locks
    /// one process at a time holds, for as long as it lives (e.g. which process exports the
    /// database's gauges). On PostgreSQL and MySQL/MariaDB they hold one connection of their
    /// own once a turn is asked for.
    pub fn turns(&self) -> crate::backend::turn::Turns {
        crate::backend::turn::Turns::new(self.backend.clone())
    }

    /// The server behind the pool and its version.
    pub async fn server(&self) -> Result<ServerInfo> {
        self.backend.catalog().server().await
    }

    /// Increments the counter `name` atomically and returns its new value: 1 the first time.
    ///
    /// Counters live in `rowclaim_counters` (created when first used). On PostgreSQL and SQLite it
    /// is one `INSERT … ON CONFLICT DO UPDATE … RETURNING`; on MySQL/MariaDB one
    /// `INSERT … ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1)`.
    pub async fn next_counter_value(&self, name: &str) -> Result<i64> {
        crate::backend::retry_transient!(self.backend.catalog().counter_next(name).await)
    }
}

#[cfg(feature = "postgres")]
impl From<PgPool> for Db {
    fn from(pool: PgPool) -> Db {
        let endpoint = pg_endpoint(&pool.connect_options()).into();
        Db {
            backend: Backend::Postgres(Pg::new(pool)),
            endpoint,
        }
    }
}

#[cfg(feature = "mysql")]
impl From<MySqlPool> for Db {
    fn from(pool: MySqlPool) -> Db {
        let endpoint = my_endpoint(&pool.connect_options()).into();
        Db {
            backend: Backend::MySql(My::new(pool)),
            endpoint,
        }
    }
}

#[cfg(feature = "sqlite")]
impl From<SqlitePool> for Db {
    /// Note: for several claimers on one SQLite file, open it in WAL mode with a busy timeout, as
    /// [`Db::connect`] does.
    fn from(pool: SqlitePool) -> Db {
        let endpoint = sqlite_endpoint(&pool.connect_options()).into();
        Db {
            backend: Backend::Sqlite(Lite::new(pool)),
            endpoint,
        }
    }
}

/// Hides a password in a URL before it goes into a message, however malformed the URL.
fn redact(url: &str) -> String {
    crate::redact::redacted_url(url)
}

#[cfg(test)]
mod tests {
    /// A server reached by a Unix socket is named by its socket file, its directory given as
    /// `host=`, as the URL's host, or as options whose host is a path (a pool handed over
    /// whole); one reached by TCP by its host and port. Never the password.
    #[cfg(feature = "postgres")]
    #[test]
    fn a_postgres_endpoint_names_the_socket_file_or_the_host_and_port() {
        use std::str::FromStr;
        let endpoint = |url: &str| {
            super::pg_endpoint(&sqlx::postgres::PgConnectOptions::from_str(url).unwrap())
        };
        let socket = "PostgreSQL on socket /run/pg/.s.PGSQL.5499";
        assert_eq!(
            endpoint("postgres://u@localhost:5499/db?host=/run/pg"),
            socket
        );
        assert_eq!(endpoint("postgres://u@%2Frun%2Fpg:5499/db"), socket);
        let options = sqlx::postgres::PgConnectOptions::new()
            .host("/run/pg")
            .port(5499);
        assert_eq!(super::pg_endpoint(&options), socket);
        assert_eq!(
            endpoint("postgres://u:secret@127.0.0.1:5432/db"),
            "PostgreSQL at 127.0.0.1:5432"
        );
    }

    /// A MySQL/MariaDB server is named by its socket file or by its host and port, as a
    /// PostgreSQL one is; never the password.
    #[cfg(feature = "mysql")]
    #[test]
    fn a_mysql_endpoint_names_the_socket_file_or_the_host_and_port() {
        use std::str::FromStr;
        let endpoint = |url: &str| {
            super::my_endpoint(&sqlx::mysql::MySqlConnectOptions::from_str(url).unwrap())
        };
        assert_eq!(
            endpoint("mysql://u:secret@localhost/db?socket=/run/mysqld/mysqld.sock"),
            "MySQL/MariaDB on socket /run/mysqld/mysqld.sock"
        );
        assert_eq!(
            endpoint("mysql://u:secret@db.internal:3307/db"),
            "MySQL/MariaDB at db.internal:3307"
        );
    }

    /// A build without a driver says which cargo feature would have it (the PostgreSQL-only
    /// build of the suite runs this).
    #[cfg(not(feature = "sqlite"))]
    #[tokio::test]
    async fn a_left_out_driver_names_its_feature() {
        let e = super::Db::connect("sqlite://x.db").await.unwrap_err();
        assert!(matches!(e, crate::error::Error::Unsupported(_)), "{e:?}");
        assert!(e.to_string().contains("cargo feature \"sqlite\""), "{e}");
    }

    /// A tool that only looks gets a missing file named and leaves nothing behind; a file whose
    /// directory is missing is named with its directory, whatever the option.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_missing_sqlite_file_is_named_and_not_created() {
        use super::{ConnectOptions, Db};
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("absent.db");
        let url = format!("sqlite://{}", file.display());
        let look = ConnectOptions::default().sqlite_create_if_missing(false);
        let e = Db::connect_with(&url, look.clone()).await.unwrap_err();
        assert!(
            matches!(e, crate::error::Error::NoSqliteFile { .. }),
            "{e:?}"
        );
        assert_eq!(e.kind(), crate::error::ErrorKind::BadInput);
        assert_eq!(
            e.to_string(),
            format!("no SQLite database at {}", file.display())
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing written"
        );

        let nested = dir.path().join("no/such/dir/x.db");
        let url = format!("sqlite://{}", nested.display());
        let e = Db::connect(&url).await.unwrap_err();
        assert!(e.to_string().contains("its directory"), "{e}");
        assert!(e.to_string().contains(&nested.display().to_string()), "{e}");

        // Once there, the file opens either way.
        drop(
            Db::connect(&format!("sqlite://{}", file.display()))
                .await
                .unwrap(),
        );
        let url = format!("sqlite://{}", file.display());
        Db::connect_with(&url, look).await.unwrap();
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(super::redact("x://u:secret@h/db"), "x://u:***@h/db");
        assert_eq!(super::redact("x://u@h/db"), "x://u@h/db");
    }
}
