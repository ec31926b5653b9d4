//! `rowclaim queue`: one queue of the managed queue as a whole: pause it, resume it, limit it,
//! and list the queues with their counts, whether they are paused and their limits.

use clap::{Args, Subcommand};
use rowclaim::Db;

use crate::error::CliError;
use crate::say::say;

#[derive(Subcommand, Debug)]
pub enum QueueCommand {
    /// Pause queue Q: from now on no worker claims a job of it, jobs a worker claimed ahead go
    /// back at its next heartbeat (a third of its lease), and running jobs finish. Jobs can
    /// still be enqueued. A queue with no jobs yet may be paused ahead (said). Nothing changes
    /// when it is paused already (said, exit 1).
    Pause(NameArgs),
    /// Let workers claim jobs of queue Q again (listening workers wake at once). Nothing
    /// changes when it is not paused (said, exit 1).
    Resume(NameArgs),
    /// Set queue Q's limits, enforced in the database across every worker on every machine:
    /// how many of its jobs run at once, how many with one limit key (`enqueue --limit-key`)
    /// run at once (1: one after another, in enqueue order), and how many start per period.
    /// Replaces the queue's limits: a limit not given is lifted (--none lifts them all).
    /// Workers move to the new limits within a second; running jobs count towards them.
    Limit(LimitArgs),
    /// The queues, each with its jobs per state, whether it is paused and its limits (a
    /// paused or limited queue without jobs is listed too).
    List(ListArgs),
}

#[derive(Args, Debug)]
pub struct LimitArgs {
    /// The queue.
    #[arg(value_name = "Q")]
    queue: String,
    /// At most N of the queue's jobs run at once.
    #[arg(long, value_name = "N", value_parser = super::values::count, allow_hyphen_values = true)]
    concurrency: Option<u32>,
    /// At most N jobs with one limit key run at once, in enqueue order (1: one after another).
    #[arg(long, value_name = "N", value_parser = super::values::count, allow_hyphen_values = true)]
    key_concurrency: Option<u32>,
    /// At most JOBS of the queue's jobs start per PERIOD, e.g. 100/1m, 5/s.
    #[arg(long, value_name = "JOBS/PERIOD", value_parser = super::values::rate, allow_hyphen_values = true)]
    rate: Option<rowclaim::Rate>,
    /// At most JOBS jobs with one limit key start per PERIOD, e.g. 1/s.
    #[arg(long, value_name = "JOBS/PERIOD", value_parser = super::values::rate, allow_hyphen_values = true)]
    key_rate: Option<rowclaim::Rate>,
    /// Lift every limit of the queue.
    #[arg(long, conflicts_with_all = ["concurrency", "key_concurrency", "rate", "key_rate"])]
    none: bool,
    /// Say what was set as one JSON object: {"queue", "limits"}.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    /// The queue.
    #[arg(value_name = "Q")]
    queue: String,
    /// Say what happened as one JSON object: {"queue", "paused", "changed", "has_jobs"}.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// One JSON object per queue and line instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn run(url: &str, cmd: QueueCommand) -> Result<(), CliError> {
    let db = Db::connect(url).await?;
    let queue = db.queue();
    let (a, pause) = match cmd {
        QueueCommand::Pause(a) => (a, true),
        QueueCommand::Resume(a) => (a, false),
        QueueCommand::List(a) => return list(&db, a.json).await,
        QueueCommand::Limit(a) => return limit(&db, a).await,
    };
    let changed = if pause {
        queue.pause(&a.queue).await?
    } else {
        queue.resume(&a.queue).await?
    };
    // A name nobody has used (a typo, say) is worth a word: pausing it ahead is allowed.
    let has_jobs = !queue
        .list(
            &rowclaim::JobFilter::new()
                .queues(vec![a.queue.clone()])
                .limit(1),
        )
        .await?
        .is_empty();
    if a.json {
        super::print_json_line(&serde_json::json!({
            "queue": a.queue,
            "paused": pause,
            "changed": changed,
            "has_jobs": has_jobs,
        }))?;
        if changed {
            return Ok(());
        }
    }
    let q = &a.queue;
    let no_jobs = if has_jobs {
        ""
    } else {
        " (no queue of that name has jobs: check the name)"
    };
    match (pause, changed) {
        (true, true) if has_jobs => {
            say!("paused queue {q}: workers start none of its jobs until resumed")
        }
        (true, true) => say!(
            "no queue named {q} has jobs; paused it anyway, so jobs enqueued to it later wait \
             until `rowclaim queue resume {q}`"
        ),
        (false, true) => say!("resumed queue {q}"),
        // Exit 1, as for `jobs retry` of a job that was not dead: nothing was changed.
        (true, false) => {
            return Err(CliError::NothingClaimed(format!(
                "queue {q} was paused already{no_jobs}"
            )))
        }
        (false, false) => {
            return Err(CliError::NothingClaimed(format!(
                "queue {q} was not paused{no_jobs}"
            )))
        }
    }
    Ok(())
}

async fn limit(db: &Db, a: LimitArgs) -> Result<(), CliError> {
    let mut limits = rowclaim::QueueLimits::default();
    limits.concurrency = a.concurrency;
    limits.key_concurrency = a.key_concurrency;
    limits.rate = a.rate;
    limits.key_rate = a.key_rate;
    if limits.is_none() && !a.none {
        return Err(CliError::BadInput(
            "give a limit (--concurrency, --key-concurrency, --rate, --key-rate), or --none to \
             lift them all"
                .into(),
        ));
    }
    db.queue().limit(&a.queue, &limits).await?;
    if a.json {
        return super::print_json_line(&serde_json::json!({
            "queue": a.queue,
            "limits": limits,
        }));
    }
    let q = &a.queue;
    match describe(&limits) {
        Some(l) => say!("queue {q} limited to {l}"),
        None => say!("queue {q} has no limits"),
    }
    Ok(())
}

/// A queue's limits in words, e.g. "3 at once, 1 per key at once, 100 per 1m"; None without any.
pub(crate) fn describe(l: &rowclaim::QueueLimits) -> Option<String> {
    let per = |r: &rowclaim::Rate| humantime::format_duration(r.per).to_string();
    let parts: Vec<String> = [
        l.concurrency.map(|n| format!("{n} at once")),
        l.key_concurrency.map(|n| format!("{n} per key at once")),
        l.rate.map(|r| format!("{} per {}", r.jobs, per(&r))),
        l.key_rate
            .map(|r| format!("{} per key per {}", r.jobs, per(&r))),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

async fn list(db: &Db, json: bool) -> Result<(), CliError> {
    let queue = db.queue();
    let stats = queue.stats(None).await?;
    let settings = queue.settings().await?;
    let mut names: Vec<&String> = stats
        .by_queue
        .keys()
        .chain(settings.iter().map(|s| &s.name))
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        let counts = stats.by_queue.get(name).cloned().unwrap_or_default();
        let own = settings.iter().find(|s| &s.name == name);
        let paused = own.and_then(|s| s.paused_at);
        let limits = own.map(|s| s.limits).unwrap_or_default();
        if json {
            super::print_json_line(&serde_json::json!({
                "queue": name,
                "paused_at": paused.map(|t| humantime::format_rfc3339_millis(t).to_string()),
                "limits": limits,
                "jobs": counts,
                "estimated": stats.estimated.get(name.as_str()),
                "at_least": stats.at_least.get(name.as_str()),
            }))?;
            continue;
        }
        let jobs: Vec<String> = rowclaim::JOB_STATUSES
            .iter()
            .map(|s| {
                let n = stats.shown(name, s, counts.get(*s).copied().unwrap_or(0));
                format!("{s} {n}")
            })
            .collect();
        let mut state = match paused {
            Some(t) => format!("paused since {}", humantime::format_rfc3339_seconds(t)),
            None => "running".to_owned(),
        };
        if let Some(l) = describe(&limits) {
            state.push_str(&format!(" (limits: {l})"));
        }
        println!("{name}\t{state}\t{}", jobs.join(", "));
    }
    Ok(())
}
