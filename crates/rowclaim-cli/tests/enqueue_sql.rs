//! Enqueue in SQL from the databases' own command-line clients (`psql`, `mariadb`/`mysql`,
//! `sqlite3`), as `docs/enqueue-sql.md` writes it: inside a transaction that rolls back it
//! leaves no job; inside one that commits it makes a job that `rowclaim work` runs; a job
//! enqueued waiting for two others runs once `rowclaim work` completed them.

mod support;

use std::path::Path;
use std::process::Stdio;

use rowclaim_testkit::{documented_sql, with_db, Backend, TestDb};
use support::run_ok;

/// Runs `sql` through the command-line client of `t`'s database; returns its stdout.
async fn client(t: &TestDb, sql: &str) -> String {
    let url = t.direct_url();
    let mut c = match t.backend {
        Backend::Postgres => {
            let mut c = tokio::process::Command::new("psql");
            c.args([&url, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", "-"]);
            c
        }
        Backend::MySql => mysql_client(&url),
        Backend::Sqlite => {
            let mut c = tokio::process::Command::new("sqlite3");
            c.args(["-bail", url.trim_start_matches("sqlite://")]);
            c
        }
    };
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let program = format!("{:?}", c.as_std().get_program());
    let mut child = c.spawn().unwrap_or_else(|e| {
        panic!("start {program}: {e} (scripts/test installs the databases' clients)")
    });
    let mut input = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut input, sql.as_bytes())
        .await
        .expect("feed the client");
    drop(input);
    let out = child.wait_with_output().await.expect("wait for the client");
    assert!(
        out.status.success(),
        "{program} ran {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `mariadb` (or `mysql`) with the flags for `url` (mysql://user[:password]@host[:port]/db).
fn mysql_client(url: &str) -> tokio::process::Command {
    let rest = url.trim_start_matches("mysql://");
    let (userinfo, rest) = rest.rsplit_once('@').unwrap_or(("root", rest));
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let (hostport, db) = rest.split_once('/').unwrap_or((rest, ""));
    let db = db.split('?').next().unwrap_or_default();
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "3306"));
    let program = if on_path("mariadb") {
        "mariadb"
    } else {
        "mysql"
    };
    let mut c = tokio::process::Command::new(program);
    c.args([
        &format!("-u{user}"),
        &format!("-h{host}"),
        &format!("-P{port}"),
        "--batch",
        db,
    ])
    .env("MYSQL_PWD", password);
    c
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// The documented enqueue in a transaction: rolled back, no job; committed, a job that `rowclaim
/// work` runs with the documented payload.
async fn rolled_back_or_run(t: &TestDb, block: &str) {
    run_ok(&t.url, &["init"], "").await;
    let sql = documented_sql(block);
    assert!(sql.contains("COMMIT;"), "{block}: a transaction");
    client(t, &sql.replace("COMMIT;", "ROLLBACK;")).await;
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 0);

    client(t, &sql).await;
    client(t, &sql.replace("COMMIT;", "ROLLBACK;")).await;
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 1);

    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("payloads");
    let handler = format!("cat >> '{}'", out.display());
    run_ok(
        &t.url,
        &[
            "work",
            "--queue",
            "mail",
            "--until-empty",
            "--",
            "sh",
            "-c",
            &handler,
        ],
        "",
    )
    .await;
    let ran = std::fs::read_to_string(Path::new(&out)).expect("the handler's file");
    let payload: serde_json::Value = serde_json::from_str(&ran).expect("one JSON payload");
    assert_eq!(payload, serde_json::json!({"to": "ada"}));
    let completed = "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'";
    assert_eq!(t.count(completed).await, 1);
}

#[tokio::test]
async fn psql() {
    with_db(Backend::Postgres, |t| async move {
        rolled_back_or_run(&t, "postgres").await
    })
    .await;
}

#[tokio::test]
async fn mysql() {
    with_db(Backend::MySql, |t| async move {
        rolled_back_or_run(&t, "mysql").await
    })
    .await;
}

#[tokio::test]
async fn sqlite3() {
    with_db(Backend::Sqlite, |t| async move {
        rolled_back_or_run(&t, "sqlite").await
    })
    .await;
}

/// The documented enqueue that waits for jobs 1 and 2 (enqueued first with `rowclaim enqueue`),
/// through the database's own client: the job waits; one `rowclaim work --until-empty` runs the
/// two, releases it and runs it.
async fn waits_then_runs(t: &TestDb, block: &str) {
    run_ok(&t.url, &["init"], "").await;
    run_ok(
        &t.url,
        &["enqueue", "--queue", "mail"],
        "{\"to\": \"a\"}\n{\"to\": \"b\"}\n",
    )
    .await;
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE id IN (1, 2)")
            .await,
        2
    );
    client(t, &documented_sql(block)).await;
    let waiting = "SELECT COUNT(*) FROM rowclaim_jobs WHERE id = 3 AND status = 'waiting'";
    assert_eq!(t.count(waiting).await, 1, "{block}");
    run_ok(
        &t.url,
        &["work", "--queue", "mail", "--until-empty", "--", "cat"],
        "",
    )
    .await;
    let completed = "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'";
    assert_eq!(t.count(completed).await, 3, "{block}");
}

#[tokio::test]
async fn psql_waits() {
    with_db(Backend::Postgres, |t| async move {
        waits_then_runs(&t, "postgres-after").await
    })
    .await;
}

#[tokio::test]
async fn mysql_waits() {
    with_db(Backend::MySql, |t| async move {
        waits_then_runs(&t, "mysql-after").await
    })
    .await;
}

#[tokio::test]
async fn sqlite3_waits() {
    with_db(Backend::Sqlite, |t| async move {
        waits_then_runs(&t, "sqlite-after").await
    })
    .await;
}
