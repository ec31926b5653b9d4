//! The browser harness proves itself on a page of its own before the dashboard's tests rely on
//! it: a counter changed by a POSTed form, a reset behind a `confirm()`, text that changes later
//! in the page's own script, a screenshot, and two browsers at once.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use rowclaim_testkit::browser::{Browser, WINDOW};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A tiny web app on a spare port of 127.0.0.1: `GET /` shows the counter, `POST /add` adds the
/// form's `n` to it, `POST /reset` sets it to 0; both answer with a redirect to `/`.
struct App {
    url: String,
    counter: Arc<AtomicI64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn app() -> App {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let counter = Arc::new(AtomicI64::new(0));
    let shared = counter.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve(conn, shared.clone()));
        }
    });
    App { url, counter, task }
}

const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>counter</title></head>
<body style="font-family: sans-serif">
  <h1>Counter: <span id="count">{count}</span></h1>
  <form id="add" method="post" action="/add">
    <input id="n" name="n" value="1" required pattern="-?[0-9]+">
    <button id="add-button" type="submit">Add</button>
  </form>
  <form id="reset" method="post" action="/reset"
        onsubmit="return confirm('Reset the counter to 0?')">
    <button id="reset-button" type="submit">Reset</button>
  </form>
  <p><button id="later" type="button"
       onclick="setTimeout(() => { document.getElementById('status').textContent = 'done'; }, 700)"
     >Later</button> <span id="status">idle</span></p>
</body></html>
"#;

/// One request per connection, `Connection: close`: all a browser needs.
async fn serve(mut conn: TcpStream, counter: Arc<AtomicI64>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut request_line = head.lines().next().unwrap_or("").split(' ');
    let method = request_line.next().unwrap_or("").to_owned();
    let path = request_line.next().unwrap_or("").to_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();

    let redirect =
        "HTTP/1.1 303 See Other\r\nLocation: /\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            .to_owned();
    let response = match (method.as_str(), path.as_str()) {
        ("GET", "/") => {
            let page = PAGE.replace("{count}", &counter.load(Ordering::SeqCst).to_string());
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            )
        }
        ("POST", "/add") => {
            let n: i64 = body
                .split('&')
                .find_map(|kv| kv.strip_prefix("n="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            counter.fetch_add(n, Ordering::SeqCst);
            redirect
        }
        ("POST", "/reset") => {
            counter.store(0, Ordering::SeqCst);
            redirect
        }
        _ => "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
    };
    let _ = conn.write_all(response.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// Width and height from a PNG's IHDR chunk (bytes 16..24), after checking the signature.
fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" || &png[12..16] != b"IHDR" {
        return None;
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((be(&png[16..20]), be(&png[20..24])))
}

/// The whole tour on one browser: read, fill and post, confirm (cancel, then accept), text
/// changed later by the page's script, page source, screenshot.
async fn drive(browser: &Browser, app: &App, add: i64) {
    browser.goto(&app.url).await.unwrap();
    assert_eq!(browser.text("#count").await.unwrap(), "0");

    // Fill and click: the POST is answered with a redirect, so wait for the new page's text.
    browser.fill("#n", &add.to_string()).await.unwrap();
    assert_eq!(browser.value("#n").await.unwrap(), add.to_string());
    browser.click("#add-button").await.unwrap();
    browser
        .wait_for_text("#count", |t| t == add.to_string())
        .await
        .unwrap();
    assert_eq!(app.counter.load(Ordering::SeqCst), add);

    // Submitting the form (as Enter would) instead of clicking its button.
    browser.fill("#n", "2").await.unwrap();
    browser.submit("#n").await.unwrap();
    let expected = (add + 2).to_string();
    browser
        .wait_for_text("#count", |t| t == expected)
        .await
        .unwrap();

    // Cancel in the confirm: nothing is posted, so the counter cannot have changed.
    browser.click("#reset-button").await.unwrap();
    let asked = browser.dismiss_confirm().await.unwrap();
    assert_eq!(asked, "Reset the counter to 0?");
    assert_eq!(browser.text("#count").await.unwrap(), expected);
    assert_eq!(app.counter.load(Ordering::SeqCst), add + 2);

    // OK in the confirm: the reset is posted.
    browser.click("#reset-button").await.unwrap();
    assert_eq!(
        browser.accept_confirm().await.unwrap(),
        "Reset the counter to 0?"
    );
    browser.wait_for_text("#count", |t| t == "0").await.unwrap();
    assert_eq!(app.counter.load(Ordering::SeqCst), 0);

    // Text the page's own script changes later: polled until it does.
    browser.click("#later").await.unwrap();
    browser
        .wait_for_text_contains("#status", "done")
        .await
        .unwrap();
    assert!(browser
        .page_source()
        .await
        .unwrap()
        .contains(r#"<span id="status">done</span>"#));
    assert!(browser.exists("#add").await.unwrap());
    assert!(!browser.exists("#no-such-thing").await.unwrap());
}

#[tokio::test]
async fn drives_a_page_with_forms_confirms_and_script() {
    let app = app().await;
    let browser = Browser::start().await.unwrap();
    drive(&browser, &app, 5).await;

    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("browser-selftest")
        .join(format!("counter-{}.png", std::process::id()));
    let _ = std::fs::remove_file(&path);
    browser.screenshot_to(&path).await.unwrap();
    let png = std::fs::read(&path).unwrap();
    let (width, height) = png_size(&png).unwrap_or_else(|| panic!("not a PNG: {}", path.display()));
    assert_eq!(width, WINDOW.0, "screenshot width");
    assert!(
        height > 0 && height <= WINDOW.1,
        "screenshot height {height}"
    );
    assert!(
        png.len() > 1000,
        "a {}-byte PNG is too small to show the page",
        png.len()
    );
    std::fs::remove_file(&path).unwrap();

    browser.close().await.unwrap();
}

/// Two browsers in one test at once, each with its own page state: they share nothing (their
/// own chromedriver, port, profile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_browsers_at_once() {
    let (a, b) = tokio::join!(app(), app());
    let (ba, bb) = tokio::join!(Browser::start(), Browser::start());
    let (ba, bb) = (ba.unwrap(), bb.unwrap());
    assert_ne!(ba.chromedriver_port(), bb.chromedriver_port());
    tokio::join!(drive(&ba, &a, 3), drive(&bb, &b, 4));
    // One is closed, the other just dropped: both clean up.
    ba.close().await.unwrap();
    drop(bb);
}

/// A lookup that cannot succeed fails with the selector in the message, after the timeout; an
/// unanswered dialog fails the next command.
#[tokio::test]
async fn failures_are_clear() {
    let app = app().await;
    let mut browser = Browser::start().await.unwrap();
    browser.set_timeout(std::time::Duration::from_secs(1));
    browser.goto(&app.url).await.unwrap();
    let err = browser
        .click("#no-such-button")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("#no-such-button"), "{err}");
    let err = browser
        .wait_for_text_contains("#count", "never")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"0\"") && err.contains("never"), "{err}");

    // A confirm nobody answered fails the next command and is still there to answer.
    browser.click("#reset-button").await.unwrap();
    let err = browser.text("#count").await.unwrap_err().to_string();
    assert!(err.to_lowercase().contains("alert"), "{err}");
    browser.dismiss_confirm().await.unwrap();
    assert_eq!(browser.text("#count").await.unwrap(), "0");
}
