//! `rowclaim queue pause|resume|list` with three `rowclaim work` processes on every backend, and
//! what a command says of its job: exit 75 snoozes it (no attempt used), its stdout is its
//! output (`jobs show`).

use rowclaim_testkit as common;
mod support;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use support::{rowclaim, run_ok, until_count};

/// How many times each job started, from the log the workers' command appends to.
fn starts(log: &std::path::Path) -> HashMap<String, usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut n = HashMap::new();
    for line in text.lines() {
        *n.entry(line.trim().to_owned()).or_insert(0) += 1;
    }
    n
}

/// Three workers serve queues p and other. Jobs of p enqueued after `queue pause p` never start
/// while it is paused, whichever worker looks, though the workers run other's jobs meanwhile;
/// after `queue resume p` each runs exactly once.
async fn pause_across_workers(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("starts.log");
    let said = run_ok(&url, &["queue", "pause", "p", "--json"], "").await;
    let said: serde_json::Value = serde_json::from_str(said.trim()).expect("JSON");
    assert_eq!(said["changed"], true, "{said}");
    // Paused already: nothing changed, exit 1 (as `jobs retry` of a job that is not dead).
    let again = support::run_fed(&url, &["queue", "pause", "p"], "").await;
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(
        again.stdout.is_empty(),
        "the notice goes to stderr: {again:?}"
    );
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("queue p was paused already"), "{said}");

    let command = format!(
        "echo \"$ROWCLAIM_QUEUE $ROWCLAIM_ID\" >> '{}'",
        log.display()
    );
    let mut workers = Vec::new();
    for _ in 0..3 {
        let w = rowclaim(
            &url,
            &[
                "work",
                "--queue",
                "p",
                "--queue",
                "other",
                "--concurrency",
                "2",
                "--poll",
                "200ms",
                "--lease",
                "3s",
                "--",
                "sh",
                "-c",
                &command,
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker");
        workers.push(w);
    }
    let p_jobs: String = (0..20).map(|i| format!("{{\"p\":{i}}}\n")).collect();
    run_ok(&url, &["enqueue", "--queue", "p"], &p_jobs).await;
    let other_jobs: String = (0..10).map(|i| format!("{{\"o\":{i}}}\n")).collect();
    run_ok(&url, &["enqueue", "--queue", "other"], &other_jobs).await;
    // The workers are alive and claiming: other's jobs all run.
    until_count(
        &t,
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'other' AND status = 'completed'",
        10,
    )
    .await;
    // A few more rounds of polling by every worker, then: nothing of p ran.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !starts(&log).keys().any(|k| k.starts_with("p ")),
        "a job of the paused queue ran: {:?}",
        starts(&log)
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'p' AND status = 'ready' AND attempts = 0")
            .await,
        20
    );
    let list = run_ok(&url, &["queue", "list", "--json"], "").await;
    let p: serde_json::Value = list
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON"))
        .find(|q| q["queue"] == "p")
        .expect("p is listed");
    assert!(p["paused_at"].is_string(), "{p}");
    assert_eq!(p["jobs"]["ready"], 20, "{p}");

    run_ok(&url, &["queue", "resume", "p"], "").await;
    until_count(
        &t,
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'p' AND status = 'completed'",
        20,
    )
    .await;
    support::stop(workers).await;
    let ran = starts(&log);
    assert_eq!(ran.len(), 30, "every job ran: {ran:?}");
    assert!(ran.values().all(|n| *n == 1), "each once: {ran:?}");
    let list = run_ok(&url, &["queue", "list"], "").await;
    assert!(
        list.lines().any(|l| l.starts_with("p\trunning")),
        "p runs: {list}"
    );
}

/// A command that exits 75 asks to run again later: it does, without using an attempt. What a
/// command prints is its job's output: JSON as JSON, text as a string, cut at --output-limit.
async fn snooze_and_output(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let flag = dir.path().join("snoozed-once");
    let lines = "{\"do\":\"snooze\"}\n{\"do\":\"json\"}\n{\"do\":\"text\"}\n{\"do\":\"long\"}\n";
    run_ok(
        &url,
        &["enqueue", "--queue", "c", "--max-attempts", "1"],
        lines,
    )
    .await;
    let command = format!(
        "read job; case \"$job\" in \
           *snooze*) if [ ! -e '{flag}' ]; then touch '{flag}'; exit 75; fi; echo '{{\"woke\": true}}' ;; \
           *json*) echo '{{\"sum\": 42}}' ;; \
           *text*) echo 'hello there' ;; \
           *long*) printf 'x%.0s' $(seq 1 100) ;; \
         esac",
        flag = flag.display()
    );
    let out = rowclaim(
        &url,
        &[
            "work",
            "--queue",
            "c",
            "--until-empty",
            "--wait-scheduled",
            "--snooze-for",
            "1s",
            "--output-limit",
            "64",
            "--json",
            "--",
            "sh",
            "-c",
            &command,
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .output()
    .await
    .expect("run the worker");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The commands' stdout still reaches ours, whole.
    assert!(
        stdout.contains("hello there") && stdout.contains(&"x".repeat(100)),
        "{stdout}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("a JSON summary");
    assert_eq!(summary["done"], 4, "{summary}");
    assert_eq!(summary["snoozed"], 1, "{summary}");

    let show = |id: i64| {
        let url = url.clone();
        async move {
            let text = run_ok(&url, &["jobs", "show", &id.to_string()], "").await;
            serde_json::from_str::<serde_json::Value>(&text).expect("a job as JSON")
        }
    };
    let snoozed = show(1).await;
    assert_eq!(snoozed["status"], "completed", "{snoozed}");
    assert_eq!(snoozed["attempts"], 1, "ran twice, one attempt: {snoozed}");
    assert_eq!(snoozed["output"], serde_json::json!({"woke": true}));
    assert_eq!(show(2).await["output"], serde_json::json!({"sum": 42}));
    assert_eq!(show(3).await["output"], "hello there");
    let long = show(4).await["output"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(long, format!("{}…", "x".repeat(64)), "cut at the limit");
}

macro_rules! cases {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_paused_queue_starts_nothing_in_any_worker() {
                with_db($backend, pause_across_workers).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn exit_75_snoozes_and_stdout_is_the_output() {
                with_db($backend, snooze_and_output).await
            }
        }
    };
}

cases!(postgres, Backend::Postgres);
cases!(mysql, Backend::MySql);
cases!(sqlite, Backend::Sqlite);
