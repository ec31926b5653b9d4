//! `Queue::bulk` and `Queue::count` on every backend: a limit takes the newest matching jobs
//! across several batches, pages read both ways, a filter the action cannot take is refused,
//! and a delete takes every job of its queue and no other.

use rowclaim_testkit as common;

use std::sync::Arc;

use common::{with_db, Backend, TestDb};
use rowclaim::{BulkAction, ErrorKind, JobFilter, NewJob};
use serde_json::json;

/// More than two batches of jobs.
const JOBS: i64 = 4_500;

async fn bulk_in_batches(t: Arc<TestDb>) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|i| NewJob::new(json!({ "i": i })).queue("b"))
        .collect();
    q.enqueue_many(&jobs).await.expect("enqueue");
    let all_b = JobFilter::new().queues(["b"]);
    assert_eq!(q.count(&all_b, None).await.unwrap(), JOBS as u64);
    assert_eq!(
        q.count(&all_b, Some(BulkAction::Retry)).await.unwrap(),
        0,
        "none is in a state a retry takes"
    );

    // At most 3,000, newest first: they span two batches.
    let cancelled = q
        .bulk(BulkAction::Cancel, &all_b.clone().limit(3_000))
        .await;
    assert_eq!(cancelled.unwrap(), 3_000);
    let first_id = t.count("SELECT MIN(id) FROM rowclaim_jobs").await;
    let newest = format!(
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'cancelled' AND id >= {}",
        first_id + JOBS - 3_000
    );
    assert_eq!(t.count(&newest).await, 3_000, "the newest 3,000");

    // Pages both ways: the page above a page's first job is the page before it.
    let page = |f: JobFilter| {
        let q = q.clone();
        async move { q.list(&f.limit(10)).await.unwrap() }
    };
    let first = page(all_b.clone()).await;
    let second = page(all_b.clone().before_id(first[9].id)).await;
    let back = page(all_b.clone().after_id(second[0].id)).await;
    let ids = |jobs: &[rowclaim::JobRecord]| jobs.iter().map(|j| j.id).collect::<Vec<_>>();
    assert_eq!(ids(&back), ids(&first), "newest first, the same page");

    // A status the action does not take is refused, naming it.
    let ready = all_b.clone().status("ready");
    let e = q.bulk(BulkAction::Retry, &ready).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::BadInput, "{e}");
    assert!(e.to_string().contains("\"ready\""), "{e}");

    // Deleting every job of b that is not running: all of them, the rest of the cancelled
    // ones included; another queue's job stays.
    q.enqueue(&NewJob::new(json!({})).queue("keep"))
        .await
        .unwrap();
    assert_eq!(
        q.bulk(BulkAction::Delete, &all_b).await.unwrap(),
        JOBS as u64
    );
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 1);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_bulk_in_batches() {
    with_db(Backend::Postgres, bulk_in_batches).await
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_bulk_in_batches() {
    with_db(Backend::MySql, bulk_in_batches).await
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_bulk_in_batches() {
    with_db(Backend::Sqlite, bulk_in_batches).await
}
