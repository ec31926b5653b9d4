//! Claiming on MySQL/MariaDB: one function per strategy, each holding all of its SQL in statement
//! builders (`*_sql`, pure: the snapshots call them) that the strategy runs in order.

use super::*;

#[async_trait::async_trait]
impl Claims for My {
    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let claimed = match a.strategy {
            Resolved::SkipLocked => self.skip_locked(a).await,
            Resolved::Token => self.token(a).await,
            Resolved::Optimistic => self.optimistic(a).await,
            Resolved::LeaseTable => self.lease_table(a).await,
            Resolved::Transaction => self.in_transaction(a).await,
        }?;
        Ok(claimed.map_held(Held::MySql))
    }
}

impl My {
    /// The `skip-locked` strategy on MySQL/MariaDB: one transaction: lock the first unlocked
    /// candidates ([`skip_locked_pick`]), mark them ours ([`mark_sql`]), read them back
    /// ([`rows_sql`]). On a Galera cluster the rows are read back by token after the commit
    /// instead (see `verify_after_commit`).
    async fn skip_locked(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let m = a.m;
        let verify = self.verify_after_commit().await?;
        let mut tx = self.begin().await?;
        let look = match a
            .expired
            .then(|| expired_ids_sql(m, i64::from(a.batch)))
            .flatten()
        {
            Some(look) => match texts(&mut *tx, look).await? {
                ids if ids.is_empty() => Expired::Skip,
                ids => Expired::Among(id_list(m, &ids)?),
            },
            None => Expired::Skip,
        };
        let mut found = texts(&mut *tx, skip_locked_pick(a, &look)).await?;
        if found.is_empty() && matches!(look, Expired::Among(_)) {
            // Every expired row the look found is held by another claimer whose claim has not
            // committed yet (or was settled meanwhile): walk past them, as a locking read of
            // them all does, so that an empty claim still means nothing was claimable.
            found = texts(&mut *tx, skip_locked_pick(a, &Expired::Walk)).await?;
        }
        if found.is_empty() {
            tx.rollback().await.map_err(error)?;
            return Ok(Claimed::none());
        }
        let list = id_list(m, &found)?;
        // On Galera the mark checks the rows again: a transaction another node's claim aborted
        // there may not say so, and its next statements then commit one by one (a limited
        // claim was seen marking jobs outside its transaction, `tests/galera.rs`), where
        // locks taken before hold nothing.
        let recheck = if verify {
            Recheck::Claimable
        } else {
            Recheck::Nothing
        };
        let Stmt { sql, binder } = mark_sql(a, &list, recheck);
        binder.query(sql)?.execute(&mut *tx).await.map_err(error)?;
        if verify {
            // The locks held off this node's claimers only: what counts is what committed.
            tx.commit().await.map_err(error)?;
            return Ok(Claimed::contested(self.rows_of_owner(m, a.token).await?));
        }
        let rows = parse_rows(texts(&mut *tx, rows_sql(m, &list)).await?)?;
        tx.commit().await.map_err(error)?;
        Ok(Claimed::rows(rows))
    }

    /// The `token` strategy on MySQL/MariaDB: mark the first candidates with the token
    /// ([`token_sql`]), then read the rows that carry it. A claimer that lost every row to
    /// others gets none and tries again.
    async fn token(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let Stmt { sql, binder } = token_sql(a);
        let changed = binder
            .query(sql)?
            .execute(&self.pool)
            .await
            .map_err(error)?
            .rows_affected();
        if changed == 0 {
            return Ok(Claimed::raced(
                vec![],
                once::claimable_exists(self, a.m).await?,
            ));
        }
        Ok(Claimed::rows(self.rows_of_owner(a.m, a.token).await?))
    }

    /// The `optimistic` strategy on MySQL/MariaDB: read candidates without locks
    /// ([`optimistic_pick`]); the update wins only the rows still claimable: all of them in one
    /// statement when the token tells which it won, else one statement per candidate.
    async fn optimistic(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let m = a.m;
        let mut b = B::new();
        let sql = optimistic_pick(m, &mut b, i64::from(a.batch), a.expired);
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await.map_err(error)?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        let rows = if m.owner.is_some() {
            let list = id_list(m, &found)?;
            let Stmt { sql, binder } = mark_sql(a, &list, Recheck::Claimable);
            binder
                .query(sql)?
                .execute(&self.pool)
                .await
                .map_err(error)?;
            self.rows_of_owner(m, a.token).await?
        } else {
            // Without an owner column only the affected-row count tells who won.
            let mut won = Vec::new();
            for row in m.parse_ids(&found)? {
                let list = IdList::new(m.id_kind, std::slice::from_ref(&row))?;
                let Stmt { sql, binder } = mark_sql(a, &list, Recheck::Claimable);
                if binder
                    .query(sql)?
                    .execute(&self.pool)
                    .await
                    .map_err(error)?
                    .rows_affected()
                    == 1
                {
                    won.push(row);
                }
            }
            if won.is_empty() {
                vec![]
            } else {
                let Stmt { sql, binder } = rows_sql(m, &IdList::new(m.id_kind, &won)?);
                parse_rows(
                    binder
                        .scalar(sql)?
                        .fetch_all(&self.pool)
                        .await
                        .map_err(error)?,
                )?
            }
        };
        Ok(Claimed::contested(rows))
    }

    /// The `lease-table` strategy on MySQL/MariaDB: candidates are rows without a live lease
    /// ([`lease_candidates`]); inserting the lease key is the claim (an expired lease is taken
    /// over in the same statement, [`lease_insert_sql`]), then the rows are marked, all in one
    /// transaction (on a Galera cluster read back after the commit).
    async fn lease_table(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let m = a.m;
        let mut b = B::new();
        let sql = lease_candidates(m, &mut b, i64::from(a.batch), true);
        let found: Vec<String> = b.scalar(sql)?.fetch_all(&self.pool).await.map_err(error)?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        let mut tx = self.begin().await?;
        let Stmt { sql, binder } = lease_insert_sql(a, &found);
        binder.query(sql)?.execute(&mut *tx).await.map_err(error)?;
        let won = texts(&mut *tx, leases_won_sql(a)).await?;
        if won.is_empty() {
            tx.rollback().await.map_err(error)?;
            return Ok(Claimed::raced(vec![], true));
        }
        let list = id_list(m, &won)?;
        // A lease won for a row that was finished meanwhile stays until it expires; it
        // blocks nothing, since only ready and claimed rows are candidates.
        let Stmt { sql, binder } = mark_sql(a, &list, Recheck::ReadyOrClaimed);
        binder.query(sql)?.execute(&mut *tx).await.map_err(error)?;
        if self.verify_after_commit().await? {
            // Another node's claim of the same keys shows up at commit: read back the leases
            // that committed with our token.
            tx.commit().await.map_err(error)?;
            let won = texts(&self.pool, leases_won_sql(a)).await?;
            let rows = parse_rows(texts(&self.pool, rows_sql(m, &id_list(m, &won)?)).await?)?;
            return Ok(Claimed::contested(rows));
        }
        let rows = parse_rows(texts(&mut *tx, rows_sql(m, &list)).await?)?;
        tx.commit().await.map_err(error)?;
        Ok(Claimed::contested(rows))
    }

    /// The `transaction` strategy on MySQL/MariaDB: lock the rows in a transaction that stays open;
    /// the session's idle timeout (`wait_timeout`, whole seconds) is the lease: past it the server
    /// closes the connection, the transaction rolls back and the rows are free again.
    async fn in_transaction(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let mut b = B::new();
        let sql = transaction_pick(a.m, &mut b, i64::from(a.batch));
        let mut tx = self.begin().await?;
        let rows = parse_rows(b.scalar(sql)?.fetch_all(&mut *tx).await.map_err(error)?)?;
        if rows.is_empty() {
            tx.rollback().await.map_err(error)?;
            return Ok(Claimed::none());
        }
        let Stmt { sql, binder } = lease_session_sql(a.lease, rows.len());
        binder.query(sql)?.execute(&mut *tx).await.map_err(error)?;
        Ok(Claimed::held(rows, Some(tx)))
    }
}

/// The first column of every row `s` gives, as text, run on `e` (the pool or a transaction).
async fn texts<'e, E>(e: E, s: Stmt<Sql>) -> Result<Vec<String>>
where
    E: sqlx::Executor<'e, Database = sqlx::MySql>,
{
    let Stmt { sql, binder } = s;
    binder.scalar(sql)?.fetch_all(e).await.map_err(error)
}

/// How a skip-locked claim's locking read takes rows whose lease expired.
pub(crate) enum Expired {
    /// Not at all: the claim looks at ready rows only, or the look found none expired.
    Skip,
    /// Only these rows, which a read without locks found expired ([`expired_ids_sql`]), and
    /// only where their lease has ended still, under the lock.
    Among(IdList),
    /// Every claimed row in the source's order, each locked before its lease is seen: past
    /// the rows other claimers hold.
    Walk,
}

/// The skip-locked claim's look for rows whose lease expired: the first `batch` of them, read
/// without locks (None without a lease column). Without a partial index it reads every
/// claimed row, and a locking read would lock each before it could see the lease (letting go
/// of it again at READ COMMITTED); looking without locks, through an index that holds the
/// lease (the managed queue's claim index, for a claimer of whole queues), is about four times
/// as fast. The claim then locks only the rows it found ([`Expired::Among`]).
pub(crate) fn expired_ids_sql(m: &Mapping, batch: i64) -> Option<Stmt<Sql>> {
    let mut b = B::new();
    let expired = sql::expired_arm(m, &mut b)?;
    let sql = format!(
        "SELECT {} FROM {} AS t WHERE {expired}{} ORDER BY {} LIMIT {}",
        id_text(m),
        m.table,
        m.filter,
        m.order_by,
        b.bind(batch)
    );
    Some(Stmt::new(sql, b))
}

/// The skip-locked claim's locking read: expired leases first (as `expired` says), then ready
/// rows, each arm its own locking read so each walks its own index; the arms may lock up to
/// twice the batch for the moment of this transaction when leases have expired.
pub(crate) fn skip_locked_pick(a: &ClaimArgs<'_>, expired: &Expired) -> Stmt<Sql> {
    let m = a.m;
    let mut b = B::new();
    let batch = i64::from(a.batch);
    let arm = |b: &mut B, cond: String| locking_arm(m, b, &cond, batch);
    let e = match expired {
        Expired::Skip => None,
        // The ids come first in the text, so they are bound first.
        Expired::Among(ids) if m.lease.is_some() => {
            let among = in_ids(&mut b, &format!("t.{}", m.id), ids);
            sql::expired_arm(m, &mut b).map(|cond| arm(&mut b, format!("{among} AND {cond}")))
        }
        Expired::Among(_) => None,
        Expired::Walk => sql::expired_arm(m, &mut b).map(|cond| arm(&mut b, cond)),
    };
    let sql = match e {
        Some(e) => {
            let ready = sql::ready_arm(m, &mut b);
            let r = arm(&mut b, ready);
            format!("{e} UNION ALL {r} LIMIT {}", b.bind(batch))
        }
        None => {
            let ready = sql::ready_arm(m, &mut b);
            arm(&mut b, ready)
        }
    };
    Stmt::new(sql, b)
}

/// What a marking of named rows checks again before it takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recheck {
    /// Nothing: they are locked by this transaction already.
    Nothing,
    /// Still claimable (a claim that read its candidates without locks).
    Claimable,
    /// Ready or claimed (a lease-table claim that won their leases).
    ReadyOrClaimed,
}

/// Marks the rows `list` claimed by the token, where they still meet `recheck`.
pub(crate) fn mark_sql(a: &ClaimArgs<'_>, list: &IdList, recheck: Recheck) -> Stmt<Sql> {
    let m = a.m;
    let mut b = B::new();
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let which = in_ids(&mut b, &m.id, list);
    let also = match recheck {
        Recheck::Nothing => String::new(),
        Recheck::Claimable => format!(" AND {}{}", sql::claimable(m, &mut b), m.filter),
        Recheck::ReadyOrClaimed => format!(" AND {}", ready_or_claimed(m)),
    };
    Stmt::new(
        format!("UPDATE {} SET {set} WHERE {which}{also}", m.table),
        b,
    )
}

/// "Ready or claimed", the rows a lease-table claim looks at and marks once it won their leases.
fn ready_or_claimed(m: &Mapping) -> String {
    let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
    format!("({st} = {ready} OR {st} = {claimed})", st = m.status)
}

/// The token claim: mark the first candidates with the token (the candidates come from a
/// derived table, which MySQL materialises, so the UPDATE may name its own table there). The
/// condition is checked again after waiting for another claimer's row lock, so a row is never
/// taken twice.
pub(crate) fn token_sql(a: &ClaimArgs<'_>) -> Stmt<Sql> {
    let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
    let mut b = B::new();
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let pick = sql::candidates(m, &mut b, id, i64::from(a.batch), a.expired);
    let cond = sql::claimable(m, &mut b);
    let sql = format!(
        "UPDATE {t} SET {set} WHERE {id} IN (SELECT {id} FROM ({pick}) AS c) AND {cond}{filter}"
    );
    Stmt::new(sql, b)
}

/// The lease-table claim's insert of the candidates' lease keys. On a duplicate key the
/// assignments run left to right, so the second one sees the token the first one wrote: an
/// expired lease changes hands, a live one stays. (`VALUES(col)` is deprecated from MySQL
/// 8.0.20 in favour of a row alias, which MariaDB lacks; both still accept it.)
pub(crate) fn lease_insert_sql(a: &ClaimArgs<'_>, keys: &[String]) -> Stmt<Sql> {
    let mut b = B::new();
    let mut values = Vec::with_capacity(keys.len());
    for key in keys {
        let source = b.bind(a.m.source_key.clone());
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
    Stmt::new(sql, b)
}

/// The keys of the leases the claim's token holds.
pub(crate) fn leases_won_sql(a: &ClaimArgs<'_>) -> Stmt<Sql> {
    let mut b = B::new();
    let mine = leases_of(a.m, &mut b, a.token, &Target::All);
    Stmt::new(
        format!("SELECT row_id FROM rowclaim_leases WHERE {mine}"),
        b,
    )
}

/// The transaction claim's lease: the session's idle timeout, and `@rowclaim_open`, the rows
/// still to settle, so that the last settle gives the pooled connection its usual timeout back.
pub(crate) fn lease_session_sql(lease: Duration, rows: usize) -> Stmt<Sql> {
    let mut b = B::new();
    let sql = format!(
        "SET SESSION wait_timeout = {}, @rowclaim_open = {}",
        b.bind(lease_secs(lease)),
        b.bind(rows as i64)
    );
    Stmt::new(sql, b)
}

/// The statements a claim of `a.strategy` sends, in order, for the SQL snapshots: where a
/// statement's input comes from an earlier one's answer, rows 1 and 2 were found (and won), on
/// a server that is not a Galera node.
#[cfg(test)]
pub(crate) fn statements(a: &ClaimArgs<'_>) -> Vec<Stmt<Sql>> {
    let found = || vec!["1".to_owned(), "2".to_owned()];
    let list = IdList::Int(vec![1, 2]);
    let batch = i64::from(a.batch);
    let pick = |f: fn(&Mapping, &mut B, i64, bool) -> String, expired| {
        let mut b = B::new();
        let sql = f(a.m, &mut b, batch, expired);
        Stmt::new(sql, b)
    };
    let read_back = || match &a.m.owner {
        Some(ow) => rows_of_owner_sql(a.m, ow, a.token),
        None => rows_sql(a.m, &list),
    };
    match a.strategy {
        Resolved::SkipLocked => {
            let look = a.expired.then(|| expired_ids_sql(a.m, batch)).flatten();
            let expired = match look {
                Some(_) => Expired::Among(IdList::Int(vec![1, 2])),
                None => Expired::Skip,
            };
            let pick = skip_locked_pick(a, &expired);
            let rest = [mark_sql(a, &list, Recheck::Nothing), rows_sql(a.m, &list)];
            look.into_iter().chain([pick]).chain(rest).collect()
        }
        Resolved::Token => vec![token_sql(a), read_back()],
        Resolved::Optimistic => vec![
            pick(optimistic_pick, a.expired),
            mark_sql(a, &list, Recheck::Claimable),
            read_back(),
        ],
        Resolved::LeaseTable => vec![
            pick(lease_candidates, true),
            lease_insert_sql(a, &found()),
            leases_won_sql(a),
            mark_sql(a, &list, Recheck::ReadyOrClaimed),
            rows_sql(a.m, &list),
        ],
        Resolved::Transaction => vec![
            pick(|m, b, n, _| transaction_pick(m, b, n), false),
            lease_session_sql(a.lease, 2),
        ],
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
pub(crate) fn optimistic_pick(m: &Mapping, b: &mut B, batch: i64, expired: bool) -> String {
    let select = format!("CAST({} AS CHAR) AS rowclaim_id", m.id);
    let pick = sql::candidates(m, b, &select, batch, expired);
    format!("SELECT rowclaim_id FROM ({pick}) AS c")
}

/// The lease-table claim's candidates: ready or claimed rows without a live lease. Without
/// `leases` the lease table is left out (`rowclaim check` on a database that has none yet).
pub(crate) fn lease_candidates(m: &Mapping, b: &mut B, batch: i64, leases: bool) -> String {
    let (t, id) = (&m.table, &m.id);
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
        "SELECT {} FROM {t} AS t WHERE {}{}{live} ORDER BY {} LIMIT {limit}",
        id_text(m),
        ready_or_claimed(m),
        m.filter,
        m.order_by
    )
}

/// The transaction claim's locking read of ready rows.
pub(crate) fn transaction_pick(m: &Mapping, b: &mut B, batch: i64) -> String {
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
