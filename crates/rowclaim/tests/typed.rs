//! Typed jobs and rows on real databases: the README's typed example runs; a typed job is
//! enqueued (one, many, in the caller's transaction) with its type's kind and settings and
//! handed back as its type; a payload that does not read as its type is dead after one attempt,
//! its kind and serde's message kept; a claim's rows read as a struct, or say which column
//! did not fit.

use rowclaim_testkit as common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use rowclaim::{
    Error, JobArgs, JobContext, JobFilter, NewJob, Queue, Source, Strategy, TaskResult, Worker,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// README.md's typed example, as `examples/typed_jobs.rs` holds it between its markers.
#[path = "../examples/typed_jobs.rs"]
#[allow(dead_code)]
mod example;

/// The example's part between the markers is the README's typed example, word for word: what
/// runs here is what the README shows (and the README's copy compiles as a doctest).
#[test]
fn the_readme_shows_the_example_word_for_word() {
    let example = include_str!("../examples/typed_jobs.rs");
    let start = example.find("// README begin\n").expect("the begin marker") + 16;
    let end = example.find("// README end").expect("the end marker");
    let block = &example[start..end];
    let readme = include_str!("../../../README.md");
    let fenced = format!("```rust\n{block}```\n");
    assert!(
        readme.contains(&fenced),
        "README.md's typed example differs from examples/typed_jobs.rs's; paste this into the \
         README:\n{fenced}"
    );
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Invoice {
    number: u64,
    customer: String,
}

impl JobArgs for Invoice {
    const KIND: &'static str = "invoice";
    const QUEUE: &'static str = "billing";
    const PRIORITY: i32 = 3;
    const MAX_ATTEMPTS: i32 = 7;
    const TIMEOUT: Option<Duration> = Some(Duration::from_secs(90));

    fn unique_key(&self) -> Option<String> {
        Some(format!("invoice:{}", self.number))
    }
}

/// What a worker that runs until its queue is empty is also given to run until: a bound, so
/// that a worker that would never be done (a job retried when it should be dead) ends the test
/// with its report instead of hanging it.
async fn bounded() {
    tokio::time::sleep(Duration::from_secs(120)).await
}

async fn queue(t: &TestDb) -> (rowclaim::Db, Queue) {
    let db = t.db().await;
    let q = db.queue();
    q.init().await.expect("init");
    (db, q)
}

/// The README's example enqueues a typed job and runs it: done once, its output kept, its
/// type's kind, queue, attempts and unique key on the row.
async fn readme_example(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    let report = example::welcome_ada(&db).await.expect("the example runs");
    assert_eq!((report.completed, report.dead), (1, 0), "{report:?}");
    let jobs = q.list(&JobFilter::new()).await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = &jobs[0];
    assert_eq!(
        (job.kind.as_str(), job.queue.as_str(), job.status.as_str()),
        ("welcome", "mail", "completed")
    );
    assert_eq!(job.max_attempts, 5);
    assert_eq!(job.unique_key.as_deref(), Some("welcome:ada@example.com"));
    assert_eq!(job.payload, json!({"to": "ada@example.com", "name": "Ada"}));
    let id = job.id;
    assert_eq!(
        job.output,
        Some(json!({ "message_id": format!("<welcome-{id}@example.com>") }))
    );
}

/// Typed jobs go in with their type's settings, one, many or in the caller's transaction, and
/// come back to their handler as their type, with the job's context; its output is kept.
async fn enqueue_and_handle(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    let first = Invoice {
        number: 1,
        customer: "ada".into(),
    };
    let one = q.enqueue(&first).await.unwrap();
    assert!(!one.existing);
    // Its unique key comes from its value: the same invoice again is the same job.
    assert_eq!(q.enqueue(&first).await.unwrap().id, one.id);
    let many: Vec<Invoice> = (2..=4)
        .map(|n| Invoice {
            number: n,
            customer: format!("c{n}"),
        })
        .collect();
    assert_eq!(q.enqueue_many(&many).await.unwrap(), 3);
    let all = q
        .enqueue_all(&[Invoice {
            number: 5,
            customer: "c5".into(),
        }])
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    in_transaction(
        &t,
        &Invoice {
            number: 6,
            customer: "c6".into(),
        },
    )
    .await;
    // Per-enqueue settings start from the typed job.
    let later = NewJob::of(&Invoice {
        number: 7,
        customer: "c7".into(),
    })
    .unwrap()
    .priority(9);
    q.enqueue(&later).await.unwrap();

    let jobs = q.list(&JobFilter::new()).await.unwrap();
    assert_eq!(jobs.len(), 7, "{jobs:?}");
    for job in &jobs {
        assert_eq!(
            (job.kind.as_str(), job.queue.as_str()),
            ("invoice", "billing")
        );
        assert_eq!(job.max_attempts, 7);
        assert_eq!(job.timeout_ms, Some(90_000));
        let number = job.payload["number"].as_u64().unwrap();
        assert_eq!(job.unique_key, Some(format!("invoice:{number}")));
        assert_eq!(job.priority, if number == 7 { 9 } else { 3 }, "{job:?}");
    }

    let ran = Arc::new(AtomicUsize::new(0));
    let seen = ran.clone();
    let report = Worker::new(&db)
        .queue("billing")
        .register::<Invoice, _>(move |invoice, job| {
            let seen = seen.clone();
            async move {
                assert_eq!(
                    (job.kind.as_str(), job.queue.as_str()),
                    ("invoice", "billing")
                );
                assert_eq!((job.attempt, job.max_attempts), (1, 7));
                assert_eq!(job.timeout, Some(Duration::from_secs(90)));
                assert!(job.stop_reason().is_none());
                seen.fetch_add(1, Ordering::SeqCst);
                // Any serde value is an output; `None` writes as null and keeps none.
                Ok::<_, String>((invoice.number % 2 == 0).then(|| Total {
                    customer: invoice.customer,
                    cents: invoice.number * 100,
                }))
            }
        })
        .concurrency(4)
        .until_empty(true)
        .run(bounded())
        .await
        .unwrap();
    assert_eq!((report.completed, report.dead), (7, 0), "{report:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 7);
    for job in q.list(&JobFilter::new()).await.unwrap() {
        let number = job.payload["number"].as_u64().unwrap();
        let want = (number % 2 == 0)
            .then(|| json!({"customer": job.payload["customer"], "cents": number * 100}));
        assert_eq!(job.output, want, "{job:?}");
        assert_eq!(job.status, "completed");
    }
}

#[derive(Serialize)]
struct Total {
    customer: String,
    cents: u64,
}

/// Enqueues `job` in a transaction of the caller's own, rolled back first (nothing stays), then
/// committed.
async fn in_transaction(t: &TestDb, job: &Invoice) {
    let count = "SELECT COUNT(*) FROM rowclaim_jobs";
    let before = t.count(count).await;
    for commit in [false, true] {
        match t.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&t.url).await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                Queue::enqueue_postgres(&mut tx, job).await.unwrap();
                if commit {
                    tx.commit().await.unwrap()
                } else {
                    tx.rollback().await.unwrap()
                }
            }
            #[cfg(feature = "mysql")]
            Backend::MySql => {
                let pool = sqlx::MySqlPool::connect(&t.url).await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                Queue::enqueue_mysql(&mut tx, job).await.unwrap();
                if commit {
                    tx.commit().await.unwrap()
                } else {
                    tx.rollback().await.unwrap()
                }
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&t.url).await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                Queue::enqueue_sqlite(&mut tx, job).await.unwrap();
                if commit {
                    tx.commit().await.unwrap()
                } else {
                    tx.rollback().await.unwrap()
                }
            }
            #[allow(unreachable_patterns)]
            _ => unreachable!("the case runs only for backends this build has"),
        }
        let want = before + i64::from(commit);
        assert_eq!(t.count(count).await, want, "commit {commit}");
    }
}

/// A job of a typed kind whose payload does not read as the type (enqueued as JSON, by hand or
/// by an older version of the type) is dead after its one attempt: the handler never runs, it
/// is not retried, and its last error names the kind, the type, the field and serde's message.
/// The good job beside it runs.
async fn bad_payload(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    let wrong_type = q
        .enqueue(
            &NewJob::new(json!({"number": "seven", "customer": "ada"}))
                .kind("invoice")
                .queue("billing"),
        )
        .await
        .unwrap()
        .id;
    let missing = q
        .enqueue(
            &NewJob::new(json!({"number": 8}))
                .kind("invoice")
                .queue("billing"),
        )
        .await
        .unwrap()
        .id;
    q.enqueue(&Invoice {
        number: 9,
        customer: "bob".into(),
    })
    .await
    .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let seen = ran.clone();
    let report = Worker::new(&db)
        .register(move |invoice: Invoice, _job| {
            let seen = seen.clone();
            async move {
                assert_eq!(invoice.number, 9, "only the good job reaches the handler");
                seen.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(())
            }
        })
        .until_empty(true)
        .run(bounded())
        .await
        .unwrap();
    assert_eq!(
        (report.completed, report.dead, report.retried),
        (1, 2, 0),
        "{report:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    for (id, says) in [
        (
            wrong_type,
            "number: invalid type: string \"seven\", expected u64",
        ),
        (missing, "missing field `customer`"),
    ] {
        let job = q.get(id).await.unwrap().expect("the job");
        assert_eq!(job.status, "dead", "{job:?}");
        assert_eq!((job.attempts, job.max_attempts), (1, 25), "{job:?}");
        let error = job.last_error.as_deref().unwrap_or_default();
        assert_eq!(
            error,
            format!("the payload of job {id} (kind \"invoice\") does not read as Invoice: {says}"),
            "{job:?}"
        );
    }
}

/// Snoozes and errors of a typed handler are taken as a raw handler's: `Ok(TaskResult)` says
/// itself, `Err` is retried.
async fn typed_results(t: Arc<TestDb>) {
    let (db, q) = queue(&t).await;
    let id = q
        .enqueue(&Invoice {
            number: 1,
            customer: "ada".into(),
        })
        .await
        .unwrap()
        .id;
    let report = Worker::new(&db)
        .register(|_: Invoice, job: JobContext| async move {
            match job.attempt {
                1 => Err("the printer is out of paper".to_owned()),
                _ => Ok(TaskResult::Done),
            }
        })
        .until_empty(true)
        .wait_scheduled(true)
        .run(bounded())
        .await
        .unwrap();
    assert_eq!((report.retried, report.completed), (1, 1), "{report:?}");
    let job = q.get(id).await.unwrap().unwrap();
    assert_eq!((job.status.as_str(), job.attempts), ("completed", 2));
    assert_eq!(job.errors.len(), 1, "{job:?}");
    assert_eq!(job.errors[0].error, "the printer is out of paper");
}

/// A row of the harness's `jobs` table as a struct of the test's own.
#[derive(Debug, PartialEq, Deserialize)]
struct Row {
    id: i64,
    payload: String,
    priority: i32,
}

/// A claim's rows read as a struct of one's own, with their ids; a struct a column does not
/// fit is refused naming the row, the table, the type and the column.
async fn typed_rows(t: Arc<TestDb>) {
    t.jobs(3).await;
    let claimer = t
        .db()
        .await
        .claimer(
            Source::new("jobs")
                .owner_column("owner")
                .lease_column("lease_until"),
            Strategy::Auto,
        )
        .await
        .unwrap();
    let claim = claimer.claim(3, Duration::from_secs(30)).await.unwrap();
    let rows = claim.rows_as::<Row>().unwrap();
    let want: Vec<_> = (1..=3)
        .map(|i| {
            let row = Row {
                id: i,
                payload: format!("job {i}"),
                priority: ((i * 7919) % 13) as i32,
            };
            (rowclaim::RowId::Int(i), row)
        })
        .collect();
    let mut got = rows;
    got.sort_by_key(|(_, r)| r.id);
    assert_eq!(got, want);
    let one = &claim.rows()[0];
    assert_eq!(
        rowclaim::RowId::Int(one.data_as::<Row>().unwrap().id),
        one.id
    );

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Wrong {
        payload: i64,
    }
    let e = claim.rows_as::<Wrong>().unwrap_err();
    let first = &claim.rows()[0].id;
    assert!(
        matches!(&e, Error::Shape { field, .. } if field == "payload"),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "row {first} of jobs does not read as Wrong: payload: invalid type: string"
        )),
        "{text}"
    );
    for (id, _) in got {
        claim.complete(&id).await.unwrap();
    }
}

macro_rules! typed_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_readme_example_runs() {
            with_db($backend, readme_example).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn typed_jobs_are_enqueued_and_handled_as_their_type() {
            with_db($backend, enqueue_and_handle).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_payload_that_does_not_read_is_dead_after_one_attempt() {
            with_db($backend, bad_payload).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_typed_handler_fails_and_retries_like_any() {
            with_db($backend, typed_results).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn claimed_rows_read_as_a_struct() {
            with_db($backend, typed_rows).await
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    typed_cases!(Backend::Postgres);
}
#[cfg(feature = "mysql")]
mod mysql {
    typed_cases!(Backend::MySql);
}
#[cfg(feature = "sqlite")]
mod sqlite {
    typed_cases!(Backend::Sqlite);
}
