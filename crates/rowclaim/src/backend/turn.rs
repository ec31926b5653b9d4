//! Turns: named locks that one process at a time holds on a database, for as long as it lives.
//! Several processes that could all do one thing (export the database's gauges) take turns, so
//! that exactly one does it; when the holder dies, its session ends, the server frees its locks
//! and the next process to ask takes the turn.
//!
//! PostgreSQL: session advisory locks (`pg_try_advisory_lock`, two keys: rowclaim's and the
//! name's hash), all on one connection of their own, outside the pool. MySQL/MariaDB: named locks
//! (`GET_LOCK(name, 0)`), the name made of the database's and the turn's (named locks are the
//! server's, not one database's). SQLite: a lock on a file beside the database (`FILE-rowclaim-
//! HASH.lock`), which the system frees when the process ends; an in-memory database is seen
//! by one process only, which holds every turn.

use std::collections::BTreeSet;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::run::{Col, OnConn, Run};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use super::sql::{Binder, Stmt};
use super::Backend;
use crate::error::Result;

/// The turns one process holds on one database (see the module's text).
pub struct Turns {
    backend: Backend,
    session: Option<Session>,
    held: BTreeSet<String>,
}

enum Session {
    #[cfg(feature = "postgres")]
    Pg(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    My(sqlx::MySqlConnection),
    /// The database file's path, which the lock files' names start with, and those held.
    #[cfg(feature = "sqlite")]
    Files(String, std::collections::HashMap<String, std::fs::File>),
    /// Nobody else sees this database.
    Alone,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns").field("held", &self.held).finish()
    }
}

impl Turns {
    pub(crate) fn new(backend: Backend) -> Turns {
        Turns {
            backend,
            session: None,
            held: BTreeSet::new(),
        }
    }

    /// Which of `names` this process holds now: those it held (while their session lives) and
    /// those free, taken now. A session that was lost (its connection broke) loses its turns;
    /// they are asked for again at once, and another process may have them by then.
    pub async fn hold(&mut self, names: &[String]) -> Result<BTreeSet<String>> {
        if !self.alive().await {
            self.session = None;
            self.held.clear();
        }
        if self.session.is_none() {
            self.session = Some(self.open().await?);
        }
        for name in names {
            if !self.held.contains(name) && self.take(name).await? {
                self.held.insert(name.clone());
            }
        }
        Ok(names
            .iter()
            .filter(|n| self.held.contains(*n))
            .cloned()
            .collect())
    }

    /// Whether the session still lives (one round trip on a server).
    async fn alive(&mut self) -> bool {
        match &mut self.session {
            #[cfg(feature = "postgres")]
            // A 64-bit one: PostgreSQL's plain `1` is 32 bits, which reads as no i64.
            Some(Session::Pg(conn)) => ping(conn, "SELECT 1::int8").await,
            #[cfg(feature = "mysql")]
            Some(Session::My(conn)) => ping(conn, "SELECT 1").await,
            _ => true,
        }
    }

    async fn open(&self) -> Result<Session> {
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(pg) => {
                // A transaction-mode pooler would hand the session to others: the direct
                // connection LISTEN uses, when there is one.
                let route = pg.route();
                let pool = route.listen_pool().unwrap_or_else(|| route.pool());
                let conn = pool.acquire().await.map_err(super::postgres::error)?;
                Ok(Session::Pg(conn.detach()))
            }
            #[cfg(feature = "mysql")]
            Backend::MySql(my) => {
                let conn = my.pool.acquire().await.map_err(super::mysql::error)?;
                Ok(Session::My(conn.detach()))
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(lite) => {
                let options = lite.pool.connect_options();
                let file = options.get_filename().to_string_lossy().into_owned();
                if file.is_empty() || file.contains(":memory:") || file.contains("mode=memory") {
                    return Ok(Session::Alone);
                }
                Ok(Session::Files(file, Default::default()))
            }
        }
    }

    /// Takes the turn `name` if it is free.
    async fn take(&mut self, name: &str) -> Result<bool> {
        match &mut self.session {
            #[cfg(feature = "postgres")]
            Some(Session::Pg(conn)) => {
                let mut b = Binder::new();
                let sql = format!(
                    "SELECT CASE WHEN pg_try_advisory_lock(hashtext('rowclaim_turn'), \
                     hashtext({})) THEN 1::int8 ELSE 0::int8 END",
                    b.bind(name.to_owned())
                );
                let on = on(conn, true);
                Ok(first(on.values(Stmt::new(sql, b), &[Col::OptInt]).await?) == Some(1))
            }
            #[cfg(feature = "mysql")]
            Some(Session::My(conn)) => {
                let mut b = Binder::new();
                let sql = format!(
                    "SELECT GET_LOCK(CONCAT('rowclaim:', LEFT(SHA2(CONCAT(DATABASE(), '/', {}), \
                     256), 40)), 0)",
                    b.bind(name.to_owned())
                );
                let on = on(conn, true);
                Ok(first(on.values(Stmt::new(sql, b), &[Col::OptInt]).await?) == Some(1))
            }
            #[cfg(feature = "sqlite")]
            Some(Session::Files(db, files)) => {
                let path = format!("{db}-rowclaim-{:016x}.lock", fnv(name));
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .map_err(|e| {
                        let why = format!("opening the lock file {path}: {e}");
                        super::sqlite::error(sqlx::Error::Io(std::io::Error::new(e.kind(), why)))
                    })?;
                if file.try_lock().is_err() {
                    return Ok(false);
                }
                files.insert(name.to_owned(), file);
                Ok(true)
            }
            Some(Session::Alone) => Ok(true),
            None => Ok(false),
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn ping<C>(conn: &mut C, sql: &str) -> bool
where
    C: sqlx::Connection,
    <C as sqlx::Connection>::Database: sqlx::Database<Connection = C>,
    for<'c> OnConn<'c, <C as sqlx::Connection>::Database>: Run,
{
    let stmt = Stmt::new(sql.to_owned(), Binder::new());
    on(conn, true)
        .values(stmt, &[Col::Int])
        .await
        .is_ok_and(|rows| !rows.is_empty())
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn on<C>(conn: &mut C, keep: bool) -> OnConn<'_, <C as sqlx::Connection>::Database>
where
    C: sqlx::Connection,
    <C as sqlx::Connection>::Database: sqlx::Database<Connection = C>,
{
    OnConn::new(conn, keep)
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn first(rows: Vec<Vec<crate::value::Value>>) -> Option<i64> {
    rows.into_iter()
        .next()
        .and_then(|row| row.into_iter().next())
        .and_then(|v| v.int())
}

/// A stable hash of a turn's name, for its lock file's name (FNV-1a, 64 bits).
#[cfg(feature = "sqlite")]
fn fnv(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
