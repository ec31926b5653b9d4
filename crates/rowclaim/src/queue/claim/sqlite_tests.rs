//! A claim tells its caller when it has committed all it writes, before its rows are read
//! ([`crate::backend::ClaimArgs::committed`]): a worker's turn at SQLite's one write lock ends
//! there, and the next writer goes first while the rows are read.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rowclaim_testkit::{with_db, Backend, TestDb};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::queue::{NewJob, QueueLimits};

/// Whether a writer that does not wait gets SQLite's write lock on the file at `url` now. On a
/// thread and runtime of its own, so that a synchronous caller waits for the answer.
fn lock_is_free(url: &str) -> bool {
    let url = url.to_owned();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let options = SqliteConnectOptions::from_str(&url)
                .expect("the test's url")
                .busy_timeout(Duration::ZERO);
            let mut conn = options.connect().await.expect("a second connection");
            let free = sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut conn)
                .await
                .is_ok();
            if free {
                sqlx::query("ROLLBACK")
                    .execute(&mut conn)
                    .await
                    .expect("rollback");
            }
            conn.close().await.expect("close");
            free
        })
    })
    .join()
    .expect("the look at the lock")
}

/// Claims up to 10 jobs of `queues` on `t`; returns how many came and, for each call of the
/// claim's `committed`, whether the write lock was free then.
async fn claim_noting(t: &TestDb, queues: &[&str]) -> (usize, Vec<bool>) {
    let db = crate::Db::connect(&t.url).await.expect("connect");
    let queues: Vec<String> = queues.iter().map(|q| (*q).to_owned()).collect();
    let claimer = db.queue().claimer(&queues).await.expect("claimer");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let (url, seen) = (t.url.clone(), calls.clone());
    let committed = move || seen.lock().expect("calls").push(lock_is_free(&url));
    let claim = claimer
        .claim_behind(10, Duration::from_secs(60), &[], Some(&committed))
        .await
        .expect("claim");
    let calls = calls.lock().expect("calls").clone();
    (claim.len(), calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claim_says_committed_once_the_write_lock_is_free() {
    with_db(Backend::Sqlite, |t| async move {
        let db = crate::Db::connect(&t.url).await.expect("connect");
        let q = db.queue();
        q.init().await.expect("init");
        for i in 0..3 {
            let job = NewJob::new(serde_json::json!({ "i": i })).queue("plain");
            q.enqueue(&job).await.expect("enqueue");
        }
        let (rows, calls) = claim_noting(&t, &["plain"]).await;
        assert_eq!(rows, 3);
        assert_eq!(calls, [true], "called once, with the write lock let go");

        // Nothing claimed: a claim may look again (expired leases), so no call.
        let (rows, calls) = claim_noting(&t, &["plain"]).await;
        assert_eq!((rows, calls), (0, vec![]));

        // A claimer of a limited queue claims its jobs after the ordinary claim's statement,
        // which takes the plain queue's: no call, though that statement brought rows.
        q.limit("limited", &QueueLimits::default().concurrency(5))
            .await
            .expect("limit");
        for queue in ["plain", "plain", "limited", "limited", "limited"] {
            let job = NewJob::new(serde_json::json!({})).queue(queue);
            q.enqueue(&job).await.expect("enqueue");
        }
        let (rows, calls) = claim_noting(&t, &["plain", "limited"]).await;
        assert_eq!((rows, calls), (5, vec![]));
    })
    .await;
}
