//! The log of what was done through the dashboard: every action, whatever its outcome, logged
//! (tracing, info, on the audit target) and kept for the actions page.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use rowclaim_bench::AUDIT;

/// Actions kept for the actions page.
const KEEP: usize = 200;

/// One action taken (or attempted) through the dashboard.
#[derive(Clone, Debug)]
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

/// The last actions, newest last.
#[derive(Default)]
pub struct ActionLog {
    actions: Mutex<VecDeque<Action>>,
}

impl ActionLog {
    /// Logs `a` and keeps it, dropping the oldest action when [`KEEP`] are kept.
    pub fn push(&self, a: Action) {
        tracing::info!(
            target: AUDIT,
            who = %a.who,
            action = %a.what,
            target = %a.target,
            outcome = %a.outcome,
            "dashboard action"
        );
        let mut actions = self.actions.lock().unwrap_or_else(PoisonError::into_inner);
        if actions.len() == KEEP {
            actions.pop_front();
        }
        actions.push_back(a);
    }

    /// The actions, newest first.
    pub fn newest_first(&self) -> Vec<Action> {
        let actions = self.actions.lock().unwrap_or_else(PoisonError::into_inner);
        actions.iter().rev().cloned().collect()
    }
}
