//! `rowclaim bench drain`: how fast workers drain a table or the managed queue of no-op rows,
//! with the claim latency, checking its own work (no row twice, none left).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use rowclaim::{Db, NewJob, RowId, Source, Strategy};
use serde::Serialize;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// N ready rows, W workers claiming batches of B: jobs per second and claim latency.
    Drain(DrainArgs),
}

#[derive(Args, Debug)]
pub struct DrainArgs {
    /// Rows (or jobs) to drain.
    #[arg(long, default_value_t = 100_000)]
    rows: u32,
    /// Workers, each with its own connections.
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Rows per claim.
    #[arg(long, default_value_t = 100)]
    batch: u32,
    /// Strategy for the own-table run (the managed queue picks its own).
    #[arg(long, default_value = "auto", value_parser = |s: &str| s.parse::<Strategy>().map_err(|e| e.to_string()))]
    strategy: Strategy,
    /// Drain the managed queue (rowclaim_jobs, queue "bench") instead of a table of its own.
    #[arg(long)]
    queue: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct DrainReport {
    backend: String,
    target: String,
    strategy: String,
    rows: u32,
    workers: u32,
    batch: u32,
    seconds: f64,
    jobs_per_second: f64,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
}

pub async fn run(url: &str, cmd: BenchCommand) -> anyhow::Result<i32> {
    let BenchCommand::Drain(a) = cmd;
    if a.rows == 0 || a.workers == 0 || a.batch == 0 {
        bail!(crate::BadInput(
            "--rows, --workers and --batch must be at least 1".into()
        ));
    }
    let db = Db::connect(url)
        .await
        .context("connecting to the database")?;
    let server = db.server().await?.description;
    let source = Source::new("rowclaim_bench")
        .owner_column("owner")
        .lease_column("lease_until")
        .attempts_column("attempts");
    if a.queue {
        db.queue().init().await?;
        let jobs: Vec<NewJob> = (0..a.rows)
            .map(|i| NewJob::new(serde_json::json!({ "i": i })).queue("bench"))
            .collect();
        db.queue().enqueue_many(&jobs).await?;
    } else {
        create_table(url, a.rows).await?;
    }

    let seen: Arc<Mutex<HashMap<RowId, u32>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let progress = indicatif::ProgressBar::new(u64::from(a.rows));
    progress.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let mut strategy_used = String::new();
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..a.workers {
        let opts = rowclaim::ConnectOptions::default().max_connections(2);
        let wdb = Db::connect_with(url, opts).await?;
        let claimer = if a.queue {
            wdb.queue().claimer(&["bench".to_owned()]).await?
        } else {
            wdb.claimer(source.clone(), a.strategy).await?
        };
        strategy_used = claimer.strategy().to_string();
        let (seen, latencies, progress, batch) =
            (seen.clone(), latencies.clone(), progress.clone(), a.batch);
        workers.push(tokio::spawn(async move {
            loop {
                let t = Instant::now();
                let claim = claimer.claim(batch, Duration::from_secs(60)).await?;
                latencies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(t.elapsed());
                if claim.is_empty() {
                    return Ok::<_, rowclaim::Error>(());
                }
                let ids: Vec<RowId> = claim.rows().iter().map(|r| r.id.clone()).collect();
                {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    for id in &ids {
                        *seen.entry(id.clone()).or_default() += 1;
                    }
                }
                // The no-op job: complete the whole batch at once (fenced by the token).
                if strategy_is_transaction(&claimer) {
                    for id in &ids {
                        claim.complete(id).await?;
                    }
                } else {
                    claimer.complete(claim.token(), &ids).await?;
                }
                progress.inc(ids.len() as u64);
            }
        }));
    }
    for w in workers {
        w.await.context("bench worker panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    progress.finish_and_clear();

    // Check our own work: every row once, none left.
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let twice = seen.values().filter(|n| **n > 1).count();
    let verify = Db::connect(url).await?;
    let left = if a.queue {
        let stats = verify.queue().stats(Some("bench")).await?;
        let by = stats.by_queue.get("bench").cloned().unwrap_or_default();
        by.get("ready").copied().unwrap_or(0) + by.get("running").copied().unwrap_or(0)
    } else {
        let backlog = verify
            .claimer(source, Strategy::Auto)
            .await?
            .backlog()
            .await?;
        backlog.ready + backlog.claimed
    };
    if twice > 0 || left > 0 || seen.len() != a.rows as usize {
        bail!(
            "bench FAILED its own check: {twice} rows processed twice, {left} left, {} of {} processed",
            seen.len(),
            a.rows
        );
    }
    let mut lat = latencies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    lat.sort();
    let pct = |p: f64| {
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i].as_secs_f64() * 1000.0
    };
    let report = DrainReport {
        backend: server,
        target: if a.queue {
            "managed queue"
        } else {
            "own table"
        }
        .into(),
        strategy: strategy_used,
        rows: a.rows,
        workers: a.workers,
        batch: a.batch,
        seconds,
        jobs_per_second: f64::from(a.rows) / seconds,
        claim_p50_ms: pct(0.50),
        claim_p99_ms: pct(0.99),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{:<24} {:<14} {:<12} {:>9} {:>7} {:>6} {:>12} {:>10} {:>10}",
            "backend",
            "target",
            "strategy",
            "rows",
            "workers",
            "batch",
            "jobs/s",
            "claim p50",
            "claim p99"
        );
        println!(
            "{:<24} {:<14} {:<12} {:>9} {:>7} {:>6} {:>12.0} {:>8.2}ms {:>8.2}ms",
            report.backend,
            report.target,
            report.strategy,
            report.rows,
            report.workers,
            report.batch,
            report.jobs_per_second,
            report.claim_p50_ms,
            report.claim_p99_ms
        );
        println!("check: every row processed once, none left");
    }
    Ok(crate::exit::OK)
}

fn strategy_is_transaction(c: &rowclaim::Claimer) -> bool {
    c.strategy() == Strategy::Transaction
}

/// (Re)creates `rowclaim_bench` with `rows` ready rows, in the backend's own types.
async fn create_table(url: &str, rows: u32) -> anyhow::Result<()> {
    let n = i64::from(rows);
    match url.split(':').next().unwrap_or_default() {
        "postgres" | "postgresql" => {
            let pool = sqlx::PgPool::connect(url).await?;
            sqlx::raw_sql(
                "DROP TABLE IF EXISTS rowclaim_bench;
                 CREATE TABLE rowclaim_bench (id bigint PRIMARY KEY, status text NOT NULL,
                   owner text, lease_until timestamptz, attempts int NOT NULL DEFAULT 0,
                   payload jsonb NOT NULL DEFAULT '{}');
                 CREATE INDEX rowclaim_bench_ready ON rowclaim_bench (id) WHERE status = 'ready';
                 CREATE INDEX rowclaim_bench_owner ON rowclaim_bench (owner) WHERE status = 'claimed';",
            )
            .execute(&pool)
            .await?;
            sqlx::query(
                "INSERT INTO rowclaim_bench (id, status) SELECT i, 'ready' FROM generate_series(1, $1) i",
            )
            .bind(n)
            .execute(&pool)
            .await?;
            sqlx::raw_sql("VACUUM ANALYZE rowclaim_bench")
                .execute(&pool)
                .await?;
        }
        "mysql" | "mariadb" => {
            let pool = sqlx::MySqlPool::connect(&url.replacen("mariadb:", "mysql:", 1)).await?;
            sqlx::raw_sql(
                "DROP TABLE IF EXISTS rowclaim_bench;
                 CREATE TABLE rowclaim_bench (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL,
                   owner VARCHAR(36), lease_until DATETIME(6), attempts INT NOT NULL DEFAULT 0,
                   payload TEXT, KEY (status, id), KEY (owner)) ENGINE=InnoDB",
            )
            .execute(&pool)
            .await?;
            let mut start = 1;
            while start <= n {
                let end = (start + 9_999).min(n);
                let values: Vec<String> = (start..=end).map(|i| format!("({i},'ready')")).collect();
                let sql = format!(
                    "INSERT INTO rowclaim_bench (id, status) VALUES {}",
                    values.join(",")
                );
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                    .execute(&pool)
                    .await?;
                start = end + 1;
            }
        }
        _ => {
            let db = Db::connect(url).await?; // creates the file, in WAL mode
            drop(db);
            let pool = sqlx::SqlitePool::connect(url).await?;
            sqlx::raw_sql(
                "DROP TABLE IF EXISTS rowclaim_bench;
                 CREATE TABLE rowclaim_bench (id INTEGER PRIMARY KEY, status TEXT NOT NULL,
                   owner TEXT, lease_until INTEGER, attempts INTEGER NOT NULL DEFAULT 0, payload TEXT);
                 CREATE INDEX rowclaim_bench_ready ON rowclaim_bench (status, id);
                 CREATE INDEX rowclaim_bench_owner ON rowclaim_bench (owner);",
            )
            .execute(&pool)
            .await?;
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
                 INSERT INTO rowclaim_bench (id, status) SELECT i, 'ready' FROM n",
            )
            .bind(n)
            .execute(&pool)
            .await?;
        }
    }
    Ok(())
}
