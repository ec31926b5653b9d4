//! The `rowclaim` command: a thin layer of clap commands over the `rowclaim` library.

mod bench;
mod demo;
mod source_args;
mod work;

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use rowclaim::{Claimer, Db, Error, Retention, RowId, Token};
use source_args::{SourceArgs, Target};

/// Exit codes, as documented in `rowclaim --help`.
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// `claim` found nothing to claim; `jobs` changed no job.
    pub const NOTHING_CLAIMED: i32 = 1;
    /// Bad input: usage, a name that is not an identifier, a missing table or column, a strategy
    /// the server or table cannot do, a zero lease, an unreadable config file.
    pub const BAD_INPUT: i32 = 2;
    /// The token no longer holds the rows (their lease expired and another claimer took them, or
    /// they were settled already). Nothing was changed.
    pub const LEASE_LOST: i32 = 3;
    /// The database failed (connection, query), the work COMMAND could not be started, or a
    /// worker gave up after `--give-up-after`.
    pub const FAILURE: i32 = 4;
    /// `work --until-empty` finished, but some rows failed, died, were lost to another worker or
    /// were given up during an outage.
    pub const INCOMPLETE: i32 = 5;
    /// The connection broke while a commit was under way: it may or may not have taken effect.
    pub const OUTCOME_UNKNOWN: i32 = 6;
    /// `work` was stopped by a second signal: running commands were stopped, their rows given
    /// back.
    pub const INTERRUPTED: i32 = 130;
}

const AFTER_HELP: &str = "\
Exit codes:
  0  success
  1  claim: nothing was claimable; jobs: no job was changed
  2  bad input: usage, an invalid identifier, a missing table or column, a strategy this server
     or table cannot do, a zero lease, a bad config file
  3  lease lost: the token no longer holds the rows (nothing was changed)
  4  failure: database error, the work COMMAND could not be started, or work gave up after
     --give-up-after
  5  work --until-empty finished, but some rows failed, died, were lost or were given up
  6  outcome unknown: the connection broke while a commit was under way (an enqueue, a
     complete); check before doing it again
  130  work stopped by a second signal: running commands were stopped and their rows given back

The database comes from --database, else $DATABASE_URL, else sqlite://rowclaim.db here.";

/// Share the rows of one SQL table between many workers: each row is processed by exactly one of
/// them at a time, and rows of a worker that dies come back when its lease expires.
///
/// Works on PostgreSQL, MySQL 8 / MariaDB 10.6+ and SQLite, on a table you already have: an id
/// column and a status column are all it needs; owner, lease and attempts columns unlock more.
#[derive(Parser, Debug)]
#[command(name = "rowclaim", version, after_help = AFTER_HELP, max_term_width = 100)]
struct Cli {
    /// Database URL: postgres://user@host/db, mysql://user@host/db (also MariaDB),
    /// sqlite://path/to/file.db.
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        default_value = "sqlite://rowclaim.db",
        hide_env_values = true
    )]
    database: String,
    /// Log more on stderr (-v: what rowclaim decides, -vv: every retry).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Claim rows and run COMMAND once per row: the row as a JSON object on its stdin (for
    /// --queue: the job's payload), its id in $ROWCLAIM_ID and the claim token in
    /// $ROWCLAIM_TOKEN (for --queue also $ROWCLAIM_KIND, $ROWCLAIM_QUEUE, $ROWCLAIM_ATTEMPT).
    /// Exit 0 marks the row done; any other exit fails it (a job is retried with backoff until
    /// its last attempt). COMMAND's stdout and stderr go to this terminal.
    ///
    /// While a command runs its lease is renewed, so a slow command keeps its row. If the
    /// database goes away, running commands go on, claims pause and resume when it answers, and
    /// results are retried until their lease would end. A command whose row is no longer this
    /// worker's (lease lost, job cancelled) or that runs past --timeout is stopped: SIGTERM to
    /// its process group, SIGKILL after --kill-after.
    ///
    /// Each command runs in a process group of its own, so a Ctrl-C at the terminal reaches
    /// rowclaim only. The first SIGINT or SIGTERM stops claiming, gives back rows not started,
    /// and lets running commands finish within --grace; then they are stopped and their rows
    /// given back. A second signal (a second or more after the first) stops them at once and
    /// exits 130.
    #[command(after_help = AFTER_HELP)]
    Work(WorkArgs),
    /// Claim rows and print them as JSON lines, each with its token: {"token":…,"id":…,"row":{…}}.
    /// Settle them later with complete, fail or release --token. Exits 1 when nothing was claimable.
    #[command(after_help = AFTER_HELP)]
    Claim(ClaimArgs),
    /// Mark rows a token holds as done.
    #[command(after_help = AFTER_HELP)]
    Complete(TokenArgs),
    /// Mark rows a token holds as failed.
    #[command(after_help = AFTER_HELP)]
    Fail(TokenArgs),
    /// Give rows a token holds back: ready to be claimed again.
    #[command(after_help = AFTER_HELP)]
    Release(TokenArgs),
    /// Push the lease of rows a token holds to now + --lease (by the database's clock).
    #[command(after_help = AFTER_HELP)]
    Extend(ExtendArgs),
    /// Show rows per status, claimed rows per owner, and expired leases; without a table, the
    /// managed queue's jobs per queue and status, the oldest ready job's wait and the jobs
    /// completed in the last minute.
    #[command(after_help = AFTER_HELP)]
    Stats(StatsArgs),
    /// Create or migrate the managed job queue (table rowclaim_jobs). Idempotent; safe to run
    /// from several processes at once.
    #[command(after_help = AFTER_HELP)]
    Init,
    /// Look at and change jobs of the managed queue: list, show, retry a dead or cancelled job,
    /// cancel a ready or running one, prune finished ones. show, retry and cancel exit 1 when
    /// there was no such job to show or change.
    #[command(subcommand, after_help = AFTER_HELP)]
    Jobs(JobsCommand),
    /// Add jobs to the managed queue: one JSON payload as the argument, or JSON lines on stdin
    /// (all or nothing: one malformed line adds none, and the error names its line).
    #[command(after_help = AFTER_HELP)]
    Enqueue(EnqueueArgs),
    /// Measure, on whatever --database points at: `drain` (jobs per second and claim latency;
    /// --plain for the yardstick of a hand-written queue), `latency` (enqueue to start),
    /// `scale` (claim latency as the table grows), `contention` (jobs per second against workers,
    /// per strategy, with an SVG chart). Every run checks its own work and fails loudly if a row
    /// was processed twice or left behind. Use a scratch database: the bench drops and recreates
    /// its tables (rowclaim_bench, rowclaim_plain) and deletes the jobs of the queue "bench".
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Create a SQLite table of jobs and let several workers drain it: shows how many rows each
    /// worker took and checks that no row was processed twice. Needs no server.
    Demo(demo::DemoArgs),
}

#[derive(Args, Debug)]
struct WorkArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Rows claimed at once (default: the free slots). Rows beyond the free slots wait, claimed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    batch: Option<u32>,
    /// Rows to claim ahead, beyond the running ones, waiting for a free slot with their leases
    /// renewed. Claims then come in batches of about N/2: for short commands, a few hundred.
    #[arg(long, value_name = "N", default_value_t = 0)]
    prefetch: usize,
    /// How long a claim holds its rows without a heartbeat, e.g. 30s, 5m.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// Commands run at once.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// Stop a command that runs longer than this and fail its row ("timed out after …"); a
    /// job's own --timeout from enqueue wins. Default: no limit.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// At the first signal, how long running commands may take to finish before they are
    /// stopped and their rows given back.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// How long a stopped command gets between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    kill_after: Duration,
    /// With --queue: what becomes of completed jobs: keep (as `completed`, until `jobs prune`)
    /// or delete.
    #[arg(long, value_name = "WHAT", default_value = "keep", value_parser = parse_retention)]
    completed: Retention,
    /// Exit (code 4) once the database has been unreachable this long, e.g. 10m. Default: keep
    /// waiting for it.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    give_up_after: Option<Duration>,
    /// Exit 0 once no row is left to work on (none ready, none claimed by a worker that might
    /// still die and give it back). Without it, keep polling for new rows.
    #[arg(long)]
    until_empty: bool,
    /// How long to wait before looking again when nothing was claimable. With --queue on
    /// PostgreSQL a new job wakes the worker at once (LISTEN/NOTIFY), so this is only a fallback.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// With --queue on PostgreSQL: do not LISTEN for new jobs, only poll (e.g. behind a
    /// connection pooler in transaction mode, where LISTEN does not work).
    #[arg(long)]
    no_listen: bool,
    /// The command to run per row, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND [ARGS]")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct ClaimArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Rows to claim at most.
    #[arg(long, value_name = "N", default_value_t = 1)]
    batch: u32,
    /// How long the claim holds the rows, e.g. 30s, 5m.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
}

#[derive(Args, Debug)]
struct TokenArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// The claim's token, as `claim` printed it.
    #[arg(long, value_name = "T")]
    token: String,
    /// Only these rows (repeat the flag, or separate with commas); default: all rows of the token.
    /// Named rows change all together or not at all.
    #[arg(long = "id", value_name = "ID", value_delimiter = ',')]
    ids: Vec<String>,
}

#[derive(Args, Debug)]
struct ExtendArgs {
    #[command(flatten)]
    token: TokenArgs,
    /// The new lease, from now.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    lease: Duration,
}

#[derive(Subcommand, Debug)]
enum JobsCommand {
    /// List jobs, newest first, as JSON lines.
    List {
        /// Only this queue (repeat for several).
        #[arg(long = "queue", value_name = "Q")]
        queues: Vec<String>,
        /// Only jobs in this state: ready, running, completed, dead, cancelled.
        #[arg(long, value_name = "S")]
        status: Option<String>,
        /// At most this many.
        #[arg(long, value_name = "N", default_value_t = 50)]
        limit: u32,
    },
    /// Show one job as JSON. Exits 1 when there is no such job.
    Show {
        /// The job's id.
        id: i64,
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
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        older_than: Duration,
    },
}

#[derive(Args, Debug)]
struct EnqueueArgs {
    /// The queue.
    #[arg(long, value_name = "Q", default_value = "default")]
    queue: String,
    /// The job's kind, for routing to a handler.
    #[arg(long, value_name = "K", default_value = "")]
    kind: String,
    /// Higher runs first.
    #[arg(
        long,
        value_name = "P",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    priority: i32,
    /// Run no earlier than this long from now, e.g. 10s, 5m.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, conflicts_with = "run_at")]
    delay: Option<Duration>,
    /// Run no earlier than this time, e.g. 2026-12-01T08:00:00Z.
    #[arg(long, value_name = "RFC3339", value_parser = humantime::parse_rfc3339_weak)]
    run_at: Option<std::time::SystemTime>,
    /// Runs before the job is dead.
    #[arg(long, value_name = "N", default_value_t = rowclaim::DEFAULT_MAX_ATTEMPTS)]
    max_attempts: i32,
    /// While a job with this key is ready or running, return it instead of adding another.
    #[arg(long, value_name = "K")]
    unique_key: Option<String>,
    /// Stop a run of the job that takes longer than this, e.g. 5m; it then fails ("timed out
    /// after 5m") and is retried like any failure. Default: the worker's --timeout.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
    /// The payload; without it, one payload per line is read from stdin.
    #[arg(value_name = "JSON")]
    json: Option<String>,
}

#[derive(Args, Debug)]
struct StatsArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() {
    let cli = Cli::parse();
    let level = match cli.verbose {
        // sqlx warns about every broken connection it tests and every slow statement; an outage
        // is rowclaim's to report, once.
        0 => "warn,sqlx=error",
        1 => "info,rowclaim=debug",
        _ => "debug,rowclaim=trace",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ROWCLAIM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Where a line comes from in the code helps when debugging (-v), not otherwise.
        .with_target(cli.verbose > 0)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rowclaim: cannot start: {e}");
            std::process::exit(exit::FAILURE);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rowclaim: {}", explain(&e));
            exit_code(&e)
        }
    };
    // Do not wait for tasks still parked on the runtime (a released signal handler, say).
    runtime.shutdown_timeout(Duration::from_millis(100));
    std::process::exit(code);
}

/// `keep` or `delete`, for `--completed`.
pub fn parse_retention(s: &str) -> Result<Retention, String> {
    match s {
        "keep" => Ok(Retention::Keep),
        "delete" => Ok(Retention::Delete),
        other => Err(format!("{other:?}: use keep or delete")),
    }
}

/// Input the user must fix (a config file, a missing flag): exits with [`exit::BAD_INPUT`].
#[derive(Debug)]
pub struct BadInput(pub String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

fn exit_code(e: &anyhow::Error) -> i32 {
    if e.chain().any(|c| c.is::<BadInput>()) {
        return exit::BAD_INPUT;
    }
    match e.chain().find_map(|c| c.downcast_ref::<Error>()) {
        Some(Error::LeaseLost { .. }) => exit::LEASE_LOST,
        Some(Error::OutcomeUnknown { .. }) => exit::OUTCOME_UNKNOWN,
        Some(
            Error::Database(_)
            | Error::Connect { .. }
            | Error::GaveUp { .. }
            | Error::HandlerAborted(_),
        )
        | None => exit::FAILURE,
        Some(_) => exit::BAD_INPUT,
    }
}

/// An error and its causes in one line, each said once. A library error's message is complete
/// (it carries its cause's text), so the chain ends there.
fn explain(e: &anyhow::Error) -> String {
    let mut said: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !said.iter().any(|s| s.contains(&text)) {
            said.push(text);
        }
        if cause.is::<Error>() {
            break;
        }
    }
    let mut line = said.join(": ");
    if let Some(Error::OutcomeUnknown { what, .. }) =
        e.chain().find_map(|c| c.downcast_ref::<Error>())
    {
        if what.starts_with("the enqueue") {
            line.push_str("; check with `rowclaim jobs list` before enqueueing again");
        }
    }
    line
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let url = cli.database.as_str();
    match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Bench(cmd) => bench::run(url, cmd).await,
        Command::Work(a) => {
            let concurrency = a.concurrency as usize;
            // Connections: results go in batches, so a few beside the running commands serve
            // claims, heartbeats, results and LISTEN; with the transaction strategy each claim
            // holds one for as long as its rows wait.
            let ahead = if a.source.strategy == rowclaim::Strategy::Transaction {
                a.prefetch
            } else {
                a.prefetch.min(32)
            };
            let connections = (concurrency + ahead + 3).min(u32::MAX as usize) as u32;
            if a.completed == Retention::Delete && a.source.queues.is_empty() {
                let why = "--completed delete is for jobs of the managed queue (--queue); rows of \
                           your own table are marked done";
                return Err(BadInput(why.into()).into());
            }
            let claimer = claimer_keeping(url, &a.source, connections, a.completed).await?;
            say_strategy(&claimer, a.source.strategy);
            let mut worker = rowclaim::Worker::for_claimer(claimer)
                .handler(work::RunCommand {
                    command: a.command,
                    kill_after: a.kill_after,
                })
                .concurrency(concurrency)
                .prefetch(a.prefetch)
                .lease(a.lease)
                .poll(a.poll)
                .grace(a.grace)
                .until_empty(a.until_empty)
                .listen(!a.no_listen);
            if let Some(n) = a.batch {
                worker = worker.batch(n);
            }
            if let Some(limit) = a.timeout {
                worker = worker.timeout(limit);
            }
            if let Some(outage) = a.give_up_after {
                worker = worker.give_up_after(outage);
            }
            tokio::spawn(stop_on_signal(
                StopSignals::listen()?,
                worker.shutdown_handle(),
            ));
            let report = worker.run(std::future::pending()).await?;
            eprintln!("rowclaim: {}", work::summary(&report));
            Ok(if report.interrupted {
                exit::INTERRUPTED
            } else if a.until_empty && report.troubled() > 0 {
                exit::INCOMPLETE
            } else {
                exit::OK
            })
        }
        Command::Claim(a) => {
            if a.source.strategy == rowclaim::Strategy::Transaction {
                let why = "the transaction strategy holds rows only while the claiming process \
                           runs, and claim exits at once; use it with `rowclaim work`";
                return Err(BadInput(why.into()).into());
            }
            let claimer = claimer(url, &a.source, 2).await?;
            say_strategy(&claimer, a.source.strategy);
            let claim = claimer.claim(a.batch, a.lease).await?;
            if claim.is_empty() {
                eprintln!("rowclaim: nothing to claim in {}", claimer.table_name());
                return Ok(exit::NOTHING_CLAIMED);
            }
            let mut out = std::io::stdout().lock();
            for row in claim.rows() {
                let line = serde_json::json!({
                    "token": claim.token().to_string(),
                    "id": row.id,
                    "row": row.data,
                });
                writeln!(out, "{line}")?;
            }
            Ok(exit::OK)
        }
        Command::Complete(a) => {
            settle(url, &a, "completed", |c, t, ids| async move {
                c.complete(&t, &ids).await
            })
            .await
        }
        Command::Fail(a) => {
            settle(url, &a, "failed", |c, t, ids| async move {
                c.fail(&t, &ids).await
            })
            .await
        }
        Command::Release(a) => {
            settle(url, &a, "released", |c, t, ids| async move {
                c.release(&t, &ids).await
            })
            .await
        }
        Command::Extend(a) => {
            let lease = a.lease;
            settle(url, &a.token, "extended", move |c, t, ids| async move {
                c.extend(&t, &ids, lease).await
            })
            .await
        }
        Command::Init => {
            let db = Db::connect(url).await?;
            db.queue().init().await?;
            eprintln!(
                "rowclaim: the managed queue is ready on {}",
                db.server().await?.description
            );
            Ok(exit::OK)
        }
        Command::Enqueue(a) => enqueue(url, a).await,
        Command::Jobs(op) => {
            let db = Db::connect(url).await?;
            let queue = db.queue();
            let (changed, what) = match op {
                JobsCommand::List {
                    queues,
                    status,
                    limit,
                } => {
                    let mut out = std::io::stdout().lock();
                    for job in queue.list(&queues, status.as_deref(), limit).await? {
                        writeln!(out, "{job}")?;
                    }
                    return Ok(exit::OK);
                }
                JobsCommand::Show { id } => {
                    return match queue.get(id).await? {
                        Some(job) => {
                            println!("{}", serde_json::to_string_pretty(&job)?);
                            Ok(exit::OK)
                        }
                        None => {
                            eprintln!("rowclaim: no job {id}");
                            Ok(exit::NOTHING_CLAIMED)
                        }
                    };
                }
                JobsCommand::Retry { id } => (u64::from(queue.retry(id).await?), "retried"),
                JobsCommand::Cancel { id } => (u64::from(queue.cancel(id).await?), "cancelled"),
                JobsCommand::Prune { older_than } => {
                    let n = queue.prune(older_than).await?;
                    eprintln!("rowclaim: pruned {n} job(s)");
                    return Ok(exit::OK);
                }
            };
            eprintln!("rowclaim: {what} {changed} job(s)");
            Ok(if changed > 0 {
                exit::OK
            } else {
                exit::NOTHING_CLAIMED
            })
        }
        Command::Stats(a) if !a.source.given() || !a.source.queues.is_empty() => {
            let db = Db::connect(url).await?;
            let only = (a.source.queues.len() == 1).then(|| a.source.queues[0].as_str());
            let mut stats = db.queue().stats(only).await?;
            if a.source.queues.len() > 1 {
                stats.by_queue.retain(|q, _| a.source.queues.contains(q));
            }
            if a.json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
                return Ok(exit::OK);
            }
            println!("{:<20} {:<12} {:>10}", "queue", "status", "jobs");
            for (queue, by_status) in &stats.by_queue {
                for (status, n) in by_status {
                    println!("{queue:<20} {status:<12} {n:>10}");
                }
            }
            println!();
            for (queue, by_status) in &stats.by_queue {
                let oldest = stats.oldest_ready_secs.get(queue).copied().unwrap_or(0.0);
                let done = stats.completed_last_minute.get(queue).copied().unwrap_or(0);
                let ready = by_status.get("ready").copied().unwrap_or(0);
                println!(
                    "{queue}: {ready} ready, oldest due waits {oldest:.1}s, {done} completed in the last minute"
                );
            }
            Ok(exit::OK)
        }
        Command::Stats(a) => {
            let claimer = claimer(url, &a.source, 2).await?;
            let stats = claimer.stats().await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
                return Ok(exit::OK);
            }
            println!(
                "{} on {} (strategy {})",
                claimer.table_name(),
                claimer.server().description,
                claimer.strategy()
            );
            println!("\n  {:<24} {:>10}", "status", "rows");
            for (status, n) in &stats.by_status {
                println!("  {status:<24} {n:>10}");
            }
            if !stats.claimed_by_owner.is_empty() {
                println!("\n  {:<40} {:>10}", "claimed by (token)", "rows");
                for (owner, n) in &stats.claimed_by_owner {
                    println!("  {owner:<40} {n:>10}");
                }
            }
            println!("\n  expired leases: {}", stats.expired_leases);
            Ok(exit::OK)
        }
    }
}

/// `rowclaim enqueue`: one job from the argument, or JSON lines from stdin, all or nothing.
async fn enqueue(url: &str, a: EnqueueArgs) -> anyhow::Result<i32> {
    let template = |payload: serde_json::Value| {
        let mut job = rowclaim::NewJob::new(payload)
            .queue(&a.queue)
            .kind(&a.kind)
            .priority(a.priority)
            .max_attempts(a.max_attempts);
        if let Some(d) = a.delay {
            job = job.delay(d);
        }
        if let Some(t) = a.run_at {
            job = job.run_at(t);
        }
        if let Some(k) = &a.unique_key {
            job = job.unique_key(k);
        }
        if let Some(limit) = a.timeout {
            job = job.timeout(limit);
        }
        job
    };
    let db = Db::connect(url).await?;
    let queue = db.queue();
    if let Some(text) = &a.json {
        let payload: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| BadInput(format!("the JSON argument is not valid JSON: {e}")))?;
        let done = queue.enqueue(&template(payload)).await?;
        println!("{}", serde_json::to_string(&done)?);
        if done.existing {
            eprintln!(
                "rowclaim: job {} with that unique key is pending already",
                done.id
            );
        }
        return Ok(exit::OK);
    }
    if a.unique_key.is_some() {
        let why = "--unique-key goes with one job given as an argument, not with JSON lines";
        return Err(BadInput(why.into()).into());
    }
    let progress = indicatif::ProgressBar::new_spinner();
    progress.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let mut jobs = Vec::new();
    let stdin = std::io::stdin();
    for (i, line) in std::io::BufRead::lines(stdin.lock()).enumerate() {
        let line = line.context("reading stdin")?;
        if line.trim().is_empty() {
            continue;
        }
        let payload: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
            BadInput(format!(
                "line {}: not valid JSON ({e}); nothing was enqueued",
                i + 1
            ))
        })?;
        jobs.push(template(payload));
        if jobs.len() % 10_000 == 0 {
            progress.set_message(format!("read {} jobs", jobs.len()));
            progress.tick();
        }
    }
    progress.set_message(format!("enqueueing {} jobs", jobs.len()));
    progress.enable_steady_tick(Duration::from_millis(200));
    let added = queue.enqueue_many(&jobs).await?;
    progress.finish_and_clear();
    eprintln!("rowclaim: enqueued {added} jobs on queue {}", a.queue);
    Ok(exit::OK)
}

/// Connects and checks the source against the live table.
async fn claimer(url: &str, source: &SourceArgs, connections: u32) -> anyhow::Result<Claimer> {
    claimer_keeping(url, source, connections, Retention::Keep).await
}

/// [`claimer`], with what becomes of completed jobs of the managed queue.
async fn claimer_keeping(
    url: &str,
    source: &SourceArgs,
    connections: u32,
    completed: Retention,
) -> anyhow::Result<Claimer> {
    let opts = rowclaim::ConnectOptions::default().max_connections(connections.max(2));
    let db = Db::connect_with(url, opts).await?;
    let claimer = match source.target()? {
        Target::Table(table) => db.claimer(*table, source.strategy).await?,
        Target::Queues(queues) => db.queue().claimer_with(&queues, completed).await?,
    };
    Ok(claimer)
}

/// Says on stderr which strategy `auto` chose, for the commands that claim.
fn say_strategy(claimer: &Claimer, asked: rowclaim::Strategy) {
    if asked == rowclaim::Strategy::Auto {
        eprintln!(
            "rowclaim: strategy auto chose {} for {} on {}",
            claimer.strategy(),
            claimer.table_name(),
            claimer.server().description
        );
    }
}

async fn settle<F, Fut>(url: &str, a: &TokenArgs, verb: &str, op: F) -> anyhow::Result<i32>
where
    F: FnOnce(Claimer, Token, Vec<RowId>) -> Fut,
    Fut: std::future::Future<Output = rowclaim::Result<u64>>,
{
    let claimer = claimer(url, &a.source, 2).await?;
    let token: Token = a.token.parse()?;
    let ids = a
        .ids
        .iter()
        .map(|id| claimer.parse_id(id))
        .collect::<rowclaim::Result<Vec<_>>>()?;
    let n = op(claimer, token, ids).await?;
    eprintln!("rowclaim: {verb} {n} row(s)");
    Ok(exit::OK)
}

/// The signals that stop `work`: SIGINT (Ctrl-C), SIGTERM, and SIGHUP (the terminal went
/// away). Listened for before the first claim, so that no early signal kills rowclaim outright.
struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn listen() -> anyhow::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind| signal(kind).context("listening for signals");
        Ok(StopSignals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }

    /// The next signal at least a second after `since`: one within a second is the same event
    /// delivered twice (`timeout(1)` signals rowclaim and then its whole process group).
    async fn next_after(&mut self, since: tokio::time::Instant) {
        loop {
            self.next().await;
            if since.elapsed() >= Duration::from_secs(1) {
                return;
            }
        }
    }
}

/// First signal: drain (stop claiming, let running commands finish within the grace period).
/// Second: stop them now. Third: exit at once.
async fn stop_on_signal(mut signals: StopSignals, stop: rowclaim::Shutdown) {
    signals.next().await;
    eprintln!(
        "rowclaim: stopping: no new claims, rows not started go back, running commands may \
         finish (signal again to stop them now)"
    );
    stop.drain();
    signals.next_after(tokio::time::Instant::now()).await;
    eprintln!("rowclaim: second signal: stopping running commands now and giving their rows back");
    stop.now();
    signals.next_after(tokio::time::Instant::now()).await;
    eprintln!(
        "rowclaim: third signal: exiting at once; unfinished rows come back when their lease ends"
    );
    std::process::exit(exit::INTERRUPTED);
}
