//! `rowclaim dashboard` started for a test, and a page watched in a browser until it shows what
//! a test waits for.

use std::process::Stdio;
use std::time::Duration;

use rowclaim_testkit::browser::Browser;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A dashboard process, the address it serves and the login address it printed.
pub struct Dashboard {
    pub child: tokio::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The address that logs in (with the token).
    pub login: String,
}

/// Starts `rowclaim dashboard --listen 127.0.0.1:0 EXTRA…` on `url`. `token`: the one in its
/// `--token-file`, whose start line then names none.
pub async fn start(url: &str, extra: &[&str], token: Option<&str>) -> Dashboard {
    let mut args = vec!["dashboard", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut child = super::rowclaim(url, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the dashboard");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("the dashboard says where it is within 2 minutes")
        .expect("read its stdout")
        .expect("a start line");
    let at = line
        .strip_prefix("dashboard at ")
        .unwrap_or_else(|| panic!("the start line: {line}"));
    let base = at.split("/login").next().unwrap_or_default().to_owned();
    let login = match (at.contains("?token="), token) {
        (true, _) => at.to_owned(),
        (false, Some(token)) => format!("{base}/login?token={token}"),
        (false, None) => panic!("no token in {line}"),
    };
    Dashboard { child, base, login }
}

/// Loads `url` again and again (the page's own refresh is every 10 s; reloading is quicker)
/// until the text of `css` passes `ok`, for at most 3 minutes: the suite runs on a loaded
/// machine, so only the end state is asserted, never how soon it came.
pub async fn reload_until(b: &Browser, url: &str, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..180 {
        b.goto(url).await.expect("load the page");
        if let Ok(text) = b.text(css).await {
            if ok(text.trim()) {
                return text.trim().to_owned();
            }
            last = text;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("{css} on {url} never passed; last seen {last:?}");
}
