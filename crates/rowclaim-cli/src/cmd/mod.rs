//! The command line: the global flags, the commands, and which file runs each.
//!
//! One file per command (or family of commands), each holding its flags and what it does:
//! `work`, `claim`, `settle` (complete, fail, release), `extend`, `stats`, `check`, `init`,
//! `enqueue`, `jobs`, `demo` and `bench` (which hands over to the `rowclaim-bench` crate). What
//! several of them share is here ([`claimer`], [`say_strategy`]) and in `source_args.rs` (the
//! table flags).

mod bench;
mod check;
mod claim;
mod completions;
mod dashboard;
mod demo;
mod enqueue;
mod extend;
pub(crate) mod help;
mod init;
mod jobs;
pub(crate) mod queue;
mod schedule;
mod settle;
mod source;
mod source_args;
mod stats;
mod values;
mod work;
pub(crate) mod workers;

use clap::{Parser, Subcommand};
use rowclaim::{Claimer, Db, Retention};

use crate::error::CliError;
use crate::say::say;
use source_args::{SourceArgs, Target};

/// Share the rows of one SQL table between many workers: each row is processed by exactly one of
/// them at a time, and rows of a worker that dies come back when its lease expires.
///
/// Works on PostgreSQL, MySQL 8 / MariaDB 10.6+ and SQLite, on a table you already have: an id
/// column and a status column are all it needs; owner, lease and attempts columns unlock more.
#[derive(Parser, Debug)]
#[command(name = "rowclaim", version, max_term_width = 100)]
pub struct Cli {
    /// Database URL: postgres://user@host/db, mysql://user@host/db (also MariaDB),
    /// sqlite://path/to/file.db. DATABASE_URL may also come from a .env file in the current
    /// directory (the environment wins). Without either: sqlite://rowclaim.db in the current
    /// directory, and rowclaim says so.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true,
          value_hint = clap::ValueHint::Url, help_heading = GLOBAL)]
    pub database: Option<String>,
    /// Print only results and errors: no "strategy auto chose …", progress or summaries.
    #[arg(short, long, global = true, conflicts_with = "verbose", help_heading = GLOBAL)]
    pub quiet: bool,
    /// Log more on stderr (-v: what rowclaim decides, -vv: every retry and the database
    /// driver's own warnings, slow statements included). ROWCLAIM_LOG, a tracing filter such
    /// as "rowclaim=debug,sqlx=warn", overrides -v, -vv and --quiet. Colour only on a
    /// terminal, none under NO_COLOR.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = GLOBAL)]
    pub verbose: u8,
    /// Whether --database was given on the command line (set after parsing).
    #[arg(skip)]
    pub database_given: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Claim rows and run COMMAND once per row: the row as a JSON object on its stdin (for
    /// --queue: the job's payload), its id in $ROWCLAIM_ID and the claim token in
    /// $ROWCLAIM_TOKEN (for --queue also $ROWCLAIM_KIND, $ROWCLAIM_QUEUE, $ROWCLAIM_ATTEMPT).
    /// Exit 0 marks the row done; any other exit fails it (a job is retried with backoff until
    /// its last attempt). COMMAND's stdout and stderr go to this terminal; a failed job keeps
    /// its exit status and the last 2 KiB of its stderr in last_error.
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
    Work(work::WorkArgs),
    /// Claim rows and print them as JSON lines, each with its token: {"token":…,"id":…,"row":{…}}.
    /// Settle them later with complete, fail or release --token. Exits 1 when nothing was claimable.
    Claim(claim::ClaimArgs),
    /// Mark rows a token holds as done.
    Complete(settle::TokenArgs),
    /// Mark rows a token holds as failed.
    Fail(settle::TokenArgs),
    /// Give rows a token holds back: ready to be claimed again.
    Release(settle::TokenArgs),
    /// Push the lease of rows a token holds to now + --lease (by the database's clock).
    Extend(extend::ExtendArgs),
    /// Show rows per status, claimed rows per owner, and expired leases; without a table, the
    /// managed queue's jobs per queue and status, the oldest ready job's wait and the jobs
    /// completed in the last minute.
    Stats(stats::StatsArgs),
    /// Check what claims on a source would meet on the live database, writing nothing: the
    /// strategy auto picks and why; whether the claim's statements find ready rows and rows
    /// whose lease expired through an index (the server's own plan of each; if not, the CREATE
    /// INDEX to run); privileges; a
    /// standby or read-only server; the default isolation; on MySQL/MariaDB the binary log
    /// format (statement-based logging breaks claims), Galera and the lease column's type; the
    /// database's clock against this one. Exits 7 when something makes claims slow, 8 when
    /// something makes them fail or lose exclusivity.
    Check(check::CheckArgs),
    /// Create or migrate the managed job queue (table rowclaim_jobs). Idempotent; safe to run
    /// from several processes at once.
    Init(init::InitArgs),
    /// Look at and change jobs of the managed queue: list, show, retry dead or cancelled jobs,
    /// cancel waiting, ready or running ones, delete them (by id, or every job --queue, --status,
    /// --kind, --older-than or --search match), prune finished ones. show, retry, cancel and
    /// delete exit 1 when there was no such job to show or change.
    #[command(subcommand)]
    Jobs(jobs::JobsCommand),
    /// A queue of the managed queue as a whole: pause it (workers start none of its jobs),
    /// resume it, list the queues with their jobs per state and whether they are paused.
    #[command(subcommand)]
    Queue(queue::QueueCommand),
    /// Schedules of the managed queue: cron expressions (in a time zone) and fixed intervals,
    /// written as [schedule.NAME] tables in rowclaim.toml. `work --queue Q` runs those whose
    /// queue it serves; `schedule run` runs them without a worker; any number of schedulers may
    /// run the same schedules, and each tick is enqueued once. list shows the stored schedules,
    /// forget removes one no scheduler runs any more.
    #[command(subcommand)]
    Schedule(schedule::ScheduleCommand),
    /// The mapping each table's claimers agree on, recorded by the first claim on it: list the
    /// records, replace one when every claimer moves to a new mapping, forget one.
    #[command(subcommand)]
    Source(source::SourceCommand),
    /// The workers the registry lists: every `rowclaim work` and library Worker registers
    /// (host, pid, version, queues or table, started, last heartbeat by the database's clock,
    /// jobs running), heartbeats every third of its lease and is marked stopped when it shuts
    /// down cleanly; one without a heartbeat for its lease is gone. Stopped and gone workers
    /// are listed for a day.
    Workers(workers::WorkersArgs),
    /// Add jobs to the managed queue: one JSON payload as the argument, or JSON lines on stdin
    /// (all or nothing: one malformed line adds none, and the error names its line).
    Enqueue(enqueue::EnqueueArgs),
    /// Measure, on whatever --database points at: `drain` (jobs per second and claim latency;
    /// --plain for the yardstick of a hand-written queue), `latency` (enqueue to start),
    /// `scale` (claim latency as the table grows), `contention` (jobs per second against workers,
    /// per strategy, with an SVG chart). Every run checks its own work and fails loudly if a row
    /// was processed twice or left behind. Use a scratch database: the bench drops and recreates
    /// its tables (rowclaim_bench, rowclaim_plain) and deletes the jobs of the queue "bench".
    #[command(subcommand)]
    Bench(rowclaim_bench::BenchCommand),
    /// Create a SQLite table of jobs and let several workers drain it: shows how many rows each
    /// worker took and checks that no row was processed twice. Needs no server, and takes no
    /// --database (its database is a file of its own; --keep PATH keeps it).
    Demo(demo::DemoArgs),
    /// Serve a web dashboard of the managed queue and the own tables rowclaim has claimed:
    /// counts by status, charts, running jobs and claimed rows with their holders, jobs and rows
    /// one by one. Actions (each confirmed, logged and listed on its actions page; none with
    /// --read-only): pause and resume a queue; retry, cancel or delete a job; give a held row
    /// back. It prints two lines on stdout: the address to open with its login token
    /// (`dashboard at http://127.0.0.1:8080/login?token=…`) and where /metrics is with the
    /// bearer token a scraper presents. Only the login token opens a session; every action
    /// also needs the session's CSRF token; an address that sends 10 wrong tokens waits 5
    /// minutes (429). The session cookie is named after the listen address, so dashboards on
    /// one host keep their own. Plain HTTP, so on a loopback address only, unless
    /// --behind-tls-proxy.
    Dashboard(dashboard::DashboardArgs),
    /// Print a completion script for SHELL on stdout, e.g. `mkdir -p
    /// ~/.local/share/bash-completion/completions && rowclaim completions bash >
    /// ~/.local/share/bash-completion/completions/rowclaim`. Takes no --database.
    Completions(completions::CompletionsArgs),
}

impl Command {
    /// Commands that only look at the database: they must not create a SQLite file.
    fn only_reads(&self) -> bool {
        match self {
            Command::Stats(_)
            | Command::Workers(_)
            | Command::Check(_)
            | Command::Source(source::SourceCommand::List(_))
            | Command::Queue(queue::QueueCommand::List(_))
            | Command::Schedule(schedule::ScheduleCommand::List(_)) => true,
            Command::Jobs(op) => matches!(
                op,
                jobs::JobsCommand::List { .. } | jobs::JobsCommand::Show { .. }
            ),
            _ => false,
        }
    }
}

/// The help heading of the flags every command takes.
const GLOBAL: &str = "Global options";

/// The database when neither --database nor DATABASE_URL names one.
const DEFAULT_DATABASE: &str = "sqlite://rowclaim.db";

/// Runs the command; `Err` says how it failed (and so with which exit code).
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let command = match cli.command {
        Command::Demo(a) => return demo::run(a, cli.database_given).await,
        Command::Completions(a) => return completions::run(a),
        command => command,
    };
    let url = cli.database.unwrap_or_else(|| {
        // A database nobody chose: say which, or a missing table is a riddle.
        let here = std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "the current directory".into());
        say!("no --database or DATABASE_URL; using {DEFAULT_DATABASE} in {here}");
        DEFAULT_DATABASE.to_owned()
    });
    let url = if command.only_reads() {
        only_reading(url)
    } else {
        url
    };
    dispatch(&url, command)
        .await
        .map_err(|e| name_the_database(e, &url))
}

/// Runs a command that works on the database at `url`.
async fn dispatch(url: &str, command: Command) -> Result<(), CliError> {
    match command {
        Command::Work(a) => work::run(url, a).await,
        Command::Claim(a) => claim::run(url, a).await,
        Command::Complete(a) => settle::complete(url, a).await,
        Command::Fail(a) => settle::fail(url, a).await,
        Command::Release(a) => settle::release(url, a).await,
        Command::Extend(a) => extend::run(url, a).await,
        Command::Stats(a) => stats::run(url, a).await,
        Command::Workers(a) => workers::run(url, a).await,
        Command::Check(a) => check::run(url, a).await,
        Command::Init(a) => init::run(url, a).await,
        Command::Jobs(op) => jobs::run(url, op).await,
        Command::Queue(op) => queue::run(url, op).await,
        Command::Source(op) => source::run(url, op).await,
        Command::Schedule(op) => schedule::run(url, op).await,
        Command::Enqueue(a) => enqueue::run(url, a).await,
        Command::Bench(scenario) => bench::run(url, scenario).await,
        Command::Dashboard(a) => dashboard::run(url, a).await,
        Command::Demo(_) | Command::Completions(_) => Ok(()),
    }
}

/// A SQLite URL opened read-only (`mode=ro`), for the commands that only read: a file this user
/// may read but not write can be looked at, nothing is written to one that may be, and a
/// missing one is not created.
fn only_reading(url: String) -> String {
    if !url.starts_with("sqlite:") || url.contains("mode=") {
        return url;
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}mode=ro")
}

/// A missing table is said with the database it was looked for in (its URL without password
/// or parameters): a --database pointing elsewhere is the usual cause. So is a SQLite file's own
/// error (read-only, locked, corrupt): the file is the input it stems from.
fn name_the_database(e: CliError, url: &str) -> CliError {
    let context = match &e {
        CliError::Library(e) if e.kind() == rowclaim::ErrorKind::MissingTable => {
            format!("in {}", shown_url(url))
        }
        // Only a command that reads opens a SQLite file without creating it (`mode=ro`).
        CliError::Library(rowclaim::Error::NoSqliteFile {
            directory_missing: false,
            ..
        }) => "(commands that only read create none: check --database or DATABASE_URL; \
               `rowclaim init` or your own CREATE TABLE makes one)"
            .to_owned(),
        CliError::Library(rowclaim::Error::Database(_)) if url.starts_with("sqlite:") => {
            format!("(database {})", shown_url(url))
        }
        _ => return e,
    };
    match e {
        CliError::Library(source) => CliError::Located {
            source: Box::new(source),
            context,
        },
        e => e,
    }
}

/// `url` as it may be shown: without a password (however malformed the URL) and without the
/// query (which may hold one).
fn shown_url(url: &str) -> String {
    let shown = rowclaim::redacted_url(url);
    // After the userinfo, which the library masked whole (it may hold a `?`).
    let query = shown.find('@').map_or(0, |at| at + 1);
    match shown[query..].find('?') {
        Some(q) => shown[..query + q].to_owned(),
        None => shown,
    }
}

/// Connects and checks the source against the live table, on a pool of `connections`.
async fn claimer(url: &str, source: &SourceArgs, connections: u32) -> Result<Claimer, CliError> {
    let opts = rowclaim::ConnectOptions::default().max_connections(connections.max(2));
    claimer_keeping(url, source, opts, Retention::Keep, &[]).await
}

/// [`claimer`] with pool options, and with what becomes of completed jobs of the managed queue
/// and which kinds of its jobs to claim (all when empty).
async fn claimer_keeping(
    url: &str,
    source: &SourceArgs,
    opts: rowclaim::ConnectOptions,
    completed: Retention,
    kinds: &[String],
) -> Result<Claimer, CliError> {
    let db = Db::connect_with(url, opts).await?;
    let claimer = match source.target()? {
        Target::Table(table) => db.claimer(*table, source.strategy).await?,
        Target::Queues(queues) => db.queue().claimer_of(&queues, kinds, completed).await?,
    };
    Ok(claimer)
}

/// Says on stderr which strategy `auto` chose, for the commands that claim.
fn say_strategy(claimer: &Claimer, asked: rowclaim::Strategy) {
    if asked == rowclaim::Strategy::Auto {
        say!(
            "strategy auto chose {} for {} on {}",
            claimer.strategy(),
            claimer.table_name(),
            claimer.server().description
        );
    }
}

/// One JSON object as one line on stdout: what `--json` prints.
fn print_json_line(value: &serde_json::Value) -> Result<(), CliError> {
    use std::io::Write;
    writeln!(std::io::stdout().lock(), "{value}").map_err(CliError::io("writing to stdout"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn shown_urls_hold_no_password() {
        let shown =
            super::shown_url("postgres://app:s3cret@db:5432/app?password=x&sslmode=require");
        assert_eq!(shown, "postgres://app:***@db:5432/app");
        assert_eq!(
            super::shown_url("postgres//app:s3cret@db/app?x"),
            "postgres//***@db/app"
        );
        assert_eq!(
            super::shown_url("mysql://root@h/test"),
            "mysql://root@h/test"
        );
        assert_eq!(
            super::shown_url("sqlite://rowclaim.db"),
            "sqlite://rowclaim.db"
        );
    }
}
