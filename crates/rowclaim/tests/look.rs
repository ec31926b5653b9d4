//! Looking at sources and changing them by hand (what `rowclaim dashboard` does), on every
//! backend: a source from a table's record, its rows with holder and lease, a held row given
//! back whose holder is then fenced out (in the table and in `rowclaim_leases`), deleting jobs
//! and paging through them.

use rowclaim_testkit as common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{with_db, Backend, TestDb};
use rowclaim::{ErrorKind, JobFilter, NewJob, RowFilter, Source, Strategy};
use serde_json::json;

fn harness_source() -> Source {
    Source::new("jobs")
        .owner_column("owner")
        .lease_column("lease_until")
        .attempts_column("attempts")
}

/// Rows as stored, from a claimer made from the table's record, and a held row given back.
async fn rows_and_release(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(6).await;
    let db = t.db().await;
    let worker = db
        .claimer(harness_source(), strategy)
        .await
        .expect("claimer");
    let claim = worker
        .claim(2, Duration::from_secs(3600))
        .await
        .expect("claim");
    assert_eq!(claim.rows().len(), 2);
    let token = claim.token().to_string();

    let record = db
        .recorded_sources()
        .await
        .expect("records")
        .into_iter()
        .next()
        .expect("the first claim recorded the table");
    let look = db
        .claimer(record.source(), record.strategy)
        .await
        .expect("a claimer from the record");
    let held = look
        .rows(&RowFilter::new().status("claimed"))
        .await
        .expect("rows");
    assert_eq!(held.len(), 2, "{held:?}");
    for r in &held {
        assert_eq!(r.owner.as_deref(), Some(token.as_str()), "{r:?}");
        assert!(
            r.lease_until.is_some_and(|l| l > SystemTime::now()),
            "{r:?}"
        );
        assert_eq!(
            r.data["id"],
            json!(r.id.clone()),
            "the row's columns: {r:?}"
        );
    }
    let page = look.rows(&RowFilter::new().limit(4)).await.expect("a page");
    assert_eq!(page.len(), 4);
    let last = page[3].id.to_string();
    let rest = look
        .rows(&RowFilter::new().after(last))
        .await
        .expect("the next");
    assert_eq!(rest.len(), 2, "{rest:?}");

    let id = held[0].id.clone();
    // Given back only while the holder the operator saw still holds it.
    let other = "01999999-0000-7000-8000-000000000000";
    assert!(
        !look.release_row(&id, Some(other)).await.expect("release"),
        "another holder's row is left alone"
    );
    let row = look.row(&id).await.expect("row").expect("still there");
    assert_eq!(row.owner.as_deref(), Some(token.as_str()), "{row:?}");
    assert!(
        look.release_row(&id, Some(&token)).await.expect("release"),
        "it was held"
    );
    let row = look.row(&id).await.expect("row").expect("still there");
    assert_eq!(row.status, "ready");
    assert_eq!(row.owner, None, "{row:?}");
    assert!(
        !look.release_row(&id, None).await.expect("again"),
        "nothing held now"
    );
    // Fencing: the holder's result for the released row is refused, the other row still its.
    let err = claim
        .complete(&id)
        .await
        .expect_err("the holder lost the row");
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    claim
        .complete(&held[1].id)
        .await
        .expect("the other row is still held");
}

async fn rows_in_table(t: Arc<TestDb>) {
    rows_and_release(t, Strategy::Token).await
}

async fn rows_in_lease_table(t: Arc<TestDb>) {
    rows_and_release(t, Strategy::LeaseTable).await
}

async fn rows_optimistic(t: Arc<TestDb>) {
    rows_and_release(t, Strategy::Optimistic).await
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn rows_skip_locked(t: Arc<TestDb>) {
    rows_and_release(t, Strategy::SkipLocked).await
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// A row a `transaction` claimer of the same table holds in its open transaction: a release
/// fails at once (it would otherwise wait for that transaction, on MySQL/MariaDB for its lock
/// timeout again and again), and the claimer still settles its row.
async fn release_does_not_wait_for_a_transaction(t: Arc<TestDb>) {
    t.jobs(2).await;
    let db = t.db().await;
    // The first claim records the table as claimed in place (token); a transaction claimer keeps
    // its claims in the table too, so it may share it.
    let first = db
        .claimer(harness_source(), Strategy::Token)
        .await
        .expect("claimer");
    let c = first
        .claim(1, Duration::from_secs(3600))
        .await
        .expect("claim");
    c.complete(&c.rows()[0].id).await.expect("complete");
    let tx_claimer = db
        .claimer(harness_source(), Strategy::Transaction)
        .await
        .expect("a transaction claimer");
    let held = tx_claimer
        .claim(1, Duration::from_secs(3600))
        .await
        .expect("claim in a transaction");
    let id = held.rows()[0].id.clone();
    let err = first
        .release_row(&id, None)
        .await
        .expect_err("the row is locked by the open transaction");
    assert_eq!(err.kind(), ErrorKind::LockConflict, "{err}");
    held.complete(&id).await.expect("the holder still settles");
}

/// Without an owner column there is no token to fence a holder out by: an operator's release
/// is refused, and the row stays with its holder, who settles it.
async fn release_needs_a_fence(t: Arc<TestDb>) {
    t.jobs(2).await;
    let db = t.db().await;
    // The one strategy that claims in the table with neither owner nor lease column (auto
    // would pick the lease table here, which does fence).
    let worker = db
        .claimer(Source::new("jobs"), Strategy::Optimistic)
        .await
        .expect("claimer");
    let claim = worker
        .claim(1, Duration::from_secs(3600))
        .await
        .expect("claim");
    let id = claim.rows()[0].id.clone();
    let err = worker
        .release_row(&id, None)
        .await
        .expect_err("no owner column");
    assert_eq!(err.kind(), ErrorKind::BadInput, "{err}");
    assert!(err.to_string().contains("owner column"), "{err}");
    claim
        .complete(&id)
        .await
        .expect("the holder still settles its row");
}

/// A running job is not deleted; others are. Pages of jobs do not overlap.
async fn delete_and_page(t: Arc<TestDb>) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    for i in 0..5 {
        q.enqueue(&NewJob::new(json!({ "n": i })).queue("look"))
            .await
            .expect("enqueue");
    }
    let claimer = q.claimer(&["look".to_owned()]).await.expect("claimer");
    let claim = claimer
        .claim(1, Duration::from_secs(3600))
        .await
        .expect("claim");
    let running = claim.rows()[0]
        .id
        .to_string()
        .parse::<i64>()
        .expect("an id");
    assert!(
        !q.delete(running).await.expect("delete"),
        "a running job stays"
    );
    assert!(q.get(running).await.expect("get").is_some());

    let first = q
        .list(&JobFilter::new().queues(["look"]).limit(2))
        .await
        .expect("a page");
    let next = q
        .list(
            &JobFilter::new()
                .queues(["look"])
                .limit(10)
                .before_id(first[1].id),
        )
        .await
        .expect("the next page");
    assert_eq!(first.len() + next.len(), 5);
    assert!(next.iter().all(|j| j.id < first[1].id));

    let ready = first
        .iter()
        .find(|j| j.id != running)
        .expect("a ready job")
        .id;
    assert!(q.delete(ready).await.expect("delete"), "a ready job goes");
    assert!(q.get(ready).await.expect("get").is_none());
    assert!(!q.delete(ready).await.expect("again"), "and is gone");
}

macro_rules! look_cases {
    ($name:ident, $backend:expr, $feature:literal) => {
        // Each database's cases only in a build with its driver (CI also runs PostgreSQL alone).
        #[cfg(feature = $feature)]
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread")]
            async fn rows_in_table() {
                with_db($backend, super::rows_in_table).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn rows_in_lease_table() {
                with_db($backend, super::rows_in_lease_table).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn rows_optimistic() {
                with_db($backend, super::rows_optimistic).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn release_needs_a_fence() {
                with_db($backend, super::release_needs_a_fence).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn delete_and_page() {
                with_db($backend, super::delete_and_page).await
            }
        }
    };
}

/// Cases for servers with row locks and SKIP LOCKED (not SQLite).
macro_rules! row_lock_cases {
    ($name:ident, $backend:expr, $feature:literal) => {
        #[cfg(feature = $feature)]
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread")]
            async fn rows_skip_locked() {
                with_db($backend, super::rows_skip_locked).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn release_does_not_wait_for_a_transaction() {
                with_db($backend, super::release_does_not_wait_for_a_transaction).await
            }
        }
    };
}

row_lock_cases!(postgres_locks, Backend::Postgres, "postgres");
row_lock_cases!(mysql_locks, Backend::MySql, "mysql");

look_cases!(postgres, Backend::Postgres, "postgres");
look_cases!(mysql, Backend::MySql, "mysql");
look_cases!(sqlite, Backend::Sqlite, "sqlite");
