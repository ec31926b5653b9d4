//! A claim that SQLite committed reaches the worker that asked for it, and its rows run on
//! their first attempt, however long the claim waited for the write lock and then for its
//! COMMIT (issue 25 item 1).
//!
//! Under load a SQLite COMMIT can take seconds after it was sent: in WAL mode it may carry an
//! fsync (the WAL header after a restart, or an automatic checkpoint), and a busy disk makes
//! that slow, while other claims wait for the write lock behind it. The runtime once gave a
//! claim up at its time limit and dropped it: the COMMIT went through all the same, and its rows
//! stayed claimed by nobody until their lease ran out, then ran again as a second attempt. A
//! limited claim also counted its wait for the write lock against its lease, so rows that came
//! back with most of their lease left were given up unstarted.
//!
//! A scheduler told to stop while its tick's COMMIT waits counts that tick's job in its report
//! (the stop once dropped the pass under way, and the job was enqueued but counted by nobody).
//!
//! Both waits are made here on purpose and in order, not by luck: another connection holds the
//! write lock, then a reader holds the claim's COMMIT back (the file is in rollback-journal
//! mode, where a COMMIT waits for readers to finish; in WAL mode it would wait for the fsync).

#![cfg(feature = "sqlite")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rowclaim::{Db, NewJob, QueueLimits, Retention, Schedule, Scheduler, Worker};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection};

const JOBS: i64 = 10;
/// The worker's lease, and (before the fix) its claim's time limit.
const LEASE: Duration = Duration::from_secs(20);
/// How long after the worker starts the other writer keeps the write lock: the claim's wait for
/// it, over a quarter of the lease.
const WRITER_HOLDS: Duration = Duration::from_secs(11);
/// How long after the worker starts the reader holds the claim's COMMIT back: past the claim's
/// old time limit (the lease), and less than three quarters of the lease after the claim had
/// the write lock. (The rows then start with 5 s to spare before the runtime would give them
/// up unstarted, a quarter of the lease before its end: room for a slow machine.)
const READER_HOLDS: Duration = Duration::from_secs(21);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_claim_with_a_slow_commit_is_handed_out_and_runs_once() {
    let (_dir, options, db) = scratch("slow-commit.db").await;
    let q = db.queue();
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|n| NewJob::new(json!({ "n": n })).queue("slow"))
        .collect();
    q.enqueue_many(&jobs).await.expect("enqueue");
    // A limit that never binds: the jobs go through the limited claim.
    q.limit("slow", &QueueLimits::default().concurrency(1000))
        .await
        .expect("limit");

    // Made before the locks are taken: the worker's first write under them is its claim.
    let claimer = db
        .queue()
        .claimer_with(&["slow".to_owned()], Retention::Keep)
        .await
        .expect("a claimer");

    // Another writer holds the write lock: the worker's first claim waits for it.
    let mut writer = SqliteConnection::connect_with(&options)
        .await
        .expect("the writer");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut writer)
        .await
        .expect("the write lock");
    // A reader in a transaction: the claim's COMMIT waits until it ends.
    let mut reader = SqliteConnection::connect_with(&options)
        .await
        .expect("the reader");
    sqlx::query("BEGIN")
        .execute(&mut reader)
        .await
        .expect("BEGIN");
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM rowclaim_jobs")
        .fetch_one(&mut reader)
        .await
        .expect("a read");

    // Every run of a handler: the job's id and its attempt.
    let runs: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
    let seen = runs.clone();
    let worker = Worker::for_claimer(claimer)
        .handle_rows(move |row| {
            let seen = seen.clone();
            async move {
                let n = |k: &str| row.data[k].as_i64().unwrap_or(-1);
                seen.lock().expect("runs").push((n("id"), n("attempts")));
                Ok::<_, String>(())
            }
        })
        // One claim takes every job.
        .concurrency(JOBS as usize)
        .lease(LEASE)
        .poll(Duration::from_millis(100))
        .until_empty(true);
    let started = tokio::time::Instant::now();
    let running = tokio::spawn(worker.run(std::future::pending()));

    tokio::time::sleep_until(started + WRITER_HOLDS).await;
    sqlx::query("ROLLBACK")
        .execute(&mut writer)
        .await
        .expect("the write lock let go");
    tokio::time::sleep_until(started + READER_HOLDS).await;
    sqlx::query("COMMIT")
        .execute(&mut reader)
        .await
        .expect("the read ended");

    let report = tokio::time::timeout(Duration::from_secs(120), running)
        .await
        .expect("the worker ends")
        .expect("the worker task")
        .expect("the worker");
    let mut runs = runs.lock().expect("runs").clone();
    runs.sort_unstable();
    let want: Vec<(i64, i64)> = runs.iter().map(|(id, _)| (*id, 1)).collect();
    assert_eq!(runs.len(), JOBS as usize, "each job ran once: {runs:?}");
    assert_eq!(runs, want, "each on its first attempt");
    assert_eq!(report.completed, JOBS as u64, "{report:?}");
    assert_eq!(report.troubled(), 0, "nothing given up or lost: {report:?}");
    let attempts: i64 = sqlx::query_scalar("SELECT SUM(attempts) FROM rowclaim_jobs")
        .fetch_one(&mut reader)
        .await
        .expect("attempts");
    assert_eq!(attempts, JOBS, "one claim of each job");
}

/// A reader holds a tick's COMMIT back while the scheduler is told to stop: the pass under way
/// ends, and the report counts every job the schedule enqueued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_stopped_while_its_tick_commits_counts_the_tick() {
    let (_dir, options, db) = scratch("stopped-scheduler.db").await;

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let scheduler = Scheduler::new(&db).schedule(
        Schedule::every("tick", Duration::from_secs(1))
            .job(NewJob::new(json!({ "from": "tick" })).queue("ticks")),
    );
    let running = tokio::spawn(scheduler.run(async {
        let _ = stop_rx.await;
    }));

    // Once a tick is in, a reader takes the database: the next tick's COMMIT waits for it.
    let mut reader = SqliteConnection::connect_with(&options)
        .await
        .expect("the reader");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while jobs_in(&mut reader).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tick in 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sqlx::query("BEGIN")
        .execute(&mut reader)
        .await
        .expect("BEGIN");
    let before = jobs_in(&mut reader).await;

    // The next tick's transaction holds the write lock (a writer that tries gets SQLITE_BUSY
    // at once) and its COMMIT waits for the reader.
    let mut prober = SqliteConnection::connect_with(&options.clone().busy_timeout(Duration::ZERO))
        .await
        .expect("the prober");
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no tick's write in 2 minutes"
        );
        match sqlx::query("BEGIN IMMEDIATE").execute(&mut prober).await {
            Ok(_) => {
                sqlx::query("ROLLBACK")
                    .execute(&mut prober)
                    .await
                    .expect("ROLLBACK");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) if is_busy(&e) => break,
            Err(e) => panic!("the prober's BEGIN IMMEDIATE failed otherwise than busy: {e}"),
        }
    }

    // Told to stop now, with the tick's COMMIT waiting; the reader lets it through soon after,
    // well inside the time the scheduler gives a pass under way.
    stop_tx.send(()).expect("the scheduler listens");
    tokio::time::sleep(Duration::from_millis(500)).await;
    sqlx::query("COMMIT")
        .execute(&mut reader)
        .await
        .expect("the read ended");

    let report = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the scheduler ends")
        .expect("the scheduler task")
        .expect("the scheduler");
    let jobs = jobs_in(&mut reader).await;
    assert!(
        jobs > before,
        "the held tick was enqueued ({before} before, {jobs} after)"
    );
    assert_eq!(
        report.enqueued, jobs as u64,
        "the report counts every job enqueued: {report:?}"
    );
}

/// Whether `e` is SQLITE_BUSY (another connection holds the write lock): the primary code in
/// the low byte of SQLite's extended code.
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 5)
}

/// How many jobs the queue holds, as `c` sees it.
async fn jobs_in(c: &mut SqliteConnection) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM rowclaim_jobs")
        .fetch_one(c)
        .await
        .expect("a count of jobs")
}

/// A queue in a scratch file in rollback-journal mode, where a COMMIT waits for readers (the
/// test decides when it ends): its directory (kept while the test runs), its connect options,
/// and a `Db` of a pool of 8, initialised.
async fn scratch(file: &str) -> (tempfile::TempDir, SqliteConnectOptions, Db) {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join(file))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Delete)
        // Longer than any wait of the tests: no statement gives up.
        .busy_timeout(Duration::from_secs(60));
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options.clone())
        .await
        .expect("a pool");
    let db = Db::from(pool);
    db.queue().init().await.expect("init");
    (dir, options, db)
}
