//! The log of what was done through the dashboard: every action, whatever its outcome, logged
//! (tracing, info, on the audit target) and kept for the actions page: in the database's journal
//! (`rowclaim_journal`, kind [`KIND`]), so that a restart keeps it, for [`KEEP_FOR`].
//!
//! An action is written to the journal by a task of its own (the handlers that log stay
//! synchronous), and kept in memory until then: the page shows the journal's actions and those
//! of this dashboard not written yet, so an action shows at once and a failed write loses it
//! from the page only at the next restart (the audit log on stderr has it regardless).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rowclaim::Db;
use rowclaim_bench::AUDIT;
use serde::{Deserialize, Serialize};

/// Actions shown on the actions page (and kept in memory).
const KEEP: usize = 200;

/// How long the journal keeps an action.
pub const KEEP_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

/// The journal's kind of an action.
pub const KIND: &str = "dashboard.action";

/// One action taken (or attempted) through the dashboard.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Action {
    pub at: SystemTime,
    /// Who asked (session name and address).
    pub who: String,
    /// e.g. `retry job`.
    pub what: String,
    /// The job id, or `table row id`.
    pub target: String,
    /// What came of it, e.g. `done`, `no such job in that state`, or the error.
    pub outcome: String,
}

/// An action as the journal keeps it: with an id, so that one read back is not shown twice.
#[derive(Serialize, Deserialize)]
struct Kept {
    id: String,
    #[serde(flatten)]
    action: Action,
}

/// One of this dashboard's latest actions, with the id it is kept under.
struct Mine {
    id: String,
    action: Action,
}

/// The log: the journal, and this dashboard's latest actions.
pub struct ActionLog {
    db: Db,
    mine: Arc<Mutex<VecDeque<Mine>>>,
}

impl ActionLog {
    pub fn new(db: Db) -> ActionLog {
        ActionLog {
            db,
            mine: Arc::default(),
        }
    }

    /// Logs `a` and keeps it: in memory at once, in the journal as soon as it is written.
    pub fn push(&self, a: Action) {
        tracing::info!(
            target: AUDIT,
            who = %a.who,
            action = %a.what,
            target = %a.target,
            outcome = %a.outcome,
            "dashboard action"
        );
        let id = crate::secret::random_hex(16).unwrap_or_else(|_| {
            let at =
                a.at.duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default();
            format!("{}-{}", at.as_nanos(), std::process::id())
        });
        {
            let mut mine = self.mine.lock().unwrap_or_else(PoisonError::into_inner);
            if mine.len() == KEEP {
                mine.pop_front();
            }
            mine.push_back(Mine {
                id: id.clone(),
                action: a.clone(),
            });
        }
        let db = self.db.clone();
        tokio::spawn(async move {
            let body = serde_json::to_value(Kept { id, action: a }).unwrap_or_default();
            if let Err(e) = db.journal_write(KIND, &body).await {
                tracing::warn!("dashboard: an action could not be kept in the database: {e}");
            }
            if let Err(e) = db.journal_prune(KIND, KEEP_FOR).await {
                tracing::debug!("dashboard: pruning old actions: {e}");
            }
        });
    }

    /// The actions, newest first: the journal's, and this dashboard's not written yet (or all
    /// of this dashboard's, when the journal cannot be read).
    pub async fn newest_first(&self) -> Vec<Action> {
        let kept: Vec<Kept> = match self.db.journal_newest(KIND, KEEP_FOR, KEEP).await {
            Ok(notes) => notes
                .into_iter()
                .filter_map(|n| serde_json::from_value(n.body).ok())
                .collect(),
            Err(e) => {
                tracing::warn!("dashboard: the actions kept in the database cannot be read: {e}");
                Vec::new()
            }
        };
        let seen: HashSet<&str> = kept.iter().map(|k| k.id.as_str()).collect();
        let pending: Vec<Action> = {
            let mine = self.mine.lock().unwrap_or_else(PoisonError::into_inner);
            mine.iter()
                .filter(|m| !seen.contains(m.id.as_str()))
                .map(|m| m.action.clone())
                .collect()
        };
        let mut all: Vec<Action> = kept.into_iter().map(|k| k.action).chain(pending).collect();
        all.sort_by_key(|a| std::cmp::Reverse(a.at));
        all.truncate(KEEP);
        all
    }
}
