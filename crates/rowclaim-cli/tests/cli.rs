//! The `rowclaim` binary on real databases: several `work` processes on a table the user made,
//! a worker SIGKILLed mid-run whose rows are finished by a later worker, graceful shutdown,
//! the claim/complete round trip and its exit codes.

use rowclaim_testkit as common;
mod support;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};

use support::{BIN, TABLE as FULL};

fn rowclaim(t: &TestDb, args: &[&str]) -> tokio::process::Command {
    support::rowclaim(&t.url, args)
}

async fn output(t: &TestDb, args: &[&str]) -> Output {
    rowclaim(t, args).output().await.expect("run rowclaim")
}

/// How often each id appears in a log of `$ROWCLAIM_ID` lines.
fn id_counts(log: &Path) -> HashMap<String, usize> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut counts = HashMap::new();
    for id in text.lines() {
        *counts.entry(id.to_owned()).or_default() += 1;
    }
    counts
}

/// A table the user created, four `rowclaim work` processes started at once: every row is run
/// exactly once and ends done.
async fn several_workers(t: Arc<TestDb>) {
    const ROWS: usize = 300;
    t.jobs(ROWS as i64).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    let script = format!("cat >/dev/null; echo \"$ROWCLAIM_ID\" >> {}", log.display());
    let mut workers = Vec::new();
    for i in 0..4 {
        let concurrency = if i % 2 == 0 { "1" } else { "3" };
        let mut args: Vec<&str> = FULL.to_vec();
        args.extend([
            "--until-empty",
            "--concurrency",
            concurrency,
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let mut cmd = rowclaim(&t, &["work"]);
        cmd.args(&args).stderr(Stdio::piped());
        workers.push(cmd.spawn().expect("start worker"));
    }
    for w in workers {
        let out = w.wait_with_output().await.unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "worker failed: {err}");
        assert!(err.contains("done"), "summary on stderr: {err}");
    }
    let counts = id_counts(&log);
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "rows run more than once: {twice:?}");
    assert_eq!(counts.len(), ROWS, "every row was run");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        ROWS as i64
    );
}

/// A worker is SIGKILLed while its commands run: its commands are told to stop too (they run in
/// process groups of their own, so only the kernel's parent-death signal reaches them), and a
/// worker started later finishes its rows once their lease has expired.
async fn killed_worker(t: Arc<TestDb>) {
    t.jobs(12).await;
    let dir = tempfile::tempdir().unwrap();
    let (started, finished, pids) = (
        dir.path().join("started.log"),
        dir.path().join("finished.log"),
        dir.path().join("pids.log"),
    );
    // `exec`: the process rowclaim started becomes the sleep, so the signal reaches the sleep.
    let slow = format!(
        "echo $$ >> {}; echo \"$ROWCLAIM_ID\" >> {}; exec sleep 120",
        pids.display(),
        started.display()
    );
    let mut args: Vec<&str> = FULL.to_vec();
    // No rows claimed ahead: the three running are all it holds.
    args.extend([
        "--lease",
        "2s",
        "--concurrency",
        "3",
        "--prefetch",
        "0",
        "--",
        "sh",
        "-c",
        &slow,
    ]);
    let mut doomed = rowclaim(&t, &["work"]);
    doomed.args(&args).process_group(0);
    let mut doomed = doomed.spawn().expect("start worker");
    // Wait until it runs three rows.
    for _ in 0..200 {
        if id_counts(&started).len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held: Vec<String> = id_counts(&started).into_keys().collect();
    assert_eq!(held.len(), 3, "the first worker started three rows");
    // SIGKILL the worker and its commands: no cleanup happens.
    let pgid = doomed.id().expect("pid") as i32;
    let killed = std::process::Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{pgid}")])
        .status()
        .unwrap();
    assert!(killed.success());
    let _ = doomed.wait().await;
    let commands: Vec<String> = std::fs::read_to_string(&pids)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(commands.len(), 3, "three commands started");
    let alive = || {
        commands
            .iter()
            .filter(|pid| {
                // Gone, or a zombie nobody has reaped yet: either way it stopped.
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, r)| !r.starts_with('Z'))
                })
            })
            .count()
    };
    for _ in 0..300 {
        if alive() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        alive(),
        0,
        "the killed worker's commands stopped: {commands:?}"
    );
    let claimed = t
        .count("SELECT COUNT(*) FROM jobs WHERE status = 'claimed'")
        .await;
    assert_eq!(claimed, 3, "the dead worker's rows are still claimed");

    let quick = format!(
        "cat >/dev/null; echo \"$ROWCLAIM_ID\" >> {}",
        finished.display()
    );
    let mut args: Vec<&str> = FULL.to_vec();
    args.extend(["--until-empty", "--poll", "200ms", "--", "sh", "-c", &quick]);
    let out = output(&t, &[&["work"], args.as_slice()].concat()).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let finished = id_counts(&finished);
    assert_eq!(finished.len(), 12, "the later worker finished every row");
    for id in &held {
        assert_eq!(
            finished.get(id),
            Some(&1),
            "row {id} of the killed worker was finished"
        );
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        12
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE attempts = 2")
            .await,
        3,
        "re-claims count"
    );
}

/// SIGTERM: the running command finishes and its row is done; rows claimed but not started are
/// given back.
async fn graceful_shutdown(t: Arc<TestDb>) {
    t.jobs(5).await;
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started.log");
    let script = format!("echo \"$ROWCLAIM_ID\" >> {}; sleep 1", started.display());
    let mut args: Vec<&str> = FULL.to_vec();
    args.extend([
        "--batch",
        "5",
        "--concurrency",
        "1",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let mut cmd = rowclaim(&t, &["work"]);
    cmd.args(&args).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    for _ in 0..200 {
        if !id_counts(&started).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let out = child.wait_with_output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("1 done") && err.contains("4 released"),
        "{err}"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
            .await,
        1
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready' AND owner IS NULL")
            .await,
        4
    );
}

/// claim prints JSON lines with a token; complete by token; stale and empty cases exit 3 and 1;
/// a failing command marks its row failed.
async fn claim_round_trip(t: Arc<TestDb>) {
    t.jobs(3).await;
    let claim = [&["claim", "--batch", "2"], FULL.as_slice()].concat();
    let out = output(&t, &claim).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["id"], 1);
    assert_eq!(lines[0]["row"]["payload"], "job 1");
    let token = lines[0]["token"].as_str().unwrap().to_owned();
    assert_eq!(lines[1]["token"], token.as_str());

    let complete = [
        &["complete", "--token", &token, "--id", "1"],
        FULL.as_slice(),
    ]
    .concat();
    let out = output(&t, &complete).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Again: the token no longer holds row 1.
    let out = output(&t, &complete).await;
    assert_eq!(out.status.code(), Some(3), "lease lost exit code");
    assert!(String::from_utf8_lossy(&out.stderr).contains("lease lost"));

    let release = [&["release", "--token", &token], FULL.as_slice()].concat();
    assert!(output(&t, &release).await.status.success());

    // A failing command fails its row; --until-empty then says that not every row went well.
    let work = [
        FULL.as_slice(),
        &["--until-empty", "--", "sh", "-c", "exit 7"],
    ]
    .concat();
    let out = output(&t, &[&["work"], work.as_slice()].concat()).await;
    assert_eq!(
        out.status.code(),
        Some(5),
        "failed rows under --until-empty: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'failed'")
            .await,
        2
    );

    let out = output(&t, &claim).await;
    assert_eq!(out.status.code(), Some(1), "nothing to claim");

    let stats = [&["stats", "--json"], FULL.as_slice()].concat();
    let out = output(&t, &stats).await;
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["by_status"]["failed"], 2);
    assert_eq!(s["by_status"]["done"], 1);
}

/// Bad input exits 2 with a message naming the culprit, and writes nothing.
async fn bad_input(t: Arc<TestDb>) {
    t.jobs(2).await;
    let out = output(&t, &["claim", "--table", "jobs; drop table jobs"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("\"jobs; drop table jobs\" is not a plain SQL identifier"));

    let out = output(
        &t,
        &["claim", "--table", "jobs", "--lease-column", "ends_at"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no column ends_at"));

    let delete = [
        &["work", "--completed", "delete"],
        FULL.as_slice(),
        &["--", "true"],
    ]
    .concat();
    let out = output(&t, &delete).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--completed delete"));

    let out = output(&t, &[&["claim", "--lease", "0s"], FULL.as_slice()].concat()).await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--lease") && err.contains("must be positive"),
        "{err}"
    );

    let out = output(
        &t,
        &["claim", "--table", "jobs", "--strategy", "skip-locked"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    if t.backend == Backend::Sqlite {
        assert!(err.contains("SQLite has no SKIP LOCKED"), "{err}");
    } else {
        assert!(err.contains("owner column"), "{err}");
    }
    // A --where that would leave its parentheses, or that is no condition on the table.
    t.exec("UPDATE jobs SET status = 'done' WHERE id = 1").await;
    for filter in ["1=1) or (1=1", "nope = 1"] {
        let out = output(
            &t,
            &[&["claim", "--where", filter], FULL.as_slice()].concat(),
        )
        .await;
        assert_eq!(out.status.code(), Some(2), "--where {filter}");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.contains(&format!("--where {filter:?}")), "{err}");
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready' AND owner IS NULL")
            .await,
        1
    );
}

/// A COMMAND that cannot run (missing, or a file that may not be executed) stops the worker
/// with a message naming it, and its rows go back; a script without a `#!` line runs under
/// /bin/sh, as execvp runs it.
async fn command_that_cannot_run(t: Arc<TestDb>) {
    t.jobs(2).await;
    let dir = tempfile::tempdir().unwrap();
    let not_executable = dir.path().join("not-executable");
    std::fs::write(&not_executable, "exit 0\n").unwrap();
    let not_executable = not_executable.to_str().unwrap();
    for (program, why) in [
        ("rowclaim-no-such-command", "No such file or directory"),
        (not_executable, "Permission denied"),
    ] {
        let args = [
            &["work"],
            FULL.as_slice(),
            &["--until-empty", "--", program],
        ]
        .concat();
        let out = output(&t, &args).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{err}");
        assert!(
            err.contains(&format!("cannot run {program:?}: {why}")),
            "{err}"
        );
        assert_eq!(
            t.count("SELECT COUNT(*) FROM jobs WHERE status = 'ready'")
                .await,
            2,
            "the rows went back"
        );
    }
    let script = dir.path().join("no-shebang");
    let log = dir.path().join("ran.log");
    std::fs::write(
        &script,
        format!("echo \"$1 $ROWCLAIM_ID\" >> {}\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = script.to_str().unwrap();
    let args = [
        &["work"],
        FULL.as_slice(),
        &["--until-empty", "--", script, "arg"],
    ]
    .concat();
    let out = output(&t, &args).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut ran: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    ran.sort();
    assert_eq!(ran, ["arg 1", "arg 2"]);
}

/// A database error is said once, with the database's own code and without the server's
/// source-file line numbers (here the database's answer to a `--where` it does not take, which
/// makes it bad input: exit 2).
async fn database_errors_said_once(t: Arc<TestDb>) {
    t.jobs(1).await;
    let args = [&["stats", "--where", "no_such_column = 1"], FULL.as_slice()].concat();
    let out = output(&t, &args).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--where \"no_such_column = 1\""), "{err}");
    assert!(!err.contains(" at line "), "no server source lines: {err}");
    // The database's own words, once.
    let said = match t.backend {
        Backend::Postgres => "SQLSTATE 42703",
        Backend::MySql => "error 1054",
        Backend::Sqlite => "no such column",
    };
    assert_eq!(err.matches(said).count(), 1, "said once: {err}");
}

/// A server that does not answer fails a one-shot command at once, naming what was dialled and
/// what the operating system said, once. (`work` waits for it instead: tests/connect.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_named() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for url in [
        format!("postgres://postgres@127.0.0.1:{port}/x"),
        format!("mysql://root:secret@127.0.0.1:{port}/x"),
    ] {
        let out = tokio::process::Command::new(BIN)
            .args(["--database", &url, "claim", "--table", "t"])
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{err}");
        assert!(err.contains(&format!("at 127.0.0.1:{port}")), "{err}");
        assert_eq!(err.matches("refused").count(), 1, "said once: {err}");
        assert!(!err.contains("secret"), "no password: {err}");
    }
}

/// --source reads the mapping from rowclaim.toml.
async fn config_file(t: Arc<TestDb>) {
    t.jobs(2).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rowclaim.toml"),
        "[source.mail]\ntable = \"jobs\"\nowner-column = \"owner\"\nlease-column = \"lease_until\"\norder-by = \"id desc\"\n",
    )
    .unwrap();
    let out = rowclaim(&t, &["claim", "--source", "mail"])
        .current_dir(dir.path())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(row["id"], 2, "order-by from the file");
    let out = rowclaim(&t, &["claim", "--source", "nope"])
        .current_dir(dir.path())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[source.nope]"));
}

macro_rules! cli_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn several_work_processes_never_run_a_row_twice() {
            with_db($backend, several_workers).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sigkilled_worker_rows_are_finished_by_a_later_worker() {
            with_db($backend, killed_worker).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sigterm_finishes_running_and_releases_waiting_rows() {
            with_db($backend, graceful_shutdown).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn claim_complete_round_trip_and_exit_codes() {
            with_db($backend, claim_round_trip).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bad_input_exits_2_and_names_it() {
            with_db($backend, bad_input).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_command_that_cannot_run_stops_the_worker_naming_it() {
            with_db($backend, command_that_cannot_run).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn database_errors_are_said_once() {
            with_db($backend, database_errors_said_once).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn source_from_config_file() {
            with_db($backend, config_file).await
        }
    };
}

mod postgres {
    cli_cases!(Backend::Postgres);
}
mod mysql {
    cli_cases!(Backend::MySql);
}
mod sqlite {
    cli_cases!(Backend::Sqlite);
}

#[test]
fn demo_drains_a_table_exactly_once() {
    let out = std::process::Command::new(BIN)
        .args(["demo", "--rows", "500", "--workers", "3"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("0 processed twice, 0 left over, 500 done"),
        "{text}"
    );
    assert_eq!(text.matches("worker ").count(), 3, "{text}");
}

/// Which ids each worker process started (`what` = "started") or finished ("done"):
/// `<what>.<worker pid>` files written by the command.
fn ids_by_worker(dir: &Path, what: &str) -> HashMap<String, Vec<String>> {
    let mut by = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if let Some(pid) = name.strip_prefix(what).and_then(|n| n.strip_prefix('.')) {
            let ids = std::fs::read_to_string(&path).unwrap();
            by.insert(pid.to_owned(), ids.lines().map(str::to_owned).collect());
        }
    }
    by
}

/// The managed queue: 5,000 jobs, three `work --queue` processes, one SIGKILLed mid-run and two
/// more started later. Every job ends completed, and a job ran again only where a holder failed:
/// the killed worker held it, or a surviving worker said it lost the job (on a loaded machine a
/// 2 s lease can run out before its renewal lands; that re-run is the at-least-once promise, not
/// a bug).
async fn queue_crash_recovery(t: Arc<TestDb>) {
    const JOBS: usize = 5000;
    assert!(output(&t, &["init"]).await.status.success());
    let lines: String = (0..JOBS).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let mut enqueue = rowclaim(&t, &["enqueue", "--queue", "q"]);
    enqueue
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = enqueue.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, lines.as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "echo \"$ROWCLAIM_ID\" >> {0}/started.$PPID; cat >/dev/null; sleep 0.02; \
         echo \"$ROWCLAIM_ID\" >> {0}/done.$PPID",
        dir.path().display()
    );
    let worker = |group: bool| {
        // -v: a result given up because its lease ran out is said at debug level.
        let mut c = rowclaim(
            &t,
            &[
                "-v",
                "work",
                "--queue",
                "q",
                "--until-empty",
                "--lease",
                "2s",
            ],
        );
        c.args([
            "--concurrency",
            "4",
            "--poll",
            "200ms",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        c.stderr(Stdio::piped());
        if group {
            c.process_group(0);
        }
        c.spawn().expect("start worker")
    };
    let doomed = worker(true);
    let doomed_pid = doomed.id().unwrap().to_string();
    let mut survivors = vec![worker(false), worker(false)];
    // Let the doomed worker get going, then kill it and its commands without warning.
    for _ in 0..400 {
        let started = ids_by_worker(dir.path(), "started");
        if started.get(&doomed_pid).map_or(0, Vec::len) >= 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    std::process::Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{doomed_pid}")])
        .status()
        .unwrap();
    survivors.push(worker(false));
    survivors.push(worker(false));
    // How often the survivors said they lost each job (lease lost, result refused or given up).
    let mut lost: HashMap<String, usize> = HashMap::new();
    // What the survivors said, kept to show with a failure.
    let mut told = String::new();
    for w in survivors {
        let out = w.wait_with_output().await.unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{said}");
        told.push_str(&said);
        for line in said.lines() {
            let Some((_, rest)) = line.split_once("row ") else {
                continue;
            };
            let Some((id, what)) = rest.split_once(':') else {
                continue;
            };
            if [
                "lease was lost",
                "no longer this worker's",
                "given up",
                "not be recorded",
            ]
            .iter()
            .any(|w| what.contains(w))
            {
                *lost.entry(id.to_owned()).or_default() += 1;
            }
        }
    }

    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'")
            .await,
        JOBS as i64
    );
    let by_worker = ids_by_worker(dir.path(), "started");
    let killed: std::collections::HashSet<&String> = by_worker
        .get(&doomed_pid)
        .map(|v| v.iter().collect())
        .unwrap_or_default();
    assert!(!killed.is_empty(), "the killed worker ran jobs");
    let mut runs: HashMap<&String, usize> = HashMap::new();
    for ids in by_worker.values() {
        for id in ids {
            *runs.entry(id).or_default() += 1;
        }
    }
    assert_eq!(runs.len(), JOBS, "every job ran");
    let again: Vec<_> = runs
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| *id)
        .collect();
    // A job the killed worker started and did not finish cannot have completed there, and every
    // job completed: someone ran it again. (Whether the kill found any job running is the
    // scheduler's business, so that is not asserted.)
    let finished: std::collections::HashSet<String> = ids_by_worker(dir.path(), "done")
        .remove(&doomed_pid)
        .unwrap_or_default()
        .into_iter()
        .collect();
    for id in killed.iter().filter(|id| !finished.contains(id.as_str())) {
        assert!(
            runs[*id] >= 2,
            "job {id} was cut off by the kill but never ran again"
        );
    }
    for id in &again {
        let failed_holders =
            usize::from(killed.contains(id)) + lost.get(id.as_str()).copied().unwrap_or(0);
        if runs[id] - 1 > failed_holders {
            // Shown: the lines about this row, and every line that is not about one row.
            let about = format!("row {id}:");
            let told: Vec<&str> = told
                .lines()
                .filter(|l| l.contains(&about) || !l.contains("row "))
                .collect();
            panic!(
                "job {id} ran {} times, but only {failed_holders} of its holders failed (killed \
                 worker held it: {}); the survivors said:\n{}",
                runs[id],
                killed.contains(id),
                told.join("\n")
            );
        }
    }
}

/// enqueue reads JSON lines all or nothing, naming the bad line; work --queue retries a failing
/// job with backoff, then it is dead with its error kept.
async fn queue_cli(t: Arc<TestDb>) {
    let out = output(&t, &["enqueue", "{}"]).await;
    assert_eq!(out.status.code(), Some(2), "before init");
    assert!(String::from_utf8_lossy(&out.stderr).contains("rowclaim init"));
    assert!(output(&t, &["init"]).await.status.success());

    let mut enqueue = rowclaim(&t, &["enqueue", "--queue", "q"]);
    enqueue.stdin(Stdio::piped()).stderr(Stdio::piped());
    let mut child = enqueue.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"{\"a\":1}\n{\"a\":2}\n{\"a\": oops}\n")
        .await
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 3"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
        0,
        "nothing was enqueued"
    );

    let out = output(
        &t,
        &[
            "enqueue",
            "--queue",
            "q",
            "--max-attempts",
            "2",
            "{\"x\":1}",
        ],
    )
    .await;
    assert!(out.status.success());
    let work = [
        "work",
        "--queue",
        "q",
        "--until-empty",
        "--poll",
        "100ms",
        "--",
        "sh",
        "-c",
        "exit 3",
    ];
    let out = output(&t, &work).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "a job died: {err}");
    assert!(err.contains("1 failed, 1 to retry"), "{err}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'dead' AND attempts = 2 AND last_error LIKE '%status 3%'").await,
        1
    );
    let out = output(&t, &["stats", "--json"]).await;
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["by_queue"]["q"]["dead"], 1);
    // Every figure counted: nothing named as an estimate or a lower bound.
    assert_eq!(s["estimated"], serde_json::json!({}), "{s}");
    assert_eq!(s["at_least"], serde_json::json!({}), "{s}");

    let id = t
        .count("SELECT MAX(id) FROM rowclaim_jobs")
        .await
        .to_string();
    let out = output(&t, &["jobs", "retry", &id]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'ready'")
            .await,
        1
    );
    assert!(output(&t, &["jobs", "cancel", &id]).await.status.success());
    let out = output(&t, &["jobs", "cancel", &id]).await;
    assert_eq!(out.status.code(), Some(1), "nothing left to cancel");
    let out = output(&t, &["jobs", "prune", "--older-than", "1h"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'cancelled'")
            .await,
        1
    );

    // --completed delete: completed jobs are gone, the others stay.
    let out = output(&t, &["enqueue", "--queue", "gone", "{}"]).await;
    assert!(out.status.success());
    let work = [
        "work",
        "--queue",
        "gone",
        "--completed",
        "delete",
        "--until-empty",
        "--",
        "true",
    ];
    let out = output(&t, &work).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'gone'")
            .await,
        0
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'cancelled'")
            .await,
        1,
        "other queues' jobs are untouched"
    );
}

/// PostgreSQL LISTEN/NOTIFY: a worker polling only every 60 s starts a new job at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_notify_wakes_an_idle_worker() {
    with_db(Backend::Postgres, |t| async move {
        assert!(output(&t, &["init"]).await.status.success());
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let script = format!("cat > {}", ran.display());
        let mut worker = rowclaim(
            &t,
            &[
                "work", "--queue", "q", "--poll", "60s", "--", "sh", "-c", &script,
            ],
        );
        let worker = worker.stderr(Stdio::piped()).spawn().unwrap();
        // Give the worker time to find the queue empty and start waiting.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let enqueued = std::time::Instant::now();
        assert!(output(&t, &["enqueue", "--queue", "q", "{\"hello\":1}"])
            .await
            .status
            .success());
        while !ran.exists() && enqueued.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let waited = enqueued.elapsed();
        let pid = worker.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        let out = worker.wait_with_output().await.unwrap();
        assert!(
            ran.exists(),
            "the job never ran: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Polling would have started it only after 60 s; notification starts it at once.
        assert!(waited < Duration::from_secs(30), "started after {waited:?}");
        assert_eq!(
            std::fs::read_to_string(&ran).unwrap().trim(),
            "{\"hello\":1}"
        );
    })
    .await
}

/// enqueue of many JSON lines: the first bad line is named however far in it is (and nothing is
/// enqueued, also of the chunks before it, which the database had written by then); a good
/// input gives one id line per job, in the order of the lines, ids ascending. The input spans
/// four of the command's chunks of 20,000 jobs, the bad lines in the third and fourth (parsed by
/// different threads).
async fn queue_enqueue_many_lines(t: Arc<TestDb>) {
    assert!(output(&t, &["init"]).await.status.success());
    let enqueue = |input: String| {
        let t = t.clone();
        async move {
            let mut c = rowclaim(&t, &["enqueue", "--queue", "q", "--priority", "3"]);
            c.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = c.spawn().unwrap();
            let mut stdin = child.stdin.take().unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut stdin, input.as_bytes())
                .await
                .unwrap();
            drop(stdin);
            child.wait_with_output().await.unwrap()
        }
    };
    let line = |i: usize| match i {
        45_001 | 63_999 => "{\"i\": oops}\n".to_owned(),
        _ if i.is_multiple_of(1000) => "\n".to_owned(),
        _ => format!("{{\"i\":{i}}}\n"),
    };
    let bad: String = (1..=65_000).map(line).collect();
    let out = enqueue(bad).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 45001:"), "{err}");
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 0);
    // Lines are kept as their text, not parsed into values; a line a value could not be read
    // from (an escaped lone surrogate, a number past a float's range) is still a bad line,
    // though a look at the text alone lets it through (and SQLite would store it).
    let out = enqueue("{\"i\": 1}\n{\"i\": \"\\ud800\"}\n".to_owned()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 2:"), "{err}");
    let out = enqueue("{\"i\": 1}\n\n{\"i\": 1e400}\n".to_owned()).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 3:"), "{err}");
    assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 0);

    let good: String = (1..=65_000)
        .map(|i| {
            if i == 45_001 || i == 63_999 {
                "{}\n".to_owned()
            } else {
                line(i)
            }
        })
        .collect();
    let out = enqueue(good).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<i64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["existing"], false, "{l}");
            v["id"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(ids.len(), 64_935, "one line per job, blank lines skipped");
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids ascend in input order"
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'q' AND priority = 3")
            .await,
        64_935
    );
}

/// An enqueue that fails at once for another reason (here: the queue not set up) says that
/// reason, though a bad line lies further in, already parsed by then (the command names a bad
/// line only when the enqueue reached it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_says_why_it_failed_not_a_later_bad_line() {
    with_db(Backend::Sqlite, |t| async move {
        let input: String = (1..=65_000)
            .map(|i| match i {
                20_050 => "{oops}\n".to_owned(),
                _ => format!("{{\"i\":{i}}}\n"),
            })
            .collect();
        let out = support::run_fed(&t.url, &["enqueue"], &input).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("rowclaim init"), "{err}");
        assert!(!err.contains("line 20050"), "{err}");
    })
    .await
}

macro_rules! queue_cli_cases {
    ($backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn queue_enqueue_many_lines_all_or_nothing() {
            with_db($backend, queue_enqueue_many_lines).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn queue_workers_survive_a_sigkill() {
            with_db($backend, queue_crash_recovery).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn queue_enqueue_and_retries() {
            with_db($backend, queue_cli).await
        }
    };
}

mod queue_postgres {
    use super::*;
    queue_cli_cases!(Backend::Postgres);
}
mod queue_mysql {
    use super::*;
    queue_cli_cases!(Backend::MySql);
}
mod queue_sqlite {
    use super::*;
    queue_cli_cases!(Backend::Sqlite);
}

/// `rowclaim bench` runs the bench crate's scenarios as before, and `bench worker -- COMMAND`
/// finds this binary to run `rowclaim work` (the bench's own tests are in crates/rowclaim-bench;
/// this one needs the `rowclaim` binary, which only this package's tests are sure to have).
async fn bench_worker_runs_rowclaim_work(t: Arc<TestDb>) {
    let args = [
        "bench", "worker", "--jobs", "40", "--table", "--json", "--", "true",
    ];
    let out = output(&t, &args).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench {args:?} failed: {err}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bench {args:?} printed no JSON ({e}): {err}"));
    assert!(
        r["runner"].as_str().unwrap().contains("rowclaim work"),
        "{r}"
    );
    let rate = r["jobs_per_second"].as_f64().unwrap_or(0.0);
    let secs = r["seconds"].as_f64().unwrap_or(0.0);
    assert!((rate * secs - 40.0).abs() < 0.5, "{r}");
    let out = output(&t, &["bench", "drain", "--rows", "0"]).await;
    assert_eq!(out.status.code(), Some(2), "bad bench input exits 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_worker_command_sqlite() {
    with_db(Backend::Sqlite, bench_worker_runs_rowclaim_work).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_worker_command_postgres() {
    with_db(Backend::Postgres, bench_worker_runs_rowclaim_work).await
}
