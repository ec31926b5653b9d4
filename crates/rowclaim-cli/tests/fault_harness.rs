//! Smoke tests of the fault-test harness itself (`common::servers`, `common::proxy`): private
//! servers start, restart and kill sessions as promised, and the proxy's faults do what they
//! say — on PostgreSQL and MariaDB.

use rowclaim_testkit as common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::servers::{PrivateMariadb, PrivatePostgres, StopMode};
use sqlx::{AssertSqlSafe, Connection};

/// Long enough for anything on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits (up to 60 s) until `cond` holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "still not so after 60 s: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn patiently<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f)
        .await
        .unwrap_or_else(|_| panic!("no result within 60 s: {what}"))
}

/// The same smoke tests for each backend: `$server` is the private server type, `$conn` the
/// sqlx connection type. The SQL used is valid on both.
macro_rules! harness_tests {
    ($module:ident, $server:ty, $conn:ty) => {
        mod $module {
            use super::*;

            type Conn = $conn;

            async fn connect(url: &str) -> Conn {
                patiently("connect", Conn::connect(url))
                    .await
                    .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
            }

            async fn exec(c: &mut Conn, sql: &str) {
                sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                    .execute(&mut *c)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }

            async fn try_count(c: &mut Conn) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM t")
                    .fetch_one(&mut *c)
                    .await
            }

            async fn count(c: &mut Conn) -> i64 {
                try_count(c)
                    .await
                    .unwrap_or_else(|e| panic!("count rows: {e}"))
            }

            async fn start() -> $server {
                let t = Instant::now();
                let server = <$server>::start().await;
                eprintln!(
                    "{}: private server on port {} started in {} ms",
                    stringify!($module),
                    server.port(),
                    t.elapsed().as_millis()
                );
                server
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn proxy_faults() {
                let server = start().await;
                let url = server.create_database("harness").await;
                let mut direct = connect(&url).await;
                exec(&mut direct, "CREATE TABLE t (id INT PRIMARY KEY)").await;
                let proxy = Proxy::start(server.port()).await;
                let via = proxy.url_for(&url);
                assert_eq!(
                    proxy.url_for("mysql://u:p@127.0.0.1:3306/db?x=1"),
                    format!("mysql://u:p@127.0.0.1:{}/db?x=1", proxy.port())
                );
                assert_eq!(
                    via,
                    url.replace(&server.port().to_string(), &proxy.port().to_string())
                );

                // A query through the proxy.
                let mut c = connect(&via).await;
                assert_eq!(count(&mut c).await, 0);
                assert_eq!(proxy.connections(), 1);

                // cut_all: the connection in use fails, a new one works.
                proxy.cut_all();
                let r = patiently("query after cut_all", try_count(&mut c)).await;
                assert!(r.is_err(), "a query on a cut connection succeeded");
                eventually("cut connection closed", || proxy.connections() == 0).await;
                drop(c);
                let mut c = connect(&via).await;
                assert_eq!(count(&mut c).await, 0);

                // blackhole: a query and a new connection hang, and finish once it heals.
                proxy.blackhole(true);
                let query = tokio::spawn(async move {
                    let r = try_count(&mut c).await;
                    (c, r)
                });
                let via2 = via.clone();
                let connecting = tokio::spawn(async move { Conn::connect(&via2).await });
                tokio::time::sleep(Duration::from_secs(1)).await;
                assert!(
                    !query.is_finished(),
                    "a query returned through a black hole"
                );
                assert!(
                    !connecting.is_finished(),
                    "a connection was made through a black hole"
                );
                proxy.blackhole(false);
                let (mut c, r) = patiently("query after the black hole", query)
                    .await
                    .expect("query task");
                assert_eq!(r.expect("query after the black hole healed"), 0);
                let mut c2 = patiently("connect after the black hole", connecting)
                    .await
                    .expect("connect task")
                    .expect("connect after the black hole healed");
                assert_eq!(count(&mut c2).await, 0);
                assert_eq!(count(&mut c).await, 0);

                // cut_after(COMMIT): the client sees an error, the row is committed anyway.
                proxy.cut_after(b"COMMIT");
                assert!(!proxy.fired());
                let mut tx = c.begin().await.expect("BEGIN through the proxy");
                exec(&mut tx, "INSERT INTO t (id) VALUES (1)").await;
                let r = patiently("COMMIT through the proxy", tx.commit()).await;
                assert!(r.is_err(), "the client saw its COMMIT answered");
                assert!(proxy.fired(), "cut_after did not fire");
                assert_eq!(
                    count(&mut direct).await,
                    1,
                    "the cut COMMIT was not committed"
                );
                // Disarmed: the next COMMIT goes through.
                let mut tx = c2.begin().await.expect("BEGIN through the proxy");
                exec(&mut tx, "INSERT INTO t (id) VALUES (2)").await;
                tx.commit().await.expect("a COMMIT after cut_after fired");
                assert_eq!(count(&mut direct).await, 2);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn server_faults() {
                let server = start().await;
                let port = server.port();
                let url = server.create_database("harness").await;
                let mut direct = connect(&url).await;
                exec(&mut direct, "CREATE TABLE t (id INT PRIMARY KEY)").await;
                drop(direct);
                let proxy = Proxy::start(port).await;
                let via = proxy.url_for(&url);
                let mut c = connect(&via).await;

                let modes = [StopMode::Fast, StopMode::Immediate, StopMode::Kill];
                let rows = modes.len() as i64;
                for (i, mode) in modes.into_iter().enumerate() {
                    // Committed just before the stop (or crash).
                    exec(&mut c, &format!("INSERT INTO t (id) VALUES ({i})")).await;
                    let t = Instant::now();
                    server.restart(mode).await;
                    eprintln!(
                        "{}: restart({mode:?}) took {} ms",
                        stringify!($module),
                        t.elapsed().as_millis()
                    );
                    assert_eq!(server.port(), port);
                    let mut direct = connect(&url).await;
                    assert_eq!(
                        count(&mut direct).await,
                        i as i64 + 1,
                        "rows after {mode:?}"
                    );
                    let r = patiently("query after restart", try_count(&mut c)).await;
                    assert!(r.is_err(), "a connection survived restart({mode:?})");
                    c = connect(&via).await;
                    assert_eq!(count(&mut c).await, i as i64 + 1);
                }

                // stop / start_again: a downtime window of the test's own.
                server.stop(StopMode::Fast).await;
                assert!(
                    patiently("connect while stopped", Conn::connect(&url))
                        .await
                        .is_err(),
                    "connected to a stopped server"
                );
                server.start_again().await;
                let mut direct = connect(&url).await;
                assert_eq!(count(&mut direct).await, rows);
                drop(direct);

                // kill_backends: the sessions on the database end.
                let mut c = connect(&via).await;
                let mut d = connect(&url).await;
                assert_eq!(count(&mut c).await, rows);
                assert_eq!(count(&mut d).await, rows);
                let killed = server.kill_backends("harness").await;
                assert!(killed >= 2, "kill_backends killed {killed} sessions, not 2");
                for (name, conn) in [("proxied", &mut c), ("direct", &mut d)] {
                    let r = patiently("query after kill_backends", try_count(conn)).await;
                    assert!(r.is_err(), "the {name} session survived kill_backends");
                }
                let mut c = connect(&via).await;
                assert_eq!(count(&mut c).await, rows);
            }
        }
    };
}

harness_tests!(postgres, PrivatePostgres, sqlx::PgConnection);
harness_tests!(mariadb, PrivateMariadb, sqlx::MySqlConnection);
