//! The managed job queue: `rowclaim_jobs`, a table whose mapping rowclaim owns.
//!
//! Jobs carry a queue name, a kind, a JSON payload, a priority, a time to run at, a most-attempts
//! count and an optional unique key. Their states: `ready` → `running` → `completed`, or back to
//! `ready` with a later run-at after a failure, or `dead` after the last attempt; `cancelled` by
//! hand. A job that waits for other jobs is `waiting` until they finish (`after.rs`), then
//! `ready`, or `cancelled` when one of them failed. Claiming, fencing and lease expiry are the same as for any source.

mod after;
mod bulk;
mod claim;
mod counts;
mod enqueue;
mod enqueue_sql;
mod incoming;
mod limits;
mod migrate;
mod payload;
mod record;
mod schedule;
#[cfg(test)]
mod script;
mod settings;
#[cfg(test)]
mod snapshots;
mod store;
mod typed;
mod waits;
mod wakeups;

pub use bulk::BulkAction;
pub(crate) use claim::served;
pub use counts::COUNT_CAP;
pub(crate) use job::JobParts;
pub use job::{
    backoff, Enqueued, Exactness, Job, JobFailure, NewJob, QueueStats, Retention,
    DEFAULT_MAX_ATTEMPTS,
};
pub use limits::{QueueLimits, Rate, MAX_RATE_PERIOD};
pub use record::{AttemptError, JobFilter, JobRecord, Scheduled, JOB_STATUSES};
pub use schedule::{
    unique_key as schedule_key, CatchUp, Schedule, ScheduleStatus, Scheduler, SchedulerReport,
    LATE_WINDOW, MAX_CATCH_UP,
};
pub use settings::QueueSettings;
pub use typed::{JobArgs, ToNewJob};
pub use waits::{Group, Link, Links};
pub use wakeups::Wakeups;
#[cfg(feature = "postgres")]
pub(crate) use wakeups::CHANNEL;

mod job;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::backend::{retry_transient, Outcome};
use crate::claim::{Claim, Claimer};
use crate::db::Db;
use crate::error::{DbKind, Error, Result};
use crate::id::RowId;
use crate::strategy::Strategy;
use incoming::Incoming;
use store::store;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

/// The queue store role: what each database writes its own way for the managed queue (one file
/// per database beside this one), with what every database does alike (written once:
/// [`store::Shared`], [`schedule::Schedules`]). One door: [`store::store`] finds a database's.
#[async_trait::async_trait]
pub(crate) trait QueueStore:
    store::Shared + schedule::Schedules + bulk::Bulk + after::Waits + Send + Sync
{
    /// Creates or migrates the managed queue's tables, then the schedules' (each component
    /// versioned; concurrent runs take turns).
    async fn init(&self) -> Result<()>;
    /// Enqueues jobs in one transaction, all or none. Without `ids` the caller only counts the
    /// new jobs: a store may then answer 0 as their ids (PostgreSQL's COPY then leaves them to
    /// the column's default instead of asking the sequence first).
    async fn enqueue(&self, jobs: &mut Incoming<'_>, ids: bool) -> Result<Vec<Enqueued>>;
    /// Cancels, retries or prunes jobs; returns how many changed.
    async fn admin(&self, op: Admin) -> Result<u64>;
    /// Jobs per queue and status, oldest due ready job, recent throughput.
    async fn stats(&self, queue: Option<&str>) -> Result<QueueStats>;
    /// Jobs as stored, newest first: those `filter` lets through, or the one job `id`.
    async fn records(&self, filter: &JobFilter, id: Option<i64>) -> Result<Vec<JobRecord>>;
    /// A connection that hears of new jobs, where the database can push them
    /// ([`crate::Capability::Listen`]); `None` elsewhere.
    async fn listen(&self) -> Result<Option<Listener>>;
    /// Wakes the workers listening for `queue` as a new job would (nothing where there is no
    /// listening).
    async fn wake(&self, queue: &str) -> Result<()>;
}

/// A connection listening for enqueues.
#[derive(Debug)]
pub(crate) enum Listener {
    /// The listener, and the driver to make a new one after a failover moved the pool.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::postgres::PgListener, crate::backend::postgres::Pg),
}

impl Listener {
    /// The queue of the next job enqueued.
    async fn recv(&mut self) -> Result<String> {
        #[cfg(feature = "postgres")]
        match self {
            Listener::Postgres(l, pg) => match l.recv().await {
                Ok(n) => Ok(n.payload().to_owned()),
                Err(e) => {
                    // The listener reconnects by itself, but to the pool it was made from,
                    // which a failover may have closed: make it again from where the pool is now.
                    if let Ok(Some(fresh)) = pg.listener().await {
                        *l = fresh;
                    }
                    Err(crate::backend::postgres::error(e))
                }
            },
        }
        // Without PostgreSQL there is no listener to have.
        #[cfg(not(feature = "postgres"))]
        match *self {}
    }
}

/// The managed job queue of a database. Get one with [`Db::queue`].
#[derive(Clone, Debug)]
pub struct Queue {
    db: Db,
}

impl Db {
    /// The managed job queue in this database (create it with [`Queue::init`]).
    pub fn queue(&self) -> Queue {
        Queue { db: self.clone() }
    }
}

impl Queue {
    /// Creates or migrates `rowclaim_jobs` and its indexes, then `rowclaim_schedules` (the
    /// schedules' own component). Versioned and idempotent; safe when several processes run it
    /// at once (they take turns on a lock; on a Galera cluster, where that lock is per node, a
    /// step that collides with another node's is run again).
    pub async fn init(&self) -> Result<()> {
        store(&self.db).init().await
    }

    /// A claimer of due jobs from `queues` (all queues when empty), highest priority first, then
    /// oldest run-at. It uses skip-locked where the server has it, token elsewhere. Completed
    /// jobs are kept.
    pub async fn claimer(&self, queues: &[String]) -> Result<Claimer> {
        self.claimer_with(queues, Retention::Keep).await
    }

    /// [`Queue::claimer`], with what becomes of the jobs it completes.
    pub async fn claimer_with(&self, queues: &[String], completed: Retention) -> Result<Claimer> {
        self.claimer_of(queues, &[], completed).await
    }

    /// [`Queue::claimer_with`], claiming only jobs of `kinds` (all when empty). The claim
    /// itself asks for those kinds: jobs of other kinds are never claimed and given back.
    pub async fn claimer_of(
        &self,
        queues: &[String],
        kinds: &[String],
        completed: Retention,
    ) -> Result<Claimer> {
        for q in queues {
            if q.is_empty() {
                return Err(Error::InvalidInput("queue name must not be empty".into()));
            }
        }
        let jobs = claim::Jobs {
            queues: queues.to_vec(),
            kinds: kinds.to_vec(),
            delete_done: completed == Retention::Delete,
        };
        self.db
            .layered_claimer(&claim::source(), &jobs)
            .await
            .map_err(not_initialised)
    }

    /// [`Db::check`] for a claimer of jobs from `queues` (all queues when empty), as
    /// [`Queue::claimer`] makes it: the strategy it uses, whether its claim reads ready jobs
    /// through the queue's index, privileges, the server's settings and the clock. Writes
    /// nothing.
    pub async fn check(&self, queues: &[String]) -> Result<crate::check::CheckReport> {
        for q in queues {
            if q.is_empty() {
                return Err(Error::InvalidInput("queue name must not be empty".into()));
            }
        }
        let jobs = claim::Jobs {
            queues: queues.to_vec(),
            kinds: Vec::new(),
            delete_done: false,
        };
        self.db
            .check_source(&claim::source(), Strategy::Auto, Some(&jobs))
            .await
            .map_err(not_initialised)
    }

    /// Cancels a waiting, ready or running job (a running one's result is then refused by
    /// fencing), and the jobs that wait for it (but those that run anyway, which it releases
    /// once the rest of what they wait for finished).
    /// Returns whether a job was cancelled.
    pub async fn cancel(&self, id: i64) -> Result<bool> {
        let cancelled = retry_transient!(store(&self.db).admin(Admin::Cancel(id)).await)? > 0;
        if cancelled {
            // The jobs that waited for it are cancelled with it (or run anyway).
            self.resolve(after::Scope::For(vec![id])).await?;
        }
        Ok(cancelled)
    }

    /// Makes a dead or cancelled job ready again, with its attempts reset. Returns whether one was.
    pub async fn retry(&self, id: i64) -> Result<bool> {
        Ok(retry_transient!(store(&self.db).admin(Admin::Retry(id)).await)? > 0)
    }

    /// Deletes a job that is not running (a running one must be cancelled first, so that its
    /// worker is fenced out rather than finding its job gone). The jobs waiting for one that
    /// had not completed are cancelled first, naming it. Returns whether one was deleted.
    pub async fn delete(&self, id: i64) -> Result<bool> {
        // The jobs waiting for a job deleted before it completed are cancelled (a job that is
        // gone counts as done for those still waiting).
        match self.get(id).await?.map(|j| j.status) {
            Some(s) if s == "waiting" || s == "ready" => {
                self.cancel(id).await?;
            }
            Some(s) if s == "dead" || s == "cancelled" => {
                self.resolve(after::Scope::For(vec![id])).await?;
            }
            _ => {}
        }
        Ok(retry_transient!(store(&self.db).admin(Admin::Delete(id)).await)? > 0)
    }

    /// Deletes completed, dead and cancelled jobs that finished longer than `age` ago.
    pub async fn prune(&self, age: Duration) -> Result<u64> {
        // A job waiting for a dead or cancelled job is cancelled before that job goes (a job
        // that is gone counts as done).
        self.release_waiting().await?;
        retry_transient!(store(&self.db).admin(Admin::Prune(age)).await)
    }

    /// Jobs as stored, newest first: all of them, or those of some queues, kinds or a state
    /// ([`JobFilter`]); the same fields on every database.
    pub async fn list(&self, filter: &JobFilter) -> Result<Vec<JobRecord>> {
        filter.check()?;
        let mut jobs = retry_transient!(store(&self.db).records(filter, None).await)
            .map_err(not_initialised)?;
        // A newer page is read upwards from its start (see `records_sql`).
        if filter.after_id.is_some() && filter.before_id.is_none() {
            jobs.reverse();
        }
        Ok(jobs)
    }

    /// How many jobs `filter` matches (its limit and page aside); with an action, how many of
    /// them that action would change (those in a state it takes).
    pub async fn count(&self, filter: &JobFilter, action: Option<BulkAction>) -> Result<u64> {
        filter.check()?;
        let f = JobFilter {
            before_id: None,
            after_id: None,
            ..filter.clone()
        };
        retry_transient!(store(&self.db).count(&f, action, None).await).map_err(not_initialised)
    }

    /// As [`Queue::count`], but reading at most `most + 1` matching jobs: `Some(n)` when `n <=
    /// most` jobs match, `None` when more do (the dashboard's "more than 10000 matching",
    /// [`COUNT_CAP`]). Many matching jobs are not read one by one; few matching jobs among
    /// many others may still be, as the filter's columns allow.
    pub async fn count_at_most(
        &self,
        filter: &JobFilter,
        action: Option<BulkAction>,
        most: u64,
    ) -> Result<Option<u64>> {
        filter.check()?;
        let f = JobFilter {
            before_id: None,
            after_id: None,
            ..filter.clone()
        };
        let bound = Some(most.saturating_add(1));
        let n = retry_transient!(store(&self.db).count(&f, action, bound).await)
            .map_err(not_initialised)?;
        Ok((n <= most).then_some(n))
    }

    /// Does `action` to every job `filter` matches that is in a state the action takes (as
    /// [`Queue::retry`], [`Queue::cancel`] and [`Queue::delete`] do to one), newest first, in
    /// batches of a few thousand jobs, each its own short transaction: a million jobs never
    /// take one giant transaction. Jobs enqueued after it started are left alone. With a
    /// limit, at most that many. A job changed meanwhile by another process is changed only
    /// if it still matches. A retry leaves a job whose unique key another pending job has as
    /// it is. Returns how many changed. A filter whose state the action cannot take (a retry
    /// of ready jobs) is refused; a filter without conditions takes every job.
    pub async fn bulk(&self, action: BulkAction, filter: &JobFilter) -> Result<u64> {
        action.check(filter)?;
        let store = store(&self.db);
        let mut rest = filter.limit.map(u64::from);
        let mut f = JobFilter {
            after_id: None,
            ..filter.clone()
        };
        let mut changed = 0;
        loop {
            let room = rest.map_or(bulk::BATCH, |r| r.min(u64::from(bulk::BATCH)) as u32);
            if room == 0 {
                break;
            }
            let batch =
                retry_transient!(store.batch(action, &f, room).await).map_err(not_initialised)?;
            let mut done = batch.changed;
            for id in batch.keyed {
                done += self.retry_keyed(id).await?;
            }
            changed += done;
            rest = rest.map(|r| r.saturating_sub(batch.found as u64));
            match batch.lowest {
                Some(low) if batch.found == room as usize => f.before_id = Some(low),
                _ => break,
            }
        }
        if action == BulkAction::Cancel && changed > 0 {
            // The jobs that waited for those cancelled are cancelled with them.
            self.release_waiting().await?;
        }
        Ok(changed)
    }

    /// Retries job `id`, which has a unique key: 1 if it is ready again, 0 if another pending
    /// job holds its key (or it changed state meanwhile).
    async fn retry_keyed(&self, id: i64) -> Result<u64> {
        match retry_transient!(store(&self.db).admin(Admin::Retry(id)).await) {
            Ok(n) => Ok(n),
            Err(e) => match retry_transient!(store(&self.db).key_taken(id).await) {
                Ok(true) => Ok(0),
                _ => Err(e),
            },
        }
    }

    /// Ready jobs of `queues` and `kinds` (all when empty) whose run-at is still to come and
    /// that never ran: what a worker `until_empty` leaves behind unless told to wait for them
    /// ([`crate::Worker::wait_scheduled`]).
    pub async fn scheduled(&self, queues: &[String], kinds: &[String]) -> Result<Scheduled> {
        let filter = JobFilter::new()
            .queues(queues.to_vec())
            .kinds(kinds.to_vec());
        retry_transient!(store(&self.db).scheduled(&filter).await).map_err(not_initialised)
    }

    /// One job by id, as stored.
    pub async fn get(&self, id: i64) -> Result<Option<JobRecord>> {
        let one = JobFilter::new().limit(1);
        let got = retry_transient!(store(&self.db).records(&one, Some(id)).await)
            .map_err(not_initialised)?;
        Ok(got.into_iter().next())
    }

    /// Pauses `queue`: from the moment this returns no worker claims a job of it (the claim
    /// itself checks), jobs a worker claimed ahead go back at its next heartbeat, and running
    /// jobs finish. Returns whether it was running before. The queue need not have jobs yet.
    pub async fn pause(&self, queue: &str) -> Result<bool> {
        check_queue_name(queue)?;
        retry_transient!(settings::settings(&self.db).set_paused(queue, true).await)
            .map_err(not_initialised)
    }

    /// Lets workers claim jobs of `queue` again. Returns whether it was paused.
    pub async fn resume(&self, queue: &str) -> Result<bool> {
        check_queue_name(queue)?;
        let resumed = retry_transient!(settings::settings(&self.db).set_paused(queue, false).await)
            .map_err(not_initialised)?;
        if resumed {
            // Idle workers that listen hear of it as of new jobs, instead of at their next poll.
            store(&self.db).wake(queue).await?;
        }
        Ok(resumed)
    }

    /// Sets `queue`'s limits, all of them (a limit `limits` leaves out is lifted;
    /// [`QueueLimits::default`] lifts every one). They hold for every claim that starts after
    /// this returns; workers that served the queue without limits move its jobs to the limited
    /// claim within a second, and jobs running already count towards them. The queue need not
    /// have jobs yet. Needs the queue's schema version 5 (`rowclaim init`).
    pub async fn limit(&self, queue: &str, limits: &QueueLimits) -> Result<()> {
        check_queue_name(queue)?;
        limits.check()?;
        retry_transient!(settings::settings(&self.db).set_limits(queue, limits).await)
            .map_err(not_initialised)?;
        // Idle workers that listen look again at once, under the new limits.
        store(&self.db).wake(queue).await
    }

    /// The paused queues' names (what a worker looks at every heartbeat).
    pub(crate) async fn paused(&self) -> Result<Vec<String>> {
        retry_transient!(settings::settings(&self.db).paused().await)
    }

    /// The queues with settings of their own (paused or limited ones), by name.
    pub async fn settings(&self) -> Result<Vec<QueueSettings>> {
        retry_transient!(settings::settings(&self.db).settings().await).map_err(not_initialised)
    }

    /// Jobs per queue and status, the oldest due ready job's wait, and recent throughput.
    pub async fn stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        retry_transient!(store(&self.db).stats(queue).await).map_err(not_initialised)
    }
}

/// A queue name as every job's is checked: 1 to 255 characters.
fn check_queue_name(queue: &str) -> Result<()> {
    if queue.is_empty() || queue.len() > 255 {
        return Err(Error::InvalidInput(format!(
            "queue name {queue:?} must have 1 to 255 characters"
        )));
    }
    Ok(())
}

/// Says what to do when the managed queue's tables are missing, or older than this rowclaim:
/// [`Error::NotInitialised`].
fn not_initialised(e: Error) -> Error {
    not_set_up(e, "the managed queue")
}

/// `e` as [`Error::NotInitialised`] for `what` when it says a table or column of rowclaim's own
/// is missing; as it is otherwise.
pub(crate) fn not_set_up(e: Error, what: &'static str) -> Error {
    let kind = e.db_kind();
    let missing = matches!(e, Error::MissingTable { .. }) || kind == Some(DbKind::MissingTable);
    let older = kind == Some(DbKind::MissingColumn);
    if !missing && !older {
        return e;
    }
    Error::NotInitialised {
        what,
        older,
        source: match e {
            Error::Database(d) => Some(d),
            _ => None,
        },
    }
}

impl Queue {
    /// Starts listening for new jobs of `queues` (all when empty). Create it before the first
    /// claim, so that no job enqueued in between is missed.
    pub async fn wakeups(&self, queues: &[String]) -> Result<Wakeups> {
        let listener = store(&self.db).listen().await?;
        Ok(Wakeups {
            listener,
            queues: queues.to_vec(),
        })
    }
}

/// Administrative changes to jobs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Admin {
    Cancel(i64),
    Retry(i64),
    Delete(i64),
    Prune(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let first = backoff(1).as_secs_f64();
        assert!((0.75..=1.25).contains(&first), "{first}");
        let tenth = backoff(10).as_secs_f64();
        assert!((384.0..=640.0).contains(&tenth), "{tenth}");
        assert!(backoff(50).as_secs_f64() <= 4500.0);
    }

    #[test]
    fn bad_jobs_are_refused() {
        assert!(NewJob::new(serde_json::json!({}))
            .queue("")
            .check()
            .is_err());
        let err = NewJob::new(serde_json::json!({}))
            .max_attempts(0)
            .check()
            .unwrap_err();
        assert!(err.to_string().contains("max attempts"), "{err}");
    }
}
