//! Claiming on MySQL/MariaDB: one function per strategy, each holding all of its SQL.

use super::*;

impl My {
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

    /// The `skip-locked` strategy on MySQL/MariaDB: one transaction: lock the first unlocked
    /// candidates, mark them ours, read them back. Expired leases first, then ready rows, each arm
    /// its own locking read so each walks its own index; the arms may lock up to twice the batch
    /// for the moment of this transaction when leases have expired. On a Galera cluster the rows
    /// are read back by token after the commit instead (see `verify_after_commit`).
    async fn skip_locked(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let (m, t, id) = (a.m, &a.m.table, &a.m.id);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let arm = |b: &mut B, cond: String| locking_arm(m, b, &cond, batch);
        let sql = match a.expired.then(|| sql::expired_arm(m, &mut b)).flatten() {
            Some(expired) => {
                let e = arm(&mut b, expired);
                let ready = sql::ready_arm(m, &mut b);
                let r = arm(&mut b, ready);
                format!("{e} UNION ALL {r} LIMIT {}", b.bind(batch))
            }
            None => {
                let ready = sql::ready_arm(m, &mut b);
                arm(&mut b, ready)
            }
        };
        let verify = self.verify_after_commit().await?;
        let mut tx = self.begin().await?;
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
        if found.is_empty() {
            tx.rollback().await?;
            return Ok(Claimed::none());
        }
        let list = id_list(m, &found)?;
        let mut b = B::new();
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let which = in_ids(&mut b, id, &list);
        let sql = format!("UPDATE {t} SET {set} WHERE {which}");
        b.query(sql)?.execute(&mut *tx).await?;
        if verify {
            // The locks held off this node's claimers only: what counts is what committed.
            tx.commit().await?;
            return Ok(Claimed::contested(self.rows_of_owner(m, a.token).await?));
        }
        let mut b = B::new();
        let sql = rows_sql(m, &mut b, &list);
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
        tx.commit().await?;
        Ok(Claimed::rows(rows))
    }

    /// The `token` strategy on MySQL/MariaDB: mark the first candidates with the token (the
    /// candidates come from a derived table, which MySQL materialises, so the UPDATE may name its
    /// own table there), then read the rows that carry it. The condition is checked again after
    /// waiting for another claimer's row lock, so a row is never taken twice; a claimer that lost
    /// every row to others gets none and tries again.
    async fn token(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let pick = sql::candidates(m, &mut b, id, batch, a.expired);
        let cond = sql::claimable(m, &mut b);
        let sql = format!(
            "UPDATE {t} SET {set} WHERE {id} IN (SELECT {id} FROM ({pick}) AS c) \
             AND {cond}{filter}"
        );
        let changed = b.query(sql)?.execute(&self.pool).await?.rows_affected();
        if changed == 0 {
            return Ok(Claimed::raced(
                vec![],
                run::claimable_exists(self, m).await?,
            ));
        }
        Ok(Claimed::rows(self.rows_of_owner(m, a.token).await?))
    }

    /// The `optimistic` strategy on MySQL/MariaDB: read candidates without locks; the update wins
    /// only the rows still claimable.
    async fn optimistic(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let sql = optimistic_pick(m, &mut b, batch, a.expired);
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        let rows = if m.owner.is_some() {
            // One statement for all candidates; the token tells which it won.
            let list = id_list(m, &found)?;
            let mut b = B::new();
            let set = sql::claim_set(m, &mut b, a.token, a.lease);
            let which = in_ids(&mut b, id, &list);
            let cond = sql::claimable(m, &mut b);
            let sql = format!("UPDATE {t} SET {set} WHERE {which} AND {cond}{filter}");
            b.query(sql)?.execute(&self.pool).await?;
            self.rows_of_owner(m, a.token).await?
        } else {
            // Without an owner column only the affected-row count tells who won: one
            // statement per candidate.
            let mut won = Vec::new();
            for row in m.parse_ids(&found)? {
                let mut b = B::new();
                let set = sql::claim_set(m, &mut b, a.token, a.lease);
                let key = b.value(&row);
                let cond = sql::claimable(m, &mut b);
                let sql = format!("UPDATE {t} SET {set} WHERE {id} = {key} AND {cond}{filter}");
                if b.query(sql)?.execute(&self.pool).await?.rows_affected() == 1 {
                    won.push(row);
                }
            }
            if won.is_empty() {
                vec![]
            } else {
                let list = IdList::new(m.id_kind, &won)?;
                let mut b = B::new();
                let sql = rows_sql(m, &mut b, &list);
                parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)?
            }
        };
        Ok(Claimed::contested(rows))
    }

    /// The `lease-table` strategy on MySQL/MariaDB: candidates are rows without a live lease;
    /// inserting the lease key is the claim (an expired lease is taken over in the same statement),
    /// then the rows are marked, all in one transaction (on a Galera cluster read back after
    /// the commit).
    async fn lease_table(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let (m, t, id) = (a.m, &a.m.table, &a.m.id);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let st = &m.status;
        let sql = lease_candidates(m, &mut b, batch, true);
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        // On a duplicate key the assignments run left to right, so the second one sees
        // the token the first one wrote: an expired lease changes hands, a live one stays.
        // (`VALUES(col)` is deprecated from MySQL 8.0.20 in favour of a row alias, which
        // MariaDB lacks; both still accept it.)
        let mut b = B::new();
        let mut values = Vec::with_capacity(found.len());
        for key in &found {
            let source = b.bind(m.source_key.clone());
            let key = b.bind(key.clone());
            let token = b.bind(a.token.to_owned());
            let until = Sql::later(&mut b, a.lease);
            values.push(format!("({source}, {key}, {token}, {until})"));
        }
        let sql = format!(
            "INSERT INTO rowclaim_leases (source, row_id, token, lease_until) VALUES {} \
             ON DUPLICATE KEY UPDATE \
             token = IF(lease_until < UTC_TIMESTAMP(6), VALUES(token), token), \
             lease_until = IF(token = VALUES(token), VALUES(lease_until), lease_until)",
            values.join(", ")
        );
        let mut tx = self.begin().await?;
        b.query(sql)?.execute(&mut *tx).await?;
        let mut b = B::new();
        let source = b.bind(m.source_key.clone());
        let token = b.bind(a.token.to_owned());
        let sql = format!(
            "SELECT row_id FROM rowclaim_leases WHERE source = {source} AND token = {token}"
        );
        let won: Vec<String> = b.scalar(sql)?.fetch_all(&mut *tx).await?;
        if won.is_empty() {
            tx.rollback().await?;
            return Ok(Claimed::raced(vec![], true));
        }
        let list = id_list(m, &won)?;
        // A lease won for a row that was finished meanwhile stays until it expires; it
        // blocks nothing, since only ready and claimed rows are candidates.
        let mut b = B::new();
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let which = in_ids(&mut b, id, &list);
        let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
        let sql =
            format!("UPDATE {t} SET {set} WHERE {which} AND ({st} = {ready} OR {st} = {claimed})");
        b.query(sql)?.execute(&mut *tx).await?;
        if self.verify_after_commit().await? {
            // Another node's claim of the same keys shows up at commit: read back the leases
            // that committed with our token.
            tx.commit().await?;
            let mut b = B::new();
            let mine = leases_of(m, &mut b, a.token, &Target::All);
            let sql = format!("SELECT row_id FROM rowclaim_leases WHERE {mine}");
            let won: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await?;
            let mut b = B::new();
            let sql = rows_sql(m, &mut b, &id_list(m, &won)?);
            let rows = parse_rows(b.scalar(sql)?.fetch_all(&self.pool).await?)?;
            return Ok(Claimed::contested(rows));
        }
        let mut b = B::new();
        let sql = rows_sql(m, &mut b, &list);
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
        tx.commit().await?;
        Ok(Claimed::contested(rows))
    }

    /// The `transaction` strategy on MySQL/MariaDB: lock the rows in a transaction that stays open;
    /// the session's idle timeout (`wait_timeout`, whole seconds) is the lease: past it the server
    /// closes the connection, the transaction rolls back and the rows are free again.
    async fn transaction(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let m = a.m;
        let mut b = B::new();
        let sql = transaction_pick(m, &mut b, i64::from(a.batch));
        let mut tx = self.begin().await?;
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await?)?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok(Claimed::none());
        }
        // The lease starts now. `@rowclaim_open` counts the rows still to settle, so that
        // the last settle gives the pooled connection its usual timeout back.
        sqlx::query("SET SESSION wait_timeout = ?, @rowclaim_open = ?")
            .bind(lease_secs(a.lease))
            .bind(rows.len() as i64)
            .execute(&mut *tx)
            .await?;
        Ok(Claimed::held(rows, Some(tx)))
    }
}

/// One arm of the skip-locked claim: the first `batch` unlocked rows that meet `cond`, locked.
fn locking_arm(m: &Mapping, b: &mut B, cond: &str, batch: i64) -> String {
    format!(
        "(SELECT {} FROM {} AS t WHERE {cond}{} ORDER BY {} LIMIT {} FOR UPDATE SKIP LOCKED)",
        id_text(m),
        m.table,
        m.filter,
        m.order_by,
        b.bind(batch)
    )
}

/// The optimistic claim's candidates, read without locks.
fn optimistic_pick(m: &Mapping, b: &mut B, batch: i64, expired: bool) -> String {
    let select = format!("CAST({} AS CHAR) AS rowclaim_id", m.id);
    let pick = sql::candidates(m, b, &select, batch, expired);
    format!("SELECT rowclaim_id FROM ({pick}) AS c")
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
             AND l.row_id = CAST(t.{id} AS CHAR) AND l.lease_until >= UTC_TIMESTAMP(6))"
        )
    } else {
        String::new()
    };
    let limit = b.bind(batch);
    format!(
        "SELECT {} FROM {t} AS t WHERE ({st} = {ready} OR {st} = {claimed}){}{live} \
         ORDER BY {} LIMIT {limit}",
        id_text(m),
        m.filter,
        m.order_by
    )
}

/// The transaction claim's locking read of ready rows.
fn transaction_pick(m: &Mapping, b: &mut B, batch: i64) -> String {
    let limit = b.bind(batch);
    format!(
        "SELECT {} FROM {} AS t WHERE {} = {}{} ORDER BY {} LIMIT {limit} FOR UPDATE SKIP LOCKED",
        Sql::row_json(m),
        m.table,
        m.status,
        status_literal(&m.ready),
        m.filter,
        m.order_by
    )
}

/// The statement a claim of `strategy` looks for ready rows with, as the claim sends it: the
/// locking read of skip-locked and transaction, the token UPDATE's candidates, the first
/// statement of the others. `rowclaim check` explains it.
pub(super) fn lookup(m: &Mapping, strategy: Resolved, batch: i64, leases: bool) -> (String, B) {
    let mut b = B::new();
    let sql = match strategy {
        Resolved::SkipLocked => {
            let ready = sql::ready_arm(m, &mut b);
            locking_arm(m, &mut b, &ready, batch)
        }
        Resolved::Token => sql::candidates(m, &mut b, &m.id, batch, false),
        Resolved::Optimistic => optimistic_pick(m, &mut b, batch, false),
        Resolved::LeaseTable => lease_candidates(m, &mut b, batch, leases),
        Resolved::Transaction => transaction_pick(m, &mut b, batch),
    };
    (sql, b)
}
