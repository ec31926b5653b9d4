//! `rowclaim bench latency`: how long a job waits between its enqueue and its start, with a
//! library `Worker` woken by LISTEN/NOTIFY (PostgreSQL) or by polling.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use rowclaim::{ConnectOptions, Db, NewJob, Worker};
use serde::Serialize;
use sqlx::AssertSqlSafe;

use crate::error::{BenchError, Context, Result};
use crate::setup::{self, Kind, Raw};
use crate::{bad, bar, check_failed, lock, ms, print_json, Summary, Table, Target, QUEUE};

pub(crate) const ABOUT: &str = "\
Latency: how long a job waits between its enqueue and the start of its handler.

One task enqueues --jobs single jobs to the managed queue \"bench\" at a fixed --rate (each in its
own transaction, with the library's Queue::enqueue) while a library Worker with --concurrency
slots runs them with no-op handlers. The time of each job is taken right after its enqueue
commits (keyed by the job's id) and again when its handler starts; the difference is its latency.
Reported per wake-up mode: p50, p99 and max in milliseconds, and the enqueue rate reached.

Wake-up modes (--wakeup):
  notify  PostgreSQL only: the Worker LISTENs and every enqueue NOTIFYs, so an idle worker wakes
          at once. Elsewhere it says \"notify: not available on this backend\" and runs poll.
  poll    the Worker looks again every --poll when it found nothing. On PostgreSQL the Worker
          always LISTENs, so for this mode the jobs are inserted with a plain INSERT that sends no
          NOTIFY (the library has no way to enqueue without one): what a worker sees when
          producers do not use rowclaim.
  both    notify, then poll (the default).

The run checks itself: every job started exactly once and all completed; otherwise it fails with
\"bench FAILED its own check\" and a non-zero exit. Earlier jobs of the queue \"bench\" are deleted
before each mode.";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Wakeup {
    Notify,
    Poll,
    Both,
}

#[derive(Args, Debug)]
pub struct LatencyArgs {
    /// Jobs to enqueue per wake-up mode.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    jobs: u64,
    /// Jobs enqueued per second (one at a time, evenly spaced).
    #[arg(long, value_name = "JOBS_PER_S", default_value_t = 200.0)]
    rate: f64,
    /// Jobs the Worker runs at once.
    #[arg(long, value_name = "C", default_value_t = 8)]
    concurrency: u32,
    /// How the idle Worker learns of new jobs.
    #[arg(long, value_enum, default_value_t = Wakeup::Both)]
    wakeup: Wakeup,
    /// The Worker's polling interval (how long it waits when it found nothing), e.g. 1s, 250ms.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// PostgreSQL: claims and settles commit without waiting for the WAL flush
    /// (ConnectOptions::async_commit): a database crash may make jobs run again, never lose them.
    #[arg(long)]
    async_commit: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct LatencyReport {
    scenario: &'static str,
    backend: String,
    target: &'static str,
    strategy: String,
    jobs: u64,
    rate: f64,
    concurrency: u32,
    poll_ms: f64,
    async_commit: bool,
    notes: Vec<String>,
    runs: Vec<ModeRun>,
}

#[derive(Serialize)]
struct ModeRun {
    wakeup: &'static str,
    /// How jobs were enqueued: "Queue::enqueue" or "plain INSERT (no NOTIFY)".
    enqueue: &'static str,
    jobs: u64,
    started: u64,
    completed: u64,
    /// The enqueue rate reached: intervals between the first and the last enqueue's return,
    /// over the seconds between them (none with one job).
    enqueue_rate: Option<f64>,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

pub(crate) async fn run(url: &str, a: LatencyArgs) -> Result<()> {
    if a.jobs == 0 {
        return Err(bad("--jobs must be at least 1"));
    }
    if !(a.rate.is_finite() && a.rate > 0.0) {
        return Err(bad("--rate must be a number of jobs per second above 0"));
    }
    if a.concurrency == 0 {
        return Err(bad("--concurrency must be at least 1"));
    }
    if a.poll.is_zero() {
        return Err(bad("--poll must be longer than zero (e.g. 1s)"));
    }
    let kind = setup::kind(url)?;
    let backend = super::server(url).await?;
    let db = Db::connect_with(url, ConnectOptions::default().max_connections(2)).await?;
    db.queue().init().await?;
    let strategy = db
        .queue()
        .claimer(&[QUEUE.to_owned()])
        .await?
        .strategy()
        .to_string();
    let mut notes = Vec::new();
    let mut modes = match a.wakeup {
        Wakeup::Notify => vec![Wakeup::Notify],
        Wakeup::Poll => vec![Wakeup::Poll],
        Wakeup::Both => vec![Wakeup::Notify, Wakeup::Poll],
    };
    if kind != Kind::Postgres && modes.contains(&Wakeup::Notify) {
        let note = "notify: not available on this backend".to_owned();
        // The table repeats it under the results; JSON keeps it in "notes".
        if a.json {
            eprintln!("{note}");
        }
        notes.push(note);
        modes.retain(|m| *m == Wakeup::Poll);
        if modes.is_empty() {
            modes.push(Wakeup::Poll);
        }
    }
    let mut runs = Vec::new();
    for mode in modes {
        runs.push(one_mode(url, kind, &a, mode).await?);
    }
    let report = LatencyReport {
        scenario: "latency",
        backend,
        target: Target::Queue.name(),
        strategy,
        jobs: a.jobs,
        rate: a.rate,
        concurrency: a.concurrency,
        poll_ms: ms(a.poll),
        async_commit: a.async_commit,
        notes,
        runs,
    };
    if a.json {
        print_json(&report)?;
    } else {
        println!(
            "{}, managed queue ({}), {} jobs at {}/s, Worker concurrency {}, poll {}{}",
            report.backend,
            report.strategy,
            report.jobs,
            report.rate,
            report.concurrency,
            humantime::format_duration(a.poll),
            if a.async_commit { ", async commit" } else { "" }
        );
        let mut t = Table::new(
            [
                "wakeup",
                "enqueue",
                "jobs",
                "enqueued/s",
                "p50",
                "p99",
                "max",
            ],
            2,
        );
        for r in &report.runs {
            t.row(vec![
                r.wakeup.into(),
                r.enqueue.into(),
                r.jobs.to_string(),
                r.enqueue_rate.map_or("-".into(), |r| format!("{r:.0}")),
                format!("{:.2}ms", r.p50_ms),
                format!("{:.2}ms", r.p99_ms),
                format!("{:.2}ms", r.max_ms),
            ]);
        }
        print!("{}", t.render());
        for n in &report.notes {
            println!("{n}");
        }
        println!("check: every job started once and completed");
    }
    Ok(())
}

/// Times of each job: when its enqueue returned, and when its handler started (every start).
#[derive(Default)]
struct Times {
    enqueued: Mutex<HashMap<i64, Instant>>,
    started: Mutex<HashMap<i64, Vec<Instant>>>,
    starts: AtomicU64,
}

async fn one_mode(url: &str, kind: Kind, a: &LatencyArgs, mode: Wakeup) -> Result<ModeRun> {
    let raw = Raw::setup(url).await?;
    setup::clear_queue(&raw).await?;
    // PostgreSQL, poll: a plain INSERT, which sends no NOTIFY.
    let plain_insert = kind == Kind::Postgres && mode == Wakeup::Poll;
    let (wakeup, enqueue) = match mode {
        Wakeup::Notify => ("notify", "Queue::enqueue"),
        _ if plain_insert => ("poll", "plain INSERT (no NOTIFY)"),
        _ => ("poll", "Queue::enqueue"),
    };
    let progress = bar(a.jobs, format!("latency ({wakeup})"));

    // The worker, on a pool of its own: a connection per running job, one to claim, one spare.
    let times = Arc::new(Times::default());
    let wdb = Db::connect_with(
        url,
        ConnectOptions::default()
            .max_connections(a.concurrency + 2)
            .async_commit(a.async_commit),
    )
    .await?;
    let on_start = times.clone();
    let bar_start = progress.clone();
    let worker = Worker::new(&wdb)
        .queue(QUEUE)
        .concurrency(a.concurrency as usize)
        .poll(a.poll)
        .handle_any(move |job| {
            let now = Instant::now();
            lock(&on_start.started).entry(job.id).or_default().push(now);
            on_start.starts.fetch_add(1, Ordering::SeqCst);
            bar_start.inc(1);
            async { Ok::<(), String>(()) }
        });
    // Stop once every job started (the worker then lets them finish), or give up well after the
    // last one should have run (the check below then says what is missing).
    let (jobs, watched) = (a.jobs, times.clone());
    let give_up =
        Duration::from_secs_f64(a.jobs as f64 / a.rate) + a.poll * 10 + Duration::from_secs(30);
    let begun = Instant::now();
    let shutdown = async move {
        while watched.starts.load(Ordering::SeqCst) < jobs && begun.elapsed() < give_up {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let running = tokio::spawn(worker.run(shutdown));
    // Let the worker find the queue empty and start waiting, as an idle worker would be.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let edb = Db::connect_with(url, ConnectOptions::default().max_connections(1)).await?;
    let queue = edb.queue();
    let every = Duration::from_secs_f64(1.0 / a.rate);
    let first = tokio::time::Instant::now();
    // When the first and the last enqueue returned.
    let mut span: (Option<Instant>, Option<Instant>) = (None, None);
    for i in 0..a.jobs {
        tokio::time::sleep_until(first + every.mul_f64(i as f64)).await;
        let id = if plain_insert {
            insert_without_notify(&raw, i).await?
        } else {
            let job = NewJob::new(serde_json::json!({ "i": i })).queue(QUEUE);
            queue.enqueue(&job).await?.id
        };
        let now = Instant::now();
        lock(&times.enqueued).insert(id, now);
        span = (span.0.or(Some(now)), Some(now));
    }
    let enqueue_rate = match span {
        (Some(a), Some(b)) if b > a => Some((jobs - 1) as f64 / (b - a).as_secs_f64()),
        _ => None,
    };
    let report = running
        .await
        .context("the bench worker panicked")?
        .context("the bench worker")?;
    progress.finish_and_clear();

    // Check: every job started exactly once, all completed, none left.
    let enqueued = std::mem::take(&mut *lock(&times.enqueued));
    let started = std::mem::take(&mut *lock(&times.started));
    let twice = started.values().filter(|s| s.len() > 1).count();
    let never = enqueued
        .keys()
        .filter(|id| !started.contains_key(id))
        .count();
    let strangers = started
        .keys()
        .filter(|id| !enqueued.contains_key(id))
        .count();
    let counts = Target::Queue.counts(url).await?;
    let left = counts.ready + counts.claimed;
    if twice > 0
        || never > 0
        || strangers > 0
        || report.completed != a.jobs
        || counts.done != a.jobs
        || left > 0
    {
        return Err(check_failed(format!(
            "{wakeup}: of {} jobs {never} never started, {twice} started twice, {strangers} \
             unknown jobs started, {} completed by the worker ({} in the table), {left} left",
            a.jobs, report.completed, counts.done
        )));
    }
    let waits: Vec<Duration> = enqueued
        .iter()
        .filter_map(|(id, at)| {
            let start = started.get(id)?.first()?;
            // A job can start before its enqueue call has returned: that counts as no wait.
            Some(start.saturating_duration_since(*at))
        })
        .collect();
    let s = Summary::of(waits);
    raw.close().await;
    Ok(ModeRun {
        wakeup,
        enqueue,
        jobs: a.jobs,
        started: started.len() as u64,
        completed: report.completed,
        enqueue_rate,
        p50_ms: s.p50_ms,
        p99_ms: s.p99_ms,
        max_ms: s.max_ms,
    })
}

/// PostgreSQL: one job of the queue `bench` inserted by plain SQL, without `pg_notify`.
async fn insert_without_notify(raw: &Raw, i: u64) -> Result<i64> {
    let Raw::Pg(pool) = raw else {
        return Err(BenchError::Failed(
            "a plain INSERT is only used on PostgreSQL".into(),
        ));
    };
    let sql = format!(
        "INSERT INTO rowclaim_jobs (queue, payload) VALUES ('{QUEUE}', $1::jsonb) RETURNING id"
    );
    Ok(sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(serde_json::json!({ "i": i }).to_string())
        .fetch_one(pool)
        .await?)
}
