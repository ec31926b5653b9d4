//! `rowclaim workers`: the workers the registry lists (`rowclaim_workers`), running, stopped and
//! gone, with their host, pid, version, what they work on and their last heartbeat.

use std::time::SystemTime;

use clap::Args;
use rowclaim::{WorkerEntry, WorkerState};
use serde::Serialize;

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct WorkersArgs {
    /// Print JSON (one array of workers) instead of a table.
    #[arg(long)]
    json: bool,
    /// List only workers in this state: active, stopped or gone.
    #[arg(long, value_name = "STATE", value_parser = ["active", "stopped", "gone"])]
    state: Option<String>,
}

/// One worker as `--json` prints it.
#[derive(Serialize)]
struct Shown<'a> {
    id: &'a str,
    host: &'a str,
    pid: i64,
    queues: &'a [String],
    started_at: String,
    heartbeat_at: String,
    running: i64,
    state: WorkerState,
    version: &'a str,
    source: &'a str,
    concurrency: i64,
    lease_secs: f64,
}

pub async fn run(url: &str, a: WorkersArgs) -> Result<(), CliError> {
    let db = rowclaim::Db::connect(url).await?;
    let mut workers = db.workers().await?;
    if let Some(state) = &a.state {
        workers.retain(|w| w.state.as_str() == state);
    }
    if a.json {
        let shown: Vec<Shown<'_>> = workers.iter().map(shown).collect();
        let text = serde_json::to_string_pretty(&shown)
            .map_err(|e| CliError::io("writing the workers")(e.into()))?;
        println!("{text}");
        return Ok(());
    }
    if workers.is_empty() {
        println!(
            "no worker has registered (rowclaim work and Worker register in rowclaim_workers)"
        );
        return Ok(());
    }
    println!(
        "{:<8} {:<20} {:>8} {:>9} {:>12}  {:<24} id",
        "state", "host", "pid", "running", "heartbeat", "queues / table"
    );
    let now = SystemTime::now();
    for w in &workers {
        println!(
            "{:<8} {:<20} {:>8} {:>9} {:>12}  {:<24} {}",
            w.state.as_str(),
            w.host,
            w.pid,
            format!("{}/{}", w.running, w.concurrency),
            ago(now, w.heartbeat_at),
            work_of(w),
            w.id
        );
    }
    Ok(())
}

fn shown(w: &WorkerEntry) -> Shown<'_> {
    Shown {
        id: &w.id,
        host: &w.host,
        pid: w.pid,
        queues: &w.queues,
        started_at: humantime::format_rfc3339_millis(w.started_at).to_string(),
        heartbeat_at: humantime::format_rfc3339_millis(w.heartbeat_at).to_string(),
        running: w.running,
        state: w.state,
        version: &w.version,
        source: &w.source,
        concurrency: w.concurrency,
        lease_secs: w.lease.as_secs_f64(),
    }
}

/// What a worker works on: its queues (every queue when none is named), or its table.
pub fn work_of(w: &WorkerEntry) -> String {
    if !w.queues.is_empty() {
        w.queues.join(",")
    } else if w.source.ends_with("rowclaim_jobs") {
        "(every queue)".to_owned()
    } else {
        w.source.clone()
    }
}

/// How long ago `then` was, as this machine's clock sees it (for a person to read).
fn ago(now: SystemTime, then: SystemTime) -> String {
    let secs = now.duration_since(then).map_or(0, |d| d.as_secs());
    format!("{secs}s ago")
}
