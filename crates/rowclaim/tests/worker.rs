//! The worker runtime on real databases: a panicking or hung handler fails its job and the job
//! runs again; a cancelled or taken-over row's job is stopped while the rest go on; shutdown
//! gives rows back; a handler that cannot run stops the worker. (Database outages are in the
//! CLI crate's fault suite, on private servers.)

use rowclaim_testkit as common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use rowclaim::{Db, Error, NewJob, Queue, Source, Strategy, TaskResult, Worker};
use serde_json::json;

async fn queue(t: &TestDb) -> (Db, Queue) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    (db, q)
}

/// Resolves once `sql` counts `want` (polled; gives up after a minute so a failing test ends).
async fn until_count(t: Arc<TestDb>, sql: &'static str, want: i64) {
    for _ in 0..600 {
        if t.count(sql).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Resolves once `flag` is set (bounded like [`until_count`]).
async fn until_set(flag: Arc<AtomicBool>) {
    for _ in 0..600 {
        if flag.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sets its flag when dropped: tells that the runtime dropped a handler's future.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn own_table() -> Source {
    Source::new("jobs")
        .owner_column("owner")
        .lease_column("lease_until")
        .attempts_column("attempts")
}

/// A claimer of the harness's `jobs` table, on a pool of its own.
async fn own_claimer(t: &TestDb) -> rowclaim::Claimer {
    t.db()
        .await
        .claimer(own_table(), Strategy::Auto)
        .await
        .expect("a claimer of jobs")
}

/// Resolves once `counter` reaches `n` (bounded like [`until_count`]).
async fn until_at_least(counter: &AtomicUsize, n: usize) {
    for _ in 0..3000 {
        if counter.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A handler that panics fails its job, which runs again after the backoff; the worker goes on
/// with other jobs. On an own table the row ends failed.
async fn panics(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    let flaky = q
        .enqueue(&NewJob::new(json!({})).kind("flaky"))
        .await
        .unwrap()
        .id;
    q.enqueue_many(
        &(0..5)
            .map(|i| NewJob::new(json!({ "i": i })))
            .collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    let report = Worker::new(&db)
        .handle("flaky", |job| async move {
            if job.attempt == 1 {
                panic!("boom on the first run");
            }
            Ok::<_, String>(())
        })
        .handle_any(|_job| async { Ok::<_, String>(()) })
        .concurrency(2)
        .poll(Duration::from_millis(100))
        .run(until_count(
            t.clone(),
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'",
            6,
        ))
        .await
        .expect("the worker survives a panic");
    assert_eq!((report.completed, report.retried), (6, 1), "{report:?}");
    let sql = format!(
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {flaky} AND status = 'completed' \
         AND attempts = 2 AND last_error LIKE 'panicked: boom on the first run%'"
    );
    assert_eq!(
        t.count(&sql).await,
        1,
        "the panic was its first run's error"
    );

    t.jobs(3).await;
    let claimer = own_claimer(&t).await;
    let report = Worker::for_claimer(claimer)
        .handle_rows(|row| async move {
            if row.id.to_string() == "2" {
                panic!("row two");
            }
            Ok::<_, String>(())
        })
        .until_empty(true)
        .run(std::future::pending())
        .await
        .unwrap();
    assert_eq!((report.completed, report.failed), (2, 1), "{report:?}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE id = 2 AND status = 'failed'")
            .await,
        1
    );
}

/// A hung job is stopped at its time limit (its future dropped), fails with "timed out", and
/// runs again; a job's own limit wins over the worker's.
async fn timeouts(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    q.enqueue(&NewJob::new(json!({})).kind("hangs"))
        .await
        .unwrap();
    q.enqueue(
        &NewJob::new(json!({}))
            .kind("hangs")
            .timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    let report = Worker::new(&db)
        .handle("hangs", move |job| {
            let d = d.clone();
            async move {
                if job.attempt == 1 {
                    struct Count(Arc<AtomicUsize>);
                    impl Drop for Count {
                        fn drop(&mut self) {
                            self.0.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    let _guard = Count(d);
                    std::future::pending::<()>().await;
                }
                Ok::<_, String>(())
            }
        })
        .timeout(Duration::from_secs(1))
        .concurrency(2)
        .poll(Duration::from_millis(100))
        .run(until_count(
            t.clone(),
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed' AND attempts = 2",
            2,
        ))
        .await
        .unwrap();
    assert_eq!((report.completed, report.retried), (2, 2), "{report:?}");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        2,
        "both hung runs were dropped"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE last_error = 'timed out after 1s'")
            .await,
        1
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE last_error = 'timed out after 300ms'")
            .await,
        1,
        "the job's own limit"
    );
}

/// Cancelling a running job stops it at the next heartbeat; the job stays cancelled.
async fn cancel_running(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    let id = q.enqueue(&NewJob::new(json!({}))).await.unwrap().id;
    let (started, dropped) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (s, d) = (started.clone(), dropped.clone());
    let worker = Worker::new(&db)
        .handle_any(move |_job| {
            let (s, d) = (s.clone(), d.clone());
            async move {
                let _guard = Dropped(d);
                s.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok::<_, String>(())
            }
        })
        .lease(Duration::from_millis(1500));
    let cancel = {
        let (q, started, dropped) = (q.clone(), started.clone(), dropped.clone());
        async move {
            until_set(started).await;
            assert!(q.cancel(id).await.unwrap(), "the running job was cancelled");
            until_set(dropped).await;
        }
    };
    let report = worker.run(cancel).await.unwrap();
    assert!(
        dropped.load(Ordering::SeqCst),
        "the cancelled job was stopped"
    );
    assert_eq!((report.lost, report.completed), (1, 0), "{report:?}");
    let sql =
        format!("SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {id} AND status = 'cancelled'");
    assert_eq!(t.count(&sql).await, 1);
}

/// Two rows claimed together; another claimer takes one of them over. The heartbeat finds that
/// row lost and stops its job, without touching the row; the other row goes on and completes.
async fn one_row_of_a_claim_lost(t: Arc<TestDb>) {
    t.jobs(2).await;
    let claimer = own_claimer(&t).await;
    let started = Arc::new(AtomicUsize::new(0));
    let one_dropped = Arc::new(AtomicBool::new(false));
    let (s, d) = (started.clone(), one_dropped.clone());
    let worker = Worker::for_claimer(claimer)
        .handle_rows(move |row| {
            let (s, d) = (s.clone(), d.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                if row.id.to_string() == "1" {
                    let _guard = Dropped(d);
                    std::future::pending::<()>().await;
                } else {
                    // Outlives several heartbeats.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                Ok::<_, String>(())
            }
        })
        .concurrency(2)
        .lease(Duration::from_millis(1500));
    let thief = {
        let (t, started) = (t.clone(), started.clone());
        async move {
            until_at_least(&started, 2).await;
            // What another claimer does after the lease expired: the row is its own now, for
            // an hour.
            let later = match t.backend {
                Backend::Postgres => "now() + interval '1 hour'",
                Backend::MySql => "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR",
                Backend::Sqlite => "CAST(unixepoch('subsec') * 1000 AS INTEGER) + 3600000",
            };
            t.exec(&format!(
                "UPDATE jobs SET owner = 'another-claimer', lease_until = {later} WHERE id = 1"
            ))
            .await;
        }
    };
    let done = async {
        thief.await;
        until_set(one_dropped.clone()).await;
        until_count(
            t.clone(),
            "SELECT COUNT(*) FROM jobs WHERE id = 2 AND status = 'done'",
            1,
        )
        .await;
    };
    let report = worker.run(done).await.unwrap();
    assert!(
        one_dropped.load(Ordering::SeqCst),
        "the lost row's job was stopped"
    );
    assert_eq!((report.lost, report.completed), (1, 1), "{report:?}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE id = 1 AND status = 'claimed' AND owner = 'another-claimer'")
            .await,
        1,
        "the taken-over row is left to its new holder"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE id = 2 AND status = 'done'")
            .await,
        1
    );
}

/// Results are written in batches, fenced row by row: three jobs of one claim end together and
/// their results go to the database together; the one row another claimer took over meanwhile
/// is refused, the other two complete.
async fn batched_results_fenced_per_row(t: Arc<TestDb>) {
    fenced_batch(t, 3).await
}

/// The same with twelve rows: a batch SQLite counts rather than names row by row (the count
/// finds one row missing, and the batch is named row by row after all).
async fn a_large_batch_fenced_per_row(t: Arc<TestDb>) {
    fenced_batch(t, 12).await
}

/// `jobs` rows start at once; one of them is taken over by another claimer; all end together.
async fn fenced_batch(t: Arc<TestDb>, jobs: i64) {
    t.jobs(jobs).await;
    let go = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(AtomicUsize::new(0));
    let (g, s) = (go.clone(), started.clone());
    let worker = Worker::for_claimer(own_claimer(&t).await)
        .handle_rows(move |_row| {
            let (g, s) = (g.clone(), s.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                g.notified().await;
                Ok::<_, String>(())
            }
        })
        .concurrency(jobs as usize)
        // No heartbeat before the results: the refusal comes from the batch itself.
        .lease(Duration::from_secs(120))
        .settle_delay(Duration::from_millis(200));
    let run = {
        let t = t.clone();
        async move {
            until_at_least(&started, jobs as usize).await;
            let later = match t.backend {
                Backend::Postgres => "now() + interval '1 hour'",
                Backend::MySql => "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR",
                Backend::Sqlite => "CAST(unixepoch('subsec') * 1000 AS INTEGER) + 3600000",
            };
            t.exec(&format!(
                "UPDATE jobs SET owner = 'another-claimer', lease_until = {later} WHERE id = 2"
            ))
            .await;
            go.notify_waiters();
            let done = jobs - 1;
            until_count(
                t.clone(),
                "SELECT COUNT(*) FROM jobs WHERE status = 'done'",
                done,
            )
            .await;
        }
    };
    let report = worker.run(run).await.unwrap();
    assert_eq!(
        (report.completed, report.lost),
        (jobs as u64 - 1, 1),
        "{report:?}"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE id = 2 AND status = 'claimed' AND owner = 'another-claimer'")
            .await,
        1,
        "the taken-over row is untouched"
    );
}

/// With `Retention::Delete` a completed job is gone at once; a failed one stays to be retried.
async fn completed_jobs_deleted(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    q.enqueue_many(
        &(0..20)
            .map(|i| NewJob::new(json!({ "i": i })))
            .collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    q.enqueue(&NewJob::new(json!({})).kind("fails"))
        .await
        .unwrap();
    let report = Worker::new(&db)
        .handle("fails", |_job| async { Err::<(), _>("no") })
        .handle_any(|_job| async { Ok::<_, String>(()) })
        .retention(rowclaim::Retention::Delete)
        .concurrency(4)
        .prefetch(8)
        .poll(Duration::from_millis(100))
        .run(until_count(
            t.clone(),
            "SELECT COUNT(*) FROM rowclaim_jobs",
            1,
        ))
        .await
        .unwrap();
    assert_eq!((report.completed, report.retried), (20, 1), "{report:?}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'ready' AND last_error = 'no'")
            .await,
        1,
        "the failed job is kept for its retry"
    );
}

/// Runs `jobs` jobs of `kind` with the default prefetch at concurrency 2, each taking `takes`;
/// returns the most rows the worker held claimed at once, as its handlers saw them (every
/// `every`th job counts the claimed rows).
async fn most_held(t: &Arc<TestDb>, kind: &str, jobs: usize, takes: Duration, every: usize) -> i64 {
    let (db, q) = queue(t).await;
    let new: Vec<_> = (0..jobs)
        .map(|i| NewJob::new(json!({ "i": i })).kind(kind))
        .collect();
    q.enqueue_many(&new).await.unwrap();
    let most = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (t, most, seen) = (t.clone(), most.clone(), seen.clone());
        move |_job| {
            let (t, most, seen) = (t.clone(), most.clone(), seen.clone());
            async move {
                tokio::time::sleep(takes).await;
                if seen.fetch_add(1, Ordering::SeqCst) % every == every - 1 {
                    let held = t
                        .count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'running'")
                        .await;
                    most.fetch_max(held, Ordering::SeqCst);
                }
                Ok::<_, String>(())
            }
        }
    };
    let report = Worker::new(&db)
        .handle(kind, handler)
        .concurrency(2)
        .poll(Duration::from_millis(100))
        .until_empty(true)
        .run(std::future::pending())
        .await
        .unwrap();
    assert_eq!(report.completed, jobs as u64, "{report:?}");
    most.load(Ordering::SeqCst)
}

/// Without a prefetch a worker claims ahead about a second of work: short jobs come in claims of
/// hundreds, far more rows than its slots; jobs of a quarter second a few rows ahead, so that
/// one worker does not keep them from others.
async fn default_prefetch_follows_the_jobs(t: Arc<TestDb>) {
    let short = most_held(&t, "short", 3000, Duration::ZERO, 250).await;
    assert!(
        short > 100,
        "short jobs: at most {short} rows held at once; claims of hundreds expected"
    );
    // 2 slots × 1 s / 250 ms = 8 rows ahead, 2 running: 10, and a claim's rounding.
    let long = most_held(&t, "long", 24, Duration::from_millis(250), 1).await;
    assert!(
        (1..=12).contains(&long),
        "jobs of 250 ms: {long} rows held at once; about 10 expected"
    );
}

/// `Shutdown::now` stops running jobs at once and gives their rows back; rows claimed ahead
/// and never started go back too.
async fn shutdown_now(t: Arc<TestDb>) {
    t.jobs(5).await;
    let claimer = own_claimer(&t).await;
    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let worker = Worker::for_claimer(claimer)
        .handle_rows(move |_row| {
            let s = s.clone();
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok::<_, String>(())
            }
        })
        .concurrency(2)
        .prefetch(3)
        .grace(Duration::from_secs(60));
    let stop = worker.shutdown_handle();
    let holder = t.clone();
    let stopper = async move {
        until_at_least(&started, 2).await;
        // Every row held (two running, three waiting) before the drain: a claim may come back
        // with fewer rows than it asked for, and the one that takes the rest follows it.
        for _ in 0..3000 {
            let held = "SELECT COUNT(*) FROM jobs WHERE owner IS NOT NULL";
            if holder.count(held).await >= 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.drain();
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.now();
    };
    let (report, ()) = tokio::join!(worker.run(std::future::pending()), stopper);
    let report = report.unwrap();
    assert!(report.interrupted);
    assert_eq!((report.released, report.completed), (5, 0), "{report:?}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready' AND owner IS NULL")
            .await,
        5
    );
    // The rows that never started keep their attempt; the two that ran used one each.
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE attempts = 0")
            .await,
        3,
        "rows given back unstarted lost an attempt"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE attempts = 1")
            .await,
        2
    );
}

/// A handler that cannot run at all stops the worker with that error; the row goes back.
async fn abort(t: Arc<TestDb>) {
    t.jobs(1).await;
    let claimer = own_claimer(&t).await;
    struct CannotRun;
    impl rowclaim::Handler for CannotRun {
        fn run(&self, _task: rowclaim::Task) -> rowclaim::TaskFuture {
            Box::pin(async { TaskResult::Abort("no such program".into()) })
        }
    }
    let err = Worker::for_claimer(claimer)
        .handler(CannotRun)
        .run(std::future::pending())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::HandlerAborted(ref m) if m == "no such program"),
        "{err}"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready' AND owner IS NULL")
            .await,
        1
    );
}

/// A handler's output is kept with its job; a snooze runs the job again later without using an
/// attempt; on a table of your own a snooze gives the row back with its attempt refunded.
async fn output_and_snooze(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    let out = q
        .enqueue(&NewJob::new(json!({"n": 2})).kind("double"))
        .await
        .unwrap()
        .id;
    let later = q
        .enqueue(&NewJob::new(json!({})).kind("later").max_attempts(1))
        .await
        .unwrap()
        .id;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let report = Worker::new(&db)
        .handle("double", |job| async move {
            Ok::<_, String>(json!({ "twice": job.payload["n"].as_i64().unwrap_or(0) * 2 }))
        })
        .handle("later", move |_job| {
            let r = r.clone();
            async move {
                // The first run asks to run again in a moment: it has one attempt only, so a
                // snooze that used it would leave the job dead instead of run.
                Ok::<_, String>(if r.fetch_add(1, Ordering::SeqCst) == 0 {
                    TaskResult::Snooze(Duration::from_millis(300))
                } else {
                    TaskResult::Done
                })
            }
        })
        .poll(Duration::from_millis(100))
        .until_empty(true)
        .wait_scheduled(true)
        .run(std::future::pending())
        .await
        .unwrap();
    assert_eq!((report.completed, report.snoozed), (2, 1), "{report:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let done = q.get(out).await.unwrap().expect("the job");
    assert_eq!(done.output, Some(json!({"twice": 4})), "{done:?}");
    let snoozed = q.get(later).await.unwrap().expect("the job");
    assert_eq!(snoozed.status, "completed", "{snoozed:?}");
    assert_eq!(
        snoozed.attempts, 1,
        "the snooze used no attempt: {snoozed:?}"
    );
    assert_eq!(snoozed.output, None);

    // A row of your own table waits out its snooze in its lease column, claimed by nobody, its
    // attempt taken back; then it is claimed again as a row whose lease ended.
    t.jobs(1).await;
    let claimer = own_claimer(&t).await;
    let own_runs = Arc::new(AtomicUsize::new(0));
    let r = own_runs.clone();
    let report = Worker::for_claimer(claimer)
        .handle_rows(move |_row| {
            let r = r.clone();
            async move {
                Ok::<_, String>(if r.fetch_add(1, Ordering::SeqCst) == 0 {
                    TaskResult::Snooze(Duration::from_millis(1500))
                } else {
                    TaskResult::Done
                })
            }
        })
        .poll(Duration::from_millis(100))
        .until_empty(true)
        .run(std::future::pending())
        .await
        .unwrap();
    assert_eq!((report.completed, report.snoozed), (1, 1), "{report:?}");
    assert_eq!(own_runs.load(Ordering::SeqCst), 2);
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done' AND attempts = 1")
            .await,
        1,
        "two runs, one attempt"
    );
}

/// A paused queue: jobs claimed ahead go back without a run (and without using an attempt)
/// while the running one finishes; nothing of it is claimed until it is resumed; other queues
/// go on meanwhile.
async fn pause_and_resume(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    let jobs: Vec<NewJob> = (0..11)
        .map(|i| NewJob::new(json!({ "i": i })).queue("p"))
        .collect();
    q.enqueue_many(&jobs).await.unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let others = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(tokio::sync::Notify::new());
    let (s, o, g) = (started.clone(), others.clone(), go.clone());
    let worker = Worker::new(&db)
        .queue("p")
        .queue("other")
        .handle_any(move |job| {
            let (s, o, g) = (s.clone(), o.clone(), g.clone());
            async move {
                if job.queue == "other" {
                    o.fetch_add(1, Ordering::SeqCst);
                    return Ok::<_, String>(());
                }
                // The first job of p waits to be let go: the rest wait, claimed ahead.
                if s.fetch_add(1, Ordering::SeqCst) == 0 {
                    g.notified().await;
                }
                Ok(())
            }
        })
        .concurrency(1)
        .prefetch(10)
        // Heartbeats, and so looks at the paused queues, every second.
        .lease(Duration::from_secs(3))
        .poll(Duration::from_millis(100));
    let stop = worker.shutdown_handle();
    let steps = async {
        until_at_least(&started, 1).await;
        assert_eq!(
            t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'running'")
                .await,
            11,
            "one running, ten claimed ahead"
        );
        assert!(q.pause("p").await.unwrap(), "it was running");
        assert!(!q.pause("p").await.unwrap(), "paused already");
        // The ten claimed ahead go back, unrun, their attempt refunded.
        until_count(
            t.clone(),
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'p' AND status = 'ready' \
             AND attempts = 0",
            10,
        )
        .await;
        go.notify_one();
        // Other queues go on; a job of p enqueued now is not claimed either.
        q.enqueue(&NewJob::new(json!({"late": true})).queue("p"))
            .await
            .unwrap();
        q.enqueue_many(
            &(0..5)
                .map(|i| NewJob::new(json!({ "o": i })).queue("other"))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
        until_at_least(&others, 5).await;
        until_count(
            t.clone(),
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'p' AND status = 'completed'",
            1,
        )
        .await;
        assert_eq!(started.load(Ordering::SeqCst), 1, "nothing of p ran paused");
        assert_eq!(
            t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'p' AND status = 'ready'")
                .await,
            11
        );
        let settings = q.settings().await.unwrap();
        assert!(
            settings
                .iter()
                .any(|s| s.name == "p" && s.paused_at.is_some()),
            "{settings:?}"
        );
        assert!(q.resume("p").await.unwrap());
        assert!(!q.resume("p").await.unwrap(), "running already");
        until_count(
            t.clone(),
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'p' AND status = 'completed' \
             AND attempts = 1",
            12,
        )
        .await;
        stop.drain();
    };
    let (report, ()) = tokio::join!(worker.run(std::future::pending()), steps);
    let report = report.unwrap();
    assert_eq!(report.completed, 17, "{report:?}");
    assert_eq!(started.load(Ordering::SeqCst), 12, "each job of p ran once");
    assert!(q.settings().await.unwrap().is_empty(), "no queue is paused");
}

macro_rules! worker_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_panicking_handler_fails_its_job_which_runs_again() {
            with_db($backend, panics).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_hung_job_is_stopped_at_its_time_limit() {
            with_db($backend, timeouts).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_cancelled_running_job_is_stopped() {
            with_db($backend, cancel_running).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_row_taken_over_is_stopped_and_the_rest_go_on() {
            with_db($backend, one_row_of_a_claim_lost).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn results_are_batched_and_fenced_row_by_row() {
            with_db($backend, batched_results_fenced_per_row).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_large_batch_is_fenced_row_by_row() {
            with_db($backend, a_large_batch_fenced_per_row).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn completed_jobs_can_be_deleted() {
            with_db($backend, completed_jobs_deleted).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_now_gives_every_row_back() {
            with_db($backend, shutdown_now).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_handler_that_cannot_run_stops_the_worker() {
            with_db($backend, abort).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn output_is_kept_and_a_snooze_uses_no_attempt() {
            with_db($backend, output_and_snooze).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_paused_queue_runs_nothing_until_resumed() {
            with_db($backend, pause_and_resume).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_default_prefetch_follows_how_long_jobs_take() {
            with_db($backend, default_prefetch_follows_the_jobs).await
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    worker_cases!(Backend::Postgres);
}
#[cfg(feature = "mysql")]
mod mysql {
    worker_cases!(Backend::MySql);
}
#[cfg(feature = "sqlite")]
mod sqlite {
    worker_cases!(Backend::Sqlite);
}

/// Settings that cannot work are refused before anything is claimed.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_are_refused() {
    with_db(Backend::Sqlite, |t: Arc<TestDb>| async move {
        let (db, _) = queue(&t).await;
        let ok = || Worker::new(&db).handle_any(|_job| async { Ok::<_, String>(()) });
        for (worker, says) in [
            (ok().concurrency(0), "concurrency"),
            (ok().batch(0), "batch"),
            (ok().timeout(Duration::ZERO), "timeout"),
            (ok().lease(Duration::ZERO), "lease"),
            (Worker::new(&db), "no handler"),
        ] {
            let err = worker.run(std::future::pending()).await.unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        t.jobs(1).await;
        let claimer = db.claimer(own_table(), Strategy::Auto).await.unwrap();
        let err = Worker::for_claimer(claimer)
            .handle_any(|_job| async { Ok::<_, String>(()) })
            .run(std::future::pending())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("handle_rows"), "{err}");
    })
    .await;
}

/// A result whose answer never came in time (the settle ran on at the server, slowed down by a
/// trigger past the try's time limit, and committed) is tried again; the retry finds the row
/// done under this claim's token and counts it done, not "unconfirmed".
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn slow_settle_counts_done(t: Arc<TestDb>) {
    t.jobs(4).await;
    match t.backend {
        Backend::Postgres => {
            t.exec(
                "CREATE FUNCTION slow_done() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF NEW.id = 1 AND NEW.status = 'done' AND OLD.status <> 'done' THEN \
                 PERFORM pg_sleep(3); END IF; RETURN NEW; END $$",
            )
            .await;
            t.exec(
                "CREATE TRIGGER slow_done BEFORE UPDATE ON jobs FOR EACH ROW \
                 EXECUTE FUNCTION slow_done()",
            )
            .await;
        }
        _ => {
            t.exec(
                "CREATE TRIGGER slow_done BEFORE UPDATE ON jobs FOR EACH ROW BEGIN \
                 IF NEW.id = 1 AND NEW.status = 'done' AND OLD.status <> 'done' THEN DO SLEEP(3); \
                 END IF; END",
            )
            .await;
        }
    }
    let claimer = t
        .db()
        .await
        .claimer(own_table(), Strategy::Token)
        .await
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    // A lease of 6 s: one try of a result may take 2 s, so the 3 s settle is cut off once.
    let report = Worker::for_claimer(claimer)
        .handle_rows(move |_row| {
            r.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, String>(()) }
        })
        .concurrency(4)
        .lease(Duration::from_secs(6))
        .until_empty(true)
        .run(std::future::pending())
        .await
        .unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 4, "no row ran twice");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        4
    );
    assert_eq!(
        (
            report.completed,
            report.unconfirmed,
            report.lost,
            report.given_up
        ),
        (4, 0, 0, 0),
        "{report:?}"
    );
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_cut_off_but_recorded_counts_done_postgres() {
    with_db(Backend::Postgres, slow_settle_counts_done).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_cut_off_but_recorded_counts_done_mysql() {
    with_db(Backend::MySql, slow_settle_counts_done).await;
}
