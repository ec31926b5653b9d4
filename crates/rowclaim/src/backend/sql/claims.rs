//! The conditions and SET lists every driver's claims and settles are made of: "claimable",
//! "ready", "expired", "held by this token", "mark claimed", "settle as". Each means the same on
//! every database; a driver's `claim.rs` puts them together.

use std::time::Duration;

use super::{and_each, no_owner, Binder, Dialect, Stmt};
use crate::backend::{Outcome, Target};
use crate::error::Result;
use crate::mapping::{status_literal, Lifecycle, Mapping};

/// Rows a claim may take: ready (and due, where rows have a due time), or claimed with an
/// expired lease; each meeting what a layer above asks of a claimable row. This is the recheck a
/// statement applies to rows it already named; to *find* rows use [`candidates`] (or the two
/// arms), because one OR across both kinds can use neither kind's index.
pub(crate) fn claimable<D: Dialect>(m: &Mapping, b: &mut Binder<D>) -> String {
    let ready = ready_arm(m, b);
    match expired_arm(m, b) {
        Some(expired) => format!("(({ready}) OR ({expired}))"),
        None => format!("({ready})"),
    }
}

/// The first arm of a claim: ready rows (and due, where rows have a due time) that meet the
/// conditions of a layer above. An equality on status, so a partial index over ready rows (or
/// one on `(status, …)`) serves it in the source's order, however many finished rows the table
/// keeps. (Status values are literals: nothing to bind.)
pub(crate) fn ready_arm<D: Dialect>(m: &Mapping, b: &mut Binder<D>) -> String {
    let mut cond = format!("{} = {}", m.status, status_literal(&m.ready));
    if let Some(l) = &m.lifecycle {
        cond.push_str(&format!(" AND {} <= {}", l.due, D::NOW));
        cond.push_str(&and_each(&l.claimable, b));
    }
    cond
}

/// The second arm: claimed rows whose lease has expired (None without a lease column). Few rows
/// are claimed at any time, so an index over claimed rows keeps this cheap.
pub(crate) fn expired_arm<D: Dialect>(m: &Mapping, b: &mut Binder<D>) -> Option<String> {
    let le = m.lease.as_ref()?;
    let mut cond = format!(
        "{} = {} AND {le} < {}",
        m.status,
        status_literal(&m.claimed),
        D::NOW
    );
    if let Some(l) = &m.lifecycle {
        cond.push_str(&and_each(&l.claimable, b));
    }
    Some(cond)
}

/// The expired arm on its own, as `rowclaim check` plans it: up to `limit` claimed rows whose
/// lease has ended, in the source's order (None without a lease column).
pub(crate) fn expired_lookup<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    limit: i64,
) -> Option<String> {
    let cond = expired_arm(m, b)?;
    Some(format!(
        "SELECT {} FROM {} WHERE {cond}{} ORDER BY {} LIMIT {}",
        m.id,
        m.table,
        m.filter,
        m.order_by,
        b.bind(limit)
    ))
}

/// A query for up to `limit` rows a claim may take, without locking them: rows with an expired
/// lease first (when `expired`), then ready rows in the source's order. Each arm is its own
/// sub-select so each walks its own index. `select` is the column list of each arm (alias
/// anything cast, so that ORDER BY still means the column).
pub(crate) fn candidates<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    select: &str,
    limit: i64,
    expired: bool,
) -> String {
    let (t, order, filter) = (&m.table, &m.order_by, &m.filter);
    let arm = |b: &mut Binder<D>, cond: String| {
        format!(
            "SELECT {select} FROM {t} WHERE {cond}{filter} ORDER BY {order} LIMIT {}",
            b.bind(limit)
        )
    };
    match expired.then(|| expired_arm(m, b)).flatten() {
        None => {
            let ready = ready_arm(m, b);
            arm(b, ready)
        }
        Some(expired) => {
            let e = arm(b, expired);
            let ready = ready_arm(m, b);
            let r = arm(b, ready);
            format!(
                "SELECT * FROM ({e}) AS rowclaim_e UNION ALL SELECT * FROM ({r}) AS rowclaim_r \
                 LIMIT {}",
                b.bind(limit)
            )
        }
    }
}

/// The SET list that marks rows claimed by `token`: status, owner, lease end (now + `lease` by
/// the server's clock), one more attempt.
pub(crate) fn claim_set<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    token: &str,
    lease: Duration,
) -> String {
    let mut set = vec![format!("{} = {}", m.status, status_literal(&m.claimed))];
    if let Some(ow) = &m.owner {
        set.push(format!("{ow} = {}", b.bind(token.to_owned())));
    }
    if let Some(le) = &m.lease {
        set.push(format!("{le} = {}", D::later(b, lease)));
    }
    if let Some(at) = &m.attempts {
        set.push(format!("{at} = COALESCE({at}, 0) + 1"));
    }
    if let Some(l) = &m.lifecycle {
        set.push(format!("{} = {}", l.started, D::NOW));
    }
    set.join(", ")
}

/// The fencing condition "`token` holds this row" for strategies that mark rows in the table:
/// claimed, by this owner, and (for [`Target::Ids`]) one of the named rows. Without an owner
/// column only named rows can be meant.
///
/// With named rows the status test is written `(status = claimed) IS TRUE`: the same test, but
/// one a planner cannot match to a partial index over claimed rows (the managed queue's lease
/// index), so the rows are found through their key. Otherwise PostgreSQL, when statistics say
/// few rows are claimed, walks that index instead, and until vacuum it also holds an entry for
/// every row claimed since; with a transaction open elsewhere for minutes, hundreds of
/// thousands, each looked up in the table.
pub(crate) fn held_by<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    token: &str,
    target: &Target<'_>,
) -> Result<String> {
    let claimed = format!("{} = {}", m.status, status_literal(&m.claimed));
    let mut cond = match target {
        Target::Ids(..) => format!("({claimed}) IS TRUE"),
        Target::All => claimed,
    };
    match &m.owner {
        Some(ow) => cond.push_str(&format!(" AND {ow} = {}", b.bind(token.to_owned()))),
        None if matches!(target, Target::All) => return Err(no_owner(m)),
        None => {}
    }
    if let Target::Ids(list, _) = target {
        cond.push_str(&format!(" AND {}", D::id_in(b, &m.id, list)));
    }
    Ok(cond)
}

/// The statement that changes the rows `cond` picks: `UPDATE … SET set`, or `DELETE` when there
/// is no `set` (a settle whose outcome deletes, see [`Outcome::deletes`]).
pub(crate) fn change_sql(m: &Mapping, set: Option<&str>, cond: &str) -> String {
    match set {
        Some(set) => format!("UPDATE {} SET {set} WHERE {cond}", m.table),
        None => format!("DELETE FROM {} WHERE {cond}", m.table),
    }
}

/// `life`'s history with this failed attempt appended: its number, when it started and ended
/// (epoch ms, by the database's clock) and its error, cut short. MySQL evaluates a SET list
/// left to right, so this reads only columns that settling leaves as they are.
fn attempt_entry<D: Dialect>(
    m: &Mapping,
    life: &Lifecycle,
    b: &mut Binder<D>,
    error: &str,
) -> String {
    let cut: String = error.chars().take(super::ATTEMPT_ERROR_CHARS).collect();
    let attempt = m.attempts.clone().unwrap_or_else(|| "NULL".to_owned());
    D::appended(
        &life.history,
        &[
            ("attempt", attempt),
            ("started_ms", D::epoch_ms(&life.started)),
            ("ended_ms", D::epoch_ms(D::NOW)),
            // Cast: PostgreSQL cannot tell the type of a bare parameter in a JSON object.
            ("error", format!("CAST({} AS {})", b.bind(cut), D::TEXT)),
        ],
    )
}

/// The SET list that settles rows. A row given back loses its owner and lease; a retried row
/// runs again `after` from now; errors and finishing times go where the mapping has columns.
pub(crate) fn outcome_set<D: Dialect>(m: &Mapping, b: &mut Binder<D>, outcome: &Outcome) -> String {
    let life = m.lifecycle.as_ref();
    if let (Outcome::Snooze { after }, None, Some(le)) = (outcome, life, &m.lease) {
        return snooze_in_lease(m, b, le, *after);
    }
    let mut set = vec![format!(
        "{} = {}",
        m.status,
        status_literal(outcome.status(m))
    )];
    if matches!(
        outcome,
        Outcome::Ready | Outcome::Retry { .. } | Outcome::Snooze { .. } | Outcome::Unstarted
    ) {
        set.extend(m.owner.iter().map(|ow| format!("{ow} = NULL")));
        set.extend(m.lease.iter().map(|le| format!("{le} = NULL")));
    }
    if let (Outcome::Retry { after, .. } | Outcome::Snooze { after }, Some(l)) = (outcome, life) {
        set.push(format!("{} = {}", l.due, D::later(b, *after)));
    }
    // A snooze, or a row that never started, is no attempt: the claim's is taken back.
    if let (Outcome::Snooze { .. } | Outcome::Unstarted, Some(at)) = (outcome, &m.attempts) {
        set.push(attempt_taken_back(at));
    }
    let Some(l) = life else {
        return set.join(", ");
    };
    match outcome {
        Outcome::Done(Some(out)) => set.push(format!("{} = {}", l.output, D::json(b, out.clone()))),
        Outcome::Failed(Some(e)) | Outcome::Retry { error: Some(e), .. } => {
            set.push(format!("{} = {}", l.error, b.bind(e.clone())));
            set.push(format!("{} = {}", l.history, attempt_entry(m, l, b, e)));
        }
        _ => {}
    }
    if matches!(outcome, Outcome::Done(_) | Outcome::Failed(_)) {
        set.push(format!("{} = {}", l.finished, D::NOW));
    }
    set.join(", ")
}

/// A snoozed row of a table of one's own, which has no column for when a row is due: it stays
/// claimed, by nobody (no owner, so no token holds it), until its lease, set to `after` from
/// now, ends; then claims take it as a row whose lease expired. The claim's attempt is taken
/// back, as that claim adds one again. Only for strategies that keep claims in the table
/// ([`crate::claim::Claimer::snoozes`]).
fn snooze_in_lease<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    lease: &str,
    after: Duration,
) -> String {
    let mut set = vec![format!("{lease} = {}", D::later(b, after))];
    set.extend(m.owner.iter().map(|ow| format!("{ow} = NULL")));
    set.extend(m.attempts.iter().map(|at| attempt_taken_back(at)));
    set.join(", ")
}

/// The attempts column `at` one lower (never below 0): the claim's attempt taken back.
fn attempt_taken_back(at: &str) -> String {
    format!("{at} = CASE WHEN {at} > 0 THEN {at} - 1 ELSE 0 END")
}

/// Settles the rows `target` of `token`, held in the table (not in the lease table): moves them
/// to `outcome`, or deletes them where a completed row is not kept.
pub(crate) fn settle_in_table_sql<D: Dialect>(
    m: &Mapping,
    token: &str,
    target: &Target<'_>,
    outcome: &Outcome,
) -> Result<Stmt<D>> {
    let mut b = Binder::new();
    let set = (!outcome.deletes(m)).then(|| outcome_set(m, &mut b, outcome));
    let cond = held_by(m, &mut b, token, target)?;
    Ok(Stmt::new(change_sql(m, set.as_deref(), &cond), b))
}

/// Pushes the lease column of the rows `target` of `token` to now + `lease`.
pub(crate) fn extend_in_table_sql<D: Dialect>(
    m: &Mapping,
    token: &str,
    target: &Target<'_>,
    lease: Duration,
) -> Result<Stmt<D>> {
    let Some(le) = &m.lease else {
        return Err(crate::error::Error::Unsupported(format!(
            "{} has no lease column mapped, so its claims cannot be extended",
            m.table_display
        )));
    };
    let mut b = Binder::new();
    let set = format!("{le} = {}", D::later(&mut b, lease));
    let cond = held_by(m, &mut b, token, target)?;
    Ok(Stmt::new(change_sql(m, Some(&set), &cond), b))
}
