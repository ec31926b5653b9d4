//! `rowclaim stats`: rows per status of a table, or the managed queue's jobs per queue.

use clap::Args;

use super::source_args::{SourceArgs, Target};
use crate::error::CliError;

#[derive(Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(url: &str, a: StatsArgs) -> Result<(), CliError> {
    if !a.source.given() || !a.source.queues.is_empty() {
        queue_stats(url, a).await
    } else {
        table_stats(url, a).await
    }
}

/// Pretty JSON on stdout.
fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::io("writing the statistics")(e.into()))?;
    println!("{text}");
    Ok(())
}

/// Without a table, or with --queue: the managed queue's jobs per queue and status.
async fn queue_stats(url: &str, a: StatsArgs) -> Result<(), CliError> {
    let db = rowclaim::Db::connect(url).await?;
    let only = (a.source.queues.len() == 1).then(|| a.source.queues[0].as_str());
    let mut stats = db.queue().stats(only).await?;
    if a.source.queues.len() > 1 {
        stats.by_queue.retain(|q, _| a.source.queues.contains(q));
    }
    if a.json {
        return print_json(&stats);
    }
    println!("{:<20} {:<12} {:>10}", "queue", "status", "jobs");
    for (queue, by_status) in &stats.by_queue {
        for (status, n) in by_status {
            let n = stats.shown(queue, status, *n);
            println!("{queue:<20} {status:<12} {n:>10}");
        }
    }
    println!();
    for (queue, by_status) in &stats.by_queue {
        let oldest = stats.oldest_ready_secs.get(queue).copied().unwrap_or(0.0);
        let figure = |name: &str, m: &std::collections::BTreeMap<String, u64>| {
            stats.shown(queue, name, m.get(queue).copied().unwrap_or(0))
        };
        let done = figure("completed_last_minute", &stats.completed_last_minute);
        let retrying = figure("retrying", &stats.retrying);
        let ready = stats.shown(queue, "ready", by_status.get("ready").copied().unwrap_or(0));
        println!(
            "{queue}: {ready} ready ({retrying} of them waiting for a retry), oldest due waits \
             {oldest:.1}s, {done} completed in the last minute"
        );
    }
    if !stats.estimated.is_empty() || !stats.at_least.is_empty() {
        println!(
            "\n≈: the database's estimate; +: at least. Counts stop at {} jobs of a queue and \
             status.",
            rowclaim::COUNT_CAP
        );
    }
    Ok(())
}

/// A table of the user's: rows per status, claimed rows per owner, expired leases.
async fn table_stats(url: &str, a: StatsArgs) -> Result<(), CliError> {
    // Only looks: no table is made, no mapping recorded, so a read-only user can run it.
    let Target::Table(source) = a.source.target()? else {
        return queue_stats(url, a).await;
    };
    let db = rowclaim::Db::connect(url).await?;
    let claimer = db.reader(*source, a.source.strategy).await?;
    let stats = claimer.stats().await?;
    if a.json {
        return print_json(&stats);
    }
    println!(
        "{} on {} (strategy {})",
        claimer.table_name(),
        claimer.server().description,
        claimer.strategy()
    );
    println!("\n  {:<24} {:>10}", "status", "rows");
    for (status, n) in &stats.by_status {
        println!("  {status:<24} {n:>10}");
    }
    if !stats.claimed_by_owner.is_empty() {
        println!("\n  {:<40} {:>10}", "claimed by (token)", "rows");
        for (owner, n) in &stats.claimed_by_owner {
            println!("  {owner:<40} {n:>10}");
        }
    }
    println!("\n  expired leases: {}", stats.expired_leases);
    Ok(())
}
