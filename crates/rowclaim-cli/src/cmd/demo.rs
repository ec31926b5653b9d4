//! `rowclaim demo`: the README's first command. Makes a SQLite table of jobs, lets several workers
//! (each with its own connections, as separate processes would have) drain it, and checks the
//! result: every row processed once, none left.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use rowclaim::{Db, RowId, Source, Strategy};
use sqlx::sqlite::SqlitePool;

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Rows in the demo table.
    #[arg(long, value_name = "N", default_value = "2000", value_parser = super::values::count, allow_hyphen_values = true)]
    rows: u32,
    /// Workers draining it at once.
    #[arg(long, value_name = "N", default_value = "4", value_parser = super::values::count, allow_hyphen_values = true)]
    workers: u32,
    /// Rows each claim takes.
    #[arg(long, value_name = "N", default_value = "10", value_parser = super::values::count, allow_hyphen_values = true)]
    batch: u32,
    /// How rows are claimed (SQLite has no skip-locked).
    #[arg(long, value_name = "S", default_value = "auto",
          value_parser = ["auto", "token", "optimistic", "lease-table", "transaction"])]
    strategy: String,
    /// Keep the demo database at PATH (default: a temporary file, removed afterwards).
    #[arg(long, value_name = "PATH", value_hint = clap::ValueHint::FilePath)]
    keep: Option<PathBuf>,
    /// Refused: the demo makes a database of its own (hidden; it keeps the global --database
    /// out of this command's help; `main` sees whether it was typed).
    #[arg(long, hide = true)]
    #[allow(dead_code)]
    database: Option<String>,
}

pub async fn run(a: DemoArgs, database_given: bool) -> Result<(), CliError> {
    if database_given {
        // The demo drops its own table into the file it makes; it never touches yours.
        let why = "demo makes a SQLite database of its own and takes no --database; use --keep \
                   PATH to keep it";
        return Err(CliError::BadInput(why.into()));
    }
    let strategy: Strategy = a.strategy.parse().map_err(rowclaim::Error::from)?;
    let dir = tempfile::tempdir().map_err(CliError::io("creating a temporary directory"))?;
    let path = a.keep.clone().unwrap_or_else(|| dir.path().join("demo.db"));
    if path.exists() {
        let why = format!("{} exists already; --keep wants a new file", path.display());
        return Err(CliError::BadInput(why));
    }
    let url = format!("sqlite://{}", path.display());
    let db = Db::connect(&url).await?;
    // The demo's own SQL goes through plain sqlx; its errors are sorted as the library's are.
    let setup = SqlitePool::connect(&url).await.map_err(sorted)?;
    sqlx::raw_sql(
        "CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            status TEXT NOT NULL DEFAULT 'ready',
            owner TEXT,
            lease_until INTEGER,
            attempts INTEGER NOT NULL DEFAULT 0,
            payload TEXT NOT NULL);
         CREATE INDEX jobs_status ON jobs (status);",
    )
    .execute(&setup)
    .await
    .map_err(sorted)?;
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
         INSERT INTO jobs (id, payload) SELECT i, 'email #' || i FROM n",
    )
    .bind(i64::from(a.rows))
    .execute(&setup)
    .await
    .map_err(sorted)?;

    let source = Source::new("jobs")
        .owner_column("owner")
        .lease_column("lease_until")
        .attempts_column("attempts");
    let chosen = db.claimer(source.clone(), strategy).await?;
    println!(
        "rowclaim demo: {} ready rows in table jobs ({}), {} workers, strategy {}\n",
        a.rows,
        chosen.server().description,
        a.workers,
        chosen.strategy()
    );

    let seen: Arc<Mutex<HashMap<RowId, u32>>> = Arc::default();
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 1..=a.workers {
        // Each worker opens its own pool: its own connections, as another process would.
        let db = Db::connect(&url).await?;
        let (source, seen, batch) = (source.clone(), seen.clone(), a.batch);
        workers.push(tokio::spawn(async move {
            let claimer = db.claimer(source, strategy).await?;
            let mut mine = 0u64;
            loop {
                let claim = claimer.claim(batch, Duration::from_secs(30)).await?;
                if claim.is_empty() {
                    return Ok::<_, rowclaim::Error>((w, mine));
                }
                for row in claim.rows() {
                    // "Processing": note who ran the row, then complete it.
                    *seen
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(row.id.clone())
                        .or_default() += 1;
                    claim.complete(&row.id).await?;
                    mine += 1;
                }
            }
        }));
    }
    for w in workers {
        let (n, mine) = w.await.map_err(|source| CliError::Panicked {
            what: "a demo worker panicked",
            source,
        })??;
        println!("  worker {n:<3} processed {mine:>6} rows");
    }
    let elapsed = started.elapsed();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let twice = seen.values().filter(|n| **n > 1).count();
    let done: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
        .fetch_one(&setup)
        .await
        .map_err(sorted)?;
    let left = i64::from(a.rows) - done;
    println!(
        "\n  {} rows processed in {:.2?}: {} processed twice, {} left over, {} done in the table",
        seen.len(),
        elapsed,
        twice,
        left,
        done
    );
    setup.close().await;
    if twice > 0 || left != 0 || seen.len() as u32 != a.rows {
        println!("\n  FAILED: the workers did not share the rows exactly once");
        return Err(CliError::DemoFailed(format!(
            "{twice} rows processed twice, {left} left over"
        )));
    }
    println!("\n  Every row was processed by exactly one worker.");
    if let Some(p) = &a.keep {
        println!(
            "  Look around: rowclaim --database sqlite://{} stats --table jobs --owner-column owner --lease-column lease_until",
            p.display()
        );
    }
    Ok(())
}

/// An error of the demo's own SQL, sorted as the library sorts SQLite's.
fn sorted(e: sqlx::Error) -> rowclaim::Error {
    rowclaim::Error::Database(rowclaim::DatabaseError::sqlite(e))
}
