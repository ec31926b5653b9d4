//! Settings of one queue of the managed queue, kept in `rowclaim_queues` (a row only for queues
//! that have any): whether it is paused, and its limits (see `limits/`). Written once over a driver's [`Run`], since the SQL is
//! the same on every database but for its clock.
//!
//! A pause is honoured in the claim itself (see `claim.rs`: `Jobs::conditions`): a job of a paused queue
//! is never claimed once the pause has committed, whichever worker asks. Jobs a worker claimed
//! ahead before that are given back at its next look at the paused queues (every heartbeat);
//! jobs already running finish.

use std::time::{Instant, SystemTime};

use serde::Serialize;

use super::limits::{self, QueueLimits, Rate, COLUMNS, LIMITED};
use super::migrate::Schema;
use crate::backend::run::{Finish, Run, Transact};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::backend::{dispatch, ClaimArgs};
use crate::db::Db;
use crate::error::Result;
use crate::value::{at_ms, IdList};

/// The settings role: pauses, limits and the limited claim, written once for every database
/// over its driver's [`Run`].
#[async_trait::async_trait]
pub(crate) trait Settings: Send + Sync {
    /// Pauses (`paused`) or resumes `queue`; whether that changed anything.
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<bool>;
    /// The paused queues, by name.
    async fn paused(&self) -> Result<Vec<String>>;
    /// Every queue with settings of its own.
    async fn settings(&self) -> Result<Vec<QueueSettings>>;
    /// Sets `queue`'s limits (all of them).
    async fn set_limits(&self, queue: &str, limits: &QueueLimits) -> Result<()>;
    /// The queues with limits that are not paused.
    async fn limited_queues(&self) -> Result<Vec<String>>;
    /// Claims what the limits of `queue` allow (jobs of `kinds`, all when empty), in a
    /// transaction of its own (SQLite's takes the write lock): the jobs it took, and the
    /// instant their lease runs from at the earliest. `seen`, `own`: see [`limits::claim`]. Their
    /// rows are read by [`Settings::claimed_rows`] once it committed.
    async fn claim_limited(
        &self,
        a: &ClaimArgs<'_>,
        queue: &str,
        kinds: &[String],
        seen: &mut limits::Seen,
        own: &[String],
    ) -> Result<(Option<limits::Taken>, Instant)>;
    /// The rows of the jobs a limited claim took ([`limits::claimed_rows`]).
    async fn claimed_rows(&self, a: &ClaimArgs<'_>, ids: &IdList)
        -> Result<Vec<serde_json::Value>>;
    /// Whether the jobs `ids` a limited claim of `queue` took were given back, unstarted: on a
    /// node that applies other nodes' writes late, because a count after the claim's commit found
    /// a limit crossed ([`limits::gave_back`]). Never elsewhere.
    async fn gave_back_crossed(&self, a: &ClaimArgs<'_>, queue: &str, ids: &IdList)
        -> Result<bool>;
}

#[async_trait::async_trait]
impl<R: Transact + Send + Sync> Settings for R
where
    R::Sql: Schema,
{
    async fn set_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        set_paused(self, queue, paused).await
    }

    async fn paused(&self) -> Result<Vec<String>> {
        paused(self).await
    }

    async fn settings(&self) -> Result<Vec<QueueSettings>> {
        settings_of(self).await
    }

    async fn set_limits(&self, queue: &str, l: &QueueLimits) -> Result<()> {
        set_limits(self, queue, l).await
    }

    async fn limited_queues(&self) -> Result<Vec<String>> {
        limits::limited_queues(self).await
    }

    async fn claim_limited(
        &self,
        a: &ClaimArgs<'_>,
        queue: &str,
        kinds: &[String],
        seen: &mut limits::Seen,
        own: &[String],
    ) -> Result<(Option<limits::Taken>, Instant)> {
        let asked = Instant::now();
        let wait_for_others = self.applies_others_late().await?;
        let tx = self.transaction(false).await?;
        // The mark sets the lease by the database's clock after BEGIN. On SQLite BEGIN took
        // the write lock, which may have been a long wait: the lease runs from no earlier
        // than now, not from before that wait. (Elsewhere BEGIN waits for nothing.)
        let from = if R::Sql::ONE_WRITER {
            Instant::now()
        } else {
            asked
        };
        let taken = limits::claim(&tx, a, queue, kinds, wait_for_others, seen, own).await?;
        tx.commit().await?;
        Ok((taken, from))
    }

    async fn claimed_rows(
        &self,
        a: &ClaimArgs<'_>,
        ids: &IdList,
    ) -> Result<Vec<serde_json::Value>> {
        limits::claimed_rows(self, a, ids).await
    }

    async fn gave_back_crossed(
        &self,
        a: &ClaimArgs<'_>,
        queue: &str,
        ids: &IdList,
    ) -> Result<bool> {
        if !self.applies_others_late().await? {
            return Ok(false);
        }
        limits::gave_back(self, a, queue, ids).await
    }
}

/// The settings role of `db`'s driver: the one door to it.
pub(crate) fn settings(db: &Db) -> &dyn Settings {
    dispatch!(&db.backend, d => d)
}

/// One queue's settings, from [`crate::Queue::settings`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct QueueSettings {
    /// The queue.
    pub name: String,
    /// Since when it is paused (by the database's clock), if it is.
    #[serde(serialize_with = "super::record::rfc3339_opt")]
    pub paused_at: Option<SystemTime>,
    /// Its limits.
    pub limits: QueueLimits,
}

/// Pauses (`paused`) or resumes `queue`; returns whether that changed anything (false: it was
/// paused, or running, already).
async fn set_paused<R: Run + ?Sized>(r: &R, queue: &str, paused: bool) -> Result<bool> {
    let now = R::Sql::NOW;
    if paused {
        // A row for the queue first, then the pause: two statements whose counts mean the
        // same on every database.
        ensure_row(r, queue).await?;
    }
    let mut b = Binder::<R::Sql>::new();
    let name = b.bind(queue.to_owned());
    let sql = if paused {
        format!(
            "UPDATE rowclaim_queues SET paused_at = {now} WHERE name = {name} \
             AND paused_at IS NULL"
        )
    } else {
        format!(
            "UPDATE rowclaim_queues SET paused_at = NULL WHERE name = {name} \
             AND paused_at IS NOT NULL"
        )
    };
    Ok(r.execute(Stmt::new(sql, b)).await? > 0)
}

/// Makes sure `queue` has a row in `rowclaim_queues` (one that exists is kept as it is).
pub(crate) async fn ensure_row<R: Run + ?Sized>(r: &R, queue: &str) -> Result<()> {
    let mut b = Binder::<R::Sql>::new();
    let name = b.bind(queue.to_owned());
    let sql = format!(
        "INSERT INTO rowclaim_queues (name) VALUES ({name}) {}",
        R::Sql::keep_existing("name")
    );
    r.execute(Stmt::new(sql, b)).await?;
    Ok(())
}

/// The paused queues, by name.
async fn paused<R: Run + ?Sized>(r: &R) -> Result<Vec<String>> {
    let sql = "SELECT name FROM rowclaim_queues WHERE paused_at IS NOT NULL ORDER BY name";
    r.texts(Stmt::new(sql.to_owned(), Binder::new())).await
}

/// Every queue with settings of its own (paused, or limited), by name.
async fn settings_of<R: Run + ?Sized>(r: &R) -> Result<Vec<QueueSettings>> {
    let sql = format!(
        "SELECT name, {}, {COLUMNS} FROM rowclaim_queues WHERE paused_at IS NOT NULL \
         OR {LIMITED} ORDER BY name",
        R::Sql::epoch_ms("paused_at")
    );
    let rows = r.named_numbers(Stmt::new(sql, Binder::new()), 7).await?;
    Ok(rows
        .into_iter()
        .map(|(name, columns)| QueueSettings {
            name,
            paused_at: columns.first().copied().flatten().map(at_ms),
            limits: QueueLimits::from_columns(columns.get(1..).unwrap_or_default()),
        })
        .collect())
}

/// Sets `queue`'s limits (all of them: a limit not given is lifted).
async fn set_limits<R: Run + ?Sized>(r: &R, queue: &str, l: &QueueLimits) -> Result<()> {
    ensure_row(r, queue).await?;
    let mut b = Binder::<R::Sql>::new();
    let num = |b: &mut Binder<R::Sql>, v: Option<u32>| b.bind(v.map(i64::from));
    let period = |b: &mut Binder<R::Sql>, r: Option<Rate>| b.bind(r.map(|r| r.period_ms()));
    let sql = format!(
        "UPDATE rowclaim_queues SET concurrency = {}, key_concurrency = {}, rate = {}, \
         rate_period_ms = {}, key_rate = {}, key_rate_period_ms = {} WHERE name = {}",
        num(&mut b, l.concurrency),
        num(&mut b, l.key_concurrency),
        num(&mut b, l.rate.map(|r| r.jobs)),
        period(&mut b, l.rate),
        num(&mut b, l.key_rate.map(|r| r.jobs)),
        period(&mut b, l.key_rate),
        b.bind(queue.to_owned()),
    );
    r.execute(Stmt::new(sql, b)).await?;
    Ok(())
}
