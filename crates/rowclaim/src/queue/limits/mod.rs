//! Limits of one queue, enforced in the database so that they hold across every worker on every
//! machine: how many of its jobs run at once, how many with one limit key run at once (1: one
//! after another, in enqueue order), and how many start per period, in the queue and per key.
//!
//! A queue's limits live in its `rowclaim_queues` row. The ordinary claim leaves the jobs of a
//! limited queue alone (`claim.rs`: `Jobs::conditions`); they are claimed here instead, one
//! queue at a time, by [`claim`]: in a transaction that first writes the queue's row
//! (`claim_turns`), so that limited claims of one queue take turns on its row lock, every
//! database alike (and on Galera two nodes' turns conflict at certification, and one is
//! retried). Under that lock it counts what runs and what started, picks what the limits allow
//! (`pick.rs`; on PostgreSQL with what the claimer saw of the lines before, [`Seen`]), marks
//! it claimed and, for a rate, records the starts in `rowclaim_starts`. The claimed rows are
//! read once the transaction committed ([`claimed_rows`]), with the lock let go; on a Galera
//! node only after a count made after the commit agrees (`recount.rs`: the turns there do not
//! always keep two nodes' claims apart). Each claim's statements are written once, here, over a
//! driver's [`Run`].
//!
//! What counts as running: jobs claimed whose lease has not run out (a job whose holder died
//! holds its place until its lease runs out; then it is taken again first, or on PostgreSQL
//! under a key concurrency without a key rate after the ready jobs ahead of it in its line,
//! such as a retry, which a dead worker's run must not pass). What counts as
//! started: each claim of a job, by the database's clock, the same instant its `attempted_at`
//! records.

mod claiming;
mod lines;
mod pick;
mod recount;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::run::Run;
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::{Error, Result};
pub(crate) use claiming::{claim, claimed_rows, Seen, Taken};
#[cfg(test)]
pub(crate) use claiming::{
    claimed_sql, mark_returning_sql, mark_sql, prune_starts_sql, read_sql, starts_sql, turn_sql,
    waiting_sql,
};
pub(crate) use lines::{heads_sql, keyless_sql, runs_sql};
pub(crate) use pick::pick_ids_sql;
pub(crate) use recount::gave_back;

/// The limits of one queue. Set with [`crate::Queue::limit`]; none by default.
///
/// ```
/// use rowclaim::{QueueLimits, Rate};
/// use std::time::Duration;
/// // At most 10 jobs at once, one per customer at a time, 100 starts a minute.
/// let limits = QueueLimits::default()
///     .concurrency(10)
///     .key_concurrency(1)
///     .rate(Rate::new(100, Duration::from_secs(60)));
/// assert!(!limits.is_none());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueLimits {
    /// At most this many of the queue's jobs run at once, across all workers.
    pub concurrency: Option<u32>,
    /// At most this many jobs with one limit key ([`crate::NewJob::limit_key`]) run at once,
    /// started in enqueue order; 1 runs each key's jobs one after another.
    pub key_concurrency: Option<u32>,
    /// At most this many of the queue's jobs start per period.
    pub rate: Option<Rate>,
    /// At most this many jobs with one limit key start per period.
    pub key_rate: Option<Rate>,
}

/// So many job starts per period (a sliding window: any period-long stretch holds at most
/// `jobs` starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Rate {
    /// Starts allowed per period.
    pub jobs: u32,
    /// The period.
    #[serde(with = "period_ms")]
    pub per: Duration,
}

mod period_ms {
    use super::Duration;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// The longest rate period: starts are kept this long at most.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(7 * 24 * 3600);

impl Rate {
    /// `jobs` starts per `per`.
    pub fn new(jobs: u32, per: Duration) -> Rate {
        Rate { jobs, per }
    }

    fn check(&self, what: &str) -> Result<()> {
        if self.jobs == 0 {
            return Err(Error::InvalidInput(format!(
                "{what} must allow at least 1 job per period (pause the queue to start none)"
            )));
        }
        if self.per < Duration::from_millis(1) || self.per > MAX_RATE_PERIOD {
            return Err(Error::InvalidInput(format!(
                "{what}'s period must be from 1ms to 7 days, not {:?}",
                self.per
            )));
        }
        Ok(())
    }

    pub(crate) fn period_ms(&self) -> i64 {
        i64::try_from(self.per.as_millis()).unwrap_or(i64::MAX)
    }
}

impl QueueLimits {
    /// At most `n` of the queue's jobs at once.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// At most `n` jobs with one limit key at once (1: one after another, in enqueue order).
    pub fn key_concurrency(mut self, n: u32) -> Self {
        self.key_concurrency = Some(n);
        self
    }

    /// At most `rate.jobs` of the queue's jobs start per `rate.per`.
    pub fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// At most `rate.jobs` jobs with one limit key start per `rate.per`.
    pub fn key_rate(mut self, rate: Rate) -> Self {
        self.key_rate = Some(rate);
        self
    }

    /// No limit at all.
    pub fn is_none(&self) -> bool {
        *self == QueueLimits::default()
    }

    pub(crate) fn check(&self) -> Result<()> {
        for (n, what) in [
            (self.concurrency, "concurrency"),
            (self.key_concurrency, "per-key concurrency"),
        ] {
            if n == Some(0) {
                return Err(Error::InvalidInput(format!(
                    "{what} must be at least 1 (pause the queue to run none)"
                )));
            }
        }
        if let Some(r) = &self.rate {
            r.check("rate")?;
        }
        if let Some(r) = &self.key_rate {
            r.check("per-key rate")?;
        }
        Ok(())
    }

    /// From the columns as [`COLUMNS`] lists them.
    pub(crate) fn from_columns(c: &[Option<i64>]) -> QueueLimits {
        let n = |i: usize| {
            c.get(i)
                .copied()
                .flatten()
                .and_then(|v| u32::try_from(v).ok())
        };
        let rate = |i: usize| {
            Some(Rate::new(
                n(i)?,
                Duration::from_millis(u64::try_from(c.get(i + 1).copied().flatten()?).ok()?),
            ))
        };
        QueueLimits {
            concurrency: n(0),
            key_concurrency: n(1),
            rate: rate(2),
            key_rate: rate(4),
        }
    }

    /// How many of a claim's `batch` the queue's own limits leave room for, with `running` of
    /// its jobs running and `started` started within its rate period.
    fn room(&self, batch: i64, running: i64, started: i64) -> i64 {
        let mut room = batch;
        if let Some(max) = self.concurrency {
            room = room.min(i64::from(max) - running);
        }
        if let Some(rate) = self.rate {
            room = room.min(i64::from(rate.jobs) - started);
        }
        room
    }

    /// Whether at most the first job of a key's line may start at once (per-key limits of 1,
    /// or none).
    fn first_only(&self) -> bool {
        self.key_concurrency.is_none_or(|n| n == 1) && self.key_rate.is_none_or(|r| r.jobs == 1)
    }

    /// Whether a claim checks job by job, in claim order, which may start (`pick::arms_sql`):
    /// where only the first of a line may, and, where the database reads the limit index key
    /// by key ([`Dialect::SKIP_SCAN`]), under any per-key concurrency without a per-key rate.
    /// Otherwise every line is numbered (`pick::lines_sql`).
    fn by_arms<D: Dialect>(&self) -> bool {
        self.first_only() || (D::SKIP_SCAN && self.key_rate.is_none())
    }

    /// Whether a claim looks at the first [`WINDOW`] ready jobs in its order only, and further
    /// back key by key ([`heads_sql`]) when they leave room: under per-key limits, picked job by
    /// job, where the database reads the limit index key by key.
    fn looks_further<D: Dialect>(&self) -> bool {
        D::SKIP_SCAN && self.per_key() && self.by_arms::<D>()
    }

    /// How many of a key's line may start at once where jobs are picked job by job
    /// ([`QueueLimits::by_arms`]): its first `n`.
    fn line_front(&self) -> i64 {
        match self.key_rate {
            Some(_) => 1,
            None => i64::from(self.key_concurrency.unwrap_or(1)),
        }
    }

    /// How many of a key's jobs run at once where a claim may take more of the key's line than
    /// that, for the worker that took them to run one after another (a
    /// [`Line`](crate::claim::Line)): under a per-key concurrency without rates and without a
    /// concurrency of the queue's own. (A rate counts each start when its job is claimed: a job
    /// claimed ahead would start later than counted. A run's jobs waiting in a worker count as
    /// running against the queue's concurrency, and would leave it room for less than it allows.)
    /// Ten keys one at a time then run about as fast as an unlimited queue, not one job per key
    /// per round trip of a result and a claim.
    pub(crate) fn line_width(&self) -> Option<u32> {
        match (self.concurrency, self.rate, self.key_rate) {
            (None, None, None) => self.key_concurrency,
            _ => None,
        }
    }

    /// Whether a key's jobs have limits of their own.
    fn per_key(&self) -> bool {
        self.key_concurrency.is_some() || self.key_rate.is_some()
    }

    /// The longest of its rate periods, in milliseconds: how long starts must be kept.
    pub(crate) fn longest_period_ms(&self) -> Option<i64> {
        [self.rate, self.key_rate]
            .iter()
            .flatten()
            .map(Rate::period_ms)
            .max()
    }
}

/// A queue's limit columns in `rowclaim_queues`, in the order [`QueueLimits::from_columns`]
/// reads them.
pub(crate) const COLUMNS: &str =
    "concurrency, key_concurrency, rate, rate_period_ms, key_rate, key_rate_period_ms";

/// "This queue has a limit", over a `rowclaim_queues` row.
pub(crate) const LIMITED: &str = "(concurrency IS NOT NULL OR key_concurrency IS NOT NULL \
     OR rate IS NOT NULL OR key_rate IS NOT NULL)";

/// The queues with limits that are not paused, by name: those [`claim`] serves.
pub(crate) async fn limited_queues<R: Run + ?Sized>(r: &R) -> Result<Vec<String>> {
    let sql = format!(
        "SELECT name FROM rowclaim_queues WHERE paused_at IS NULL AND {LIMITED} ORDER BY name"
    );
    r.texts(Stmt::new(sql, Binder::new())).await
}

/// The job statuses a limited claim reads (checked literals, as everywhere).
const READY: &str = "'ready'";
const RUNNING: &str = "'running'";
