//! Settings of one queue of the managed queue, kept in `rowclaim_queues` (a row only for queues
//! that have any): whether it is paused, and its limits (see `limits.rs`). Written once over a driver's [`Run`], since the SQL is
//! the same on every database but for its clock.
//!
//! A pause is honoured in the claim itself (see `sql::queue_condition`): a job of a paused queue
//! is never claimed once the pause has committed, whichever worker asks. Jobs a worker claimed
//! ahead before that are given back at its next look at the paused queues (every heartbeat);
//! jobs already running finish.

use std::time::SystemTime;

use serde::Serialize;

use super::limits::{QueueLimits, COLUMNS, LIMITED};
use super::record::at_ms;
use crate::backend::run::Run;
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::Result;

/// One queue's settings, from [`crate::Queue::settings`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct QueueSettings {
    /// The queue.
    pub name: String,
    /// Since when it is paused (by the database's clock), if it is.
    #[serde(serialize_with = "super::record::rfc3339_opt")]
    pub paused_at: Option<SystemTime>,
    /// Its limits.
    pub limits: QueueLimits,
}

/// Pauses (`paused`) or resumes `queue`; returns whether that changed anything (false: it was
/// paused, or running, already).
pub(crate) async fn set_paused<R: Run + ?Sized>(r: &R, queue: &str, paused: bool) -> Result<bool> {
    let now = R::Sql::NOW;
    if paused {
        // A row for the queue first, then the pause: two statements whose counts mean the
        // same on every database.
        ensure_row(r, queue).await?;
    }
    let mut b = Binder::<R::Sql>::new();
    let name = b.bind(queue.to_owned());
    let sql = if paused {
        format!(
            "UPDATE rowclaim_queues SET paused_at = {now} WHERE name = {name} \
             AND paused_at IS NULL"
        )
    } else {
        format!(
            "UPDATE rowclaim_queues SET paused_at = NULL WHERE name = {name} \
             AND paused_at IS NOT NULL"
        )
    };
    Ok(r.execute(Stmt::new(sql, b)).await? > 0)
}

/// Makes sure `queue` has a row in `rowclaim_queues` (one that exists is kept as it is).
pub(crate) async fn ensure_row<R: Run + ?Sized>(r: &R, queue: &str) -> Result<()> {
    let mut b = Binder::<R::Sql>::new();
    let name = b.bind(queue.to_owned());
    let sql = format!(
        "INSERT INTO rowclaim_queues (name) VALUES ({name}) {}",
        R::Sql::keep_existing("name")
    );
    r.execute(Stmt::new(sql, b)).await?;
    Ok(())
}

/// The paused queues, by name.
pub(crate) async fn paused<R: Run + ?Sized>(r: &R) -> Result<Vec<String>> {
    let sql = "SELECT name FROM rowclaim_queues WHERE paused_at IS NOT NULL ORDER BY name";
    r.texts(Stmt::new(sql.to_owned(), Binder::new())).await
}

/// Every queue with settings of its own (paused, or limited), by name.
pub(crate) async fn settings<R: Run + ?Sized>(r: &R) -> Result<Vec<QueueSettings>> {
    let sql = format!(
        "SELECT name, {}, {COLUMNS} FROM rowclaim_queues WHERE paused_at IS NOT NULL \
         OR {LIMITED} ORDER BY name",
        R::Sql::epoch_ms("paused_at")
    );
    let rows = r.named_numbers(Stmt::new(sql, Binder::new()), 7).await?;
    Ok(rows
        .into_iter()
        .map(|(name, columns)| QueueSettings {
            name,
            paused_at: columns.first().copied().flatten().map(at_ms),
            limits: QueueLimits::from_columns(columns.get(1..).unwrap_or_default()),
        })
        .collect())
}
