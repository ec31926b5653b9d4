//! SQLite has one writer at a time: workers that wait for each other's write lock, or for a long
//! writer of the application's, are waiting, not cut off. Four `rowclaim work --until-empty`
//! processes on one file all exit 0, say nothing about an outage, and run every row once.

use rowclaim_testkit as common;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use common::{Backend, TestDb};
use sqlx::Connection;

const ROWS: i64 = 1000;
const WORKERS: usize = 4;

/// A file with `ROWS` ready rows in `t` (an id, a status, an owner and a lease for the
/// strategies that need them), and a file the workers' command appends each row's id to.
async fn setup() -> (TestDb, std::path::PathBuf) {
    let t = TestDb::new(Backend::Sqlite).await;
    t.exec(&format!(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, status TEXT NOT NULL DEFAULT 'ready', \
         owner TEXT, lease_until INTEGER); \
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {ROWS}) \
         INSERT INTO t (id) SELECT x FROM c"
    ))
    .await;
    let ran = std::env::temp_dir().join(format!("rowclaim-ran-{}", uuid::Uuid::now_v7()));
    (t, ran)
}

/// Starts `WORKERS` workers on `t` with `strategy` and `lease`, waits for all, and checks: each
/// exited 0 and said nothing of an outage or of rows given up; every row is done, and ran once.
async fn four_workers(t: &TestDb, ran: &std::path::Path, strategy: &str, lease: &str) {
    let record = format!("cat >/dev/null; echo $ROWCLAIM_ID >> {}", ran.display());
    let mut args = vec!["work", "--table", "t"];
    if strategy != "transaction" {
        args.extend(["--owner-column", "owner", "--lease-column", "lease_until"]);
    }
    args.extend([
        "--strategy",
        strategy,
        "--batch",
        "10",
        "--lease",
        lease,
        "--until-empty",
        "--",
        "sh",
        "-c",
        &record,
    ]);
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            support::rowclaim(&t.url, &args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start rowclaim work")
        })
        .collect();
    for w in workers {
        let (code, stderr) = support::finish(w).await;
        assert_eq!(code, Some(0), "{strategy}: a worker failed:\n{stderr}");
        for word in ["lost the database", "unreachable", "given up", "outage"] {
            assert!(
                !stderr.contains(word),
                "{strategy}: a worker took a lock wait for a fault ({word}):\n{stderr}"
            );
        }
    }
    let done = t
        .count("SELECT COUNT(*) FROM t WHERE status = 'done'")
        .await;
    assert_eq!(done, ROWS, "{strategy}: every row done");
    let text = std::fs::read_to_string(ran).expect("the rows' record");
    let mut runs: HashMap<&str, u32> = HashMap::new();
    for id in text.lines() {
        *runs.entry(id).or_default() += 1;
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{strategy}: rows ran twice: {twice:?}");
    assert_eq!(runs.len() as i64, ROWS, "{strategy}: every row ran");
    let _ = std::fs::remove_file(ran);
}

/// Holds the write lock of `t`'s file from another connection, as an application's long
/// transaction would, from `after` for `hold`. Returns how many rows were not done yet when it
/// had the lock (the test means something only if the workers had work left then).
fn long_writer(t: &TestDb, after: Duration, hold: Duration) -> tokio::task::JoinHandle<i64> {
    let url = t.url.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let mut c = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("open the file");
        sqlx::raw_sql("BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS app_log (line TEXT)")
            .execute(&mut c)
            .await
            .expect("take the write lock");
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t WHERE status <> 'done'")
            .fetch_one(&mut c)
            .await
            .expect("count the rows left");
        tokio::time::sleep(hold).await;
        sqlx::raw_sql("COMMIT")
            .execute(&mut c)
            .await
            .expect("let it go");
        left
    })
}

/// The transaction strategy on SQLite is one claimer at a time: the others wait for its
/// transaction's write lock, however short the lease.
#[tokio::test]
async fn transaction_claimers_take_turns() {
    let (t, ran) = setup().await;
    four_workers(&t, &ran, "transaction", "3s").await;
}

/// Workers of `strategy` while the application holds the write lock for 6 s: they wait for it
/// (their lease of 15 s outlasts the wait, which is longer than a third of it: a statement on
/// SQLite is not cut at a third of the lease as on a server) and carry on.
async fn wait_out_a_long_writer(strategy: &str) {
    let (t, ran) = setup().await;
    let writer = long_writer(&t, Duration::from_millis(500), Duration::from_secs(6));
    four_workers(&t, &ran, strategy, "15s").await;
    let left = writer.await.expect("the writer");
    assert!(left > 0, "the writer came after the work was done");
}

#[tokio::test]
async fn token_claimers_wait_out_a_long_writer() {
    wait_out_a_long_writer("token").await;
}

#[tokio::test]
async fn lease_table_claimers_wait_out_a_long_writer() {
    wait_out_a_long_writer("lease-table").await;
}
