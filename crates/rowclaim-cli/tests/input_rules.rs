//! Input a new user gets wrong is refused or said plainly (issue 24, item 9): a lease past 7
//! days, a --run-at without an offset (read as UTC, and the time taken said), a .env line that
//! cannot be read (its line number), a negative `every` (the schedule and the valid form), a
//! port in use (exit 2 for --metrics and the dashboard's --listen alike, flag and port named).
//! On SQLite: these are the CLI's own rules, the same on every database.

mod support;

use std::process::Output;

use support::{stderr, Scratch};

fn scratch() -> Scratch {
    Scratch::new("rules.db")
}

async fn run(s: &Scratch, args: &[&str]) -> Output {
    s.run(args).await
}

#[tokio::test]
async fn leases_are_at_most_seven_days() {
    let s = scratch();
    for args in [
        &["claim", "--table", "t", "--lease", "100000d"][..],
        &["work", "--table", "t", "--lease", "8d", "--", "true"],
        &[
            "extend", "--token", "x", "--table", "t", "--lease", "30days",
        ],
    ] {
        let out = run(&s, args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let said = stderr(&out);
        assert!(
            said.contains("--lease") && said.contains("at most 7d"),
            "{said}"
        );
    }
}

#[tokio::test]
async fn run_at_without_an_offset_is_said_to_be_utc() {
    let s = scratch();
    assert!(run(&s, &["init"]).await.status.success());
    let out = run(&s, &["enqueue", "--run-at", "2099-12-01 08:00:00", "{}"]).await;
    assert!(out.status.success(), "{out:?}");
    let said = stderr(&out);
    assert!(said.contains("read as UTC, 2099-12-01T08:00:00Z"), "{said}");
    let out = run(
        &s,
        &["enqueue", "--run-at", "2099-12-01T09:00:00+01:00", "{}"],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(!stderr(&out).contains("UTC"), "{out:?}");
    let out = run(&s, &["jobs", "list"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let both = text
        .matches("\"run_at\":\"2099-12-01T08:00:00.000Z\"")
        .count();
    assert_eq!(both, 2, "{text}");
}

#[tokio::test]
async fn a_bad_env_line_is_named_by_its_number() {
    let s = scratch();
    std::fs::write(
        s.dir.path().join(".env"),
        "# settings\nA=1\n\nB=2\nC=3\nD=4\nBAD=two words here\n",
    )
    .expect("write .env");
    let out = run(&s, &["stats"]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = stderr(&out);
    assert!(said.contains("line 7 (BAD=…)"), "{said}");
    assert!(!said.contains("line index"), "{said}");
    assert!(!said.contains("two words"), "{said}");
}

#[tokio::test]
async fn a_negative_interval_names_the_schedule_and_the_form() {
    let s = scratch();
    std::fs::write(
        s.dir.path().join("rowclaim.toml"),
        "[schedule.tidy]\nqueue = \"q\"\nevery = \"-5m\"\n",
    )
    .expect("write rowclaim.toml");
    let out = run(&s, &["schedule", "run"]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = stderr(&out);
    assert!(said.contains("[schedule.tidy]"), "{said}");
    assert!(said.contains("every \"-5m\""), "{said}");
    assert!(said.contains("every = \"15m\""), "{said}");
    assert!(!said.contains("expected number"), "{said}");
}

#[tokio::test]
async fn a_port_in_use_is_bad_input_for_metrics_and_dashboard() {
    let s = scratch();
    assert!(run(&s, &["init"]).await.status.success());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let addr = taken.local_addr().expect("its address").to_string();
    let args = [
        "work",
        "--queue",
        "q",
        "--until-empty",
        "--metrics",
        &addr,
        "--",
        "true",
    ];
    let out = run(&s, &args).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        stderr(&out).contains(&format!("--metrics {addr}")),
        "{out:?}"
    );
    let out = run(&s, &["dashboard", "--listen", &addr]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        stderr(&out).contains(&format!("--listen {addr}")),
        "{out:?}"
    );
}
