//! How a command connects: one connection for a one-shot command, TLS where the server has it
//! (`prefer`, the default) and verified where the URL asks, a plain connection where it has not.

use rowclaim_testkit as common;
mod support;

use std::process::Output;

use common::proxy::Proxy;
use common::servers::PrivatePostgres;
use common::tls::TestCa;
use common::{with_db, Backend, TestDb};

async fn run(url: &str, args: &[&str]) -> Output {
    support::rowclaim(url, args)
        .output()
        .await
        .expect("run rowclaim")
}

fn says(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{}", says(out));
}

/// Refused for want of a trustworthy server: exit 4 (cannot connect), naming the server.
fn refused(out: &Output, endpoint: &str) {
    assert_eq!(out.status.code(), Some(4), "{}", says(out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(endpoint), "names {endpoint}: {}", says(out));
}

/// A one-shot command opens one session: the pool keeps the one that checked the server is
/// there, instead of closing it and opening another (a second TCP, TLS and session start).
/// Sessions, not connections: on a loaded machine a slow first connection is joined by a knock
/// on the port (connect and close, nothing sent) to see whether anything listens.
async fn one_connection(t: std::sync::Arc<TestDb>) {
    let port: u16 = t
        .url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("port in the test URL");
    ok(&run(&t.url, &["init"]).await);
    let proxy = Proxy::start(port).await;
    let out = run(&proxy.url_for(&t.url), &["stats", "--json"]).await;
    ok(&out);
    assert_eq!(proxy.sessions(), 1, "sessions opened by `stats`");
    let out = run(&proxy.url_for(&t.url), &["enqueue", "--queue", "a", "{}"]).await;
    ok(&out);
    assert_eq!(proxy.sessions(), 2, "sessions opened by `enqueue` (one)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_postgres() {
    with_db(Backend::Postgres, one_connection).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_mysql() {
    with_db(Backend::MySql, one_connection).await
}

/// A server with TLS on and a certificate the test's own CA issued for `localhost`: the default
/// URL speaks TLS to it; `require` does without checking the certificate; `verify-ca` trusts
/// only a CA it is given; `verify-full` also checks the name the URL dialled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_where_the_server_has_it_verified_where_asked() {
    let ca = TestCa::new();
    let cert = ca.server_cert("localhost");
    let pg = PrivatePostgres::start_with(
        "ssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\nlog_connections = on",
        &[("server.pem", &cert.cert), ("server.key", &cert.key)],
    )
    .await;
    let url = pg.url("postgres");
    let root = format!("sslrootcert={}", ca.cert_path().display());
    let endpoint = format!("127.0.0.1:{}", pg.port());
    // The harness's own connections speak TLS too: the log line of rowclaim's is found by name.
    ok(&run(&format!("{url}?application_name=tls-check"), &["init"]).await);
    let log = pg.log_tail();
    let authorized = log
        .lines()
        .find(|l| l.contains("connection authorized") && l.contains("application_name=tls-check"))
        .unwrap_or_else(|| panic!("rowclaim's connection in the server log:\n{log}"));
    assert!(
        authorized.contains("SSL enabled"),
        "the default URL (sslmode=prefer) speaks TLS: {authorized}"
    );

    ok(&run(&format!("{url}?sslmode=require"), &["stats", "--json"]).await);
    let out = run(&format!("{url}?sslmode=verify-ca"), &["stats", "--json"]).await;
    refused(&out, &endpoint);
    ok(&run(
        &format!("{url}?sslmode=verify-ca&{root}"),
        &["stats", "--json"],
    )
    .await);
    // The certificate names localhost, not the 127.0.0.1 the URL dialled.
    let out = run(
        &format!("{url}?sslmode=verify-full&{root}"),
        &["stats", "--json"],
    )
    .await;
    refused(&out, &endpoint);
    let by_name = url.replace("127.0.0.1", "localhost");
    ok(&run(
        &format!("{by_name}?sslmode=verify-full&{root}"),
        &["stats", "--json"],
    )
    .await);
    // A CA of someone else's does not vouch for this server.
    let other = TestCa::new();
    let elsewhere = format!("sslrootcert={}", other.cert_path().display());
    let out = run(
        &format!("{by_name}?sslmode=verify-full&{elsewhere}"),
        &["stats", "--json"],
    )
    .await;
    refused(&out, &format!("localhost:{}", pg.port()));
}

/// A server without TLS: the default URL connects in plain text; `require` refuses to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tls_server_plain_by_default_refused_when_required() {
    let pg = PrivatePostgres::start().await;
    let url = pg.url("postgres");
    ok(&run(&url, &["init"]).await);
    ok(&run(&url, &["stats", "--json"]).await);
    let out = run(&format!("{url}?sslmode=require"), &["stats", "--json"]).await;
    refused(&out, &format!("127.0.0.1:{}", pg.port()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TLS"),
        "says TLS is what is missing: {}",
        says(&out)
    );
}

/// A port of 127.0.0.1 that nothing listens on: connections to it are refused.
fn refusing_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a spare port");
    listener.local_addr().expect("its address").port()
}

/// A one-shot command against a port nothing listens on says the connection was refused (a
/// knock on the port finds it while the pool quietly retries), not that no answer came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_named_as_refused() {
    let port = refusing_port();
    for url in [
        format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        format!("mysql://root@127.0.0.1:{port}/test"),
    ] {
        let out = run(&url, &["stats", "--json"]).await;
        refused(&out, &format!("127.0.0.1:{port}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Connection refused"), "{}", says(&out));
    }
}

/// A server that turns sessions away (every connection taken) is named with its own words
/// within a short `connect_timeout`, not reported as silent: the pool retries "too many
/// clients" quietly, and a session of rowclaim's own, at half the timeout, hears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_room_says_so() {
    use sqlx::Connection;
    let pg = PrivatePostgres::start_with(
        "max_connections = 3\nsuperuser_reserved_connections = 0",
        &[],
    )
    .await;
    let url = pg.url("postgres");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            sqlx::PgConnection::connect(&url)
                .await
                .expect("one of the server's three connections"),
        );
    }
    let out = run(&format!("{url}?connect_timeout=2"), &["stats", "--json"]).await;
    refused(&out, &format!("127.0.0.1:{}", pg.port()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("too many clients"), "{}", says(&out));
    drop(held);
}

/// `work` started while the database is down waits for it, as it waits out an outage, says so
/// once, and works once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_waits_for_a_database_that_is_down_at_start() {
    let pg = PrivatePostgres::start().await;
    let url = pg.url("postgres");
    ok(&run(&url, &["init"]).await);
    ok(&run(&url, &["enqueue", "--queue", "a", "{}"]).await);
    pg.stop(common::servers::StopMode::Fast).await;
    let worker = support::rowclaim(
        &url,
        &["work", "--queue", "a", "--until-empty", "--", "true"],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("start rowclaim work");
    // Several tries fail meanwhile (100 ms, 200 ms, 400 ms … apart).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    pg.start_again().await;
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        worker.wait_with_output(),
    )
    .await
    .expect("work ends once the database is back")
    .expect("wait for rowclaim work");
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("waiting for the database").count(),
        1,
        "says once that it waits: {}",
        says(&out)
    );
    assert!(err.contains("1 done"), "ran the job: {}", says(&out));
}

/// With --give-up-after, `work` waits that long for a database that is down at start, then
/// exits 4 saying it gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_gives_up_on_a_database_down_at_start() {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", refusing_port());
    let out = run(
        &url,
        &[
            "work",
            "--queue",
            "a",
            "--give-up-after",
            "1s",
            "--",
            "true",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(4), "{}", says(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("waiting for the database"), "{}", says(&out));
    assert!(err.contains("gave up"), "{}", says(&out));
}

/// A server that takes the connection and never answers is given `connect_timeout` from the
/// URL (libpq's parameter), not the default 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_timeout_in_the_url() {
    let proxy = Proxy::start(refusing_port()).await;
    proxy.blackhole(true);
    for url in [
        format!(
            "postgres://postgres@127.0.0.1:{}/db?connect_timeout=1",
            proxy.port()
        ),
        format!(
            "mysql://root@127.0.0.1:{}/db?connect_timeout=1",
            proxy.port()
        ),
    ] {
        let out = run(&url, &["stats", "--json"]).await;
        refused(&out, &format!("127.0.0.1:{}", proxy.port()));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no answer within 1s"), "{}", says(&out));
    }
}

/// A PostgreSQL URL at a MariaDB port: the message names the host and port, no password, and
/// says it is not a PostgreSQL server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_url_at_a_mysql_port() {
    // Under with_db, which drops the test database afterwards (it was left behind once).
    with_db(Backend::MySql, postgres_url_at_mysql).await
}

async fn postgres_url_at_mysql(t: std::sync::Arc<TestDb>) {
    let port = t
        .url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .expect("port in the test URL")
        .to_owned();
    for mode in ["", "?sslmode=disable"] {
        let url = format!("postgres://someone:sekret@127.0.0.1:{port}/db{mode}");
        let out = run(&url, &["stats", "--json"]).await;
        refused(&out, &format!("127.0.0.1:{port}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("not a PostgreSQL server"), "{}", says(&out));
        assert!(!err.contains("sekret"), "no password: {}", says(&out));
    }
}
