//! The claim store on SQLite: settling, extending and reading rows a token holds, locking reads,
//! listing rows (the reports are shared: `sql::stats`, `sql::backlog`).

use super::*;
use crate::backend::run::{Finish, Run, Transact};
use crate::backend::{RowQuery, StoredRow};

/// A row as JSON text, then its status, holder and lease end (see `StoredRow`).
type TextRow = (String, Option<String>, Option<String>, Option<i64>);

#[async_trait::async_trait]
impl ClaimStore for Lite {
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
        let tx = self.transaction(false).await?;
        let gone = tx.texts(drop_leases_sql(m, token, &target)).await?;
        let changed = tx.execute(settle_leased_sql(m, gone, &outcome)).await?;
        match target {
            Target::Ids(_, n) if changed != n as u64 => tx.rollback().await?,
            _ => tx.commit().await?,
        }
        Ok(changed)
    }

    async fn settle_each(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<RowId>>> {
        // Nearly always the claim still holds every row: then one all-or-nothing change says
        // so by its count, where `RETURNING` sends each row's id from SQLite's thread to this
        // one. Only when some were lost (it then changed nothing) does `RETURNING` name them.
        let held_in_table = strategy != Strategy::LeaseTable && m.owner.is_some();
        if held_in_table && list.len() >= COUNTED_FROM {
            let target = Target::Ids(list, list.len());
            let s = sql::settle_in_table_sql(m, token, &target, &outcome)?;
            if once::change_all_or_nothing(self, s, &target).await? == list.len() as u64 {
                return Ok(Some(list.row_ids()));
            }
        }
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
        let s = if strategy == Strategy::LeaseTable {
            let mut b = B::new();
            let until = Sql::later(&mut b, lease);
            let mine = leases_of(&mut b, m, token, &target);
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
        let mut b = B::new();
        let sql = if strategy == Strategy::LeaseTable {
            let mine = leases_of(&mut b, m, token, &target);
            format!("SELECT row_id FROM rowclaim_leases WHERE {mine}")
        } else {
            let cond = sql::held_by(m, &mut b, token, &target)?;
            format!(
                "SELECT CAST({} AS TEXT) AS rowclaim_id FROM {} WHERE {cond}",
                m.id, m.table
            )
        };
        let found = self.texts(Stmt::new(sql, b)).await?;
        m.parse_ids(&found)
    }

    async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        list: &IdList,
        outcome: Outcome,
    ) -> Result<()> {
        let LiteHeld { tx, deadline_ms } = held.sqlite()?;
        if Lite::deadline_passed(tx, *deadline_ms).await? {
            return Err(expired());
        }
        if outcome.gives_back() {
            return Ok(());
        }
        let mut b = B::new();
        let st = status_literal(outcome.status(m));
        let ids = in_ids(&mut b, list);
        let sql = format!(
            "UPDATE {} SET {} = {st} WHERE {} {ids}",
            m.table, m.status, m.id
        );
        b.query(sql)?.execute(&mut **tx).await.map_err(error)?;
        Ok(())
    }

    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        let LiteHeld { tx, deadline_ms } = held.sqlite()?;
        if Lite::deadline_passed(tx, *deadline_ms).await? {
            return Err(expired());
        }
        let sql = format!("SELECT {NOW} + ?");
        *deadline_ms = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(sql::lease_ms(lease))
            .fetch_one(&mut **tx)
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
        if wait == LockWait::SkipLocked {
            return Err(Error::Unsupported(
                "SQLite has no SKIP LOCKED: its locks cover the whole database, one writer at a time"
                    .into(),
            ));
        }
        // SQLite locks the database, not rows, and in WAL mode readers never block writers: the
        // only lock that keeps others from changing the rows is the write lock, for both modes.
        let _ = mode;
        let mut tx = match wait {
            LockWait::Wait => self.write().await?,
            _ => {
                // NOWAIT: ask for the write lock with no busy wait, then restore the timeout.
                let mut tx = self.pool.begin().await.map_err(error)?;
                let timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(error)?;
                sqlx::query("PRAGMA busy_timeout = 0")
                    .execute(&mut *tx)
                    .await
                    .map_err(error)?;
                // A write statement takes the write lock even when it changes nothing.
                let sql = format!("UPDATE {} SET {} = {} WHERE 0", m.table, m.id, m.id);
                let locked = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(&mut *tx)
                    .await;
                let restore = format!("PRAGMA busy_timeout = {timeout}");
                sqlx::query(sqlx::AssertSqlSafe(restore))
                    .execute(&mut *tx)
                    .await
                    .map_err(error)?;
                // Busy with no busy wait is exactly "locked by another writer".
                locked.map_err(|e| match error_kind(&e) {
                    Some(DbKind::Transient | DbKind::LockWait) => Error::Locked,
                    _ => error(e),
                })?;
                tx
            }
        };
        let mut b = B::new();
        let which = match list {
            Some(l) => format!("{} {}", m.id, in_ids(&mut b, l)),
            None => "1".to_owned(),
        };
        let limit = limit
            .map(|n| format!(" LIMIT {}", b.bind(i64::from(n))))
            .unwrap_or_default();
        let sql = format!(
            "SELECT {} FROM {} WHERE {which}{} ORDER BY {}{limit}",
            row_json(m),
            m.table,
            m.filter,
            m.order_by
        );
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await.map_err(error)?)?;
        Ok((
            Held::Sqlite(LiteHeld {
                tx,
                deadline_ms: i64::MAX,
            }),
            rows,
        ))
    }

    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<crate::report::Stats> {
        once::stats(self, m, strategy).await
    }

    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64, u64)> {
        once::backlog(self, m).await
    }

    async fn rows(&self, m: &Mapping, strategy: Strategy, q: &RowQuery) -> Result<Vec<StoredRow>> {
        let mut b = B::new();
        // Lease columns hold epoch milliseconds here already.
        let held = sql::holder_columns(m, strategy, &mut b, |c| c.to_owned(), "NULL");
        let sql = sql::rows_sql(m, &mut b, &format!("{}, {held}", json_of(&m.columns)), q);
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

/// The fewest rows a settle counts (in a transaction of its own) rather than names by
/// `RETURNING`: below it, the transaction's two statements more cost more than the ids sent back.
const COUNTED_FROM: usize = 8;

/// The lease table's condition "these leases belong to `token`" (all of them, or those of
/// `target`'s ids).
fn leases_of(b: &mut B, m: &Mapping, token: &str, target: &Target<'_>) -> String {
    let source = b.bind(m.source_key.clone());
    let tok = b.bind(token.to_owned());
    let only = match target {
        Target::All => String::new(),
        Target::Ids(list, _) => format!(" AND row_id {}", in_text_ids(b, list)),
    };
    format!("source = {source} AND token = {tok}{only}")
}

/// Drops the leases of the rows `target` of `token`, returning their keys.
pub(crate) fn drop_leases_sql(m: &Mapping, token: &str, target: &Target<'_>) -> Stmt<Sql> {
    let mut b = B::new();
    let mine = leases_of(&mut b, m, token, target);
    Stmt::new(
        format!("DELETE FROM rowclaim_leases WHERE {mine} RETURNING row_id"),
        b,
    )
}

/// Settles the claimed rows whose leases (keys `gone`) were just dropped.
pub(crate) fn settle_leased_sql(m: &Mapping, gone: Vec<String>, outcome: &Outcome) -> Stmt<Sql> {
    let mut b = B::new();
    let set = sql::outcome_set(m, &mut b, outcome);
    let gone = b.bind(IdList::Text(gone).to_json());
    let claimed = status_literal(&m.claimed);
    let sql = format!(
        "UPDATE {} SET {set} WHERE {} IN (SELECT {} FROM json_each({gone})) AND {} = {claimed}",
        m.table,
        m.id,
        row_id_as_id(m, "value"),
        m.status,
    );
    Stmt::new(sql, b)
}

/// The statements a settle sends, for the SQL snapshots (the lease table's: its keys 1 and 2
/// dropped).
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
    let gone = vec!["1".to_owned(), "2".to_owned()];
    Ok(vec![
        drop_leases_sql(m, token, target),
        settle_leased_sql(m, gone, outcome),
    ])
}
