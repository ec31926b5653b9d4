//! `rowclaim work --metrics`: a worker draining a queue (and one on a table of your own) is
//! scraped over HTTP while it runs, on every backend. The worker's own counters must add up to
//! what the database holds, and the database gauges must agree with it.

use rowclaim_testkit as common;
mod support;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Starts `rowclaim work --metrics 127.0.0.1:0 …` and returns it with the address it said.
async fn worker_with_metrics(url: &str, args: &[&str]) -> (tokio::process::Child, String) {
    let mut all = vec!["work", "--metrics", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let mut child = support::rowclaim(url, &all)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rowclaim work");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if let Some(rest) = line.strip_prefix("rowclaim: metrics at http://") {
                return rest.trim_end_matches("/metrics").to_owned();
            }
        }
        panic!("rowclaim work ended without saying where its metrics are");
    })
    .await
    .expect("the metrics address is said within a minute");
    // Keep draining stderr so the worker never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

/// One scrape: the status line's code and the body.
async fn scrape(addr: &str) -> (u16, String) {
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to /metrics");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.expect("send");
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    (code, body.to_owned())
}

/// Samples by series (name and labels as written), summed over series that differ only in
/// labels not asked for: `value(&m, "rowclaim_jobs_completed_total", &[])`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, v)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let have: HashMap<&str, &str> = series_labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k, v.trim_matches('"')))
            .collect();
        if labels.iter().all(|(k, v)| have.get(k) == Some(v)) {
            let v: f64 = v.parse().expect("a number");
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// Scrapes until `done` holds (at most 3 minutes: the suite runs on a loaded machine) and
/// returns that scrape.
async fn scrape_until(addr: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..360 {
        let (code, body) = scrape(addr).await;
        assert_eq!(code, 200, "{body}");
        if done(&body) {
            return body;
        }
        last = body;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("never saw {what}; last scrape:\n{last}");
}

async fn stop(mut child: tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
}

/// `table` as the database's catalog names it: the `source` label of every series.
fn catalog_name(t: &TestDb, table: &str) -> String {
    match t.backend {
        Backend::Postgres => format!("public.{table}"),
        Backend::MySql => format!("{}.{table}", t.name),
        Backend::Sqlite => format!("main.{table}"),
    }
}

async fn queue_metrics(t: Arc<TestDb>) {
    // A password the server does not ask for (trust auth) must still never show.
    let url = match t.backend {
        Backend::Postgres => t.url.replacen("://postgres@", "://postgres:s3cretpw@", 1),
        _ => t.url.clone(),
    };
    assert!(
        t.backend != Backend::Postgres || url.contains("s3cretpw"),
        "{url}"
    );
    let out = support::rowclaim(&url, &["init"]).output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: String = (0..30)
        .map(|i| {
            let fail = if i % 10 == 3 { ",\"fail\":1" } else { "" };
            format!("{{\"i\":{i}{fail}}}\n")
        })
        .collect();
    let out = support::run_fed(
        &url,
        &["enqueue", "--queue", "m", "--max-attempts", "1"],
        &lines,
    )
    .await;
    assert!(out.status.success(), "{out:?}");

    let (worker, addr) = worker_with_metrics(
        &url,
        &[
            "--queue",
            "m",
            "--concurrency",
            "4",
            "--poll",
            "200ms",
            "--",
            "sh",
            "-c",
            "if grep -q fail; then exit 3; fi",
        ],
    )
    .await;
    let source = catalog_name(&t, "rowclaim_jobs");
    let m = [("queue", "m"), ("source", source.as_str())];
    let body = scrape_until(&addr, "27 completed and 3 dead jobs", |b| {
        value(b, "rowclaim_jobs_completed_total", &m) == Some(27.0)
            && value(b, "rowclaim_jobs_dead_total", &m) == Some(3.0)
            && value(
                b,
                "rowclaim_queue_jobs",
                &[("queue", "m"), ("status", "completed")],
            ) == Some(27.0)
    })
    .await;
    // The worker's counts add up to the queue's.
    assert_eq!(value(&body, "rowclaim_claimed_rows_total", &m), Some(30.0));
    assert_eq!(value(&body, "rowclaim_jobs_retried_total", &m), Some(0.0));
    assert_eq!(value(&body, "rowclaim_leases_lost_total", &m), Some(0.0));
    assert!(
        value(&body, "rowclaim_claims_total", &[("result", "rows")]).unwrap_or(0.0) >= 1.0,
        "{body}"
    );
    assert_eq!(
        value(&body, "rowclaim_job_duration_seconds_count", &m),
        Some(30.0),
        "every job's run is timed once"
    );
    assert!(value(&body, "rowclaim_claim_duration_seconds_count", &m).unwrap_or(0.0) >= 1.0);
    assert!(value(&body, "rowclaim_settle_duration_seconds_count", &m).unwrap_or(0.0) >= 1.0);
    assert_eq!(value(&body, "rowclaim_jobs_in_flight", &m), Some(0.0));
    // The strategy label is the one in use, never `auto`.
    assert!(
        !body.contains("strategy=\"auto\"") && body.contains("strategy=\""),
        "{body}"
    );
    // The database gauges agree.
    let q = [("queue", "m")];
    let dead = [("queue", "m"), ("status", "dead")];
    assert_eq!(value(&body, "rowclaim_queue_jobs", &dead), Some(3.0));
    assert_eq!(value(&body, "rowclaim_queue_due_jobs", &q), Some(0.0));
    assert_eq!(value(&body, "rowclaim_queue_expired_leases", &q), Some(0.0));
    assert_eq!(value(&body, "rowclaim_database_up", &[]), Some(1.0));
    assert!(
        body.contains("# TYPE rowclaim_claim_duration_seconds histogram"),
        "{body}"
    );
    assert!(!body.contains("s3cretpw"), "{body}");

    // New work shows up in the gauges within their refresh.
    let out = support::run_fed(&url, &["enqueue", "--queue", "m", "--delay", "1h"], "{}\n").await;
    assert!(out.status.success(), "{out:?}");
    scrape_until(&addr, "the job scheduled later", |b| {
        value(
            b,
            "rowclaim_queue_jobs",
            &[("queue", "m"), ("status", "ready")],
        ) == Some(1.0)
    })
    .await;
    stop(worker).await;
}

async fn own_table_metrics(t: Arc<TestDb>) {
    t.jobs(12).await;
    let mut args: Vec<&str> = support::TABLE.to_vec();
    args.extend(["--concurrency", "2", "--", "sh", "-c", "cat >/dev/null"]);
    let (worker, addr) = worker_with_metrics(&t.url, &args).await;
    // The worker's series and the table's gauges carry the same source label, whatever the
    // name the worker was given (`jobs`): the catalog's.
    let source = catalog_name(&t, "jobs");
    let s = [("source", source.as_str())];
    let body = scrape_until(&addr, "12 rows done", |b| {
        value(b, "rowclaim_jobs_completed_total", &s) == Some(12.0)
            && value(
                b,
                "rowclaim_source_rows",
                &[("source", source.as_str()), ("status", "done")],
            ) == Some(12.0)
    })
    .await;
    assert_eq!(value(&body, "rowclaim_claimed_rows_total", &s), Some(12.0));
    assert_eq!(
        value(&body, "rowclaim_source_expired_leases", &s),
        Some(0.0)
    );
    assert_eq!(
        value(&body, "rowclaim_jobs_completed_total", &[("queue", "")]),
        Some(12.0),
        "an own table's series have an empty queue label"
    );
    stop(worker).await;
}

macro_rules! metrics_cases {
    ($backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn work_metrics_on_a_queue() {
            with_db($backend, queue_metrics).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn work_metrics_on_an_own_table() {
            with_db($backend, own_table_metrics).await
        }
    };
}

mod postgres {
    use super::*;
    metrics_cases!(Backend::Postgres);
}
mod mysql {
    use super::*;
    metrics_cases!(Backend::MySql);
}
mod sqlite {
    use super::*;
    metrics_cases!(Backend::Sqlite);
}
