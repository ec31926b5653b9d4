//! The stored schedules as an operator sees them ([`Queue::schedules`]), and forgetting one.

use std::time::SystemTime;

use serde::Serialize;

use super::{CatchUp, LATE_WINDOW};
use crate::backend::retry_transient;
use crate::error::{Error, Result};
use crate::queue::record::{at_ms, rfc3339, rfc3339_opt};
use crate::queue::store::store;
use crate::queue::Queue;

/// A schedule as stored, from [`Queue::schedules`]. Serialised with its times as RFC 3339 in
/// UTC with milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ScheduleStatus {
    /// Its name.
    pub name: String,
    /// Its cron expression, or `every <interval>`.
    pub expression: String,
    /// The time zone of its cron expression (none for an interval).
    pub zone: Option<String>,
    /// The queue its jobs go to.
    pub queue: String,
    /// The kind of its jobs.
    pub kind: String,
    /// What it does with missed ticks.
    pub catch_up: CatchUp,
    /// Its latest tick that enqueued a job.
    #[serde(serialize_with = "rfc3339_opt")]
    pub last_tick: Option<SystemTime>,
    /// The job of that tick.
    pub last_job: Option<i64>,
    /// Its next tick.
    #[serde(serialize_with = "rfc3339")]
    pub next_tick: SystemTime,
    /// Whether its next tick is more than [`LATE_WINDOW`] past by the database's clock: no
    /// scheduler runs it (it was removed from every scheduler's schedules, or none is running).
    pub overdue: bool,
}

impl Queue {
    /// The stored schedules, by name: what schedulers have registered, with their last and next
    /// ticks.
    pub async fn schedules(&self) -> Result<Vec<ScheduleStatus>> {
        let s = store(&self.db);
        let (now, rows) = retry_transient!(
            async { Ok::<_, Error>((s.schedule_now().await?, s.schedule_rows().await?)) }.await
        )
        .map_err(not_initialised)?;
        let late = i64::try_from(LATE_WINDOW.as_millis()).unwrap_or(i64::MAX);
        Ok(rows
            .into_iter()
            .map(|r| ScheduleStatus {
                overdue: now - r.next_tick > late,
                catch_up: r.catch_up.parse().unwrap_or_default(),
                next_tick: at_ms(r.next_tick),
                last_tick: r.last_tick.map(at_ms),
                last_job: r.last_job,
                name: r.name,
                queue: r.queue,
                kind: r.kind,
                expression: r.expression,
                zone: r.zone,
            })
            .collect())
    }

    /// Removes a stored schedule (one that no scheduler runs any more; a scheduler that still
    /// has it stores it again). Returns whether there was one.
    pub async fn forget_schedule(&self, name: &str) -> Result<bool> {
        retry_transient!(store(&self.db).forget_schedule(name).await).map_err(not_initialised)
    }
}

/// Says to run `init` when the schedules' table is missing ([`crate::Error::NotInitialised`]).
pub(super) fn not_initialised(e: Error) -> Error {
    crate::queue::not_set_up(e, "the schedules")
}
