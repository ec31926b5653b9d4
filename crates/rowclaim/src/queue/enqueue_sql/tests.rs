//! The documented enqueue (`docs/enqueue-sql.md`, every option) on a database `init` migrated
//! from each version of the jobs' schema it can start from (none, 1, …, the latest): the job it
//! makes has every option, and run again with its unique key it makes no second job; and the
//! documented enqueue that waits (`after`), on each database.

use std::sync::Arc;

use rowclaim_testkit::{documented_sql, with_db, Backend, TestDb};

use super::super::migrate::Schema;

/// Brings the fresh database `t` to jobs' schema `version` (0: nothing yet) with the
/// migrations' own statements, as an install of that version left it.
async fn at_version<D: Schema>(t: &TestDb, version: usize) {
    if version > 0 {
        t.exec(D::SCHEMA_TABLE).await;
        // Owned first: an iterator of `&str` held across an await makes this generic future
        // not `Send` for every lifetime, as `with_db` needs.
        let steps: Vec<String> = D::JOBS[..version]
            .iter()
            .flat_map(|v| v.iter().map(|s| (*s).to_owned()))
            .collect();
        for step in steps {
            t.exec(&step).await;
        }
        t.exec(&format!(
            "INSERT INTO rowclaim_schema (component, version) VALUES ('jobs', {version})"
        ))
        .await;
    }
}

/// Migrates a database at each version with `init`, then enqueues with the documented
/// block `block` twice; `job` counts the jobs with every option the block gives.
/// Each version's database is dropped after it (`with_db`), also after a failed assertion.
async fn from_every_version<D: Schema>(backend: Backend, block: &str, job: &str) {
    for version in 0..=D::JOBS.len() {
        let (sql, block, job) = (documented_sql(block), block.to_owned(), job.to_owned());
        with_db(backend, move |t| async move {
            from_version::<D>(t, version, sql, block, job).await;
        })
        .await;
    }
}

/// [`from_every_version`] from `version`, on the fresh database `t`.
/// (Owned arguments: a future that borrows across its awaits is not `Send` for every lifetime,
/// as `with_db` needs.)
async fn from_version<D: Schema>(
    t: Arc<TestDb>,
    version: usize,
    sql: String,
    block: String,
    job: String,
) {
    at_version::<D>(&t, version).await;
    let db = crate::Db::connect(&t.url).await.expect("connect");
    db.queue().init().await.expect("init");
    t.exec(&sql).await;
    t.exec(&sql).await;
    let all = t.count("SELECT COUNT(*) FROM rowclaim_jobs").await;
    assert_eq!(all, 1, "{block} from version {version}: jobs");
    assert_eq!(
        t.count(&job).await,
        1,
        "{block} from version {version}: {job}"
    );
    let installed = format!(
        "SELECT COUNT(*) FROM rowclaim_schema WHERE component = 'enqueue' AND version = {}",
        D::ENQUEUE.len()
    );
    if !D::ENQUEUE.is_empty() {
        assert_eq!(t.count(&installed).await, 1, "from version {version}");
    }
    drop(db);
}

/// The documented enqueue that waits (`block`, for jobs 1 and 2, enqueued first): the job
/// waits until both completed, then is ready; with an id of no job it is refused with an
/// error containing `unknown` and leaves no job; waiting for a dead job it is cancelled,
/// naming that job.
/// `anyway` is what, put after the ids, makes it run anyway: then it is ready though one
/// of them is dead.
async fn waits(backend: Backend, block: &str, unknown: &str, anyway: Option<&str>) {
    let (block, unknown) = (block.to_owned(), unknown.to_owned());
    let anyway = anyway.map(str::to_owned);
    with_db(backend, move |t| async move {
        waits_on(t, block, unknown, anyway).await;
    })
    .await;
}

/// [`waits`] on the fresh database `t`.
async fn waits_on(t: Arc<TestDb>, block: String, unknown: String, anyway: Option<String>) {
    let sql = documented_sql(&block);
    assert!(sql.contains("[1, 2]"), "{block}: waits for jobs 1 and 2");
    let db = crate::Db::connect(&t.url).await.expect("connect");
    let q = db.queue();
    q.init().await.expect("init");
    for want in [1, 2] {
        let dep = crate::NewJob::new(serde_json::json!({"dep": want}));
        assert_eq!(q.enqueue(&dep).await.expect("enqueue").id, want);
    }
    let jobs = "SELECT COUNT(*) FROM rowclaim_jobs";

    let err = t
        .try_exec(&sql.replace("[1, 2]", "[2, 987654]"))
        .await
        .expect_err("an unknown id");
    assert!(err.contains(&unknown), "{block}: {err}");
    assert_eq!(t.count(jobs).await, 2, "{block}: refused whole");

    t.exec(&sql).await;
    let waiter = 3;
    let status = |id: i64| {
        let q = q.clone();
        async move { q.get(id).await.expect("get").expect("the job") }
    };
    assert_eq!(status(waiter).await.status, "waiting", "{block}");
    let edges = "SELECT COUNT(*) FROM rowclaim_waits WHERE job = 3";
    assert_eq!(t.count(edges).await, 2, "{block}");
    let claimer = q.claimer(&[]).await.expect("claimer");
    let lease = std::time::Duration::from_secs(30);
    let c = claimer.claim(10, lease).await.expect("claim");
    assert_eq!(c.len(), 2, "{block}: the waiting job is not claimed");
    c.complete(&c.rows()[0].id).await.expect("complete");
    assert_eq!(q.release_waiting().await.expect("look"), 0, "{block}");
    assert_eq!(status(waiter).await.status, "waiting", "{block}: one left");
    c.complete(&c.rows()[1].id).await.expect("complete");
    assert_eq!(q.release_waiting().await.expect("look"), 1, "{block}");
    assert_eq!(status(waiter).await.status, "ready", "{block}: released");

    let doomed = crate::NewJob::new(serde_json::json!({}))
        .priority(100)
        .max_attempts(1);
    let dead = q.enqueue(&doomed).await.expect("enqueue").id;
    let c = claimer.claim(1, lease).await.expect("claim");
    assert_eq!(c.rows()[0].id.to_string(), dead.to_string());
    c.fail(&c.rows()[0].id).await.expect("fail");
    t.exec(&sql.replace("[1, 2]", &format!("[1, {dead}]")))
        .await;
    let cancelled = status(dead + 1).await;
    assert_eq!(cancelled.status, "cancelled", "{block}");
    assert_eq!(
        cancelled.last_error.as_deref(),
        Some(super::super::after::cancel_reason(dead, "dead").as_str()),
        "{block}"
    );
    assert_eq!(t.count(jobs).await, 5, "{block}");
    if let Some(anyway) = anyway {
        let anyway = format!("[1, {dead}]{anyway}");
        t.exec(&sql.replace("[1, 2]", &anyway)).await;
        let runs = status(dead + 2).await;
        assert_eq!(runs.status, "ready", "{block}: runs anyway");
        let marked = "SELECT COUNT(*) FROM rowclaim_jobs WHERE if_failed = 'run'";
        assert_eq!(t.count(marked).await, 1, "{block}");
    }
    drop(db);
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_waits() {
    waits(
        Backend::Postgres,
        "postgres-after",
        "job 987654,",
        Some(", run_anyway => true"),
    )
    .await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_waits() {
    waits(
        Backend::MySql,
        "mysql-after",
        "job 987654,",
        Some(r#", "run_anyway": true"#),
    )
    .await;
}

/// (Its run-anyway form is another statement: the Python client's tests run it.)
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_waits() {
    waits(
        Backend::Sqlite,
        "sqlite-after",
        "NOT NULL constraint failed: rowclaim_waits.waits_for",
        None,
    )
    .await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_from_every_version() {
    from_every_version::<crate::backend::postgres::Sql>(
        Backend::Postgres,
        "postgres-options",
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'mail' AND kind = 'welcome' \
         AND payload = '{\"to\": \"ada\"}'::jsonb AND priority = 5 AND max_attempts = 3 \
         AND unique_key = 'welcome:ada' AND limit_key = 'ada' AND timeout_ms = 30000 \
         AND status = 'ready' AND attempts = 0 \
         AND run_at BETWEEN now() + interval '9 minutes' AND now() + interval '10 minutes'",
    )
    .await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_from_every_version() {
    from_every_version::<crate::backend::mysql::Sql>(
        Backend::MySql,
        "mysql-options",
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'mail' AND kind = 'welcome' \
         AND JSON_VALUE(payload, '$.to') = 'ada' AND priority = 5 AND max_attempts = 3 \
         AND unique_key = 'welcome:ada' AND limit_key = 'ada' AND timeout_ms = 30000 \
         AND status = 'ready' AND attempts = 0 AND created_at <= UTC_TIMESTAMP(6) \
         AND run_at BETWEEN UTC_TIMESTAMP(6) + INTERVAL 9 MINUTE \
         AND UTC_TIMESTAMP(6) + INTERVAL 10 MINUTE",
    )
    .await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_from_every_version() {
    from_every_version::<crate::backend::sqlite::Sql>(
        Backend::Sqlite,
        "sqlite-options",
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'mail' AND kind = 'welcome' \
         AND json_extract(payload, '$.to') = 'ada' AND priority = 5 AND max_attempts = 3 \
         AND unique_key = 'welcome:ada' AND limit_key = 'ada' AND timeout_ms = 30000 \
         AND status = 'ready' AND attempts = 0 \
         AND created_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) \
         AND run_at - created_at BETWEEN 599000 AND 600000",
    )
    .await;
}
