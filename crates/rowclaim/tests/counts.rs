//! The managed queue's counts on a table larger than the count cap, on every backend: figures
//! below the cap are exact, those above it are marked (an estimate where the database keeps
//! statistics, a lower bound on SQLite), dead and cancelled jobs are counted exactly however
//! many other jobs the table holds, and the dashboard's capped count stops at its bound.

use rowclaim_testkit as common;

use std::sync::Arc;

use common::{with_db, Backend, TestDb};
use rowclaim::{Exactness, JobFilter, NewJob, COUNT_CAP};
use serde_json::json;

/// `n` ready jobs of `queue`.
fn jobs(queue: &str, n: u64) -> Vec<NewJob> {
    (0..n)
        .map(|i| NewJob::new(json!({ "i": i })).queue(queue))
        .collect()
}

/// Moves the ready jobs of `queue` to `status`, finished when they were created (a lease that
/// ended then, for running).
async fn set_status(t: &TestDb, queue: &str, status: &str) {
    t.exec(&format!(
        "UPDATE rowclaim_jobs SET status = '{status}', \
         finished_at = CASE WHEN '{status}' = 'running' THEN NULL ELSE created_at END, \
         lease_until = CASE WHEN '{status}' = 'running' THEN created_at ELSE NULL END, \
         owner = CASE WHEN '{status}' = 'running' THEN 'gone' ELSE NULL END \
         WHERE queue = '{queue}' AND status = 'ready'"
    ))
    .await;
}

async fn counts_above_and_below_the_cap(t: Arc<TestDb>) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    let cap = COUNT_CAP;
    // big: more ready jobs than the cap, one of them low in priority and due an hour ago (the
    // oldest, and last in claim order); 7 dead and 3 cancelled.
    q.enqueue(&NewJob::new(json!({})).queue("big").priority(-5))
        .await
        .unwrap();
    let hour_ago = match t.backend {
        Backend::Postgres => "now() - interval '1 hour'",
        Backend::MySql => "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR",
        Backend::Sqlite => "run_at - 3600000",
    };
    t.exec(&format!(
        "UPDATE rowclaim_jobs SET run_at = {hour_ago} WHERE queue = 'big'"
    ))
    .await;
    q.enqueue_many(&jobs("big-dead", 7)).await.unwrap();
    q.enqueue_many(&jobs("big-cancelled", 3)).await.unwrap();
    set_status(&t, "big-dead", "dead").await;
    set_status(&t, "big-cancelled", "cancelled").await;
    t.exec("UPDATE rowclaim_jobs SET queue = 'big' WHERE queue IN ('big-dead', 'big-cancelled')")
        .await;
    q.enqueue_many(&jobs("big", cap + 50)).await.unwrap();
    // small: 5 ready, 4 dead. done: more completed jobs than the cap. held: more running jobs
    // than the cap, every lease ended.
    q.enqueue_many(&jobs("small", 4)).await.unwrap();
    set_status(&t, "small", "dead").await;
    q.enqueue_many(&jobs("small", 5)).await.unwrap();
    q.enqueue_many(&jobs("done", cap + 20)).await.unwrap();
    set_status(&t, "done", "completed").await;
    q.enqueue_many(&jobs("held", cap + 5)).await.unwrap();
    set_status(&t, "held", "running").await;

    let s = q.stats(None).await.expect("stats");
    let exact = |queue: &str, figure: &str| s.exactness(queue, figure) == Exactness::Exact;
    // Below the cap: exact, whatever the table holds besides.
    assert_eq!(s.by_queue["small"]["ready"], 5, "{s:?}");
    assert_eq!(s.by_queue["small"]["dead"], 4, "{s:?}");
    assert_eq!(s.by_queue["big"]["dead"], 7, "{s:?}");
    assert_eq!(s.by_queue["big"]["cancelled"], 3, "{s:?}");
    for (queue, figure) in [
        ("small", "ready"),
        ("small", "dead"),
        ("big", "dead"),
        ("big", "cancelled"),
        ("small", "due"),
    ] {
        assert!(exact(queue, figure), "{queue} {figure}: {s:?}");
    }
    assert_eq!(s.due.get("small"), Some(&5), "{s:?}");
    // Above the cap: marked, an estimate where the database has one, else the cap.
    let above = match t.backend {
        Backend::Sqlite => Exactness::AtLeast,
        _ => Exactness::Estimate,
    };
    assert_eq!(s.exactness("big", "ready"), above, "{s:?}");
    let big = s.by_queue["big"]["ready"];
    match above {
        Exactness::AtLeast => assert_eq!(big, cap, "{s:?}"),
        _ => assert!(big > cap, "{s:?}"),
    }
    assert_eq!(s.exactness("big", "due"), above, "{s:?}");
    assert!(s.due["big"] > 0, "{s:?}");
    assert_eq!(s.exactness("done", "completed"), above, "{s:?}");
    assert!(s.by_queue["done"]["completed"] > 0, "{s:?}");
    assert_eq!(s.exactness("held", "running"), above, "{s:?}");
    assert_eq!(
        s.exactness("held", "expired_leases"),
        Exactness::AtLeast,
        "{s:?}"
    );
    assert!(s.expired_leases["held"] >= cap, "{s:?}");
    // The oldest due job is found however many ready jobs come before it in claim order.
    let oldest = s.oldest_ready_secs["big"];
    assert!((3000.0..7200.0).contains(&oldest), "{s:?}");
    // What a person reads.
    assert_eq!(s.shown("small", "ready", 5), "5");
    let shown = s.shown("big", "ready", big);
    match above {
        Exactness::AtLeast => assert_eq!(shown, format!("{cap}+")),
        _ => assert_eq!(shown, format!("≈{big}")),
    }
    // The JSON says which figures are not exact.
    let j = serde_json::to_value(&s).unwrap();
    let marked = if above == Exactness::AtLeast {
        &j["at_least"]
    } else {
        &j["estimated"]
    };
    assert!(
        marked["big"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("ready"))),
        "{j}"
    );

    // One queue asked: only it, the same figures.
    let only = q.stats(Some("small")).await.expect("stats of small");
    assert_eq!(only.by_queue.keys().collect::<Vec<_>>(), ["small"]);
    assert_eq!(only.by_queue["small"]["dead"], 4, "{only:?}");

    // The dashboard's count of matching jobs stops at its bound.
    let big_ready = JobFilter::new().queues(["big"]).status("ready");
    assert_eq!(q.count_at_most(&big_ready, None, cap).await.unwrap(), None);
    let small_dead = JobFilter::new().queues(["small"]).status("dead");
    assert_eq!(
        q.count_at_most(&small_dead, None, cap).await.unwrap(),
        Some(4)
    );
    assert_eq!(q.count(&big_ready, None).await.unwrap(), cap + 51);
}

macro_rules! count_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn exact_below_the_cap_marked_above_it() {
            with_db($backend, counts_above_and_below_the_cap).await
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    count_cases!(Backend::Postgres);
}
#[cfg(feature = "sqlite")]
mod sqlite {
    count_cases!(Backend::Sqlite);
}
#[cfg(feature = "mysql")]
mod mysql {
    count_cases!(Backend::MySql);
}
