//! `rowclaim queue`: one queue of the managed queue as a whole: pause it, resume it, and list
//! the queues with their counts and whether they are paused.

use clap::{Args, Subcommand};
use rowclaim::Db;

use crate::error::CliError;

#[derive(Subcommand, Debug)]
pub enum QueueCommand {
    /// Pause queue Q: from now on no worker claims a job of it, jobs a worker claimed ahead go
    /// back at its next heartbeat (a third of its lease), and running jobs finish. Jobs can
    /// still be enqueued. Nothing changes when it is paused already (said, exit 0).
    Pause(NameArgs),
    /// Let workers claim jobs of queue Q again (listening workers wake at once). Nothing
    /// changes when it is not paused (said, exit 0).
    Resume(NameArgs),
    /// The queues, each with its jobs per state and whether it is paused (a paused queue
    /// without jobs is listed too).
    List(ListArgs),
}

#[derive(Args, Debug)]
pub struct NameArgs {
    /// The queue.
    #[arg(value_name = "Q")]
    queue: String,
    /// Say what happened as one JSON object: {"queue", "paused", "changed"}.
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
    };
    let changed = if pause {
        queue.pause(&a.queue).await?
    } else {
        queue.resume(&a.queue).await?
    };
    if a.json {
        return super::print_json_line(&serde_json::json!({
            "queue": a.queue,
            "paused": pause,
            "changed": changed,
        }));
    }
    let q = &a.queue;
    let said = match (pause, changed) {
        (true, true) => format!("paused queue {q}: workers start none of its jobs until resumed"),
        (true, false) => format!("queue {q} was paused already"),
        (false, true) => format!("resumed queue {q}"),
        (false, false) => format!("queue {q} was not paused"),
    };
    crate::say::say!("{said}");
    Ok(())
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
        let paused = settings
            .iter()
            .find(|s| &s.name == name)
            .and_then(|s| s.paused_at);
        if json {
            super::print_json_line(&serde_json::json!({
                "queue": name,
                "paused_at": paused.map(|t| humantime::format_rfc3339_millis(t).to_string()),
                "jobs": counts,
            }))?;
            continue;
        }
        let jobs: Vec<String> = rowclaim::JOB_STATUSES
            .iter()
            .map(|s| format!("{s} {}", counts.get(*s).copied().unwrap_or(0)))
            .collect();
        let state = match paused {
            Some(t) => format!("paused since {}", humantime::format_rfc3339_seconds(t)),
            None => "running".to_owned(),
        };
        println!("{name}\t{state}\t{}", jobs.join(", "));
    }
    Ok(())
}
