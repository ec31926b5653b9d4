//! `rowclaim enqueue --after` and `jobs show` of jobs that wait, as a process (SQLite: the
//! statements are the library's, tested on every database in its `waits` tests).

mod support;

use serde_json::Value;

fn id_of(line: &str) -> String {
    let v: Value = serde_json::from_str(line.trim()).expect("JSON");
    v["id"].as_i64().expect("an id").to_string()
}

#[tokio::test]
async fn enqueue_after_waits_and_show_says_for_what() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("waits.db").display());
    support::run_ok(&url, &["init"], "").await;
    let a = id_of(&support::run_ok(&url, &["enqueue", "--kind", "export", "{}"], "").await);
    let b = id_of(&support::run_ok(&url, &["enqueue", "--kind", "export", "{}"], "").await);
    let after = format!("{a},{b}");
    let last = id_of(
        &support::run_ok(
            &url,
            &["enqueue", "--kind", "report", "--after", &after, "{}"],
            "",
        )
        .await,
    );
    let show = |id: String| {
        let url = url.clone();
        async move {
            let out = support::run_ok(&url, &["jobs", "show", &id], "").await;
            serde_json::from_str::<Value>(&out).expect("show is JSON")
        }
    };
    let job = show(last.clone()).await;
    assert_eq!(job["status"], "waiting", "{job}");
    let waits: Vec<String> = job["waits_for"]
        .as_array()
        .expect("waits_for")
        .iter()
        .map(|l| l["id"].to_string())
        .collect();
    assert_eq!(waits, [a.clone(), b.clone()], "{job}");
    assert_eq!(job["waits_for"][0]["status"], "ready", "{job}");
    assert_eq!(job["run_anyway"], false, "{job}");
    let first = show(a.clone()).await;
    assert_eq!(first["waited_by"][0]["id"].to_string(), last, "{first}");

    // One that runs anyway says so, with --json as without.
    let anyway = id_of(
        &support::run_ok(
            &url,
            &[
                "enqueue",
                "--kind",
                "tidy",
                "--after",
                &a,
                "--run-anyway",
                "{}",
            ],
            "",
        )
        .await,
    );
    assert_eq!(show(anyway.clone()).await["run_anyway"], true);
    let out = support::run_ok(&url, &["jobs", "show", &anyway, "--json"], "").await;
    let shown: Value = serde_json::from_str(&out).expect("show --json is JSON");
    assert_eq!(shown["run_anyway"], true, "{shown}");

    // `jobs list --status waiting` finds them.
    let listed = support::run_ok(&url, &["jobs", "list", "--status", "waiting"], "").await;
    assert_eq!(listed.lines().count(), 2, "{listed}");

    // The exports run, then the report (and the tidy-up): all of them complete.
    support::run_ok(
        &url,
        &["work", "--queue", "default", "--until-empty", "--", "cat"],
        "",
    )
    .await;
    assert_eq!(show(last.clone()).await["status"], "completed");
    assert_eq!(show(anyway.clone()).await["status"], "completed");

    // An id of no job is refused, naming it; --run-anyway needs --after.
    let out = support::run_fed(&url, &["enqueue", "--after", "9999", "{}"], "").await;
    assert_eq!(out.status.code(), Some(2), "{}", support::stderr(&out));
    assert!(
        support::stderr(&out).contains("job 9999"),
        "{}",
        support::stderr(&out)
    );
    let out = support::run_fed(&url, &["enqueue", "--run-anyway", "{}"], "").await;
    assert_eq!(out.status.code(), Some(2), "{}", support::stderr(&out));
}
