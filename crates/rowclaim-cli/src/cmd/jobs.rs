//! `rowclaim jobs`: look at and change jobs of the managed queue.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::{Args, Subcommand};
use rowclaim::{BulkAction, Db, JobFilter, Queue};

use crate::error::CliError;

/// Which jobs a command takes: those every given condition matches.
#[derive(Args, Debug, Default, Clone)]
pub struct Selection {
    /// Only this queue (repeat for several).
    #[arg(long = "queue", value_name = "Q")]
    pub queues: Vec<String>,
    /// Only jobs of this kind (repeat, or a comma list, for several).
    #[arg(long = "kind", value_name = "K", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Only jobs in this state: ready, running, completed, dead, cancelled.
    #[arg(long, value_name = "S",
          value_parser = clap::builder::PossibleValuesParser::new(rowclaim::JOB_STATUSES))]
    pub status: Option<String>,
    /// Only jobs enqueued longer ago than this (e.g. 7d, 12h), by the database's clock.
    #[arg(long, value_name = "DURATION", value_parser = super::values::duration, allow_hyphen_values = true)]
    pub older_than: Option<Duration>,
    /// Only the job with this id, or jobs whose kind, status, payload or last error contains
    /// this text (ignoring case; % and _ are plain characters).
    #[arg(long, value_name = "TEXT")]
    pub search: Option<String>,
}

impl Selection {
    /// The library's filter of these conditions (all jobs, at most 50, where none is given).
    pub fn filter(&self) -> Result<JobFilter, CliError> {
        if self.search.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(CliError::BadInput(
                "--search: the text is empty; give some text, or leave --search out".into(),
            ));
        }
        let mut f = JobFilter::new()
            .queues(self.queues.clone())
            .kinds(self.kinds.clone());
        if let Some(s) = &self.status {
            f = f.status(s.clone());
        }
        if let Some(d) = self.older_than {
            f = f.older_than(d);
        }
        if let Some(t) = &self.search {
            f = f.search(t.clone());
        }
        Ok(f)
    }

    /// The conditions as the log says them: `queue mail, status dead`.
    fn said(&self) -> String {
        let mut parts = Vec::new();
        if !self.queues.is_empty() {
            parts.push(format!("queue {}", self.queues.join(", ")));
        }
        if !self.kinds.is_empty() {
            parts.push(format!("kind {}", self.kinds.join(", ")));
        }
        if let Some(s) = &self.status {
            parts.push(format!("status {s}"));
        }
        if let Some(d) = self.older_than {
            parts.push(format!("older than {}", humantime::format_duration(d)));
        }
        if let Some(t) = &self.search {
            parts.push(format!("search {t:?}"));
        }
        if parts.is_empty() {
            "every job".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// What `jobs retry|cancel|delete` act on: job ids, or every job the conditions match.
#[derive(Args, Debug)]
pub struct Targets {
    /// The jobs' ids.
    #[arg(value_name = "ID")]
    pub ids: Vec<i64>,
    #[command(flatten)]
    pub select: Selection,
    /// Every job (in a state the action takes), without any condition.
    #[arg(long)]
    pub all: bool,
    /// Do not ask before acting on more than 100 jobs. Asked only when stdin is a terminal:
    /// a script (stdin not a terminal) is never asked.
    #[arg(long, short = 'y')]
    pub yes: bool,
}

#[derive(Subcommand, Debug)]
pub enum JobsCommand {
    /// List jobs, newest first, as JSON lines (the same keys on every database; times in
    /// RFC 3339, UTC).
    List {
        #[command(flatten)]
        select: Selection,
        /// At most this many.
        #[arg(long, value_name = "N", default_value = "50", value_parser = super::values::count, allow_hyphen_values = true)]
        limit: u32,
    },
    /// Show one job as JSON (as in `jobs list`), with its failed attempts (`errors`: each
    /// one's attempt, times and error, the last 20), the jobs it waits for (`waits_for`) and
    /// those that wait for it (`waited_by`), each with its status (null: gone), and whether it
    /// runs also when one it waits for ends dead or cancelled (`run_anyway`). Exits 1 when
    /// there is no such job.
    Show {
        /// The job's id.
        id: i64,
        /// JSON, as always (accepted so that scripts may say so, as with `stats --json`).
        #[arg(long)]
        json: bool,
    },
    /// Make dead or cancelled jobs ready again, their attempts reset: the jobs given by id, or
    /// every dead or cancelled job the conditions match (e.g. --queue mail --status dead), in
    /// batches. Says how many changed; exits 1 when none did.
    #[command(after_help = BULK_HELP)]
    Retry(Targets),
    /// Cancel waiting, ready or running jobs (a running job's result is then refused), and the
    /// jobs that wait for them: by id, or every waiting, ready or running job the conditions
    /// match.
    #[command(after_help = BULK_HELP)]
    Cancel(Targets),
    /// Delete jobs that are not running (cancel a running one first): by id, or every such
    /// job the conditions match.
    #[command(after_help = BULK_HELP)]
    Delete(Targets),
    /// Delete completed, dead and cancelled jobs that finished longer ago than --older-than.
    Prune {
        /// e.g. 7d, 12h.
        #[arg(long, value_name = "DURATION", value_parser = super::values::duration_or_zero, allow_hyphen_values = true)]
        older_than: Duration,
    },
}

/// How `jobs retry|cancel|delete` choose their jobs, and when they ask first.
const BULK_HELP: &str = "Give job ids, or conditions (--queue, --kind, --status, --older-than, \
--search: a job must match all of them), or --all for every job. Conditions act on every \
matching job in batches of a few thousand, each its own transaction, newest first; jobs \
enqueued meanwhile are left alone. Above 100 jobs, when stdin is a terminal, the command says \
how many and asks first (--yes does not ask); when stdin is not a terminal it does not ask.";

/// Above this many jobs, a terminal is asked first.
const ASK_ABOVE: u64 = 100;

pub async fn run(url: &str, op: JobsCommand) -> Result<(), CliError> {
    let db = Db::connect(url).await?;
    let queue = db.queue();
    let (action, targets) = match op {
        JobsCommand::List { select, limit } => {
            let filter = select.filter()?.limit(limit);
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
            let mut shown = serde_json::to_value(&job)
                .map_err(|e| CliError::io("writing the job")(e.into()))?;
            // What it waits for, what waits for it, and whether it runs anyway (none before the
            // queue's schema has waits: `rowclaim init`).
            match queue.links(id).await {
                Ok(links) => {
                    if let Some(o) = shown.as_object_mut() {
                        o.insert("waits_for".into(), serde_json::json!(links.waits_for));
                        o.insert("waited_by".into(), serde_json::json!(links.waited_by));
                        o.insert("run_anyway".into(), serde_json::json!(links.run_anyway));
                    }
                }
                Err(e) if e.kind() == rowclaim::ErrorKind::NotInitialised => {}
                Err(e) => return Err(e.into()),
            }
            let text = serde_json::to_string_pretty(&shown)
                .map_err(|e| CliError::io("writing the job")(e.into()))?;
            println!("{text}");
            return Ok(());
        }
        JobsCommand::Retry(t) => (BulkAction::Retry, t),
        JobsCommand::Cancel(t) => (BulkAction::Cancel, t),
        JobsCommand::Delete(t) => (BulkAction::Delete, t),
        JobsCommand::Prune { older_than } => {
            let n = queue.prune(older_than).await?;
            crate::say::say!("pruned {n} job(s)");
            return Ok(());
        }
    };
    if targets.ids.is_empty() {
        by_filter(&queue, action, &targets).await
    } else {
        by_ids(&queue, action, &targets).await
    }
}

/// The past tense the log says of `action`.
fn done(action: BulkAction) -> &'static str {
    match action {
        BulkAction::Retry => "retried",
        BulkAction::Cancel => "cancelled",
        _ => "deleted",
    }
}

/// `action` on the jobs given by id, one by one. Exit 1 (with why, per job) when any of them
/// was not changed: a script learns that a job was not in a state the action takes.
async fn by_ids(queue: &Queue, action: BulkAction, t: &Targets) -> Result<(), CliError> {
    let s = &t.select;
    if t.all
        || !s.queues.is_empty()
        || !s.kinds.is_empty()
        || s.status.is_some()
        || s.older_than.is_some()
        || s.search.is_some()
    {
        return Err(CliError::BadInput(format!(
            "jobs {}: give job ids or conditions (--queue, --kind, --status, --older-than, \
             --search, --all), not both",
            action.verb()
        )));
    }
    let mut changed = 0u64;
    let mut unchanged = Vec::new();
    for &id in &t.ids {
        let did = match action {
            BulkAction::Retry => queue.retry(id).await?,
            BulkAction::Cancel => queue.cancel(id).await?,
            _ => queue.delete(id).await?,
        };
        if did {
            changed += 1;
        } else {
            unchanged.push(why_unchanged(queue, id, action).await?);
        }
    }
    crate::say::say!("{} {changed} job(s)", done(action));
    match unchanged.len() {
        0 => Ok(()),
        1 => Err(CliError::NothingClaimed(unchanged.remove(0))),
        n => Err(CliError::NothingClaimed(format!(
            "{n} of {} jobs unchanged: {}",
            t.ids.len(),
            unchanged.join("; ")
        ))),
    }
}

/// `action` on every job the conditions match, in the library's batches; asks first on a
/// terminal above [`ASK_ABOVE`] jobs.
async fn by_filter(queue: &Queue, action: BulkAction, t: &Targets) -> Result<(), CliError> {
    let verb = action.verb();
    let filter = t.select.filter()?;
    if !t.all && !filter.narrows() {
        return Err(CliError::BadInput(format!(
            "jobs {verb}: which jobs? Give job ids, or conditions (--queue, --kind, --status, \
             --older-than, --search), or --all for every job"
        )));
    }
    if let Some(s) = &t.select.status {
        if !action.takes().contains(&s.as_str()) {
            return Err(CliError::BadInput(format!(
                "--status {s}: jobs {verb} takes only {} jobs; give one of those, or leave \
                 --status out to {verb} every {} job the other conditions match",
                action.takes().join(" or "),
                action.takes().join(" or ")
            )));
        }
    }
    let said = t.select.said();
    if !t.yes && std::io::stdin().is_terminal() {
        let n = queue.count(&filter, Some(action)).await?;
        if n > ASK_ABOVE && !confirmed(&format!("{verb} {n} jobs ({said})?"))? {
            return Err(CliError::NothingClaimed(format!(
                "{} no job: not confirmed",
                done(action)
            )));
        }
    }
    let changed = queue.bulk(action, &filter).await?;
    if changed == 0 {
        return Err(CliError::NothingClaimed(format!(
            "{} no job: none of {said} is {}",
            done(action),
            action.takes().join(" or ")
        )));
    }
    crate::say::say!("{} {changed} job(s) ({said})", done(action));
    Ok(())
}

/// Asks `question` on stderr; whether the answer read from the terminal is yes.
fn confirmed(question: &str) -> Result<bool, CliError> {
    eprint!("rowclaim: {question} [y/N] ");
    std::io::stderr()
        .flush()
        .map_err(CliError::io("writing to stderr"))?;
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(CliError::io("reading the answer from stdin"))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

/// Why `action` of job `id` changed nothing: no such job, or the state it is in and the
/// states the action takes.
async fn why_unchanged(queue: &Queue, id: i64, action: BulkAction) -> Result<String, CliError> {
    let verb = done(action);
    let takes = match action {
        BulkAction::Retry => "only a dead or cancelled job can be retried",
        BulkAction::Cancel => "only a waiting, ready or running job can be cancelled",
        _ => "a running job cannot be deleted; cancel it first",
    };
    Ok(match queue.get(id).await? {
        None => format!("{verb} no job: there is no job {id}"),
        Some(job) => format!("{verb} no job: job {id} is {} ({takes})", job.status),
    })
}
