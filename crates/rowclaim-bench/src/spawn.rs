//! `rowclaim bench spawn`: the yardstick of a command per job — how fast this machine starts
//! and reaps a command, --concurrency at a time, with no database at all.

use std::process::Stdio;
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use tokio::task::JoinSet;

use crate::error::{BenchError, Context, Result};
use crate::{bad, print_json, Table};

pub(crate) const ABOUT: &str = "\
Spawn: the physical limit of `rowclaim work` — a loop that only starts COMMAND --jobs times,
--concurrency at a time, and waits for each (stdin, stdout and stderr closed), with no database.
Divide `rowclaim bench worker -- COMMAND` by it.";

#[derive(Args, Debug)]
pub struct SpawnArgs {
    /// How many times to run COMMAND.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    jobs: u64,
    /// Commands running at once.
    #[arg(long, value_name = "C", default_value_t = 8)]
    concurrency: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The command, after --.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Serialize)]
struct SpawnReport {
    scenario: &'static str,
    command: String,
    jobs: u64,
    concurrency: u32,
    seconds: f64,
    jobs_per_second: f64,
}

pub(crate) async fn run(a: SpawnArgs) -> Result<()> {
    if a.jobs == 0 || a.concurrency == 0 {
        return Err(bad("--jobs and --concurrency must be at least 1"));
    }
    let Some((program, args)) = a.command.split_first() else {
        return Err(bad("give the COMMAND after --"));
    };
    let started = Instant::now();
    let mut running = JoinSet::new();
    let mut left = a.jobs;
    while left > 0 || !running.is_empty() {
        while left > 0 && running.len() < a.concurrency as usize {
            left -= 1;
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut child = cmd
                .spawn()
                .with_context(|| format!("starting {program:?}"))?;
            running.spawn(async move { child.wait().await });
        }
        if let Some(done) = running.join_next().await {
            let status = done.context("a wait panicked")?.context("waiting")?;
            if !status.success() {
                return Err(BenchError::Failed(format!(
                    "{program} exited with {status}"
                )));
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let report = SpawnReport {
        scenario: "spawn",
        command: a.command.join(" "),
        jobs: a.jobs,
        concurrency: a.concurrency,
        seconds,
        jobs_per_second: a.jobs as f64 / seconds,
    };
    if a.json {
        print_json(&report)?;
        return Ok(());
    }
    println!(
        "{} × `{}`, {} at once, no database",
        report.jobs, report.command, report.concurrency
    );
    let mut t = Table::new(["jobs/s", "seconds"], 0);
    t.row(vec![
        format!("{:.0}", report.jobs_per_second),
        format!("{:.2}", report.seconds),
    ]);
    print!("{}", t.render());
    Ok(())
}
