//! How PostgreSQL statements reach the server, for the deployments users have:
//!
//! - **Straight** to one server: the pool, with sqlx's prepared-statement cache.
//! - **Through a transaction-mode pooler** (PgBouncer, Supavisor, PgCat: `pgbouncer=true` in the
//!   URL): a statement's two round trips (parse, then bind and execute) must land on one server
//!   connection, and a named prepared statement would outlive the transaction on a server
//!   connection that another client gets next. So each statement is unnamed and runs in a
//!   transaction of its own (`BEGIN`, statement, `COMMIT`: more round trips, the price of the
//!   pooler). LISTEN does not pass a pooler: wake-ups need a direct URL (`listen_database`).
//! - **Several hosts** (`postgres://u@h1:5432,h2:5433/db`, libpq's form): the first host that
//!   takes writes (`target_session_attrs=read-write`, the default here since every claim writes;
//!   `any` takes the first that answers). When a statement finds the server gone or read-only,
//!   or is given up unanswered (a crashed primary tells its clients nothing; a host behind a
//!   black hole never answers), the hosts are tried again, once a second until one takes writes,
//!   and the pool moves there: after a failover, the runtime's retries land on the new primary
//!   by themselves. A search tries the host that failed last, each host for at most
//!   [`SEARCH_CHECK`], so that a silent old primary does not hold up the move.
//!
//! Every statement of the PostgreSQL driver goes through [`Route::exec`] (outside a transaction)
//! or [`Route::on`] (inside one), so none can bypass these rules.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures_core::future::BoxFuture;
use futures_core::stream::BoxStream;
use futures_util::{FutureExt, StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgQueryResult, PgRow, PgStatement,
    PgTypeInfo,
};
use sqlx::{Connection, Either, Execute, Executor, Postgres};

use super::target::{Target, Wanted};
use crate::error::{DbKind, Result};

/// A statement still unanswered this long when its caller gives it up makes the route suspect
/// its server: the pool's own reconnects (to a crashed host: refused, retried inside sqlx until
/// its acquire timeout) and a black hole both look like this, and report no error.
const SILENCE: Duration = Duration::from_secs(1);

/// The longest a failover search waits for one host to answer: a host that does not answer by
/// then is taken for gone in this round (a connection to a live PostgreSQL takes milliseconds).
pub(crate) const SEARCH_CHECK: Duration = Duration::from_secs(2);

/// Where a pool's statements go, and how (see the module's notes).
#[derive(Debug)]
pub(crate) struct Route {
    pool: RwLock<PgPool>,
    /// A transaction-mode pooler is in between.
    pooled: bool,
    /// The hosts of a multi-host URL; None for one host (nothing to move to).
    failover: Option<Failover>,
    /// Where LISTEN connects when the pool cannot (through a pooler): a one-connection pool of
    /// the direct URL given for it.
    listen: Option<PgPool>,
}

#[derive(Debug)]
struct Failover {
    hosts: Vec<(String, PgConnectOptions)>,
    wanted: Wanted,
    pool_options: PgPoolOptions,
    connect_timeout: Duration,
    /// The host the pool reaches now.
    current: tokio::sync::Mutex<usize>,
    /// A search for the writable host is under way (one at a time).
    searching: AtomicBool,
    /// Told when the pool moves: statements still waiting for a connection of the old pool (sqlx
    /// retries a refused connect inside `acquire` until its timeout, and closing the pool does
    /// not stop that) give up at once, and the caller's retry goes to the new pool.
    moved: tokio::sync::Notify,
}

impl Route {
    /// One pool, no failover.
    pub(crate) fn single(pool: PgPool, pooled: bool, listen: Option<PgPool>) -> Route {
        Route {
            pool: RwLock::new(pool),
            pooled,
            failover: None,
            listen,
        }
    }

    /// A route over the hosts of `target`; the pool reaches host `current` first.
    pub(crate) fn with_hosts(
        target: Target,
        current: usize,
        pool_options: PgPoolOptions,
        connect_timeout: Duration,
        listen: Option<PgPool>,
    ) -> Route {
        let pool = pool_options
            .clone()
            .connect_lazy_with(target.hosts[current].1.clone());
        let failover = (target.hosts.len() > 1).then(|| Failover {
            hosts: target.hosts,
            wanted: target.wanted,
            pool_options,
            connect_timeout,
            current: tokio::sync::Mutex::new(current),
            searching: AtomicBool::new(false),
            moved: tokio::sync::Notify::new(),
        });
        Route {
            pool: RwLock::new(pool),
            pooled: target.pooled,
            failover,
            listen,
        }
    }

    /// The pool statements go to now.
    pub(crate) fn pool(&self) -> PgPool {
        match self.pool.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Whether a transaction-mode pooler is in between.
    pub(crate) fn pooled(&self) -> bool {
        self.pooled
    }

    /// The pool LISTEN connects through: the one of the direct URL given for it, else the pool
    /// statements go to (None through a pooler without one).
    pub(crate) fn listen_pool(&self) -> Option<PgPool> {
        match (&self.listen, self.pooled) {
            (Some(direct), _) => Some(direct.clone()),
            (None, false) => Some(self.pool()),
            (None, true) => None,
        }
    }

    /// An executor for one statement outside a transaction.
    pub(crate) fn exec(self: &Arc<Self>) -> Exec {
        Exec(self.clone())
    }

    /// An executor for statements inside a transaction (of [`Route::begin`]).
    pub(crate) fn on<'c>(self: &'c Arc<Self>, conn: &'c mut PgConnection) -> On<'c> {
        On { conn, route: self }
    }

    /// A connection of the pool statements go to now. Waiting for one ends when the pool moves
    /// ([`Failover::moved`]) with [`sqlx::Error::PoolClosed`]: nothing was sent, and the
    /// caller's retry goes to the new pool.
    async fn acquire(&self) -> sqlx::Result<PoolConnection<Postgres>> {
        let Some(f) = &self.failover else {
            return self.pool().acquire().await;
        };
        let moved = f.moved.notified();
        tokio::pin!(moved);
        // Listening before the pool is read: a move after this wakes us; one before, we see.
        moved.as_mut().enable();
        let pool = self.pool();
        tokio::select! {
            conn = pool.acquire() => conn,
            () = moved => Err(sqlx::Error::PoolClosed),
        }
    }

    /// Starts a transaction, whole or not at all ([`crate::backend::retry::begin_whole`]).
    pub(crate) async fn begin(self: &Arc<Self>) -> Result<sqlx::Transaction<'static, Postgres>> {
        let mut watch = self.watch();
        let route = self.clone();
        let begun = crate::backend::retry::begin_whole(async move {
            let conn = route.acquire().await?;
            sqlx::Transaction::begin(conn, None).await
        })
        .await;
        if let Some(w) = &mut watch {
            w.answered = true;
        }
        match begun {
            Ok(tx) => Ok(tx),
            Err(e) => {
                self.noticed(&e);
                Err(super::error(e))
            }
        }
    }

    /// Called with every failed statement: when the server is gone or read-only and there are
    /// other hosts, looks for the one that takes writes (see [`Route::suspect`]).
    fn noticed(self: &Arc<Self>, e: &sqlx::Error) {
        if matches!(
            super::error_kind(e),
            Some(DbKind::ConnectionGone | DbKind::ReadOnly)
        ) {
            self.suspect();
        }
    }

    /// The server may be gone: when there are other hosts, looks for the one wanted, in the
    /// background, until a host answers as wanted (the caller's retry finds the pool moved).
    /// One report keeps the search going: a standby is often promoted a few seconds after the
    /// primary died.
    fn suspect(self: &Arc<Self>) {
        let Some(f) = &self.failover else { return };
        // A statement dropped while its runtime shuts down has nowhere to search from.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if f.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let route = self.clone();
        runtime.spawn(async move {
            while !route.find_primary().await {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            if let Some(f) = &route.failover {
                f.searching.store(false, Ordering::Release);
            }
        });
    }

    /// Watches one statement: given up unanswered after [`SILENCE`], it makes the route suspect
    /// its server. None without other hosts (nothing to move to).
    fn watch(self: &Arc<Self>) -> Option<Watch> {
        self.failover.as_ref().map(|_| Watch {
            route: self.clone(),
            since: Instant::now(),
            answered: false,
        })
    }

    /// Tries the other hosts in order, then the one the pool reaches now (it is why we search);
    /// moves the pool to the first one wanted if it is not the current one. Whether a host
    /// answered as wanted.
    async fn find_primary(&self) -> bool {
        let Some(f) = &self.failover else { return true };
        let mut current = f.current.lock().await;
        let order = search_order(f.hosts.len(), *current);
        let check = f.connect_timeout.min(SEARCH_CHECK);
        let found = match first_wanted_of(&f.hosts, &order, f.wanted, check).await {
            Ok(i) => i,
            Err(why) => {
                tracing::debug!("PostgreSQL failover: no host to move to yet: {why}");
                return false;
            }
        };
        if found == *current {
            return true;
        }
        let pool = f
            .pool_options
            .clone()
            .connect_lazy_with(f.hosts[found].1.clone());
        let old = match self.pool.write() {
            Ok(mut p) => std::mem::replace(&mut *p, pool),
            Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), pool),
        };
        tracing::warn!(
            "PostgreSQL: {} {}; statements now go to {}",
            f.hosts[*current].0,
            match f.wanted {
                Wanted::ReadWrite => "is gone or takes no writes",
                Wanted::Any => "no longer answers",
            },
            f.hosts[found].0
        );
        *current = found;
        // Statements waiting for a connection of the old pool go to the new one; those
        // running on it finish or fail there; its idle connections close now.
        f.moved.notify_waiters();
        tokio::spawn(async move { old.close().await });
        true
    }
}

/// The index of the first host that answers and is as wanted, or why there is none (each host's
/// reason).
pub(crate) async fn first_wanted(
    hosts: &[(String, PgConnectOptions)],
    wanted: Wanted,
    connect_timeout: Duration,
) -> std::result::Result<usize, String> {
    let order: Vec<usize> = (0..hosts.len()).collect();
    first_wanted_of(hosts, &order, wanted, connect_timeout).await
}

/// The hosts a failover search tries, in this order: the others in the URL's order, then
/// `current`, the one that failed (it may come back, as after a restart without a promotion).
fn search_order(hosts: usize, current: usize) -> Vec<usize> {
    (0..hosts)
        .filter(|&i| i != current)
        .chain(std::iter::once(current))
        .collect()
}

/// [`first_wanted`] over the hosts at `order`.
async fn first_wanted_of(
    hosts: &[(String, PgConnectOptions)],
    order: &[usize],
    wanted: Wanted,
    connect_timeout: Duration,
) -> std::result::Result<usize, String> {
    let mut why = Vec::new();
    for &i in order {
        let (label, options) = &hosts[i];
        match tokio::time::timeout(connect_timeout, check(options, wanted)).await {
            Ok(Ok(true)) => return Ok(i),
            Ok(Ok(false)) => why.push(format!("{label}: read-only (a standby?)")),
            Ok(Err(e)) => why.push(format!("{label}: {}", super::sorted(e))),
            Err(_) => why.push(format!(
                "{label}: no answer within {}",
                humantime::format_duration(connect_timeout)
            )),
        }
    }
    Err(why.join("; "))
}

/// Whether the server at `options` answers and is as wanted.
async fn check(options: &PgConnectOptions, wanted: Wanted) -> sqlx::Result<bool> {
    let mut conn = PgConnection::connect_with(options).await?;
    let ok = match wanted {
        Wanted::Any => true,
        Wanted::ReadWrite => {
            // A simple query: nothing is prepared, so this also works through a pooler.
            let row = conn.fetch_one("SHOW transaction_read_only").await?;
            let value: String = sqlx::Row::try_get(&row, 0)?;
            value == "off"
        }
    };
    let _ = conn.close().await;
    Ok(ok)
}

/// One statement on its way (see [`Route::watch`]): dropped before it was answered, and after
/// [`SILENCE`], it makes the route suspect its server.
#[derive(Debug)]
struct Watch {
    route: Arc<Route>,
    since: Instant,
    /// An answer came (rows, or an error the route has seen).
    answered: bool,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.answered && self.since.elapsed() >= SILENCE {
            tracing::debug!(
                "PostgreSQL: a statement was given up unanswered after {:?}; looking for the \
                 host that takes writes",
                self.since.elapsed()
            );
            self.route.suspect();
        }
    }
}

/// A statement that sqlx must not keep prepared (behind a pooler): `persistent` is false.
struct Prepared<E> {
    query: E,
    keep: bool,
}

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Prepared<E> {
    fn sql(self) -> sqlx::SqlStr {
        self.query.sql()
    }

    fn statement(&self) -> Option<&PgStatement> {
        self.query.statement()
    }

    fn take_arguments(
        &mut self,
    ) -> std::result::Result<Option<sqlx::postgres::PgArguments>, sqlx::error::BoxDynError> {
        self.query.take_arguments()
    }

    fn persistent(&self) -> bool {
        self.keep && self.query.persistent()
    }
}

/// Runs one statement outside a transaction (see [`Route::exec`]). Results are read whole
/// before they are handed on: rowclaim's statements return a batch of rows at most.
#[derive(Debug)]
pub(crate) struct Exec(Arc<Route>);

type Step = Either<PgQueryResult, PgRow>;

impl Exec {
    async fn steps<'q, E: Execute<'q, Postgres> + 'q>(self, query: E) -> sqlx::Result<Vec<Step>> {
        let route = self.0;
        let mut watch = route.watch();
        let result = async {
            let mut conn = route.acquire().await?;
            if route.pooled {
                // Whole or not at all, as every transaction here (`begin_whole`).
                let begin = sqlx::Transaction::begin(conn, None);
                let mut tx = crate::backend::retry::begin_whole(begin).await?;
                let steps: Vec<Step> = tx
                    .fetch_many(Prepared { query, keep: false })
                    .try_collect()
                    .await?;
                tx.commit().await?;
                Ok(steps)
            } else {
                conn.fetch_many(query).try_collect().await
            }
        }
        .await;
        if let Some(w) = &mut watch {
            w.answered = true;
        }
        if let Err(e) = &result {
            route.noticed(e);
        }
        result
    }
}

impl<'c> Executor<'c> for Exec {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, sqlx::Result<Step>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        futures_util::stream::once(self.steps(query))
            .map_ok(|steps| futures_util::stream::iter(steps.into_iter().map(Ok)))
            .try_flatten()
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, sqlx::Result<Option<PgRow>>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        async move {
            let steps = self.steps(query).await?;
            Ok(steps.into_iter().find_map(|s| s.right()))
        }
        .boxed()
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, sqlx::Result<PgStatement>>
    where
        'c: 'e,
    {
        let pool = self.0.pool();
        async move { pool.prepare_with(sql, parameters).await }.boxed()
    }
}

/// Runs statements inside a transaction (see [`Route::on`]).
#[derive(Debug)]
pub(crate) struct On<'c> {
    conn: &'c mut PgConnection,
    route: &'c Arc<Route>,
}

impl<'c> Executor<'c> for On<'c> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, sqlx::Result<Step>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let keep = !self.route.pooled;
        let route = self.route;
        let mut watch = route.watch();
        self.conn
            .fetch_many(Prepared { query, keep })
            .inspect(move |step| {
                // Any reply, rows or an error, is an answer.
                if let Some(w) = &mut watch {
                    w.answered = true;
                }
                if let Err(e) = step {
                    route.noticed(e);
                }
            })
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, sqlx::Result<Option<PgRow>>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let keep = !self.route.pooled;
        let route = self.route;
        let mut watch = route.watch();
        async move {
            let result = self.conn.fetch_optional(Prepared { query, keep }).await;
            if let Some(w) = &mut watch {
                w.answered = true;
            }
            if let Err(e) = &result {
                route.noticed(e);
            }
            result
        }
        .boxed()
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, sqlx::Result<PgStatement>>
    where
        'c: 'e,
    {
        self.conn.prepare_with(sql, parameters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_tries_the_host_that_failed_last() {
        assert_eq!(search_order(3, 0), [1, 2, 0]);
        assert_eq!(search_order(3, 1), [0, 2, 1]);
        assert_eq!(search_order(2, 1), [0, 1]);
        assert_eq!(search_order(1, 0), [0]);
    }
}
