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

use crate::mapping::{Column, Mapping, Naming, TableName};
use crate::value::IdList;
use crate::{LockMode, LockWait, Result, RowId, Stats, Strategy};

mod inspect;
mod request;
mod retry;
pub(crate) mod run;
mod server;
pub(crate) mod sql;

#[cfg(test)]
mod snapshots;

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
    ClaimArgs, Claimed, Outcome, Position, Resolved, RowQuery, StoredRow, Target,
};
pub(crate) use retry::{commit, enqueue_what, is_transient, pause, retry_transient, MAX_RETRIES};
pub(crate) use server::ServerKind;
pub use server::{Capability, ServerInfo};

/// The catalog role: what the server is and what a table looks like.
pub(crate) trait Catalog {
    /// The server and its version.
    async fn server(&self) -> Result<ServerInfo>;
    /// The table's columns; empty when the table does not exist.
    async fn columns(&self, table: &TableName) -> Result<Vec<Column>>;
    /// The table's name as the catalog resolves it (`schema.table`), so that every spelling of one
    /// table (`jobs`, `public.jobs`, `JOBS`) keys the same leases.
    async fn table_key(&self, table: &TableName) -> Result<String>;
    /// Creates `rowclaim_leases` if it is missing (lease-table strategy).
    async fn ensure_lease_table(&self) -> Result<()>;
    /// Creates `rowclaim_sources`, the source registry, if it is missing.
    async fn ensure_registry(&self) -> Result<()>;
    /// Increments a named counter atomically and returns its new value (1 the first time).
    async fn counter_next(&self, name: &str) -> Result<i64>;
}

/// The claim store role: taking rows, and everything done to rows a token holds. The reports
/// are written once for every driver (`run::stats`, `run::backlog`), over the driver's
/// [`run::Run`].
pub(crate) trait ClaimStore: run::Run {
    /// An open transaction holding row locks (the transaction strategy, locking reads).
    type Held;
    /// Takes up to `batch` rows.
    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Self::Held>>;
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
        held: &mut Self::Held,
        m: &Mapping,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<()>;
    /// Within a held transaction: pushes its lease (idle timeout or deadline) to now + `lease`.
    async fn held_extend(&self, held: &mut Self::Held, lease: Duration) -> Result<()>;
    /// Ends a held transaction: commits it, or rolls it back.
    async fn held_end(held: Self::Held, commit: bool) -> Result<()>;
    /// Opens a transaction and takes row locks (seed 001's locking reads).
    async fn lock_rows(
        &self,
        m: &Mapping,
        ids: Option<&IdList>,
        limit: Option<u32>,
        mode: LockMode,
        wait: LockWait,
    ) -> Result<(Self::Held, Vec<serde_json::Value>)>;
    /// Counts by status, claims by owner, expired leases.
    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<Stats> {
        run::stats(self, m, strategy).await
    }
    /// Rows that still need a worker: (ready and due or awaiting a retry, claimed).
    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64, u64)> {
        run::backlog(self, m).await
    }
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

/// One of the databases this build has a driver for.
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
    Postgres(<postgres::Pg as ClaimStore>::Held),
    #[cfg(feature = "mysql")]
    MySql(<mysql::My as ClaimStore>::Held),
    #[cfg(feature = "sqlite")]
    Sqlite(<sqlite::Lite as ClaimStore>::Held),
}

impl Held {
    pub(crate) async fn commit(self) -> Result<()> {
        self.end(true).await
    }

    pub(crate) async fn rollback(self) -> Result<()> {
        self.end(false).await
    }

    async fn end(self, commit: bool) -> Result<()> {
        match self {
            #[cfg(feature = "postgres")]
            Held::Postgres(h) => postgres::Pg::held_end(h, commit).await,
            #[cfg(feature = "mysql")]
            Held::MySql(h) => mysql::My::held_end(h, commit).await,
            #[cfg(feature = "sqlite")]
            Held::Sqlite(h) => sqlite::Lite::held_end(h, commit).await,
        }
    }
}

/// Calls the same method on whichever driver `$self` is.
macro_rules! dispatch {
    ($self:expr, $d:ident => $call:expr) => {
        match $self {
            #[cfg(feature = "postgres")]
            $crate::backend::Backend::Postgres($d) => $call,
            #[cfg(feature = "mysql")]
            $crate::backend::Backend::MySql($d) => $call,
            #[cfg(feature = "sqlite")]
            $crate::backend::Backend::Sqlite($d) => $call,
        }
    };
}
pub(crate) use dispatch;

/// Calls a held-transaction method on the driver that opened `$held`.
macro_rules! dispatch_held {
    ($self:expr, $held:expr, $d:ident, $h:ident => $call:expr) => {
        #[allow(unreachable_patterns)]
        match ($self, $held) {
            #[cfg(feature = "postgres")]
            (Backend::Postgres($d), Held::Postgres($h)) => $call,
            #[cfg(feature = "mysql")]
            (Backend::MySql($d), Held::MySql($h)) => $call,
            #[cfg(feature = "sqlite")]
            (Backend::Sqlite($d), Held::Sqlite($h)) => $call,
            _ => Err(crate::Error::Internal(
                "a transaction was handed to another database's driver".into(),
            )),
        }
    };
}

/// Sorts a server's error into what it means to rowclaim: each driver knows its own codes.
pub(crate) fn classify(e: &dyn sqlx::error::DatabaseError) -> Option<crate::error::DbKind> {
    #[cfg(feature = "postgres")]
    if let Some(kind) = postgres::classify(e) {
        return Some(kind);
    }
    #[cfg(feature = "mysql")]
    if let Some(kind) = mysql::classify(e) {
        return Some(kind);
    }
    #[cfg(feature = "sqlite")]
    if let Some(kind) = sqlite::classify(e) {
        return Some(kind);
    }
    None
}

/// A server's error in one line with its own code, as its driver words it.
pub(crate) fn describe(e: &dyn sqlx::error::DatabaseError) -> Option<String> {
    #[cfg(feature = "postgres")]
    if let Some(text) = postgres::describe(e) {
        return Some(text);
    }
    #[cfg(feature = "mysql")]
    if let Some(text) = mysql::describe(e) {
        return Some(text);
    }
    #[cfg(feature = "sqlite")]
    if let Some(text) = sqlite::describe(e) {
        return Some(text);
    }
    None
}

impl Backend {
    /// How this database names things, for checking a source against its catalog.
    pub(crate) fn naming(&self) -> Naming {
        dispatch!(self, d => run::naming(d))
    }

    pub(crate) async fn server(&self) -> Result<ServerInfo> {
        dispatch!(self, d => d.server().await)
    }
    pub(crate) async fn columns(&self, t: &TableName) -> Result<Vec<Column>> {
        dispatch!(self, d => d.columns(t).await)
    }
    pub(crate) async fn table_key(&self, t: &TableName) -> Result<String> {
        dispatch!(self, d => d.table_key(t).await)
    }
    pub(crate) async fn ensure_lease_table(&self) -> Result<()> {
        dispatch!(self, d => d.ensure_lease_table().await)
    }
    pub(crate) async fn ensure_registry(&self) -> Result<()> {
        dispatch!(self, d => d.ensure_registry().await)
    }
    pub(crate) async fn counter_next(&self, name: &str) -> Result<i64> {
        dispatch!(self, d => d.counter_next(name).await)
    }

    pub(crate) async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(d) => Ok(d.claim(a).await?.map_held(Held::Postgres)),
            #[cfg(feature = "mysql")]
            Backend::MySql(d) => Ok(d.claim(a).await?.map_held(Held::MySql)),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(d) => Ok(d.claim(a).await?.map_held(Held::Sqlite)),
        }
    }
    pub(crate) async fn settle(
        &self,
        m: &Mapping,
        s: Strategy,
        token: &str,
        target: Target<'_>,
        outcome: Outcome,
    ) -> Result<u64> {
        dispatch!(self, d => d.settle(m, s, token, target, outcome).await)
    }
    pub(crate) async fn settle_each(
        &self,
        m: &Mapping,
        s: Strategy,
        token: &str,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<RowId>>> {
        dispatch!(self, d => d.settle_each(m, s, token, ids, outcome).await)
    }
    pub(crate) async fn extend(
        &self,
        m: &Mapping,
        s: Strategy,
        token: &str,
        target: Target<'_>,
        lease: Duration,
    ) -> Result<u64> {
        dispatch!(self, d => d.extend(m, s, token, target, lease).await)
    }
    pub(crate) async fn still_held(
        &self,
        m: &Mapping,
        s: Strategy,
        token: &str,
        ids: &IdList,
    ) -> Result<Vec<RowId>> {
        dispatch!(self, d => d.still_held(m, s, token, ids).await)
    }
    pub(crate) async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<()> {
        dispatch_held!(self, held, d, h => d.held_settle(h, m, ids, outcome).await)
    }
    pub(crate) async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        dispatch_held!(self, held, d, h => d.held_extend(h, lease).await)
    }
    pub(crate) async fn lock_rows(
        &self,
        m: &Mapping,
        ids: Option<&IdList>,
        limit: Option<u32>,
        mode: LockMode,
        wait: LockWait,
    ) -> Result<(Held, Vec<serde_json::Value>)> {
        match self {
            #[cfg(feature = "postgres")]
            Backend::Postgres(d) => {
                let (h, rows) = d.lock_rows(m, ids, limit, mode, wait).await?;
                Ok((Held::Postgres(h), rows))
            }
            #[cfg(feature = "mysql")]
            Backend::MySql(d) => {
                let (h, rows) = d.lock_rows(m, ids, limit, mode, wait).await?;
                Ok((Held::MySql(h), rows))
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(d) => {
                let (h, rows) = d.lock_rows(m, ids, limit, mode, wait).await?;
                Ok((Held::Sqlite(h), rows))
            }
        }
    }
    pub(crate) async fn stats(&self, m: &Mapping, s: Strategy) -> Result<Stats> {
        dispatch!(self, d => d.stats(m, s).await)
    }
    pub(crate) async fn backlog(&self, m: &Mapping) -> Result<(u64, u64, u64)> {
        dispatch!(self, d => d.backlog(m).await)
    }
    pub(crate) async fn rows(
        &self,
        m: &Mapping,
        s: Strategy,
        q: &RowQuery,
    ) -> Result<Vec<StoredRow>> {
        dispatch!(self, d => d.rows(m, s, q).await)
    }
    pub(crate) async fn release_row(
        &self,
        m: &Mapping,
        s: Strategy,
        id: &RowId,
        holder: Option<&str>,
    ) -> Result<u64> {
        dispatch!(self, d => d.release_row(m, s, id, holder).await)
    }
}
