//! Handlers that fail: a panic or a time limit fails the job, which runs again; a cancel stops
//! a running job; a handler that cannot run at all stops the worker.

use super::*;

/// A handler that panics fails its job, which runs again after the backoff; the worker goes on
/// with other jobs. On an own table the row ends failed.
pub(super) async fn panics(t: Arc<TestDb>) {
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
pub(super) async fn timeouts(t: Arc<TestDb>) {
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
pub(super) async fn cancel_running(t: Arc<TestDb>) {
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
        // Renewals find the cancel. A lease of 15 s gives each renewal 5 s, with 10 s to spare:
        // a renewal that stalls past the lease's end gives the job up instead, and CI's loaded
        // MariaDB let every 2 s try of a 6 s lease run out (see `one_row_of_a_claim_lost`).
        .lease(Duration::from_secs(15));
    let cancel = {
        let (q, started, dropped) = (q.clone(), started.clone(), dropped.clone());
        async move {
            assert!(until_set(started).await, "the job started");
            assert!(q.cancel(id).await.unwrap(), "the running job was cancelled");
            assert!(
                until_set(dropped).await,
                "the cancelled job was stopped while the worker ran"
            );
        }
    };
    let report = worker.run(cancel).await.unwrap();
    assert_eq!((report.lost, report.completed), (1, 0), "{report:?}");
    let sql =
        format!("SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {id} AND status = 'cancelled'");
    assert_eq!(t.count(&sql).await, 1);
}

/// A handler that cannot run at all stops the worker with that error; the row goes back.
pub(super) async fn abort(t: Arc<TestDb>) {
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
