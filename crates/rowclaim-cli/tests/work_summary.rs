//! `work`'s summary tells a job cancelled while it ran from one lost to another worker: the
//! cancel is counted as cancelled (text and `--json`), and an `--until-empty` run that met only
//! that ends well (exit 0).

use rowclaim_testkit as common;
mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{with_db, Backend, TestDb};

async fn cancelled_is_said(t: Arc<TestDb>) {
    let out = support::rowclaim(&t.url, &["init"]).output().await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = support::run_fed(&t.url, &["enqueue", "--queue", "c"], "{}\n").await;
    assert!(out.status.success(), "{out:?}");
    let id = t
        .count("SELECT MAX(id) FROM rowclaim_jobs")
        .await
        .to_string();

    let args = [
        "work",
        "--queue",
        "c",
        "--until-empty",
        "--json",
        "--lease",
        "3s",
        "--poll",
        "200ms",
        "--",
        "sleep",
        "120",
    ];
    let worker = support::rowclaim(&t.url, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the worker");
    support::until_count(
        &t,
        "SELECT COUNT(*) FROM rowclaim_jobs WHERE status = 'running'",
        1,
    )
    .await;
    let out = support::rowclaim(&t.url, &["jobs", "cancel", &id])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let out = tokio::time::timeout(Duration::from_secs(120), worker.wait_with_output())
        .await
        .expect("the worker ends once its job is cancelled")
        .expect("wait for the worker");
    let said = support::stderr(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no summary: {said}"));
    let summary: serde_json::Value = serde_json::from_str(line).expect("the JSON summary");
    assert_eq!(summary["cancelled"], 1, "{summary}\n{said}");
    assert_eq!(summary["lost"], 0, "{summary}\n{said}");
    assert!(
        said.contains("0 lost to another worker, 1 cancelled"),
        "{said}"
    );
    assert_eq!(out.status.code(), Some(0), "a cancel is no trouble: {said}");
}

mod postgres {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_job_is_said_as_cancelled() {
        with_db(Backend::Postgres, cancelled_is_said).await
    }
}
mod mysql {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_job_is_said_as_cancelled() {
        with_db(Backend::MySql, cancelled_is_said).await
    }
}
mod sqlite {
    use super::*;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_job_is_said_as_cancelled() {
        with_db(Backend::Sqlite, cancelled_is_said).await
    }
}
