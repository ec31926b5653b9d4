//! The history behind the charts: the samples of the queue's and the sources' counts, in a ring
//! buffer of bounded length, so a chart shows the last while since the dashboard started (the
//! sampler fills it; the pages read it).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

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
    /// Keeps `s`, dropping the oldest sample when [`KEEP`] are kept.
    pub fn push(&self, s: Sample) {
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
