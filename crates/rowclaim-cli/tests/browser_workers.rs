//! The dashboard's Workers page, its holders by process, "run now" for a schedule, and the
//! chart history and the actions' log kept across a restart, in a real browser (headless
//! Chromium over WebDriver, `rowclaim_testkit::browser`), on every backend.

use rowclaim_testkit as common;
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::browser::Browser;
use common::{with_db, Backend, TestDb};
use support::dashboard::{reload_until, Dashboard};
use support::{run_ok, until_count};

/// Starts `rowclaim dashboard` sampling every `every`.
async fn dashboard(url: &str, every: &str) -> Dashboard {
    support::dashboard::start(url, &["--sample-every", every], None).await
}

/// The seconds a chart's caption says it spans (`(last 12 s; …)`, `(last 3 min; …)`).
fn span_secs(caption: &str) -> u64 {
    let after = caption.split("(last ").nth(1).unwrap_or_default();
    let mut words = after.split([' ', ';']);
    let n: u64 = words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    if words.next() == Some("min") {
        n * 60
    } else {
        n
    }
}

/// A schedule that has ticked once (its job is the pattern "run now" copies): `schedule run`
/// of an every-second schedule until it enqueued a job, then stopped.
async fn a_ticked_schedule(t: &TestDb) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("rowclaim.toml"),
        "[schedule.tick]\nevery = \"1s\"\nqueue = \"ticks\"\npayload = { from = \"config\" }\n",
    )
    .expect("write rowclaim.toml");
    let scheduler = support::rowclaim(&t.url, &["schedule", "run"])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the scheduler");
    let mut n = 0;
    for _ in 0..1800 {
        n = t
            .count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'ticks'")
            .await;
        if n > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(n > 0, "the schedule never ticked");
    support::stop(vec![scheduler]).await;
    dir
}

async fn workers_in_a_browser(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    let _config = a_ticked_schedule(&t).await;
    // One worker process holding two jobs under two claims: the second job is enqueued only
    // once the first runs, so a second claim takes it.
    run_ok(&url, &["enqueue", "--queue", "mail", "{\"n\":1}"], "").await;
    let worker = support::rowclaim(
        &url,
        &[
            "work",
            "--queue",
            "mail",
            "--concurrency",
            "2",
            "--lease",
            "3s",
            "--poll",
            "200ms",
            "--",
            "sleep",
            "60",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start the worker");
    let pid = worker.id().expect("pid");
    let running = "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'mail' AND status = 'running'";
    until_count(&t, running, 1).await;
    run_ok(&url, &["enqueue", "--queue", "mail", "{\"n\":2}"], "").await;
    until_count(&t, running, 2).await;
    let claims = "SELECT COUNT(DISTINCT owner) FROM rowclaim_jobs WHERE status = 'running'";
    assert_eq!(t.count(claims).await, 2, "two claims of one process");
    // And a worker of an own table, holding its one row.
    t.jobs(1).await;
    let mut args = vec!["work", "--lease", "3s", "--poll", "200ms"];
    args.extend(support::TABLE);
    args.extend(["--", "sleep", "60"]);
    let own = support::rowclaim(&url, &args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the own table's worker");
    let own_pid = own.id().expect("pid");
    until_count(&t, "SELECT COUNT(*) FROM jobs WHERE status = 'claimed'", 1).await;

    let dash = dashboard(&url, "1s").await;
    let b = Browser::start().await.expect("start the browser");
    b.goto(&dash.login).await.unwrap();

    // The Workers page lists the worker: its pid, active, and the two jobs it runs.
    let row = format!("table#workers tr[data-pid=\"{pid}\"]");
    let seen = reload_until(&b, &format!("{}/workers", dash.base), &row, |r| {
        r.contains("active") && r.contains("2/2")
    })
    .await;
    assert!(seen.contains("mail"), "{seen}");

    // The queue page names one holder, the process, with its two claims.
    b.goto(&format!("{}/queues/mail", dash.base)).await.unwrap();
    let holders = b.find_all("table#holders tr").await.unwrap();
    assert_eq!(holders.len(), 2, "a header and one holder");
    let holder = b.text("table#holders").await.unwrap();
    assert!(holder.contains(&format!("pid {pid}")), "{holder}");

    // The own table's page names the worker that holds its row.
    b.goto(&format!("{}/", dash.base)).await.unwrap();
    b.click("tr[data-source] a").await.unwrap();
    let holder = b.text("table#holders").await.unwrap();
    assert!(holder.contains(&format!("pid {own_pid}")), "{holder}");

    // Run now: the schedule's job once more, from the overview's schedules table.
    let ticks = "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'ticks'";
    let before = t.count(ticks).await;
    b.goto(&format!("{}/", dash.base)).await.unwrap();
    b.click("tr[data-schedule=\"tick\"] form[action=\"/schedules/tick/run\"] button")
        .await
        .unwrap();
    let asked = b.accept_confirm().await.unwrap();
    assert!(asked.contains("tick"), "{asked}");
    until_count(&t, ticks, before + 1).await;
    let copied = "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'ticks' AND unique_key IS NULL";
    assert_eq!(
        t.count(copied).await,
        1,
        "a copy of the tick's job, not a tick"
    );
    // The new job's page, with the schedule's payload.
    b.wait_for_text_contains("table#job", "ticks")
        .await
        .unwrap();
    let page = b.page_source().await.unwrap();
    assert!(page.contains("config"), "the tick's payload: {page}");

    // Samples and the action reach the journal; then a restart.
    let samples = "SELECT COUNT(*) FROM rowclaim_journal WHERE kind = 'dashboard.sample'";
    for _ in 0..1800 {
        if t.count(samples).await >= 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until_count(
        &t,
        "SELECT COUNT(*) FROM rowclaim_journal WHERE kind = 'dashboard.action'",
        1,
    )
    .await;
    support::stop(vec![dash.child]).await;
    let dash = dashboard(&url, "1h").await;
    b.goto(&dash.login).await.unwrap();

    // The new dashboard has sampled once itself: a chart over more than a few seconds is the
    // history it read back.
    b.goto(&format!("{}/queues/mail", dash.base)).await.unwrap();
    let caption = b.text("figure.chart figcaption").await.unwrap();
    assert!(
        span_secs(&caption) >= 5,
        "the chart's history was kept: {caption}"
    );
    b.goto(&format!("{}/actions", dash.base)).await.unwrap();
    let actions = b.text("table#actions").await.unwrap();
    assert!(
        actions.contains("run schedule now") && actions.contains("done: job"),
        "{actions}"
    );

    support::stop(vec![dash.child, worker, own]).await;
    b.close().await.unwrap();
}

macro_rules! cases {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn workers_page_holders_run_now_and_history_kept() {
                with_db($backend, workers_in_a_browser).await
            }
        }
    };
}

cases!(postgres, Backend::Postgres);
cases!(mysql, Backend::MySql);
cases!(sqlite, Backend::Sqlite);
