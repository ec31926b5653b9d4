//! The recount's question on a MariaDB server (the statement is the same on a Galera node;
//! `tests/galera.rs` runs it there): each limit crossed is seen, where the claim's jobs count.

use std::time::Duration;

use rowclaim_testkit::{with_db, Backend};

use super::{crossed_sql, unstart_sql};
use crate::backend::mysql::Sql;
use crate::backend::run::Run;
use crate::db::Db;
use crate::queue::job::NewJob;
use crate::queue::limits::{QueueLimits, Rate};
use crate::value::IdList;

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
