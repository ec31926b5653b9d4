//! The sampler: a task polls the queue's and the sources' counts every few seconds (one cheap
//! statement per queue table and source) into the charts' [`History`](super::history::History).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::history::{QueueSample, Sample};
use super::state::Dashboard;

/// Samples every `every` for as long as the dashboard runs. A failed look (the database away)
/// is skipped, not fatal: the chart shows a gap in time.
pub async fn run(state: Arc<Dashboard>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match sample(&state).await {
            Ok(s) => state.history.push(s),
            Err(e) => tracing::debug!("dashboard: no sample this time: {e}"),
        }
    }
}

async fn sample(state: &Dashboard) -> rowclaim::Result<Sample> {
    let mut queues = BTreeMap::new();
    // A database without the managed queue simply has none to chart.
    if let Ok(stats) = state.db.queue().stats(None).await {
        for (name, by_status) in stats.by_queue {
            let q = QueueSample {
                completed_last_minute: stats.completed_last_minute.get(&name).copied().unwrap_or(0),
                oldest_wait_secs: stats.oldest_ready_secs.get(&name).copied().unwrap_or(0.0),
                by_status,
            };
            queues.insert(name, q);
        }
    }
    let mut sources = BTreeMap::new();
    for record in state.db.recorded_sources().await? {
        let table = record.table.clone();
        let Ok((_, claimer)) = state.claimer_of(record).await else {
            continue;
        };
        if let Ok(stats) = claimer.stats().await {
            sources.insert(table, stats.by_status);
        }
    }
    Ok(Sample {
        at: SystemTime::now(),
        queues,
        sources,
    })
}
