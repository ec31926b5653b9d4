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

/// Resolves once `flag` is set (bounded like [`until_count`]); says whether it was. A test that
/// needs the flag set while the worker runs asserts this: shutdown sets many such flags itself.
async fn until_set(flag: Arc<AtomicBool>) -> bool {
    for _ in 0..600 {
        if flag.load(Ordering::SeqCst) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
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

mod failures;
mod fencing;
mod flow;
use failures::*;
use fencing::*;
use flow::*;

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
