//! The schedules' statements on every database, as snapshots (`insta`, in `snapshots/` beside
//! this file), made without a server: a tick's whole transaction (the compare-and-set, the
//! job's enqueue, its id recorded) as [`fire`] sends it to a stand-in database, and the
//! statements that store and redefine a schedule. A change to any of them shows as a diff in
//! review; `INSTA_UPDATE=always cargo test -p rowclaim --lib schedule::snapshots` writes them
//! anew.

use super::define::Schedule;
use super::store::{fire, insert_stmt, redefine_stmt, Definition, Firing};
use crate::backend::sql::{Dialect, Stmt};
use crate::queue::script::{block_on, Script, Step};
use crate::queue::store::EnqueueOne;
use crate::queue::NewJob;

/// 2026-01-01T00:00:00Z and the day after, in epoch milliseconds.
const TICK: i64 = 1_767_225_600_000;
const NEXT: i64 = TICK + 86_400_000;

fn definition() -> Definition<'static> {
    Definition {
        name: "nightly",
        queue: "reports",
        kind: "sales",
        expression: "0 0 * * *",
        zone: Some("Europe/Paris"),
        catch_up: "latest",
        fingerprint: "0123456789abcdef",
    }
}

/// A tick of `nightly` with its one job, as the scheduler hands it to the store.
fn firing() -> Firing<'static> {
    let schedule = Schedule::cron("nightly", "0 0 * * *").job(
        NewJob::new(serde_json::json!({"report": "sales"}))
            .queue("reports")
            .kind("sales"),
    );
    Firing {
        name: "nightly",
        fingerprint: "0123456789abcdef",
        seen_next: TICK,
        next: NEXT,
        jobs: vec![(TICK, schedule.job_at(TICK))],
    }
}

/// The statements of one tick with one job, as `fire` sends them.
fn tick<D: Dialect>() -> String
where
    for<'s> Step<'s, D>: EnqueueOne,
{
    let db = Script::<D>::new();
    let enqueued = block_on(fire(&db, &firing())).expect("the tick");
    let ids: Vec<i64> = enqueued
        .expect("the tick is won")
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids, [1], "the tick's one job is enqueued");
    db.log()
}

/// One statement and its values, as the snapshots show them.
fn shown<D: Dialect>(s: Stmt<D>) -> String {
    format!("{}\n  -- {:?}", s.sql, s.binder.values())
}

/// The statements that store a schedule, replace its definition (with a next tick, then
/// without), on one database.
fn define<D: Dialect>() -> String {
    [
        shown(insert_stmt::<D>(&definition(), TICK)),
        shown(redefine_stmt::<D>(&definition(), Some(NEXT))),
        shown(redefine_stmt::<D>(&definition(), None)),
    ]
    .join("\n")
}

#[cfg(feature = "postgres")]
#[test]
fn postgres() {
    use crate::backend::postgres::Sql;
    insta::assert_snapshot!("postgres_fire", tick::<Sql>());
    insta::assert_snapshot!("postgres_insert_redefine", define::<Sql>());
}

#[cfg(feature = "mysql")]
#[test]
fn mysql() {
    use crate::backend::mysql::Sql;
    insta::assert_snapshot!("mysql_fire", tick::<Sql>());
    insta::assert_snapshot!("mysql_insert_redefine", define::<Sql>());
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite() {
    use crate::backend::sqlite::Sql;
    insta::assert_snapshot!("sqlite_fire", tick::<Sql>());
    insta::assert_snapshot!("sqlite_insert_redefine", define::<Sql>());
}

/// A scheduler that lost the race for a tick (its compare-and-set matched no row) rolls back
/// and enqueues nothing.
#[cfg(feature = "sqlite")]
#[test]
fn a_lost_tick_enqueues_nothing() {
    let db = Script::<crate::backend::sqlite::Sql>::changing(0);
    let got = block_on(fire(&db, &firing())).expect("the tick");
    assert!(got.is_none(), "{got:?}");
    let log = db.log();
    assert!(log.ends_with("ROLLBACK"), "{log}");
    assert!(!log.contains("INSERT"), "{log}");
}
