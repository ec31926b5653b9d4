//! The fault suite: workers that must keep their promises while things go wrong.
//!
//! - On the machine's shared servers (nothing there is restarted or killed): Ctrl-C delivered to
//!   the whole process group, a second signal, the doubled signal of `timeout(1)`, a hung
//!   command with a time limit, a running job cancelled, a worker SIGSTOPped past its lease.
//! - On private servers this suite starts itself (see `common::servers`), reached through a TCP
//!   proxy of its own (`common::proxy`): server restarts, killed sessions, cut and black-holed
//!   connections, an enqueue whose COMMIT answer is lost.
//!
//! Each asserts invariants, never timings: no row lost, none completed twice, every worker still
//! running, and a row run twice only where its first run was in flight at a fault. Each scenario
//! also writes one row of the fault table (RELIABILITY.md) to `target/tmp/fault-table/`.

use rowclaim_testkit as common;
mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};
use tokio::process::Command;

use support::{finish, now_us, rowclaim, TABLE};

/// A bash command that logs `S <id> <µs> <its pid>` when it starts and `E …` when it ends,
/// doing `work` in between (a shell snippet).
fn logged(log: &Path, work: &str) -> Vec<String> {
    let log = log.display();
    vec![
        "bash".into(),
        "-c".into(),
        format!(
            "echo \"S $ROWCLAIM_ID ${{EPOCHREALTIME/./}} $$$WORKER\" >> {log}; {work}; \
             echo \"E $ROWCLAIM_ID ${{EPOCHREALTIME/./}} $$$WORKER\" >> {log}"
        ),
    ]
}

/// `rowclaim work SOURCE… OPTIONS… -- <logged(log, shell)>`.
fn work(url: &str, source: &[&str], options: &[&str], log: &Path, shell: &str) -> Command {
    let cmd = logged(log, shell);
    let mut args = vec!["work"];
    args.extend(source);
    args.extend(options);
    args.push("--");
    args.extend(cmd.iter().map(String::as_str));
    rowclaim(url, &args)
}

/// One run of a row, from a log of `logged` lines.
#[derive(Clone, Debug)]
struct Run {
    start: u64,
    end: Option<u64>,
    who: String,
}

/// Runs per row id.
fn runs(log: &Path) -> HashMap<String, Vec<Run>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open: HashMap<(String, String), Run> = HashMap::new();
    let mut done: HashMap<String, Vec<Run>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, id, at, who] = f[..] else { continue };
        let at: u64 = at.parse().unwrap_or(0);
        let key = (id.to_owned(), who.to_owned());
        match kind {
            "S" => {
                open.insert(
                    key,
                    Run {
                        start: at,
                        end: None,
                        who: who.to_owned(),
                    },
                );
            }
            "E" => {
                if let Some(mut run) = open.remove(&key) {
                    run.end = Some(at);
                    done.entry(key.0).or_default().push(run);
                }
            }
            _ => {}
        }
    }
    for ((id, _), run) in open {
        done.entry(id).or_default().push(run);
    }
    for list in done.values_mut() {
        list.sort_by_key(|r| r.start);
    }
    done
}

/// Sends `signal` (e.g. "INT") to a process, or with `group` to its whole process group.
fn kill(signal: &str, pid: u32, group: bool) {
    let target = if group {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    let ok = std::process::Command::new("kill")
        .args([&format!("-{signal}"), "--", &target])
        .status()
        .expect("run kill");
    assert!(ok.success(), "kill -{signal} {target}");
}

/// Waits (bounded: a minute) until `check` holds.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..1200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gave up waiting until {what}");
}

fn alive(pid: &str) -> bool {
    std::process::Command::new("kill")
        .args(["-0", pid])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// One row of the fault table, kept for RELIABILITY.md.
fn table_row(
    scenario: &str,
    backend: Backend,
    rows: usize,
    lost: usize,
    reruns: impl std::fmt::Display,
    recover: &str,
) {
    let line = format!(
        "| {scenario} | {} | {rows} | {lost} | {reruns} | {recover} |",
        match backend {
            Backend::Postgres => "PostgreSQL",
            Backend::MySql => "MariaDB",
            Backend::Sqlite => "SQLite",
        }
    );
    eprintln!("fault table: {line}");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fault-table");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(format!(
        "{}-{:?}.md",
        scenario.replace(|c: char| !c.is_ascii_alphanumeric(), "-"),
        backend
    ));
    let _ = std::fs::write(file, format!("{line}\n"));
}

// ------------------------------------------------------------------ signals (shared servers)

/// A terminal's Ctrl-C goes to the whole foreground process group. The commands lead groups of
/// their own, so only rowclaim gets it: the running commands finish and their rows are done,
/// rows claimed ahead go back, and the worker exits 0.
async fn ctrl_c_to_the_group(t: Arc<TestDb>) {
    t.jobs(6).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let options = ["--concurrency", "2", "--prefetch", "2"];
    // Long enough that the Ctrl-C comes while both run, on a slow machine too.
    let mut worker = work(&t.url, &TABLE, &options, &log, "sleep 5");
    worker.process_group(0).stderr(Stdio::piped());
    let worker = worker.spawn().unwrap();
    let pid = worker.id().unwrap();
    until("two commands run", || runs(&log).len() == 2).await;
    kill("INT", pid, true);
    let (code, err) = finish(worker).await;
    assert_eq!(code, Some(0), "{err}");
    let r = runs(&log);
    assert_eq!(r.len(), 2, "nothing new started after Ctrl-C: {r:?}");
    for (id, list) in &r {
        assert!(
            list[0].end.is_some(),
            "row {id}'s command was not interrupted: {err}"
        );
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        2,
        "{err}"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready' AND owner IS NULL")
            .await,
        4,
        "the two rows claimed ahead went back: {err}"
    );
    assert!(err.contains("2 released"), "{err}");
    table_row("Ctrl-C to the process group", t.backend, 6, 0, 0, "-");
}

/// A second signal stops the running commands (SIGTERM to their group), gives their rows back
/// and exits 130.
async fn second_signal(t: Arc<TestDb>) {
    t.jobs(2).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let options = ["--concurrency", "2", "--kill-after", "2s"];
    let mut worker = work(&t.url, &TABLE, &options, &log, "sleep 60");
    worker.process_group(0).stderr(Stdio::piped());
    let worker = worker.spawn().unwrap();
    let pid = worker.id().unwrap();
    until("two commands run", || runs(&log).len() == 2).await;
    kill("INT", pid, true);
    // A second signal within a second of the first being handled would count as the same one
    // (and a slow machine may handle it late).
    tokio::time::sleep(Duration::from_secs(3)).await;
    kill("INT", pid, true);
    let (code, err) = finish(worker).await;
    assert_eq!(code, Some(130), "{err}");
    for list in runs(&log).values() {
        assert!(
            list[0].end.is_none(),
            "the command was stopped, not finished"
        );
        assert!(!alive(&list[0].who), "command {} is gone", list[0].who);
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready' AND owner IS NULL")
            .await,
        2,
        "both rows went back: {err}"
    );
}

/// `timeout(1)` signals rowclaim and then its whole process group: the same SIGTERM twice at
/// once. That is one request to stop, not two: the running command finishes.
async fn doubled_signal(t: Arc<TestDb>) {
    t.jobs(1).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let mut worker = work(&t.url, &TABLE, &[], &log, "sleep 2");
    worker.process_group(0).stderr(Stdio::piped());
    let worker = worker.spawn().unwrap();
    let pid = worker.id().unwrap();
    until("the command runs", || runs(&log).len() == 1).await;
    kill("TERM", pid, false);
    kill("TERM", pid, true);
    let (code, err) = finish(worker).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        1,
        "{err}"
    );
}

/// A command that hangs is stopped at `--timeout`; on an own table its row fails (exit 5 under
/// --until-empty), a managed job fails with "timed out after 1s" and its next run completes.
async fn hung_command(t: Arc<TestDb>) {
    t.jobs(3).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    // Row 2 hangs; the others are quick.
    let hang_two = "if [ \"$ROWCLAIM_ID\" = 2 ]; then sleep 60; fi";
    let options = [
        "--until-empty",
        "--concurrency",
        "3",
        "--timeout",
        "1s",
        "--kill-after",
        "1s",
    ];
    let out = work(&t.url, &TABLE, &options, &log, hang_two)
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "a row failed: {err}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE id = 2 AND status = 'failed'")
            .await,
        1
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        2
    );
    let hung = &runs(&log)["2"][0];
    assert!(
        hung.end.is_none() && !alive(&hung.who),
        "the hung command was stopped"
    );

    // The managed queue: the first run hangs, the retry completes.
    assert!(rowclaim(&t.url, &["init"])
        .output()
        .await
        .unwrap()
        .status
        .success());
    let out = rowclaim(&t.url, &["enqueue", "--queue", "q", "{}"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let hang_first = "if [ \"$ROWCLAIM_ATTEMPT\" = 1 ]; then sleep 60; fi";
    let options = [
        "--until-empty",
        "--poll",
        "200ms",
        "--timeout",
        "1s",
        "--kill-after",
        "1s",
    ];
    let out = work(&t.url, &["--queue", "q"], &options, &log, hang_first)
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        t.count(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed' AND attempts = 2 \
             AND last_error = 'timed out after 1s'"
        )
        .await,
        1,
        "{err}"
    );
    table_row("hung command, --timeout 1s", t.backend, 4, 0, 1, "-");
}

/// `rowclaim jobs cancel` on a running job: the worker stops its command at the next heartbeat
/// and keeps running; the job stays cancelled.
async fn cancel_running(t: Arc<TestDb>) {
    assert!(rowclaim(&t.url, &["init"])
        .output()
        .await
        .unwrap()
        .status
        .success());
    let out = rowclaim(&t.url, &["enqueue", "--queue", "q", "{}"])
        .output()
        .await
        .unwrap();
    let id: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = id["id"].to_string();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    // Renewals find the cancel, every 3 s, each with 6 s to spare (one stalled past a shorter
    // lease's end gives the job up instead).
    let options = ["--lease", "9s", "--kill-after", "1s"];
    let mut worker = work(&t.url, &["--queue", "q"], &options, &log, "sleep 60");
    worker.stderr(Stdio::piped());
    let worker = worker.spawn().unwrap();
    until("the job runs", || runs(&log).len() == 1).await;
    let out = rowclaim(&t.url, &["jobs", "cancel", &id])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shell = runs(&log)[&id][0].who.clone();
    until("the cancelled job's command is stopped", || !alive(&shell)).await;
    kill("TERM", worker.id().unwrap(), false);
    let (code, err) = finish(worker).await;
    assert_eq!(code, Some(0), "{err}");
    // Said as what it was: cancelled, not lost to another worker.
    assert!(err.contains("1 cancelled"), "{err}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'cancelled'")
            .await,
        1
    );
    table_row("running job cancelled", t.backend, 1, 0, 0, "-");
}

/// A worker SIGSTOPped past its lease, then continued: meanwhile another worker took its rows
/// over. On waking it starts none of the rows it had claimed ahead (their leases could not be
/// confirmed), its late result is refused, and every row is done exactly once, by the worker
/// that held it.
async fn stopped_past_its_lease(t: Arc<TestDb>) {
    const ROWS: usize = 8;
    t.jobs(ROWS as i64).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let options = [
        "--lease",
        "2s",
        "--concurrency",
        "1",
        "--prefetch",
        "3",
        "--poll",
        "200ms",
    ];
    // Its first command outlasts the time the stop takes to come, on a slow machine too.
    let mut sleeper = work(&t.url, &TABLE, &options, &log, "sleep 5");
    sleeper.stderr(Stdio::piped());
    let sleeper = sleeper.spawn().unwrap();
    let sleeper_pid = sleeper.id().unwrap();
    until("the first worker runs a row", || runs(&log).len() == 1).await;
    // And holds its room: 1 running, 3 ahead. A stop that came while its last claim ahead was
    // still under way cut that claim short (on a loaded machine: 3 rows held, not 4).
    let mut held = 0;
    for _ in 0..600 {
        held = t
            .count("SELECT COUNT(*) FROM jobs WHERE owner IS NOT NULL")
            .await;
        if held >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        held, 4,
        "rows the first worker holds (1 running, prefetch 3)"
    );
    kill("STOP", sleeper_pid, false);
    let first_who = runs(&log).values().flatten().next().unwrap().who.clone();
    let stopped_at = now_us();
    // The other worker takes everything over once the stopped worker's leases expire.
    let options = [
        "--lease",
        "30s",
        "--concurrency",
        "4",
        "--until-empty",
        "--poll",
        "200ms",
    ];
    let out = work(&t.url, &TABLE, &options, &log, "sleep 1")
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        ROWS as i64
    );
    // Its command (not stopped: it leads a group of its own) has ended, so the late result is
    // there to be tried once the worker wakes.
    until("the stopped worker's first command ends", || {
        runs(&log)
            .values()
            .flatten()
            .any(|run| run.who == first_who && run.end.is_some())
    })
    .await;
    let continued_at = now_us();
    kill("CONT", sleeper_pid, false);
    // Give it time to wake, beat, find its rows gone and try its late result.
    tokio::time::sleep(Duration::from_secs(3)).await;
    kill("TERM", sleeper_pid, false);
    let (code, err) = finish(sleeper).await;
    assert_eq!(code, Some(0), "the continued worker ran on: {err}");

    let r = runs(&log);
    assert_eq!(r.len(), ROWS, "every row ran");
    let mut reruns = 0;
    for (id, list) in &r {
        // Started after it was continued: only by the worker that held it then, not the sleeper.
        if let Some(run) = list.iter().find(|run| run.start >= continued_at) {
            panic!("row {id} started after the continue: {run:?}");
        }
        if list.len() > 1 {
            reruns += list.len() - 1;
            assert!(
                list[0].start < stopped_at,
                "row {id} ran twice, but its first run began after the stop: {list:?}"
            );
        }
    }
    assert!(
        reruns <= 1,
        "only the row running at the stop ran twice: {r:?}"
    );
    assert!(
        err.contains("rowclaim: 0 done"),
        "the sleeper's late result was refused: {err}"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done' AND attempts > 1")
            .await as usize,
        ROWS.min(4),
        "the rows the sleeper held (1 running, 3 ahead) were claimed again, the rest once: {err}"
    );
    table_row(
        "worker SIGSTOPped past its lease",
        t.backend,
        ROWS,
        0,
        reruns,
        "-",
    );
}

macro_rules! shared_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn ctrl_c_to_the_process_group_finishes_running_rows() {
            with_db($backend, ctrl_c_to_the_group).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_second_signal_stops_commands_and_exits_130() {
            with_db($backend, second_signal).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn timeouts_doubled_signal_is_one_stop() {
            with_db($backend, doubled_signal).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_hung_command_is_stopped_at_its_timeout() {
            with_db($backend, hung_command).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cancelling_a_running_job_stops_its_command() {
            with_db($backend, cancel_running).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_worker_stopped_past_its_lease_starts_nothing_stale() {
            with_db($backend, stopped_past_its_lease).await
        }
    };
}

mod shared_postgres {
    shared_cases!(Backend::Postgres);
}
mod shared_mysql {
    shared_cases!(Backend::MySql);
}
mod shared_sqlite {
    shared_cases!(Backend::Sqlite);
}

// ----------------------------------------------- server faults (private servers, via a proxy)

use common::proxy::Proxy;
use common::servers::{PrivateMariadb, PrivatePostgres, StopMode};
use rowclaim::{NewJob, Source, Strategy, Worker};

/// A private server of the test's own.
enum Server {
    Pg(PrivatePostgres),
    My(PrivateMariadb),
}

impl Server {
    async fn start(backend: Backend) -> Server {
        match backend {
            Backend::Postgres => Server::Pg(PrivatePostgres::start().await),
            Backend::MySql => Server::My(PrivateMariadb::start().await),
            Backend::Sqlite => panic!("SQLite has no server to fault"),
        }
    }

    fn port(&self) -> u16 {
        match self {
            Server::Pg(s) => s.port(),
            Server::My(s) => s.port(),
        }
    }

    fn admin_url(&self) -> String {
        match self {
            Server::Pg(s) => s.admin_url(),
            Server::My(s) => s.admin_url(),
        }
    }

    async fn restart(&self, mode: StopMode) {
        match self {
            Server::Pg(s) => s.restart(mode).await,
            Server::My(s) => s.restart(mode).await,
        }
    }

    async fn kill_backends(&self, database: &str) -> usize {
        match self {
            Server::Pg(s) => s.kill_backends(database).await,
            Server::My(s) => s.kill_backends(database).await,
        }
    }

    /// Opens connections (to the admin database, so that killing the test database's sessions
    /// spares them) until the server refuses one, and keeps them in `slots`.
    async fn take_free_slots(&self, slots: &mut Vec<Slot>) {
        use sqlx::Connection;
        let url = self.admin_url();
        for _ in 0..500 {
            let slot = match self {
                Server::Pg(_) => sqlx::PgConnection::connect(&url).await.map(Slot::Pg),
                Server::My(_) => sqlx::MySqlConnection::connect(&url).await.map(Slot::My),
            };
            match slot {
                Ok(slot) => slots.push(slot),
                Err(_) => return,
            }
        }
        panic!("the server never ran out of connection slots");
    }
}

/// A connection held to take a connection slot of the server.
enum Slot {
    Pg(sqlx::PgConnection),
    My(sqlx::MySqlConnection),
}

impl Slot {
    /// Kills every session of `database`, through this connection (the server has no free
    /// slot for another).
    async fn kill_sessions(&mut self, database: &str) {
        match self {
            Slot::Pg(c) => {
                sqlx::query(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = $1 AND backend_type = 'client backend' \
                     AND pid <> pg_backend_pid()",
                )
                .bind(database)
                .execute(c)
                .await
                .expect("kill the sessions");
            }
            Slot::My(c) => {
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT CAST(id AS SIGNED) FROM information_schema.processlist \
                     WHERE db = ? AND id <> CONNECTION_ID()",
                )
                .bind(database)
                .fetch_all(&mut *c)
                .await
                .expect("list the sessions");
                for id in ids {
                    // A session may be gone already.
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                        .execute(&mut *c)
                        .await;
                }
            }
        }
    }
}

/// A private server, a proxy in front of it, and a test database on it: `db` reaches it
/// directly (setup and checks), `url` through the proxy (what the workers use).
struct Site {
    server: Server,
    proxy: Proxy,
    db: TestDb,
    url: String,
}

impl Site {
    async fn start(backend: Backend) -> Site {
        let server = Server::start(backend).await;
        let db = TestDb::on(backend, &server.admin_url()).await;
        let proxy = Proxy::start(server.port()).await;
        let url = proxy.url_for(&db.url);
        Site {
            server,
            proxy,
            db,
            url,
        }
    }
}

/// A span of time in which a fault was on (µs since the epoch, both ends included).
#[derive(Clone, Copy, Debug)]
struct Window {
    from: u64,
    to: u64,
}

/// Runs `fault` and says when it was on.
async fn window<F: std::future::Future<Output = ()>>(fault: F) -> Window {
    let from = now_us();
    fault.await;
    Window { from, to: now_us() }
}

/// Rows done so far across both workloads, sampled every 100 ms through a direct connection.
#[derive(Clone)]
struct Progress {
    samples: Arc<std::sync::Mutex<Vec<(u64, i64)>>>,
    total: i64,
}

impl Progress {
    /// Samples, every 100 ms through a direct connection, the sum of `done` (counts of done
    /// rows, [`FAULT_ROWS`] each in the end); the sampler runs until aborted.
    fn sample(
        site: Arc<Site>,
        done: &'static [&'static str],
    ) -> (Progress, tokio::task::JoinHandle<()>) {
        let progress = Progress {
            samples: Arc::default(),
            total: (done.len() * FAULT_ROWS) as i64,
        };
        let p = progress.clone();
        let sampler = tokio::spawn(async move {
            loop {
                let mut sum = Some(0);
                for sql in done {
                    sum = match (sum, site.db.try_count(sql).await) {
                        (Some(s), Some(n)) => Some(s + n),
                        _ => None,
                    };
                }
                if let Some(n) = sum {
                    p.samples.lock().unwrap().push((now_us(), n));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        (progress, sampler)
    }

    fn latest(&self) -> i64 {
        self.samples.lock().unwrap().last().map_or(0, |s| s.1)
    }

    /// Waits until `fraction` of all rows are done.
    async fn reach(&self, fraction: f64) {
        let want = (self.total as f64 * fraction) as i64;
        until(&format!("{want} rows are done"), || self.latest() >= want).await;
    }

    /// For each window: how long after its end the first further row was done.
    fn recovery(&self, windows: &[Window]) -> Option<Duration> {
        let samples = self.samples.lock().unwrap();
        windows
            .iter()
            .filter_map(|w| {
                let before = samples.iter().rev().find(|s| s.0 <= w.to)?.1;
                let after = samples.iter().find(|s| s.0 > w.to && s.1 > before)?;
                Some(Duration::from_micros(after.0 - w.to))
            })
            .max()
    }
}

const FAULT_ROWS: usize = 300;
const FAULT_LEASE: Duration = Duration::from_secs(10);
const OWN_DONE: &str = "SELECT COUNT(*) FROM jobs WHERE status = 'done'";
const TX_DONE: &str = "SELECT COUNT(*) FROM tx_jobs WHERE status = 'done'";
const QUEUE_DONE: &str = "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'";

/// A library worker that logs its runs like [`logged`] does, as "lib-N".
fn library_worker(worker: Worker, log: PathBuf) -> Worker {
    let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    worker
        .handle_rows(move |row| {
            let (log, who) = (
                log.clone(),
                format!(
                    "lib-{}",
                    n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                ),
            );
            async move {
                let line = |kind: &str| format!("{kind} {} {} {who}\n", row.id, now_us());
                append(&log, &line("S"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                append(&log, &line("E"));
                Ok::<_, String>(())
            }
        })
        .concurrency(3)
        .lease(FAULT_LEASE)
        .poll(Duration::from_millis(200))
}

fn append(path: &Path, line: &str) {
    use std::io::Write;
    // After a failed test its directory may be gone while the worker still runs: then there is
    // nothing left to log to.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Checks that every row of a workload ran to its end at least once, and that each run before a
/// row's last one is explained by a fault: its row was held while a fault was on. A row is held
/// from its claim (at most a lease before its run starts: a row waits for a slot only while its
/// lease is confirmed) until its result is recorded (retried until its lease ends), or until
/// the next run starts for a run that was stopped. Returns the re-runs.
fn check_runs(what: &str, log: &Path, windows: &[Window]) -> usize {
    let all = runs(log);
    let mut reruns = 0;
    for id in 1..=FAULT_ROWS {
        let Some(list) = all.get(&id.to_string()) else {
            panic!("{what}: row {id} never ran");
        };
        assert!(
            list.iter().any(|r| r.end.is_some()),
            "{what}: row {id} never ran to its end: {list:?}"
        );
        for (i, run) in list.iter().enumerate().take(list.len() - 1) {
            let slack = FAULT_LEASE.as_micros() as u64 + 3_000_000;
            let until = run.end.map_or(list[i + 1].start, |end| end + slack);
            let claimed = run.start.saturating_sub(FAULT_LEASE.as_micros() as u64);
            assert!(
                windows.iter().any(|w| w.from <= until && w.to >= claimed),
                "{what}: row {id} ran again, but its run {run:?} overlapped no fault \
                 {windows:?}; all its runs: {list:?}"
            );
            reruns += 1;
        }
    }
    reruns
}

/// The fault scenario harness: on a private server, an own table and a managed queue of
/// [`FAULT_ROWS`] rows each, worked at once by `rowclaim work` processes (three on the own
/// table, claiming with skip-locked, token and transaction; two on the queue) and one library
/// [`Worker`] each, all through the proxy. `fault` injects its faults at points of progress and returns when they were on.
/// Then every row must be done once, every worker still running (and exiting 0 when told to
/// stop), and every re-run explained by a fault.
async fn fault_scenario<F, Fut>(scenario: &str, backend: Backend, fault: F)
where
    F: FnOnce(Arc<Site>, Progress) -> Fut,
    Fut: std::future::Future<Output = Vec<Window>>,
{
    let site = Arc::new(Site::start(backend).await);
    site.db.jobs(FAULT_ROWS as i64).await;
    site.db.jobs_table("tx_jobs", FAULT_ROWS as i64).await;
    let direct = rowclaim::Db::connect(&site.db.url)
        .await
        .expect("connect directly");
    direct.queue().init().await.expect("init");
    let jobs: Vec<NewJob> = (0..FAULT_ROWS)
        .map(|i| NewJob::new(serde_json::json!({ "i": i })).queue("q"))
        .collect();
    direct.queue().enqueue_many(&jobs).await.expect("enqueue");

    let dir = tempfile::tempdir().unwrap();
    let log = |name: &str| dir.path().join(format!("{name}.log"));
    let (own_log, tx_log, queue_log) = (log("own"), log("tx"), log("queue"));
    let lease = format!("{}s", FAULT_LEASE.as_secs());
    let mut cli = Vec::new();
    // The own table's workers claim with skip-locked and token (they mark rows claimed); the
    // transaction strategy, whose rows are held only by row locks, has a table of its own
    // (updates of other claimers waiting on its locks can deadlock it on MariaDB).
    let own = |strategy| [&TABLE[..], &["--strategy", strategy]].concat();
    let workers: Vec<(&PathBuf, Vec<&str>)> = vec![
        (&own_log, own("skip-locked")),
        (&own_log, own("token")),
        (
            &tx_log,
            vec!["--table", "tx_jobs", "--strategy", "transaction"],
        ),
        (
            &tx_log,
            vec!["--table", "tx_jobs", "--strategy", "transaction"],
        ),
        (&queue_log, vec!["--queue", "q"]),
        (&queue_log, vec!["--queue", "q"]),
    ];
    let n_workers = workers.len();
    for (i, (log, source)) in workers.into_iter().enumerate() {
        let options = ["--concurrency", "3", "--lease", &lease, "--poll", "200ms"];
        let stderr = std::fs::File::create(dir.path().join(format!("worker-{i}.err"))).unwrap();
        let mut c = work(&site.url, &source, &options, log, "sleep 0.05");
        // Runs say which worker ran them: "<pid>@<worker>".
        c.stderr(Stdio::from(stderr)).env("WORKER", format!("@{i}"));
        cli.push(c.spawn().expect("start a worker"));
    }
    let through_proxy = rowclaim::Db::connect(&site.url)
        .await
        .expect("connect via the proxy");
    let own = through_proxy
        .claimer(
            Source::new("jobs")
                .owner_column("owner")
                .lease_column("lease_until")
                .attempts_column("attempts"),
            Strategy::Auto,
        )
        .await
        .unwrap();
    let lib_own = library_worker(Worker::for_claimer(own), own_log.clone());
    let lib_queue = library_worker(
        Worker::for_claimer(through_proxy.queue().claimer(&["q".into()]).await.unwrap()),
        queue_log.clone(),
    );
    let stops = [lib_own.shutdown_handle(), lib_queue.shutdown_handle()];
    let libs = [
        tokio::spawn(lib_own.run(std::future::pending())),
        tokio::spawn(lib_queue.run(std::future::pending())),
    ];

    let (progress, sampler) = Progress::sample(site.clone(), &[OWN_DONE, TX_DONE, QUEUE_DONE]);

    let windows = fault(site.clone(), progress.clone()).await;
    let stderr_of = |i: usize| {
        std::fs::read_to_string(dir.path().join(format!("worker-{i}.err"))).unwrap_or_default()
    };
    for _ in 0..3600 {
        if progress.latest() == progress.total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sampler.abort();
    assert_eq!(
        progress.latest(),
        progress.total,
        "{scenario} on {backend:?}: not every row was done; workers said:\n{}",
        (0..n_workers)
            .map(stderr_of)
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    // Every worker is still running: none gave up.
    for (i, w) in cli.iter_mut().enumerate() {
        assert!(
            w.try_wait().unwrap().is_none(),
            "worker {i} exited: {}",
            stderr_of(i)
        );
    }
    assert!(
        libs.iter().all(|l| !l.is_finished()),
        "a library worker stopped"
    );
    for w in &cli {
        kill("TERM", w.id().unwrap(), false);
    }
    for (i, w) in cli.into_iter().enumerate() {
        let (code, _) = finish(w).await;
        assert_eq!(code, Some(0), "worker {i}: {}", stderr_of(i));
    }
    // The faults reached the workers: they saw the database go away, and said so. (When the
    // server's slots are taken and the sessions killed, busy workers may win freed slots back
    // before anything of theirs fails; the transaction strategy's claims, whose transactions
    // were killed, say that instead.)
    let said: Vec<String> = (0..n_workers).map(stderr_of).collect();
    assert!(
        said.iter().any(|e| e.contains("lost the database")
            || e.contains("terminating connection due to administrator command")),
        "no worker noticed the faults: {said:?}"
    );
    if std::env::var_os("ROWCLAIM_SHOW_WORKERS").is_some() {
        for (i, said) in said.iter().enumerate() {
            eprintln!("{scenario} on {backend:?}, worker {i} said:\n{said}");
        }
    }
    stops.iter().for_each(rowclaim::Shutdown::drain);
    for l in libs {
        l.await.unwrap().expect("the library worker ends well");
    }

    // Nothing lost, nothing left in another state.
    assert_eq!(site.db.count(OWN_DONE).await, FAULT_ROWS as i64);
    assert_eq!(
        site.db.count("SELECT COUNT(*) FROM jobs").await,
        FAULT_ROWS as i64
    );
    assert_eq!(site.db.count(TX_DONE).await, FAULT_ROWS as i64);
    assert_eq!(site.db.count(QUEUE_DONE).await, FAULT_ROWS as i64);
    assert_eq!(
        site.db.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
        FAULT_ROWS as i64
    );
    // Re-runs per workload: lease-based claims (skip-locked, token, the queue) keep their rows
    // through a short outage; a transaction claim loses its rows with its session.
    let reruns = format!(
        "{} / {} / {}",
        check_runs("own table", &own_log, &windows),
        check_runs("transaction table", &tx_log, &windows),
        check_runs("queue", &queue_log, &windows)
    );
    let recover = progress
        .recovery(&windows)
        .map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
    table_row(scenario, backend, 3 * FAULT_ROWS, 0, reruns, &recover);
}

/// `rowclaim work --until-empty` through a crash (immediate restart) of the server mid-drain:
/// every row ends done, so every worker exits 0, whatever it gave up or lost on the way; what
/// it let go and saw finished later is in its summary (issue 25: it used to exit 5).
async fn until_empty_through_a_restart(backend: Backend) {
    let site = Arc::new(Site::start(backend).await);
    site.db.jobs(FAULT_ROWS as i64).await;
    site.db.jobs_table("tx_jobs", FAULT_ROWS as i64).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runs.log");
    let (progress, sampler) = Progress::sample(site.clone(), &[OWN_DONE, TX_DONE]);
    let lease = format!("{}s", FAULT_LEASE.as_secs());
    let own = |strategy| [&TABLE[..], &["--strategy", strategy]].concat();
    // A transaction claim loses its rows with its session: the restart makes those workers
    // give rows up, which the other one then finishes.
    let tx = || vec!["--table", "tx_jobs", "--strategy", "transaction"];
    let sources = [own("skip-locked"), own("token"), tx(), tx()];
    let workers: Vec<_> = sources
        .iter()
        .map(|source| {
            let options = [
                "--concurrency",
                "3",
                "--lease",
                &lease,
                "--poll",
                "200ms",
                "--until-empty",
                "--json",
            ];
            let mut c = work(&site.url, source, &options, &log, "sleep 0.05");
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
            c.spawn().expect("start a worker")
        })
        .collect();
    progress.reach(0.3).await;
    site.server.restart(StopMode::Immediate).await;
    let mut let_go = 0;
    for (i, w) in workers.into_iter().enumerate() {
        let out = tokio::time::timeout(Duration::from_secs(300), w.wait_with_output())
            .await
            .expect("the worker ends within 5 minutes")
            .expect("wait for the worker");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "worker {i}: {err}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let summary: serde_json::Value = stdout
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or_else(|| panic!("worker {i}: no summary on stdout: {stdout}"));
        let count = |key: &str| summary[key].as_u64().expect("a count");
        // Every row ended done, so each one let go was finished later.
        let gone = count("lost") + count("given_up");
        assert_eq!(count("finished_later"), gone, "worker {i}: {summary}");
        let_go += gone;
    }
    sampler.abort();
    assert_eq!(site.db.count(OWN_DONE).await, FAULT_ROWS as i64);
    assert_eq!(site.db.count(TX_DONE).await, FAULT_ROWS as i64);
    eprintln!(
        "{backend:?}: the workers let {let_go} row(s) go at the restart; all were finished later"
    );
}

/// The server restarts twice mid-run: a clean (fast) shutdown, then a crash (immediate).
async fn restarts(site: Arc<Site>, progress: Progress) -> Vec<Window> {
    progress.reach(0.2).await;
    let first = window(site.server.restart(StopMode::Fast)).await;
    progress.reach(0.55).await;
    let second = window(site.server.restart(StopMode::Immediate)).await;
    vec![first, second]
}

/// Every session of the database is killed, five times, 0.5 s apart.
async fn kills(site: Arc<Site>, progress: Progress) -> Vec<Window> {
    progress.reach(0.2).await;
    let mut windows = Vec::new();
    for _ in 0..5 {
        let name = site.db.name.clone();
        windows.push(
            window(async {
                site.server.kill_backends(&name).await;
            })
            .await,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    windows
}

/// Every connection is cut, then the network black-holes everything for 5 s, then every
/// connection is cut again.
async fn network(site: Arc<Site>, progress: Progress) -> Vec<Window> {
    progress.reach(0.2).await;
    let first = window(async { site.proxy.cut_all() }).await;
    progress.reach(0.4).await;
    let hole = window(async {
        site.proxy.blackhole(true);
        tokio::time::sleep(Duration::from_secs(5)).await;
        site.proxy.blackhole(false);
    })
    .await;
    progress.reach(0.6).await;
    let last = window(async { site.proxy.cut_all() }).await;
    vec![first, hole, last]
}

/// Another client takes every free connection slot of the server for 3 s, and the workers'
/// sessions are killed: they must win slots back as they free up.
async fn exhausted(site: Arc<Site>, progress: Progress) -> Vec<Window> {
    progress.reach(0.3).await;
    let w = window(async {
        let mut slots = Vec::new();
        site.server.take_free_slots(&mut slots).await;
        slots[0].kill_sessions(&site.db.name).await;
        site.server.take_free_slots(&mut slots).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(slots);
    })
    .await;
    vec![w]
}

/// `rowclaim enqueue` of 5,000 jobs whose COMMIT reaches the server but whose answer is lost:
/// it exits 6 and says the jobs may have been enqueued; they were.
async fn enqueue_commit_cut(backend: Backend) {
    let site = Site::start(backend).await;
    let init = rowclaim(&site.db.url, &["init"]).output().await.unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    // The COMMIT statement itself, not "READ COMMITTED" in MySQL's BEGIN: PostgreSQL's simple
    // query ends in a NUL, MySQL's COM_QUERY packet starts with the command byte 0x03.
    site.proxy.cut_after(match backend {
        Backend::Postgres => b"COMMIT\0",
        _ => b"\x03COMMIT",
    });
    let lines: String = (0..5000).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let mut enqueue = rowclaim(&site.url, &["enqueue", "--queue", "q"]);
    enqueue.stdin(Stdio::piped()).stderr(Stdio::piped());
    let mut child = enqueue.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, lines.as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let (code, err) = finish(child).await;
    assert!(site.proxy.fired(), "the COMMIT went through the proxy");
    assert_eq!(code, Some(6), "outcome unknown: {err}");
    assert!(err.contains("may or may not have taken effect"), "{err}");
    assert!(err.contains("jobs list"), "{err}");
    assert_eq!(
        site.db.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
        5000,
        "the COMMIT did take effect: a plain failure would have invited enqueueing it all again"
    );
    table_row(
        "enqueue whose COMMIT answer is lost",
        backend,
        5000,
        0,
        0,
        "-",
    );
}

macro_rules! server_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn workers_ride_out_two_server_restarts() {
            fault_scenario(
                "server restarted twice (fast, immediate)",
                $backend,
                restarts,
            )
            .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn workers_ride_out_killed_sessions() {
            fault_scenario("every session killed, 5 times", $backend, kills).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn workers_ride_out_cuts_and_a_black_hole() {
            fault_scenario("connections cut twice, 5 s black hole", $backend, network).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn workers_ride_out_a_server_without_free_connections() {
            fault_scenario(
                "connection slots exhausted by another client, sessions killed",
                $backend,
                exhausted,
            )
            .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_enqueue_whose_commit_answer_is_lost_says_so() {
            enqueue_commit_cut($backend).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn until_empty_exits_0_after_a_restart_when_every_row_is_done() {
            until_empty_through_a_restart($backend).await
        }
    };
}

mod private_postgres {
    server_cases!(Backend::Postgres);
}
mod private_mariadb {
    server_cases!(Backend::MySql);
}
