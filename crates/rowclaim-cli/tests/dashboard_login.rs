//! The dashboard's login as a process, over HTTP: an address that keeps sending wrong tokens
//! is answered 429 (with Retry-After) well before its 50th try, its right token too, while
//! another address still logs in; two dashboards on one host keep their own session cookies,
//! so logging in to one does not log a browser out of the other.

use rowclaim_testkit as common;
mod support;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use common::{with_db, Backend, TestDb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running dashboard: where it listens and its login token.
struct Dash {
    addr: SocketAddr,
    token: String,
    _child: tokio::process::Child,
}

async fn dashboard(url: &str) -> Dash {
    let d = support::dashboard::start(url, &[], None).await;
    let rest = d.login.strip_prefix("http://").expect(&d.login);
    let (addr, token) = rest.split_once("/login?token=").expect(&d.login);
    Dash {
        addr: addr.parse().expect("an address"),
        token: token.to_owned(),
        _child: d.child,
    }
}

/// An answer: its status and headers (names in lower case).
struct Answer {
    status: u16,
    headers: HashMap<String, String>,
}

/// `GET path` to `to`, from the local address `from`, with these cookies.
async fn get(to: SocketAddr, from: IpAddr, path: &str, cookies: &[String]) -> Answer {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .expect("bind the client");
    let mut conn = socket.connect(to).await.expect("connect");
    let cookie = if cookies.is_empty() {
        String::new()
    } else {
        format!("Cookie: {}\r\n", cookies.join("; "))
    };
    let req = format!("GET {path} HTTP/1.1\r\nHost: {to}\r\n{cookie}Connection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw);
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer { status, headers }
}

const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
/// Another address of this machine (all of 127.0.0.0/8 is loopback on Linux).
const ELSEWHERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

async fn wrong_logins_wait(t: Arc<TestDb>) {
    let d = dashboard(&t.url).await;
    let mut first_429 = None;
    for n in 1..=50 {
        let a = get(d.addr, HERE, "/login?token=not-the-token", &[]).await;
        match a.status {
            401 => assert!(first_429.is_none(), "try {n}: 401 after a 429"),
            429 => {
                let wait: u64 = a.headers["retry-after"]
                    .parse()
                    .expect("Retry-After seconds");
                assert!(wait >= 1, "try {n}: Retry-After {wait}");
                first_429.get_or_insert(n);
            }
            s => panic!("try {n}: {s}"),
        }
    }
    let first = first_429.expect("some wrong login answered 429");
    assert!(
        first < 50,
        "429 before the 50th wrong login: first at {first}"
    );
    // The right token from that address waits too: a guess cannot be confirmed meanwhile.
    let right = format!("/login?token={}", d.token);
    assert_eq!(get(d.addr, HERE, &right, &[]).await.status, 429);
    // Another address is not slowed: it logs in.
    let a = get(d.addr, ELSEWHERE, &right, &[]).await;
    assert_eq!(a.status, 303, "a right token from elsewhere logs in");
    assert!(a.headers.contains_key("set-cookie"));
}

/// Logs in to `d`: the cookie (`name=value`) its answer sets.
async fn log_in(d: &Dash) -> String {
    let a = get(d.addr, HERE, &format!("/login?token={}", d.token), &[]).await;
    assert_eq!(a.status, 303);
    let set = &a.headers["set-cookie"];
    set.split(';').next().unwrap_or_default().to_owned()
}

async fn two_dashboards_keep_their_sessions(t: Arc<TestDb>) {
    let (a, b) = (dashboard(&t.url).await, dashboard(&t.url).await);
    // A browser keeps one cookie per name for the host, whatever the port.
    let mut jar: HashMap<String, String> = HashMap::new();
    for d in [&a, &b] {
        let cookie = log_in(d).await;
        let (name, _) = cookie.split_once('=').expect("name=value");
        assert!(name.contains(&d.addr.port().to_string()), "{name}");
        jar.insert(name.to_owned(), cookie);
    }
    assert_eq!(jar.len(), 2, "one cookie each: {jar:?}");
    let cookies: Vec<String> = jar.into_values().collect();
    for d in [&a, &b] {
        let page = get(d.addr, HERE, "/", &cookies).await;
        assert_eq!(page.status, 200, "{}: still logged in", d.addr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_logins_from_one_address_are_answered_429() {
    with_db(Backend::Sqlite, wrong_logins_wait).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dashboards_on_one_host_keep_their_sessions() {
    with_db(Backend::Sqlite, two_dashboards_keep_their_sessions).await
}
