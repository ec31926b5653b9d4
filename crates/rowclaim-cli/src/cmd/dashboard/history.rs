//! The history behind the charts: the samples of the queue's and the sources' counts, kept in the
//! database's journal (`rowclaim_journal`, kind [`KIND`]) so that a restart keeps them, and in a
//! ring buffer of bounded length, which the pages read. The sampler fills both; a dashboard
//! starts with the samples of the last [`SPAN`] read back ([`History::load`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rowclaim::Db;
use serde::{Deserialize, Serialize};

/// Samples kept: at one every 5 s, the last hour.
pub const KEEP: usize = 720;

/// How far back the charts look, and how long the journal keeps a sample.
pub const SPAN: Duration = Duration::from_secs(3600);

/// The journal's kind of a sample.
pub const KIND: &str = "dashboard.sample";

/// One look at the database.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sample {
    pub at: SystemTime,
    /// Per managed queue.
    pub queues: BTreeMap<String, QueueSample>,
    /// Per recorded source (its table): rows per status.
    pub sources: BTreeMap<String, BTreeMap<String, u64>>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
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
    /// The samples the journal keeps of the last [`SPAN`] (none when it cannot be read: the
    /// charts then start empty, as they did before the journal).
    pub async fn load(db: &Db) -> History {
        let history = History::default();
        match db.journal_newest(KIND, SPAN, KEEP).await {
            Ok(notes) => {
                // Newest first from the journal; the ring holds them oldest first.
                for note in notes.into_iter().rev() {
                    match serde_json::from_value::<Sample>(note.body) {
                        Ok(s) => history.push(s),
                        Err(e) => tracing::debug!("dashboard: a stored sample skipped: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("dashboard: the charts' history cannot be read back: {e}"),
        }
        history
    }

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
