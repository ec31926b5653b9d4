//! What becomes of the rows a worker holds: completed jobs deleted, the default prefetch,
//! shutdown, output and snooze, a paused queue.

use super::*;

/// With `Retention::Delete` a completed job is gone at once; a failed one stays to be retried.
pub(super) async fn completed_jobs_deleted(t: Arc<TestDb>) {
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
        // Until only the failed job is left, its failure recorded: with the other jobs gone
        // alone, the worker could stop while it still held the failing job (then released).
        .run(until_count(
            t.clone(),
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'ready' AND last_error = 'no' \
             AND (SELECT COUNT(*) FROM rowclaim_jobs) = 1",
            1,
        ))
        .await
        .unwrap();
    // At least one retry: on a slow machine the failed job may come due again (its retry waits
    // about a second) and fail once more before the worker stops.
    assert_eq!(report.completed, 20, "{report:?}");
    assert!(report.retried >= 1, "{report:?}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'ready' AND last_error = 'no'")
            .await,
        1,
        "the failed job is kept for its retry"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
        1,
        "the completed jobs are gone"
    );
}

/// Runs `jobs` jobs of `kind` with the default prefetch at concurrency 2, each taking `takes`;
/// returns the most rows the worker held claimed at once, as its handlers saw them (every
/// `every`th job counts the claimed rows).
pub(super) async fn most_held(
    t: &Arc<TestDb>,
    kind: &str,
    jobs: usize,
    takes: Duration,
    every: usize,
) -> i64 {
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
pub(super) async fn default_prefetch_follows_the_jobs(t: Arc<TestDb>) {
    let short = most_held(&t, "short", 3000, Duration::ZERO, 250).await;
    assert!(
        short > 100,
        "short jobs: at most {short} rows held at once; claims of hundreds expected"
    );
    // 2 slots × 1 s / 250 ms = 8 rows ahead, 2 running: 10, and a claim's rounding. The rows
    // counted as running also hold jobs finished whose results are not yet written (a claim
    // looks past up to 10 of those), so up to 20 on a slow machine; a prefetch blind to how
    // long jobs take holds all 40.
    let long = most_held(&t, "long", 40, Duration::from_millis(250), 1).await;
    assert!(
        (1..=20).contains(&long),
        "jobs of 250 ms: {long} rows held at once; about 10 expected"
    );
}

/// `Shutdown::now` stops running jobs at once and gives their rows back; rows claimed ahead
/// and never started go back too.
pub(super) async fn shutdown_now(t: Arc<TestDb>) {
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

/// A handler's output is kept with its job; a snooze runs the job again later without using an
/// attempt; on a table of your own a snooze gives the row back with its attempt refunded.
pub(super) async fn output_and_snooze(t: Arc<TestDb>) {
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
pub(super) async fn pause_and_resume(t: Arc<TestDb>) {
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
        // Heartbeats, and so looks at the paused queues, every 3 s; each renewal has 6 s to
        // spare (a renewal stalled past a shorter lease's end gave every row up).
        .lease(Duration::from_secs(9))
        .poll(Duration::from_millis(100));
    let stop = worker.shutdown_handle();
    let steps = async {
        until_at_least(&started, 1).await;
        // One running, ten claimed ahead (a claim may come back with fewer rows than it asked
        // for, and the one that takes the rest follows it).
        until_count(
            t.clone(),
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'running'",
            11,
        )
        .await;
        assert_eq!(started.load(Ordering::SeqCst), 1, "the first still runs");
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
