//! The contract cases run once per backend: locking reads, bad input, the lease table's edges,
//! what `auto` picks, status-only tables, the counter, stats.
//!
//! Each case takes the test's database (empty: the case makes its tables). Where a case depends
//! on what the server can do, it asks ([`rowclaim::ServerInfo::supports`]); it matches on
//! [`Backend`] only for the SQL dialect of its own raw SQL and for a driver's own wording. A new
//! backend proves itself by a driver and one `contract_suite!` invocation (see
//! [`crate::contract`]), adding an arm here only where its dialect differs.

use std::sync::Arc;
use std::time::Duration;

use rowclaim::{Capability, Error, LockMode, LockWait, RowId, Source, Strategy};

use super::full_source;
use crate::{Backend, TestDb};

/// (e) Locking reads: NOWAIT on a locked row fails with `Locked`; SKIP LOCKED leaves it out.
pub async fn locking_reads(t: Arc<TestDb>) {
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

    let server = c1.server().clone();
    if server.supports(Capability::SkipLocked) {
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
    } else {
        let err = c2
            .lock(None, Some(10), LockMode::Update, LockWait::SkipLocked)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("SKIP LOCKED"), "{err}");
    }
    // Shared and update locks are row locks only where writers do not wait for each other;
    // with one writer at a time (SQLite) every lock is the database's write lock, tested below.
    if server.supports(Capability::ConcurrentWriters) {
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
pub async fn bad_input(t: Arc<TestDb>) {
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
    // With every column it needs mapped, skip-locked stands or falls with the server.
    let server = db.server().await.unwrap();
    let skip_locked = db.claimer(full_source(), Strategy::SkipLocked).await;
    if server.supports(Capability::SkipLocked) {
        let c = skip_locked.unwrap();
        assert_eq!(c.strategy(), Strategy::SkipLocked);
    } else {
        let Err(err) = skip_locked else {
            panic!(
                "{} has no SKIP LOCKED, yet a skip-locked claimer was made",
                server.description
            )
        };
        assert!(matches!(err, Error::UnsupportedStrategy { .. }), "{err}");
        assert!(err.to_string().contains("SKIP LOCKED"), "{err}");
        // The driver's own words, which say why.
        if t.backend == Backend::Sqlite {
            assert!(
                err.to_string().contains("SQLite has no SKIP LOCKED"),
                "{err}"
            );
        }
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
pub async fn lease_table_edges(t: Arc<TestDb>) {
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

/// `auto` picks skip-locked where the server has SKIP LOCKED, else token; lease-table without
/// owner/lease columns.
pub async fn auto_choice(t: Arc<TestDb>) {
    t.jobs(1).await;
    let db = t.db().await;
    let full = db
        .claimer(full_source(), Strategy::Auto)
        .await
        .unwrap()
        .strategy();
    // `capabilities_are_as_documented` pins what each known server says here, so this cannot
    // pass by a server wrongly saying it has no SKIP LOCKED.
    let expected = if db.server().await.unwrap().supports(Capability::SkipLocked) {
        Strategy::SkipLocked
    } else {
        Strategy::Token
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
pub async fn status_only(t: Arc<TestDb>, strategy: Strategy) {
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
pub async fn counter(t: Arc<TestDb>) {
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
pub async fn stats(t: Arc<TestDb>, strategy: Strategy) {
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

/// `--where` cannot widen a claim: conditions that would leave their parentheses, or that one
/// database reads differently from another, are refused naming `--where`, as is anything the
/// database does not take as a condition on the table; an accepted one claims only ready rows.
pub async fn filter_stays_inside(t: Arc<TestDb>) {
    t.jobs(10).await;
    t.exec("UPDATE jobs SET status = 'done' WHERE id <= 5")
        .await;
    let db = t.db().await;
    for bad in [
        // Escapes on a lax check: the case, closing and reopening.
        "1=1) or (1=1",
        "1=1) or status = 'done' or (1=1",
        // Comments and quotes that databases read differently.
        "1=1 -- ) or (1=1",
        "1=1 /* ) or (1=1 */",
        "1=1 # ) or (1=1",
        "payload = $$x$$",
        "payload = 'a\\' or 1=1 or payload = ''",
        "payload = 'unclosed",
        // Statements, not conditions.
        "1=1); delete from jobs where (1=1",
        "1=1) union select * from jobs where (1=1",
        // Not a condition on this table, as the database says.
        "nope = 1",
        "id ==",
        "1=1, 2",
    ] {
        let err = match db.claimer(full_source().filter(bad), Strategy::Auto).await {
            Ok(c) => {
                let got = c.claim(10, Duration::from_secs(30)).await;
                panic!("--where {bad:?} was accepted; its claim: {got:?}")
            }
            Err(e) => e,
        };
        assert_eq!(err.kind(), rowclaim::ErrorKind::BadInput, "{bad}: {err}");
        assert!(err.to_string().starts_with("--where "), "{bad}: {err}");
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready' AND owner IS NULL")
            .await,
        5,
        "nothing was claimed by a refused condition"
    );

    // Accepted: parentheses of its own, a string holding what was refused outside quotes.
    let c = db
        .claimer(
            full_source().filter("(id > 0 or id < 0) and payload <> 'x) or (1=1 -- ; $ #'"),
            Strategy::Auto,
        )
        .await
        .expect("a condition with balanced parentheses and a harmless string");
    let claim = c.claim(10, Duration::from_secs(30)).await.expect("claim");
    let mut ids: Vec<String> = claim.rows().iter().map(|r| r.id.to_string()).collect();
    ids.sort_by_key(|s| s.parse::<i64>().unwrap_or(0));
    assert_eq!(
        ids,
        ["6", "7", "8", "9", "10"],
        "only ready rows are claimed"
    );
}

/// One mapping per table: the first claim records it; a claimer that would break exclusivity
/// with it is refused, naming each difference, before it claims or creates anything; claimers
/// that differ only where exclusivity does not depend on it are let in; `record_source`
/// replaces the record and `forget_source` removes it. Two first claimers that disagree race to
/// record: one of them is refused at its first claim and no row is held twice.
pub async fn one_mapping_per_table(t: Arc<TestDb>) {
    use rowclaim::registry::ClaimsKept;
    t.jobs(20).await;
    let db = t.db().await;
    let lease = Duration::from_secs(300);
    assert!(db.recorded_source("jobs").await.unwrap().is_none());

    // Looking does not record: a claimer that never claims leaves no record.
    let looker = db
        .claimer(Source::new("jobs"), Strategy::Auto)
        .await
        .unwrap();
    looker.stats().await.unwrap();
    assert!(db.recorded_source("jobs").await.unwrap().is_none());
    drop(looker);

    let first = db.claimer(full_source(), Strategy::Auto).await.unwrap();
    let held = first.claim(1, lease).await.unwrap();
    let held_id = held.rows()[0].id.clone();
    let rec = db
        .recorded_source("jobs")
        .await
        .unwrap()
        .expect("the first claim records the mapping");
    assert_eq!(rec.claims, ClaimsKept::InTable);
    assert_eq!(
        rec.owner_column.as_deref().map(str::to_lowercase),
        Some("owner".into())
    );
    assert_eq!(
        rec.lease_column.as_deref().map(str::to_lowercase),
        Some("lease_until".into())
    );
    assert_eq!(rec.strategy, first.strategy());
    assert!(rec.recorded_at > 1_700_000_000, "{rec:?}");
    assert_eq!(db.recorded_sources().await.unwrap(), vec![rec.clone()]);

    // The case: no owner and lease columns, so `auto` would keep claims in
    // rowclaim_leases, where the first claimer never looks.
    let err = db
        .claimer(Source::new("jobs"), Strategy::Auto)
        .await
        .expect_err("a lease-table claimer of a table claimed in place");
    assert_eq!(err.kind(), rowclaim::ErrorKind::BadInput, "{err}");
    let text = err.to_string();
    for part in [
        "owner column",
        "lease column",
        "claims kept",
        "rowclaim source replace",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    // A different ready value, and another id column (unique, as every id column must be), are
    // refused too.
    t.exec("ALTER TABLE jobs ADD COLUMN alt_id BIGINT").await;
    t.exec("UPDATE jobs SET alt_id = id").await;
    t.exec("CREATE UNIQUE INDEX jobs_alt_id ON jobs (alt_id)")
        .await;
    for (bad, what) in [
        (
            full_source().status_values("new", "claimed", "done", "failed"),
            "ready value",
        ),
        (full_source().id_column("alt_id"), "id column"),
    ] {
        let err = match db.claimer(bad, Strategy::Auto).await {
            Ok(c) => c.claim(1, lease).await.map(|_| ()).unwrap_err(),
            Err(e) => e,
        };
        assert!(err.to_string().contains(what), "{what}: {err}");
    }

    // What may differ: the done and failed values, attempts, the order, the condition, and
    // the strategy among those that keep claims in the table.
    let other = full_source()
        .status_values("ready", "claimed", "finished", "broken")
        .order_by("priority desc, id")
        .filter("id > 10");
    let c = db.claimer(other, Strategy::Optimistic).await.unwrap();
    let claim = c.claim(2, lease).await.unwrap();
    assert_eq!(claim.rows().len(), 2);
    for row in claim.rows() {
        assert_ne!(row.id, held_id, "a row held by the first claimer");
    }

    // Replacing the record lets the lease-table mapping in and keeps the old one out.
    let new = db
        .record_source(Source::new("jobs"), Strategy::Auto)
        .await
        .unwrap();
    assert_eq!(new.claims, ClaimsKept::InLeaseTable);
    assert_eq!(new.owner_column, None);
    let bare = db
        .claimer(Source::new("jobs"), Strategy::Auto)
        .await
        .unwrap();
    assert_eq!(bare.strategy(), Strategy::LeaseTable);
    assert!(db.claimer(full_source(), Strategy::Auto).await.is_err());

    // `auto` follows a record that keeps claims in rowclaim_leases where the mapping allows.
    db.record_source(full_source(), Strategy::LeaseTable)
        .await
        .unwrap();
    let auto = db.claimer(full_source(), Strategy::Auto).await.unwrap();
    assert_eq!(auto.strategy(), Strategy::LeaseTable);

    // Forgotten, the next claim records again; and two first claimers that disagree cannot
    // both claim.
    assert!(db.forget_source("jobs").await.unwrap());
    assert!(!db.forget_source("jobs").await.unwrap());
    let (db1, db2) = (t.db().await, t.db().await);
    let in_table = db1.claimer(full_source(), Strategy::Auto).await.unwrap();
    let in_leases = db2
        .claimer(Source::new("jobs"), Strategy::LeaseTable)
        .await
        .unwrap();
    let (a, b) = tokio::join!(in_table.claim(5, lease), in_leases.claim(5, lease));
    match (&a, &b) {
        (Ok(_), Err(e)) | (Err(e), Ok(_)) => {
            assert!(matches!(e, Error::MappingDisagrees { .. }), "{e}")
        }
        _ => panic!("exactly one of two disagreeing first claimers may claim: {a:?} / {b:?}"),
    }
}
