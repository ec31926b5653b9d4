//! No message of any command shows a password from a database URL, malformed or not (issue 24,
//! item 5): every path where a URL or its host goes into a message is fed one, and stdout and
//! stderr (at -vv, so the logs too) are searched for it.

mod support;

use std::process::Stdio;

const SECRET: &str = "S3cretPW";

/// A database no test makes: a URL that would reach the server fails there, writing nothing.
const NO_DB: &str = "rowclaim_no_such_db";

/// URLs that fail, each on another path: a malformed scheme, a bad port, an unknown or bad
/// parameter, a host that does not answer, a bad host list, a wrong password.
fn failing_urls(pg_host: &str, my_host: &str) -> Vec<String> {
    let s = SECRET;
    vec![
        // Not a URL rowclaim knows: no "://".
        format!("postgres//postgres:{s}@{pg_host}/{NO_DB}"),
        format!("postgresql:/postgres:{s}@{pg_host}/{NO_DB}"),
        format!("mysql//root:{s}@{my_host}/test"),
        format!("mysql//{s}@{my_host}/test"),
        format!("postgres:{s}@{pg_host}/{NO_DB}"),
        format!("postgres://postgres:{s}/postgres"),
        // An unknown scheme.
        format!("oracle://scott:{s}@{pg_host}/x"),
        // A password holding an `@`, `/` and `?`.
        format!("postgres://postgres:{s}@x/y?z@127.0.0.1:1/postgres"),
        // Bad ports.
        format!("postgres://postgres:{s}@127.0.0.1:notaport/postgres"),
        format!("mysql://root:{s}@127.0.0.1:99999/test"),
        format!("mariadb://root:{s}@127.0.0.1:x/test"),
        // Parameters: unknown, bad values, rowclaim's own.
        format!("postgres://postgres:{s}@{pg_host}/{NO_DB}?sslmode=sometimes"),
        format!("postgres://postgres:{s}@{pg_host}/{NO_DB}?bogus=1"),
        format!("postgres://postgres:{s}@{pg_host}/{NO_DB}?target_session_attrs=primary"),
        format!("postgres://postgres:{s}@{pg_host}/{NO_DB}?pgbouncer=maybe"),
        format!("mysql://root:{s}@{my_host}/test?ssl-mode=sometimes"),
        format!("mysql://root:{s}@{my_host}/test?bogus=1"),
        format!("postgres://{pg_host}/{NO_DB}?user=postgres&password={s}&sslmode=sometimes"),
        format!("postgres://{pg_host}/{NO_DB}?user=postgres&password={s}"),
        // Host lists.
        format!("postgres://postgres:{s}@{pg_host},/{NO_DB}"),
        format!("postgres://postgres:{s}@127.0.0.1:1,127.0.0.1:x/postgres"),
        format!("postgres://postgres:{s}@127.0.0.1:1,127.0.0.1:2/postgres"),
        // Servers that do not answer, or refuse.
        format!("postgres://postgres:{s}@127.0.0.1:1/postgres"),
        format!("mysql://root:{s}@127.0.0.1:1/test"),
        format!("postgres://postgres:{s}@no-such-host.invalid/postgres"),
        format!("mysql://root:{s}@{my_host}/test"),
    ]
}

/// A worker that drains queue q and ends: after at most 1 s of an unreachable database, for
/// `work` waits for one that is down at its start.
const WORK: &[&str] = &[
    "work",
    "--queue",
    "q",
    "--until-empty",
    "--give-up-after",
    "1s",
    "--",
    "true",
];

/// The commands a URL reaches, each connecting its own way.
const COMMANDS: &[&[&str]] = &[
    &["stats"],
    &["init"],
    &["jobs", "list"],
    &["claim", "--table", "nope"],
    WORK,
    &["bench", "latency", "--jobs", "1"],
];

fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap_or_default().to_owned()
}

async fn said(args: &[&str], database: Option<&str>, dir: &std::path::Path) -> String {
    let mut c = tokio::process::Command::new(support::BIN);
    c.arg("-vv");
    if let Some(url) = database {
        c.arg("--database").arg(url);
    }
    c.args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .env_remove("ROWCLAIM_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), c.output())
        .await
        .expect("rowclaim fails within a minute")
        .expect("run rowclaim");
    assert!(
        !out.status.success(),
        "{args:?} {database:?} succeeded: {out:?}"
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn no_message_shows_a_password_from_a_url() {
    let pg = std::env::var("ROWCLAIM_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let my = std::env::var("ROWCLAIM_TEST_MYSQL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let dir = tempfile::tempdir().expect("temp dir");
    let mut leaks = Vec::new();
    let mut paths = std::collections::BTreeSet::new();
    for url in failing_urls(&host_of(&pg), &host_of(&my)) {
        for args in COMMANDS {
            let text = said(args, Some(&url), dir.path()).await;
            if text.contains(SECRET) {
                leaks.push(format!("{args:?} --database {url}:\n{text}"));
            }
            if let Some(line) = text.lines().rev().find(|l| l.starts_with("rowclaim: ")) {
                paths.insert(line.replace(SECRET, "<SECRET>"));
            }
        }
    }
    // The same URL from DATABASE_URL, and as the one LISTEN uses.
    let malformed = format!("postgres//postgres:{SECRET}@127.0.0.1/postgres");
    let mut c = support::rowclaim(&malformed, &["stats"]);
    c.env("DATABASE_URL", &malformed);
    let out = c.output().await.expect("run rowclaim");
    let text = format!("{out:?}");
    if text.contains(SECRET) {
        leaks.push(format!("DATABASE_URL={malformed}: {text}"));
    }
    for listen in [
        malformed.clone(),
        format!("mysql://root:{SECRET}@127.0.0.1/test"),
        format!("postgres://postgres:{SECRET}@127.0.0.1:x/postgres"),
        format!("postgres://postgres:{SECRET}@127.0.0.1/postgres?pgbouncer=true"),
    ] {
        let args = [
            "work",
            "--queue",
            "q",
            "--until-empty",
            "--listen-database",
            &listen,
            "--",
            "true",
        ];
        let text = said(&args, Some(&pg), dir.path()).await;
        if text.contains(SECRET) {
            leaks.push(format!("--listen-database {listen}:\n{text}"));
        }
    }
    // A missing table is said with the database it was looked for in.
    let pg_with = pg.replacen("postgres@", &format!("postgres:{SECRET}@"), 1);
    let text = said(
        &["stats", "--table", "no_such_table_here"],
        Some(&pg_with),
        dir.path(),
    )
    .await;
    assert!(text.contains("no_such_table_here"), "{text}");
    if text.contains(SECRET) {
        leaks.push(format!("a missing table:\n{text}"));
    }
    // A .env whose line holding the URL cannot be read.
    std::fs::write(
        dir.path().join(".env"),
        format!("A=1\nDATABASE_URL=\"postgres://u:{SECRET}@h/db\n"),
    )
    .expect("write .env");
    let text = said(&["stats"], None, dir.path()).await;
    assert!(text.contains(".env"), "{text}");
    if text.contains(SECRET) {
        leaks.push(format!(".env:\n{text}"));
    }
    assert!(leaks.is_empty(), "passwords shown:\n{}", leaks.join("\n\n"));
    // The paths were different ones (a test that only ever met one error would prove little).
    assert!(
        paths.len() >= 10,
        "only {} messages: {paths:#?}",
        paths.len()
    );
    eprintln!("{paths:#?}");
}

/// Commands that succeed with a password in the URL (the test server trusts any) say nothing of
/// it either, at -vv: connecting, claiming, working, checking, the bench.
async fn succeeding(t: std::sync::Arc<rowclaim_testkit::TestDb>) {
    t.jobs(3).await;
    let url = t
        .url
        .replacen("postgres@", &format!("postgres:{SECRET}@"), 1);
    assert!(url.contains(SECRET), "{url}");
    let claim = [&["claim"][..], &support::TABLE[..]].concat();
    let check = [&["check"][..], &support::TABLE[..]].concat();
    let runs: [&[&str]; 9] = [
        &["init"],
        &["enqueue", "--queue", "q", "{}"],
        WORK,
        &["stats"],
        &["jobs", "list"],
        &["queue", "pause", "q"],
        &claim,
        &check,
        &["bench", "drain", "--rows", "20", "--workers", "2"],
    ];
    for args in runs {
        let mut c = support::rowclaim(&url, &[&["-vv"][..], args].concat());
        let out = c.output().await.expect("run rowclaim");
        // `check` may exit 7 or 8 for what it found; none of these fails otherwise.
        assert!(
            matches!(out.status.code(), Some(0 | 7 | 8)),
            "{args:?}: {out:?}"
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !text.contains(SECRET),
            "{args:?} showed the password:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_succeed_show_no_password_either() {
    rowclaim_testkit::with_db(rowclaim_testkit::Backend::Postgres, succeeding).await;
}
