//! Queue limits, on every backend, with several workers on pools of their own (as processes on
//! other machines would be): no limit is ever exceeded, every job runs once, and per-key jobs
//! start in enqueue order. The limits are checked against what the handlers saw (a handler runs
//! inside its job's claim, so what overlaps there overlapped in the database) and against the
//! database's own record of each start (`attempted_at`); never against timings.

use rowclaim_testkit as common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use common::{with_db, Backend, TestDb};
use rowclaim::{Error, JobFilter, NewJob, Queue, QueueLimits, Rate, Worker};
use serde_json::json;

/// What the handlers saw: how many ran at once, in the queue and per key, at most; and the
/// order in which each key's jobs started.
#[derive(Default)]
struct Seen {
    running: usize,
    running_max: usize,
    per_key: HashMap<String, usize>,
    per_key_max: usize,
    order: HashMap<String, Vec<i64>>,
}

impl Seen {
    /// Asserts that each of `keys` ran `jobs` jobs, never more than `per_key` of them at once,
    /// and (one at a time) in enqueue order.
    fn assert_keys_held(&self, keys: &[&str], per_key: u32, jobs: usize) {
        assert!(
            self.per_key_max <= per_key as usize,
            "{} jobs of one key ran at once",
            self.per_key_max
        );
        for key in keys {
            let order = self
                .order
                .get(*key)
                .unwrap_or_else(|| panic!("no job of key {key} ran"));
            assert_eq!(order.len(), jobs, "key {key}");
            if per_key == 1 {
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(order, &sorted, "key {key} ran out of enqueue order");
            }
        }
    }
}

/// Runs `workers` workers (each on its own pool) over queue `queue` until `jobs` jobs completed,
/// each handler taking `work`; returns what the handlers saw.
async fn run_workers(
    t: &Arc<TestDb>,
    queue: &str,
    workers: usize,
    jobs: i64,
    work: Duration,
) -> Seen {
    run_workers_polling(t, queue, workers, jobs, work, Duration::from_millis(50)).await
}

/// [`run_workers`], the workers looking again every `poll` when they found nothing. Gives up
/// waiting after two minutes, and drains them.
async fn run_workers_polling(
    t: &Arc<TestDb>,
    queue: &str,
    workers: usize,
    jobs: i64,
    work: Duration,
    poll: Duration,
) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut running = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..workers {
        let db = t.db().await;
        let seen = seen.clone();
        let worker = Worker::new(&db)
            .queue(queue)
            .handle_any(move |job| {
                let seen = seen.clone();
                async move {
                    let key = job.payload["key"].as_str().unwrap_or_default().to_owned();
                    let n = job.payload["n"].as_i64().unwrap_or(-1);
                    {
                        let mut s = seen.lock().unwrap();
                        s.running += 1;
                        s.running_max = s.running_max.max(s.running);
                        let k = s.per_key.entry(key.clone()).or_default();
                        *k += 1;
                        let k = *k;
                        s.per_key_max = s.per_key_max.max(k);
                        s.order.entry(key.clone()).or_default().push(n);
                    }
                    tokio::time::sleep(work).await;
                    let mut s = seen.lock().unwrap();
                    s.running -= 1;
                    *s.per_key.entry(key).or_default() -= 1;
                    Ok::<_, String>(())
                }
            })
            .concurrency(4)
            .lease(Duration::from_secs(30))
            .poll(poll);
        stops.push(worker.shutdown_handle());
        running.push(tokio::spawn(async move {
            worker.run(std::future::pending()).await
        }));
    }
    let done = format!(
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = '{queue}' AND status = 'completed'"
    );
    for _ in 0..1200 {
        if t.count(&done).await >= jobs {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for s in &stops {
        s.drain();
    }
    for r in running {
        r.await.expect("worker task").expect("worker");
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.running, 0, "every handler ended");
    seen
}

async fn queue(t: &TestDb) -> Queue {
    let q = t.db().await.queue();
    q.init().await.expect("init");
    q
}

/// How many jobs of `queue` completed on their second attempt.
#[cfg(feature = "postgres")]
async fn completed_on_second_try(t: &TestDb, queue: &str) -> i64 {
    t.count(&format!(
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = '{queue}' \
         AND status = 'completed' AND attempts = 2"
    ))
    .await
}

/// Every job of `queue` completed on its first attempt.
async fn all_ran_once(t: &TestDb, queue: &str, jobs: i64) {
    assert_eq!(
        t.count(&format!(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = '{queue}' \
             AND status = 'completed' AND attempts = 1"
        ))
        .await,
        jobs,
        "{jobs} jobs of {queue} ran once each"
    );
}

/// A worker's own results free the places of its keys' lines: it claims a line's next job once
/// the last one's result is written, not at its next poll (an hour here). A claim that ran
/// while results were being written came back empty and idled until the poll, and without
/// `until_empty` results did not end an idle spell at all (10 keys one at a time: about 200
/// jobs/s instead of 900 at a poll of 100 ms).
async fn own_results_free_places_without_a_poll(t: Arc<TestDb>) {
    let q = queue(&t).await;
    q.limit("lines", &QueueLimits::default().key_concurrency(1))
        .await
        .unwrap();
    let keys = ["a", "b"];
    let jobs: Vec<NewJob> = (0..40)
        .map(|n| {
            let key = keys[n % 2];
            NewJob::new(json!({ "key": key, "n": n }))
                .queue("lines")
                .limit_key(key)
        })
        .collect();
    q.enqueue_many(&jobs).await.unwrap();
    let an_hour = Duration::from_secs(3600);
    let seen = run_workers_polling(&t, "lines", 1, 40, Duration::ZERO, an_hour).await;
    all_ran_once(&t, "lines", 40).await;
    seen.assert_keys_held(&keys, 1, 20);
}

/// A per-key concurrency under a queue concurrency of 3: three workers of four slots each run
/// at most three jobs at once, never more than `per_key` of one key, and (one at a time) each
/// key's jobs in enqueue order. 1 and 2 take the two ways a limited claim picks jobs.
async fn concurrency_per_queue_and_key(t: Arc<TestDb>, per_key: u32) {
    let q = queue(&t).await;
    q.limit(
        "l",
        &QueueLimits::default()
            .concurrency(3)
            .key_concurrency(per_key),
    )
    .await
    .unwrap();
    let keys = ["a", "b", "c", "d"];
    let jobs: Vec<NewJob> = (0..32)
        .map(|n| {
            let key = keys[n % keys.len()];
            NewJob::new(json!({ "key": key, "n": n }))
                .queue("l")
                .limit_key(key)
                // Priorities against the enqueue order: within a key, enqueue order wins.
                .priority((n % 3) as i32)
        })
        .collect();
    q.enqueue_many(&jobs).await.unwrap();
    let seen = run_workers(&t, "l", 3, 32, Duration::from_millis(30)).await;
    all_ran_once(&t, "l", 32).await;
    seen.assert_keys_held(&keys, per_key, 8);
    assert!(seen.running_max <= 3, "{} ran at once", seen.running_max);
    // The settings say so; lifting the limits hands the queue back to the ordinary claim.
    let settings = q.settings().await.unwrap();
    let l = settings
        .iter()
        .find(|s| s.name == "l")
        .expect("settings of l");
    assert_eq!(l.limits.concurrency, Some(3));
    assert_eq!(l.limits.key_concurrency, Some(per_key));
    assert_eq!(l.paused_at, None);
    q.limit("l", &QueueLimits::default()).await.unwrap();
    assert!(q.settings().await.unwrap().iter().all(|s| s.name != "l"));
    q.enqueue(
        &NewJob::new(json!({ "key": "a", "n": 99 }))
            .queue("l")
            .limit_key("a"),
    )
    .await
    .unwrap();
    run_workers(&t, "l", 1, 33, Duration::ZERO).await;
    all_ran_once(&t, "l", 33).await;
}

/// When each job of `queue` started, by the database's clock, in milliseconds, per limit key
/// (`""`: all of them).
async fn starts(q: &Queue, queue: &str) -> HashMap<String, Vec<u128>> {
    let mut by_key: HashMap<String, Vec<u128>> = HashMap::new();
    for job in q
        .list(&JobFilter::new().queues([queue]).limit(1000))
        .await
        .unwrap()
    {
        let at = job
            .attempted_at
            .expect("a completed job has a start")
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        by_key.entry(String::new()).or_default().push(at);
        if let Some(k) = job.limit_key {
            by_key.entry(k).or_default().push(at);
        }
    }
    for v in by_key.values_mut() {
        v.sort_unstable();
    }
    by_key
}

/// No period-long stretch of `starts` holds more than `rate.jobs` of them (a millisecond of
/// slack: the stores keep starts in whole milliseconds).
fn within(starts: &[u128], rate: Rate, what: &str) {
    let n = rate.jobs as usize;
    for w in starts.windows(n + 1) {
        assert!(
            w[n] - w[0] + 1 >= rate.per.as_millis(),
            "{what}: {} starts within {} ms: {w:?}",
            n + 1,
            w[n] - w[0]
        );
    }
}

/// A queue rate and a per-key rate of `per_key` starts: two workers start no more than the
/// rates allow in any period-long stretch, by the database's record of each start. 1 and 2 take
/// the two ways a limited claim picks jobs.
async fn rates(t: Arc<TestDb>, per_key: u32) {
    let q = queue(&t).await;
    let (rate, key_rate) = (
        Rate::new(4, Duration::from_millis(600)),
        Rate::new(per_key, Duration::from_millis(400)),
    );
    let mut limits = QueueLimits::default().rate(rate).key_rate(key_rate);
    if per_key > 1 {
        // Both per-key limits at once: both counts beside the numbered lines.
        limits = limits.key_concurrency(per_key);
    }
    q.limit("r", &limits).await.unwrap();
    let jobs: Vec<NewJob> = (0..14)
        .map(|n| {
            let job = NewJob::new(json!({ "n": n })).queue("r");
            // Two jobs without a key: only the queue's rate counts them.
            match n {
                0 | 7 => job,
                _ => job.limit_key(["x", "y", "z"][n % 3]),
            }
        })
        .collect();
    q.enqueue_many(&jobs).await.unwrap();
    run_workers(&t, "r", 2, 14, Duration::ZERO).await;
    all_ran_once(&t, "r", 14).await;
    let starts = starts(&q, "r").await;
    within(&starts[""], rate, "queue r");
    for key in ["x", "y", "z"] {
        within(&starts[key], key_rate, key);
    }
    // Starts older than the longest period are not kept: the next claim, after that long,
    // drops every start of the first run. Its own start stays until a claim a period later,
    // which a slow machine may reach before the workers stop, so it is at most one.
    let last_start = starts[""].last().copied().unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(700)).await;
    q.enqueue(&NewJob::new(json!({ "n": 14 })).queue("r"))
        .await
        .unwrap();
    run_workers(&t, "r", 1, 15, Duration::ZERO).await;
    let kept = "SELECT COUNT(*) FROM rowclaim_starts WHERE queue = 'r'";
    assert_eq!(
        t.count(&format!("{kept} AND started_ms <= {last_start}"))
            .await,
        0,
        "starts of the first run left after a claim a period later"
    );
    assert!(
        t.count(kept).await <= 1,
        "more than the last claim's start kept"
    );
}

/// Limits that cannot work are refused, naming what is wrong, and nothing is written.
async fn bad_limits(t: Arc<TestDb>) {
    let q = queue(&t).await;
    for (limits, says) in [
        (QueueLimits::default().concurrency(0), "concurrency"),
        (
            QueueLimits::default().key_concurrency(0),
            "per-key concurrency",
        ),
        (
            QueueLimits::default().rate(Rate::new(0, Duration::from_secs(1))),
            "rate",
        ),
        (
            QueueLimits::default().key_rate(Rate::new(1, Duration::ZERO)),
            "per-key rate's period",
        ),
    ] {
        match q.limit("bad", &limits).await {
            Err(Error::InvalidInput(m)) => assert!(m.contains(says), "{m}"),
            other => panic!("{limits:?}: {other:?}"),
        }
    }
    assert!(q.settings().await.unwrap().is_empty());
    match q
        .enqueue(&NewJob::new(json!({})).queue("bad").limit_key(""))
        .await
    {
        Err(Error::InvalidInput(m)) => assert!(m.contains("limit key"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// A key whose line is deeper than a claim looks into the queue's order hides no other key's
/// first jobs, nor a job without a key: with 1,200 jobs of key a ahead of key b's two and one
/// job without a key (`-0`), one claim takes the `first` of each line and the keyless job, and
/// the next (while those run, or within the rate's period) takes nothing; a job without a key
/// enqueued then is the one after.
async fn a_deep_line_hides_no_other_key(t: Arc<TestDb>, limits: QueueLimits, first: &[&str]) {
    let q = queue(&t).await;
    q.limit("deep", &limits).await.unwrap();
    let job = |key: &str, n: usize| {
        NewJob::new(json!({"key": key, "n": n}))
            .queue("deep")
            .limit_key(key)
    };
    let mut jobs: Vec<NewJob> = (0..1200).map(|n| job("a", n)).collect();
    jobs.extend((0..2).map(|n| job("b", n)));
    jobs.push(NewJob::new(json!({"key": "-", "n": 0})).queue("deep"));
    q.enqueue_many(&jobs).await.unwrap();
    let claimer = q.claimer(&["deep".to_owned()]).await.unwrap();
    let taken = |claim: &rowclaim::Claim| {
        let mut t: Vec<String> = claim
            .rows()
            .iter()
            .map(|r| {
                // The payload comes as the JSON text it is stored as.
                let p: serde_json::Value = match &r.data["payload"] {
                    serde_json::Value::String(text) => serde_json::from_str(text).unwrap(),
                    other => other.clone(),
                };
                format!("{}{}", p["key"].as_str().unwrap_or("?"), p["n"])
            })
            .collect();
        t.sort();
        t
    };
    let claim = claimer.claim(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(taken(&claim), first, "{limits:?}");
    let next = claimer.claim(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(taken(&next), Vec::<String>::new(), "{limits:?}");
    // A job without a key behind the deep line, enqueued now: the claimer looked for such jobs
    // a moment ago, and looks again only now and then while it finds others, but a claim that
    // finds nothing else always looks.
    q.enqueue(&NewJob::new(json!({"key": "-", "n": 1})).queue("deep"))
        .await
        .unwrap();
    let last = claimer.claim(10, Duration::from_secs(60)).await.unwrap();
    assert_eq!(taken(&last), ["-1"], "{limits:?}");
}

/// A limited claim hands its jobs on as an ordinary claim does: the same row for the same job
/// (the limited claim reads its rows by a statement of its own), down to a payload that is a
/// JSON string reading as a number, which must reach the handler as that string.
async fn limited_rows_are_ordinary_rows(t: Arc<TestDb>) {
    let q = queue(&t).await;
    q.limit("limited", &QueueLimits::default().key_concurrency(1))
        .await
        .unwrap();
    let payloads = [
        json!("123"),
        json!({"nested": {"list": [1, "two", null]}, "text": "é \" '"}),
        json!(null),
        json!(4.5),
    ];
    let jobs = |queue: &str| -> Vec<NewJob> {
        payloads
            .iter()
            .enumerate()
            .map(|(i, p)| {
                NewJob::new(p.clone())
                    .queue(queue)
                    .kind("k")
                    .priority(3)
                    .max_attempts(7)
                    .timeout(Duration::from_millis(1500))
                    .unique_key(format!("{queue}-{i}"))
                    .limit_key(format!("key-{i}"))
            })
            .collect()
    };
    q.enqueue_many(&jobs("plain")).await.unwrap();
    q.enqueue_many(&jobs("limited")).await.unwrap();
    let mut rows = Vec::new();
    for queue in ["plain", "limited"] {
        let claimer = q.claimer(&[queue.to_owned()]).await.unwrap();
        let claim = claimer.claim(10, Duration::from_secs(60)).await.unwrap();
        let mut read: Vec<(serde_json::Value, rowclaim::Job)> = claim
            .rows()
            .iter()
            .map(|r| {
                let mut data = r.data.clone();
                let fields = data.as_object_mut().unwrap();
                fields.remove("id");
                fields.remove("queue");
                let mut job = rowclaim::Job::from_row(r).unwrap();
                job.id = 0;
                job.queue = String::new();
                (data, job)
            })
            .collect();
        read.sort_by_key(|(data, _)| data["unique_key"].as_str().unwrap_or("").to_owned());
        assert_eq!(
            read.len(),
            payloads.len(),
            "{queue}: one claim takes every job"
        );
        rows.push(read);
    }
    let (plain, limited) = (&rows[0], &rows[1]);
    for ((plain_row, plain_job), (limited_row, limited_job)) in plain.iter().zip(limited) {
        let key = |row: &serde_json::Value| row["unique_key"].as_str().unwrap_or("").to_owned();
        assert_eq!(key(limited_row), key(plain_row).replace("plain", "limited"));
        let mut limited_row = limited_row.clone();
        limited_row["unique_key"] = plain_row["unique_key"].clone();
        assert_eq!(limited_row, *plain_row, "the same row from either claim");
        assert_eq!(limited_job, plain_job, "the same job from either claim");
    }
    let read: Vec<_> = limited.iter().map(|(_, job)| job.payload.clone()).collect();
    assert!(
        read.contains(&json!("123")),
        "a JSON string stays one: {read:?}"
    );
    assert!(limited.iter().all(|(_, job)| job.attempt == 1
        && job.max_attempts == 7
        && job.timeout == Some(Duration::from_millis(1500))));
}

macro_rules! limit_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn concurrency_limits_hold_across_workers_and_keys_run_in_order() {
            with_db($backend, |t| concurrency_per_queue_and_key(t, 1)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn concurrency_limits_of_two_per_key_hold_across_workers() {
            with_db($backend, |t| concurrency_per_queue_and_key(t, 2)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_workers_own_results_free_places_without_waiting_for_its_poll() {
            with_db($backend, own_results_free_places_without_a_poll).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn rate_limits_hold_across_workers() {
            with_db($backend, |t| rates(t, 1)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn rate_limits_of_two_per_key_hold_across_workers() {
            with_db($backend, |t| rates(t, 2)).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_deep_line_of_one_key_at_a_time_hides_no_other_key() {
            let one_at_a_time = QueueLimits::default().key_concurrency(1);
            with_db($backend, |t| {
                a_deep_line_hides_no_other_key(t, one_at_a_time, &["-0", "a0", "b0"])
            })
            .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_deep_line_of_one_start_an_hour_hides_no_other_key() {
            let hourly = QueueLimits::default().key_rate(Rate::new(1, Duration::from_secs(3600)));
            with_db($backend, |t| {
                a_deep_line_hides_no_other_key(t, hourly, &["-0", "a0", "b0"])
            })
            .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_deep_line_of_two_at_a_time_hides_no_other_key() {
            let two = QueueLimits::default().key_concurrency(2);
            with_db($backend, |t| {
                a_deep_line_hides_no_other_key(t, two, &["-0", "a0", "a1", "b0", "b1"])
            })
            .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_limited_claim_reads_its_jobs_as_an_ordinary_claim_does() {
            with_db($backend, limited_rows_are_ordinary_rows).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn limits_that_cannot_work_are_refused() {
            with_db($backend, bad_limits).await
        }
    };
}

/// Runs of keys' lines claimed while the last ones run (PostgreSQL).
#[cfg(feature = "postgres")]
#[path = "limits/runs.rs"]
mod runs;

#[cfg(feature = "postgres")]
mod postgres {
    limit_cases!(Backend::Postgres);

    /// The statement under `heading` in the PostgreSQL limited-claim snapshot (the snapshot test
    /// ties that text to the code), with its binds written in.
    fn from_snapshot(heading: &str) -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/queue/snapshots/rowclaim__queue__snapshots__postgres__limited_claim.snap"
        );
        let snap = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut lines = snap.lines().skip_while(|l| !l.starts_with(heading));
        let (Some(_), Some(sql), Some(binds)) = (lines.next(), lines.next(), lines.next()) else {
            panic!("{path} has no statement under {heading:?}");
        };
        let binds = binds
            .strip_prefix("-- binds: [")
            .and_then(|b| b.strip_suffix(']'))
            .unwrap_or_else(|| panic!("binds: {binds}"));
        let mut sql = sql.trim_end_matches(';').to_owned();
        // From the last: $12 before $1.
        let binds: Vec<&str> = binds.split(", ").collect();
        for (i, v) in binds.iter().enumerate().rev() {
            let literal = match (v.strip_prefix("Text(\""), v.strip_prefix("Int(")) {
                (Some(t), _) => format!("'{}'", t.trim_end_matches("\")")),
                (_, Some(n)) => n.trim_end_matches(')').to_owned(),
                _ => panic!("a bind of another kind: {v}"),
            };
            sql = sql.replace(&format!("${}", i + 1), &literal);
        }
        sql
    }

    /// The plan of `sql` as it ran. Run, not only planned: EXPLAIN alone does not show every
    /// subplan's choice.
    async fn ran(t: &TestDb, sql: &str) -> String {
        let plan: Vec<String> = t
            .strings(&format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}"))
            .await
            .into_iter()
            .flatten()
            .collect();
        plan.join("\n")
    }

    /// 20,000 due jobs of queue mail, vacuumed and analyzed, then given `keys` keys by an
    /// `UPDATE`, with autovacuum off (the planner's statistics stay as the test leaves them).
    async fn jobs_keyed_after_analyze(t: &TestDb, keys: u32) {
        t.exec("ALTER TABLE rowclaim_jobs SET (autovacuum_enabled = false)")
            .await;
        t.exec(
            "INSERT INTO rowclaim_jobs (queue, kind, payload, run_at, created_at) \
             SELECT 'mail', 'send', '{}', now(), now() FROM generate_series(1, 20000)",
        )
        .await;
        t.exec("VACUUM ANALYZE rowclaim_jobs").await;
        t.exec(&format!(
            "UPDATE rowclaim_jobs SET limit_key = 'k' || (id % {keys})"
        ))
        .await;
    }

    /// Three keys with lines deeper than a claim's window, and jobs without a key among them,
    /// drained by two workers: the claims soon read the fronts of the lines first (few keys
    /// leave most of a claim's room), and the per-key limit and each key's order still hold.
    async fn few_keys_with_deep_lines(t: Arc<TestDb>, per_key: u32) {
        let q = queue(&t).await;
        q.limit("deep", &QueueLimits::default().key_concurrency(per_key))
            .await
            .unwrap();
        let keys = ["a", "b", "c"];
        let jobs: Vec<NewJob> = (0..1200)
            .map(|n| {
                // One job in 40 without a key (its "key" in the payload only names it).
                if n % 40 == 39 {
                    NewJob::new(json!({ "key": format!("-{n}"), "n": n })).queue("deep")
                } else {
                    let key = keys[n % 3];
                    NewJob::new(json!({ "key": key, "n": n }))
                        .queue("deep")
                        .limit_key(key)
                }
            })
            .collect();
        q.enqueue_many(&jobs).await.unwrap();
        let seen = run_workers(&t, "deep", 2, 1200, Duration::from_millis(1)).await;
        all_ran_once(&t, "deep", 1200).await;
        seen.assert_keys_held(&keys, per_key, 390);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn few_keys_with_deep_lines_run_one_at_a_time_in_order() {
        with_db(Backend::Postgres, |t| few_keys_with_deep_lines(t, 1)).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn few_keys_with_deep_lines_run_at_most_two_at_a_time() {
        with_db(Backend::Postgres, |t| few_keys_with_deep_lines(t, 2)).await
    }

    /// Runs of a key's line are a worker's (it runs them one after another): a plain claimer,
    /// once it knows how many keys there are, still takes only the front of each idle line, and
    /// none of a key still running.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plain_claimer_takes_the_front_of_each_idle_line_only() {
        with_db(Backend::Postgres, |t| async move {
            let q = queue(&t).await;
            one_at_a_time_by_key(&q, "runs", &["a", "b", "c"], 90).await;
            let claimer = q.claimer(&["runs".to_owned()]).await.unwrap();
            let lease = Duration::from_secs(30);
            let by_key = |claim: &rowclaim::Claim| {
                let mut by_key: HashMap<String, Vec<i64>> = HashMap::new();
                for (key, n) in claim.rows().iter().map(key_and_n) {
                    by_key.entry(key).or_default().push(n);
                }
                by_key
            };
            // The first claim learns the keys: each line's front only.
            let first = claimer.claim(30, lease).await.unwrap();
            let fronts = by_key(&first);
            assert_eq!(fronts.len(), 3, "{fronts:?}");
            assert!(fronts.values().all(|n| n.len() == 1), "{fronts:?}");
            // Key c's front still runs; a's and b's are done.
            for row in first.rows() {
                if key_and_n(row).0 != "c" {
                    first.complete(&row.id).await.unwrap();
                }
            }
            // A plain claimer (not a worker's) takes no runs: the front of each idle line.
            let second = claimer.claim(30, lease).await.unwrap();
            let fronts = by_key(&second);
            assert!(!fronts.contains_key("c"), "c still runs: {fronts:?}");
            assert_eq!(fronts.get("a"), Some(&vec![3]), "{fronts:?}");
            assert_eq!(fronts.get("b"), Some(&vec![4]), "{fronts:?}");
        })
        .await
    }

    /// Jobs of a key that run behind a job of it waiting for its retry count against the key's
    /// concurrency as much as those ahead: with two at a time, and jobs 1 and 2 of key a
    /// running (started while the key allowed three), its failed job 0, due again, waits; key
    /// b's front does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_running_behind_a_retry_hold_their_places() {
        with_db(Backend::Postgres, |t| async move {
            let q = queue(&t).await;
            q.limit("behind", &QueueLimits::default().key_concurrency(2))
                .await
                .unwrap();
            let jobs: Vec<NewJob> = (0..6)
                .map(|n| {
                    let key = if n < 5 { "a" } else { "b" };
                    NewJob::new(json!({ "key": key, "n": n }))
                        .queue("behind")
                        .limit_key(key)
                })
                .collect();
            q.enqueue_many(&jobs).await.unwrap();
            let nth = |n: i64| {
                format!(
                    "(SELECT id FROM rowclaim_jobs WHERE queue = 'behind' \
                     ORDER BY id OFFSET {n} LIMIT 1)"
                )
            };
            t.exec(&format!(
                "UPDATE rowclaim_jobs SET attempts = 1, last_error = 'failed' WHERE id = {}",
                nth(0)
            ))
            .await;
            t.exec(&format!(
                "UPDATE rowclaim_jobs SET status = 'running', attempts = 1, owner = 'other', \
                 attempted_at = now(), lease_until = now() + interval '1 minute' \
                 WHERE id IN ({}, {})",
                nth(1),
                nth(2)
            ))
            .await;
            let claimer = q.claimer(&["behind".to_owned()]).await.unwrap();
            let claim = claimer.claim(10, Duration::from_secs(30)).await.unwrap();
            let taken: Vec<(String, i64)> = claim.rows().iter().map(key_and_n).collect();
            assert_eq!(taken, vec![("b".to_owned(), 5)], "key a holds two running");
        })
        .await
    }

    /// The jobs of a run whose worker died all run out together: they are taken again first
    /// first, one at a time under a key concurrency of 1, not all at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_whose_leases_ran_out_is_taken_again_one_at_a_time() {
        with_db(Backend::Postgres, |t| async move {
            let q = queue(&t).await;
            two_keys_with_a_dead_run(&t, &q, "gone", 30).await;
            let claimer = q.claimer(&["gone".to_owned()]).await.unwrap();
            let lease = Duration::from_secs(30);
            let mut taken: Vec<(String, i64)> = Vec::new();
            for _ in 0..3 {
                let claim = claimer.claim(30, lease).await.unwrap();
                taken.extend(claim.rows().iter().map(key_and_n));
            }
            let a: Vec<i64> = taken
                .iter()
                .filter(|(k, _)| k == "a")
                .map(|(_, n)| *n)
                .collect();
            assert_eq!(a, vec![0], "key a: its first job again, alone: {taken:?}");
        })
        .await
    }

    /// A dead worker's run, the first of its jobs already taken again and sent back for a
    /// retry: the retry runs first, then the rest of the run one at a time, then the line
    /// behind it; each of a key's jobs in line order, with a worker taking runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_workers_run_waits_for_the_retry_of_its_first_job() {
        with_db(Backend::Postgres, |t| async move {
            let q = queue(&t).await;
            two_keys_with_a_dead_run(&t, &q, "dead", 60).await;
            // The first of key a's dead run was taken again, failed, and waits for its retry,
            // due once the worker knows the keys and takes runs (key b's jobs take a while).
            t.exec(
                "UPDATE rowclaim_jobs SET status = 'ready', owner = NULL, lease_until = NULL, \
                 run_at = now() + interval '1 second' WHERE id = (SELECT MIN(id) \
                 FROM rowclaim_jobs WHERE queue = 'dead' AND limit_key = 'a')",
            )
            .await;
            let db = t.db().await;
            let order: Arc<Mutex<Vec<i64>>> = Arc::default();
            let seen = order.clone();
            Worker::new(&db)
                .queue("dead")
                .handle_any(move |job| {
                    let seen = seen.clone();
                    async move {
                        let n = job.payload["n"].as_i64().unwrap_or(-1);
                        seen.lock().unwrap().push(n);
                        if n % 2 == 1 {
                            tokio::time::sleep(Duration::from_millis(60)).await;
                        }
                        Ok::<(), String>(())
                    }
                })
                .concurrency(4)
                .prefetch(100)
                .lease(Duration::from_secs(30))
                .poll(Duration::from_millis(50))
                .until_empty(true)
                .run(std::future::pending())
                .await
                .unwrap();
            let order = order.lock().unwrap().clone();
            let a: Vec<i64> = order.iter().copied().filter(|n| n % 2 == 0).collect();
            let expected: Vec<i64> = (0..30).map(|i| 2 * i).collect();
            assert_eq!(a, expected, "key a in line order, each once");
            let mut b: Vec<i64> = order.iter().copied().filter(|n| n % 2 == 1).collect();
            b.sort_unstable();
            let expected: Vec<i64> = (0..30).map(|i| 2 * i + 1).collect();
            assert_eq!(b, expected, "key b: each job once");
        })
        .await
    }

    /// A job of a run that fails sends the rest of its run back unstarted (attempts as they
    /// were): the key's later jobs run only after its retry, in line order, and every other
    /// job once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_rest_of_a_run_waits_for_the_retry_of_a_job_that_failed() {
        with_db(Backend::Postgres, |t| async move {
            let q = queue(&t).await;
            one_at_a_time_by_key(&q, "retry", &["a", "b", "c"], 150).await;
            let db = t.db().await;
            let order: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
            // The most jobs of one key held at once in the database: more than one is a run.
            let held_max: Arc<Mutex<i64>> = Arc::default();
            let (seen, held, tdb) = (order.clone(), held_max.clone(), t.clone());
            let worker = Worker::new(&db)
                .queue("retry")
                .handle_any(move |job| {
                    let (seen, held, tdb) = (seen.clone(), held.clone(), tdb.clone());
                    async move {
                        let n = job.payload["n"].as_i64().unwrap_or(-1);
                        seen.lock().unwrap().push((n, job.attempt));
                        let key = ["a", "b", "c"][(n % 3) as usize];
                        let now = tdb
                            .count(&format!(
                                "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'retry' \
                                 AND limit_key = '{key}' AND status = 'running'"
                            ))
                            .await;
                        let mut held = held.lock().unwrap();
                        *held = (*held).max(now);
                        if n == 90 && job.attempt == 1 {
                            return Err("the first try fails".to_owned());
                        }
                        Ok(())
                    }
                })
                .concurrency(4)
                .prefetch(150)
                .lease(Duration::from_secs(30))
                .poll(Duration::from_millis(50));
            worker
                .until_empty(true)
                .run(std::future::pending())
                .await
                .unwrap();
            let held_max = *held_max.lock().unwrap();
            assert!(
                held_max > 1,
                "the worker took runs: {held_max} of a key held at once"
            );
            let order = order.lock().unwrap().clone();
            let a: Vec<(i64, i64)> = order.iter().copied().filter(|(n, _)| n % 3 == 0).collect();
            let mut expected: Vec<(i64, i64)> = (0..50).map(|i| (3 * i, 1)).collect();
            expected.insert(31, (90, 2));
            assert_eq!(
                a, expected,
                "key a in line order, its failed job run again first"
            );
            let twice = completed_on_second_try(&t, "retry").await;
            assert_eq!(twice, 1, "only the failed job ran twice");
            all_ran_once(&t, "retry", 149).await;
        })
        .await
    }

    /// A claimed job's key and `n`, from its payload.
    fn key_and_n(row: &rowclaim::ClaimedRow) -> (String, i64) {
        let payload: serde_json::Value =
            serde_json::from_str(row.data["payload"].as_str().unwrap()).unwrap();
        let key = payload["key"].as_str().unwrap().to_owned();
        (key, payload["n"].as_i64().unwrap())
    }

    /// Queue `name`, one job of each key at a time, with `jobs` jobs of `keys` in turn (job `n`
    /// of key `keys[n % keys.len()]`, `n` in its payload).
    pub(super) async fn one_at_a_time_by_key(q: &Queue, name: &str, keys: &[&str], jobs: usize) {
        q.limit(name, &QueueLimits::default().key_concurrency(1))
            .await
            .unwrap();
        let jobs: Vec<NewJob> = (0..jobs)
            .map(|n| {
                let key = keys[n % keys.len()];
                NewJob::new(json!({ "key": key, "n": n }))
                    .queue(name)
                    .limit_key(key)
            })
            .collect();
        q.enqueue_many(&jobs).await.unwrap();
    }

    /// [`one_at_a_time_by_key`] with keys a and b (a's are the even `n`s), and key a's first
    /// five left running by a dead worker, their leases long out.
    async fn two_keys_with_a_dead_run(t: &TestDb, q: &Queue, name: &str, jobs: usize) {
        one_at_a_time_by_key(q, name, &["a", "b"], jobs).await;
        t.exec(&format!(
            "UPDATE rowclaim_jobs SET status = 'running', attempts = 1, owner = 'gone', \
             lease_until = now() - interval '1 minute' WHERE id IN (SELECT id \
             FROM rowclaim_jobs WHERE queue = '{name}' AND limit_key = 'a' ORDER BY id LIMIT 5)"
        ))
        .await;
    }

    /// Keys new to a table since its last ANALYZE (the planner's statistics say no job has
    /// one, as when an application starts to use keys): the look at lines further back still
    /// reads the limit index key by key. With `MIN(limit_key)` for the next key, PostgreSQL
    /// read the whole table once a key (1,000 keys, 20,000 jobs: 2.8 s a claim).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lines_further_back_are_read_by_index_with_keys_the_planner_has_not_seen() {
        with_db(Backend::Postgres, |t| async move {
            queue(&t).await;
            jobs_keyed_after_analyze(&t, 1000).await;
            let further = from_snapshot("-- the first of lines further back: key concurrency 1");
            let plan = ran(&t, &further).await;
            assert!(plan.contains("rowclaim_jobs_limit"), "{plan}");
            assert!(!plan.contains("Seq Scan on rowclaim_jobs"), "{plan}");
        })
        .await
    }

    /// Few keys with deep lines, and the queue's first jobs long finished: a job's check for a
    /// job ahead of it in its key's line reads the limit index. Written `o.id < j.id`,
    /// PostgreSQL walked the primary key from its start for each job it checked, once its
    /// statistics knew the keys were few (10 keys, 20,000 jobs, 2,000 completed: 240 ms a
    /// claim). One at a time per key, the first of each key's line is looked up once per key
    /// (cached by key), not once per job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_job_ahead_in_line_is_sought_by_the_limit_index_when_keys_are_few() {
        with_db(Backend::Postgres, |t| async move {
            queue(&t).await;
            // The planner's choice turns on small differences of cost: jobs that got their keys
            // after the table was vacuumed, and the first ones finished since, tip it (with the
            // keys there from the start it read the limit index either way, and with an SSD
            // setup's random_page_cost of 1.1 too). So the plan is checked both ways: no walk of
            // the primary key, and the bound read by the limit index (which fails with the old
            // text whatever the page costs).
            jobs_keyed_after_analyze(&t, 10).await;
            t.exec("ANALYZE rowclaim_jobs").await;
            t.exec(
                "UPDATE rowclaim_jobs SET status = 'completed', finished_at = now() \
                 WHERE id <= 2000",
            )
            .await;
            for heading in [
                "-- pick: key concurrency 1",
                "-- pick: key concurrency 2",
                "-- pick: one at a time per key",
            ] {
                let plan = ran(&t, &from_snapshot(heading)).await;
                assert!(
                    !plan.contains("rowclaim_jobs_pkey on rowclaim_jobs o"),
                    "{heading}: {plan}"
                );
                if heading.ends_with('1') {
                    assert!(plan.contains("Cache Key: w.limit_key"), "{heading}: {plan}");
                    continue;
                }
                // The bound is read by the index, not checked row by row.
                assert!(
                    plan.lines().any(|l| l.contains("Index Cond")
                        && l.contains("ROW(status, id) < ROW('ready'::text")),
                    "{heading}: {plan}"
                );
            }
        })
        .await
    }

    /// The fronts of 1,000 lines, two a key, carry what the claim checks and orders them by:
    /// joined back to the jobs by id, PostgreSQL hashed the whole table on every claim (a
    /// sequential scan of 20,000 jobs: 15 ms of a 45 ms claim).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_fronts_of_lines_are_not_joined_back_to_the_whole_table() {
        with_db(Backend::Postgres, |t| async move {
            queue(&t).await;
            jobs_keyed_after_analyze(&t, 1000).await;
            t.exec("ANALYZE rowclaim_jobs").await;
            t.exec(
                "UPDATE rowclaim_jobs SET status = 'completed', finished_at = now() \
                 WHERE id <= 12000",
            )
            .await;
            for heading in [
                "-- the first two of lines further back",
                "-- the first of lines further back: one at a time per key",
            ] {
                let plan = ran(&t, &from_snapshot(heading)).await;
                assert!(plan.contains("rowclaim_jobs_limit"), "{heading}: {plan}");
                // (The look for jobs without a key reads the table: no index holds them apart.)
                assert!(
                    !plan.contains("Seq Scan on rowclaim_jobs j"),
                    "{heading}: {plan}"
                );
                assert!(!plan.contains("Hash Join"), "{heading}: {plan}");
            }
        })
        .await
    }

    /// A run is read in line order by the limit index, from its first job to where it stops,
    /// and no further than its length. With the stop written `stop IS NULL OR …` (a filter the
    /// planner could not guess), PostgreSQL read each key's whole line by a bitmap and sorted
    /// it for the run's first jobs, on every claim (10 keys of 1,300 jobs: 23 ms a claim). With
    /// each key's first job in line looked up after a walk of the keys, it turned to the
    /// primary key once most jobs were finished, and walked it from its start for each key
    /// (12,000 of 20,000 finished: 130 ms a claim).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_is_read_in_line_order_by_the_limit_index() {
        with_db(Backend::Postgres, |t| async move {
            queue(&t).await;
            jobs_keyed_after_analyze(&t, 10).await;
            t.exec("ANALYZE rowclaim_jobs").await;
            // A drain well under way: the first jobs claimed and finished since the last vacuum.
            t.exec(
                "UPDATE rowclaim_jobs SET status = 'running', owner = 'w', \
                 lease_until = now() + interval '1 hour' WHERE id <= 12000",
            )
            .await;
            t.exec(
                "UPDATE rowclaim_jobs SET status = 'completed', finished_at = now() \
                 WHERE id <= 12000",
            )
            .await;
            let runs = from_snapshot("-- runs of idle lines");
            let plan = ran(&t, &runs).await;
            assert!(
                !plan.contains("Bitmap Heap Scan on rowclaim_jobs h"),
                "{plan}"
            );
            assert!(
                plan.lines().any(|l| l.contains("Index Cond")
                    && l.contains("ROW(status, id) >= ROW('ready'::text")
                    && l.contains("ROW(status, id) < ROW('ready'::text")),
                "the run's start and stop bound the index read: {plan}"
            );
            assert!(!plan.contains("Sort Key: h.id"), "{plan}");
            assert!(!plan.contains("rowclaim_jobs_pkey"), "{plan}");
        })
        .await
    }
}
#[cfg(feature = "mysql")]
mod mysql {
    limit_cases!(Backend::MySql);
}
#[cfg(feature = "sqlite")]
mod sqlite {
    limit_cases!(Backend::Sqlite);
}
