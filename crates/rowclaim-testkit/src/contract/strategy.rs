//! The contract cases run once per strategy: [`contract_suite!`](crate::contract_suite) runs each
//! for every strategy on every backend, through [`for_strategy`](super::for_strategy), which
//! checks the strategy's refusal instead where the server lacks what it needs.
//!
//! Each case takes the test's database (empty: the case makes its tables) and the strategy.
//! A new backend proves itself by a driver and one `contract_suite!` invocation; these cases need
//! nothing of their own for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rowclaim::{Capability, Claim, Error, LockMode, LockWait, RowId, Strategy};

use super::full_source;
use crate::TestDb;

/// (a) 8 claimers, each with its own connections, drain 2,000 rows: every row is executed once
/// and ends done.
pub async fn drain(t: Arc<TestDb>, strategy: Strategy) {
    const ROWS: i64 = 2000;
    t.jobs(ROWS).await;
    let executions: Arc<Mutex<HashMap<RowId, u32>>> = Default::default();
    let mut workers = Vec::new();
    for _ in 0..8 {
        let db = t.db().await;
        let executions = executions.clone();
        workers.push(tokio::spawn(async move {
            let claimer = db.claimer(full_source(), strategy).await.expect("claimer");
            assert_eq!(claimer.strategy(), strategy);
            loop {
                let claim = claimer
                    .claim(7, Duration::from_secs(60))
                    .await
                    .expect("claim");
                if claim.is_empty() {
                    break;
                }
                for row in claim.rows() {
                    *executions
                        .lock()
                        .unwrap()
                        .entry(row.id.clone())
                        .or_default() += 1;
                    claim.complete(&row.id).await.expect("complete");
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let executions = executions.lock().unwrap().clone();
    let twice: Vec<_> = executions.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "rows executed more than once: {twice:?}");
    assert_eq!(executions.len() as i64, ROWS, "rows executed");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        ROWS
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status <> 'done'")
            .await,
        0
    );
}

/// (b) A claimer whose lease expired loses its rows to a later claimer; its complete is refused
/// with `LeaseLost` and changes nothing.
pub async fn expired_lease(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(3).await;
    let (db_a, db_b) = (t.db().await, t.db().await);
    let a = db_a.claimer(full_source(), strategy).await.unwrap();
    let b = db_b.claimer(full_source(), strategy).await.unwrap();
    // The transaction strategy's lease on MySQL is an idle timeout in whole seconds.
    let lease = Duration::from_secs(1);
    // With one writer at a time (SQLite), a transaction claim holds the database's write lock.
    let one_writer = !a.server().supports(Capability::ConcurrentWriters);
    let first = a.claim(3, lease).await.unwrap();
    assert_eq!(first.len(), 3);
    let id = first.rows()[0].id.clone();

    if one_writer && strategy == Strategy::Transaction {
        // The claim holds the database's write lock, so nobody can re-claim before the late
        // claimer gives up; past its deadline its writes are refused and the rows go back.
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let err = first.complete(&id).await.unwrap_err();
        assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
        drop(first);
        let second = b.claim(3, lease).await.unwrap();
        assert_eq!(second.len(), 3, "rows are claimable again");
        for r in second.rows() {
            second.complete(&r.id).await.unwrap();
        }
        assert_eq!(
            t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
                .await,
            3
        );
        return;
    }

    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = b.claim(3, Duration::from_secs(30)).await.unwrap();
    assert_eq!(second.len(), 3, "expired rows are claimable again");
    assert!(second.rows().iter().any(|r| r.id == id));
    if strategy != Strategy::Transaction {
        let twice = t
            .count("SELECT COUNT(*) FROM jobs WHERE attempts = 2")
            .await;
        assert_eq!(twice, 3, "each re-claim counts an attempt");
    }

    let before = t.strings("SELECT status FROM jobs ORDER BY id").await;
    let err = first.complete(&id).await.unwrap_err();
    assert!(
        matches!(err, Error::LeaseLost { .. }),
        "late complete: {err}"
    );
    if strategy != Strategy::Transaction {
        let err = a
            .complete(first.token(), std::slice::from_ref(&id))
            .await
            .unwrap_err();
        match err {
            Error::LeaseLost { ids, .. } => assert_eq!(ids, vec![id.clone()]),
            other => panic!("expected LeaseLost, got {other}"),
        }
    }
    let after = t.strings("SELECT status FROM jobs ORDER BY id").await;
    assert_eq!(before, after, "the late claimer changed nothing");

    for r in second.rows() {
        second.complete(&r.id).await.unwrap();
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        3
    );
}

/// (c) Released rows are ready again and are claimed next.
pub async fn release(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(10).await;
    let db = t.db().await;
    let c = db.claimer(full_source(), strategy).await.unwrap();
    let claim = c.claim(5, Duration::from_secs(30)).await.unwrap();
    let ids = ids_of(&claim);
    assert_eq!(ids.len(), 5);
    claim.release(&ids[0]).await.unwrap();
    claim.release(&ids[1]).await.unwrap();
    for id in &ids[2..] {
        claim.complete(id).await.unwrap();
    }
    assert!(matches!(
        claim.complete(&ids[0]).await,
        Err(Error::LeaseLost { .. })
    ));
    drop(claim);
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready'")
            .await,
        7
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE owner IS NOT NULL AND status = 'ready'")
            .await,
        0
    );

    let again = c.claim(2, Duration::from_secs(30)).await.unwrap();
    let mut got = ids_of(&again);
    got.sort();
    assert_eq!(got, ids[..2].to_vec(), "released rows come first again");

    if strategy != Strategy::Transaction {
        // Release by token, as `rowclaim release --token` does.
        let n = c.release(again.token(), &[]).await.unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready'")
                .await,
            7
        );
    }
}

/// (d) Claims follow the source's ORDER BY.
pub async fn order(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(40).await;
    let db = t.db().await;
    let c = db
        .claimer(full_source().order_by("priority desc, id desc"), strategy)
        .await
        .unwrap();
    let mut expected: Vec<(i64, i64)> = (1..=40).map(|i| ((i * 7919) % 13, i)).collect();
    expected.sort_by(|a, b| b.cmp(a));
    let mut seen = Vec::new();
    for _ in 0..6 {
        let claim = c.claim(1, Duration::from_secs(30)).await.unwrap();
        let row = &claim.rows()[0];
        seen.push(row.id.clone());
        claim.complete(&row.id).await.unwrap();
    }
    let want: Vec<RowId> = expected[..6]
        .iter()
        .map(|(_, id)| RowId::Int(*id))
        .collect();
    assert_eq!(seen, want);
    // A batch takes the next rows in order.
    let claim = c.claim(4, Duration::from_secs(30)).await.unwrap();
    let mut got = ids_of(&claim);
    got.sort();
    let mut want: Vec<RowId> = expected[6..10]
        .iter()
        .map(|(_, id)| RowId::Int(*id))
        .collect();
    want.sort();
    assert_eq!(got, want);
}

/// Claimed rows carry their columns as JSON.
pub async fn row_data(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(1).await;
    let db = t.db().await;
    let c = db.claimer(full_source(), strategy).await.unwrap();
    let claim = c.claim(1, Duration::from_secs(30)).await.unwrap();
    let row = &claim.rows()[0];
    assert_eq!(row.id, RowId::Int(1));
    assert_eq!(row.data["payload"], "job 1");
    assert_eq!(row.data["id"], 1);
}

/// Extending a lease keeps the rows past the original lease; by token too.
pub async fn extend(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(4).await;
    let (db_a, db_b) = (t.db().await, t.db().await);
    let a = db_a.claimer(full_source(), strategy).await.unwrap();
    let b = db_b.claimer(full_source(), strategy).await.unwrap();
    let claim = a.claim(2, Duration::from_secs(1)).await.unwrap();
    claim.extend(Duration::from_secs(30)).await.unwrap();
    if strategy != Strategy::Transaction {
        let n = a
            .extend(claim.token(), &[], Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(n, 2, "extend by token covers the claim's rows");
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // With one writer at a time, the transaction claim's write lock keeps `b` from claiming at
    // all until `claim` ends, so there is no "other two" to look at.
    let one_writer = !a.server().supports(Capability::ConcurrentWriters);
    if !(one_writer && strategy == Strategy::Transaction) {
        // Past the first lease, the rows are still held: another claimer gets the other two.
        let other = b.claim(4, Duration::from_secs(30)).await.unwrap();
        assert_eq!(other.len(), 2, "extended rows are not re-claimed");
        for r in other.rows() {
            assert!(!claim.rows().iter().any(|c| c.id == r.id));
            other.complete(&r.id).await.unwrap();
        }
    }
    for r in claim.rows() {
        claim.complete(&r.id).await.unwrap();
    }
}

/// A busy claimer looks for expired leases only now and then, yet an empty claim still means
/// nothing was claimable: the claimer that just took every row gets them back as soon as their
/// lease has expired, well within its once-a-second look.
pub async fn own_rows_back_after_expiry(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(3).await;
    let db = t.db().await;
    let a = db.claimer(full_source(), strategy).await.unwrap();
    let first = a.claim(3, Duration::from_millis(300)).await.unwrap();
    assert_eq!(
        first.len(),
        3,
        "a full batch: the next claim looks at ready rows first"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again = a.claim(3, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        again.len(),
        3,
        "expired rows are claimable at once, not after a rescue pause"
    );
}

/// Expired rows that another transaction holds (a claimer whose claim has not committed yet)
/// are passed over, not waited for, and the expired rows behind them are claimed: a claim
/// that finds its first candidates held still takes the next ones, and an empty claim still
/// means nothing was claimable. Skip-locked claims on servers with row locks; with one writer
/// at a time (SQLite) a held row is a held database, and there is nothing to pass.
pub async fn held_expired_rows(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(4).await;
    let (db, other) = (t.db().await, t.db().await);
    let c = db.claimer(full_source(), strategy).await.unwrap();
    if !c.server().supports(Capability::ConcurrentWriters) {
        return;
    }
    let first = c.claim(4, Duration::from_millis(300)).await.unwrap();
    assert_eq!(first.len(), 4);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let holder = other.claimer(full_source(), strategy).await.unwrap();
    let held_ids = [RowId::Int(1), RowId::Int(2)];
    let held = holder
        .lock(Some(&held_ids), None, LockMode::Update, LockWait::Wait)
        .await
        .unwrap();
    assert_eq!(held.rows().len(), 2);
    let next = c.claim(2, Duration::from_secs(30)).await.unwrap();
    let behind = [RowId::Int(3), RowId::Int(4)];
    assert_eq!(ids_of(&next), behind, "the rows behind the held ones");
    held.rollback().await.unwrap();
    let rest = c.claim(2, Duration::from_secs(30)).await.unwrap();
    assert_eq!(ids_of(&rest), held_ids, "once let go, claimable");
}

/// The ids of a claim's rows, in its order.
fn ids_of(claim: &Claim) -> Vec<RowId> {
    claim.rows().iter().map(|r| r.id.clone()).collect()
}

/// Naming rows the token does not all hold changes none of them.
pub async fn all_or_nothing(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(4).await;
    let db = t.db().await;
    let c = db.claimer(full_source(), strategy).await.unwrap();
    let claim = c.claim(2, Duration::from_secs(30)).await.unwrap();
    let held = claim.rows()[0].id.clone();
    let err = c
        .complete(claim.token(), &[held.clone(), RowId::Int(4)])
        .await
        .unwrap_err();
    match err {
        Error::LeaseLost { ids, .. } => assert_eq!(ids, vec![RowId::Int(4)]),
        other => panic!("expected LeaseLost naming row 4, got {other}"),
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        0
    );
    assert_eq!(c.complete(claim.token(), &[held]).await.unwrap(), 1);
}
