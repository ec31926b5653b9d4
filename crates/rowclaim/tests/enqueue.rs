//! Bulk enqueue on every backend, at sizes that cross the statements' chunk boundaries: every
//! job is enqueued exactly once with all its options, ids follow the order the jobs were given
//! in, unique keys (pending before, twice in one call) return the pending job, and a database
//! error on a late job leaves nothing of the call behind.

use rowclaim_testkit as common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{with_db, Backend, TestDb};
use rowclaim::{JobFilter, NewJob};
use serde_json::json;

/// More jobs than several chunks of every backend's bulk statement hold.
const N: usize = 25_013;

/// A fixed run-at two hours ahead, to the millisecond.
fn later_ms() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    (now.as_millis() as i64 / 1000 + 7200) * 1000 + 123
}

fn at(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms as u64)
}

fn ms_of(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// The options job `i` gets: a mix, so that neighbouring jobs in one statement differ.
struct Expect {
    queue: String,
    kind: String,
    priority: i32,
    max_attempts: i32,
    delay: bool,
    run_at_ms: Option<i64>,
    timeout_ms: Option<i64>,
    limit_key: Option<String>,
    unique_key: Option<String>,
}

fn expect(i: usize, later: i64) -> Expect {
    let unique_key = match i {
        3000 | 9000 => Some("twice".to_owned()),
        6000 => Some("pending".to_owned()),
        _ if i % 1000 == 500 => Some(format!("u{i}")),
        _ => None,
    };
    Expect {
        queue: format!("q{}", i % 3),
        // Characters COPY's text format escapes, in some kinds.
        kind: if i % 4 == 3 {
            format!("k\t\\N\n{}", i % 4)
        } else {
            format!("k{}", i % 4)
        },
        priority: (i % 5) as i32 - 2,
        max_attempts: (i % 6) as i32 + 1,
        // Times only in the second half: the first half's runs between unique keys all run now
        // (PostgreSQL copies those), the second half's each have their own times.
        delay: i >= N / 2 && i.is_multiple_of(7),
        run_at_ms: (i >= N / 2 && i.is_multiple_of(11) && !i.is_multiple_of(7))
            .then_some(later + i as i64),
        timeout_ms: i.is_multiple_of(13).then_some((i as i64 + 1) * 1000),
        limit_key: i.is_multiple_of(17).then(|| format!("L{}", i % 2)),
        unique_key,
    }
}

/// A payload's text with what JSON and COPY escape: quotes, backslashes, tabs, newlines, `\N`.
fn text(i: usize) -> String {
    format!("job {i} ✓ \"quoted\" back\\slash \\N tab\there\r\nnext line")
}

fn job(i: usize, e: &Expect) -> NewJob {
    e.job(json!({ "i": i, "text": text(i) }))
}

impl Expect {
    /// A job on `queue` with every option at its default.
    fn plain(queue: &str) -> Expect {
        Expect {
            queue: queue.to_owned(),
            kind: String::new(),
            priority: 0,
            max_attempts: 25,
            delay: false,
            run_at_ms: None,
            timeout_ms: None,
            limit_key: None,
            unique_key: None,
        }
    }

    /// The job with these options and `payload`.
    fn job(&self, payload: serde_json::Value) -> NewJob {
        self.with(NewJob::new(payload))
    }

    /// `j` (a job with its payload) with these options.
    fn with(&self, j: NewJob) -> NewJob {
        let e = self;
        let mut j = j
            .queue(&e.queue)
            .kind(&e.kind)
            .priority(e.priority)
            .max_attempts(e.max_attempts);
        if e.delay {
            j = j.delay(Duration::from_secs(3600));
        }
        if let Some(ms) = e.run_at_ms {
            j = j.run_at(at(ms));
        }
        if let Some(ms) = e.timeout_ms {
            j = j.timeout(Duration::from_millis(ms as u64));
        }
        if let Some(k) = &e.limit_key {
            j = j.limit_key(k);
        }
        if let Some(k) = &e.unique_key {
            j = j.unique_key(k);
        }
        j
    }

    /// That `r`, enqueued between `before` and `after`, is a new job with these options.
    fn check(&self, r: &rowclaim::JobRecord, before: SystemTime, after: SystemTime, what: &str) {
        let e = self;
        let slack = Duration::from_secs(30);
        assert_eq!(r.queue, e.queue, "{what}");
        assert_eq!(r.kind, e.kind, "{what}");
        assert_eq!(r.status, "ready", "{what}");
        assert_eq!(r.priority, i64::from(e.priority), "{what}");
        assert_eq!(r.max_attempts, i64::from(e.max_attempts), "{what}");
        assert_eq!(r.attempts, 0, "{what}");
        assert_eq!(r.timeout_ms, e.timeout_ms, "{what}");
        assert_eq!(r.limit_key, e.limit_key, "{what}");
        assert_eq!(r.unique_key, e.unique_key, "{what}");
        if let Some(ms) = e.run_at_ms {
            assert_eq!(ms_of(r.run_at), ms, "{what}");
        } else if e.delay {
            let hour = Duration::from_secs(3600);
            assert!(r.run_at >= before + hour - slack, "{what}");
            assert!(r.run_at <= after + hour + slack, "{what}");
        } else {
            assert!(r.run_at >= before - slack, "{what}");
            assert!(r.run_at <= after + slack, "{what}");
        }
    }
}

/// How a test hands its jobs to the queue.
#[derive(Clone, Copy)]
enum Call {
    /// `enqueue_all`, one slice.
    All,
    /// `enqueue_stream`, in uneven chunks (one of them empty).
    Stream,
}

async fn enqueue_by(
    q: &rowclaim::Queue,
    jobs: &[NewJob],
    call: Call,
) -> rowclaim::Result<Vec<rowclaim::Enqueued>> {
    match call {
        Call::All => q.enqueue_all(jobs).await,
        Call::Stream => {
            let cuts = [0, 1, 7_000, 7_000, 19_999, jobs.len()];
            let chunks: Vec<rowclaim::Result<Vec<NewJob>>> = cuts
                .windows(2)
                .map(|w| Ok(jobs[w[0].min(jobs.len())..w[1].min(jobs.len())].to_vec()))
                .collect();
            q.enqueue_stream(futures_util::stream::iter(chunks)).await
        }
    }
}

async fn every_job_once_with_its_options(t: Arc<TestDb>) {
    every_job_once(t, Call::All).await
}

async fn every_job_once_from_a_stream(t: Arc<TestDb>) {
    every_job_once(t, Call::Stream).await
}

/// Every job once, with its options; ids in the order given; unique keys answered by the
/// pending job.
async fn every_job_once(t: Arc<TestDb>, call: Call) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    let pending = q
        .enqueue(&NewJob::new(json!({"before": true})).unique_key("pending"))
        .await
        .expect("enqueue the pending job");
    let later = later_ms();
    let expects: Vec<Expect> = (0..N).map(|i| expect(i, later)).collect();
    let jobs: Vec<NewJob> = expects.iter().enumerate().map(|(i, e)| job(i, e)).collect();
    let before = SystemTime::now();
    let got = enqueue_by(&q, &jobs, call).await.expect("enqueue");
    let after = SystemTime::now();
    assert_eq!(got.len(), N, "one answer per job");

    // The unique keys: the second "twice" is the first one, "pending" the job from before.
    assert!(!got[3000].existing);
    assert!(got[9000].existing, "{:?}", got[9000]);
    assert_eq!(got[9000].id, got[3000].id);
    assert!(got[6000].existing, "{:?}", got[6000]);
    assert_eq!(got[6000].id, pending.id);
    let new: Vec<(usize, i64)> = got
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.existing)
        .map(|(i, e)| (i, e.id))
        .collect();
    assert_eq!(new.len(), N - 2);
    assert!(
        new.windows(2).all(|w| w[0].1 < w[1].1),
        "ids ascend in the order the jobs were given"
    );
    let ids: HashSet<i64> = new.iter().map(|(_, id)| *id).collect();
    assert_eq!(ids.len(), N - 2, "every new job has an id of its own");
    assert!(!ids.contains(&pending.id));

    let records = q
        .list(&JobFilter::new().limit(N as u32 + 10))
        .await
        .expect("list");
    assert_eq!(
        records.len(),
        N - 1,
        "the jobs of the call and the one before"
    );
    let by_id: HashMap<i64, _> = records.iter().map(|r| (r.id, r)).collect();
    for (i, id) in new {
        let e = &expects[i];
        let r = by_id
            .get(&id)
            .unwrap_or_else(|| panic!("job {i} (id {id}) is not in the table"));
        let what = format!("job {i}: {r:?}");
        assert_eq!(r.payload["i"], json!(i), "{what}");
        assert_eq!(r.payload["text"], json!(text(i)), "{what}");
        e.check(r, before, after, &what);
    }
    // enqueue_many counts only the jobs it added (its path may leave the ids to the database).
    let again = [
        NewJob::new(json!({})).unique_key("twice"),
        NewJob::new(json!({})),
    ];
    assert_eq!(q.enqueue_many(&again).await.unwrap(), 1);
    let many: Vec<NewJob> = (0..3)
        .map(|i| {
            let j = NewJob::new(json!({ "m": i, "text": text(i) }))
                .queue("many")
                .kind("k\t\\N\n")
                .priority(7)
                .max_attempts(3);
            if i == 1 {
                j.timeout(Duration::from_secs(9)).limit_key("L\\")
            } else {
                j
            }
        })
        .collect();
    assert_eq!(q.enqueue_many(&many).await.unwrap(), 3);
    let mut got = q.list(&JobFilter::new().queues(["many"])).await.unwrap();
    got.sort_by_key(|r| r.id);
    assert_eq!(got.len(), 3);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.payload, json!({ "m": i, "text": text(i) }), "{r:?}");
        assert_eq!(
            (r.kind.as_str(), r.priority, r.max_attempts),
            ("k\t\\N\n", 7, 3)
        );
        let (timeout, key) = if i == 1 {
            (Some(9000), Some("L\\".to_owned()))
        } else {
            (None, None)
        };
        assert_eq!((r.timeout_ms, r.limit_key.clone()), (timeout, key), "{r:?}");
    }
}

/// A trigger that refuses a job whose payload says "poison", in each database's dialect.
async fn poison_trigger(t: &TestDb) {
    match t.backend {
        Backend::Postgres => {
            t.exec(
                "CREATE FUNCTION rowclaim_test_poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF NEW.payload::text LIKE '%poison%' THEN \
                 RAISE EXCEPTION 'poisoned job'; END IF; RETURN NEW; END $$",
            )
            .await;
            t.exec(
                "CREATE TRIGGER rowclaim_test_poison BEFORE INSERT ON rowclaim_jobs \
                 FOR EACH ROW EXECUTE FUNCTION rowclaim_test_poison()",
            )
            .await;
        }
        Backend::MySql => {
            t.exec(
                "CREATE TRIGGER rowclaim_test_poison BEFORE INSERT ON rowclaim_jobs \
                 FOR EACH ROW BEGIN IF NEW.payload LIKE '%poison%' THEN \
                 SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poisoned job'; END IF; END",
            )
            .await;
        }
        Backend::Sqlite => {
            t.exec(
                "CREATE TRIGGER rowclaim_test_poison BEFORE INSERT ON rowclaim_jobs \
                 WHEN NEW.payload LIKE '%poison%' BEGIN SELECT RAISE(ABORT, 'poisoned job'); END",
            )
            .await;
        }
    }
}

/// A job the database refuses, late in a call of many statements, leaves nothing of the call:
/// not the jobs before it, not the unique keys it took. The same jobs without it then go in.
async fn all_or_nothing_on_a_database_error(t: Arc<TestDb>) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    q.enqueue(&NewJob::new(json!({"before": true})))
        .await
        .unwrap();
    poison_trigger(&t).await;
    let mut jobs: Vec<NewJob> = (0..N)
        .map(|i| {
            let j = NewJob::new(json!({ "i": i })).queue("bulk");
            if i % 5000 == 7 {
                j.unique_key(format!("key{i}"))
            } else {
                j
            }
        })
        .collect();
    for at in [N - 3, 1] {
        let mut bad = jobs.clone();
        bad.insert(at, NewJob::new(json!({"poison": at})).queue("bulk"));
        let err = q.enqueue_many(&bad).await.unwrap_err();
        assert!(err.to_string().contains("poisoned job"), "{err}");
        assert_eq!(
            t.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
            1,
            "nothing of the call is left (poison at {at})"
        );
    }
    // The unique keys are free: the same jobs go in, each once.
    jobs.push(NewJob::new(json!({"last": true})).queue("bulk"));
    assert_eq!(q.enqueue_many(&jobs).await.unwrap(), N as u64 + 1);
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'bulk'")
            .await,
        N as i64 + 1
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE unique_key IS NOT NULL")
            .await,
        (0..N).filter(|i| i % 5000 == 7).count() as i64
    );
}

/// A stream's enqueue is one transaction: an error from the stream after chunks were written,
/// or a job the database refuses in a late chunk, leaves nothing of the call. A job of a later
/// chunk that waits for a job is held for that job, not for another.
async fn a_stream_is_all_or_nothing(t: Arc<TestDb>) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    let first = q
        .enqueue(&NewJob::new(json!({"before": true})))
        .await
        .unwrap();
    poison_trigger(&t).await;
    let chunk = |c: usize| -> Vec<NewJob> {
        (0..10_000)
            .map(|i| {
                let j = NewJob::new(json!({ "c": c, "i": i })).queue("bulk");
                if i == 7 {
                    j.unique_key(format!("key{c}"))
                } else {
                    j
                }
            })
            .collect()
    };
    // Each refused call leaves only the job from before.
    let refused = |chunks: Vec<rowclaim::Result<Vec<NewJob>>>, why: &'static str| {
        let (q, t) = (q.clone(), t.clone());
        async move {
            let err = q
                .enqueue_stream(futures_util::stream::iter(chunks))
                .await
                .unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
            assert_eq!(
                t.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
                1,
                "{why}"
            );
        }
    };
    let not_json = rowclaim::Error::InvalidInput("line 30001 is not JSON".into());
    let chunks = vec![Ok(chunk(0)), Ok(chunk(1)), Ok(chunk(2)), Err(not_json)];
    refused(chunks, "line 30001").await;
    let mut late = chunk(2);
    late[9_000] = NewJob::new(json!({"poison": true})).queue("bulk");
    refused(vec![Ok(chunk(0)), Ok(chunk(1)), Ok(late)], "poisoned job").await;

    // The same chunks go in (their unique keys were left free), and a job of the last chunk
    // waits for the job from before.
    let mut last = chunk(2);
    last.push(
        NewJob::new(json!({"waits": true}))
            .queue("bulk")
            .after([first.id]),
    );
    let chunks = vec![Ok(chunk(0)), Ok(chunk(1)), Ok(last)];
    let got = q
        .enqueue_stream(futures_util::stream::iter(chunks))
        .await
        .expect("enqueue_stream");
    assert_eq!(got.len(), 30_001);
    assert!(got.iter().all(|e| !e.existing));
    assert!(got.windows(2).all(|w| w[0].id < w[1].id), "ids ascend");
    let waiting = got[30_000].id;
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'waiting'")
            .await,
        1,
        "only the job that waits is waiting"
    );
    let links = q.links(waiting).await.expect("links");
    assert_eq!(links.waits_for.len(), 1, "{links:?}");
    assert_eq!(links.waits_for[0].id, first.id, "{links:?}");
}

/// A job of [`payloads_of_every_kind`]: its payload, and its options.
type Given = (serde_json::Value, Expect);

fn given(payload: serde_json::Value, queue: &str) -> Given {
    (payload, Expect::plain(queue))
}

fn keyed(payload: serde_json::Value, key: &str) -> Given {
    let mut e = Expect::plain("a");
    e.unique_key = Some(key.to_owned());
    (payload, e)
}

/// The jobs of [`payloads_of_every_kind`]: long runs of jobs alike but for their payloads
/// (objects, arrays, empty ones too), scalars of every JSON kind among them, runs just shorter
/// and just longer than a statement of their own takes, unique keys first and inside runs (new
/// and pending), runs that differ from the one before in one setting only.
fn every_kind() -> Vec<Given> {
    let object = |i: usize| {
        json!({
            "i": i, "text": text(i), "tenth": 0.1 + i as f64, "sum": 0.1 + 0.2, "huge": 1.5e300,
            "u64": u64::MAX - i as u64, "none": null, "list": [i, "two", [3.25], {"four": false}],
        })
    };
    // A job with a unique key before any other, and one later that meets it pending.
    let mut jobs = vec![keyed(json!({"first": true}), "first")];
    for i in 0..1_500 {
        jobs.push(given(object(i), "a"));
        if i == 700 {
            jobs.push(keyed(json!({"keyed": i}), &format!("kind-{i}")));
        }
        if i == 900 {
            jobs.push(keyed(json!({"again": i}), "first"));
        }
    }
    let scalars = [
        json!(123),
        json!(-7),
        json!(2.5),
        json!(1e-7),
        json!(u64::MAX),
        json!("a string with \"quotes\", ✓ and \\"),
        json!(""),
        json!("{not an object}"),
        json!("[not an array]"),
        json!(true),
        json!(false),
        json!(null),
    ];
    for (i, v) in scalars.iter().cycle().take(40).enumerate() {
        // Scalars between objects alike, and runs of scalars alike.
        jobs.push(given(v.clone(), "a"));
        if i % 3 == 0 {
            jobs.push(given(object(i), "a"));
        }
    }
    for (len, queue) in [(15, "b"), (16, "c"), (17, "b"), (1, "c"), (40, "b")] {
        for i in 0..len {
            let payload = match i % 4 {
                0 => json!({}),
                1 => json!([]),
                _ => json!([i, "array", {"len": len}]),
            };
            jobs.push(given(payload, queue));
        }
    }
    // Payloads 30 levels deep, and among them some 31 deep (MariaDB reads JSON at most 32 deep,
    // so these cannot go in a run's array). Brackets and quotes inside a string, before the
    // levels (keys are written in order), are no levels.
    for i in 0..40 {
        let deep = i % 20 == 18;
        let mut v = json!({"i": i});
        for level in 1..if deep { 30 } else { 29 } {
            v = match level % 2 {
                0 => json!([v, "x"]),
                _ => json!({"level": level, "v": v}),
            };
        }
        jobs.push(given(json!({"a": "\" ]]]}", "deep": deep, "v": v}), "e"));
    }
    // Neighbours that differ, more of them than one statement of rows of values could bind on
    // SQLite (32,766 values, 11 a job). (MySQL's pieces of 5,000 jobs fit its 65,535 either
    // way; its plan's unit tests check the 500 rows a statement.)
    for i in 0..7_000 {
        let mut g = given(json!({"n": i}), "f");
        g.1.priority = i % 2;
        jobs.push(g);
    }
    // A run longer than a statement of rows of values, and than a piece of a chunk (SQLite
    // writes runs of at most 10,000, MariaDB of 5,000).
    for i in 0..12_000 {
        jobs.push(given(json!({"long run": i}), "g"));
    }
    // Runs of 20, each with one setting more than the run before: neighbours differ in that
    // setting only.
    let settings: [fn(&mut Expect); 7] = [
        |_| {},
        |e| e.kind = "k1".into(),
        |e| e.max_attempts = 3,
        |e| e.timeout_ms = Some(9_000),
        |e| e.limit_key = Some("L".into()),
        |e| e.priority = 5,
        |e| e.delay = true,
    ];
    for s in 0..settings.len() {
        for i in 0..20 {
            let mut g = given(object(s * 20 + i), "d");
            settings[..=s].iter().for_each(|set| set(&mut g.1));
            jobs.push(g);
        }
    }
    jobs
}

/// Payloads of every JSON kind come back as given, whatever statement carries them; the ids
/// are new, their own and ascend in the order given.
async fn payloads_of_every_kind(t: Arc<TestDb>) {
    payloads_of_every_kind_in(t.db().await).await
}

/// MySQL/MariaDB number an insert's rows `auto_increment_increment` apart from
/// `auto_increment_offset` (Galera sets them to the cluster's size and the node's place): the
/// ids answered are the rows' own, in rows of values and in runs alike.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_ids_follow_the_servers_increment() {
    with_db(Backend::MySql, |t: Arc<TestDb>| async move {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(3)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    let set = "SET SESSION auto_increment_increment = 3, auto_increment_offset = 2";
                    sqlx::Executor::execute(conn, set).await.map(drop)
                })
            })
            .connect(&t.url)
            .await
            .expect("a pool whose sessions number rows 3 apart");
        payloads_of_every_kind_in(rowclaim::Db::from(pool)).await
    })
    .await
}

/// SQLite keeps a payload as its `json()` makes it, however the text was written, in a run of
/// alike jobs (a bound value each) as in a row of values: without whitespace, escapes and
/// digits as written. Fails if a run stored a payload with whitespace as given.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_payloads_as_json_makes_them() {
    with_db(Backend::Sqlite, |t: Arc<TestDb>| async move {
        let db = t.db().await;
        let q = db.queue();
        q.init().await.expect("init");
        let texts = [
            "{\"a\": 1}",
            "[1, 2,\n 3]",
            " { \"s\" : \"x  y\" } ",
            "{\"tab\":\"a\\tb\",\"nl\":\"a\\nb\"}",
            "{\"n\":1.50,\"e\":1E5,\"big\":123456789012345678901234567890}",
            "{\"u\":\"\\u00e9\\/\"}",
            "\"a string\"",
            "5",
            "true",
            "null",
            "{}",
            "[]",
        ];
        // 40 alike jobs (a run, some with whitespace), 40 of the texts without any (a run
        // bound as given), then every text alone between jobs of other queues (rows).
        let mut jobs: Vec<NewJob> = (0..40)
            .map(|i| {
                NewJob::from_json(texts[i % texts.len()])
                    .unwrap()
                    .queue("run")
            })
            .collect();
        let compact: Vec<&str> = texts
            .iter()
            .copied()
            .filter(|t| !t.contains([' ', '\n']))
            .collect();
        jobs.extend((0..40).map(|i| {
            let text = compact[i % compact.len()];
            NewJob::from_json(text).unwrap().queue("compact")
        }));
        for (i, text) in texts.iter().enumerate() {
            jobs.push(NewJob::from_json(*text).unwrap().queue("rows"));
            jobs.push(NewJob::new(json!(i)).queue(format!("other{i}")));
        }
        assert_eq!(q.enqueue_many(&jobs).await.unwrap(), jobs.len() as u64);
        for queue in ["run", "compact", "rows"] {
            let all = format!("FROM rowclaim_jobs WHERE queue = '{queue}'");
            let as_json = t
                .count(&format!(
                    "SELECT COUNT(*) {all} AND payload = json(payload)"
                ))
                .await;
            let n = t.count(&format!("SELECT COUNT(*) {all}")).await;
            assert_eq!(
                (as_json, n > 0),
                (n, true),
                "queue {queue}: stored as json() makes it"
            );
        }
        // The same text stored by a run and by a row of values.
        let differ = t
            .count(
                "SELECT COUNT(*) FROM rowclaim_jobs r WHERE queue IN ('run', 'compact') AND NOT \
                 EXISTS (SELECT 1 FROM rowclaim_jobs o WHERE o.queue = 'rows' \
                 AND o.payload = r.payload)",
            )
            .await;
        assert_eq!(
            differ, 0,
            "a run stores each payload as a row of values does"
        );
    })
    .await
}

/// A trigger of the user's that inserts a job of its own while an enqueue writes takes an id
/// the enqueue counted on: the enqueue fails whole instead of telling wrong ids, in a run
/// (which SQLite numbers; its last id is checked) as in rows of values (primary key).
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_enqueue_fails_whole_when_a_trigger_takes_its_ids() {
    with_db(Backend::Sqlite, |t: Arc<TestDb>| async move {
        let db = t.db().await;
        let q = db.queue();
        q.init().await.expect("init");
        q.enqueue(&NewJob::new(json!("before"))).await.unwrap();
        t.exec(
            "CREATE TRIGGER rowclaim_test_twin AFTER INSERT ON rowclaim_jobs \
             WHEN NEW.payload = '{\"twin\":true}' BEGIN \
             INSERT INTO rowclaim_jobs (queue, payload, run_at, created_at) \
             VALUES ('twin', '{}', 0, 0); END",
        )
        .await;
        // 40 alike jobs (a run), then 8 (rows of values).
        for n in [40, 8] {
            let jobs: Vec<NewJob> = (0..n)
                .map(|i| match i == n / 2 {
                    true => NewJob::new(json!({"twin": true})),
                    false => NewJob::new(json!({ "i": i })),
                })
                .collect();
            let err = q.enqueue_all(&jobs).await.unwrap_err();
            assert_eq!(
                t.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
                1,
                "nothing of {n} jobs is left: {err}"
            );
        }
    })
    .await
}

/// [`payloads_of_every_kind`] through `db`.
async fn payloads_of_every_kind_in(db: rowclaim::Db) {
    let q = db.queue();
    q.init().await.expect("init");
    let before = q
        .enqueue_all(&[NewJob::new(json!({"before": 1})), NewJob::new(json!(2))])
        .await
        .expect("enqueue the jobs before");
    let given = every_kind();
    // Every third payload is given as JSON text (NewJob::from_json), pretty-printed: runs mix
    // payloads given both ways, and text with newlines and indents inside.
    let jobs: Vec<NewJob> = given
        .iter()
        .enumerate()
        .map(|(i, (p, e))| match i % 3 {
            1 => {
                let text = serde_json::to_string_pretty(p).expect("serialise");
                e.with(NewJob::from_json(format!("\t{text}\r\n")).expect("JSON"))
            }
            _ => e.job(p.clone()),
        })
        .collect();
    let start = SystemTime::now();
    let got = q.enqueue_all(&jobs).await.expect("enqueue");
    let end = SystemTime::now();
    assert_eq!(got.len(), given.len(), "one answer per job");
    assert!(got[0].id > before[1].id, "{:?} after {before:?}", got[0]);
    // The one job that met a pending key is the second keyed "first"; every other one is new.
    let again = given
        .iter()
        .rposition(|(_, e)| e.unique_key.as_deref() == Some("first"))
        .expect("the second job keyed \"first\"");
    assert!(got[again].existing, "{:?}", got[again]);
    assert_eq!(got[again].id, got[0].id);
    let (given, got): (Vec<Given>, Vec<_>) = given
        .into_iter()
        .zip(got)
        .enumerate()
        .filter(|(i, _)| *i != again)
        .map(|(_, pair)| pair)
        .unzip();
    assert!(got.iter().all(|e| !e.existing));
    assert!(
        got.windows(2).all(|w| w[0].id < w[1].id),
        "ids ascend in the order given"
    );
    let records = q
        .list(&JobFilter::new().limit(given.len() as u32 + 10))
        .await
        .expect("list");
    assert_eq!(
        records.len(),
        given.len() + 2,
        "the new jobs of the call and the two before"
    );
    let by_id: HashMap<i64, _> = records.iter().map(|r| (r.id, r)).collect();
    for (i, (g, e)) in given.iter().zip(&got).enumerate() {
        let r = by_id
            .get(&e.id)
            .unwrap_or_else(|| panic!("job {i} (id {}) is not in the table", e.id));
        let what = format!("job {i}: {r:?}");
        assert_eq!(r.payload, g.0, "{what}");
        g.1.check(r, start, end, &what);
    }
}

macro_rules! enqueue_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bulk_enqueue_keeps_every_job_and_its_options() {
            with_db($backend, every_job_once_with_its_options).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_streamed_enqueue_keeps_every_job_and_its_options() {
            with_db($backend, every_job_once_from_a_stream).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_streamed_enqueue_is_all_or_nothing() {
            with_db($backend, a_stream_is_all_or_nothing).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bulk_enqueue_is_all_or_nothing_on_a_database_error() {
            with_db($backend, all_or_nothing_on_a_database_error).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn payloads_of_every_kind_come_back_as_given() {
            with_db($backend, payloads_of_every_kind).await
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    enqueue_cases!(Backend::Postgres);
}
#[cfg(feature = "sqlite")]
mod sqlite {
    enqueue_cases!(Backend::Sqlite);
}
#[cfg(feature = "mysql")]
mod mysql {
    enqueue_cases!(Backend::MySql);
}
