//! Commands that did nothing say why (issue 24, item 7): a config file named but missing, a
//! queue paused or resumed that nobody has used or that was in that state already, a job
//! retried or cancelled that does not exist or is in another state. On SQLite: the messages are
//! the CLI's own, the same on every database.

mod support;

use std::process::Output;

use support::{stderr, Scratch};

fn scratch() -> Scratch {
    Scratch::new("said.db")
}

async fn run(s: &Scratch, args: &[&str]) -> Output {
    s.run(args).await
}

#[tokio::test]
async fn a_config_file_named_must_exist() {
    let s = scratch();
    assert!(run(&s, &["init"]).await.status.success());
    let args = [
        "work",
        "--queue",
        "q",
        "--until-empty",
        "--config",
        "nope.toml",
        "--",
        "true",
    ];
    let out = run(&s, &args).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("nope.toml"), "{out:?}");
    // Without --config, a missing ./rowclaim.toml has no schedules.
    let out = run(&s, &["work", "--queue", "q", "--until-empty", "--", "true"]).await;
    assert!(out.status.success(), "{out:?}");
    // --config where nothing reads it is said, not ignored.
    std::fs::write(s.dir.path().join("x.toml"), "").expect("write x.toml");
    let args = ["work", "--table", "t", "--config", "x.toml", "--", "true"];
    let out = run(&s, &args).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("--config"), "{out:?}");
}

/// A scratch database with the queue set up and job 1 ready in queue mail.
async fn with_one_mail_job() -> Scratch {
    let s = scratch();
    assert!(run(&s, &["init"]).await.status.success());
    let out = run(&s, &["enqueue", "--queue", "mail", "{}"]).await;
    assert!(out.status.success(), "{out:?}");
    s
}

#[tokio::test]
async fn pause_and_resume_say_what_they_found() {
    let s = with_one_mail_job().await;
    // A queue nobody has used: paused ahead, said so.
    let out = run(&s, &["queue", "pause", "maill"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stderr(&out).contains("no queue named maill has jobs"),
        "{out:?}"
    );
    // Paused already: nothing changed, exit 1.
    let out = run(&s, &["queue", "pause", "maill"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("was paused already"), "{out:?}");
    // A queue with jobs that is not paused.
    let out = run(&s, &["queue", "resume", "mail"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = stderr(&out);
    assert!(said.contains("queue mail was not paused"), "{said}");
    assert!(!said.contains("has jobs"), "{said}");
    // A typo: not paused, and no jobs of that name.
    let out = run(&s, &["queue", "resume", "mial"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr(&out).contains("no queue of that name has jobs"),
        "{out:?}"
    );
    let out = run(&s, &["queue", "pause", "mail"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stderr(&out).contains("paused queue mail"), "{out:?}");
    let out = run(&s, &["queue", "resume", "mail", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(said["changed"], true, "{said}");
    assert_eq!(said["has_jobs"], true, "{said}");
}

#[tokio::test]
async fn retry_and_cancel_say_why_nothing_changed() {
    let s = with_one_mail_job().await;
    let out = run(&s, &["jobs", "retry", "42"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains("there is no job 42"), "{out:?}");
    let out = run(&s, &["jobs", "retry", "1"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = stderr(&out);
    assert!(said.contains("job 1 is ready"), "{said}");
    assert!(said.contains("only a dead or cancelled job"), "{said}");
    assert!(run(&s, &["jobs", "cancel", "1"]).await.status.success());
    let out = run(&s, &["jobs", "cancel", "1"]).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = stderr(&out);
    assert!(said.contains("job 1 is cancelled"), "{said}");
    assert!(
        said.contains("only a waiting, ready or running job"),
        "{said}"
    );
    let out = run(&s, &["jobs", "cancel", "7"]).await;
    assert!(stderr(&out).contains("there is no job 7"), "{out:?}");
}
