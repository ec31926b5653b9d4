//! Which jobs of a limited queue may start now: the SQL that picks them, job by job in claim
//! order ([`arms_sql`]), by the fronts of key lines further back ([`heads_sql`]), or by every
//! line numbered ([`lines_sql`]). [`super::claim`] runs it under the queue's turn.

use super::{QueueLimits, Rate, READY, RUNNING};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::queue::migrate::Schema;

/// The ids (as text) of up to `take` jobs the queue's per-key limits let start now.
/// `window`: where [`heads_sql`] looks further back, whether ready jobs are read in claim order
/// at all (without it, only jobs whose lease ran out: the claim then reads every line's front
/// by [`heads_sql`]).
pub(crate) fn pick_ids_sql<D: Schema>(
    queue: &str,
    kinds: &[String],
    limits: &QueueLimits,
    take: i64,
    window: bool,
) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let sql = format!(
        "SELECT CAST(id AS {}) FROM ({}) AS p",
        D::TEXT,
        pick_sql(&mut b, queue, kinds, limits, take, window)
    );
    Stmt::new(sql, b)
}

/// "Job `t` (an alias, or empty for the table's own columns) is in its key's line", for a
/// ready job: due, or waiting for a retry (a failed job keeps its place). A job scheduled for
/// later that never ran is not in line until its time comes.
fn in_line<D: Dialect>(t: &str) -> String {
    let t = if t.is_empty() {
        String::new()
    } else {
        format!("{t}.")
    };
    format!("({t}run_at <= {} OR {t}attempts > 0)", D::NOW)
}

/// Ready jobs a claim looks at in its order before the first of lines further back are
/// sought ([`heads_sql`]): a claim reads at most this many jobs of busy keys. (A claimer that
/// saw few keys reads the fronts of lines first and skips these: `Seen` in `super`.)
pub(super) const WINDOW: i64 = 1000;

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
/// [`heads_sql`]. Rows of its shape, and after them the id of the first job in line of the
/// row's key (none for a job without a key): the rows of one key share it.
pub(crate) fn runs_sql<D: Schema>(
    queue: &str,
    kinds: &[String],
    width: u32,
    run: i64,
    take: i64,
    keyless: bool,
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
    // Per key: its first job in line and the first of its running jobs behind that (left by
    // a dead worker's run, `blocked`'s expired arm: a run stops before it, to start after it);
    // how many of its jobs run (those behind its first in line only while their leases last);
    // and the run, from its first job in line on, read by the limit index (bounded as it is
    // ordered: bounded by the id alone, PostgreSQL walked the primary key from that id and
    // passed over every other key's jobs on the way), with what the claim orders by, so that
    // no join reads the jobs again (it hashed the whole table). Its end is a bound of the index
    // too (no stop: the largest id): as `stop IS NULL OR …`, a filter the planner could not
    // guess, PostgreSQL read each key's whole line by a bitmap and sorted it for the first
    // `run` (10 keys of 1,300 ready jobs each: 23 ms a claim, against 3.6 ms).
    let walk = format!(
        "{heads}rowclaim_fronts (k, id, priority, run_at, ok, place, due, head, busy) AS (\
         SELECT rowclaim_heads.k, l.id, l.priority, l.run_at, l.ok, l.place, l.due, l.head, r.n \
         FROM rowclaim_heads CROSS JOIN LATERAL (SELECT rowclaim_heads.id, \
         (SELECT s.id FROM rowclaim_jobs AS s WHERE s.queue = {q3} \
         AND s.limit_key = rowclaim_heads.k AND s.{status} = {RUNNING} \
         AND s.id > rowclaim_heads.id ORDER BY s.{status}, s.id LIMIT 1) AS stop) AS line_first \
         CROSS JOIN LATERAL (SELECT COUNT(*) AS n FROM (SELECT 1 FROM rowclaim_jobs AS o \
         WHERE o.queue = {q5} AND o.limit_key = rowclaim_heads.k AND o.{status} = {RUNNING} \
         AND (o.lease_until >= {now} OR o.id < line_first.id) LIMIT {front}) AS o) AS r \
         CROSS JOIN LATERAL (SELECT m.id, m.priority, m.run_at, m.ok, \
         ROW_NUMBER() OVER (ORDER BY m.id) AS place, MIN(m.ok) OVER (ORDER BY m.id) AS due, \
         FIRST_VALUE(m.id) OVER (ORDER BY m.id) AS head FROM (SELECT h.id, h.priority, \
         h.run_at, CASE WHEN h.run_at <= {now}{fits} THEN 1 ELSE 0 END AS ok \
         FROM rowclaim_jobs AS h WHERE h.queue = {q6} AND h.limit_key = rowclaim_heads.k \
         AND h.{status} = {READY} AND (h.{status}, h.id) >= ({READY}, line_first.id) \
         AND (h.{status}, h.id) < ({READY}, COALESCE(line_first.stop, {no_stop})) \
         ORDER BY h.{status}, h.id LIMIT {run}) AS m) AS l) ",
        status = D::LINE_STATUS,
        no_stop = i64::MAX,
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
         f.keyless, f.head FROM ((SELECT c.id, c.priority, c.run_at, c.place, \
         CAST(0 AS BIGINT) AS keyless, c.head FROM rowclaim_fronts AS c WHERE c.ok = 1 \
         AND (c.busy + c.place <= {front2} OR (c.busy = 0 AND c.due = 1))){keyless}) AS f \
         ORDER BY f.place, f.priority DESC, f.run_at, f.id LIMIT {take}",
        D::TEXT,
    );
    Stmt::new(sql, b)
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

/// The ids of up to `take` jobs of `queue` that its per-key limits allow to start now, in claim
/// order (jobs whose lease ran out first, then by priority, run-at, id).
///
/// Within one key, jobs line up in enqueue order, jobs whose lease ran out ahead (on
/// PostgreSQL under a key concurrency without a key rate, behind the ready jobs before them in
/// line: see [`FirstOfLine::blocked`]): the `n`th of
/// a key's line may start while fewer than `limit − n + 1` of the key's jobs run (or started
/// within the rate's period). The line holds the key's pending work: ready jobs that are due or
/// wait for a retry (so that a failed job keeps its place), and jobs whose lease ran out. A job
/// scheduled for later that never ran is not in line until its time comes.
///
/// Where at most the first of a line can start (per-key limits of 1, the common "one at a time
/// per key"), and on PostgreSQL under any per-key concurrency without a per-key rate, each job
/// is checked on its own, through indexes, as claims walk the queue in order ([`arms_sql`]);
/// otherwise every line is numbered ([`lines_sql`]), which reads all of the queue's pending
/// work.
fn pick_sql<D: Schema>(
    b: &mut Binder<D>,
    queue: &str,
    kinds: &[String],
    l: &QueueLimits,
    take: i64,
    window: bool,
) -> String {
    if l.by_arms::<D>() {
        arms_sql(b, queue, kinds, l, take, window || !l.looks_further::<D>())
    } else {
        lines_sql(b, queue, kinds, l, take)
    }
}

/// [`pick_sql`] job by job: jobs whose lease ran out, then due ready jobs, each arm read through
/// its own index as the ordinary claim reads them (`sql::candidates`), a keyed job only if no
/// job of its key is ahead of it in line (nor runs, under a concurrency of 1; nor started
/// within the period, under a rate of 1), or, under a per-key concurrency of `n` above 1, if
/// fewer than `n` of its key run or wait ahead of it. Without per-key limits, simply the first
/// jobs of each arm. (Values are bound in the order the text has them.)
fn arms_sql<D: Schema>(
    b: &mut Binder<D>,
    queue: &str,
    kinds: &[String],
    l: &QueueLimits,
    take: i64,
    ready: bool,
) -> String {
    let line = FirstOfLine { queue, limits: l };
    let e = line.arm(b, Arm::Expired, kinds, take);
    if !ready {
        return format!("SELECT id FROM ({e}) AS rowclaim_e");
    }
    let r = line.arm(b, Arm::Ready, kinds, take);
    format!(
        "SELECT id FROM ({e}) AS rowclaim_e UNION ALL SELECT id FROM ({r}) AS rowclaim_r \
         LIMIT {}",
        b.bind(take)
    )
}

/// The two arms of [`arms_sql`]: jobs whose lease ran out, and due ready jobs.
#[derive(Clone, Copy, PartialEq)]
enum Arm {
    Expired,
    Ready,
}

/// What a pick knows of the jobs ahead of a keyed job `j` in its key's line.
#[derive(Clone, Copy, PartialEq)]
enum Ahead {
    /// Nothing: they are sought through the limit index.
    Sought,
    /// `j` is the line's nth job, n the value of this SQL expression: [`heads_sql`] reads each
    /// line's first jobs in line order, and [`FirstOfLine::window`] checks apart that `j` is
    /// its line's first, so that looking again for jobs ahead (a walk, between vacuums, over
    /// the index entries of every job of the key finished since) is not needed.
    Place(&'static str),
}

/// The conditions of [`arms_sql`] for one queue: when a keyed job `j` is not the first of its
/// key's line.
struct FirstOfLine<'a> {
    queue: &'a str,
    limits: &'a QueueLimits,
}

impl FirstOfLine<'_> {
    /// One arm: its jobs, in its index's order, those that are first of their line. Under
    /// per-key limits the ready arm looks at the first [`WINDOW`] ready jobs only, so that a
    /// claim does not read a deep backlog of jobs whose keys are busy; [`heads_sql`] finds the
    /// first of lines further back.
    fn arm<D: Schema>(&self, b: &mut Binder<D>, arm: Arm, kinds: &[String], take: i64) -> String {
        let now = D::NOW;
        let q = b.bind(self.queue.to_owned());
        if arm == Arm::Ready && self.limits.looks_further::<D>() {
            return self.window(b, &q, kinds, take);
        }
        let mut cond = match arm {
            Arm::Expired => format!("j.status = {RUNNING} AND j.lease_until < {now}"),
            Arm::Ready => format!("j.status = {READY} AND j.run_at <= {now}"),
        };
        let blocked = self.blocked(b, arm, Ahead::Sought);
        if !blocked.is_empty() {
            cond.push_str(&format!(
                " AND (j.limit_key IS NULL OR NOT ({}))",
                blocked.join(" OR ")
            ));
        }
        let kinds = kinds_cond(b, kinds, "j.");
        let order = match arm {
            Arm::Expired => "j.lease_until, j.id",
            Arm::Ready => "j.priority DESC, j.run_at, j.id",
        };
        format!(
            "SELECT j.id FROM rowclaim_jobs AS j WHERE j.queue = {q} AND {cond}{kinds} \
             ORDER BY {order} LIMIT {}",
            b.bind(take)
        )
    }

    /// The ready arm under per-key limits where the database reads the limit index key by key:
    /// the first [`WINDOW`] due ready jobs in claim order, those that may start. Where only
    /// the first of a line may start, each job's key's first job in line is looked up once per
    /// key (the planner caches it by key: `Memoize`), not once per job: 10 keys with deep
    /// lines cost 10 look-ups a claim instead of 1,000. The check runs in claim order and
    /// stops once `take` jobs passed. (The look-up is ordered by the limit index's status and
    /// id, an order the primary key cannot give: see `Schema::ahead_in_line`.)
    fn window<D: Schema>(&self, b: &mut Binder<D>, q: &str, kinds: &[String], take: i64) -> String {
        let now = D::NOW;
        let kinds = kinds_cond(b, kinds, "w.");
        let window = b.bind(WINDOW.max(take));
        let (first, cond) = if self.limits.line_front() == 1 {
            let q2 = b.bind(self.queue.to_owned());
            let blocked = self.blocked(b, Arm::Ready, Ahead::Place("1")).join(" OR ");
            (
                format!(
                    " LEFT JOIN LATERAL (SELECT o.id FROM rowclaim_jobs AS o \
                     WHERE o.queue = {q2} AND o.limit_key = j.limit_key \
                     AND o.{status} = {READY} AND {} \
                     ORDER BY o.{status}, o.id LIMIT 1) AS rowclaim_first ON TRUE",
                    in_line::<D>("o"),
                    status = D::LINE_STATUS
                ),
                format!("rowclaim_first.id = j.id AND NOT ({blocked})"),
            )
        } else {
            let blocked = self.blocked(b, Arm::Ready, Ahead::Sought).join(" OR ");
            (String::new(), format!("NOT ({blocked})"))
        };
        format!(
            "SELECT j.id FROM (SELECT w.id, w.limit_key, w.priority, w.run_at \
             FROM rowclaim_jobs AS w WHERE w.queue = {q} AND w.status = {READY} \
             AND w.run_at <= {now}{kinds} ORDER BY w.priority DESC, w.run_at, w.id \
             LIMIT {window}) AS j{first} WHERE j.limit_key IS NULL OR ({cond}) \
             ORDER BY j.priority DESC, j.run_at, j.id LIMIT {}",
            b.bind(take)
        )
    }

    /// What keeps a keyed job of `arm` from starting, each a condition of its own. The other
    /// jobs `o` of j's key are read through the limit index, by its status column.
    fn blocked<D: Schema>(&self, b: &mut Binder<D>, arm: Arm, ahead_of_j: Ahead) -> Vec<String> {
        let now = D::NOW;
        let one_running = self.limits.key_concurrency.is_some();
        let key_rate = self.limits.key_rate;
        let status = format!("o.{}", D::LINE_STATUS);
        let expired = format!("{status} = {RUNNING} AND o.lease_until < {now}");
        let expired_ahead = format!("{expired} AND {}", D::ahead_in_line(RUNNING));
        let ahead = format!(
            "{status} = {READY} AND {} AND {}",
            D::ahead_in_line(READY),
            in_line::<D>("o")
        );
        // Where a worker may have taken runs of a key's line (PostgreSQL, a key concurrency
        // without a key rate; also once the limits changed since), a dead worker's run leaves
        // several of a key's jobs running with their leases out, and one of them may go back
        // to wait for a retry while those behind it still count as running. Such jobs behind
        // `j` in its line do not keep it waiting (it is ahead of them, and they wait for it
        // below), else neither would ever start. Everywhere else every running job counts.
        let runs = D::SKIP_SCAN && one_running && key_rate.is_none();
        let running = if runs {
            vec![
                format!("{status} = {RUNNING} AND o.lease_until >= {now}"),
                expired_ahead.clone(),
            ]
        } else {
            vec![format!("{status} = {RUNNING}")]
        };
        let mut blocked = Vec::new();
        match arm {
            // A job whose lease ran out takes its own place again; under a rate, one at a
            // time, the first first.
            Arm::Expired => {
                if let Some(rate) = key_rate {
                    blocked.push(self.other(b, &expired_ahead));
                    blocked.push(self.started(b, rate));
                } else if runs {
                    // The jobs of a run may all have run out together: they are taken again
                    // first first, no more than the key's concurrency at once, and none before
                    // a job ahead of it in line that went back (a retry).
                    let counts: Vec<String> = running
                        .iter()
                        .chain(std::iter::once(&ahead))
                        .map(|cond| self.counted(b, cond))
                        .collect();
                    let n = b.bind(self.limits.line_front());
                    blocked.push(format!("{} >= {n}", counts.join(" + ")));
                }
            }
            // Up to n of a key at once: a job may start while fewer than n of its key run or
            // wait ahead of it in line (each count stops at n).
            Arm::Ready if self.limits.line_front() > 1 => {
                let mut counts: Vec<String> =
                    running.iter().map(|cond| self.counted(b, cond)).collect();
                counts.push(match ahead_of_j {
                    Ahead::Place(place) => format!("({place} - 1)"),
                    Ahead::Sought => self.counted(b, &ahead),
                });
                let n = b.bind(self.limits.line_front());
                blocked.push(format!("{} >= {n}", counts.join(" + ")));
            }
            Arm::Ready if one_running || key_rate.is_some() => {
                if ahead_of_j == Ahead::Sought {
                    blocked.push(self.other(b, &ahead));
                }
                if one_running {
                    for cond in &running {
                        blocked.push(self.other(b, cond));
                    }
                } else {
                    blocked.push(self.other(b, &expired));
                }
                if let Some(rate) = key_rate {
                    blocked.push(self.started(b, rate));
                }
            }
            Arm::Ready => {}
        }
        blocked
    }

    /// "How many jobs of j's key are such that `cond`", counted up to the line's front.
    fn counted<D: Dialect>(&self, b: &mut Binder<D>, cond: &str) -> String {
        let q = b.bind(self.queue.to_owned());
        format!(
            "(SELECT COUNT(*) FROM (SELECT 1 FROM rowclaim_jobs o WHERE o.queue = {q} \
             AND o.limit_key = j.limit_key AND {cond} LIMIT {}) AS rowclaim_n)",
            b.bind(self.limits.line_front())
        )
    }

    /// "A job of j's key such that `cond`".
    fn other<D: Dialect>(&self, b: &mut Binder<D>, cond: &str) -> String {
        format!(
            "EXISTS (SELECT 1 FROM rowclaim_jobs o WHERE o.queue = {} \
             AND o.limit_key = j.limit_key AND {cond})",
            b.bind(self.queue.to_owned())
        )
    }

    /// "A job of j's key started within the rate's period".
    fn started<D: Dialect>(&self, b: &mut Binder<D>, rate: Rate) -> String {
        let q = b.bind(self.queue.to_owned());
        format!(
            "EXISTS (SELECT 1 FROM rowclaim_starts s WHERE s.queue = {q} \
             AND s.limit_key = j.limit_key AND s.started_ms >= {} - {})",
            D::epoch_ms(D::NOW),
            b.bind(rate.period_ms())
        )
    }
}

/// [`pick_sql`] where more than the first of a line may start: every key's line numbered
/// (`ROW_NUMBER`), with its running jobs and recent starts beside it. (Values are bound in the
/// order the text has them.)
fn lines_sql<D: Dialect>(
    b: &mut Binder<D>,
    queue: &str,
    kinds: &[String],
    l: &QueueLimits,
    take: i64,
) -> String {
    let (now, now_ms) = (D::NOW, D::epoch_ms(D::NOW));
    let expired = format!("CASE WHEN status = {RUNNING} THEN 1 ELSE 0 END");
    let line = format!(
        "SELECT id, kind, priority, run_at, limit_key, {expired} AS expired, \
         CASE WHEN status = {RUNNING} OR run_at <= {now} THEN 1 ELSE 0 END AS due, \
         ROW_NUMBER() OVER (PARTITION BY limit_key ORDER BY {expired} DESC, id) AS place \
         FROM rowclaim_jobs WHERE queue = {} AND ((status = {READY} \
         AND {}) OR (status = {RUNNING} AND lease_until < {now}))",
        b.bind(queue.to_owned()),
        in_line::<D>("")
    );
    let mut joins = String::new();
    if l.key_concurrency.is_some() {
        joins.push_str(&format!(
            " LEFT JOIN (SELECT limit_key, COUNT(*) AS n FROM rowclaim_jobs \
             WHERE queue = {} AND status = {RUNNING} AND lease_until >= {now} \
             AND limit_key IS NOT NULL GROUP BY limit_key) r ON r.limit_key = c.limit_key",
            b.bind(queue.to_owned())
        ));
    }
    if let Some(rate) = l.key_rate {
        let q = b.bind(queue.to_owned());
        joins.push_str(&format!(
            " LEFT JOIN (SELECT limit_key, COUNT(*) AS n FROM rowclaim_starts \
             WHERE queue = {q} AND started_ms >= {now_ms} - {} AND limit_key IS NOT NULL \
             GROUP BY limit_key) s ON s.limit_key = c.limit_key",
            b.bind(rate.period_ms())
        ));
    }
    let mut cond = String::from("c.due = 1");
    cond.push_str(&kinds_cond(b, kinds, "c."));
    if let Some(max) = l.key_concurrency {
        cond.push_str(&format!(
            " AND (c.limit_key IS NULL OR c.place + COALESCE(r.n, 0) <= {})",
            b.bind(i64::from(max))
        ));
    }
    if let Some(rate) = l.key_rate {
        cond.push_str(&format!(
            " AND (c.limit_key IS NULL OR c.place + COALESCE(s.n, 0) <= {})",
            b.bind(i64::from(rate.jobs))
        ));
    }
    format!(
        "SELECT c.id FROM ({line}) AS c{joins} WHERE {cond} \
         ORDER BY c.expired DESC, c.priority DESC, c.run_at, c.id LIMIT {}",
        b.bind(take)
    )
}

/// ` AND kind IN (…)` for a claimer of some kinds only (of alias `t`, e.g. `"c."`); empty for
/// one of all kinds.
fn kinds_cond<D: Dialect>(b: &mut Binder<D>, kinds: &[String], t: &str) -> String {
    if kinds.is_empty() {
        return String::new();
    }
    let list: Vec<String> = kinds.iter().map(|k| b.bind(k.clone())).collect();
    format!(" AND {t}kind IN ({})", list.join(", "))
}
