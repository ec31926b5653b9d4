//! The history behind the charts: a task polls the queue's and the sources' counts every few
//! seconds (one cheap statement per queue table and source) into a ring buffer of bounded
//! length, so a chart shows the last while since the dashboard started.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use super::server::Dashboard;

/// Samples kept: at one every 5 s, the last hour.
pub const KEEP: usize = 720;

/// One look at the database.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at: SystemTime,
    /// Per managed queue.
    pub queues: BTreeMap<String, QueueSample>,
    /// Per recorded source (its table): rows per status.
    pub sources: BTreeMap<String, BTreeMap<String, u64>>,
}

#[derive(Clone, Debug, Default)]
pub struct QueueSample {
    pub by_status: BTreeMap<String, u64>,
    /// Jobs completed in the minute before the sample, as the database counts them.
    pub completed_last_minute: u64,
    /// How long the oldest due ready job had waited, in seconds.
    pub oldest_wait_secs: f64,
}

/// The ring buffer, shared with the pages.
#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    fn push(&self, s: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() == KEEP {
            samples.pop_front();
        }
        samples.push_back(s);
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.iter().cloned().collect()
    }
}

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
