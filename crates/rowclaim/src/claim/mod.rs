//! The claim core: [`Claimer`] takes claims on one source, a [`Claim`] is a token, its rows and
//! the fenced operations on them. It knows no queue: a layer above that owns a source (the
//! managed queue) shapes its claims through a [`Shape`] it installs, and completes its mapping
//! with a [`crate::mapping::Lifecycle`].
//!
//! One claim, top to bottom: [`Claimer::claim`] → (a layer's [`Shape::claim`] →)
//! [`Claimer::claim_with`] → the driver's [`ClaimStore::claim`](crate::backend::ClaimStore) →
//! the strategy's statement builder in `backend/<database>/claim.rs`.

mod choice;
mod claimed;
mod fenced;
mod making;
mod rows;
#[cfg(test)]
pub(crate) mod snapshots;
mod token;
mod words;

pub(crate) use choice::auto_choice;
pub use claimed::{Claim, LockedRows};
pub use rows::{RowFilter, SourceRow};
pub use token::Token;
pub(crate) use words::Line;
pub use words::{Backlog, ClaimedRow};

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, Notify};

use crate::backend::{
    retry_transient, ClaimArgs, Claimed, Committed, Held, Outcome, Resolved, ServerInfo,
};
use crate::db::Db;
use crate::error::{DbKind, Error, Result};
use crate::id::RowId;
use crate::locking::{LockMode, LockWait};
use crate::mapping::{Fragment, Lifecycle, Mapping, Naming};
use crate::report::Stats;
use crate::strategy::Strategy;
use crate::value::IdList;
use fenced::{check_lease, unknown_if_cut, Change};

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
    /// The strategy as the driver runs it.
    resolved: Resolved,
    server: ServerInfo,
    /// Whether the table's record in the source registry is known to agree with this claimer's
    /// mapping: found so when the claimer was made (or a layer above owns the table, which has
    /// none), else written (or checked again) by the first claim.
    recorded: AtomicBool,
    /// When this claimer last looked for rows whose lease expired, and whether its last claim
    /// came back short of its batch (see [`RESCUE_EVERY`]).
    rescue: StdMutex<Rescue>,
    /// How a layer above shapes this claimer's claims, when one made it.
    shape: Option<Arc<dyn Shape>>,
    /// What its tokens end in, when a worker tagged them ([`Token::tagged`]).
    tag: Option<u64>,
    /// The slots of the worker that runs its claims' lines ([`Line`]) as they say; only such
    /// a claimer's claims hold lines (a layer above takes none for any other caller).
    line_slots: Option<usize>,
}

/// How often a busy claimer also looks for rows whose lease expired. Looking costs a scan of an
/// index over claimed rows, which between vacuums also holds every row claimed and finished
/// since; a claimer whose ready rows keep coming needs it only now and then, and one that came
/// back short of its batch looks every time.
const RESCUE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Rescue {
    last: Option<Instant>,
    short: bool,
}

/// How often a claim that lost every candidate to other claimers is tried again before it
/// reports "nothing claimed".
const LOST_RACE_RETRIES: u32 = 50;

/// How a layer above (the managed queue) shapes the claims of a claimer it made: where to look
/// for ready rows, and rows it adds under the same token. The claim core calls it and knows
/// nothing else of it.
#[async_trait::async_trait]
pub(crate) trait Shape: Send + Sync + fmt::Debug {
    /// Claims up to `batch` rows for `lease` with `claimer`, through [`Claimer::claim_with`];
    /// `own` and `committed`: see [`Claimer::claim_behind`].
    async fn claim(
        &self,
        claimer: &Claimer,
        batch: u32,
        lease: Duration,
        own: &[Token],
        committed: Option<Committed<'_>>,
    ) -> Result<Claim>;
    /// The shape as itself, for the layer that made it to recognise it.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Whether its claims come under limits (the managed queue's limited queues), where a
    /// result written may free room for the next claim (a concurrency limit counts running
    /// rows): such results are written without waiting for company.
    fn limited(&self) -> bool {
        false
    }
    /// Whether its last claims took runs of keys' lines for the worker to run one after another
    /// ([`Line`]).
    fn takes_runs(&self) -> bool {
        false
    }
}

/// A layer above the claim core that owns a source's table (the managed queue): it completes
/// the source's mapping and shapes its claims ([`crate::Db::layered_claimer`]).
pub(crate) trait Layer: Send + Sync {
    /// What the layer keeps of each row and asks of claims, for the checked mapping `m` (its
    /// names quoted as `naming` quotes them).
    fn lifecycle(&self, m: &Mapping, naming: &Naming) -> Lifecycle;
    /// How it shapes the claims of its claimer.
    fn shape(&self) -> Arc<dyn Shape>;
}

/// Rows a layer above adds to a claim under its token (the managed queue's limited claim).
#[async_trait::async_trait]
pub(crate) trait More: Send + Sync {
    /// Adds to `rows` up to `args.batch` rows in all, claimed under `args.token` with its
    /// lease; returns the instant the added rows' lease runs from at the earliest (`None`:
    /// none added). When it fails it has changed nothing, but for rows it claimed and could
    /// not read back (the managed queue reads them after its claim commits): those are taken
    /// again once their lease runs out, as after a claim whose answer was lost.
    async fn claim_more(
        &self,
        args: &ClaimArgs<'_>,
        rows: &mut Vec<serde_json::Value>,
    ) -> Result<Option<Instant>>;
}

/// One claim as a layer above asks for it ([`Claimer::claim_with`]).
#[derive(Clone, Copy)]
pub(crate) struct Claiming<'a> {
    pub batch: u32,
    pub lease: Duration,
    /// Look for ready rows in these arms, in order ([`ClaimArgs::arms`]); `None`: all of them.
    pub arms: Option<&'a [Fragment]>,
    /// Leave the source's own claim out: `more` claims every row.
    pub skip: bool,
    /// Claims more rows under the same token while the batch has room.
    pub more: Option<&'a dyn More>,
    /// Called once the claim has written all it writes ([`ClaimArgs::committed`]); passed to
    /// the driver only where nothing is claimed after its statement (no `more`).
    pub committed: Option<Committed<'a>>,
}

impl Claiming<'_> {
    /// A claim of the source's rows, nothing more.
    pub(crate) fn plain(batch: u32, lease: Duration) -> Claiming<'static> {
        Claiming {
            batch,
            lease,
            arms: None,
            skip: false,
            more: None,
            committed: None,
        }
    }
}

impl Claimer {
    pub(crate) fn new(
        db: Db,
        m: Mapping,
        strategy: Strategy,
        server: ServerInfo,
        recorded: bool,
    ) -> Result<Claimer> {
        Ok(Claimer {
            inner: Arc::new(Inner {
                db,
                m,
                strategy,
                resolved: Resolved::of(strategy)?,
                recorded: AtomicBool::new(recorded),
                server,
                rescue: StdMutex::default(),
                shape: None,
                tag: None,
                line_slots: None,
            }),
        })
    }

    /// This claimer with its claims shaped by a layer above (which made it).
    pub(crate) fn shaped(self, shape: Arc<dyn Shape>) -> Claimer {
        self.remade(|i| i.shape = Some(shape))
    }

    /// This claimer with every token it makes ending in `tag` ([`Token::tagged`]): a worker's
    /// claims, told apart by the worker's id.
    pub(crate) fn tagged(self, tag: u64) -> Claimer {
        self.remade(|i| i.tag = Some(tag))
    }

    /// This claimer for a worker of `slots` slots that runs its claims' lines ([`Line`]).
    pub(crate) fn running_lines(self, slots: usize) -> Claimer {
        self.remade(|i| i.line_slots = Some(slots.max(1)))
    }

    /// The slots of the worker that runs this claimer's lines; `None`: its claims hold none.
    pub(crate) fn line_slots(&self) -> Option<usize> {
        self.inner.line_slots
    }

    fn remade(&self, change: impl FnOnce(&mut Inner)) -> Claimer {
        let i = &self.inner;
        let mut inner = Inner {
            db: i.db.clone(),
            m: i.m.clone(),
            strategy: i.strategy,
            resolved: i.resolved,
            recorded: AtomicBool::new(i.recorded.load(Ordering::Relaxed)),
            server: i.server.clone(),
            rescue: StdMutex::default(),
            shape: i.shape.clone(),
            tag: i.tag,
            line_slots: i.line_slots,
        };
        change(&mut inner);
        Claimer {
            inner: Arc::new(inner),
        }
    }

    /// A fresh token for a claim: tagged when a worker tagged this claimer.
    fn token(&self) -> Token {
        self.inner.tag.map_or_else(Token::new, Token::tagged)
    }

    /// How a layer above shapes this claimer's claims, if one does.
    pub(crate) fn shape(&self) -> Option<&dyn Shape> {
        self.inner.shape.as_deref()
    }

    /// Whether its claims come under limits (see [`Shape::limited`]).
    pub(crate) fn limited(&self) -> bool {
        self.shape().is_some_and(Shape::limited)
    }

    /// Whether its claims take runs of keys' lines (see [`Shape::takes_runs`]).
    pub(crate) fn takes_runs(&self) -> bool {
        self.shape().is_some_and(Shape::takes_runs)
    }

    /// The strategy in use (what `auto` resolved to).
    pub fn strategy(&self) -> Strategy {
        self.inner.strategy
    }

    /// The database this claimer works on.
    pub fn db(&self) -> &Db {
        &self.inner.db
    }

    /// Whether its claims expire (a lease column, or the lease table): only then are there
    /// leases to renew.
    pub(crate) fn claims_expire(&self) -> bool {
        self.inner.strategy == Strategy::LeaseTable || self.inner.m.lease.is_some()
    }

    /// Whether a row given back "for later" (a snooze) can wait on this source: the managed
    /// queue keeps when a job is due; a table of one's own holds the row back in its lease
    /// column (claimed by nobody until the lease ends), which the lease-table and transaction
    /// strategies do not use.
    pub(crate) fn snoozes(&self) -> bool {
        let i = &self.inner;
        i.m.lifecycle.is_some()
            || (i.m.lease.is_some()
                && !matches!(i.strategy, Strategy::LeaseTable | Strategy::Transaction))
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
        self.claim_behind(batch, lease, &[], None).await
    }

    /// [`Claimer::claim`] for a worker that runs its claims' lines ([`Line`]) and still runs
    /// those of the claims `own` whole: each row of them either runs, waits in its line, or
    /// finished for good (none went back, was lost or given up), and every row of a line's
    /// key it holds is in that line ([`Claim::lines_whole`]). The next rows of such a line
    /// may then be claimed while its rows run: they join it, to run behind them.
    ///
    /// `committed` is called once the claim has committed all it writes, where the driver can
    /// tell, before its rows are read ([`ClaimArgs::committed`]); a claim that claims nothing,
    /// or fails before its commit, returns without calling it.
    pub(crate) async fn claim_behind(
        &self,
        batch: u32,
        lease: Duration,
        own: &[Token],
        committed: Option<Committed<'_>>,
    ) -> Result<Claim> {
        if batch == 0 {
            return Err(Error::InvalidInput("batch must be at least 1".into()));
        }
        check_lease(lease)?;
        let claimed = match &self.inner.shape {
            Some(shape) => shape.claim(self, batch, lease, own, committed).await,
            None => {
                self.claim_with(Claiming {
                    committed,
                    ..Claiming::plain(batch, lease)
                })
                .await
            }
        };
        match claimed {
            // A refusal for want of a privilege says which, and the GRANT.
            Err(e) => {
                let i = &self.inner;
                let recorded = i.recorded.load(Ordering::Relaxed);
                Err(i.db.explain_denied(&i.m, i.strategy, recorded, e).await)
            }
            claimed => claimed,
        }
    }

    /// One claim as `how` says: the source's rows (unless skipped), in the arms given, then the
    /// rows `more` adds, all under one fresh token.
    pub(crate) async fn claim_with(&self, how: Claiming<'_>) -> Result<Claim> {
        let i = &self.inner;
        if !i.recorded.load(Ordering::Relaxed) {
            // The first claim that can take rows records the mapping. One that would find
            // nothing (a wrong ready value, an empty table) records nothing, so that it cannot
            // lock out the mapping that was meant; with nothing to take there is nothing to
            // guard. (The count is of ready and claimed rows: it errs towards recording.)
            if !self.backlog().await?.has_work() {
                return self.new_claim(self.token(), Vec::new(), None, how.lease, Instant::now());
            }
            i.db.record(&i.m, i.strategy).await?;
            i.recorded.store(true, Ordering::Relaxed);
        }
        // Only strategies that look for candidates in two arms can leave the expired arm out
        // (see RESCUE_EVERY); for the others, and without a lease column, nothing to throttle.
        let throttled = i.m.lease.is_some()
            && matches!(
                i.strategy,
                Strategy::SkipLocked | Strategy::Token | Strategy::Optimistic
            );
        let mut rounds = 0;
        loop {
            let token = self.token();
            let token_text = token.to_string();
            let expired = {
                let r = i.rescue.lock().unwrap_or_else(|p| p.into_inner());
                !throttled || r.short || r.last.is_none_or(|t| t.elapsed() >= RESCUE_EVERY)
            };
            let args = ClaimArgs {
                m: &i.m,
                strategy: i.resolved,
                batch: how.batch,
                lease: how.lease,
                token: &token_text,
                expired,
                arms: how.arms,
                // Rows claimed by `more` after the driver's statement write too.
                committed: how.committed.filter(|_| how.more.is_none()),
            };
            // The lease runs from no earlier than this, by the database's clock.
            let sent = Instant::now();
            let claimed = if how.skip {
                Claimed::none()
            } else {
                retry_transient!(i.db.backend.claims().claim(&args).await)?
            };
            self.claimed(claimed.rows.len() < how.batch as usize, expired);
            if claimed.rows.is_empty() && !how.skip {
                if !expired {
                    // Only ready rows were looked at. Before answering "nothing claimable",
                    // look at expired leases too: the next round does, this one having come
                    // back short.
                    continue;
                }
                if claimed.lost_race && rounds < LOST_RACE_RETRIES {
                    rounds += 1;
                    crate::backend::pause(rounds.min(6)).await;
                    continue;
                }
            }
            let own = claimed.locked_at.unwrap_or(sent);
            let mut rows = claimed.rows;
            let had_own = !rows.is_empty();
            let added = match how.more {
                Some(more) => self.add_more(more, &args, &mut rows).await?,
                None => None,
            };
            // The earliest start holds for all: the source's own claim's when it took rows (a
            // layer's rows are leased by later statements), else the added rows' own. A claim
            // of limited queues only must not count its wait for SQLite's write lock against
            // the lease, or rows that arrive with most of it left are given up unstarted.
            let from = if had_own { own } else { added.unwrap_or(own) };
            return self.new_claim(token, rows, claimed.held, how.lease, from);
        }
    }

    /// Notes how a claim went, for the next one's look at expired leases.
    fn claimed(&self, short: bool, expired: bool) {
        let mut r = self.inner.rescue.lock().unwrap_or_else(|p| p.into_inner());
        r.short = short;
        if expired {
            r.last = Some(Instant::now());
        }
    }

    /// Adds the rows a layer above claims beside the source's own; returns when the added rows'
    /// lease runs from, if known (see [`More::claim_more`]). Rows claimed already are this
    /// claim's, committed under its token: failing the claim would leave them held by nobody
    /// until their lease ran out (and a claim of more that failed changed nothing).
    async fn add_more(
        &self,
        more: &dyn More,
        args: &ClaimArgs<'_>,
        rows: &mut Vec<serde_json::Value>,
    ) -> Result<Option<Instant>> {
        if rows.len() >= args.batch as usize {
            return Ok(None);
        }
        match more.claim_more(args, rows).await {
            Ok(from) => Ok(from),
            Err(e) if !rows.is_empty() => {
                // Unknown for what was added before the failure: the caller's earlier start.
                tracing::warn!(error = %e, "claiming more rows for a claim failed");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// A claim of `rows`, taken under `token` at `sent`.
    fn new_claim(
        &self,
        token: Token,
        rows: Vec<serde_json::Value>,
        held: Option<Held>,
        lease: Duration,
        sent: Instant,
    ) -> Result<Claim> {
        let rows = self.rows_from_json(rows)?;
        tracing::trace!(rows = rows.len(), "claimed");
        let ids: Vec<RowId> = rows.iter().map(|r| r.id.clone()).collect();
        Ok(Claim {
            claimer: self.clone(),
            token,
            open: StdMutex::new(ids.iter().cloned().collect()),
            ids,
            rows,
            lines: Vec::new(),
            lines_whole: false,
            held: Mutex::new(held),
            settled: Notify::new(),
            lease,
            claimed_at: sent,
        })
    }

    fn rows_from_json(&self, rows: Vec<serde_json::Value>) -> Result<Vec<ClaimedRow>> {
        let m = &self.inner.m;
        rows.into_iter()
            .map(|data| {
                let id = m.id_of(&data)?;
                Ok(ClaimedRow { id, data })
            })
            .collect()
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
            .store()
            .lock_rows(&i.m, list.as_ref(), limit, mode, wait)
            .await
            .map_err(|e| match e {
                // A driver whose server words NOWAIT's refusal differently says so itself.
                Error::Database(d) if d.db_kind() == Some(DbKind::LockConflict) => Error::Locked,
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
        i.db.backend.store().stats(&i.m, i.strategy).await
    }

    /// How much work is left: ready rows (where rows have a due time: due, or awaiting a retry)
    /// and claimed rows, within the source's filter (and what a layer above counts as its work).
    pub async fn backlog(&self) -> Result<Backlog> {
        let i = &self.inner;
        let (ready, claimed, scheduled) = i.db.backend.store().backlog(&i.m).await?;
        Ok(Backlog {
            ready,
            claimed,
            scheduled,
            claims_expire: i.strategy == Strategy::LeaseTable || i.m.lease.is_some(),
        })
    }
}
