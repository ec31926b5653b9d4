//! Claiming on SQLite: one function per strategy, each holding all of its SQL in statement
//! builders (`*_sql`, pure: the snapshots call them) that the strategy runs in order.

use super::*;

#[async_trait::async_trait]
impl Claims for Lite {
    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let claimed = match a.strategy {
            Resolved::SkipLocked => Err(Error::UnsupportedStrategy {
                strategy: Strategy::SkipLocked,
                reason: "SQLite has no SKIP LOCKED (it has one writer at a time)".into(),
            }),
            Resolved::Token => self.token(a).await,
            Resolved::Optimistic => self.optimistic(a).await,
            Resolved::LeaseTable => self.lease_table(a).await,
            Resolved::Transaction => self.in_transaction(a).await,
        }?;
        Ok(claimed.map_held(Held::Sqlite))
    }
}

/// The rows of a claim that committed, read into values once the write lock is let go: reading
/// 1,000 rows took 2–5 ms, which other writers waited for when it came before the commit. The
/// caller learns of the commit first ([`ClaimArgs::committed`]). Should a row not read (a REAL
/// column of a table of yours holding an infinity, which `json_object` writes as no JSON
/// number), the claim fails with its rows claimed; they are taken again once their lease runs
/// out, as after a claim whose answer was lost (the MySQL driver reads after its commit too).
fn read_committed(a: &ClaimArgs<'_>, texts: Vec<String>) -> Result<Vec<serde_json::Value>> {
    if let (Some(committed), false) = (a.committed, texts.is_empty()) {
        committed();
    }
    parse_rows(texts)
}

impl Lite {
    /// The `token` strategy on SQLite: one statement ([`token_sql`]) under the write lock:
    /// nobody else can take the same rows.
    async fn token(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        // The write lock first, in a statement of its own, so that the lease is counted from
        // when it was had rather than from before a wait for it.
        let mut tx = self.write().await?;
        let locked_at = std::time::Instant::now();
        let Stmt { sql, binder } = token_sql(a);
        let texts = binder
            .scalar(sql)?
            .fetch_all(&mut *tx)
            .await
            .map_err(error)?;
        tx.commit().await.map_err(error)?;
        let rows = read_committed(a, texts)?;
        Ok(Claimed::rows(rows).locked_at(locked_at))
    }

    /// The `optimistic` strategy on SQLite: candidates read without the write lock
    /// ([`optimistic_pick`]); the update ([`optimistic_sql`]) wins only rows still claimable.
    async fn optimistic(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let m = a.m;
        let mut b = B::new();
        let sql = optimistic_pick(m, &mut b, i64::from(a.batch), a.expired);
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await.map_err(error)?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        let list = IdList::new(m.id_kind, &m.parse_ids(&found)?)?;
        let Stmt { sql, binder } = optimistic_sql(a, &list);
        let rows = parse_rows(
            binder
                .scalar(sql)?
                .fetch_all(&self.pool)
                .await
                .map_err(error)?,
        )?;
        let lost_race = rows.is_empty() && once::claimable_exists(self, m).await?;
        Ok(Claimed::raced(rows, lost_race))
    }

    /// The `lease-table` strategy on SQLite: under the write lock: rows without a live lease
    /// ([`lease_candidates`]), insert their lease keys (taking over expired ones,
    /// [`lease_insert_sql`]), mark the rows ([`lease_mark_sql`]).
    async fn lease_table(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let m = a.m;
        let mut tx = self.write().await?;
        let locked_at = std::time::Instant::now();
        let mut b = B::new();
        let sql = lease_candidates(m, &mut b, i64::from(a.batch), true);
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await.map_err(error)?;
        if found.is_empty() {
            tx.rollback().await.map_err(error)?;
            return Ok(Claimed::none());
        }
        let Stmt { sql, binder } = lease_insert_sql(a, found);
        let won: Vec<String> = binder
            .scalar(sql)?
            .fetch_all(&mut *tx)
            .await
            .map_err(error)?;
        let won = IdList::new(m.id_kind, &m.parse_ids(&won)?)?;
        let Stmt { sql, binder } = lease_mark_sql(a, &won);
        let texts = binder
            .scalar(sql)?
            .fetch_all(&mut *tx)
            .await
            .map_err(error)?;
        tx.commit().await.map_err(error)?;
        let rows = read_committed(a, texts)?;
        Ok(Claimed::rows(rows).locked_at(locked_at))
    }

    /// The `transaction` strategy on SQLite: hold the write lock while the rows are processed;
    /// SQLite cannot end the session on its own, so the deadline ([`deadline_sql`]) is checked
    /// before each later write.
    async fn in_transaction(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let mut tx = self.write().await?;
        let locked_at = std::time::Instant::now();
        let Stmt { sql, binder } = deadline_sql(a.lease);
        let deadline_ms: i64 = binder
            .scalar(sql)?
            .fetch_one(&mut *tx)
            .await
            .map_err(error)?;
        let mut b = B::new();
        let sql = transaction_pick(a.m, &mut b, i64::from(a.batch));
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await.map_err(error)?)?;
        let held = if rows.is_empty() {
            tx.rollback().await.map_err(error)?;
            None
        } else {
            Some(LiteHeld { tx, deadline_ms })
        };
        Ok(Claimed::held(rows, held).locked_at(locked_at))
    }
}

/// The token claim: mark the first candidates and return them, in one statement.
pub(crate) fn token_sql(a: &ClaimArgs<'_>) -> Stmt<Sql> {
    let (m, t, id) = (a.m, &a.m.table, &a.m.id);
    let json = Sql::row_json(m);
    let mut b = B::new();
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let pick = sql::candidates(m, &mut b, id, i64::from(a.batch), a.expired);
    let sql =
        format!("UPDATE {t} SET {set} WHERE {id} IN (SELECT {id} FROM ({pick})) RETURNING {json}");
    Stmt::new(sql, b)
}

/// The optimistic claim's update of the candidates it read: it wins the rows still claimable.
pub(crate) fn optimistic_sql(a: &ClaimArgs<'_>, list: &IdList) -> Stmt<Sql> {
    let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
    let json = Sql::row_json(m);
    let mut b = B::new();
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let ids = in_ids(&mut b, list);
    let cond = sql::claimable(m, &mut b);
    let sql = format!("UPDATE {t} SET {set} WHERE {id} {ids} AND {cond}{filter} RETURNING {json}");
    Stmt::new(sql, b)
}

/// The lease-table claim's insert of the candidates' lease keys: a key that exists changes hands
/// only when its lease has expired. Returns the keys won.
pub(crate) fn lease_insert_sql(a: &ClaimArgs<'_>, keys: Vec<String>) -> Stmt<Sql> {
    let mut b = B::new();
    let source = b.bind(a.m.source_key.clone());
    let token = b.bind(a.token.to_owned());
    let until = Sql::later(&mut b, a.lease);
    let keys = b.bind(IdList::Text(keys).to_json());
    let sql = format!(
        "INSERT INTO rowclaim_leases (source, row_id, token, lease_until) \
         SELECT {source}, value, {token}, {until} FROM json_each({keys}) WHERE true \
         ON CONFLICT (source, row_id) DO UPDATE \
         SET token = excluded.token, lease_until = excluded.lease_until \
         WHERE rowclaim_leases.lease_until < {NOW} RETURNING row_id"
    );
    Stmt::new(sql, b)
}

/// The lease-table claim's marking of the rows whose lease keys it won (still ready or claimed).
pub(crate) fn lease_mark_sql(a: &ClaimArgs<'_>, won: &IdList) -> Stmt<Sql> {
    let (m, t, id, st) = (a.m, &a.m.table, &a.m.id, &a.m.status);
    let json = Sql::row_json(m);
    let mut b = B::new();
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let ids = in_ids(&mut b, won);
    let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
    let sql = format!(
        "UPDATE {t} SET {set} WHERE {id} {ids} AND ({st} = {ready} OR {st} = {claimed}) \
         RETURNING {json}"
    );
    Stmt::new(sql, b)
}

/// A held transaction's deadline: now + `lease`, by the database's clock.
pub(crate) fn deadline_sql(lease: Duration) -> Stmt<Sql> {
    let mut b = B::new();
    let sql = format!("SELECT {NOW} + {}", b.bind(sql::lease_ms(lease)));
    Stmt::new(sql, b)
}

/// The statements a claim of `a.strategy` sends, in order, for the SQL snapshots: where a
/// statement's input comes from an earlier one's answer, rows 1 and 2 were found (and won).
/// (Skip-locked is refused here before any statement.)
#[cfg(test)]
pub(crate) fn statements(a: &ClaimArgs<'_>) -> Vec<Stmt<Sql>> {
    let list = IdList::Int(vec![1, 2]);
    let batch = i64::from(a.batch);
    let pick = |f: fn(&Mapping, &mut B, i64, bool) -> String, expired| {
        let mut b = B::new();
        let sql = f(a.m, &mut b, batch, expired);
        Stmt::new(sql, b)
    };
    match a.strategy {
        Resolved::SkipLocked => vec![],
        Resolved::Token => vec![token_sql(a)],
        Resolved::Optimistic => vec![pick(optimistic_pick, a.expired), optimistic_sql(a, &list)],
        Resolved::LeaseTable => vec![
            pick(lease_candidates, true),
            lease_insert_sql(a, vec!["1".to_owned(), "2".to_owned()]),
            lease_mark_sql(a, &list),
        ],
        Resolved::Transaction => vec![
            deadline_sql(a.lease),
            pick(|m, b, n, _| transaction_pick(m, b, n), false),
        ],
    }
}

/// The optimistic claim's candidates, read without the write lock.
pub(crate) fn optimistic_pick(m: &Mapping, b: &mut B, batch: i64, expired: bool) -> String {
    let select = format!("CAST({} AS TEXT) AS rowclaim_id", m.id);
    let pick = sql::candidates(m, b, &select, batch, expired);
    format!("SELECT rowclaim_id FROM ({pick})")
}

/// The lease-table claim's candidates: ready or claimed rows without a live lease. Without
/// `leases` the lease table is left out (`rowclaim check` on a database that has none yet).
pub(crate) fn lease_candidates(m: &Mapping, b: &mut B, batch: i64, leases: bool) -> String {
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
pub(crate) fn transaction_pick(m: &Mapping, b: &mut B, batch: i64) -> String {
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
