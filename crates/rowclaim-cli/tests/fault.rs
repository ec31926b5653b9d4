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

#[path = "../../rowclaim/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{with_db, Backend, TestDb};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_rowclaim");

/// The own-table flags for the harness's `jobs` table.
const TABLE: [&str; 8] = [
    "--table",
    "jobs",
    "--owner-column",
    "owner",
    "--lease-column",
    "lease_until",
    "--attempts-column",
    "attempts",
];

fn rowclaim(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--database").arg(url).args(args);
    c.env_remove("DATABASE_URL")
        .env_remove("ROWCLAIM_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

/// Microseconds since the epoch: the clock the commands' `$EPOCHREALTIME` reads too.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A bash command that logs `S <id> <µs> <its pid>` when it starts and `E …` when it ends,
/// doing `work` in between (a shell snippet).
fn logged(log: &Path, work: &str) -> Vec<String> {
    let log = log.display();
    vec![
        "bash".into(),
        "-c".into(),
        format!(
            "echo \"S $ROWCLAIM_ID ${{EPOCHREALTIME/./}} $$\" >> {log}; {work}; \
             echo \"E $ROWCLAIM_ID ${{EPOCHREALTIME/./}} $$\" >> {log}"
        ),
    ]
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

async fn finish(child: Child) -> (Option<i32>, String) {
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the worker exits")
        .expect("wait for the worker");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
    reruns: usize,
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
    let cmd = logged(&log, "sleep 2");
    let mut args: Vec<&str> = vec!["work"];
    args.extend(TABLE);
    args.extend(["--concurrency", "2", "--prefetch", "2", "--"]);
    args.extend(cmd.iter().map(String::as_str));
    let mut worker = rowclaim(&t.url, &args);
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
    let cmd = logged(&log, "sleep 60");
    let mut args: Vec<&str> = vec!["work"];
    args.extend(TABLE);
    args.extend(["--concurrency", "2", "--kill-after", "2s", "--"]);
    args.extend(cmd.iter().map(String::as_str));
    let mut worker = rowclaim(&t.url, &args);
    worker.process_group(0).stderr(Stdio::piped());
    let worker = worker.spawn().unwrap();
    let pid = worker.id().unwrap();
    until("two commands run", || runs(&log).len() == 2).await;
    kill("INT", pid, true);
    // A second signal within a second of the first would count as the same one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
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
    let cmd = logged(&log, "sleep 2");
    let mut args: Vec<&str> = vec!["work"];
    args.extend(TABLE);
    args.push("--");
    args.extend(cmd.iter().map(String::as_str));
    let mut worker = rowclaim(&t.url, &args);
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
    let cmd = logged(&log, "if [ \"$ROWCLAIM_ID\" = 2 ]; then sleep 60; fi");
    let mut args: Vec<&str> = vec!["work"];
    args.extend(TABLE);
    args.extend([
        "--until-empty",
        "--concurrency",
        "3",
        "--timeout",
        "1s",
        "--kill-after",
        "1s",
        "--",
    ]);
    args.extend(cmd.iter().map(String::as_str));
    let out = rowclaim(&t.url, &args).output().await.unwrap();
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
    let cmd = logged(&log, "if [ \"$ROWCLAIM_ATTEMPT\" = 1 ]; then sleep 60; fi");
    let mut args = vec![
        "work",
        "--queue",
        "q",
        "--until-empty",
        "--poll",
        "200ms",
        "--timeout",
        "1s",
        "--kill-after",
        "1s",
        "--",
    ];
    args.extend(cmd.iter().map(String::as_str));
    let out = rowclaim(&t.url, &args).output().await.unwrap();
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
    let cmd = logged(&log, "sleep 60");
    let mut args = vec![
        "work",
        "--queue",
        "q",
        "--lease",
        "3s",
        "--kill-after",
        "1s",
        "--",
    ];
    args.extend(cmd.iter().map(String::as_str));
    let mut worker = rowclaim(&t.url, &args);
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
    assert!(err.contains("1 lost"), "{err}");
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
    let cmd = logged(&log, "sleep 1");
    let mut args: Vec<&str> = vec!["work"];
    args.extend(TABLE);
    args.extend([
        "--lease",
        "2s",
        "--concurrency",
        "1",
        "--prefetch",
        "3",
        "--poll",
        "200ms",
        "--",
    ]);
    args.extend(cmd.iter().map(String::as_str));
    let mut sleeper = rowclaim(&t.url, &args);
    sleeper.stderr(Stdio::piped());
    let sleeper = sleeper.spawn().unwrap();
    let sleeper_pid = sleeper.id().unwrap();
    until("the first worker runs a row", || runs(&log).len() == 1).await;
    kill("STOP", sleeper_pid, false);
    let stopped_at = now_us();
    // The other worker takes everything over once the stopped worker's leases expire.
    let mut args: Vec<&str> = vec!["work"];
    args.extend(TABLE);
    args.extend([
        "--lease",
        "30s",
        "--concurrency",
        "4",
        "--until-empty",
        "--poll",
        "200ms",
        "--",
    ]);
    args.extend(cmd.iter().map(String::as_str));
    let out = rowclaim(&t.url, &args).output().await.unwrap();
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
