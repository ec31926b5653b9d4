//! `rowclaim work`: claim rows and run a COMMAND per row until stopped (or, with
//! `--until-empty`, until no row is left). The library's worker runtime does the claiming,
//! heartbeats, time limits and outages; `run_command.rs` is the handler that runs the COMMAND,
//! `signals.rs` turns signals into the runtime's drain and stop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use rowclaim::Retention;

use super::source_args::SourceArgs;
use crate::error::CliError;
use crate::prometheus;
use crate::run_command::{self, RunCommand};
use crate::secret::Bearer;
use crate::signals::{stop_on_signal, StopSignals};

#[derive(Args, Debug)]
pub struct WorkArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Rows claimed at once (default: the free slots). Rows beyond the free slots wait, claimed.
    /// A worker that holds nothing claims no more than --concurrency first.
    #[arg(long, value_name = "N", value_parser = super::values::count, allow_hyphen_values = true)]
    batch: Option<u32>,
    /// Rows to claim ahead, beyond the running ones, waiting for a free slot with their leases
    /// renewed; claims then come in batches of about N/2. Default: about a second of work, as
    /// the commands' mean run time says (1 to 2,000 rows); with --strategy transaction, 0.
    #[arg(long, value_name = "N", value_parser = super::values::count_or_zero, allow_hyphen_values = true)]
    prefetch: Option<u32>,
    /// How long a claim holds its rows without a heartbeat, e.g. 30s, 5m (at most 7d).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::values::lease, allow_hyphen_values = true)]
    lease: Duration,
    /// Commands run at once.
    #[arg(long, value_name = "N", default_value = "1", value_parser = super::values::count, allow_hyphen_values = true)]
    concurrency: u32,
    /// Stop a command that runs longer than this and fail its row ("timed out after …"); a
    /// job's own --timeout from enqueue wins. Default: no limit.
    #[arg(long, value_name = "DURATION", value_parser = super::values::duration, allow_hyphen_values = true)]
    timeout: Option<Duration>,
    /// At the first signal, how long running commands may take to finish before they are
    /// stopped and their rows given back.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::values::duration_or_zero, allow_hyphen_values = true)]
    grace: Duration,
    /// How long a stopped command gets between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::values::duration, allow_hyphen_values = true)]
    kill_after: Duration,
    /// A command that exits with 75 (EX_TEMPFAIL) asks to run again later: its row is snoozed
    /// this long, without using an attempt (a managed job's run-at moves on; a row of your own
    /// table, which has no run-at, is ready again at once).
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = super::values::duration, allow_hyphen_values = true)]
    snooze_for: Duration,
    /// Keep at most this many bytes of a command's stdout as its job's output (`jobs show`): a
    /// JSON document as JSON, other text as a string. Its stdout still reaches ours whole. 0
    /// keeps none.
    #[arg(long, value_name = "BYTES", default_value = "65536", value_parser = super::values::count_or_zero, allow_hyphen_values = true)]
    output_limit: u32,
    /// With --queue: what becomes of completed jobs: keep (as `completed`, until `jobs prune`)
    /// or delete.
    #[arg(long, value_name = "WHAT", default_value = "keep", value_parser = retentions())]
    completed: Retention,
    /// With --queue: run only jobs of this kind (repeat, or a comma list, for several). Jobs of
    /// other kinds are left for other workers: they are never claimed.
    #[arg(long = "kind", value_name = "K", value_delimiter = ',')]
    kinds: Vec<String>,
    /// Exit (code 4) once the database has been unreachable this long, e.g. 10m. Default: keep
    /// waiting for it.
    #[arg(long, value_name = "DURATION", value_parser = super::values::duration, allow_hyphen_values = true)]
    give_up_after: Option<Duration>,
    /// Exit 0 once no row is left to work on (none ready, none claimed by a worker that might
    /// still die and give it back). Without it, keep polling for new rows.
    #[arg(long)]
    until_empty: bool,
    /// With --until-empty and --queue: jobs scheduled for later (enqueue --delay/--run-at) are
    /// work left too: wait for them and run them before exiting. Without it, --until-empty
    /// exits when only such jobs are left, and says how many there are and when the next is due.
    #[arg(long, requires = "until_empty")]
    wait_scheduled: bool,
    /// At the end, also print the summary as one JSON object, the last line on stdout.
    ///
    /// {"done":…,"failed":…,"retried":…,"released":…,"lost":…,"cancelled":…,"given_up":…,
    /// "finished_later":…,"unconfirmed":…,"outages":…,"interrupted":…} ("lost": taken by another
    /// worker; "cancelled": jobs cancelled while this worker ran them).
    #[arg(long)]
    json: bool,
    /// How long to wait before looking again when nothing was claimable. With --queue on
    /// PostgreSQL a new job wakes the worker at once (LISTEN/NOTIFY), so this is only a fallback.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = super::values::duration, allow_hyphen_values = true)]
    poll: Duration,
    /// With --queue on PostgreSQL: do not LISTEN for new jobs, only poll.
    #[arg(long, conflicts_with = "listen_database")]
    no_listen: bool,
    /// With --queue on PostgreSQL behind a transaction-mode pooler (pgbouncer=true in
    /// --database): a direct URL of the same database for LISTEN, which cannot pass the pooler.
    /// Without it, idle workers poll (and say so once).
    #[arg(
        long,
        value_name = "URL",
        env = "ROWCLAIM_LISTEN_DATABASE",
        hide_env_values = true
    )]
    listen_database: Option<String>,
    /// Serve Prometheus metrics on this address at /metrics, e.g. 127.0.0.1:9464 (port 0
    /// picks one, and the address is said). The list is in docs/metrics.md.
    ///
    /// This worker's claims, results (per queue and job kind), latencies and in-flight jobs,
    /// plus the queue's (or table's) counts read from the database at most every 5 s. Those
    /// counts are the database's, so of all the workers and dashboards on one database one
    /// exports them (rowclaim_gauges_exporter 1; another takes over when it stops): a sum over
    /// every scrape adds up.
    ///
    /// An address beyond loopback (not 127.0.0.0/8 or ::1) is refused without
    /// --metrics-token-file: the metrics name queues, tables and job kinds.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// With --metrics: answer only requests that send `Authorization: Bearer <token>`, the
    /// token in this file; others get 401. Needed to serve beyond loopback.
    ///
    /// The token is the file's first line, at least 16 characters (e.g. `openssl rand -hex 32 >
    /// PATH`); it is never printed or logged. A Prometheus scrape config sends it with
    /// `authorization: {credentials_file: PATH}`.
    #[arg(long, value_name = "PATH", requires = "metrics")]
    metrics_token_file: Option<PathBuf>,
    /// With --queue: do not run the schedules of the config file (--config) whose jobs go to
    /// the queues served. Without it they run beside the worker, until it starts to stop; any
    /// number of workers may run them, and each tick is enqueued once.
    #[arg(long)]
    no_schedules: bool,
    /// The command to run per row, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND [ARGS]")]
    command: Vec<String>,
}

pub async fn run(url: &str, a: WorkArgs) -> Result<(), CliError> {
    let concurrency = a.concurrency as usize;
    let transaction = a.source.strategy == rowclaim::Strategy::Transaction;
    // A claim of the transaction strategy holds a connection for as long as its rows wait: it
    // claims ahead only when told to.
    let prefetch = a.prefetch.map(|n| n as usize).or(transaction.then_some(0));
    // Connections: results go in batches, so a few beside the running commands serve claims,
    // heartbeats, results and LISTEN; with the transaction strategy each claim holds one for as
    // long as its rows wait.
    let ahead = match prefetch {
        Some(n) if transaction => n,
        Some(n) => n.min(32),
        None => 32,
    };
    let connections = (concurrency + ahead + 3).min(u32::MAX as usize) as u32;
    if a.completed == Retention::Delete && a.source.queues.is_empty() {
        let why = "--completed delete is for jobs of the managed queue (--queue); rows of your \
                   own table are marked done";
        return Err(CliError::BadInput(why.into()));
    }
    if a.wait_scheduled && a.source.queues.is_empty() {
        let why = "--wait-scheduled is for jobs of the managed queue (--queue)";
        return Err(CliError::BadInput(why.into()));
    }
    if !a.kinds.is_empty() && a.source.queues.is_empty() {
        let why = "--kind is for jobs of the managed queue (--queue); narrow the rows of your \
                   own table with --where";
        return Err(CliError::BadInput(why.into()));
    }
    if a.source.config.is_some() && a.source.queues.is_empty() && a.source.source.is_none() {
        let why = "--config is read for --source NAME, or for the schedules of `work --queue`; \
                   this run uses neither";
        return Err(CliError::BadInput(why.into()));
    }
    // Before connecting: a worker that would serve its metrics unguarded claims nothing.
    let metrics = metrics_guard(&a)?;
    // The config file's schedules of the queues served, checked before connecting.
    let schedules = if a.no_schedules || a.source.queues.is_empty() {
        Vec::new()
    } else {
        // ./rowclaim.toml may be missing (no schedules); a file named by --config must exist.
        let named = a.source.config.is_some();
        super::schedule::from_config(a.source.config_file(), &a.source.queues, named)?
    };
    let mut opts = rowclaim::ConnectOptions::default().max_connections(connections.max(2));
    if let Some(listen) = &a.listen_database {
        opts = opts.listen_database(listen.clone());
    }
    let claimer = claimer_waiting(url, &a, opts).await?;
    super::say_strategy(&claimer, a.source.strategy);
    let queue = claimer.db().queue();
    if let Some((addr, bearer)) = metrics {
        let watched = if a.source.queues.is_empty() {
            prometheus::Watched {
                queue: None,
                sources: prometheus::fixed(vec![claimer.clone()]),
            }
        } else {
            prometheus::Watched {
                queue: Some(queue.clone()),
                sources: prometheus::fixed(Vec::new()),
            }
        };
        let endpoint = prometheus::Endpoint::new(claimer.db(), watched)?;
        let bound = prometheus::serve(addr, endpoint, bearer).await?;
        // The file is named, never the token: stderr may be kept in a journal.
        match &a.metrics_token_file {
            Some(path) => crate::say::say!(
                "metrics at http://{bound}/metrics (Authorization: Bearer, the token in {})",
                path.display()
            ),
            None => crate::say::say!("metrics at http://{bound}/metrics"),
        }
    }
    let mut worker = rowclaim::Worker::for_claimer(claimer)
        .handler(RunCommand {
            command: a.command,
            kill_after: a.kill_after,
            snooze_for: a.snooze_for,
            output_limit: a.output_limit as usize,
        })
        .concurrency(concurrency)
        .lease(a.lease)
        .poll(a.poll)
        .grace(a.grace)
        .until_empty(a.until_empty)
        .wait_scheduled(a.wait_scheduled)
        .listen(!a.no_listen);
    if let Some(n) = prefetch {
        worker = worker.prefetch(n);
    }
    if let Some(n) = a.batch {
        worker = worker.batch(n);
    }
    if !schedules.is_empty() {
        crate::say::say!(
            "{}",
            super::schedule::running(&schedules, a.source.config_file())
        );
    }
    for s in schedules {
        worker = worker.schedule(s);
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
    let mut summary = run_command::summary(&report);
    let mut json = run_command::summary_json(&report);
    // What --until-empty leaves behind: jobs not due yet, which it does not wait for.
    if a.until_empty && !a.source.queues.is_empty() && !report.interrupted {
        let later = queue.scheduled(&a.source.queues, &a.kinds).await?;
        if later.jobs > 0 {
            let next = later.next_at_text().unwrap_or_default();
            summary.push_str(&format!(
                "; {} job(s) scheduled later (next at {next}; --wait-scheduled waits for them)",
                later.jobs
            ));
        }
        json["scheduled_later"] = later.jobs.into();
        json["next_scheduled_at"] = later.next_at_text().into();
    }
    if a.json {
        super::print_json_line(&json)?;
    }
    // The summary is said once: as the error's text when the run did not end well.
    if report.interrupted {
        return Err(CliError::Interrupted(summary));
    }
    if a.until_empty && report.troubled() > 0 {
        return Err(CliError::Incomplete(summary));
    }
    crate::say::say!("{summary}");
    Ok(())
}

/// `--metrics`' address and the token that guards it, read before connecting. Without a token
/// only loopback is served: the metrics name tables, queues and job kinds, which are not for
/// whoever can reach the port.
fn metrics_guard(a: &WorkArgs) -> Result<Option<(SocketAddr, Option<Bearer>)>, CliError> {
    let Some(addr) = a.metrics else {
        return Ok(None);
    };
    let bearer = match &a.metrics_token_file {
        Some(path) => Some(Bearer::from_file(path, "--metrics-token-file")?),
        None if addr.ip().is_loopback() => None,
        None => {
            return Err(CliError::BadInput(format!(
                "--metrics {addr}: not a loopback address, and without --metrics-token-file \
                 anyone who can reach it reads the metrics; give --metrics-token-file PATH (a \
                 file holding the token scrapers send as `Authorization: Bearer <token>`), or \
                 serve on 127.0.0.1 (or ::1)"
            )))
        }
    };
    Ok(Some((addr, bearer)))
}

/// Connects and checks the source; a server that cannot be reached is waited for as the
/// worker waits out an outage (said once; tried again after 100 ms, doubling up to 5 s), until
/// --give-up-after has passed.
async fn claimer_waiting(
    url: &str,
    a: &WorkArgs,
    opts: rowclaim::ConnectOptions,
) -> Result<rowclaim::Claimer, CliError> {
    let since = std::time::Instant::now();
    let mut pause = Duration::from_millis(100);
    let mut said = false;
    loop {
        let tried = super::claimer_keeping(url, &a.source, opts.clone(), a.completed, &a.kinds);
        let e = match tried.await {
            Err(CliError::Library(e)) if e.is_unreachable() => e,
            other => return other,
        };
        let lasted = since.elapsed();
        if a.give_up_after.is_some_and(|limit| lasted >= limit) {
            let last = e.to_string();
            return Err(rowclaim::Error::GaveUp { lasted, last }.into());
        }
        if !said {
            crate::say::say!("{e}; waiting for the database (--give-up-after sets how long)");
            said = true;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// `keep` or `delete`, for `--completed` (which completion scripts offer).
fn retentions() -> impl clap::builder::TypedValueParser<Value = Retention> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(["keep", "delete"])
        .try_map(|s: String| parse_retention(&s))
}

/// `keep` or `delete`, for `--completed`.
fn parse_retention(s: &str) -> Result<Retention, String> {
    match s {
        "keep" => Ok(Retention::Keep),
        "delete" => Ok(Retention::Delete),
        other => Err(format!("{other:?}: use keep or delete")),
    }
}
