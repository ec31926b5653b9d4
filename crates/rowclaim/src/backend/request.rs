//! What the rest of the crate asks of a driver and gets back: a claim's request and answer, the
//! place a claim ended, the state a settled row moves to, which rows of a token are meant.

use std::time::Duration;

use crate::mapping::{Fragment, Mapping};
use crate::strategy::Strategy;
use crate::value::IdList;

/// Called once a claim's writes have committed, before its rows are read ([`ClaimArgs::committed`]).
pub(crate) type Committed<'a> = &'a (dyn Fn() + Send + Sync);

/// A claim's request to a driver.
pub(crate) struct ClaimArgs<'a> {
    pub m: &'a Mapping,
    pub strategy: Resolved,
    pub batch: u32,
    pub lease: Duration,
    pub token: &'a str,
    /// Also look for rows whose lease expired (the claimer does now and then, not every time).
    pub expired: bool,
    /// Look for ready rows in these arms, in order (each a condition on top of the ready
    /// arm), instead of all ready rows at once: a layer above resumes where its last claim
    /// ended. A driver that cannot walk arms looks at all ready rows, which is never wrong.
    pub arms: Option<&'a [Fragment]>,
    /// Called right after the claim's rows are claimed and committed, before the driver reads
    /// them into values, where it claims in a write transaction of its own (SQLite's token and
    /// lease-table claims) and only when rows came: a caller that waited for its turn at
    /// SQLite's one write lock lets the next writer go there, not after the reading (2–5 ms a
    /// claim of 1,000 rows). Nothing else of this claim may write after it (the claim core
    /// passes it only then).
    pub committed: Option<Committed<'a>>,
}

/// What a driver's claim returns; `H` is the driver's open transaction.
pub(crate) struct Claimed<H> {
    /// Each claimed row as a JSON object of its columns.
    pub rows: Vec<serde_json::Value>,
    /// For the transaction strategy: the open transaction holding the rows' locks.
    pub held: Option<H>,
    /// Whether candidates were seen but all were taken by others first (optimistic, lease-table):
    /// the caller tries again instead of reporting "nothing to claim".
    pub lost_race: bool,
    /// When the claim got the write lock it waited for (SQLite), if the driver knows: the
    /// lease, computed by statements after it by the database's clock, runs from no earlier
    /// than this, which may be well after the claim was sent.
    pub locked_at: Option<std::time::Instant>,
}

impl<H> Claimed<H> {
    /// Nothing claimed.
    pub(crate) fn none() -> Claimed<H> {
        Claimed {
            rows: Vec::new(),
            held: None,
            lost_race: false,
            locked_at: None,
        }
    }

    /// Rows taken by a claim that cannot lose a race to another claimer.
    pub(crate) fn rows(rows: Vec<serde_json::Value>) -> Claimed<H> {
        Claimed {
            rows,
            ..Claimed::none()
        }
    }

    /// Rows taken by a claim that can lose races; `lost_race` when it saw candidates but others
    /// took them all first (the caller then tries again).
    pub(crate) fn raced(rows: Vec<serde_json::Value>, lost_race: bool) -> Claimed<H> {
        Claimed {
            lost_race,
            ..Claimed::rows(rows)
        }
    }

    /// Rows taken by a claim that read its candidates first and lost every one it found when
    /// it comes back empty (optimistic, lease-table).
    pub(crate) fn contested(rows: Vec<serde_json::Value>) -> Claimed<H> {
        let lost_race = rows.is_empty();
        Claimed::raced(rows, lost_race)
    }

    /// Rows held by an open transaction (the transaction strategy): none when nothing was found.
    pub(crate) fn held(rows: Vec<serde_json::Value>, held: Option<H>) -> Claimed<H> {
        Claimed {
            held,
            ..Claimed::rows(rows)
        }
    }

    /// The same answer, its lease counted from `at`, when the claim got the write lock.
    pub(crate) fn locked_at(self, at: std::time::Instant) -> Claimed<H> {
        Claimed {
            locked_at: Some(at),
            ..self
        }
    }

    /// The same answer with the driver's transaction wrapped for the rest of the crate.
    pub(crate) fn map_held<T>(self, f: impl FnOnce(H) -> T) -> Claimed<T> {
        Claimed {
            rows: self.rows,
            held: self.held.map(f),
            lost_race: self.lost_race,
            locked_at: self.locked_at,
        }
    }
}

/// A strategy as a driver runs it: `auto` already resolved for this server and table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    SkipLocked,
    Token,
    Optimistic,
    LeaseTable,
    Transaction,
}

impl Resolved {
    /// `strategy`, which must be resolved already.
    pub(crate) fn of(strategy: Strategy) -> crate::error::Result<Resolved> {
        Ok(match strategy {
            Strategy::SkipLocked => Resolved::SkipLocked,
            Strategy::Token => Resolved::Token,
            Strategy::Optimistic => Resolved::Optimistic,
            Strategy::LeaseTable => Resolved::LeaseTable,
            Strategy::Transaction => Resolved::Transaction,
            Strategy::Auto => {
                return Err(crate::error::Error::Internal(
                    "strategy auto reached a driver unresolved".into(),
                ))
            }
        })
    }
}

/// The state a settled row moves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done, with what the handler produced (JSON text) where the mapping keeps it.
    Done(Option<String>),
    /// Failed for good (the managed queue's `dead`), with the error if there is a column for it.
    Failed(Option<String>),
    /// Given back, ready at once.
    Ready,
    /// Given back, ready again after a delay (needs a run-at column), keeping the error.
    Retry {
        after: Duration,
        error: Option<String>,
    },
    /// Given back to run again after a delay without using an attempt: ready, the claim's
    /// attempt taken back, run-at moved on (where there is a column for each).
    Snooze { after: Duration },
    /// Given back before it started (its queue was paused, or the worker stopped): ready at
    /// once, the claim's attempt taken back, its place in the order kept.
    Unstarted,
}

impl Outcome {
    /// Whether settling this way deletes the row instead of changing its status: a completed job
    /// of a managed queue that keeps no completed jobs.
    pub(crate) fn deletes(&self, m: &Mapping) -> bool {
        matches!(self, Outcome::Done(_)) && m.deletes_done()
    }

    /// Gives the row back as it was, ready, without a result to write: under the
    /// `transaction` strategy such a row is left as it is and only its lock goes.
    pub(crate) fn gives_back(&self) -> bool {
        matches!(
            self,
            Outcome::Ready | Outcome::Snooze { .. } | Outcome::Unstarted
        )
    }

    pub(crate) fn status<'m>(&self, m: &'m Mapping) -> &'m crate::id::RowId {
        match self {
            Outcome::Done(_) => &m.done,
            Outcome::Failed(_) => &m.failed,
            Outcome::Ready
            | Outcome::Retry { .. }
            | Outcome::Snooze { .. }
            | Outcome::Unstarted => &m.ready,
        }
    }
}

/// Which rows of a token an operation applies to.
pub(crate) enum Target<'a> {
    /// All rows the token holds.
    All,
    /// These rows; all or nothing.
    Ids(&'a IdList, usize),
}

/// Which rows of a source a look at it wants (`Claimer::rows`, `Claimer::row`): values parsed
/// to the status and id columns' kinds, to be bound.
pub(crate) struct RowQuery {
    pub status: Option<crate::id::RowId>,
    pub id: Option<crate::id::RowId>,
    /// Only rows whose id sorts after this one (the next page).
    pub after: Option<crate::id::RowId>,
    pub limit: i64,
}

/// A row as a driver reads it for a look: the row as JSON, its status as text, who holds it
/// (owner column or lease table) and when that lease ends, in epoch milliseconds.
pub(crate) type StoredRow = (
    serde_json::Value,
    Option<String>,
    Option<String>,
    Option<i64>,
);
