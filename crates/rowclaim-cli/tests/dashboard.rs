//! `rowclaim dashboard` as a process on real databases, spoken to over HTTP: nothing without
//! the token, the overview's counts, a job's page, a retry that reaches the database and the
//! actions log, POSTs refused without the CSRF token, from another origin and when read-only,
//! a row given back whose holder is then fenced out, the refused non-loopback --listen, and no
//! database password on any page.

use rowclaim_testkit as common;
mod support;

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use support::{rowclaim, TABLE};

/// A password put into the dashboard's database URL where the server lets one be used; no page
/// may show it.
const SECRET: &str = "Pa55wordNeverShown";

/// One HTTP answer.
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

/// A running dashboard: its address, its login and metrics tokens, the process.
struct Dash {
    host: String,
    token: String,
    metrics_token: String,
    /// The start lines it printed on stdout.
    start_lines: String,
    child: tokio::process::Child,
    /// Every page body seen, to look for secrets in at the end.
    seen: Vec<String>,
    cookie: Option<String>,
}

/// Where `line` (`<what> at http://HOST/PATH…`) says `what` is served, and what follows PATH.
fn served_at<'l>(line: &'l str, what: &str, path: &str) -> (&'l str, &'l str) {
    line.strip_prefix(&format!("{what} at http://"))
        .and_then(|rest| rest.split_once(path))
        .unwrap_or_else(|| panic!("the {what} start line: {line}"))
}

impl Dash {
    /// Starts `rowclaim dashboard --listen 127.0.0.1:0 EXTRA…` on `url` (at the default log
    /// level: what the operator does must be logged without `-v`) and reads its start lines.
    /// `tokens`: the login and metrics tokens given in files, which the lines must not show.
    async fn start(url: &str, extra: &[&str], tokens: Option<(&str, &str)>) -> Dash {
        let mut args = vec![
            "dashboard",
            "--listen",
            "127.0.0.1:0",
            "--sample-every",
            "1s",
        ];
        args.extend_from_slice(extra);
        let mut cmd = rowclaim(url, &args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start the dashboard");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(120), lines.next_line())
                .await
                .expect("the dashboard says where it is within 2 minutes")
                .expect("read its stdout")
                .expect("a line on stdout")
        };
        let (login, metrics) = (next().await, next().await);
        let (host, after) = served_at(&login, "dashboard", "/login");
        let (metrics_host, metrics_after) = served_at(&metrics, "metrics", "/metrics");
        assert_eq!(host, metrics_host);
        let (token, metrics_token) = match tokens {
            None => (
                after
                    .strip_prefix("?token=")
                    .unwrap_or_else(|| panic!("the token in {login}"))
                    .to_owned(),
                metrics_after
                    .strip_prefix(" (Authorization: Bearer ")
                    .and_then(|t| t.strip_suffix(')'))
                    .unwrap_or_else(|| panic!("the metrics token in {metrics}"))
                    .to_owned(),
            ),
            Some((login_token, metrics_token)) => {
                assert!(
                    !login.contains(login_token),
                    "a chosen token is never printed"
                );
                assert!(!metrics.contains(metrics_token), "nor the metrics one");
                (login_token.to_owned(), metrics_token.to_owned())
            }
        };
        Dash {
            host: host.to_owned(),
            token,
            metrics_token,
            start_lines: format!("{login}\n{metrics}"),
            child,
            seen: Vec::new(),
            cookie: None,
        }
    }

    /// Sends one request (with the session cookie once logged in) and reads the whole answer.
    async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut stream = tokio::net::TcpStream::connect(&self.host)
            .await
            .expect("connect");
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.host
        );
        if let Some(c) = &self.cookie {
            req.push_str(&format!("Cookie: {c}\r\n"));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if method == "POST" {
            req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        req.push_str(body);
        stream.write_all(req.as_bytes()).await.expect("send");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("read the answer");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, rest) = text.split_once("\r\n\r\n").expect("a head");
        let mut head_lines = head.lines();
        let status: u16 = head_lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .expect("a status");
        let headers: HashMap<String, String> = head_lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let body = if headers
            .get("transfer-encoding")
            .is_some_and(|t| t.contains("chunked"))
        {
            dechunk(rest)
        } else {
            rest.to_owned()
        };
        self.seen.push(format!("{head}\n\n{body}"));
        Answer {
            status,
            headers,
            body,
        }
    }

    async fn get(&mut self, path: &str) -> Answer {
        self.send("GET", path, &[], "").await
    }

    /// Logs in with the start token through the login form (a POST from the dashboard's own
    /// page): the session cookie is kept for later requests.
    async fn login(&mut self) {
        let body = format!("token={}", self.token);
        let a = self.post("/login", &body).await;
        self.keep_session(a);
    }

    /// Logs in through the printed address (`GET /login?token=…`).
    async fn login_by_link(&mut self) {
        let path = format!("/login?token={}", self.token);
        let a = self.get(&path).await;
        self.keep_session(a);
    }

    fn keep_session(&mut self, a: Answer) {
        assert_eq!(a.status, 303, "login redirects: {}", a.body);
        let set = a
            .headers
            .get("set-cookie")
            .expect("a session cookie")
            .clone();
        assert!(set.contains("HttpOnly"), "{set}");
        assert!(set.contains("SameSite=Strict"), "{set}");
        self.cookie = Some(set.split(';').next().unwrap_or_default().to_owned());
    }

    /// The session's CSRF token, from a page's form.
    async fn csrf(&mut self) -> String {
        let page = self.get("/").await.body;
        let at = page
            .find("name=\"csrf\" value=\"")
            .expect("a form with the CSRF token");
        page[at + 19..]
            .split('"')
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    /// A POST from this dashboard's own page: its Origin, the form `body`.
    async fn post(&mut self, path: &str, body: &str) -> Answer {
        let origin = format!("http://{}", self.host);
        self.send("POST", path, &[("Origin", &origin)], body).await
    }

    /// Stops the dashboard: its stderr, and every answer it gave.
    async fn stop(mut self) -> (String, Vec<String>) {
        let _ = self.child.start_kill();
        let out = self
            .child
            .wait_with_output()
            .await
            .expect("wait for the dashboard");
        (String::from_utf8_lossy(&out.stderr).into_owned(), self.seen)
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// The HTML of the table row that `marker` (e.g. `data-queue="mail"`) opens.
fn row_of<'p>(page: &'p str, marker: &str) -> &'p str {
    let at = page
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} on the page:\n{page}"));
    let row = &page[at..];
    &row[..row.find("</tr>").unwrap_or(row.len())]
}

/// The count a row shows for `status` (`data-status="ready">3<`).
fn count_in(row: &str, status: &str) -> String {
    let marker = format!("data-status=\"{status}\">");
    let at = row
        .find(&marker)
        .unwrap_or_else(|| panic!("{status} in {row}"));
    row[at + marker.len()..]
        .split('<')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The database URL the dashboard gets: with a password where the server can check one (a
/// PostgreSQL that trusts local users ignores it; on MariaDB/MySQL a user of its own), so that
/// the test can see it is never shown. SQLite URLs hold no password.
async fn url_with_password(t: &TestDb) -> (String, Option<String>) {
    match t.backend {
        Backend::Postgres => {
            let url = t.url.replacen(
                "postgres://postgres@",
                &format!("postgres://postgres:{SECRET}@"),
                1,
            );
            assert_ne!(url, t.url, "a password went into {}", t.url);
            (url, None)
        }
        Backend::MySql => {
            let user = format!("dash{}", &t.name[t.name.len() - 8..]);
            t.exec(&format!(
                "CREATE USER '{user}'@'%' IDENTIFIED BY '{SECRET}'"
            ))
            .await;
            t.exec(&format!("GRANT ALL ON {}.* TO '{user}'@'%'", t.name))
                .await;
            let (_, after) = t.url.split_once('@').expect("user@host in the URL");
            (format!("mysql://{user}:{SECRET}@{after}"), Some(user))
        }
        Backend::Sqlite => (t.url.clone(), None),
    }
}

async fn run_ok(url: &str, args: &[&str]) -> String {
    let out = rowclaim(url, args).output().await.expect("run rowclaim");
    assert!(
        out.status.success(),
        "rowclaim {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The job ids of `rowclaim enqueue` output lines.
fn enqueued_id(out: &str) -> i64 {
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("enqueue's JSON");
    v["id"].as_i64().expect("an id")
}

/// A queue "mail" with 3 ready jobs, 1 running (held by `rowclaim claim`) and 1 dead (its
/// command failed on its only attempt), and the harness table claimed 2 of 5 rows by
/// `rowclaim claim`: returns the dead job, and the claim's token and one of its rows.
async fn fill(t: &TestDb) -> (i64, String, String) {
    let url = &t.url;
    run_ok(url, &["init"]).await;
    let dead = enqueued_id(
        &run_ok(
            url,
            &[
                "enqueue",
                "--queue",
                "mail",
                "--kind",
                "boom",
                "--max-attempts",
                "1",
                r#"{"marker":"dash-payload-7"}"#,
            ],
        )
        .await,
    );
    let out = rowclaim(
        url,
        &[
            "work",
            "--queue",
            "mail",
            "--until-empty",
            "--",
            "sh",
            "-c",
            "cat >/dev/null; echo kaput-42 >&2; exit 3",
        ],
    )
    .output()
    .await
    .expect("run the failing worker");
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run_ok(url, &["enqueue", "--queue", "mail", "--kind", "slow", "{}"]).await;
    run_ok(
        url,
        &["claim", "--queue", "mail", "--batch", "1", "--lease", "1h"],
    )
    .await;
    for i in 0..3 {
        run_ok(
            url,
            &[
                "enqueue",
                "--queue",
                "mail",
                "--kind",
                "plain",
                &format!("{{\"n\":{i}}}"),
            ],
        )
        .await;
    }
    t.jobs(5).await;
    // A schedule of queue mail, registered only (a ready shutdown): shown with its next tick.
    let db = t.db().await;
    rowclaim::Scheduler::new(&db)
        .schedule(
            rowclaim::Schedule::cron("nightly-report", "0 3 * * *")
                .zone("Europe/Paris")
                .job(rowclaim::NewJob::new(serde_json::json!({})).queue("mail")),
        )
        .run(std::future::ready(()))
        .await
        .expect("register a schedule");
    let claim = [
        &["claim", "--batch", "2", "--lease", "1h"],
        TABLE.as_slice(),
    ]
    .concat();
    let out = run_ok(url, &claim).await;
    let first: serde_json::Value =
        serde_json::from_str(out.lines().next().expect("a claimed row")).expect("claim's JSON");
    let token = first["token"].as_str().expect("a token").to_owned();
    let row = first["id"].to_string();
    (dead, token, row)
}

async fn dashboard(t: Arc<TestDb>) {
    let (dead, token, row) = fill(&t).await;
    let (url, mysql_user) = url_with_password(&t).await;
    let mut d = Dash::start(&url, &[], None).await;

    // Without the token: the login page at most, and no data.
    for path in ["/", "/queues/mail", &format!("/jobs/{dead}"), "/actions"] {
        let a = d.get(path).await;
        assert_eq!(a.status, 401, "{path} without a session");
        assert!(
            !a.body.contains("dash-payload-7") && !a.body.contains("data-queue"),
            "{path}: {}",
            a.body
        );
    }
    let wrong = d.get("/login?token=0123456789abcdef").await;
    assert_eq!(wrong.status, 401);
    assert!(!wrong.headers.contains_key("set-cookie"));
    let csrf_less = d
        .send("POST", &format!("/jobs/{dead}/retry"), &[], "csrf=x")
        .await;
    assert_eq!(csrf_less.status, 401, "a POST without a session");

    // /metrics: for the metrics token as a bearer token (a scraper), not for anyone, and not
    // for the login token (a scrape config must hold no credential that can act).
    let anon = d.get("/metrics").await;
    assert_eq!(anon.status, 401, "{}", anon.body);
    assert!(!anon.body.contains("rowclaim_queue_jobs"), "{}", anon.body);
    for wrong in ["0123456789abcdef".to_owned(), d.token.clone()] {
        let bearer = format!("Bearer {wrong}");
        let a = d
            .send("GET", "/metrics", &[("Authorization", &bearer)], "")
            .await;
        assert_eq!(a.status, 401, "{}", a.body);
    }
    // Nor does the metrics token open a session.
    let path = format!("/login?token={}", d.metrics_token);
    let a = d.get(&path).await;
    assert_eq!(a.status, 401, "the metrics token is no login");
    assert!(!a.headers.contains_key("set-cookie"));
    let bearer = format!("Bearer {}", d.metrics_token);
    let scraped = d
        .send("GET", "/metrics", &[("Authorization", &bearer)], "")
        .await;
    assert_eq!(scraped.status, 200, "{}", scraped.body);
    for series in [
        "rowclaim_queue_jobs{queue=\"mail\",status=\"ready\"} 3",
        "rowclaim_queue_jobs{queue=\"mail\",status=\"running\"} 1",
        "rowclaim_queue_jobs{queue=\"mail\",status=\"dead\"} 1",
        "rowclaim_queue_due_jobs{queue=\"mail\"} 3",
        "rowclaim_database_up 1",
    ] {
        assert!(
            scraped.body.contains(series),
            "{series} in\n{}",
            scraped.body
        );
    }
    assert!(
        scraped.body.contains(".jobs\",status=\"claimed\"} 2"),
        "the own table's rows by status:\n{}",
        scraped.body
    );

    // A login form posted from another site is refused (no session for it).
    let body = format!("token={}", d.token);
    let a = d
        .send(
            "POST",
            "/login",
            &[("Origin", "http://evil.example")],
            &body,
        )
        .await;
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(!a.headers.contains_key("set-cookie"));
    d.login_by_link().await;
    let overview = d.get("/").await;
    assert_eq!(overview.status, 200);
    let mail = row_of(&overview.body, "data-queue=\"mail\"");
    assert_eq!(count_in(mail, "ready"), "3", "{mail}");
    assert_eq!(count_in(mail, "running"), "1", "{mail}");
    assert_eq!(count_in(mail, "dead"), "1", "{mail}");
    // The own table, by its catalog name (public.jobs, <database>.jobs, main.jobs).
    let jobs = row_of(&overview.body, "data-source=\"");
    assert!(jobs.contains(".jobs\""), "{jobs}");
    assert_eq!(count_in(jobs, "claimed"), "claimed: 2", "{jobs}");
    assert_eq!(count_in(jobs, "ready"), "ready: 3", "{jobs}");
    let table = jobs["data-source=\"".len()..]
        .split('"')
        .next()
        .unwrap_or_default()
        .to_owned();

    let nightly = row_of(&overview.body, "data-schedule=\"nightly-report\"");
    for shown in ["0 3 * * *", "Europe/Paris", "/queues/mail", "never"] {
        assert!(nightly.contains(shown), "{shown} in {nightly}");
    }
    assert!(!nightly.contains("overdue"), "{nightly}");

    let queue = d.get("/queues/mail").await;
    assert_eq!(queue.status, 200);
    assert!(
        queue.body.contains("data-schedule=\"nightly-report\""),
        "the queue's schedules on its page"
    );
    assert!(queue.body.contains("id=\"running\""), "running jobs listed");
    let job = d.get(&format!("/jobs/{dead}")).await;
    assert_eq!(job.status, 200);
    assert!(
        job.body.contains("dash-payload-7"),
        "payload on the job page"
    );
    assert!(job.body.contains("kaput-42"), "last error on the job page");
    // Its failed attempt too, in the table of attempts (not only as the last error).
    let attempts = job
        .body
        .split("id=\"attempts\"")
        .nth(1)
        .expect("the failed attempts on the job page");
    assert!(attempts.contains("kaput-42"), "{attempts}");
    let source = d.get(&format!("/sources/{table}")).await;
    assert_eq!(source.status, 200);
    assert!(
        source.body.contains(&token),
        "the holder's token on the table's page"
    );
    let row_page = d.get(&format!("/sources/{table}/rows/{row}")).await;
    assert_eq!(row_page.status, 200);
    assert!(
        row_page.body.contains("/release"),
        "a held row can be released"
    );

    // Refused POSTs change nothing.
    let is_dead =
        format!("SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {dead} AND status = 'dead'");
    let csrf = d.csrf().await;
    let retry = format!("/jobs/{dead}/retry");
    let a = d.post(&retry, "").await;
    assert_eq!(a.status, 403, "no CSRF token");
    let a = d.post(&retry, "csrf=0000").await;
    assert_eq!(a.status, 403, "a wrong CSRF token");
    let a = d
        .send(
            "POST",
            &retry,
            &[("Origin", "http://evil.example")],
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(a.status, 403, "another origin");
    let a = d
        .send(
            "POST",
            &retry,
            &[("Referer", "http://evil.example/x")],
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(a.status, 403, "another referer");
    let a = d.send("POST", &retry, &[], &format!("csrf={csrf}")).await;
    assert_eq!(a.status, 403, "neither Origin nor Referer");
    assert_eq!(t.count(&is_dead).await, 1, "still dead after refused POSTs");
    // Every answer forbids framing and sniffing.
    assert_eq!(
        overview.headers.get("x-frame-options").map(String::as_str),
        Some("DENY")
    );
    assert_eq!(
        overview
            .headers
            .get("x-content-type-options")
            .map(String::as_str),
        Some("nosniff")
    );
    // A job scheduled past the year 9999 (PostgreSQL and SQLite keep such times) still shows.
    if t.backend != Backend::MySql {
        let far = match t.backend {
            Backend::Sqlite => "UPDATE rowclaim_jobs SET run_at = 253402300800000 + 86400000",
            _ => "UPDATE rowclaim_jobs SET run_at = '10000-01-02T00:00:00Z'",
        };
        t.exec(&format!("{far} WHERE id = {dead}")).await;
        let page = d.get(&format!("/jobs/{dead}")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        assert!(page.body.contains("after the year 9999"), "{}", page.body);
        let page = d.get("/queues/mail").await;
        assert_eq!(page.status, 200);
    }

    // The retry itself: the job is ready again, and the action is listed.
    let a = d.post(&retry, &format!("csrf={csrf}")).await;
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(
        t.count(&format!("SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {dead} AND status = 'ready' AND attempts = 0"))
            .await,
        1,
        "the dead job is ready again"
    );
    let actions = d.get("/actions").await.body;
    assert!(
        actions.contains("retry job") && actions.contains(&format!("job {dead}")),
        "{actions}"
    );
    let history = d.get(&format!("/jobs/{dead}")).await.body;
    assert!(
        history.contains("retry job from the dashboard by session"),
        "the retry in the job's timeline: {history}"
    );

    // Pause and resume a queue from its page: the database says so, and so do the pages.
    let paused =
        "SELECT COUNT(*) FROM rowclaim_queues WHERE name = 'mail' AND paused_at IS NOT NULL";
    let a = d.post("/queues/mail/pause", &format!("csrf={csrf}")).await;
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(t.count(paused).await, 1, "mail is paused");
    let overview = d.get("/").await.body;
    assert!(
        row_of(&overview, "data-queue=\"mail\"").contains("paused"),
        "the overview says so: {overview}"
    );
    let page = d.get("/queues/mail").await.body;
    assert!(
        page.contains("/queues/mail/resume"),
        "a resume button: {page}"
    );
    let a = d.post("/queues/mail/resume", &format!("csrf={csrf}")).await;
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(t.count(paused).await, 0, "mail runs again");
    let actions = d.get("/actions").await.body;
    assert!(
        actions.contains("pause queue") && actions.contains("resume queue"),
        "{actions}"
    );

    // What a job's command printed is its output, shown on its page.
    run_ok(&t.url, &["enqueue", "--queue", "sums", "{}"]).await;
    let out = rowclaim(
        &t.url,
        &[
            "work",
            "--queue",
            "sums",
            "--until-empty",
            "--",
            "sh",
            "-c",
            "echo '{\"sum\": 42}'",
        ],
    )
    .output()
    .await
    .expect("run the worker");
    assert!(out.status.success(), "{out:?}");
    let sum = t
        .count("SELECT MAX(id) FROM rowclaim_jobs WHERE queue = 'sums'")
        .await;
    let page = d.get(&format!("/jobs/{sum}")).await.body;
    assert!(
        page.contains("id=\"output\"") && page.contains("&quot;sum&quot;: 42"),
        "the output on the job's page: {page}"
    );

    // A job that waits: its page lists what it waits for, and that job's page what waits for it.
    let first = enqueued_id(&run_ok(&t.url, &["enqueue", "--queue", "later", "{}"]).await);
    let after = first.to_string();
    let waits = enqueued_id(
        &run_ok(
            &t.url,
            &["enqueue", "--queue", "later", "--after", &after, "{}"],
        )
        .await,
    );
    let page = d.get(&format!("/jobs/{waits}")).await.body;
    assert!(
        page.contains("id=\"waits-for\"")
            && page.contains(&format!("href=\"/jobs/{first}\""))
            && page.contains(">waiting<"),
        "what it waits for on the job's page: {page}"
    );
    let page = d.get(&format!("/jobs/{first}")).await.body;
    assert!(
        page.contains("id=\"waited-by\"") && page.contains(&format!("href=\"/jobs/{waits}\"")),
        "what waits for it on the job's page: {page}"
    );
    assert!(
        !page.contains("id=\"run-anyway\""),
        "a job that waits for nothing says nothing of running anyway: {page}"
    );
    let page = d.get(&format!("/jobs/{waits}")).await.body;
    assert!(
        !page.contains("id=\"run-anyway\""),
        "a job that does not run anyway: {page}"
    );
    let anyway = enqueued_id(
        &run_ok(
            &t.url,
            &[
                "enqueue",
                "--queue",
                "later",
                "--after",
                &after,
                "--run-anyway",
                "{}",
            ],
        )
        .await,
    );
    let page = d.get(&format!("/jobs/{anyway}")).await.body;
    assert!(
        page.contains("id=\"waits-for\"") && page.contains("id=\"run-anyway\""),
        "a job that runs anyway says so beside what it waits for: {page}"
    );

    // A release for a holder that no longer holds the row (the page was old) gives nothing back.
    let release = format!("/sources/{table}/rows/{row}/release");
    let stale = "01999999-0000-7000-8000-000000000000";
    let a = d
        .post(&release, &format!("csrf={csrf}&holder={stale}"))
        .await;
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(
        t.count(&format!(
            "SELECT COUNT(*) FROM jobs WHERE id = {row} AND owner = '{token}'"
        ))
        .await,
        1,
        "still its holder's"
    );
    assert!(
        d.get("/actions")
            .await
            .body
            .contains("not held by that claim"),
        "the refusal is listed"
    );
    // The row's page posts the holder it shows: given back, ready, and its holder's result is
    // refused (fencing).
    let page = d.get(&format!("/sources/{table}/rows/{row}")).await.body;
    assert!(
        page.contains(&format!("name=\"holder\" value=\"{token}\"")),
        "the form names the holder: {page}"
    );
    let a = d
        .post(&release, &format!("csrf={csrf}&holder={token}"))
        .await;
    assert_eq!(a.status, 303, "{}", a.body);
    assert_eq!(
        t.count(&format!(
            "SELECT COUNT(*) FROM jobs WHERE id = {row} AND status = 'ready' AND owner IS NULL"
        ))
        .await,
        1,
        "the row is ready again"
    );
    let complete = [
        &["complete", "--token", &token, "--id", &row],
        TABLE.as_slice(),
    ]
    .concat();
    let out = rowclaim(&t.url, &complete)
        .output()
        .await
        .expect("run complete");
    assert_eq!(
        out.status.code(),
        Some(3),
        "the old holder lost the row: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let secrets = [d.token.clone(), d.metrics_token.clone()];
    let start_lines = d.start_lines.clone();
    let (stderr, mut pages) = d.stop().await;
    pages.push(start_lines);
    // At the default log level: the audit trail needs no -v.
    assert!(
        stderr.contains("dashboard action") && stderr.contains("logged in"),
        "actions and logins are logged: {stderr}"
    );

    // Read-only, with a token of the operator's: nothing offered, every POST refused.
    let dir = tempfile::tempdir().expect("temp dir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "operator-chosen-token-1234\n").expect("write the token");
    let token_path = token_file.display().to_string();
    let metrics_file = dir.path().join("metrics-token");
    std::fs::write(&metrics_file, "operator-metrics-token-5678\n").expect("write the token");
    let metrics_path = metrics_file.display().to_string();
    let mut ro = Dash::start(
        &url,
        &[
            "--read-only",
            "--token-file",
            &token_path,
            "--metrics-token-file",
            &metrics_path,
        ],
        Some(("operator-chosen-token-1234", "operator-metrics-token-5678")),
    )
    .await;
    assert_eq!(ro.token, "operator-chosen-token-1234");
    let bearer = "Bearer operator-metrics-token-5678";
    let a = ro
        .send("GET", "/metrics", &[("Authorization", bearer)], "")
        .await;
    assert_eq!(a.status, 200, "the metrics token from its file: {}", a.body);
    ro.login().await;
    let ready_job = t
        .count("SELECT MAX(id) FROM rowclaim_jobs WHERE status = 'ready'")
        .await;
    let page = ro.get(&format!("/jobs/{ready_job}")).await;
    assert_eq!(page.status, 200);
    assert!(
        !page.body.contains("/cancel\""),
        "no actions in read-only mode"
    );
    let csrf = ro.csrf().await;
    let a = ro
        .post(
            &format!("/jobs/{ready_job}/cancel"),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(a.status, 403, "read-only refuses POSTs");
    let a = ro.post("/queues/mail/pause", &format!("csrf={csrf}")).await;
    assert_eq!(a.status, 403, "and pausing");
    assert!(
        !ro.get("/queues/mail")
            .await
            .body
            .contains("/queues/mail/pause"),
        "no pause button when read-only"
    );
    let a = ro.post("/logout", &format!("csrf={csrf}")).await;
    assert_eq!(
        a.status, 303,
        "logging out changes no data: allowed when read-only"
    );
    assert_eq!(ro.get("/").await.status, 401, "the session is over");
    assert_eq!(
        t.count(&format!(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE id = {ready_job} AND status = 'ready'"
        ))
        .await,
        1,
        "nothing changed"
    );
    let (ro_stderr, ro_pages) = ro.stop().await;
    pages.extend(ro_pages);

    for page in &pages {
        assert!(
            !page.contains(SECRET),
            "the database password on a page:\n{page}"
        );
    }
    for log in [&stderr, &ro_stderr] {
        assert!(
            !log.contains(SECRET),
            "the database password in the log:\n{log}"
        );
        for token in secrets
            .iter()
            .map(String::as_str)
            .chain(["operator-chosen-token-1234", "operator-metrics-token-5678"])
        {
            assert!(!log.contains(token), "a token in the log:\n{log}");
        }
    }
    if let Some(user) = mysql_user {
        t.exec(&format!("DROP USER '{user}'@'%'")).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_postgres() {
    with_db(Backend::Postgres, dashboard).await
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_mysql() {
    with_db(Backend::MySql, dashboard).await
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_sqlite() {
    with_db(Backend::Sqlite, dashboard).await
}

/// A non-loopback address is refused before anything else, naming the flag, unless the
/// operator says TLS is terminated in front.
#[tokio::test]
async fn non_loopback_listen_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("x.db").display());
    let out = rowclaim(&url, &["dashboard", "--listen", "0.0.0.0:0"])
        .output()
        .await
        .expect("run the dashboard");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--listen") && err.contains("--behind-tls-proxy"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no start line");
}
