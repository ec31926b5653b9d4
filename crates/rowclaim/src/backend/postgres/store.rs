//! The claim store on PostgreSQL: settling, extending and reading rows a token holds, locking
//! reads, listing rows. The statements are built by pure functions (`*_sql`); what every driver
//! runs alike is in `backend/once.rs`.

use super::*;
use crate::backend::run::{Run, Transact};
use crate::backend::{RowQuery, StoredRow};

#[async_trait::async_trait]
impl ClaimStore for Pg {
    async fn settle(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        outcome: Outcome,
    ) -> Result<u64> {
        let s = settle_sql(m, strategy, token, &target, &outcome)?;
        once::change_all_or_nothing(self, s, &target).await
    }

    async fn settle_each(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<RowId>>> {
        once::settle_returning(self, m, strategy, token, list, outcome).await
    }

    async fn extend(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        lease: Duration,
    ) -> Result<u64> {
        let s = extend_sql(m, strategy, token, &target, lease)?;
        once::change_all_or_nothing(self, s, &target).await
    }

    async fn still_held(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
    ) -> Result<Vec<RowId>> {
        let found = self
            .texts(still_held_sql(m, strategy, token, list)?)
            .await?;
        m.parse_ids(&found)
    }

    async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<()> {
        let tx = held.postgres()?;
        if outcome.gives_back() {
            return Ok(()); // still ready in the table; the lock goes at commit
        }
        let Stmt { sql, binder } = held_settle_sql(m, list, &outcome);
        binder
            .query(sql)?
            .execute(self.on(tx))
            .await
            .map_err(error)?;
        Ok(())
    }

    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        let tx = held.postgres()?;
        let Stmt { sql, binder } = super::claim::idle_timeout_sql(lease);
        binder
            .query(sql)?
            .execute(self.on(tx))
            .await
            .map_err(error)?;
        Ok(())
    }

    async fn lock_rows(
        &self,
        m: &Mapping,
        list: Option<&IdList>,
        limit: Option<u32>,
        mode: LockMode,
        wait: LockWait,
    ) -> Result<(Held, Vec<serde_json::Value>)> {
        let tx = self.transaction(false).await?;
        let rows = json_rows(&tx, lock_rows_sql(m, list, limit, mode, wait)).await?;
        Ok((Held::Postgres(tx.into_inner()), rows))
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<crate::report::Stats> {
        once::stats(self, m, strategy).await
    }

    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64, u64)> {
        once::backlog(self, m).await
    }

    async fn rows(&self, m: &Mapping, strategy: Strategy, q: &RowQuery) -> Result<Vec<StoredRow>> {
        type Found = (
            sqlx::types::Json<serde_json::Value>,
            Option<String>,
            Option<String>,
            Option<i64>,
        );
        let rows: Vec<Found> = self.fetch_all(rows_sql(m, strategy, q)).await?;
        Ok(rows
            .into_iter()
            .map(|(row, st, owner, lease)| (row.0, st, owner, lease))
            .collect())
    }

    async fn release_row(
        &self,
        m: &Mapping,
        strategy: Strategy,
        id: &RowId,
        holder: Option<&str>,
    ) -> Result<u64> {
        once::release_row(self, m, strategy, id, holder).await
    }
}

/// Moves the rows `target` of `token` to `outcome` (deletes them, where a completed row is not
/// kept). With the lease table, which says who holds a row: drops the token's leases and
/// settles those rows, in one statement.
pub(crate) fn settle_sql(
    m: &Mapping,
    strategy: Strategy,
    token: &str,
    target: &Target<'_>,
    outcome: &Outcome,
) -> Result<Stmt<Sql>> {
    if strategy != Strategy::LeaseTable {
        return sql::settle_in_table_sql(m, token, target, outcome);
    }
    let (t, mut b) = (&m.table, B::new());
    let held = held_leases(&mut b, m, token, target);
    let set = sql::outcome_set(m, &mut b, outcome);
    let claimed = status_literal(&m.claimed);
    let gone_id = row_id_as_id(m, "gone.row_id");
    let sql = format!(
        "WITH gone AS (DELETE FROM rowclaim_leases WHERE {held} RETURNING row_id) \
         UPDATE {t} AS t SET {set} FROM gone WHERE t.{} = {gone_id} AND t.{} = {claimed}",
        m.id, m.status
    );
    Ok(Stmt::new(sql, b))
}

/// Pushes the lease of the rows `target` of `token` to now + `lease`: in the lease column, or in
/// the lease table.
pub(crate) fn extend_sql(
    m: &Mapping,
    strategy: Strategy,
    token: &str,
    target: &Target<'_>,
    lease: Duration,
) -> Result<Stmt<Sql>> {
    if strategy != Strategy::LeaseTable {
        return sql::extend_in_table_sql(m, token, target, lease);
    }
    let mut b = B::new();
    let until = Sql::later(&mut b, lease);
    let held = held_leases(&mut b, m, token, target);
    let sql = format!("UPDATE rowclaim_leases SET lease_until = {until} WHERE {held}");
    Ok(Stmt::new(sql, b))
}

/// Which of `list` the token still holds, as text.
pub(crate) fn still_held_sql(
    m: &Mapping,
    strategy: Strategy,
    token: &str,
    list: &IdList,
) -> Result<Stmt<Sql>> {
    let mut b = B::new();
    let target = Target::Ids(list, 0);
    let sql = if strategy == Strategy::LeaseTable {
        let held = held_leases(&mut b, m, token, &target);
        format!("SELECT row_id FROM rowclaim_leases WHERE {held}")
    } else {
        let cond = sql::held_by(m, &mut b, token, &target)?;
        format!("SELECT {}::text FROM {} WHERE {cond}", m.id, m.table)
    };
    Ok(Stmt::new(sql, b))
}

/// Within the transaction strategy's transaction, which holds the rows' locks: their new status.
pub(crate) fn held_settle_sql(m: &Mapping, list: &IdList, outcome: &Outcome) -> Stmt<Sql> {
    let mut b = B::new();
    let st = status_literal(outcome.status(m));
    let any = ids(&mut b, list);
    let sql = format!(
        "UPDATE {} SET {} = {st} WHERE {} = ANY({any})",
        m.table, m.status, m.id
    );
    Stmt::new(sql, b)
}

/// A locking read (seed 001): the rows `list`, or the first `limit` in the source's order.
pub(crate) fn lock_rows_sql(
    m: &Mapping,
    list: Option<&IdList>,
    limit: Option<u32>,
    mode: LockMode,
    wait: LockWait,
) -> Stmt<Sql> {
    let mut b = B::new();
    let which = match list {
        Some(l) => format!("{} = ANY({})", m.id, ids(&mut b, l)),
        None => "true".to_owned(),
    };
    let limit = limit
        .map(|n| format!(" LIMIT {}", b.bind(i64::from(n))))
        .unwrap_or_default();
    let lock = match mode {
        LockMode::Share => "FOR SHARE",
        LockMode::Update => "FOR UPDATE",
    };
    let wait = match wait {
        LockWait::Wait => "",
        LockWait::NoWait => " NOWAIT",
        LockWait::SkipLocked => " SKIP LOCKED",
    };
    let sql = format!(
        "SELECT to_jsonb(t) FROM {} AS t WHERE {which}{} ORDER BY {}{limit} {lock}{wait}",
        m.table, m.filter, m.order_by
    );
    Stmt::new(sql, b)
}

/// A look at the source's rows with their holders.
pub(crate) fn rows_sql(m: &Mapping, strategy: Strategy, q: &RowQuery) -> Stmt<Sql> {
    let mut b = B::new();
    let held = sql::holder_columns(m, strategy, &mut b, Sql::epoch_ms, "CAST(NULL AS int8)");
    let sql = sql::rows_sql(m, &mut b, &format!("to_jsonb(t), {held}"), q);
    Stmt::new(sql, b)
}

/// The statements a settle sends, for the SQL snapshots.
#[cfg(test)]
pub(crate) fn settle_statements(
    m: &Mapping,
    strategy: Strategy,
    token: &str,
    target: &Target<'_>,
    outcome: &Outcome,
) -> Result<Vec<Stmt<Sql>>> {
    Ok(vec![settle_sql(m, strategy, token, target, outcome)?])
}
