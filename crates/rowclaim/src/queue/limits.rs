//! Limits of one queue, enforced in the database so that they hold across every worker on every
//! machine: how many of its jobs run at once, how many with one limit key run at once (1: one
//! after another, in enqueue order), and how many start per period, in the queue and per key.
//!
//! A queue's limits live in its `rowclaim_queues` row. The ordinary claim leaves the jobs of a
//! limited queue alone (`claim.rs`: `Jobs::conditions`); they are claimed here instead, one queue at a
//! time, by [`claim`]: in a transaction that first writes the queue's row (`claim_turns`), so
//! that limited claims of one queue take turns on its row lock, every database alike (and on
//! Galera two nodes' turns conflict at certification, and one is retried). Under that lock it
//! counts what runs and what started, picks what the limits allow, marks it claimed and, for a
//! rate, records the starts in `rowclaim_starts`. Each claim's statements are written once, here,
//! over a driver's [`Run`] in its transaction.
//!
//! What counts as running: jobs claimed whose lease has not run out (a job whose holder died
//! holds its place until its lease runs out; then it is taken again first). What counts as
//! started: each claim of a job, by the database's clock, the same instant its `attempted_at`
//! records.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::run::Run;
use crate::backend::sql::{self, Binder, Dialect, Stmt};
use crate::backend::ClaimArgs;
use crate::error::{Error, Result};
use crate::value::IdList;

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

    /// Whether a claim checks job by job, in claim order, which may start ([`arms_sql`]):
    /// where only the first of a line may, and, where the database reads the limit index key
    /// by key ([`Dialect::SKIP_SCAN`]), under any per-key concurrency without a per-key rate.
    /// Otherwise every line is numbered ([`lines_sql`]).
    fn by_arms<D: Dialect>(&self) -> bool {
        self.first_only() || (D::SKIP_SCAN && self.key_rate.is_none())
    }

    /// How many of a key's line may start at once: its first `n`.
    fn line_front(&self) -> i64 {
        match self.key_rate {
            Some(_) => 1,
            None => i64::from(self.key_concurrency.unwrap_or(1)),
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

/// Claims up to `a.batch` jobs of the limited queue `queue` (of `kinds`, all when empty) that
/// its limits allow, in the transaction `tx` (the caller commits it): rows as JSON, as any claim
/// returns them. None when the queue is paused or no longer limited (the ordinary claim serves
/// it then).
pub(crate) async fn claim<R: Run + ?Sized>(
    tx: &R,
    a: &ClaimArgs<'_>,
    queue: &str,
    kinds: &[String],
) -> Result<Vec<serde_json::Value>> {
    // The queue's turn: its row lock, held to the end of the transaction.
    if tx.execute(turn_sql(queue)).await? == 0 {
        return Ok(vec![]);
    }
    let Some((_, columns)) = tx.named_numbers(read_sql(queue), 8).await?.pop() else {
        return Ok(vec![]);
    };
    let limits = QueueLimits::from_columns(&columns);
    let count = |i: usize| columns.get(i).copied().flatten().unwrap_or(0);
    let room = limits.room(i64::from(a.batch), count(6), count(7));
    if room <= 0 {
        return Ok(vec![]);
    }
    let mut picked = tx.texts(pick_ids_sql(queue, kinds, &limits, room)).await?;
    if R::Sql::SKIP_SCAN
        && limits.by_arms::<R::Sql>()
        && limits.per_key()
        && (picked.len() as i64) * 2 < room
    {
        // The claim order's first jobs left most of the room: the first of lines further back.
        let heads = tx.texts(heads_sql(queue, kinds, &limits, room)).await?;
        for id in heads {
            if (picked.len() as i64) < room && !picked.contains(&id) {
                picked.push(id);
            }
        }
    }
    if picked.is_empty() {
        return Ok(vec![]);
    }
    let ids = IdList::new(a.m.id_kind, &a.m.parse_ids(&picked)?)?;
    tx.execute(mark_sql(a, &ids)).await?;
    if let Some(keep_ms) = limits.longest_period_ms() {
        tx.execute(starts_sql(a, &ids)).await?;
        tx.execute(prune_starts_sql(queue, keep_ms)).await?;
    }
    tx.texts(claimed_sql(a, &ids))
        .await?
        .iter()
        .map(|t| sql::parse_row(t))
        .collect()
}

/// The queue's turn: a write of its row, whose lock the claim's transaction holds to its end,
/// so that limited claims of one queue take turns. Nothing when it is paused or no longer
/// limited.
pub(crate) fn turn_sql<D: Dialect>(queue: &str) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "UPDATE rowclaim_queues SET claim_turns = claim_turns + 1 WHERE name = {} \
         AND paused_at IS NULL AND {LIMITED}",
        b.bind(queue.to_owned())
    );
    Stmt::new(sql, b)
}

/// The queue's limits, what runs and what started within its rate period, in one read. (A count
/// a limit does not need is not made.)
pub(crate) fn read_sql<D: Dialect>(queue: &str) -> Stmt<D> {
    let (now, now_ms) = (D::NOW, D::epoch_ms(D::NOW));
    let mut b = Binder::<D>::new();
    let sql = format!(
        "SELECT name, {COLUMNS}, \
         CASE WHEN concurrency IS NULL THEN 0 ELSE (SELECT COUNT(*) FROM rowclaim_jobs j \
           WHERE j.queue = q.name AND j.status = {RUNNING} AND j.lease_until >= {now}) END, \
         CASE WHEN rate IS NULL THEN 0 ELSE (SELECT COUNT(*) FROM rowclaim_starts s \
           WHERE s.queue = q.name AND s.started_ms >= {now_ms} - q.rate_period_ms) END \
         FROM rowclaim_queues q WHERE name = {}",
        b.bind(queue.to_owned())
    );
    Stmt::new(sql, b)
}

/// The ids (as text) of up to `take` jobs the queue's per-key limits let start now.
pub(crate) fn pick_ids_sql<D: Dialect>(
    queue: &str,
    kinds: &[String],
    limits: &QueueLimits,
    take: i64,
) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "SELECT CAST(id AS {}) FROM ({}) AS p",
        D::TEXT,
        pick_sql(&mut b, queue, kinds, limits, take)
    );
    Stmt::new(sql, b)
}

/// Ready jobs a claim looks at in its order before the first of lines further back are
/// sought ([`heads_sql`]): a claim reads at most this many jobs of busy keys.
const WINDOW: i64 = 1000;

/// The ids (as text) of up to `take` jobs at the front of their key's line that may start
/// (see [`pick_sql`]), in claim order: each key's line is found through the limit index, key
/// after key, and its front looked up (its first job; its first `n` under a per-key concurrency
/// of `n`), so that the claim reads as many index entries as there are keys with ready jobs,
/// however deep their lines. PostgreSQL only ([`Dialect::SKIP_SCAN`]; it reads each front
/// through `LATERAL`).
pub(crate) fn heads_sql<D: Dialect>(
    queue: &str,
    kinds: &[String],
    limits: &QueueLimits,
    take: i64,
) -> Stmt<D> {
    let now = D::NOW;
    let mut b = Binder::<D>::new();
    let q1 = b.bind(queue.to_owned());
    let q2 = b.bind(queue.to_owned());
    let q3 = b.bind(queue.to_owned());
    let front = b.bind(limits.line_front());
    let kinds = kinds_cond(&mut b, kinds, "j.");
    let line = FirstOfLine { queue, limits };
    let blocked = line.blocked(&mut b, Arm::Ready).join(" OR ");
    let sql = format!(
        "WITH RECURSIVE rowclaim_keys (k) AS (\
         SELECT MIN(limit_key) FROM rowclaim_jobs WHERE queue = {q1} AND status = {READY} \
         AND limit_key IS NOT NULL \
         UNION ALL SELECT (SELECT MIN(o.limit_key) FROM rowclaim_jobs AS o WHERE o.queue = {q2} \
         AND o.status = {READY} AND o.limit_key > rowclaim_keys.k) \
         FROM rowclaim_keys WHERE rowclaim_keys.k IS NOT NULL) \
         SELECT CAST(j.id AS {}) FROM rowclaim_keys CROSS JOIN LATERAL \
         (SELECT h.id FROM rowclaim_jobs AS h WHERE h.queue = {q3} \
         AND h.status = {READY} AND h.limit_key = rowclaim_keys.k \
         AND (h.run_at <= {now} OR h.attempts > 0) ORDER BY h.id LIMIT {front}) AS rowclaim_front \
         JOIN rowclaim_jobs AS j ON j.id = rowclaim_front.id \
         WHERE j.run_at <= {now}{kinds} AND NOT ({blocked}) \
         ORDER BY j.priority DESC, j.run_at, j.id LIMIT {}",
        D::TEXT,
        b.bind(take)
    );
    Stmt::new(sql, b)
}

/// Marks the picked jobs ours. The status is checked again: a job may have been cancelled since.
pub(crate) fn mark_sql<D: Dialect>(a: &ClaimArgs<'_>, ids: &IdList) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let set = sql::claim_set(a.m, &mut b, a.token, a.lease);
    let sql = format!(
        "UPDATE rowclaim_jobs SET {set} WHERE {} AND (status = {READY} \
         OR (status = {RUNNING} AND lease_until < {}))",
        D::id_in(&mut b, "id", ids),
        D::NOW
    );
    Stmt::new(sql, b)
}

/// "The jobs `ids` the claim's token holds now".
fn claimed_by<D: Dialect>(b: &mut Binder<D>, a: &ClaimArgs<'_>, ids: &IdList) -> String {
    format!(
        "{} AND owner = {} AND status = {RUNNING}",
        D::id_in(b, "id", ids),
        b.bind(a.token.to_owned())
    )
}

/// Records the claim's starts, for rate limits (by the database's clock).
pub(crate) fn starts_sql<D: Dialect>(a: &ClaimArgs<'_>, ids: &IdList) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "INSERT INTO rowclaim_starts (queue, limit_key, started_ms) \
         SELECT queue, limit_key, {} FROM rowclaim_jobs WHERE {}",
        D::epoch_ms(D::NOW),
        claimed_by(&mut b, a, ids)
    );
    Stmt::new(sql, b)
}

/// Forgets the queue's starts older than its longest rate period.
pub(crate) fn prune_starts_sql<D: Dialect>(queue: &str, keep_ms: i64) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "DELETE FROM rowclaim_starts WHERE queue = {} AND started_ms < {} - {}",
        b.bind(queue.to_owned()),
        D::epoch_ms(D::NOW),
        b.bind(keep_ms)
    );
    Stmt::new(sql, b)
}

/// The jobs the claim took, as JSON text, in the claim order.
pub(crate) fn claimed_sql<D: Dialect>(a: &ClaimArgs<'_>, ids: &IdList) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "SELECT CAST({} AS {}) FROM rowclaim_jobs AS t WHERE {} \
         ORDER BY priority DESC, run_at, id",
        D::row_json(a.m),
        D::TEXT,
        claimed_by(&mut b, a, ids)
    );
    Stmt::new(sql, b)
}

/// The ids of up to `take` jobs of `queue` that its per-key limits allow to start now, in claim
/// order (jobs whose lease ran out first, then by priority, run-at, id).
///
/// Within one key, jobs line up in enqueue order, jobs whose lease ran out ahead: the `n`th of
/// a key's line may start while fewer than `limit − n + 1` of the key's jobs run (or started
/// within the rate's period). The line holds the key's pending work: ready jobs that are due or
/// wait for a retry (so that a failed job keeps its place), and jobs whose lease ran out. A job
/// scheduled for later that never ran is not in line until its time comes.
///
/// Where at most the first of a line can start (per-key limits of 1, the common "one at a time
/// per key"), and on PostgreSQL under any per-key concurrency without a per-key rate, each job
/// is checked on its own, through indexes, as claims walk the queue in order ([`arms_sql`]);
/// otherwise every line is numbered ([`lines_sql`]), which reads all of the queue's pending
/// work.
fn pick_sql<D: Dialect>(
    b: &mut Binder<D>,
    queue: &str,
    kinds: &[String],
    l: &QueueLimits,
    take: i64,
) -> String {
    if l.by_arms::<D>() {
        arms_sql(b, queue, kinds, l, take)
    } else {
        lines_sql(b, queue, kinds, l, take)
    }
}

/// [`pick_sql`] job by job: jobs whose lease ran out, then due ready jobs, each arm read through
/// its own index as the ordinary claim reads them (`sql::candidates`), a keyed job only if no
/// job of its key is ahead of it in line (nor runs, under a concurrency of 1; nor started
/// within the period, under a rate of 1), or, under a per-key concurrency of `n` above 1, if
/// fewer than `n` of its key run or wait ahead of it. Without per-key limits, simply the first
/// jobs of each arm. (Values are bound in the order the text has them.)
fn arms_sql<D: Dialect>(
    b: &mut Binder<D>,
    queue: &str,
    kinds: &[String],
    l: &QueueLimits,
    take: i64,
) -> String {
    let line = FirstOfLine { queue, limits: l };
    let e = line.arm(b, Arm::Expired, kinds, take);
    let r = line.arm(b, Arm::Ready, kinds, take);
    format!(
        "SELECT id FROM ({e}) AS rowclaim_e UNION ALL SELECT id FROM ({r}) AS rowclaim_r \
         LIMIT {}",
        b.bind(take)
    )
}

/// The two arms of [`arms_sql`]: jobs whose lease ran out, and due ready jobs.
#[derive(Clone, Copy, PartialEq)]
enum Arm {
    Expired,
    Ready,
}

/// The conditions of [`arms_sql`] for one queue: when a keyed job `j` is not the first of its
/// key's line.
struct FirstOfLine<'a> {
    queue: &'a str,
    limits: &'a QueueLimits,
}

impl FirstOfLine<'_> {
    /// One arm: its jobs, in its index's order, those that are first of their line. Under
    /// per-key limits the ready arm looks at the first [`WINDOW`] ready jobs only, so that a
    /// claim does not read a deep backlog of jobs whose keys are busy; [`heads_sql`] finds the
    /// first of lines further back.
    fn arm<D: Dialect>(&self, b: &mut Binder<D>, arm: Arm, kinds: &[String], take: i64) -> String {
        let now = D::NOW;
        let q = b.bind(self.queue.to_owned());
        if arm == Arm::Ready && self.limits.per_key() && D::SKIP_SCAN {
            let kinds = kinds_cond(b, kinds, "w.");
            let window = b.bind(WINDOW.max(take));
            let blocked = self.blocked(b, arm).join(" OR ");
            return format!(
                "SELECT j.id FROM (SELECT w.id, w.limit_key, w.priority, w.run_at \
                 FROM rowclaim_jobs AS w WHERE w.queue = {q} AND w.status = {READY} \
                 AND w.run_at <= {now}{kinds} ORDER BY w.priority DESC, w.run_at, w.id \
                 LIMIT {window}) AS j WHERE j.limit_key IS NULL OR NOT ({blocked}) \
                 ORDER BY j.priority DESC, j.run_at, j.id LIMIT {}",
                b.bind(take)
            );
        }
        let mut cond = match arm {
            Arm::Expired => format!("j.status = {RUNNING} AND j.lease_until < {now}"),
            Arm::Ready => format!("j.status = {READY} AND j.run_at <= {now}"),
        };
        let blocked = self.blocked(b, arm);
        if !blocked.is_empty() {
            cond.push_str(&format!(
                " AND (j.limit_key IS NULL OR NOT ({}))",
                blocked.join(" OR ")
            ));
        }
        let kinds = kinds_cond(b, kinds, "j.");
        let order = match arm {
            Arm::Expired => "j.lease_until, j.id",
            Arm::Ready => "j.priority DESC, j.run_at, j.id",
        };
        format!(
            "SELECT j.id FROM rowclaim_jobs AS j WHERE j.queue = {q} AND {cond}{kinds} \
             ORDER BY {order} LIMIT {}",
            b.bind(take)
        )
    }

    /// What keeps a keyed job of `arm` from starting, each a condition of its own.
    fn blocked<D: Dialect>(&self, b: &mut Binder<D>, arm: Arm) -> Vec<String> {
        let now = D::NOW;
        let one_running = self.limits.key_concurrency.is_some();
        let key_rate = self.limits.key_rate;
        let expired = format!("o.status = {RUNNING} AND o.lease_until < {now}");
        let mut blocked = Vec::new();
        match arm {
            // A job whose lease ran out takes its own place again; under a rate, one at a
            // time, the first first.
            Arm::Expired => {
                if let Some(rate) = key_rate {
                    blocked.push(self.other(b, &format!("{expired} AND o.id < j.id")));
                    blocked.push(self.started(b, rate));
                }
            }
            // Up to n of a key at once: a job may start while fewer than n of its key run or
            // wait ahead of it in line (each count stops at n).
            Arm::Ready if self.limits.line_front() > 1 => {
                let ahead = format!(
                    "o.status = {READY} AND o.id < j.id AND (o.run_at <= {now} OR o.attempts > 0)"
                );
                let running = self.counted(b, &format!("o.status = {RUNNING}"));
                let waiting = self.counted(b, &ahead);
                let n = b.bind(self.limits.line_front());
                blocked.push(format!("{running} + {waiting} >= {n}"));
            }
            Arm::Ready if one_running || key_rate.is_some() => {
                let ahead = format!(
                    "o.status = {READY} AND o.id < j.id AND (o.run_at <= {now} OR o.attempts > 0)"
                );
                blocked.push(self.other(b, &ahead));
                if one_running {
                    blocked.push(self.other(b, &format!("o.status = {RUNNING}")));
                } else {
                    blocked.push(self.other(b, &expired));
                }
                if let Some(rate) = key_rate {
                    blocked.push(self.started(b, rate));
                }
            }
            Arm::Ready => {}
        }
        blocked
    }

    /// "How many jobs of j's key are such that `cond`", counted up to the line's front.
    fn counted<D: Dialect>(&self, b: &mut Binder<D>, cond: &str) -> String {
        let q = b.bind(self.queue.to_owned());
        format!(
            "(SELECT COUNT(*) FROM (SELECT 1 FROM rowclaim_jobs o WHERE o.queue = {q} \
             AND o.limit_key = j.limit_key AND {cond} LIMIT {}) AS rowclaim_n)",
            b.bind(self.limits.line_front())
        )
    }

    /// "A job of j's key such that `cond`".
    fn other<D: Dialect>(&self, b: &mut Binder<D>, cond: &str) -> String {
        format!(
            "EXISTS (SELECT 1 FROM rowclaim_jobs o WHERE o.queue = {} \
             AND o.limit_key = j.limit_key AND {cond})",
            b.bind(self.queue.to_owned())
        )
    }

    /// "A job of j's key started within the rate's period".
    fn started<D: Dialect>(&self, b: &mut Binder<D>, rate: Rate) -> String {
        let q = b.bind(self.queue.to_owned());
        format!(
            "EXISTS (SELECT 1 FROM rowclaim_starts s WHERE s.queue = {q} \
             AND s.limit_key = j.limit_key AND s.started_ms >= {} - {})",
            D::epoch_ms(D::NOW),
            b.bind(rate.period_ms())
        )
    }
}

/// [`pick_sql`] where more than the first of a line may start: every key's line numbered
/// (`ROW_NUMBER`), with its running jobs and recent starts beside it. (Values are bound in the
/// order the text has them.)
fn lines_sql<D: Dialect>(
    b: &mut Binder<D>,
    queue: &str,
    kinds: &[String],
    l: &QueueLimits,
    take: i64,
) -> String {
    let (now, now_ms) = (D::NOW, D::epoch_ms(D::NOW));
    let expired = format!("CASE WHEN status = {RUNNING} THEN 1 ELSE 0 END");
    let line = format!(
        "SELECT id, kind, priority, run_at, limit_key, {expired} AS expired, \
         CASE WHEN status = {RUNNING} OR run_at <= {now} THEN 1 ELSE 0 END AS due, \
         ROW_NUMBER() OVER (PARTITION BY limit_key ORDER BY {expired} DESC, id) AS place \
         FROM rowclaim_jobs WHERE queue = {} AND ((status = {READY} \
         AND (run_at <= {now} OR attempts > 0)) OR (status = {RUNNING} AND lease_until < {now}))",
        b.bind(queue.to_owned())
    );
    let mut joins = String::new();
    if l.key_concurrency.is_some() {
        joins.push_str(&format!(
            " LEFT JOIN (SELECT limit_key, COUNT(*) AS n FROM rowclaim_jobs \
             WHERE queue = {} AND status = {RUNNING} AND lease_until >= {now} \
             AND limit_key IS NOT NULL GROUP BY limit_key) r ON r.limit_key = c.limit_key",
            b.bind(queue.to_owned())
        ));
    }
    if let Some(rate) = l.key_rate {
        let q = b.bind(queue.to_owned());
        joins.push_str(&format!(
            " LEFT JOIN (SELECT limit_key, COUNT(*) AS n FROM rowclaim_starts \
             WHERE queue = {q} AND started_ms >= {now_ms} - {} AND limit_key IS NOT NULL \
             GROUP BY limit_key) s ON s.limit_key = c.limit_key",
            b.bind(rate.period_ms())
        ));
    }
    let mut cond = String::from("c.due = 1");
    cond.push_str(&kinds_cond(b, kinds, "c."));
    if let Some(max) = l.key_concurrency {
        cond.push_str(&format!(
            " AND (c.limit_key IS NULL OR c.place + COALESCE(r.n, 0) <= {})",
            b.bind(i64::from(max))
        ));
    }
    if let Some(rate) = l.key_rate {
        cond.push_str(&format!(
            " AND (c.limit_key IS NULL OR c.place + COALESCE(s.n, 0) <= {})",
            b.bind(i64::from(rate.jobs))
        ));
    }
    format!(
        "SELECT c.id FROM ({line}) AS c{joins} WHERE {cond} \
         ORDER BY c.expired DESC, c.priority DESC, c.run_at, c.id LIMIT {}",
        b.bind(take)
    )
}

/// ` AND kind IN (…)` for a claimer of some kinds only (of alias `t`, e.g. `"c."`); empty for
/// one of all kinds.
fn kinds_cond<D: Dialect>(b: &mut Binder<D>, kinds: &[String], t: &str) -> String {
    if kinds.is_empty() {
        return String::new();
    }
    let list: Vec<String> = kinds.iter().map(|k| b.bind(k.clone())).collect();
    format!(" AND {t}kind IN ({})", list.join(", "))
}
