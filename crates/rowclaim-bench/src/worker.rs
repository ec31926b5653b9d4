//! `rowclaim bench worker`: the path users run. The library `Worker` with a no-op handler, or
//! `rowclaim work` running a command per job, drains the managed queue (or the own table), and
//! the run reports jobs per second with the CPU spent per job by the worker and by the server.

use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Args;
use rowclaim::{ConnectOptions, Db, Strategy, Worker};
use serde::Serialize;

use crate::error::{BenchError, Context, Result};
use crate::{bad, bar, check_failed, print_json, setup, Table, Target};

pub(crate) const ABOUT: &str = "\
Worker: how fast the runtime users run drains no-op jobs.

Makes --jobs ready jobs of the managed queue \"bench\" (or, with --table, rows of rowclaim_bench),
then drains them with one worker: the library Worker with a no-op async handler, in this
process; or, with a COMMAND after --, `rowclaim work --until-empty` as a child process running
COMMAND once per job (e.g. -- true). --concurrency, --prefetch and --batch are the worker's.

Reported: jobs per second (jobs / seconds from the worker's start to its end), the worker's CPU
time per job (this process, or the child and the commands it ran), and the database server's
CPU time per job when the server runs on this machine (the CPU of its processes, read from
/proc before and after), and with the library Worker the seconds from its start, connecting
included, to its first job's handler. The run checks itself: every job completed, each claimed
once.

--hold-snapshot keeps another connection in a REPEATABLE READ transaction, with a snapshot
taken, for the whole drain: the rows the drain deletes or updates cannot be vacuumed or purged
meanwhile, as when a long report runs beside the queue.";

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Jobs to drain.
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    jobs: u64,
    /// Jobs the worker runs at once.
    #[arg(long, value_name = "C", default_value_t = 8)]
    concurrency: u32,
    /// Jobs claimed ahead of the free slots (the worker's --prefetch) [default: the worker's].
    #[arg(long, value_name = "P")]
    prefetch: Option<u32>,
    /// Most jobs per claim statement (the worker's --batch) [default: the worker's].
    #[arg(long, value_name = "B")]
    batch: Option<u32>,
    /// Drain rowclaim_bench (a table of its own) instead of the managed queue.
    #[arg(long)]
    table: bool,
    /// Strategy for --table: auto, skip-locked, token, optimistic, lease-table [default: auto].
    #[arg(long, value_parser = super::strategy_names(), requires = "table")]
    strategy: Option<Strategy>,
    /// PostgreSQL: claims and settles commit without waiting for the WAL flush.
    #[arg(long)]
    async_commit: bool,
    /// Keep a REPEATABLE READ transaction open on another connection for the whole drain.
    #[arg(long)]
    hold_snapshot: bool,
    /// What becomes of completed jobs (the queue only): keep or delete.
    #[arg(long, value_name = "WHAT", default_value = "keep", value_parser = crate::parse_retention)]
    completed: rowclaim::Retention,
    /// Record the worker's metrics in a Prometheus recorder, as `rowclaim work --metrics` does
    /// (for `-- COMMAND`: passes `--metrics 127.0.0.1:0`), to measure what recording costs. The
    /// library Worker's run also checks the recorded completions against its own count.
    #[arg(long)]
    metrics: bool,
    /// The queue only: spread the jobs over K limit keys (round robin), for --key-concurrency.
    #[arg(long, value_name = "K", conflicts_with = "table")]
    keys: Option<u64>,
    /// The queue only: limit it to N jobs at once (`queue limit --concurrency`), so that its
    /// jobs go through the limited claim; lifted afterwards.
    #[arg(long, value_name = "N", conflicts_with = "table")]
    limit_concurrency: Option<u32>,
    /// The queue only: at most N jobs of one limit key at once (`queue limit
    /// --key-concurrency`); lifted afterwards.
    #[arg(long, value_name = "N", conflicts_with = "table")]
    key_concurrency: Option<u32>,
    /// The planner's statistics when the clock starts: fresh (after the fill, PostgreSQL's
    /// VACUUM ANALYZE and a CHECKPOINT; MariaDB/MySQL's and SQLite's ANALYZE) or stale (only
    /// PostgreSQL's CHECKPOINT: what the planner knew before the fill).
    #[arg(long, value_enum, value_name = "WHEN", default_value = "fresh")]
    stats: crate::Stats,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Drain with `rowclaim work` running this command per job, instead of the library Worker.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Serialize)]
struct WorkerReport {
    scenario: &'static str,
    backend: String,
    target: String,
    runner: String,
    jobs: u64,
    concurrency: u32,
    prefetch: Option<u32>,
    batch: Option<u32>,
    seconds: f64,
    /// From the worker's start, its connecting included, to its first job's handler (as
    /// graphile-worker's runner measures from `run()`); `None` for `rowclaim work`.
    seconds_to_first_handler: Option<f64>,
    jobs_per_second: f64,
    worker_cpu_us_per_job: f64,
    server_cpu_us_per_job: Option<f64>,
    /// The worker's peak resident memory (this process with the library Worker; the `work`
    /// child, or the largest command it ran, otherwise).
    peak_rss_mb: f64,
    async_commit: bool,
    hold_snapshot: bool,
    metrics: bool,
    keys: Option<u64>,
    limits: Option<rowclaim::QueueLimits>,
    stats: crate::Stats,
}

/// Spreads the queue's jobs over `--keys` limit keys and sets `--limit-concurrency` and
/// `--key-concurrency` as the queue's limits; the limits set, if any.
async fn limit_queue(url: &str, a: &WorkerArgs) -> Result<Option<rowclaim::QueueLimits>> {
    if let Some(k) = a.keys {
        if k == 0 {
            return Err(bad("--keys must be at least 1"));
        }
        let raw = setup::Raw::connect(url, 1).await?;
        let key = match raw.kind() {
            setup::Kind::MySql => format!("CONCAT('k', id % {k})"),
            _ => format!("'k' || (id % {k})"),
        };
        raw.exec(format!(
            "UPDATE rowclaim_jobs SET limit_key = {key} WHERE queue = '{}'",
            super::QUEUE
        ))
        .await?;
        // The fill's statistics said no job has a key, and the update left a dead version of
        // every job: fresh statistics are gathered again (stale ones stay as they were), or the
        // planner plans the limited claim for a table without keys until autovacuum comes.
        raw.settle("rowclaim_jobs", a.stats).await?;
    }
    let mut limits = rowclaim::QueueLimits::default();
    limits.concurrency = a.limit_concurrency;
    limits.key_concurrency = a.key_concurrency;
    if limits.is_none() {
        return Ok(None);
    }
    Db::connect(url)
        .await?
        .queue()
        .limit(super::QUEUE, &limits)
        .await?;
    Ok(Some(limits))
}

pub(crate) async fn run(setting: &super::Setting, a: WorkerArgs) -> Result<()> {
    let url = setting.url.as_str();
    for (flag, v) in [
        ("--jobs", a.jobs),
        ("--concurrency", u64::from(a.concurrency)),
    ] {
        if v == 0 {
            return Err(bad(format!("{flag} must be at least 1")));
        }
    }
    let backend = super::server(url).await?;
    let target = if a.table {
        Target::Table(a.strategy.unwrap_or(Strategy::Auto))
    } else {
        Target::Queue
    };
    let progress = bar(a.jobs, "filling");
    target.prepare(url, a.jobs, 0, &progress, a.stats).await?;
    progress.finish_and_clear();
    let limits = limit_queue(url, &a).await?;
    let snapshot = if a.hold_snapshot {
        Some(hold_snapshot(url).await?)
    } else {
        None
    };

    let server_before = server_cpu(&backend);
    let (drain, runner) = if a.command.is_empty() {
        let drain = library_worker(url, &a, target).await?;
        (drain, "library Worker, no-op handler".to_owned())
    } else {
        let (seconds, cpu) = work_command(setting, &a).await?;
        let drain = Drain {
            seconds,
            cpu,
            first: None,
        };
        (drain, format!("rowclaim work -- {}", a.command.join(" ")))
    };
    let peak_rss_mb = peak_rss_kb(if a.command.is_empty() {
        nix::sys::resource::UsageWho::RUSAGE_SELF
    } else {
        nix::sys::resource::UsageWho::RUSAGE_CHILDREN
    }) as f64
        / 1024.0;
    let server_after = server_cpu_settled(&backend).await;
    drop(snapshot);
    if limits.is_some() {
        Db::connect(url)
            .await?
            .queue()
            .limit(super::QUEUE, &rowclaim::QueueLimits::default())
            .await?;
    }

    let counts = target.counts(url).await?;
    let deleted = a.completed == rowclaim::Retention::Delete;
    // Deleted jobs leave no row behind: then none may be left, and none was claimed twice
    // (the Worker's own count says it completed them all).
    let (done, claims) = if deleted {
        (counts.done + a.jobs, a.jobs)
    } else {
        (counts.done, claims_made(url, target).await?)
    };
    if done != a.jobs || counts.ready + counts.claimed > 0 || claims != a.jobs {
        return Err(check_failed(format!(
            "{} of {} jobs done, {} left, {claims} claims (each job should be claimed once)",
            done,
            a.jobs,
            counts.ready + counts.claimed
        )));
    }
    let per_job = |cpu: Duration| cpu.as_secs_f64() * 1e6 / a.jobs as f64;
    let report = WorkerReport {
        scenario: "worker",
        backend,
        target: target.name().to_owned(),
        runner,
        jobs: a.jobs,
        concurrency: a.concurrency,
        prefetch: a.prefetch,
        batch: a.batch,
        seconds: drain.seconds,
        seconds_to_first_handler: drain.first,
        jobs_per_second: a.jobs as f64 / drain.seconds,
        worker_cpu_us_per_job: per_job(drain.cpu),
        server_cpu_us_per_job: server_before
            .zip(server_after)
            .map(|(b, e)| per_job(e.saturating_sub(b))),
        peak_rss_mb,
        async_commit: a.async_commit,
        hold_snapshot: a.hold_snapshot,
        metrics: a.metrics,
        keys: a.keys,
        limits,
        stats: a.stats,
    };
    if a.json {
        print_json(&report)?;
        return Ok(());
    }
    println!(
        "{}, {} ({}), {} jobs, concurrency {}{}{}{}{}",
        report.backend,
        report.target,
        report.runner,
        report.jobs,
        report.concurrency,
        a.prefetch
            .map_or(String::new(), |p| format!(", prefetch {p}")),
        a.batch.map_or(String::new(), |b| format!(", batch {b}")),
        if a.hold_snapshot {
            ", a REPEATABLE READ snapshot held"
        } else {
            ""
        },
        if a.metrics { ", metrics recorded" } else { "" }
    );
    let mut t = Table::new(
        [
            "jobs/s",
            "seconds",
            "worker CPU/job",
            "server CPU/job",
            "peak RSS",
            "first job",
        ],
        0,
    );
    t.row(vec![
        format!("{:.0}", report.jobs_per_second),
        format!("{:.2}", report.seconds),
        format!("{:.1} µs", report.worker_cpu_us_per_job),
        report
            .server_cpu_us_per_job
            .map_or("n/a".to_owned(), |us| format!("{us:.1} µs")),
        format!("{:.1} MB", report.peak_rss_mb),
        report
            .seconds_to_first_handler
            .map_or("n/a".to_owned(), |s| format!("{:.0} ms", s * 1000.0)),
    ]);
    print!("{}", t.render());
    Ok(())
}

/// What a drain took.
struct Drain {
    /// From the worker's start (after connecting) to its end.
    seconds: f64,
    /// The worker's CPU.
    cpu: Duration,
    /// From before connecting to the first job's handler.
    first: Option<f64>,
}

/// Drains with the library Worker in this process.
async fn library_worker(url: &str, a: &WorkerArgs, target: Target) -> Result<Drain> {
    let connecting = Instant::now();
    let connections = a.concurrency + a.prefetch.unwrap_or(0).min(16) + 4;
    let opts = ConnectOptions::default()
        .max_connections(connections)
        .async_commit(a.async_commit);
    let db = Db::connect_with(url, opts).await?;
    let claimer = match target {
        Target::Table(s) => db.claimer(super::own_source(), s).await?,
        Target::Queue => {
            db.queue()
                .claimer_with(&[super::QUEUE.to_owned()], a.completed)
                .await?
        }
    };
    let first = std::sync::Arc::new(std::sync::OnceLock::new());
    let first_seen = first.clone();
    let mut worker = Worker::for_claimer(claimer)
        .handle_rows(move |_row| {
            first_seen.get_or_init(Instant::now);
            async { Ok::<_, String>(()) }
        })
        .concurrency(a.concurrency as usize)
        .poll(Duration::from_millis(100))
        .until_empty(true);
    if let Some(p) = a.prefetch {
        worker = worker.prefetch(p as usize);
    }
    if let Some(b) = a.batch {
        worker = worker.batch(b);
    }
    let recorder = if a.metrics {
        Some(crate::prometheus_recorder().map_err(|e| bad(format!("--metrics: {e}")))?)
    } else {
        None
    };
    let cpu = self_cpu();
    let started = Instant::now();
    let report = worker.run(std::future::pending()).await?;
    let seconds = started.elapsed().as_secs_f64();
    if report.completed != a.jobs || report.troubled() > 0 {
        return Err(check_failed(format!(
            "the Worker completed {} of {} jobs: {report:?}",
            report.completed, a.jobs
        )));
    }
    let cpu = self_cpu().saturating_sub(cpu);
    if let Some(recorder) = recorder {
        let recorded = completed_recorded(&recorder.render());
        if recorded != a.jobs as f64 {
            return Err(check_failed(format!(
                "the metrics recorded {recorded} completions of {} jobs",
                a.jobs
            )));
        }
    }
    let first = first
        .get()
        .map(|t| t.duration_since(connecting).as_secs_f64());
    Ok(Drain {
        seconds,
        cpu,
        first,
    })
}

/// The sum of `rowclaim_jobs_completed_total` over its labels, in Prometheus text.
fn completed_recorded(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(rowclaim::metrics::COMPLETED))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Drains with `rowclaim work --until-empty -- COMMAND`; returns the seconds and the CPU of the
/// child and everything it ran.
async fn work_command(setting: &super::Setting, a: &WorkerArgs) -> Result<(f64, Duration)> {
    let mut cmd = tokio::process::Command::new(&setting.rowclaim);
    cmd.arg("--database").arg(&setting.url).arg("work");
    if a.table {
        let s = a.strategy.unwrap_or(Strategy::Auto).to_string();
        cmd.args(["--table", setup::BENCH_TABLE, "--owner-column", "owner"])
            .args([
                "--lease-column",
                "lease_until",
                "--attempts-column",
                "attempts",
            ])
            .args(["--strategy", &s]);
    } else {
        cmd.args(["--queue", super::QUEUE]);
        if a.completed == rowclaim::Retention::Delete {
            cmd.args(["--completed", "delete"]);
        }
    }
    cmd.args(["--until-empty", "--poll", "100ms"])
        .args(["--concurrency", &a.concurrency.to_string()]);
    if let Some(p) = a.prefetch {
        cmd.args(["--prefetch", &p.to_string()]);
    }
    if let Some(b) = a.batch {
        cmd.args(["--batch", &b.to_string()]);
    }
    if a.metrics {
        cmd.args(["--metrics", "127.0.0.1:0"]);
    }
    cmd.arg("--").args(&a.command);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let cpu = children_cpu();
    let started = Instant::now();
    let out = cmd
        .output()
        .await
        .with_context(|| format!("running {} work", setting.rowclaim.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(BenchError::Failed(format!(
            "rowclaim work failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok((seconds, children_cpu().saturating_sub(cpu)))
}

/// How many claims the jobs took in all (the attempts column): each once, in a clean drain.
async fn claims_made(url: &str, target: Target) -> Result<u64> {
    let raw = setup::Raw::connect(url, 1).await?;
    let int = match raw.kind() {
        setup::Kind::MySql => "SIGNED",
        _ => "BIGINT",
    };
    let sql = match target {
        Target::Table(_) => format!(
            "SELECT CAST(COALESCE(SUM(attempts), 0) AS {int}) FROM {}",
            setup::BENCH_TABLE
        ),
        Target::Queue => format!(
            "SELECT CAST(COALESCE(SUM(attempts), 0) AS {int}) FROM rowclaim_jobs \
             WHERE queue = '{}'",
            super::QUEUE
        ),
    };
    let n = raw.int(sql).await?;
    raw.close().await;
    Ok(n.max(0) as u64)
}

/// A connection with a REPEATABLE READ snapshot taken and held until dropped.
async fn hold_snapshot(url: &str) -> Result<setup::Snapshot> {
    setup::Snapshot::take(url).await
}

/// This process's CPU time (user + system) so far.
pub(crate) fn self_cpu() -> Duration {
    rusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
}

/// The CPU time of the children this process has waited for, and of their waited-for children.
pub(crate) fn children_cpu() -> Duration {
    rusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
}

/// The peak resident memory of this process or of its largest waited-for child, in kB.
fn peak_rss_kb(who: nix::sys::resource::UsageWho) -> i64 {
    nix::sys::resource::getrusage(who).map_or(0, |u| u.max_rss())
}

fn rusage(who: nix::sys::resource::UsageWho) -> Duration {
    let Ok(u) = nix::sys::resource::getrusage(who) else {
        return Duration::ZERO;
    };
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    tv(u.user_time()) + tv(u.system_time())
}

/// [`server_cpu`] once the connections that just closed are counted. For a moment after a
/// PostgreSQL backend exits its CPU is in no process's entry: not its own, and not yet the
/// postmaster's, which takes it when it reaps the backend. A reading right after a worker's pool
/// or a `rowclaim work` ended could come back low (graphile-worker's runner read 0 µs per job
/// that way).
/// Only PostgreSQL runs a process per connection; elsewhere the reading is taken at once.
pub(crate) async fn server_cpu_settled(backend: &str) -> Option<Duration> {
    if backend.starts_with("PostgreSQL") {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    server_cpu(backend)
}

/// The CPU time of the database server's processes on this machine (PostgreSQL: every
/// `postgres` process, with what it reaped; MySQL/MariaDB: `mariadbd`/`mysqld`), from /proc;
/// None when none is visible (a remote server, SQLite in this process).
pub(crate) fn server_cpu(backend: &str) -> Option<Duration> {
    let names: &[&str] = if backend.starts_with("PostgreSQL") {
        &["postgres"]
    } else if backend.starts_with("MariaDB") || backend.starts_with("MySQL") {
        &["mariadbd", "mysqld"]
    } else {
        return None;
    };
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)? as f64;
    let mut total = 0u64;
    let mut found = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid … utime(14) stime(15) cutime(16) cstime(17)
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !names.contains(&&stat[open + 1..close]) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let field = |n: usize| {
            fields
                .get(n - 3)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        total += field(14) + field(15) + field(16) + field(17);
        found = true;
    }
    found.then(|| Duration::from_secs_f64(total as f64 / ticks))
}
