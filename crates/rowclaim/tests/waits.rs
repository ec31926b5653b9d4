//! Jobs that wait for other jobs, on every backend: groups released once after all their jobs
//! completed under three workers at once, a dead member cancelling its group's last job, the
//! rules at enqueue (unknown ids, finished jobs), cancels that cascade, jobs deleted when they
//! complete, a prune that strands no one, and jobs that wait enqueued inside the caller's own
//! transaction.

use rowclaim_testkit as common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use rowclaim::{Db, ErrorKind, Job, NewJob, Queue, Retention, Worker};
use serde_json::json;

// Jobs that wait, enqueued inside the caller's own transaction.
#[path = "waits/own_tx.rs"]
mod own_tx;
use own_tx::own_transaction;

async fn ready_queue(t: &TestDb) -> (Db, Queue) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    (db, q)
}

/// Groups to enqueue: `ROWCLAIM_WAIT_GROUPS`, else 1,000 (the figure).
fn groups() -> usize {
    std::env::var("ROWCLAIM_WAIT_GROUPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000)
}

/// Every group's job 4 of every 7th group fails once (its last job must keep waiting through
/// the retry); job 7 of every 50th group fails for good (its last job is cancelled naming it).
fn member(group: usize, i: usize) -> NewJob {
    let job = NewJob::new(json!({"group": group, "i": i})).kind("member");
    if group % 50 == 3 && i == 7 {
        job.kind("doomed").max_attempts(1)
    } else if group % 7 == 2 && i == 4 {
        job.kind("flaky")
    } else {
        job
    }
}

/// What the handlers saw: members finished per group (counted as their handler returns Ok),
/// and each last job's runs, each with the smaller of the count of its group's handlers that
/// had returned and the count of the jobs it waits for that the database had completed.
#[derive(Default)]
struct Seen {
    finished: HashMap<u64, u64>,
    last_runs: HashMap<u64, Vec<u64>>,
}

fn group_of(job: &Job) -> u64 {
    job.payload["group"].as_u64().unwrap_or(u64::MAX)
}

/// A worker of its own connection pool with the handlers of the group test.
async fn worker(t: &TestDb, seen: Arc<Mutex<Seen>>) -> Worker {
    let db = t.db().await;
    let queue = db.queue();
    let (a, b) = (seen.clone(), seen);
    Worker::new(&db)
        .handle("member", move |job: Job| {
            let seen = a.clone();
            async move {
                *seen
                    .lock()
                    .unwrap()
                    .finished
                    .entry(group_of(&job))
                    .or_default() += 1;
                Ok::<_, String>(())
            }
        })
        .handle("flaky", {
            let seen = b.clone();
            move |job: Job| {
                let seen = seen.clone();
                async move {
                    if job.attempt == 1 {
                        return Err("fails once".to_owned());
                    }
                    *seen
                        .lock()
                        .unwrap()
                        .finished
                        .entry(group_of(&job))
                        .or_default() += 1;
                    Ok(())
                }
            }
        })
        .handle("doomed", |_job: Job| async { Err::<(), _>("never works") })
        .handle("last", move |job: Job| {
            let (seen, queue) = (b.clone(), queue.clone());
            async move {
                // As the database has it while this runs: how many of the jobs it waits for
                // are completed.
                let links = queue.links(job.id).await.map_err(|e| e.to_string())?;
                let completed = links
                    .waits_for
                    .iter()
                    .filter(|l| l.status.as_deref() == Some("completed"))
                    .count() as u64;
                let mut s = seen.lock().unwrap();
                let g = group_of(&job);
                let done = s.finished.get(&g).copied().unwrap_or(0);
                s.last_runs.entry(g).or_default().push(done.min(completed));
                Ok::<_, String>(())
            }
        })
        .concurrency(8)
        .poll(Duration::from_millis(50))
        // Far longer than the test: no lease runs out, so no job may run twice.
        .lease(Duration::from_secs(120))
}

/// With 3 workers, `groups()` groups of 10 jobs and a last job each, enqueued while the workers
/// run: every last job ran once, after all 10 of its group completed; a group with a dead
/// member has its last job cancelled naming that member.
async fn groups_release_once(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    let n = groups();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = tokio_util_like::Stop::default();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let w = worker(&t, seen.clone()).await;
        let stop = stop.clone();
        workers.push(tokio::spawn(async move { w.run(stop.wait()).await }));
    }
    let mut lasts = HashMap::new();
    let started = std::time::Instant::now();
    // Four enqueuers at once, as the workers run.
    let mut enqueuers = Vec::new();
    for e in 0..4 {
        let q = q.clone();
        enqueuers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for g in (e..n).step_by(4) {
                let jobs: Vec<NewJob> = (0..10).map(|i| member(g, i)).collect();
                let last = NewJob::new(json!({"group": g})).kind("last");
                let group = q.enqueue_group(&jobs, last).await.expect("enqueue a group");
                assert_eq!(group.jobs.len(), 10);
                got.push((g as u64, group));
            }
            got
        }));
    }
    for e in enqueuers {
        lasts.extend(e.await.unwrap());
    }
    eprintln!("enqueued {n} groups in {:?}", started.elapsed());
    let finished = "SELECT COUNT(*) FROM rowclaim_jobs WHERE kind = 'last' \
                    AND status IN ('completed', 'cancelled')";
    for _ in 0..1_200 {
        if t.count(finished).await == n as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("finished in {:?}", started.elapsed());
    stop.set();
    for w in workers {
        w.await.unwrap().expect("a worker");
    }
    assert_eq!(t.count(finished).await, n as i64, "every last job finished");
    let last_runs = std::mem::take(&mut seen.lock().unwrap().last_runs);
    for (g, group) in &lasts {
        let doomed = g % 50 == 3;
        let last = q.get(group.last.id).await.unwrap().expect("the last job");
        if doomed {
            assert_eq!(last.status, "cancelled", "group {g}");
            let dead = group.jobs[7].id;
            let said = last.last_error.clone().unwrap_or_default();
            assert!(said.contains(&format!("job {dead}, ")), "group {g}: {said}");
            assert!(said.contains("dead"), "group {g}: {said}");
            assert!(!last_runs.contains_key(g), "group {g}'s last job never ran");
        } else {
            assert_eq!(last.status, "completed", "group {g}");
            assert_eq!(last.attempts, 1, "group {g}: claimed once");
            assert_eq!(
                last_runs.get(g).map(Vec::as_slice),
                Some(&[10][..]),
                "group {g}: ran once, after its 10 jobs"
            );
        }
    }
}

/// The rules at enqueue, and what a cancel does to the jobs that wait.
async fn enqueue_rules(t: Arc<TestDb>) {
    let (_db, q) = ready_queue(&t).await;
    let lease = Duration::from_secs(30);
    let claimer = q.claimer(&[]).await.unwrap();

    // An unknown id is refused, naming it; nothing is enqueued.
    let err = q
        .enqueue(&NewJob::new(json!({})).after([987_654]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput);
    assert!(err.to_string().contains("job 987654"), "{err}");
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 0);
    let err = NewJob::new(json!({})).after([1]).unique_key("k");
    assert!(q.enqueue(&err).await.is_err(), "after and a unique key");

    // A waiting job is not claimed; its links show both ways.
    let a = q.enqueue(&NewJob::new(json!({"a": 1}))).await.unwrap().id;
    let w = q
        .enqueue(&NewJob::new(json!({"w": 1})).after([a]))
        .await
        .unwrap()
        .id;
    assert_eq!(q.get(w).await.unwrap().unwrap().status, "waiting");
    let links = q.links(w).await.unwrap();
    assert_eq!(links.waits_for.len(), 1);
    assert_eq!(links.waits_for[0].id, a);
    assert_eq!(q.links(a).await.unwrap().waited_by[0].id, w);
    let c = claimer.claim(10, lease).await.unwrap();
    assert_eq!(c.len(), 1, "only the job waited for is claimable");
    c.complete(&c.rows()[0].id).await.unwrap();
    // Settled by hand: the look is the caller's (a worker looks by itself).
    assert_eq!(q.release_waiting().await.unwrap(), 1);
    assert_eq!(q.get(w).await.unwrap().unwrap().status, "ready");
    assert_eq!(q.release_waiting().await.unwrap(), 0, "released once");

    // A completed job counts as done at enqueue.
    let now = q
        .enqueue(&NewJob::new(json!({})).after([a]))
        .await
        .unwrap()
        .id;
    assert_eq!(q.get(now).await.unwrap().unwrap().status, "ready");

    // A dead job cancels at once, naming it; or runs anyway.
    let d = q
        .enqueue(&NewJob::new(json!({"d": 1})).priority(100).max_attempts(1))
        .await
        .unwrap()
        .id;
    let c = claimer.claim(1, lease).await.unwrap();
    assert_eq!(c.rows()[0].id.to_string(), d.to_string());
    c.fail(&c.rows()[0].id).await.unwrap();
    let x = q
        .enqueue(&NewJob::new(json!({})).after([a, d]))
        .await
        .unwrap()
        .id;
    let x = q.get(x).await.unwrap().unwrap();
    assert_eq!(x.status, "cancelled");
    assert!(
        x.last_error
            .as_deref()
            .is_some_and(|e| e.contains(&format!("job {d}, ")) && e.contains("dead")),
        "{x:?}"
    );
    let y = q
        .enqueue(&NewJob::new(json!({})).after([d]).run_anyway())
        .await
        .unwrap()
        .id;
    assert_eq!(q.get(y).await.unwrap().unwrap().status, "ready");

    // A cancel cancels what waits for it, and what waits for that; a job that runs anyway
    // is released instead.
    let b = q.enqueue(&NewJob::new(json!({"b": 1}))).await.unwrap().id;
    let w1 = q
        .enqueue(&NewJob::new(json!({})).after([b]))
        .await
        .unwrap()
        .id;
    let w2 = q
        .enqueue(&NewJob::new(json!({})).after([w1]))
        .await
        .unwrap()
        .id;
    let w3 = q
        .enqueue(&NewJob::new(json!({})).after([b]).run_anyway())
        .await
        .unwrap()
        .id;
    assert!(q.cancel(b).await.unwrap());
    let said = |id| {
        let q = q.clone();
        async move {
            let r = q.get(id).await.unwrap().unwrap();
            (r.status, r.last_error.unwrap_or_default())
        }
    };
    let (s1, e1) = said(w1).await;
    assert_eq!(s1, "cancelled");
    assert!(
        e1.contains(&format!("job {b}, ")) && e1.contains("cancelled"),
        "{e1}"
    );
    let (s2, e2) = said(w2).await;
    assert_eq!(s2, "cancelled", "the cancel cascades");
    assert!(e2.contains(&format!("job {w1}, ")), "{e2}");
    assert_eq!(said(w3).await.0, "ready", "runs anyway");

    // A job deleted before it completed cancels what waits for it.
    let e = q.enqueue(&NewJob::new(json!({"e": 1}))).await.unwrap().id;
    let w4 = q
        .enqueue(&NewJob::new(json!({})).after([e]))
        .await
        .unwrap()
        .id;
    assert!(q.delete(e).await.unwrap());
    let (s4, e4) = said(w4).await;
    assert_eq!(s4, "cancelled", "{e4}");
    assert!(e4.contains(&format!("job {e}, ")), "{e4}");
}

/// A job deleted when it completes still releases the jobs that wait for it; a prune cancels
/// the jobs waiting for a dead job before it deletes that job.
async fn deleted_and_pruned(t: Arc<TestDb>) {
    let (db, q) = ready_queue(&t).await;
    let group = q
        .enqueue_group(
            &(0..3)
                .map(|i| NewJob::new(json!({ "i": i })).kind("member"))
                .collect::<Vec<_>>(),
            NewJob::new(json!({})).kind("last"),
        )
        .await
        .unwrap();
    let ran = Arc::new(Mutex::new(Vec::new()));
    let r = ran.clone();
    let report = Worker::new(&db)
        .handle_any(move |job: Job| {
            let ran = r.clone();
            async move {
                ran.lock().unwrap().push(job.kind);
                Ok::<_, String>(())
            }
        })
        .retention(Retention::Delete)
        .until_empty(true)
        .poll(Duration::from_millis(50))
        .run(std::future::pending())
        .await
        .unwrap();
    assert_eq!(report.completed, 4, "{report:?}");
    assert_eq!(ran.lock().unwrap().last().map(String::as_str), Some("last"));
    assert!(q.get(group.last.id).await.unwrap().is_none(), "deleted too");

    // A dead job whose waiter nobody looked at yet (settled by hand): the prune cancels the
    // waiter, then deletes the dead job.
    let d = q
        .enqueue(&NewJob::new(json!({})).max_attempts(1))
        .await
        .unwrap()
        .id;
    let w = q
        .enqueue(&NewJob::new(json!({})).after([d]))
        .await
        .unwrap()
        .id;
    let c = q.claimer(&[]).await.unwrap();
    let claim = c.claim(5, Duration::from_secs(30)).await.unwrap();
    assert_eq!(claim.len(), 1);
    claim.fail(&claim.rows()[0].id).await.unwrap();
    assert_eq!(q.get(w).await.unwrap().unwrap().status, "waiting");
    // Past the dead job's finish by every database's clock (SQLite's is in milliseconds).
    tokio::time::sleep(Duration::from_millis(20)).await;
    q.prune(Duration::ZERO).await.unwrap();
    assert!(q.get(d).await.unwrap().is_none(), "pruned");
    // The waiter was cancelled first (and pruned with it): neither left waiting nor released
    // for a job that is gone.
    q.release_waiting().await.unwrap();
    let left = "SELECT COUNT(*) FROM rowclaim_jobs WHERE status IN ('waiting', 'ready')";
    assert_eq!(t.count(left).await, 0, "job {w} not stranded, not released");
}

/// A stop switch the workers' `run` waits on.
mod tokio_util_like {
    use std::sync::Arc;

    #[derive(Clone, Default)]
    pub struct Stop(Arc<tokio::sync::Notify>, Arc<std::sync::atomic::AtomicBool>);

    impl Stop {
        pub fn set(&self) {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            self.0.notify_waiters();
        }

        pub async fn wait(self) {
            loop {
                let notified = self.0.notified();
                if self.1.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        }
    }
}

macro_rules! wait_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn groups_released_once_under_three_workers() {
            with_db($backend, groups_release_once).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn rules_at_enqueue_and_cancels() {
            with_db($backend, enqueue_rules).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn deleted_on_completion_and_pruned() {
            with_db($backend, deleted_and_pruned).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn enqueued_in_own_transaction() {
            with_db($backend, own_transaction).await
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    wait_cases!(Backend::Postgres);
}
#[cfg(feature = "sqlite")]
mod sqlite {
    wait_cases!(Backend::Sqlite);
}
#[cfg(feature = "mysql")]
mod mysql {
    wait_cases!(Backend::MySql);
}
