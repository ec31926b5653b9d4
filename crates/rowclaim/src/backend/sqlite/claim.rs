//! Claiming on SQLite: one function per strategy, each holding all of its SQL.

use super::*;

impl Lite {
    /// Takes up to `a.batch` rows with the strategy `a.strategy`.
    pub(super) async fn claim_rows(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        match a.strategy {
            Resolved::SkipLocked => self.skip_locked(a).await,
            Resolved::Token => self.token(a).await,
            Resolved::Optimistic => self.optimistic(a).await,
            Resolved::LeaseTable => self.lease_table(a).await,
            Resolved::Transaction => self.transaction(a).await,
        }
    }

    /// The `skip-locked` strategy on SQLite.
    async fn skip_locked(&self, _a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        Err(Error::UnsupportedStrategy {
            strategy: Strategy::SkipLocked,
            reason: "SQLite has no SKIP LOCKED (it has one writer at a time)".into(),
        })
    }

    /// The `token` strategy on SQLite: one statement under the write lock: nobody else can take the
    /// same rows.
    async fn token(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let (m, t, id) = (a.m, &a.m.table, &a.m.id);
        let json = Sql::row_json(m);
        let batch = i64::from(a.batch);
        let mut b = B::new();
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let pick = sql::candidates(m, &mut b, id, batch, a.expired);
        let sql = format!(
            "UPDATE {t} SET {set} WHERE {id} IN (SELECT {id} FROM ({pick})) RETURNING {json}"
        );
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)?;
        Ok(Claimed::rows(rows))
    }

    /// The `optimistic` strategy on SQLite: candidates read without the write lock; the update wins
    /// only rows still claimable.
    async fn optimistic(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
        let json = Sql::row_json(m);
        let batch = i64::from(a.batch);
        let mut b = B::new();
        let pick = sql::candidates(
            m,
            &mut b,
            &format!("CAST({id} AS TEXT) AS rowclaim_id"),
            batch,
            a.expired,
        );
        let sql = format!("SELECT rowclaim_id FROM ({pick})");
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        let list = IdList::new(m.id_kind, &m.parse_ids(&found)?)?;
        let mut b = B::new();
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let ids = in_ids(&mut b, &list);
        let cond = sql::claimable(m, &mut b);
        let sql =
            format!("UPDATE {t} SET {set} WHERE {id} {ids} AND {cond}{filter} RETURNING {json}");
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)?;
        let lost_race = rows.is_empty() && run::claimable_exists(self, m).await?;
        Ok(Claimed::raced(rows, lost_race))
    }

    /// The `lease-table` strategy on SQLite: under the write lock: rows without a live lease,
    /// insert their lease keys (taking over expired ones), mark the rows.
    async fn lease_table(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let (m, t, id, order, filter) = (a.m, &a.m.table, &a.m.id, &a.m.order_by, &a.m.filter);
        let json = Sql::row_json(m);
        let batch = i64::from(a.batch);
        let mut b = B::new();
        let mut tx = self.write().await?;
        let st = &m.status;
        let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
        let source = b.bind(m.source_key.clone());
        let limit = b.bind(batch);
        let sql = format!(
            "SELECT CAST(t.{id} AS TEXT) AS rowclaim_id FROM {t} AS t \
             WHERE ({st} = {ready} OR {st} = {claimed}){filter} \
             AND NOT EXISTS (SELECT 1 FROM rowclaim_leases l WHERE l.source = {source} \
             AND l.row_id = CAST(t.{id} AS TEXT) AND l.lease_until >= {NOW}) \
             ORDER BY {order} LIMIT {limit}"
        );
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
        if found.is_empty() {
            tx.rollback().await?;
            return Ok(Claimed::none());
        }
        let mut b = B::new();
        let source = b.bind(m.source_key.clone());
        let token = b.bind(a.token.to_owned());
        let until = Sql::later(&mut b, a.lease);
        let keys = b.bind(IdList::Text(found).to_json());
        let sql = format!(
            "INSERT INTO rowclaim_leases (source, row_id, token, lease_until) \
             SELECT {source}, value, {token}, {until} FROM json_each({keys}) WHERE true \
             ON CONFLICT (source, row_id) DO UPDATE \
             SET token = excluded.token, lease_until = excluded.lease_until \
             WHERE rowclaim_leases.lease_until < {NOW} RETURNING row_id"
        );
        let won: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
        let won = IdList::new(m.id_kind, &m.parse_ids(&won)?)?;
        let mut b = B::new();
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let ids = in_ids(&mut b, &won);
        let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
        let sql = format!(
            "UPDATE {t} SET {set} WHERE {id} {ids} AND ({st} = {ready} OR {st} = {claimed}) \
             RETURNING {json}"
        );
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
        tx.commit().await?;
        Ok(Claimed::rows(rows))
    }

    /// The `transaction` strategy on SQLite: hold the write lock while the rows are processed;
    /// SQLite cannot end the session on its own, so the deadline is checked before each later
    /// write.
    async fn transaction(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let (m, t, order, filter) = (a.m, &a.m.table, &a.m.order_by, &a.m.filter);
        let json = Sql::row_json(m);
        let batch = i64::from(a.batch);
        let mut b = B::new();
        let mut tx = self.write().await?;
        let sql = format!("SELECT {NOW} + ?");
        let deadline_ms: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(sql::lease_ms(a.lease))
            .fetch_one(&mut *tx)
            .await?;
        let ready = status_literal(&m.ready);
        let limit = b.bind(batch);
        let sql = format!(
            "SELECT {json} FROM {t} WHERE {} = {ready}{filter} ORDER BY {order} LIMIT {limit}",
            m.status
        );
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
        let held = if rows.is_empty() {
            tx.rollback().await?;
            None
        } else {
            Some(LiteHeld { tx, deadline_ms })
        };
        Ok(Claimed::held(rows, held))
    }
}
