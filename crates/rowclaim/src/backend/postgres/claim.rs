//! Claiming on PostgreSQL: one function per strategy, each holding all of its SQL in statement
//! builders (`*_sql`, pure: the snapshots call them) that the strategy runs in order.

use super::*;

#[async_trait::async_trait]
impl Claims for Pg {
    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let claimed = match a.strategy {
            Resolved::SkipLocked => self.skip_locked(a).await,
            Resolved::Token => self.token(a).await,
            Resolved::Optimistic => self.optimistic(a).await,
            Resolved::LeaseTable => self.lease_table(a).await,
            Resolved::Transaction => self.in_transaction(a).await,
        }?;
        Ok(claimed.map_held(Held::Postgres))
    }
}

impl Pg {
    /// The `skip-locked` strategy on PostgreSQL: one statement ([`skip_locked_sql`]) locks the
    /// first unlocked candidates, marks them ours and returns them.
    async fn skip_locked(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let s = skip_locked_sql(a);
        if a.m.lifecycle.is_some() {
            // Plain columns, each read by its type: building a JSON object per row costs the
            // server about as much as the rest of the claim (10 µs of 26 per job).
            let rows: Vec<Columns> = self.fetch_all(s).await?;
            return Ok(Claimed::rows(rows.into_iter().map(|c| c.0).collect()));
        }
        Ok(Claimed::rows(json_rows(self, s).await?))
    }

    /// The `token` strategy on PostgreSQL ([`token_sql`]); a claimer that lost every row to
    /// others gets none and tries again.
    async fn token(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let rows = json_rows(self, token_sql(a)).await?;
        let lost_race = rows.is_empty() && once::claimable_exists(self, a.m).await?;
        Ok(Claimed::raced(rows, lost_race))
    }

    /// The `optimistic` strategy on PostgreSQL: read candidates without locks
    /// ([`optimistic_pick`]); the update ([`optimistic_sql`]) wins only the rows still
    /// claimable.
    async fn optimistic(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let m = a.m;
        let mut b = B::new();
        let sql = optimistic_pick(m, &mut b, i64::from(a.batch), a.expired);
        let found = self.texts(Stmt::new(sql, b)).await?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        let list = IdList::new(m.id_kind, &m.parse_ids(&found)?)?;
        let rows = json_rows(self, optimistic_sql(a, &list)).await?;
        Ok(Claimed::contested(rows))
    }

    /// The `lease-table` strategy on PostgreSQL: candidates are rows without a live lease
    /// ([`lease_candidates`]); in one transaction, inserting the lease keys is the claim (an
    /// expired lease is taken over in the same statement, [`lease_insert_sql`]), then the rows
    /// are marked ([`lease_mark_sql`]) and leases won on rows finished meanwhile dropped
    /// ([`lease_drop_sql`]).
    async fn lease_table(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let m = a.m;
        let mut b = B::new();
        let sql = lease_candidates(m, &mut b, i64::from(a.batch), true);
        let found = self.texts(Stmt::new(sql, b)).await?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        let tx = self.transaction(false).await?;
        let won = tx.texts(lease_insert_sql(a, found)).await?;
        let rows = json_rows(&tx, lease_mark_sql(a, won.clone())).await?;
        if rows.len() < won.len() {
            let marked = rows
                .iter()
                .filter_map(|r| r.get(&m.id_name).map(json_key))
                .collect();
            tx.execute(lease_drop_sql(a, won, marked)).await?;
        }
        tx.commit().await?;
        Ok(Claimed::contested(rows))
    }

    /// The `transaction` strategy on PostgreSQL: lock the rows in a transaction that stays open;
    /// the session's idle timeout is the lease: past it the server ends the session and the rows
    /// are free again.
    async fn in_transaction(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Tx>> {
        let tx = self.transaction(false).await?;
        tx.execute(idle_timeout_sql(a.lease)).await?;
        let mut b = B::new();
        let sql = transaction_pick(a.m, &mut b, i64::from(a.batch));
        let rows = json_rows(&tx, Stmt::new(sql, b)).await?;
        let held = if rows.is_empty() {
            tx.rollback().await?;
            None
        } else {
            Some(tx.into_inner())
        };
        Ok(Claimed::held(rows, held))
    }
}

/// The skip-locked claim: lock the first unlocked candidates, mark them ours, return them.
/// Expired leases are taken first, then ready rows fill the batch; each arm walks its own index
/// (an OR of the two walks the primary key past every finished row). A claim given arms to look
/// for ready rows in (a layer above resumes where its last claim ended) walks them in order,
/// each an index range. The claimed rows are then found by their ids, each through the primary
/// key (`= ANY(ARRAY(…))`, which the planner reads so at any size): as a join on c, with fresh
/// statistics the planner hashed the whole table once a batch was a few percent of it (a claim
/// of 500 among 50,000 ready rows took 22 ms instead of 3.6 ms). The outer LIMIT on
/// c keeps the arms from taking more than the batch between them.
pub(crate) fn skip_locked_sql(a: &ClaimArgs<'_>) -> Stmt<Sql> {
    let (m, t, id) = (a.m, &a.m.table, &a.m.id);
    let mut b = B::new();
    let limit = b.bind(i64::from(a.batch));
    let ready = sql::ready_arm(m, &mut b);
    let mut arms: Vec<String> = Vec::new();
    if a.expired {
        arms.extend(sql::expired_arm(m, &mut b));
    }
    match a.arms {
        Some(more) => {
            for f in more {
                arms.push(format!("{ready} AND {}", sql::fragment::render(f, &mut b)));
            }
        }
        None => arms.push(ready),
    }
    // Each arm takes what the arms before it left of the batch.
    let mut ctes = Vec::new();
    let mut before: Vec<String> = Vec::new();
    for (n, cond) in arms.iter().enumerate() {
        let left = before
            .iter()
            .map(|p| format!(" - (SELECT count(*) FROM {p})"))
            .collect::<String>();
        ctes.push(format!("a{n} AS ({})", locking_arm(m, cond, &limit, &left)));
        before.push(format!("a{n}"));
    }
    let union = before
        .iter()
        .map(|p| format!("SELECT {id} FROM {p}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let returning = match &m.lifecycle {
        None => "to_jsonb(t)".to_owned(), // the whole row, as `json_rows` reads it
        Some(l) => carried(m, l, &mut b),
    };
    let sql = format!(
        "WITH {}, c AS ({union} LIMIT {limit}) \
         UPDATE {t} AS t SET {set} WHERE t.{id} = ANY(ARRAY(SELECT {id} FROM c)) \
         RETURNING {returning}",
        ctes.join(", ")
    );
    Stmt::new(sql, b)
}

/// What a skip-locked claim of a source a layer above completes returns per row: its carried
/// columns one by one (those it carries as text cast to text) and the extra values it asks for,
/// each under its own name (a user's own table returns each row as JSON instead).
fn carried(m: &Mapping, l: &crate::mapping::Lifecycle, b: &mut B) -> String {
    let mut cols = vec![claimed_columns(m)];
    for (name, value) in &l.extra {
        cols.push(format!(
            "{} AS {}",
            sql::fragment::render(value, b),
            Sql::quote(name)
        ));
    }
    cols.join(", ")
}

/// The token claim: mark the first candidates with the token. The outer condition is checked
/// again after waiting for another claimer's row lock, so a row is never taken twice. The
/// candidates are locked in id order, as a settle locks its rows: a candidate that turned out
/// taken stays locked until this statement ends, and two statements that lock in different
/// orders deadlock. The candidates are an array, not an `IN` list, for the reason the
/// skip-locked claim gives: as a join, fresh statistics made it hash the whole table twice.
pub(crate) fn token_sql(a: &ClaimArgs<'_>) -> Stmt<Sql> {
    let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
    let row = Sql::row_json(m);
    let mut b = B::new();
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let pick = sql::candidates(m, &mut b, id, i64::from(a.batch), a.expired);
    let outer = sql::claimable(m, &mut b);
    let sql = format!(
        "UPDATE {t} AS t SET {set} FROM (SELECT {id} AS rowclaim_id FROM {t} \
         WHERE {id} = ANY(ARRAY(SELECT {id} FROM ({pick}) AS c)) ORDER BY {id} FOR UPDATE) AS l \
         WHERE t.{id} = l.rowclaim_id AND {outer}{filter} RETURNING {row}"
    );
    Stmt::new(sql, b)
}

/// The optimistic claim's update of the candidates it read: it wins the rows still claimable.
pub(crate) fn optimistic_sql(a: &ClaimArgs<'_>, list: &IdList) -> Stmt<Sql> {
    let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
    let row = Sql::row_json(m);
    let mut b = B::new();
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let any = ids(&mut b, list);
    let cond = sql::claimable(m, &mut b);
    let sql = format!(
        "UPDATE {t} AS t SET {set} WHERE {id} = ANY({any}) AND {cond}{filter} RETURNING {row}"
    );
    Stmt::new(sql, b)
}

/// The lease-table claim's insert of the candidates' lease keys: a key that exists changes hands
/// only when its lease has expired. Returns the keys won.
pub(crate) fn lease_insert_sql(a: &ClaimArgs<'_>, keys: Vec<String>) -> Stmt<Sql> {
    let mut b = B::new();
    let source = b.bind(a.m.source_key.clone());
    let token = b.bind(a.token.to_owned());
    let until = Sql::later(&mut b, a.lease);
    let keys = b.bind(keys);
    let sql = format!(
        "INSERT INTO rowclaim_leases AS l (source, row_id, token, lease_until) \
         SELECT {source}, k, {token}, {until} FROM unnest({keys}::text[]) AS k \
         ON CONFLICT (source, row_id) DO UPDATE \
         SET token = EXCLUDED.token, lease_until = EXCLUDED.lease_until \
         WHERE l.lease_until < now() RETURNING row_id"
    );
    Stmt::new(sql, b)
}

/// The lease-table claim's marking of the rows whose lease keys it won (still ready or claimed).
pub(crate) fn lease_mark_sql(a: &ClaimArgs<'_>, won: Vec<String>) -> Stmt<Sql> {
    let (m, t, id, st) = (a.m, &a.m.table, &a.m.id, &a.m.status);
    let row = Sql::row_json(m);
    let mut b = B::new();
    let set = sql::claim_set(m, &mut b, a.token, a.lease);
    let keys = b.bind(won);
    let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
    let key_id = row_id_as_id(m, "k");
    let sql = format!(
        "UPDATE {t} AS t SET {set} WHERE t.{id} IN (SELECT {key_id} FROM unnest({keys}::text[]) \
         AS k) AND ({st} = {ready} OR {st} = {claimed}) RETURNING {row}"
    );
    Stmt::new(sql, b)
}

/// The lease-table claim's drop of the leases it won on rows it could not mark (finished
/// meanwhile): all of `won` but `marked`.
pub(crate) fn lease_drop_sql(
    a: &ClaimArgs<'_>,
    won: Vec<String>,
    marked: Vec<String>,
) -> Stmt<Sql> {
    let mut b = B::new();
    let sql = format!(
        "DELETE FROM rowclaim_leases WHERE source = {} AND token = {} \
         AND row_id = ANY({}) AND row_id <> ALL({})",
        b.bind(a.m.source_key.clone()),
        b.bind(a.token.to_owned()),
        b.bind(won),
        b.bind(marked)
    );
    Stmt::new(sql, b)
}

/// The transaction claim's (and its heartbeat's) lease: the session's idle-in-transaction
/// timeout, for the rest of the transaction.
pub(crate) fn idle_timeout_sql(lease: Duration) -> Stmt<Sql> {
    let mut b = B::new();
    let sql = format!(
        "SELECT set_config('idle_in_transaction_session_timeout', {}, true)",
        b.bind(sql::lease_ms(lease).to_string())
    );
    Stmt::new(sql, b)
}

/// The statements a claim of `a.strategy` sends, in order, for the SQL snapshots: where a
/// statement's input comes from an earlier one's answer, rows 1 and 2 were found (and won).
#[cfg(test)]
pub(crate) fn statements(a: &ClaimArgs<'_>) -> Vec<Stmt<Sql>> {
    let found = || vec!["1".to_owned(), "2".to_owned()];
    let batch = i64::from(a.batch);
    let pick = |f: fn(&Mapping, &mut B, i64, bool) -> String, expired| {
        let mut b = B::new();
        let sql = f(a.m, &mut b, batch, expired);
        Stmt::new(sql, b)
    };
    match a.strategy {
        Resolved::SkipLocked => vec![skip_locked_sql(a)],
        Resolved::Token => vec![token_sql(a)],
        Resolved::Optimistic => {
            let list = IdList::Int(vec![1, 2]);
            vec![pick(optimistic_pick, a.expired), optimistic_sql(a, &list)]
        }
        Resolved::LeaseTable => vec![
            pick(lease_candidates, true),
            lease_insert_sql(a, found()),
            lease_mark_sql(a, found()),
        ],
        Resolved::Transaction => vec![
            idle_timeout_sql(a.lease),
            pick(|m, b, n, _| transaction_pick(m, b, n), false),
        ],
    }
}

/// One arm of the skip-locked claim: the first `limit` unlocked rows that meet `cond`, locked.
fn locking_arm(m: &Mapping, cond: &str, limit: &str, left: &str) -> String {
    format!(
        "SELECT {} FROM {} WHERE {cond}{} ORDER BY {} LIMIT {limit}{left} FOR UPDATE SKIP LOCKED",
        m.id, m.table, m.filter, m.order_by
    )
}

/// The optimistic claim's candidates, read without locks.
pub(crate) fn optimistic_pick(m: &Mapping, b: &mut B, batch: i64, expired: bool) -> String {
    let select = format!("{}::text AS rowclaim_id", m.id);
    let pick = sql::candidates(m, b, &select, batch, expired);
    format!("SELECT rowclaim_id FROM ({pick}) AS c")
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
             AND l.row_id = t.{id}::text AND l.lease_until >= now())"
        )
    } else {
        String::new()
    };
    let limit = b.bind(batch);
    format!(
        "SELECT t.{id}::text AS rowclaim_id FROM {t} AS t \
         WHERE ({st} = {ready} OR {st} = {claimed}){}{live} ORDER BY {} LIMIT {limit}",
        m.filter, m.order_by
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
/// first arm of skip-locked's UPDATE, the token UPDATE's candidates, the first statement of the
/// others. `rowclaim check` explains it.
pub(super) fn lookup(m: &Mapping, strategy: Resolved, batch: i64, leases: bool) -> (String, B) {
    let mut b = B::new();
    let sql = match strategy {
        Resolved::SkipLocked => {
            let limit = b.bind(batch);
            let ready = sql::ready_arm(m, &mut b);
            locking_arm(m, &ready, &limit, "")
        }
        Resolved::Token => sql::candidates(m, &mut b, &m.id, batch, false),
        Resolved::Optimistic => optimistic_pick(m, &mut b, batch, false),
        Resolved::LeaseTable => lease_candidates(m, &mut b, batch, leases),
        Resolved::Transaction => transaction_pick(m, &mut b, batch),
    };
    (sql, b)
}
