//! The contract every backend × strategy must pass. A new backend proves itself here.
//!
//! (a) concurrent claimers drain a table, each row done exactly once; (b) an expired lease is
//! re-claimed and the late claimer's complete is fenced off; (c) release gives rows back; (d) the
//! ORDER BY is honoured; (e) locking reads: NOWAIT → `Locked`, SKIP LOCKED skips; (f) bad input
//! is refused with an error naming the problem and the table is left untouched.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use rowclaim::{Error, LockMode, LockWait, RowId, Source, Strategy};

fn full_source() -> Source {
    Source::new("jobs")
        .owner_column("owner")
        .lease_column("lease_until")
        .attempts_column("attempts")
}

/// (a) 8 claimers, each with its own connections, drain 2,000 rows: every row is executed once
/// and ends done.
async fn drain(t: Arc<TestDb>, strategy: Strategy) {
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
async fn expired_lease(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(3).await;
    let (db_a, db_b) = (t.db().await, t.db().await);
    let a = db_a.claimer(full_source(), strategy).await.unwrap();
    let b = db_b.claimer(full_source(), strategy).await.unwrap();
    // The transaction strategy's lease on MySQL is an idle timeout in whole seconds.
    let lease = Duration::from_secs(1);
    let first = a.claim(3, lease).await.unwrap();
    assert_eq!(first.len(), 3);
    let id = first.rows()[0].id.clone();

    if t.backend == Backend::Sqlite && strategy == Strategy::Transaction {
        // SQLite: the claim holds the database's write lock, so nobody can re-claim before the
        // late claimer gives up; past its deadline its writes are refused and the rows go back.
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
async fn release(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(10).await;
    let db = t.db().await;
    let c = db.claimer(full_source(), strategy).await.unwrap();
    let claim = c.claim(5, Duration::from_secs(30)).await.unwrap();
    let ids: Vec<RowId> = claim.rows().iter().map(|r| r.id.clone()).collect();
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
    let mut got: Vec<RowId> = again.rows().iter().map(|r| r.id.clone()).collect();
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
async fn order(t: Arc<TestDb>, strategy: Strategy) {
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
    let mut got: Vec<RowId> = claim.rows().iter().map(|r| r.id.clone()).collect();
    got.sort();
    let mut want: Vec<RowId> = expected[6..10]
        .iter()
        .map(|(_, id)| RowId::Int(*id))
        .collect();
    want.sort();
    assert_eq!(got, want);
}

/// Extending a lease keeps the rows past the original lease; by token too.
async fn extend(t: Arc<TestDb>, strategy: Strategy) {
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
    if !(t.backend == Backend::Sqlite && strategy == Strategy::Transaction) {
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

/// Naming rows the token does not all hold changes none of them.
async fn all_or_nothing(t: Arc<TestDb>, strategy: Strategy) {
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

/// Claimed rows carry their columns as JSON.
async fn row_data(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(1).await;
    let db = t.db().await;
    let c = db.claimer(full_source(), strategy).await.unwrap();
    let claim = c.claim(1, Duration::from_secs(30)).await.unwrap();
    let row = &claim.rows()[0];
    assert_eq!(row.id, RowId::Int(1));
    assert_eq!(row.data["payload"], "job 1");
    assert_eq!(row.data["id"], 1);
}

/// (e) Locking reads: NOWAIT on a locked row fails with `Locked`; SKIP LOCKED leaves it out.
async fn locking_reads(t: Arc<TestDb>) {
    t.jobs(5).await;
    let (db1, db2) = (t.db().await, t.db().await);
    let c1 = db1
        .claimer(Source::new("jobs"), Strategy::LeaseTable)
        .await
        .unwrap();
    let c2 = db2
        .claimer(Source::new("jobs"), Strategy::LeaseTable)
        .await
        .unwrap();
    let one = [RowId::Int(1)];
    let held = c1
        .lock(Some(&one), None, LockMode::Update, LockWait::Wait)
        .await
        .unwrap();
    assert_eq!(held.rows().len(), 1);
    assert_eq!(held.rows()[0].data["payload"], "job 1");

    let err = c2
        .lock(Some(&one), None, LockMode::Update, LockWait::NoWait)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Locked),
        "NOWAIT on a locked row: {err}"
    );

    if t.backend == Backend::Sqlite {
        let err = c2
            .lock(None, Some(10), LockMode::Update, LockWait::SkipLocked)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("SKIP LOCKED"), "{err}");
    } else {
        let rest = c2
            .lock(None, Some(10), LockMode::Update, LockWait::SkipLocked)
            .await
            .unwrap();
        let ids: Vec<RowId> = rest.rows().iter().map(|r| r.id.clone()).collect();
        assert_eq!(
            ids,
            (2..=5).map(RowId::Int).collect::<Vec<_>>(),
            "row 1 is skipped"
        );
        rest.rollback().await.unwrap();
        // Shared locks do not exclude each other, but exclude an update lock.
        held.rollback().await.unwrap();
        let s1 = c1
            .lock(Some(&one), None, LockMode::Share, LockWait::Wait)
            .await
            .unwrap();
        let s2 = c2
            .lock(Some(&one), None, LockMode::Share, LockWait::NoWait)
            .await
            .unwrap();
        assert_eq!(s2.rows().len(), 1);
        s2.commit().await.unwrap();
        let db3 = t.db().await;
        let c3 = db3
            .claimer(Source::new("jobs"), Strategy::LeaseTable)
            .await
            .unwrap();
        let err = c3
            .lock(Some(&one), None, LockMode::Update, LockWait::NoWait)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Locked), "{err}");
        s1.commit().await.unwrap();
        return;
    }
    held.commit().await.unwrap();
    let after = c2
        .lock(Some(&one), None, LockMode::Update, LockWait::NoWait)
        .await
        .unwrap();
    after.commit().await.unwrap();
}

/// (f) Bad input: each error names the problem, and the table is untouched.
async fn bad_input(t: Arc<TestDb>) {
    t.jobs(5).await;
    let snapshot =
        || t.strings("SELECT status || ':' || COALESCE(owner, '-') FROM jobs ORDER BY id");
    let snapshot = if t.backend == Backend::MySql {
        t.strings("SELECT CONCAT(status, ':', COALESCE(owner, '-')) FROM jobs ORDER BY id")
            .await
    } else {
        snapshot().await
    };
    let db = t.db().await;

    let err = db
        .claimer(Source::new("x; drop table jobs"), Strategy::Auto)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidIdentifier { what: "table", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("x; drop table jobs"), "{err}");

    let err = db
        .claimer(
            full_source().status_column("x; drop table y"),
            Strategy::Auto,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("status column"), "{err}");

    let err = db
        .claimer(Source::new("nope"), Strategy::Auto)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MissingTable { .. }), "{err}");

    let err = db
        .claimer(full_source().lease_column("lease_ends"), Strategy::Auto)
        .await
        .unwrap_err();
    match &err {
        Error::MissingColumn { column, what, .. } => {
            assert_eq!(column, "lease_ends");
            assert_eq!(*what, "lease column");
        }
        other => panic!("expected MissingColumn, got {other}"),
    }

    let err = db
        .claimer(full_source().lease_column("payload"), Strategy::Auto)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::WrongColumnType { .. }), "{err}");
    assert!(err.to_string().contains("payload"), "{err}");

    let err = db
        .claimer(
            Source::new("jobs").status_values("ready", "claimed", "done", "ready"),
            Strategy::Auto,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"ready\""), "{err}");

    // A strategy the mapping or server cannot do.
    let err = db
        .claimer(Source::new("jobs"), Strategy::Token)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedStrategy { .. }), "{err}");
    assert!(err.to_string().contains("owner column"), "{err}");
    let err = db
        .claimer(Source::new("jobs"), Strategy::SkipLocked)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedStrategy { .. }), "{err}");
    if t.backend == Backend::Sqlite {
        let err = db
            .claimer(full_source(), Strategy::SkipLocked)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("SQLite has no SKIP LOCKED"),
            "{err}"
        );
    }

    let lease_no_owner = Source::new("jobs").lease_column("lease_until");
    let err = db
        .claimer(lease_no_owner, Strategy::Optimistic)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("owner column"), "{err}");

    let c = db.claimer(full_source(), Strategy::Auto).await.unwrap();
    let err = c.claim(5, Duration::ZERO).await.unwrap_err();
    assert!(
        err.to_string().contains("lease must be longer than zero"),
        "{err}"
    );
    let err = c.claim(0, Duration::from_secs(1)).await.unwrap_err();
    assert!(err.to_string().contains("batch"), "{err}");
    let err = c.parse_id("abc").unwrap_err();
    assert!(err.to_string().contains("\"abc\""), "{err}");
    let token = "0190a1b2-0000-7000-8000-000000000000".parse().unwrap();
    let err = c.complete(&token, &[RowId::Int(1)]).await.unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");

    let after = if t.backend == Backend::MySql {
        t.strings("SELECT CONCAT(status, ':', COALESCE(owner, '-')) FROM jobs ORDER BY id")
            .await
    } else {
        t.strings("SELECT status || ':' || COALESCE(owner, '-') FROM jobs ORDER BY id")
            .await
    };
    assert_eq!(snapshot, after, "bad input left the table untouched");
}

/// Review findings: spellings of one table share leases; a settle never touches a finished row;
/// repeated ids count once.
async fn lease_table_edges(t: Arc<TestDb>) {
    t.jobs(3).await;
    let other_spelling = match t.backend {
        Backend::Postgres => "public.jobs".to_owned(),
        Backend::MySql => format!("{}.jobs", t.name),
        Backend::Sqlite => "main.jobs".to_owned(),
    };
    let (db_a, db_b) = (t.db().await, t.db().await);
    let a = db_a
        .claimer(Source::new("jobs"), Strategy::LeaseTable)
        .await
        .unwrap();
    let b = db_b
        .claimer(Source::new(other_spelling.as_str()), Strategy::LeaseTable)
        .await
        .unwrap();
    let claim = a.claim(3, Duration::from_secs(30)).await.unwrap();
    assert_eq!(claim.len(), 3);
    let again = b.claim(3, Duration::from_secs(30)).await.unwrap();
    assert!(
        again.is_empty(),
        "{other_spelling} is the same table: its rows are taken"
    );

    // Row 1 is finished behind the claim's back: releasing it must not bring it back.
    t.exec("UPDATE jobs SET status = 'done' WHERE id = 1").await;
    let err = a
        .release(claim.token(), &[RowId::Int(1)])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        1
    );

    let two = RowId::Int(2);
    assert_eq!(
        a.complete(claim.token(), &[two.clone(), two])
            .await
            .unwrap(),
        1
    );
}

/// `auto` picks skip-locked where it can, token on SQLite, lease-table without owner/lease.
async fn auto_choice(t: Arc<TestDb>) {
    t.jobs(1).await;
    let db = t.db().await;
    let full = db
        .claimer(full_source(), Strategy::Auto)
        .await
        .unwrap()
        .strategy();
    let expected = if t.backend == Backend::Sqlite {
        Strategy::Token
    } else {
        Strategy::SkipLocked
    };
    assert_eq!(full, expected);
    let bare = db
        .claimer(Source::new("jobs"), Strategy::Auto)
        .await
        .unwrap()
        .strategy();
    assert_eq!(bare, Strategy::LeaseTable);
}

/// Status-only tables work with the strategies that need nothing else.
async fn status_only(t: Arc<TestDb>, strategy: Strategy) {
    t.exec("CREATE TABLE tasks (code VARCHAR(20) PRIMARY KEY, state INTEGER NOT NULL)")
        .await;
    t.exec("INSERT INTO tasks VALUES ('a', 0), ('b', 0), ('c', 0)")
        .await;
    let db = t.db().await;
    let source = Source::new("tasks")
        .id_column("code")
        .status_column("state")
        .status_values("0", "1", "2", "3");
    let c = db.claimer(source, strategy).await.unwrap();
    let claim = c.claim(2, Duration::from_secs(30)).await.unwrap();
    let ids: Vec<RowId> = claim.rows().iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&RowId::Text("a".into())));
    claim.complete(&ids[0]).await.unwrap();
    claim.fail(&ids[1]).await.unwrap();
    assert_eq!(
        t.count("SELECT COUNT(*) FROM tasks WHERE state = 2").await,
        1
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM tasks WHERE state = 3").await,
        1
    );
    let next = c.claim(5, Duration::from_secs(30)).await.unwrap();
    assert_eq!(next.len(), 1);
    let err = rowclaim::Source::new("tasks")
        .status_column("state")
        .status_values("new", "1", "2", "3");
    let err = db
        .claimer(err.id_column("code"), strategy)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("\"new\" is not an integer"),
        "{err}"
    );
}

/// A counter handed out concurrently gives every value once.
async fn counter(t: Arc<TestDb>) {
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let db = t.db().await;
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..25 {
                got.push(db.next_counter_value("invoice").await.expect("counter"));
            }
            got
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    assert_eq!(all, (1..=100).collect::<Vec<i64>>());
    assert_eq!(t.db().await.next_counter_value("other").await.unwrap(), 1);
}

/// Stats count by status, owner and expired lease.
async fn stats(t: Arc<TestDb>, strategy: Strategy) {
    t.jobs(10).await;
    let db = t.db().await;
    let c = db.claimer(full_source(), strategy).await.unwrap();
    let claim = c.claim(4, Duration::from_secs(30)).await.unwrap();
    claim.complete(&claim.rows()[0].id).await.unwrap();
    let s = c.stats().await.unwrap();
    assert_eq!(s.by_status.get("done"), Some(&1));
    assert_eq!(s.by_status.get("ready"), Some(&6));
    assert_eq!(s.claimed_by_owner.get(&claim.token().to_string()), Some(&3));
    assert_eq!(s.expired_leases, 0);
}

macro_rules! strategy_cases {
    ($backend:expr, $strategy:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn drain_8_claimers() {
            with_db($backend, |t| drain(t, $strategy)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn expired_lease_is_reclaimed_and_fenced() {
            with_db($backend, |t| expired_lease(t, $strategy)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn release_gives_rows_back() {
            with_db($backend, |t| release(t, $strategy)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn order_by_is_honoured() {
            with_db($backend, |t| order(t, $strategy)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn rows_come_as_json() {
            with_db($backend, |t| row_data(t, $strategy)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn extend_keeps_rows_past_the_lease() {
            with_db($backend, |t| extend(t, $strategy)).await
        }
    };
}

/// A busy claimer looks for expired leases only now and then, yet an empty claim still means
/// nothing was claimable: the claimer that just took every row gets them back as soon as their
/// lease has expired, well within its once-a-second look.
async fn own_rows_back_after_expiry(t: Arc<TestDb>, strategy: Strategy) {
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

macro_rules! token_cases {
    ($backend:expr, $strategy:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn empty_claim_means_nothing_claimable() {
            with_db($backend, |t| own_rows_back_after_expiry(t, $strategy)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn complete_of_partly_held_rows_changes_nothing() {
            with_db($backend, |t| all_or_nothing(t, $strategy)).await
        }
    };
}

macro_rules! backend_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn locking_reads_nowait_and_skip_locked() {
            with_db($backend, locking_reads).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bad_input_is_refused_and_changes_nothing() {
            with_db($backend, bad_input).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn lease_table_keys_settles_and_repeated_ids() {
            with_db($backend, lease_table_edges).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn auto_picks_a_strategy() {
            with_db($backend, auto_choice).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn counter_is_atomic() {
            with_db($backend, counter).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn status_only_table_optimistic() {
            with_db($backend, |t| status_only(t, Strategy::Optimistic)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn status_only_table_lease_table() {
            with_db($backend, |t| status_only(t, Strategy::LeaseTable)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn status_only_table_transaction() {
            with_db($backend, |t| status_only(t, Strategy::Transaction)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stats_token() {
            with_db($backend, |t| stats(t, Strategy::Token)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stats_lease_table() {
            with_db($backend, |t| stats(t, Strategy::LeaseTable)).await
        }
    };
}

mod postgres {
    use super::*;
    const B: Backend = Backend::Postgres;
    mod backend {
        backend_cases!(super::B);
    }
    mod skip_locked {
        strategy_cases!(super::B, Strategy::SkipLocked);
        token_cases!(super::B, Strategy::SkipLocked);
    }
    mod token {
        strategy_cases!(super::B, Strategy::Token);
        token_cases!(super::B, Strategy::Token);
    }
    mod optimistic {
        strategy_cases!(super::B, Strategy::Optimistic);
        token_cases!(super::B, Strategy::Optimistic);
    }
    mod lease_table {
        strategy_cases!(super::B, Strategy::LeaseTable);
        token_cases!(super::B, Strategy::LeaseTable);
    }
    mod transaction {
        strategy_cases!(super::B, Strategy::Transaction);
    }
}

mod mysql {
    use super::*;
    const B: Backend = Backend::MySql;
    mod backend {
        backend_cases!(super::B);
    }
    mod skip_locked {
        strategy_cases!(super::B, Strategy::SkipLocked);
        token_cases!(super::B, Strategy::SkipLocked);
    }
    mod token {
        strategy_cases!(super::B, Strategy::Token);
        token_cases!(super::B, Strategy::Token);
    }
    mod optimistic {
        strategy_cases!(super::B, Strategy::Optimistic);
        token_cases!(super::B, Strategy::Optimistic);
    }
    mod lease_table {
        strategy_cases!(super::B, Strategy::LeaseTable);
        token_cases!(super::B, Strategy::LeaseTable);
    }
    mod transaction {
        strategy_cases!(super::B, Strategy::Transaction);
    }
}

mod sqlite {
    use super::*;
    const B: Backend = Backend::Sqlite;
    mod backend {
        backend_cases!(super::B);
    }
    mod token {
        strategy_cases!(super::B, Strategy::Token);
        token_cases!(super::B, Strategy::Token);
    }
    mod optimistic {
        strategy_cases!(super::B, Strategy::Optimistic);
        token_cases!(super::B, Strategy::Optimistic);
    }
    mod lease_table {
        strategy_cases!(super::B, Strategy::LeaseTable);
        token_cases!(super::B, Strategy::LeaseTable);
    }
    mod transaction {
        strategy_cases!(super::B, Strategy::Transaction);
    }
}
