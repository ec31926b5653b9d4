//! Claiming on SQLite: one function per strategy, each holding all of its SQL.

use super::*;

impl Lite {
    /// Takes up to `a.batch` rows with the strategy `a.strategy`.
    pub(super) async fn claim_rows(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        match a.strategy {
            Resolved::SkipLocked => self.skip_locked(a).await,
            Resolved::Token => self.token(a).await,
            Resolved::Optimistic => self.optimistic(a).await,
            Resolved::LeaseTable => self.lease_table(a).await,
            Resolved::Transaction => self.transaction(a).await,
        }
    }

    /// The `skip-locked` strategy on SQLite.
    async fn skip_locked(&self, _a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        Err(Error::UnsupportedStrategy {
            strategy: Strategy::SkipLocked,
            reason: "SQLite has no SKIP LOCKED (it has one writer at a time)".into(),
        })
    }

    /// The `token` strategy on SQLite: one statement under the write lock: nobody else can take the
    /// same rows.
    async fn token(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
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
    async fn optimistic(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
        let json = Sql::row_json(m);
        let batch = i64::from(a.batch);
        let mut b = B::new();
        let sql = optimistic_pick(m, &mut b, batch, a.expired);
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
    async fn lease_table(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let (m, t, id) = (a.m, &a.m.table, &a.m.id);
        let json = Sql::row_json(m);
        let batch = i64::from(a.batch);
        let mut b = B::new();
        let mut tx = self.write().await?;
        let st = &m.status;
        let sql = lease_candidates(m, &mut b, batch, true);
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
    async fn transaction(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let mut b = B::new();
        let mut tx = self.write().await?;
        let sql = format!("SELECT {NOW} + ?");
        let deadline_ms: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(sql::lease_ms(a.lease))
            .fetch_one(&mut *tx)
            .await?;
        let sql = transaction_pick(a.m, &mut b, i64::from(a.batch));
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

/// The optimistic claim's candidates, read without the write lock.
fn optimistic_pick(m: &Mapping, b: &mut B, batch: i64, expired: bool) -> String {
    let select = format!("CAST({} AS TEXT) AS rowclaim_id", m.id);
    let pick = sql::candidates(m, b, &select, batch, expired);
    format!("SELECT rowclaim_id FROM ({pick})")
}

/// The lease-table claim's candidates: ready or claimed rows without a live lease. Without
/// `leases` the lease table is left out (`rowclaim check` on a database that has none yet).
fn lease_candidates(m: &Mapping, b: &mut B, batch: i64, leases: bool) -> String {
    let (t, id, st) = (&m.table, &m.id, &m.status);
    let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
    let live = if leases {
        let source = b.bind(m.source_key.clone());
        format!(
            " AND NOT EXISTS (SELECT 1 FROM rowclaim_leases l WHERE l.source = {source} \
             AND l.row_id = CAST(t.{id} AS TEXT) AND l.lease_until >= {NOW})"
        )
    } else {
        String::new()
    };
    let limit = b.bind(batch);
    format!(
        "SELECT CAST(t.{id} AS TEXT) AS rowclaim_id FROM {t} AS t \
         WHERE ({st} = {ready} OR {st} = {claimed}){}{live} ORDER BY {} LIMIT {limit}",
        m.filter, m.order_by
    )
}

/// The transaction claim's read of ready rows (under the write lock).
fn transaction_pick(m: &Mapping, b: &mut B, batch: i64) -> String {
    let limit = b.bind(batch);
    format!(
        "SELECT {} FROM {} WHERE {} = {}{} ORDER BY {} LIMIT {limit}",
        Sql::row_json(m),
        m.table,
        m.status,
        status_literal(&m.ready),
        m.filter,
        m.order_by
    )
}

/// The statement a claim of `strategy` looks for ready rows with, as the claim sends it: the
/// token UPDATE's candidates, the first statement of the others (SQLite has no skip-locked).
/// `rowclaim check` explains it.
pub(super) fn lookup(m: &Mapping, strategy: Resolved, batch: i64, leases: bool) -> (String, B) {
    let mut b = B::new();
    let sql = match strategy {
        Resolved::Token | Resolved::SkipLocked => sql::candidates(m, &mut b, &m.id, batch, false),
        Resolved::Optimistic => optimistic_pick(m, &mut b, batch, false),
        Resolved::LeaseTable => lease_candidates(m, &mut b, batch, leases),
        Resolved::Transaction => transaction_pick(m, &mut b, batch),
    };
    (sql, b)
}
