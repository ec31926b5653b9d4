//! A limited claim ([`claim`]): under the queue's turn, what runs and what started is counted,
//! what the limits allow picked (`pick.rs`), marked claimed and, for a rate, its starts
//! recorded; the rows read once it committed ([`claimed_rows`]). The module above says why it
//! is built so.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::pick::WINDOW;
use super::{
    heads_sql, keyless_sql, pick_ids_sql, runs_sql, QueueLimits, COLUMNS, LIMITED, READY, RUNNING,
};
use crate::backend::run::Run;
use crate::backend::sql::{self, Binder, Dialect, IntoRow, Stmt};
use crate::backend::ClaimArgs;
use crate::error::Result;
use crate::id::RowId;
use crate::queue::migrate::Schema;
use crate::value::IdList;

/// How often a claimer looks for jobs without a key behind the first [`WINDOW`] ready jobs of a
/// limited queue where it found none the last time, while the jobs it finds in front keep it
/// busy. That look reads the queue's ready jobs to their end where none are keyless (no index
/// holds keyless jobs apart): a table of 5,000 jobs of 10 keys, each claim 1.2 ms, more than
/// its other statements together. A claim that would otherwise come back empty always looks
/// (but where the worker runs lines, `fronts`), so such a job waits at most this long more for
/// a free slot while the claimer finds other jobs (as a job whose lease ran out waits, `claim/`).
pub(crate) const KEYLESS_EVERY: Duration = Duration::from_secs(1);

/// What a claimer learned of one limited queue's lines in its last claims, so that its next
/// claim reads no more than it needs (PostgreSQL, under per-key limits, where [`heads_sql`]
/// reads the fronts of lines key by key).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seen {
    /// Keys with a job in line when it last read the fronts of lines (keys whose jobs all wait
    /// for a later time are not counted, and cost such a read more). Where the fronts of that
    /// many lines leave most of a claim's room, the claim reads them first and skips the first
    /// [`WINDOW`] ready jobs (and the count of them), which could not fill it either: 10 keys
    /// with deep lines read 10 fronts, not 1,000 jobs.
    keys: Option<i64>,
    /// When it last looked for jobs without a key behind the window, and whether it found any.
    keyless_at: Option<Instant>,
    keyless_found: bool,
    /// The queue's line width as its last claim read the limits ([`QueueLimits::line_width`]),
    /// where the claimer takes runs (`slots`): where set, a claim's rows of one key make a line.
    pub(crate) width: Option<u32>,
    /// The slots of the worker that runs the claimer's lines, set before each claim; `None`
    /// (any other caller): no runs, no lines.
    pub(crate) slots: Option<usize>,
    /// Whether its last look at the lines took runs (longer than the line's width).
    pub(crate) took_runs: bool,
}

impl Seen {
    /// Whether a claim of up to `room` jobs under `limits` reads the fronts of lines first.
    fn few_keys(&self, limits: &QueueLimits, room: i64) -> bool {
        self.keys
            .is_some_and(|k| k.saturating_mul(limits.line_front()).saturating_mul(2) < room)
    }

    /// How many of an idle key's line a claim of up to `room` jobs takes: the room shared among
    /// the keys last seen, or among the worker's slots where those are more (a run takes about
    /// as long as the worker's other rows then, and its rows waiting do not keep the worker from
    /// claiming other work much longer than those would), at least the key's concurrency; only
    /// that where the line is not the worker's to run ([`QueueLimits::line_width`], `slots`)
    /// or no keys were seen yet.
    fn run_length(&self, limits: &QueueLimits, room: i64) -> i64 {
        match (self.width, self.keys, self.slots) {
            (Some(n), Some(keys), Some(slots)) if keys > 0 => {
                let slots = i64::try_from(slots).unwrap_or(i64::MAX);
                (room / keys.max(slots)).max(i64::from(n))
            }
            _ => limits.line_front(),
        }
    }

    /// Whether a claim looks for jobs without a key behind the window: where the last look
    /// found some, or [`KEYLESS_EVERY`] after the last.
    fn keyless_due(&self) -> bool {
        self.keyless_found
            || self
                .keyless_at
                .is_none_or(|at| at.elapsed() >= KEYLESS_EVERY)
    }
}

/// What a limited claim took ([`claim`]).
pub(crate) struct Taken {
    /// The jobs, by id.
    pub ids: IdList,
    /// Of those, the runs of keys' lines ([`runs_sql`]): each key's jobs, by id, in line
    /// order, with the number of its line (the key's, so that a key's next run joins it). The
    /// worker runs each line `width` at once ([`QueueLimits::line_width`]).
    pub runs: Vec<(i64, Vec<i64>)>,
    /// How many of a run's jobs may run at once.
    pub width: u32,
    /// Every keyed job it took is in one of `runs`: the worker may claim the next runs of
    /// their lines while it runs them (`own` in [`runs_sql`]). Not where jobs came in claim
    /// order (their keys are not known here) or by the fronts of lines without runs.
    pub whole: bool,
    /// The jobs' rows, where the mark returned them (a claim that took runs: see
    /// [`mark_returning_sql`]), in the order the claim picked them; else [`claimed_rows`]
    /// reads them once the claim committed.
    pub rows: Option<Vec<serde_json::Value>>,
}

/// Claims up to `a.batch` jobs of the limited queue `queue` (of `kinds`, all when empty) that
/// its limits allow, in the transaction `tx`: their ids (the caller commits, then reads the
/// rows with [`claimed_rows`], outside any retry of the claim). None when the queue is paused
/// or no longer limited (the ordinary claim serves it then). `wait_for_others`: first wait
/// until this server has applied what other servers committed (a Galera node), so that the
/// counts below see every job they started. `seen`: what the claimer learned of the queue's
/// lines before, brought up to date.
/// `own`: the tokens of claims whose lines the worker still runs whole ([`runs_sql`]).
pub(crate) async fn claim<R: Run + ?Sized>(
    tx: &R,
    a: &ClaimArgs<'_>,
    queue: &str,
    kinds: &[String],
    wait_for_others: bool,
    seen: &mut Seen,
    own: &[String],
) -> Result<Option<Taken>>
where
    R::Sql: Schema,
{
    if let Some(setup) = R::Sql::LIMITED_CLAIM_SETUP {
        tx.execute(Stmt::new(setup.to_owned(), Binder::new()))
            .await?;
    }
    // The queue's turn: its row lock, held to the end of the transaction.
    if tx.execute(turn_sql(queue, wait_for_others)).await? == 0 {
        return Ok(None);
    }
    let Some((_, columns)) = tx.named_numbers(read_sql(queue), 8).await?.pop() else {
        return Ok(None);
    };
    let limits = QueueLimits::from_columns(&columns);
    seen.width = seen.slots.and(limits.line_width());
    let count = |i: usize| columns.get(i).copied().flatten().unwrap_or(0);
    let room = limits.room(i64::from(a.batch), count(6), count(7));
    if room <= 0 {
        return Ok(None);
    }
    let further = limits.looks_further::<R::Sql>();
    let fronts_first = further && seen.few_keys(&limits, room);
    let pick = pick_ids_sql(queue, kinds, &limits, room, !fronts_first);
    let mut picked = tx.texts(pick).await?;
    let (mut lines, mut keyless) = (HashMap::new(), HashSet::new());
    if fronts_first
        || (further
            && (picked.len() as i64) * 2 < room
            && (seen.width.is_some() || tx.count(waiting_sql(queue)).await? >= WINDOW))
    {
        // The first jobs in claim order left most of the room (or could not fill it), and
        // more wait behind them: the fronts of lines, and jobs without a key. (Where the
        // worker may run a key's line, the lines behind those fronts are worth a look however
        // few jobs wait.)
        let nothing_yet = picked.is_empty();
        let fronts = fronts(tx, queue, kinds, &limits, room, nothing_yet, seen, own).await?;
        (lines, keyless) = add_fronts(&mut picked, fronts, room);
    }
    if picked.is_empty() {
        return Ok(None);
    }
    let runs = runs_of(&picked, &lines, seen.width);
    let whole = !runs.is_empty()
        && picked
            .iter()
            .all(|id| lines.contains_key(id) || keyless.contains(id));
    let picked = a.m.parse_ids(&picked)?;
    let ids = IdList::new(a.m.id_kind, &picked)?;
    let rows = if seen.took_runs {
        let marked = read_rows(tx, mark_returning_sql(a, &ids)).await?;
        Some(in_order(a, &picked, marked)?)
    } else {
        tx.execute(mark_sql(a, &ids)).await?;
        None
    };
    if let Some(keep_ms) = limits.longest_period_ms() {
        tx.execute(starts_sql(a, &ids)).await?;
        tx.execute(prune_starts_sql(queue, keep_ms)).await?;
    }
    Ok(Some(Taken {
        ids,
        runs,
        width: seen.width.unwrap_or(1),
        whole,
        rows,
    }))
}

/// Adds to `picked` the `fronts` not among them while the claim has room (`room` jobs in all);
/// of every front, its line's number where it is of a run, and the fronts without a key.
fn add_fronts(
    picked: &mut Vec<String>,
    fronts: Vec<Front>,
    room: i64,
) -> (HashMap<String, i64>, HashSet<String>) {
    let (mut lines, mut keyless) = (HashMap::new(), HashSet::new());
    let known: HashSet<String> = picked.iter().cloned().collect();
    let left = usize::try_from(room)
        .unwrap_or(usize::MAX)
        .saturating_sub(picked.len());
    let mut added = 0;
    for Front { id, line, keyed } in fronts {
        if let Some(line) = line {
            lines.insert(id.clone(), line);
        }
        if !keyed {
            keyless.insert(id.clone());
        }
        if added < left && !known.contains(&id) {
            picked.push(id);
            added += 1;
        }
    }
    (lines, keyless)
}

/// The rows of `marked` (as [`mark_returning_sql`] returns them, in no order) in the order of
/// their ids in `picked`.
fn in_order(
    a: &ClaimArgs<'_>,
    picked: &[RowId],
    marked: Vec<serde_json::Value>,
) -> Result<Vec<serde_json::Value>> {
    let place: HashMap<&RowId, usize> = picked.iter().enumerate().map(|(i, id)| (id, i)).collect();
    let mut rows = marked
        .into_iter()
        .map(|row| {
            let at = place.get(&a.m.id_of(&row)?).copied().unwrap_or(usize::MAX);
            Ok((at, row))
        })
        .collect::<Result<Vec<_>>>()?;
    rows.sort_unstable_by_key(|(at, _)| *at);
    Ok(rows.into_iter().map(|(_, row)| row).collect())
}

/// The jobs of `picked` that share a line (`lines`, from [`runs_sql`]), by line, in line
/// order: each key's run, also one no longer than `width` (a key's jobs a worker holds are all
/// in its line, which its next run may join).
fn runs_of(
    picked: &[String],
    lines: &HashMap<String, i64>,
    width: Option<u32>,
) -> Vec<(i64, Vec<i64>)> {
    if width.is_none() {
        return Vec::new();
    }
    let mut by_line: HashMap<i64, Vec<i64>> = HashMap::new();
    for id in picked {
        if let (Some(line), Ok(n)) = (lines.get(id), id.parse::<i64>()) {
            by_line.entry(*line).or_default().push(n);
        }
    }
    let mut runs: Vec<(i64, Vec<i64>)> = by_line.into_iter().collect();
    for (_, run) in &mut runs {
        run.sort_unstable();
    }
    runs
}

/// A job the fronts of lines offer ([`fronts`]).
struct Front {
    id: String,
    /// The number of its key's line, where it is of a run ([`runs_sql`]).
    line: Option<i64>,
    /// It has a key (else it came from the arm of jobs without one).
    keyed: bool,
}

/// The rows of the jobs a limited claim took ([`claim`]), as JSON, as any claim returns them,
/// read after its transaction committed: the queue's turn is not held while they are read
/// (1,000 keys: the read was a fifth of the time each claim held it), and the jobs are the
/// claim's by then. Should the read fail, the jobs run again once their lease runs out, as
/// after a claim whose answer was lost.
pub(crate) async fn claimed_rows<R: Run + ?Sized>(
    r: &R,
    a: &ClaimArgs<'_>,
    ids: &IdList,
) -> Result<Vec<serde_json::Value>> {
    read_rows(r, claimed_sql(a, ids)).await
}

/// The claimed rows statement `s` returns ([`Dialect::claimed_select`]), as JSON objects.
async fn read_rows<R: Run + ?Sized>(r: &R, s: Stmt<R::Sql>) -> Result<Vec<serde_json::Value>> {
    let rows: Vec<<R::Sql as Dialect>::Claimed> = r.fetch_all(s).await?;
    rows.into_iter().map(IntoRow::into_row).collect()
}

/// The ids of the fronts of the queue's lines that may start ([`heads_sql`]), with jobs
/// without a key where they are due ([`Seen::keyless_due`]), or where the claim would come
/// back empty without them (`nothing_yet`: it found nothing before this look, and the fronts
/// are all busy). Notes what it saw. `own`: as [`runs_sql`] takes it.
#[allow(clippy::too_many_arguments)]
async fn fronts<R: Run + ?Sized>(
    tx: &R,
    queue: &str,
    kinds: &[String],
    limits: &QueueLimits,
    room: i64,
    nothing_yet: bool,
    seen: &mut Seen,
    own: &[String],
) -> Result<Vec<Front>>
where
    R::Sql: Schema,
{
    let mut keyless = seen.keyless_due();
    let run = seen.run_length(limits, room);
    // Where the worker may run a key's line (`QueueLimits::line_width`), runs of it; each row
    // then also names its key's line.
    seen.took_runs = seen.width.is_some_and(|width| run > i64::from(width));
    let (heads, numbers) = match seen.width {
        Some(width) if seen.took_runs => {
            (runs_sql(queue, kinds, width, run, room, keyless, own), 3)
        }
        _ => (heads_sql(queue, kinds, limits, room, keyless), 2),
    };
    let mut rows = tx.named_numbers(heads, numbers).await?;
    // The count of keys is on every row; with none, the last one stands.
    if let Some((_, numbers)) = rows.first() {
        seen.keys = numbers.first().copied().flatten();
    }
    // Nothing else to claim: look for jobs without a key after all. Not where the worker runs
    // lines: its own runs keep every key busy between its claims, and each such look read the
    // whole backlog (200,000 jobs of 10 keys: 30 ms a claim); a job without a key waits at
    // most `KEYLESS_EVERY` longer there.
    if rows.is_empty() && nothing_yet && !keyless && seen.width.is_none() {
        keyless = true;
        rows = tx.named_numbers(keyless_sql(queue, kinds, room), 2).await?;
    }
    if keyless {
        seen.keyless_at = Some(Instant::now());
        seen.keyless_found = rows
            .iter()
            .any(|(_, numbers)| numbers.get(1).copied().flatten() == Some(1));
    }
    // A run's rows say their key's line (`runs_sql`), after the count and the keyless.
    Ok(rows
        .into_iter()
        .map(|(id, numbers)| Front {
            id,
            line: numbers.get(2).copied().flatten(),
            keyed: numbers.get(1).copied().flatten() != Some(1),
        })
        .collect())
}

/// The queue's turn: a write of its row, whose lock the claim's transaction holds to its end,
/// so that limited claims of one queue take turns. Nothing when it is paused or no longer
/// limited.
pub(crate) fn turn_sql<D: Dialect>(queue: &str, wait_for_others: bool) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    // On Galera a node applies the other nodes' claims moments after they commit: without the
    // wait (2: before an UPDATE) a claim 14 ms after another's on a second node counted the
    // running jobs without it and ran 3 in a queue limited to 2.
    let wait = sql::write_after_applied(wait_for_others);
    let sql = format!(
        "{wait}UPDATE rowclaim_queues SET claim_turns = claim_turns + 1 WHERE name = {} \
         AND paused_at IS NULL AND {LIMITED}",
        b.bind(queue.to_owned())
    );
    Stmt::new(sql, b)
}

/// The queue's limits, and what runs and what started within its rate period, in one read.
/// (A count a limit does not need is not made.)
pub(crate) fn read_sql<D: Dialect>(queue: &str) -> Stmt<D> {
    let (now, now_ms) = (D::NOW, D::epoch_ms(D::NOW));
    let mut b = Binder::<D>::new();
    let sql = format!(
        "SELECT name, {COLUMNS}, \
         CASE WHEN concurrency IS NULL THEN 0 ELSE (SELECT COUNT(*) FROM rowclaim_jobs j \
           WHERE j.queue = q.name AND j.status = {RUNNING} AND j.lease_until >= {now}) END, \
         CASE WHEN rate IS NULL THEN 0 ELSE (SELECT COUNT(*) FROM rowclaim_starts s \
           WHERE s.queue = q.name AND s.started_ms >= {now_ms} - q.rate_period_ms) END \
         FROM rowclaim_queues q WHERE name = {}",
        b.bind(queue.to_owned())
    );
    Stmt::new(sql, b)
}

/// How many due jobs of `queue` are ready, up to [`WINDOW`]: whether more wait behind the first
/// jobs a claim looked at. Asked only when those left most of its room, so that a claim that
/// fills its room from them does not walk a thousand index entries to learn it.
pub(crate) fn waiting_sql<D: Dialect>(queue: &str) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "SELECT COUNT(*) FROM (SELECT 1 FROM rowclaim_jobs w WHERE w.queue = {} \
         AND w.status = {READY} AND w.run_at <= {} LIMIT {WINDOW}) AS rowclaim_w",
        b.bind(queue.to_owned()),
        D::NOW
    );
    Stmt::new(sql, b)
}

/// Marks the picked jobs ours. The status is checked again: a job may have been cancelled since.
pub(crate) fn mark_sql<D: Dialect>(a: &ClaimArgs<'_>, ids: &IdList) -> Stmt<D> {
    mark::<D>(a, ids, "")
}

/// [`mark_sql`] with `returning` after it (an alias `t` names the table).
fn mark<D: Dialect>(a: &ClaimArgs<'_>, ids: &IdList, returning: &str) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let set = sql::claim_set(a.m, &mut b, a.token, a.lease);
    let sql = format!(
        "UPDATE rowclaim_jobs{} SET {set} WHERE {} AND (status = {READY} \
         OR (status = {RUNNING} AND lease_until < {})){returning}",
        if returning.is_empty() { "" } else { " AS t" },
        D::id_in(&mut b, "id", ids),
        D::NOW
    );
    Stmt::new(sql, b)
}

/// [`mark_sql`] that returns the marked jobs' rows as [`claimed_sql`] reads them: for a claim
/// that took runs of keys' lines, whose rows are this worker's own claims' anyway. Read in the
/// claim's transaction, under the queue's turn, they cost each row one look-up less (and the
/// claim a statement less): 10 keys one at a time, the read after the commit took 6.0 µs a job,
/// one claim after another.
pub(crate) fn mark_returning_sql<D: Dialect>(a: &ClaimArgs<'_>, ids: &IdList) -> Stmt<D> {
    let returning = format!(" RETURNING {}", D::claimed_select(a.m));
    mark::<D>(a, ids, &returning)
}

/// "The jobs `ids` the claim's token holds now".
fn claimed_by<D: Dialect>(b: &mut Binder<D>, a: &ClaimArgs<'_>, ids: &IdList) -> String {
    format!(
        "{} AND owner = {} AND status = {RUNNING}",
        D::id_in(b, "id", ids),
        b.bind(a.token.to_owned())
    )
}

/// Records the claim's starts, for rate limits: each at the instant its job's `attempted_at`
/// records (the claim's, by the database's clock), so that a start given back can be found
/// (`recount.rs`).
pub(crate) fn starts_sql<D: Dialect>(a: &ClaimArgs<'_>, ids: &IdList) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "INSERT INTO rowclaim_starts (queue, limit_key, started_ms) \
         SELECT queue, limit_key, {} FROM rowclaim_jobs WHERE {}",
        D::epoch_ms("attempted_at"),
        claimed_by(&mut b, a, ids)
    );
    Stmt::new(sql, b)
}

/// Forgets the queue's starts older than its longest rate period.
pub(crate) fn prune_starts_sql<D: Dialect>(queue: &str, keep_ms: i64) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "DELETE FROM rowclaim_starts WHERE queue = {} AND started_ms < {} - {}",
        b.bind(queue.to_owned()),
        D::epoch_ms(D::NOW),
        b.bind(keep_ms)
    );
    Stmt::new(sql, b)
}

/// The jobs the claim took, in the claim order, as the database reads them fastest
/// ([`Dialect::claimed_select`]: plain columns on PostgreSQL, where building a JSON object cost
/// the server 3.5 µs a row; JSON text elsewhere).
pub(crate) fn claimed_sql<D: Dialect>(a: &ClaimArgs<'_>, ids: &IdList) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "SELECT {} FROM rowclaim_jobs AS t WHERE {} ORDER BY priority DESC, run_at, id",
        D::claimed_select(a.m),
        claimed_by(&mut b, a, ids)
    );
    Stmt::new(sql, b)
}
