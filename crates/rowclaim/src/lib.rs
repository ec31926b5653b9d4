//! # rowclaim
//!
//! Share the rows of one SQL table between many processes, on many machines, so that every row is
//! processed by exactly one of them at a time and no row is lost when one of them dies. Works on
//! PostgreSQL, MySQL 8 / MariaDB 10.6+ and SQLite, on a table you already have.
//!
//! ```no_run
//! # async fn demo() -> rowclaim::Result<()> {
//! use rowclaim::{Db, Source, Strategy};
//! use std::time::Duration;
//!
//! let db = Db::connect("postgres://app@localhost/app").await?;
//! let source = Source::new("invoices")
//!     .status_values("new", "sending", "sent", "failed")
//!     .owner_column("worker")
//!     .lease_column("lease_until")
//!     .attempts_column("attempts");
//! let claimer = db.claimer(source, Strategy::Auto).await?;
//! println!("claiming with {}", claimer.strategy()); // skip-locked
//!
//! let claim = claimer.claim(50, Duration::from_secs(30)).await?;
//! for row in claim.rows() {
//!     match send(&row.data).await {
//!         Ok(()) => claim.complete(&row.id).await?,
//!         Err(_) => claim.fail(&row.id).await?,
//!     }
//! }
//! # Ok(()) }
//! # async fn send(_: &serde_json::Value) -> Result<(), ()> { Ok(()) }
//! ```
//!
//! ## Words
//!
//! - A [`Source`] is a table and its mapping: id and status columns, the four status values, and
//!   optional owner, lease and attempts columns, an order and a filter.
//! - A [`Claim`] is up to N rows taken at once under a fresh [`Token`] (UUID v7).
//! - Its **lease** is a deadline computed by the database's clock. Rows whose lease expired are
//!   claimable again.
//! - **Fencing**: completing, failing, releasing and extending are conditional on the token. A
//!   claimer whose rows were re-claimed after its lease expired changes nothing and gets
//!   [`Error::LeaseLost`]. A row reaches `done` once, even if it was executed twice.
//! - A [`Strategy`] is how a claim is taken: `skip-locked`, `token`, `optimistic`, `lease-table`,
//!   `transaction`, or `auto`.
//! - The managed queue ([`Queue`]) holds jobs; a **job type** ([`JobArgs`]) is a serde type that
//!   names its kind: [`Queue::enqueue`] takes its values and [`Worker::register`] runs them with a
//!   handler of that type. [`NewJob`] and [`Worker::handle`] are the same in JSON.
//!
//! ## Guarantees
//!
//! At-least-once execution, exactly-once completion. The source's `ORDER BY` is honoured among
//! unclaimed rows. Transient errors (deadlocks, lock-wait timeouts, serialization failures, SQLite
//! busy) are retried inside the library. Identifiers are validated and quoted; values are always
//! bound parameters. The source's filter (`--where`) is the one piece of SQL taken as written: it
//! must come from the operator, not from end users.

#![warn(missing_docs)]
// Helpers shared by some drivers go unused in a build with only the others.
#![cfg_attr(
    not(all(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]

mod backend;
mod check;
mod claim;
mod db;
mod error;
mod id;
pub mod journal;
mod locking;
mod mapping;
pub mod metrics;
mod queue;
mod redact;
pub mod registry;
mod report;
mod shape;
mod source;
mod strategy;
mod value;
mod wait;
mod worker;

/// README.md's Rust examples, compiled as doctests so that they keep compiling (each only
/// defines functions: none runs against a database here; `tests/typed.rs` runs the typed one).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

pub use backend::turn::Turns;
pub use backend::{Capability, ServerInfo};
pub use check::CheckReport;
pub use claim::{Backlog, Claim, ClaimedRow, Claimer, LockedRows, RowFilter, SourceRow, Token};
pub use db::{ConnectOptions, Db};
pub use error::{DatabaseError, Error, ErrorKind, Result};
pub use id::RowId;
pub use locking::{LockMode, LockWait};
pub use queue::{
    backoff, schedule_key, AttemptError, BulkAction, CatchUp, Enqueued, Exactness, Group, Job,
    JobArgs, JobFailure, JobFilter, JobRecord, Link, Links, NewJob, Queue, QueueLimits,
    QueueSettings, QueueStats, Rate, Retention, Schedule, ScheduleStatus, Scheduled, Scheduler,
    SchedulerReport, ToNewJob, Wakeups, COUNT_CAP, DEFAULT_MAX_ATTEMPTS, JOB_STATUSES, LATE_WINDOW,
    MAX_CATCH_UP, MAX_RATE_PERIOD,
};
pub use redact::redacted_url;
pub use report::{Finding, Severity, Stats, Topic};
pub use source::Source;
pub use strategy::{Strategy, UnknownStrategy};
pub use worker::{
    Handler, IntoTaskResult, JobContext, Shutdown, StopReason, Task, TaskFuture, TaskResult,
    Worker, WorkerEntry, WorkerReport, WorkerState,
};
