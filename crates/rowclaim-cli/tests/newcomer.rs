//! What a new user meets, on every database: a table whose id names two rows is refused before
//! anything is claimed (and `check` finds it); a missing privilege stops `work` at once with the
//! GRANT to run, not as an outage; `stats` only looks (no table made, a read-only user may run
//! it); a row of one's own table that its command snoozes (exit 75) waits out the snooze.

use rowclaim_testkit as common;
mod support;

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use serde_json::Value;
use support::stderr;

async fn output(url: &str, args: &[&str]) -> Output {
    let run = support::rowclaim(url, args).output();
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .unwrap_or_else(|_| panic!("rowclaim {args:?} ends within 2 minutes"))
        .expect("run rowclaim")
}

/// How many of rowclaim's own tables the test's database holds.
async fn own_tables(t: &TestDb) -> i64 {
    t.count(match t.backend {
        Backend::Sqlite => "SELECT COUNT(*) FROM sqlite_master WHERE name LIKE 'rowclaim%'",
        Backend::MySql => {
            "SELECT COUNT(*) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'rowclaim%'"
        }
        Backend::Postgres => {
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_name LIKE 'rowclaim%'"
        }
    })
    .await
}

/// A user of the test's server who may only read `table`, and the URL that connects as it;
/// `None` on SQLite, whose files have no users. [`drop_reader`] removes it.
async fn reader(t: &TestDb, table: &str) -> Option<(String, String)> {
    let user = format!("rc_read_{}", &t.name[t.name.len().saturating_sub(10)..]);
    match t.backend {
        Backend::Postgres => {
            t.exec(&format!("CREATE ROLE {user} LOGIN")).await;
            t.exec(&format!("GRANT SELECT ON {table} TO {user}")).await;
            let url = t.direct_url().replacen("postgres@", &format!("{user}@"), 1);
            Some((user, url))
        }
        Backend::MySql => {
            t.exec(&format!(
                "CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-{user}'"
            ))
            .await;
            t.exec(&format!(
                "GRANT SELECT ON {}.{table} TO '{user}'@'%'",
                t.name
            ))
            .await;
            let (_, after) = t.url.split_once('@').expect("user@host in the URL");
            Some((user.clone(), format!("mysql://{user}:pw-{user}@{after}")))
        }
        Backend::Sqlite => None,
    }
}

/// Removes a user [`reader`] made (users belong to the whole server).
async fn drop_reader(t: &TestDb, user: &str) {
    match t.backend {
        Backend::Postgres => {
            t.exec(&format!("DROP OWNED BY {user}; DROP ROLE {user}"))
                .await;
        }
        Backend::MySql => t.exec(&format!("DROP USER '{user}'@'%'")).await,
        Backend::Sqlite => {}
    }
}

/// Two rows share id 1 and nothing keeps ids apart: claim and complete are refused naming the
/// column and the statement that fixes it, nothing is claimed, and `check` exits 8 with that
/// statement as the fix; once it has run, claims work.
async fn non_unique_id(t: Arc<TestDb>) {
    t.exec("CREATE TABLE twice (id BIGINT NOT NULL, status VARCHAR(20) NOT NULL)")
        .await;
    t.exec("INSERT INTO twice (id, status) VALUES (1, 'ready'), (1, 'ready'), (2, 'ready')")
        .await;
    let token = "01a214dc-cdc8-7641-90c3-48b94964a8ee";
    for args in [
        &["claim", "--table", "twice", "--batch", "1"][..],
        &[
            "complete", "--table", "twice", "--token", token, "--id", "1",
        ][..],
    ] {
        let out = output(&t.url, args).await;
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(said.contains("twice.id is not unique"), "{said}");
        assert!(said.contains("CREATE UNIQUE INDEX"), "{said}");
    }
    let ready = "SELECT COUNT(*) FROM twice WHERE status = 'ready'";
    assert_eq!(t.count(ready).await, 3, "nothing was claimed");
    assert_eq!(own_tables(&t).await, 0, "nothing was made");

    let out = output(&t.url, &["check", "--json", "--table", "twice"]).await;
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("check's JSON");
    let id = report["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == "id-column"))
        .unwrap_or_else(|| panic!("no id-column finding: {report:#}"));
    assert_eq!(id["severity"], "error", "{report:#}");
    let fix = id["fix"].as_str().expect("a fix").to_owned();
    assert!(fix.starts_with("CREATE UNIQUE INDEX"), "{fix}");

    t.exec("DELETE FROM twice WHERE id = 1").await;
    t.exec("INSERT INTO twice (id, status) VALUES (1, 'ready')")
        .await;
    t.exec(&fix).await;
    let out = output(&t.url, &["claim", "--table", "twice", "--batch", "1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A user who may read the table but not change it: `work --until-empty` stops at once with
/// exit 2, naming UPDATE and the GRANT (a configuration error, not an outage it waits out).
/// On SQLite, a URL that opens the file read-only does the same (exit 2).
async fn missing_privilege(t: Arc<TestDb>) {
    t.jobs(3).await;
    let user = reader(&t, "jobs").await;
    let url = match &user {
        Some((_, url)) => url.clone(),
        None => format!("{}?mode=ro", t.url),
    };
    let args = [
        &["work"][..],
        &support::TABLE[..],
        &["--until-empty", "--give-up-after", "90s", "--", "true"],
    ]
    .concat();
    let out = output(&url, &args).await;
    if let Some((user, _)) = &user {
        drop_reader(&t, user).await;
    }
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(!said.contains("unreachable"), "{said}");
    if user.is_some() {
        assert!(said.contains("UPDATE on"), "{said}");
        assert!(said.contains("GRANT UPDATE ON"), "{said}");
    }
    let ready = "SELECT COUNT(*) FROM jobs WHERE status = 'ready'";
    assert_eq!(t.count(ready).await, 3);
}

/// `stats` of a table mapped by its status alone (auto: lease-table) makes no table, and a user
/// who may only read the table can run it.
async fn stats_only_looks(t: Arc<TestDb>) {
    t.exec("CREATE TABLE plain (id BIGINT PRIMARY KEY, status VARCHAR(20) NOT NULL)")
        .await;
    t.exec("INSERT INTO plain (id, status) VALUES (1, 'ready'), (2, 'ready'), (3, 'done')")
        .await;
    let args = ["stats", "--table", "plain", "--json"];
    let mut urls = vec![t.url.clone()];
    let user = reader(&t, "plain").await;
    urls.extend(user.iter().map(|(_, url)| url.clone()));
    let mut outs = Vec::new();
    for url in &urls {
        outs.push(output(url, &args).await);
    }
    if let Some((user, _)) = &user {
        drop_reader(&t, user).await;
    }
    for out in outs {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let stats: Value = serde_json::from_slice(&out.stdout).expect("stats' JSON");
        assert_eq!(stats["by_status"]["ready"], 2, "{stats}");
        assert_eq!(stats["by_status"]["done"], 1, "{stats}");
    }
    assert_eq!(own_tables(&t).await, 0, "stats made a table");
}

/// A command that exits 75 with `--snooze-for 30s` on a table of one's own runs once in 5
/// seconds: the row waits, claimed by nobody until its lease ends, its attempt taken back. On a
/// table with no lease column (auto: lease-table) a snooze cannot wait: the row fails, saying
/// so and naming --lease-column.
async fn snooze_waits(t: Arc<TestDb>) {
    t.jobs(1).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let runs = dir.path().join("runs");
    let script = format!("echo x >> '{}'; cat > /dev/null; exit 75", runs.display());
    let args = [
        &["work"][..],
        &support::TABLE[..],
        &["--snooze-for", "30s", "--", "sh", "-c", &script],
    ]
    .concat();
    let worker = support::rowclaim(&t.url, &args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start rowclaim work");
    let count = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    for _ in 0..1200 {
        if count() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(count(), 1, "the command never ran");
    tokio::time::sleep(Duration::from_secs(5)).await;
    support::stop(vec![worker]).await;
    assert_eq!(count(), 1, "a snoozed row ran again before its time");
    let waiting = "SELECT COUNT(*) FROM jobs WHERE status = 'claimed' AND owner IS NULL \
                   AND lease_until IS NOT NULL AND attempts = 0";
    assert_eq!(t.count(waiting).await, 1);

    t.exec("CREATE TABLE plain (id BIGINT PRIMARY KEY, status VARCHAR(20) NOT NULL)")
        .await;
    t.exec("INSERT INTO plain (id, status) VALUES (1, 'ready')")
        .await;
    let args = [
        "work",
        "--table",
        "plain",
        "--until-empty",
        "--",
        "sh",
        "-c",
        "cat > /dev/null; exit 75",
    ];
    let out = output(&t.url, &args).await;
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "{said}");
    assert!(said.contains("--lease-column"), "{said}");
    let failed = "SELECT COUNT(*) FROM plain WHERE status = 'failed'";
    assert_eq!(t.count(failed).await, 1, "{said}");
}

/// A claim with a wrong mapping finds nothing and records nothing: the mapping meant claims
/// next, instead of being refused as differing from the wrong one.
async fn an_empty_claim_records_nothing(t: Arc<TestDb>) {
    t.exec("CREATE TABLE plain (id BIGINT PRIMARY KEY, status VARCHAR(20) NOT NULL)")
        .await;
    t.exec("INSERT INTO plain (id, status) VALUES (1, 'ready'), (2, 'ready')")
        .await;
    let wrong = [
        "claim",
        "--table",
        "plain",
        "--ready",
        "0",
        "--claimed",
        "1",
    ];
    let out = output(&t.url, &wrong).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = output(&t.url, &["claim", "--table", "plain"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Now recorded: the wrong mapping is refused.
    let out = output(&t.url, &wrong).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

macro_rules! newcomer_cases {
    ($backend:expr) => {
        use super::*;

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_non_unique_id_is_refused() {
            with_db($backend, non_unique_id).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_missing_privilege_stops_work_naming_the_grant() {
            with_db($backend, missing_privilege).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stats_makes_nothing_and_needs_only_reading() {
            with_db($backend, stats_only_looks).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_claim_that_finds_nothing_records_no_mapping() {
            with_db($backend, an_empty_claim_records_nothing).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_snoozed_row_of_ones_own_table_waits() {
            with_db($backend, snooze_waits).await
        }
    };
}

mod postgres {
    newcomer_cases!(Backend::Postgres);
}
mod mysql {
    newcomer_cases!(Backend::MySql);
}
mod sqlite {
    newcomer_cases!(Backend::Sqlite);
}
