//! The worker registry through the CLI, on every backend: two `rowclaim work` processes (one of
//! the managed queue, one of an own table) are listed by `rowclaim workers --json` with their
//! pids and host; the one killed with SIGKILL is listed gone once its lease passed without a
//! heartbeat, the one stopped with SIGTERM stopped; and a running job's owner (its claim's
//! token) names the worker that runs it.

use rowclaim_testkit as common;
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use serde_json::Value;
use support::{rowclaim, run_ok, TABLE};

/// `rowclaim workers --json`, parsed.
async fn workers(url: &str) -> Vec<Value> {
    let out = run_ok(url, &["workers", "--json"], "").await;
    serde_json::from_str::<Vec<Value>>(out.trim()).expect("workers --json prints a JSON array")
}

/// Polls `workers --json` (at most 3 minutes: the suite runs on a loaded machine) until `ok`
/// holds of the list; fails the test with the last list otherwise.
async fn until(url: &str, what: &str, ok: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut last = Vec::new();
    for _ in 0..900 {
        last = workers(url).await;
        if ok(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("never {what}: {last:#?}");
}

/// The listed worker of process `pid`.
fn of_pid(list: &[Value], pid: u32) -> Option<&Value> {
    list.iter().find(|w| w["pid"] == i64::from(pid))
}

/// This machine's name, as `uname -n` says it.
fn host() -> String {
    let out = std::process::Command::new("uname")
        .arg("-n")
        .output()
        .expect("uname -n");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

async fn killed_gone_stopped_stopped(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    t.jobs(3).await;
    run_ok(&url, &["enqueue", "--queue", "w"], "{\"n\":1}\n").await;
    // A: the managed queue's queue w, its one job running (a long command) when it is killed.
    let a = rowclaim(
        &url,
        &[
            "work", "--queue", "w", "--lease", "3s", "--poll", "200ms", "--", "sleep", "20",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start worker a");
    // B: an own table, its rows done at once; it idles on until stopped.
    let mut args = vec![
        "work",
        "--lease",
        "3s",
        "--poll",
        "200ms",
        "--concurrency",
        "2",
    ];
    args.extend(TABLE);
    args.extend(["--", "true"]);
    let b = rowclaim(&url, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start worker b");
    let (pid_a, pid_b) = (a.id().expect("pid"), b.id().expect("pid"));

    let list = until(&url, "both listed active, a running its job", |l| {
        let active = |w: Option<&Value>| w.is_some_and(|w| w["state"] == "active");
        active(of_pid(l, pid_a))
            && active(of_pid(l, pid_b))
            && of_pid(l, pid_a).is_some_and(|w| w["running"] == 1)
    })
    .await;
    let (wa, wb) = (of_pid(&list, pid_a).unwrap(), of_pid(&list, pid_b).unwrap());
    for w in [wa, wb] {
        assert_eq!(w["host"], host(), "{w}");
        assert_eq!(w["version"], env!("CARGO_PKG_VERSION"), "{w}");
        for field in ["id", "started_at", "heartbeat_at"] {
            assert!(w[field].is_string(), "{field}: {w}");
        }
    }
    assert_eq!(wa["queues"], serde_json::json!(["w"]), "{wa}");
    assert_eq!(wb["queues"], serde_json::json!([]), "{wb}");
    assert!(
        wb["source"].as_str().unwrap_or("").ends_with("jobs"),
        "{wb}"
    );
    assert_eq!(wb["concurrency"], 2, "{wb}");
    assert_ne!(wa["id"], wb["id"]);
    // The running job's owner is a token of a's claim, which ends as a's id does.
    let id_a = wa["id"].as_str().unwrap_or_default();
    let tail = &id_a[id_a.len().saturating_sub(12)..];
    assert_eq!(
        t.count(&format!(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'running' AND owner LIKE '%{tail}'"
        ))
        .await,
        1,
        "the running job's owner names worker a ({id_a})"
    );

    // SIGKILL (tokio's kill): a cannot say anything; it is gone once its lease passes.
    support::stop(vec![a]).await;
    until(&url, "a listed gone", |l| {
        of_pid(l, pid_a).is_some_and(|w| w["state"] == "gone" && w["running"] == 0)
    })
    .await;

    // SIGTERM: b shuts down cleanly and says so in the registry.
    std::process::Command::new("kill")
        .args(["-TERM", &pid_b.to_string()])
        .status()
        .expect("kill -TERM");
    let out = b.wait_with_output().await.expect("b ends");
    assert!(out.status.success(), "{}", support::stderr(&out));
    let list = workers(&url).await;
    let wb = of_pid(&list, pid_b).expect("b is still listed");
    assert_eq!(wb["state"], "stopped", "{wb}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        3
    );
}

/// A user that may claim and settle rows of `jobs` but not create or write `rowclaim_workers`
/// (users belong to the whole server: dropped at the end).
async fn claimer_user(t: &TestDb) -> (String, String) {
    let user = format!("rc_work_{}", &t.name[t.name.len().saturating_sub(10)..]);
    match t.backend {
        Backend::Postgres => {
            t.exec(&format!("CREATE ROLE {user} LOGIN")).await;
            t.exec(&format!("GRANT SELECT, UPDATE ON jobs TO {user}"))
                .await;
            t.exec(&format!("GRANT SELECT ON rowclaim_sources TO {user}"))
                .await;
            let url = t.direct_url().replacen("postgres@", &format!("{user}@"), 1);
            (user, url)
        }
        _ => {
            t.exec(&format!(
                "CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-{user}'"
            ))
            .await;
            for (table, what) in [("jobs", "SELECT, UPDATE"), ("rowclaim_sources", "SELECT")] {
                t.exec(&format!(
                    "GRANT {what} ON {}.{table} TO '{user}'@'%'",
                    t.name
                ))
                .await;
            }
            let (_, after) = t.url.split_once('@').expect("user@host in the URL");
            (user.clone(), format!("mysql://{user}:pw-{user}@{after}"))
        }
    }
}

/// A worker whose user may not create (or write) the registry works all the same: it says so
/// once, completes every row, and exits cleanly.
async fn unlisted_but_working(t: Arc<TestDb>) {
    t.jobs(5).await;
    // The table's mapping recorded by its owner, so that the user only reads the record.
    let mut replace = vec!["source", "replace"];
    replace.extend(TABLE);
    run_ok(&t.url, &replace, "").await;
    let (user, url) = claimer_user(&t).await;
    let mut args = vec!["work", "--until-empty", "--lease", "3s"];
    args.extend(TABLE);
    args.extend(["--", "true"]);
    let out = support::run_fed(&url, &args, "").await;
    let err = support::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        err.matches("will not list it").count(),
        1,
        "said once: {err}"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        5
    );
    match t.backend {
        Backend::Postgres => {
            t.exec(&format!("DROP OWNED BY {user}; DROP ROLE {user}"))
                .await
        }
        _ => t.exec(&format!("DROP USER '{user}'@'%'")).await,
    }
}

/// A worker prunes the entries stopped a day ago or more as it starts, also one that ends at
/// once (`--until-empty` of one job); younger entries stay listed.
async fn pruned_as_it_starts(t: Arc<TestDb>) {
    let url = t.url.clone();
    t.jobs(1).await;
    let mut work = vec!["work"];
    work.extend(TABLE);
    work.extend(["--until-empty", "--", "true"]);
    run_ok(&url, &work, "").await;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    for (id, ago_ms) in [("old-one", 49 * 3_600_000), ("young-one", 3_600_000)] {
        let at = now_ms - ago_ms;
        t.exec(&format!(
            "INSERT INTO rowclaim_workers (id, host, pid, version, queues, source, concurrency, \
             lease_ms, running, started_at, heartbeat_at, stopped_at) VALUES ('{id}', 'h', 1, \
             '0', '[]', 'jobs', 1, 30000, 0, {at}, {at}, {at})"
        ))
        .await;
    }
    t.insert_jobs(2, 2).await;
    run_ok(&url, &work, "").await;
    let left = |id: &str| format!("SELECT COUNT(*) FROM rowclaim_workers WHERE id = '{id}'");
    assert_eq!(t.count(&left("old-one")).await, 0, "stopped 49 hours ago");
    assert_eq!(t.count(&left("young-one")).await, 1, "stopped an hour ago");
}

macro_rules! cases {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_workers_listed_then_one_gone_and_one_stopped() {
                with_db($backend, killed_gone_stopped_stopped).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_worker_prunes_entries_a_day_old_as_it_starts() {
                with_db($backend, pruned_as_it_starts).await
            }
        }
    };
}

macro_rules! denied {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_registry_it_may_not_write_does_not_stop_it() {
                with_db($backend, unlisted_but_working).await
            }
        }
    };
}

cases!(postgres, Backend::Postgres);
cases!(mysql, Backend::MySql);
denied!(postgres_denied, Backend::Postgres);
denied!(mysql_denied, Backend::MySql);
cases!(sqlite, Backend::Sqlite);
