//! The claim store on PostgreSQL: settling, extending and reading rows a token holds, locking
//! reads, listing rows (the reports are shared: `sql::stats`, `sql::backlog`).

use super::*;
use crate::backend::{RowQuery, StoredRow};

#[async_trait::async_trait]
impl ClaimStore for Pg {
    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        Ok(self.claim_rows(a).await?.map_held(Held::Postgres))
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
        let mut b = B::new();
        if strategy != Strategy::LeaseTable {
            let set = (!outcome.deletes(m)).then(|| sql::outcome_set(m, &mut b, &outcome));
            let cond = sql::held_by(m, &mut b, token, &target)?;
            let sql = sql::change_sql(m, set.as_deref(), &cond);
            return self.change_all_or_nothing(sql, b, &target).await;
        }
        // The lease table says who holds a row: drop the token's leases, settle those rows.
        let held = held_leases(&mut b, m, token, &target);
        let set = sql::outcome_set(m, &mut b, &outcome);
        let claimed = status_literal(&m.claimed);
        let gone_id = row_id_as_id(m, "gone.row_id");
        let sql = format!(
            "WITH gone AS (DELETE FROM rowclaim_leases WHERE {held} RETURNING row_id) \
             UPDATE {t} AS t SET {set} FROM gone WHERE t.{} = {gone_id} AND t.{} = {claimed}",
            m.id, m.status
        );
        self.change_all_or_nothing(sql, b, &target).await
    }

    async fn settle_each(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<RowId>>> {
        run::settle_returning(self, m, strategy, token, list, outcome).await
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
        if strategy != Strategy::LeaseTable {
            let le = m.lease.as_deref().unwrap_or_default();
            let set = format!("{le} = {}", Sql::later(&mut b, lease));
            let cond = sql::held_by(m, &mut b, token, &target)?;
            let sql = sql::change_sql(m, Some(&set), &cond);
            return self.change_all_or_nothing(sql, b, &target).await;
        }
        let until = Sql::later(&mut b, lease);
        let held = held_leases(&mut b, m, token, &target);
        let sql = format!("UPDATE rowclaim_leases SET lease_until = {until} WHERE {held}");
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
            let held = held_leases(&mut b, m, token, &target);
            format!("SELECT row_id FROM rowclaim_leases WHERE {held}")
        } else {
            let cond = sql::held_by(m, &mut b, token, &target)?;
            format!("SELECT {}::text FROM {} WHERE {cond}", m.id, m.table)
        };
        let found: Vec<String> = b.scalar(sql)?.fetch_all(self.exec()).await?;
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
        let mut b = B::new();
        let st = status_literal(outcome.status(m));
        let any = ids(&mut b, list);
        let sql = format!(
            "UPDATE {} SET {} = {st} WHERE {} = ANY({any})",
            m.table, m.status, m.id
        );
        b.query(sql)?.execute(self.on(tx)).await?;
        Ok(())
    }

    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        let tx = held.postgres()?;
        sqlx::query("SELECT set_config('idle_in_transaction_session_timeout', $1, true)")
            .bind(sql::lease_ms(lease).to_string())
            .execute(self.on(tx))
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
        let mut tx = self.begin().await?;
        let rows: Vec<sqlx::types::Json<serde_json::Value>> =
            b.scalar(sql)?.fetch_all(self.on(&mut tx)).await?;
        Ok((Held::Postgres(tx), json_rows(rows)))
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<crate::Stats> {
        run::stats(self, m, strategy).await
    }

    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64, u64)> {
        run::backlog(self, m).await
    }

    async fn rows(&self, m: &Mapping, strategy: Strategy, q: &RowQuery) -> Result<Vec<StoredRow>> {
        let mut b = B::new();
        let held = sql::holder_columns(m, strategy, &mut b, Sql::epoch_ms, "CAST(NULL AS int8)");
        let sql = sql::rows_sql(m, &mut b, &format!("to_jsonb(t), {held}"), q);
        type Found = (
            sqlx::types::Json<serde_json::Value>,
            Option<String>,
            Option<String>,
            Option<i64>,
        );
        let rows: Vec<Found> = b.query_as(sql)?.fetch_all(self.exec()).await?;
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
        if strategy == Strategy::Transaction {
            return Err(sql::release_refused(m));
        }
        let mut tx = self.begin().await?;
        let mut b = B::new();
        let lock = sql::lock_row_sql(m, &mut b, id, " NOWAIT");
        b.query(lock)?.execute(self.on(&mut tx)).await.map_err(
            |e| match crate::error::db_kind(&e) {
                Some(DbKind::LockConflict) => Error::Locked,
                _ => Error::Database(e),
            },
        )?;
        // The lease and the row change together: the holder's settle then finds no lease of
        // its token, and the row, if marked claimed, is ready again.
        let gone = if strategy == Strategy::LeaseTable {
            let mut b = B::new();
            let delete = sql::release_lease_sql(m, &mut b, id, holder);
            let gone = b
                .query(delete)?
                .execute(self.on(&mut tx))
                .await?
                .rows_affected();
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
        let changed = b
            .query(back)?
            .execute(self.on(&mut tx))
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(gone + changed)
    }
}
