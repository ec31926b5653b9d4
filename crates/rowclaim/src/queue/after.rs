//! Jobs that wait for other jobs ([`crate::NewJob::after`]), written once over the driver's
//! [`Run`]. A waiting job is a row of `rowclaim_jobs` in status `waiting`, which no claim reads
//! (a claim reads `ready` rows only: the claim's statements are the same with or without
//! waiting jobs), and one row of `rowclaim_waits` per job it waits for.
//!
//! - **Enqueue** ([`hold`], in the enqueue's transaction, after its inserts; [`enqueue_in`],
//!   in the caller's own transaction, around its insert): the jobs it waits for are read (an
//!   unknown id is an error naming it); completed ones count as done; a dead or cancelled one
//!   cancels the new job at once (naming it), unless it runs anyway; the new job is `waiting`
//!   while any other is unfinished.
//! - **Release** ([`resolve`]): after a job finished (the worker that settled it, right after
//!   its settle commits; `Queue::cancel`; the enqueue itself, after its commit), the jobs that
//!   wait for it are judged again from what they wait for, as it is now: all completed (or
//!   gone: deleted when they completed, or pruned) → `ready`; one dead or cancelled →
//!   `cancelled`, naming it (or `ready`, for a job that runs anyway); else still `waiting`.
//!   A cancelled waiter's own waiters are judged next. Every change is guarded by
//!   `status = 'waiting'`, so a job is released at most once however many look at once.
//! - **Never zero times**: the last of the jobs a job waits for commits its finish before its
//!   finisher looks, so that look sees all of them finished. The enqueue looks after its own
//!   commit, so a job that finished between the enqueue's read and its commit is seen too. On
//!   Galera the looks first wait until their node has applied what the cluster committed
//!   (`wsrep_sync_wait`). A finisher that died between its commit and its look is covered by
//!   every worker's sweep ([`Scope::After`]: a page of waiting jobs once a lease).

use std::collections::BTreeMap;

use crate::backend::run::{Col, Run, Transact};
use crate::backend::sql::{self, Binder, Dialect, Stmt};
use crate::error::{Error, Result};
use crate::value::{IdList, Value};

use super::store::EnqueueOne;
use super::{Enqueued, NewJob};

/// A waiting job's status: no claim reads it.
pub(crate) const WAITING: &str = "waiting";

/// Ids per statement: far below what any database lets one statement bind.
const CHUNK: usize = 500;

/// Rounds of cascading cancels one look follows (a chain of waiting jobs this long).
const CASCADE: usize = 1_000;

/// Which waiting jobs a look judges.
#[derive(Clone, Debug)]
pub(crate) enum Scope {
    /// Those that wait for these jobs, which just finished.
    For(Vec<i64>),
    /// These jobs (just enqueued).
    Jobs(Vec<i64>),
    /// The sweep: waiting jobs after this id, [`SWEEP_PAGE`] of them.
    After(i64),
}

/// Waiting jobs per page of a sweep: a sweep's cost stays bounded however many jobs wait.
pub(crate) const SWEEP_PAGE: usize = 1_000;

/// What a look changed: jobs made ready (with their queues, to wake), jobs cancelled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub released: Vec<(i64, String)>,
    pub cancelled: Vec<i64>,
    /// Of a sweep's page: its last waiting job, if it was full (the next page starts after it).
    pub next: Option<i64>,
}

/// What a waiting job is, judged from the jobs it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Everything it waits for completed (or is gone, or failed and it runs anyway).
    Ready,
    /// Something it waits for has not finished.
    Waiting,
    /// This job it waits for ended in this state (dead or cancelled).
    Cancel(i64, String),
}

/// Judges a job from the states of the jobs it waits for (`None`: gone, which counts as done:
/// only a finished job is deleted without its waiters being judged first).
pub(crate) fn judge<'a>(
    deps: impl IntoIterator<Item = (i64, Option<&'a str>)>,
    run_anyway: bool,
) -> Verdict {
    let mut waiting = false;
    for (id, status) in deps {
        match status {
            None | Some("completed") => {}
            Some(s @ ("dead" | "cancelled")) if !run_anyway => {
                return Verdict::Cancel(id, s.to_owned())
            }
            Some("dead" | "cancelled") => {}
            Some(_) => waiting = true,
        }
    }
    if waiting {
        Verdict::Waiting
    } else {
        Verdict::Ready
    }
}

/// The error a job cancelled for what it waited for carries.
pub(crate) fn cancel_reason(dep: i64, status: &str) -> String {
    let how = if status == "dead" {
        "ended dead"
    } else {
        "was cancelled"
    };
    format!("cancelled: job {dep}, which it waited for, {how}")
}

/// The `if_failed` column's value for a job that runs anyway.
const RUN_ANYWAY: &str = "run";

/// In the enqueue's transaction, after its inserts: records what each job of `jobs` that
/// waits waits for (the ids of the jobs inserted are `out`, in the same order), and makes it
/// `waiting` or `cancelled` as those jobs are now. Returns the ids of the jobs that wait.
pub(crate) async fn hold<'j, R: Run + ?Sized>(
    r: &R,
    jobs: impl IntoIterator<Item = &'j NewJob> + Send,
    out: &[Enqueued],
) -> Result<Vec<i64>> {
    let mut held = Vec::new();
    for (i, (job, new)) in jobs.into_iter().zip(out).enumerate() {
        // Most jobs wait for nothing: passed over here, not through an await each.
        if !job.waits() {
            continue;
        }
        let Some(deps) = Deps::read(r, job, &out[..i], i + 1).await? else {
            continue;
        };
        deps.hold(r, new.id).await?;
        held.push(new.id);
    }
    Ok(held)
}

/// Enqueues one job inside the caller's own transaction (`Queue::enqueue_postgres` and its
/// kin). What it waits for is read before its row is written, so that an id of no job leaves
/// that transaction as it was. There is no look after the commit, which is the caller's: a job
/// it waits for that finishes between this read and that commit leaves it waiting until a
/// worker's sweep or [`crate::Queue::release_waiting`].
pub(crate) async fn enqueue_in<R: EnqueueOne + ?Sized>(r: &R, job: &NewJob) -> Result<Enqueued> {
    let deps = Deps::read(r, job, &[], 1).await?;
    let got = r.enqueue_one(&job.parts()).await?;
    if let Some(deps) = deps {
        deps.hold(r, got.id).await?;
    }
    Ok(got)
}

/// What one job waits for, as those jobs are now: read, then held for the job's row.
struct Deps {
    /// Sorted, each once.
    ids: Vec<i64>,
    /// Each one's state (every one exists: [`Deps::read`] refuses an id of no job).
    states: BTreeMap<i64, Option<String>>,
    run_anyway: bool,
}

impl Deps {
    /// What `job` waits for (`prior`: the jobs enqueued before it in the same call; `which`:
    /// its place among them, for the error), with each one's state; `None` when it waits for
    /// nothing. An id of no job is an error naming it.
    async fn read<R: Run + ?Sized>(
        r: &R,
        job: &NewJob,
        prior: &[Enqueued],
        which: usize,
    ) -> Result<Option<Deps>> {
        let ids = job.waits_for(prior);
        if ids.is_empty() {
            return Ok(None);
        }
        let states = states(r, &ids, false).await?;
        if let Some(gone) = ids.iter().find(|d| !states.contains_key(d)) {
            return Err(Error::InvalidInput(format!(
                "job {which}: waits for job {gone}, which does not exist (never enqueued, \
                 deleted, or pruned after it finished); leave it out of after()"
            )));
        }
        Ok(Some(Deps {
            ids,
            states,
            run_anyway: job.runs_anyway(),
        }))
    }

    /// Records that job `id` (just inserted, ready) waits for these, and puts it in the state
    /// they make it: ready, waiting, or cancelled naming the one that failed.
    async fn hold<R: Run + ?Sized>(&self, r: &R, id: i64) -> Result<()> {
        for chunk in self.ids.chunks(CHUNK) {
            r.execute(edges_stmt(id, chunk)).await?;
        }
        let verdict = judge(
            self.ids
                .iter()
                .map(|d| (*d, self.states.get(d).and_then(Option::as_deref))),
            self.run_anyway,
        );
        r.execute(hold_stmt(id, &verdict, self.run_anyway)).await?;
        Ok(())
    }
}

/// Each of `ids`' status, where the job exists.
async fn states<R: Run + ?Sized>(
    r: &R,
    ids: &[i64],
    sync: bool,
) -> Result<BTreeMap<i64, Option<String>>> {
    let mut found = BTreeMap::new();
    for chunk in ids.chunks(CHUNK) {
        let mut b = Binder::new();
        let sql = format!(
            "{}SELECT id, status FROM rowclaim_jobs WHERE {}",
            sql::read_after_applied(sync),
            within(&mut b, "id", chunk)
        );
        for row in r.values(Stmt::new(sql, b), &[Col::Int, Col::Text]).await? {
            let mut row = row.into_iter();
            if let (Some(id), status) = (row.next().and_then(Value::int), row.next()) {
                found.insert(id, status.and_then(Value::text));
            }
        }
    }
    Ok(found)
}

/// "`column` is one of `ids`", bound as the dialect binds id lists (one array on PostgreSQL:
/// one statement text however many ids, prepared once).
fn within<D: Dialect>(b: &mut Binder<D>, column: &str, ids: &[i64]) -> String {
    D::id_in(b, column, &IdList::Int(ids.to_vec()))
}

/// Records that job `job` waits for `deps`.
pub(crate) fn edges_stmt<D: Dialect>(job: i64, deps: &[i64]) -> Stmt<D> {
    let mut b = Binder::new();
    let rows: Vec<String> = deps
        .iter()
        .map(|d| format!("({}, {})", b.bind(job), b.bind(*d)))
        .collect();
    let sql = format!(
        "INSERT INTO rowclaim_waits (job, waits_for) VALUES {}",
        rows.join(", ")
    );
    Stmt::new(sql, b)
}

/// Puts a job just inserted (ready) in the state `verdict` says, and notes whether it runs
/// anyway.
pub(crate) fn hold_stmt<D: Dialect>(job: i64, verdict: &Verdict, run_anyway: bool) -> Stmt<D> {
    // Bound in the order they appear (MySQL's and SQLite's placeholders are positional).
    let mut b = Binder::new();
    let set = match verdict {
        Verdict::Ready => String::new(),
        Verdict::Waiting => format!("status = '{WAITING}', "),
        Verdict::Cancel(dep, status) => format!(
            "status = 'cancelled', finished_at = {}, last_error = {}, ",
            D::NOW,
            b.bind(cancel_reason(*dep, status))
        ),
    };
    let set = format!(
        "{set}if_failed = {}",
        b.bind(run_anyway.then(|| RUN_ANYWAY.to_owned()))
    );
    let sql = format!("UPDATE rowclaim_jobs SET {set} WHERE id = {}", b.bind(job));
    Stmt::new(sql, b)
}

/// Judges the waiting jobs `scope` names again, as the jobs they wait for are now: releases
/// those whose wait is over, cancels those one of whose jobs failed (and then the jobs that
/// wait for those). Each statement commits on its own; each change is guarded by the job
/// still waiting.
pub(crate) async fn resolve<R: Transact + ?Sized>(r: &R, scope: Scope) -> Result<Resolved> {
    let sync = r.applies_others_late().await?;
    let mut done = Resolved::default();
    let mut waiters = match scope {
        Scope::Jobs(ids) => ids,
        Scope::For(ids) => waiters_of(r, &ids, sync).await?,
        Scope::After(id) => {
            let page = waiting_after(r, id, sync).await?;
            done.next = page.last().copied().filter(|_| page.len() == SWEEP_PAGE);
            page
        }
    };
    for _ in 0..CASCADE {
        if waiters.is_empty() {
            break;
        }
        let mut cancelled = Vec::new();
        for chunk in waiters.chunks(CHUNK) {
            let (release, cancel) = judge_waiting(r, chunk, sync).await?;
            if !release.is_empty() {
                let ids: Vec<i64> = release.iter().map(|(id, _)| *id).collect();
                if r.execute(release_stmt(&ids)).await? > 0 {
                    done.released.extend(release);
                }
            }
            for (job, dep, status) in cancel {
                if r.execute(cancel_stmt(job, dep, &status)).await? > 0 {
                    cancelled.push(job);
                }
            }
        }
        done.cancelled.extend(&cancelled);
        // A cancelled job may be waited for in turn.
        waiters = waiters_of(r, &cancelled, sync).await?;
    }
    Ok(done)
}

/// The jobs waiting for any of `ids`.
async fn waiters_of<R: Run + ?Sized>(r: &R, ids: &[i64], sync: bool) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        let mut b = Binder::new();
        let sql = format!(
            "{}SELECT DISTINCT job FROM rowclaim_waits WHERE {}",
            sql::read_after_applied(sync),
            within(&mut b, "waits_for", chunk)
        );
        out.extend(ints(r.values(Stmt::new(sql, b), &[Col::Int]).await?));
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A page of waiting jobs, by id, after `id`.
async fn waiting_after<R: Run + ?Sized>(r: &R, id: i64, sync: bool) -> Result<Vec<i64>> {
    let mut b = Binder::new();
    let sql = format!(
        "{}SELECT id FROM rowclaim_jobs WHERE status = '{WAITING}' AND id > {} ORDER BY id \
         LIMIT {}",
        sql::read_after_applied(sync),
        b.bind(id),
        b.bind(SWEEP_PAGE as i64)
    );
    Ok(ints(r.values(Stmt::new(sql, b), &[Col::Int]).await?))
}

fn ints(rows: Vec<Vec<Value>>) -> Vec<i64> {
    rows.into_iter()
        .filter_map(|row| row.into_iter().next().and_then(Value::int))
        .collect()
}

/// A job to release and its queue; a job to cancel, the job it waited for and that job's state.
type Judged = (Vec<(i64, String)>, Vec<(i64, i64, String)>);

/// Reads what each of `jobs` that still waits waits for, and judges it.
async fn judge_waiting<R: Run + ?Sized>(r: &R, jobs: &[i64], sync: bool) -> Result<Judged> {
    let mut b = Binder::new();
    let sql = format!(
        "{}SELECT w.job, j.queue, j.if_failed, w.waits_for, d.status FROM rowclaim_waits w \
         JOIN rowclaim_jobs j ON j.id = w.job LEFT JOIN rowclaim_jobs d ON d.id = w.waits_for \
         WHERE j.status = '{WAITING}' AND {} ORDER BY w.job, w.waits_for",
        sql::read_after_applied(sync),
        within(&mut b, "w.job", jobs)
    );
    let rows = r
        .values(
            Stmt::new(sql, b),
            &[Col::Int, Col::Text, Col::OptText, Col::Int, Col::OptText],
        )
        .await?;
    // job → (queue, runs anyway, [(waits for, its state)])
    type Deps = (String, bool, Vec<(i64, Option<String>)>);
    let mut by_job: BTreeMap<i64, Deps> = BTreeMap::new();
    for row in rows {
        let mut c = row.into_iter();
        let (Some(job), Some(queue), if_failed, Some(dep), status) = (
            c.next().and_then(Value::int),
            c.next().and_then(Value::text),
            c.next().and_then(Value::text),
            c.next().and_then(Value::int),
            c.next().and_then(Value::text),
        ) else {
            continue;
        };
        let e = by_job
            .entry(job)
            .or_insert_with(|| (queue, if_failed.as_deref() == Some(RUN_ANYWAY), Vec::new()));
        e.2.push((dep, status));
    }
    let (mut release, mut cancel) = (Vec::new(), Vec::new());
    for (job, (queue, anyway, deps)) in by_job {
        match judge(deps.iter().map(|(d, s)| (*d, s.as_deref())), anyway) {
            Verdict::Ready => release.push((job, queue)),
            Verdict::Waiting => {}
            Verdict::Cancel(dep, status) => cancel.push((job, dep, status)),
        }
    }
    Ok((release, cancel))
}

/// Makes these waiting jobs ready (the guard: a job released once is not released again).
pub(crate) fn release_stmt<D: Dialect>(jobs: &[i64]) -> Stmt<D> {
    let mut b = Binder::new();
    let sql = format!(
        "UPDATE rowclaim_jobs SET status = 'ready' WHERE status = '{WAITING}' AND {}",
        within(&mut b, "id", jobs)
    );
    Stmt::new(sql, b)
}

/// Cancels a waiting job for the job `dep` it waited for, which ended as `status`.
pub(crate) fn cancel_stmt<D: Dialect>(job: i64, dep: i64, status: &str) -> Stmt<D> {
    let mut b = Binder::new();
    let sql = format!(
        "UPDATE rowclaim_jobs SET status = 'cancelled', finished_at = {}, last_error = {} \
         WHERE id = {} AND status = '{WAITING}'",
        D::NOW,
        b.bind(cancel_reason(dep, status)),
        b.bind(job)
    );
    Stmt::new(sql, b)
}

/// What a job waits for and what waits for it, each with its state (`None`: gone), and
/// whether it runs anyway, for `jobs show` and the dashboard.
pub(crate) async fn links<R: Run + ?Sized>(r: &R, job: i64) -> Result<super::Links> {
    let mut links = super::Links::default();
    let mut b = Binder::new();
    let sql = format!(
        "SELECT if_failed FROM rowclaim_jobs WHERE id = {}",
        b.bind(job)
    );
    let if_failed = r.values(Stmt::new(sql, b), &[Col::OptText]).await?;
    links.run_anyway = if_failed
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next())
        .and_then(Value::text)
        .is_some_and(|v| v == RUN_ANYWAY);
    for (mine, other, into_waits) in [("job", "waits_for", true), ("waits_for", "job", false)] {
        let mut b = Binder::new();
        let sql = format!(
            "SELECT w.{other}, d.status FROM rowclaim_waits w \
             LEFT JOIN rowclaim_jobs d ON d.id = w.{other} WHERE w.{mine} = {} \
             ORDER BY w.{other}",
            b.bind(job)
        );
        let rows = r
            .values(Stmt::new(sql, b), &[Col::Int, Col::OptText])
            .await?;
        for row in rows {
            let mut c = row.into_iter();
            if let (Some(id), status) = (c.next().and_then(Value::int), c.next()) {
                let link = super::Link {
                    id,
                    status: status.and_then(Value::text),
                };
                if into_waits {
                    links.waits_for.push(link);
                } else {
                    links.waited_by.push(link);
                }
            }
        }
    }
    Ok(links)
}

/// The waits' statements on a driver (a part of the queue store, [`super::QueueStore`]).
#[async_trait::async_trait]
pub(crate) trait Waits: Send + Sync {
    /// [`resolve`].
    async fn resolve(&self, scope: Scope) -> Result<Resolved>;
    /// [`links`].
    async fn links(&self, job: i64) -> Result<super::Links>;
}

#[async_trait::async_trait]
impl<R: Transact + Send + Sync> Waits for R {
    async fn resolve(&self, scope: Scope) -> Result<Resolved> {
        resolve(self, scope).await
    }

    async fn links(&self, job: i64) -> Result<super::Links> {
        links(self, job).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_judged_by_what_it_waits_for() {
        let j = |deps: &[(i64, Option<&'static str>)], anyway| judge(deps.iter().copied(), anyway);
        assert_eq!(
            j(&[(1, Some("completed")), (2, None)], false),
            Verdict::Ready
        );
        assert_eq!(
            j(&[(1, Some("completed")), (2, Some("running"))], false),
            Verdict::Waiting
        );
        assert_eq!(
            j(&[(1, Some("ready")), (2, Some("dead"))], false),
            Verdict::Cancel(2, "dead".into())
        );
        assert_eq!(
            j(&[(1, Some("ready")), (2, Some("dead"))], true),
            Verdict::Waiting
        );
        assert_eq!(
            j(&[(1, Some("cancelled")), (2, Some("completed"))], true),
            Verdict::Ready
        );
        assert_eq!(
            j(&[(1, Some("waiting"))], false),
            Verdict::Waiting,
            "a job that waits itself is unfinished"
        );
    }
}
