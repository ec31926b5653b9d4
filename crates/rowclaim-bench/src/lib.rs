//! `rowclaim bench`: measurements that check their own work.
//!
//! This crate is the bench on its own: `rowclaim bench …` parses [`BenchCommand`] and hands it to
//! [`run`]; the `rowclaim-bench` binary (src/main.rs) does the same without the rest of the
//! command, so the bench's tests need nothing else. Errors are [`BenchError`].
//!
//! Unlike the `rowclaim` library, this one prints: a run's report goes to stdout and its progress
//! bars to stderr, because this library is the body of a command, not something other programs
//! build on.
//!
//! - `drain`: N ready rows, W workers: jobs per second and claim latency (also `--plain`, the same
//!   drain done with the minimum SQL of a hand-written queue, without rowclaim).
//! - `latency`: jobs enqueued one by one at a fixed rate; the time from enqueue to start.
//! - `scale`: claim latency as the table grows (90% of it done rows).
//! - `contention`: throughput against the number of workers, per strategy (table and SVG chart).
//! - `enqueue`: N jobs into the managed queue (library, `rowclaim enqueue`, or plain SQL).
//!
//! The pieces they share live here: the claim loops (the library's `Claimer::claim` and
//! `Claimer::complete`), the self-check, percentiles, progress bars and output. The SQL the bench
//! writes itself (tables, bulk fills) is in `setup.rs`, the plain client's in `plain.rs`.
//!
//! The bench assumes a scratch database: it drops and recreates `rowclaim_bench` and
//! `rowclaim_plain`, and deletes the jobs of the managed queue `bench` before it enqueues its own.

mod contention;
mod drain;
mod enqueue;
mod error;
mod latency;
mod logging;
mod plain;
mod recorder;
mod scale;
mod setup;
mod spawn;
mod svg;
mod worker;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Subcommand;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rowclaim::{Claimer, ConnectOptions, Db, JobFilter, RowId, Source, Strategy};
use serde::Serialize;

pub(crate) use error::{bad, check_failed, Context};
pub use error::{BenchError, Result};
pub use logging::{
    colour, init_logging, init_logging_with, init_quiet_logging, log_filter, ExtraLayer, Gated,
    AUDIT,
};
pub use recorder::prometheus_recorder;
pub use setup::Stats;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// N ready rows, W workers claiming batches of B until none is left: jobs per second and claim
    /// latency. With --plain, the same drain with the minimum SQL of a hand-written queue.
    #[command(long_about = drain::ABOUT)]
    Drain(drain::DrainArgs),
    /// Jobs enqueued one at a time at a fixed rate while a Worker runs them: time from enqueue to
    /// start (p50, p99, max), woken by LISTEN/NOTIFY and by polling.
    #[command(long_about = latency::ABOUT)]
    Latency(latency::LatencyArgs),
    /// Claim latency with the table at several sizes, 90% of it done rows: does a claim slow down
    /// as the table grows?
    #[command(long_about = scale::ABOUT)]
    Scale(scale::ScaleArgs),
    /// Jobs per second against the number of workers, for every strategy: a table, JSON, and an
    /// SVG line chart.
    #[command(long_about = contention::ABOUT)]
    Contention(contention::ContentionArgs),
    /// The path users run: the library Worker (no-op handler) or `rowclaim work -- COMMAND`
    /// drains N jobs: jobs per second, and worker and server CPU per job.
    #[command(long_about = worker::ABOUT)]
    Worker(worker::WorkerArgs),
    /// N jobs into the managed queue: through Queue::enqueue_many, through `rowclaim enqueue`
    /// (JSON lines on stdin), or the yardstick (one INSERT … SELECT of the same rows).
    #[command(long_about = enqueue::ABOUT)]
    Enqueue(enqueue::EnqueueArgs),
    /// The yardstick of a command per job: start COMMAND N times, C at a time, no database.
    #[command(long_about = spawn::ABOUT)]
    Spawn(spawn::SpawnArgs),
}

/// What a bench run needs besides its flags.
#[derive(Clone, Debug)]
pub struct Setting {
    /// The database to measure (`--database`).
    pub url: String,
    /// The `rowclaim` binary, for `bench worker -- COMMAND`, which measures `rowclaim work` as a
    /// child process. `rowclaim bench` passes itself; `rowclaim-bench` looks beside itself.
    pub rowclaim: PathBuf,
}

/// Runs one scenario; its report goes to stdout, progress to stderr. `Ok` means the run passed
/// its own check.
pub async fn run(setting: &Setting, cmd: BenchCommand) -> Result<()> {
    let url = setting.url.as_str();
    match cmd {
        BenchCommand::Drain(a) => drain::run(url, a).await,
        BenchCommand::Latency(a) => latency::run(url, a).await,
        BenchCommand::Scale(a) => scale::run(url, a).await,
        BenchCommand::Contention(a) => contention::run(url, a).await,
        BenchCommand::Worker(a) => worker::run(setting, a).await,
        BenchCommand::Spawn(a) => spawn::run(a).await,
        BenchCommand::Enqueue(a) => enqueue::run(setting, a).await,
    }
}

/// The managed queue the bench enqueues to (its jobs are deleted before each run).
pub(crate) const QUEUE: &str = "bench";

/// The lease of every bench claim: long enough that no bench row is ever claimed twice.
const LEASE: Duration = Duration::from_secs(60);

/// The bench's own table, `rowclaim_bench`, as a source: owner, lease and attempts mapped, so that
/// every strategy can run on it.
pub(crate) fn own_source() -> Source {
    Source::new(setup::BENCH_TABLE)
        .owner_column("owner")
        .lease_column("lease_until")
        .attempts_column("attempts")
}

/// What the claim loops work on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `rowclaim_bench`, claimed with this strategy.
    Table(Strategy),
    /// The managed queue (it picks its own strategy).
    Queue,
}

impl Target {
    pub(crate) fn from_flags(queue: bool, strategy: Strategy) -> Target {
        if queue {
            Target::Queue
        } else {
            Target::Table(strategy)
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Target::Table(_) => "own table",
            Target::Queue => "managed queue",
        }
    }

    /// A claimer of this target on its own pool of `connections`.
    pub(crate) async fn claimer(
        self,
        url: &str,
        connections: u32,
        async_commit: bool,
        completed: rowclaim::Retention,
    ) -> Result<Claimer> {
        let opts = ConnectOptions::default()
            .max_connections(connections)
            .async_commit(async_commit);
        let db = Db::connect_with(url, opts)
            .await
            .context("connecting to the database")?;
        Ok(match self {
            Target::Table(s) => db.claimer(own_source(), s).await?,
            Target::Queue => {
                db.queue()
                    .claimer_with(&[QUEUE.to_owned()], completed)
                    .await?
            }
        })
    }

    /// Rows not yet done: ready, and claimed but not settled.
    pub(crate) async fn left(self, url: &str) -> Result<u64> {
        let counts = self.counts(url).await?;
        Ok(counts.ready + counts.claimed)
    }

    /// Rows (jobs of the queue `bench`) per state, by the library's own exact counts.
    pub(crate) async fn counts(self, url: &str) -> Result<Counts> {
        let db = Db::connect_with(url, ConnectOptions::default().max_connections(2)).await?;
        let get =
            |m: &std::collections::BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
        Ok(match self {
            Target::Table(_) => {
                let stats = db
                    .claimer(own_source(), Strategy::Auto)
                    .await?
                    .stats()
                    .await?;
                let s = &stats.by_status;
                Counts {
                    ready: get(s, "ready"),
                    claimed: get(s, "claimed"),
                    done: get(s, "done"),
                }
            }
            Target::Queue => {
                // Counted exactly: `Queue::stats` stops counting at `COUNT_CAP` and estimates
                // (or, on SQLite, gives a lower bound) above it, and the check needs every job.
                let (queue, of) = (db.queue(), |status| {
                    JobFilter::new().queues([QUEUE]).status(status)
                });
                Counts {
                    ready: queue.count(&of("ready"), None).await?,
                    claimed: queue.count(&of("running"), None).await?,
                    done: queue.count(&of("completed"), None).await?,
                }
            }
        })
    }

    /// Creates the rows to work on: `rows` rows of which the first `done` (the lowest ids) are
    /// done already and the rest ready. The own table is dropped and made anew; the queue `bench`
    /// loses its jobs first. `stats`: the planner's statistics afterwards.
    pub(crate) async fn prepare(
        self,
        url: &str,
        rows: u64,
        done: u64,
        bar: &ProgressBar,
        stats: Stats,
    ) -> Result<()> {
        let raw = setup::Raw::setup(url).await?;
        match self {
            Target::Table(_) => setup::create_bench_table(&raw, rows, done, bar, stats).await?,
            Target::Queue => {
                Db::connect_with(url, ConnectOptions::default().max_connections(2))
                    .await?
                    .queue()
                    .init()
                    .await?;
                setup::fill_queue(&raw, rows, done, bar, stats).await?;
            }
        }
        raw.close().await;
        Ok(())
    }
}

/// Rows per state.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    pub ready: u64,
    pub claimed: u64,
    pub done: u64,
}

/// How the claim loops run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Load {
    /// Workers, each with its own pool of `concurrency` connections (as separate processes).
    pub workers: u32,
    /// Claim loops per worker, sharing its pool and its claimer.
    pub concurrency: u32,
    /// Rows per claim.
    pub batch: u32,
    /// Stop after this many claims in all (else: when a claim comes back empty).
    pub claims: Option<u64>,
    /// PostgreSQL: claims and settles commit without waiting for the WAL flush
    /// (`ConnectOptions::async_commit`).
    pub async_commit: bool,
    /// What becomes of completed jobs of the queue.
    pub completed: rowclaim::Retention,
}

/// What the claim loops did.
pub(crate) struct Outcome {
    /// The strategy the claimers used (what `auto` resolved to).
    pub strategy: String,
    /// From the first claim to the last completion.
    pub seconds: f64,
    /// The duration of every claim that returned rows.
    pub latencies: Vec<Duration>,
    /// How often each row was claimed.
    pub seen: HashMap<RowId, u32>,
}

/// What the claim loops share.
#[derive(Default)]
struct Tally {
    seen: Mutex<HashMap<RowId, u32>>,
    latencies: Mutex<Vec<Duration>>,
}

/// Runs the claim loops of `load` on `target`: each loop claims a batch with `Claimer::claim`,
/// counts its rows and completes them all with `Claimer::complete(token, ids)` (the no-op job;
/// the transaction strategy completes row by row inside its claim). Connections are opened before
/// the clock starts.
pub(crate) async fn claim_loops(
    url: &str,
    target: Target,
    load: Load,
    bar: &ProgressBar,
) -> Result<Outcome> {
    let mut claimers = Vec::new();
    for _ in 0..load.workers {
        claimers.push(
            target
                .claimer(url, load.concurrency, load.async_commit, load.completed)
                .await?,
        );
    }
    let strategy = claimers
        .first()
        .map(|c| c.strategy().to_string())
        .unwrap_or_default();
    let tally = Arc::new(Tally::default());
    let budget = load.claims.map(|n| Arc::new(AtomicU64::new(n)));
    let started = Instant::now();
    let mut loops = Vec::new();
    for claimer in &claimers {
        for _ in 0..load.concurrency {
            let (claimer, tally, budget, bar) =
                (claimer.clone(), tally.clone(), budget.clone(), bar.clone());
            loops.push(tokio::spawn(async move {
                claim_loop(&claimer, load.batch, budget.as_deref(), &tally, &bar).await
            }));
        }
    }
    for l in loops {
        l.await.context("a bench claim loop panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let seen = std::mem::take(&mut *lock(&tally.seen));
    let latencies = std::mem::take(&mut *lock(&tally.latencies));
    Ok(Outcome {
        strategy,
        seconds,
        latencies,
        seen,
    })
}

async fn claim_loop(
    claimer: &Claimer,
    batch: u32,
    budget: Option<&AtomicU64>,
    tally: &Tally,
    bar: &ProgressBar,
) -> rowclaim::Result<()> {
    loop {
        if let Some(b) = budget {
            if b.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_err()
            {
                return Ok(());
            }
        }
        let t = Instant::now();
        let claim = claimer.claim(batch, LEASE).await?;
        let took = t.elapsed();
        if claim.is_empty() {
            return Ok(());
        }
        lock(&tally.latencies).push(took);
        let ids: Vec<RowId> = claim.rows().iter().map(|r| r.id.clone()).collect();
        {
            let mut seen = lock(&tally.seen);
            for id in &ids {
                *seen.entry(id.clone()).or_default() += 1;
            }
        }
        // The no-op job: complete the whole batch at once (fenced by the token). The transaction
        // strategy has no token that works outside its claim: it completes each row in the claim's
        // own transaction, which commits with the last one.
        if claimer.strategy() == Strategy::Transaction {
            for id in &ids {
                claim.complete(id).await?;
            }
        } else {
            claimer.complete(claim.token(), &ids).await?;
        }
        bar.inc(ids.len() as u64);
    }
}

/// Locks a mutex; a loop that panicked while holding it left counts that are still worth reading.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every one of `expected` rows seen exactly once, and `left` rows left undone: the drain check.
pub(crate) fn check_drained(seen: &HashMap<RowId, u32>, expected: u64, left: u64) -> Result<()> {
    let twice = seen.values().filter(|n| **n > 1).count();
    if twice > 0 || left > 0 || seen.len() as u64 != expected {
        return Err(check_failed(format!(
            "{twice} rows processed twice, {left} left, {} of {expected} processed",
            seen.len()
        )));
    }
    Ok(())
}

/// Percentiles of durations, in milliseconds (all zero when there were none).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct Summary {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    pub(crate) fn of(mut d: Vec<Duration>) -> Summary {
        d.sort_unstable();
        let Some(max) = d.last() else {
            return Summary::default();
        };
        let pct = |p: f64| {
            // Nearest rank: the smallest value with at least p of all values at or below it.
            let i = ((d.len() as f64 * p).ceil() as usize).clamp(1, d.len()) - 1;
            ms(d[i])
        };
        Summary {
            p50_ms: pct(0.50),
            p99_ms: pct(0.99),
            max_ms: ms(*max),
        }
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A progress bar on stderr (drawn only when stderr is a terminal).
pub(crate) fn bar(len: u64, msg: impl Into<Cow<'static, str>>) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg:<28} [{bar:32}] {human_pos}/{human_len} {per_sec:>10} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(msg);
    bar
}

/// A table for stdout: the first `left` columns aligned left (text), the rest right (numbers).
pub(crate) struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    left: usize,
}

impl Table {
    pub(crate) fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>, left: usize) -> Table {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
            left,
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub(crate) fn render(&self) -> String {
        let cols = self.headers.len();
        let width = |c: usize| {
            std::iter::once(&self.headers)
                .chain(&self.rows)
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..cols).map(width).collect();
        let mut out = String::new();
        for r in std::iter::once(&self.headers).chain(&self.rows) {
            let cells: Vec<String> = (0..cols)
                .map(|c| {
                    let s = r.get(c).map(String::as_str).unwrap_or("");
                    if c < self.left {
                        format!("{s:<w$}", w = widths[c])
                    } else {
                        format!("{s:>w$}", w = widths[c])
                    }
                })
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}

/// Prints `report` as pretty JSON.
pub(crate) fn print_json(report: &impl Serialize) -> Result<()> {
    // Serialising the bench's own report structs cannot fail; an io::Error keeps it typed.
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::from)?;
    println!("{text}");
    Ok(())
}

/// The server behind `url`, as the library describes it (`PostgreSQL 15.4`).
pub(crate) async fn server(url: &str) -> Result<String> {
    let db = Db::connect_with(url, ConnectOptions::default().max_connections(1))
        .await
        .context("connecting to the database")?;
    Ok(db.server().await?.description)
}

/// `keep` or `delete`, for `--completed`. (The `rowclaim` command parses its own `--completed`
/// the same way; the library's `Retention` has no text form to share.)
pub(crate) fn parse_retention(s: &str) -> std::result::Result<rowclaim::Retention, String> {
    match s {
        "keep" => Ok(rowclaim::Retention::Keep),
        "delete" => Ok(rowclaim::Retention::Delete),
        other => Err(format!("{other:?}: use keep or delete")),
    }
}

/// Parses a strategy for clap.
pub(crate) fn parse_strategy(s: &str) -> std::result::Result<Strategy, String> {
    s.parse::<Strategy>().map_err(|e| e.to_string())
}

/// A strategy by name, for `--strategy`: completion scripts offer the names, not file names.
pub(crate) fn strategy_names() -> impl clap::builder::TypedValueParser<Value = Strategy> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Strategy::ALL.map(Strategy::name))
        .try_map(|s: String| parse_strategy(&s))
}

/// `1.5k`, `20k`, `1.2M`: a count for a chart's axis.
pub(crate) fn short_count(n: f64) -> String {
    let (v, unit) = if n.abs() >= 1e6 {
        (n / 1e6, "M")
    } else if n.abs() >= 1e3 {
        (n / 1e3, "k")
    } else {
        (n, "")
    };
    let s = format!("{v:.1}");
    let s = s.strip_suffix(".0").unwrap_or(&s);
    format!("{s}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Summary::of(d);
        assert_eq!((s.p50_ms, s.p99_ms, s.max_ms), (50.0, 99.0, 100.0));
        let s = Summary::of(vec![Duration::from_millis(7)]);
        assert_eq!((s.p50_ms, s.p99_ms), (7.0, 7.0));
        assert_eq!(Summary::of(vec![]).p50_ms, 0.0);
    }

    #[test]
    fn tables_align() {
        let mut t = Table::new(["name", "n"], 1);
        t.row(vec!["a".into(), "100".into()]);
        t.row(vec!["longer".into(), "2".into()]);
        assert_eq!(t.render(), "name      n\na       100\nlonger    2\n");
    }

    #[test]
    fn short_counts() {
        assert_eq!(short_count(0.0), "0");
        assert_eq!(short_count(1500.0), "1.5k");
        assert_eq!(short_count(20000.0), "20k");
        assert_eq!(short_count(2_500_000.0), "2.5M");
    }
}
