//! `rowclaim source` and the one-mapping-per-table rule, as the issue that asked for it met the
//! problem: a `claim` without `--owner-column/--lease-column` (so `auto` picks lease-table) took a
//! row that a skip-locked claim held with a 5-minute lease, and created `rowclaim_leases` without
//! a word. Now it is refused, names the differences and the command that replaces the record.

use rowclaim_testkit as common;
mod support;

use std::process::Output;
use std::sync::Arc;

use common::{with_db, Backend, TestDb};

async fn output(t: &TestDb, args: &[&str]) -> Output {
    support::rowclaim(&t.url, args)
        .output()
        .await
        .expect("run rowclaim")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn disagreeing_claimers(t: Arc<TestDb>) {
    t.jobs(3).await;
    let full = [&support::TABLE[..], &["--lease", "5m"]].concat();
    let out = output(&t, &[&["claim"], full.as_slice()].concat()).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("rowclaim created table rowclaim_sources"),
        "the registry's creation is announced: {}",
        stderr(&out)
    );
    let held: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(held["id"], 1);

    // The second claimer: refused, exit 2, naming what differs and how to replace.
    let out = output(&t, &["claim", "--table", "jobs", "--batch", "3"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    for part in [
        "owner column: \"owner\" recorded, none here",
        "lease column",
        "claims kept",
        "rowclaim source replace",
    ] {
        assert!(said.contains(part), "{part:?} missing from: {said}");
    }
    assert_eq!(said.matches("rowclaim:").count(), 1, "said once: {said}");
    assert_eq!(
        t.count("SELECT COUNT(*) FROM jobs WHERE status = 'claimed'")
            .await,
        1,
        "nothing more was claimed"
    );
    assert!(
        t.try_count("SELECT COUNT(*) FROM rowclaim_leases")
            .await
            .is_none(),
        "rowclaim_leases was not created"
    );

    // The record, as a person and a script read it.
    let out = output(&t, &["source", "list"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("jobs: id id, status status"), "{text}");
    let out = output(&t, &["source", "list", "--json"]).await;
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["claims"], "in-table");
    assert!(
        list[0]["table"].as_str().unwrap().ends_with("jobs"),
        "{list}"
    );

    // Replaced, the lease-table claimer is let in (and announces rowclaim_leases); the old
    // mapping is refused now.
    let out = output(&t, &["source", "replace", "--table", "jobs", "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["claims"], "in-lease-table");
    assert_eq!(record["owner_column"], serde_json::Value::Null);
    let out = output(&t, &["claim", "--table", "jobs"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("rowclaim created table rowclaim_leases"));
    let out = output(&t, &[&["claim"], full.as_slice()].concat()).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // Forgotten, then nothing to forget (exit 1); a bad table name is bad input.
    let out = output(&t, &["source", "forget", "jobs"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(&t, &["source", "forget", "jobs"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = output(&t, &["source", "forget", "jobs; drop table jobs"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = output(&t, &["source", "replace", "--queue", "default"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

macro_rules! registry_cases {
    ($backend:expr) => {
        use super::*;
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_claimer_that_disagrees_is_refused_and_the_record_can_be_replaced() {
            with_db($backend, disagreeing_claimers).await
        }
    };
}

mod postgres {
    registry_cases!(Backend::Postgres);
}
mod mysql {
    registry_cases!(Backend::MySql);
}
mod sqlite {
    registry_cases!(Backend::Sqlite);
}
