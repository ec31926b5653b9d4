//! Results: a finished job's outcome goes to one settler, which writes what piled up in one
//! statement per claim and outcome (fenced row by row), a few flushes at once when they pile up.

use super::*;

/// Records a row's outcome through the settler, retrying while the database fails, until the
/// lease would end (a source whose claims never expire: until the worker stops now); then gives
/// the row up, and it comes back through its lease.
pub(super) async fn record(sh: Arc<Shared>, finished: Finished) {
    let Finished {
        held,
        id,
        outcome,
        counter,
    } = finished;
    let (held, id, counter) = (&held, &id, sh.tally.of(counter));
    let mut failures = 0u32;
    // A try whose answer was lost may have gone through: a refusal after it proves nothing.
    let mut uncertain = false;
    let most = (sh.cfg.lease / 3).max(Duration::from_secs(2));
    let give_up = || {
        if sh.renews {
            tracing::debug!("row {id}: result not recorded before its lease may end; given up");
        } else {
            tracing::warn!(
                "row {id}: its result could not be recorded, and without a lease column it stays \
                 claimed: give it back with `rowclaim release`"
            );
        }
        held.give_up(std::slice::from_ref(id));
        add(&sh.tally.given_up);
    };
    loop {
        let deadline = sh.renews.then(|| held.lease_end());
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return give_up();
        }
        let limit = deadline.map_or(most, |d| sh.attempt_timeout(d));
        let flushed = tokio::time::timeout(limit, sh.settle(held, id, outcome.clone()))
            .await
            .unwrap_or(Flushed::TimedOut);
        match flushed {
            Flushed::Recorded => {
                sh.health.answered();
                return add(counter);
            }
            Flushed::Lost => {
                if uncertain {
                    tracing::debug!(
                        "row {id}: its result was most likely recorded before the connection broke"
                    );
                    return add(&sh.tally.unconfirmed);
                }
                if !held.abandoned.load(Ordering::Relaxed) {
                    tracing::warn!(
                        "row {id}: its result was refused: the row is no longer this worker's \
                         (its lease expired and another worker took it, or it was cancelled)"
                    );
                }
                return add(held.lost_counter(&sh.tally));
            }
            Flushed::Failed(e) if e.is_connection() || matches!(*e, Error::Database(_)) => {
                uncertain |= matches!(*e, Error::OutcomeUnknown { .. });
                sh.health.failed("recording results", &e);
            }
            Flushed::Failed(e) => {
                tracing::warn!("row {id}: its result could not be recorded: {e}");
                held.give_up(std::slice::from_ref(id));
                return add(&sh.tally.given_up);
            }
            Flushed::TimedOut => {
                uncertain = true;
                if sh.claimer.strategy() == Strategy::Transaction {
                    // The held transaction is in an unknown state: give the whole claim up.
                    held.abandoned.store(true, Ordering::Relaxed);
                    held.claim.abandon().await;
                    held.stop_all(StopReason::LeaseLost);
                    return add(&sh.tally.given_up);
                }
                sh.health
                    .unreachable("recording results", &"no answer in time");
            }
        }
        let wait = pause(failures);
        failures += 1;
        if sh.hurry.load(Ordering::SeqCst) || deadline.is_some_and(|d| Instant::now() + wait >= d) {
            return give_up();
        }
        tokio::time::sleep(wait).await;
    }
}

/// One row's result on its way to the database.
pub(super) struct Settle {
    pub(super) held: Arc<Held>,
    pub(super) id: RowId,
    pub(super) outcome: Outcome,
    pub(super) reply: oneshot::Sender<Flushed>,
}

/// What became of a result sent to the settler.
pub(super) enum Flushed {
    Recorded,
    /// The claim no longer held the row: nothing was changed.
    Lost,
    Failed(Arc<Error>),
    TimedOut,
}

/// Most results in one flush.
pub(super) const FLUSH_MOST: usize = 1000;

/// Flushes in flight at once. A second flush starts only while results pile up behind a running
/// one ([`PILE_UP`] or more): where a statement is quick (PostgreSQL) one flush at a time makes the
/// largest batches and costs least per result; where a batch of a thousand takes tens of
/// milliseconds (MariaDB), the next one would otherwise wait behind it with the server half idle.
pub(super) const FLUSHES_AT_ONCE: usize = 4;

/// Results waiting that start another flush beside the running ones.
pub(super) const PILE_UP: usize = FLUSH_MOST / 2;

/// Writes results in batches: whatever arrived while the previous flush ran (and, with a
/// `delay`, for that long after the first), one statement per claim and outcome, the claims'
/// statements side by side; more flushes at once when results pile up (see [`FLUSHES_AT_ONCE`]).
/// A row's result is sent again only after its flush answered, so no two flushes hold the same
/// row. A flush that takes longer than `limit` answers "timed out" to its rows, whose supervisors
/// try again.
pub(super) async fn settler(
    mut rx: mpsc::UnboundedReceiver<Settle>,
    delay: Duration,
    limit: Duration,
    metrics: WorkerMetrics,
) {
    let mut flushing = JoinSet::new();
    let mut pending: Vec<Settle> = Vec::new();
    let mut open = true;
    loop {
        let start = !pending.is_empty()
            && (flushing.is_empty()
                || (pending.len() >= PILE_UP && flushing.len() < FLUSHES_AT_ONCE));
        if start {
            if !delay.is_zero() {
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
            Some(_) = flushing.join_next(), if !flushing.is_empty() => {}
            else => break,
        }
    }
}

pub(super) async fn flush(batch: Vec<Settle>, limit: Duration, metrics: WorkerMetrics) {
    type Group = (Arc<Held>, Outcome, Vec<(RowId, oneshot::Sender<Flushed>)>);
    let mut groups: Vec<Group> = Vec::new();
    for s in batch {
        match groups
            .iter_mut()
            .find(|(h, o, _)| Arc::ptr_eq(h, &s.held) && *o == s.outcome)
        {
            Some((_, _, rows)) => rows.push((s.id, s.reply)),
            None => groups.push((s.held, s.outcome, vec![(s.id, s.reply)])),
        }
    }
    let mut statements = JoinSet::new();
    for (held, outcome, rows) in groups {
        let (seconds, batch_rows) = (metrics.settle_seconds.clone(), metrics.settle_rows.clone());
        statements.spawn(async move {
            let ids: Vec<RowId> = rows.iter().map(|(id, _)| id.clone()).collect();
            let started = Instant::now();
            let result = tokio::time::timeout(limit, held.claim.settle_rows(&ids, outcome)).await;
            seconds.record(secs(started.elapsed()));
            batch_rows.record(ids.len() as f64);
            // A broken transaction claim loses all its rows at once: stop the others' jobs now.
            held.stop_forgotten();
            let failed = match result {
                Ok(Ok(lost)) => {
                    for (id, reply) in rows {
                        let _ = reply.send(if lost.contains(&id) {
                            Flushed::Lost
                        } else {
                            Flushed::Recorded
                        });
                    }
                    return;
                }
                Ok(Err(e)) => Some(Arc::new(e)),
                Err(_) => None,
            };
            for (_, reply) in rows {
                let _ = reply.send(match &failed {
                    Some(e) => Flushed::Failed(e.clone()),
                    None => Flushed::TimedOut,
                });
            }
        });
    }
    while statements.join_next().await.is_some() {}
}
