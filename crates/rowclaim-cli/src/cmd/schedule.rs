//! `rowclaim schedule`: schedules of the managed queue. They are written as `[schedule.NAME]`
//! tables in `rowclaim.toml` (read here, for `work --queue` and `schedule run`) and stored in the
//! database by the schedulers that run them (`schedule list` shows those, `schedule forget`
//! removes one no scheduler runs any more).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use rowclaim::{CatchUp, Db, NewJob, Schedule, ScheduleStatus, Scheduler};
use serde::Deserialize;

use crate::error::CliError;
use crate::say::say;
use crate::signals::StopSignals;

#[derive(Subcommand, Debug)]
pub enum ScheduleCommand {
    /// Show the schedules stored in the database (those some scheduler registered): name,
    /// expression, zone, queue, kind, catch-up, last tick (and its job), next tick. A schedule
    /// whose next tick is more than a minute past is marked overdue: no scheduler runs it.
    List(ListArgs),
    /// Run the schedules of the config file, without a worker, until SIGINT or SIGTERM: enqueue
    /// each tick's job once, however many schedulers (this command, `work --queue`) run them.
    Run(RunArgs),
    /// Remove a stored schedule that no scheduler runs any more (a running scheduler that still
    /// has it stores it again). Exits 1 when there was none.
    Forget(ForgetArgs),
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// One JSON object per schedule, one per line, instead of text (times in RFC 3339, UTC).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Run only the schedules whose jobs go to queue Q (repeat for several). Default: all.
    #[arg(long = "queue", value_name = "Q")]
    queues: Vec<String>,
    /// The config file with the [schedule.NAME] tables.
    #[arg(long, value_name = "PATH", default_value = "rowclaim.toml")]
    config: PathBuf,
    /// At the end, also print the summary as one JSON object on stdout:
    /// {"enqueued":…,"skipped":…,"outages":…}.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ForgetArgs {
    /// The schedule's name.
    #[arg(value_name = "NAME")]
    name: String,
}

pub async fn run(url: &str, cmd: ScheduleCommand) -> Result<(), CliError> {
    match cmd {
        ScheduleCommand::List(a) => {
            let db = Db::connect(url).await?;
            list(&db.queue().schedules().await?, a.json)
        }
        ScheduleCommand::Run(a) => {
            let schedules = from_config(&a.config, &a.queues, true)?;
            if schedules.is_empty() {
                let which = if a.queues.is_empty() {
                    String::new()
                } else {
                    format!(" for queue {}", a.queues.join(", "))
                };
                return Err(CliError::BadInput(format!(
                    "{} has no [schedule.NAME]{which}: nothing to run",
                    a.config.display()
                )));
            }
            let db = Db::connect(url).await?;
            say!("{}", running(&schedules, &a.config));
            let mut scheduler = Scheduler::new(&db);
            for s in schedules {
                scheduler = scheduler.schedule(s);
            }
            let mut signals = StopSignals::listen()?;
            let report = scheduler
                .run(async move {
                    signals.first().await;
                    say!("stopping the scheduler");
                })
                .await?;
            if a.json {
                super::print_json_line(&serde_json::json!({
                    "enqueued": report.enqueued,
                    "skipped": report.skipped,
                    "outages": report.outages,
                }))?;
            }
            say!(
                "scheduler stopped: {} job(s) enqueued, {} missed tick(s) skipped",
                report.enqueued,
                report.skipped
            );
            Ok(())
        }
        ScheduleCommand::Forget(a) => {
            let db = Db::connect(url).await?;
            if db.queue().forget_schedule(&a.name).await? {
                say!("forgot schedule {}", a.name);
                Ok(())
            } else {
                Err(CliError::NothingClaimed(format!("no schedule {}", a.name)))
            }
        }
    }
}

/// What a scheduler says when it starts: how many schedules, from where.
pub fn running(schedules: &[Schedule], config: &Path) -> String {
    let names: Vec<&str> = schedules.iter().map(Schedule::name).collect();
    format!(
        "running {} schedule(s) of {}: {}",
        names.len(),
        config.display(),
        names.join(", ")
    )
}

fn list(schedules: &[ScheduleStatus], json: bool) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    let mut line =
        |text: String| writeln!(out, "{text}").map_err(CliError::io("writing to stdout"));
    if json {
        for s in schedules {
            let text = serde_json::to_string(s)
                .map_err(|e| CliError::io("writing the schedule")(e.into()))?;
            line(text)?;
        }
        return Ok(());
    }
    if schedules.is_empty() {
        say!("no schedules are stored here (a scheduler stores its schedules when it starts)");
        return Ok(());
    }
    let rows: Vec<[String; 8]> = schedules
        .iter()
        .map(|s| {
            let last = match (s.last_tick, s.last_job) {
                (Some(t), Some(job)) => format!("{} (job {job})", at(t)),
                (Some(t), None) => at(t),
                (None, _) => "-".into(),
            };
            let next = if s.overdue {
                format!("{} (overdue: no scheduler runs it)", at(s.next_tick))
            } else {
                at(s.next_tick)
            };
            [
                s.name.clone(),
                s.expression.clone(),
                s.zone.clone().unwrap_or_else(|| "-".into()),
                s.queue.clone(),
                s.kind.clone(),
                s.catch_up.to_string(),
                last,
                next,
            ]
        })
        .collect();
    let head = [
        "name",
        "expression",
        "zone",
        "queue",
        "kind",
        "catch-up",
        "last tick",
        "next tick",
    ];
    let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let join = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    line(join(head.to_vec()))?;
    for r in &rows {
        line(join(r.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

/// A time as RFC 3339 in UTC, to the second (ticks are whole seconds).
fn at(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// One `[schedule.NAME]` table of the config file.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ScheduleConfig {
    /// A cron expression (5 fields, or 6 with seconds first), read in `zone`.
    cron: Option<String>,
    /// Or an interval, e.g. "15m", counted from the Unix epoch.
    every: Option<String>,
    /// The IANA time zone of `cron` (default UTC).
    zone: Option<String>,
    /// The queue of its jobs (default "default").
    queue: Option<String>,
    /// The kind of its jobs (default: the schedule's name).
    kind: Option<String>,
    /// The payload of its jobs (default {}).
    payload: Option<toml::Value>,
    priority: Option<i32>,
    max_attempts: Option<i32>,
    /// A time limit per run, e.g. "5m".
    timeout: Option<String>,
    /// latest (default), all or none.
    catch_up: Option<String>,
}

/// The schedules of the config file at `path` whose queue is one of `queues` (all when empty),
/// checked: a bad one is refused naming the file, the schedule and the field. A missing file is
/// an error when `required`, else no schedules.
pub fn from_config(
    path: &Path,
    queues: &[String],
    required: bool,
) -> Result<Vec<Schedule>, CliError> {
    let shown = path.display();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(CliError::BadInput(format!("cannot read {shown}: {e}"))),
    };
    let mut file: toml::Table = toml::from_str(&text)
        .map_err(|e| CliError::BadInput(format!("{shown} is not a valid rowclaim config: {e}")))?;
    // A misspelt table would otherwise be a schedule that silently never runs.
    if let Some(other) = file.keys().find(|k| *k != "source" && *k != "schedule") {
        return Err(CliError::BadInput(format!(
            "{shown}: unknown table [{other}] (a rowclaim config has [source.NAME] and \
             [schedule.NAME] tables)"
        )));
    }
    let tables: BTreeMap<String, toml::Value> = match file.remove("schedule") {
        None => BTreeMap::new(),
        Some(toml::Value::Table(t)) => t.into_iter().collect(),
        Some(_) => {
            return Err(CliError::BadInput(format!(
                "{shown}: schedule must be tables, [schedule.NAME]"
            )))
        }
    };
    let mut out = Vec::new();
    for (name, table) in tables {
        let bad =
            |detail: String| CliError::BadInput(format!("{shown}: [schedule.{name}] {detail}"));
        let config: ScheduleConfig = table
            .try_into()
            .map_err(|e: toml::de::Error| bad(e.message().trim().to_owned()))?;
        let schedule = build(&name, config).map_err(bad)?;
        if let Err(e) = schedule.check() {
            // The library says "schedule NAME: …"; the table names it here.
            let said = e.to_string();
            let prefix = format!("schedule {name}: ");
            return Err(bad(said.strip_prefix(&prefix).unwrap_or(&said).to_owned()));
        }
        if queues.is_empty() || queues.iter().any(|q| q == schedule.queue_name()) {
            out.push(schedule);
        }
    }
    Ok(out)
}

/// A schedule from its table; `Err` says what is wrong, in the table's words.
fn build(name: &str, c: ScheduleConfig) -> Result<Schedule, String> {
    let mut s = match (c.cron, c.every) {
        (Some(cron), None) => Schedule::cron(name, cron),
        (None, Some(every)) => {
            let d = super::values::duration(&every).map_err(|e| {
                format!(
                    "every {every:?}: {e}; write every = \"15m\" (a positive duration: 30s, 5m, \
                     1h 30m)"
                )
            })?;
            Schedule::every(name, d)
        }
        (Some(_), Some(_)) => return Err("has both cron and every: give one".into()),
        (None, None) => return Err("needs cron = \"…\" or every = \"…\"".into()),
    };
    if let Some(zone) = c.zone {
        s = s.zone(zone);
    }
    let payload = match c.payload {
        Some(p) => serde_json::to_value(p).map_err(|e| format!("payload: {e}"))?,
        None => serde_json::json!({}),
    };
    let mut job = NewJob::new(payload)
        .queue(c.queue.unwrap_or_else(|| "default".into()))
        .kind(c.kind.unwrap_or_else(|| name.to_owned()))
        .priority(c.priority.unwrap_or(0));
    if let Some(n) = c.max_attempts {
        job = job.max_attempts(n);
    }
    if let Some(t) = c.timeout {
        let d: Duration =
            humantime::parse_duration(&t).map_err(|e| format!("timeout {t:?}: {e}"))?;
        job = job.timeout(d);
    }
    s = s.job(job);
    if let Some(policy) = c.catch_up {
        let p: CatchUp = policy.parse().map_err(|e: rowclaim::Error| e.to_string())?;
        s = s.catch_up(p);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Vec<Schedule>, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rowclaim.toml");
        std::fs::write(&path, text).unwrap();
        from_config(&path, &[], true).map_err(|e| {
            let said = e.explain();
            said.split_once("rowclaim.toml: ")
                .map(|(_, rest)| rest.to_owned())
                .unwrap_or(said)
        })
    }

    #[test]
    fn bad_schedules_name_the_table_and_the_field() {
        let cases = [
            (
                "[schedule.a]\ncron = \"61 * * * *\"",
                "[schedule.a] cron \"61 * * * *\" is not a cron expression",
            ),
            (
                "[schedule.a]\ncron = \"0 3 * * *\"\nzone = \"Europe/Pariss\"",
                "[schedule.a] zone \"Europe/Pariss\" is not a known IANA time zone",
            ),
            (
                "[schedule.a]\nevery = \"15 minuets\"",
                "[schedule.a] every \"15 minuets\": ",
            ),
            (
                "[schedule.a]\nevery = \"1500ms\"",
                "[schedule.a] every \"1s 500ms\" must be whole seconds",
            ),
            (
                "[schedule.a]\ncron = \"* * * * *\"\nevery = \"1m\"",
                "[schedule.a] has both cron and every",
            ),
            ("[schedule.a]\nqueue = \"q\"", "[schedule.a] needs cron"),
            (
                "[schedule.a]\ncrom = \"* * * * *\"",
                "[schedule.a] unknown field `crom`",
            ),
            (
                "[schedule.a]\ncron = \"* * * * *\"\ncatch-up = \"some\"",
                "[schedule.a] catch-up \"some\": use latest, all or none",
            ),
            (
                "[schedule.a]\ncron = \"* * * * *\"\nmax-attempts = 0",
                "[schedule.a] job: max attempts must be at least 1",
            ),
            (
                "[schedule.\"no good\"]\ncron = \"* * * * *\"",
                "name \"no good\" is not a schedule name",
            ),
            (
                "[schedules.a]\ncron = \"* * * * *\"",
                "unknown table [schedules]",
            ),
        ];
        for (text, want) in cases {
            let got = load(text).map(|_| ()).unwrap_err();
            assert!(got.contains(want), "{text}\n  said: {got}\n  want: {want}");
        }
    }

    #[test]
    fn good_schedules_are_read_with_their_defaults() {
        let got = load(
            "[source.mail]\ntable = \"emails\"\n\n\
             [schedule.nightly]\ncron = \"0 3 * * *\"\nzone = \"Europe/Paris\"\nqueue = \"reports\"\n\
             payload = { report = \"sales\", days = 1 }\ncatch-up = \"all\"\n\n\
             [schedule.sync]\nevery = \"15m\"\n",
        )
        .unwrap();
        let names: Vec<(&str, &str)> = got.iter().map(|s| (s.name(), s.queue_name())).collect();
        assert_eq!(names, [("nightly", "reports"), ("sync", "default")]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.toml");
        assert!(from_config(&path, &[], false).unwrap().is_empty());
        assert!(from_config(&path, &[], true).is_err());
    }
}
