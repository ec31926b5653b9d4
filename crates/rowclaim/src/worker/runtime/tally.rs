//! The worker's report: one count per way a row can end, each also recorded as its metric (a
//! job's outcome in the series of its queue and kind).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::lease::Lease;
use crate::id::RowId;
use crate::metrics::{JobSeries, WorkerMetrics};
use crate::worker::WorkerReport;

/// The most ids of rows let go that a worker keeps to look at when it ends (one look each, within
/// one claim's time limit). Past that, the rest count as not known to have ended well.
const LET_GO_KEPT: usize = 1_000;

/// One count of the worker's report, also recorded as its metric (and, for a failed attempt
/// of a job, as a failed run too).
pub(super) struct Count {
    n: Arc<AtomicU64>,
    metric: metrics::Counter,
    failed_too: Option<metrics::Counter>,
}

impl Count {
    fn new(metric: &metrics::Counter) -> Count {
        Count {
            n: Arc::default(),
            metric: metric.clone(),
            failed_too: None,
        }
    }

    /// This count, recorded as `metric` (and `failed_too`).
    fn as_metric(&self, metric: &metrics::Counter, failed_too: Option<&metrics::Counter>) -> Count {
        Count {
            n: self.n.clone(),
            metric: metric.clone(),
            failed_too: failed_too.cloned(),
        }
    }

    pub(super) fn add(&self, k: u64) {
        self.n.fetch_add(k, Ordering::Relaxed);
        self.metric.increment(k);
        if let Some(failed) = &self.failed_too {
            failed.increment(k);
        }
    }

    pub(super) fn get(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }
}

pub(super) struct Tally {
    pub(super) completed: Count,
    pub(super) retried: Count,
    pub(super) failed: Count,
    pub(super) dead: Count,
    pub(super) released: Count,
    pub(super) snoozed: Count,
    pub(super) lost: Count,
    pub(super) given_up: Count,
    pub(super) unconfirmed: Count,
    /// The ids of rows given up or lost (at most [`LET_GO_KEPT`]), each with whether it was
    /// lost: an `--until-empty` run looks at how they ended once nothing is left to do, and a
    /// worker of the managed queue at which lost ones were cancelled.
    let_go: Mutex<Vec<(RowId, bool)>>,
}

pub(super) fn add(counter: &Count) {
    counter.add(1);
}

/// Which count a recorded result goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Counter {
    Completed,
    Retried,
    Failed,
    Dead,
    Released,
    Snoozed,
}

impl Tally {
    pub(super) fn new(m: &WorkerMetrics) -> Tally {
        // A job's outcome goes to the series of its queue and kind ([`Tally::of`]).
        let by_job = || Count::new(&metrics::Counter::noop());
        Tally {
            completed: by_job(),
            retried: by_job(),
            failed: by_job(),
            dead: by_job(),
            released: Count::new(&m.released),
            snoozed: by_job(),
            lost: Count::new(&m.leases_lost),
            given_up: Count::new(&m.given_up),
            unconfirmed: Count::new(&m.unconfirmed),
            let_go: Mutex::default(),
        }
    }

    /// Counts that go to no metric, for tests.
    #[cfg(test)]
    pub(super) fn detached() -> Tally {
        let c = || Count::new(&metrics::Counter::noop());
        Tally {
            completed: c(),
            retried: c(),
            failed: c(),
            dead: c(),
            released: c(),
            snoozed: c(),
            lost: c(),
            given_up: c(),
            unconfirmed: c(),
            let_go: Mutex::default(),
        }
    }

    /// The count `c`, recorded in `series` (a release is the worker's, not the job's). A
    /// retried or dead job's attempt failed: it counts as a failed run too.
    pub(super) fn of(&self, c: Counter, series: &JobSeries) -> Count {
        match c {
            Counter::Completed => self.completed.as_metric(&series.completed, None),
            Counter::Retried => self
                .retried
                .as_metric(&series.retried, Some(&series.failed)),
            Counter::Failed => self.failed.as_metric(&series.failed, None),
            Counter::Dead => self.dead.as_metric(&series.dead, Some(&series.failed)),
            Counter::Released => self.released.as_metric(&self.released.metric, None),
            Counter::Snoozed => self.snoozed.as_metric(&series.snoozed, None),
        }
    }

    /// Rows of a claim under `lease` that are gone: given up when this worker let the whole
    /// claim go itself, lost when another worker (or a cancel) took them.
    pub(super) fn gone(&self, lease: &Lease, ids: &[RowId]) {
        if lease.abandoned() {
            self.gave_up(ids);
        } else {
            self.lost(ids);
        }
    }

    /// Rows this worker gave up: they come back through their lease.
    pub(super) fn gave_up(&self, ids: &[RowId]) {
        self.given_up.add(ids.len() as u64);
        self.keep(ids, false);
    }

    /// Rows another worker (or a cancel) took from this one.
    pub(super) fn lost(&self, ids: &[RowId]) {
        self.lost.add(ids.len() as u64);
        self.keep(ids, true);
    }

    fn keep(&self, ids: &[RowId], lost: bool) {
        let mut kept = self.let_go.lock().unwrap_or_else(|p| p.into_inner());
        let room = LET_GO_KEPT.saturating_sub(kept.len());
        kept.extend(ids.iter().take(room).map(|id| (id.clone(), lost)));
    }

    /// The ids kept of the rows given up or lost ([`LET_GO_KEPT`] at most: the others count as
    /// not known to have finished, since `finished_later` only counts rows looked at).
    pub(super) fn let_go(&self) -> Vec<RowId> {
        self.kept(|_| true)
    }

    /// The ids kept of the rows lost ([`LET_GO_KEPT`] at most, with those given up).
    pub(super) fn lost_ids(&self) -> Vec<RowId> {
        self.kept(|lost| lost)
    }

    fn kept(&self, which: impl Fn(bool) -> bool) -> Vec<RowId> {
        let kept = self.let_go.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter()
            .filter(|(_, lost)| which(*lost))
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub(super) fn report(&self, outages: u64, interrupted: bool) -> WorkerReport {
        WorkerReport {
            completed: self.completed.get(),
            retried: self.retried.get(),
            failed: self.failed.get(),
            dead: self.dead.get(),
            released: self.released.get(),
            snoozed: self.snoozed.get(),
            lost: self.lost.get(),
            cancelled: 0,
            given_up: self.given_up.get(),
            unconfirmed: self.unconfirmed.get(),
            finished_later: 0,
            outages,
            interrupted,
        }
    }
}
