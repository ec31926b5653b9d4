//! `rowclaim bench contention`: jobs per second against the number of workers, per strategy.

use std::path::PathBuf;

use clap::Args;
use rowclaim::{ConnectOptions, Db, Error, Strategy};
use serde::Serialize;

use crate::error::{Context, Result};
use crate::svg::{Chart, Series};
use crate::{
    bad, bar, check_drained, claim_loops, own_source, print_json, short_count, Load, Table, Target,
};

pub(crate) const ABOUT: &str = "\
Contention: jobs per second against the number of workers, per strategy.

Every cell of the matrix --workers-list × --strategies is one drain (as `bench drain`): the bench
table rowclaim_bench is made anew with --rows ready rows, then that many workers (each on its own
connection, as separate processes) claim --batch rows at a time with the library
(Claimer::claim), complete them (Claimer::complete with the token; the transaction strategy row by
row inside its claim) and claim again until nothing is left. Cells run worker count by worker
count, each strategy in turn.

Default strategies: every one the server allows on a table with owner, lease and attempts
columns: skip-locked (not SQLite), token, optimistic, lease-table and transaction (which keeps a
transaction open per claim; on SQLite one claimer at a time). Strategies the server cannot do are
left out with a note; naming one in --strategies makes that an error. With --queue the cells drain
the managed queue \"bench\" instead, with the strategy it picks.

Output: a table whose rows are the worker counts and whose columns are the strategies, each cell
in jobs per second; --json with every cell (also seconds and claim p50/p99); --svg FILE writes a
line chart (x: workers on a log2 axis, y: jobs per second, one line per strategy). Every cell
checks itself: every row claimed exactly once and none left; otherwise the run fails with \"bench
FAILED its own check\" and a non-zero exit.";

const DEFAULT_STRATEGIES: [Strategy; 5] = [
    Strategy::SkipLocked,
    Strategy::Token,
    Strategy::Optimistic,
    Strategy::LeaseTable,
    Strategy::Transaction,
];

#[derive(Args, Debug)]
pub struct ContentionArgs {
    /// Worker counts, separated by commas.
    #[arg(
        long,
        value_name = "W,W,…",
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64"
    )]
    workers_list: Vec<u32>,
    /// Strategies, separated by commas [default: every strategy this server allows].
    #[arg(
        long,
        value_name = "S,S,…",
        value_delimiter = ',',
        value_parser = super::strategy_names(),
        conflicts_with = "queue"
    )]
    strategies: Vec<Strategy>,
    /// Rows each cell drains.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    rows: u64,
    /// Rows per claim.
    #[arg(long, value_name = "B", default_value_t = 10)]
    batch: u32,
    /// Drain the managed queue (rowclaim_jobs, queue "bench") instead of a table of its own: one
    /// column, with the strategy the queue picks.
    #[arg(long)]
    queue: bool,
    /// Also write the chart as an SVG file here.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ContentionReport {
    scenario: &'static str,
    backend: String,
    target: &'static str,
    rows: u64,
    batch: u32,
    workers_list: Vec<u32>,
    strategies: Vec<String>,
    notes: Vec<String>,
    cells: Vec<Cell>,
    svg: Option<String>,
}

#[derive(Serialize)]
struct Cell {
    strategy: String,
    workers: u32,
    seconds: f64,
    jobs_per_second: f64,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
}

pub(crate) async fn run(url: &str, a: ContentionArgs) -> Result<()> {
    if a.rows == 0 || a.batch == 0 {
        return Err(bad("--rows and --batch must be at least 1"));
    }
    let mut workers = a.workers_list.clone();
    workers.sort_unstable();
    workers.dedup();
    if workers.is_empty() || workers.contains(&0) {
        return Err(bad(
            "--workers-list needs worker counts of at least 1, e.g. 1,2,4,8",
        ));
    }
    let backend = super::server(url).await?;
    let mut notes = Vec::new();
    let filling = bar(a.rows, "filling");
    let targets: Vec<Target> = if a.queue {
        vec![Target::Queue]
    } else {
        // Which strategies can run here: ask the library, on a table that exists.
        Target::Table(Strategy::Auto)
            .prepare(url, a.rows, 0, &filling, crate::Stats::Fresh)
            .await?;
        let explicit = !a.strategies.is_empty();
        let wanted = if explicit {
            a.strategies.clone()
        } else {
            DEFAULT_STRATEGIES.to_vec()
        };
        let db = Db::connect_with(url, ConnectOptions::default().max_connections(2)).await?;
        let mut usable = Vec::new();
        for s in wanted {
            match db.claimer(own_source(), s).await {
                // `auto` counts as what it resolves to, once.
                Ok(c) if usable.contains(&Target::Table(c.strategy())) => {}
                Ok(c) => usable.push(Target::Table(c.strategy())),
                Err(e @ Error::UnsupportedStrategy { .. }) if !explicit => {
                    let note = format!("left out: {e}");
                    // The table repeats it under the results; JSON keeps it in "notes".
                    if a.json {
                        eprintln!("{note}");
                    }
                    notes.push(note);
                }
                Err(e) => return Err(e).context(format!("--strategies: {s}")),
            }
        }
        usable
    };
    filling.finish_and_clear();
    if targets.is_empty() {
        return Err(bad("--strategies: none of them can run on this server"));
    }

    let cells_n = (workers.len() * targets.len()) as u64;
    let progress = bar(cells_n * a.rows, "");
    let mut cells: Vec<Cell> = Vec::new();
    let mut names: Vec<String> = vec![String::new(); targets.len()];
    for &w in &workers {
        for (i, target) in targets.iter().enumerate() {
            let label = match target {
                Target::Table(s) => s.to_string(),
                Target::Queue => "managed queue".into(),
            };
            progress.set_message(format!("{label} × {w} workers: filling"));
            target
                .prepare(
                    url,
                    a.rows,
                    0,
                    &indicatif::ProgressBar::hidden(),
                    crate::Stats::Fresh,
                )
                .await?;
            progress.set_message(format!("{label} × {w} workers"));
            let load = Load {
                workers: w,
                concurrency: 1,
                batch: a.batch,
                claims: None,
                async_commit: false,
                completed: rowclaim::Retention::Keep,
            };
            let outcome = claim_loops(url, *target, load, &progress)
                .await
                .with_context(|| format!("{label} with {w} workers"))?;
            let left = target.left(url).await?;
            check_drained(&outcome.seen, a.rows, left)
                .with_context(|| format!("{label} with {w} workers"))?;
            let name = match target {
                Target::Table(_) => outcome.strategy.clone(),
                Target::Queue => format!("managed queue ({})", outcome.strategy),
            };
            names[i] = name.clone();
            let lat = super::Summary::of(outcome.latencies);
            cells.push(Cell {
                strategy: name,
                workers: w,
                seconds: outcome.seconds,
                jobs_per_second: a.rows as f64 / outcome.seconds,
                claim_p50_ms: lat.p50_ms,
                claim_p99_ms: lat.p99_ms,
            });
        }
    }
    progress.finish_and_clear();

    let target_name = targets.first().map(|t| t.name()).unwrap_or("own table");
    let svg = match &a.svg {
        Some(path) => {
            let chart = Chart {
                title: format!(
                    "{backend}, {target_name}: {} rows, batch {}",
                    short_count(a.rows as f64),
                    a.batch
                ),
                x_label: "workers (log2 scale)".into(),
                y_label: "jobs per second".into(),
                series: names
                    .iter()
                    .map(|n| Series {
                        name: n.clone(),
                        points: cells
                            .iter()
                            .filter(|c| &c.strategy == n)
                            .map(|c| (f64::from(c.workers), c.jobs_per_second))
                            .collect(),
                    })
                    .collect(),
            };
            std::fs::write(path, chart.render())
                .with_context(|| format!("--svg: writing {}", path.display()))?;
            Some(path.display().to_string())
        }
        None => None,
    };
    let report = ContentionReport {
        scenario: "contention",
        backend,
        target: target_name,
        rows: a.rows,
        batch: a.batch,
        workers_list: workers,
        strategies: names,
        notes,
        cells,
        svg,
    };
    if a.json {
        print_json(&report)?;
    } else {
        println!(
            "{}, {}: jobs per second, {} rows per cell, batch {}",
            report.backend, report.target, report.rows, report.batch
        );
        let mut t = Table::new(
            std::iter::once("workers".to_owned()).chain(report.strategies.iter().cloned()),
            0,
        );
        for &w in &report.workers_list {
            let mut row = vec![w.to_string()];
            for name in &report.strategies {
                let cell = report
                    .cells
                    .iter()
                    .find(|c| c.workers == w && &c.strategy == name);
                row.push(cell.map_or("-".into(), |c| format!("{:.0}", c.jobs_per_second)));
            }
            t.row(row);
        }
        print!("{}", t.render());
        for n in &report.notes {
            println!("{n}");
        }
        if let Some(p) = &report.svg {
            println!("chart: {p}");
        }
        println!("check: in every cell every row processed once, none left");
    }
    Ok(())
}
