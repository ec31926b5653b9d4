//! How far ahead the worker claims. With a prefetch the user set, that many rows wait claimed
//! beyond the running ones. Without one, the worker claims ahead about [`AHEAD`] of work: it
//! measures how long its jobs take and holds as many rows as its slots get through in that time,
//! at least one and at most [`MOST_AHEAD`]. Short jobs then come in claims of hundreds, a few
//! commits for many jobs, and long jobs one at a time, so that one worker does not keep rows
//! from the others while they wait.

use std::time::Duration;

/// The work a worker claims ahead of its free slots, when its prefetch is not set. A row waits
/// about this long for a slot before it starts, on top of the time its claim took.
pub(super) const AHEAD: Duration = Duration::from_secs(1);

/// Most rows claimed ahead when the prefetch is not set: two flushes of results. Larger claims
/// cost fewer statements per job: with no-op jobs, 2,000 ran 12 % more jobs a second than 1,000
/// on PostgreSQL, 13 % on MariaDB and 5 % on SQLite, and 3,000 or 4,000 no more than 2,000
/// (BENCHMARKS.md, 2026-12-02). Long jobs never get near it (see [`AHEAD`]).
pub(super) const MOST_AHEAD: usize = 2000;

/// [`MOST_AHEAD`] where the worker's claims take runs of keys' lines (a limited queue, one run of
/// each idle key a claim). Measured before a key's next run could be claimed while its last one
/// runs (`Claimer::claim_behind`), when the worker idled for a claim between its runs and
/// longer runs paid for it less often: 10 keys one at a time, no-op jobs, 15,000–16,400 jobs/s
/// at 2,000 and 19,800–20,800 at 5,000 (19,900 at 10,000). The rows of a run could not run elsewhere sooner
/// anyway: its key's concurrency is this worker's while it holds the run. [`AHEAD`] still
/// bounds it for jobs that take time.
pub(super) const MOST_AHEAD_IN_RUNS: usize = 5000;

/// How much of each new job's time goes into the mean: it follows a change of job within a few
/// dozen jobs.
const WEIGHT: f64 = 0.05;

/// The worker's claiming pace.
#[derive(Debug)]
pub(super) struct Pace {
    concurrency: usize,
    /// Rows claimed ahead: the user's, or `None` to adapt.
    prefetch: Option<usize>,
    /// Most rows per claim: the user's, or the room left.
    batch: Option<u32>,
    /// The work claimed ahead when adapting: [`AHEAD`], shorter for short leases.
    ahead: Duration,
    /// Mean time of a job's handler, in seconds (exponentially weighted), once one has ended.
    job_secs: Option<f64>,
    /// The claims take runs of keys' lines ([`MOST_AHEAD_IN_RUNS`]).
    runs: bool,
}

impl Pace {
    pub(super) fn new(
        concurrency: usize,
        prefetch: Option<usize>,
        batch: Option<u32>,
        lease: Duration,
    ) -> Pace {
        Pace {
            concurrency,
            prefetch,
            batch,
            // Rows that wait must start well inside their lease, renewed or not.
            ahead: AHEAD.min(lease / 10),
            job_secs: None,
            runs: false,
        }
    }

    /// Whether the worker's claims take runs of keys' lines now (they may start or stop as the
    /// limits of its queues change).
    pub(super) fn claims_take_runs(&mut self, runs: bool) {
        self.runs = runs;
    }

    /// Whether the worker's claims take runs of keys' lines now.
    pub(super) fn takes_runs(&self) -> bool {
        self.runs
    }

    /// A job's handler ran for `took`.
    pub(super) fn job_took(&mut self, took: Duration) {
        if self.prefetch.is_some() {
            return;
        }
        let secs = took.as_secs_f64();
        self.job_secs = Some(match self.job_secs {
            None => secs,
            Some(mean) => mean + WEIGHT * (secs - mean),
        });
    }

    /// Rows to claim ahead of the running ones now. Until a job has ended, as many as the slots.
    pub(super) fn prefetch(&self) -> usize {
        if let Some(p) = self.prefetch {
            return p;
        }
        let Some(mean) = self.job_secs else {
            return self.concurrency;
        };
        // The rows the slots get through in `ahead`; a job of no measurable time counts a
        // microsecond.
        let rows = self.concurrency as f64 * self.ahead.as_secs_f64() / mean.max(1e-6);
        let most = if self.runs {
            MOST_AHEAD_IN_RUNS
        } else {
            MOST_AHEAD
        };
        (rows.min(most as f64) as usize).max(1)
    }

    /// How many rows to claim while the worker holds `holding` rows (running, waiting for a slot,
    /// or coming in claims under way), `waiting` of them for a slot: what it may still hold, at
    /// most a batch, once no more than half the prefetch wait (so that claims come in batches).
    ///
    /// - Beside a claim under way (`beside`), only a claim of a quarter of a batch or more:
    ///   claims of a few rows each would cost a statement and a commit each.
    /// - An idle worker (nothing held, no claim under way) claims no more than its slots start
    ///   at once, so that its first jobs start after a short claim; the rest of its room comes
    ///   in the next claim, beside this one where the worker makes two at once. (On PostgreSQL
    ///   a claim of 1,008 rows took 13 ms where the first job of a claim of 8 started after 2.)
    /// - Results still being written (`recording`) do not count: their jobs are done, and their
    ///   rows are let go within a flush. Counted, they made claims smaller while settles ran.
    ///   More of them than the worker may hold stops claims, though: the database is writing
    ///   results slower than the jobs end.
    pub(super) fn wants(
        &self,
        holding: usize,
        waiting: usize,
        beside: bool,
        recording: usize,
    ) -> Option<usize> {
        let prefetch = self.prefetch();
        let room = self.concurrency + prefetch;
        let batch = self
            .batch
            .map_or(room, |b| usize::try_from(b).unwrap_or(usize::MAX));
        let most = room.max(batch);
        if recording > most {
            return None;
        }
        let mut left = most.saturating_sub(holding).min(batch);
        if holding == 0 && !beside {
            left = left.min(self.concurrency);
        }
        let enough = !beside || left * 4 >= batch.min(room);
        (left > 0 && enough && waiting <= prefetch / 2).then_some(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    #[test]
    fn a_set_prefetch_and_batch_are_kept() {
        let mut pace = Pace::new(4, Some(16), Some(8), LEASE);
        pace.job_took(Duration::from_micros(5));
        assert_eq!(pace.prefetch(), 16);
        assert_eq!(pace.wants(1, 0, false, 0), Some(8), "a batch at most");
        assert_eq!(pace.wants(15, 2, false, 0), Some(5), "the room left");
        assert_eq!(pace.wants(10, 8, false, 0), Some(8));
        assert_eq!(
            pace.wants(10, 9, false, 0),
            None,
            "more than half the prefetch wait"
        );
        assert_eq!(pace.wants(20, 0, false, 0), None, "no room");
        assert_eq!(pace.wants(25, 0, false, 0), None, "no room");
    }

    #[test]
    fn beside_a_claim_under_way_only_a_quarter_of_a_batch_or_more() {
        let pace = Pace::new(4, Some(16), None, LEASE);
        // Room 20: 4 slots, 16 ahead; a claim under way asked for 12 of it.
        assert_eq!(
            pace.wants(4 + 12, 0, true, 0),
            None,
            "4 rows: less than 20 / 4"
        );
        assert_eq!(pace.wants(4 + 11, 0, true, 0), Some(5));
        assert_eq!(
            pace.wants(4 + 12, 0, false, 0),
            Some(4),
            "alone, any room is claimed"
        );
        assert_eq!(
            pace.wants(4 + 11, 9, true, 0),
            None,
            "more than half the prefetch wait"
        );
    }

    #[test]
    fn results_being_written_take_no_room_until_more_than_it_pile_up() {
        let pace = Pace::new(4, Some(16), None, LEASE);
        assert_eq!(pace.wants(4, 0, false, 20), Some(16), "the whole room");
        assert_eq!(pace.wants(4, 0, false, 21), None, "settles fall behind");
    }

    #[test]
    fn before_any_job_ended_it_claims_ahead_as_many_as_the_slots() {
        let pace = Pace::new(8, None, None, LEASE);
        assert_eq!(pace.prefetch(), 8);
        assert_eq!(pace.wants(8, 0, true, 0), Some(8));
        assert_eq!(pace.wants(1, 0, false, 0), Some(15));
    }

    #[test]
    fn an_idle_worker_claims_its_slots_first_and_the_rest_beside() {
        let pace = Pace::new(8, Some(1000), None, LEASE);
        assert_eq!(pace.wants(0, 0, false, 0), Some(8), "the slots first");
        assert_eq!(
            pace.wants(8, 0, true, 0),
            Some(1000),
            "the rest beside that claim"
        );
        let batched = Pace::new(8, Some(1000), Some(4), LEASE);
        assert_eq!(batched.wants(0, 0, false, 0), Some(4), "a batch at most");
        let adapting = Pace::new(8, None, None, LEASE);
        assert_eq!(adapting.wants(0, 0, false, 0), Some(8));
        // Results still being written leave it idle: the slots first all the same.
        assert_eq!(pace.wants(0, 0, false, 20), Some(8));
        // A prefetch too small for a claim beside the first (a quarter of the room): the rest
        // waits for the first claim's answer.
        let small = Pace::new(8, Some(2), None, LEASE);
        assert_eq!(small.wants(0, 0, false, 0), Some(8));
        assert_eq!(small.wants(8, 0, true, 0), None);
    }

    #[test]
    fn short_jobs_grow_it_to_a_second_of_work_up_to_most_ahead() {
        let mut pace = Pace::new(8, None, None, LEASE);
        pace.job_took(Duration::from_millis(20));
        // 8 slots × 1 s / 20 ms
        assert_eq!(pace.prefetch(), 400);
        assert_eq!(pace.wants(8, 0, true, 0), Some(400));
        for _ in 0..200 {
            pace.job_took(Duration::from_micros(3));
        }
        assert_eq!(pace.prefetch(), MOST_AHEAD);
        assert_eq!(
            pace.wants(8, 0, true, 0),
            Some(MOST_AHEAD),
            "the rest of the room, in one claim beside the first"
        );
    }

    #[test]
    fn where_claims_take_runs_short_jobs_grow_it_further() {
        let mut pace = Pace::new(8, None, None, LEASE);
        pace.claims_take_runs(true);
        pace.job_took(Duration::from_millis(20));
        assert_eq!(pace.prefetch(), 400, "a second of work, as anywhere");
        for _ in 0..200 {
            pace.job_took(Duration::from_micros(3));
        }
        assert_eq!(pace.prefetch(), MOST_AHEAD_IN_RUNS);
        pace.claims_take_runs(false);
        assert_eq!(pace.prefetch(), MOST_AHEAD);
        let mut set = Pace::new(8, Some(16), None, LEASE);
        set.claims_take_runs(true);
        assert_eq!(set.prefetch(), 16, "a prefetch the user set is kept");
    }

    #[test]
    fn long_jobs_shrink_it_to_one_row_ahead() {
        let mut pace = Pace::new(8, None, None, LEASE);
        for _ in 0..100 {
            pace.job_took(Duration::from_micros(10));
        }
        assert_eq!(pace.prefetch(), MOST_AHEAD);
        for _ in 0..200 {
            pace.job_took(Duration::from_secs(20));
        }
        assert_eq!(pace.prefetch(), 1, "one row waits, not a worker's worth");
        assert_eq!(pace.wants(8, 0, false, 0), Some(1));
        assert_eq!(pace.wants(9, 1, false, 0), None, "the row ahead is there");
    }

    #[test]
    fn a_short_lease_claims_less_ahead() {
        let mut pace = Pace::new(2, None, None, Duration::from_secs(2));
        pace.job_took(Duration::from_millis(10));
        // 2 slots × 200 ms (a tenth of the lease) / 10 ms
        assert_eq!(pace.prefetch(), 40);
    }

    #[test]
    fn a_slow_job_holds_it_back_until_short_ones_bring_it_back() {
        let mut pace = Pace::new(8, None, None, LEASE);
        for _ in 0..100 {
            pace.job_took(Duration::from_millis(10));
        }
        assert_eq!(pace.prefetch(), 800);
        // The mean is of time, so that a mix of short and long jobs claims no more than a
        // second of work ahead: one slow job makes it careful at once.
        pace.job_took(Duration::from_secs(1));
        let after = pace.prefetch();
        assert!((100..200).contains(&after), "{after}");
        for _ in 0..100 {
            pace.job_took(Duration::from_millis(10));
        }
        assert!(pace.prefetch() >= 750, "{}", pace.prefetch());
    }
}
