//! The queue's API for jobs that wait for other jobs: enqueue with waits, a group and its last
//! job in one call, the look that releases or cancels waiting jobs, and what a job waits for
//! and what waits for it. The statements are in `after.rs`.

use serde::Serialize;

use super::after::{Resolved, Scope};
use super::store::store;
use super::{not_initialised, Enqueued, NewJob, Queue};
use crate::backend::retry_transient;
use crate::error::{Error, Result};

/// What [`Queue::enqueue_group`] enqueued: the group's jobs, in the order given, and the last
/// job, which waits for all of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Group {
    /// The group's jobs.
    pub jobs: Vec<Enqueued>,
    /// The job that waits for them.
    pub last: Enqueued,
}

/// Another job a job is linked to by a wait, and its state (`None`: it no longer exists:
/// deleted when it completed, or pruned).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Link {
    /// The other job's id.
    pub id: i64,
    /// Its state, if it still exists.
    pub status: Option<String>,
}

/// What a job waits for, what waits for it, and whether it runs anyway ([`Queue::links`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Links {
    /// The jobs it waits (or waited) for.
    pub waits_for: Vec<Link>,
    /// The jobs that wait (or waited) for it.
    pub waited_by: Vec<Link>,
    /// It runs also when a job it waits for ends dead or cancelled ([`NewJob::run_anyway`]),
    /// instead of being cancelled with it.
    pub run_anyway: bool,
}

impl Queue {
    /// Enqueues the jobs of a group and a last job that waits for all of them, in one call and
    /// one transaction: all or none. The last job runs once every job of the group completed;
    /// if one ends dead or cancelled, it is cancelled naming that job (unless it
    /// [`NewJob::run_anyway`]). It may also wait for other jobs ([`NewJob::after`]).
    ///
    /// ```no_run
    /// # async fn f(queue: rowclaim::Queue) -> rowclaim::Result<()> {
    /// use rowclaim::NewJob;
    /// let exports: Vec<NewJob> = (1..=50)
    ///     .map(|part| NewJob::new(serde_json::json!({"part": part})).kind("export"))
    ///     .collect();
    /// let report = NewJob::new(serde_json::json!({})).kind("report");
    /// let group = queue.enqueue_group(&exports, report).await?;
    /// println!("report {} waits for {} exports", group.last.id, group.jobs.len());
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_group(&self, jobs: &[NewJob], last: NewJob) -> Result<Group> {
        let mut all = jobs.to_vec();
        all.push(last.after_prior());
        super::job::check_jobs(&all)?;
        let mut got = self.enqueue_jobs(&all, true).await?;
        let last = got
            .pop()
            .ok_or_else(|| Error::InvalidInput("enqueue returned nothing".into()))?;
        Ok(Group { jobs: got, last })
    }

    /// Looks at every waiting job: releases those whose wait is over and cancels those one
    /// of whose jobs ended dead or cancelled. Workers do this after every job they finish and
    /// every few seconds besides; call it after completing jobs of your own claims
    /// ([`crate::Claimer`]) so that the jobs that wait for them need not wait for a worker.
    /// Returns how many jobs it released or cancelled.
    pub async fn release_waiting(&self) -> Result<u64> {
        let (mut from, mut changed) = (0, 0);
        loop {
            let (n, next) = self.sweep_from(from).await?;
            changed += n;
            match next {
                Some(id) => from = id,
                None => return Ok(changed),
            }
        }
    }

    /// One page of [`Queue::release_waiting`]: the waiting jobs after id `from`. Returns how
    /// many it released or cancelled, and where the next page starts (`None`: this was the
    /// last).
    pub(crate) async fn sweep_from(&self, from: i64) -> Result<(u64, Option<i64>)> {
        let done = self.resolve(Scope::After(from)).await?;
        let n = (done.released.len() + done.cancelled.len()) as u64;
        Ok((n, done.next))
    }

    /// The look after jobs `ids` finished (the worker's, right after their settle).
    pub(crate) async fn finished(&self, ids: Vec<i64>) -> Result<()> {
        self.resolve(Scope::For(ids)).await.map(drop)
    }

    /// Judges the waiting jobs of `scope` again, and wakes the queues of those released.
    pub(super) async fn resolve(&self, scope: Scope) -> Result<Resolved> {
        let done = retry_transient!(store(&self.db).resolve(scope.clone()).await)
            .map_err(not_initialised)?;
        let mut queues: Vec<&str> = done.released.iter().map(|(_, q)| q.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        for q in queues {
            store(&self.db).wake(q).await?;
        }
        Ok(done)
    }

    /// What job `id` waits (or waited) for, and what waits for it, each with its state; and
    /// whether it runs anyway.
    pub async fn links(&self, id: i64) -> Result<Links> {
        retry_transient!(store(&self.db).links(id).await).map_err(not_initialised)
    }
}
