//! The drivers: one module per database, each holding that database's SQL for claiming rows,
//! behind two roles the rest of the crate sees:
//!
//! - [`Catalog`]: what the server is, a table's columns and key, the lease and counter tables;
//! - [`ClaimStore`]: claim (one function per strategy, in the driver's `claim.rs`), settle,
//!   extend, still-held, locking reads, stats and backlog.
//!
//! The managed queue's store (a third role) lives in `crate::queue`, one file per database, so
//! that a claim driver holds no job-queue SQL. What a server can do is asked
//! ([`ServerInfo::supports`]), never matched on.
//!
//! A new database (SQL Server's `UPDATE TOP (n) … WITH (ROWLOCK, UPDLOCK, READPAST)` would be the
//! next) is a module here implementing both roles and a [`sql::Dialect`], a [`Backend`] variant
//! behind a cargo feature, a `QueueStore`, and one `contract_suite!` invocation in the tests
//! (`rowclaim-testkit`) that proves it.

use std::time::Duration;

use crate::error::Result;
use crate::id::RowId;
use crate::locking::{LockMode, LockWait};
use crate::mapping::{Column, Mapping, Naming, TableName};
use crate::report::Stats;
use crate::strategy::Strategy;
use crate::value::IdList;

mod inspect;
pub(crate) mod once;
mod request;
mod retry;
pub(crate) mod run;
mod server;
pub(crate) mod sql;
pub(crate) mod turn;

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!("rowclaim needs at least one of the features postgres, mysql, sqlite");

pub(crate) use inspect::{Inspect, Lookup, Need, Reads};
pub(crate) use request::{
    ClaimArgs, Claimed, Committed, Outcome, Resolved, RowQuery, StoredRow, Target,
};
pub(crate) use retry::{commit, is_transient, pause, retry_transient, MAX_RETRIES};
pub(crate) use server::ServerKind;
pub use server::{Capability, ServerInfo};

/// The catalog role: what the server is and what a table looks like.
#[async_trait::async_trait]
pub(crate) trait Catalog: Send + Sync {
    /// Whether the database is a file with one writer at a time and no network (SQLite): a
    /// statement that takes long waits for the write lock; it always answers in the end.
    fn one_writer(&self) -> bool {
        false
    }
    /// The server and its version.
    async fn server(&self) -> Result<ServerInfo>;
    /// The table's columns; empty when the table does not exist.
    async fn columns(&self, table: &TableName) -> Result<Vec<Column>>;
    /// The table's name as the catalog resolves it (`schema.table`), so that every spelling of one
    /// table (`jobs`, `public.jobs`, `JOBS`) keys the same leases.
    async fn table_key(&self, table: &TableName) -> Result<String>;
    /// Whether `column` alone names one row of the table: its primary key, or a unique index on
    /// that column only (not partial, not on an expression). Every strategy takes and settles
    /// rows by id, so an id two rows share would be taken and settled twice.
    async fn id_unique(&self, table: &TableName, column: &str) -> Result<bool>;
    /// Creates `rowclaim_leases` if it is missing (lease-table strategy).
    async fn ensure_lease_table(&self) -> Result<()>;
    /// Creates `rowclaim_sources`, the source registry, if it is missing.
    async fn ensure_registry(&self) -> Result<()>;
    /// Increments a named counter atomically and returns its new value (1 the first time).
    async fn counter_next(&self, name: &str) -> Result<i64>;
    /// How this database names things, for checking a source against its catalog.
    fn naming(&self) -> Naming;
    /// Runs the source's filter on its table without reading a row (`once::probe_filter`).
    async fn probe_filter(&self, m: &Mapping) -> Result<()>;
}

/// The claim role: taking rows, one function per strategy, all of its SQL in the driver's
/// `claim.rs`.
#[async_trait::async_trait]
pub(crate) trait Claims: Send + Sync {
    /// Takes up to `a.batch` rows with the strategy `a.strategy`.
    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>>;
}

/// The claim store role: everything done to rows a token holds, locking reads, looks at a
/// source's rows and its counts. What every driver runs alike is written once (`once.rs`).
#[async_trait::async_trait]
pub(crate) trait ClaimStore: Send + Sync {
    /// Moves rows a token holds to `outcome`; returns how many changed. With [`Target::Ids`] it
    /// changes all of them or none.
    async fn settle(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        outcome: Outcome,
    ) -> Result<u64>;
    /// Moves each of the named rows that `token` still holds to `outcome`, on its own rather
    /// than all or nothing, in one statement; returns the rows it moved. `None` when the database
    /// or strategy cannot tell which in one statement: the caller then settles all or nothing
    /// and narrows down.
    async fn settle_each(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<RowId>>>;
    /// Pushes the lease of rows a token holds to now + `lease`; returns how many it pushed.
    async fn extend(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        lease: Duration,
    ) -> Result<u64>;
    /// Which of `ids` the token still holds (for naming the lost ones in `LeaseLost`).
    async fn still_held(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        ids: &IdList,
    ) -> Result<Vec<RowId>>;
    /// Within a held transaction: moves `ids` to `outcome` (not yet committed).
    async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<()>;
    /// Within a held transaction: pushes its lease (idle timeout or deadline) to now + `lease`.
    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()>;
    /// Opens a transaction and takes row locks (seed 001's locking reads).
    async fn lock_rows(
        &self,
        m: &Mapping,
        ids: Option<&IdList>,
        limit: Option<u32>,
        mode: LockMode,
        wait: LockWait,
    ) -> Result<(Held, Vec<serde_json::Value>)>;
    /// Counts by status, claims by owner, expired leases (`once::stats`).
    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<Stats>;
    /// Rows that still need a worker: (ready and due or awaiting a retry, claimed, scheduled
    /// for later) (`once::backlog`).
    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64, u64)>;
    /// Rows as stored, in id order, with who holds them and until when (for looking at a
    /// source, not for claiming).
    async fn rows(&self, m: &Mapping, strategy: Strategy, q: &RowQuery) -> Result<Vec<StoredRow>>;
    /// Gives the claimed row `id` back: ready, owner and lease cleared, its entry in
    /// `rowclaim_leases` removed; only while `holder` holds it, when given. A row locked by an
    /// open transaction (a `transaction` claimer of the same table) is [`crate::Error::Locked`]
    /// at once, not waited for. Returns how many rows (or leases) changed.
    async fn release_row(
        &self,
        m: &Mapping,
        strategy: Strategy,
        id: &RowId,
        holder: Option<&str>,
    ) -> Result<u64>;
}

/// One of the databases this build has a driver for: the one door to them is its role
/// accessors ([`Backend::claims`], [`Backend::store`], [`Backend::catalog`],
/// [`Backend::inspect`]; a role written once over [`run::Run`] in a layer above has an
/// accessor of its own there).
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    #[cfg(feature = "postgres")]
    Postgres(postgres::Pg),
    #[cfg(feature = "mysql")]
    MySql(mysql::My),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::Lite),
}

/// An open transaction held by a claim of the transaction strategy, or by locked rows: the
/// driver's own, tagged with its database.
pub(crate) enum Held {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::LiteHeld),
}

impl Held {
    pub(crate) async fn commit(self) -> Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            Held::Postgres(tx) => tx.commit().await.map_err(postgres::error)?,
            #[cfg(feature = "mysql")]
            Held::MySql(tx) => tx.commit().await.map_err(mysql::error)?,
            #[cfg(feature = "sqlite")]
            Held::Sqlite(h) => h.tx.commit().await.map_err(sqlite::error)?,
        }
        Ok(())
    }

    pub(crate) async fn rollback(self) -> Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            Held::Postgres(tx) => tx.rollback().await.map_err(postgres::error)?,
            #[cfg(feature = "mysql")]
            Held::MySql(tx) => tx.rollback().await.map_err(mysql::error)?,
            #[cfg(feature = "sqlite")]
            Held::Sqlite(h) => h.tx.rollback().await.map_err(sqlite::error)?,
        }
        Ok(())
    }
}

#[allow(unreachable_patterns)] // with one driver built, the other arm is unreachable
impl Held {
    /// The PostgreSQL transaction it is.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(&mut self) -> Result<&mut sqlx::Transaction<'static, sqlx::Postgres>> {
        match self {
            Held::Postgres(tx) => Ok(tx),
            _ => Err(not_ours()),
        }
    }

    /// The MySQL/MariaDB transaction it is.
    #[cfg(feature = "mysql")]
    pub(crate) fn mysql(&mut self) -> Result<&mut sqlx::Transaction<'static, sqlx::MySql>> {
        match self {
            Held::MySql(tx) => Ok(tx),
            _ => Err(not_ours()),
        }
    }

    /// The SQLite transaction it is.
    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(&mut self) -> Result<&mut sqlite::LiteHeld> {
        match self {
            Held::Sqlite(h) => Ok(h),
            _ => Err(not_ours()),
        }
    }
}

/// A held transaction handed to another database's driver (a bug).
pub(crate) fn not_ours() -> crate::error::Error {
    crate::error::Error::Internal("a transaction was handed to another database's driver".into())
}

/// `$body` with `$d` bound to whichever driver `$backend` is: for the one accessor of each role.
macro_rules! dispatch {
    ($backend:expr, $d:ident => $body:expr) => {
        match $backend {
            #[cfg(feature = "postgres")]
            $crate::backend::Backend::Postgres($d) => $body,
            #[cfg(feature = "mysql")]
            $crate::backend::Backend::MySql($d) => $body,
            #[cfg(feature = "sqlite")]
            $crate::backend::Backend::Sqlite($d) => $body,
        }
    };
}
pub(crate) use dispatch;

impl Backend {
    /// The claim role.
    pub(crate) fn claims(&self) -> &dyn Claims {
        dispatch!(self, d => d)
    }

    /// The claim store role.
    pub(crate) fn store(&self) -> &dyn ClaimStore {
        dispatch!(self, d => d)
    }

    /// The catalog role.
    pub(crate) fn catalog(&self) -> &dyn Catalog {
        dispatch!(self, d => d)
    }

    /// The inspect role (`rowclaim check`).
    pub(crate) fn inspect(&self) -> &dyn Inspect {
        dispatch!(self, d => d)
    }

    /// Whether the database is SQLite's one-writer file ([`Catalog::one_writer`]).
    pub(crate) fn one_writer(&self) -> bool {
        self.catalog().one_writer()
    }
}
