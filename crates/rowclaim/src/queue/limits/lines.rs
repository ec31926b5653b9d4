//! The fronts of a limited queue's key lines, read key by key through the limit index
//! (PostgreSQL): each key's first job in line ([`heads_sql`]), or a run of each idle key's line
//! ([`runs_sql`]), and jobs without a key ([`keyless_sql`]). A claim reads these where the first
//! jobs in claim order (`pick.rs`) leave most of its room, or first where it saw few keys.

use super::pick::{holds_place, in_line, kinds_cond, Ahead, Arm, FirstOfLine};
use super::{QueueLimits, READY, RUNNING};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::queue::migrate::Schema;
use crate::value::Value;

/// The ids (as text) of up to `take` jobs that may start (see [`pick_sql`]) at the front of
/// their key's line, or without a key, in claim order: each key's line is found through the
/// limit index, key after key, and its front with it (its first job; its first `n` under a
/// per-key concurrency of `n`, looked up per key), so that the claim reads about as many index
/// entries as there are keys with a job in line (and, between vacuums, those of their jobs
/// finished since), however deep their lines. Jobs without a key, when asked for (`keyless`),
/// are read in claim order. PostgreSQL only ([`Dialect::SKIP_SCAN`]; it reads each front
/// through `LATERAL`).
/// The next key is the first by `ORDER BY … LIMIT 1`, not `MIN`: while the planner's statistics
/// say no job has a key (keys new to a table not analyzed since), PostgreSQL read the whole
/// table for each `MIN` of a key after a parameter, one key at a time.
///
/// `keyless`: also the first jobs without a key. Those cost a read of the queue's ready jobs to
/// the end of the index (or of the table) where there are none, since no index holds them
/// apart, so [`super::claim`] asks for them only where it found some, or now and then (see
/// `KEYLESS_EVERY`).
///
/// Each row: the id, the number of keys with a job in line, and 1 for a job without a key
/// (else 0).
pub(crate) fn heads_sql<D: Schema>(
    queue: &str,
    kinds: &[String],
    limits: &QueueLimits,
    take: i64,
    keyless: bool,
) -> Stmt<D> {
    let now = D::NOW;
    let in_line = in_line::<D>;
    let mut b = Binder::<D>::new();
    // Each front comes with what the claim checks and orders it by, so that no join reads
    // the jobs again: joined back by id, PostgreSQL hashed the whole table on every claim (1,000
    // keys, 20,000 jobs: 15 ms of a 45 ms claim).
    const COLUMNS: [&str; 5] = ["limit_key", "id", "priority", "run_at", "kind"];
    let cols = COLUMNS.join(", ");
    let (fronts, place) = if limits.line_front() == 1 {
        // One front a key: the walk lands on each key's first job in line.
        let walk = first_in_line_walk(&mut b, queue, "rowclaim_fronts", &cols, &COLUMNS);
        (format!("{walk} "), "1")
    } else {
        let keys = keys_walk(&mut b, queue);
        let q3 = b.bind(queue.to_owned());
        let front = b.bind(limits.line_front());
        let walk = format!(
            "{keys}rowclaim_fronts ({cols}, place) AS (SELECT rowclaim_keys.k, l.id, \
             l.priority, l.run_at, l.kind, l.place FROM rowclaim_keys CROSS JOIN LATERAL \
             (SELECT h.id, h.priority, h.run_at, h.kind, \
             ROW_NUMBER() OVER (ORDER BY h.id) AS place FROM rowclaim_jobs AS h \
             WHERE h.queue = {q3} AND h.status = {READY} AND h.limit_key = rowclaim_keys.k \
             AND {} ORDER BY h.id LIMIT {front}) AS l) ",
            in_line("h"),
        );
        (walk, "j.place")
    };
    let keyed_kinds = kinds_cond(&mut b, kinds, "j.");
    let line = FirstOfLine { queue, limits };
    let blocked = line
        .blocked(&mut b, Arm::Ready, Ahead::Place(place))
        .join(" OR ");
    let keyless = if keyless {
        format!(" UNION ALL ({})", keyless_arm(&mut b, queue, kinds, take))
    } else {
        String::new()
    };
    let take = b.bind(take);
    let sql = format!(
        "{fronts}SELECT CAST(f.id AS {}), \
         (SELECT COUNT(DISTINCT limit_key) FROM rowclaim_fronts), f.keyless \
         FROM ((SELECT j.id, j.priority, j.run_at, CAST(0 AS BIGINT) AS keyless \
         FROM rowclaim_fronts AS j \
         WHERE j.run_at <= {now}{keyed_kinds} AND NOT ({blocked})){keyless}) AS f \
         ORDER BY f.priority DESC, f.run_at, f.id LIMIT {take}",
        D::TEXT,
    );
    Stmt::new(sql, b)
}

/// [`heads_sql`] for a claim that may take a run of each idle key's line (see
/// `QueueLimits::line_width`): up to `run` jobs from the front of the line of each key none of
/// whose jobs runs, each due and of the claim's kinds, as are all between it and the front (the
/// worker runs them one after another, `width` at once). A job scheduled for later behind the
/// front ends the run (it joins the line at its place once due, and what the run would hold
/// behind it would start first), and so does a running job behind the front, left by a dead
/// worker's run. From a key whose jobs run, as many as its width leaves room for, as
/// [`heads_sql`] takes (a scheduled job among them counts a place here). Rows come place by
/// place (every key's first, then every key's second, …), so that the claim's room is shared
/// among the keys, and what it takes of a line is its front. PostgreSQL only, as
/// [`heads_sql`]. Rows of its shape, and after them a number of the row's key (a hash of it;
/// none for a job without a key): the rows of one key share it, and so do those of its next
/// run, so that the worker runs them in one line.
///
/// `own`: the tokens of claims whose lines the worker still runs, whole (see
/// `Claimer::claim_behind`). A key whose running jobs are all held under them, with their
/// leases, counts as idle: its next run joins the line the worker runs, behind the jobs it
/// holds, so that the worker claims a key's next run while its last one runs rather than idle
/// for a claim between runs.
pub(crate) fn runs_sql<D: Schema>(
    queue: &str,
    kinds: &[String],
    width: u32,
    run: i64,
    take: i64,
    keyless: bool,
    own: &[String],
) -> Stmt<D> {
    let now = D::NOW;
    let mut b = Binder::<D>::new();
    // The keys and the first job in line of each, in one walk (see `first_in_line_walk`).
    let heads = first_in_line_walk(
        &mut b,
        queue,
        "rowclaim_heads",
        "k, id",
        &["limit_key", "id"],
    );
    let heads = format!("{heads}, ");
    let q3 = b.bind(queue.to_owned());
    let q5 = b.bind(queue.to_owned());
    let front = b.bind(i64::from(width));
    let fits = kinds_cond(&mut b, kinds, "h.");
    let q6 = b.bind(queue.to_owned());
    let run = b.bind(run);
    // Per key: its first job in line, the number of its line (once a key, not once a job),
    // and the first of its running jobs behind that (left by
    // a dead worker's run, `blocked`'s expired arm: a run stops before it, to start after it);
    // how many of its jobs run (those behind its first in line only while their leases last);
    // and the run, from its first job in line on, read by the limit index (bounded as it is
    // ordered: bounded by the id alone, PostgreSQL walked the primary key from that id and
    // passed over every other key's jobs on the way), with what the claim orders by, so that
    // no join reads the jobs again (it hashed the whole table). Its end is a bound of the index
    // too (no stop: the largest id): as `stop IS NULL OR …`, a filter the planner could not
    // guess, PostgreSQL read each key's whole line by a bitmap and sorted it for the first
    // `run` (10 keys of 1,300 ready jobs each: 23 ms a claim, against 3.6 ms).
    let (others, others_of) = not_own::<D>(&mut b, queue, own);
    let walk = format!(
        "{heads}rowclaim_fronts (k, id, priority, run_at, ok, place, due, line, busy, others) \
         AS (SELECT rowclaim_heads.k, l.id, l.priority, l.run_at, l.ok, l.place, l.due, \
         line_first.line, r.n, {others} \
         FROM rowclaim_heads CROSS JOIN LATERAL (SELECT rowclaim_heads.id, \
         hashtextextended(rowclaim_heads.k, 0) AS line, \
         (SELECT s.id FROM rowclaim_jobs AS s WHERE s.queue = {q3} \
         AND s.limit_key = rowclaim_heads.k AND s.{status} = {RUNNING} \
         AND s.id > rowclaim_heads.id ORDER BY s.{status}, s.id LIMIT 1) AS stop) AS line_first \
         CROSS JOIN LATERAL (SELECT COUNT(*) AS n FROM (SELECT 1 FROM rowclaim_jobs AS o \
         WHERE o.queue = {q5} AND o.limit_key = rowclaim_heads.k AND {holding} \
         LIMIT {front}) AS o) AS r\
         {others_of} CROSS JOIN LATERAL (SELECT m.id, m.priority, m.run_at, m.ok, \
         ROW_NUMBER() OVER (ORDER BY m.id) AS place, MIN(m.ok) OVER (ORDER BY m.id) AS due \
         FROM (SELECT h.id, h.priority, \
         h.run_at, CASE WHEN h.run_at <= {now}{fits} THEN 1 ELSE 0 END AS ok \
         FROM rowclaim_jobs AS h WHERE h.queue = {q6} AND h.limit_key = rowclaim_heads.k \
         AND h.{status} = {READY} AND (h.{status}, h.id) >= ({READY}, line_first.id) \
         AND (h.{status}, h.id) < ({READY}, COALESCE(line_first.stop, {no_stop})) \
         ORDER BY h.{status}, h.id LIMIT {run}) AS m) AS l) ",
        status = D::LINE_STATUS,
        no_stop = i64::MAX,
        holding = holds_place::<D>("o", "o.id < line_first.id"),
    );
    let front2 = b.bind(i64::from(width));
    let keyless = if keyless {
        format!(
            " UNION ALL (SELECT w.id, w.priority, w.run_at, CAST(1 AS BIGINT), w.keyless, \
             CAST(NULL AS BIGINT) FROM ({}) AS w)",
            keyless_arm(&mut b, queue, kinds, take)
        )
    } else {
        String::new()
    };
    let take = b.bind(take);
    let sql = format!(
        "{walk}SELECT CAST(f.id AS {}), (SELECT COUNT(DISTINCT k) FROM rowclaim_fronts), \
         f.keyless, f.line FROM ((SELECT c.id, c.priority, c.run_at, c.place, \
         CAST(0 AS BIGINT) AS keyless, c.line FROM rowclaim_fronts AS c WHERE c.ok = 1 \
         AND (c.busy + c.place <= {front2} OR (c.others = 0 AND c.due = 1))){keyless}) AS f \
         ORDER BY f.place, f.priority DESC, f.run_at, f.id LIMIT {take}",
        D::TEXT,
    );
    Stmt::new(sql, b)
}

/// For [`runs_sql`] where the worker runs lines whole under the tokens `own`: a lateral join
/// `y` of whether any running job of the key counts against it, one not held under `own` with
/// its lease (at most one read), and that count's column. Without `own`, every running job
/// counts: the count of them, `r.n`, and no join.
fn not_own<D: Schema>(b: &mut Binder<D>, queue: &str, own: &[String]) -> (&'static str, String) {
    if own.is_empty() {
        return ("r.n", String::new());
    }
    let now = D::NOW;
    let q = b.bind(queue.to_owned());
    // One array, so that the statement's text is one however many claims the worker holds
    // (each text is a statement the connection prepares and keeps).
    let own = b.bind(Value::Texts(own.to_vec()));
    let lateral = format!(
        " CROSS JOIN LATERAL (SELECT COUNT(*) AS n FROM (SELECT 1 FROM rowclaim_jobs AS x \
         WHERE x.queue = {q} AND x.limit_key = rowclaim_heads.k AND {} AND NOT \
         (x.lease_until >= {now} AND x.owner IS NOT NULL AND x.owner = ANY({own})) LIMIT 1) \
         AS x) AS y",
        holds_place::<D>("x", "x.id < line_first.id"),
    );
    ("y.n", lateral)
}

/// `WITH RECURSIVE {cte} ({names}) AS (…)`: of each key of `queue` with a job in line, the job
/// columns `cols` of its first job in line (the first of `cols` is `limit_key`, named first in
/// `names`), in one walk from key to key through the limit index that lands on it: a key's
/// entries are walked once, not once to find the key and again for its first job. Ordered by
/// the key first, an order only the limit index has: looked up per key (`ORDER BY status, id
/// LIMIT 1` after a walk of the keys), the planner turned to the primary key once a drain was
/// under way and walked it from its start past every finished job, for each key (10 keys:
/// 17 ms a key, 200 ms a claim).
fn first_in_line_walk<D: Schema>(
    b: &mut Binder<D>,
    queue: &str,
    cte: &str,
    names: &str,
    cols: &[&str],
) -> String {
    let q1 = b.bind(queue.to_owned());
    let q2 = b.bind(queue.to_owned());
    let of = |t: &str| {
        cols.iter()
            .map(|c| format!("{t}.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let key = names.split(',').next().unwrap_or(names).trim();
    format!(
        "WITH RECURSIVE {cte} ({names}) AS (SELECT {} FROM (SELECT {} FROM rowclaim_jobs AS h \
         WHERE h.queue = {q1} AND h.{status} = {READY} AND h.limit_key IS NOT NULL AND {} \
         ORDER BY h.limit_key, h.{status}, h.id LIMIT 1) AS f \
         UNION ALL SELECT {} FROM {cte} CROSS JOIN LATERAL (SELECT {} FROM rowclaim_jobs AS o \
         WHERE o.queue = {q2} AND o.{status} = {READY} AND o.limit_key > {cte}.{key} AND {} \
         ORDER BY o.limit_key, o.{status}, o.id LIMIT 1) AS n)",
        of("f"),
        of("h"),
        in_line::<D>("h"),
        of("n"),
        of("o"),
        in_line::<D>("o"),
        status = D::LINE_STATUS,
    )
}

/// `WITH RECURSIVE rowclaim_keys (k) AS (…), `: the keys with a ready job in `queue`, walked
/// from key to key through the limit index (each step one index probe, however deep the lines).
fn keys_walk<D: Dialect>(b: &mut Binder<D>, queue: &str) -> String {
    let q1 = b.bind(queue.to_owned());
    let q2 = b.bind(queue.to_owned());
    format!(
        "WITH RECURSIVE rowclaim_keys (k) AS (\
         SELECT (SELECT limit_key FROM rowclaim_jobs WHERE queue = {q1} \
         AND status = {READY} AND limit_key IS NOT NULL ORDER BY limit_key LIMIT 1) \
         UNION ALL SELECT (SELECT o.limit_key FROM rowclaim_jobs AS o WHERE o.queue = {q2} \
         AND o.status = {READY} AND o.limit_key > rowclaim_keys.k \
         ORDER BY o.limit_key LIMIT 1) \
         FROM rowclaim_keys WHERE rowclaim_keys.k IS NOT NULL), "
    )
}

/// The first `take` due jobs of `queue` without a key, in claim order, as rows of
/// [`heads_sql`]'s shape (no count of keys): for a claim whose fronts were all busy, without
/// walking the keys again.
pub(crate) fn keyless_sql<D: Schema>(queue: &str, kinds: &[String], take: i64) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "SELECT CAST(w.id AS {}), CAST(NULL AS BIGINT), w.keyless FROM ({}) AS w",
        D::TEXT,
        keyless_arm(&mut b, queue, kinds, take)
    );
    Stmt::new(sql, b)
}

/// The select of [`keyless_sql`] and of [`heads_sql`]'s arm of jobs without a key: id,
/// priority, run-at and 1 (the row is a job without a key).
fn keyless_arm<D: Dialect>(b: &mut Binder<D>, queue: &str, kinds: &[String], take: i64) -> String {
    let q = b.bind(queue.to_owned());
    let kinds = kinds_cond(b, kinds, "w.");
    format!(
        "SELECT w.id, w.priority, w.run_at, CAST(1 AS BIGINT) AS keyless \
         FROM rowclaim_jobs AS w WHERE w.queue = {q} AND w.status = {READY} \
         AND w.run_at <= {} AND w.limit_key IS NULL{kinds} \
         ORDER BY w.priority DESC, w.run_at, w.id LIMIT {}",
        D::NOW,
        b.bind(take)
    )
}
