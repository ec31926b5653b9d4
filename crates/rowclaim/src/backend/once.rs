//! The statements every driver runs the same way, written once over a driver's [`Run`]: a
//! source's stats and backlog, the "did this claim lose a race?" check, the settle that says
//! which rows it changed (`RETURNING`), the change of named rows that commits all or nothing,
//! and the release of a held row by hand. A driver's `store.rs` calls them.

use super::run::{Col, Finish, Run, Transact};
use super::sql::{
    and_each, candidates, change_sql, held_by, lock_row_sql, outcome_set, release_lease_sql,
    release_refused, release_row_sql, Binder, Dialect, Stmt,
};
use super::{Outcome, Target};
use crate::error::{DbKind, Error, Result};
use crate::id::RowId;
use crate::mapping::{status_literal, Mapping, Naming};
use crate::report::Stats;
use crate::strategy::Strategy;
use crate::value::IdList;

/// Runs a statement that changes rows; with several named rows it commits only if all of them
/// changed (all or nothing). A transaction of three round trips costs the server less than one
/// statement that locks the rows first and then changes them (a lock is a WAL record of its
/// own). Where one writer at a time writes ([`Dialect::ONE_WRITER`]), every change takes the
/// write lock up front, in a transaction.
pub(crate) async fn change_all_or_nothing<R: Transact + ?Sized>(
    r: &R,
    s: Stmt<R::Sql>,
    target: &Target<'_>,
) -> Result<u64> {
    let named = match target {
        Target::Ids(_, n) => Some(*n),
        Target::All => None,
    };
    if named.is_none_or(|n| n <= 1) && !R::Sql::ONE_WRITER {
        return r.execute(s).await;
    }
    let tx = r.transaction(false).await?;
    let changed = tx.execute(s).await?;
    if named.is_some_and(|n| changed != n as u64) {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(changed)
}

/// Gives the claimed row `id` back by hand ([`super::ClaimStore::release_row`]): in one
/// transaction, a locking read that does not wait ([`Dialect::NOWAIT`]: a row that a
/// `transaction` claimer holds in its open transaction fails at once, as [`Error::Locked`]),
/// then its lease in `rowclaim_leases` and its row, together (the holder's settle then finds no
/// lease of its token, and the row, if marked claimed, is ready again).
pub(crate) async fn release_row<R: Transact + ?Sized>(
    r: &R,
    m: &Mapping,
    strategy: Strategy,
    id: &RowId,
    holder: Option<&str>,
) -> Result<u64> {
    if strategy == Strategy::Transaction {
        return Err(release_refused(m));
    }
    let release = release_sql::<R::Sql>(m, strategy, id, holder);
    let tx = r.transaction(false).await?;
    if let Some(lock) = release.lock {
        tx.execute(lock).await.map_err(|e| {
            // MariaDB answers NOWAIT on a locked row with its lock-wait timeout (1205), which
            // is transient elsewhere; PostgreSQL and MySQL with a lock conflict of their own.
            match e.db_kind() {
                Some(DbKind::LockConflict | DbKind::Transient | DbKind::LockWait) => Error::Locked,
                _ => e,
            }
        })?;
    }
    let gone = match release.lease {
        Some(delete) => {
            let gone = tx.execute(delete).await?;
            if gone == 0 && holder.is_some() {
                // Not held by that holder (any more): nothing to give back. Roll back now: a
                // transaction only dropped keeps the row's lock until the pool gets to it, and
                // the next release on another connection would find the row locked.
                tx.rollback().await?;
                return Ok(0);
            }
            gone
        }
        None => 0,
    };
    let changed = tx.execute(release.row).await?;
    tx.commit().await?;
    Ok(gone + changed)
}

/// The statements of a release by hand ([`release_row`]), in order.
pub(crate) struct Release<D: Dialect> {
    /// The locking read that does not wait (none without row locks).
    pub lock: Option<Stmt<D>>,
    /// The removal of its lease from `rowclaim_leases` (lease-table sources only).
    pub lease: Option<Stmt<D>>,
    /// The row back to ready.
    pub row: Stmt<D>,
}

/// The statements that give row `id` back (see [`release_row`]).
pub(crate) fn release_sql<D: Dialect>(
    m: &Mapping,
    strategy: Strategy,
    id: &RowId,
    holder: Option<&str>,
) -> Release<D> {
    let lock = D::NOWAIT.map(|nowait| {
        let mut b = Binder::new();
        let sql = lock_row_sql(m, &mut b, id, nowait);
        Stmt::new(sql, b)
    });
    let lease = (strategy == Strategy::LeaseTable).then(|| {
        let mut b = Binder::new();
        let sql = release_lease_sql(m, &mut b, id, holder);
        Stmt::new(sql, b)
    });
    let in_table = (strategy != Strategy::LeaseTable)
        .then_some(holder)
        .flatten();
    let mut b = Binder::new();
    let sql = release_row_sql(m, &mut b, id, in_table);
    Release {
        lock,
        lease,
        row: Stmt::new(sql, b),
    }
}

/// Settles each named row the token still holds, on its own, in one statement that says which
/// rows it changed (`UPDATE … RETURNING`, for servers with [`crate::Capability::Returning`]);
/// `None` where a token cannot name its rows this way (lease table, no owner column).
pub(crate) async fn settle_returning<R: Run + ?Sized>(
    r: &R,
    m: &Mapping,
    strategy: Strategy,
    token: &str,
    list: &IdList,
    outcome: Outcome,
) -> Result<Option<Vec<crate::id::RowId>>> {
    if strategy == Strategy::LeaseTable || m.owner.is_none() {
        return Ok(None);
    }
    let mut b = Binder::new();
    let set = (!outcome.deletes(m)).then(|| outcome_set(m, &mut b, &outcome));
    let cond = held_by(m, &mut b, token, &Target::Ids(list, list.len()))?;
    let sql = format!(
        "{} RETURNING CAST({} AS {})",
        change_sql(m, set.as_deref(), &cond),
        m.id,
        R::Sql::TEXT
    );
    let done = r.texts(Stmt::new(sql, b)).await?;
    Ok(Some(m.parse_ids(&done)?))
}

/// Rows waiting for a worker: ready rows that are due or await a retry (a row scheduled for
/// later that never ran is not work yet), claimed rows, and those scheduled for later; all
/// within what a layer above counts as its work, and the source's filter. One statement, so
/// that the three counts see one "now": counted apart, a row whose time came between the first
/// count and the last was in neither, and `--until-empty` ended with it still to run.
pub(crate) async fn backlog<R: Run + ?Sized>(r: &R, m: &Mapping) -> Result<(u64, u64, u64)> {
    let now = R::Sql::NOW;
    let (due, later) = match (&m.lifecycle, &m.attempts) {
        (Some(l), Some(a)) => (
            format!(" AND ({} <= {now} OR {a} > 0)", l.due),
            Some(format!(" AND {} > {now} AND {a} = 0", l.due)),
        ),
        (Some(l), None) => (
            format!(" AND {} <= {now}", l.due),
            Some(format!(" AND {} > {now}", l.due)),
        ),
        _ => (String::new(), None),
    };
    let ready = status_literal(&m.ready);
    let mut b = Binder::new();
    let mut count = |cond: &str| {
        let work = m
            .lifecycle
            .as_ref()
            .map(|l| and_each(&l.work, &mut b))
            .unwrap_or_default();
        format!(
            "(SELECT COUNT(*) FROM {} WHERE {cond}{work}{})",
            m.table, m.filter
        )
    };
    let counts = [
        count(&format!("{} = {ready}{due}", m.status)),
        count(&format!("{} = {}", m.status, status_literal(&m.claimed))),
        match later {
            Some(later) => count(&format!("{} = {ready}{later}", m.status)),
            // Nothing is scheduled where rows have no due time; counted all the same, so
            // that the column is the same integer type as the others on every database.
            None => format!("(SELECT COUNT(*) FROM {} WHERE 1 = 0)", m.table),
        },
    ];
    let sql = format!("SELECT {}", counts.join(", "));
    let row = r
        .values(Stmt::new(sql, b), &[Col::Int, Col::Int, Col::Int])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Internal("the backlog's three counts answered no row".into()))?;
    let mut n = row
        .into_iter()
        .map(|v| v.int().map_or(0, |n| u64::try_from(n).unwrap_or(0)));
    let mut next = || n.next().unwrap_or(0);
    Ok((next(), next(), next()))
}

/// Whether any row could be claimed now: asked when a claim that can lose races (token) came
/// back empty, to tell "lost to others, try again" from "nothing to do".
pub(crate) async fn claimable_exists<R: Run + ?Sized>(r: &R, m: &Mapping) -> Result<bool> {
    let mut b = Binder::new();
    let sql = format!(
        "SELECT COUNT(*) FROM ({}) AS c",
        candidates(m, &mut b, "1 AS one", 1, true)
    );
    Ok(r.count(Stmt::new(sql, b)).await? > 0)
}

/// A source's stats: rows per status, claimed rows per owner (token), expired leases (none
/// without a lease column or lease table).
pub(crate) async fn stats<R: Run + ?Sized>(
    r: &R,
    m: &Mapping,
    strategy: Strategy,
) -> Result<Stats> {
    let (t, st, filter) = (&m.table, &m.status, &m.filter);
    let (now, text) = (R::Sql::NOW, R::Sql::TEXT);
    let by_status = r
        .count_by(Stmt::new(
            format!(
                "SELECT CAST({st} AS {text}), COUNT(*) FROM {t} WHERE 1 = 1{filter} GROUP BY 1"
            ),
            Binder::new(),
        ))
        .await?;
    let mut b = Binder::new();
    let owners = if strategy == Strategy::LeaseTable {
        let s = b.bind(m.source_key.clone());
        format!(
            "SELECT CAST(token AS {text}), COUNT(*) FROM rowclaim_leases \
             WHERE source = {s} AND lease_until >= {now} GROUP BY 1"
        )
    } else {
        let owner = m.owner.as_deref().unwrap_or("NULL");
        let c = status_literal(&m.claimed);
        format!(
            "SELECT CAST({owner} AS {text}), COUNT(*) FROM {t} WHERE {st} = {c}{filter} GROUP BY 1"
        )
    };
    let by_owner = match r.count_by(Stmt::new(owners, b)).await {
        // No lease table yet: no claim has been taken with it, so nothing is held or expired.
        // (MySQL answers a user who may not read a table as if it were missing: the same.)
        Err(e)
            if strategy == Strategy::LeaseTable
                && matches!(
                    e.db_kind(),
                    Some(DbKind::MissingTable | DbKind::PermissionDenied)
                ) =>
        {
            return Ok(stats_of(by_status, Vec::new(), 0));
        }
        other => other?,
    };
    let mut b = Binder::new();
    let expired = if strategy == Strategy::LeaseTable {
        let s = b.bind(m.source_key.clone());
        Some(format!(
            "SELECT COUNT(*) FROM rowclaim_leases WHERE source = {s} AND lease_until < {now}"
        ))
    } else {
        m.lease.as_ref().map(|le| {
            let c = status_literal(&m.claimed);
            format!("SELECT COUNT(*) FROM {t} WHERE {st} = {c} AND {le} < {now}{filter}")
        })
    };
    let expired = match expired {
        Some(sql) => r.count(Stmt::new(sql, b)).await?,
        None => 0,
    };
    Ok(stats_of(by_status, by_owner, expired))
}

/// Stats from the counts: rows per status, claimed rows per owner, expired leases.
fn stats_of(
    by_status: Vec<(Option<String>, i64)>,
    by_owner: Vec<(Option<String>, i64)>,
    expired: i64,
) -> Stats {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Stats {
        by_status: by_status
            .into_iter()
            .map(|(s, n)| (s.unwrap_or_else(|| "(null)".into()), count(n)))
            .collect(),
        claimed_by_owner: by_owner
            .into_iter()
            .map(|(o, n)| (o.unwrap_or_else(|| "(no owner)".into()), count(n)))
            .collect(),
        expired_leases: count(expired),
    }
}

/// Runs the source's filter on its table in a statement that reads no row: the database says
/// whether it is a condition on the table.
pub(crate) async fn probe_filter<R: Run + ?Sized>(r: &R, m: &Mapping) -> Result<()> {
    let sql = format!(
        "SELECT COUNT(*) FROM (SELECT 1 AS probe FROM {} WHERE 1 = 1{} LIMIT 0) AS p",
        m.table, m.filter
    );
    r.count(Stmt::new(sql, Binder::new())).await.map(drop)
}

/// How the database of driver `R` names things, for checking a source against its catalog.
pub(crate) fn naming<R: Run + ?Sized>(_: &R) -> Naming {
    super::sql::naming::<R::Sql>()
}
