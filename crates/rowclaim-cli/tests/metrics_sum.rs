//! The database gauges add up over every process Prometheus scrapes: two `rowclaim work
//! --metrics` and a dashboard on one database, and `sum(rowclaim_queue_jobs{status="completed"})`
//! is the database's count, because one process exports them (the others export none); when it
//! stops, another takes over.

use rowclaim_testkit as common;
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use support::scrape::{scrape_as, stop, value, worker_with_metrics};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A scrape target: where, the `Authorization` header it wants, the process.
struct Target {
    addr: String,
    auth: Option<String>,
    child: tokio::process::Child,
}

/// `rowclaim dashboard` on a spare port: its /metrics address and bearer token, from its start
/// lines.
async fn dashboard(url: &str) -> Target {
    let args = ["dashboard", "--listen", "127.0.0.1:0"];
    let mut child = support::rowclaim(url, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the dashboard");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let line = lines.next_line().await.expect("stdout").expect("a line");
            if line.starts_with("metrics at ") {
                return line;
            }
        }
    })
    .await
    .expect("the dashboard says where its metrics are");
    // metrics at http://HOST/metrics (Authorization: Bearer TOKEN)
    let rest = line.strip_prefix("metrics at http://").expect(&line);
    let (addr, rest) = rest.split_once("/metrics").expect(&line);
    let token = rest
        .trim()
        .strip_prefix("(Authorization: Bearer ")
        .and_then(|t| t.strip_suffix(')'))
        .expect(&line);
    Target {
        addr: addr.to_owned(),
        auth: Some(format!("Bearer {token}")),
        child,
    }
}

async fn worker(url: &str) -> Target {
    let args = ["--queue", "s", "--poll", "200ms", "--", "true"];
    let (child, addr) = worker_with_metrics(url, &args).await;
    Target {
        addr,
        auth: None,
        child,
    }
}

/// Scrapes every target until exactly one exports the database gauges, showing `completed`
/// completed jobs of queue `s`, and the others show none; returns the exporter's index.
async fn one_exports(targets: &[&Target], completed: f64) -> usize {
    let done = [("queue", "s"), ("status", "completed")];
    let mut last = Vec::new();
    for _ in 0..360 {
        last.clear();
        for t in targets {
            let (code, _, body) = scrape_as(&t.addr, t.auth.as_deref()).await;
            assert_eq!(code, 200, "{body}");
            last.push(body);
        }
        let exporters: Vec<usize> = (0..last.len())
            .filter(|i| value(&last[*i], "rowclaim_gauges_exporter", &[]) == Some(1.0))
            .collect();
        let sum: f64 = last
            .iter()
            .filter_map(|b| value(b, "rowclaim_queue_jobs", &done))
            .sum();
        let series = last
            .iter()
            .filter(|b| b.contains("\nrowclaim_queue_jobs{"))
            .count();
        if exporters.len() == 1 && series == 1 && sum == completed {
            return exporters[0];
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("never one exporter with {completed} completed; last scrapes:\n{last:#?}");
}

async fn gauges_add_up(t: Arc<TestDb>) {
    let out = support::rowclaim(&t.url, &["init"]).output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let jobs: String = (0..40).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let out = support::run_fed(&t.url, &["enqueue", "--queue", "s"], &jobs).await;
    assert!(out.status.success(), "{out:?}");

    let (a, b, d) = (
        worker(&t.url).await,
        worker(&t.url).await,
        dashboard(&t.url).await,
    );
    let completed = "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'";
    support::until_count(&t, completed, 40).await;
    let exporter = one_exports(&[&a, &b, &d], 40.0).await;

    // The exporter stops: another process takes its turn, and the sum still adds up.
    let mut targets = vec![a, b, d];
    let gone = targets.remove(exporter);
    stop(gone.child).await;
    one_exports(&[&targets[0], &targets[1]], 40.0).await;
    for t in targets {
        stop(t.child).await;
    }
}

mod postgres {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_workers_and_a_dashboard_add_up() {
        with_db(Backend::Postgres, gauges_add_up).await
    }
}
mod mysql {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_workers_and_a_dashboard_add_up() {
        with_db(Backend::MySql, gauges_add_up).await
    }
}
mod sqlite {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_workers_and_a_dashboard_add_up() {
        with_db(Backend::Sqlite, gauges_add_up).await
    }
}
