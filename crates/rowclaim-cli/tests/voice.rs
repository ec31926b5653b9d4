//! One voice for what the command says on stderr (issue 24, item 10): the library's log events
//! read `rowclaim: …` like the command's own lines (the level word only for warnings and
//! errors, no timestamp), and a table rowclaim creates is announced once, however many of a
//! bench's workers met it missing.

use rowclaim_testkit as common;
mod support;

use std::sync::Arc;

use common::{with_db, Backend, TestDb};

/// Every stderr line is the command's voice: `rowclaim: …`, or a bench's own table and check.
fn foreign_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("rowclaim: "))
        // A timestamp or a bare level word at the start is the log's other format.
        .filter(|l| {
            l.starts_with(|c: char| c.is_ascii_digit())
                || l.contains(" WARN ")
                || l.contains(" INFO ")
        })
        .collect()
}

async fn created_once(t: Arc<TestDb>) {
    let out = support::rowclaim(
        &t.url,
        &[
            "bench",
            "contention",
            "--workers-list",
            "2,3",
            "--strategies",
            "token,lease-table",
            "--rows",
            "60",
        ],
    )
    .output()
    .await
    .expect("run bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for table in ["rowclaim_sources", "rowclaim_leases"] {
        let said = stderr.matches(&format!("created table {table}")).count();
        assert!(said <= 1, "{table} announced {said} times: {stderr}");
    }
    assert!(
        stderr.contains("rowclaim: warning: rowclaim created table rowclaim_sources"),
        "in the command's voice, level word and all: {stderr}"
    );
    let foreign = foreign_lines(&stderr);
    assert!(foreign.is_empty(), "lines in another format: {foreign:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_table_is_said_once_in_the_commands_voice_postgres() {
    with_db(Backend::Postgres, created_once).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_created_table_is_said_once_in_the_commands_voice_sqlite() {
    with_db(Backend::Sqlite, created_once).await;
}

/// What a command that must succeed said on stderr.
async fn said(t: &TestDb, args: &[&str]) -> String {
    let out = support::rowclaim(&t.url, args)
        .output()
        .await
        .expect("run rowclaim");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?}: {stderr}");
    stderr
}

/// At -v the library's decisions are said too, each line `rowclaim: [target] …`.
async fn verbose_lines(t: Arc<TestDb>) {
    t.jobs(2).await;
    let args = [&["-v", "claim"][..], &support::TABLE[..]].concat();
    let stderr = said(&t, &args).await;
    assert!(
        stderr.contains("] rowclaim created table"),
        "the origin from -v on: {stderr}"
    );
    assert!(stderr.contains("[rowclaim::"), "{stderr}");
    let foreign = foreign_lines(&stderr);
    assert!(foreign.is_empty(), "lines in another format: {foreign:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_lines_are_in_the_commands_voice() {
    with_db(Backend::Sqlite, verbose_lines).await;
}

/// A log that is not a terminal gets no colour codes: an event's fields read `worker="…"`,
/// not with escape sequences around the name, in a file or a pipe.
async fn plain_in_a_pipe(t: Arc<TestDb>) {
    said(&t, &["init"]).await;
    let stderr = said(
        &t,
        &["-v", "work", "--queue", "q", "--until-empty", "--", "true"],
    )
    .await;
    assert!(
        stderr.contains("worker=\""),
        "a line with a field: {stderr}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "escape codes in a pipe: {stderr:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_in_a_pipe_has_no_colour_codes() {
    with_db(Backend::Sqlite, plain_in_a_pipe).await;
}
