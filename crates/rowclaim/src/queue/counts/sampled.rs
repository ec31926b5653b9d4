//! The statuses no index holds by queue, read in one sample each for all queues; the expired
//! leases; the completions of the last minute.

use std::collections::BTreeMap;

use super::{estimate, is, Counting, COUNT_CAP, FINISHED, LIMIT};
use crate::backend::run::{Col, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::Result;
use crate::queue::QueueStats;
use crate::value::Value;

/// The statuses no index holds by queue (running always, for its expired leases), each read
/// in one sample of at most [`LIMIT`] rows for all queues: a queue's figure is exact when the
/// sample held every row of the status; else the database's estimate for the queues the
/// sample met, or what the sample counted as a lower bound.
pub(super) async fn sampled<R: Run>(
    r: &R,
    how: &Counting,
    s: &mut QueueStats,
    only: Option<&str>,
) -> Result<()> {
    let counted = |st: &str| how.per_queue.contains(&st);
    let cols = [Col::Text, Col::Text, Col::Int, Col::Int];
    let sql = samples_sql::<R::Sql>(counted);
    let rows = r.values(Stmt::new(sql, Binder::new()), &cols).await?;
    for (sample, (total, queues)) in samples(rows) {
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
            s.set_jobs(&q, status, n);
        }
        if status == "running" && full {
            expired_leases(r, s, only).await?;
        }
    }
    Ok(())
}

/// The samples' statement: rows of (status, queue, jobs, of those expired), one select per
/// status that `counted` (counted by queue through an index) leaves out.
fn samples_sql<D: Dialect>(counted: impl Fn(&str) -> bool) -> String {
    let (d, text) = (D::NOW, D::TEXT);
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
    selects.join(" UNION ALL ")
}

/// A sample's rows in all, and per queue its rows of the sample's status and of those expired.
type Sample = (i64, BTreeMap<String, (i64, i64)>);

/// The rows of [`samples_sql`] by sample: running, waiting, and finished (whose figures per
/// queue are of completed jobs only; dead and cancelled count in its total).
fn samples(rows: Vec<Vec<Value>>) -> BTreeMap<String, Sample> {
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
    samples
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
pub(super) async fn last_minute<R: Run>(
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
