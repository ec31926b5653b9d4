//! `rowclaim jobs retry|cancel|delete` on every job a filter matches, on every backend: 20,000
//! dead jobs of one queue made ready in one command (others untouched), the filters of
//! `jobs list` (search, age), a unique key another job holds, the refusals of a selection that
//! is missing or that the action cannot take, and the question asked on a terminal.

use rowclaim_testkit as common;
mod support;

use std::process::Output;
use std::sync::Arc;

use common::{with_db, Backend, TestDb};
use support::{run_fed, run_ok, stderr};

/// Dead jobs the one command makes ready.
const DEAD: usize = 20_000;

/// `n` JSON lines `{"n": i}`.
fn lines(n: usize) -> String {
    (0..n).map(|i| format!("{{\"n\":{i}}}\n")).collect()
}

async fn run(url: &str, args: &[&str]) -> Output {
    run_fed(url, args, "").await
}

/// 20,003 jobs of queue q die (3 of them are then cancelled instead), 10 of queue other die,
/// 5 more of q are ready: `jobs retry --queue q --status dead` makes exactly the 20,000 dead
/// jobs of q ready, their attempts reset.
async fn retry_all_dead(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    run_ok(&url, &["enqueue", "--queue", "q"], &lines(DEAD + 3)).await;
    run_ok(&url, &["enqueue", "--queue", "other"], &lines(10)).await;
    t.exec(
        "UPDATE rowclaim_jobs SET status = 'dead', attempts = 3, last_error = 'boom', \
         finished_at = run_at",
    )
    .await;
    t.exec("UPDATE rowclaim_jobs SET status = 'cancelled' WHERE queue = 'q' AND id <= 3")
        .await;
    run_ok(&url, &["enqueue", "--queue", "q"], &lines(5)).await;

    let out = run(&url, &["jobs", "retry", "--queue", "q", "--status", "dead"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        stderr(&out).contains(&format!("retried {DEAD} job(s) (queue q, status dead)")),
        "{out:?}"
    );
    let count = |sql: &'static str| t.count(sql);
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'q' AND status = 'ready' \
             AND attempts = 0 AND finished_at IS NULL"
        )
        .await,
        (DEAD + 5) as i64,
        "every dead job of q is ready, attempts reset; the 5 ready ones stay"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'q' AND status = 'cancelled'")
            .await,
        3,
        "cancelled jobs are not dead: untouched"
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'other' AND status = 'dead' \
             AND attempts = 3"
        )
        .await,
        10,
        "another queue's dead jobs are untouched"
    );
    // Nothing dead is left in q: the same command changes nothing, and says so (exit 1).
    let again = run(&url, &["jobs", "retry", "--queue", "q", "--status", "dead"]).await;
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(stderr(&again).contains("retried no job"), "{again:?}");
}

/// The filters select what `jobs list` shows and what the actions change: a search that takes
/// `%` and `_` as plain characters and ignores case, an age, ids, and a retry that leaves a job
/// whose unique key another pending job holds.
async fn filters(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    let payloads = "{\"deal\":\"50% off\"}\n{\"deal\":\"500 off\"}\n{\"deal\":\"5x0 off\"}\n";
    run_ok(
        &url,
        &["enqueue", "--queue", "shop", "--kind", "Sale"],
        payloads,
    )
    .await;
    let listed = |args: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let mut all = vec!["jobs", "list"];
            all.extend_from_slice(args);
            let out = run_ok(&url, &all, "").await;
            let mut ids: Vec<i64> = out
                .lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).expect("JSON")["id"]
                        .as_i64()
                        .expect("an id")
                })
                .collect();
            ids.sort_unstable();
            ids
        }
    };
    assert_eq!(
        listed(&["--search", "50%"]).await,
        vec![1],
        "% is a plain %"
    );
    assert_eq!(
        listed(&["--search", "5_0"]).await,
        Vec::<i64>::new(),
        "_ too"
    );
    assert_eq!(
        listed(&["--search", "sale"]).await,
        vec![1, 2, 3],
        "kind, any case"
    );
    assert_eq!(listed(&["--search", "2"]).await, vec![2], "the id");
    assert_eq!(listed(&["--older-than", "1h"]).await, Vec::<i64>::new());
    let two_hours_ago = match t.backend {
        Backend::Postgres => "created_at - interval '2 hours'",
        Backend::MySql => "created_at - INTERVAL 2 HOUR",
        Backend::Sqlite => "created_at - 7200000",
    };
    t.exec(&format!(
        "UPDATE rowclaim_jobs SET created_at = {two_hours_ago}, status = 'dead', \
         last_error = 'SMTP refused' WHERE id = 3"
    ))
    .await;
    assert_eq!(listed(&["--older-than", "1h"]).await, vec![3]);
    assert_eq!(
        listed(&["--search", "smtp"]).await,
        vec![3],
        "the last error"
    );
    // Cancel by search: the two ready jobs it matches (3 matches too, but is dead).
    let out = run(&url, &["jobs", "cancel", "--search", " OFF\""]).await;
    assert!(stderr(&out).contains("cancelled 2 job(s)"), "{out:?}");
    assert_eq!(
        listed(&["--status", "cancelled"]).await,
        vec![1, 2],
        "{out:?}"
    );
    // By ids: both deleted, one missing said.
    let out = run(&url, &["jobs", "delete", "1", "99"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("there is no job 99"), "{out:?}");
    assert_eq!(listed(&[]).await, vec![2, 3]);

    // A dead job whose unique key a ready job has now stays dead; the others are retried.
    let keyed = "{\"k\":1}";
    run_ok(
        &url,
        &["enqueue", "--queue", "k", "--unique-key", "u", keyed],
        "",
    )
    .await;
    t.exec("UPDATE rowclaim_jobs SET status = 'dead' WHERE queue = 'k'")
        .await;
    run_ok(
        &url,
        &["enqueue", "--queue", "k", "--unique-key", "u", keyed],
        "",
    )
    .await;
    run_ok(&url, &["enqueue", "--queue", "k"], &lines(3)).await;
    t.exec("UPDATE rowclaim_jobs SET status = 'dead' WHERE queue = 'k' AND unique_key IS NULL")
        .await;
    let out = run(&url, &["jobs", "retry", "--queue", "k"]).await;
    assert!(stderr(&out).contains("retried 3 job(s)"), "{out:?}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'k' AND status = 'dead'")
            .await,
        1,
        "the job whose key is pending stays dead"
    );
}

/// What the actions refuse, naming the flag and the way out (exit 2), and the question a
/// terminal is asked above 100 jobs.
#[tokio::test]
async fn a_missing_or_impossible_selection_is_refused() {
    let s = support::Scratch::new("bulk.db");
    assert!(s.run(&["init"]).await.status.success());
    let url = s.url.clone();
    run_ok(&url, &["enqueue", "--queue", "q"], &lines(150)).await;
    let refused = |args: &'static [&'static str], says: &'static [&'static str]| {
        let url = url.clone();
        async move {
            let out = run(&url, args).await;
            assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
            for s in says {
                assert!(
                    stderr(&out).contains(s),
                    "{args:?} should say {s:?}: {out:?}"
                );
            }
        }
    };
    refused(&["jobs", "retry"], &["which jobs?", "--all"]).await;
    refused(&["jobs", "delete", "1", "--queue", "q"], &["not both"]).await;
    refused(
        &["jobs", "retry", "--queue", "q", "--status", "ready"],
        &["--status ready", "dead or cancelled"],
    )
    .await;
    refused(
        &["jobs", "cancel", "--status", "completed"],
        &["--status completed"],
    )
    .await;
    refused(
        &["jobs", "delete", "--status", "running"],
        &["--status running"],
    )
    .await;
    refused(&["jobs", "list", "--search", " "], &["--search"]).await;
    refused(&["jobs", "retry", "--older-than", "-1h"], &["--older-than"]).await;

    // On a terminal (`script` gives the command one), 150 jobs are asked about first: "n"
    // changes nothing; --yes does not ask.
    let bin = support::BIN;
    let on_tty = |answer: &'static str, extra: &'static str| {
        let url = url.clone();
        async move {
            let script = format!("{bin} --database '{url}' jobs cancel --queue q {extra}");
            let mut c = tokio::process::Command::new("script");
            c.args(["-qec", &script, "/dev/null"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .env_remove("DATABASE_URL");
            let mut child = c.spawn().expect("start script");
            let mut input = child.stdin.take().expect("stdin");
            tokio::io::AsyncWriteExt::write_all(&mut input, answer.as_bytes())
                .await
                .expect("answer");
            let out = child.wait_with_output().await.expect("wait for script");
            drop(input);
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let said = on_tty("n\n", "").await;
    assert!(said.contains("cancel 150 jobs (queue q)?"), "{said}");
    assert!(said.contains("not confirmed"), "{said}");
    let count = |s: &'static str| {
        let url = url.clone();
        async move {
            run_ok(
                &url,
                &["jobs", "list", "--status", s, "--limit", "1000"],
                "",
            )
            .await
            .lines()
            .count()
        }
    };
    assert_eq!(count("ready").await, 150, "nothing cancelled");
    let said = on_tty("", "--yes").await;
    assert!(!said.contains("[y/N]"), "--yes does not ask: {said}");
    assert_eq!(count("cancelled").await, 150, "{said}");
}

macro_rules! cases {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retry_makes_20000_dead_jobs_of_a_queue_ready() {
                with_db($backend, retry_all_dead).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn filters_select_what_the_actions_change() {
                with_db($backend, filters).await
            }
        }
    };
}

cases!(postgres, Backend::Postgres);
cases!(mysql, Backend::MySql);
cases!(sqlite, Backend::Sqlite);
