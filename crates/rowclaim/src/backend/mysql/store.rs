//! The claim store on MySQL/MariaDB: settling, extending and reading rows a token holds, locking
//! reads, listing rows (the reports are shared: `sql::stats`, `sql::backlog`).

use super::*;
use crate::backend::run::{Finish, Run, Transact};
use crate::backend::{RowQuery, StoredRow};

/// A row as JSON text, then its status, holder and lease end (see `StoredRow`).
type TextRow = (String, Option<String>, Option<String>, Option<i64>);

#[async_trait::async_trait]
impl ClaimStore for My {
    async fn settle(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        outcome: Outcome,
    ) -> Result<u64> {
        if strategy != Strategy::LeaseTable {
            let s = sql::settle_in_table_sql(m, token, &target, &outcome)?;
            return once::change_all_or_nothing(self, s, &target).await;
        }
        // Lock and delete the token's leases, then settle their rows. (MariaDB could do the first
        // two in one `DELETE … RETURNING`; MySQL 8 cannot, so both servers take two statements.)
        let tx = self.transaction(false).await?;
        let gone = tx.texts(leases_sql(m, token, &target, true)).await?;
        if gone.is_empty() {
            tx.rollback().await?;
            return Ok(0);
        }
        tx.execute(drop_leases_sql(m, token, &target)).await?;
        let changed = tx
            .execute(settle_leased_sql(m, &id_list(m, &gone)?, &outcome))
            .await?;
        match target {
            Target::Ids(_, n) if changed != n as u64 => tx.rollback().await?,
            _ => tx.commit().await?,
        }
        Ok(changed)
    }

    /// MySQL has no `UPDATE … RETURNING`. A completed or failed row keeps its owner, so one
    /// `UPDATE` suffices when it matched every named row (the common case), and a short count is
    /// followed by a read of which rows now carry the token in their new state. A row given back
    /// (owner cleared) or deleted leaves no such trace: for those the caller settles all or
    /// nothing and narrows down.
    async fn settle_each(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<RowId>>> {
        let keeps_owner = matches!(outcome, Outcome::Done(_) | Outcome::Failed(_));
        let Some(owner) = m.owner.as_ref() else {
            return Ok(None);
        };
        if strategy == Strategy::LeaseTable || !keeps_owner || outcome.deletes(m) {
            return Ok(None);
        }
        let n = list.len();
        let s = sql::settle_in_table_sql(m, token, &Target::Ids(list, n), &outcome)?;
        if self.execute(s).await? == n as u64 {
            return Ok(Some(list.row_ids()));
        }
        let ours = self
            .texts(settled_by_sql(m, owner, token, list, &outcome))
            .await?;
        Ok(Some(m.parse_ids(&ours)?))
    }

    async fn extend(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        lease: Duration,
    ) -> Result<u64> {
        let s = if strategy == Strategy::LeaseTable {
            let mut b = B::new();
            let until = Sql::later(&mut b, lease);
            let mine = leases_of(m, &mut b, token, &target);
            Stmt::new(
                format!("UPDATE rowclaim_leases SET lease_until = {until} WHERE {mine}"),
                b,
            )
        } else {
            sql::extend_in_table_sql(m, token, &target, lease)?
        };
        once::change_all_or_nothing(self, s, &target).await
    }

    async fn still_held(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
    ) -> Result<Vec<RowId>> {
        let target = Target::Ids(list, 0);
        let s = if strategy == Strategy::LeaseTable {
            leases_sql(m, token, &target, false)
        } else {
            let mut b = B::new();
            let cond = sql::held_by(m, &mut b, token, &target)?;
            Stmt::new(
                format!("SELECT {} FROM {} AS t WHERE {cond}", id_text(m), m.table),
                b,
            )
        };
        let found = self.texts(s).await?;
        m.parse_ids(&found)
    }

    async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<()> {
        let tx = held.mysql()?;
        // A row given back is still ready in the table; only its lock goes, at commit.
        if !outcome.gives_back() {
            let Stmt { sql, binder } = held_settle_sql(m, list, &outcome);
            binder.query(sql)?.execute(&mut **tx).await.map_err(error)?;
        }
        let Stmt { sql, binder } = held_done_sql(list.len());
        binder.query(sql)?.execute(&mut **tx).await.map_err(error)?;
        Ok(())
    }

    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        let tx = held.mysql()?;
        let mut b = B::new();
        let sql = format!("SET SESSION wait_timeout = {}", b.bind(lease_secs(lease)));
        b.query(sql)?.execute(&mut **tx).await.map_err(error)?;
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
        let kind = self.server().await?.kind;
        let mut b = B::new();
        let which = match list {
            Some(l) => in_ids(&mut b, &format!("t.{}", m.id), l),
            None => "TRUE".to_owned(),
        };
        let limit = limit
            .map(|n| format!(" LIMIT {}", b.bind(i64::from(n))))
            .unwrap_or_default();
        let lock = match (mode, kind) {
            (LockMode::Update, _) => "FOR UPDATE",
            // MariaDB has no FOR SHARE; MySQL 8 has both and takes NOWAIT / SKIP LOCKED after
            // either, MariaDB after LOCK IN SHARE MODE.
            (LockMode::Share, ServerKind::MariaDb) => "LOCK IN SHARE MODE",
            (LockMode::Share, _) => "FOR SHARE",
        };
        let nowait = wait == LockWait::NoWait;
        let wait = match wait {
            LockWait::Wait => "",
            LockWait::NoWait => " NOWAIT",
            LockWait::SkipLocked => " SKIP LOCKED",
        };
        let sql = format!(
            "SELECT {} FROM {} AS t WHERE {which}{} ORDER BY {}{limit} {lock}{wait}",
            row_json(m),
            m.table,
            m.filter,
            m.order_by
        );
        let mut tx = self.begin().await?;
        let fetched = b.scalar(sql)?.fetch_all(&mut *tx).await;
        // MariaDB answers NOWAIT on a locked row with its lock-wait timeout (1205), which
        // elsewhere is a transient error; MySQL has its own code (3572), a lock conflict.
        let texts = fetched.map_err(|e| match error_kind(&e) {
            Some(DbKind::Transient) if nowait => Error::Locked,
            _ => error(e),
        })?;
        Ok((Held::MySql(tx), parse_rows(texts)?))
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<crate::report::Stats> {
        once::stats(self, m, strategy).await
    }

    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64, u64)> {
        once::backlog(self, m).await
    }

    async fn rows(&self, m: &Mapping, strategy: Strategy, q: &RowQuery) -> Result<Vec<StoredRow>> {
        let mut b = B::new();
        let held = sql::holder_columns(m, strategy, &mut b, Sql::epoch_ms, "CAST(NULL AS SIGNED)");
        let sql = sql::rows_sql(m, &mut b, &format!("{}, {held}", row_json(m)), q);
        let rows: Vec<TextRow> = b
            .query_as(sql)?
            .fetch_all(&self.pool)
            .await
            .map_err(error)?;
        rows.into_iter()
            .map(|(row, st, owner, lease)| Ok((sql::parse_row(&row)?, st, owner, lease)))
            .collect()
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

/// The lease table's keys of the rows `target` of `token` (locked, with `lock`: a settle
/// takes them so).
pub(crate) fn leases_sql(m: &Mapping, token: &str, target: &Target<'_>, lock: bool) -> Stmt<Sql> {
    let mut b = B::new();
    let mine = leases_of(m, &mut b, token, target);
    let lock = if lock { " FOR UPDATE" } else { "" };
    Stmt::new(
        format!("SELECT row_id FROM rowclaim_leases WHERE {mine}{lock}"),
        b,
    )
}

/// Drops the leases of the rows `target` of `token`.
pub(crate) fn drop_leases_sql(m: &Mapping, token: &str, target: &Target<'_>) -> Stmt<Sql> {
    let mut b = B::new();
    let mine = leases_of(m, &mut b, token, target);
    Stmt::new(format!("DELETE FROM rowclaim_leases WHERE {mine}"), b)
}

/// Settles the claimed rows `list` whose leases were just dropped.
pub(crate) fn settle_leased_sql(m: &Mapping, list: &IdList, outcome: &Outcome) -> Stmt<Sql> {
    let mut b = B::new();
    let set = sql::outcome_set(m, &mut b, outcome);
    let which = in_ids(&mut b, &m.id, list);
    let claimed = status_literal(&m.claimed);
    let sql = format!(
        "UPDATE {} SET {set} WHERE {which} AND {} = {claimed}",
        m.table, m.status
    );
    Stmt::new(sql, b)
}

/// Which of `list` carry `token` in `outcome`'s state: the rows a short settle did settle.
pub(crate) fn settled_by_sql(
    m: &Mapping,
    owner: &str,
    token: &str,
    list: &IdList,
    outcome: &Outcome,
) -> Stmt<Sql> {
    let mut b = B::new();
    let which = in_ids(&mut b, &m.id, list);
    let sql = format!(
        "SELECT CAST({} AS CHAR) FROM {} WHERE {which} AND {owner} = {} AND {} = {}",
        m.id,
        m.table,
        b.bind(token.to_owned()),
        m.status,
        status_literal(outcome.status(m))
    );
    Stmt::new(sql, b)
}

/// Within the transaction strategy's transaction, which holds the rows' locks: their new status.
pub(crate) fn held_settle_sql(m: &Mapping, list: &IdList, outcome: &Outcome) -> Stmt<Sql> {
    let mut b = B::new();
    let st = status_literal(outcome.status(m));
    let which = in_ids(&mut b, &m.id, list);
    let sql = format!("UPDATE {} SET {} = {st} WHERE {which}", m.table, m.status);
    Stmt::new(sql, b)
}

/// After `n` rows of the transaction strategy are settled: once the last one is, the facade
/// commits and the connection goes back to the pool, with the server's idle timeout again.
/// Both expressions read the variables' old values (whichever order the server evaluates them
/// in), so this is one round trip.
pub(crate) fn held_done_sql(n: usize) -> Stmt<Sql> {
    let mut b = B::new();
    let n = n as i64;
    let sql = format!(
        "SET SESSION wait_timeout = IF(@rowclaim_open <= {}, @@GLOBAL.wait_timeout, \
         @@SESSION.wait_timeout), @rowclaim_open = @rowclaim_open - {}",
        b.bind(n),
        b.bind(n)
    );
    Stmt::new(sql, b)
}

/// The statements a settle sends, for the SQL snapshots (the lease table's: its keys 1 and 2
/// found).
#[cfg(test)]
pub(crate) fn settle_statements(
    m: &Mapping,
    strategy: Strategy,
    token: &str,
    target: &Target<'_>,
    outcome: &Outcome,
) -> Result<Vec<Stmt<Sql>>> {
    if strategy != Strategy::LeaseTable {
        return Ok(vec![sql::settle_in_table_sql(m, token, target, outcome)?]);
    }
    Ok(vec![
        leases_sql(m, token, target, true),
        drop_leases_sql(m, token, target),
        settle_leased_sql(m, &IdList::Int(vec![1, 2]), outcome),
    ])
}
