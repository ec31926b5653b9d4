//! Recording one result: sent to the settler and tried again while the database fails, until
//! the row's lease would end; then the row is given up and comes back through its lease.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{Flushed, Reply, Settle, Settling};
use crate::backend::Outcome;
use crate::error::Error;
use crate::id::RowId;
use crate::worker::outage::{pause, Health};
use crate::worker::runtime::tally::{add, Count, Tally};

/// What recording a result needs of the worker: where results go, what it counts and whom it
/// tells about outages, and its rules.
pub(in crate::worker::runtime) struct Recorder<'a, T> {
    pub(in crate::worker::runtime) settles: &'a mpsc::UnboundedSender<Settling<T>>,
    pub(in crate::worker::runtime) tally: &'a Tally,
    pub(in crate::worker::runtime) health: &'a Health,
    /// Stopping now: a result gets one try, not retries until its lease ends.
    pub(in crate::worker::runtime) hurry: &'a AtomicBool,
    /// Claims have leases: a result is retried until its lease would end (else until it is
    /// recorded, or the worker stops now).
    pub(in crate::worker::runtime) renews: bool,
    /// The longest one try may take.
    pub(in crate::worker::runtime) attempt_most: Duration,
}

impl<T: Settle> Recorder<'_, T> {
    /// Records a row's outcome through the settler, retrying while the database fails, until the
    /// lease would end (a source whose claims never expire: until the worker stops now); then
    /// gives the row up, and it comes back through its lease. `counter` counts it once recorded.
    #[cfg(test)]
    pub(in crate::worker::runtime) async fn record(
        &self,
        target: &Arc<T>,
        id: &RowId,
        outcome: Outcome,
        counter: &Count,
    ) {
        self.record_from(target, id, outcome, counter, None).await;
    }

    /// Goes on recording a row's outcome after its first try, sent without a recorder, was
    /// answered `first` (see [`Reply::Then`]).
    pub(in crate::worker::runtime) async fn record_after(
        &self,
        target: &Arc<T>,
        id: &RowId,
        outcome: Outcome,
        counter: &Count,
        first: Flushed,
    ) {
        self.record_from(target, id, outcome, counter, Some(first))
            .await;
    }

    /// Whether a result is still worth sending: its lease has not ended (or it has none). One
    /// that is not is given up.
    pub(in crate::worker::runtime) fn worth_sending(&self, target: &T, id: &RowId) -> bool {
        let ended = self.renews && Instant::now() >= target.lease().end();
        if ended {
            self.give_up(target, id);
        }
        !ended
    }

    async fn record_from(
        &self,
        target: &Arc<T>,
        id: &RowId,
        outcome: Outcome,
        counter: &Count,
        mut answer: Option<Flushed>,
    ) {
        let mut failures = 0u32;
        // A try whose answer was lost may have gone through: a refusal after it proves nothing.
        let mut uncertain = false;
        loop {
            let deadline = self.renews.then(|| target.lease().end());
            let flushed = match answer.take() {
                Some(flushed) => flushed,
                None => {
                    if !self.worth_sending(target, id) {
                        return;
                    }
                    let limit = deadline.map_or(self.attempt_most, |d| {
                        d.saturating_duration_since(Instant::now())
                            .min(self.attempt_most)
                    });
                    tokio::time::timeout(limit, self.send(target, id, outcome.clone()))
                        .await
                        .unwrap_or(Flushed::TimedOut)
                }
            };
            let answered = self.answered(target, id, &outcome, flushed, &mut uncertain, counter);
            if answered.await.is_break() {
                return;
            }
            let wait = pause(failures);
            failures += 1;
            if self.hurry.load(Ordering::SeqCst)
                || deadline.is_some_and(|d| Instant::now() + wait >= d)
            {
                return self.give_up(target, id);
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// A result was recorded.
    pub(in crate::worker::runtime) fn recorded(&self, counter: &Count) {
        self.health.answered();
        add(counter);
    }

    /// Sends a row's result to the settler and waits for what became of it.
    async fn send(&self, target: &Arc<T>, id: &RowId, outcome: Outcome) -> Flushed {
        let (reply, answer) = oneshot::channel();
        let settling = Settling {
            target: target.clone(),
            id: id.clone(),
            outcome,
            reply: Reply::Wait(reply),
        };
        if self.settles.send(settling).is_err() {
            return Flushed::TimedOut; // the settler is gone: the worker is over
        }
        answer.await.unwrap_or(Flushed::TimedOut)
    }

    /// Acts on one try's answer: breaks when the result is settled one way or another, goes on
    /// when it is worth another try.
    async fn answered(
        &self,
        target: &T,
        id: &RowId,
        outcome: &Outcome,
        flushed: Flushed,
        uncertain: &mut bool,
        counter: &Count,
    ) -> ControlFlow<()> {
        match flushed {
            Flushed::Recorded => self.recorded(counter),
            Flushed::Lost => self.lost(target, id, outcome, *uncertain, counter).await,
            Flushed::Failed(e) if e.is_connection() || matches!(*e, Error::Database(_)) => {
                *uncertain |= matches!(*e, Error::OutcomeUnknown { .. });
                self.health.failed("recording results", &e);
                return ControlFlow::Continue(());
            }
            Flushed::Failed(e) => {
                tracing::warn!("row {id}: its result could not be recorded: {e}");
                target.give_up(std::slice::from_ref(id));
                self.tally.gave_up(std::slice::from_ref(id));
            }
            Flushed::TimedOut => {
                *uncertain = true;
                if target.abandon_if_unsure().await {
                    self.tally.gave_up(std::slice::from_ref(id));
                    return ControlFlow::Break(());
                }
                self.health.no_answer("recording results");
                return ControlFlow::Continue(());
            }
        }
        ControlFlow::Break(())
    }

    /// The claim no longer held the row when its result came. After a try whose answer was
    /// lost, the row is looked at: showing this claim's outcome, the first try went through.
    async fn lost(
        &self,
        target: &T,
        id: &RowId,
        outcome: &Outcome,
        uncertain: bool,
        counter: &Count,
    ) {
        if uncertain {
            if target.settled_as(id, outcome).await {
                tracing::debug!("row {id}: its result was recorded before the connection broke");
                return add(counter);
            }
            tracing::debug!(
                "row {id}: its result was most likely recorded before the connection broke"
            );
            return add(&self.tally.unconfirmed);
        }
        if !target.lease().abandoned() {
            tracing::warn!(
                "row {id}: its result was refused: the row is no longer this worker's \
                 (its lease expired and another worker took it, or it was cancelled)"
            );
        }
        self.tally.gone(target.lease(), std::slice::from_ref(id));
    }

    /// The result could not be recorded in time: the row is let go.
    fn give_up(&self, target: &T, id: &RowId) {
        if self.renews {
            tracing::debug!("row {id}: result not recorded before its lease may end; given up");
        } else {
            tracing::warn!(
                "row {id}: its result could not be recorded, and without a lease column it stays \
                 claimed: give it back with `rowclaim release`"
            );
        }
        target.give_up(std::slice::from_ref(id));
        self.tally.gave_up(std::slice::from_ref(id));
    }
}
