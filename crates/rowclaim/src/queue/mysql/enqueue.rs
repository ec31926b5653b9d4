//! Enqueue on MySQL/MariaDB: jobs without a unique key in multi-row inserts built ahead of
//! their turn (on MariaDB runs of alike jobs through `JSON_TABLE`, the rest a row of values
//! each), a job with one alone; the ids each insert gave, from its first (`last_insert_id`,
//! [`InsertId`]).

use futures_util::future::join;
use sqlx::MySql;

use super::{DUPLICATE_KEY, MAX_SPAN_US};
use crate::backend::mysql::{error_number, My, Sql, NOW};
use crate::backend::run::{Col, InTx, OnConn, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::{Error, Result};
use crate::queue::incoming::{alike, pieces, Next, Walk};
use crate::queue::store::{first_int, UNIQUE_TRIES};
use crate::queue::{Enqueued, JobParts, NewJob};
use crate::value::Value;

type B = Binder<Sql>;

/// A runner on one connection that says which id an insert gave its first row: MySQL tells it
/// with the statement's result (`last_insert_id`), which [`Run::execute`] does not carry (the
/// other databases say `RETURNING id`). The statement goes to the transaction's or the caller's
/// connection itself.
pub(crate) trait InsertId: Run<Sql = Sql> {
    /// Runs an `INSERT`; returns the id of its first row and how many rows it wrote.
    async fn insert_ids(&self, s: Stmt<Sql>) -> Result<(i64, u64)>;

    /// Runs an `INSERT`; returns the id of its first row.
    async fn insert_id(&self, s: Stmt<Sql>) -> Result<i64> {
        Ok(self.insert_ids(s).await?.0)
    }
}

impl InsertId for InTx<'_, My, MySql> {
    async fn insert_ids(&self, s: Stmt<Sql>) -> Result<(i64, u64)> {
        let q = s.binder.query(s.sql)?;
        let mut tx = self.tx.lock().await;
        let done = q
            .execute(&mut **tx)
            .await
            .map_err(crate::backend::mysql::error)?;
        Ok((id_of(done.last_insert_id())?, done.rows_affected()))
    }
}

impl InsertId for OnConn<'_, MySql> {
    async fn insert_ids(&self, s: Stmt<Sql>) -> Result<(i64, u64)> {
        let q = s.binder.query(s.sql)?;
        let mut conn = self.conn.lock().await;
        let done = q
            .persistent(self.keep)
            .execute(&mut **conn)
            .await
            .map_err(crate::backend::mysql::error)?;
        Ok((id_of(done.last_insert_id())?, done.rows_affected()))
    }
}

fn id_of(id: u64) -> Result<i64> {
    i64::try_from(id).map_err(|_| Error::InvalidInput("job id is out of range".into()))
}

crate::queue::store::enqueue_one_by!(
    InTx<'_, My, MySql>,
    OnConn<'_, MySql>,
    #[cfg(test)]
    crate::queue::script::Step<'_, Sql>,
);

/// The stand-in database of the snapshots gives every insert the id 1.
#[cfg(test)]
impl InsertId for crate::queue::script::Step<'_, Sql> {
    async fn insert_ids(&self, s: Stmt<Sql>) -> Result<(i64, u64)> {
        self.0.keep(s);
        Ok((1, 1))
    }
}

/// Rows per multi-row INSERT: 500 rows of 10 values stay far below the 65,535 placeholders of
/// one statement.
const BULK_ROWS: usize = 500;

/// Jobs per piece of a chunk, and so per run ([`insert_run`], which binds no value per job): a
/// run of 5,000 took the server a fifth less time than ten of 500.
const RUN_ROWS: usize = 5_000;

/// Payload bytes per multi-row INSERT, well below the smallest default `max_allowed_packet`
/// (16 MiB on MariaDB, 64 MiB on MySQL 8), which a statement with its values must fit in.
const BULK_BYTES: usize = 4 << 20;

/// `DATETIME`'s range in unix epoch milliseconds: 1000-01-01 to 9999-12-31 23:59:59.999.
const DATETIME_MS: std::ops::RangeInclusive<i64> = -30_610_224_000_000..=253_402_300_799_999;

/// Refuses run-at times `DATETIME` cannot hold. Past the range the server's date arithmetic gives
/// NULL, which `COALESCE` would quietly turn into "now" (or, outside strict mode, the zero date).
fn check_times(job: &JobParts<'_>) -> Result<()> {
    if job.run_at_ms.is_some_and(|ms| !DATETIME_MS.contains(&ms)) {
        return Err(Error::InvalidInput(
            "run-at time is outside the years 1000 to 9999 that MySQL's DATETIME holds".into(),
        ));
    }
    if job.delay_ms.saturating_mul(1000) > MAX_SPAN_US {
        return Err(Error::InvalidInput(
            "a delay of more than 900 years is beyond what MySQL's DATETIME holds".into(),
        ));
    }
    Ok(())
}

/// Payloads below this size are sent without asking the server's packet limit (no server's
/// `max_allowed_packet` is smaller: its least is 1 KiB, its defaults 16 or 64 MiB).
const SMALL_PAYLOAD: usize = 1 << 20;

/// Room in a packet for the statement around a payload: its text and the other values.
const STATEMENT_ROOM: usize = 4096;

/// Refuses a payload bigger than one statement may carry to this server, before sending it: the
/// server would answer only "Got a packet bigger than 'max_allowed_packet'" (and, over some
/// proxies, close the connection), naming neither the job nor the limit. Asks the limit only
/// when a payload is large.
/// `before`: the jobs of the same call before these (a job is named by its place in the call).
async fn check_packet<R: Run<Sql = Sql>>(
    r: &R,
    jobs: &[JobParts<'_>],
    before: usize,
) -> Result<()> {
    if jobs.iter().all(|j| j.payload.len() <= SMALL_PAYLOAD) {
        return Ok(());
    }
    let sql = "SELECT CAST(@@max_allowed_packet AS SIGNED)";
    let limit = r.count(Stmt::new(sql.to_owned(), B::new())).await?;
    let limit = u64::try_from(limit).unwrap_or(0);
    for (i, j) in jobs.iter().enumerate() {
        let bytes = j.payload.len();
        if (bytes + STATEMENT_ROOM) as u64 > limit {
            return Err(Error::PayloadTooLarge {
                job: before + i + 1,
                bytes,
                limit,
            });
        }
    }
    Ok(())
}

/// What an enqueue may do, on this server for this caller.
#[derive(Clone, Copy)]
pub(super) struct Terms {
    /// Whether the caller wants the jobs' ids (else bulk jobs are answered 0s).
    pub(super) ids: bool,
    /// Whether runs of alike jobs go through `JSON_TABLE` ([`insert_run`]): on MariaDB only.
    pub(super) runs: bool,
}

/// Inserts `jobs` (one chunk of an enqueue, after `before` others) piece by piece
/// ([`pieces`]), their ids to `out` in order (0s for bulk jobs where the ids are not wanted).
/// Each statement is built while the server runs the one before; the chunk's last insert is
/// left in `carry`, to run while the next chunk's first is built ([`Carry`]).
pub(super) async fn insert_jobs<R: InsertId>(
    r: &R,
    jobs: &[NewJob],
    before: usize,
    terms: Terms,
    carry: &mut Carry,
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    let Carry { autoinc, built } = carry;
    let parts: Vec<JobParts<'_>> = jobs.iter().map(NewJob::parts).collect();
    for p in &parts {
        check_times(p)?;
    }
    check_packet(r, &parts, before).await?;
    out.reserve(parts.len());
    let mut plan = Plan {
        walk: Walk::new(pieces(parts, RUN_ROWS, BULK_BYTES)),
        autoinc: *autoinc,
        terms,
    };
    while !plan.walk.finished() {
        // `join` polls in order: the insert built before goes to the server first, and the
        // next step is made ready while the server runs it (or, for a statement of a row
        // count not run before on this connection, while the server prepares it).
        let (ran, next) = join(insert_bulk(r, built.take(), plan.autoinc, out), async {
            plan.step()
        })
        .await;
        ran?;
        match next? {
            None => break,
            Some(Ready::Insert(insert)) => *built = Some(insert),
            Some(Ready::Ask) => plan.autoinc = Some(Autoinc::ask(r).await?),
            Some(Ready::Keyed(job)) => out.push(enqueue_one(r, &job).await?),
        }
    }
    *autoinc = plan.autoinc;
    Ok(())
}

/// What an enqueue carries from one chunk to the next: the server's numbering, once asked, and
/// the insert built last and not run yet, which goes first. Without it the server waited for
/// a build at every chunk's start (`rowclaim enqueue` sends chunks of 20,000).
#[derive(Default)]
pub(super) struct Carry {
    autoinc: Option<Autoinc>,
    built: Option<Insert>,
}

impl Carry {
    /// Runs the insert left, the enqueue's last.
    pub(super) async fn finish<R: InsertId>(self, r: &R, out: &mut Vec<Enqueued>) -> Result<()> {
        insert_bulk(r, self.built, self.autoinc, out).await
    }
}

/// What an enqueue does next, in the order of its jobs.
enum Ready<'a> {
    /// Bulk jobs wait, and the server's auto-increment is not known yet: ask it.
    Ask,
    /// A bulk insert, built ahead of its turn.
    Insert(Insert),
    /// A job with a unique key.
    Keyed(JobParts<'a>),
}

/// An insert of so many bulk jobs; `known`: whether their ids are wanted and follow from the
/// first.
struct Insert {
    stmt: Stmt<Sql>,
    n: usize,
    known: bool,
}

/// How the server numbers an insert's rows, asked once per transaction before its first insert
/// of more than one job whose ids the caller wants.
///
/// One multi-row `INSERT … VALUES` is a "simple insert" (its row count is known up front), for
/// which InnoDB reserves all its auto-increment values at once, under every
/// `innodb_autoinc_lock_mode`: the ids are the first one (`last_insert_id`) plus
/// `i × auto_increment_increment`. An `INSERT … SELECT` (a run, [`insert_run`]) is a "bulk
/// insert": its rows' ids are consecutive only under lock modes 0 and 1, where it holds the
/// table's AUTO-INC lock to its end; under 2 (MySQL 8's default, and Galera's) another
/// transaction's rows may take ids between them. There a run is used only when the caller
/// does not want the ids; they still ascend in the order given (rows are numbered as they are
/// inserted, and `JSON_TABLE` gives its rows in the array's order).
#[derive(Clone, Copy)]
pub(super) struct Autoinc {
    /// `auto_increment_increment`: 1 unless set, as Galera does (the cluster's size).
    step: i64,
    /// Whether a bulk insert's rows get consecutive ids (lock mode 0 or 1).
    consecutive: bool,
}

impl Autoinc {
    async fn ask<R: Run<Sql = Sql>>(r: &R) -> Result<Autoinc> {
        let sql = "SELECT CAST(@@SESSION.auto_increment_increment AS SIGNED), \
                   CAST(@@GLOBAL.innodb_autoinc_lock_mode AS SIGNED)";
        let row = r.values(Stmt::new(sql.to_owned(), B::new()), &[Col::Int, Col::Int]);
        let mut row = row
            .await?
            .into_iter()
            .next()
            .unwrap_or_default()
            .into_iter();
        match (
            row.next().and_then(Value::int),
            row.next().and_then(Value::int),
        ) {
            (Some(step), Some(mode)) => Ok(Autoinc {
                step,
                consecutive: mode < 2,
            }),
            _ => Err(Error::Internal(
                "the server did not say how it numbers new rows".into(),
            )),
        }
    }
}

/// A chunk's jobs turned into statements one at a time ([`Plan::step`]).
struct Plan<'a, I: Iterator<Item = JobParts<'a>>> {
    walk: Walk<'a, I>,
    autoinc: Option<Autoinc>,
    terms: Terms,
}

impl<'a, I: Iterator<Item = JobParts<'a>>> Plan<'a, I> {
    /// The next step; `None` after the last. A bulk piece goes in several inserts: runs of at
    /// least [`MIN_RUN`](crate::queue::incoming::MIN_RUN) alike jobs one statement each
    /// ([`insert_run`]), where the server and the ids allow, and the jobs between them at most
    /// [`BULK_ROWS`] rows of values per statement ([`insert_stmt`]).
    fn step(&mut self) -> Result<Option<Ready<'a>>> {
        match self.walk.next() {
            Next::Done => return Ok(None),
            Next::Keyed(job) => return Ok(Some(Ready::Keyed(job))),
            Next::Bulk => {}
        }
        // The ids of more than one job need the server's numbering; one job's is its
        // insert's own, and a caller who only counts the jobs is answered 0s.
        let autoinc = match self.autoinc {
            None if self.terms.ids && self.walk.waiting() > 1 => return Ok(Some(Ready::Ask)),
            a => a,
        };
        let consecutive = autoinc.is_none_or(|a| a.consecutive);
        let runs = self.terms.runs && (consecutive || !self.terms.ids);
        let (jobs, is_run) = self.walk.take(BULK_ROWS, |jobs| match runs {
            true => run_len(jobs),
            false => 0,
        });
        let stmt = match is_run {
            true => insert_run(jobs)?,
            false => insert_stmt(jobs)?,
        };
        Ok(Some(Ready::Insert(Insert {
            stmt,
            n: jobs.len(),
            known: self.terms.ids && (consecutive || !is_run),
        })))
    }
}

/// How many jobs from the first of `jobs` make a run: alike, each payload nested at most
/// [`RUN_DEPTH`] levels deep.
fn run_len(jobs: &[JobParts<'_>]) -> usize {
    jobs.iter()
        .take_while(|j| alike(&jobs[0], j) && nests_within(&j.payload, RUN_DEPTH))
        .count()
}

/// The deepest payload a run takes: MariaDB reads JSON at most 32 levels deep, and the run's
/// array is one more (a payload 31 deep was refused, one 30 deep read). Deeper payloads go in
/// rows of values, which MariaDB does not parse.
const RUN_DEPTH: usize = 30;

/// Whether the JSON text `payload` nests at most `max` arrays and objects deep.
fn nests_within(payload: &str, max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &c in payload.as_bytes() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

/// The columns an enqueue writes, as [`job_values`] gives them.
const COLUMNS: &str = "queue, kind, payload, priority, run_at, max_attempts, unique_key, \
     timeout_ms, limit_key, created_at";

/// One job's values in an enqueue's INSERT, in the order of [`COLUMNS`]; its payload the one
/// given, or bound when `None`. The run-at is absolute epoch milliseconds when given, else now
/// + the delay (see `Sql::at_ms`: no session time zone is involved).
fn job_values(b: &mut B, job: &JobParts<'_>, payload: Option<&str>) -> Result<String> {
    let delay_us = job
        .delay_ms
        .checked_mul(1000)
        .ok_or_else(|| Error::InvalidInput("delay is too long".into()))?;
    // Bound in the order they appear (MySQL's placeholders are positional).
    let (queue, kind) = (b.bind(job.queue.to_owned()), b.bind(job.kind.to_owned()));
    let payload = match payload {
        Some(p) => p.to_owned(),
        None => b.bind(job.payload.to_string()),
    };
    let (priority, at) = (b.bind(job.priority), Sql::at_ms(&b.bind(job.run_at_ms)));
    Ok(format!(
        "{queue}, {kind}, {payload}, {priority}, COALESCE({at}, {NOW} + INTERVAL {} MICROSECOND), \
         {}, {}, {}, {}, {NOW}",
        b.bind(delay_us),
        b.bind(job.max_attempts),
        b.bind(job.unique_key.map(str::to_owned)),
        b.bind(job.timeout_ms),
        b.bind(job.limit_key.map(str::to_owned)),
    ))
}

/// `INSERT INTO rowclaim_jobs … VALUES (…), (…)` for these jobs.
pub(crate) fn insert_stmt(jobs: &[JobParts<'_>]) -> Result<Stmt<Sql>> {
    let mut b = B::new();
    let mut rows = Vec::with_capacity(jobs.len());
    for j in jobs {
        rows.push(format!("({})", job_values(&mut b, j, None)?));
    }
    let sql = format!(
        "INSERT INTO rowclaim_jobs ({COLUMNS}) VALUES {}",
        rows.join(", ")
    );
    Ok(Stmt::new(sql, b))
}

/// An insert of `run` (alike jobs) in one statement: their settings bound once, their payloads
/// as one JSON array that `JSON_TABLE` reads back element by element (a row of ten bound
/// values per job costs the server about half as much again). MariaDB hands each element back
/// as its text, exactly as given. MySQL 8 would not: its `JSON` type parses each one (numbers
/// past 64 bits rounded through a float, keys sorted) and, in recent 8.0 releases, makes a JSON
/// `null` an SQL NULL; so runs are MariaDB's only ([`Terms::runs`]).
///
/// Under `innodb_autoinc_lock_mode` 1 the statement holds the table's AUTO-INC lock to its end
/// (see [`Autoinc`]): other inserts into the jobs table wait for it (up to 5,000 rows, tens of
/// milliseconds), where rows of values take it only for a moment.
fn insert_run(run: &[JobParts<'_>]) -> Result<Stmt<Sql>> {
    let mut payloads =
        String::with_capacity(run.iter().map(|j| j.payload.len() + 1).sum::<usize>() + 1);
    for (i, j) in run.iter().enumerate() {
        payloads.push(if i == 0 { '[' } else { ',' });
        payloads.push_str(&j.payload);
    }
    payloads.push(']');
    let mut b = B::new();
    let values = job_values(&mut b, &run[0], Some("j.payload"))?;
    let sql = format!(
        "INSERT INTO rowclaim_jobs ({COLUMNS}) SELECT {values} FROM JSON_TABLE({}, '$[*]' \
         COLUMNS (payload JSON PATH '$')) AS j",
        b.bind(payloads)
    );
    Ok(Stmt::new(sql, b))
}
/// Runs `insert`, if there is one (checking it wrote every job); adds the jobs' ids to `out`,
/// or 0s where they are not known (see [`Autoinc`]).
async fn insert_bulk<R: InsertId>(
    r: &R,
    insert: Option<Insert>,
    autoinc: Option<Autoinc>,
    out: &mut Vec<Enqueued>,
) -> Result<()> {
    let Some(Insert { stmt, n, known }) = insert else {
        return Ok(());
    };
    let (first, wrote) = r.insert_ids(stmt).await?;
    if usize::try_from(wrote).ok() != Some(n) {
        return Err(Error::Internal(format!(
            "an insert of {n} jobs wrote {wrote}"
        )));
    }
    let step = autoinc.map_or(1, |a| a.step);
    out.extend((0..n as i64).map(|i| Enqueued {
        id: if known { first + i * step } else { 0 },
        existing: false,
    }));
    Ok(())
}

/// Enqueues one job on a connection (in the caller's transaction when they hold one; this neither
/// begins nor commits). With a unique key that a ready or running job has already, returns that
/// job.
pub(crate) async fn enqueue_one<R: InsertId>(r: &R, job: &JobParts<'_>) -> Result<Enqueued> {
    check_times(job)?;
    check_packet(r, std::slice::from_ref(job), 0).await?;
    let Some(key) = job.unique_key else {
        let id = r.insert_id(insert_stmt(std::slice::from_ref(job))?).await?;
        return Ok(Enqueued {
            id,
            existing: false,
        });
    };
    for _ in 0..UNIQUE_TRIES {
        // The insert itself is the uniqueness check: it waits for a twin another transaction is
        // inserting, and fails with a duplicate key once that one commits. A failed statement
        // undoes only itself in MySQL, so the caller's transaction goes on.
        match r.insert_id(insert_stmt(std::slice::from_ref(job))?).await {
            Ok(id) => {
                return Ok(Enqueued {
                    id,
                    existing: false,
                })
            }
            Err(Error::Database(e)) if error_number(e.sqlx()) == Some(DUPLICATE_KEY) => {}
            Err(e) => return Err(e),
        }
        if let Some(id) = first_int(r, twin(key)).await? {
            return Ok(Enqueued { id, existing: true });
        }
        // The twin completed, died or was cancelled in between: the key is free again.
    }
    Err(Error::InvalidInput(format!(
        "could not enqueue the job with unique key {key:?}: other jobs with that key kept \
         starting and finishing; try again"
    )))
}

/// The pending job with unique key `key`. A locking read sees the latest committed rows, also
/// in a caller's REPEATABLE READ transaction whose snapshot predates the twin. (The failed
/// insert holds a shared lock on the twin's key already.) `LOCK IN SHARE MODE` is understood by
/// MySQL 8 and MariaDB.
fn twin(key: &str) -> Stmt<Sql> {
    let mut b = B::new();
    let sql = format!(
        "SELECT id FROM rowclaim_jobs WHERE pending_key = {} LOCK IN SHARE MODE",
        b.bind(key.to_owned())
    );
    Stmt::new(sql, b)
}

#[cfg(test)]
mod tests;
