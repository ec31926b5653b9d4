//! Schedules: jobs of the managed queue enqueued on a cron expression (in a time zone) or every
//! fixed interval, by any number of schedulers at once, each tick exactly once.
//!
//! State lives in `rowclaim_schedules` (schema component `schedules`, made by
//! [`Queue::init`]): one row per schedule with its next tick. A scheduler that finds a tick due
//! (by the database's clock) advances the row with a compare-and-set `UPDATE … WHERE name = ?
//! AND next_tick = <what it read>` and enqueues the tick's job in the same transaction. Of
//! several schedulers racing for a tick, one update matches; the others match nothing and
//! enqueue nothing. Each tick's job also carries the unique key `schedule:<name>:<epoch secs>`
//! and runs at its tick.
//!
//! Each backend's SQL for this is in one file beside this one.

mod timing;

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize, Serializer};

use timing::Timing;
pub use timing::{LATE_WINDOW, MAX_CATCH_UP};

use super::{Enqueued, NewJob, Queue};
use crate::backend::{dispatch, retry_transient};
use crate::{Db, Error, Result};

/// What a scheduler does with ticks it missed (its database unreachable, no scheduler
/// running) once it runs again. A tick less than [`LATE_WINDOW`] (a minute) late is not
/// missed: it is enqueued whatever the policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum CatchUp {
    /// Enqueue the most recent missed tick once and skip the older ones (unless a later tick
    /// is due on time anyway). The default: most periodic jobs bring something up to date, so
    /// one run catches up, and a daily job is not left out until tomorrow.
    #[default]
    Latest,
    /// Enqueue every missed tick, oldest first, up to the [`MAX_CATCH_UP`] most recent.
    All,
    /// Enqueue none of the missed ticks: the next one is the next on time.
    None,
}

impl CatchUp {
    fn as_str(self) -> &'static str {
        match self {
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
            CatchUp::None => "none",
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CatchUp {
    type Err = Error;

    fn from_str(s: &str) -> Result<CatchUp> {
        match s {
            "latest" => Ok(CatchUp::Latest),
            "all" => Ok(CatchUp::All),
            "none" => Ok(CatchUp::None),
            other => Err(Error::InvalidInput(format!(
                "catch-up {other:?}: use latest, all or none"
            ))),
        }
    }
}

/// When a schedule ticks, as given.
#[derive(Clone, Debug, PartialEq)]
enum When {
    Cron(String),
    Every(Duration),
}

/// A job enqueued on a schedule: a cron expression read in a time zone, or a fixed interval.
///
/// ```
/// use rowclaim::{CatchUp, NewJob, Schedule};
/// use std::time::Duration;
/// // 03:00 every day, Paris time (also across daylight saving changes).
/// let nightly = Schedule::cron("nightly-report", "0 3 * * *")
///     .zone("Europe/Paris")
///     .job(NewJob::new(serde_json::json!({"report": "sales"})).queue("reports"))
///     .catch_up(CatchUp::Latest);
/// // Every 15 minutes: at :00, :15, :30 and :45 (intervals count from the Unix epoch).
/// let sync = Schedule::every("sync", Duration::from_secs(15 * 60));
/// assert!(nightly.check().is_ok() && sync.check().is_ok());
/// ```
///
/// Cron expressions have 5 fields (minute hour day-of-month month day-of-week), or 6 with
/// seconds first; names (`MON`, `JAN`), ranges, steps, lists, `L`, `W`, `#` and the nicknames
/// `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly` are understood. They are read in the
/// schedule's IANA time zone (UTC unless given): a time that a spring-forward change skips runs
/// once just after the gap; a fixed time that an autumn change repeats runs once, at its first
/// pass; `*` and step fields tick through both passes.
#[derive(Clone, Debug)]
pub struct Schedule {
    name: String,
    when: When,
    zone: Option<String>,
    job: NewJob,
    catch_up: CatchUp,
}

impl Schedule {
    /// A schedule named `name` (letters, digits, `-`, `_`, `.`; unique in the database) on a cron
    /// expression, read in UTC unless [`Schedule::zone`] says otherwise. Its job is an empty
    /// JSON object of kind `name` on queue `default` unless [`Schedule::job`] says otherwise.
    pub fn cron(name: impl Into<String>, expression: impl Into<String>) -> Schedule {
        Schedule::with(name.into(), When::Cron(expression.into()))
    }

    /// A schedule ticking every `interval` (whole seconds, at least one), counted from the Unix
    /// epoch: every 15 minutes is at :00, :15, :30 and :45 of every hour, every day at midnight
    /// UTC, whoever runs it and whenever it started.
    pub fn every(name: impl Into<String>, interval: Duration) -> Schedule {
        Schedule::with(name.into(), When::Every(interval))
    }

    fn with(name: String, when: When) -> Schedule {
        let job = NewJob::new(serde_json::json!({})).kind(name.clone());
        Schedule {
            name,
            when,
            zone: None,
            job,
            catch_up: CatchUp::default(),
        }
    }

    /// The IANA time zone the cron expression is read in, e.g. `Europe/Paris`. Default UTC.
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// The job each tick enqueues: its queue, kind, payload, priority, attempts and time limit.
    /// A job without a kind gets the schedule's name as its kind. Its delay, run-at and unique
    /// key are the schedule's: a tick's job runs at its tick, with the unique key
    /// `schedule:<name>:<tick in epoch seconds>`.
    pub fn job(mut self, job: NewJob) -> Self {
        self.job = if job.parts().kind.is_empty() {
            job.kind(self.name.clone())
        } else {
            job
        };
        self
    }

    /// What to do with missed ticks. Default [`CatchUp::Latest`].
    pub fn catch_up(mut self, policy: CatchUp) -> Self {
        self.catch_up = policy;
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue its jobs go to.
    pub fn queue_name(&self) -> &str {
        self.job.queue_name()
    }

    /// Checks the name, the expression or interval, the time zone and the job, and that the
    /// expression ever matches. [`Scheduler::run`] checks every schedule before it starts.
    pub fn check(&self) -> Result<()> {
        self.compile().map(|_| ())
    }

    /// The field that says when it runs: `cron` or `every`.
    fn when_field(&self) -> &'static str {
        if matches!(self.when, When::Cron(_)) {
            "cron"
        } else {
            "every"
        }
    }

    /// A schedule that never ticks again: named, with its expression.
    fn never_ticks(&self, expression: &str, e: timing::NoTick) -> Error {
        self.invalid(self.when_field(), expression, format!("never ticks: {e}"))
    }

    fn invalid(&self, field: &'static str, value: &str, problem: impl Into<String>) -> Error {
        Error::InvalidSchedule {
            schedule: self.name.clone(),
            field,
            value: value.to_owned(),
            problem: problem.into(),
            source: None,
        }
    }

    fn compile(&self) -> Result<Compiled> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_NAME
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !name_ok {
            return Err(self.invalid(
                "name",
                &self.name,
                format!("is not a schedule name: 1 to {MAX_NAME} letters, digits, '-', '_' or '.'"),
            ));
        }
        self.job
            .check()
            .map_err(|e| self.invalid("job", "", e.to_string()))?;
        let (timing, expression, zone) = match &self.when {
            When::Every(every) => {
                if let Some(z) = &self.zone {
                    return Err(self.invalid(
                        "zone",
                        z,
                        "is for cron expressions; an interval counts from the Unix epoch",
                    ));
                }
                let text = humantime::format_duration(*every).to_string();
                let ms = i64::try_from(every.as_millis()).unwrap_or(i64::MAX);
                if ms < 1000 || ms % 1000 != 0 || ms > MAX_INTERVAL_MS {
                    return Err(self.invalid(
                        "every",
                        &text,
                        "must be whole seconds, from 1s to 10 years",
                    ));
                }
                (Timing::Every { ms }, format!("every {text}"), None)
            }
            When::Cron(expr) => {
                let expr = expr.trim();
                if expr.len() > 255 {
                    return Err(self.invalid("cron", expr, "is longer than 255 characters"));
                }
                let cron: croner::Cron = expr.parse().map_err(|e: croner::errors::CronError| {
                    Error::InvalidSchedule {
                        schedule: self.name.clone(),
                        field: "cron",
                        value: expr.to_owned(),
                        problem: format!("is not a cron expression: {e}"),
                        source: Some(Box::new(e)),
                    }
                })?;
                let zone_name = self.zone.clone().unwrap_or_else(|| "UTC".to_owned());
                let zone =
                    jiff::tz::TimeZone::get(&zone_name).map_err(|e| Error::InvalidSchedule {
                        schedule: self.name.clone(),
                        field: "zone",
                        value: zone_name.clone(),
                        problem: format!("is not a known IANA time zone: {e}"),
                        source: Some(Box::new(e)),
                    })?;
                let timing = Timing::Cron {
                    cron: Box::new(cron),
                    zone,
                };
                (timing, expr.to_owned(), Some(zone_name))
            }
        };
        // An expression that never matches (30 February) would leave its row without a tick.
        let now_ms = i64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(0);
        if let Err(e) = timing.next_after(now_ms) {
            return Err(self.never_ticks(&expression, e));
        }
        let parts = self.job.parts();
        let fingerprint = fingerprint(&serde_json::json!({
            "expression": expression,
            "zone": zone,
            "catch_up": self.catch_up,
            "job": self.job,
        }));
        Ok(Compiled {
            timing,
            def: Owned {
                name: self.name.clone(),
                queue: parts.queue.to_owned(),
                kind: parts.kind.to_owned(),
                expression,
                zone,
                catch_up: self.catch_up.as_str(),
                fingerprint,
            },
        })
    }

    /// The job of the tick at `tick` (epoch ms).
    fn job_at(&self, tick: i64) -> NewJob {
        self.job
            .clone()
            .run_at(UNIX_EPOCH + Duration::from_millis(tick.max(0).unsigned_abs()))
            .unique_key(unique_key(&self.name, tick))
    }
}

/// The longest schedule name: room for it in the unique key of its jobs (255 characters).
const MAX_NAME: usize = 100;

/// Ten years: intervals longer than that are a mistake more likely than a plan.
const MAX_INTERVAL_MS: i64 = 10 * 366 * 86_400_000;

/// The unique key of a tick's job: `schedule:<name>:<tick in epoch seconds>`.
pub fn unique_key(name: &str, tick_ms: i64) -> String {
    format!("schedule:{name}:{}", tick_ms.div_euclid(1000))
}

/// A stable 64-bit FNV-1a hash of a definition, as hex: schedulers compare it to tell whether
/// they run the same definition of a schedule.
fn fingerprint(def: &serde_json::Value) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in def.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A checked schedule: how it ticks, and its definition as stored.
struct Compiled {
    timing: Timing,
    def: Owned,
}

/// A schedule's definition as its row holds it.
#[derive(Clone, Debug)]
struct Owned {
    name: String,
    queue: String,
    kind: String,
    expression: String,
    zone: Option<String>,
    catch_up: &'static str,
    fingerprint: String,
}

impl Owned {
    fn borrow(&self) -> Definition<'_> {
        Definition {
            name: &self.name,
            queue: &self.queue,
            kind: &self.kind,
            expression: &self.expression,
            zone: self.zone.as_deref(),
            catch_up: self.catch_up,
            fingerprint: &self.fingerprint,
        }
    }
}

/// A definition as the stores bind it.
pub(crate) struct Definition<'a> {
    pub name: &'a str,
    pub queue: &'a str,
    pub kind: &'a str,
    pub expression: &'a str,
    pub zone: Option<&'a str>,
    pub catch_up: &'a str,
    pub fingerprint: &'a str,
}

/// A row of `rowclaim_schedules`, times in epoch milliseconds: name, queue, kind, expression,
/// zone, catch-up, fingerprint, next tick, last tick, last job.
pub(crate) type Row = (
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    String,
    i64,
    Option<i64>,
    Option<i64>,
);

/// One tick's advance of a schedule: from the next tick a scheduler read to the one after now,
/// with the jobs of the ticks it enqueues (oldest first, each with its tick).
pub(crate) struct Firing<'a> {
    pub name: &'a str,
    pub fingerprint: &'a str,
    pub seen_next: i64,
    pub next: i64,
    pub jobs: Vec<(i64, NewJob)>,
}

/// The schedule store role: what each database implements (one file per database beside this
/// one).
pub(crate) trait ScheduleStore {
    /// Creates or migrates `rowclaim_schedules` (component `schedules` of `rowclaim_schema`).
    async fn init_schedules(&self) -> Result<()>;
    /// The database's now, in epoch milliseconds.
    async fn schedule_now(&self) -> Result<i64>;
    /// Every stored schedule, by name.
    async fn schedule_rows(&self) -> Result<Vec<Row>>;
    /// Stores a schedule unless one of its name is stored already.
    async fn insert_schedule(&self, def: &Definition<'_>, next_ms: i64) -> Result<()>;
    /// Replaces a stored schedule's definition, and its next tick when given.
    async fn redefine_schedule(&self, def: &Definition<'_>, next_ms: Option<i64>) -> Result<()>;
    /// In one transaction: advances the schedule from `seen_next` to `next` if it is still at
    /// `seen_next` with this fingerprint, and then enqueues the jobs. `None` when another
    /// scheduler advanced it first (nothing was enqueued).
    async fn fire(&self, f: &Firing<'_>) -> Result<Option<Vec<Enqueued>>>;
    /// Removes a stored schedule; returns whether there was one.
    async fn forget_schedule(&self, name: &str) -> Result<bool>;
}

/// Creates or migrates the schedules' table (after the jobs' own, by [`Queue::init`]).
pub(crate) async fn init(db: &Db) -> Result<()> {
    dispatch!(&db.backend, d => d.init_schedules().await)
}

/// A schedule as stored, from [`Queue::schedules`]. Serialised with its times as RFC 3339 in
/// UTC with milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ScheduleStatus {
    /// Its name.
    pub name: String,
    /// Its cron expression, or `every <interval>`.
    pub expression: String,
    /// The time zone of its cron expression (none for an interval).
    pub zone: Option<String>,
    /// The queue its jobs go to.
    pub queue: String,
    /// The kind of its jobs.
    pub kind: String,
    /// What it does with missed ticks.
    pub catch_up: CatchUp,
    /// Its latest tick that enqueued a job.
    #[serde(serialize_with = "rfc3339_opt")]
    pub last_tick: Option<SystemTime>,
    /// The job of that tick.
    pub last_job: Option<i64>,
    /// Its next tick.
    #[serde(serialize_with = "rfc3339")]
    pub next_tick: SystemTime,
    /// Whether its next tick is more than [`LATE_WINDOW`] past by the database's clock: no
    /// scheduler runs it (it was removed from every scheduler's schedules, or none is running).
    pub overdue: bool,
}

fn at_ms(ms: i64) -> SystemTime {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&super::record::format_rfc3339(*t))
}

fn rfc3339_opt<S: Serializer>(
    t: &Option<SystemTime>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match t {
        Some(t) => rfc3339(t, s),
        None => s.serialize_none(),
    }
}

impl Queue {
    /// The stored schedules, by name: what schedulers have registered, with their last and next
    /// ticks.
    pub async fn schedules(&self) -> Result<Vec<ScheduleStatus>> {
        let (now, rows) = retry_transient!(dispatch!(&self.db.backend, d => async {
                Ok::<_, Error>((d.schedule_now().await?, d.schedule_rows().await?))
            }.await))
        .map_err(not_initialised)?;
        let late = i64::try_from(LATE_WINDOW.as_millis()).unwrap_or(i64::MAX);
        Ok(rows
            .into_iter()
            .map(|r| ScheduleStatus {
                name: r.0,
                queue: r.1,
                kind: r.2,
                expression: r.3,
                zone: r.4,
                catch_up: r.5.parse().unwrap_or_default(),
                next_tick: at_ms(r.7),
                last_tick: r.8.map(at_ms),
                last_job: r.9,
                overdue: now - r.7 > late,
            })
            .collect())
    }

    /// Removes a stored schedule (one that no scheduler runs any more; a scheduler that still
    /// has it stores it again). Returns whether there was one.
    pub async fn forget_schedule(&self, name: &str) -> Result<bool> {
        retry_transient!(dispatch!(&self.db.backend, d => d.forget_schedule(name).await))
            .map_err(not_initialised)
    }
}

/// Says to run `init` when the schedules' table is missing ([`Error::NotInitialised`]).
fn not_initialised(e: Error) -> Error {
    super::not_set_up(e, "the schedules")
}

/// Runs schedules: enqueues each due tick's job into the managed queue, exactly once however
/// many schedulers run the same schedules (in this process or in others, on other machines).
///
/// ```no_run
/// # async fn demo(db: rowclaim::Db) -> rowclaim::Result<()> {
/// use rowclaim::{Schedule, Scheduler};
/// let report = Scheduler::new(&db)
///     .schedule(Schedule::cron("nightly", "0 3 * * *").zone("Europe/Paris"))
///     .run(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// println!("{} jobs enqueued", report.enqueued);
/// # Ok(()) }
/// ```
///
/// Beside a [`crate::Worker`], give the schedules to the worker instead
/// ([`crate::Worker::schedule`]): they run while it runs and stop when it stops.
///
/// - **Time** is the database's: a machine whose clock is off neither fires early nor late.
/// - **Registration**: at start each schedule is stored in `rowclaim_schedules` (made by
///   [`Queue::init`]) if it is not there yet, its first tick the first one after now. A stored
///   schedule of the same name with another definition is replaced (the scheduler started last
///   wins; its next tick is computed anew when the expression, zone or interval changed), and
///   schedulers still running the old definition leave it alone, saying so once.
/// - **Removed schedules** stop: only schedules some running scheduler has are enqueued. The
///   row stays, shown as overdue by [`Queue::schedules`], until [`Queue::forget_schedule`].
/// - **Outages** are waited out: passes are retried with backoff (100 ms growing to 5 s), said
///   once when the database goes away and once when it answers again; ticks due meanwhile are
///   then late or missed ([`CatchUp`]).
#[derive(Clone, Debug)]
pub struct Scheduler {
    db: Db,
    schedules: Vec<Schedule>,
}

/// What a scheduler did, from [`Scheduler::run`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerReport {
    /// Jobs it enqueued (ticks whose advance it won).
    pub enqueued: u64,
    /// Missed ticks its catch-up policies skipped.
    pub skipped: u64,
    /// How many times the database stopped answering for a while.
    pub outages: u64,
}

impl Scheduler {
    /// A scheduler of `db`'s managed queue, with no schedules yet.
    pub fn new(db: &Db) -> Scheduler {
        Scheduler {
            db: db.clone(),
            schedules: Vec::new(),
        }
    }

    /// Adds a schedule.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Whether it has no schedules.
    pub fn is_empty(&self) -> bool {
        self.schedules.is_empty()
    }

    /// Checks and registers the schedules, then enqueues their ticks until `shutdown` completes
    /// (a ready future: register only). Returns an error only when it cannot start: a bad
    /// schedule, two of one name, the queue not initialised, the database unreachable at start.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<SchedulerReport> {
        let running = self.start().await?;
        Ok(running.run(shutdown).await)
    }

    /// Checks and registers the schedules.
    pub(crate) async fn start(self) -> Result<Running> {
        let mut seen = BTreeSet::new();
        let mut items = Vec::with_capacity(self.schedules.len());
        for s in self.schedules {
            let compiled = s.compile()?;
            if !seen.insert(s.name.clone()) {
                return Err(s.invalid("name", &s.name, "is given to two schedules"));
            }
            items.push(Item {
                schedule: s,
                compiled,
                warned: false,
                failing: None,
            });
        }
        let mut running = Running {
            db: self.db,
            items,
            report: SchedulerReport::default(),
        };
        if !running.items.is_empty() {
            running.register().await.map_err(not_initialised)?;
        }
        Ok(running)
    }
}

/// One schedule of a running scheduler.
struct Item {
    schedule: Schedule,
    compiled: Compiled,
    /// Whether it was said that another definition of it is stored.
    warned: bool,
    /// What went wrong with it last (said once), while it goes wrong.
    failing: Option<String>,
}

/// A scheduler whose schedules are checked and registered.
pub(crate) struct Running {
    db: Db,
    items: Vec<Item>,
    report: SchedulerReport,
}

/// The longest wait between two looks at the stored schedules.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// The shortest: a tick the database's clock has not quite reached is looked at again soon.
const MIN_WAIT: Duration = Duration::from_millis(20);

impl Running {
    /// Stores each schedule that is not stored yet, and replaces stored definitions that differ.
    async fn register(&mut self) -> Result<()> {
        let backend = &self.db.backend;
        let now = retry_transient!(dispatch!(backend, d => d.schedule_now().await))?;
        let rows = retry_transient!(dispatch!(backend, d => d.schedule_rows().await))?;
        let stored: BTreeMap<&str, &Row> = rows.iter().map(|r| (r.0.as_str(), r)).collect();
        for item in &self.items {
            let def = item.compiled.def.borrow();
            let first = item
                .compiled
                .timing
                .next_after(now)
                .map_err(|e| item.schedule.never_ticks(def.expression, e))?;
            match stored.get(def.name) {
                None => {
                    retry_transient!(
                        dispatch!(backend, d => d.insert_schedule(&def, first).await)
                    )?;
                }
                Some(row) if row.6 == def.fingerprint => {}
                Some(row) => {
                    let retimed = row.3 != def.expression || row.4.as_deref() != def.zone;
                    let next = retimed.then_some(first);
                    retry_transient!(
                        dispatch!(backend, d => d.redefine_schedule(&def, next).await)
                    )?;
                    tracing::info!(
                        schedule = def.name,
                        "schedule {} was stored with another definition: replaced by this one{}",
                        def.name,
                        if retimed {
                            ", its next tick computed anew"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        Ok(())
    }

    /// Enqueues due ticks until `stop` completes.
    pub(crate) async fn run(mut self, stop: impl Future<Output = ()>) -> SchedulerReport {
        if self.items.is_empty() {
            return self.report;
        }
        tokio::pin!(stop);
        let mut failures: u32 = 0;
        let mut outage: Option<tokio::time::Instant> = None;
        let mut refused: Option<String> = None;
        loop {
            let pass = tokio::select! {
                biased;
                () = &mut stop => break,
                pass = self.pass() => pass,
            };
            let wait = match pass {
                Ok(wait) => {
                    if let Some(since) = outage.take() {
                        tracing::warn!(
                            "the scheduler's database ({}) answers again after {:.1}s",
                            self.db.endpoint(),
                            since.elapsed().as_secs_f64()
                        );
                    }
                    failures = 0;
                    refused = None;
                    wait
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    if e.is_connection() {
                        if outage.is_none() {
                            outage = Some(tokio::time::Instant::now());
                            self.report.outages += 1;
                            tracing::warn!(
                                "the scheduler lost the database ({}): {e}; ticks due meanwhile \
                                 are enqueued once it answers (late, or missed after {})",
                                self.db.endpoint(),
                                humantime::format_duration(LATE_WINDOW)
                            );
                        } else {
                            tracing::debug!("scheduling: {e} (database still unreachable)");
                        }
                    } else {
                        let text = e.to_string();
                        if refused.as_deref() == Some(text.as_str()) {
                            tracing::debug!("scheduling: {text} (again; retrying)");
                        } else {
                            tracing::warn!("scheduling failed: {text}; retrying");
                            refused = Some(text);
                        }
                    }
                    crate::wait::pause(failures - 1)
                }
            };
            tokio::select! {
                biased;
                () = &mut stop => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        self.report
    }

    /// One look at the stored schedules: enqueues the due ticks of this scheduler's schedules.
    /// Returns how long to wait before the next look. A lost connection ends the pass (an
    /// outage); anything else wrong with one schedule (a job the database refuses, an
    /// expression with no tick left) is said and that schedule tried again later, so that it
    /// does not hold up the others.
    async fn pass(&mut self) -> Result<Duration> {
        let Running { db, items, report } = self;
        let backend = &db.backend;
        let now = retry_transient!(dispatch!(backend, d => d.schedule_now().await))?;
        let rows = retry_transient!(dispatch!(backend, d => d.schedule_rows().await))?;
        let stored: BTreeMap<&str, &Row> = rows.iter().map(|r| (r.0.as_str(), r)).collect();
        let mut wake = now.saturating_add(millis(MAX_WAIT));
        for item in items.iter_mut() {
            let row = stored.get(item.compiled.def.name.as_str()).copied();
            match item.tick(backend, row, now, report).await {
                Ok(next) => {
                    if item.failing.take().is_some() {
                        tracing::warn!(
                            schedule = item.schedule.name,
                            "schedule {} is enqueued again",
                            item.schedule.name
                        );
                    }
                    wake = wake.min(next.unwrap_or(wake));
                }
                Err(e) if e.is_connection() => return Err(e),
                Err(e) => {
                    let text = e.to_string();
                    if item.failing.as_deref() != Some(text.as_str()) {
                        tracing::warn!(
                            schedule = item.schedule.name,
                            "schedule {}: {text}; trying again in {}",
                            item.schedule.name,
                            humantime::format_duration(ITEM_RETRY)
                        );
                        item.failing = Some(text);
                    }
                    wake = wake.min(now.saturating_add(millis(ITEM_RETRY)));
                }
            }
        }
        let ms = u64::try_from(wake.saturating_sub(now)).unwrap_or(0);
        Ok(Duration::from_millis(ms).clamp(MIN_WAIT, MAX_WAIT))
    }
}

/// How soon a schedule whose tick failed (other than by a lost connection) is tried again.
const ITEM_RETRY: Duration = Duration::from_secs(5);

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Item {
    /// Enqueues this schedule's due ticks, as stored in `row` (None: not stored). Returns when
    /// it ticks next (None: it is not this scheduler's to tick).
    async fn tick(
        &mut self,
        backend: &crate::backend::Backend,
        row: Option<&Row>,
        now: i64,
        report: &mut SchedulerReport,
    ) -> Result<Option<i64>> {
        let def = self.compiled.def.borrow();
        let no_tick = |e: timing::NoTick| self.schedule.never_ticks(def.expression, e);
        let Some(row) = row else {
            // Forgotten, or the table was made anew: store it again.
            let first = self.compiled.timing.next_after(now).map_err(no_tick)?;
            retry_transient!(dispatch!(backend, d => d.insert_schedule(&def, first).await))?;
            return Ok(Some(first));
        };
        if row.6 != def.fingerprint {
            if !self.warned {
                self.warned = true;
                tracing::warn!(
                    schedule = def.name,
                    "schedule {} is stored with another definition (a scheduler started later \
                     has it so); this scheduler leaves it to the schedulers that have that one",
                    def.name
                );
            }
            return Ok(None);
        }
        self.warned = false;
        let seen_next = row.7;
        if seen_next > now {
            return Ok(Some(seen_next));
        }
        let due = self
            .compiled
            .timing
            .due(seen_next, now, self.schedule.catch_up)
            .map_err(no_tick)?;
        let firing = Firing {
            name: def.name,
            fingerprint: def.fingerprint,
            seen_next,
            next: due.next,
            jobs: due
                .ticks
                .iter()
                .map(|t| (*t, self.schedule.job_at(*t)))
                .collect(),
        };
        // None: another scheduler advanced it first, and enqueued the tick.
        if let Some(enqueued) = retry_transient!(dispatch!(backend, d => d.fire(&firing).await))? {
            let new = enqueued.iter().filter(|e| !e.existing).count() as u64;
            report.enqueued += new;
            report.skipped += due.skipped;
            if due.skipped > 0 {
                tracing::info!(
                    schedule = def.name,
                    "schedule {}: {} missed tick(s) skipped (catch-up {}), {new} enqueued",
                    def.name,
                    due.skipped,
                    self.schedule.catch_up
                );
            } else {
                tracing::debug!(schedule = def.name, "schedule {}: {new} enqueued", def.name);
            }
        }
        Ok(Some(due.next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_schedules_are_named_with_their_field() {
        let said = |s: Schedule| s.check().unwrap_err().to_string();
        let e = said(Schedule::cron("nightly", "61 * * * *"));
        assert!(
            e.starts_with("schedule nightly: cron \"61 * * * *\" is not a cron expression"),
            "{e}"
        );
        let e = said(Schedule::cron("nightly", "0 3 * * *").zone("Europe/Pariss"));
        assert!(
            e.starts_with("schedule nightly: zone \"Europe/Pariss\" is not a known IANA time zone"),
            "{e}"
        );
        let e = said(Schedule::every("sync", Duration::from_millis(1500)));
        assert!(
            e.contains("every \"1s 500ms\" must be whole seconds"),
            "{e}"
        );
        let e = said(Schedule::every("sync", Duration::from_secs(60)).zone("UTC"));
        assert!(e.contains("zone \"UTC\" is for cron expressions"), "{e}");
        let e = said(Schedule::cron("no good", "* * * * *"));
        assert!(e.contains("name \"no good\" is not a schedule name"), "{e}");
        let e = said(Schedule::cron("feb30", "0 0 30 2 *"));
        assert!(e.contains("never ticks"), "{e}");
        let e = said(
            Schedule::cron("q", "* * * * *").job(NewJob::new(serde_json::json!({})).queue("")),
        );
        assert!(e.contains("queue name"), "{e}");
        let err = Schedule::cron("z", "* * * * *")
            .zone("Nowhere/Land")
            .check()
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::BadInput);
        assert!(
            std::error::Error::source(&err).is_some(),
            "the zone's error is kept"
        );
    }

    #[test]
    fn definitions_have_stable_fingerprints() {
        let a = Schedule::cron("n", "0 3 * * *")
            .zone("Europe/Paris")
            .compile()
            .unwrap();
        let b = Schedule::cron("n", "0 3 * * *")
            .zone("Europe/Paris")
            .compile()
            .unwrap();
        let c = Schedule::cron("n", "0 4 * * *")
            .zone("Europe/Paris")
            .compile()
            .unwrap();
        assert_eq!(a.def.fingerprint, b.def.fingerprint);
        assert_ne!(a.def.fingerprint, c.def.fingerprint);
        assert_eq!(a.def.kind, "n", "the kind defaults to the name");
        assert_eq!(
            Schedule::every("s", Duration::from_secs(900))
                .compile()
                .unwrap()
                .def
                .expression,
            "every 15m"
        );
    }

    #[test]
    fn tick_jobs_run_at_their_tick_with_a_unique_key() {
        let s = Schedule::every("sync", Duration::from_secs(60));
        let parts_of = s.job_at(1_767_225_600_000);
        let p = parts_of.parts();
        assert_eq!(p.unique_key, Some("schedule:sync:1767225600"));
        assert_eq!(p.run_at_ms, Some(1_767_225_600_000));
        assert_eq!("all".parse::<CatchUp>().unwrap(), CatchUp::All);
        assert!("some".parse::<CatchUp>().is_err());
    }
}
