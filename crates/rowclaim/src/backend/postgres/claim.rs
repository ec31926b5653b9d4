//! Claiming on PostgreSQL: one function per strategy, each holding all of its SQL.

use super::*;

impl Pg {
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

    /// The `skip-locked` strategy on PostgreSQL: one statement: lock the first unlocked candidates,
    /// mark them ours, return them. Expired leases are taken first, then ready rows fill the batch;
    /// each arm walks its own index (an OR of the two walks the primary key past every finished
    /// row). The outer LIMIT on c keeps the planner's estimate of c small (a LIMIT computed from a
    /// subquery alone is guessed at a tenth of the table, and then it hashes the whole table
    /// instead of joining by the primary key). A managed-queue claim given a position walks the
    /// ready rows in two arms that start there (the rest of its priority, then lower priorities),
    /// each an index range: see `Position`.
    async fn skip_locked(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let (m, t, id) = (a.m, &a.m.table, &a.m.id);
        let row = Sql::row_json(a.m);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let limit = b.bind(batch);
        let ready = sql::ready_arm(m, &mut b);
        let mut arms: Vec<String> = Vec::new();
        if a.expired {
            arms.extend(sql::expired_arm(m, &mut b));
        }
        match (a.after, &m.priority, &m.run_at) {
            (Some(p), Some(prio), Some(run_at)) => {
                let (pv, rv, iv) = (b.bind(p.priority), b.bind(p.run_at_us), b.bind(p.id));
                arms.push(format!(
                    "{ready} AND {prio} = {pv} AND ({run_at}, {id}) > \
                     (timestamptz 'epoch' + {rv} * interval '1 microsecond', {iv})"
                ));
                arms.push(format!("{ready} AND {prio} < {pv}"));
            }
            _ => arms.push(ready),
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
        let sql = format!(
            "WITH {}, c AS ({union} LIMIT {limit}) \
             UPDATE {t} AS t SET {set} FROM c WHERE t.{id} = c.{id} RETURNING ",
            ctes.join(", ")
        );
        // A managed job comes back as plain columns: building a JSON object per row
        // costs the server about as much as the rest of the claim (10 µs of 26 per job).
        let (Some(prio), Some(run_at)) = (&m.priority, &m.run_at) else {
            let sql = sql + &row;
            return Ok(Claimed::rows(json_rows(
                b.scalar(sql)?.fetch_all(self.exec()).await?,
            )));
        };
        // The payload as its JSON text, as `claimed_json` sends it (see there why).
        let cols: Vec<String> = m
            .claim_columns
            .iter()
            .map(|c| match c.as_str() {
                "payload" => format!("t.{}::text", Sql::quote(c)),
                _ => format!("t.{}", Sql::quote(c)),
            })
            .collect();
        let sql = format!(
            "{sql}{}, t.{prio}::int8 AS rowclaim_priority, \
             (extract(epoch FROM t.{run_at}) * 1000000)::int8 AS rowclaim_run_at_us",
            cols.join(", ")
        );
        let fetched = b.query(sql)?.fetch_all(self.exec()).await?;
        let mut position: Option<Position> = None;
        let mut rows = Vec::with_capacity(fetched.len());
        for r in &fetched {
            let (row, p) = job_row(m, r)?;
            position = Some(position.map_or(p, |q| q.later(p)));
            rows.push(row);
        }
        Ok(Claimed {
            rows,
            held: None,
            lost_race: false,
            position,
        })
    }

    /// The `token` strategy on PostgreSQL: mark the first candidates with the token. The outer
    /// condition is checked again after waiting for another claimer's row lock, so a row is never
    /// taken twice; a claimer that lost every row to others gets none and tries again. The
    /// candidates are locked in id order, as a settle locks its rows: a candidate that turned out
    /// taken stays locked until this statement ends, and two statements that lock in different
    /// orders deadlock.
    async fn token(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
        let row = Sql::row_json(a.m);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let pick = sql::candidates(m, &mut b, id, batch, a.expired);
        let outer = sql::claimable(m, &mut b);
        let sql = format!(
            "UPDATE {t} AS t SET {set} FROM (SELECT {id} AS rowclaim_id FROM {t} \
             WHERE {id} IN (SELECT {id} FROM ({pick}) AS c) ORDER BY {id} FOR UPDATE) AS l \
             WHERE t.{id} = l.rowclaim_id AND {outer}{filter} RETURNING {row}"
        );
        let rows = json_rows(b.scalar(sql)?.fetch_all(self.exec()).await?);
        let lost_race = rows.is_empty() && run::claimable_exists(self, m).await?;
        Ok(Claimed::raced(rows, lost_race))
    }

    /// The `optimistic` strategy on PostgreSQL: read candidates without locks; the update wins only
    /// the rows still claimable.
    async fn optimistic(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let (m, t, id, filter) = (a.m, &a.m.table, &a.m.id, &a.m.filter);
        let row = Sql::row_json(a.m);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let sql = optimistic_pick(m, &mut b, batch, a.expired);
        let found: Vec<String> = b.scalar(sql)?.fetch_all(self.exec()).await?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        let list = IdList::new(m.id_kind, &m.parse_ids(&found)?)?;
        let mut b = B::new();
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let any = ids(&mut b, &list);
        let cond = sql::claimable(m, &mut b);
        let sql = format!(
            "UPDATE {t} AS t SET {set} WHERE {id} = ANY({any}) AND {cond}{filter} \
             RETURNING {row}"
        );
        let rows = json_rows(b.scalar(sql)?.fetch_all(self.exec()).await?);
        Ok(Claimed::contested(rows))
    }

    /// The `lease-table` strategy on PostgreSQL: candidates are rows without a live lease;
    /// inserting the lease key is the claim (an expired lease is taken over in the same statement),
    /// then the rows are marked.
    async fn lease_table(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let (m, t, id) = (a.m, &a.m.table, &a.m.id);
        let row = Sql::row_json(a.m);
        let mut b = B::new();
        let batch = i64::from(a.batch);
        let st = &m.status;
        let sql = lease_candidates(m, &mut b, batch, true);
        let found: Vec<String> = b.scalar(sql)?.fetch_all(self.exec()).await?;
        if found.is_empty() {
            return Ok(Claimed::none());
        }
        // One transaction: win the lease keys (taking over expired ones), mark the rows,
        // and drop leases won on rows that were finished meanwhile.
        let mut tx = self.begin().await?;
        let mut b = B::new();
        let source = b.bind(m.source_key.clone());
        let token = b.bind(a.token.to_owned());
        let until = Sql::later(&mut b, a.lease);
        let keys = b.bind(found);
        let sql = format!(
            "INSERT INTO rowclaim_leases AS l (source, row_id, token, lease_until) \
             SELECT {source}, k, {token}, {until} FROM unnest({keys}::text[]) AS k \
             ON CONFLICT (source, row_id) DO UPDATE \
             SET token = EXCLUDED.token, lease_until = EXCLUDED.lease_until \
             WHERE l.lease_until < now() RETURNING row_id"
        );
        let won: Vec<String> = b.scalar(sql)?.fetch_all(self.on(&mut tx)).await?;
        let mut b = B::new();
        let set = sql::claim_set(m, &mut b, a.token, a.lease);
        let keys = b.bind(won.clone());
        let (ready, claimed) = (status_literal(&m.ready), status_literal(&m.claimed));
        let key_id = row_id_as_id(m, "k");
        let sql = format!(
            "UPDATE {t} AS t SET {set} WHERE t.{id} IN (SELECT {key_id} FROM unnest({keys}::text[]) AS k) \
             AND ({st} = {ready} OR {st} = {claimed}) RETURNING {row}"
        );
        let rows = json_rows(b.scalar(sql)?.fetch_all(self.on(&mut tx)).await?);
        if rows.len() < won.len() {
            sqlx::query(
                "DELETE FROM rowclaim_leases WHERE source = $1 AND token = $2 \
                 AND row_id = ANY($3) AND row_id <> ALL($4)",
            )
            .bind(m.source_key.clone())
            .bind(a.token.to_owned())
            .bind(won)
            .bind(
                rows.iter()
                    .filter_map(|r| r.get(&m.id_name).map(json_key))
                    .collect::<Vec<_>>(),
            )
            .execute(self.on(&mut tx))
            .await?;
        }
        tx.commit().await?;
        Ok(Claimed::contested(rows))
    }

    /// The `transaction` strategy on PostgreSQL: lock the rows in a transaction that stays open;
    /// the session's idle timeout is the lease: past it the server ends the session and the rows
    /// are free again.
    async fn transaction(&self, a: &ClaimArgs<'_>) -> Result<Claimed<Held>> {
        let mut b = B::new();
        let mut tx = self.begin().await?;
        sqlx::query("SELECT set_config('idle_in_transaction_session_timeout', $1, true)")
            .bind(sql::lease_ms(a.lease).to_string())
            .execute(self.on(&mut tx))
            .await?;
        let sql = transaction_pick(a.m, &mut b, i64::from(a.batch));
        let rows = json_rows(b.scalar(sql)?.fetch_all(self.on(&mut tx)).await?);
        let held = if rows.is_empty() {
            tx.rollback().await?;
            None
        } else {
            Some(tx)
        };
        Ok(Claimed::held(rows, held))
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
fn optimistic_pick(m: &Mapping, b: &mut B, batch: i64, expired: bool) -> String {
    let select = format!("{}::text AS rowclaim_id", m.id);
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
