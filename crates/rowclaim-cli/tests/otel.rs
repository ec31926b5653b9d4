//! The `otel` feature: `rowclaim work` sends a `job` span per job, with its token and row id, to
//! the OTLP/HTTP endpoint in OTEL_EXPORTER_OTLP_ENDPOINT. The collector here is a listener of
//! the test's own that keeps what it is sent. Run by `scripts/test` with `--features otel`.
#![cfg(feature = "otel")]

use rowclaim_testkit as common;
mod support;

use std::sync::{Arc, Mutex};

use common::{with_db, Backend, TestDb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A collector that answers every request 200 and keeps (path, body) of each.
async fn collector() -> (String, Arc<Mutex<Vec<(String, Vec<u8>)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let keep = keep.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                // Read the head, then as many body bytes as it announces.
                loop {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let body = buf[end + 4..end + 4 + length].to_vec();
                    keep.lock().unwrap().push((path, body));
                    let _ = conn
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    buf.clear();
                }
            });
        }
    });
    (format!("http://{addr}"), got)
}

async fn job_spans_reach_the_collector(t: Arc<TestDb>) {
    let (endpoint, got) = collector().await;
    let out = support::rowclaim(&t.url, &["init"]).output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = support::run_fed(
        &t.url,
        &["enqueue", "--queue", "traced", "--kind", "mail"],
        "{}\n{}\n",
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let out = support::rowclaim(
        &t.url,
        &[
            "work",
            "--queue",
            "traced",
            "--until-empty",
            "--",
            "sh",
            "-c",
            "echo \"$ROWCLAIM_TOKEN\"",
        ],
    )
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
    .output()
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let tokens: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(tokens.len(), 2, "{out:?}");
    // The spans are flushed before the command exits.
    let sent = got.lock().unwrap().clone();
    let traces: Vec<&Vec<u8>> = sent
        .iter()
        .filter(|(path, _)| path == "/v1/traces")
        .map(|(_, body)| body)
        .collect();
    assert!(
        !traces.is_empty(),
        "no request to /v1/traces: {:?}",
        sent.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    let all: Vec<u8> = traces.into_iter().flatten().copied().collect();
    // OTLP protobuf keeps strings as they are, each after its field's tag and its length: a
    // span's name is field 5 of Span (tag 0x2A); an attribute's key is field 1 of KeyValue and a
    // string value field 1 of AnyValue (both tag 0x0A). Looking for tag, length and text finds
    // the field itself, not the same letters inside a longer string.
    let field = |tag: u8, text: &str| -> Vec<u8> {
        let len = u8::try_from(text.len()).expect("a short string");
        [vec![tag, len], text.as_bytes().to_vec()].concat()
    };
    let has = |needle: &[u8]| all.windows(needle.len()).any(|w| w == needle);
    assert!(has(&field(0x2A, "job")), "no span named job");
    for key in [
        "id",
        "token",
        "source",
        "queue",
        "kind",
        "attempt",
        "service.name",
    ] {
        assert!(has(&field(0x0A, key)), "no attribute {key:?}");
    }
    for value in ["traced", "mail", "main.rowclaim_jobs"] {
        assert!(has(&field(0x0A, value)), "no attribute value {value:?}");
    }
    for token in &tokens {
        assert!(
            has(&field(0x0A, token)),
            "the span of the job run under token {token} was not sent"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_job_spans_reach_the_collector() {
    with_db(Backend::Sqlite, job_spans_reach_the_collector).await
}
