//! The managed queue's counts, read without walking the whole table (issue 26): what `stats`,
//! the gauges and the dashboard show, at a cost that does not grow with the jobs kept.
//!
//! Each (queue, status) is counted through an index that holds that status by queue, and only
//! up to [`COUNT_CAP`] rows: a larger figure is the database's estimate (PostgreSQL's planner,
//! MySQL's EXPLAIN) or, on SQLite, which keeps no statistics to estimate from, a lower bound.
//! The queues of a status are found by a loose scan of that index (one probe per queue). The
//! statuses no index holds by queue (on PostgreSQL and SQLite: running, waiting, completed) are
//! read in one sample of at most `COUNT_CAP + 1` rows each, through their partial index: exact
//! per queue while the status has at most the cap in all queues together. Nothing here adds a
//! write to a claim or a settle.

use super::QueueStats;
use crate::backend::run::{Col, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::Result;
use crate::value::Value;

mod ready;
mod sampled;

use ready::ready_figures;
use sampled::{last_minute, sampled};

/// How many jobs of one queue and status are counted before the figure becomes an estimate
/// (or, on SQLite, a lower bound); also where the dashboard's "all N matching" stops counting.
pub const COUNT_CAP: u64 = 10_000;

/// Rows a capped count reads: one more than the cap, to know it was passed.
const LIMIT: i64 = COUNT_CAP as i64 + 1;

/// Ready jobs read row by row (for what no index holds: the attempts of a retry) before the
/// figure becomes an estimate: each such row is a read of the table, not of an index.
const ROW_READS: i64 = 1_000;

/// Pairs (or queues) per statement: a statement's placeholders stay few.
const CHUNK: usize = 100;

/// Jobs in `status`, said so that each database uses the partial index that holds them: SQLite
/// uses a partial index only when the condition names its own `WHERE` (PostgreSQL proves the
/// implication, MySQL has no partial indexes: the repetition is harmless there).
fn is(status: &str) -> String {
    match status {
        "dead" | "cancelled" => format!("status IN ('dead', 'cancelled') AND status = '{status}'"),
        "completed" => format!("{FINISHED} AND status = 'completed'"),
        _ => format!("status = '{status}'"),
    }
}

/// The finished jobs: the condition of the finished index.
const FINISHED: &str = "status IN ('completed', 'dead', 'cancelled')";

/// What differs between databases in counting.
pub(crate) struct Counting {
    /// Statuses an index holds by status and queue: each queue's are counted through it.
    pub per_queue: &'static [&'static str],
    /// How the database estimates the rows of a condition; None where it cannot (SQLite).
    pub estimate: Option<Estimate>,
    /// Whether the loose scan for a status's queues is one recursive statement (its probes
    /// use the index), or a statement per queue found (MariaDB reads every entry of the
    /// status for a probe inside a recursive statement).
    pub recursive_scan: bool,
}

/// A database's estimate of the rows a condition matches.
pub(crate) struct Estimate {
    /// Put before `SELECT 1 FROM rowclaim_jobs WHERE …`.
    pub explain: &'static str,
    /// The estimated rows, read from what the explain answered (one text per row).
    pub rows: fn(&[String]) -> Option<u64>,
}

/// [`stats`] over one connection of a server's pool, in a transaction that writes nothing: its
/// statements follow each other closely, and the pool would open a second connection for a
/// statement sent while the last one's connection was still on its way back. (SQLite's
/// transactions are its one writer's: it counts through the pool.)
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn stats_in_one<T: crate::backend::run::Transact>(
    db: &T,
    how: &Counting,
    only: Option<&str>,
) -> Result<QueueStats> {
    let tx = db.transaction(false).await?;
    let stats = stats(&tx, how, only).await;
    let ended = crate::backend::run::Finish::rollback(tx).await;
    let stats = stats?;
    ended?;
    Ok(stats)
}

/// The figures of the managed queue (of `only`, or of every queue), counted as the module
/// comment says.
pub(crate) async fn stats<R: Run>(r: &R, how: &Counting, only: Option<&str>) -> Result<QueueStats> {
    let now = r
        .count(Stmt::new(
            format!("SELECT {}", R::Sql::epoch_ms(R::Sql::NOW)),
            Binder::new(),
        ))
        .await?;
    let mut s = QueueStats::default();
    let pairs: Vec<(String, &'static str)> = match only {
        Some(q) => how.per_queue.iter().map(|st| (q.to_owned(), *st)).collect(),
        None => present(r, how, how.per_queue).await?,
    };
    let (ready, others): (Vec<_>, Vec<_>) = pairs.into_iter().partition(|(_, st)| *st == "ready");
    let ready: Vec<String> = ready.into_iter().map(|(q, _)| q).collect();
    let others = unless_far_above(r, how, &mut s, others).await?;
    for (q, st, n) in capped(r, &others).await? {
        put(&mut s, r, how, &q, st, n).await?;
    }
    ready_figures(r, how, &mut s, &ready, now).await?;
    sampled(r, how, &mut s, only).await?;
    last_minute(r, &mut s, only, now).await?;
    Ok(s)
}

/// Completed jobs kept by the hundred thousand are not counted even to the cap: where the
/// database estimates, a figure it puts far above the cap (ten times) is taken as it is. (Only
/// completed jobs: a stale estimate of dead or ready jobs must not hide a small count.)
const FAR_ABOVE: u64 = 10 * COUNT_CAP;

/// `pairs` but those of completed jobs the database estimates far above the cap, whose
/// estimates go into `s`.
async fn unless_far_above<R: Run>(
    r: &R,
    how: &Counting,
    s: &mut QueueStats,
    pairs: Vec<(String, &'static str)>,
) -> Result<Vec<(String, &'static str)>> {
    if how.estimate.is_none() {
        return Ok(pairs);
    }
    let mut left = Vec::with_capacity(pairs.len());
    for (q, st) in pairs {
        if st == "completed" {
            if let Some(est) = estimate(r, how, &q, st, "")
                .await?
                .filter(|e| *e > FAR_ABOVE)
            {
                s.mark_estimated(&q, st);
                s.set_jobs(&q, st, est);
                continue;
            }
        }
        left.push((q, st));
    }
    Ok(left)
}

/// Sets a status's count of a queue from a capped count: the count, or above the cap the
/// estimate or the cap as a lower bound.
async fn put<R: Run>(
    s: &mut QueueStats,
    r: &R,
    how: &Counting,
    q: &str,
    status: &'static str,
    n: i64,
) -> Result<()> {
    let n = if n < LIMIT {
        u64::try_from(n).unwrap_or(0)
    } else if let Some(est) = estimate(r, how, q, status, "").await? {
        s.mark_estimated(q, status);
        est.max(LIMIT as u64)
    } else {
        s.mark_at_least(q, status);
        COUNT_CAP
    };
    if n > 0 {
        s.set_jobs(q, status, n);
    }
    Ok(())
}

/// The queues that have jobs in each of `statuses`, by a loose scan of the index that holds
/// the status by queue (the next queue after the last, one probe each).
async fn present<R: Run>(
    r: &R,
    how: &Counting,
    statuses: &'static [&'static str],
) -> Result<Vec<(String, &'static str)>> {
    if statuses.is_empty() {
        return Ok(Vec::new());
    }
    if !how.recursive_scan {
        return present_stepped(r, statuses).await;
    }
    let text = R::Sql::TEXT;
    let mut ctes = Vec::new();
    let mut selects = Vec::new();
    for (i, st) in statuses.iter().enumerate() {
        let st = is(st);
        ctes.push(format!(
            "s{i}(q) AS (SELECT MIN(queue) FROM rowclaim_jobs WHERE {st} \
             UNION ALL SELECT (SELECT MIN(queue) FROM rowclaim_jobs WHERE {st} \
             AND queue > s{i}.q) FROM s{i} WHERE s{i}.q IS NOT NULL)"
        ));
        selects.push(format!(
            "SELECT '{i}', CAST(q AS {text}) FROM s{i} WHERE q IS NOT NULL"
        ));
    }
    let sql = format!(
        "WITH RECURSIVE {} {}",
        ctes.join(", "),
        selects.join(" UNION ALL ")
    );
    let rows = r
        .values(Stmt::new(sql, Binder::new()), &[Col::Text, Col::Text])
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            let mut row = row.into_iter();
            let i: usize = row.next().and_then(Value::text)?.parse().ok()?;
            Some((row.next().and_then(Value::text)?, *statuses.get(i)?))
        })
        .collect())
}

/// [`present`] a statement per step: each step asks, for every status not done yet, the next
/// queue after the one it found last.
async fn present_stepped<R: Run>(
    r: &R,
    statuses: &'static [&'static str],
) -> Result<Vec<(String, &'static str)>> {
    let text = R::Sql::TEXT;
    let mut last: Vec<(&'static str, Option<String>)> =
        statuses.iter().map(|st| (*st, None)).collect();
    let mut out = Vec::new();
    while !last.is_empty() {
        let mut b = Binder::new();
        let probes: Vec<String> = last
            .iter()
            .map(|(st, after)| {
                let after = match after {
                    Some(q) => format!(" AND queue > {}", b.bind(q.clone())),
                    None => String::new(),
                };
                format!(
                    "CAST((SELECT MIN(queue) FROM rowclaim_jobs WHERE {}{after}) AS {text})",
                    is(st)
                )
            })
            .collect();
        let sql = format!("SELECT {}", probes.join(", "));
        let cols = vec![Col::OptText; last.len()];
        let row = r.values(Stmt::new(sql, b), &cols).await?;
        let found: Vec<Option<String>> = row
            .into_iter()
            .next()
            .map(|row| row.into_iter().map(Value::text).collect())
            .unwrap_or_default();
        let mut next = Vec::new();
        for ((st, _), q) in last.into_iter().zip(found) {
            if let Some(q) = q {
                out.push((q.clone(), st));
                next.push((st, Some(q)));
            }
        }
        last = next;
    }
    Ok(out)
}

/// Each pair's jobs, counted up to [`LIMIT`] through the index of its status.
async fn capped<R: Run>(
    r: &R,
    pairs: &[(String, &'static str)],
) -> Result<Vec<(String, &'static str, i64)>> {
    let mut out = Vec::with_capacity(pairs.len());
    for chunk in pairs.chunks(CHUNK) {
        let mut b = Binder::new();
        let selects: Vec<String> = chunk
            .iter()
            .enumerate()
            .map(|(i, (q, st))| {
                format!(
                    "SELECT '{i}', COUNT(*) FROM (SELECT 1 AS one FROM rowclaim_jobs \
                     WHERE {} AND queue = {} LIMIT {LIMIT}) t{i}",
                    is(st),
                    b.bind(q.clone())
                )
            })
            .collect();
        let sql = selects.join(" UNION ALL ");
        for row in r.values(Stmt::new(sql, b), &[Col::Text, Col::Int]).await? {
            let mut row = row.into_iter();
            let i: Option<usize> = row
                .next()
                .and_then(Value::text)
                .and_then(|t| t.parse().ok());
            let n = row.next().and_then(Value::int).unwrap_or(0);
            if let Some((q, st)) = i.and_then(|i| chunk.get(i)) {
                out.push((q.clone(), *st, n));
            }
        }
    }
    Ok(out)
}

/// The database's estimate of the jobs of `queue` in `status` that meet `more` (` AND …`, or
/// nothing), when it can estimate.
async fn estimate<R: Run>(
    r: &R,
    how: &Counting,
    queue: &str,
    status: &'static str,
    more: &str,
) -> Result<Option<u64>> {
    let Some(e) = &how.estimate else {
        return Ok(None);
    };
    let mut b = Binder::new();
    let sql = format!(
        "{} SELECT 1 FROM rowclaim_jobs WHERE status = '{status}' AND queue = {}{more}",
        e.explain,
        b.bind(queue.to_owned())
    );
    let lines = r.texts(Stmt::new(sql, b)).await?;
    Ok((e.rows)(&lines))
}
