//! `rowclaim bench drain`: how fast workers drain a table or the managed queue of no-op rows, and
//! the same drain done by a plain client with the minimum SQL (the yardstick).

use clap::Args;
use rowclaim::Strategy;
use serde::Serialize;

use crate::error::Result;
use crate::{
    bad, bar, check_drained, claim_loops, plain, print_json, Load, Summary, Table, Target,
};

pub(crate) const ABOUT: &str = "\
Drain: how fast workers empty a table of no-op rows.

Makes --rows ready rows, starts --workers workers (each with its own pool of --concurrency
connections, like separate processes) that each run --concurrency claim loops: claim --batch rows
with the library (Claimer::claim), complete them all at once (Claimer::complete with the claim's
token), and again, until a claim comes back empty. Connections are opened before the clock starts.

The rows: a table of its own, rowclaim_bench (id, status, owner, lease_until, attempts, payload;
indexes on the ready rows and on the owner, dropped and made anew), claimed with --strategy; or,
with --queue, jobs of the managed queue \"bench\" (its earlier jobs are deleted first).

--plain measures the yardstick instead: the minimum SQL a hand-written queue runs, on the same
server, without rowclaim: table rowclaim_plain (id, status default 'ready', payload) with an index
over the ready rows; each loop claims --batch ids and then DELETEs them.
  PostgreSQL     WITH c AS (SELECT id … WHERE status = 'ready' ORDER BY id LIMIT n
                   FOR UPDATE SKIP LOCKED),
                 u AS (UPDATE … SET status = 'running' FROM c … RETURNING id)
                 SELECT id FROM u;  then DELETE … WHERE id = ANY($1)
  MariaDB/MySQL  BEGIN; SELECT id … WHERE status = 'ready' ORDER BY id LIMIT n
                   FOR UPDATE SKIP LOCKED;
                 UPDATE … SET status = 'running' WHERE id IN (…); COMMIT;
                 then DELETE … WHERE id IN (…)
  SQLite         UPDATE … SET status = 'running' WHERE id IN
                   (SELECT id … WHERE status = 'ready' ORDER BY id LIMIT n) RETURNING id;
                 then DELETE … WHERE id IN (…)  (WAL, busy timeout 10 s)
It runs --workers × --concurrency loops, each on a connection of its own.

Reported: jobs per second (rows / seconds from the first claim to the last completion) and the
claim latency p50 / p99 (claims that returned rows; for --plain the claim statement or
transaction). The run checks itself: every row claimed exactly once and none left (not ready, not
claimed); otherwise it fails with \"bench FAILED its own check\" and a non-zero exit.";

#[derive(Args, Debug)]
pub struct DrainArgs {
    /// Rows (or jobs) to drain.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    rows: u64,
    /// Workers, each with its own pool of connections (as separate processes have).
    #[arg(long, value_name = "W", default_value_t = 8)]
    workers: u32,
    /// Claim loops per worker, sharing that worker's pool of this many connections.
    #[arg(long, value_name = "C", default_value_t = 1)]
    concurrency: u32,
    /// Rows per claim.
    #[arg(long, value_name = "B", default_value_t = 100)]
    batch: u32,
    /// Strategy for the own table: auto, skip-locked, token, optimistic, lease-table,
    /// transaction [default: auto]. The managed queue picks its own.
    #[arg(long, value_parser = super::strategy_names())]
    strategy: Option<Strategy>,
    /// Drain the managed queue (rowclaim_jobs, queue "bench") instead of a table of its own.
    #[arg(long)]
    queue: bool,
    /// The yardstick: the same drain with the minimum SQL of a hand-written queue, no rowclaim.
    #[arg(long, conflicts_with_all = ["queue", "strategy"])]
    plain: bool,
    /// PostgreSQL: claims and settles commit without waiting for the WAL flush
    /// (ConnectOptions::async_commit): a database crash may make jobs run again, never lose them.
    #[arg(long)]
    async_commit: bool,
    /// With --queue: what becomes of completed jobs: keep or delete.
    #[arg(long, value_name = "WHAT", default_value = "keep", value_parser = crate::parse_retention)]
    completed: rowclaim::Retention,
    /// The planner's statistics when the clock starts: fresh (after the fill, PostgreSQL's
    /// VACUUM ANALYZE and a CHECKPOINT; MariaDB/MySQL's and SQLite's ANALYZE) or stale (only
    /// PostgreSQL's CHECKPOINT: what the planner knew before the fill).
    #[arg(long, value_enum, value_name = "WHEN", default_value = "fresh")]
    stats: crate::Stats,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct DrainReport {
    scenario: &'static str,
    backend: String,
    target: String,
    strategy: String,
    rows: u64,
    workers: u32,
    concurrency: u32,
    batch: u32,
    seconds: f64,
    jobs_per_second: f64,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
    async_commit: bool,
    stats: crate::Stats,
}

pub(crate) async fn run(url: &str, a: DrainArgs) -> Result<()> {
    for (flag, v) in [
        ("--rows", a.rows),
        ("--workers", u64::from(a.workers)),
        ("--concurrency", u64::from(a.concurrency)),
        ("--batch", u64::from(a.batch)),
    ] {
        if v == 0 {
            return Err(bad(format!("{flag} must be at least 1")));
        }
    }
    let backend = super::server(url).await?;
    let progress = bar(a.rows, "filling");
    let (target, strategy, outcome, left) = if a.plain {
        plain::create(url, a.rows, &progress, a.stats).await?;
        progress.reset();
        progress.set_message("draining (plain client)");
        let loops = a.workers * a.concurrency;
        let outcome = plain::drain(url, loops, a.batch, &progress).await?;
        let left = plain::left(url).await?;
        ("plain client", "minimum SQL".to_owned(), outcome, left)
    } else {
        let target = Target::from_flags(a.queue, a.strategy.unwrap_or(Strategy::Auto));
        target.prepare(url, a.rows, 0, &progress, a.stats).await?;
        progress.reset();
        progress.set_message("draining");
        let load = Load {
            workers: a.workers,
            concurrency: a.concurrency,
            batch: a.batch,
            claims: None,
            async_commit: a.async_commit,
            completed: a.completed,
        };
        let outcome = claim_loops(url, target, load, &progress).await?;
        let left = target.left(url).await?;
        (target.name(), outcome.strategy.clone(), outcome, left)
    };
    progress.finish_and_clear();
    check_drained(&outcome.seen, a.rows, left)?;
    let lat = Summary::of(outcome.latencies);
    let report = DrainReport {
        scenario: "drain",
        backend,
        target: target.into(),
        strategy,
        rows: a.rows,
        workers: a.workers,
        concurrency: a.concurrency,
        batch: a.batch,
        seconds: outcome.seconds,
        jobs_per_second: a.rows as f64 / outcome.seconds,
        claim_p50_ms: lat.p50_ms,
        claim_p99_ms: lat.p99_ms,
        async_commit: a.async_commit,
        stats: a.stats,
    };
    if a.json {
        print_json(&report)?;
    } else {
        let mut t = Table::new(
            [
                "backend",
                "target",
                "strategy",
                "rows",
                "workers",
                "conc.",
                "batch",
                "jobs/s",
                "claim p50",
                "claim p99",
            ],
            3,
        );
        let r = &report;
        t.row(vec![
            r.backend.clone(),
            r.target.clone(),
            r.strategy.clone(),
            r.rows.to_string(),
            r.workers.to_string(),
            r.concurrency.to_string(),
            r.batch.to_string(),
            format!("{:.0}", r.jobs_per_second),
            format!("{:.2}ms", r.claim_p50_ms),
            format!("{:.2}ms", r.claim_p99_ms),
        ]);
        print!("{}", t.render());
        if r.async_commit {
            println!("claims and settles committed asynchronously (--async-commit)");
        }
        println!("check: every row processed once, none left");
    }
    Ok(())
}
