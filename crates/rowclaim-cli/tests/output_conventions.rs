//! The command line's conventions, the same on every database (issue 12): one JSON shape for
//! jobs, `--json` for every command that reports a result, the failing command's stderr kept with
//! its job, `--kind`, what `--until-empty` leaves scheduled, and uniform validation of counts and
//! durations.

use rowclaim_testkit as common;
mod support;

use std::collections::BTreeSet;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use common::{with_db, Backend, TestDb};

fn rowclaim(t: &TestDb, args: &[&str]) -> tokio::process::Command {
    support::rowclaim(&t.url, args)
}

async fn output(t: &TestDb, args: &[&str]) -> Output {
    rowclaim(t, args).output().await.expect("run rowclaim")
}

/// Runs `rowclaim ARGS…`, which must succeed; its stdout.
async fn ok(t: &TestDb, args: &[&str]) -> String {
    let out = output(t, args).await;
    assert!(
        out.status.success(),
        "rowclaim {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// "2026-11-23T10:00:00.123Z": RFC 3339, UTC, milliseconds.
fn is_rfc3339_utc_ms(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    b.len() == 24
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && b[23] == b'Z'
}

fn at(v: &serde_json::Value) -> SystemTime {
    humantime::parse_rfc3339(v.as_str().expect("a time")).expect("RFC 3339")
}

const TIMES: [&str; 5] = [
    "run_at",
    "created_at",
    "finished_at",
    "lease_until",
    "attempted_at",
];

/// The same jobs on one database, in the states a job can be in (ready, delayed, running, dead):
/// `jobs list` and `jobs show` as JSON.
async fn jobs_as_json(t: Arc<TestDb>) -> (Vec<serde_json::Value>, serde_json::Value) {
    ok(&t, &["init"]).await;
    ok(&t, &["enqueue", "--queue", "q", "--kind", "a", "{\"n\":1}"]).await;
    let delayed = [
        "enqueue",
        "--queue",
        "q",
        "--kind",
        "b",
        "--delay",
        "5m",
        "--unique-key",
        "k1",
        "--timeout",
        "90s",
        "--priority",
        "3",
        "{\"n\":2}",
    ];
    ok(&t, &delayed).await;
    ok(
        &t,
        &[
            "enqueue",
            "--queue",
            "doomed",
            "--max-attempts",
            "1",
            "[1,2]",
        ],
    )
    .await;
    ok(&t, &["enqueue", "--queue", "held", "\"text\""]).await;
    // A dead job (finished, with its error) and a running one (owner and lease).
    let out = output(
        &t,
        &[
            "work",
            "--queue",
            "doomed",
            "--until-empty",
            "--",
            "sh",
            "-c",
            "exit 7",
        ],
    )
    .await;
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(&t, &["claim", "--queue", "held", "--lease", "10m"]).await;

    let list = json_lines(&ok(&t, &["jobs", "list"]).await);
    let show: serde_json::Value =
        serde_json::from_str(&ok(&t, &["jobs", "show", "2"]).await).expect("show is JSON");
    (list, show)
}

/// `jobs list` and `jobs show` give the same keys on PostgreSQL, MariaDB and SQLite, times as
/// RFC 3339 in UTC with milliseconds, payloads as JSON, and no column of rowclaim's own making.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_have_one_json_shape_on_every_database() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    for backend in [Backend::Sqlite, Backend::Postgres, Backend::MySql] {
        let seen = seen.clone();
        with_db(backend, move |t| async move {
            let got = jobs_as_json(t).await;
            seen.lock().unwrap().push((backend, got));
        })
        .await;
    }
    let seen = seen.lock().unwrap();
    let keys = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_object().expect("an object").keys().cloned().collect()
    };
    let expected: BTreeSet<String> = [
        "id",
        "queue",
        "kind",
        "status",
        "payload",
        "priority",
        "attempts",
        "max_attempts",
        "run_at",
        "created_at",
        "finished_at",
        "lease_until",
        "owner",
        "unique_key",
        "last_error",
        "timeout_ms",
        "output",
        "limit_key",
        "attempted_at",
        "errors",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    for (backend, (list, show)) in seen.iter() {
        assert_eq!(list.len(), 4, "{backend:?}: {list:?}");
        // `jobs show` adds what the job waits for, what waits for it, and whether it runs
        // anyway.
        let mut shown = expected.clone();
        shown.extend(["waits_for", "waited_by", "run_anyway"].map(str::to_owned));
        assert_eq!(keys(show), shown, "{backend:?}: {show}");
        for job in list.iter().chain([show]) {
            let mut job = job.clone();
            if let Some(o) = job.as_object_mut() {
                o.remove("waits_for");
                o.remove("waited_by");
                o.remove("run_anyway");
            }
            let job = &job;
            assert_eq!(keys(job), expected, "{backend:?}: {job}");
            for k in TIMES {
                let v = &job[k];
                assert!(
                    v.is_null() || v.as_str().is_some_and(is_rfc3339_utc_ms),
                    "{backend:?}: {k} = {v}"
                );
            }
        }
        let by_queue = |q: &str| list.iter().find(|j| j["queue"] == q).expect(q);
        // Newest first, ids as enqueued.
        let ids: Vec<i64> = list.iter().map(|j| j["id"].as_i64().unwrap()).collect();
        assert_eq!(ids, [4, 3, 2, 1], "{backend:?}");

        let ready = by_queue("q");
        assert_eq!(ready["payload"], serde_json::json!({"n": 2}), "{backend:?}");
        let mut as_listed = show.clone();
        if let Some(o) = as_listed.as_object_mut() {
            assert_eq!(
                o.remove("waits_for"),
                Some(serde_json::json!([])),
                "{backend:?}"
            );
            assert_eq!(
                o.remove("waited_by"),
                Some(serde_json::json!([])),
                "{backend:?}"
            );
            assert_eq!(
                o.remove("run_anyway"),
                Some(serde_json::json!(false)),
                "{backend:?}"
            );
        }
        assert_eq!(
            &as_listed, ready,
            "{backend:?}: show is the same job as list"
        );
        assert_eq!(ready["status"], "ready");
        assert_eq!(ready["priority"], 3);
        assert_eq!(ready["timeout_ms"], 90_000);
        assert_eq!(ready["unique_key"], "k1");
        // --delay 5m counts from the enqueue, by the database's clock (one statement's now).
        let delay = at(&ready["run_at"])
            .duration_since(at(&ready["created_at"]))
            .expect("run_at after created_at");
        assert_eq!(delay, Duration::from_secs(300), "{backend:?}");

        let dead = by_queue("doomed");
        assert_eq!(dead["status"], "dead", "{backend:?}");
        assert_eq!(dead["payload"], serde_json::json!([1, 2]));
        assert!(dead["finished_at"].is_string(), "{backend:?}: {dead}");
        assert!(
            dead["last_error"].as_str().is_some_and(|e| e.contains('7')),
            "{dead}"
        );
        // Its one failed attempt, kept with its error and times.
        let errors = dead["errors"].as_array().expect("errors is a list");
        assert_eq!(errors.len(), 1, "{backend:?}: {dead}");
        assert_eq!(errors[0]["attempt"], 1, "{backend:?}: {dead}");
        assert!(
            errors[0]["error"]
                .as_str()
                .is_some_and(|e| e.contains("status 7")),
            "{backend:?}: {dead}"
        );
        for k in ["started_at", "ended_at"] {
            assert!(
                errors[0][k].as_str().is_some_and(is_rfc3339_utc_ms),
                "{backend:?}: {k} in {dead}"
            );
        }
        assert!(at(&errors[0]["started_at"]) <= at(&errors[0]["ended_at"]));
        assert_eq!(ready["errors"], serde_json::json!([]), "{backend:?}");

        let running = by_queue("held");
        assert_eq!(running["status"], "running", "{backend:?}");
        assert_eq!(running["payload"], "text");
        assert!(running["owner"].is_string() && running["lease_until"].is_string());
        assert!(at(&running["lease_until"]) > at(&running["created_at"]));
    }
    // And the same on all three: the keys of every job, and each job's value types.
    let shape = |list: &Vec<serde_json::Value>| -> Vec<Vec<(String, &'static str)>> {
        list.iter()
            .map(|j| {
                j.as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| {
                        let ty = match v {
                            serde_json::Value::Null => "null",
                            serde_json::Value::Bool(_) => "bool",
                            serde_json::Value::Number(_) => "number",
                            serde_json::Value::String(_) => "string",
                            serde_json::Value::Array(_) => "array",
                            serde_json::Value::Object(_) => "object",
                        };
                        (k.clone(), ty)
                    })
                    .collect()
            })
            .collect()
    };
    let first = shape(&seen[0].1 .0);
    for (backend, (list, _)) in seen.iter().skip(1) {
        assert_eq!(shape(list), first, "{backend:?} differs from SQLite");
    }
}

/// An unknown --status is refused, naming the flag and the states there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_list_refuses_an_unknown_status() {
    with_db(Backend::Sqlite, |t| async move {
        ok(&t, &["init"]).await;
        let out = output(&t, &["jobs", "list", "--status", "bogus"]).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--status") && err.contains("cancelled"),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    })
    .await
}

/// `jobs list --kind` lists jobs of those kinds only (repeated or as a comma list).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_list_by_kind() {
    with_db(Backend::Sqlite, |t| async move {
        ok(&t, &["init"]).await;
        for kind in ["a", "b", "c", "a"] {
            ok(&t, &["enqueue", "--kind", kind, "{}"]).await;
        }
        let kinds = |args: &'static [&'static str]| {
            let t = t.clone();
            async move {
                let mut all = vec!["jobs", "list"];
                all.extend(args);
                let mut got: Vec<String> = json_lines(&ok(&t, &all).await)
                    .iter()
                    .map(|j| j["kind"].as_str().unwrap().to_owned())
                    .collect();
                got.sort();
                got
            }
        };
        assert_eq!(kinds(&["--kind", "a"]).await, ["a", "a"]);
        assert_eq!(kinds(&["--kind", "a,c"]).await, ["a", "a", "c"]);
        assert_eq!(kinds(&["--kind", "b", "--kind", "c"]).await, ["b", "c"]);
        assert!(kinds(&["--kind", "zzz"]).await.is_empty());
    })
    .await
}

/// The last line of stdout as JSON.
fn last_json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_else(|| {
        panic!(
            "nothing on stdout; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// `--json` on init, complete, fail, release, extend and the `work` summary: one JSON object on
/// stdout; without it stdout stays empty (the human line is on stderr).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_result_can_be_json() {
    with_db(Backend::Sqlite, |t| async move {
        let out = output(&t, &["init", "--json"]).await;
        assert!(out.status.success());
        let said = last_json(&out);
        assert_eq!(said["ready"], true);
        assert!(
            said["server"]
                .as_str()
                .is_some_and(|s| s.contains("SQLite")),
            "{said}"
        );
        assert!(
            output(&t, &["init"]).await.stdout.is_empty(),
            "human output by default"
        );

        t.jobs(4).await;
        let claimed = json_lines(
            &ok(
                &t,
                &[&["claim", "--batch", "4"], &support::TABLE[..]].concat(),
            )
            .await,
        );
        let token = claimed[0]["token"].as_str().unwrap().to_owned();
        let settle = |verb: &'static str, id: &'static str, extra: &'static [&'static str]| {
            let (t, token) = (t.clone(), token.clone());
            async move {
                let mut args = vec![verb, "--token", &token, "--id", id, "--json"];
                args.extend(extra);
                args.extend(support::TABLE);
                let out = output(&t, &args).await;
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                last_json(&out)
            }
        };
        let expect =
            |action: &str| serde_json::json!({"action": action, "rows": 1, "token": token});
        assert_eq!(
            settle("extend", "1", &["--lease", "5m"]).await,
            expect("extended")
        );
        assert_eq!(settle("complete", "1", &[]).await, expect("completed"));
        assert_eq!(settle("fail", "2", &[]).await, expect("failed"));
        assert_eq!(settle("release", "3", &[]).await, expect("released"));
        let human = [
            &["complete", "--token", &token, "--id", "4"],
            &support::TABLE[..],
        ]
        .concat();
        assert!(output(&t, &human).await.stdout.is_empty());
        assert_eq!(
            t.count("SELECT COUNT(*) FROM jobs WHERE status = 'done'")
                .await,
            2
        );

        // work: the command's own stdout comes first, the summary is the last line.
        for payload in ["{\"ok\":1}", "{\"ok\":2}", "{\"ok\":0}"] {
            ok(
                &t,
                &["enqueue", "--queue", "w", "--max-attempts", "1", payload],
            )
            .await;
        }
        let script = "echo from-the-command; grep -q '\"ok\":0' && exit 1; exit 0";
        let out = output(
            &t,
            &[
                "work",
                "--queue",
                "w",
                "--until-empty",
                "--json",
                "--",
                "sh",
                "-c",
                script,
            ],
        )
        .await;
        assert_eq!(out.status.code(), Some(5), "a job died");
        assert!(String::from_utf8_lossy(&out.stdout).contains("from-the-command"));
        let summary = last_json(&out);
        assert_eq!(summary["done"], 2, "{summary}");
        assert_eq!(summary["failed"], 1, "{summary}");
        for key in [
            "retried",
            "released",
            "lost",
            "given_up",
            "finished_later",
            "unconfirmed",
            "outages",
        ] {
            assert_eq!(summary[key], 0, "{key}: {summary}");
        }
        assert_eq!(summary["interrupted"], false);
    })
    .await
}

/// A failing command's stderr still reaches the terminal, and its end is kept in the job's
/// `last_error` after the exit status (the first of it cut off beyond 2 KiB).
async fn stderr_tail_kept(t: Arc<TestDb>) {
    ok(&t, &["init"]).await;
    ok(
        &t,
        &["enqueue", "--queue", "s", "--max-attempts", "1", "{}"],
    )
    .await;
    ok(
        &t,
        &["enqueue", "--queue", "long", "--max-attempts", "1", "{}"],
    )
    .await;
    let out = output(
        &t,
        &[
            "work",
            "--queue",
            "s",
            "--until-empty",
            "--",
            "sh",
            "-c",
            "echo 'first line' >&2; echo 'disk full: /var/x' >&2; exit 7",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(5));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("disk full: /var/x"),
        "stderr still shown: {err}"
    );
    let shown: serde_json::Value =
        serde_json::from_str(&ok(&t, &["jobs", "show", "1"]).await).unwrap();
    assert_eq!(
        shown["last_error"], "sh exited with status 7: first line\ndisk full: /var/x",
        "{shown}"
    );

    // 5000 bytes of stderr: the last 2 KiB are kept, marked as cut, ending with the last line.
    let out = output(
        &t,
        &[
            "work", "--queue", "long", "--until-empty", "--", "sh", "-c",
            "i=0; while [ $i -lt 100 ]; do echo \"line $i ........................................\" >&2; i=$((i+1)); done; exit 3",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(5));
    let shown: serde_json::Value =
        serde_json::from_str(&ok(&t, &["jobs", "show", "2"]).await).unwrap();
    let e = shown["last_error"].as_str().unwrap();
    let (head, tail) = e.split_once(": …").expect("status, then the cut tail");
    assert_eq!(head, "sh exited with status 3");
    assert!(
        tail.ends_with("line 99 ........................................"),
        "{e}"
    );
    assert!(tail.len() <= 2048 && tail.len() > 1900, "{}", tail.len());
    assert!(!tail.contains("line 0 "), "the start is cut off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_tail_kept_sqlite() {
    with_db(Backend::Sqlite, stderr_tail_kept).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_tail_kept_postgres() {
    with_db(Backend::Postgres, stderr_tail_kept).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_tail_kept_mysql() {
    with_db(Backend::MySql, stderr_tail_kept).await
}

/// `work --queue Q --kind …` runs only jobs of those kinds and never claims the others (their
/// attempts stay 0); the command gets $ROWCLAIM_KIND, $ROWCLAIM_QUEUE and $ROWCLAIM_ATTEMPT.
async fn work_by_kind(t: Arc<TestDb>) {
    ok(&t, &["init"]).await;
    for kind in ["a", "b", "c", "b", "a"] {
        ok(&t, &["enqueue", "--queue", "k", "--kind", kind, "{}"]).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ran.log");
    let script = format!(
        "cat >/dev/null; echo \"$ROWCLAIM_ID $ROWCLAIM_KIND $ROWCLAIM_QUEUE $ROWCLAIM_ATTEMPT\" >> {}",
        log.display()
    );
    let out = output(
        &t,
        &[
            "work",
            "--queue",
            "k",
            "--kind",
            "a,c",
            "--until-empty",
            "--batch",
            "5",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .await;
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
    assert_eq!(ran, ["1 a k 1", "3 c k 1", "5 a k 1"]);
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE kind = 'b' AND status = 'ready' AND attempts = 0 AND owner IS NULL")
            .await,
        2,
        "jobs of other kinds were never claimed"
    );
    // Repeated --kind works too, and runs what is left.
    let out = output(
        &t,
        &[
            "work",
            "--queue",
            "k",
            "--kind",
            "x",
            "--kind",
            "b",
            "--until-empty",
            "--",
            "true",
        ],
    )
    .await;
    assert!(out.status.success());
    assert_eq!(
        t.count("SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'completed'")
            .await,
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_by_kind_sqlite() {
    with_db(Backend::Sqlite, work_by_kind).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_by_kind_postgres() {
    with_db(Backend::Postgres, work_by_kind).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_by_kind_mysql() {
    with_db(Backend::MySql, work_by_kind).await
}

/// --kind is for the managed queue: on an own table it is refused, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_kind_needs_a_queue() {
    with_db(Backend::Sqlite, |t| async move {
        t.jobs(1).await;
        let args = [
            &["work", "--kind", "a"],
            &support::TABLE[..],
            &["--", "true"],
        ]
        .concat();
        let out = output(&t, &args).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("--kind"), "{err}");
    })
    .await
}

/// `--until-empty` says how many jobs it leaves scheduled for later and when the next is due (also
/// in --json); `--wait-scheduled` waits for them and runs them.
async fn until_empty_and_scheduled_jobs(t: Arc<TestDb>) {
    ok(&t, &["init"]).await;
    ok(&t, &["enqueue", "--queue", "later", "{}"]).await;
    ok(&t, &["enqueue", "--queue", "later", "--delay", "2h", "{}"]).await;
    ok(
        &t,
        &[
            "enqueue", "--queue", "later", "--delay", "1h", "--kind", "slow", "{}",
        ],
    )
    .await;
    ok(
        &t,
        &["enqueue", "--queue", "elsewhere", "--delay", "1s", "{}"],
    )
    .await;
    let out = output(
        &t,
        &[
            "work",
            "--queue",
            "later",
            "--until-empty",
            "--json",
            "--",
            "true",
        ],
    )
    .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let listed = json_lines(
        &ok(
            &t,
            &["jobs", "list", "--queue", "later", "--status", "ready"],
        )
        .await,
    );
    let next = listed
        .iter()
        .map(|j| j["run_at"].as_str().unwrap().to_owned())
        .min()
        .unwrap();
    assert!(
        err.contains(&format!("2 job(s) scheduled later (next at {next}")),
        "{err}"
    );
    let summary = last_json(&out);
    assert_eq!(summary["done"], 1, "{summary}");
    assert_eq!(
        summary["scheduled_later"], 2,
        "other queues are not counted: {summary}"
    );
    assert_eq!(summary["next_scheduled_at"], next.as_str());

    // --wait-scheduled: a job due in a second runs too; with --kind, the others are not waited
    // for.
    ok(
        &t,
        &[
            "enqueue", "--queue", "later", "--delay", "1s", "--kind", "soon", "{}",
        ],
    )
    .await;
    let out = output(
        &t,
        &[
            "work",
            "--queue",
            "later",
            "--kind",
            "soon",
            "--until-empty",
            "--wait-scheduled",
            "--poll",
            "200ms",
            "--json",
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
    let summary = last_json(&out);
    assert_eq!(summary["done"], 1, "{summary}");
    assert_eq!(summary["scheduled_later"], 0, "{summary}");
    assert!(summary["next_scheduled_at"].is_null());
    assert_eq!(
        t.count(
            "SELECT COUNT(*) FROM rowclaim_jobs WHERE queue = 'later' AND status = 'completed'"
        )
        .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_empty_scheduled_sqlite() {
    with_db(Backend::Sqlite, until_empty_and_scheduled_jobs).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_empty_scheduled_postgres() {
    with_db(Backend::Postgres, until_empty_and_scheduled_jobs).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_empty_scheduled_mysql() {
    with_db(Backend::MySql, until_empty_and_scheduled_jobs).await
}

/// --wait-scheduled only means something with --until-empty and the managed queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_scheduled_is_refused_where_it_means_nothing() {
    with_db(Backend::Sqlite, |t| async move {
        t.jobs(1).await;
        for args in [
            vec!["work", "--queue", "q", "--wait-scheduled", "--", "true"],
            [
                &["work", "--until-empty", "--wait-scheduled"],
                &support::TABLE[..],
                &["--", "true"],
            ]
            .concat(),
        ] {
            let out = output(&t, &args).await;
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(
                err.contains("--wait-scheduled") || err.contains("--until-empty"),
                "{err}"
            );
        }
    })
    .await
}

/// Every count must be at least 1 and every duration longer than zero (a negative one reaches
/// the check rather than passing for a flag); each refusal exits 2 and names the flag. Nothing
/// runs: the refusals come before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_durations_are_checked_alike() {
    with_db(Backend::Sqlite, |t| async move {
        ok(&t, &["init"]).await;
        let work = |flag: &'static str, v: &'static str| {
            vec![
                "work",
                "--queue",
                "q",
                flag,
                v,
                "--until-empty",
                "--",
                "true",
            ]
        };
        let cases: Vec<(Vec<&str>, &str, &str)> = vec![
            (work("--batch", "0"), "--batch", "at least 1"),
            (work("--batch", "-3"), "--batch", "at least 1"),
            (work("--concurrency", "0"), "--concurrency", "at least 1"),
            (work("--concurrency", "-1"), "--concurrency", "at least 1"),
            (work("--prefetch", "-1"), "--prefetch", "at least 0"),
            (work("--lease", "-5s"), "--lease", "must be positive"),
            (work("--lease", "0s"), "--lease", "must be positive"),
            (work("--timeout", "-1m"), "--timeout", "must be positive"),
            (work("--poll", "0ms"), "--poll", "must be positive"),
            (
                work("--kill-after", "-1s"),
                "--kill-after",
                "must be positive",
            ),
            (
                work("--give-up-after", "0s"),
                "--give-up-after",
                "must be positive",
            ),
            (work("--grace", "-1s"), "--grace", "must be positive"),
            (work("--lease", "soon"), "--lease", "e.g. 30s"),
            (
                vec!["claim", "--queue", "q", "--batch", "0"],
                "--batch",
                "at least 1",
            ),
            (
                vec!["claim", "--queue", "q", "--lease", "-5s"],
                "--lease",
                "must be positive",
            ),
            (
                vec!["extend", "--queue", "q", "--token", "x", "--lease", "-1s"],
                "--lease",
                "must be positive",
            ),
            (
                vec!["enqueue", "--max-attempts", "0", "{}"],
                "--max-attempts",
                "at least 1",
            ),
            (
                vec!["enqueue", "--delay", "-5m", "{}"],
                "--delay",
                "must be positive",
            ),
            (
                vec!["enqueue", "--timeout", "0s", "{}"],
                "--timeout",
                "must be positive",
            ),
            (
                vec!["jobs", "list", "--limit", "0"],
                "--limit",
                "at least 1",
            ),
            (
                vec!["jobs", "prune", "--older-than", "-1d"],
                "--older-than",
                "must be positive",
            ),
            (vec!["demo", "--workers", "0"], "--workers", "at least 1"),
            (vec!["demo", "--rows", "-10"], "--rows", "at least 1"),
        ];
        for (args, flag, said) in cases {
            let out = output(&t, &args).await;
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(flag) && err.contains(said), "{args:?}: {err}");
        }
        // Zero is allowed where it means something: no grace, no delay, everything finished.
        ok(&t, &["enqueue", "--delay", "0s", "{}"]).await;
        ok(
            &t,
            &[
                "work",
                "--queue",
                "default",
                "--grace",
                "0s",
                "--until-empty",
                "--",
                "true",
            ],
        )
        .await;
        ok(&t, &["jobs", "prune", "--older-than", "0s"]).await;
        assert_eq!(
            t.count("SELECT COUNT(*) FROM rowclaim_jobs").await,
            0,
            "nothing was enqueued but the one job, since pruned"
        );
    })
    .await
}

/// `demo` makes its own database: a --database on its command line is refused, naming it (it
/// was silently ignored), while a DATABASE_URL in the environment is not in the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_refuses_a_database_it_would_ignore() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs.db");
    let url = format!("sqlite://{}", theirs.display());
    let out = std::process::Command::new(support::BIN)
        .args(["--database", &url, "demo", "--rows", "10"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--database") && err.contains("--keep"),
        "{err}"
    );
    assert!(!theirs.exists(), "nothing was made");

    let out = std::process::Command::new(support::BIN)
        .args(["demo", "--rows", "10", "--workers", "2"])
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!theirs.exists(), "the demo used a file of its own");
}

/// A status value longer than the status column holds is refused before anything is claimed,
/// naming the value, the column and its length (it failed at the first claim or settle, as the
/// database's "value too long").
async fn status_value_too_long(t: Arc<TestDb>) {
    t.exec("CREATE TABLE short_status (id INT PRIMARY KEY, status VARCHAR(8) NOT NULL)")
        .await;
    t.exec("INSERT INTO short_status (id, status) VALUES (1, 'ready')")
        .await;
    ok(&t, &["stats", "--table", "short_status"]).await;
    for (flag, value, what) in [
        ("--claimed", "claimed_by_worker", "claimed value"),
        ("--failed", "failed_for_good", "failed value"),
    ] {
        let out = output(&t, &["claim", "--table", "short_status", flag, value]).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(what) && err.contains(value) && err.contains("at most 8"),
            "{err}"
        );
    }
    assert_eq!(
        t.count("SELECT COUNT(*) FROM short_status WHERE status = 'ready'")
            .await,
        1,
        "nothing was claimed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_value_too_long_postgres() {
    with_db(Backend::Postgres, status_value_too_long).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_value_too_long_mysql() {
    with_db(Backend::MySql, status_value_too_long).await
}

/// MariaDB: a payload bigger than `max_allowed_packet` is refused before it is sent, naming its
/// stdin line and the limit, exit 2, nothing enqueued (it was the server's bare "Got a packet
/// bigger than 'max_allowed_packet'", exit 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_over_max_allowed_packet_names_its_line() {
    with_db(Backend::MySql, |t| async move {
        ok(&t, &["init"]).await;
        let limit = t.count("SELECT CAST(@@max_allowed_packet AS SIGNED)").await as usize;
        let big = format!("{{\"blob\":\"{}\"}}", "x".repeat(limit + 1000));
        // Behind two of the command's chunks of 20,000 jobs, which the database writes first.
        let mut input: String = (1..=45_000)
            .map(|i| format!("{{\"small\":{i}}}\n"))
            .collect();
        input.push_str(&format!("\n{big}\n{{\"small\":0}}\n"));
        let out = support::run_fed(&t.url, &["enqueue"], &input).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("line 45002:") && err.contains(&format!("{limit} bytes")),
            "{err}"
        );
        assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 0);
        // A large payload that fits still goes in.
        let fits = format!("{{\"blob\":\"{}\"}}\n", "y".repeat(2 << 20));
        let out = support::run_fed(&t.url, &["enqueue"], &fits).await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(t.count("SELECT COUNT(*) FROM rowclaim_jobs").await, 1);
    })
    .await
}

/// A payload reaches the command as the JSON it was enqueued as, on every database (on
/// PostgreSQL a JSON string such as "123" arrived as the number 123), and `claim --queue` prints
/// it as that JSON too. One is larger than a pipe holds (64 KiB), so that what does not go into
/// the pipe before the command starts is written while it reads.
async fn payloads_arrive_as_enqueued(t: Arc<TestDb>) {
    ok(&t, &["init"]).await;
    let large = format!("\"{}\"", "x".repeat(100_000));
    let payloads = [
        "\"123\"",
        "{\"a\":[1,\"2\"]}",
        "\"{\\\"x\\\":1}\"",
        "7",
        large.as_str(),
    ];
    for p in payloads {
        ok(&t, &["enqueue", "--queue", "p", p]).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = format!("cat > {}/$ROWCLAIM_ID", dir.path().display());
    ok(
        &t,
        &[
            "work",
            "--queue",
            "p",
            "--until-empty",
            "--",
            "sh",
            "-c",
            &script,
        ],
    )
    .await;
    for (i, p) in payloads.iter().enumerate() {
        let got = std::fs::read_to_string(dir.path().join((i + 1).to_string())).unwrap();
        assert!(got.trim_end() == *p, "job {}: {} bytes", i + 1, got.len());
    }
    ok(&t, &["enqueue", "--queue", "c", "\"123\""]).await;
    let claimed = json_lines(&ok(&t, &["claim", "--queue", "c"]).await);
    assert_eq!(claimed[0]["row"]["payload"], "123", "{}", claimed[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_arrive_as_enqueued_postgres() {
    with_db(Backend::Postgres, payloads_arrive_as_enqueued).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_arrive_as_enqueued_mysql() {
    with_db(Backend::MySql, payloads_arrive_as_enqueued).await
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_arrive_as_enqueued_sqlite() {
    with_db(Backend::Sqlite, payloads_arrive_as_enqueued).await
}
