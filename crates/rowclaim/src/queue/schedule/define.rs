//! A schedule as given ([`Schedule`], [`CatchUp`]) and as checked: how it ticks and the
//! definition its row holds, with the fingerprint that tells schedulers whether they run the
//! same one.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::store::Definition;
use super::timing::{self, Timing};
use crate::error::{Error, Result};
use crate::queue::NewJob;

/// What a scheduler does with ticks it missed (its database unreachable, no scheduler
/// running) once it runs again. A tick less than [`LATE_WINDOW`](super::LATE_WINDOW) (a
/// minute) late is not missed: it is enqueued whatever the policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum CatchUp {
    /// Enqueue the most recent missed tick once and skip the older ones (unless a later tick
    /// is due on time anyway). The default: most periodic jobs bring something up to date, so
    /// one run catches up, and a daily job is not left out until tomorrow.
    #[default]
    Latest,
    /// Enqueue every missed tick, oldest first, up to the [`MAX_CATCH_UP`](super::MAX_CATCH_UP)
    /// most recent.
    All,
    /// Enqueue none of the missed ticks: the next one is the next on time.
    None,
}

impl CatchUp {
    pub(super) fn as_str(self) -> &'static str {
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
    pub(super) name: String,
    when: When,
    zone: Option<String>,
    job: NewJob,
    pub(super) catch_up: CatchUp,
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
    /// expression ever matches. [`Scheduler::run`](crate::Scheduler::run) checks every
    /// schedule before it starts.
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
    pub(super) fn never_ticks(&self, expression: &str, e: timing::NoTick) -> Error {
        self.invalid(self.when_field(), expression, format!("never ticks: {e}"))
    }

    pub(super) fn invalid(
        &self,
        field: &'static str,
        value: &str,
        problem: impl Into<String>,
    ) -> Error {
        Error::InvalidSchedule {
            schedule: self.name.clone(),
            field,
            value: value.to_owned(),
            problem: problem.into(),
            source: None,
        }
    }

    /// Checks it, and says how it ticks and what its row holds.
    pub(super) fn compile(&self) -> Result<Compiled> {
        self.check_name()?;
        self.job
            .check()
            .map_err(|e| self.invalid("job", "", e.to_string()))?;
        if self.job.waits() {
            let why = "waits for other jobs (after): a tick's job cannot (it has a unique key)";
            return Err(self.invalid("job", "", why.to_owned()));
        }
        let (timing, expression, zone) = match &self.when {
            When::Every(every) => self.every_timing(*every)?,
            When::Cron(expr) => self.cron_timing(expr.trim())?,
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

    fn check_name(&self) -> Result<()> {
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
        Ok(())
    }

    /// An interval's timing, its expression as stored (`every 15m`), and no zone.
    fn every_timing(&self, every: Duration) -> Result<(Timing, String, Option<String>)> {
        if let Some(z) = &self.zone {
            return Err(self.invalid(
                "zone",
                z,
                "is for cron expressions; an interval counts from the Unix epoch",
            ));
        }
        let text = humantime::format_duration(every).to_string();
        let ms = i64::try_from(every.as_millis()).unwrap_or(i64::MAX);
        if ms < 1000 || ms % 1000 != 0 || ms > MAX_INTERVAL_MS {
            return Err(self.invalid("every", &text, "must be whole seconds, from 1s to 10 years"));
        }
        Ok((Timing::Every { ms }, format!("every {text}"), None))
    }

    /// A cron expression's timing in its zone, the expression, and the zone's name.
    fn cron_timing(&self, expr: &str) -> Result<(Timing, String, Option<String>)> {
        if expr.len() > 255 {
            return Err(self.invalid("cron", expr, "is longer than 255 characters"));
        }
        let cron: croner::Cron =
            expr.parse()
                .map_err(|e: croner::errors::CronError| Error::InvalidSchedule {
                    schedule: self.name.clone(),
                    field: "cron",
                    value: expr.to_owned(),
                    problem: format!("is not a cron expression: {e}"),
                    source: Some(Box::new(e)),
                })?;
        let zone_name = self.zone.clone().unwrap_or_else(|| "UTC".to_owned());
        let zone = jiff::tz::TimeZone::get(&zone_name).map_err(|e| Error::InvalidSchedule {
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
        Ok((timing, expr.to_owned(), Some(zone_name)))
    }

    /// The job of the tick at `tick` (epoch ms).
    pub(super) fn job_at(&self, tick: i64) -> NewJob {
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
pub(super) struct Compiled {
    pub(super) timing: Timing,
    pub(super) def: Owned,
}

/// A schedule's definition as its row holds it.
#[derive(Clone, Debug)]
pub(super) struct Owned {
    pub(super) name: String,
    queue: String,
    kind: String,
    expression: String,
    zone: Option<String>,
    catch_up: &'static str,
    fingerprint: String,
}

impl Owned {
    pub(super) fn borrow(&self) -> Definition<'_> {
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
        assert_eq!(err.kind(), crate::error::ErrorKind::BadInput);
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
