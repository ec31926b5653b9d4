//! The managed queue's SQL on PostgreSQL (its schema: `migrate/postgres.rs`): enqueue (jobs that
//! run now by COPY, others many per statement, arrays `unnest`ed into rows), admin, stats and
//! records, and the LISTEN that wakes idle workers. Every statement goes through the driver's
//! [`Run`], but for the COPY, which has its own protocol.

use sqlx::Postgres;

use super::counts::{Counting, Estimate};
use super::incoming::{pieces, Piece};
use super::migrate::{migrate, Component};
use super::record::{records_sql, RecordRow};
use super::store::{admin_stmt, insert_unless_pending};
use super::{
    Admin, Enqueued, Incoming, JobFilter, JobParts, JobRecord, Listener, NewJob, QueueStats,
    QueueStore,
};
use crate::backend::postgres::{Pg, Sql};
use crate::backend::run::{Finish, InTx, OnConn, Run, Transact};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::Result;

type B = Binder<Sql>;

impl Pg {
    /// A connection listening on the enqueue channel: on the pool's server, or on the direct
    /// URL given for it; None through a pooler without one.
    pub(crate) async fn listener(&self) -> Result<Option<sqlx::postgres::PgListener>> {
        let Some(pool) = self.route().listen_pool() else {
            return Ok(None);
        };
        let mut l = sqlx::postgres::PgListener::connect_with(&pool)
            .await
            .map_err(crate::backend::postgres::error)?;
        l.listen(super::CHANNEL)
            .await
            .map_err(crate::backend::postgres::error)?;
        Ok(Some(l))
    }
}

#[async_trait::async_trait]
impl QueueStore for Pg {
    async fn listen(&self) -> Result<Option<Listener>> {
        match self.listener().await? {
            Some(l) => Ok(Some(Listener::Postgres(l, self.clone()))),
            None => {
                tracing::warn!(
                    "LISTEN cannot pass a transaction-mode pooler (pgbouncer=true): idle \
                     workers poll for new jobs; give a direct URL for wake-ups \
                     (--listen-database)"
                );
                Ok(None)
            }
        }
    }

    async fn wake(&self, queue: &str) -> Result<()> {
        self.execute(notify(queue)).await?;
        Ok(())
    }

    async fn init(&self) -> Result<()> {
        for component in Component::ALL {
            // Concurrent inits take turns on one lock, held until the transaction ends; DDL is
            // transactional here, so a failed step leaves nothing.
            let tx = self.transaction(true).await?;
            tx.execute(Stmt::new(INIT_LOCK.to_owned(), B::new()))
                .await?;
            migrate(&tx, component).await?;
            tx.commit().await?;
        }
        Ok(())
    }

    async fn enqueue(&self, jobs: &mut Incoming<'_>, ids: bool) -> Result<Vec<Enqueued>> {
        let tx = self.transaction(true).await?;
        let mut out = Vec::new();
        // The queues of the jobs inserted in bulk, woken once each at the end (a notification
        // is delivered at the commit, whenever it was sent in the transaction).
        let mut woken: Vec<String> = Vec::new();
        while let Some((_, chunk)) = jobs.next().await? {
            insert_jobs(&tx, chunk, ids, &mut out, &mut woken).await?;
        }
        woken.sort_unstable();
        woken.dedup();
        for q in woken {
            tx.execute(notify(&q)).await?;
        }
        super::after::hold(&tx, jobs.to_hold(), &out).await?;
        let n = jobs.count();
        tx.commit_as(|| super::job::enqueue_what(n)).await?;
        Ok(out)
    }

    async fn admin(&self, op: Admin) -> Result<u64> {
        // Durable whatever the pool's commit setting: an operator's change is not to be lost.
        let tx = self.transaction(true).await?;
        let changed = tx
            .execute(admin_stmt(op, |b: &mut B, age| {
                format!(
                    "now() - make_interval(secs => {})",
                    b.bind(age.as_secs_f64())
                )
            }))
            .await?;
        tx.commit().await?;
        Ok(changed)
    }

    async fn stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        super::counts::stats_in_one(self, &COUNTING, queue).await
    }

    async fn records(&self, filter: &JobFilter, id: Option<i64>) -> Result<Vec<JobRecord>> {
        let ms = Sql::epoch_ms;
        let columns = format!(
            "id, queue, kind, payload::text, status, priority::int8, attempts::int8, \
             max_attempts::int8, {}, {}, {}, {}, owner, unique_key, last_error, timeout_ms, \
             output::text, limit_key, {}, errors::text",
            ms("run_at"),
            ms("created_at"),
            ms("finished_at"),
            ms("lease_until"),
            ms("attempted_at")
        );
        let mut b = B::new();
        let sql = records_sql(&mut b, &columns, filter, id);
        let rows: Vec<RecordRow> = self.fetch_all(Stmt::new(sql, b)).await?;
        Ok(rows.into_iter().map(JobRecord::from_row).collect())
    }
}

super::store::enqueue_one_by!(
    InTx<'_, Pg, Postgres>,
    OnConn<'_, Postgres>,
    #[cfg(test)]
    super::script::Step<'_, Sql>,
);

/// Inserts `jobs` (one chunk of an enqueue) piece by piece ([`pieces`]), their ids to `out` in
/// order, and notes the queues of the jobs inserted in bulk in `woken`.
async fn insert_jobs(
    tx: &InTx<'_, Pg, Postgres>,
    jobs: &[NewJob],
    ids: bool,
    out: &mut Vec<Enqueued>,
    woken: &mut Vec<String>,
) -> Result<()> {
    out.reserve(jobs.len());
    for piece in pieces(jobs.iter().map(NewJob::parts), BULK_ROWS, BULK_BYTES) {
        match piece {
            Piece::Keyed(job) => out.push(enqueue_one(tx, &job).await?),
            Piece::Bulk(bulk) => {
                for job in &bulk {
                    if woken.last().map(String::as_str) != Some(job.queue) {
                        woken.push(job.queue.to_owned());
                    }
                }
                out.extend(insert_chunk(tx, bulk, ids).await?);
            }
        }
    }
    Ok(())
}

/// Concurrent inits take turns on this lock (see `init`).
const INIT_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('rowclaim_init'))";

/// Jobs per bulk insert: one statement's arrays (a handful of bound values however many jobs,
/// far from the 65,535 a statement may have).
const BULK_ROWS: usize = 50_000;

/// Payload bytes per bulk insert: a statement's payload array stays far below the 1 GiB a value
/// may have, and the server's memory for one statement small.
const BULK_BYTES: usize = 16 << 20;

/// When a job runs: at its absolute time (epoch ms) if it has one, else now + its delay.
fn run_at(at: &str, delay: &str) -> String {
    format!(
        "COALESCE({}, now() + make_interval(secs => {delay}::float8 / 1000))",
        Sql::at_ms(at)
    )
}

/// Enqueues one job on a connection (in the caller's transaction when they hold one). A unique
/// key that is pending already returns that job.
pub(crate) async fn enqueue_one<R: Run<Sql = Sql>>(r: &R, job: &JobParts<'_>) -> Result<Enqueued> {
    let done = insert_unless_pending(r, job, insert_one).await?;
    if !done.existing {
        r.execute(notify(job.queue)).await?;
    }
    Ok(done)
}

/// Inserts one job unless its unique key is pending; returns its id if it was inserted.
pub(crate) fn insert_one(job: &JobParts<'_>) -> Stmt<Sql> {
    let mut b = B::new();
    let (queue, kind) = (b.bind(job.queue.to_owned()), b.bind(job.kind.to_owned()));
    let (payload, priority) = (b.bind(job.payload.to_string()), b.bind(job.priority));
    let run_at = run_at(&b.bind(job.run_at_ms), &b.bind(job.delay_ms));
    let sql = format!(
        "INSERT INTO rowclaim_jobs \
         (queue, kind, payload, priority, run_at, max_attempts, unique_key, timeout_ms, limit_key) \
         VALUES ({queue}, {kind}, {payload}::jsonb, {priority}, {run_at}, {}, {}, {}, {}) \
         ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND status IN ('ready', 'running') \
         DO NOTHING RETURNING id",
        b.bind(job.max_attempts),
        b.bind(job.unique_key.map(str::to_owned)),
        b.bind(job.timeout_ms),
        b.bind(job.limit_key.map(str::to_owned)),
    );
    Stmt::new(sql, b)
}

/// Inserts a chunk of jobs without unique keys in the enqueue's transaction: by COPY when every
/// one of them runs now (the usual bulk enqueue; COPY writes its rows in batches, which an
/// `INSERT … SELECT` cannot), else in one statement ([`insert_bulk`]). Either way the ids
/// ascend in the order the jobs were given in. Without `ids` a COPY's jobs are answered with
/// id 0 (the caller counts them only). The caller wakes the listening workers.
async fn insert_chunk(
    tx: &InTx<'_, Pg, Postgres>,
    jobs: Vec<JobParts<'_>>,
    ids: bool,
) -> Result<Vec<Enqueued>> {
    if jobs
        .iter()
        .all(|j| j.run_at_ms.is_none() && j.delay_ms == 0)
    {
        copy_bulk(tx, jobs, ids).await
    } else {
        insert_bulk(tx, jobs).await
    }
}

/// The COPY of [`copy_bulk`]: each job's id given (see [`ids_stmt`]), or, without, the column's
/// default (the next of its sequence); its run-at the column's default, now() (the
/// transaction's start, as for a job enqueued with no delay).
const COPY_JOBS: &str = "COPY rowclaim_jobs \
     (id, queue, kind, payload, priority, max_attempts, timeout_ms, limit_key) FROM STDIN";
const COPY_JOBS_NO_IDS: &str = "COPY rowclaim_jobs \
     (queue, kind, payload, priority, max_attempts, timeout_ms, limit_key) FROM STDIN";

/// `n` new ids from the jobs' own sequence (the one `id bigserial` made), ascending: other
/// enqueues may take ids meanwhile, never these.
fn ids_stmt(n: usize) -> Stmt<Sql> {
    let mut b = B::new();
    let sql = format!(
        "SELECT nextval(s) FROM CAST(pg_get_serial_sequence('rowclaim_jobs', 'id') AS regclass) \
         AS s, generate_series(1, {}) ORDER BY 1",
        b.bind(n as i64)
    );
    Stmt::new(sql, b)
}

/// Inserts jobs that run now, without unique keys, by COPY in the transaction `tx`. With `ids`
/// their ids are taken from the sequence first and given to the jobs in order; without, each
/// row takes the next one itself and the jobs are answered with id 0.
async fn copy_bulk(
    tx: &InTx<'_, Pg, Postgres>,
    jobs: Vec<JobParts<'_>>,
    ids: bool,
) -> Result<Vec<Enqueued>> {
    if jobs.is_empty() {
        return Ok(vec![]);
    }
    let given = ids;
    let (ids, copy_sql): (Vec<(i64,)>, _) = if given {
        (tx.fetch_all(ids_stmt(jobs.len())).await?, COPY_JOBS)
    } else {
        (vec![(0,); jobs.len()], COPY_JOBS_NO_IDS)
    };
    if ids.len() != jobs.len() {
        return Err(crate::error::Error::InvalidInput(format!(
            "the id sequence gave {} ids for {} jobs",
            ids.len(),
            jobs.len()
        )));
    }
    let mut data = Vec::with_capacity(jobs.iter().map(|j| j.payload.len() + 32).sum());
    for ((id,), j) in ids.iter().zip(&jobs) {
        copy_row(&mut data, given.then_some(*id), j);
    }
    let written = {
        let mut conn = tx.tx.lock().await;
        let mut copy = conn
            .copy_in_raw(copy_sql)
            .await
            .map_err(crate::backend::postgres::error)?;
        copy.send(data)
            .await
            .map_err(crate::backend::postgres::error)?;
        copy.finish()
            .await
            .map_err(crate::backend::postgres::error)?
    };
    if written != jobs.len() as u64 {
        return Err(crate::error::Error::InvalidInput(format!(
            "COPY wrote {written} of {} jobs",
            jobs.len()
        )));
    }
    Ok(new_jobs(ids))
}

/// The answers for jobs just inserted, in the order of their ids.
fn new_jobs(ids: Vec<(i64,)>) -> Vec<Enqueued> {
    ids.into_iter()
        .map(|(id,)| Enqueued {
            id,
            existing: false,
        })
        .collect()
}

/// One job as a line of COPY's text format: tab-separated, `\N` for NULL, and a backslash,
/// tab, newline or carriage return in a value written as its escape. Without an id the line
/// has no id column.
fn copy_row(out: &mut Vec<u8>, id: Option<i64>, j: &JobParts<'_>) {
    use std::io::Write;
    fn text(out: &mut Vec<u8>, s: &str) {
        for b in s.bytes() {
            match b {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\t' => out.extend_from_slice(b"\\t"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                _ => out.push(b),
            }
        }
    }
    // Writing into a Vec cannot fail.
    if let Some(id) = id {
        let _ = write!(out, "{id}\t");
    }
    text(out, j.queue);
    out.push(b'\t');
    text(out, j.kind);
    out.push(b'\t');
    text(out, &j.payload);
    let _ = write!(out, "\t{}\t{}\t", j.priority, j.max_attempts);
    match j.timeout_ms {
        Some(ms) => {
            let _ = write!(out, "{ms}");
        }
        None => out.extend_from_slice(b"\\N"),
    }
    out.push(b'\t');
    match j.limit_key {
        Some(k) => text(out, k),
        None => out.extend_from_slice(b"\\N"),
    }
    out.push(b'\n');
}

/// Inserts jobs without unique keys in one statement (arrays unnested into rows).
async fn insert_bulk<R: Run<Sql = Sql>>(r: &R, jobs: Vec<JobParts<'_>>) -> Result<Vec<Enqueued>> {
    if jobs.is_empty() {
        return Ok(vec![]);
    }
    Ok(new_jobs(r.fetch_all(bulk_stmt(jobs)).await?))
}

/// The bulk insert of [`insert_bulk`]: the payloads as one array, unnested into rows in the
/// order given (so are the ids `RETURNING` gives back). Every other column is bound once when
/// all the jobs share its value (as jobs enqueued together mostly do: less for the client to
/// send and for the server to unnest), else as an array beside the payloads. A run-at of "now"
/// for every job is the column's default, `now()`, as `now() + 0 s` would be.
fn bulk_stmt(jobs: Vec<JobParts<'_>>) -> Stmt<Sql> {
    let mut i = BulkInsert::default();
    let same = |v| v;
    i.column(&jobs, "queue", "text", |j| j.queue, str::to_owned);
    i.column(&jobs, "kind", "text", |j| j.kind, str::to_owned);
    i.column(&jobs, "priority", "int4", |j| j.priority, same);
    i.column(&jobs, "max_attempts", "int4", |j| j.max_attempts, same);
    i.column(&jobs, "timeout_ms", "int8", |j| j.timeout_ms, |v| v);
    let owned = |k: Option<&str>| k.map(str::to_owned);
    i.column(&jobs, "limit_key", "text", |j| j.limit_key, owned);
    i.run_at(&jobs);
    // The payloads into their array (a serialised value moved, not copied).
    let payloads: Vec<String> = jobs.into_iter().map(|j| j.payload.into_owned()).collect();
    i.columns.push("payload");
    i.values.push("j.payload::jsonb".to_owned());
    let payloads = i.b.bind(payloads);
    i.arrays.push(format!("{payloads}::text[]"));
    i.names.push("payload");
    let sql = format!(
        "INSERT INTO rowclaim_jobs ({}) SELECT {} FROM unnest({}) AS j({}) RETURNING id",
        i.columns.join(", "),
        i.values.join(", "),
        i.arrays.join(", "),
        i.names.join(", ")
    );
    Stmt::new(sql, i.b)
}

/// [`bulk_stmt`]'s parts: the columns written, what each row's value is, and the arrays
/// unnested (named in `j`).
#[derive(Default)]
struct BulkInsert {
    b: B,
    columns: Vec<&'static str>,
    values: Vec<String>,
    arrays: Vec<String>,
    names: Vec<&'static str>,
}

impl BulkInsert {
    /// `column` of every job, as `get` reads it (borrowed) and `own` binds it: one bound value
    /// (cast to `ty`) when all are equal, else an array named `column` in `j`.
    fn column<'a, T: PartialEq + Copy, U>(
        &mut self,
        jobs: &[JobParts<'a>],
        column: &'static str,
        ty: &str,
        get: impl Fn(&JobParts<'a>) -> T,
        own: impl Fn(T) -> U,
    ) where
        U: Into<crate::backend::sql::Value>,
        Vec<U>: Into<crate::backend::sql::Value>,
    {
        let first = get(&jobs[0]);
        self.columns.push(column);
        if jobs[1..].iter().all(|j| get(j) == first) {
            self.values
                .push(format!("{}::{ty}", self.b.bind(own(first))));
        } else {
            let all: Vec<U> = jobs.iter().map(|j| own(get(j))).collect();
            self.values.push(format!("j.{column}"));
            self.arrays.push(format!("{}::{ty}[]", self.b.bind(all)));
            self.names.push(column);
        }
    }

    /// The run-at: the column's default (now) for all, one time for all, or each job's own.
    fn run_at(&mut self, jobs: &[JobParts<'_>]) {
        let when = |j: &JobParts<'_>| (j.run_at_ms, j.delay_ms);
        let first = when(&jobs[0]);
        if jobs[1..].iter().all(|j| when(j) == first) {
            if first != (None, 0) {
                self.columns.push("run_at");
                let (at, delay) = (self.b.bind(first.0), self.b.bind(first.1));
                self.values.push(run_at(&at, &delay));
            }
        } else {
            self.columns.push("run_at");
            self.values.push(run_at("j.at", "j.delay"));
            let at: Vec<Option<i64>> = jobs.iter().map(|j| j.run_at_ms).collect();
            let delay: Vec<i64> = jobs.iter().map(|j| j.delay_ms).collect();
            let (at, delay) = (self.b.bind(at), self.b.bind(delay));
            self.arrays.push(format!("{at}::int8[]"));
            self.arrays.push(format!("{delay}::int8[]"));
            self.names.extend(["at", "delay"]);
        }
    }
}

/// Wakes listening workers of `queue` (when the enqueueing transaction commits, inside one).
fn notify(queue: &str) -> Stmt<Sql> {
    let mut b = B::new();
    let sql = format!(
        "SELECT pg_notify('{}', {})",
        super::CHANNEL,
        b.bind(queue.to_owned())
    );
    Stmt::new(sql, b)
}

/// How stats count here: ready jobs through the ready index, dead and cancelled through theirs
/// (v8), each by queue; above the cap, the planner's estimate.
const COUNTING: Counting = Counting {
    per_queue: &["ready", "dead", "cancelled"],
    estimate: Some(Estimate {
        explain: "EXPLAIN",
        rows: planned_rows,
    }),
    recursive_scan: true,
};

/// The rows the plan's top node expects: `rows=N` in the first line of `EXPLAIN`'s text.
fn planned_rows(lines: &[String]) -> Option<u64> {
    let first = lines.first()?;
    let at = first.find(" rows=")? + " rows=".len();
    let digits: String = first[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
