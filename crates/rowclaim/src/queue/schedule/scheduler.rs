//! The scheduler: registers its schedules, then looks at the stored ones again and again and
//! enqueues each due tick through the store's compare-and-set ([`Schedules::fire`]).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use super::define::{Compiled, Schedule};
use super::status::not_initialised;
use super::store::{Firing, Stored};
use super::timing;
use super::LATE_WINDOW;
use crate::backend::retry_transient;
use crate::db::Db;
use crate::error::Result;
use crate::queue::store::store;
use crate::queue::QueueStore;

/// Runs schedules: enqueues each due tick's job into the managed queue, exactly once however
/// many schedulers run the same schedules (in this process or in others, on other machines).
///
/// ```no_run
/// # async fn demo(db: rowclaim::Db) -> rowclaim::Result<()> {
/// use rowclaim::{Schedule, Scheduler};
/// let report = Scheduler::new(&db)
///     .schedule(Schedule::cron("nightly", "0 3 * * *").zone("Europe/Paris"))
///     .run(async { let _ = tokio::signal::ctrl_c().await; })
///     .await?;
/// println!("{} jobs enqueued", report.enqueued);
/// # Ok(()) }
/// ```
///
/// Beside a [`crate::Worker`], give the schedules to the worker instead
/// ([`crate::Worker::schedule`]): they run while it runs and stop when it stops.
///
/// - **Time** is the database's: a machine whose clock is off neither fires early nor late.
/// - **Registration**: at start each schedule is stored in `rowclaim_schedules` (made by
///   [`Queue::init`](crate::Queue::init)) if it is not there yet, its first tick the first one
///   after now. A stored schedule of the same name with another definition is replaced (the
///   scheduler started last wins; its next tick is computed anew when the expression, zone or
///   interval changed), and schedulers still running the old definition leave it alone, saying
///   so once.
/// - **Removed schedules** stop: only schedules some running scheduler has are enqueued. The
///   row stays, shown as overdue by [`Queue::schedules`](crate::Queue::schedules), until
///   [`Queue::forget_schedule`](crate::Queue::forget_schedule).
/// - **Outages** are waited out: passes are retried with backoff (100 ms growing to 5 s), said
///   once when the database goes away and once when it answers again; ticks due meanwhile are
///   then late or missed ([`CatchUp`](crate::CatchUp)).
#[derive(Clone, Debug)]
pub struct Scheduler {
    db: Db,
    schedules: Vec<Schedule>,
}

/// What a scheduler did, from [`Scheduler::run`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchedulerReport {
    /// Jobs it enqueued (ticks whose advance it won).
    pub enqueued: u64,
    /// Missed ticks its catch-up policies skipped.
    pub skipped: u64,
    /// How many times the database stopped answering for a while.
    pub outages: u64,
}

impl Scheduler {
    /// A scheduler of `db`'s managed queue, with no schedules yet.
    pub fn new(db: &Db) -> Scheduler {
        Scheduler {
            db: db.clone(),
            schedules: Vec::new(),
        }
    }

    /// Adds a schedule.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Whether it has no schedules.
    pub fn is_empty(&self) -> bool {
        self.schedules.is_empty()
    }

    /// Checks and registers the schedules, then enqueues their ticks until `shutdown` completes
    /// (a ready future: register only). A look at the schedules under way when `shutdown`
    /// completes ends first, for at most 5 s, so that the report counts every job it enqueued.
    /// Returns an error only when it cannot start: a bad schedule, two of one name, the queue
    /// not initialised, the database unreachable at start.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<SchedulerReport> {
        let running = self.start().await?;
        Ok(running.run(shutdown).await)
    }

    /// Checks and registers the schedules.
    pub(crate) async fn start(self) -> Result<Running> {
        let mut seen = BTreeSet::new();
        let mut items = Vec::with_capacity(self.schedules.len());
        for s in self.schedules {
            let compiled = s.compile()?;
            if !seen.insert(s.name.clone()) {
                return Err(s.invalid("name", &s.name, "is given to two schedules"));
            }
            items.push(Item {
                schedule: s,
                compiled,
                warned: false,
                failing: None,
            });
        }
        let mut running = Running {
            db: self.db,
            items,
            report: SchedulerReport::default(),
        };
        if !running.items.is_empty() {
            running.register().await.map_err(not_initialised)?;
        }
        Ok(running)
    }
}

/// One schedule of a running scheduler.
struct Item {
    schedule: Schedule,
    compiled: Compiled,
    /// Whether it was said that another definition of it is stored.
    warned: bool,
    /// What went wrong with it last (said once), while it goes wrong.
    failing: Option<String>,
}

/// A scheduler whose schedules are checked and registered.
pub(crate) struct Running {
    db: Db,
    items: Vec<Item>,
    report: SchedulerReport,
}

/// The longest wait between two looks at the stored schedules.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// The shortest: a tick the database's clock has not quite reached is looked at again soon.
const MIN_WAIT: Duration = Duration::from_millis(20);

impl Running {
    /// Stores each schedule that is not stored yet, and replaces stored definitions that differ.
    async fn register(&mut self) -> Result<()> {
        let store = store(&self.db);
        let (now, rows) = stored(store).await?;
        let by_name: BTreeMap<&str, &Stored> = rows.iter().map(|r| (r.name.as_str(), r)).collect();
        for item in &self.items {
            let def = item.compiled.def.borrow();
            let first = item
                .compiled
                .timing
                .next_after(now)
                .map_err(|e| item.schedule.never_ticks(def.expression, e))?;
            match by_name.get(def.name) {
                None => {
                    retry_transient!(store.insert_schedule(&def, first).await)?;
                }
                Some(row) if row.fingerprint == def.fingerprint => {}
                Some(row) => {
                    let retimed =
                        row.expression != def.expression || row.zone.as_deref() != def.zone;
                    let next = retimed.then_some(first);
                    retry_transient!(store.redefine_schedule(&def, next).await)?;
                    tracing::info!(
                        schedule = def.name,
                        "schedule {} was stored with another definition: replaced by this one{}",
                        def.name,
                        if retimed {
                            ", its next tick computed anew"
                        } else {
                            ""
                        }
                    );
                }
            }
        }
        Ok(())
    }

    /// Enqueues due ticks until `stop` completes.
    pub(crate) async fn run(mut self, stop: impl Future<Output = ()>) -> SchedulerReport {
        if self.items.is_empty() {
            return self.report;
        }
        tokio::pin!(stop);
        let mut failures: u32 = 0;
        let mut outage: Option<tokio::time::Instant> = None;
        let mut refused: Option<String> = None;
        loop {
            let pass = {
                let pass = self.pass();
                tokio::pin!(pass);
                tokio::select! {
                    biased;
                    pass = &mut pass => Some(pass),
                    () = &mut stop => {
                        // A tick's job may be committed already: the pass ends (within a bound,
                        // in case the database stopped answering) so that the report counts it.
                        let _ = tokio::time::timeout(PASS_AT_STOP, pass).await;
                        None
                    }
                }
            };
            let Some(pass) = pass else { break };
            let wait = match pass {
                Ok(wait) => {
                    if let Some(since) = outage.take() {
                        tracing::warn!(
                            "the scheduler's database ({}) answers again after {:.1}s",
                            self.db.endpoint(),
                            since.elapsed().as_secs_f64()
                        );
                    }
                    failures = 0;
                    refused = None;
                    wait
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    if e.is_connection() {
                        if outage.is_none() {
                            outage = Some(tokio::time::Instant::now());
                            self.report.outages += 1;
                            tracing::warn!(
                                "the scheduler lost the database ({}): {e}; ticks due meanwhile \
                                 are enqueued once it answers (late, or missed after {})",
                                self.db.endpoint(),
                                humantime::format_duration(LATE_WINDOW)
                            );
                        } else {
                            tracing::debug!("scheduling: {e} (database still unreachable)");
                        }
                    } else {
                        let text = e.to_string();
                        if refused.as_deref() == Some(text.as_str()) {
                            tracing::debug!("scheduling: {text} (again; retrying)");
                        } else {
                            tracing::warn!("scheduling failed: {text}; retrying");
                            refused = Some(text);
                        }
                    }
                    crate::wait::pause(failures - 1)
                }
            };
            tokio::select! {
                biased;
                () = &mut stop => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        self.report
    }

    /// One look at the stored schedules: enqueues the due ticks of this scheduler's schedules.
    /// Returns how long to wait before the next look. A lost connection ends the pass (an
    /// outage); anything else wrong with one schedule (a job the database refuses, an
    /// expression with no tick left) is said and that schedule tried again later, so that it
    /// does not hold up the others.
    async fn pass(&mut self) -> Result<Duration> {
        let Running { db, items, report } = self;
        let store = store(db);
        let (now, rows) = stored(store).await?;
        let by_name: BTreeMap<&str, &Stored> = rows.iter().map(|r| (r.name.as_str(), r)).collect();
        let mut wake = now.saturating_add(millis(MAX_WAIT));
        for item in items.iter_mut() {
            let row = by_name.get(item.compiled.def.name.as_str()).copied();
            match item.tick(store, row, now, report).await {
                Ok(next) => {
                    if item.failing.take().is_some() {
                        tracing::warn!(
                            schedule = item.schedule.name,
                            "schedule {} is enqueued again",
                            item.schedule.name
                        );
                    }
                    wake = wake.min(next.unwrap_or(wake));
                }
                Err(e) if e.is_connection() => return Err(e),
                Err(e) => {
                    let text = e.to_string();
                    if item.failing.as_deref() != Some(text.as_str()) {
                        tracing::warn!(
                            schedule = item.schedule.name,
                            "schedule {}: {text}; trying again in {}",
                            item.schedule.name,
                            humantime::format_duration(ITEM_RETRY)
                        );
                        item.failing = Some(text);
                    }
                    wake = wake.min(now.saturating_add(millis(ITEM_RETRY)));
                }
            }
        }
        let ms = u64::try_from(wake.saturating_sub(now)).unwrap_or(0);
        Ok(Duration::from_millis(ms).clamp(MIN_WAIT, MAX_WAIT))
    }
}

/// The database's now and every stored schedule, each read again while the database asks.
async fn stored(store: &dyn QueueStore) -> Result<(i64, Vec<Stored>)> {
    let now = retry_transient!(store.schedule_now().await)?;
    let rows = retry_transient!(store.schedule_rows().await)?;
    Ok((now, rows))
}

/// How soon a schedule whose tick failed (other than by a lost connection) is tried again.
const ITEM_RETRY: Duration = Duration::from_secs(5);

/// How long a pass under way when the scheduler is told to stop may go on: long enough for a
/// statement, not for an outage.
const PASS_AT_STOP: Duration = Duration::from_secs(5);

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Item {
    /// Enqueues this schedule's due ticks, as stored in `row` (None: not stored). Returns when
    /// it ticks next (None: it is not this scheduler's to tick).
    async fn tick(
        &mut self,
        store: &dyn QueueStore,
        row: Option<&Stored>,
        now: i64,
        report: &mut SchedulerReport,
    ) -> Result<Option<i64>> {
        let def = self.compiled.def.borrow();
        let no_tick = |e: timing::NoTick| self.schedule.never_ticks(def.expression, e);
        let Some(row) = row else {
            // Forgotten, or the table was made anew: store it again.
            let first = self.compiled.timing.next_after(now).map_err(no_tick)?;
            retry_transient!(store.insert_schedule(&def, first).await)?;
            return Ok(Some(first));
        };
        if row.fingerprint != def.fingerprint {
            if !self.warned {
                self.warned = true;
                tracing::warn!(
                    schedule = def.name,
                    "schedule {} is stored with another definition (a scheduler started later \
                     has it so); this scheduler leaves it to the schedulers that have that one",
                    def.name
                );
            }
            return Ok(None);
        }
        self.warned = false;
        let seen_next = row.next_tick;
        if seen_next > now {
            return Ok(Some(seen_next));
        }
        let due = self
            .compiled
            .timing
            .due(seen_next, now, self.schedule.catch_up)
            .map_err(no_tick)?;
        let firing = Firing {
            name: def.name,
            fingerprint: def.fingerprint,
            seen_next,
            next: due.next,
            jobs: due
                .ticks
                .iter()
                .map(|t| (*t, self.schedule.job_at(*t)))
                .collect(),
        };
        // None: another scheduler advanced it first, and enqueued the tick.
        if let Some(enqueued) = retry_transient!(store.fire(&firing).await)? {
            let new = enqueued.iter().filter(|e| !e.existing).count() as u64;
            report.enqueued += new;
            report.skipped += due.skipped;
            if due.skipped > 0 {
                tracing::info!(
                    schedule = def.name,
                    "schedule {}: {} missed tick(s) skipped (catch-up {}), {new} enqueued",
                    def.name,
                    due.skipped,
                    self.schedule.catch_up
                );
            } else {
                tracing::debug!(schedule = def.name, "schedule {}: {new} enqueued", def.name);
            }
        }
        Ok(Some(due.next))
    }
}
