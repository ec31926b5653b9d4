//! One claim as the runtime looks after it: the claim core's [`Claim`], its lease as this worker
//! last confirmed it ([`Lease`]), and the stop switches of its running jobs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::lease::Lease;
use super::settle::Settle;
use crate::backend::Outcome;
use crate::claim::Claim;
use crate::error::Result;
use crate::id::RowId;
use crate::worker::handler::StopReason;

/// One claim, as the runtime looks after it.
pub(super) struct Held {
    pub(super) claim: Arc<Claim>,
    pub(super) lease: Lease,
    /// Stop switches of the claim's rows whose handler is running.
    pub(super) running: Mutex<HashMap<RowId, watch::Sender<Option<StopReason>>>>,
    /// The claim holds a transaction (the transaction strategy): a write that went unanswered
    /// leaves it in an unknown state.
    pub(super) transaction: bool,
    /// The worker still runs the claim's lines whole ([`Held::runs_lines_whole`]).
    lines_whole: AtomicBool,
}

impl Held {
    pub(super) fn new(claim: Claim, transaction: bool) -> Arc<Held> {
        Arc::new(Held {
            lease: Lease::new(claim.lease(), claim.claimed_at().into()),
            running: Mutex::default(),
            transaction,
            lines_whole: AtomicBool::new(claim.lines_whole()),
            claim: Arc::new(claim),
        })
    }

    /// Whether the worker still runs the claim's lines whole: it holds lines, every row of
    /// their keys it took is in them ([`Claim::lines_whole`]), and none of the worker's rows
    /// went back unfinished, was lost or given up since it was made. Its rows that have not
    /// finished then all run or wait in their lines, so the next rows of those lines may be
    /// claimed to run behind them (`Claimer::claim_behind`). A row that went back may still
    /// show as running under its token until its result is written, and must not then count
    /// as the worker's own.
    pub(super) fn runs_lines_whole(&self) -> bool {
        self.lines_whole.load(Ordering::Relaxed)
    }

    /// A row of the worker went back unfinished, was lost or given up: see
    /// [`Held::runs_lines_whole`].
    pub(super) fn mark_lines_broken(&self) {
        self.lines_whole.store(false, Ordering::Relaxed);
    }

    pub(super) fn stop(&self, ids: &[RowId], reason: StopReason) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            if let Some(switch) = running.get(id) {
                let _ = switch.send(Some(reason));
            }
        }
    }

    pub(super) fn stop_all(&self, reason: StopReason) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for switch in running.values() {
            let _ = switch.send(Some(reason));
        }
    }

    /// Stops every running job whose row the claim no longer looks after (lost, given up, or
    /// dropped with a broken transaction). A switch is removed before its result is recorded,
    /// so a registered switch always belongs to a handler still running.
    pub(super) fn stop_forgotten(&self) {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for (id, switch) in running.iter() {
            if !self.claim.is_open(id) {
                let _ = switch.send(Some(StopReason::LeaseLost));
            }
        }
    }

    /// Gives rows up: this worker stops looking after them (they come back when their lease
    /// ends) and stops their jobs, if running.
    pub(super) fn give_up(&self, ids: &[RowId]) {
        self.mark_lines_broken();
        ids.iter().for_each(|id| self.claim.forget(id));
        self.stop(ids, StopReason::LeaseLost);
        if self.claim.open_count() == 0 {
            let claim = self.claim.clone();
            tokio::spawn(async move { claim.commit_if_done().await });
        }
    }

    /// Gives the whole claim up after a write that went unanswered, if it holds a transaction:
    /// that transaction is in an unknown state and is dropped unwritten (its rows come back
    /// through their lease). Returns whether it did.
    pub(super) async fn abandon_if_unsure(&self) -> bool {
        if !self.transaction {
            return false;
        }
        self.lease.abandon();
        self.claim.abandon().await;
        self.stop_all(StopReason::LeaseLost);
        true
    }
}

impl Held {
    /// After jobs of the managed queue finished for good (completed or dead), the jobs that
    /// wait for them look again (`queue/after.rs`), once the settle committed (`follows` says
    /// when). A look that fails is left to the workers' sweep: the finish is written already.
    async fn release_waiters(&self, ids: &[RowId], lost: &[RowId]) {
        let done: Vec<i64> = ids
            .iter()
            .filter(|id| !lost.contains(id))
            .filter_map(|id| match id {
                RowId::Int(i) => Some(*i),
                RowId::Text(_) => None,
            })
            .collect();
        if done.is_empty() {
            return;
        }
        if let Err(e) = self.claim.claimer().db().queue().finished(done).await {
            tracing::warn!("releasing the jobs that wait for finished jobs (the sweep will): {e}");
        }
    }
}

/// Whether rows settled so finished for good, so that the jobs waiting for them may be
/// released or cancelled: completed, or dead (a worker's failure that will be retried is
/// [`Outcome::Retry`], and leaves its job unfinished; one settles dead as [`Outcome::Failed`]
/// only on its last attempt). A batch settled otherwise sends no look at all. A cancelled job
/// is never settled by its worker (its result is refused): [`crate::Queue::cancel`] looks.
pub(super) fn finished_for_good(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Done(_) | Outcome::Failed(_) => true,
        Outcome::Ready | Outcome::Retry { .. } | Outcome::Snooze { .. } | Outcome::Unstarted => {
            false
        }
    }
}

/// The claim core behind the settler.
impl Settle for Held {
    fn lease(&self) -> &Lease {
        &self.lease
    }

    async fn settle(&self, ids: &[RowId], outcome: Outcome) -> Result<Vec<RowId>> {
        // A broken transaction claim loses all its rows at once: stop the others' jobs now, also
        // when the settler's time limit cuts the statement off.
        let _after = StopForgotten(self);
        self.claim.settle_rows(ids, outcome).await
    }

    fn follows(&self, outcome: &Outcome) -> bool {
        finished_for_good(outcome) && crate::queue::served(self.claim.claimer()).is_some()
    }

    async fn settled(&self, ids: &[RowId], lost: &[RowId]) {
        self.release_waiters(ids, lost).await;
    }

    fn give_up(&self, ids: &[RowId]) {
        Held::give_up(self, ids);
    }

    async fn settled_as(&self, id: &RowId, outcome: &Outcome) -> bool {
        self.claim.settled_as(id, outcome).await.unwrap_or(false)
    }

    async fn abandon_if_unsure(&self) -> bool {
        Held::abandon_if_unsure(self).await
    }
}

/// Stops the jobs whose rows the claim let go, when dropped.
struct StopForgotten<'a>(&'a Held);

impl Drop for StopForgotten<'_> {
    fn drop(&mut self) {
        self.0.stop_forgotten();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_jobs_finished_for_good_release_their_waiters() {
        let error = Some("boom".to_owned());
        assert!(finished_for_good(&Outcome::Done(None)));
        assert!(finished_for_good(&Outcome::Failed(error.clone())), "dead");
        let unfinished = [
            Outcome::Retry {
                after: Duration::from_secs(1),
                error,
            },
            Outcome::Ready,
            Outcome::Snooze {
                after: Duration::from_secs(1),
            },
            Outcome::Unstarted,
        ];
        for o in unfinished {
            assert!(!finished_for_good(&o), "{o:?} is not finished");
        }
    }
}
