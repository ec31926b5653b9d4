//! The managed queue's claims: the job layer on top of the claim core. `rowclaim_jobs` is a
//! source whose mapping this layer owns; it completes that mapping ([`Jobs`]: run-at,
//! attempted-at, finished-at, last error and output, the conditions of its queues, kinds,
//! pauses and limits) and shapes its claims ([`JobClaims`]: where a claim resumes, and the jobs
//! of limited queues that `limits/` claims under the same token).
//!
//! A job claim, top to bottom: [`Claimer::claim`] → [`JobClaims::claim`] →
//! [`Claimer::claim_with`] (the claim core, as for any source) and [`Limited::claim_more`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::{retry_transient, ClaimArgs, Committed};
use crate::claim::{Claim, Claimer, Claiming, Layer, Line, More, Shape, Token};
use crate::db::Db;
use crate::error::Result;
use crate::id::RowId;
use crate::mapping::{Fragment, Lifecycle, Mapping, Naming, Piece};
use crate::source::Source;

use super::limits::{Seen, Taken, LIMITED};
use super::settings::settings;

/// The columns of a job that its claim returns (what [`crate::Job`] is read from).
const JOB_COLUMNS: &[&str] = &[
    "id",
    "queue",
    "kind",
    "payload",
    "priority",
    "attempts",
    "max_attempts",
    "unique_key",
    "timeout_ms",
    "last_error",
];

/// The field a PostgreSQL skip-locked claim returns each job's run-at in (epoch µs), for its
/// place in the claim order ([`Position`]); taken out of the row before anyone sees it.
const RUN_AT_US: &str = "rowclaim_run_at_us";

/// The managed queue's source: `rowclaim_jobs`, its states, and its claim order (priority
/// first, then run-at and id).
pub(crate) fn source() -> Source {
    Source::new("rowclaim_jobs")
        .status_values("ready", "running", "completed", "dead")
        .owner_column("owner")
        .lease_column("lease_until")
        .attempts_column("attempts")
        .order_by("priority desc, run_at, id")
}

/// The managed queue as a layer of the claim core, for a claimer of jobs of `queues` and
/// `kinds` (all when empty).
pub(crate) struct Jobs {
    pub queues: Vec<String>,
    pub kinds: Vec<String>,
    /// Completed jobs are deleted, not kept.
    pub delete_done: bool,
}

impl Layer for Jobs {
    fn lifecycle(&self, m: &Mapping, naming: &Naming) -> Lifecycle {
        let q = naming.quote;
        Lifecycle {
            due: q("run_at"),
            started: q("attempted_at"),
            finished: q("finished_at"),
            error: q("last_error"),
            history: q("errors"),
            output: q("output"),
            delete_done: self.delete_done,
            // A job of a paused queue is never claimed; one of a limited queue only by the
            // limited claim (`limits/`), which counts it as work all the same.
            claimable: self.conditions(&format!("paused_at IS NOT NULL OR {LIMITED}")),
            work: self.conditions("paused_at IS NOT NULL"),
            carried: m
                .columns
                .iter()
                .filter(|c| JOB_COLUMNS.contains(&c.as_str()))
                .cloned()
                .collect(),
            as_text: vec!["payload".to_owned()],
            extra: vec![(
                RUN_AT_US.to_owned(),
                Fragment::new().piece(Piece::MicrosOf("run_at")),
            )],
            index_fix: "rowclaim init (it creates the queue's indexes)",
        }
    }

    fn shape(&self) -> Arc<dyn Shape> {
        Arc::new(JobClaims {
            queues: self.queues.clone(),
            kinds: self.kinds.clone(),
            resume: Mutex::default(),
            limited: Mutex::default(),
            seen: Mutex::default(),
        })
    }
}

impl Jobs {
    /// Jobs of the claimer's queues and kinds (names bound), not of a queue whose
    /// `rowclaim_queues` row meets `blocked`.
    fn conditions(&self, blocked: &str) -> Vec<Fragment> {
        let mut out = Vec::new();
        for (column, names) in [("queue", &self.queues), ("kind", &self.kinds)] {
            if !names.is_empty() {
                out.push(
                    Fragment::new()
                        .column(column)
                        .sql(" IN (")
                        .values(names.iter().cloned())
                        .sql(")"),
                );
            }
        }
        out.push(match self.queues.as_slice() {
            // One queue: a test of that queue alone, which the planners evaluate once before
            // the scan and which then skips the scan of a paused queue's backlog altogether.
            [one] => Fragment::new()
                .sql("NOT EXISTS (SELECT 1 FROM rowclaim_queues WHERE name = ")
                .value(one.clone())
                .sql(format!(" AND ({blocked}))")),
            _ => Fragment::new().column("queue").sql(format!(
                " NOT IN (SELECT name FROM rowclaim_queues WHERE {blocked})"
            )),
        });
        out
    }
}

/// How often a claimer of the managed queue reads again which of its queues have limits. An
/// ordinary claim never takes a limited queue's job (the claim itself checks); this only says
/// how soon a queue that became limited is served by the limited claim (`limits/`).
const LIMITS_EVERY: Duration = Duration::from_secs(1);

/// How long claims resume where the last one ended before one starts again from the beginning
/// of the queue's order. Resuming skips the index entries of jobs claimed before (see
/// [`Position`]) but also any job that became claimable behind that place meanwhile: one of
/// higher priority, a retry due earlier, a job whose enqueue committed late. Those wait at most
/// this long (or until a claim comes back short, which also starts again from the beginning).
const RESTART_EVERY: Duration = Duration::from_secs(1);

/// The managed queue's claims ([`Shape`]) for one claimer.
#[derive(Debug)]
pub(crate) struct JobClaims {
    queues: Vec<String>,
    kinds: Vec<String>,
    /// Where the last full claim ended, and when the run of claims resuming there started from
    /// the beginning of the queue (see [`RESTART_EVERY`]).
    resume: Mutex<Option<(Position, Instant)>>,
    /// Its limited queues as last read, and when (see [`LIMITS_EVERY`]).
    limited: Mutex<Option<(Instant, Vec<String>)>>,
    /// What it learned of its limited queues' lines, by queue (see [`Seen`]).
    seen: Mutex<HashMap<String, Seen>>,
}

#[async_trait::async_trait]
impl Shape for JobClaims {
    async fn claim(
        &self,
        claimer: &Claimer,
        batch: u32,
        lease: Duration,
        own: &[Token],
        committed: Option<Committed<'_>>,
    ) -> Result<Claim> {
        let limited = self.limited_queues(claimer.db()).await?;
        // A claimer whose queues are all limited has nothing for the ordinary claim, which
        // leaves limited queues alone: only the limited claim is asked.
        let only_limited =
            !self.queues.is_empty() && self.queues.iter().all(|q| limited.contains(q));
        let from = self.resume_from();
        let arms = from.map(|p| p.arms());
        let more = Limited {
            db: claimer.db(),
            queues: limited,
            kinds: &self.kinds,
            seen: &self.seen,
            slots: claimer.line_slots(),
            own: own.iter().map(Token::to_string).collect(),
            lines: Mutex::default(),
            whole: AtomicBool::new(true),
        };
        let how = Claiming {
            batch,
            lease,
            arms: arms.as_deref(),
            skip: only_limited,
            more: (!more.queues.is_empty()).then_some(&more as &dyn More),
            committed,
        };
        let mut claim = claimer.claim_with(how).await?;
        let mut resumed = from.is_some();
        if claim.is_empty() && resumed {
            // Nothing after the place the last claim ended: look from the beginning.
            resumed = false;
            claim = claimer.claim_with(Claiming { arms: None, ..how }).await?;
        }
        self.note_end(&mut claim, batch, resumed);
        let lines = std::mem::take(&mut *more.lines.lock().unwrap_or_else(|p| p.into_inner()));
        let whole = !lines.is_empty() && more.whole.load(Ordering::Relaxed);
        claim.set_lines(lines, whole);
        Ok(claim)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn limited(&self) -> bool {
        let last = self.limited.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref().is_some_and(|(_, queues)| !queues.is_empty())
    }

    /// Where the last look at the lines of one of its queues took runs.
    fn takes_runs(&self) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.values().any(|s| s.took_runs)
    }
}

impl JobClaims {
    /// The queues it takes jobs from (empty: all).
    pub(crate) fn queues(&self) -> &[String] {
        &self.queues
    }

    /// Where this claim resumes, if the last run of full claims started recently enough.
    fn resume_from(&self) -> Option<Position> {
        let r = self.resume.lock().unwrap_or_else(|p| p.into_inner());
        r.filter(|(_, since)| since.elapsed() < RESTART_EVERY)
            .map(|(p, _)| p)
    }

    /// Notes where `claim` ended in the queue's order, from the place its ordinary claim
    /// returned with each job (taken out of the rows here). A claim that came back short
    /// starts the next one from the beginning: whatever is claimable may lie behind.
    fn note_end(&self, claim: &mut Claim, batch: u32, resumed: bool) {
        let (mut end, mut ordinary) = (None::<Position>, 0usize);
        for row in claim.rows_mut() {
            if let Some(p) = Position::take_from(&mut row.data) {
                ordinary += 1;
                end = Some(end.map_or(p, |q| q.later(p)));
            }
        }
        let mut r = self.resume.lock().unwrap_or_else(|p| p.into_inner());
        *r = match (ordinary < batch as usize, end, resumed) {
            (true, _, _) | (false, None, _) => None,
            // From the beginning: a new run of resumed claims starts here.
            (false, Some(p), false) => Some((p, Instant::now())),
            // Resumed: go on from the later place (claims run side by side). Where a claim
            // beside it came back short meanwhile, the next one starts from the beginning:
            // a new run here would let jobs behind this place wait longer than RESTART_EVERY.
            (false, Some(p), true) => r.map(|(q, since)| (q.later(p), since)),
        };
    }

    /// Which of this claimer's queues have limits (read at most every [`LIMITS_EVERY`]).
    async fn limited_queues(&self, db: &Db) -> Result<Vec<String>> {
        {
            let last = self.limited.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, queues)) = &*last {
                if at.elapsed() < LIMITS_EVERY {
                    return Ok(queues.clone());
                }
            }
        }
        let mut queues = retry_transient!(settings(db).limited_queues().await)?;
        if !self.queues.is_empty() {
            queues.retain(|q| self.queues.contains(q));
        }
        *self.limited.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), queues.clone()));
        Ok(queues)
    }
}

/// The queues `claimer` takes jobs from, when it is a claimer of the managed queue (empty: all
/// of them); `None` for any other source.
pub(crate) fn served(claimer: &Claimer) -> Option<&[String]> {
    let shape = claimer.shape()?.as_any().downcast_ref::<JobClaims>()?;
    Some(shape.queues())
}

/// The jobs of limited queues a claim adds ([`More`]): what each queue's limits allow, one
/// queue after another, each in a transaction of its own (`limits::claim`).
struct Limited<'a> {
    db: &'a Db,
    queues: Vec<String>,
    kinds: &'a [String],
    seen: &'a Mutex<HashMap<String, Seen>>,
    /// The slots of the worker that runs the claim's lines, if one does: only then may it take
    /// runs of a key's line ([`Claimer::line_slots`]).
    slots: Option<usize>,
    /// The tokens of claims whose lines the worker still runs whole, as text: a key's next run
    /// may join the line ([`super::limits::runs_sql`]).
    own: Vec<String>,
    /// The lines among the jobs it took: each key's run ([`super::limits::Taken`]), for the
    /// claim that holds them.
    lines: Mutex<Vec<Line>>,
    /// Every keyed job of a limited queue it took is in one of `lines` (and no job came from
    /// the ordinary claim beside them): see [`Claim::lines_whole`].
    whole: AtomicBool,
}

impl Limited<'_> {
    fn seen_of(&self, queue: &str) -> Seen {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(queue).copied().unwrap_or_default()
    }

    fn saw(&self, queue: &str, what: Seen) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(queue.to_owned(), what);
    }

    /// Notes a claim's runs as lines of the claim, named by queue and key (the number of its
    /// line), so that a key's next run, claimed while this one runs, joins the line the worker
    /// runs. (Two keys whose numbers met would share one line: run one after another, never
    /// at once.)
    fn lines(&self, queue: &str, width: u32, runs: Vec<(i64, Vec<i64>)>) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.extend(runs.into_iter().map(|(line, run)| Line {
            name: format!("{queue}/{line}").into(),
            width,
            rows: run.into_iter().map(RowId::Int).collect(),
        }));
    }

    /// [`More::claim_more`]: each limited queue's claim in turn, while the batch has room.
    async fn claim_each(
        &self,
        args: &ClaimArgs<'_>,
        rows: &mut Vec<serde_json::Value>,
    ) -> Result<Option<Instant>> {
        let mut from: Option<Instant> = None;
        for queue in &self.queues {
            let taken = u32::try_from(rows.len()).unwrap_or(args.batch);
            let left = args.batch.saturating_sub(taken);
            if left == 0 {
                break;
            }
            let args = ClaimArgs {
                batch: left,
                ..*args
            };
            let store = settings(self.db);
            let mut seen = self.seen_of(queue);
            seen.slots = self.slots;
            let (taken, at) = retry_transient!(
                store
                    .claim_limited(&args, queue, self.kinds, &mut seen, &self.own)
                    .await
            )?;
            self.saw(queue, seen);
            let Some(Taken {
                ids,
                runs,
                width,
                whole,
                rows: marked,
            }) = taken
            else {
                continue;
            };
            // On a Galera node the claim stands only once a count after its commit agrees.
            if retry_transient!(store.gave_back_crossed(&args, queue, &ids).await)? {
                continue;
            }
            // Read once the claim committed, and not by claiming again should it fail: the
            // jobs are this claim's now (see `limits::claimed_rows`).
            let taken = match marked {
                Some(rows) => rows,
                None => retry_transient!(store.claimed_rows(&args, &ids).await)?,
            };
            if !taken.is_empty() {
                from = Some(from.map_or(at, |f| f.min(at)));
            }
            if !whole {
                self.whole.store(false, Ordering::Relaxed);
            }
            rows.extend(taken);
            self.lines(queue, width, runs);
        }
        Ok(from)
    }
}

#[async_trait::async_trait]
impl More for Limited<'_> {
    async fn claim_more(
        &self,
        args: &ClaimArgs<'_>,
        rows: &mut Vec<serde_json::Value>,
    ) -> Result<Option<Instant>> {
        let ordinary = !rows.is_empty();
        let added = self.claim_each(args, rows).await;
        // Rows of the ordinary claim beside, or, after a failure, rows a limited claim took and
        // never read (they run nowhere): the worker does not run the claim's lines whole.
        if ordinary || added.is_err() {
            self.whole.store(false, Ordering::Relaxed);
        }
        added
    }
}

/// A place in the managed queue's claim order (priority descending, then run-at, then id): where
/// a claim ended. The next claim resumes after it instead of walking again, from the start of
/// the ready index, past the entries of every job claimed since the last vacuum; PostgreSQL
/// keeps those entries until vacuum removes them (for as long as any snapshot may still see the
/// rows), and every claim from the start would step over all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    pub priority: i64,
    /// Microseconds since the Unix epoch: exact, unlike a float of seconds.
    pub run_at_us: i64,
    pub id: i64,
}

impl Position {
    /// Later in the claim order sorts greater.
    fn key(&self) -> (std::cmp::Reverse<i64>, i64, i64) {
        (std::cmp::Reverse(self.priority), self.run_at_us, self.id)
    }

    /// The later of two places in the claim order.
    pub(crate) fn later(self, other: Position) -> Position {
        if other.key() > self.key() {
            other
        } else {
            self
        }
    }

    /// The place of a claimed job whose row carries its run-at ([`RUN_AT_US`], taken out).
    fn take_from(row: &mut serde_json::Value) -> Option<Position> {
        let obj = row.as_object_mut()?;
        let run_at_us = obj.remove(RUN_AT_US)?.as_i64()?;
        Some(Position {
            priority: obj.get("priority")?.as_i64()?,
            run_at_us,
            id: obj.get("id")?.as_i64()?,
        })
    }

    /// The arms a claim after this place looks for ready jobs in, in order: the rest of its
    /// priority (run-at and id after it), then lower priorities; each an index range.
    pub(crate) fn arms(&self) -> Vec<Fragment> {
        vec![
            Fragment::new()
                .column("priority")
                .sql(" = ")
                .value(self.priority)
                .sql(" AND (")
                .column("run_at")
                .sql(", ")
                .column("id")
                .sql(") > (")
                .piece(Piece::AtMicros(self.run_at_us))
                .sql(", ")
                .value(self.id)
                .sql(")"),
            Fragment::new()
                .column("priority")
                .sql(" < ")
                .value(self.priority),
        ]
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod sqlite_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// The settler writes results at once for a claimer under limits (`Claimer::limited`):
    /// that turns on the limited queues last read, and on nothing before they were read.
    #[test]
    fn a_claimer_is_limited_while_one_of_its_queues_last_read_was() {
        let claims = JobClaims {
            queues: Vec::new(),
            kinds: Vec::new(),
            resume: Mutex::default(),
            limited: Mutex::default(),
            seen: Mutex::default(),
        };
        assert!(!claims.limited(), "nothing read yet");
        *claims.limited.lock().expect("unpoisoned") = Some((Instant::now(), Vec::new()));
        assert!(!claims.limited(), "no queue limited");
        *claims.limited.lock().expect("unpoisoned") =
            Some((Instant::now(), vec!["mail".to_owned()]));
        assert!(claims.limited());
    }

    #[test]
    fn positions_order_as_claims_do() {
        let p = |priority, run_at_us, id| Position {
            priority,
            run_at_us,
            id,
        };
        // Higher priority first, then earlier run-at, then lower id.
        assert_eq!(p(5, 10, 1).later(p(1, 0, 0)), p(1, 0, 0));
        assert_eq!(p(1, 10, 1).later(p(1, 5, 9)), p(1, 10, 1));
        assert_eq!(p(1, 10, 1).later(p(1, 10, 2)), p(1, 10, 2));
    }

    #[test]
    fn a_place_is_taken_out_of_the_row() {
        let mut row = serde_json::json!({"id": 7, "priority": 3, RUN_AT_US: 42, "queue": "q"});
        let p = Position::take_from(&mut row).expect("a place");
        assert_eq!(
            p,
            Position {
                priority: 3,
                run_at_us: 42,
                id: 7
            }
        );
        assert_eq!(
            row,
            serde_json::json!({"id": 7, "priority": 3, "queue": "q"})
        );
        assert!(Position::take_from(&mut row).is_none(), "taken once");
    }
}
