//! The statements every driver runs the same way, written once over a driver's [`Run`]: a
//! source's stats and backlog, the "did this claim lose a race?" check, and the settle that
//! says which rows it changed (`RETURNING`). Each driver gets `Run` from `binder_queries!`.

use std::future::Future;

use super::sql::{and_each, candidates, change_sql, held_by, outcome_set, Binder, Dialect, Stmt};
use super::{Outcome, Target};
use crate::mapping::{status_literal, Mapping, Naming};
use crate::value::{IdList, Value};
use crate::{Result, Stats, Strategy};

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
    OptFloat,
}

fn none() -> crate::Error {
    crate::Error::Internal("a statement that answers one row answered none".into())
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
}

impl<Driver: Sync, DB: sqlx::Database> Finish for InTx<'_, Driver, DB> {
    async fn commit_as(self, what: impl FnOnce() -> String + Send) -> Result<()> {
        super::commit(self.tx.into_inner(), what).await
    }

    async fn commit(self) -> Result<()> {
        Ok(self.tx.into_inner().commit().await?)
    }

    async fn rollback(self) -> Result<()> {
        Ok(self.tx.into_inner().rollback().await?)
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
pub(crate) fn values<R: sqlx::Row>(rows: Vec<R>, columns: &[Col]) -> Result<Vec<Vec<Value>>>
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
                        Col::OptFloat => Value::OptFloat(r.try_get(i)?),
                    })
                })
                .collect()
        })
        .collect()
}

/// Settles each named row the token still holds, on its own, in one statement that says which
/// rows it changed (`UPDATE … RETURNING`, for servers with [`crate::Capability::Returning`]);
/// `None` where a token cannot name its rows this way (lease table, no owner column).
pub(crate) async fn settle_returning<R: Run + ?Sized>(
    r: &R,
    m: &Mapping,
    strategy: Strategy,
    token: &str,
    list: &IdList,
    outcome: Outcome,
) -> Result<Option<Vec<crate::RowId>>> {
    if strategy == Strategy::LeaseTable || m.owner.is_none() {
        return Ok(None);
    }
    let mut b = Binder::new();
    let set = (!outcome.deletes(m)).then(|| outcome_set(m, &mut b, &outcome));
    let cond = held_by(m, &mut b, token, &Target::Ids(list, list.len()))?;
    let sql = format!(
        "{} RETURNING CAST({} AS {})",
        change_sql(m, set.as_deref(), &cond),
        m.id,
        R::Sql::TEXT
    );
    let done = r.texts(Stmt::new(sql, b)).await?;
    Ok(Some(m.parse_ids(&done)?))
}

/// Rows waiting for a worker: ready rows that are due or await a retry (a row scheduled for
/// later that never ran is not work yet), claimed rows, and those scheduled for later; all
/// within what a layer above counts as its work, and the source's filter.
pub(crate) async fn backlog<R: Run + ?Sized>(r: &R, m: &Mapping) -> Result<(u64, u64, u64)> {
    let now = R::Sql::NOW;
    let (due, later) = match (&m.lifecycle, &m.attempts) {
        (Some(l), Some(a)) => (
            format!(" AND ({} <= {now} OR {a} > 0)", l.due),
            Some(format!(" AND {} > {now} AND {a} = 0", l.due)),
        ),
        (Some(l), None) => (
            format!(" AND {} <= {now}", l.due),
            Some(format!(" AND {} > {now}", l.due)),
        ),
        _ => (String::new(), None),
    };
    let ready = status_literal(&m.ready);
    let mut counts = [0u64; 3];
    for (cond, n) in [
        Some(format!("{} = {ready}{due}", m.status)),
        Some(format!("{} = {}", m.status, status_literal(&m.claimed))),
        later.map(|later| format!("{} = {ready}{later}", m.status)),
    ]
    .into_iter()
    .zip(counts.iter_mut())
    {
        let Some(cond) = cond else { continue };
        let mut b = Binder::new();
        let work = m
            .lifecycle
            .as_ref()
            .map(|l| and_each(&l.work, &mut b))
            .unwrap_or_default();
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE {cond}{work}{}",
            m.table, m.filter
        );
        *n = u64::try_from(r.count(Stmt::new(sql, b)).await?).unwrap_or(0);
    }
    Ok((counts[0], counts[1], counts[2]))
}

/// Whether any row could be claimed now: asked when a claim that can lose races (token) came
/// back empty, to tell "lost to others, try again" from "nothing to do".
pub(crate) async fn claimable_exists<R: Run + ?Sized>(r: &R, m: &Mapping) -> Result<bool> {
    let mut b = Binder::new();
    let sql = format!(
        "SELECT COUNT(*) FROM ({}) AS c",
        candidates(m, &mut b, "1 AS one", 1, true)
    );
    Ok(r.count(Stmt::new(sql, b)).await? > 0)
}

/// A source's stats: rows per status, claimed rows per owner (token), expired leases (none
/// without a lease column or lease table).
pub(crate) async fn stats<R: Run + ?Sized>(
    r: &R,
    m: &Mapping,
    strategy: Strategy,
) -> Result<Stats> {
    let (t, st, filter) = (&m.table, &m.status, &m.filter);
    let (now, text) = (R::Sql::NOW, R::Sql::TEXT);
    let by_status = r
        .count_by(Stmt::new(
            format!(
                "SELECT CAST({st} AS {text}), COUNT(*) FROM {t} WHERE 1 = 1{filter} GROUP BY 1"
            ),
            Binder::new(),
        ))
        .await?;
    let mut b = Binder::new();
    let owners = if strategy == Strategy::LeaseTable {
        let s = b.bind(m.source_key.clone());
        format!(
            "SELECT CAST(token AS {text}), COUNT(*) FROM rowclaim_leases \
             WHERE source = {s} AND lease_until >= {now} GROUP BY 1"
        )
    } else {
        let owner = m.owner.as_deref().unwrap_or("NULL");
        let c = status_literal(&m.claimed);
        format!(
            "SELECT CAST({owner} AS {text}), COUNT(*) FROM {t} WHERE {st} = {c}{filter} GROUP BY 1"
        )
    };
    let by_owner = r.count_by(Stmt::new(owners, b)).await?;
    let mut b = Binder::new();
    let expired = if strategy == Strategy::LeaseTable {
        let s = b.bind(m.source_key.clone());
        Some(format!(
            "SELECT COUNT(*) FROM rowclaim_leases WHERE source = {s} AND lease_until < {now}"
        ))
    } else {
        m.lease.as_ref().map(|le| {
            let c = status_literal(&m.claimed);
            format!("SELECT COUNT(*) FROM {t} WHERE {st} = {c} AND {le} < {now}{filter}")
        })
    };
    let expired = match expired {
        Some(sql) => r.count(Stmt::new(sql, b)).await?,
        None => 0,
    };
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Stats {
        by_status: by_status
            .into_iter()
            .map(|(s, n)| (s.unwrap_or_else(|| "(null)".into()), count(n)))
            .collect(),
        claimed_by_owner: by_owner
            .into_iter()
            .map(|(o, n)| (o.unwrap_or_else(|| "(no owner)".into()), count(n)))
            .collect(),
        expired_leases: count(expired),
    })
}

/// Runs the source's filter on its table in a statement that reads no row: the database says
/// whether it is a condition on the table.
pub(crate) async fn probe_filter<R: Run + ?Sized>(r: &R, m: &Mapping) -> Result<()> {
    let sql = format!(
        "SELECT COUNT(*) FROM (SELECT 1 AS probe FROM {} WHERE 1 = 1{} LIMIT 0) AS p",
        m.table, m.filter
    );
    r.count(Stmt::new(sql, Binder::new())).await.map(drop)
}

/// How the database of driver `R` names things, for checking a source against its catalog.
pub(crate) fn naming<R: Run + ?Sized>(_: &R) -> Naming {
    Naming {
        quote: R::Sql::quote,
        lease_column: R::Sql::LEASE_COLUMN,
        lease_type: R::Sql::LEASE_TYPE,
    }
}
