//! [`Claimer`] takes claims on one source; a [`Claim`] is a token, its rows and the fenced
//! operations on them.

mod claimed;
mod rows;

pub use claimed::LockedRows;
pub use rows::{RowFilter, SourceRow};

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Notify};

use crate::backend::{
    dispatch, retry_transient, ClaimArgs, Claimed, Held, Outcome, Position, Resolved, ServerInfo,
    Target,
};
use crate::error::DbKind;
use crate::mapping::Mapping;
use crate::queue::QueueStore;
use crate::value::IdList;
use crate::{Db, Error, Result, RowId, Strategy};

/// The name of one claim: a fresh UUID v7. Every later change to the claim's rows is conditional
/// on it (fencing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Token(uuid::Uuid);

impl Token {
    pub(crate) fn new() -> Token {
        Token(uuid::Uuid::now_v7())
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl FromStr for Token {
    type Err = Error;
    fn from_str(s: &str) -> Result<Token> {
        uuid::Uuid::parse_str(s.trim())
            .map(Token)
            .map_err(|_| Error::InvalidInput(format!("token {s:?} is not a UUID")))
    }
}

/// One claimed row: its id and all its columns as a JSON object (as they are after the claim).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClaimedRow {
    /// The row's id.
    pub id: RowId,
    /// The row as a JSON object, column name → value.
    pub data: serde_json::Value,
}

/// Row counts of a source, as `rowclaim stats` shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// Rows per status value (all rows of the table that pass the source's filter).
    pub by_status: BTreeMap<String, u64>,
    /// Claimed rows per owner token.
    pub claimed_by_owner: BTreeMap<String, u64>,
    /// Claimed rows whose lease has expired (claimable again).
    pub expired_leases: u64,
}

/// Work left in a source, from [`Claimer::backlog`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Backlog {
    /// Rows in the ready state.
    pub ready: u64,
    /// Rows claimed now.
    pub claimed: u64,
    /// Managed queue: ready jobs scheduled for later that never ran (not counted in `ready`).
    pub scheduled: u64,
    /// Whether claimed rows come back when their claimer dies (a lease column is mapped, or the
    /// strategy is lease-table). Without that, a claimed row stays claimed until someone settles it.
    pub claims_expire: bool,
}

impl Backlog {
    /// Whether any row may still need a worker: ready rows, or claimed rows that come back if their
    /// claimer dies.
    pub fn has_work(&self) -> bool {
        self.ready > 0 || (self.claims_expire && self.claimed > 0)
    }
}

/// How a locking read locks rows (seed 001).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockMode {
    /// `FOR SHARE` (`LOCK IN SHARE MODE` on MariaDB): others may read, not change.
    Share,
    /// `FOR UPDATE`: as if the rows were being updated.
    Update,
}

/// What a locking read does about rows another transaction has locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockWait {
    /// Wait for them.
    Wait,
    /// Fail at once with [`Error::Locked`].
    NoWait,
    /// Leave them out of the result.
    SkipLocked,
}

/// Takes claims on one source with one strategy. Cheap to clone; share it between tasks.
#[derive(Clone, Debug)]
pub struct Claimer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    db: Db,
    m: Mapping,
    strategy: Strategy,
    server: ServerInfo,
    /// Whether the table's record in the source registry is known to agree with this claimer's
    /// mapping: found so when the claimer was made (or the managed queue, which has none),
    /// else written (or checked again) by the first claim.
    recorded: AtomicBool,
    /// When this claimer last looked for rows whose lease expired, and whether its last claim
    /// came back short of its batch (see [`RESCUE_EVERY`]).
    rescue: StdMutex<Rescue>,
    /// Managed queue: its limited queues as last read, and when (see [`LIMITS_EVERY`]).
    limited: StdMutex<Option<(Instant, Vec<String>)>>,
}

/// How often a claimer of the managed queue reads again which of its queues have limits. An
/// ordinary claim never takes a limited queue's job (the claim itself checks); this only says
/// how soon a queue that became limited is served by the limited claim (`queue/limits.rs`).
const LIMITS_EVERY: Duration = Duration::from_secs(1);

/// How often a busy claimer also looks for rows whose lease expired. Looking costs a scan of an
/// index over claimed rows, which between vacuums also holds every row claimed and finished
/// since; a claimer whose ready rows keep coming needs it only now and then, and one that came
/// back short of its batch looks every time.
const RESCUE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Rescue {
    last: Option<Instant>,
    short: bool,
    /// Where the last full claim ended, and when the run of claims resuming there started
    /// from the beginning of the queue (see [`RESTART_EVERY`]).
    resume: Option<(Position, Instant)>,
}

/// How long claims resume where the last one ended before one starts again from the beginning
/// of the queue's order. Resuming skips the index entries of jobs claimed before (see
/// [`Position`]) but also any job that became claimable behind that place meanwhile: one of
/// higher priority, a retry due earlier, a job whose enqueue committed late. Those wait at most
/// this long (or until a claim comes back short, which also starts again from the beginning).
const RESTART_EVERY: Duration = Duration::from_secs(1);

/// A fenced change to rows a token holds.
#[derive(Clone)]
enum Change {
    Settle(Outcome),
    Extend(Duration),
}

impl Change {
    fn verb(&self) -> &'static str {
        match self {
            Change::Settle(Outcome::Done(_)) => "complete",
            Change::Settle(Outcome::Failed(_)) => "fail",
            Change::Settle(Outcome::Ready | Outcome::Unstarted) => "release",
            Change::Settle(Outcome::Retry { .. }) => "retry",
            Change::Settle(Outcome::Snooze { .. }) => "snooze",
            Change::Extend(_) => "extend",
        }
    }
}

/// How often a claim that lost every candidate to other claimers is tried again before it
/// reports "nothing claimed".
const LOST_RACE_RETRIES: u32 = 50;

impl Claimer {
    pub(crate) fn new(
        db: Db,
        m: Mapping,
        strategy: Strategy,
        server: ServerInfo,
        recorded: bool,
    ) -> Claimer {
        Claimer {
            inner: Arc::new(Inner {
                db,
                m,
                strategy,
                recorded: AtomicBool::new(recorded),
                server,
                rescue: StdMutex::default(),
                limited: StdMutex::default(),
            }),
        }
    }

    /// The strategy in use (what `auto` resolved to).
    pub fn strategy(&self) -> Strategy {
        self.inner.strategy
    }

    /// The database this claimer works on.
    pub fn db(&self) -> &Db {
        &self.inner.db
    }

    /// For a claimer of the managed queue: the queues it takes jobs from (empty: all).
    pub(crate) fn managed_queues(&self) -> Option<&[String]> {
        self.inner.m.queues.as_ref().map(|(_, q)| q.as_slice())
    }

    /// Whether its claims expire (a lease column, or the lease table): only then are there
    /// leases to renew.
    pub(crate) fn claims_expire(&self) -> bool {
        self.inner.strategy == Strategy::LeaseTable || self.inner.m.lease.is_some()
    }

    /// The server this claimer works on.
    pub fn server(&self) -> &ServerInfo {
        &self.inner.server
    }

    /// The checked mapping this claimer works with.
    pub(crate) fn mapping(&self) -> &Mapping {
        &self.inner.m
    }

    /// The source's table, as it was named.
    pub fn table_name(&self) -> &str {
        &self.inner.m.table_display
    }

    /// The table as the database's catalog names it (`schema.table`; `main.table` on SQLite):
    /// the same for every claimer of the table however its name was written, as
    /// `rowclaim_sources` records it and as metrics and traces label it.
    pub fn source_name(&self) -> &str {
        &self.inner.m.source_key
    }

    /// Parses an id given as text (e.g. on the command line) for this source's id column.
    pub fn parse_id(&self, text: &str) -> Result<RowId> {
        self.inner.m.id_kind.parse(text, "row id")
    }

    /// Claims up to `batch` rows for `lease`, in the source's order. An empty claim means nothing
    /// was claimable.
    ///
    /// Rows whose lease has expired are claimable again (and their attempts column, if mapped,
    /// counts up). Transient database errors are retried here, as are rounds in which other
    /// claimers took every candidate first.
    pub async fn claim(&self, batch: u32, lease: Duration) -> Result<Claim> {
        if batch == 0 {
            return Err(Error::InvalidInput("batch must be at least 1".into()));
        }
        check_lease(lease)?;
        let i = &self.inner;
        if !i.recorded.load(Ordering::Relaxed) {
            i.db.record(&i.m, i.strategy).await?;
            i.recorded.store(true, Ordering::Relaxed);
        }
        // A claimer whose queues are all limited has nothing for the ordinary claim, which
        // leaves limited queues alone: only the limited claim is asked.
        let only_limited = match self.managed_queues() {
            Some(mine) if !mine.is_empty() => {
                let limited = self.limited_queues().await?;
                mine.iter().all(|q| limited.contains(q))
            }
            _ => false,
        };
        let mut rounds = 0;
        loop {
            let token = Token::new();
            let token_text = token.to_string();
            // Only strategies that look for candidates in two arms can leave the expired arm out;
            // for the others (and without a lease column) there is nothing to throttle.
            let throttled = i.m.lease.is_some()
                && matches!(
                    i.strategy,
                    Strategy::SkipLocked | Strategy::Token | Strategy::Optimistic
                );
            let (expired, after) = {
                let r = i.rescue.lock().unwrap_or_else(|p| p.into_inner());
                (
                    !throttled || r.short || r.last.is_none_or(|t| t.elapsed() >= RESCUE_EVERY),
                    r.resume
                        .filter(|(_, since)| since.elapsed() < RESTART_EVERY)
                        .map(|(p, _)| p),
                )
            };
            let args = ClaimArgs {
                m: &i.m,
                strategy: Resolved::of(i.strategy)?,
                batch,
                lease,
                token: &token_text,
                expired,
                after,
            };
            // The lease runs from no earlier than this, by the database's clock.
            let sent = Instant::now();
            let claimed = if only_limited {
                Claimed::none()
            } else {
                retry_transient!(i.db.backend.claim(&args).await)?
            };
            let short = claimed.rows.len() < batch as usize;
            {
                let mut r = i.rescue.lock().unwrap_or_else(|p| p.into_inner());
                r.short = short;
                if expired {
                    r.last = Some(Instant::now());
                }
                r.resume = match (short, claimed.position, after) {
                    // Short: whatever is claimable may lie behind; start from the beginning.
                    (true, _, _) | (false, None, _) => None,
                    // From the beginning: a new run of resumed claims starts here.
                    (false, Some(p), None) => Some((p, Instant::now())),
                    // Resumed: go on from the later place (claims run side by side).
                    (false, Some(p), Some(_)) => r
                        .resume
                        .map(|(q, since)| (q.later(p), since))
                        .or(Some((p, Instant::now()))),
                };
            }
            if claimed.rows.is_empty() && (!expired || after.is_some()) && !only_limited {
                // Only ready rows were looked at, or only those after a place in the order.
                // Before answering "nothing claimable", look at all of them and at expired
                // leases too: the next round does, this claim having come back short.
                continue;
            }
            if claimed.rows.is_empty() && claimed.lost_race && rounds < LOST_RACE_RETRIES {
                rounds += 1;
                crate::backend::pause(rounds.min(6)).await;
                continue;
            }
            let mut found = claimed.rows;
            if i.m.queues.is_some() && found.len() < batch as usize {
                match self.claim_limited(&args, &mut found).await {
                    Ok(()) => {}
                    // Rows claimed already are this claim's, committed under its token:
                    // failing the claim would leave them held by nobody until their lease ran
                    // out. (A limited claim that failed changed nothing.)
                    Err(e) if !found.is_empty() => {
                        tracing::warn!(error = %e, "claiming from the limited queues failed");
                    }
                    Err(e) => return Err(e),
                }
            }
            let rows = self.rows_from_json(found)?;
            tracing::trace!(rows = rows.len(), "claimed");
            let ids: Vec<RowId> = rows.iter().map(|r| r.id.clone()).collect();
            return Ok(Claim {
                claimer: self.clone(),
                token,
                open: StdMutex::new(ids.iter().cloned().collect()),
                ids,
                rows,
                held: Mutex::new(claimed.held),
                settled: Notify::new(),
                lease,
                claimed_at: sent,
            });
        }
    }

    /// Managed queue: adds to `found` what the limits of this claimer's limited queues allow,
    /// up to `args.batch` rows in all, one queue after another (`queue/limits.rs`).
    async fn claim_limited(
        &self,
        args: &ClaimArgs<'_>,
        found: &mut Vec<serde_json::Value>,
    ) -> Result<()> {
        for queue in self.limited_queues().await? {
            let left = args
                .batch
                .saturating_sub(u32::try_from(found.len()).unwrap_or(args.batch));
            if left == 0 {
                break;
            }
            let args = ClaimArgs {
                batch: left,
                ..*args
            };
            found.extend(retry_transient!(dispatch!(
                &self.inner.db.backend,
                d => QueueStore::claim_limited(d, &args, &queue).await
            ))?);
        }
        Ok(())
    }

    /// Managed queue: which of this claimer's queues have limits (read at most every
    /// [`LIMITS_EVERY`]).
    async fn limited_queues(&self) -> Result<Vec<String>> {
        let i = &self.inner;
        {
            let last = i.limited.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, queues)) = &*last {
                if at.elapsed() < LIMITS_EVERY {
                    return Ok(queues.clone());
                }
            }
        }
        let mut queues =
            retry_transient!(dispatch!(&i.db.backend, d => crate::queue::limited_queues(d).await))?;
        if let Some(mine) = self.managed_queues().filter(|q| !q.is_empty()) {
            queues.retain(|q| mine.contains(q));
        }
        *i.limited.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), queues.clone()));
        Ok(queues)
    }

    fn rows_from_json(&self, rows: Vec<serde_json::Value>) -> Result<Vec<ClaimedRow>> {
        let m = &self.inner.m;
        rows.into_iter()
            .map(|data| {
                let id = data
                    .get(&m.id_name)
                    .and_then(|v| m.id_kind.id_from_json(v))
                    .ok_or_else(|| {
                        Error::InvalidInput(format!(
                            "claimed row has no usable {} in {data}",
                            m.id_name
                        ))
                    })?;
                Ok(ClaimedRow { id, data })
            })
            .collect()
    }

    /// Marks rows `token` holds as done. `ids` empty means all rows the token holds.
    /// Returns how many rows changed; [`Error::LeaseLost`] (and no change) if the token no longer
    /// holds one of them.
    pub async fn complete(&self, token: &Token, ids: &[RowId]) -> Result<u64> {
        self.settle(token, ids, Outcome::Done(None)).await
    }

    /// Marks rows `token` holds as failed. See [`Claimer::complete`].
    pub async fn fail(&self, token: &Token, ids: &[RowId]) -> Result<u64> {
        self.settle(token, ids, Outcome::Failed(None)).await
    }

    /// Gives rows `token` holds back: ready to be claimed again. See [`Claimer::complete`].
    pub async fn release(&self, token: &Token, ids: &[RowId]) -> Result<u64> {
        self.settle(token, ids, Outcome::Ready).await
    }

    /// Pushes the lease of rows `token` holds to now + `lease` (database clock).
    pub async fn extend(&self, token: &Token, ids: &[RowId], lease: Duration) -> Result<u64> {
        check_lease(lease)?;
        let i = &self.inner;
        if i.strategy != Strategy::LeaseTable && i.m.lease.is_none() {
            return Err(Error::Unsupported(format!(
                "{} has no lease column mapped, so its claims do not expire and cannot be extended",
                i.m.table_display
            )));
        }
        self.fenced(token, ids, Change::Extend(lease)).await
    }

    async fn settle(&self, token: &Token, ids: &[RowId], outcome: Outcome) -> Result<u64> {
        self.fenced(token, ids, Change::Settle(outcome)).await
    }

    /// Runs a fenced change; a short count becomes `LeaseLost` naming the rows the token lost.
    async fn fenced(&self, token: &Token, ids: &[RowId], change: Change) -> Result<u64> {
        self.check_by_token(change.verb())?;
        let i = &self.inner;
        let (b, t) = (&i.db.backend, token.to_string());
        let lost = |ids: Vec<RowId>| Error::LeaseLost {
            token: t.clone(),
            ids,
        };
        // A row named twice counts once (so the count check below stays exact).
        let mut seen = HashSet::with_capacity(ids.len());
        let unique: Vec<RowId> = ids.iter().filter(|id| seen.insert(*id)).cloned().collect();
        let ids = unique.as_slice();
        let list = if ids.is_empty() {
            None
        } else {
            Some(IdList::new(i.m.id_kind, ids)?)
        };
        let target = || match &list {
            None => Target::All,
            Some(l) => Target::Ids(l, ids.len()),
        };
        let n = retry_transient!(match &change {
            Change::Settle(o) => b.settle(&i.m, i.strategy, &t, target(), o.clone()).await,
            Change::Extend(lease) => b.extend(&i.m, i.strategy, &t, target(), *lease).await,
        })
        .map_err(|e| unknown_if_cut(e, change.verb(), ids.len()))?;
        match &list {
            None if n == 0 => Err(lost(vec![])),
            Some(l) if n as usize != ids.len() => {
                let held = b.still_held(&i.m, i.strategy, &t, l).await?;
                Err(lost(
                    ids.iter()
                        .filter(|id| !held.contains(id))
                        .cloned()
                        .collect(),
                ))
            }
            _ => Ok(n),
        }
    }

    fn check_by_token(&self, op: &str) -> Result<()> {
        let i = &self.inner;
        if i.strategy == Strategy::Transaction {
            return Err(Error::Unsupported(format!(
                "the transaction strategy keeps its rows in the claiming process's open \
                 transaction, so a token cannot {op} them from elsewhere; use the Claim itself \
                 (rowclaim work), or another strategy"
            )));
        }
        Ok(())
    }

    /// Opens a transaction and locks rows of the source with a locking read (seed 001):
    /// the rows `ids` (or, with `ids` = `None`, the first `limit` rows in the source's order that
    /// pass its filter). Locks last until [`LockedRows::commit`] or [`LockedRows::rollback`].
    ///
    /// With [`LockWait::NoWait`] a locked row fails the read with [`Error::Locked`]; with
    /// [`LockWait::SkipLocked`] locked rows are left out. On SQLite, whose locks cover the whole
    /// database and whose readers never block writers, both modes take the write lock
    /// (`BEGIN IMMEDIATE`), and [`LockWait::SkipLocked`] is not available.
    pub async fn lock(
        &self,
        ids: Option<&[RowId]>,
        limit: Option<u32>,
        mode: LockMode,
        wait: LockWait,
    ) -> Result<LockedRows> {
        let i = &self.inner;
        let list = ids.map(|ids| IdList::new(i.m.id_kind, ids)).transpose()?;
        let (held, rows) = i
            .db
            .backend
            .lock_rows(&i.m, list.as_ref(), limit, mode, wait)
            .await
            .map_err(|e| match e {
                // A driver whose server words NOWAIT's refusal differently says so itself.
                Error::Database(d) if crate::error::db_kind(&d) == Some(DbKind::LockConflict) => {
                    Error::Locked
                }
                other => other,
            })?;
        Ok(LockedRows {
            rows: self.rows_from_json(rows)?,
            held: Some(held),
        })
    }

    /// Row counts by status, claims by owner and expired leases.
    pub async fn stats(&self) -> Result<Stats> {
        let i = &self.inner;
        i.db.backend.stats(&i.m, i.strategy).await
    }

    /// How much work is left: ready rows (for the managed queue: due, or awaiting a retry) and
    /// claimed rows, within the source's queues and filter.
    pub async fn backlog(&self) -> Result<Backlog> {
        let i = &self.inner;
        let (ready, claimed, scheduled) = i.db.backend.backlog(&i.m).await?;
        Ok(Backlog {
            ready,
            claimed,
            scheduled,
            claims_expire: i.strategy == Strategy::LeaseTable || i.m.lease.is_some(),
        })
    }
}

/// A statement that was sent, and whose connection broke before the answer, may have been
/// carried out: that is [`Error::OutcomeUnknown`], not a plain failure.
fn unknown_if_cut(e: Error, verb: &str, rows: usize) -> Error {
    match e {
        Error::Database(d) if crate::error::may_have_happened(&d) => Error::OutcomeUnknown {
            what: match rows {
                0 => format!("the {verb} of the token's rows"),
                1 => format!("the {verb} of 1 row"),
                n => format!("the {verb} of {n} rows"),
            },
            source: d,
        },
        other => other,
    }
}

fn check_lease(lease: Duration) -> Result<()> {
    if lease.is_zero() {
        return Err(Error::InvalidInput(
            "lease must be longer than zero (e.g. 30s)".into(),
        ));
    }
    Ok(())
}

/// Rows claimed under one token. Settle each row with [`Claim::complete`], [`Claim::fail`] or
/// [`Claim::release`]; the methods take `&self`, so one claim's rows can be worked on
/// concurrently (wrap it in an `Arc`).
///
/// Rows left unsettled stay claimed until their lease expires, then others claim them again;
/// with the transaction strategy, dropping the claim rolls back at once.
#[derive(Debug)]
pub struct Claim {
    claimer: Claimer,
    token: Token,
    rows: Vec<ClaimedRow>,
    /// The rows' ids in the claim's order (they outlive `rows` when the runtime takes those).
    ids: Vec<RowId>,
    open: StdMutex<HashSet<RowId>>,
    held: Mutex<Option<Held>>,
    /// Signalled when the last open row is settled or given up (ends [`Claim::keep_alive`]).
    settled: Notify,
    lease: Duration,
    claimed_at: Instant,
}
