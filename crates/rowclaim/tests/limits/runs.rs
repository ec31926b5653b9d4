//! A worker that runs keys' lines claims a key's next run while its last one runs: the next run
//! joins the line the worker runs, behind the jobs it holds (`Claimer::claim_behind`). These
//! check what that must not change: a key's jobs one at a time and in line order, a failed
//! job's retry before the rest of its line, every job once; and that the worker did claim
//! ahead so (two claims' jobs of one key running at once in the database).

use super::postgres::one_at_a_time_by_key;
use super::*;

/// What the handlers of [`drain`] saw.
#[derive(Default)]
struct Ran {
    /// Each key's jobs as they started: `n` and the attempt.
    order: HashMap<String, Vec<(i64, i64)>>,
    /// Jobs of one key running at once in handlers, now and at most.
    per_key: HashMap<String, usize>,
    per_key_max: usize,
    /// The most claims (tokens) that held running jobs of one key at once, in the database.
    owners_max: i64,
}

/// Which jobs (by `n`) fail their first attempt, and which take half a second.
type Plan = (fn(i64) -> bool, fn(i64) -> bool);

/// Drains queue `name` (keys `keys`, job `n` of key `keys[n % keys.len()]`) with `workers`
/// workers (each on its own pool) of 4 slots and a prefetch of 60, so that each claims many
/// runs of each line; a job whose `n` `fails` fails its first attempt, one that is `slow` takes
/// half a second.
async fn drain(
    t: &Arc<TestDb>,
    name: &str,
    keys: &[&str],
    (fails, slow): Plan,
    workers: usize,
) -> Ran {
    let ran: Arc<Mutex<Ran>> = Arc::default();
    let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    let mut running = Vec::new();
    for _ in 0..workers {
        let db = t.db().await;
        let (seen, tdb, keys) = (ran.clone(), t.clone(), keys.clone());
        let worker = Worker::new(&db)
            .queue(name)
            .handle_any(move |job| {
                let (seen, tdb, keys) = (seen.clone(), tdb.clone(), keys.clone());
                let name = job.queue.clone();
                async move {
                    let n = job.payload["n"].as_i64().unwrap_or(-1);
                    let key = keys[n as usize % keys.len()].clone();
                    {
                        let mut r = seen.lock().unwrap();
                        r.order
                            .entry(key.clone())
                            .or_default()
                            .push((n, job.attempt));
                        let now = r.per_key.entry(key.clone()).or_default();
                        *now += 1;
                        let now = *now;
                        r.per_key_max = r.per_key_max.max(now);
                    }
                    let owners = tdb
                        .count(&format!(
                            "SELECT COUNT(DISTINCT owner) FROM rowclaim_jobs \
                             WHERE queue = '{name}' AND limit_key = '{key}' \
                             AND status = 'running'"
                        ))
                        .await;
                    if slow(n) {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    let mut r = seen.lock().unwrap();
                    r.owners_max = r.owners_max.max(owners);
                    *r.per_key.entry(key).or_default() -= 1;
                    if fails(n) && job.attempt == 1 {
                        return Err("the first try fails".to_owned());
                    }
                    Ok::<(), String>(())
                }
            })
            .concurrency(4)
            .prefetch(60)
            .lease(Duration::from_secs(30))
            .poll(Duration::from_millis(50))
            .until_empty(true);
        running.push(tokio::spawn(async move {
            worker.run(std::future::pending()).await
        }));
    }
    for r in running {
        r.await.expect("worker task").expect("worker");
    }
    let ran = std::mem::take(&mut *ran.lock().unwrap());
    ran
}

/// Each key's jobs ran one at a time, in line order, a failed job's retry right after its
/// first try; and two claims' jobs of one key ran at once (the worker claimed a next run
/// while the last one ran).
fn assert_lines_held(ran: &Ran, keys: &[&str], jobs: i64, fails: fn(i64) -> bool) {
    assert_eq!(ran.per_key_max, 1, "jobs of one key ran at once");
    for (i, key) in keys.iter().enumerate() {
        let mut expected = Vec::new();
        for n in (0..jobs).filter(|n| *n as usize % keys.len() == i) {
            expected.push((n, 1));
            if fails(n) {
                expected.push((n, 2));
            }
        }
        let order = ran.order.get(*key).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(order, expected.as_slice(), "key {key}: line order");
    }
    assert!(
        ran.owners_max >= 2,
        "the worker claimed no key's next run while its last one ran (at most {} claims \
         held a key's jobs at once)",
        ran.owners_max
    );
}

fn never(_: i64) -> bool {
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_next_run_joins_its_line_one_at_a_time_in_order() {
    with_db(Backend::Postgres, |t| async move {
        let q = queue(&t).await;
        let keys = ["a", "b", "c"];
        one_at_a_time_by_key(&q, "next", &keys, 900).await;
        let ran = drain(&t, "next", &keys, (never, never), 1).await;
        assert_lines_held(&ran, &keys, 900, never);
        all_ran_once(&t, "next", 900).await;
    })
    .await
}

/// Jobs 100, 240, 380, 520 and 660 (of keys b, a, b, c, a: `n % 3`) fail their first try.
fn some_fail(n: i64) -> bool {
    n >= 100 && n % 140 == 100
}

/// A job fails while the worker has its key's next run claimed, or a claim of it under way:
/// that run goes back unstarted with the rest of the line, and the key's later jobs run only
/// after the retry, in line order. Each retry's write takes half a second (a trigger), so that
/// claims start, and run, while the failed job still shows as running under its claim's
/// token: they must not count it as the worker's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_run_claimed_behind_a_job_that_failed_waits_for_its_retry() {
    with_db(Backend::Postgres, |t| async move {
        let q = queue(&t).await;
        let keys = ["a", "b", "c"];
        one_at_a_time_by_key(&q, "behind", &keys, 700).await;
        t.exec(
            "CREATE FUNCTION slow_retry() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF OLD.status = 'running' AND NEW.status = 'ready' \
             AND NEW.run_at > now() + interval '100 milliseconds' \
             THEN PERFORM pg_sleep(0.5); END IF; RETURN NEW; END $$",
        )
        .await;
        t.exec(
            "CREATE TRIGGER slow_retry BEFORE UPDATE ON rowclaim_jobs \
             FOR EACH ROW EXECUTE FUNCTION slow_retry()",
        )
        .await;
        let ran = drain(&t, "behind", &keys, (some_fail, never), 1).await;
        assert_lines_held(&ran, &keys, 700, some_fail);
        let twice = completed_on_second_try(&t, "behind").await;
        assert_eq!(twice, 5, "only the failed jobs ran twice");
        all_ran_once(&t, "behind", 695).await;
    })
    .await
}

/// Two workers: each claims the next runs of the lines it runs, never of a line the other
/// runs (its jobs there are not its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_claim_next_runs_of_their_own_lines_only() {
    with_db(Backend::Postgres, |t| async move {
        let q = queue(&t).await;
        let keys = ["a", "b", "c", "d"];
        one_at_a_time_by_key(&q, "two", &keys, 1200).await;
        let ran = drain(&t, "two", &keys, (never, never), 2).await;
        assert_lines_held(&ran, &keys, 1200, never);
        all_ran_once(&t, "two", 1200).await;
    })
    .await
}

fn first(n: i64) -> bool {
    n == 0
}

/// A dead worker's last job of key a, its lease running out a second into the drain, while the
/// worker's claims take runs of keys b and c: the claim that takes it again takes it on its
/// own, not in a line (its key is not known there), so that claim is not whole and its token
/// not the worker's own: no later claim takes key a's next run while that job runs (it takes
/// half a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_taken_again_alone_keeps_its_key_from_the_next_claims() {
    with_db(Backend::Postgres, |t| async move {
        let q = queue(&t).await;
        let keys = ["a", "b", "c"];
        one_at_a_time_by_key(&q, "alone", &keys, 3000).await;
        t.exec(
            "UPDATE rowclaim_jobs SET status = 'running', owner = 'gone', \
             lease_until = now() + interval '1 second' WHERE id = (SELECT MIN(id) \
             FROM rowclaim_jobs WHERE queue = 'alone' AND limit_key = 'a')",
        )
        .await;
        let ran = drain(&t, "alone", &keys, (never, first), 1).await;
        assert_lines_held(&ran, &keys, 3000, never);
        all_ran_once(&t, "alone", 3000).await;
    })
    .await
}
