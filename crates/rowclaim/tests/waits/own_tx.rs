//! Jobs that wait, enqueued inside the caller's own transaction (`Queue::enqueue_postgres`,
//! `enqueue_mysql`, `enqueue_sqlite`): a part of the `waits` tests.

use std::sync::Arc;
use std::time::Duration;

use rowclaim::{Enqueued, ErrorKind, Job, NewJob, Queue, Worker};
use rowclaim_testkit::{Backend, TestDb};
use serde_json::json;

use super::ready_queue;

/// Enqueues `jobs` one by one in a transaction of the test's own, as an application does
/// (`Queue::enqueue_postgres`, `enqueue_mysql`, `enqueue_sqlite`), going on past a refused
/// one; awaits `meanwhile`; then commits, or rolls back.
async fn in_own_tx(
    t: &TestDb,
    jobs: &[NewJob],
    commit: bool,
    meanwhile: impl std::future::Future<Output = ()>,
) -> Vec<rowclaim::Result<Enqueued>> {
    macro_rules! own {
        ($pool:ty, $enqueue:path) => {{
            let pool = <$pool>::connect(&t.url)
                .await
                .expect("a pool of the test's own");
            let mut tx = pool.begin().await.expect("begin");
            let mut got = Vec::new();
            for job in jobs {
                got.push($enqueue(&mut tx, job).await);
            }
            meanwhile.await;
            if commit {
                tx.commit().await.expect("commit");
            } else {
                tx.rollback().await.expect("rollback");
            }
            pool.close().await;
            got
        }};
    }
    match t.backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres => own!(sqlx::PgPool, Queue::enqueue_postgres),
        #[cfg(feature = "mysql")]
        Backend::MySql => own!(sqlx::MySqlPool, Queue::enqueue_mysql),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => own!(sqlx::SqlitePool, Queue::enqueue_sqlite),
        #[allow(unreachable_patterns)]
        _ => unreachable!("the case runs only for backends this build has"),
    }
}

/// The ids of jobs enqueued in an own transaction, each of which must have been.
fn ids(got: Vec<rowclaim::Result<Enqueued>>) -> Vec<i64> {
    got.into_iter()
        .map(|e| e.expect("enqueued in the own transaction").id)
        .collect()
}

/// Jobs that wait, enqueued inside the caller's own transaction: none of it if that rolls
/// back; an unknown id refused by name, writing nothing; the rules of `Queue::enqueue` at
/// enqueue; released by a worker once their job completed; and one whose job finished
/// between the enqueue and the commit waits until `release_waiting`.
pub(crate) async fn own_transaction(t: Arc<TestDb>) {
    let (db, q) = ready_queue(&t).await;
    let status = |id| {
        let q = q.clone();
        async move { q.get(id).await.unwrap().expect("the job").status }
    };
    let jobs = "SELECT COUNT(*) FROM rowclaim_jobs";
    let edges = "SELECT COUNT(*) FROM rowclaim_waits";
    let a = q.enqueue(&NewJob::new(json!({"a": 1}))).await.unwrap().id;

    // Rolled back: neither the job nor its edges.
    let w = NewJob::new(json!({})).after([a]);
    let got = ids(in_own_tx(&t, &[w], false, async {}).await);
    assert_eq!(got.len(), 1);
    assert_eq!(t.count(jobs).await, 1, "the rolled-back job is gone");
    assert_eq!(t.count(edges).await, 0, "and its edges");

    // An unknown id is refused by name and writes nothing: the transaction goes on, and
    // commits the job before it alone.
    let plain = NewJob::new(json!({"plain": 1}));
    let unknown = NewJob::new(json!({})).after([a, 987_654]);
    let mut got = in_own_tx(&t, &[plain, unknown], true, async {}).await;
    let err = got.pop().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput, "{err}");
    assert!(err.to_string().contains("job 987654"), "{err}");
    let p = got.pop().unwrap().expect("the job before it").id;
    assert_eq!(status(p).await, "ready");
    assert_eq!(t.count(jobs).await, 2, "nothing of the refused job");
    assert_eq!(t.count(edges).await, 0, "nothing of the refused job");

    // Committed: waiting, with their edges (one runs anyway); a worker completes what they
    // wait for, releases them and runs them.
    let waiting = [
        NewJob::new(json!({"w": 1})).after([a]),
        NewJob::new(json!({"w": 2})).after([a, p]).run_anyway(),
    ];
    let [w1, w2] = ids(in_own_tx(&t, &waiting, true, async {}).await)[..] else {
        panic!("two jobs")
    };
    assert_eq!(status(w1).await, "waiting");
    assert_eq!(status(w2).await, "waiting");
    assert_eq!(t.count(edges).await, 3);
    let links = q.links(w2).await.unwrap();
    assert!(links.run_anyway, "{links:?}");
    let waited: Vec<i64> = links.waits_for.iter().map(|l| l.id).collect();
    assert_eq!(waited, [a, p]);
    assert!(!q.links(w1).await.unwrap().run_anyway);
    let report = Worker::new(&db)
        .handle_any(|_job: Job| async { Ok::<_, String>(()) })
        .until_empty(true)
        .poll(Duration::from_millis(50))
        .run(std::future::pending())
        .await
        .unwrap();
    assert_eq!(report.completed, 4, "{report:?}");
    for id in [a, p, w1, w2] {
        assert_eq!(status(id).await, "completed", "job {id}");
    }

    // At enqueue, as with Queue::enqueue: a completed job counts as done; a dead one cancels
    // the new job at once, naming it, unless it runs anyway.
    let d = q
        .enqueue(&NewJob::new(json!({"d": 1})).queue("doomed").max_attempts(1))
        .await
        .unwrap()
        .id;
    let doomed = q.claimer(&["doomed".to_owned()]).await.unwrap();
    let c = doomed.claim(1, Duration::from_secs(30)).await.unwrap();
    assert_eq!(c.len(), 1);
    c.fail(&c.rows()[0].id).await.unwrap();
    assert_eq!(status(d).await, "dead");
    let rules = [
        NewJob::new(json!({})).after([a]),
        NewJob::new(json!({})).after([a, d]),
        NewJob::new(json!({})).after([d]).run_anyway(),
    ];
    let [done, cancelled, anyway] = ids(in_own_tx(&t, &rules, true, async {}).await)[..] else {
        panic!("three jobs")
    };
    assert_eq!(status(done).await, "ready");
    let x = q.get(cancelled).await.unwrap().unwrap();
    assert_eq!(x.status, "cancelled");
    let said = x.last_error.unwrap_or_default();
    assert!(
        said.contains(&format!("job {d}, ")) && said.contains("dead"),
        "{said}"
    );
    assert_eq!(status(anyway).await, "ready");

    // Its job finishes between the enqueue and the commit (not on SQLite, whose open write
    // transaction holds off every other writer): nothing looks after the caller's commit, so
    // it waits until release_waiting (or a worker's sweep).
    if t.backend != Backend::Sqlite {
        let b = q
            .enqueue(&NewJob::new(json!({"b": 1})).queue("race"))
            .await
            .unwrap()
            .id;
        let racer = q.claimer(&["race".to_owned()]).await.unwrap();
        let meanwhile = async {
            let c = racer.claim(1, Duration::from_secs(30)).await.unwrap();
            assert_eq!(c.len(), 1);
            c.complete(&c.rows()[0].id).await.unwrap();
        };
        let w = NewJob::new(json!({})).after([b]);
        let [w] = ids(in_own_tx(&t, &[w], true, meanwhile).await)[..] else {
            panic!("one job")
        };
        assert_eq!(status(b).await, "completed");
        assert_eq!(
            status(w).await,
            "waiting",
            "no look after the caller's commit"
        );
        assert_eq!(q.release_waiting().await.unwrap(), 1);
        assert_eq!(status(w).await, "ready");
    }
}
