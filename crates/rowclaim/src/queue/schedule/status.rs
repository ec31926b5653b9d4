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

impl Queue {
    /// Runs the schedule `name` once now, outside its ticks: enqueues a copy of the job its
    /// latest tick enqueued (queue, kind, payload, priority, attempts, time limit, limit key),
    /// to run now, without a unique key (a run by hand is not one of its ticks, which stay as
    /// they were). The stored schedule does not keep its job's payload, so the latest tick's
    /// job is the pattern: a schedule that never ticked, or whose latest job was deleted, is
    /// refused ([`Error::InvalidInput`], saying why). Returns the new job's id, or `None` when
    /// no schedule has that name.
    pub async fn run_schedule_now(&self, name: &str) -> Result<Option<i64>> {
        let Some(s) = self.schedules().await?.into_iter().find(|s| s.name == name) else {
            return Ok(None);
        };
        let Some(last) = s.last_job else {
            return Err(Error::InvalidInput(format!(
                "schedule {name} has not enqueued a job yet, and its job is copied from its \
                 latest tick's: run it once a scheduler has ticked it"
            )));
        };
        let Some(pattern) = self.get(last).await? else {
            return Err(Error::InvalidInput(format!(
                "schedule {name}: its latest job ({last}), whose copy a run now enqueues, was \
                 deleted; run it once its next tick has enqueued a job"
            )));
        };
        let mut job = crate::queue::NewJob::new(pattern.payload)
            .queue(pattern.queue)
            .kind(pattern.kind)
            .priority(i32::try_from(pattern.priority).unwrap_or(0))
            .max_attempts(i32::try_from(pattern.max_attempts).unwrap_or(1).max(1));
        if let Some(ms) = pattern.timeout_ms.and_then(|ms| u64::try_from(ms).ok()) {
            job = job.timeout(std::time::Duration::from_millis(ms));
        }
        if let Some(key) = pattern.limit_key {
            job = job.limit_key(key);
        }
        Ok(Some(self.enqueue(&job).await?.id))
    }
}

/// Says to run `init` when the schedules' table is missing ([`crate::Error::NotInitialised`]).
pub(super) fn not_initialised(e: Error) -> Error {
    crate::queue::not_set_up(e, "the schedules")
}
