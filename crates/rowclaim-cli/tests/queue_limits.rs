//! `rowclaim queue limit` with three `rowclaim work` processes on every backend: no limit is
//! exceeded across the processes, each key's jobs run one after another in enqueue order, every
//! job runs once; `queue list` and `jobs show` say so; limits that cannot work are refused.
//!
//! What overlapped is read from the commands' own start and end times: a command runs inside
//! its job's claim, so commands that overlapped were jobs running at once in the database.

use rowclaim_testkit as common;
mod support;

use std::process::Stdio;
use std::sync::Arc;

use common::{with_db, Backend, TestDb};
use support::{rowclaim, run_ok, until_count};

/// One run of a command: when it started and ended (ns), its job's key and place.
struct Run {
    start: u128,
    end: u128,
    key: String,
    n: i64,
}

fn runs(log: &std::path::Path) -> Vec<Run> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|l| {
            let mut f = l.splitn(3, ' ');
            let start = f.next().unwrap().parse().expect("start");
            let end = f.next().unwrap().parse().expect("end");
            let job: serde_json::Value = serde_json::from_str(f.next().unwrap()).expect("payload");
            Run {
                start,
                end,
                key: job["key"].as_str().unwrap().to_owned(),
                n: job["n"].as_i64().unwrap(),
            }
        })
        .collect()
}

/// The most of `runs` that ran at one moment.
fn most_at_once<'a>(runs: impl Iterator<Item = &'a Run>) -> usize {
    let mut edges: Vec<(u128, i64)> = runs.flat_map(|r| [(r.start, 1), (r.end, -1)]).collect();
    // An end before a start at the same instant: touching runs did not overlap.
    edges.sort_unstable();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

async fn limits_across_workers(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    let said = run_ok(
        &url,
        &[
            "queue",
            "limit",
            "l",
            "--concurrency",
            "2",
            "--key-concurrency",
            "1",
            "--json",
        ],
        "",
    )
    .await;
    let said: serde_json::Value = serde_json::from_str(said.trim()).expect("JSON");
    assert_eq!(said["limits"]["concurrency"], 2, "{said}");
    assert_eq!(said["limits"]["key_concurrency"], 1, "{said}");
    let keys = ["k1", "k2", "k3"];
    for n in 0..12 {
        let key = keys[n % 3];
        let payload = format!("{{\"key\":\"{key}\",\"n\":{n}}}");
        run_ok(
            &url,
            &["enqueue", "--queue", "l", "--limit-key", key, &payload],
            "",
        )
        .await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("runs.log");
    let command = format!(
        "s=$(date +%s%N); job=$(cat); sleep 0.2; echo \"$s $(date +%s%N) $job\" >> '{}'",
        log.display()
    );
    let mut workers = Vec::new();
    for _ in 0..3 {
        let w = rowclaim(
            &url,
            &[
                "work",
                "--queue",
                "l",
                "--concurrency",
                "3",
                "--poll",
                "100ms",
                "--lease",
                "30s",
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
    until_count(
        &t,
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'l' AND status = 'completed'",
        12,
    )
    .await;
    support::stop(workers).await;
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'l' AND status = 'completed' AND attempts = 1")
            .await,
        12,
        "every job ran, once"
    );
    let runs = runs(&log);
    assert_eq!(runs.len(), 12, "each command ran once");
    assert!(most_at_once(runs.iter()) <= 2, "more than 2 ran at once");
    for key in keys {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.key == key).collect();
        assert_eq!(
            most_at_once(mine.iter().copied()),
            1,
            "two of {key} at once"
        );
        let mut by_start = mine.clone();
        by_start.sort_by_key(|r| r.start);
        let order: Vec<i64> = by_start.iter().map(|r| r.n).collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted, "{key} ran out of enqueue order");
    }

    let list = run_ok(&url, &["queue", "list"], "").await;
    assert!(
        list.lines()
            .any(|l| l.starts_with("l\trunning (limits: 2 at once, 1 per key at once)")),
        "{list}"
    );
    let job = run_ok(&url, &["jobs", "show", "1"], "").await;
    let job: serde_json::Value = serde_json::from_str(job.trim()).expect("JSON");
    assert_eq!(job["limit_key"], "k1", "{job}");
    assert!(job["attempted_at"].is_string(), "{job}");

    // Lifted: listed without limits.
    run_ok(&url, &["queue", "limit", "l", "--none"], "").await;
    let list = run_ok(&url, &["queue", "list"], "").await;
    assert!(
        list.lines().any(|l| l.starts_with("l\trunning\t")),
        "{list}"
    );
}

/// Limits that cannot work are refused, naming the flag, and nothing is set.
async fn bad_limits(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    for (args, says) in [
        (vec!["queue", "limit", "q"], "--none"),
        (
            vec!["queue", "limit", "q", "--concurrency", "0"],
            "--concurrency",
        ),
        (vec!["queue", "limit", "q", "--rate", "5"], "--rate"),
        (
            vec!["queue", "limit", "q", "--key-rate", "1/0s"],
            "--key-rate",
        ),
        (
            vec!["queue", "limit", "q", "--none", "--concurrency", "2"],
            "--none",
        ),
    ] {
        let out = support::run_fed(&url, &args, "").await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let list = run_ok(&url, &["queue", "list", "--json"], "").await;
    assert!(!list.contains("\"q\""), "{list}");
}

macro_rules! cases {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn limits_hold_across_three_work_processes() {
                with_db($backend, limits_across_workers).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn limits_that_cannot_work_are_refused() {
                with_db($backend, bad_limits).await
            }
        }
    };
}

cases!(postgres, Backend::Postgres);
cases!(mysql, Backend::MySql);
cases!(sqlite, Backend::Sqlite);
