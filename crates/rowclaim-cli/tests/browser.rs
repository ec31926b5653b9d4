//! `rowclaim dashboard` in a real browser (headless Chromium from Debian's packages, driven over
//! WebDriver by `rowclaim_testkit::browser`), on every backend: log in with the printed token,
//! watch a queue's counts change while a `rowclaim work` process drains it, retry a dead job from
//! its page and see it complete, no actions and a refused forged POST when read-only, and nothing
//! but the login page without the token.
//!
//! With `ROWCLAIM_SCREENSHOTS=1` the PostgreSQL run also writes the README's screenshots to
//! `docs/screenshots/`.

use rowclaim_testkit as common;
mod support;

use std::process::Stdio;
use std::sync::Arc;

use common::browser::Browser;
use common::{with_db, Backend, TestDb};
use support::dashboard::{reload_until, Dashboard};
use support::run_ok;

/// Jobs the worker drains while the page is watched.
const JOBS: usize = 60;

/// Starts `rowclaim dashboard` sampling every second, with `extra` flags; `token`: the one in
/// its --token-file.
async fn dashboard(url: &str, extra: &[&str], token: Option<&str>) -> Dashboard {
    let mut args = vec!["--sample-every", "1s"];
    args.extend_from_slice(extra);
    support::dashboard::start(url, &args, token).await
}

fn count_cell(queue: &str, status: &str) -> String {
    format!("tr[data-queue=\"{queue}\"] td[data-status=\"{status}\"]")
}

async fn in_a_browser(t: Arc<TestDb>) {
    let url = t.url.clone();
    let flag_dir = tempfile::tempdir().expect("temp dir");
    let flag = flag_dir.path().join("fixed");
    run_ok(&url, &["init"], "").await;
    let jobs: String = (0..JOBS).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    run_ok(&url, &["enqueue", "--queue", "mail"], &jobs).await;
    // One job that fails until the flag file exists, with one attempt: it dies, and runs
    // again only when retried from the page.
    run_ok(
        &url,
        &[
            "enqueue",
            "--queue",
            "mail",
            "--max-attempts",
            "1",
            r#"{"flaky":true}"#,
        ],
        "",
    )
    .await;
    // A queue no worker serves, for the read-only case.
    run_ok(&url, &["enqueue", "--queue", "idle", r#"{"idle":1}"#], "").await;
    // A table of the user's own, partly claimed: the overview lists it too.
    t.jobs(20).await;
    let mut claim_args = support::TABLE.to_vec();
    claim_args.extend(["--lease", "10m"]);
    let mut args = vec!["claim", "--batch", "3"];
    args.extend(claim_args);
    run_ok(&url, &args, "").await;

    let dash = dashboard(&url, &[], None).await;
    let b = Browser::start().await.expect("start the browser");
    let overview = format!("{}/", dash.base);

    // Without the token: the login page, no data.
    b.goto(&overview).await.unwrap();
    let page = b.page_source().await.unwrap();
    assert!(!page.contains("data-queue"), "no queue without the token");
    assert!(
        page.to_lowercase().contains("token"),
        "the login page: {page}"
    );

    // With it: the overview, before any worker ran.
    b.goto(&dash.login).await.unwrap();
    let ready = b.text(&count_cell("mail", "ready")).await.unwrap();
    assert_eq!(ready.trim(), (JOBS + 1).to_string(), "all of mail is ready");
    assert!(
        b.exists("tr[data-source]").await.unwrap(),
        "the own table is listed"
    );

    // A worker drains the queue while the page is watched: its counts change to the end state.
    let mut worker = support::rowclaim(
        &url,
        &[
            "work",
            "--queue",
            "mail",
            "--concurrency",
            "2",
            "--poll",
            "200ms",
            "--",
            "sh",
            "-c",
            &format!(
                "sleep 0.05; if grep -q flaky && [ ! -e '{}' ]; then exit 3; fi",
                flag.display()
            ),
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start the worker");
    let done = JOBS.to_string();
    reload_until(&b, &overview, &count_cell("mail", "completed"), |t| {
        t == done
    })
    .await;
    reload_until(&b, &overview, &count_cell("mail", "dead"), |t| t == "1").await;
    assert_eq!(
        b.text(&count_cell("mail", "ready")).await.unwrap().trim(),
        "0"
    );

    // Retry the dead job from its page; the worker, still running, completes it now.
    let dead = t
        .count("SELECT MAX(id) FROM rowclaim_jobs WHERE status = 'dead'")
        .await;
    std::fs::write(&flag, "").expect("write the flag");
    let job_page = format!("{}/jobs/{dead}", dash.base);
    b.goto(&job_page).await.unwrap();
    assert_eq!(b.text("#status").await.unwrap().trim(), "dead");
    b.click("form[action$=\"/retry\"] button").await.unwrap();
    let asked = b.accept_confirm().await.unwrap();
    assert!(!asked.is_empty(), "the retry asks first");
    // The POST answers with the job's page again, its timeline naming the retry: only then is
    // it safe to load another page (which would cancel a form submission still under way).
    b.wait_for_text_contains("#timeline", "retry job from the dashboard")
        .await
        .unwrap();
    reload_until(&b, &job_page, "#status", |s| s == "completed").await;
    assert_eq!(
        t.count(&format!(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {dead} AND status = 'completed'"
        ))
        .await,
        1,
        "the retried job completed in the database"
    );
    // Pause a queue from its page, and resume it.
    let idle_page = format!("{}/queues/idle", dash.base);
    b.goto(&idle_page).await.unwrap();
    b.click("form[action$=\"/pause\"] button").await.unwrap();
    b.accept_confirm().await.unwrap();
    b.wait_for_text_contains("#state", "paused").await.unwrap();
    assert_eq!(
        t.count(
            "SELECT COUNT(*) FROM rowclaim_queues WHERE name = 'idle' AND paused_at IS NOT NULL"
        )
        .await,
        1,
        "paused in the database"
    );
    b.click("form[action$=\"/resume\"] button").await.unwrap();
    b.accept_confirm().await.unwrap();
    b.wait_for_text_contains("#state", "Running").await.unwrap();
    let actions = format!("{}/actions", dash.base);
    b.goto(&actions).await.unwrap();
    assert!(
        b.page_source().await.unwrap().contains("retry"),
        "the action is logged"
    );

    if t.backend == Backend::Postgres && std::env::var_os("ROWCLAIM_SCREENSHOTS").is_some() {
        screenshots(&b, &dash.base, dead).await;
    }
    let _ = worker.start_kill();
    let _ = worker.wait().await;

    // Read-only: no actions offered, and a POST forged in the page is refused.
    let token_dir = tempfile::tempdir().expect("temp dir");
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, "read-only-operator-token\n").expect("write the token");
    let ro = dashboard(
        &url,
        &[
            "--read-only",
            "--token-file",
            &token_file.display().to_string(),
        ],
        Some("read-only-operator-token"),
    )
    .await;
    b.goto(&ro.login).await.unwrap();
    let idle = t
        .count("SELECT MAX(id) FROM rowclaim_jobs WHERE queue = 'idle'")
        .await;
    b.goto(&format!("{}/jobs/{idle}", ro.base)).await.unwrap();
    assert_eq!(b.text("#status").await.unwrap().trim(), "ready");
    assert!(
        !b.exists("form[action$=\"/cancel\"]").await.unwrap(),
        "no cancel button when read-only"
    );
    let forged = b
        .driver()
        .execute(
            format!(
                "const csrf = document.querySelector('input[name=csrf]'); \
                 return fetch('/jobs/{idle}/cancel', {{method: 'POST', \
                   headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, \
                   body: 'csrf=' + (csrf ? csrf.value : '')}}).then(r => r.status);"
            ),
            Vec::new(),
        )
        .await
        .expect("run the forged POST");
    assert_eq!(
        forged.json(),
        &serde_json::json!(403),
        "read-only refuses it"
    );
    assert_eq!(
        t.count(&format!(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {idle} AND status = 'ready'"
        ))
        .await,
        1,
        "nothing changed"
    );
    b.close().await.expect("close the browser");
    for mut d in [dash, ro] {
        let _ = d.child.start_kill();
        let _ = d.child.wait().await;
    }
}

/// The README's screenshots: the overview, the queue's page, the retried job's page, the
/// workers and the search of every queue.
async fn screenshots(b: &Browser, base: &str, job: i64) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/screenshots");
    std::fs::create_dir_all(dir).expect("make docs/screenshots");
    for (page, file) in [
        (format!("{base}/"), "overview.png"),
        (format!("{base}/queues/mail"), "queue.png"),
        (format!("{base}/jobs/{job}"), "job.png"),
        (format!("{base}/workers"), "workers.png"),
        (format!("{base}/jobs?status=completed"), "jobs.png"),
    ] {
        b.goto(&page).await.unwrap();
        b.screenshot_to(format!("{dir}/{file}")).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_browser_postgres() {
    with_db(Backend::Postgres, in_a_browser).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_browser_mysql() {
    with_db(Backend::MySql, in_a_browser).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_a_browser_sqlite() {
    with_db(Backend::Sqlite, in_a_browser).await
}
