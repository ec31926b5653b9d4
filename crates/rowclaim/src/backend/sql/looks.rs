//! The statements of a look at a source's rows (`Claimer::rows`) and of giving a held row back
//! by hand (`Claimer::release_row`), written once for every driver.

use super::{change_sql, outcome_set, Binder, Dialect};
use crate::backend::{Outcome, RowQuery};
use crate::mapping::{status_literal, Mapping};

/// What a look at a source's rows selects besides the row itself: its status as text, who holds
/// it and when that lease ends (`lease_ms` spells a time as epoch milliseconds in the dialect).
/// The lease table is read in sub-selects rather than joined, so that the operator's filter,
/// written for the table alone, cannot meet a column of the same name there.
pub(crate) fn holder_columns<D: Dialect>(
    m: &Mapping,
    strategy: crate::strategy::Strategy,
    b: &mut Binder<D>,
    lease_ms: fn(&str) -> String,
    null_ms: &str,
) -> String {
    let (st, text) = (&m.status, D::TEXT);
    let (owner, lease) = if strategy == crate::strategy::Strategy::LeaseTable {
        let lease_of = |b: &mut Binder<D>, what: &str| {
            format!(
                "(SELECT {what} FROM rowclaim_leases AS l WHERE l.source = {} \
                 AND l.row_id = CAST(t.{} AS {text}))",
                b.bind(m.source_key.clone()),
                m.id
            )
        };
        let owner = lease_of(b, "l.token");
        let lease = lease_of(b, &lease_ms("l.lease_until"));
        (owner, lease)
    } else {
        (
            m.owner.as_ref().map_or_else(
                || format!("CAST(NULL AS {text})"),
                |ow| format!("CAST(t.{ow} AS {text})"),
            ),
            m.lease
                .as_ref()
                .map_or_else(|| null_ms.to_owned(), |le| lease_ms(&format!("t.{le}"))),
        )
    };
    format!("CAST(t.{st} AS {text}), {owner}, {lease}")
}

/// `SELECT select FROM table AS t` for the rows `q` asks for, in id order.
pub(crate) fn rows_sql<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    select: &str,
    q: &RowQuery,
) -> String {
    let mut cond = String::from("1 = 1");
    if let Some(s) = &q.status {
        cond.push_str(&format!(" AND t.{} = {}", m.status, b.value(s)));
    }
    if let Some(id) = &q.id {
        cond.push_str(&format!(" AND t.{} = {}", m.id, b.value(id)));
    }
    if let Some(after) = &q.after {
        cond.push_str(&format!(" AND t.{} > {}", m.id, b.value(after)));
    }
    format!(
        "SELECT {select} FROM {} AS t WHERE {cond}{} ORDER BY t.{} LIMIT {}",
        m.table,
        m.filter,
        m.id,
        b.bind(q.limit)
    )
}

/// The statement that gives a claimed row back, for strategies that keep claims in the table:
/// ready, owner and lease cleared; only while `holder` owns it, when given (and the mapping has
/// an owner column). The holder's token no longer matches, so fencing refuses whatever it does
/// with the row later.
pub(crate) fn release_row_sql<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    id: &crate::id::RowId,
    holder: Option<&str>,
) -> String {
    let set = outcome_set(m, b, &Outcome::Ready);
    let mut cond = format!(
        "{} = {} AND {} = {}{}",
        m.id,
        b.value(id),
        m.status,
        status_literal(&m.claimed),
        m.filter
    );
    if let (Some(ow), Some(h)) = (&m.owner, holder) {
        cond.push_str(&format!(" AND {ow} = {}", b.bind(h.to_owned())));
    }
    change_sql(m, Some(&set), &cond)
}

/// The statement that removes row `id`'s lease from `rowclaim_leases` (only `holder`'s, when
/// given): a release of a source whose claims are kept there.
pub(crate) fn release_lease_sql<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    id: &crate::id::RowId,
    holder: Option<&str>,
) -> String {
    let mut delete = format!(
        "DELETE FROM rowclaim_leases WHERE source = {} AND row_id = {}",
        b.bind(m.source_key.clone()),
        b.bind(id.to_string())
    );
    if let Some(h) = holder {
        delete.push_str(&format!(" AND token = {}", b.bind(h.to_owned())));
    }
    delete
}

/// The locking read a release takes first, `wait_clause` being the dialect's NOWAIT: a row that
/// a `transaction` claimer holds in its open transaction fails at once instead of keeping the
/// releasing connection waiting for that transaction.
pub(crate) fn lock_row_sql<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    id: &crate::id::RowId,
    wait_clause: &str,
) -> String {
    format!(
        "SELECT 1 FROM {} WHERE {} = {} FOR UPDATE{wait_clause}",
        m.table,
        m.id,
        b.value(id)
    )
}

/// A row held by the transaction strategy is locked by its claimer's open transaction: an
/// UPDATE would wait for it, and the claimer's commit would still win.
pub(crate) fn release_refused(m: &Mapping) -> crate::error::Error {
    crate::error::Error::Unsupported(format!(
        "rows of {} are claimed with the transaction strategy: the claiming process's open \
         transaction holds them, and they come back when it ends",
        m.table_display
    ))
}
