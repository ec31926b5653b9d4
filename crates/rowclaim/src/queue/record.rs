//! Jobs as stored, for looking at them (`rowclaim jobs list` / `jobs show`): one shape on every
//! database. Each store reads the same columns, times as epoch milliseconds (the databases keep
//! them as timestamptz, DATETIME(6) in UTC and integers), and [`JobRecord`] prints them as
//! RFC 3339 in UTC, so a script reading the JSON need not know which database wrote it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};

use crate::backend::sql::{Binder, Dialect};
use crate::error::{Error, Result};

/// The states a job of the managed queue can be in.
pub const JOB_STATUSES: &[&str] = &[
    "waiting",
    "ready",
    "running",
    "completed",
    "dead",
    "cancelled",
];

/// Which jobs [`crate::Queue::list`] returns: all of them unless narrowed, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobFilter {
    /// Only these queues (all when empty).
    pub queues: Vec<String>,
    /// Only these kinds (all when empty).
    pub kinds: Vec<String>,
    /// Only jobs in this state (one of [`JOB_STATUSES`]).
    pub status: Option<String>,
    /// At most this many: a list 50 unless set, [`crate::Queue::bulk`] every match unless set;
    /// [`crate::Queue::count`] counts every match.
    pub limit: Option<u32>,
    /// Only jobs with a lower id: the next (older) page after a page ending there.
    pub before_id: Option<i64>,
    /// Only jobs with a higher id: the page before (newer than) a page starting there. The
    /// list is still newest first: the jobs just above `after_id`.
    pub after_id: Option<i64>,
    /// Only jobs created longer ago than this, by the database's clock.
    pub older_than: Option<Duration>,
    /// Only jobs whose id is this number, or whose kind, status, payload (as JSON text) or last
    /// error contains this text, ignoring case. `%` and `_` are plain characters here.
    pub search: Option<String>,
}

impl JobFilter {
    /// All jobs, at most 50.
    pub fn new() -> JobFilter {
        JobFilter::default()
    }

    /// Only jobs of these queues.
    pub fn queues(mut self, queues: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.queues = queues.into_iter().map(Into::into).collect();
        self
    }

    /// Only jobs of these kinds.
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.kinds = kinds.into_iter().map(Into::into).collect();
        self
    }

    /// Only jobs in `status`: `waiting`, `ready`, `running`, `completed`, `dead` or `cancelled`.
    pub fn status(mut self, status: impl Into<String>) -> Self {
        self.status = Some(status.into());
        self
    }

    /// At most `n` jobs.
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    /// Only jobs with an id below `id` (jobs are listed newest first, so: the next page).
    pub fn before_id(mut self, id: i64) -> Self {
        self.before_id = Some(id);
        self
    }

    /// Only jobs with an id above `id`: the newer page before a page starting at `id`.
    pub fn after_id(mut self, id: i64) -> Self {
        self.after_id = Some(id);
        self
    }

    /// Only jobs created longer than `age` ago (by the database's clock).
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Only jobs whose id is `text`, or whose kind, status, payload or last error contains
    /// `text`, ignoring case.
    pub fn search(mut self, text: impl Into<String>) -> Self {
        self.search = Some(text.into());
        self
    }

    /// Whether anything narrows the jobs down (a limit or a page alone does not).
    pub fn narrows(&self) -> bool {
        !self.queues.is_empty()
            || !self.kinds.is_empty()
            || self.status.is_some()
            || self.older_than.is_some()
            || self.search.is_some()
    }

    /// Refuses a state no job can be in: a typo would otherwise list nothing, silently.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(s) = &self.status {
            if !JOB_STATUSES.contains(&s.as_str()) {
                return Err(Error::InvalidInput(format!(
                    "status {s:?} is not a job state; it is one of {}",
                    JOB_STATUSES.join(", ")
                )));
            }
        }
        if self.search.as_deref().is_some_and(str::is_empty) {
            return Err(Error::InvalidInput(
                "the search text is empty; leave the search out to match every job".into(),
            ));
        }
        if self
            .older_than
            .is_some_and(|d| d.as_millis() > i64::MAX as u128)
        {
            return Err(Error::InvalidInput("the age is too large".into()));
        }
        Ok(())
    }
}

/// A job as stored in `rowclaim_jobs`, the same on every database. Serialised with its times as
/// RFC 3339 in UTC with milliseconds (`"2026-11-23T10:00:00.123Z"`), absent ones as `null`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct JobRecord {
    /// The job's id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its kind.
    pub kind: String,
    /// `waiting`, `ready`, `running`, `completed`, `dead` or `cancelled`.
    pub status: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// Higher runs first.
    pub priority: i64,
    /// Runs so far (claims, counting the one running now).
    pub attempts: i64,
    /// Runs it may have in all.
    pub max_attempts: i64,
    /// When it runs next (or ran last).
    #[serde(serialize_with = "rfc3339")]
    pub run_at: SystemTime,
    /// When it was enqueued.
    #[serde(serialize_with = "rfc3339")]
    pub created_at: SystemTime,
    /// When it completed, died or was cancelled.
    #[serde(serialize_with = "rfc3339_opt")]
    pub finished_at: Option<SystemTime>,
    /// While running: when its lease runs out.
    #[serde(serialize_with = "rfc3339_opt")]
    pub lease_until: Option<SystemTime>,
    /// While running: the token of the claim that holds it.
    pub owner: Option<String>,
    /// Its unique key, if it was enqueued with one.
    pub unique_key: Option<String>,
    /// The error of its last failed run.
    pub last_error: Option<String>,
    /// Its own time limit per run, in milliseconds, if it was enqueued with one.
    pub timeout_ms: Option<i64>,
    /// What its handler produced when it completed (for `rowclaim work`, the command's stdout),
    /// if anything.
    pub output: Option<serde_json::Value>,
    /// Its limit key: jobs of one key share the queue's per-key limits.
    pub limit_key: Option<String>,
    /// When its latest attempt started (by the database's clock).
    #[serde(serialize_with = "rfc3339_opt")]
    pub attempted_at: Option<SystemTime>,
    /// Its failed attempts, oldest first (the last 20 are kept): each one's error and times.
    /// A retry by hand keeps them; a job that never failed has none.
    pub errors: Vec<AttemptError>,
}

/// One failed attempt of a job, as kept in its `errors`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct AttemptError {
    /// Which attempt it was (1 for the first run).
    pub attempt: Option<i64>,
    /// When it started (by the database's clock).
    #[serde(serialize_with = "rfc3339_opt")]
    pub started_at: Option<SystemTime>,
    /// When it failed (by the database's clock).
    #[serde(serialize_with = "rfc3339_opt")]
    pub ended_at: Option<SystemTime>,
    /// Its error (the first 2,000 characters; for `rowclaim work -- COMMAND`, the command's
    /// exit status and the tail of its stderr).
    pub error: String,
}

/// An attempt as the databases store it (times in epoch milliseconds).
#[derive(serde::Deserialize)]
struct StoredAttempt {
    attempt: Option<i64>,
    started_ms: Option<f64>,
    ended_ms: Option<f64>,
    #[serde(default)]
    error: Option<String>,
}

/// A job's `errors` column (JSON text; NULL for none) as its attempts. A list that does not
/// read (edited by hand) shows as one entry saying so, rather than hiding the job.
fn attempts_of(text: Option<String>) -> Vec<AttemptError> {
    let Some(text) = text else {
        return Vec::new();
    };
    let ms = |v: Option<f64>| v.map(|ms| at_ms(ms as i64));
    match serde_json::from_str::<Vec<StoredAttempt>>(&text) {
        Ok(list) => list
            .into_iter()
            .map(|a| AttemptError {
                attempt: a.attempt,
                started_at: ms(a.started_ms),
                ended_at: ms(a.ended_ms),
                error: a.error.unwrap_or_default(),
            })
            .collect(),
        Err(e) => vec![AttemptError {
            attempt: None,
            started_at: None,
            ended_at: None,
            error: format!("(the job's errors column does not read as a list of attempts: {e})"),
        }],
    }
}

/// The columns every store selects, in this order (times in epoch milliseconds; the payload
/// and output as JSON text).
pub(crate) struct RecordRow {
    id: i64,
    queue: String,
    kind: String,
    payload: String,
    status: String,
    priority: i64,
    attempts: i64,
    max_attempts: i64,
    run_at: i64,
    created_at: i64,
    finished_at: Option<i64>,
    lease_until: Option<i64>,
    owner: Option<String>,
    unique_key: Option<String>,
    last_error: Option<String>,
    timeout_ms: Option<i64>,
    output: Option<String>,
    limit_key: Option<String>,
    attempted_at: Option<i64>,
    errors: Option<String>,
}

// By position, as each store's `columns` lists them (more columns than sqlx's tuples take).
impl<'r, R> sqlx::FromRow<'r, R> for RecordRow
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> std::result::Result<Self, sqlx::Error> {
        Ok(RecordRow {
            id: row.try_get(0)?,
            queue: row.try_get(1)?,
            kind: row.try_get(2)?,
            payload: row.try_get(3)?,
            status: row.try_get(4)?,
            priority: row.try_get(5)?,
            attempts: row.try_get(6)?,
            max_attempts: row.try_get(7)?,
            run_at: row.try_get(8)?,
            created_at: row.try_get(9)?,
            finished_at: row.try_get(10)?,
            lease_until: row.try_get(11)?,
            owner: row.try_get(12)?,
            unique_key: row.try_get(13)?,
            last_error: row.try_get(14)?,
            timeout_ms: row.try_get(15)?,
            output: row.try_get(16)?,
            limit_key: row.try_get(17)?,
            attempted_at: row.try_get(18)?,
            errors: row.try_get(19)?,
        })
    }
}

/// JSON text as the JSON it is (a store that keeps JSON as text may hold anything).
fn json_of(text: String) -> serde_json::Value {
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
}

impl JobRecord {
    pub(crate) fn from_row(r: RecordRow) -> JobRecord {
        JobRecord {
            id: r.id,
            queue: r.queue,
            kind: r.kind,
            status: r.status,
            // MySQL and SQLite keep the payload as text, PostgreSQL as jsonb: all of it arrives
            // as text here and is shown as the JSON it is.
            payload: json_of(r.payload),
            priority: r.priority,
            attempts: r.attempts,
            max_attempts: r.max_attempts,
            run_at: at_ms(r.run_at),
            created_at: at_ms(r.created_at),
            finished_at: r.finished_at.map(at_ms),
            lease_until: r.lease_until.map(at_ms),
            owner: r.owner,
            unique_key: r.unique_key,
            last_error: r.last_error,
            timeout_ms: r.timeout_ms,
            output: r.output.map(json_of),
            limit_key: r.limit_key,
            attempted_at: r.attempted_at.map(at_ms),
            errors: attempts_of(r.errors),
        }
    }
}

/// `SELECT columns FROM rowclaim_jobs WHERE <filter> ORDER BY id DESC LIMIT n`, or the one job
/// `id`. `columns` is the store's own spelling of [`RecordRow`].
pub(crate) fn records_sql<D: Dialect>(
    b: &mut Binder<D>,
    columns: &str,
    filter: &JobFilter,
    id: Option<i64>,
) -> String {
    let mut cond = filter_cond(b, filter);
    if let Some(id) = id {
        cond.push_str(&format!(" AND id = {}", b.bind(id)));
    }
    let limit = b.bind(i64::from(filter.limit.unwrap_or(50)));
    // A newer page is the jobs just above `after_id`: read upwards from there, then put newest
    // first (the caller reverses them).
    let order = if filter.after_id.is_some() && filter.before_id.is_none() {
        "ASC"
    } else {
        "DESC"
    };
    format!("SELECT {columns} FROM rowclaim_jobs WHERE {cond} ORDER BY id {order} LIMIT {limit}")
}

/// How many ready jobs of `filter`'s queues and kinds are scheduled for later and never ran,
/// and the first one's run-at: `first_run_at_ms` is the store's epoch-ms spelling of
/// `MIN(run_at)`. (Jobs awaiting a retry are work `--until-empty` waits for already.)
pub(crate) fn scheduled_sql<D: Dialect>(
    b: &mut Binder<D>,
    first_run_at_ms: &str,
    filter: &JobFilter,
) -> String {
    let cond = filter_cond(b, filter);
    format!(
        "SELECT COUNT(*), {first_run_at_ms} FROM rowclaim_jobs WHERE {cond} \
         AND status = 'ready' AND attempts = 0 AND run_at > {}",
        D::NOW
    )
}

/// Jobs scheduled for later, from [`crate::Queue::scheduled`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Scheduled {
    /// Ready jobs whose run-at is still to come and that never ran.
    pub jobs: u64,
    /// When the first of them is due (RFC 3339 in UTC when serialised).
    #[serde(serialize_with = "rfc3339_opt")]
    pub next_at: Option<SystemTime>,
}

impl Scheduled {
    pub(crate) fn new(jobs: i64, first_ms: Option<i64>) -> Scheduled {
        Scheduled {
            jobs: u64::try_from(jobs).unwrap_or(0),
            next_at: first_ms.map(at_ms),
        }
    }

    /// `next_at` as RFC 3339 in UTC with milliseconds.
    pub fn next_at_text(&self) -> Option<String> {
        self.next_at.map(format_rfc3339)
    }
}

/// `filter`'s queues, kinds, state, age, search and page as a condition, values bound.
pub(crate) fn filter_cond<D: Dialect>(b: &mut Binder<D>, filter: &JobFilter) -> String {
    let mut cond = String::from("1 = 1");
    let mut any_of = |b: &mut Binder<D>, col: &str, values: &[String]| {
        if !values.is_empty() {
            let list: Vec<String> = values.iter().map(|v| b.bind(v.clone())).collect();
            cond.push_str(&format!(" AND {col} IN ({})", list.join(", ")));
        }
    };
    any_of(b, "queue", &filter.queues);
    any_of(b, "kind", &filter.kinds);
    if let Some(s) = &filter.status {
        any_of(b, "status", std::slice::from_ref(s));
    }
    if let Some(id) = filter.before_id {
        cond.push_str(&format!(" AND id < {}", b.bind(id)));
    }
    if let Some(id) = filter.after_id {
        cond.push_str(&format!(" AND id > {}", b.bind(id)));
    }
    if let Some(age) = filter.older_than {
        // In epoch milliseconds, so that any age compares the same way on every database (no
        // date arithmetic past a type's years); `created_at` has no index to lose.
        let ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        cond.push_str(&format!(
            " AND {} < {} - {}",
            D::epoch_ms("created_at"),
            D::epoch_ms(D::NOW),
            b.bind(ms)
        ));
    }
    if let Some(text) = &filter.search {
        cond.push_str(&search_cond(b, text));
    }
    cond
}

/// ` AND (…)`: the job `text` names by id, or whose kind, status, payload or last error
/// contains `text` ignoring case (both sides lowered by the database, so that it lowers them
/// alike). The pattern is bound, its `LIKE` characters escaped with `!` (a backslash would
/// need writing differently per database).
fn search_cond<D: Dialect>(b: &mut Binder<D>, text: &str) -> String {
    let mut pattern = String::from("%");
    for c in text.chars() {
        if matches!(c, '%' | '_' | '!') {
            pattern.push('!');
        }
        pattern.push(c);
    }
    pattern.push('%');
    let payload = format!("CAST(payload AS {})", D::TEXT);
    // Bound in the order they stand in the text (`?` placeholders count by position).
    let mut any: Vec<String> = Vec::new();
    if let Ok(id) = text.trim().parse::<i64>() {
        any.push(format!("id = {}", b.bind(id)));
    }
    for col in ["kind", "status", &payload, "COALESCE(last_error, '')"] {
        any.push(format!(
            "LOWER({col}) LIKE LOWER({}) ESCAPE '!'",
            b.bind(pattern.clone())
        ));
    }
    format!(" AND ({})", any.join(" OR "))
}

/// Epoch milliseconds (as every store reads times) as a time; also before 1970.
pub(crate) fn at_ms(ms: i64) -> SystemTime {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

pub(crate) fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&format_rfc3339(*t))
}

pub(crate) fn rfc3339_opt<S: Serializer>(
    t: &Option<SystemTime>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match t {
        Some(t) => rfc3339(t, s),
        None => s.serialize_none(),
    }
}

/// `t` as RFC 3339 in UTC with milliseconds. Also before 1970 (a job may be given any run-at),
/// where humantime's formatter would panic.
pub(crate) fn format_rfc3339(t: SystemTime) -> String {
    let ms: i64 = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    };
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let secs = ms_of_day / 1000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        ms_of_day % 1000
    )
}

/// Days since 1970-01-01 as a proleptic Gregorian date (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(format_rfc3339(at_ms(0)), "1970-01-01T00:00:00.000Z");
        // 2026-11-23T10:00:00.123Z
        assert_eq!(
            format_rfc3339(at_ms(1_795_428_000_123)),
            "2026-11-23T10:00:00.123Z"
        );
        assert_eq!(
            format_rfc3339(at_ms(951_782_400_000)),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(format_rfc3339(at_ms(-1)), "1969-12-31T23:59:59.999Z");
        // The same instant humantime prints, where it can.
        let t = at_ms(1_700_000_000_007);
        assert_eq!(
            format_rfc3339(t),
            humantime::format_rfc3339_millis(t).to_string()
        );
    }

    #[test]
    fn an_unknown_status_is_refused_naming_the_states() {
        let err = JobFilter::new().status("bogus").check().unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("\"bogus\"") && said.contains("cancelled"),
            "{said}"
        );
        assert!(JobFilter::new().status("dead").check().is_ok());
    }
}
