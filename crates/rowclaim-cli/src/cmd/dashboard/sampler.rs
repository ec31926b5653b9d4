//! The sampler: a task polls the queue's and the sources' counts every few seconds (one cheap
//! statement per queue table and source) into the charts' [`History`](super::history::History).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::history::{QueueSample, Sample, KIND, SPAN};
use super::state::Dashboard;

/// Samples every `every` for as long as the dashboard runs, into the history and the journal
/// (which drops samples older than the charts' span now and then). A failed look (the database
/// away) is skipped, not fatal: the chart shows a gap in time. A journal that cannot be written
/// is said once: the charts then last until the dashboard restarts.
pub async fn run(state: Arc<Dashboard>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut said = false;
    for n in 0u64.. {
        tick.tick().await;
        let s = match sample(&state).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("dashboard: no sample this time: {e}");
                continue;
            }
        };
        let body = serde_json::to_value(&s).unwrap_or_default();
        state.history.push(s);
        if let Err(e) = state.db.journal_write(KIND, &body).await {
            if !std::mem::replace(&mut said, true) {
                tracing::warn!(
                    "dashboard: the charts' history cannot be kept in the database: {e}"
                );
            }
        }
        if n % 12 == 0 {
            if let Err(e) = state.db.journal_prune(KIND, SPAN).await {
                tracing::debug!("dashboard: pruning old samples: {e}");
            }
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
