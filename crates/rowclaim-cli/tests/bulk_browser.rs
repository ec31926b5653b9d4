//! The dashboard's lists of jobs in a real browser, on every backend: "retry all N matching"
//! from a queue's filtered list (the count asked, the database changed, other jobs not), the
//! checkboxes acting on selected rows, the search across queues, pages both ways, and an own
//! table whose finished rows keep old leases (only a claimed row's is painted expired).

use rowclaim_testkit as common;
mod support;

use std::sync::Arc;

use common::browser::Browser;
use common::{with_db, Backend, TestDb};
use support::run_ok;

/// Dead jobs of queue mail that one click retries.
const DEAD: usize = 300;

/// Starts `rowclaim dashboard EXTRA…` on `url`: the process, its base address and login
/// address.
async fn dashboard(url: &str, extra: &[&str]) -> (tokio::process::Child, String, String) {
    let d = support::dashboard::start(url, extra, None).await;
    (d.child, d.base, d.login)
}

/// `lines` JSON payloads `{"n": i, "tag": "<tag>-i"}`.
fn payloads(n: usize, tag: &str) -> String {
    (0..n)
        .map(|i| format!("{{\"n\":{i},\"tag\":\"{tag}-{i}\"}}\n"))
        .collect()
}

/// The ids of the jobs a list shows, in its order.
async fn listed(b: &Browser) -> Vec<i64> {
    let mut ids = Vec::new();
    for row in b.find_all("table#jobs tr[data-job]").await.unwrap() {
        let id = row.attr("data-job").await.unwrap().unwrap_or_default();
        ids.push(id.parse().expect("a job id"));
    }
    ids
}

async fn lists(t: Arc<TestDb>) {
    let url = t.url.clone();
    run_ok(&url, &["init"], "").await;
    run_ok(&url, &["enqueue", "--queue", "mail"], &payloads(DEAD, "m")).await;
    run_ok(&url, &["enqueue", "--queue", "other"], &payloads(20, "o")).await;
    t.exec("UPDATE rowclaim_jobs SET status = 'dead', attempts = 3, last_error = 'refused'")
        .await;
    run_ok(&url, &["enqueue", "--queue", "mail"], &payloads(5, "fresh")).await;
    run_ok(
        &url,
        &[
            "enqueue",
            "--queue",
            "elsewhere",
            r#"{"needle":"Haystack-Needle-7"}"#,
        ],
        "",
    )
    .await;

    let (mut child, base, login) = dashboard(&url, &[]).await;
    let b = Browser::start().await.expect("start the browser");
    b.goto(&login).await.unwrap();

    // The bulk POST is behind the same checks as every POST: without the CSRF token, refused.
    b.goto(&format!("{base}/queues/mail?status=dead"))
        .await
        .unwrap();
    assert_eq!(
        post_from_page(&b, "action=delete&queue=mail", false).await,
        403
    );

    // A filtered list of one queue: retry all its dead jobs, asked first with their count.
    b.goto(&format!("{base}/queues/mail?status=dead"))
        .await
        .unwrap();
    let offer = b.text("#all-matching").await.unwrap();
    assert!(
        offer.contains(&format!("Retry all {DEAD} matching")),
        "{offer}"
    );
    b.click("#all-matching form:first-of-type button")
        .await
        .unwrap();
    let asked = b.accept_confirm().await.unwrap();
    assert!(
        asked.contains(&format!("Retry all {DEAD} jobs")) && asked.contains("mail"),
        "the question says how many: {asked}"
    );
    // Answered with the actions page, which says how many changed.
    b.wait_for_text_contains("#actions", &format!("done: {DEAD} job(s) changed"))
        .await
        .unwrap();
    let count = |sql: &'static str| t.count(sql);
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'mail' AND status = 'ready' \
             AND attempts = 0"
        )
        .await,
        (DEAD + 5) as i64,
        "every dead job of mail is ready again, attempts reset"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'other' AND status = 'dead'").await,
        20,
        "another queue's dead jobs are untouched"
    );

    // Selected rows: two of other's dead jobs deleted, the rest kept.
    b.goto(&format!("{base}/jobs?queue=other&status=dead"))
        .await
        .unwrap();
    let shown = listed(&b).await;
    assert_eq!(shown.len(), 20, "{shown:?}");
    let picked = [shown[0], shown[5]];
    for id in picked {
        b.click(&format!("tr[data-job=\"{id}\"] input[name=id]"))
            .await
            .unwrap();
    }
    b.click("#selected button[value=delete]").await.unwrap();
    let asked = b.accept_confirm().await.unwrap();
    assert!(asked.contains("2 selected"), "{asked}");
    b.wait_for_text_contains("#actions", "done: 2 job(s) changed")
        .await
        .unwrap();
    assert_eq!(
        t.count(&format!(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE id IN ({}, {})",
            picked[0], picked[1]
        ))
        .await,
        0,
        "the selected jobs are deleted"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'other'").await,
        18
    );

    // A search across every queue: by payload text, in any case, and by error text.
    b.goto(&format!("{base}/jobs")).await.unwrap();
    b.fill("input[name=q]", "haystack-needle").await.unwrap();
    b.submit("form#search").await.unwrap();
    b.wait_for_text_contains("table#jobs", "elsewhere")
        .await
        .unwrap();
    assert_eq!(listed(&b).await.len(), 1);
    b.goto(&format!("{base}/jobs?q=REFUSED&status=dead&limit=25"))
        .await
        .unwrap();
    assert_eq!(listed(&b).await.len(), 18, "other's dead jobs, by error");

    // Pages both ways: older, then newer again is the first page.
    b.goto(&format!("{base}/jobs?limit=25")).await.unwrap();
    let first = listed(&b).await;
    assert!(!b.exists("#newer").await.unwrap(), "the first page");
    b.click("#older").await.unwrap();
    b.wait_for_text_contains("p.pages", "Newer").await.unwrap();
    let second = listed(&b).await;
    assert_eq!(second.len(), 25);
    assert!(second[0] < first[24], "older: {first:?} then {second:?}");
    b.click("#newer").await.unwrap();
    b.wait_for_text(".pages", |s| !s.contains("Newer"))
        .await
        .unwrap();
    assert_eq!(listed(&b).await, first, "back to the first page");

    stale_leases(&t, &b, &base).await;

    // Read-only: no bulk action offered, and one forged with the session's token refused.
    let (mut ro, ro_base, ro_login) = dashboard(&url, &["--read-only"]).await;
    b.goto(&ro_login).await.unwrap();
    b.goto(&format!("{ro_base}/queues/other?status=dead"))
        .await
        .unwrap();
    assert_eq!(listed(&b).await.len(), 18, "the list is shown");
    assert!(!b.exists("#all-matching").await.unwrap(), "no bulk action");
    assert!(!b.exists("input[name=id]").await.unwrap(), "no checkboxes");
    assert_eq!(
        post_from_page(&b, "action=delete&queue=other", true).await,
        403
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'other'").await,
        18,
        "nothing deleted"
    );
    b.close().await.expect("close the browser");
    for c in [&mut child, &mut ro] {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
}

/// POSTs `form` to `/jobs/bulk` from the page the browser shows (its origin), with the page's
/// CSRF token when `csrf`: the answer's status.
async fn post_from_page(b: &Browser, form: &str, csrf: bool) -> i64 {
    let script = format!(
        "const c = document.querySelector('input[name=csrf]'); \
         const body = '{form}' + ({csrf} && c ? '&csrf=' + c.value : ''); \
         return fetch('/jobs/bulk', {{method: 'POST', redirect: 'manual', \
           headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body}}) \
           .then(r => r.status);"
    );
    let answer = b
        .driver()
        .execute(script, Vec::new())
        .await
        .expect("run the POST");
    answer.json().as_i64().expect("a status")
}

/// An own table with a done row and a claimed row whose leases both ended an hour ago: only the
/// claimed one's is painted expired.
async fn stale_leases(t: &TestDb, b: &Browser, base: &str) {
    t.jobs(5).await;
    let mut args = vec!["claim", "--batch", "2", "--lease", "10m"];
    args.extend(support::TABLE);
    run_ok(&t.url, &args, "").await;
    let hour_ago = match t.backend {
        Backend::Postgres => "lease_until - interval '1 hour'",
        Backend::MySql => "lease_until - INTERVAL 1 HOUR",
        Backend::Sqlite => "lease_until - 3600000",
    };
    t.exec(&format!(
        "UPDATE jobs SET lease_until = {hour_ago} WHERE status = 'claimed'"
    ))
    .await;
    let claimed = t
        .count("SELECT MIN(id) FROM jobs WHERE status = 'claimed'")
        .await;
    let done = t
        .count("SELECT MAX(id) FROM jobs WHERE status = 'claimed'")
        .await;
    t.exec(&format!(
        "UPDATE jobs SET status = 'done', owner = NULL WHERE id = {done}"
    ))
    .await;
    // The table as recorded (qualified by its schema or database), from the overview.
    b.goto(&format!("{base}/")).await.unwrap();
    let table = b
        .find("tr[data-source]")
        .await
        .unwrap()
        .attr("data-source")
        .await
        .unwrap()
        .expect("the table's name");
    b.goto(&format!("{base}/sources/{table}")).await.unwrap();
    let lease_cell = |id: i64| format!("tr[data-row=\"{id}\"] td:nth-child(4)");
    let paint = |id: i64| async move {
        let cell = b.find(&lease_cell(id)).await.unwrap();
        cell.class_name().await.unwrap().unwrap_or_default()
    };
    assert!(
        paint(claimed).await.contains("problem"),
        "a claimed row's ended lease"
    );
    assert!(
        b.text(&lease_cell(claimed))
            .await
            .unwrap()
            .contains("expired"),
        "said expired"
    );
    assert!(
        !paint(done).await.contains("problem"),
        "a done row's old lease is no problem"
    );
    assert!(!b.text(&lease_cell(done)).await.unwrap().contains("expired"));
    b.goto(&format!("{base}/sources/{table}/rows/{done}"))
        .await
        .unwrap();
    let cell = b.find("#lease").await.unwrap();
    assert!(!cell
        .class_name()
        .await
        .unwrap()
        .unwrap_or_default()
        .contains("problem"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_lists_in_a_browser_postgres() {
    with_db(Backend::Postgres, lists).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_lists_in_a_browser_mysql() {
    with_db(Backend::MySql, lists).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_lists_in_a_browser_sqlite() {
    with_db(Backend::Sqlite, lists).await
}
