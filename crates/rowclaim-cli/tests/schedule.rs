//! Schedules from `rowclaim.toml` as processes on every backend: three `rowclaim work --queue`
//! processes running one every-second schedule enqueue each tick exactly once and leave none
//! out; `schedule run`, `schedule list` (text and `--json`) and `schedule forget`; a schedule
//! removed from the config stops firing; config errors named, exit 2.

use rowclaim_testkit as common;
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};

fn rowclaim(t: &TestDb, dir: &Path, args: &[&str]) -> tokio::process::Command {
    let mut c = support::rowclaim(&t.url, args);
    c.current_dir(dir);
    c
}

async fn output(t: &TestDb, dir: &Path, args: &[&str]) -> Output {
    rowclaim(t, dir, args).output().await.expect("run rowclaim")
}

async fn ok(t: &TestDb, dir: &Path, args: &[&str]) -> String {
    let out = output(t, dir, args).await;
    assert!(
        out.status.success(),
        "rowclaim {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits (at most 3 minutes: the suite runs on a loaded machine) until `sql` counts `n`.
async fn wait_for_count(t: &TestDb, sql: &str, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    while t.count(sql).await < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 3 minutes for {n} of {sql}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The ticks (epoch seconds) in the unique keys of `schedule`'s jobs.
async fn ticks_of(t: &TestDb, schedule: &str) -> Vec<i64> {
    let prefix = format!("schedule:{schedule}:");
    t.strings(&format!(
        "SELECT unique_key FROM rowclaim_jobs WHERE unique_key LIKE '{prefix}%' ORDER BY id"
    ))
    .await
    .into_iter()
    .map(|k| {
        k.and_then(|k| k.strip_prefix(&prefix).and_then(|s| s.parse().ok()))
            .expect("a tick in the unique key")
    })
    .collect()
}

fn once_each_and_contiguous(ticks: &[i64]) {
    let mut counts = BTreeMap::new();
    for t in ticks {
        *counts.entry(*t).or_insert(0) += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "ticks enqueued more than once: {twice:?}");
    let sorted: Vec<i64> = counts.into_keys().collect();
    for pair in sorted.windows(2) {
        assert_eq!(pair[1] - pair[0], 1, "a tick is missing: {sorted:?}");
    }
}

fn sigterm(child: &tokio::process::Child) {
    let pid = child.id().expect("a running process").to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
}

async fn finish(child: tokio::process::Child) -> Output {
    tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .expect("rowclaim stops within 3 minutes")
        .expect("wait for rowclaim")
}

const TICK: &str =
    "[schedule.tick]\nevery = \"1s\"\nqueue = \"ticks\"\npayload = { from = \"config\" }\n";

/// The proof, as processes: three `rowclaim work --queue ticks` run the config's
/// every-second schedule beside their workers; each tick is enqueued once, none is left out
/// while they run, and the workers run the jobs.
async fn three_work_processes(t: Arc<TestDb>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rowclaim.toml"), TICK).unwrap();
    ok(&t, dir.path(), &["init"]).await;
    let mut workers = Vec::new();
    for _ in 0..3 {
        let mut cmd = rowclaim(
            &t,
            dir.path(),
            &[
                "work",
                "--queue",
                "ticks",
                "--poll",
                "200ms",
                "--",
                "sh",
                "-c",
                "cat >/dev/null",
            ],
        );
        cmd.stderr(Stdio::piped());
        workers.push(cmd.spawn().expect("start a worker"));
    }
    let keyed = "SELECT COUNT(*) FROM rowclaim_jobs WHERE unique_key LIKE 'schedule:tick:%'";
    wait_for_count(&t, keyed, 8).await;
    for w in &workers {
        sigterm(w);
    }
    for w in workers {
        let out = finish(w).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "a worker failed: {err}");
        assert!(
            err.contains("running 1 schedule(s) of rowclaim.toml: tick"),
            "{err}"
        );
    }
    let ticks = ticks_of(&t, "tick").await;
    assert!(ticks.len() >= 8, "{ticks:?}");
    once_each_and_contiguous(&ticks);
    assert!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'")
            .await
            >= 5,
        "the workers ran the scheduled jobs"
    );
}

/// Moves a stored schedule's next tick two minutes into the past (as if no scheduler ran it).
async fn two_minutes_late(t: &TestDb, name: &str) {
    t.exec(&match t.backend {
        Backend::Postgres => format!(
            "UPDATE rowclaim_schedules SET next_tick = now() - interval '2 minutes' \
             WHERE name = '{name}'"
        ),
        Backend::MySql => format!(
            "UPDATE rowclaim_schedules SET next_tick = UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE \
             WHERE name = '{name}'"
        ),
        Backend::Sqlite => format!(
            "UPDATE rowclaim_schedules SET next_tick = \
             CAST(unixepoch('subsec') * 1000 AS INTEGER) - 120000 WHERE name = '{name}'"
        ),
    })
    .await;
}

/// `schedule run` registers and runs the config's schedules until SIGTERM; `schedule list`
/// shows them (text and JSON lines); a schedule removed from the config no longer fires when
/// the scheduler runs again, shows as overdue, and `schedule forget` removes it.
async fn run_list_forget(t: Arc<TestDb>) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rowclaim.toml");
    let nightly = "[schedule.nightly]\ncron = \"0 3 * * *\"\nzone = \"Europe/Paris\"\n\
                   queue = \"reports\"\ncatch-up = \"all\"\n";
    std::fs::write(&config, format!("{TICK}\n{nightly}")).unwrap();
    ok(&t, dir.path(), &["init"]).await;
    let empty = output(&t, dir.path(), &["schedule", "list"]).await;
    assert!(empty.status.success());
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no schedules are stored"));

    let mut cmd = rowclaim(&t, dir.path(), &["schedule", "run", "--json"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let scheduler = cmd.spawn().unwrap();
    let keyed = "SELECT COUNT(*) FROM rowclaim_jobs WHERE unique_key LIKE 'schedule:tick:%'";
    wait_for_count(&t, keyed, 3).await;
    sigterm(&scheduler);
    let out = finish(scheduler).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the summary as JSON");
    let ticked = ticks_of(&t, "tick").await;
    assert_eq!(summary["enqueued"], ticked.len() as u64, "{summary}");

    let lines: Vec<serde_json::Value> = ok(&t, dir.path(), &["schedule", "list", "--json"])
        .await
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    let (n, k) = (&lines[0], &lines[1]);
    assert_eq!(
        (
            &n["name"],
            &n["expression"],
            &n["zone"],
            &n["queue"],
            &n["kind"],
            &n["catch_up"]
        ),
        (
            &"nightly".into(),
            &"0 3 * * *".into(),
            &"Europe/Paris".into(),
            &"reports".into(),
            &"nightly".into(),
            &"all".into()
        )
    );
    assert!(n["last_tick"].is_null() && n["last_job"].is_null(), "{n}");
    assert_eq!(n["overdue"], false);
    assert_eq!(
        (&k["name"], &k["expression"], &k["zone"], &k["queue"]),
        (
            &"tick".into(),
            &"every 1s".into(),
            &serde_json::Value::Null,
            &"ticks".into()
        )
    );
    let last = *ticked.iter().max().unwrap();
    let last_at: humantime::Timestamp = k["last_tick"].as_str().unwrap().parse().unwrap();
    let last_secs = std::time::SystemTime::from(last_at)
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert_eq!(last_secs, last, "{k}");
    assert!(k["last_job"].is_i64() && k["next_tick"].is_string(), "{k}");

    let text = ok(&t, dir.path(), &["schedule", "list"]).await;
    let rows: Vec<&str> = text.lines().collect();
    assert!(
        rows[0].starts_with("name") && rows[0].contains("next tick"),
        "{text}"
    );
    assert!(
        rows[1].starts_with("nightly") && rows[1].contains("Europe/Paris"),
        "{text}"
    );
    assert!(
        rows[2].starts_with("tick") && rows[2].contains("every 1s"),
        "{text}"
    );

    // tick is removed from the config, tock added: the scheduler runs tock, never tick.
    let before = ticked.len();
    std::fs::write(
        &config,
        format!("{nightly}\n[schedule.tock]\nevery = \"1s\"\nqueue = \"ticks\"\n"),
    )
    .unwrap();
    let mut cmd = rowclaim(&t, dir.path(), &["schedule", "run", "--queue", "ticks"]);
    cmd.stderr(Stdio::piped());
    let scheduler = cmd.spawn().unwrap();
    let tocks = "SELECT COUNT(*) FROM rowclaim_jobs WHERE unique_key LIKE 'schedule:tock:%'";
    wait_for_count(&t, tocks, 3).await;
    sigterm(&scheduler);
    let out = finish(scheduler).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("running 1 schedule(s) of rowclaim.toml: tock"),
        "{err}"
    );
    assert_eq!(
        ticks_of(&t, "tick").await.len(),
        before,
        "a removed schedule fired"
    );

    two_minutes_late(&t, "tick").await;
    let text = ok(&t, dir.path(), &["schedule", "list"]).await;
    let tick_row = text.lines().find(|l| l.starts_with("tick ")).unwrap();
    assert!(tick_row.contains("overdue: no scheduler runs it"), "{text}");
    ok(&t, dir.path(), &["schedule", "forget", "tick"]).await;
    let again = output(&t, dir.path(), &["schedule", "forget", "tick"]).await;
    assert_eq!(again.status.code(), Some(1));
    let names: Vec<String> = ok(&t, dir.path(), &["schedule", "list", "--json"])
        .await
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["name"].to_string())
        .collect();
    assert_eq!(names, ["\"nightly\"", "\"tock\""]);
}

/// A bad schedule in the config stops `work --queue` and `schedule run` before anything runs,
/// naming the file, the schedule and the field (exit 2); `--no-schedules` does not read them.
async fn config_errors(t: Arc<TestDb>) {
    let dir = tempfile::tempdir().unwrap();
    ok(&t, dir.path(), &["init"]).await;
    std::fs::write(
        dir.path().join("rowclaim.toml"),
        "[schedule.nightly]\ncron = \"0 3 * * *\"\nzone = \"Europe/Pariss\"\nqueue = \"q\"\n",
    )
    .unwrap();
    for args in [
        &["work", "--queue", "q", "--until-empty", "--", "true"][..],
        &["schedule", "run"][..],
    ] {
        let out = output(&t, dir.path(), args).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(
                "rowclaim.toml: [schedule.nightly] zone \"Europe/Pariss\" is not a known IANA \
                 time zone"
            ),
            "{args:?}: {err}"
        );
    }
    let out = output(
        &t,
        dir.path(),
        &[
            "work",
            "--queue",
            "q",
            "--until-empty",
            "--no-schedules",
            "--",
            "true",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(
        dir.path().join("rowclaim.toml"),
        "[schedule.nightly]\ncron = \"0 3 * * * * * *\"\n",
    )
    .unwrap();
    let out = output(&t, dir.path(), &["schedule", "run"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("[schedule.nightly] cron \"0 3 * * * * * *\" is not a cron expression"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

macro_rules! schedule_cli_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn three_work_processes_enqueue_each_tick_once() {
            with_db($backend, three_work_processes).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn schedule_run_list_and_forget() {
            with_db($backend, run_list_forget).await
        }
    };
}

mod postgres {
    schedule_cli_cases!(Backend::Postgres);
}
mod mysql {
    schedule_cli_cases!(Backend::MySql);
}
mod sqlite {
    schedule_cli_cases!(Backend::Sqlite);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bad_schedules_are_named_and_exit_2() {
        with_db(Backend::Sqlite, config_errors).await
    }
}
