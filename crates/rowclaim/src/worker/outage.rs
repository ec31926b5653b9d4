//! Faults as weather: one place that knows whether the database answers, says so once when an
//! outage starts and once when it ends, and tells how long to wait before the next try. A wait
//! for another transaction's lock is not an outage: the database answers, someone else holds
//! what this worker needs. It is said as what it is, and counts no outage.

use std::sync::Mutex;
use std::time::Duration;

pub(crate) use crate::wait::pause;

use tokio::time::Instant;

/// Whether the database answers, as seen by everything a worker sends (claims, heartbeats,
/// results). Shared by all of a worker's tasks.
#[derive(Debug)]
pub(crate) struct Health {
    endpoint: String,
    /// The database is a file of this process (SQLite): there is no network to lose, so a
    /// statement that takes long is waiting for the one write lock.
    local: bool,
    state: Mutex<State>,
    /// Counts each outage as it starts ([`crate::metrics::OUTAGES`]).
    outage_metric: metrics::Counter,
}

#[derive(Debug, Default)]
struct State {
    /// When the current outage began (None: the database answers).
    since: Option<Instant>,
    outages: u64,
    /// The last refusal said, so that a repeated one is not said again.
    refused: Option<String>,
    /// When the current wait for another transaction's lock began (None: not waiting).
    waiting: Option<Instant>,
}

impl Health {
    pub(crate) fn new(endpoint: &str, local: bool, outage_metric: metrics::Counter) -> Health {
        Health {
            endpoint: endpoint.to_owned(),
            local,
            state: Mutex::default(),
            outage_metric,
        }
    }

    /// What to do after `error` while `what`: a connection that could not be had or broke is an
    /// outage ([`Health::unreachable`]); a lock that could not be had in time, a deadlock or a
    /// serialization failure is contention ([`Health::waiting`]); anything else the database
    /// said is a refusal ([`Health::refused`]).
    pub(crate) fn failed(&self, what: &str, error: &crate::error::Error) {
        use crate::error::DbKind;
        if error.is_connection() {
            self.unreachable(what, error);
        } else if matches!(error.db_kind(), Some(DbKind::LockWait | DbKind::Transient)) {
            self.waiting(what, error);
        } else {
            self.refused(what, error);
        }
    }

    /// A statement got no answer in time. On a server that is an outage; on SQLite, which has
    /// no network to lose, it is a wait for the write lock another connection holds.
    pub(crate) fn no_answer(&self, what: &str) {
        if self.local {
            self.waiting(what, &"the write lock is held by another connection");
        } else {
            self.unreachable(what, &"no answer in time");
        }
    }

    /// The database answers, but another transaction holds a lock this worker waited for in
    /// vain (as long as a statement may take): said once per wait, counted as no outage.
    pub(crate) fn waiting(&self, what: &str, why: &dyn std::fmt::Display) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.waiting.is_some() {
            tracing::debug!("{what}: {why} (still waiting for a lock)");
            return;
        }
        s.waiting = Some(Instant::now());
        let one_writer = if self.local {
            " (SQLite has one writer at a time)"
        } else {
            ""
        };
        tracing::warn!(
            "waiting for a lock while {what}: {why}{one_writer}; the database ({}) answers, \
             retrying",
            self.endpoint
        );
    }

    /// The database could not be reached (or did not answer in time). The first failure of an
    /// outage is a warning; later ones are logged at debug level only. Returns how long the
    /// outage has lasted.
    pub(crate) fn unreachable(&self, what: &str, error: &dyn std::fmt::Display) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.since {
            Some(since) => {
                tracing::debug!(
                    "{what}: {error} (database unreachable for {:?})",
                    since.elapsed()
                );
                since.elapsed()
            }
            None => {
                s.since = Some(Instant::now());
                s.outages += 1;
                self.outage_metric.increment(1);
                tracing::warn!(
                    "lost the database ({}) while {what}: {error}; running jobs go on, and \
                     claims, heartbeats and results are retried until it answers",
                    self.endpoint
                );
                Duration::ZERO
            }
        }
    }

    /// The database answered with an error (not a lost connection): said once as a warning,
    /// and again only when it says something else. It is retried like an outage.
    pub(crate) fn refused(&self, what: &str, error: &dyn std::fmt::Display) {
        let text = format!("{what}: {error}");
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.refused.as_deref() == Some(text.as_str()) {
            tracing::debug!("{text} (again; retrying)");
        } else {
            tracing::warn!("the database ({}) refused {text}; retrying", self.endpoint);
            s.refused = Some(text);
        }
    }

    /// A statement went through: if an outage was on, it is over, and that is said once.
    pub(crate) fn answered(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(since) = s.waiting.take() {
            tracing::debug!(
                "the lock came free after {:.1}s",
                since.elapsed().as_secs_f64()
            );
        }
        if let Some(since) = s.since.take() {
            tracing::warn!(
                "the database ({}) answers again after {:.1}s",
                self.endpoint,
                since.elapsed().as_secs_f64()
            );
        }
    }

    /// Claims go through again: a refusal said before may be said again if it comes back.
    pub(crate) fn claims_work(&self) {
        self.answered();
        if let Ok(mut s) = self.state.lock() {
            s.refused = None;
        }
    }

    /// How many outages there were.
    pub(crate) fn outages(&self) -> u64 {
        self.state.lock().map(|s| s.outages).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_one_span() {
        let h = Health::new("PostgreSQL at 127.0.0.1:1", false, metrics::Counter::noop());
        assert_eq!(h.unreachable("claiming", &"refused"), Duration::ZERO);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            h.unreachable("claiming", &"refused"),
            Duration::from_secs(3)
        );
        h.answered();
        // A new failure after an answer starts a new outage.
        assert_eq!(h.unreachable("claiming", &"refused"), Duration::ZERO);
        assert_eq!(h.outages(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_wait_is_no_outage() {
        let h = Health::new("SQLite file x.db", true, metrics::Counter::noop());
        h.no_answer("claiming rows");
        h.no_answer("recording results");
        h.answered();
        assert_eq!(h.outages(), 0, "SQLite: no answer in time is a lock wait");
        let h = Health::new("PostgreSQL at 127.0.0.1:1", false, metrics::Counter::noop());
        h.no_answer("claiming rows");
        assert_eq!(h.outages(), 1, "a server that does not answer is an outage");
    }
}
