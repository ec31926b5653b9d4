//! `rowclaim bench scale`: does a claim slow down as the table grows? Claim latency at several
//! table sizes, each table 90% done rows.

use std::time::Instant;

use clap::Args;
use rowclaim::Strategy;
use serde::Serialize;

use crate::error::Result;
use crate::{
    bad, bar, check_failed, claim_loops, print_json, short_count, Load, Summary, Table, Target,
};

pub(crate) const ABOUT: &str = "\
Scale: claim latency with the table at several sizes.

For each of --sizes (smallest first) the rows are made anew with set-based SQL (PostgreSQL
generate_series, MariaDB the sequence engine, MySQL a cross join of digits, SQLite a recursive
CTE), a chunk at a time with progress on stderr, then the planner gets statistics (PostgreSQL
VACUUM ANALYZE, MariaDB/MySQL ANALYZE TABLE, SQLite ANALYZE). 90% of the rows are done and 10%
ready, and the done rows come first: ids 1..=90% are done, the ready ones are the highest ids at
the end, as in a queue that has been running for a while (old work finished, new work behind it).

The rows: the bench's own table rowclaim_bench (id, status, owner, lease_until, attempts, payload,
with the indexes `drain` makes), claimed with --strategy; or, with --queue, jobs of the managed
queue \"bench\" in rowclaim_jobs (completed jobs first, then ready ones; earlier jobs of \"bench\"
are deleted first), which keeps the library's own indexes.

Then --workers workers (one connection each) run --claims claim + complete cycles in all, claiming
--batch rows at a time with the library (Claimer::claim, then Claimer::complete with the token).
A size whose ready rows run out first gets fewer claims (10,000 rows have 1,000 ready rows: 1,000
claims of 1); the table says how many ran.

Reported per size: the claim latency p50 and p99 (the claim call alone) and the ratio of the p50
to the smallest size's p50 (1.0 = no slower as the table grows). The run checks itself: no row was
claimed twice and every claimed row is done (no row left claimed); otherwise it fails with \"bench
FAILED its own check\" and a non-zero exit.";

#[derive(Args, Debug)]
pub struct ScaleArgs {
    /// Table sizes in rows, separated by commas (each at least 10; 90% of the rows are done).
    #[arg(
        long,
        value_name = "N,N,…",
        value_delimiter = ',',
        default_value = "10000,1000000,10000000"
    )]
    sizes: Vec<u64>,
    /// Claim + complete cycles per size (fewer when a size's ready rows run out).
    #[arg(long, value_name = "K", default_value_t = 2000)]
    claims: u64,
    /// Rows per claim.
    #[arg(long, value_name = "B", default_value_t = 1)]
    batch: u32,
    /// Workers claiming at once, each on a connection of its own.
    #[arg(long, value_name = "W", default_value_t = 1)]
    workers: u32,
    /// Strategy for the own table: auto, skip-locked, token, optimistic, lease-table,
    /// transaction [default: auto]. The managed queue picks its own.
    #[arg(long, value_parser = super::strategy_names(), conflicts_with = "queue")]
    strategy: Option<Strategy>,
    /// Fill and claim from the managed queue (rowclaim_jobs, queue "bench") instead of a table of
    /// its own.
    #[arg(long)]
    queue: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ScaleReport {
    scenario: &'static str,
    backend: String,
    target: &'static str,
    strategy: String,
    batch: u32,
    workers: u32,
    done_fraction: f64,
    ready_rows_at: &'static str,
    sizes: Vec<SizeResult>,
}

#[derive(Serialize)]
struct SizeResult {
    rows: u64,
    ready: u64,
    fill_seconds: f64,
    /// Claims that returned rows.
    claims: u64,
    rows_claimed: u64,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
    claim_max_ms: f64,
    /// This size's p50 over the smallest size's p50.
    p50_ratio: f64,
}

pub(crate) async fn run(url: &str, a: ScaleArgs) -> Result<()> {
    if a.claims == 0 || a.batch == 0 || a.workers == 0 {
        return Err(bad("--claims, --batch and --workers must be at least 1"));
    }
    let mut sizes = a.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() {
        return Err(bad("--sizes needs at least one table size"));
    }
    for &n in &sizes {
        if n < 10 || ready_of(n) < u64::from(a.batch) {
            return Err(bad(format!(
                "--sizes: {n} rows have {} ready rows (10%), fewer than one --batch of {}; \
                 use sizes of at least {}",
                ready_of(n),
                a.batch,
                u64::from(a.batch).max(1) * 10
            )));
        }
    }
    let backend = super::server(url).await?;
    let target = Target::from_flags(a.queue, a.strategy.unwrap_or(Strategy::Auto));
    let mut strategy = String::new();
    let mut results: Vec<SizeResult> = Vec::new();
    for &n in &sizes {
        let (ready, done) = (ready_of(n), n - ready_of(n));
        let filling = bar(n, format!("filling {} rows", short_count(n as f64)));
        let t = Instant::now();
        target
            .prepare(url, n, done, &filling, crate::Stats::Fresh)
            .await?;
        let fill_seconds = t.elapsed().as_secs_f64();
        filling.finish_and_clear();
        eprintln!("scale: {n} rows ({ready} ready) filled in {fill_seconds:.1} s",);

        let claims = a.claims.min(ready / u64::from(a.batch));
        let claiming = bar(claims * u64::from(a.batch), format!("claiming ({n} rows)"));
        let load = Load {
            workers: a.workers,
            concurrency: 1,
            batch: a.batch,
            claims: Some(claims),
            async_commit: false,
            completed: rowclaim::Retention::Keep,
        };
        let outcome = claim_loops(url, target, load, &claiming).await?;
        claiming.finish_and_clear();
        strategy = outcome.strategy.clone();

        // Check: no row claimed twice, every claimed row done, none left claimed.
        let twice = outcome.seen.values().filter(|c| **c > 1).count();
        let claimed = outcome.seen.len() as u64;
        let counts = target.counts(url).await?;
        if twice > 0 || counts.claimed > 0 || counts.done != done + claimed {
            return Err(check_failed(format!(
                "{n} rows: {twice} rows claimed twice, {} left claimed, {} done where {} \
                 were done before and {claimed} were claimed",
                counts.claimed, counts.done, done
            )));
        }
        let claims_done = outcome.latencies.len() as u64;
        let s = Summary::of(outcome.latencies);
        let p50_ratio = match results.first() {
            Some(first) if first.claim_p50_ms > 0.0 => s.p50_ms / first.claim_p50_ms,
            _ => 1.0,
        };
        results.push(SizeResult {
            rows: n,
            ready,
            fill_seconds,
            claims: claims_done,
            rows_claimed: claimed,
            claim_p50_ms: s.p50_ms,
            claim_p99_ms: s.p99_ms,
            claim_max_ms: s.max_ms,
            p50_ratio,
        });
    }
    let report = ScaleReport {
        scenario: "scale",
        backend,
        target: target.name(),
        strategy,
        batch: a.batch,
        workers: a.workers,
        done_fraction: 0.9,
        ready_rows_at: "end (highest ids)",
        sizes: results,
    };
    if a.json {
        print_json(&report)?;
    } else {
        println!(
            "{}, {} ({}), batch {}, {} worker(s); 90% of each table done, the ready rows at the end",
            report.backend, report.target, report.strategy, report.batch, report.workers
        );
        let mut t = Table::new(
            [
                "rows",
                "ready",
                "fill",
                "claims",
                "claim p50",
                "claim p99",
                "p50 vs smallest",
            ],
            0,
        );
        for r in &report.sizes {
            t.row(vec![
                r.rows.to_string(),
                r.ready.to_string(),
                format!("{:.1}s", r.fill_seconds),
                r.claims.to_string(),
                format!("{:.3}ms", r.claim_p50_ms),
                format!("{:.3}ms", r.claim_p99_ms),
                format!("{:.2}x", r.p50_ratio),
            ]);
        }
        print!("{}", t.render());
        println!("check: no row claimed twice, every claimed row done");
    }
    Ok(())
}

/// The ready rows of a table of `n`: 10% (the rest, rounded up, is done).
fn ready_of(n: u64) -> u64 {
    n / 10
}
