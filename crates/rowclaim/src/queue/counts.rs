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

use std::collections::BTreeMap;

use super::QueueStats;
use crate::backend::run::{Col, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::Result;
use crate::value::Value;

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
                s.by_queue
                    .entry(q.clone())
                    .or_default()
                    .insert(st.to_owned(), est);
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
        s.by_queue
            .entry(q.to_owned())
            .or_default()
            .insert(status.to_owned(), n);
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

/// The ready jobs of each queue of `queues` (read up to the cap through the ready index), and
/// of those the due ones, the retries and the oldest due one's wait.
async fn ready_figures<R: Run>(
    r: &R,
    how: &Counting,
    s: &mut QueueStats,
    queues: &[String],
    now: i64,
) -> Result<()> {
    let d = R::Sql::NOW;
    for chunk in queues.chunks(CHUNK) {
        let mut b = Binder::new();
        let selects: Vec<String> = chunk
            .iter()
            .enumerate()
            .map(|(i, q)| {
                // The ready index holds run-at: the count, the due and the oldest are read
                // from it; the retries (attempts) from the first rows only.
                format!(
                    "SELECT '{i}', COUNT(*), COUNT(CASE WHEN run_at <= {d} THEN 1 END), \
                     (SELECT COUNT(CASE WHEN attempts > 0 THEN 1 END) FROM (SELECT attempts \
                     FROM rowclaim_jobs WHERE status = 'ready' AND queue = {} \
                     LIMIT {ROW_READS}) a{i}), {} \
                     FROM (SELECT run_at FROM rowclaim_jobs \
                     WHERE status = 'ready' AND queue = {} LIMIT {LIMIT}) t{i}",
                    b.bind(q.clone()),
                    R::Sql::epoch_ms(&format!("MIN(CASE WHEN run_at <= {d} THEN run_at END)")),
                    b.bind(q.clone())
                )
            })
            .collect();
        let cols = [Col::Text, Col::Int, Col::Int, Col::Int, Col::OptInt];
        let rows = r
            .values(Stmt::new(selects.join(" UNION ALL "), b), &cols)
            .await?;
        for row in rows {
            let mut row = row.into_iter();
            let i: Option<usize> = row
                .next()
                .and_then(Value::text)
                .and_then(|t| t.parse().ok());
            let Some(q) = i.and_then(|i| chunk.get(i)) else {
                continue;
            };
            let mut n = || row.next().and_then(Value::int).unwrap_or(0);
            let (jobs, due, retrying) = (n(), n(), n());
            let oldest = row.next().and_then(Value::int);
            put(s, r, how, q, "ready", jobs).await?;
            let full = jobs >= LIMIT;
            let oldest = if full {
                oldest_run_at(r, q).await?
            } else {
                oldest
            };
            if let Some(at) = oldest.filter(|at| *at <= now) {
                s.oldest_ready_secs
                    .insert(q.clone(), (now - at).max(0) as f64 / 1000.0);
            }
            for (figure, n, cond, read_all) in [
                ("due", due, format!(" AND run_at <= {d}"), !full),
                (
                    "retrying",
                    retrying,
                    " AND attempts > 0".to_owned(),
                    jobs <= ROW_READS,
                ),
            ] {
                let mut n = u64::try_from(n).unwrap_or(0);
                if !read_all {
                    match estimate(r, how, q, "ready", &cond).await? {
                        Some(est) => {
                            // Never more than the ready jobs said.
                            n = n.max(est.min(ready_shown(s, q)));
                            s.mark_estimated(q, figure);
                        }
                        None => {
                            n = n.min(COUNT_CAP);
                            s.mark_at_least(q, figure);
                        }
                    }
                }
                if n > 0 {
                    let m = if figure == "due" {
                        &mut s.due
                    } else {
                        &mut s.retrying
                    };
                    m.insert(q.clone(), n);
                }
            }
        }
    }
    Ok(())
}

/// The ready jobs of `queue` as `stats` says them (a count, an estimate or the cap).
fn ready_shown(s: &QueueStats, queue: &str) -> u64 {
    s.by_queue
        .get(queue)
        .and_then(|m| m.get("ready"))
        .copied()
        .unwrap_or(0)
}

/// The earliest run-at of a queue's ready jobs (epoch ms), with more of them than the cap: the
/// earliest of each priority (the first of the priority in the ready index), the priorities
/// found by a loose scan.
async fn oldest_run_at<R: Run>(r: &R, q: &str) -> Result<Option<i64>> {
    let mut b = Binder::new();
    let (q1, q2, q3) = (
        b.bind(q.to_owned()),
        b.bind(q.to_owned()),
        b.bind(q.to_owned()),
    );
    let ready = "FROM rowclaim_jobs WHERE status = 'ready' AND queue =";
    let sql = format!(
        "WITH RECURSIVE p(priority) AS (SELECT MAX(priority) {ready} {q1} \
         UNION ALL SELECT (SELECT MAX(priority) {ready} {q2} AND priority < p.priority) \
         FROM p WHERE p.priority IS NOT NULL) \
         SELECT {} FROM p WHERE p.priority IS NOT NULL",
        R::Sql::epoch_ms(&format!(
            "(SELECT MIN(run_at) {ready} {q3} AND priority = p.priority)"
        ))
    );
    let rows = r.values(Stmt::new(sql, b), &[Col::OptInt]).await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| row.into_iter().next().and_then(Value::int))
        .min())
}

/// The statuses no index holds by queue (running always, for its expired leases), each read
/// in one sample of at most [`LIMIT`] rows for all queues: a queue's figure is exact when the
/// sample held every row of the status; else the database's estimate for the queues the
/// sample met, or what the sample counted as a lower bound.
async fn sampled<R: Run>(
    r: &R,
    how: &Counting,
    s: &mut QueueStats,
    only: Option<&str>,
) -> Result<()> {
    let d = R::Sql::NOW;
    let text = R::Sql::TEXT;
    let counted = |st: &str| how.per_queue.contains(&st);
    let mut selects = vec![format!(
        "SELECT CAST('running' AS {text}), CAST(queue AS {text}), COUNT(*), \
         COUNT(CASE WHEN lease_until < {d} THEN 1 END) FROM (SELECT queue, lease_until \
         FROM rowclaim_jobs WHERE status = 'running' LIMIT {LIMIT}) t GROUP BY queue"
    )];
    if !counted("waiting") {
        selects.push(format!(
            "SELECT CAST('waiting' AS {text}), CAST(queue AS {text}), COUNT(*), COUNT(*) \
             FROM (SELECT queue FROM rowclaim_jobs WHERE status = 'waiting' LIMIT {LIMIT}) w \
             GROUP BY queue"
        ));
    }
    if !counted("completed") {
        // Through the finished index, whose rows are completed, dead and cancelled (dead and
        // cancelled are counted by queue through their own): the latest finished first.
        selects.push(format!(
            "SELECT CAST(status AS {text}), CAST(queue AS {text}), COUNT(*), COUNT(*) \
             FROM (SELECT queue, status FROM rowclaim_jobs WHERE {FINISHED} \
             ORDER BY finished_at DESC LIMIT {LIMIT}) f GROUP BY status, queue"
        ));
    }
    let cols = [Col::Text, Col::Text, Col::Int, Col::Int];
    let rows = r
        .values(Stmt::new(selects.join(" UNION ALL "), Binder::new()), &cols)
        .await?;
    // sample → (rows in it, queue → (its rows of the status, of those expired))
    type Sample = (i64, BTreeMap<String, (i64, i64)>);
    let mut samples: BTreeMap<String, Sample> = BTreeMap::new();
    for row in rows {
        let mut row = row.into_iter();
        let (Some(st), Some(q)) = (
            row.next().and_then(Value::text),
            row.next().and_then(Value::text),
        ) else {
            continue;
        };
        let mut n = || row.next().and_then(Value::int).unwrap_or(0);
        let (jobs, expired) = (n(), n());
        let sample = if st == "running" || st == "waiting" {
            st.clone()
        } else {
            "finished".to_owned()
        };
        let e = samples.entry(sample).or_default();
        e.0 += jobs;
        if st == "running" || st == "waiting" || st == "completed" {
            e.1.insert(q, (jobs, expired));
        }
    }
    for (sample, (total, queues)) in samples {
        let full = total >= LIMIT;
        let status: &'static str = match sample.as_str() {
            "running" => "running",
            "waiting" => "waiting",
            _ => "completed",
        };
        for (q, (jobs, expired)) in queues {
            if only.is_some_and(|o| o != q) {
                continue;
            }
            if status == "running" && !full && expired > 0 {
                s.expired_leases.insert(q.clone(), expired as u64);
            }
            if counted(status) {
                continue;
            }
            let mut n = u64::try_from(jobs).unwrap_or(0);
            if full {
                match estimate(r, how, &q, status, "").await? {
                    Some(est) => {
                        n = n.max(est);
                        s.mark_estimated(&q, status);
                    }
                    None => {
                        n = n.min(COUNT_CAP);
                        s.mark_at_least(&q, status);
                    }
                }
            }
            s.by_queue
                .entry(q)
                .or_default()
                .insert(status.to_owned(), n);
        }
        if status == "running" && full {
            expired_leases(r, s, only).await?;
        }
    }
    Ok(())
}

/// Running jobs whose lease has ended, per queue, through the lease index, up to the cap in
/// all (beyond it, what was counted is a lower bound).
async fn expired_leases<R: Run>(r: &R, s: &mut QueueStats, only: Option<&str>) -> Result<()> {
    let sql = format!(
        "SELECT CAST(queue AS {}), COUNT(*) FROM (SELECT queue FROM rowclaim_jobs \
         WHERE status = 'running' AND lease_until < {} LIMIT {LIMIT}) t GROUP BY queue",
        R::Sql::TEXT,
        R::Sql::NOW
    );
    let rows = r.count_by(Stmt::new(sql, Binder::new())).await?;
    let full = rows.iter().map(|(_, n)| n).sum::<i64>() >= LIMIT;
    for (q, n) in rows {
        let Some(q) = q.filter(|q| only.is_none_or(|o| o == q)) else {
            continue;
        };
        if full {
            s.mark_at_least(&q, "expired_leases");
        }
        let n = u64::try_from(n).unwrap_or(0).min(COUNT_CAP);
        s.expired_leases.insert(q, n);
    }
    Ok(())
}

/// Jobs completed in the last minute, per queue: the latest completions (up to the cap)
/// through the finished index. With more than the cap in the minute, each queue's share of
/// those, over the time they took, as a rate per minute (an estimate).
async fn last_minute<R: Run>(
    r: &R,
    s: &mut QueueStats,
    only: Option<&str>,
    now: i64,
) -> Result<()> {
    let mut b = Binder::new();
    let since = R::Sql::at_ms(&b.bind(now - 60_000));
    let sql = format!(
        "SELECT CAST(queue AS {}), COUNT(*), {} FROM (SELECT queue, finished_at \
         FROM rowclaim_jobs WHERE {} AND finished_at >= {since} \
         ORDER BY finished_at DESC LIMIT {LIMIT}) t GROUP BY queue",
        R::Sql::TEXT,
        R::Sql::epoch_ms("MIN(finished_at)"),
        is("completed")
    );
    let rows = r
        .values(Stmt::new(sql, b), &[Col::Text, Col::Int, Col::OptInt])
        .await?;
    let mut total = 0;
    let mut earliest = now;
    let mut per_queue = Vec::new();
    for row in rows {
        let mut row = row.into_iter();
        let Some(q) = row.next().and_then(Value::text) else {
            continue;
        };
        let n = row.next().and_then(Value::int).unwrap_or(0);
        earliest = earliest.min(row.next().and_then(Value::int).unwrap_or(now));
        total += n;
        per_queue.push((q, n));
    }
    let full = total >= LIMIT;
    // The span the latest completions took, at least a millisecond.
    let span = (now - earliest).clamp(1, 60_000);
    for (q, n) in per_queue {
        if only.is_some_and(|o| o != q) {
            continue;
        }
        let n = if full {
            s.mark_estimated(&q, "completed_last_minute");
            n.saturating_mul(60_000) / span
        } else {
            n
        };
        s.completed_last_minute
            .insert(q, u64::try_from(n).unwrap_or(0));
    }
    Ok(())
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
