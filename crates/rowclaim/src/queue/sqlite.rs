//! The managed queue's SQL on SQLite (its schema: `migrate/sqlite.rs`): enqueue, admin, stats and
//! records. Every statement goes through the driver's [`Run`]; times are epoch milliseconds here.

use futures_util::future::join;
use sqlx::Sqlite;

use super::counts::Counting;
use super::incoming::{alike, pieces, Next, Walk};
use super::migrate::{migrate, Component};
use super::record::{records_sql, RecordRow};
use super::store::{admin_stmt, insert_unless_pending};
use super::{
    Admin, Enqueued, Incoming, JobFilter, JobParts, JobRecord, Listener, NewJob, QueueStats,
    QueueStore,
};
use crate::backend::run::{Finish, InTx, OnConn, Run, Transact};
use crate::backend::sql::{self, Binder, Stmt};
use crate::backend::sqlite::{Lite, Sql, NOW};
use crate::error::Result;

type B = Binder<Sql>;

#[async_trait::async_trait]
impl QueueStore for Lite {
    /// No LISTEN here: workers poll.
    async fn listen(&self) -> Result<Option<Listener>> {
        Ok(None)
    }

    async fn wake(&self, _queue: &str) -> Result<()> {
        Ok(())
    }

    async fn init(&self) -> Result<()> {
        for component in Component::ALL {
            // The write lock makes concurrent inits take turns; DDL is transactional here.
            let tx = self.transaction(true).await?;
            migrate(&tx, component).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    async fn enqueue(&self, jobs: &mut Incoming<'_>, _ids: bool) -> Result<Vec<Enqueued>> {
        let tx = self.transaction(true).await?;
        let mut out = Vec::new();
        let mut carry = Carry::default();
        while let Some((_, chunk)) = jobs.next().await? {
            insert_jobs(&tx, chunk, &mut carry, &mut out).await?;
        }
        run_insert(&tx, carry.built, &mut out).await?;
        super::after::hold(&tx, jobs.to_hold(), &out).await?;
        let n = jobs.count();
        tx.commit_as(|| super::job::enqueue_what(n)).await?;
        Ok(out)
    }

    async fn admin(&self, op: Admin) -> Result<u64> {
        self.execute(admin_stmt(op, |b: &mut B, age| {
            format!("{NOW} - {}", b.bind(sql::lease_ms(age)))
        }))
        .await
    }

    async fn stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        super::counts::stats(self, &COUNTING, queue).await
    }

    async fn records(&self, filter: &JobFilter, id: Option<i64>) -> Result<Vec<JobRecord>> {
        // Times are epoch milliseconds here already.
        let columns = "id, queue, kind, payload, status, priority, attempts, max_attempts, \
                       run_at, created_at, finished_at, lease_until, owner, unique_key, \
                       last_error, timeout_ms, output, limit_key, attempted_at, errors";
        let mut b = B::new();
        let sql = records_sql(&mut b, columns, filter, id);
        let rows: Vec<RecordRow> = self.fetch_all(Stmt::new(sql, b)).await?;
        Ok(rows.into_iter().map(JobRecord::from_row).collect())
    }
}

super::store::enqueue_one_by!(
    InTx<'_, Lite, Sqlite>,
    OnConn<'_, Sqlite>,
    #[cfg(test)]
    super::script::Step<'_, Sql>,
);

/// Enqueues one job on a connection (in the caller's transaction when they hold one). A unique
/// key that is pending already returns that job.
pub(crate) async fn enqueue_one<R: Run<Sql = Sql>>(r: &R, job: &JobParts<'_>) -> Result<Enqueued> {
    insert_unless_pending(r, job, insert_one).await
}

/// A runner on one connection that says which id an insert gave its last row (SQLite's
/// `last_insert_rowid`, told with the statement's result), which [`Run::execute`] does not
/// carry: an enqueue's check of its ids without a statement more.
pub(crate) trait LastId: Run<Sql = Sql> {
    /// Runs an `INSERT`; returns how many rows it wrote and the id of its last.
    async fn insert_last(&self, s: Stmt<Sql>) -> Result<(u64, i64)>;
}

impl LastId for InTx<'_, Lite, Sqlite> {
    async fn insert_last(&self, s: Stmt<Sql>) -> Result<(u64, i64)> {
        let q = s.binder.query(s.sql)?;
        let mut tx = self.tx.lock().await;
        let done = q
            .execute(&mut **tx)
            .await
            .map_err(crate::backend::sqlite::error)?;
        Ok((done.rows_affected(), done.last_insert_rowid()))
    }
}

/// Jobs per multi-row INSERT of rows of values: 1,000 of 11 values each stay well under
/// SQLite's 32,766 bound values.
const BULK_ROWS: usize = 1_000;

/// Jobs in one piece of a chunk, and so at most in one run ([`insert_run`], which binds one
/// value per job, under SQLite's 32,766): runs of 10,000 took 12 % less time than runs of
/// 1,000 (measured when a run's payloads were one JSON array; not measured again since).
const RUN_ROWS: usize = 10_000;

/// A run's payloads in one statement come to at most this many bytes, which the statement holds
/// bound; a longer run goes in several statements, a payload this long in a row of values.
const RUN_BYTES: usize = 16 << 20;

/// The columns an enqueue writes, as [`job_values`] gives them.
const COLUMNS: &str = "queue, kind, payload, priority, run_at, max_attempts, unique_key, \
     timeout_ms, limit_key, created_at";

/// One job's values in an enqueue's INSERT, in the order of [`COLUMNS`].
fn job_values(b: &mut B, job: &JobParts<'_>) -> String {
    let (queue, kind) = (b.bind(job.queue.to_owned()), b.bind(job.kind.to_owned()));
    let (payload, priority) = (b.bind(job.payload.to_string()), b.bind(job.priority));
    let (at, delay) = (b.bind(job.run_at_ms), b.bind(job.delay_ms));
    format!(
        "{queue}, {kind}, json({payload}), {priority}, COALESCE({at}, {NOW} + {delay}), {}, {}, \
         {}, {}, {NOW}",
        b.bind(job.max_attempts),
        b.bind(job.unique_key.map(str::to_owned)),
        b.bind(job.timeout_ms),
        b.bind(job.limit_key.map(str::to_owned)),
    )
}

/// Inserts one job unless its unique key is pending; returns its id if it was inserted.
pub(crate) fn insert_one(job: &JobParts<'_>) -> Stmt<Sql> {
    let mut b = B::new();
    let values = job_values(&mut b, job);
    let sql = format!(
        "INSERT INTO rowclaim_jobs ({COLUMNS}) VALUES ({values}) \
         ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('ready', 'running') \
         DO NOTHING RETURNING id"
    );
    Stmt::new(sql, b)
}

/// Inserts `jobs` (one chunk of an enqueue) in order, their ids to `out` in order. Each
/// statement is a round trip to the database's thread; the next bulk insert is built (its
/// payloads serialised, its values bound) while that thread runs the one before; the chunk's
/// last insert is left in `carry`, to run while the next chunk's first is built ([`Carry`]).
///
/// The ids of a bulk piece's jobs are known without a RETURNING row per job (about a third of
/// a bulk insert's time): the next one is the one after the largest in the table, read once
/// per enqueue. The enqueue's transaction holds the write lock from its start, so no other
/// connection inserts meanwhile, and SQLite gives a new row the largest id plus one. Rows of
/// values are given those ids; a run's rows are numbered by SQLite so, in the list's order.
/// A trigger of the user's that inserted jobs too would take one of these ids: a row of values
/// then fails on the primary key, a run on the check of its last id; never silently.
async fn insert_jobs<R: LastId>(
    r: &R,
    jobs: &[NewJob],
    carry: &mut Carry,
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    let Carry { next, built } = carry;
    out.reserve(jobs.len());
    let mut plan = Plan {
        walk: Walk::new(pieces(jobs.iter().map(NewJob::parts), RUN_ROWS, usize::MAX)),
        next: *next,
    };
    while !plan.walk.finished() {
        // `join` polls in order: the insert built before is handed to the database's thread
        // first, and the next step is built while it runs.
        let (ran, step) = join(run_insert(r, built.take(), out), async { plan.step() }).await;
        ran?;
        match step? {
            None => break,
            Some(Step::Insert(insert)) => *built = Some(insert),
            Some(Step::Ids) => plan.next = Some(after_ids(r.count(last_id()).await?, 1)?),
            Some(Step::Alone(job)) => {
                let got = enqueue_one(r, &job).await?;
                if let (false, Some(next)) = (got.existing, plan.next.as_mut()) {
                    *next = (*next).max(got.id.saturating_add(1));
                }
                out.push(got);
            }
        }
    }
    *next = plan.next;
    Ok(())
}

/// What an enqueue carries from one chunk to the next: the next bulk job's id, once known, and
/// the insert built last and not run yet, which goes first. Without it the database's thread
/// waited for a build at every chunk's start: `rowclaim enqueue`'s chunks of 20,000 left it
/// idle a fifth of the time. The enqueue runs the last insert after its last chunk.
#[derive(Default)]
struct Carry {
    next: Option<i64>,
    built: Option<Insert>,
}

/// An insert of bulk jobs with the ids `first..after`, built ahead of its turn.
struct Insert {
    stmt: Stmt<Sql>,
    first: i64,
    after: i64,
}

/// What an enqueue does next, in the order of its jobs.
enum Step<'a> {
    /// A job with a unique key, or one job before any id is known (an enqueue of one job: its
    /// id read back costs less than a look at the table's largest first): inserted alone.
    Alone(JobParts<'a>),
    /// Bulk jobs wait, and the next id is not known yet: read the table's largest.
    Ids,
    Insert(Insert),
}

/// A chunk's jobs turned into statements one at a time ([`Plan::step`]).
struct Plan<'a, I: Iterator<Item = JobParts<'a>>> {
    walk: Walk<'a, I>,
    /// The next bulk job's id, once known.
    next: Option<i64>,
}

impl<'a, I: Iterator<Item = JobParts<'a>>> Plan<'a, I> {
    /// The next step; `None` after the last. A bulk piece goes in several inserts: runs of at
    /// least [`MIN_RUN`](super::incoming::MIN_RUN) alike jobs one statement each
    /// ([`insert_run`]), the jobs between them a row of values each, at most [`BULK_ROWS`] a
    /// statement ([`insert_rows`]).
    fn step(&mut self) -> Result<Option<Step<'a>>> {
        match self.walk.next() {
            Next::Done => return Ok(None),
            Next::Keyed(job) => return Ok(Some(Step::Alone(job))),
            Next::Bulk => {}
        }
        let Some(first) = self.next else {
            return Ok(self
                .walk
                .take_one()
                .map_or(Some(Step::Ids), |j| Some(Step::Alone(j))));
        };
        let insert = match self.walk.take(BULK_ROWS, run_len) {
            (jobs, true) => insert_run(jobs, first)?,
            (jobs, false) => insert_rows(jobs, first)?,
        };
        self.next = Some(insert.after);
        Ok(Some(Step::Insert(insert)))
    }
}

/// How many jobs from the first of `jobs` make a run: alike, at most [`RUN_BYTES`] of them.
fn run_len(jobs: &[JobParts<'_>]) -> usize {
    let mut bytes = 0;
    jobs.iter()
        .take_while(|j| {
            bytes += j.payload.len() + 1;
            bytes <= RUN_BYTES && alike(&jobs[0], j)
        })
        .count()
}

/// Runs `insert` if there is one (checking it wrote every job), its ids to `out`.
async fn run_insert<R: LastId>(
    r: &R,
    insert: Option<Insert>,
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    let Some(Insert { stmt, first, after }) = insert else {
        return Ok(());
    };
    let (wrote, last) = r.insert_last(stmt).await?;
    if i64::try_from(wrote).ok() != after.checked_sub(first) {
        return Err(crate::error::Error::Internal(format!(
            "an insert of {} jobs wrote {wrote}",
            after - first
        )));
    }
    // The last row's id is `after - 1` unless something else inserted jobs meanwhile (a
    // trigger of the user's): a run's rows, which SQLite numbered, would then have other ids
    // than the ones told.
    if last != after - 1 {
        return Err(crate::error::Error::Unsupported(format!(
            "jobs {first} to {} were inserted as ids up to {last}: something else inserted jobs \
             meanwhile (a trigger on rowclaim_jobs?), which takes ids a bulk enqueue counts on; \
             insert those jobs after the enqueue instead. Nothing was enqueued",
            after - 1
        )));
    }
    out.extend((first..after).map(|id| Enqueued {
        id,
        existing: false,
    }));
    Ok(())
}

/// The largest id in the table (0 when it is empty): the next new job's is the one after.
fn last_id() -> Stmt<Sql> {
    Stmt::new(
        "SELECT COALESCE(MAX(id), 0) FROM rowclaim_jobs".into(),
        B::new(),
    )
}

/// The id after `n` jobs from `first`; an error, before anything is written, if the ids would
/// pass the largest integer (SQLite alone would then pick free ids at random).
fn after_ids(first: i64, n: usize) -> Result<i64> {
    i64::try_from(n)
        .ok()
        .and_then(|n| first.checked_add(n))
        .ok_or_else(|| {
            crate::error::Error::Internal(format!(
                "the jobs' ids have reached the largest integer: {n} more from {first} do not fit"
            ))
        })
}

/// Whether a payload's text has no whitespace at all, and so is the text `json()` would make of
/// it: a compact text of strict JSON (serde_json checked it) comes back from `json()` as it
/// went in, its strings' escapes and its numbers' digits as written. Whitespace anywhere
/// (perhaps only inside a string) sends the payload through `json()`, as a row of values does.
fn compact(payload: &str) -> bool {
    !payload
        .bytes()
        .any(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
}

/// An insert of `jobs` in one statement, a row of values each, with the ids `first`, … in
/// order.
fn insert_rows(jobs: &[JobParts<'_>], first: i64) -> Result<Insert> {
    let after = after_ids(first, jobs.len())?;
    let mut b = B::new();
    let rows: Vec<String> = (first..after)
        .zip(jobs)
        .map(|(id, job)| format!("({}, {})", b.bind(id), job_values(&mut b, job)))
        .collect();
    let sql = format!(
        "INSERT INTO rowclaim_jobs (id, {COLUMNS}) VALUES {}",
        rows.join(", ")
    );
    Ok(Insert {
        stmt: Stmt::new(sql, b),
        first,
        after,
    })
}

/// An insert of `run` (alike jobs) in one statement: their settings bound once, their payloads
/// a bound value each in a `VALUES` list (a row of 11 bound values per job costs SQLite about
/// twice the time; the payloads as one JSON array that `json_each` reads back made
/// `rowclaim enqueue` of 1,000,000 jobs 7 % slower, `enqueue_many` no faster).
/// SQLite numbers the rows itself, each the largest id plus one, in the list's order: the ids
/// `first`, … (see [`insert_jobs`]), which [`run_insert`] checks afterwards. A run's payloads
/// go through `json()` all or none (none when every one is [`compact`]), so that a full run has
/// one of two texts, which the connection prepared once and keeps: a text per mix would fill
/// the connection's statement cache with 10,000-row statements (2.5 MB each).
fn insert_run(run: &[JobParts<'_>], first: i64) -> Result<Insert> {
    let after = after_ids(first, run.len())?;
    let job = &run[0];
    let mut b = B::new();
    let (queue, kind) = (b.bind(job.queue.to_owned()), b.bind(job.kind.to_owned()));
    let (priority, at, delay) = (
        b.bind(job.priority),
        b.bind(job.run_at_ms),
        b.bind(job.delay_ms),
    );
    let payload = match run.iter().all(|j| compact(&j.payload)) {
        true => "column1",
        false => "json(column1)",
    };
    let settings = format!(
        "{queue}, {kind}, {payload}, {priority}, COALESCE({at}, {NOW} + {delay}), {}, NULL, {}, \
         {}, {NOW}",
        b.bind(job.max_attempts),
        b.bind(job.timeout_ms),
        b.bind(job.limit_key.map(str::to_owned)),
    );
    let mut rows = String::with_capacity(run.len() * 5);
    for (i, j) in run.iter().enumerate() {
        rows.push_str(if i == 0 { "(" } else { ", (" });
        rows.push_str(&b.bind(j.payload.to_string()));
        rows.push(')');
    }
    let sql =
        format!("INSERT INTO rowclaim_jobs ({COLUMNS}) SELECT {settings} FROM (VALUES {rows})");
    Ok(Insert {
        stmt: Stmt::new(sql, b),
        first,
        after,
    })
}

/// How stats count here: ready jobs through the ready index, dead and cancelled through theirs
/// (v8), each by queue; SQLite keeps no statistics to estimate from, so above the cap a figure
/// is the cap, a lower bound.
const COUNTING: Counting = Counting {
    per_queue: &["ready", "dead", "cancelled"],
    estimate: None,
    recursive_scan: true,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of a run of 20 jobs whose payloads are `{"i": n}` with a space where `spaced`.
    fn run_text(spaced: impl Fn(usize) -> bool) -> String {
        let jobs: Vec<NewJob> = (0..20)
            .map(|i| {
                let text = match spaced(i) {
                    true => format!("{{\"i\": {i}}}"),
                    false => format!("{{\"i\":{i}}}"),
                };
                NewJob::from_json(text).expect("JSON")
            })
            .collect();
        let parts: Vec<JobParts<'_>> = jobs.iter().map(NewJob::parts).collect();
        let insert = insert_run(&parts, 1).expect("a run");
        insert.stmt.sql
    }

    /// However its payloads mix compact text and text with whitespace, a run of a length has
    /// one text with `json()` and one without: the connection keeps few prepared statements.
    #[test]
    fn a_run_has_one_text_per_length_whatever_its_payloads_mix() {
        let (first, every_other) = (run_text(|i| i == 0), run_text(|i| i % 2 == 1));
        assert_eq!(first, every_other);
        assert!(first.contains("json(column1)"), "{first}");
        let compact = run_text(|_| false);
        assert!(!compact.contains("json("), "{compact}");
        assert_eq!(compact.replace("column1", "json(column1)"), first);
    }
}
