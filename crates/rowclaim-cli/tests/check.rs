//! `rowclaim check` on real databases: a table without an index that serves the claim gets the
//! `CREATE INDEX` to run and exit 7, and once that statement has run the finding is gone and the
//! exit is 0 (which proves the suggestion right); the managed queue as `init` made it is clean;
//! bad input is named; a mapping that differs from the recorded one, a strategy the server cannot
//! do, missing privileges and a MariaDB logging statements (where claims really fail) exit 8.

use rowclaim_testkit as common;
mod support;

use std::process::Output;
use std::sync::Arc;

use common::servers::PrivateMariadb;
use common::{with_db, Backend, TestDb};
use serde_json::Value;

/// The source flags of [`mail_table`]: owner and lease columns, so `auto` is skip-locked where
/// the server has it (token on SQLite).
const MAIL: [&str; 6] = [
    "--table",
    "mail",
    "--owner-column",
    "owner",
    "--lease-column",
    "lease_until",
];

async fn output(url: &str, args: &[&str]) -> Output {
    support::rowclaim(url, args)
        .output()
        .await
        .expect("run rowclaim")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `check --json ARGS…`: its exit code and report.
async fn check(url: &str, args: &[&str]) -> (Option<i32>, Value) {
    let out = output(url, &[&["check", "--json"], args].concat()).await;
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check --json printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        )
    });
    (out.status.code(), report)
}

/// The finding `name` of a report.
fn finding<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == name))
        .unwrap_or_else(|| panic!("no finding {name} in {report:#}"))
}

/// A table as a user made it, with no index but its primary key: 400 rows, every tenth ready,
/// the others done (a claim that walks past them is what an index saves). With `owner`, also
/// owner and lease columns.
async fn mail_table(t: &TestDb, name: &str, owner: bool) {
    let extra = if owner {
        format!(
            ", owner VARCHAR(64) NULL, lease_until {} NULL",
            t.lease_type()
        )
    } else {
        String::new()
    };
    t.exec(&format!(
        "CREATE TABLE {name} (id BIGINT PRIMARY KEY, status VARCHAR(20) NOT NULL{extra})"
    ))
    .await;
    let rows: Vec<String> = (1..=400)
        .map(|i| format!("({i}, '{}')", if i % 10 == 0 { "ready" } else { "done" }))
        .collect();
    t.exec(&format!(
        "INSERT INTO {name} (id, status) VALUES {}",
        rows.join(", ")
    ))
    .await;
}

/// Runs `check` on `source`, expects the index warning with its fix, runs the fix, and expects
/// the finding gone and exit 0. Returns the report before the fix.
async fn index_fixed_by_its_own_advice(t: &TestDb, source: &[&str]) -> Value {
    let (code, before) = check(&t.url, source).await;
    assert_eq!(
        code,
        Some(7),
        "a claim without an index is slow: {before:#}"
    );
    assert_eq!(before["worst"], "warning", "{before:#}");
    let index = finding(&before, "claim-index");
    assert_eq!(index["severity"], "warning", "{before:#}");
    let fix = index["fix"].as_str().expect("the index finding has a fix");
    assert!(fix.starts_with("CREATE INDEX"), "{fix}");

    t.exec(fix).await;
    let (_, after) = check(&t.url, source).await;
    // Where the ready rows' index does not serve the look at expired leases (PostgreSQL's and
    // SQLite's, partial on ready rows), that look's own advice is run too.
    let expired = findings(&after, "expired-lease-index").filter(|e| e["severity"] == "warning");
    if let Some(expired) = expired {
        t.exec(expired["fix"].as_str().expect("a fix")).await;
    }
    let (code, after) = check(&t.url, source).await;
    let index = finding(&after, "claim-index");
    assert_ne!(index["severity"], "warning", "{after:#}");
    assert_eq!(index["fix"], Value::Null, "{after:#}");
    assert_eq!(code, Some(0), "{after:#}");
    before
}

/// The finding `name` of a report, if there is one.
fn findings<'a>(report: &'a Value, name: &str) -> Option<&'a Value> {
    report["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == name))
}

/// The claim's look at expired leases is checked too: with only the index check advises for
/// ready rows, it reads every claimed row's neighbours (PostgreSQL, SQLite: exit 7, with the
/// index that serves it); once that index is made, exit 0. On MySQL/MariaDB the ready index
/// leads with the status, which serves the claimed rows too (ok at once), and a table with
/// only its primary key gets the advice.
async fn expired_lease_lookup(t: Arc<TestDb>) {
    mail_table(&t, "mail", true).await;
    let (_, report) = check(&t.url, &MAIL).await;
    let ready = finding(&report, "claim-index")["fix"]
        .as_str()
        .unwrap()
        .to_owned();
    let expired = finding(&report, "expired-lease-index");
    assert_eq!(expired["severity"], "warning", "{report:#}");
    let expired_fix = expired["fix"].as_str().expect("a fix").to_owned();
    assert!(expired_fix.starts_with("CREATE INDEX"), "{expired_fix}");
    assert!(expired_fix.contains("rowclaim_claimed"), "{expired_fix}");

    t.exec(&ready).await;
    let (code, report) = check(&t.url, &MAIL).await;
    assert_eq!(
        finding(&report, "claim-index")["severity"],
        "ok",
        "{report:#}"
    );
    let expired = finding(&report, "expired-lease-index");
    if t.backend == Backend::MySql {
        assert_eq!(expired["severity"], "ok", "{report:#}");
        assert_eq!(code, Some(0), "{report:#}");
        return;
    }
    assert_eq!(expired["severity"], "warning", "{report:#}");
    assert_eq!(code, Some(7), "only the ready index: {report:#}");
    assert_eq!(expired["fix"].as_str(), Some(expired_fix.as_str()));

    t.exec(&expired_fix).await;
    let (code, report) = check(&t.url, &MAIL).await;
    let expired = finding(&report, "expired-lease-index");
    assert_eq!(expired["severity"], "ok", "{report:#}");
    assert!(
        expired["message"]
            .as_str()
            .unwrap()
            .contains("rowclaim_claimed"),
        "{report:#}"
    );
    assert_eq!(code, Some(0), "with an index on claimed rows: {report:#}");
}

/// The index advice on a table with owner and lease columns (auto: skip-locked, token on SQLite)
/// and on one with a status column only (auto: lease-table); the report's shape; nothing written.
async fn index_advice(t: Arc<TestDb>) {
    mail_table(&t, "mail", true).await;
    let report = index_fixed_by_its_own_advice(&t, &MAIL).await;
    for key in [
        "table",
        "database",
        "server",
        "asked",
        "strategy",
        "auto",
        "auto_reason",
    ] {
        assert!(report[key].is_string(), "{key} in {report:#}");
    }
    assert_eq!(report["table"], "mail");
    assert_eq!(report["asked"], "auto");
    assert_eq!(report["strategy"], report["auto"]);
    let server = t.server().await;
    let expected = if server.supports(rowclaim::Capability::SkipLocked) {
        "skip-locked"
    } else {
        "token"
    };
    assert_eq!(report["auto"], expected, "{report:#}");
    assert!(
        finding(&report, "strategy")["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("auto picks {expected}"))),
        "{report:#}"
    );
    let severities = ["ok", "advice", "warning", "error"];
    for f in report["findings"].as_array().unwrap() {
        assert!(f["name"].is_string() && f["message"].is_string(), "{f}");
        assert!(
            severities.contains(&f["severity"].as_str().unwrap_or("")),
            "{f}"
        );
        assert!(f["fix"].is_null() || f["fix"].is_string(), "{f}");
    }
    for name in ["registry", "privileges", "clock"] {
        finding(&report, name);
    }
    assert_eq!(finding(&report, "registry")["severity"], "advice");

    // A person's report: the same findings, a summary, the worst in capitals.
    let out = output(&t.url, &[&["check"], &MAIL[..]].concat()).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("mail on "), "{text}");
    assert!(text.contains("claim-index"), "{text}");
    assert!(
        text.contains("nothing that makes claims slow or unsafe"),
        "{text}"
    );

    // Status only: auto keeps claims in rowclaim_leases, whose claim looks for ready and
    // claimed rows.
    mail_table(&t, "plain", false).await;
    let report = index_fixed_by_its_own_advice(&t, &["--table", "plain"]).await;
    assert_eq!(report["auto"], "lease-table", "{report:#}");

    // Looking wrote nothing: no record, no lease table.
    for table in ["rowclaim_sources", "rowclaim_leases"] {
        assert!(
            t.try_count(&format!("SELECT COUNT(*) FROM {table}"))
                .await
                .is_none(),
            "check created {table}"
        );
    }

    // Once a claim has recorded the mapping, a claimer that maps the table otherwise would be
    // refused: check says so (exit 8), and agrees with the recorded one.
    let out = output(&t.url, &[&["claim"], &MAIL[..]].concat()).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let (code, report) = check(&t.url, &["--table", "mail"]).await;
    assert_eq!(code, Some(8), "{report:#}");
    let registry = finding(&report, "registry");
    assert_eq!(registry["severity"], "error", "{report:#}");
    assert!(
        registry["message"]
            .as_str()
            .is_some_and(|m| m.contains("owner column")),
        "{report:#}"
    );
    let (code, report) = check(&t.url, &MAIL).await;
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(finding(&report, "registry")["severity"], "ok");
}

/// The managed queue as `init` makes it is clean; before `init`, check says to run it.
async fn managed_queue(t: Arc<TestDb>) {
    let out = output(&t.url, &["check", "--queue", "mail"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("rowclaim init"), "{}", stderr(&out));

    let out = output(&t.url, &["init"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let (code, report) = check(&t.url, &["--queue", "mail"]).await;
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["table"], "rowclaim_jobs");
    assert_eq!(
        finding(&report, "claim-index")["severity"],
        "ok",
        "{report:#}"
    );
    assert_eq!(
        finding(&report, "expired-lease-index")["severity"],
        "ok",
        "its index of running jobs serves the look at expired leases: {report:#}"
    );
    assert!(
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["name"] != "registry"),
        "the queue's mapping is rowclaim's own: {report:#}"
    );
}

/// Input a claimer would refuse is named, exit 2, before anything is checked.
async fn bad_input(t: Arc<TestDb>) {
    mail_table(&t, "mail", true).await;
    let cases: [(&[&str], &str); 5] = [
        (&["--table", "no_such"], "no_such"),
        (&["--table", "mail", "--owner-column", "nope"], "nope"),
        (
            &["--table", "mail; drop table mail"],
            "not a plain SQL identifier",
        ),
        (&["--table", "mail", "--where", "no_column = 1"], "--where"),
        (&[], "--table"),
    ];
    for (args, named) in cases {
        let out = output(&t.url, &[&["check"], args].concat()).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(named), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{args:?}: no report");
    }
    // A strategy the server cannot do is a finding (exit 8), and the rest is checked for
    // auto's pick.
    if !t.server().await.supports(rowclaim::Capability::SkipLocked) {
        let (code, report) = check(
            &t.url,
            &[&MAIL[..], &["--strategy", "skip-locked"]].concat(),
        )
        .await;
        assert_eq!(code, Some(8), "{report:#}");
        assert_eq!(finding(&report, "strategy")["severity"], "error");
        assert_eq!(report["strategy"], report["auto"], "{report:#}");
        finding(&report, "claim-index");
    }
}

macro_rules! check_cases {
    ($backend:expr) => {
        use super::*;

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_missing_index_is_named_with_the_statement_that_fixes_it() {
            with_db($backend, index_advice).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_look_at_expired_leases_is_checked_and_its_index_advised() {
            with_db($backend, expired_lease_lookup).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_managed_queue_is_clean_after_init() {
            with_db($backend, managed_queue).await
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn bad_input_is_named() {
            with_db($backend, bad_input).await
        }
    };
}

mod postgres {
    check_cases!(Backend::Postgres);

    /// A user who may read the table but not change it: claims would fail, exit 8, naming the
    /// privilege and the table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn missing_privileges_are_named() {
        with_db(Backend::Postgres, |t| async move {
            mail_table(&t, "mail", true).await;
            let role = format!("rc_check_{}", uuid::Uuid::now_v7().simple());
            t.exec(&format!("CREATE ROLE {role} LOGIN")).await;
            t.exec(&format!("GRANT SELECT ON mail TO {role}")).await;
            let url = t.direct_url().replacen("postgres@", &format!("{role}@"), 1);
            let checked = check(&url, &MAIL).await;
            // Roles belong to the whole server: gone before anything can fail.
            t.exec(&format!("REVOKE ALL ON mail FROM {role}; DROP ROLE {role}"))
                .await;
            let (code, report) = checked;
            assert_eq!(code, Some(8), "{report:#}");
            let privileges = finding(&report, "privileges");
            assert_eq!(privileges["severity"], "error", "{report:#}");
            let said = privileges["message"].as_str().unwrap_or_default();
            assert!(said.contains("UPDATE on public.mail"), "{said}");
            assert!(!said.contains("SELECT on public.mail"), "{said}");
            let fix = privileges["fix"].as_str().unwrap_or_default();
            assert!(
                fix.contains(&format!("GRANT UPDATE ON \"public\".\"mail\" TO {role};")),
                "{fix}"
            );
        })
        .await
    }
}
mod mysql {
    check_cases!(Backend::MySql);

    /// A MariaDB that logs statements (log_bin, binlog_format=STATEMENT): check flags it as
    /// breaking claims and advises ROW, for auto and each strategy, exit 8; and a claim there
    /// does fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statement_based_binlog_breaks_claims() {
        let server = PrivateMariadb::start_with(&["--log-bin", "--binlog-format=STATEMENT"]).await;
        let t = TestDb::on(Backend::MySql, &server.admin_url()).await;
        mail_table(&t, "mail", true).await;
        t.exec("CREATE INDEX mail_ready ON mail (status, id)").await;
        for strategy in ["auto", "skip-locked", "token", "lease-table"] {
            let (code, report) =
                check(&t.url, &[&MAIL[..], &["--strategy", strategy]].concat()).await;
            assert_eq!(code, Some(8), "{strategy}: {report:#}");
            let binlog = finding(&report, "binlog");
            assert_eq!(binlog["severity"], "error", "{strategy}: {report:#}");
            assert!(
                binlog["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("STATEMENT")),
                "{report:#}"
            );
            assert!(
                binlog["fix"].as_str().is_some_and(|f| f.contains("ROW")),
                "{report:#}"
            );
            // Nothing else is wrong with this table.
            for f in report["findings"].as_array().unwrap() {
                if f["name"] != "binlog" {
                    assert!(
                        f["severity"] == "ok" || f["severity"] == "advice",
                        "{strategy}: {f}"
                    );
                }
            }
        }
        let out = output(&t.url, &[&["check"], &MAIL[..]].concat()).await;
        assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("ERROR    binlog"), "{text}");
        assert!(stderr(&out).contains("binlog"), "{}", stderr(&out));

        // What check warned of: the claim is refused.
        let out = output(&t.url, &[&["claim"], &MAIL[..]].concat()).await;
        assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
        assert!(stderr(&out).contains("1665"), "{}", stderr(&out));
    }
}
mod sqlite {
    check_cases!(Backend::Sqlite);
}
