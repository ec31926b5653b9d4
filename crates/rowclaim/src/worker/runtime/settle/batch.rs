//! Writing results in batches: whatever piled up, one statement per claim and outcome.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};

use super::super::turns::WriteTurns;
use super::{Flushed, Reply, Settle, Settling};
use crate::backend::Outcome;
use crate::error::Result;
use crate::id::RowId;
use crate::metrics::{secs, WorkerMetrics};

/// Most results in one flush.
pub(super) const FLUSH_MOST: usize = 1000;

/// Flushes in flight at once. A second flush starts only while results pile up behind a running
/// one ([`PILE_UP`] or more): where a statement is quick (PostgreSQL) one flush at a time makes the
/// largest batches and costs least per result; where a batch of a thousand takes tens of
/// milliseconds (MariaDB), the next one would otherwise wait behind it with the server half idle.
pub(super) const FLUSHES_AT_ONCE: usize = 4;

/// Results waiting that start another flush beside the running ones.
pub(super) const PILE_UP: usize = FLUSH_MOST / 2;

/// Without a settle delay, flushes start at most this often while results come one by one:
/// a result that ends within this long of the last flush's start waits for the rest of it, and
/// goes with whatever ends meanwhile. A flush costs the server about the same for one row as for
/// ten (a statement and a commit): jobs of a few milliseconds each, such as a command per job,
/// ended one at a time and were written one at a time, a commit per job. A result after a quiet
/// spell is written at once, and where results come fast (a flush takes longer than this, or
/// [`COMPANY`] of them wait) nothing waits. Nor does it where a result written frees room for
/// the next claim (the settler's `gather` says so: a claimer under limits, or claims holding a
/// transaction until their rows are written): under limits the wait held back the next job of
/// a key, and 10 keys one at a time ran at a sixth of the rate.
pub(super) const FLUSH_EVERY: Duration = Duration::from_millis(5);

/// Results waiting that start a flush before [`FLUSH_EVERY`] has passed: company enough.
pub(super) const COMPANY: usize = 32;

/// What a flush measures: how long each statement took, and how many rows it wrote.
#[derive(Clone)]
pub(in crate::worker::runtime) struct FlushMetrics {
    seconds: metrics::Histogram,
    rows: metrics::Histogram,
}

impl FlushMetrics {
    pub(in crate::worker::runtime) fn of(m: &WorkerMetrics) -> FlushMetrics {
        FlushMetrics {
            seconds: m.settle_seconds.clone(),
            rows: m.settle_rows.clone(),
        }
    }

    #[cfg(test)]
    pub(super) fn noop() -> FlushMetrics {
        FlushMetrics {
            seconds: metrics::Histogram::noop(),
            rows: metrics::Histogram::noop(),
        }
    }
}

/// Writes results in batches: whatever arrived while the previous flush ran (and, with a
/// `delay`, for that long after the first; without one, until [`FLUSH_EVERY`] has passed since
/// the last flush started or [`COMPANY`] results wait, where `gather` says results may wait),
/// one statement per claim and outcome, the claims' statements side by side; more flushes at
/// once when results pile up (see [`FLUSHES_AT_ONCE`]). What follows a statement that
/// committed ([`Settle::settled`]) runs beside the next flushes, and answers the statement's rows
/// when done; the settler ends once the last of it has.
/// A row's result is sent again only after its flush answered, so no two flushes hold the same
/// row. A flush that takes longer than `limit` answers "timed out" to its rows, whose recorders
/// try again. Where writes take `turns` (one writer), one flush runs at a time, each statement
/// in its turn: a second flush could only wait for the lock, and results pile up meanwhile into
/// the next one.
pub(in crate::worker::runtime) async fn settler<T: Settle>(
    mut rx: mpsc::UnboundedReceiver<Settling<T>>,
    delay: Duration,
    limit: Duration,
    metrics: FlushMetrics,
    turns: WriteTurns,
    gather: impl Fn() -> bool + Send,
) {
    let at_once = if turns.takes_turns() {
        1
    } else {
        FLUSHES_AT_ONCE
    };
    let mut flushing = JoinSet::new();
    // What follows flushes that ended (their looks for waiting jobs), each then answering its
    // rows: they take no room from the next flush. One runs at a time, in order, so that they
    // take one more connection at most (a look takes a fraction of a flush's time).
    let mut following = JoinSet::new();
    let mut to_follow: VecDeque<Follow> = VecDeque::new();
    let mut pending: Vec<Settling<T>> = Vec::new();
    let mut open = true;
    // When the next flush may start while results come one by one (no delay set).
    let mut next_due: Option<Instant> = None;
    loop {
        if following.is_empty() {
            if let Some(follow) = to_follow.pop_front() {
                following.spawn(follow);
            }
        }
        let due = next_due.filter(|at| *at > Instant::now() && gather());
        let start = !pending.is_empty()
            && ((flushing.is_empty() && (due.is_none() || pending.len() >= COMPANY))
                || (pending.len() >= PILE_UP && flushing.len() < at_once));
        if start {
            if delay.is_zero() {
                next_due = Some(Instant::now() + FLUSH_EVERY);
            } else {
                tokio::time::sleep(delay).await;
            }
            while let Ok(s) = rx.try_recv() {
                pending.push(s);
            }
            let take = pending.len().min(FLUSH_MOST);
            flushing.spawn(flush(
                pending.drain(..take).collect(),
                limit,
                metrics.clone(),
                turns.clone(),
            ));
            continue;
        }
        tokio::select! {
            s = rx.recv(), if open => match s {
                Some(s) => {
                    pending.push(s);
                    while let Ok(s) = rx.try_recv() {
                        pending.push(s);
                    }
                }
                None => open = false,
            },
            Some(ended) = flushing.join_next(), if !flushing.is_empty() => {
                to_follow.extend(ended.unwrap_or_default());
            }
            Some(_) = following.join_next(), if !following.is_empty() => {}
            () = sleep_until(due.unwrap_or_else(Instant::now)),
                if due.is_some() && !pending.is_empty() && flushing.is_empty() => {}
            else => break,
        }
    }
}

type Replies = Vec<(RowId, Reply)>;

/// What follows a statement that committed ([`Settle::settled`]), then the answer to its rows.
pub(super) type Follow = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One flush: the batch's statements, one per claim and outcome, side by side (each in its
/// turn where writes take turns). A statement that failed or went unanswered answers its rows
/// at once; one that committed leaves what follows it to the caller, which answers them.
pub(super) async fn flush<T: Settle>(
    batch: Vec<Settling<T>>,
    limit: Duration,
    m: FlushMetrics,
    turns: WriteTurns,
) -> Vec<Follow> {
    let mut groups: Vec<(Arc<T>, Outcome, Replies)> = Vec::new();
    for s in batch {
        match groups
            .iter_mut()
            .find(|(t, o, _)| Arc::ptr_eq(t, &s.target) && *o == s.outcome)
        {
            Some((_, _, rows)) => rows.push((s.id, s.reply)),
            None => groups.push((s.target, s.outcome, vec![(s.id, s.reply)])),
        }
    }
    let mut statements = JoinSet::new();
    for (target, outcome, rows) in groups {
        let (m, turns) = (m.clone(), turns.clone());
        statements.spawn(async move {
            let ids: Vec<RowId> = rows.iter().map(|(id, _)| id.clone()).collect();
            let follows = target.follows(&outcome);
            let started = Instant::now();
            let settle = async {
                // At once where writes take no turns.
                let _turn = turns.take().await;
                target.settle(&ids, outcome).await
            };
            let result = tokio::time::timeout(limit, settle).await;
            m.seconds.record(secs(started.elapsed()));
            m.rows.record(ids.len() as f64);
            let lost = match result {
                Ok(Ok(lost)) if follows && lost.len() < ids.len() => lost,
                other => {
                    answer(rows, other.ok());
                    return None;
                }
            };
            // Its rows are answered within `limit` of the statement's start, as before the look
            // moved out of the flush: a recorder waits that long for an answer.
            let deadline = started + limit;
            Some(Box::pin(async move {
                // One queued until its time ran out does not start.
                let done = Instant::now() < deadline
                    && tokio::time::timeout_at(deadline, async {
                        // It may write too (a job released), so in its turn as well.
                        let _turn = turns.take().await;
                        target.settled(&ids, &lost).await;
                    })
                    .await
                    .is_ok();
                if !done {
                    tracing::debug!(
                        "what follows a settle ran out of {limit:?}: left to the sweep"
                    );
                }
                answer(rows, Some(Ok(lost)));
            }) as Follow)
        });
    }
    let mut follows = Vec::new();
    while let Some(ended) = statements.join_next().await {
        follows.extend(ended.ok().flatten());
    }
    follows
}

/// Tells each row of a statement what became of it (`None`: no answer in time).
fn answer(rows: Replies, result: Option<Result<Vec<RowId>>>) {
    let failed = match result {
        Some(Ok(lost)) => {
            for (id, reply) in rows {
                reply.send(if lost.contains(&id) {
                    Flushed::Lost
                } else {
                    Flushed::Recorded
                });
            }
            return;
        }
        Some(Err(e)) => Some(Arc::new(e)),
        None => None,
    };
    for (_, reply) in rows {
        reply.send(match &failed {
            Some(e) => Flushed::Failed(e.clone()),
            None => Flushed::TimedOut,
        });
    }
}
