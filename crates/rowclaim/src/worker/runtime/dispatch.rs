//! Dispatch: starts the rows waiting in the local queue as slots free up, each under a
//! supervisor, in the order [`Waiting`] keeps (a line's rows one after another). A waiting row
//! is not started when its claim no longer looks after it (counted lost), when its queue was
//! paused after it was claimed (given back unstarted), or when its lease may have ended (given
//! up: another worker may hold it by now); nor is the rest of its line then, nor after a row of
//! its line ended unfinished (given back unstarted).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::breaks::Breaks;
use super::held::{finished_for_good, Held};
use super::pace::Pace;
use super::results::record;
use super::supervise::supervise;
use super::supervise::Ran;
use super::tally::Counter;
use super::waiting::Waiting;
use super::{Finished, Shared};
use crate::backend::Outcome;
use crate::claim::{Claim, ClaimedRow, Line, Token};
use crate::id::RowId;

/// Why a row of a line goes back unstarted after one ahead of it did not finish.
const BEHIND_UNFINISHED: &str = "a job ahead of it in its line did not finish";

/// What the worker holds locally. Dropping it aborts every task in it.
pub(super) struct Local {
    /// Claimed rows waiting for a slot.
    pub(super) waiting: Waiting<Arc<Held>>,
    /// Supervisors of started rows. A job's slot is free once its handler ended; its result is
    /// recorded in the background, in batches, and counts against the rows the worker may hold.
    pub(super) jobs: Jobs,
    /// Heartbeats of claims.
    pub(super) beats: JoinSet<()>,
    /// Claims with rows still open.
    pub(super) helds: Vec<Arc<Held>>,
    /// How far ahead to claim.
    pub(super) pace: Pace,
    /// Lines that broke while claims were under way.
    breaks: Breaks,
}

impl Local {
    pub(super) fn new(sh: &Shared) -> Local {
        let cfg = &sh.cfg;
        // A claim of the transaction strategy holds a connection and a transaction for as long
        // as its rows wait: it claims ahead only as far as it was told (by default, the slots).
        let prefetch = match cfg.prefetch {
            None if sh.holds_transactions() => Some(cfg.concurrency),
            prefetch => prefetch,
        };
        Local {
            waiting: Waiting::default(),
            jobs: Jobs::default(),
            beats: JoinSet::new(),
            helds: Vec::new(),
            pace: Pace::new(cfg.concurrency, prefetch, cfg.batch, cfg.lease),
            breaks: Breaks::default(),
        }
    }

    /// A claim starts: its number, and the tokens of the claims whose lines the worker runs
    /// whole (see `Held::runs_lines_whole`), whose lines' next rows it may claim.
    pub(super) fn claim_starts(&mut self) -> (u64, Vec<Token>) {
        let own = self
            .helds
            .iter()
            .filter(|h| h.runs_lines_whole())
            .map(|h| *h.claim.token())
            .collect();
        (self.breaks.claim_starts(), own)
    }

    /// Takes the rows of claim number `number` into the queue. The rows of a line that broke
    /// since the claim started go back unstarted: they were claimed behind a row that went back
    /// meanwhile. `oldest`: the lowest number of the claims still under way, if any.
    pub(super) fn hold(
        &mut self,
        sh: &Arc<Shared>,
        mut claim: Claim,
        number: u64,
        oldest: Option<u64>,
    ) -> Arc<Held> {
        let mut rows = claim.take_rows();
        let (late, lines): (Vec<Line>, Vec<Line>) = claim
            .take_lines()
            .into_iter()
            .partition(|l| self.breaks.broke_since(&l.name, number));
        self.breaks.forget_before(oldest);
        let held = Held::new(claim, sh.holds_transactions());
        if !late.is_empty() {
            held.mark_lines_broken();
            let behind: HashSet<RowId> = late.into_iter().flat_map(|l| l.rows).collect();
            let back;
            (back, rows) = rows.into_iter().partition(|r| behind.contains(&r.id));
            for row in back {
                self.record(sh, unstarted(sh, held.clone(), &row, BEHIND_UNFINISHED));
            }
        }
        self.waiting.push(&held, rows, lines);
        self.helds.push(held.clone());
        held
    }

    /// Starts waiting rows while slots are free.
    pub(super) fn start_waiting(&mut self, sh: &Arc<Shared>, paused: &watch::Receiver<Paused>) {
        while self.jobs.len() < sh.cfg.concurrency {
            let Some(((held, row), line)) = self.waiting.next() else {
                break;
            };
            if !held.claim.is_open(&row.id) {
                // A heartbeat found it taken over, or gave it up, before it started.
                sh.tally.gone(&held.lease, std::slice::from_ref(&row.id));
            } else if paused.borrow().holds(&row) {
                self.record(sh, unstarted(sh, held, &row, "its queue is paused"));
            } else if !held.lease.may_start(sh.renews) {
                // Its lease could not be confirmed in time: another worker may hold it by now.
                tracing::debug!("row {}: not started, its lease may have ended", row.id);
                held.give_up(std::slice::from_ref(&row.id));
                sh.tally.gave_up(std::slice::from_ref(&row.id));
            } else {
                self.start(sh, held, row, line);
                continue;
            }
            self.line_ended(sh, line.as_ref(), false);
        }
    }

    fn start(
        &mut self,
        sh: &Arc<Shared>,
        held: Arc<Held>,
        row: ClaimedRow,
        line: Option<Arc<str>>,
    ) {
        let span = tracing::info_span!(
            "job",
            id = %row.id,
            token = %held.claim.token(),
            source = %sh.claimer.source_name(),
            queue = tracing::field::Empty,
            kind = tracing::field::Empty,
            attempt = tracing::field::Empty,
        );
        let job = supervise(sh.clone(), held, row).instrument(span);
        match line {
            None => self.jobs.push(job),
            Some(line) => self.jobs.push(async move {
                let mut ran = job.await;
                ran.line = Some(line);
                ran
            }),
        }
    }

    /// A row of `line` ended, or was not started: the line goes on, or where the row did not
    /// finish for good, the rest of it goes back unstarted ([`Local::lines_broke`]: those rows
    /// may show as running under their claims' tokens until their results are written).
    fn line_ended(&mut self, sh: &Arc<Shared>, line: Option<&Arc<str>>, for_good: bool) {
        let Some(line) = line else {
            return;
        };
        if !for_good {
            self.lines_broke(std::slice::from_ref(line));
        }
        for (held, row) in self.waiting.ended(line, for_good) {
            self.record(sh, unstarted(sh, held, &row, BEHIND_UNFINISHED));
        }
    }

    /// Rows went back unstarted from `lines` (and from no line, where it is empty): a claim
    /// under way gives back its rows of those lines, and the worker no longer runs any claim's
    /// lines whole (`Held::runs_lines_whole`).
    fn lines_broke(&mut self, lines: &[Arc<str>]) {
        lines.iter().for_each(|line| self.breaks.broke(line));
        self.helds.iter().for_each(|h| h.mark_lines_broken());
    }

    /// Records a result in the background.
    pub(super) fn record(&mut self, sh: &Arc<Shared>, finished: Finished) {
        record(sh, finished);
    }

    /// A supervisor ended: the result it left, if any, is recorded.
    pub(super) fn job_ended(&mut self, sh: &Arc<Shared>, ran: Ran) {
        if let Some(took) = ran.took {
            self.pace.job_took(took);
        }
        let for_good = ran
            .finished
            .as_ref()
            .is_some_and(|f| finished_for_good(&f.outcome));
        if let Some(finished) = ran.finished {
            self.record(sh, finished);
        }
        self.line_ended(sh, ran.line.as_ref(), for_good);
    }

    /// Jobs that ended while something else was awaited (see [`Jobs::beside`]).
    pub(super) fn ended(&mut self, sh: &Arc<Shared>, ended: Vec<Ran>) {
        for ran in ended {
            self.job_ended(sh, ran);
        }
    }

    /// Rows of a queue paused since they were claimed go back, not started.
    pub(super) fn give_back_paused(&mut self, sh: &Arc<Shared>, paused: &Paused) {
        let (back, emptied) = self.waiting.take_where(|row| paused.holds(row));
        if !back.is_empty() {
            self.lines_broke(&emptied);
        }
        for (held, row) in back {
            self.record(sh, unstarted(sh, held, &row, "its queue is paused"));
        }
    }

    /// Lets go of claims with no open rows, and of heartbeats that ended.
    pub(super) fn tidy(&mut self) {
        self.helds.retain(|h| h.claim.open_count() > 0);
        while self.beats.try_join_next().is_some() {}
    }

    /// How many rows to claim now, beside claims under way that asked for `coming` rows, if
    /// any (see [`Pace::wants`]).
    pub(super) fn wants(&self, sh: &Shared, coming: usize) -> Option<usize> {
        let recording = sh.results.open();
        let mut holding = self.jobs.len() + self.waiting.len() + coming;
        if sh.holds_transactions() {
            // Such a claim holds a connection until its results are written.
            holding += recording;
        }
        self.pace
            .wants(holding, self.waiting.len(), coming > 0, recording)
    }

    /// Nothing running, waiting or being recorded.
    pub(super) fn is_idle(&self, sh: &Shared) -> bool {
        self.jobs.is_empty() && self.waiting.is_empty() && sh.results.open() == 0
    }
}

/// The running jobs' supervisors, driven side by side by the claim loop's own task: a job costs
/// no task of its own, no wake-up of another thread to start it and none to learn that it
/// ended. A handler that computes for long without awaiting holds up the claim loop (and the
/// other jobs) meanwhile; such work belongs on `tokio::task::spawn_blocking`. Dropping it stops
/// every job in it.
#[derive(Default)]
pub(super) struct Jobs(FuturesUnordered<Pin<Box<dyn Future<Output = Ran> + Send>>>);

impl Jobs {
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn push(&mut self, job: impl Future<Output = Ran> + Send + 'static) {
        self.0.push(Box::pin(job));
    }

    /// The next job to end; `None` at once when none runs.
    pub(super) async fn next(&mut self) -> Option<Ran> {
        self.0.next().await
    }

    /// Runs `f` while the jobs go on; returns its output and the jobs that ended meanwhile.
    pub(super) async fn beside<T>(&mut self, f: impl Future<Output = T>) -> (T, Vec<Ran>) {
        let mut ended = Vec::new();
        tokio::pin!(f);
        loop {
            tokio::select! {
                out = &mut f => return (out, ended),
                Some(ran) = self.0.next(), if !self.0.is_empty() => ended.push(ran),
            }
        }
    }

    /// Stops every job.
    pub(super) fn stop_all(&mut self) {
        self.0.clear();
    }
}

/// The managed queues that are paused, as a worker last looked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Paused(HashSet<String>);

impl Paused {
    /// Whether `row`, a managed job, is of a paused queue.
    fn holds(&self, row: &ClaimedRow) -> bool {
        !self.0.is_empty()
            && row
                .data
                .get("queue")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|q| self.0.contains(q))
    }
}

/// A row claimed but not started, given back: `why` (its queue was paused meanwhile, or a row
/// ahead of it in its line went back).
fn unstarted(sh: &Shared, held: Arc<Held>, row: &ClaimedRow, why: &str) -> Finished {
    tracing::debug!("row {}: {why}; given back, not started", row.id);
    Finished {
        held,
        id: row.id.clone(),
        outcome: Outcome::Unstarted,
        counter: Counter::Released,
        series: sh.metrics.job(None),
    }
}

/// Looks at the paused queues every third of the lease (as often as heartbeats renew it), for
/// as long as the worker runs. A look that fails keeps the last answer. Once a lease it also
/// sweeps a page of the waiting jobs ([`crate::Queue::release_waiting`], page by page): a job
/// whose finisher died before it released the jobs waiting for it is seen there.
pub(super) async fn watch_paused(sh: Arc<Shared>, paused: watch::Sender<Paused>) {
    let every = (sh.cfg.lease / 3).max(Duration::from_millis(100));
    let queue = sh.claimer.db().queue();
    // Where the sweep goes on: a page of waiting jobs a round, so its cost stays bounded.
    let mut swept_to = 0;
    for round in 0u64.. {
        if round % 3 == 0 {
            match queue.sweep_from(swept_to).await {
                Ok((_, next)) => swept_to = next.unwrap_or(0),
                Err(e) => tracing::debug!("sweeping the waiting jobs: {e}"),
            }
        }
        match queue.paused().await {
            Ok(names) => {
                let now = Paused(names.into_iter().collect());
                paused.send_if_modified(|p| {
                    let changed = *p != now;
                    *p = now;
                    changed
                });
            }
            Err(e) => tracing::debug!("looking at the paused queues: {e}"),
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::RowId;

    fn row(id: i64, queue: serde_json::Value) -> ClaimedRow {
        ClaimedRow {
            id: RowId::Int(id),
            data: serde_json::json!({ "queue": queue }),
        }
    }

    #[test]
    fn rows_of_paused_queues_go_back_and_the_rest_keep_their_order() {
        let paused = Paused(["mail".to_owned()].into_iter().collect());
        let mut waiting = Waiting::default();
        let rows = vec![
            row(1, "mail".into()),
            row(2, "sms".into()),
            row(3, serde_json::Value::Null),
            row(4, "mail".into()),
            row(5, 7.into()),
        ];
        waiting.push(&(), rows, Vec::new());
        let ids = |rows: &mut dyn Iterator<Item = &((), ClaimedRow)>| {
            rows.map(|(_, r)| r.id.clone()).collect::<Vec<_>>()
        };
        let (back, _) = waiting.take_where(|r| paused.holds(r));
        assert_eq!(ids(&mut back.iter()), [RowId::Int(1), RowId::Int(4)]);
        assert_eq!(
            ids(&mut waiting.take_all().iter()),
            [RowId::Int(2), RowId::Int(3), RowId::Int(5)]
        );
        // Nothing paused: nothing goes back.
        waiting.push(&(), vec![row(6, "mail".into())], Vec::new());
        assert!(waiting
            .take_where(|r| Paused::default().holds(r))
            .0
            .is_empty());
        assert_eq!(waiting.len(), 1);
    }
}
