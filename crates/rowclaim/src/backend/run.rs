//! The one door every statement of the library goes through: [`Run`] runs a [`Stmt`] on a
//! driver, one of its transactions ([`Transact`]) or a caller's connection ([`OnConn`]). Each
//! driver gets these from `binder_queries!`.

use std::future::Future;

use super::sql::{Dialect, Stmt};
use crate::error::Result;
use crate::value::Value;

/// A row a statement returns, read as any `sqlx::FromRow` type of the driver's database (a
/// tuple of columns, usually).
pub(crate) trait Fetch<D: Dialect>:
    for<'r> sqlx::FromRow<'r, <D::DB as sqlx::Database>::Row> + Send + Unpin
{
}

impl<D: Dialect, T> Fetch<D> for T where
    T: for<'r> sqlx::FromRow<'r, <D::DB as sqlx::Database>::Row> + Send + Unpin
{
}

/// The one door every statement of the library goes through: a driver, one of its
/// transactions, or a caller's connection runs a [`Stmt`] built over the driver's dialect.
/// Implemented for each driver by `binder_queries!`, which is also where a driver's errors get
/// their kind.
pub(crate) trait Run: Sync {
    /// The driver's dialect.
    type Sql: Dialect;
    /// A statement answering nothing; returns how many rows it changed.
    fn execute(&self, s: Stmt<Self::Sql>) -> impl Future<Output = Result<u64>> + Send;
    /// A statement's rows.
    fn fetch_all<T: Fetch<Self::Sql>>(
        &self,
        s: Stmt<Self::Sql>,
    ) -> impl Future<Output = Result<Vec<T>>> + Send;
    /// A statement's first row, if any.
    fn fetch_optional<T: Fetch<Self::Sql>>(
        &self,
        s: Stmt<Self::Sql>,
    ) -> impl Future<Output = Result<Option<T>>> + Send;
    /// A statement's rows, each column read as `columns` says (for code written once for every
    /// database, which cannot name a database's row types).
    fn values(
        &self,
        s: Stmt<Self::Sql>,
        columns: &[Col],
    ) -> impl Future<Output = Result<Vec<Vec<Value>>>> + Send;

    /// A statement's one row (an error when it returns none).
    fn fetch_one<T: Fetch<Self::Sql>>(
        &self,
        s: Stmt<Self::Sql>,
    ) -> impl Future<Output = Result<T>> + Send {
        async move { self.fetch_optional(s).await?.ok_or_else(none) }
    }
    /// A statement answering one number.
    fn count(&self, s: Stmt<Self::Sql>) -> impl Future<Output = Result<i64>> + Send {
        async move {
            let row = self.values(s, &[Col::Int]).await?.into_iter().next();
            row.and_then(|r| r.into_iter().next())
                .and_then(Value::int)
                .ok_or_else(none)
        }
    }
    /// A statement answering (text, number) rows.
    fn count_by(
        &self,
        s: Stmt<Self::Sql>,
    ) -> impl Future<Output = Result<Vec<(Option<String>, i64)>>> + Send {
        async move {
            let rows = self.values(s, &[Col::OptText, Col::Int]).await?;
            Ok(rows
                .into_iter()
                .map(|r| {
                    let mut r = r.into_iter();
                    let text = r.next().and_then(Value::text);
                    (text, r.next().and_then(Value::int).unwrap_or(0))
                })
                .collect())
        }
    }
    /// A statement answering one text per row.
    fn texts(&self, s: Stmt<Self::Sql>) -> impl Future<Output = Result<Vec<String>>> + Send {
        async move {
            let rows = self.values(s, &[Col::Text]).await?;
            Ok(rows
                .into_iter()
                .filter_map(|r| r.into_iter().next().and_then(Value::text))
                .collect())
        }
    }
    /// A statement answering a text, then `numbers` numbers (each maybe NULL), per row.
    fn named_numbers(
        &self,
        s: Stmt<Self::Sql>,
        numbers: usize,
    ) -> impl Future<Output = Result<Vec<(String, Vec<Option<i64>>)>>> + Send {
        async move {
            let mut columns = vec![Col::Text];
            columns.extend(std::iter::repeat_n(Col::OptInt, numbers));
            let rows = self.values(s, &columns).await?;
            Ok(rows
                .into_iter()
                .map(|r| {
                    let mut r = r.into_iter();
                    let name = r.next().and_then(Value::text).unwrap_or_default();
                    (name, r.map(Value::int).collect())
                })
                .collect())
        }
    }
}

/// How [`Run::values`] reads one column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Col {
    Int,
    OptInt,
    Text,
    OptText,
}

fn none() -> crate::error::Error {
    crate::error::Error::Internal("a statement that answers one row answered none".into())
}

/// A driver that opens transactions: statements in one commit together or not at all.
pub(crate) trait Transact: Run {
    /// One of its transactions.
    type Tx<'t>: Run<Sql = Self::Sql> + Finish + Send
    where
        Self: 't;
    /// Opens a transaction that writes: at READ COMMITTED on MySQL/MariaDB, holding the write
    /// lock from the start on SQLite (`BEGIN IMMEDIATE`), durable on PostgreSQL whatever the
    /// pool's commit setting when `durable`.
    fn transaction(&self, durable: bool) -> impl Future<Output = Result<Self::Tx<'_>>> + Send;
    /// Whether a write another server committed may not be seen here yet: a Galera node
    /// applies the other nodes' writes some moments after they commit. A transaction that
    /// counts what others hold must then first wait for them (`limits/`).
    fn applies_others_late(&self) -> impl Future<Output = Result<bool>> + Send;
}

/// How a transaction ends.
pub(crate) trait Finish: Sized {
    /// Commits. A connection that breaks during the COMMIT makes the outcome unknown:
    /// [`crate::Error::OutcomeUnknown`], naming `what` was committed.
    fn commit_as(
        self,
        what: impl FnOnce() -> String + Send,
    ) -> impl Future<Output = Result<()>> + Send;
    /// Commits (its outcome, should the connection break, is a plain error).
    fn commit(self) -> impl Future<Output = Result<()>> + Send;
    /// Rolls back.
    fn rollback(self) -> impl Future<Output = Result<()>> + Send;
}

/// One of a driver's transactions, as a [`Run`]. Dropped without [`Finish::commit`], it rolls
/// back.
pub(crate) struct InTx<'d, Driver, DB: sqlx::Database> {
    /// The driver whose rules its statements follow (PostgreSQL's route).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub driver: &'d Driver,
    pub tx: tokio::sync::Mutex<sqlx::Transaction<'static, DB>>,
}

impl<'d, Driver, DB: sqlx::Database> InTx<'d, Driver, DB> {
    pub(crate) fn new(driver: &'d Driver, tx: sqlx::Transaction<'static, DB>) -> Self {
        InTx {
            driver,
            tx: tokio::sync::Mutex::new(tx),
        }
    }

    /// The driver's transaction itself, to hold open beyond this call (the transaction
    /// strategy's claim, a locking read).
    pub(crate) fn into_inner(self) -> sqlx::Transaction<'static, DB> {
        self.tx.into_inner()
    }
}

/// A caller's own connection (or transaction), as a [`Run`]: an enqueue inside the
/// application's transaction. Its statements are not kept prepared when `keep` is off (a
/// transaction-mode pooler may be in between).
pub(crate) struct OnConn<'c, DB: sqlx::Database> {
    pub conn: tokio::sync::Mutex<&'c mut DB::Connection>,
    pub keep: bool,
}

impl<'c, DB: sqlx::Database> OnConn<'c, DB> {
    pub(crate) fn new(conn: &'c mut DB::Connection, keep: bool) -> Self {
        OnConn {
            conn: tokio::sync::Mutex::new(conn),
            keep,
        }
    }
}

/// Rows read column by column as `columns` says, as [`Run::values`] answers them.
pub(crate) fn values<R: sqlx::Row>(rows: Vec<R>, columns: &[Col]) -> sqlx::Result<Vec<Vec<Value>>>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> f64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.into_iter()
        .map(|r| {
            columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    Ok(match c {
                        Col::Int => Value::Int(r.try_get(i)?),
                        Col::OptInt => Value::OptInt(r.try_get(i)?),
                        Col::Text => Value::Text(r.try_get(i)?),
                        Col::OptText => Value::OptText(r.try_get(i)?),
                    })
                })
                .collect()
        })
        .collect()
}

/// For one driver (sqlx's execution functions need the concrete database): `query`, `scalar`
/// and `query_as` over a [`Binder`]; [`Run`](super::run::Run) for the driver (its statements go
/// to `&self.pool`, or to `self.exec()` when `exec` is given: PostgreSQL's route with its pooler
/// and failover rules), for its transactions and for a caller's connection; and
/// [`Transact`](super::run::Transact) through the driver's own `open_transaction`. `$sort` is
/// the driver's function that sorts its errors where they are made.
macro_rules! binder_queries {
    ($dialect:ty, $db:ty, $driver:ty, $sort:path) => {
        $crate::backend::run::binder_queries!(@all $dialect, $db, $driver, pool, txpool, $sort);
    };
    ($dialect:ty, $db:ty, $driver:ty, exec, $sort:path) => {
        $crate::backend::run::binder_queries!(@all $dialect, $db, $driver, exec, txexec, $sort);
    };
    // Binds the executor `$e` of one statement (and whether sqlx may keep it prepared, `$k`)
    // for a runner `$s` of each kind, then evaluates `$body`.
    (@with pool, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let ($e, $k) = (&$s.pool, true);
        $body
    }};
    (@with exec, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let ($e, $k) = ($s.exec(), true);
        $body
    }};
    (@with txpool, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let mut g = $s.tx.lock().await;
        let ($e, $k) = (&mut **g, true);
        $body
    }};
    (@with txexec, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let mut g = $s.tx.lock().await;
        let ($e, $k) = ($s.driver.on(&mut **g), true);
        $body
    }};
    (@with conn, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let mut g = $s.conn.lock().await;
        let ($e, $k) = (&mut **g, $s.keep);
        $body
    }};
    (@run $dialect:ty, $db:ty, $target:ty, $how:ident, $sort:path) => {
        impl $crate::backend::run::Run for $target {
            type Sql = $dialect;

            async fn execute(
                &self,
                s: $crate::backend::sql::Stmt<$dialect>,
            ) -> $crate::error::Result<u64> {
                let q = s.binder.query(s.sql)?;
                $crate::backend::run::binder_queries!(@with $how, self, |e, keep| {
                    Ok(q.persistent(keep).execute(e).await.map_err(|e| $crate::error::Error::Database($sort(e)))?.rows_affected())
                })
            }

            async fn fetch_all<T: $crate::backend::run::Fetch<$dialect>>(
                &self,
                s: $crate::backend::sql::Stmt<$dialect>,
            ) -> $crate::error::Result<Vec<T>> {
                let q = s.binder.query_as::<T>(s.sql)?;
                $crate::backend::run::binder_queries!(@with $how, self, |e, keep| {
                    q.persistent(keep).fetch_all(e).await.map_err(|e| $crate::error::Error::Database($sort(e)))
                })
            }

            async fn fetch_optional<T: $crate::backend::run::Fetch<$dialect>>(
                &self,
                s: $crate::backend::sql::Stmt<$dialect>,
            ) -> $crate::error::Result<Option<T>> {
                let q = s.binder.query_as::<T>(s.sql)?;
                $crate::backend::run::binder_queries!(@with $how, self, |e, keep| {
                    q.persistent(keep).fetch_optional(e).await.map_err(|e| $crate::error::Error::Database($sort(e)))
                })
            }

            async fn values(
                &self,
                s: $crate::backend::sql::Stmt<$dialect>,
                columns: &[$crate::backend::run::Col],
            ) -> $crate::error::Result<Vec<Vec<$crate::value::Value>>> {
                let q = s.binder.query(s.sql)?;
                let rows = $crate::backend::run::binder_queries!(@with $how, self, |e, keep| {
                    q.persistent(keep).fetch_all(e).await.map_err(|e| $crate::error::Error::Database($sort(e)))?
                });
                $crate::backend::run::values(rows, columns).map_err(|e| $crate::error::Error::Database($sort(e)))
            }
        }
    };
    (@all $dialect:ty, $db:ty, $driver:ty, $exec:ident, $tx:ident, $sort:path) => {
        impl $crate::backend::sql::Binder<$dialect> {
            pub(crate) fn query<'q>(
                self,
                sql: String,
            ) -> $crate::error::Result<
                sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments>,
            > {
                $crate::backend::sql::record(&sql);
                Ok(sqlx::query_with(sqlx::AssertSqlSafe(sql), self.finish()?))
            }

            pub(crate) fn query_as<'q, O>(
                self,
                sql: String,
            ) -> $crate::error::Result<
                sqlx::query::QueryAs<'q, $db, O, <$db as sqlx::Database>::Arguments>,
            >
            where
                O: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
            {
                $crate::backend::sql::record(&sql);
                Ok(sqlx::query_as_with(sqlx::AssertSqlSafe(sql), self.finish()?))
            }

            pub(crate) fn scalar<'q, O>(
                self,
                sql: String,
            ) -> $crate::error::Result<
                sqlx::query::QueryScalar<'q, $db, O, <$db as sqlx::Database>::Arguments>,
            >
            where
                (O,): for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
            {
                $crate::backend::sql::record(&sql);
                Ok(sqlx::query_scalar_with(sqlx::AssertSqlSafe(sql), self.finish()?))
            }
        }

        $crate::backend::run::binder_queries!(@run $dialect, $db, $driver, $exec, $sort);
        $crate::backend::run::binder_queries!(
            @run $dialect, $db, $crate::backend::run::InTx<'_, $driver, $db>, $tx, $sort
        );
        $crate::backend::run::binder_queries!(
            @run $dialect, $db, $crate::backend::run::OnConn<'_, $db>, conn, $sort
        );

        impl $crate::backend::run::Finish for $crate::backend::run::InTx<'_, $driver, $db> {
            async fn commit_as(
                self,
                what: impl FnOnce() -> String + Send,
            ) -> $crate::error::Result<()> {
                $crate::backend::commit(self.tx.into_inner(), what, $sort).await
            }

            async fn commit(self) -> $crate::error::Result<()> {
                self.tx
                    .into_inner()
                    .commit()
                    .await
                    .map_err(|e| $crate::error::Error::Database($sort(e)))
            }

            async fn rollback(self) -> $crate::error::Result<()> {
                self.tx
                    .into_inner()
                    .rollback()
                    .await
                    .map_err(|e| $crate::error::Error::Database($sort(e)))
            }
        }

        impl $crate::backend::run::Transact for $driver {
            type Tx<'t> = $crate::backend::run::InTx<'t, $driver, $db>;

            async fn transaction(&self, durable: bool) -> $crate::error::Result<Self::Tx<'_>> {
                Ok($crate::backend::run::InTx::new(
                    self,
                    self.open_transaction(durable).await?,
                ))
            }

            async fn applies_others_late(&self) -> $crate::error::Result<bool> {
                <$driver>::applies_others_late(self).await
            }
        }
    };
}
pub(crate) use binder_queries;
