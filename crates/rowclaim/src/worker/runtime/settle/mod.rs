//! The settler: a finished job's outcome goes to one settler, which writes what piled up in one
//! statement per claim and outcome (fenced row by row), a few flushes at once when they pile up
//! ([`batch`]), what follows a statement ([`Settle::settled`]) beside the next flush; each result
//! is retried until its lease would end, then given up ([`record`]).
//!
//! Both work against [`Settle`], the few things they need of a claim, so that they can be tested
//! without a database; the runtime's [`Held`](super::held::Held) implements it over the claim
//! core.

mod batch;
mod record;
#[cfg(test)]
mod tests;

pub(super) use batch::{settler, FlushMetrics};
pub(super) use record::Recorder;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::lease::Lease;
use crate::backend::Outcome;
use crate::error::{Error, Result};
use crate::id::RowId;

/// A claim whose rows' results are written: what the settler and [`Recorder`] need of it.
pub(super) trait Settle: Send + Sync + 'static {
    /// The claim's lease as this worker last confirmed it: a result is worth writing until it
    /// ends.
    fn lease(&self) -> &Lease;

    /// Writes `outcome` for `ids`, in one statement where the strategy allows, fenced row by row.
    /// Returns the rows the claim no longer held: nothing was changed for them. An error leaves
    /// every row not yet written open, to be tried again.
    fn settle(
        &self,
        ids: &[RowId],
        outcome: Outcome,
    ) -> impl Future<Output = Result<Vec<RowId>>> + Send;

    /// Whether anything follows a committed settle of `outcome` ([`Settle::settled`]). Where
    /// nothing does, its rows are answered at once.
    fn follows(&self, outcome: &Outcome) -> bool {
        let _ = outcome;
        false
    }

    /// What follows a settle that committed, where [`Settle::follows`] (`lost`: the rows it did
    /// not write), before its
    /// rows are answered: the managed queue's look for the jobs that waited for those that
    /// finished. It runs beside the settler's next flush, not in front of it: a fast drain's
    /// flushes came one after another, each waiting for the look before (a round trip). It ends
    /// within the flush's time limit of the statement's start (so that a row is answered in
    /// time for a recorder waiting for it); a look not done by then is left to the workers'
    /// sweep.
    fn settled(&self, ids: &[RowId], lost: &[RowId]) -> impl Future<Output = ()> + Send {
        let _ = (ids, lost);
        async {}
    }

    /// Lets rows go unwritten: this worker stops looking after them (they come back when their
    /// lease ends) and stops their jobs, if running.
    fn give_up(&self, ids: &[RowId]);

    /// After a write whose answer was lost and a retry the claim refused: whether the row
    /// shows `outcome` written by this claim (its status, and this claim's token still in its
    /// owner column; or gone, where done rows are deleted), so that the first write went
    /// through. False when that cannot be told.
    fn settled_as(&self, id: &RowId, outcome: &Outcome) -> impl Future<Output = bool> + Send;

    /// After a write that went unanswered: a claim that cannot tell what state it is in (a held
    /// transaction) gives every row up and stops their jobs. Returns whether it did; other claims
    /// go on, and the write is tried again.
    fn abandon_if_unsure(&self) -> impl Future<Output = bool> + Send;
}

/// One row's result on its way to the settler.
pub(in crate::worker::runtime) struct Settling<T> {
    pub(in crate::worker::runtime) target: Arc<T>,
    pub(in crate::worker::runtime) id: RowId,
    pub(in crate::worker::runtime) outcome: Outcome,
    pub(in crate::worker::runtime) reply: Reply,
}

/// Where the answer about one result goes.
pub(in crate::worker::runtime) enum Reply {
    /// To a [`Recorder`] waiting for it, which tries again if need be.
    Wait(oneshot::Sender<Flushed>),
    /// A first try sent without anyone waiting: the settler calls this with the answer. Most
    /// results are recorded at the first try, so most need no task and no channel of their own;
    /// the call starts a [`Recorder`] for those that do not.
    Then(Box<dyn FnOnce(Flushed) + Send>),
}

impl Reply {
    fn send(self, flushed: Flushed) {
        match self {
            Reply::Wait(to) => {
                let _ = to.send(flushed);
            }
            Reply::Then(then) => then(flushed),
        }
    }
}

/// What became of a result sent to the settler.
#[derive(Debug)]
pub(in crate::worker::runtime) enum Flushed {
    Recorded,
    /// The claim no longer held the row: nothing was changed.
    Lost,
    Failed(Arc<Error>),
    TimedOut,
}
