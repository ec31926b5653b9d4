//! Which jobs of a limited queue may start now: the SQL that picks them, job by job in claim
//! order ([`arms_sql`]), or by every line numbered ([`lines_sql`]); the fronts of key lines
//! further back come from `lines.rs`. [`super::claim`] runs it under the queue's turn.

use super::{QueueLimits, Rate, READY, RUNNING};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::queue::migrate::Schema;

/// The ids (as text) of up to `take` jobs the queue's per-key limits let start now.
/// `window`: where [`super::heads_sql`] looks further back, whether ready jobs are read in claim order
/// at all (without it, only jobs whose lease ran out: the claim then reads every line's front
/// by [`super::heads_sql`]).
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

/// "Job `o` (an alias) runs and holds its key's place": its lease holds, or it is `ahead` (a
/// condition on `o`) of the job in question in their line, with its lease run out (a dead
/// worker's; it is taken again first). A running job behind it whose lease ran out does not
/// count: it waits for the one in question. Where runs of lines may be taken (PostgreSQL, a
/// key concurrency without a key rate).
pub(super) fn holds_place<D: Schema>(o: &str, ahead: &str) -> String {
    format!(
        "{o}.{} = {RUNNING} AND ({o}.lease_until >= {} OR {ahead})",
        D::LINE_STATUS,
        D::NOW
    )
}

/// "Job `t` (an alias, or empty for the table's own columns) is in its key's line", for a
/// ready job: due, or waiting for a retry (a failed job keeps its place). A job scheduled for
/// later that never ran is not in line until its time comes.
pub(super) fn in_line<D: Dialect>(t: &str) -> String {
    let t = if t.is_empty() {
        String::new()
    } else {
        format!("{t}.")
    };
    format!("({t}run_at <= {} OR {t}attempts > 0)", D::NOW)
}

/// Ready jobs a claim looks at in its order before the first of lines further back are
/// sought ([`super::heads_sql`]): a claim reads at most this many jobs of busy keys. (A claimer that
/// saw few keys reads the fronts of lines first and skips these: `Seen` in `super`.)
pub(super) const WINDOW: i64 = 1000;

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
pub(super) enum Arm {
    Expired,
    Ready,
}

/// What a pick knows of the jobs ahead of a keyed job `j` in its key's line.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Ahead {
    /// Nothing: they are sought through the limit index.
    Sought,
    /// `j` is the line's nth job, n the value of this SQL expression: [`super::heads_sql`] reads each
    /// line's first jobs in line order, and [`FirstOfLine::window`] checks apart that `j` is
    /// its line's first, so that looking again for jobs ahead (a walk, between vacuums, over
    /// the index entries of every job of the key finished since) is not needed.
    Place(&'static str),
}

/// The conditions of [`arms_sql`] for one queue: when a keyed job `j` is not the first of its
/// key's line.
pub(super) struct FirstOfLine<'a> {
    pub(super) queue: &'a str,
    pub(super) limits: &'a QueueLimits,
}

impl FirstOfLine<'_> {
    /// One arm: its jobs, in its index's order, those that are first of their line. Under
    /// per-key limits the ready arm looks at the first [`WINDOW`] ready jobs only, so that a
    /// claim does not read a deep backlog of jobs whose keys are busy; [`super::heads_sql`] finds the
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
    pub(super) fn blocked<D: Schema>(
        &self,
        b: &mut Binder<D>,
        arm: Arm,
        ahead_of_j: Ahead,
    ) -> Vec<String> {
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
        // One look at the key's running jobs, not one for those whose lease holds and another
        // for those ahead whose lease ran out: each is a descent of the limit index per job
        // looked at (1,000 keys two at a time: three looks a job, the pick a third slower).
        let running = if runs {
            holds_place::<D>("o", &D::ahead_in_line(RUNNING))
        } else {
            format!("{status} = {RUNNING}")
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
                    let counts: Vec<String> = [&running, &ahead]
                        .into_iter()
                        .map(|cond| self.counted(b, cond))
                        .collect();
                    let n = b.bind(self.limits.line_front());
                    blocked.push(format!("{} >= {n}", counts.join(" + ")));
                }
            }
            // Up to n of a key at once: a job may start while fewer than n of its key run or
            // wait ahead of it in line (each count stops at n).
            Arm::Ready if self.limits.line_front() > 1 => {
                let mut counts = vec![self.counted(b, &running)];
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
                    blocked.push(self.other(b, &running));
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
pub(super) fn kinds_cond<D: Dialect>(b: &mut Binder<D>, kinds: &[String], t: &str) -> String {
    if kinds.is_empty() {
        return String::new();
    }
    let list: Vec<String> = kinds.iter().map(|k| b.bind(k.clone())).collect();
    format!(" AND {t}kind IN ({})", list.join(", "))
}
