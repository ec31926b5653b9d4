//! What the rest of the crate asks of a driver and gets back: a claim's request and answer, the
//! place a claim ended, the state a settled row moves to, which rows of a token are meant.

use std::time::Duration;

use crate::mapping::Mapping;
use crate::value::IdList;
use crate::Strategy;

/// A claim's request to a driver.
pub(crate) struct ClaimArgs<'a> {
    pub m: &'a Mapping,
    pub strategy: Resolved,
    pub batch: u32,
    pub lease: Duration,
    pub token: &'a str,
    /// Also look for rows whose lease expired (the claimer does now and then, not every time).
    pub expired: bool,
    /// Managed queue: resume the walk of ready rows after this place in the queue's order
    /// (drivers that cannot ignore it and return no position).
    pub after: Option<Position>,
}

/// A place in the managed queue's claim order (priority descending, then run-at, then id): where
/// a claim ended. The next claim resumes after it instead of walking again, from the start of
/// the ready index, past the entries of every job claimed since the last vacuum; PostgreSQL
/// keeps those entries until vacuum removes them (for as long as any snapshot may still see the
/// rows), and every claim from the start would step over all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    pub priority: i64,
    /// Microseconds since the Unix epoch: exact, unlike a float of seconds.
    pub run_at_us: i64,
    pub id: i64,
}

impl Position {
    /// Later in the claim order sorts greater.
    fn key(&self) -> (std::cmp::Reverse<i64>, i64, i64) {
        (std::cmp::Reverse(self.priority), self.run_at_us, self.id)
    }

    /// The later of two places in the claim order.
    pub(crate) fn later(self, other: Position) -> Position {
        if other.key() > self.key() {
            other
        } else {
            self
        }
    }
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
    /// Where in the managed queue's order this claim ended, when the driver resumes claims.
    pub position: Option<Position>,
}

impl<H> Claimed<H> {
    /// Nothing claimed.
    pub(crate) fn none() -> Claimed<H> {
        Claimed {
            rows: Vec::new(),
            held: None,
            lost_race: false,
            position: None,
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

    /// The same answer with the driver's transaction wrapped for the rest of the crate.
    pub(crate) fn map_held<T>(self, f: impl FnOnce(H) -> T) -> Claimed<T> {
        Claimed {
            rows: self.rows,
            held: self.held.map(f),
            lost_race: self.lost_race,
            position: self.position,
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
    pub(crate) fn of(strategy: Strategy) -> crate::Result<Resolved> {
        Ok(match strategy {
            Strategy::SkipLocked => Resolved::SkipLocked,
            Strategy::Token => Resolved::Token,
            Strategy::Optimistic => Resolved::Optimistic,
            Strategy::LeaseTable => Resolved::LeaseTable,
            Strategy::Transaction => Resolved::Transaction,
            Strategy::Auto => {
                return Err(crate::Error::Internal(
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
    /// Given back before it started (its queue was paused): ready at once, the claim's attempt
    /// taken back, its place in the order kept.
    Unstarted,
}

impl Outcome {
    /// Whether settling this way deletes the row instead of changing its status: a completed job
    /// of a managed queue that keeps no completed jobs.
    pub(crate) fn deletes(&self, m: &Mapping) -> bool {
        matches!(self, Outcome::Done(_)) && m.delete_done
    }

    /// Gives the row back as it was, ready, without a result to write: under the
    /// `transaction` strategy such a row is left as it is and only its lock goes.
    pub(crate) fn gives_back(&self) -> bool {
        matches!(
            self,
            Outcome::Ready | Outcome::Snooze { .. } | Outcome::Unstarted
        )
    }

    pub(crate) fn status<'m>(&self, m: &'m Mapping) -> &'m crate::RowId {
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
    pub status: Option<crate::RowId>,
    pub id: Option<crate::RowId>,
    /// Only rows whose id sorts after this one (the next page).
    pub after: Option<crate::RowId>,
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
