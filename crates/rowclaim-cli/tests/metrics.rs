//! `rowclaim work --metrics`: a worker draining a queue (and one on a table of your own) is
//! scraped over HTTP while it runs, on every backend. The worker's own counters must add up to
//! what the database holds, and the database gauges must agree with it.

use rowclaim_testkit as common;
mod support;

use std::sync::Arc;

use common::{with_db, Backend, TestDb};
use support::scrape::{
    scrape_as, scrape_until, scrape_until_as, serving, stop, value, worker_with_metrics, Serving,
};

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
    // The worker's counts add up to the queue's. Claims are the worker's (no queue label),
    // what happens to a job is its queue's.
    let s = [("source", source.as_str())];
    assert_eq!(value(&body, "rowclaim_claimed_rows_total", &s), Some(30.0));
    assert_eq!(value(&body, "rowclaim_jobs_retried_total", &m), Some(0.0));
    assert_eq!(value(&body, "rowclaim_jobs_failed_total", &m), Some(3.0));
    assert_eq!(value(&body, "rowclaim_leases_lost_total", &s), Some(0.0));
    assert!(
        value(&body, "rowclaim_claims_total", &[("result", "rows")]).unwrap_or(0.0) >= 1.0,
        "{body}"
    );
    assert_eq!(
        value(&body, "rowclaim_job_duration_seconds_count", &m),
        Some(30.0),
        "every job's run is timed once"
    );
    assert!(value(&body, "rowclaim_claim_duration_seconds_count", &s).unwrap_or(0.0) >= 1.0);
    assert!(value(&body, "rowclaim_settle_duration_seconds_count", &s).unwrap_or(0.0) >= 1.0);
    // Job durations are bucketed up to an hour; the build is said.
    assert!(
        body.contains("rowclaim_job_duration_seconds_bucket{") && body.contains("le=\"3600\""),
        "{body}"
    );
    let version = format!(
        "rowclaim_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    assert!(body.contains(&version), "{body}");
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
    // Counted, not estimated: far below the cap.
    assert_eq!(
        value(&body, "rowclaim_queue_jobs_estimated", &dead),
        Some(0.0)
    );
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

/// A worker of two queues: 400 jobs of one fail (one attempt each, so each dies), the other's
/// complete. Failed runs are counted per queue and kind (before, queue jobs' failures were not
/// counted at all), and no series carries both queues in one label.
async fn failed_runs_per_queue(t: Arc<TestDb>) {
    let out = support::rowclaim(&t.url, &["init"]).output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let failing: String = (0..400)
        .map(|i| format!("{{\"i\":{i},\"fail\":1}}\n"))
        .collect();
    let args = [
        "enqueue",
        "--queue",
        "f",
        "--kind",
        "boom",
        "--max-attempts",
        "1",
    ];
    let out = support::run_fed(&t.url, &args, &failing).await;
    assert!(out.status.success(), "{out:?}");
    let fine: String = (0..20).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let args = ["enqueue", "--queue", "g", "--kind", "fine"];
    let out = support::run_fed(&t.url, &args, &fine).await;
    assert!(out.status.success(), "{out:?}");

    let (worker, addr) = worker_with_metrics(
        &t.url,
        &[
            "--queue",
            "f",
            "--queue",
            "g",
            "--concurrency",
            "8",
            "--poll",
            "200ms",
            "--",
            "sh",
            "-c",
            "if grep -q fail; then exit 3; fi",
        ],
    )
    .await;
    let f = [("queue", "f"), ("kind", "boom")];
    let g = [("queue", "g"), ("kind", "fine")];
    let body = scrape_until(&addr, "400 failed runs of f and 20 jobs of g done", |b| {
        value(b, "rowclaim_jobs_failed_total", &f) == Some(400.0)
            && value(b, "rowclaim_jobs_completed_total", &g) == Some(20.0)
    })
    .await;
    assert_eq!(value(&body, "rowclaim_jobs_dead_total", &f), Some(400.0));
    assert_eq!(value(&body, "rowclaim_jobs_failed_total", &g), Some(0.0));
    assert_eq!(value(&body, "rowclaim_jobs_completed_total", &f), Some(0.0));
    assert_eq!(
        value(&body, "rowclaim_job_duration_seconds_count", &f),
        Some(400.0)
    );
    assert!(
        !body.contains("queue=\"f,g\"") && !body.contains("queue=\"g,f\""),
        "one queue per label: {body}"
    );
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
    assert!(
        !body
            .lines()
            .any(|l| l.starts_with("rowclaim_jobs_completed_total{") && l.contains("queue=")),
        "an own table's series have no queue label: {body}"
    );
    stop(worker).await;
}

/// What the tests' token files hold.
const TOKEN: &str = "metrics-token-0123456789abcdef";

/// A token file holding `text`, in `dir`: its path.
fn token_file(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("metrics.token");
    std::fs::write(&path, text).expect("write the token file");
    path.display().to_string()
}

/// `work --metrics ADDR --metrics-token-file PATH ARGS…` on the harness table, its COMMAND
/// reading the row and succeeding, at -vv so that every log line has its chance to show the
/// token.
async fn guarded_worker(url: &str, addr: &str, path: &str) -> Serving {
    let mut args = vec!["-vv", "--metrics", addr, "--metrics-token-file", path];
    args.extend(support::TABLE);
    args.extend(["--poll", "200ms", "--", "sh", "-c", "cat >/dev/null"]);
    serving(url, &args).await
}

/// Every harness row done: the worker's counter and the table's gauge.
fn all_done(rows: f64) -> impl Fn(&str) -> bool {
    move |b: &str| {
        value(b, "rowclaim_jobs_completed_total", &[]) == Some(rows)
            && value(b, "rowclaim_source_rows", &[("status", "done")]) == Some(rows)
    }
}

/// Stops the worker and returns its stderr, which must not hold the token.
async fn stop_said(s: Serving) -> String {
    stop(s.child).await;
    let said = s.stderr.await.expect("stderr read to its end");
    assert!(!said.contains(TOKEN), "the token in the log:\n{said}");
    said
}

/// Rows of the harness table never claimed: ready, no owner, no attempt.
async fn untouched(t: &TestDb) -> i64 {
    t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready' AND owner IS NULL AND attempts = 0")
        .await
}

/// `rowclaim work EXTRA… --until-empty -- true` on the harness table, to its end.
async fn work_until_empty(url: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["work"];
    args.extend_from_slice(extra);
    args.extend(support::TABLE);
    args.extend(["--until-empty", "--", "true"]);
    support::rowclaim(url, &args)
        .output()
        .await
        .expect("run rowclaim work")
}

/// With --metrics-token-file, /metrics answers only the token: none or a wrong one (a prefix of
/// it too) is 401 with `WWW-Authenticate: Bearer`; the token is 200 with the metrics. The
/// token is in no log line, at -vv, nor in a refusal.
async fn token_guards_the_scrape(t: Arc<TestDb>) {
    t.jobs(3).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = token_file(&dir, &format!("{TOKEN}\n"));
    let s = guarded_worker(&t.url, "127.0.0.1:0", &path).await;
    let wrong = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    for auth in [
        None,
        Some("Bearer nope-nope-nope-nope"),
        Some(wrong.as_str()),
    ] {
        let (code, head, body) = scrape_as(&s.addr, auth).await;
        assert_eq!(code, 401, "{auth:?}: {head}\n{body}");
        assert!(head.contains("www-authenticate: bearer"), "{head}");
        assert!(body.contains("Authorization: Bearer"), "{body}");
        assert!(
            !body.contains("rowclaim_") && !body.contains(TOKEN),
            "{body}"
        );
    }
    let right = format!("Bearer {TOKEN}");
    let body = scrape_until_as(&s.addr, Some(&right), "3 rows done", all_done(3.0)).await;
    assert_eq!(value(&body, "rowclaim_database_up", &[]), Some(1.0));
    let said = stop_said(s).await;
    assert!(
        said.contains(&format!("(Authorization: Bearer, the token in {path})")),
        "{said}"
    );
}

/// Beyond loopback without a token file, `work` refuses to start (exit 2, naming both flags and
/// the fix) before it claims anything; an empty or missing token file likewise; with a token
/// file it serves there.
async fn beyond_loopback_needs_a_token(t: Arc<TestDb>) {
    t.jobs(3).await;
    for addr in ["0.0.0.0:0", "[::]:0", "192.0.2.1:9464"] {
        let out = work_until_empty(&t.url, &["--metrics", addr]).await;
        assert_eq!(out.status.code(), Some(2), "{addr}: {out:?}");
        let said = support::stderr(&out);
        assert!(
            said.contains(&format!("--metrics {addr}: not a loopback address"))
                && said.contains("give --metrics-token-file PATH")
                && said.contains("serve on 127.0.0.1"),
            "{said}"
        );
        assert_eq!(untouched(&t).await, 3, "{addr}: nothing claimed");
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("none").display().to_string();
    let empty = token_file(&dir, " \n");
    for (path, why) in [
        (&missing, "cannot read the token file"),
        (&empty, "is empty"),
    ] {
        let out = work_until_empty(
            &t.url,
            &["--metrics", "0.0.0.0:0", "--metrics-token-file", path],
        )
        .await;
        assert_eq!(out.status.code(), Some(2), "{path}: {out:?}");
        let said = support::stderr(&out);
        assert!(
            said.contains(&format!("--metrics-token-file {path}: "))
                && said.contains(why)
                && said.contains("openssl rand -hex 32"),
            "{said}"
        );
        assert_eq!(untouched(&t).await, 3, "{path}: nothing claimed");
    }
    let out = work_until_empty(&t.url, &["--metrics-token-file", &empty]).await;
    assert_eq!(out.status.code(), Some(2), "needs --metrics: {out:?}");
    assert!(
        support::stderr(&out).contains("--metrics <ADDR>"),
        "{out:?}"
    );
    assert_eq!(untouched(&t).await, 3);

    let path = token_file(&dir, &format!("  {TOKEN}  \n"));
    let s = guarded_worker(&t.url, "0.0.0.0:0", &path).await;
    assert_eq!(scrape_as(&s.addr, None).await.0, 401);
    let right = format!("Bearer {TOKEN}");
    scrape_until_as(&s.addr, Some(&right), "3 rows done", all_done(3.0)).await;
    stop_said(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_metrics_token_guards_the_scrape() {
    with_db(Backend::Sqlite, token_guards_the_scrape).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_metrics_beyond_loopback_needs_a_token() {
    with_db(Backend::Sqlite, beyond_loopback_needs_a_token).await
}

macro_rules! metrics_cases {
    ($backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn work_metrics_on_a_queue() {
            with_db($backend, queue_metrics).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn work_metrics_count_failed_runs_per_queue() {
            with_db($backend, failed_runs_per_queue).await
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
