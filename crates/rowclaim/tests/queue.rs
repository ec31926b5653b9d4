//! The managed queue on every backend: init, enqueue (bulk, unique keys, inside a caller's
//! transaction), claiming due jobs by queue and priority, retries and dead jobs, admin, stats.

use rowclaim_testkit as common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{with_db, Backend, TestDb};
use rowclaim::{Db, Job, NewJob, Queue};
use serde_json::json;

async fn ready_queue(t: &TestDb) -> (Db, Queue) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    (db, q)
}

/// Init is idempotent and safe when several processes run it at once.
async fn init_concurrently(t: Arc<TestDb>) {
    let mut inits = Vec::new();
    for _ in 0..3 {
        let db = t.db().await;
        inits.push(tokio::spawn(async move { db.queue().init().await }));
    }
    for i in inits {
        i.await.unwrap().expect("concurrent init");
    }
    t.db().await.queue().init().await.expect("init again");
    // One row for the component, at the latest version of its migrations (each database counts
    // its own: queue/migrate/).
    let latest = if t.backend == Backend::MySql { 16 } else { 8 };
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_schema WHERE component = 'jobs'")
            .await,
        1
    );
    let at_latest = format!(
        "SELECT COUNT(*) FROM rowclaim_schema WHERE component = 'jobs' AND version = {latest}"
    );
    assert_eq!(t.count(&at_latest).await, 1);
}

/// Jobs come out by queue, when due, highest priority first, with their payload.
async fn claim_due_jobs(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    q.enqueue(&NewJob::new(json!({"n": 1})).queue("mail"))
        .await
        .unwrap();
    q.enqueue(&NewJob::new(json!({"n": 2})).queue("mail").priority(5))
        .await
        .unwrap();
    q.enqueue(&NewJob::new(json!({"n": 3})).queue("other"))
        .await
        .unwrap();
    q.enqueue(
        &NewJob::new(json!({"n": 4}))
            .queue("mail")
            .delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    let later = SystemTime::now() + Duration::from_secs(3600);
    q.enqueue(&NewJob::new(json!({"n": 5})).queue("mail").run_at(later))
        .await
        .unwrap();

    let c = q.claimer(&["mail".to_owned()]).await.unwrap();
    let first = c.claim(1, Duration::from_secs(30)).await.unwrap();
    let job = Job::from_row(&first.rows()[0]).unwrap();
    assert_eq!(job.payload, json!({"n": 2}), "highest priority first");
    assert_eq!(
        (job.queue.as_str(), job.attempt, job.max_attempts),
        ("mail", 1, 25)
    );
    first.complete(&first.rows()[0].id).await.unwrap();
    let rest = c.claim(10, Duration::from_secs(30)).await.unwrap();
    let payloads: Vec<_> = rest
        .rows()
        .iter()
        .map(|r| Job::from_row(r).unwrap().payload)
        .collect();
    assert_eq!(
        payloads,
        vec![json!({"n": 1})],
        "other queues and future jobs stay"
    );
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed' AND finished_at IS NOT NULL").await, 1);
}

/// Claims that resume where the last one ended (PostgreSQL) still find jobs that became
/// claimable behind that place: jobs given back, and a job of higher priority enqueued after the
/// first claims. Every job is claimed, none twice, and the high-priority job before the ones
/// that were ready all along once a claim starts from the beginning again.
async fn claims_find_jobs_behind_them(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    let jobs: Vec<NewJob> = (0..40).map(|n| NewJob::new(json!({ "n": n }))).collect();
    q.enqueue_many(&jobs).await.unwrap();
    let c = q.claimer(&[]).await.unwrap();
    let lease = Duration::from_secs(60);
    let mut seen: Vec<serde_json::Value> = Vec::new();
    // Two full claims: the second resumes after the first.
    let first = c.claim(10, lease).await.unwrap();
    let second = c.claim(10, lease).await.unwrap();
    assert_eq!((first.len(), second.len()), (10, 10));
    // Give the first claim's jobs back (now behind the place claims resume at), complete the
    // second's, and enqueue an urgent job.
    for r in first.rows() {
        first.release(&r.id).await.unwrap();
    }
    for r in second.rows() {
        seen.push(Job::from_row(r).unwrap().payload);
        second.complete(&r.id).await.unwrap();
    }
    q.enqueue(&NewJob::new(json!({"n": "urgent"})).priority(9))
        .await
        .unwrap();
    let mut urgent_at = None;
    for _ in 0..20 {
        let claim = c.claim(10, lease).await.unwrap();
        if claim.is_empty() {
            break;
        }
        for r in claim.rows() {
            let payload = Job::from_row(r).unwrap().payload;
            if payload == json!({"n": "urgent"}) {
                urgent_at = Some(seen.len());
            }
            seen.push(payload);
            claim.complete(&r.id).await.unwrap();
        }
    }
    let mut numbers: Vec<i64> = seen.iter().filter_map(|p| p["n"].as_i64()).collect();
    numbers.sort_unstable();
    assert_eq!(
        numbers,
        (0..40).collect::<Vec<_>>(),
        "every job once: {seen:?}"
    );
    assert_eq!(seen.len(), 41, "and the urgent one: {seen:?}");
    let urgent_at = urgent_at.expect("the urgent job was claimed");
    assert!(
        seen[urgent_at..]
            .iter()
            .any(|p| p["n"].as_i64().is_some_and(|n| n < 10)),
        "the urgent job came before some of the jobs given back: {seen:?}"
    );
    let left = "SELECT COUNT(*) FROM rowclaim_jobs WHERE status <> 'completed'";
    assert_eq!(t.count(left).await, 0);
}

/// A failed job runs again after its delay, keeping the error; after the last attempt it is dead.
async fn retries_and_dead(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    let job = q
        .enqueue(&NewJob::new(json!({})).max_attempts(2))
        .await
        .unwrap();
    let c = q.claimer(&[]).await.unwrap();
    let claim = c.claim(1, Duration::from_secs(30)).await.unwrap();
    let id = claim.rows()[0].id.clone();
    const DELAY: Duration = Duration::from_millis(300);
    let before = std::time::Instant::now();
    claim.retry(&id, DELAY, "boom 1").await.unwrap();
    // Claimed again only once due: a claim that finds it returns at least DELAY after the retry
    // was sent (the database's clock and ours run alike; 10 ms for its rounding). A loaded
    // machine may be slower than that, which proves less but never fails wrongly.
    let again = loop {
        let got = c.claim(1, Duration::from_secs(30)).await.unwrap();
        if !got.is_empty() {
            let after = before.elapsed();
            assert!(
                after + Duration::from_millis(10) >= DELAY,
                "claimed again {after:?} after a retry due in {DELAY:?}"
            );
            break got;
        }
        assert!(
            before.elapsed() < Duration::from_secs(60),
            "the job retried with a {DELAY:?} delay was not claimable again within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let run = Job::from_row(&again.rows()[0]).unwrap();
    assert_eq!((run.id, run.attempt), (job.id, 2));
    assert_eq!(again.rows()[0].data["last_error"], "boom 1");
    again.fail_with(&id, "boom 2").await.unwrap();
    assert_eq!(
        t.count(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'dead' AND last_error = 'boom 2'"
        )
        .await,
        1
    );

    assert!(q.retry(job.id).await.unwrap(), "a dead job can be retried");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'ready' AND attempts = 0")
            .await,
        1
    );
    assert!(q.cancel(job.id).await.unwrap());
    assert!(!q.cancel(job.id).await.unwrap(), "cancelled already");
    assert!(c
        .claim(1, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        q.prune(Duration::from_secs(3600)).await.unwrap(),
        0,
        "too recent"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(q.prune(Duration::from_millis(1)).await.unwrap(), 1);
}

/// Fails job `id` of queue `h` once more, as a handler's error would, ready again at once.
async fn fail_once(c: &rowclaim::Claimer, error: &str) {
    let mut claim = c.claim(1, Duration::from_secs(30)).await.unwrap();
    if claim.is_empty() {
        // A claim resumes after the last job it took, which is where a job retried within the
        // same millisecond sorts (SQLite's clock); one that comes back short starts over.
        claim = c.claim(1, Duration::from_secs(30)).await.unwrap();
    }
    assert_eq!(claim.len(), 1, "the job is due again at once");
    claim
        .retry(&claim.rows()[0].id, Duration::ZERO, error)
        .await
        .unwrap();
}

/// Every failed attempt is kept (the last 20), with its number, times and error; ready jobs
/// that failed before are counted as waiting for a retry.
async fn failed_attempts_kept(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    let job = q
        .enqueue(&NewJob::new(json!({})).queue("h").max_attempts(30))
        .await
        .unwrap();
    let c = q.claimer(&["h".to_owned()]).await.unwrap();
    for i in 1..=3 {
        fail_once(&c, &format!("boom {i}")).await;
    }
    // A fresh ready job beside it (not due, so that only the failing job is claimed).
    q.enqueue(
        &NewJob::new(json!({}))
            .queue("h")
            .delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    let got = q.get(job.id).await.unwrap().expect("the job");
    let seen: Vec<(Option<i64>, &str)> = got
        .errors
        .iter()
        .map(|a| (a.attempt, a.error.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (Some(1), "boom 1"),
            (Some(2), "boom 2"),
            (Some(3), "boom 3")
        ]
    );
    for a in &got.errors {
        let (started, ended) = (a.started_at.expect("started"), a.ended_at.expect("ended"));
        assert!(started <= ended, "{a:?}");
    }
    let stats = q.stats(Some("h")).await.unwrap();
    assert_eq!(stats.by_queue["h"]["ready"], 2);
    assert_eq!(
        stats.retrying.get("h"),
        Some(&1),
        "one of the two ready jobs failed before"
    );

    // Only the last 20 are kept, and an error is kept cut short.
    let long = "x".repeat(5000);
    for i in 4..=25 {
        let error = if i == 25 {
            long.clone()
        } else {
            format!("boom {i}")
        };
        fail_once(&c, &error).await;
    }
    let got = q.get(job.id).await.unwrap().expect("the job");
    let attempts: Vec<i64> = got.errors.iter().filter_map(|a| a.attempt).collect();
    assert_eq!(attempts, (6..=25).collect::<Vec<_>>());
    assert_eq!(got.errors[19].error.len(), 2000);
    assert_eq!(
        got.last_error.as_deref(),
        Some(long.as_str()),
        "the last error stays whole"
    );

    // A retry by hand starts the attempts again but keeps what happened.
    assert!(q.cancel(job.id).await.unwrap());
    assert!(q.retry(job.id).await.unwrap());
    let got = q.get(job.id).await.unwrap().expect("the job");
    assert_eq!((got.attempts, got.errors.len()), (0, 20));
    let stats = q.stats(Some("h")).await.unwrap();
    assert_eq!(
        stats.retrying.get("h"),
        None,
        "a job retried by hand starts afresh"
    );
}

/// Eight concurrent enqueues of one unique key make one job.
async fn unique_keys(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let db = t.db().await;
        tasks.push(tokio::spawn(async move {
            let job = NewJob::new(json!({"try": i})).unique_key("report:2026-11");
            db.queue().enqueue(&job).await.expect("enqueue")
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    assert_eq!(
        results.iter().filter(|e| !e.existing).count(),
        1,
        "{results:?}"
    );
    assert!(results.iter().all(|e| e.id == results[0].id), "{results:?}");
    // Once the job is finished, the key is free again.
    let c = q.claimer(&[]).await.unwrap();
    let claim = c.claim(1, Duration::from_secs(30)).await.unwrap();
    claim.complete(&claim.rows()[0].id).await.unwrap();
    let next = q
        .enqueue(&NewJob::new(json!({})).unique_key("report:2026-11"))
        .await
        .unwrap();
    assert!(!next.existing);
    assert_ne!(next.id, results[0].id);
}

/// Bulk enqueue is all or nothing.
async fn bulk(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    let jobs: Vec<NewJob> = (0..1200)
        .map(|i| NewJob::new(json!({ "i": i })).queue("bulk"))
        .collect();
    assert_eq!(q.enqueue_many(&jobs).await.unwrap(), 1200);
    let mut bad = jobs[..10].to_vec();
    bad.push(NewJob::new(json!({})).max_attempts(0));
    let err = q.enqueue_many(&bad).await.unwrap_err();
    assert!(err.to_string().contains("job 11"), "{err}");
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 1200);
    let stats = q.stats(Some("bulk")).await.unwrap();
    assert_eq!(stats.by_queue["bulk"]["ready"], 1200);
    assert!(stats.oldest_ready_secs.contains_key("bulk"), "{stats:?}");
    assert_eq!(
        stats.completed_last_minute.get("bulk"),
        None,
        "nothing completed yet"
    );
}

/// The stats that a dashboard and `/metrics` show, from one statement: counts by status, due
/// jobs apart from those scheduled later, the oldest due job's wait, expired leases and recent
/// completions, per queue.
async fn stats_per_queue(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    let later = Duration::from_secs(3600);
    let mut jobs: Vec<NewJob> = (0..3).map(|_| NewJob::new(json!({})).queue("a")).collect();
    jobs.extend((0..2).map(|_| NewJob::new(json!({})).queue("a").delay(later)));
    jobs.extend((0..2).map(|_| NewJob::new(json!({})).queue("b")));
    q.enqueue_many(&jobs).await.unwrap();
    // One job of b completed; one of a held under a lease that runs out.
    let b = q.claimer(&["b".into()]).await.unwrap();
    let done = b.claim(1, Duration::from_secs(60)).await.unwrap();
    done.complete(&done.rows()[0].id).await.unwrap();
    let a = q.claimer(&["a".into()]).await.unwrap();
    let held = a.claim(1, Duration::from_secs(1)).await.unwrap();
    assert_eq!(held.len(), 1);
    let mut stats = q.stats(None).await.unwrap();
    for _ in 0..120 {
        if stats.expired_leases.get("a") == Some(&1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        stats = q.stats(None).await.unwrap();
    }
    assert_eq!(stats.expired_leases.get("a"), Some(&1), "{stats:?}");
    assert_eq!(stats.by_queue["a"]["ready"], 4, "{stats:?}");
    assert_eq!(stats.by_queue["a"]["running"], 1, "{stats:?}");
    assert_eq!(
        stats.due.get("a"),
        Some(&2),
        "the 2 scheduled later are not due"
    );
    assert_eq!(stats.due.get("b"), Some(&1), "{stats:?}");
    assert_eq!(stats.completed_last_minute.get("b"), Some(&1), "{stats:?}");
    assert_eq!(stats.completed_last_minute.get("a"), None, "{stats:?}");
    assert_eq!(stats.expired_leases.get("b"), None, "{stats:?}");
    let oldest = stats.oldest_ready_secs["a"];
    assert!((0.0..3600.0).contains(&oldest), "{stats:?}");
    // One queue asked: only it.
    let only_b = q.stats(Some("b")).await.unwrap();
    assert_eq!(only_b.by_queue.keys().collect::<Vec<_>>(), ["b"]);
    assert!(only_b.oldest_ready_secs.contains_key("b"), "{only_b:?}");
}

/// A job enqueued in the caller's transaction exists only if it commits.
async fn in_transaction(t: Arc<TestDb>) {
    let (_db, _q) = ready_queue(&t).await;
    let job = NewJob::new(json!({"order": 7}));
    for commit in [false, true] {
        match t.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&t.url).await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                Queue::enqueue_postgres(&mut tx, &job).await.unwrap();
                if commit {
                    tx.commit().await.unwrap()
                } else {
                    tx.rollback().await.unwrap()
                }
            }
            #[cfg(feature = "mysql")]
            Backend::MySql => {
                let pool = sqlx::MySqlPool::connect(&t.url).await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                Queue::enqueue_mysql(&mut tx, &job).await.unwrap();
                if commit {
                    tx.commit().await.unwrap()
                } else {
                    tx.rollback().await.unwrap()
                }
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&t.url).await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                Queue::enqueue_sqlite(&mut tx, &job).await.unwrap();
                if commit {
                    tx.commit().await.unwrap()
                } else {
                    tx.rollback().await.unwrap()
                }
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("the case runs only for backends this build has"),
        }
        let expected = i64::from(commit);
        assert_eq!(
            t.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
            expected,
            "commit = {commit}"
        );
    }
}

/// Without init, the queue says what to do.
async fn not_initialised(t: Arc<TestDb>) {
    let db = t.db().await;
    let err = db.queue().claimer(&[]).await.unwrap_err();
    assert!(err.to_string().contains("rowclaim init"), "{err}");
}

/// Waits until every job is completed, dead or cancelled (bounded).
async fn all_settled(t: Arc<TestDb>) {
    for _ in 0..300 {
        let open = t
            .count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status IN ('ready', 'running')")
            .await;
        if open == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The library worker: handlers by kind, retries then dead, dead without a handler.
async fn worker_runs_handlers(t: Arc<TestDb>) {
    let (db, q) = ready_queue(&t).await;
    let mut jobs: Vec<NewJob> = (0..60)
        .map(|i| NewJob::new(json!({ "i": i })).kind("ok"))
        .collect();
    jobs.extend((0..3).map(|_| NewJob::new(json!({})).kind("flaky").max_attempts(2)));
    jobs.extend((0..2).map(|_| NewJob::new(json!({})).kind("mystery")));
    q.enqueue_many(&jobs).await.unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let report = rowclaim::Worker::new(&db)
        .handle("ok", move |job| {
            let seen = seen2.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push(job.payload["i"].as_i64().unwrap());
                Ok::<_, String>(())
            }
        })
        .handle("flaky", |_job| async { Err::<(), _>("nope") })
        .concurrency(4)
        .poll(Duration::from_millis(100))
        .run(all_settled(t.clone()))
        .await
        .unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, (0..60).collect::<Vec<i64>>(), "each ok job ran once");
    assert_eq!(
        (report.completed, report.retried, report.dead),
        (60, 3, 5),
        "{report:?}"
    );
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'dead' AND last_error = 'nope' AND attempts = 2").await, 3);
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'dead' AND last_error LIKE 'no handler%'").await, 2);
}

/// Shutdown lets running jobs finish within the grace period, and gives back what outlasts it.
async fn worker_shutdown(t: Arc<TestDb>) {
    let (db, q) = ready_queue(&t).await;
    for grace_ms in [5000u64, 100] {
        q.enqueue_many(&[NewJob::new(json!({})), NewJob::new(json!({}))])
            .await
            .unwrap();
        // The stop comes once both jobs run, not after a fixed time: on a loaded machine the
        // first claim may answer late, and rows that never started go back as they should.
        let started = Arc::new(tokio::sync::Semaphore::new(0));
        let both_started = {
            let started = started.clone();
            // Bounded: should the jobs never start, the stop comes and the assertions say so.
            async move {
                let _ =
                    tokio::time::timeout(Duration::from_secs(60), started.acquire_many(2)).await;
            }
        };
        let report = rowclaim::Worker::new(&db)
            .handle_any(move |_job| {
                let started = started.clone();
                async move {
                    started.add_permits(1);
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    Ok::<_, String>(())
                }
            })
            .concurrency(2)
            .grace(Duration::from_millis(grace_ms))
            .run(both_started)
            .await
            .unwrap();
        if grace_ms == 5000 {
            assert_eq!((report.completed, report.released), (2, 0), "{report:?}");
        } else {
            assert_eq!((report.completed, report.released), (0, 2), "{report:?}");
            assert_eq!(
                t.count(
                    "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'ready' AND owner IS NULL"
                )
                .await,
                2
            );
        }
    }
}

macro_rules! queue_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn init_is_idempotent_and_concurrent() {
            with_db($backend, init_concurrently).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn due_jobs_by_queue_and_priority() {
            with_db($backend, claim_due_jobs).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn claims_find_jobs_behind_where_they_resume() {
            with_db($backend, claims_find_jobs_behind_them).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn retries_then_dead_then_admin() {
            with_db($backend, retries_and_dead).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn failed_attempts_are_kept_and_counted() {
            with_db($backend, failed_attempts_kept).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn unique_key_under_concurrent_enqueue() {
            with_db($backend, unique_keys).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bulk_enqueue_all_or_nothing() {
            with_db($backend, bulk).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stats_per_queue_in_one_statement() {
            with_db($backend, stats_per_queue).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn enqueue_in_callers_transaction() {
            with_db($backend, in_transaction).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn worker_handlers_retries_and_dead() {
            with_db($backend, worker_runs_handlers).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn worker_graceful_shutdown() {
            with_db($backend, worker_shutdown).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn claim_before_init_says_init() {
            with_db($backend, not_initialised).await
        }
    };
}

#[cfg(feature = "postgres")]
/// With `async_commit`, claims run in sessions that do not wait for the WAL flush, while enqueue,
/// the counter and admin changes still work (they ask for a durable commit in their own
/// transaction). The claim's filter reads the session's setting, so a claim finds the row only
/// when the setting took.
async fn async_commit_sessions(t: Arc<TestDb>) {
    let opts = rowclaim::ConnectOptions::default()
        .max_connections(2)
        .async_commit(true);
    let db = Db::connect_with(&t.url, opts).await.expect("connect");
    let q = db.queue();
    q.init().await.expect("init");
    let id = q
        .enqueue(&NewJob::new(json!({"n": 1})))
        .await
        .expect("enqueue")
        .id;
    assert!(q.cancel(id).await.expect("cancel"));
    assert_eq!(db.next_counter_value("c").await.expect("counter"), 1);
    t.exec(
        "CREATE TABLE work (id bigint PRIMARY KEY, status text NOT NULL, owner text, \
         lease_until timestamptz); INSERT INTO work VALUES (1, 'ready', NULL, NULL)",
    )
    .await;
    let source = || {
        rowclaim::Source::new("work")
            .owner_column("owner")
            .lease_column("lease_until")
            .filter("current_setting('synchronous_commit') = 'off'")
    };
    // The default pool waits for the flush: the filter finds nothing there.
    let plain = t.db().await;
    let plain = plain
        .claimer(source(), rowclaim::Strategy::SkipLocked)
        .await
        .expect("claimer");
    assert!(plain
        .claim(5, Duration::from_secs(30))
        .await
        .expect("claim")
        .is_empty());
    let claimer = db
        .claimer(source(), rowclaim::Strategy::SkipLocked)
        .await
        .expect("claimer");
    let claim = claimer
        .claim(5, Duration::from_secs(30))
        .await
        .expect("claim");
    assert_eq!(
        claim.len(),
        1,
        "the claim ran with synchronous_commit = off"
    );
    claim.complete(&claim.rows()[0].id).await.expect("complete");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM work WHERE status = 'done'")
            .await,
        1
    );
}

#[cfg(feature = "postgres")]
mod postgres {
    queue_cases!(Backend::Postgres);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_commit_claims_and_durable_enqueues() {
        with_db(Backend::Postgres, super::async_commit_sessions).await
    }
}
#[cfg(feature = "sqlite")]
mod sqlite {
    queue_cases!(Backend::Sqlite);
}
#[cfg(feature = "mysql")]
mod mysql {
    queue_cases!(Backend::MySql);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_migration_step_runs_again() {
        with_db(Backend::MySql, super::migration_steps_run_again).await
    }
}

/// MySQL commits DDL at once: an init that stopped after a step and before its version's
/// record runs that step again. Run again from version 0, every step must pass and leave the
/// schema as it was (MySQL 8 has no `IF NOT EXISTS` for columns and keys: a step's "made
/// already" error counts as done).
#[cfg(feature = "mysql")]
async fn migration_steps_run_again(t: Arc<TestDb>) {
    t.db().await.queue().init().await.expect("init");
    let schema = "SELECT CONCAT(TABLE_NAME, '.', COLUMN_NAME, ' ', COLUMN_TYPE, ' ', \
         COALESCE(GENERATION_EXPRESSION, '')) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() \
         UNION ALL SELECT CONCAT(TABLE_NAME, ' key ', INDEX_NAME, ' ', SEQ_IN_INDEX, ' ', \
         COLUMN_NAME, ' ', NON_UNIQUE, ' ', COALESCE(COLLATION, '')) \
         FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() \
         ORDER BY 1";
    let versions = "SELECT CONCAT(component, ' ', version) FROM rowclaim_schema ORDER BY 1";
    let (before, at) = (t.strings(schema).await, t.strings(versions).await);
    assert!(before.len() > 30, "{before:?}");
    assert!(before.iter().all(Option::is_some), "{before:?}");
    t.exec("UPDATE rowclaim_schema SET version = 0").await;
    t.db()
        .await
        .queue()
        .init()
        .await
        .expect("init again from version 0");
    assert_eq!(t.strings(schema).await, before);
    assert_eq!(t.strings(versions).await, at);
}
