//! Schedules: jobs of the managed queue enqueued on a cron expression (in a time zone) or every
//! fixed interval, by any number of schedulers at once, each tick exactly once.
//!
//! State lives in `rowclaim_schedules` (schema component `schedules`, made by
//! [`crate::Queue::init`]): one row per schedule with its next tick. A scheduler that finds a
//! tick due (by the database's clock) advances the row with a compare-and-set `UPDATE … WHERE
//! name = ? AND next_tick = <what it read>` and enqueues the tick's job in the same transaction.
//! Of several schedulers racing for a tick, one update matches; the others match nothing and
//! enqueue nothing. Each tick's job also carries the unique key `schedule:<name>:<epoch secs>`
//! and runs at its tick.
//!
//! - `define`: a schedule as given and as checked;
//! - `timing`: when it ticks, as arithmetic on epoch milliseconds;
//! - `scheduler`: the loop that registers schedules and enqueues their ticks;
//! - `store`: every statement, written once for every database;
//! - `status`: the stored schedules as an operator sees them.

mod define;
mod scheduler;
#[cfg(test)]
mod snapshots;
mod status;
mod store;
mod timing;

pub use define::{unique_key, CatchUp, Schedule};
pub use scheduler::{Scheduler, SchedulerReport};
pub use status::ScheduleStatus;
pub(crate) use store::Schedules;
pub use timing::{LATE_WINDOW, MAX_CATCH_UP};
