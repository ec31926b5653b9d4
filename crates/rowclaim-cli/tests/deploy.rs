//! Deployments users have, each on servers of the test's own:
//!
//! - PostgreSQL through PgBouncer in transaction pooling mode (a private PgBouncer with four
//!   server connections per database, in front of the shared server): `rowclaim work` over every
//!   strategy on an own table, and the managed queue with wake-ups degraded to polling (one
//!   warning) or taken from a direct `--listen-database` URL.
//! - A private PostgreSQL primary with a streaming standby, synchronous or asynchronous: the
//!   primary dies mid-run (an immediate stop, a SIGKILL of its whole process tree, or a black
//!   hole in front of it) and the standby is promoted while the same `rowclaim work` processes
//!   keep going on a multi-host URL, on an own table or the managed queue.
//!
//! Each asserts invariants, never timings: every row ran and ended done, none ran twice except
//! where an earlier run was in flight at the fault, and the workers never stopped.
//! (MariaDB Galera has its own file, `galera.rs`.)

use rowclaim_testkit as common;
mod support;

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::servers::{PrivatePostgres, StopMode};
use common::{with_db_via, Backend, TestDb, Via};
use tokio::process::Child;

use support::{finish, now_us, rowclaim, run_fed, TABLE};

/// A bash command that logs `S <id> <µs>` when it starts and `E <id> <µs>` when it ends.
fn logged(log: &Path, work: &str) -> Vec<String> {
    let log = log.display();
    vec![
        "bash".into(),
        "-c".into(),
        format!(
            "echo \"S $ROWCLAIM_ID ${{EPOCHREALTIME/./}}\" >> {log}; {work}; \
             echo \"E $ROWCLAIM_ID ${{EPOCHREALTIME/./}}\" >> {log}"
        ),
    ]
}

/// `rowclaim work ARGS… -- <logged command>`, stderr kept.
fn worker(url: &str, args: &[&str], log: &Path, work: &str) -> Child {
    let cmd = logged(log, work);
    let mut all: Vec<&str> = vec!["work"];
    all.extend(args);
    all.push("--");
    all.extend(cmd.iter().map(String::as_str));
    rowclaim(url, &all)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rowclaim work")
}

/// Runs of each id: (start, end) in µs, end None for a run that never ended.
fn runs(log: &Path) -> HashMap<String, Vec<(u64, Option<u64>)>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out: HashMap<String, Vec<(u64, Option<u64>)>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, id, at] = f[..] else { continue };
        let at: u64 = at.parse().unwrap_or(0);
        let list = out.entry(id.to_owned()).or_default();
        match kind {
            "S" => list.push((at, None)),
            "E" => {
                if let Some(open) = list.iter_mut().rev().find(|r| r.1.is_none()) {
                    open.1 = Some(at);
                }
            }
            _ => {}
        }
    }
    out
}

/// Runs a one-shot rowclaim command that must succeed, with `stdin` fed to it.
async fn ok(url: &str, args: &[&str], stdin: &str) {
    let out = run_fed(url, args, stdin).await;
    assert!(
        out.status.success(),
        "rowclaim {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `n` jobs as JSON lines for `rowclaim enqueue`.
fn payloads(n: usize) -> String {
    (0..n).map(|i| format!("{{\"n\":{i}}}\n")).collect()
}

const WARNING: &str = "LISTEN cannot pass a transaction-mode pooler";

// ------------------------------------------------------------------------------ PgBouncer

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_transaction_pooling() {
    with_db_via(Backend::Postgres, Via::PgBouncer, through_pgbouncer).await;
}

async fn through_pgbouncer(t: Arc<TestDb>) {
    const ROWS: i64 = 60;
    let dir = tempfile::tempdir().expect("temp dir");
    // Without pgbouncer=true the error says what to add.
    let plain = t.url.replace("?pgbouncer=true", "");
    let out = run_fed(&plain, &["stats"], "").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "stats through PgBouncer without pgbouncer=true"
    );
    assert!(
        stderr.contains("add pgbouncer=true to the URL"),
        "the error points at pgbouncer=true:\n{stderr}"
    );

    // An own table, every strategy: two workers share it through the pooler.
    for strategy in [
        "skip-locked",
        "token",
        "optimistic",
        "lease-table",
        "transaction",
    ] {
        t.exec("DROP TABLE IF EXISTS jobs").await;
        t.jobs(ROWS).await;
        // One table, claimed by each strategy in turn: the last one's record goes first.
        let out = run_fed(&t.url, &["source", "forget", "jobs"], "").await;
        assert!(matches!(out.status.code(), Some(0 | 1)), "{out:?}");
        let log = dir.path().join(format!("{strategy}.log"));
        let mut args: Vec<&str> = TABLE.to_vec();
        args.extend(["--strategy", strategy, "--until-empty", "--batch", "5"]);
        let a = worker(&t.url, &args, &log, "cat >/dev/null");
        let b = worker(&t.url, &args, &log, "cat >/dev/null");
        for (code, stderr) in [finish(a).await, finish(b).await] {
            assert_eq!(code, Some(0), "{strategy}: a worker failed:\n{stderr}");
        }
        let runs = runs(&log);
        for id in 1..=ROWS {
            let n = runs.get(&id.to_string()).map_or(0, Vec::len);
            assert_eq!(n, 1, "{strategy}: row {id} ran {n} times");
        }
        assert_eq!(
            t.count("SELECT count(*) FROM jobs WHERE status <> 'done'")
                .await,
            0,
            "{strategy}: every row done"
        );
        let mut stats: Vec<&str> = vec!["stats"];
        stats.extend(TABLE);
        ok(&t.url, &stats, "").await;
    }

    // The managed queue: one worker polls (LISTEN cannot pass the pooler, and it says so
    // once), one listens on a direct URL.
    const JOBS: usize = 200;
    ok(&t.url, &["init"], "").await;
    ok(&t.url, &["enqueue", "--queue", "q"], &payloads(JOBS)).await;
    let direct = t.direct_url();
    let log = dir.path().join("queue.log");
    let args = ["--queue", "q", "--until-empty", "--poll", "200ms"];
    let polling = worker(&t.url, &args, &log, "cat >/dev/null");
    let mut listening_args = args.to_vec();
    listening_args.extend(["--listen-database", &direct]);
    let listening = worker(&t.url, &listening_args, &log, "cat >/dev/null");
    let (code, polled) = finish(polling).await;
    assert_eq!(code, Some(0), "the polling worker failed:\n{polled}");
    let (code, listened) = finish(listening).await;
    assert_eq!(code, Some(0), "the listening worker failed:\n{listened}");
    assert_eq!(
        polled.matches(WARNING).count(),
        1,
        "the polling worker says once why it polls:\n{polled}"
    );
    assert!(
        !listened.contains(WARNING),
        "the worker with --listen-database listens:\n{listened}"
    );
    let runs = runs(&log);
    assert_eq!(runs.len(), JOBS, "every job ran");
    let twice: Vec<_> = runs.iter().filter(|(_, r)| r.len() > 1).collect();
    assert!(twice.is_empty(), "jobs ran twice: {twice:?}");
    assert_eq!(
        t.count("SELECT count(*) FROM rowclaim_jobs WHERE status <> 'completed'")
            .await,
        0
    );
    // The operator's commands pass the pooler too.
    ok(&t.url, &["stats"], "").await;
    ok(&t.url, &["jobs", "list", "--limit", "5"], "").await;
    ok(&t.url, &["jobs", "show", "1"], "").await;
    ok(&t.url, &["jobs", "prune", "--older-than", "1h"], "").await;
}

// ------------------------------------------------------------------------------- failover

/// How the primary dies in a failover test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Death {
    /// `pg_ctl stop -m immediate`: clients are told the server goes away (57P01).
    Immediate,
    /// SIGKILL of the postmaster and every process it started (a machine crash, an OOM kill):
    /// sockets close, nothing is said.
    Kill,
    /// The host stops answering (a partition): a black hole in front of the primary, which
    /// keeps running behind it.
    BlackHole,
}

/// What the workers share in a failover test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// An own table, strategy auto (skip-locked).
    OwnTable,
    /// The managed queue.
    Queue,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_a_killed_primary_async_standby() {
    failover(Death::Kill, false, Work::OwnTable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_a_killed_primary_sync_standby() {
    failover(Death::Kill, true, Work::Queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_behind_a_black_hole_async_standby() {
    failover(Death::BlackHole, false, Work::Queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_behind_a_black_hole_sync_standby() {
    failover(Death::BlackHole, true, Work::OwnTable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_an_immediate_stop_async_standby() {
    failover(Death::Immediate, false, Work::OwnTable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_an_immediate_stop_sync_standby() {
    failover(Death::Immediate, true, Work::Queue).await;
}

/// A private primary with a streaming standby (`sync`: synchronous replication, remote_apply),
/// three `rowclaim work` processes on a multi-host URL; the primary dies as `death` says mid-run
/// and the standby is promoted. The same processes finish every row on the new primary, none
/// exits, and a row runs again only where an earlier run, or its result, was in flight at the
/// fault (with an asynchronous standby, a result the primary took may not have reached it).
async fn failover(death: Death, sync: bool, work: Work) {
    const JOBS: usize = 300;
    let case = format!(
        "{death:?}, {} standby, {work:?}",
        if sync { "sync" } else { "async" }
    );
    let primary = PrivatePostgres::start().await;
    let standby = PrivatePostgres::standby_of(&primary).await;
    if sync {
        primary.replicate_synchronously().await;
    }
    // The black hole stands in front of the primary; the standby replicates directly.
    let proxy = Proxy::start(primary.port()).await;
    let primary_port = match death {
        Death::BlackHole => proxy.port(),
        Death::Immediate | Death::Kill => primary.port(),
    };
    let primary_db = primary.create_database("jobs").await;
    let standby_db = standby.url("jobs");
    let url = format!(
        "postgres://postgres@127.0.0.1:{primary_port},127.0.0.1:{}/jobs",
        standby.port()
    );
    let (mut args, pending) = match work {
        Work::OwnTable => {
            own_table(&primary_db, JOBS).await;
            (
                TABLE.to_vec(),
                "SELECT count(*) FROM jobs WHERE status <> 'done'",
            )
        }
        Work::Queue => {
            ok(&url, &["init"], "").await;
            ok(&url, &["enqueue", "--queue", "q"], &payloads(JOBS)).await;
            (
                vec!["--queue", "q", "--poll", "200ms"],
                "SELECT count(*) FROM rowclaim_jobs WHERE status <> 'completed'",
            )
        }
    };
    // A lease of 8 s: its statements are cut off (after 2.7–8 s) before the pool's own acquire
    // timeout (10 s) could report anything, so a silent server is found only by what the route
    // notices; and results sent at the fault reach the new primary well inside it.
    args.extend(["--concurrency", "4", "--lease", "8s"]);
    let count = |db: &str, sql: &'static str| {
        let db = db.to_owned();
        async move {
            let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db).await?;
            sqlx::query_scalar::<_, i64>(sql).fetch_one(&mut c).await
        }
    };
    // The standby has the work before it starts (replayed, also when asynchronous).
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&standby_db, pending).await.ok() != Some(JOBS as i64) {
        assert!(Instant::now() < deadline, "{case}: the standby lags");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("runs.log");
    // Jobs of 0.2 s: the pool is idle most of the time, so that the fault usually finds no
    // statement on its way to report it (what a server that dies in silence looks like). Once
    // half the rows are done, a job waits at its end for the fault (the file `fault`, made right
    // after it): however late a loaded machine lets this test see that the workers got going, the
    // fault comes mid-run, with rows left that only the new primary can give out.
    let fault = dir.path().join("fault");
    let work = format!(
        "cat >/dev/null; sleep 0.2; \
         if [ ! -e {fault} ] && [ \"$(grep -c '^E ' {log})\" -ge {half} ]; then \
         until [ -e {fault} ]; do sleep 0.05; done; fi",
        fault = fault.display(),
        log = log.display(),
        half = JOBS / 2
    );
    let mut workers: Vec<Child> = (0..3).map(|_| worker(&url, &args, &log, &work)).collect();

    // Mid-run: the primary dies, the standby takes over.
    let deadline = Instant::now() + Duration::from_secs(120);
    while runs(&log).values().filter(|r| r[0].1.is_some()).count() < JOBS / 4 {
        assert!(
            Instant::now() < deadline,
            "{case}: the workers did not get going"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let killed_at = now_us();
    let ended = runs(&log).values().filter(|r| r[0].1.is_some()).count();
    assert!(
        ended < JOBS,
        "{case}: the fault came mid-run ({ended} rows had ended)"
    );
    match death {
        Death::Immediate => primary.stop(StopMode::Immediate).await,
        Death::Kill => primary.stop(StopMode::Kill).await,
        Death::BlackHole => proxy.blackhole(true),
    }
    std::fs::write(&fault, "").expect("write the fault file");
    // An operator's (or a failover manager's) reaction time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    standby.promote().await;
    let promoted_at = now_us();

    // The same processes finish the work on the new primary.
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let left = count(&standby_db, pending).await;
        if left.as_ref().is_ok_and(|n| *n == 0) {
            break;
        }
        for w in &mut workers {
            if let Ok(Some(status)) = w.try_wait() {
                panic!("{case}: a worker exited during the failover ({status})");
            }
        }
        assert!(
            Instant::now() < deadline,
            "{case}: work left after 4 minutes on the new primary: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut said = String::new();
    for w in workers {
        let pid = w.id().expect("a running worker has a pid");
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let (_, stderr) = finish(w).await;
        said.push_str(&stderr);
    }
    // A worker says where its statements went (the route's move). This was missed now and then
    // until the stderr log stopped using a per-layer filter (see rowclaim-bench's `Gated`).
    assert!(
        said.contains("statements now go to"),
        "{case}: a worker said where its statements went after the failover:\n{said}"
    );

    let runs = runs(&log);
    assert_eq!(runs.len(), JOBS, "{case}: every row ran");
    let reruns: usize = runs.values().map(|r| r.len() - 1).sum();
    // For the closing notes and DEPLOYING.md: how long after the promotion work went on.
    let resumed = runs
        .values()
        .flatten()
        .map(|r| r.0)
        .filter(|&start| start > promoted_at)
        .min()
        .map_or(0, |start| (start - promoted_at) / 1000);
    eprintln!(
        "failover ({case}): {JOBS} rows, {reruns} re-run(s); standby promoted {} ms after the \
         fault, the first row started {resumed} ms after the promotion",
        (promoted_at - killed_at) / 1000
    );
    // With a synchronous standby nothing the old primary acknowledged is lost, and every job
    // here runs to its end and sends its result: the result is retried on the new primary within
    // its lease, or found there already, so no row runs twice.
    if sync {
        assert_eq!(
            reruns, 0,
            "{case}: rows whose result was sent ran again:\n{said}"
        );
    }
    // Results are written in batches after a run ends: one may still be on its way for a while.
    const RESULT_IN_FLIGHT_US: u64 = 10_000_000;
    for (id, list) in &runs {
        for (i, run) in list.iter().enumerate().skip(1) {
            // A row runs again only if an earlier run, or its result, was in flight when the
            // primary died (and its lease ran out before the new primary was found).
            let in_flight = list[..i].iter().any(|(start, end)| {
                *start < promoted_at && end.is_none_or(|e| e + RESULT_IN_FLIGHT_US > killed_at)
            });
            assert!(
                in_flight,
                "{case}: row {id} ran again at {} though no earlier run was in flight at the \
                 failover (fault at {killed_at}, promoted at {promoted_at}): {list:?}\n{said}",
                run.0
            );
        }
    }
    drop(proxy);
}

/// The harness's `jobs` table (the columns [`TABLE`] names) with `n` ready rows, on the
/// primary's database at `url`.
async fn own_table(url: &str, n: usize) {
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .expect("connect to the primary");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE jobs (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'ready', \
         owner text, lease_until timestamptz, attempts int NOT NULL DEFAULT 0); \
         INSERT INTO jobs (id) SELECT generate_series(1, {n})"
    )))
    .execute(&mut c)
    .await
    .expect("create the own table");
}
