//! A worker's registration against a real registry: how it is marked stopped when its own
//! entry never landed, or lands late.

use std::sync::Arc;
use std::time::Duration;

use rowclaim_testkit::{with_db, Backend};

use super::Registration;
use crate::db::Db;
use crate::worker::registry::{roster, WorkerState};

/// A registration of a worker of queue "q" on `db` (its entry not written).
async fn registration(db: &Db) -> Arc<Registration> {
    let queue = db.queue();
    queue.init().await.expect("init");
    let claimer = queue.claimer(&["q".to_owned()]).await.expect("claimer");
    Registration::new(claimer, vec!["q".to_owned()], 2, Duration::from_secs(30)).1
}

/// Where the worker's entry never landed (its write given up unanswered), its stop writes it
/// stopped; the write given up, landing late, then fails and changes nothing: the worker does
/// not read "gone" for a day.
async fn a_worker_stopped_before_its_entry_landed_is_listed_stopped(backend: Backend) {
    with_db(backend, |t| async move {
        let db = Db::connect(&t.url).await.expect("connect");
        // Another worker's entry makes the registry's table.
        registration(&db).await.write_entry().await;
        let reg = registration(&db).await;
        reg.stop().await;
        let state = |db: Db, id: String| async move {
            let listed = db.workers().await.expect("workers");
            let mine: Vec<_> = listed.into_iter().filter(|w| w.id == id).collect();
            assert_eq!(mine.len(), 1, "one entry of the worker");
            mine[0].state
        };
        let id = reg.entry.id.clone();
        assert_eq!(state(db.clone(), id.clone()).await, WorkerState::Stopped);
        let late = roster(&db).insert(&reg.entry, false).await;
        assert!(late.is_err(), "the late write finds its id taken");
        assert_eq!(state(db.clone(), id).await, WorkerState::Stopped);

        // An entry that did land is marked stopped, and stays the only one.
        let reg = registration(&db).await;
        reg.write_entry().await;
        reg.stop().await;
        assert_eq!(state(db, reg.entry.id.clone()).await, WorkerState::Stopped);
    })
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_a_worker_stopped_before_its_entry_landed_is_listed_stopped() {
    a_worker_stopped_before_its_entry_landed_is_listed_stopped(Backend::Postgres).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_a_worker_stopped_before_its_entry_landed_is_listed_stopped() {
    a_worker_stopped_before_its_entry_landed_is_listed_stopped(Backend::MySql).await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_a_worker_stopped_before_its_entry_landed_is_listed_stopped() {
    a_worker_stopped_before_its_entry_landed_is_listed_stopped(Backend::Sqlite).await;
}
