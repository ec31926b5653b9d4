//! The ready jobs' figures: their count, the due ones, the retries and the oldest wait, read
//! through the ready index (the retries from the first rows only).

use super::{estimate, put, Counting, COUNT_CAP, LIMIT, ROW_READS};
use crate::backend::run::{Col, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::Result;
use crate::queue::QueueStats;
use crate::value::Value;

use super::CHUNK;

/// The ready jobs of each queue of `queues` (read up to the cap through the ready index), and
/// of those the due ones, the retries and the oldest due one's wait.
pub(super) async fn ready_figures<R: Run>(
    r: &R,
    how: &Counting,
    s: &mut QueueStats,
    queues: &[String],
    now: i64,
) -> Result<()> {
    for chunk in queues.chunks(CHUNK) {
        let cols = [Col::Text, Col::Int, Col::Int, Col::Int, Col::OptInt];
        let rows = r.values(ready_stmt(chunk), &cols).await?;
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
            let read = Read {
                jobs: n(),
                due: n(),
                retrying: n(),
                oldest: row.next().and_then(Value::int),
            };
            queue_figures(r, how, s, q, read, now).await?;
        }
    }
    Ok(())
}

/// What [`ready_stmt`] read of one queue: its ready jobs (up to the cap), the due ones among
/// them, the retries among the first rows, and the oldest due run-at (epoch ms).
struct Read {
    jobs: i64,
    due: i64,
    retrying: i64,
    oldest: Option<i64>,
}

/// One row per queue of `chunk`, tagged by its place there: its [`Read`].
fn ready_stmt<D: Dialect>(chunk: &[String]) -> Stmt<D> {
    let d = D::NOW;
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
                D::epoch_ms(&format!("MIN(CASE WHEN run_at <= {d} THEN run_at END)")),
                b.bind(q.clone())
            )
        })
        .collect();
    Stmt::new(selects.join(" UNION ALL "), b)
}

/// Puts queue `q`'s ready figures in `s` from what was `read`: where the read stopped at the
/// cap (or, for the retries, at the first rows), the database's estimate or a lower bound.
async fn queue_figures<R: Run>(
    r: &R,
    how: &Counting,
    s: &mut QueueStats,
    q: &str,
    read: Read,
    now: i64,
) -> Result<()> {
    let d = R::Sql::NOW;
    put(s, r, how, q, "ready", read.jobs).await?;
    let full = read.jobs >= LIMIT;
    let oldest = if full {
        oldest_run_at(r, q).await?
    } else {
        read.oldest
    };
    if let Some(at) = oldest.filter(|at| *at <= now) {
        s.oldest_ready_secs
            .insert(q.to_owned(), (now - at).max(0) as f64 / 1000.0);
    }
    for (figure, n, cond, read_all) in [
        ("due", read.due, format!(" AND run_at <= {d}"), !full),
        (
            "retrying",
            read.retrying,
            " AND attempts > 0".to_owned(),
            read.jobs <= ROW_READS,
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
            m.insert(q.to_owned(), n);
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
