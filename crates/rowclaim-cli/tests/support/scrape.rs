//! Scraping a `/metrics` endpoint and reading the Prometheus text it answers.

use std::collections::HashMap;
use std::time::Duration;

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// One scrape, with this `Authorization` header if any: the status code, the head (lower
/// case) and the body.
pub async fn scrape_as(addr: &str, authorization: Option<&str>) -> (u16, String, String) {
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to /metrics");
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.expect("send");
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("content-type: text/plain"), "{head}");
    (code, head, body.to_owned())
}

/// Samples by series (name and labels as written), summed over series that differ only in
/// labels not asked for: `value(&m, "rowclaim_jobs_completed_total", &[])`.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
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
pub async fn scrape_until(addr: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    scrape_until_as(addr, None, what, done).await
}

/// [`scrape_until`], sending this `Authorization` header.
pub async fn scrape_until_as(
    addr: &str,
    authorization: Option<&str>,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let mut last = String::new();
    for _ in 0..360 {
        let (code, _, body) = scrape_as(addr, authorization).await;
        assert_eq!(code, 200, "{body}");
        if done(&body) {
            return body;
        }
        last = body;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("never saw {what}; last scrape:\n{last}");
}

/// A running `rowclaim work` and where it serves its metrics.
pub struct Serving {
    pub child: tokio::process::Child,
    /// `host:port` to connect to (a wildcard address said is reached on loopback).
    pub addr: String,
    /// The worker's whole stderr, once it has ended.
    pub stderr: tokio::task::JoinHandle<String>,
}

/// Starts `rowclaim work ARGS…` (which give --metrics) and waits for the address it says.
pub async fn serving(url: &str, args: &[&str]) -> Serving {
    let mut all = vec!["work"];
    all.extend_from_slice(args);
    let mut child = super::rowclaim(url, &all)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rowclaim work");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (addr, mut said) = tokio::time::timeout(Duration::from_secs(60), async {
        let mut said = String::new();
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            said.push_str(&line);
            said.push('\n');
            if let Some(rest) = line.strip_prefix("rowclaim: metrics at http://") {
                let addr = rest.split("/metrics").next().unwrap_or(rest);
                return (addr.replace("0.0.0.0:", "127.0.0.1:"), said);
            }
        }
        panic!("rowclaim work ended without saying where its metrics are:\n{said}");
    })
    .await
    .expect("the metrics address is said within a minute");
    // Keep draining stderr so the worker never blocks on a full pipe.
    let stderr = tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            said.push_str(&line);
            said.push('\n');
        }
        said
    });
    Serving {
        child,
        addr,
        stderr,
    }
}

/// Starts `rowclaim work --metrics 127.0.0.1:0 …` and returns it with the address it said.
pub async fn worker_with_metrics(url: &str, args: &[&str]) -> (tokio::process::Child, String) {
    let mut all = vec!["--metrics", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let s = serving(url, &all).await;
    (s.child, s.addr)
}

pub async fn stop(mut child: tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let _ = tokio::time::timeout(Duration::from_secs(60), child.wait()).await;
}
