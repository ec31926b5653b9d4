//! The recount of a limited claim on a node that applies other nodes' writes late (a Galera
//! node), once the claim committed.
//!
//! There the queue's turn (`turn_sql`) does not always keep two nodes' claims apart: a claim on
//! one node counted what ran, and another node's claim committed in between, and both claims
//! committed with the same turn (seen in `tests/galera.rs`, about one run in ten: a queue
//! limited to 2 ran 3 jobs at once; Jepsen reports lost updates on healthy Galera clusters
//! too). So the jobs a claim took run only once a count made after its commit, waiting for
//! every write the cluster committed before it (`wsrep_sync_wait`), finds the queue within its
//! limits; otherwise the claim gives them back, unstarted. Of two claims that crossed a limit
//! together, the one that committed later always sees both in its count, so no crossing runs;
//! at worst both give back and claim again, their starts (for rate limits) forgotten.

use crate::backend::run::Run;
use crate::backend::sql::{self, Binder, Dialect, Stmt};
use crate::backend::ClaimArgs;
use crate::backend::{Outcome, Target};
use crate::error::Result;
use crate::value::IdList;

use super::RUNNING;

/// Whether the jobs `ids` a limited claim of `queue` took and committed were given back:
/// because a count after the commit found one of the queue's limits crossed.
pub(crate) async fn gave_back<R: Run + ?Sized>(
    r: &R,
    a: &ClaimArgs<'_>,
    queue: &str,
    ids: &IdList,
) -> Result<bool> {
    if r.count(crossed_sql(queue, ids)).await? == 0 {
        return Ok(false);
    }
    // The starts first, while the jobs are still the claim's: a rate counts no start of a job
    // that did not start.
    for one in singles(ids) {
        r.execute(unstart_sql(queue, a.token, &one)).await?;
    }
    let target = Target::Ids(ids, ids.len());
    let back = sql::settle_in_table_sql(a.m, a.token, &target, &Outcome::Unstarted)?;
    let n = r.execute(back).await?;
    tracing::debug!(
        queue,
        jobs = n,
        "a limited claim crossed a limit with another node's claim: its jobs are given back"
    );
    Ok(true)
}

/// Each id of `ids` as a list of its own.
fn singles(ids: &IdList) -> Vec<IdList> {
    match ids {
        IdList::Int(v) => v.iter().map(|id| IdList::Int(vec![*id])).collect(),
        IdList::Text(v) => v.iter().map(|id| IdList::Text(vec![id.clone()])).collect(),
    }
}

/// Forgets the start the claim of `token` recorded for the job `id` (`starts_sql`: at the job's
/// `attempted_at`), one row of them: the same start of another claim is the same row, and
/// either one goes. MariaDB's SQL (`<=>`, `DELETE … LIMIT`): only a Galera node asks.
fn unstart_sql<D: Dialect>(queue: &str, token: &str, id: &IdList) -> Stmt<D> {
    let mut b = Binder::<D>::new();
    let name = b.bind(queue.to_owned());
    let which = D::id_in(&mut b, "j.id", id);
    let owner = b.bind(token.to_owned());
    let sql = format!(
        "DELETE FROM rowclaim_starts WHERE queue = {name} AND EXISTS (SELECT 1 FROM \
         rowclaim_jobs j WHERE {which} AND j.owner = {owner} AND j.status = {RUNNING} \
         AND j.limit_key <=> rowclaim_starts.limit_key \
         AND {} = rowclaim_starts.started_ms) LIMIT 1",
        D::epoch_ms("j.attempted_at")
    );
    Stmt::new(sql, b)
}

/// 1 when the queue's jobs now cross one of its limits where the jobs `ids` count (what runs in
/// the queue, and within each of their keys; the starts of the rate periods), else 0; read once
/// this node applied what the cluster committed before (`wsrep_sync_wait = 1`: reads).
pub(crate) fn crossed_sql<D: Dialect>(queue: &str, ids: &IdList) -> Stmt<D> {
    let (now, now_ms) = (D::NOW, D::epoch_ms(D::NOW));
    let mut b = Binder::<D>::new();
    let name = b.bind(queue.to_owned());
    // The keys of the claim's jobs, bound where each use stands (placeholders are positional
    // on MySQL).
    let mut keys = || {
        format!(
            "(SELECT c.limit_key FROM rowclaim_jobs c WHERE {})",
            D::id_in(&mut b, "c.id", ids)
        )
    };
    let (keys, rate_keys) = (keys(), keys());
    let running = format!(
        "rowclaim_jobs j WHERE j.queue = q.name AND j.status = {RUNNING} AND j.lease_until >= {now}"
    );
    let sql = format!(
        "SET STATEMENT wsrep_sync_wait = 1 FOR SELECT COUNT(*) FROM rowclaim_queues q \
         WHERE q.name = {name} AND ( \
         (q.concurrency IS NOT NULL AND (SELECT COUNT(*) FROM {running}) > q.concurrency) \
         OR (q.key_concurrency IS NOT NULL AND EXISTS (SELECT 1 FROM {running} \
           AND j.limit_key IN {keys} GROUP BY j.limit_key HAVING COUNT(*) > q.key_concurrency)) \
         OR (q.rate IS NOT NULL AND (SELECT COUNT(*) FROM rowclaim_starts s \
           WHERE s.queue = q.name AND s.started_ms >= {now_ms} - q.rate_period_ms) > q.rate) \
         OR (q.key_rate IS NOT NULL AND EXISTS (SELECT 1 FROM rowclaim_starts s \
           WHERE s.queue = q.name AND s.started_ms >= {now_ms} - q.key_rate_period_ms \
           AND s.limit_key IN {rate_keys} GROUP BY s.limit_key HAVING COUNT(*) > q.key_rate)))"
    );
    Stmt::new(sql, b)
}

#[cfg(all(test, feature = "mysql"))]
mod tests {
    //! The recount's question on a MariaDB server (the statement is the same on a Galera node;
    //! `tests/galera.rs` runs it there): each limit crossed is seen, where the claim's jobs count.

    use std::time::Duration;

    use rowclaim_testkit::{with_db, Backend};

    use super::{crossed_sql, unstart_sql};
    use crate::backend::mysql::Sql;
    use crate::backend::run::Run;
    use crate::queue::limits::{QueueLimits, Rate};
    use crate::value::IdList;
    use crate::{Db, NewJob};

    /// The MariaDB driver of `db`.
    #[allow(irrefutable_let_patterns)] // with only the mysql feature there is no other
    fn driver(db: &Db) -> &crate::backend::mysql::My {
        let crate::backend::Backend::MySql(my) = &db.backend else {
            panic!("a MariaDB database")
        };
        my
    }

    /// Whether a claim of `ids` in queue `lq` would be found crossing a limit.
    async fn crossed(db: &Db, ids: &[i64]) -> bool {
        let n = driver(db)
            .count(crossed_sql::<Sql>("lq", &IdList::Int(ids.to_vec())))
            .await
            .expect("the recount");
        n > 0
    }

    #[tokio::test]
    async fn a_recount_sees_each_limit_crossed_where_the_claim_counts() {
        with_db(Backend::MySql, |t| async move {
            let db = Db::connect(&t.url).await.expect("connect");
            let queue = db.queue();
            queue.init().await.expect("init");
            let limits = QueueLimits::default().concurrency(2).key_concurrency(1);
            queue.limit("lq", &limits).await.expect("limit");
            // Jobs 1-2 of key a, 3 of b, 4 of c.
            let jobs: Vec<NewJob> = ["a", "a", "b", "c"]
                .iter()
                .map(|k| NewJob::new(serde_json::json!({})).queue("lq").limit_key(*k))
                .collect();
            queue.enqueue_many(&jobs).await.expect("enqueue");
            let run = |ids: &str, lease_s: i64| {
                format!(
                    "UPDATE rowclaim_jobs SET status = 'running', \
                     lease_until = UTC_TIMESTAMP(6) + INTERVAL {lease_s} SECOND \
                     WHERE id IN ({ids})"
                )
            };
            let ready = "UPDATE rowclaim_jobs SET status = 'ready', lease_until = NULL";

            // Two running, of two keys: within both limits.
            t.exec(&run("1, 3", 60)).await;
            assert!(!crossed(&db, &[3]).await, "2 running, limit 2");
            // A third: the queue's concurrency is crossed, whichever job the claim took.
            t.exec(&run("4", 60)).await;
            assert!(crossed(&db, &[4]).await, "3 running, limit 2");
            // A lease run out holds no place.
            t.exec(&run("4", -5)).await;
            assert!(!crossed(&db, &[4]).await, "an expired lease counted");

            // Two of key a at once: crossed for a claim of an a, not for one of another key.
            t.exec(ready).await;
            t.exec(&run("1, 2", 60)).await;
            assert!(crossed(&db, &[2]).await, "2 of key a, limit 1");
            assert!(!crossed(&db, &[3]).await, "key a counted for a claim of b");

            // Rates: three starts in the period against 2 a minute; per key, 2 of a against 1.
            t.exec(ready).await;
            let limits = QueueLimits::default()
                .rate(Rate::new(2, Duration::from_secs(60)))
                .key_rate(Rate::new(1, Duration::from_secs(60)));
            queue.limit("lq", &limits).await.expect("limit");
            let now = "CAST(UNIX_TIMESTAMP(UTC_TIMESTAMP(6)) * 1000 AS SIGNED)";
            let start = |key: &str| {
                format!(
                    "INSERT INTO rowclaim_starts (queue, limit_key, started_ms) \
                     VALUES ('lq', '{key}', {now})"
                )
            };
            t.exec(&start("a")).await;
            t.exec(&start("b")).await;
            assert!(
                !crossed(&db, &[3]).await,
                "2 starts, rate 2; 1 of b, key rate 1"
            );
            t.exec(&start("a")).await;
            assert!(crossed(&db, &[3]).await, "3 starts, rate 2");
            let limits = QueueLimits::default().key_rate(Rate::new(1, Duration::from_secs(60)));
            queue.limit("lq", &limits).await.expect("limit");
            assert!(crossed(&db, &[1]).await, "2 starts of a, key rate 1");
            assert!(
                !crossed(&db, &[3]).await,
                "key a's starts counted for a claim of b"
            );

            // A claim given back forgets its job's start: one row of those at its instant and
            // key (another claim's equal start stays), none of another key or instant, and
            // none for a job the claim does not hold.
            t.exec("DELETE FROM rowclaim_starts").await;
            t.exec(
                "UPDATE rowclaim_jobs SET status = 'running', owner = 'tok', \
                 attempted_at = TIMESTAMP '2026-01-01 00:00:00.123456' WHERE id = 1",
            )
            .await;
            let ms = "CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', \
                      TIMESTAMP '2026-01-01 00:00:00.123456') DIV 1000 AS SIGNED)";
            for (key, at) in [("a", ms), ("a", ms), ("b", ms), ("a", "0")] {
                t.exec(&format!(
                    "INSERT INTO rowclaim_starts (queue, limit_key, started_ms) \
                     VALUES ('lq', '{key}', {at})"
                ))
                .await;
            }
            let unstart = |token: &str| unstart_sql::<Sql>("lq", token, &IdList::Int(vec![1]));
            let my = driver(&db);
            assert_eq!(my.execute(unstart("other")).await.expect("unstart"), 0);
            assert_eq!(my.execute(unstart("tok")).await.expect("unstart"), 1);
            let of_a = "SELECT COUNT(*) FROM rowclaim_starts WHERE limit_key = 'a'";
            assert_eq!(
                t.count(of_a).await,
                2,
                "one start of key a at the claim's instant"
            );
            assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_starts").await, 3);
        })
        .await;
    }
}
