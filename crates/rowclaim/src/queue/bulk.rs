//! Acting on every job a [`JobFilter`] matches: retry, cancel or delete them all, in batches
//! walked down by id (newest first), each batch one transaction of at most [`BATCH`] jobs, so
//! that a million jobs never take one giant transaction or hold their locks for long. Written
//! once over the driver's [`Transact`].

use super::record::filter_cond;
use super::JobFilter;
use crate::backend::run::{Fetch, Finish, Run, Transact};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::{Error, Result};

/// Jobs per batch: one statement's bound ids (far below the 32,766 values a SQLite statement
/// may have) and one short transaction.
pub(crate) const BATCH: u32 = 2_000;

/// What to do to every job a filter matches; each takes the states the one-job action takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BulkAction {
    /// Dead or cancelled jobs become ready again, their attempts reset ([`crate::Queue::retry`]).
    Retry,
    /// Waiting, ready or running jobs are cancelled ([`crate::Queue::cancel`]).
    Cancel,
    /// Jobs that are not running are deleted ([`crate::Queue::delete`]).
    Delete,
}

impl BulkAction {
    /// The states a job must be in for this action to change it.
    pub fn takes(self) -> &'static [&'static str] {
        match self {
            BulkAction::Retry => &["dead", "cancelled"],
            BulkAction::Cancel => &["waiting", "ready", "running"],
            BulkAction::Delete => &["waiting", "ready", "completed", "dead", "cancelled"],
        }
    }

    /// The action as a verb: `retry`, `cancel`, `delete`.
    pub fn verb(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Delete => "delete",
        }
    }

    /// Refuses a filter whose state the action cannot take: it would change nothing, and most
    /// likely the state or the action is a slip.
    pub(crate) fn check(self, filter: &JobFilter) -> Result<()> {
        filter.check()?;
        match &filter.status {
            Some(s) if !self.takes().contains(&s.as_str()) => Err(Error::InvalidInput(format!(
                "status {s:?}: {} takes only {} jobs; leave the status out to {} every job \
                 the other conditions match that is {}",
                self.verb(),
                self.takes().join(" or "),
                self.verb(),
                self.takes().join(" or ")
            ))),
            _ => Ok(()),
        }
    }

    /// The condition on a job's state.
    fn state_cond(self) -> &'static str {
        match self {
            BulkAction::Retry => "status IN ('dead', 'cancelled')",
            BulkAction::Cancel => "status IN ('waiting', 'ready', 'running')",
            BulkAction::Delete => "status <> 'running'",
        }
    }
}

/// The change `action` makes to the jobs `which` (a condition) selects, in their state only.
/// The one-job actions are this too (`store::admin_stmt`).
pub(crate) fn change_sql<D: Dialect>(action: BulkAction, which: &str) -> String {
    let now = D::NOW;
    let state = action.state_cond();
    match action {
        // A running job's claimer is fenced out: its token no longer owns the row.
        BulkAction::Cancel => format!(
            "UPDATE rowclaim_jobs SET status = 'cancelled', owner = NULL, lease_until = NULL, \
             finished_at = {now} WHERE {which} AND {state}"
        ),
        BulkAction::Retry => format!(
            "UPDATE rowclaim_jobs SET status = 'ready', attempts = 0, run_at = {now}, \
             owner = NULL, lease_until = NULL, finished_at = NULL WHERE {which} AND {state}"
        ),
        BulkAction::Delete => format!("DELETE FROM rowclaim_jobs WHERE {which} AND {state}"),
    }
}

/// One batch: how many jobs it found, the lowest id among them (where the next batch starts),
/// how many it changed, and the jobs with a unique key a retry left for one by one.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub found: usize,
    pub lowest: Option<i64>,
    pub changed: u64,
    pub keyed: Vec<i64>,
}

/// The bulk actions' statements, written once over a driver's transactions.
#[async_trait::async_trait]
pub(crate) trait Bulk: Send + Sync {
    /// Acts on the first `room` jobs (newest first) that `filter` matches and `action` takes,
    /// in one transaction. A retry leaves jobs with a unique key out (in `keyed`): another job
    /// may hold the key, which only one job at a time may do while pending.
    async fn batch(&self, action: BulkAction, filter: &JobFilter, room: u32) -> Result<Batch>;
    /// How many jobs `filter` matches (of those `action` takes, when given), counting at most
    /// `most` of them when given.
    async fn count(
        &self,
        filter: &JobFilter,
        action: Option<BulkAction>,
        most: Option<u64>,
    ) -> Result<u64>;
    /// Whether a job other than `id` that is ready or running has `id`'s unique key.
    async fn key_taken(&self, id: i64) -> Result<bool>;
}

#[async_trait::async_trait]
impl<R: Transact + Send + Sync> Bulk for R
where
    (i64, Option<i64>): Fetch<R::Sql>,
    (i64,): Fetch<R::Sql>,
{
    async fn batch(&self, action: BulkAction, filter: &JobFilter, room: u32) -> Result<Batch> {
        let tx = self.transaction(true).await?;
        let found: Vec<(i64, Option<i64>)> = tx.fetch_all(pick(action, filter, room)).await?;
        let mut batch = Batch {
            found: found.len(),
            lowest: found.iter().map(|(id, _)| *id).min(),
            ..Batch::default()
        };
        let mut ids = Vec::with_capacity(found.len());
        for (id, keyed) in found {
            match keyed {
                Some(_) if action == BulkAction::Retry => batch.keyed.push(id),
                _ => ids.push(id),
            }
        }
        if !ids.is_empty() {
            batch.changed = tx.execute(change(action, filter, &ids)).await?;
        }
        tx.commit().await?;
        Ok(batch)
    }

    async fn count(
        &self,
        filter: &JobFilter,
        action: Option<BulkAction>,
        most: Option<u64>,
    ) -> Result<u64> {
        let mut b = Binder::new();
        let mut cond = filter_cond(&mut b, filter);
        if let Some(a) = action {
            cond.push_str(&format!(" AND {}", a.state_cond()));
        }
        let sql = match most {
            // Stops reading at the bound: a count of a million matching jobs is not read.
            Some(most) => format!(
                "SELECT COUNT(*) FROM (SELECT 1 AS one FROM rowclaim_jobs WHERE {cond} \
                 LIMIT {}) t",
                b.bind(i64::try_from(most).unwrap_or(i64::MAX))
            ),
            None => format!("SELECT COUNT(*) FROM rowclaim_jobs WHERE {cond}"),
        };
        let (n,): (i64,) = self.fetch_one(Stmt::new(sql, b)).await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn key_taken(&self, id: i64) -> Result<bool> {
        let mut b = Binder::new();
        let sql = format!(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE unique_key = \
             (SELECT unique_key FROM rowclaim_jobs WHERE id = {}) \
             AND status IN ('ready', 'running')",
            b.bind(id)
        );
        let (n,): (i64,) = self.fetch_one(Stmt::new(sql, b)).await?;
        Ok(n > 0)
    }
}

/// The next `room` jobs, newest first, that `filter` matches and `action` takes: each id, and
/// again when the job has a unique key.
fn pick<D: Dialect>(action: BulkAction, filter: &JobFilter, room: u32) -> Stmt<D> {
    let mut b = Binder::new();
    let cond = filter_cond(&mut b, filter);
    let sql = format!(
        "SELECT id, CASE WHEN unique_key IS NULL THEN NULL ELSE id END AS keyed FROM rowclaim_jobs \
         WHERE {cond} AND {} ORDER BY id DESC LIMIT {}",
        action.state_cond(),
        b.bind(i64::from(room))
    );
    Stmt::new(sql, b)
}

/// `action` on the jobs `ids`, if they still match `filter` and are still in a state it takes
/// (another process may have changed them since they were picked).
fn change<D: Dialect>(action: BulkAction, filter: &JobFilter, ids: &[i64]) -> Stmt<D> {
    let mut b = Binder::new();
    let list: Vec<String> = ids.iter().map(|id| b.bind(*id)).collect();
    let cond = filter_cond(&mut b, filter);
    let which = format!("id IN ({}) AND {cond}", list.join(", "));
    Stmt::new(change_sql::<D>(action, &which), b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_the_action_cannot_take_is_refused_naming_it() {
        let f = JobFilter::new().status("ready");
        let said = BulkAction::Retry.check(&f).unwrap_err().to_string();
        assert!(
            said.contains("\"ready\"") && said.contains("dead or cancelled"),
            "{said}"
        );
        assert!(BulkAction::Cancel.check(&f).is_ok());
        let running = JobFilter::new().status("running");
        assert!(BulkAction::Delete.check(&running).is_err());
        assert!(BulkAction::Cancel.check(&running).is_ok());
        assert!(BulkAction::Retry
            .check(&JobFilter::new().status("cancelled"))
            .is_ok());
    }
}
