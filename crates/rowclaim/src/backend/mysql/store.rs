//! The claim store on MySQL/MariaDB: settling, extending and reading rows a token holds, locking
//! reads, listing rows (the reports are shared: `sql::stats`, `sql::backlog`).

use super::*;
use crate::backend::{RowQuery, StoredRow};

/// A row as JSON text, then its status, holder and lease end (see `StoredRow`).
type TextRow = (String, Option<String>, Option<String>, Option<i64>);

#[async_trait::async_trait]
impl ClaimStore for My {
    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        Ok(self.claim_rows(a).await?.map_held(Held::MySql))
    }

    async fn settle(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        outcome: Outcome,
    ) -> Result<u64> {
        let t = &m.table;
        if strategy != Strategy::LeaseTable {
            let mut b = B::new();
            let set = (!outcome.deletes(m)).then(|| sql::outcome_set(m, &mut b, &outcome));
            let cond = sql::held_by(m, &mut b, token, &target)?;
            let sql = sql::change_sql(m, set.as_deref(), &cond);
            return self.change_all_or_nothing(sql, b, &target).await;
        }
        // Lock and delete the token's leases, then settle their rows. (MariaDB could do the first
        // two in one `DELETE … RETURNING`; MySQL 8 cannot, so both servers take two statements.)
        let mut tx = self.begin().await?;
        let mut b = B::new();
        let mine = leases_of(m, &mut b, token, &target);
        let sql = format!("SELECT row_id FROM rowclaim_leases WHERE {mine} FOR UPDATE");
        let gone: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
        if gone.is_empty() {
            tx.rollback().await?;
            return Ok(0);
        }
        let mut b = B::new();
        let mine = leases_of(m, &mut b, token, &target);
        b.query(format!("DELETE FROM rowclaim_leases WHERE {mine}"))?
            .execute(&mut *tx)
            .await?;
        let list = id_list(m, &gone)?;
        let mut b = B::new();
        let set = sql::outcome_set(m, &mut b, &outcome);
        let which = in_ids(&mut b, &m.id, &list);
        let claimed = status_literal(&m.claimed);
        let sql = format!(
            "UPDATE {t} SET {set} WHERE {which} AND {} = {claimed}",
            m.status
        );
        let changed = b.query(sql)?.execute(&mut *tx).await?.rows_affected();
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
        let mut b = B::new();
        let set = sql::outcome_set(m, &mut b, &outcome);
        let cond = sql::held_by(m, &mut b, token, &Target::Ids(list, n))?;
        let sql = sql::change_sql(m, Some(&set), &cond);
        let changed = b.query(sql)?.execute(&self.pool).await?.rows_affected();
        if changed == n as u64 {
            return Ok(Some(list_ids(list)));
        }
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
        let ours: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
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
        let mut b = B::new();
        let sql = if strategy == Strategy::LeaseTable {
            let until = Sql::later(&mut b, lease);
            let mine = leases_of(m, &mut b, token, &target);
            format!("UPDATE rowclaim_leases SET lease_until = {until} WHERE {mine}")
        } else {
            let Some(le) = &m.lease else {
                return Err(Error::Unsupported(format!(
                    "{} has no lease column mapped, so its claims cannot be extended",
                    m.table_display
                )));
            };
            let until = Sql::later(&mut b, lease);
            let cond = sql::held_by(m, &mut b, token, &target)?;
            format!("UPDATE {} SET {le} = {until} WHERE {cond}", m.table)
        };
        self.change_all_or_nothing(sql, b, &target).await
    }

    async fn still_held(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
    ) -> Result<Vec<RowId>> {
        let mut b = B::new();
        let target = Target::Ids(list, 0);
        let sql = if strategy == Strategy::LeaseTable {
            let mine = leases_of(m, &mut b, token, &target);
            format!("SELECT row_id FROM rowclaim_leases WHERE {mine}")
        } else {
            let cond = sql::held_by(m, &mut b, token, &target)?;
            format!("SELECT {} FROM {} AS t WHERE {cond}", id_text(m), m.table)
        };
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
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
            let mut b = B::new();
            let st = status_literal(outcome.status(m));
            let which = in_ids(&mut b, &m.id, list);
            let sql = format!("UPDATE {} SET {} = {st} WHERE {which}", m.table, m.status);
            b.query(sql)?.execute(&mut **tx).await?;
        }
        // After the last row the facade commits and the connection goes back to the pool: give
        // it the server's idle timeout again. Both expressions read the variables' old values
        // (whichever order the server evaluates them in), so this is one round trip.
        let n = match list {
            IdList::Int(v) => v.len(),
            IdList::Text(v) => v.len(),
        } as i64;
        sqlx::query(
            "SET SESSION wait_timeout = IF(@rowclaim_open <= ?, @@GLOBAL.wait_timeout, \
             @@SESSION.wait_timeout), @rowclaim_open = @rowclaim_open - ?",
        )
        .bind(n)
        .bind(n)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        let tx = held.mysql()?;
        sqlx::query("SET SESSION wait_timeout = ?")
            .bind(lease_secs(lease))
            .execute(&mut **tx)
            .await?;
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
        let texts = fetched.map_err(|e| match crate::error::db_kind(&e) {
            Some(DbKind::Transient) if nowait => Error::Locked,
            _ => Error::Database(e),
        })?;
        Ok((Held::MySql(tx), parse_rows(texts)?))
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<crate::Stats> {
        run::stats(self, m, strategy).await
    }

    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64, u64)> {
        run::backlog(self, m).await
    }

    async fn rows(&self, m: &Mapping, strategy: Strategy, q: &RowQuery) -> Result<Vec<StoredRow>> {
        let mut b = B::new();
        let held = sql::holder_columns(m, strategy, &mut b, Sql::epoch_ms, "CAST(NULL AS SIGNED)");
        let sql = sql::rows_sql(m, &mut b, &format!("{}, {held}", row_json(m)), q);
        let rows: Vec<TextRow> = b.query_as(sql)?.fetch_all(&self.pool).await?;
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
        if strategy == Strategy::Transaction {
            return Err(sql::release_refused(m));
        }
        let mut tx = self.begin().await?;
        let mut b = B::new();
        let lock = sql::lock_row_sql(m, &mut b, id, " NOWAIT");
        // MariaDB answers NOWAIT on a locked row with its lock-wait timeout (1205), MySQL with
        // its own code: both mean the row is held by an open transaction.
        b.query(lock)?
            .execute(&mut *tx)
            .await
            .map_err(|e| match crate::error::db_kind(&e) {
                Some(DbKind::Transient | DbKind::LockConflict) => Error::Locked,
                _ => Error::Database(e),
            })?;
        // Both or neither: the lease goes (the holder's settle finds no lease of its token)
        // and the row, if marked claimed, is ready again.
        let gone = if strategy == Strategy::LeaseTable {
            let mut b = B::new();
            let delete = sql::release_lease_sql(m, &mut b, id, holder);
            let gone = b.query(delete)?.execute(&mut *tx).await?.rows_affected();
            if gone == 0 && holder.is_some() {
                // Not held by that holder (any more): nothing to give back.
                return Ok(0);
            }
            gone
        } else {
            0
        };
        let mut b = B::new();
        let in_table = (strategy != Strategy::LeaseTable)
            .then_some(holder)
            .flatten();
        let back = sql::release_row_sql(m, &mut b, id, in_table);
        let changed = b.query(back)?.execute(&mut *tx).await?.rows_affected();
        tx.commit().await?;
        Ok(gone + changed)
    }
}
