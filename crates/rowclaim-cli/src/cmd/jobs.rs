//! `rowclaim jobs`: look at and change jobs of the managed queue.

use std::io::Write;
use std::time::Duration;

use clap::Subcommand;
use rowclaim::{Db, JobFilter};

use crate::error::CliError;

#[derive(Subcommand, Debug)]
pub enum JobsCommand {
    /// List jobs, newest first, as JSON lines (the same keys on every database; times in
    /// RFC 3339, UTC).
    List {
        /// Only this queue (repeat for several).
        #[arg(long = "queue", value_name = "Q")]
        queues: Vec<String>,
        /// Only jobs of this kind (repeat, or a comma list, for several).
        #[arg(long = "kind", value_name = "K", value_delimiter = ',')]
        kinds: Vec<String>,
        /// Only jobs in this state: ready, running, completed, dead, cancelled.
        #[arg(long, value_name = "S",
              value_parser = clap::builder::PossibleValuesParser::new(rowclaim::JOB_STATUSES))]
        status: Option<String>,
        /// At most this many.
        #[arg(long, value_name = "N", default_value = "50", value_parser = super::values::count, allow_hyphen_values = true)]
        limit: u32,
    },
    /// Show one job as JSON (as in `jobs list`), with its failed attempts (`errors`: each
    /// one's attempt, times and error, the last 20). Exits 1 when there is no such job.
    Show {
        /// The job's id.
        id: i64,
        /// JSON, as always (accepted so that scripts may say so, as with `stats --json`).
        #[arg(long)]
        json: bool,
    },
    /// Make a dead or cancelled job ready again, its attempts reset.
    Retry {
        /// The job's id.
        id: i64,
    },
    /// Cancel a ready or running job (a running job's result is then refused).
    Cancel {
        /// The job's id.
        id: i64,
    },
    /// Delete completed, dead and cancelled jobs that finished longer ago than --older-than.
    Prune {
        /// e.g. 7d, 12h.
        #[arg(long, value_name = "DURATION", value_parser = super::values::duration_or_zero, allow_hyphen_values = true)]
        older_than: Duration,
    },
}

pub async fn run(url: &str, op: JobsCommand) -> Result<(), CliError> {
    let db = Db::connect(url).await?;
    let queue = db.queue();
    let (changed, what, id) = match op {
        JobsCommand::List {
            queues,
            kinds,
            status,
            limit,
        } => {
            let mut filter = JobFilter::new().queues(queues).kinds(kinds).limit(limit);
            if let Some(s) = status {
                filter = filter.status(s);
            }
            let mut out = std::io::stdout().lock();
            for job in queue.list(&filter).await? {
                let line = serde_json::to_string(&job)
                    .map_err(|e| CliError::io("writing the job")(e.into()))?;
                writeln!(out, "{line}").map_err(CliError::io("writing to stdout"))?;
            }
            return Ok(());
        }
        JobsCommand::Show { id, json: _ } => {
            let Some(job) = queue.get(id).await? else {
                return Err(CliError::NothingClaimed(format!("no job {id}")));
            };
            let text = serde_json::to_string_pretty(&job)
                .map_err(|e| CliError::io("writing the job")(e.into()))?;
            println!("{text}");
            return Ok(());
        }
        JobsCommand::Retry { id } => (u64::from(queue.retry(id).await?), "retried", id),
        JobsCommand::Cancel { id } => (u64::from(queue.cancel(id).await?), "cancelled", id),
        JobsCommand::Prune { older_than } => {
            let n = queue.prune(older_than).await?;
            crate::say::say!("pruned {n} job(s)");
            return Ok(());
        }
    };
    let said = format!("{what} {changed} job(s)");
    if changed == 0 {
        // Exit 1: a script retrying or cancelling learns that the job was not in that state.
        return Err(CliError::NothingClaimed(
            why_unchanged(&queue, id, what).await?,
        ));
    }
    crate::say::say!("{said}");
    Ok(())
}

/// Why `jobs retry` or `jobs cancel` of job `id` changed nothing: no such job, or the state it
/// is in and the states the command takes.
async fn why_unchanged(queue: &rowclaim::Queue, id: i64, what: &str) -> Result<String, CliError> {
    let (verb, takes) = if what == "retried" {
        ("retried", "only a dead or cancelled job can be retried")
    } else {
        ("cancelled", "only a ready or running job can be cancelled")
    };
    Ok(match queue.get(id).await? {
        None => format!("{verb} no job: there is no job {id}"),
        Some(job) => format!("{verb} no job: job {id} is {} ({takes})", job.status),
    })
}
