//! The command line's conventions for someone new to it: where the database comes from (the
//! default said when used, `.env`), commands that only read never create a SQLite file, errors
//! that name the database and the path, `--quiet`, shell completions, and the README's schema
//! examples pasted as they are on each database.

use rowclaim_testkit as common;
mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use common::{with_db, Backend, TestDb};

use support::BIN;

/// `rowclaim ARGS…` in `dir`, with no database from the environment unless `env` gives one.
fn run_in(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.current_dir(dir)
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("ROWCLAIM_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    c.output().expect("run rowclaim")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names of the files in `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Without --database or DATABASE_URL, the default is said once (not under --quiet); commands
/// that only read refuse a missing file, naming it, and create nothing; a missing table is said
/// with the database it was looked for in.
#[test]
fn the_default_database_is_named_and_reads_create_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().canonicalize().unwrap();
    let note = format!(
        "no --database or DATABASE_URL; using sqlite://rowclaim.db in {}",
        here.display()
    );
    let reads: [&[&str]; 5] = [
        &["stats"],
        &["stats", "--table", "emails"],
        &["check", "--table", "emails"],
        &["jobs", "list"],
        &["jobs", "show", "1"],
    ];
    for args in reads {
        let out = run_in(&here, &[], args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.matches(&note).count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("no SQLite database at rowclaim.db"),
            "{args:?}: {err}"
        );
        assert!(files(&here).is_empty(), "{args:?} wrote {:?}", files(&here));
    }

    let out = run_in(&here, &[], &["--quiet", "stats", "--table", "emails"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains(&note), "--quiet still said: {err}");
    assert!(err.contains("no SQLite database at rowclaim.db"), "{err}");

    // A command that writes creates the file, and the missing table names it.
    let out = run_in(&here, &[], &["claim", "--table", "emails"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("table emails does not exist in sqlite://rowclaim.db"),
        "{err}"
    );
    // Once the file is there, reading it works (and still says which database).
    let out = run_in(&here, &[], &["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_in(&here, &[], &["jobs", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out).matches(&note).count(), 1, "{}", stderr(&out));
}

/// A SQLite URL whose directory does not exist is refused naming the file and the directory,
/// by commands that write as well as those that read.
#[test]
fn a_missing_sqlite_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("no/such/dir/work.db");
    let url = format!("sqlite://{}", file.display());
    for args in [&["init"][..], &["stats", "--table", "emails"]] {
        let out = run_in(dir.path(), &[("DATABASE_URL", &url)], args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let said = format!(
            "cannot create the SQLite database {}: its directory {} does not exist",
            file.display(),
            file.parent().unwrap().display()
        );
        assert!(err.contains(&said), "{args:?}: {err}");
        assert!(!err.contains("no --database"), "{err}");
    }
    assert!(files(dir.path()).is_empty());
}

/// A missing table is said with the database it was looked for in, on every backend.
async fn missing_table_names_the_database(t: Arc<TestDb>) {
    let out = support::rowclaim(&t.url, &["claim", "--table", "nosuch"])
        .output()
        .await
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let shown = t.url.split('?').next().unwrap();
    assert!(
        err.contains(&format!("table nosuch does not exist in {shown}")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_table_names_the_database_postgres() {
    with_db(Backend::Postgres, missing_table_names_the_database).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_table_names_the_database_mysql() {
    with_db(Backend::MySql, missing_table_names_the_database).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_table_names_the_database_sqlite() {
    with_db(Backend::Sqlite, missing_table_names_the_database).await
}

/// DATABASE_URL (and the rest of the environment) may come from ./.env; the real environment
/// wins over it; a .env that cannot be read is refused, naming it.
#[test]
fn dot_env_in_the_current_directory_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let from_file = dir.path().join("from-dotenv.db");
    let from_env = dir.path().join("from-env.db");
    std::fs::write(
        dir.path().join(".env"),
        format!(
            "# the app's settings\nDATABASE_URL=sqlite://{}\n",
            from_file.display()
        ),
    )
    .unwrap();

    let out = run_in(dir.path(), &[], &["init"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("no --database"), "{err}");
    assert!(from_file.exists(), "init used .env's DATABASE_URL");

    let url = format!("sqlite://{}", from_env.display());
    let out = run_in(dir.path(), &[("DATABASE_URL", &url)], &["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(from_env.exists(), "the environment wins over .env");

    // A subdirectory has no .env of its own: the parent's is not read.
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let out = run_in(&sub, &[], &["jobs", "list"]);
    assert!(
        stderr(&out).contains("using sqlite://rowclaim.db"),
        "{}",
        stderr(&out)
    );

    std::fs::write(dir.path().join(".env"), "DATABASE_URL='unclosed\n").unwrap();
    let out = run_in(dir.path(), &[], &["init"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(".env"), "{err}");
}

/// --quiet leaves only results and errors: the claim's JSON line on stdout, nothing on stderr.
async fn quiet_says_only_results(t: Arc<TestDb>) {
    t.jobs(3).await;
    let claim = ["claim", "--table", "jobs", "--owner-column", "owner"];
    let out = support::rowclaim(&t.url, &claim).output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("strategy auto chose"),
        "{}",
        stderr(&out)
    );

    let mut quiet = vec!["-q"];
    quiet.extend(claim);
    let out = support::rowclaim(&t.url, &quiet).output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "--quiet said something");
    let line: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(line["id"], 2, "the result is still printed");
    let out = support::rowclaim(&t.url, &["--quiet", "enqueue", "{}"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "no queue yet: an error");
    assert!(stderr(&out).contains("rowclaim init"), "{}", stderr(&out));
    // Nor do the commands that only report (settling, init, the work summary).
    let token = line["token"].as_str().unwrap().to_owned();
    let complete = [&["-q", "complete", "--token", &token], &claim[1..]].concat();
    let work = [
        &["-q", "work"],
        &claim[1..],
        &["--until-empty", "--", "true"],
    ]
    .concat();
    for args in [&complete[..], &["-q", "init"], &work[..]] {
        let out = support::rowclaim(&t.url, args).output().await.unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}: --quiet said something");
    }

    let out = support::rowclaim(&t.url, &["-v", "-q", "stats"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "-v and -q conflict");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_says_only_results_and_errors() {
    with_db(Backend::Sqlite, quiet_says_only_results).await
}

/// --help documents where the database comes from (.env too) and ROWCLAIM_LOG.
#[test]
fn help_names_dot_env_and_rowclaim_log() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = stdout(&out);
    assert!(out.status.success());
    for needle in [".env", "ROWCLAIM_LOG", "--quiet", "completions"] {
        assert!(help.contains(needle), "--help lacks {needle}: {help}");
    }
}

/// A completion script for every shell clap_complete knows, naming the subcommands; a shell it
/// does not know is refused by the argument parser (exit 2).
#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = stdout(&out);
        for sub in ["work", "claim", "stats", "enqueue", "completions"] {
            assert!(script.contains(sub), "{shell} script lacks {sub}");
        }
    }
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(stdout(&out).contains("complete -F _rowclaim"));

    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("tcsh"), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
}

/// The README's "Your own table" section: its `sql` blocks, each with the database its first
/// line names (`-- PostgreSQL`, `-- MariaDB / MySQL`, `-- SQLite`), and the flags of its `SRC=`.
fn readme_schema() -> (Vec<(String, String)>, Vec<String>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md at the workspace root");
    let start = readme
        .find("\n## Your own table\n")
        .expect("README has \"## Your own table\"");
    let section = &readme[start + 1..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |i| i + 1)];
    let mut blocks = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find("```sql\n") {
        let body = &rest[open + "```sql\n".len()..];
        let end = body.find("\n```").expect("a closed sql block");
        let block = &body[..end];
        let first = block.lines().next().unwrap_or_default();
        let database = first.trim_start_matches("--").trim().to_owned();
        blocks.push((database, block.to_owned()));
        rest = &body[end..];
    }
    let src = section
        .lines()
        .find_map(|l| l.strip_prefix("SRC=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("README sets SRC=\"…\" in the same section");
    (blocks, src.split_whitespace().map(str::to_owned).collect())
}

/// The schema block the README gives for `database`.
fn readme_block(database: &str) -> String {
    let (blocks, _) = readme_schema();
    let names: Vec<&str> = blocks.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(
        names,
        ["PostgreSQL", "MariaDB / MySQL", "SQLite"],
        "README's schema blocks"
    );
    blocks
        .into_iter()
        .find(|(d, _)| d == database)
        .map(|(_, b)| b)
        .unwrap()
}

/// The README's schema for this database, pasted as it is, passes `rowclaim check`; then the
/// README's own flags claim a row of it with `rowclaim claim` and complete it.
async fn readme_schema_works(t: Arc<TestDb>) {
    let database = match t.backend {
        Backend::Postgres => "PostgreSQL",
        Backend::MySql => "MariaDB / MySQL",
        Backend::Sqlite => "SQLite",
    };
    t.exec(&readme_block(database)).await;
    t.exec("INSERT INTO emails (address) VALUES ('ada@example.com')")
        .await;
    t.exec("INSERT INTO emails (address) VALUES ('bob@example.com')")
        .await;
    let (_, src) = readme_schema();
    let src: Vec<&str> = src.iter().map(String::as_str).collect();

    // The indexes the README recommends are the ones `check` asks for.
    let mut args = vec!["check", "--json"];
    args.extend(&src);
    let out = support::rowclaim(&t.url, &args).output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{database}: {}", stdout(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let index = report["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == "claim-index"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(index["severity"], "ok", "{database}: {report:#}");

    let mut args = vec!["claim"];
    args.extend(&src);
    let out = support::rowclaim(&t.url, &args).output().await.unwrap();
    assert!(out.status.success(), "{database}: {}", stderr(&out));
    let line: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(line["id"], 1, "{line}");
    assert_eq!(line["row"]["address"], "ada@example.com", "{line}");
    let token = line["token"].as_str().unwrap().to_owned();
    let held = t
        .strings("SELECT owner FROM emails WHERE status = 'claimed'")
        .await;
    assert_eq!(held, [Some(token.clone())]);
    assert_eq!(
        t.count("SELECT COUNT(*) FROM emails WHERE id = 1 AND attempts = 1")
            .await,
        1
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM emails WHERE lease_until IS NOT NULL")
            .await,
        1
    );

    let mut args = vec!["complete"];
    args.extend(&src);
    args.extend(["--token", &token, "--id", "1"]);
    let out = support::rowclaim(&t.url, &args).output().await.unwrap();
    assert!(out.status.success(), "{database}: {}", stderr(&out));
    assert_eq!(
        t.count("SELECT COUNT(*) FROM emails WHERE status = 'done'")
            .await,
        1
    );
    assert_eq!(
        t.count("SELECT COUNT(*) FROM emails WHERE status = 'ready'")
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_schema_pastes_on_postgres() {
    with_db(Backend::Postgres, readme_schema_works).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_schema_pastes_on_mysql() {
    with_db(Backend::MySql, readme_schema_works).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_schema_pastes_on_sqlite() {
    with_db(Backend::Sqlite, readme_schema_works).await
}

/// A SQLite file this user may read but not write (the issue: "even `stats` fails"): the commands
/// that only read work, open it read-only and leave its journal mode alone; one that writes is
/// refused with a message that says why and names the file. Needs root, to act as `nobody`
/// (file modes do not stop root); elsewhere it says so and checks nothing.
#[test]
fn a_read_only_sqlite_file_is_read_and_named() {
    use std::os::unix::fs::PermissionsExt;
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let runuser = Command::new("runuser").arg("--help").output().is_ok();
    if !root || !runuser {
        eprintln!("skipped: acting as another user needs root and runuser");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Anyone may make files here (SQLite's -shm for a reader), but the database stays root's.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = dir.path().join("rowclaim");
    std::fs::copy(BIN, &bin).unwrap();
    let url = format!("sqlite://{}/jobs.db", dir.path().display());
    for args in [&["init"][..], &["enqueue", "{}"]] {
        let out = run_in(dir.path(), &[], &[&["--database", &url], args].concat());
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
    let file = dir.path().join("jobs.db");
    // The journal mode rowclaim does not use: switching a file to WAL is a write, which is what
    // made `stats` fail on a read-only file.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use sqlx::{Connection, Executor};
        let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
        c.execute("PRAGMA journal_mode=DELETE").await.unwrap();
        c.close().await.unwrap();
    });
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();

    let as_nobody = |args: &[&str]| {
        Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(&bin)
            .args(["--database", &url])
            .args(args)
            .current_dir(dir.path())
            .env_remove("DATABASE_URL")
            .output()
            .unwrap()
    };
    for args in [&["stats"][..], &["jobs", "list"], &["source", "list"]] {
        let out = as_nobody(args);
        assert!(out.status.success(), "{args:?} as nobody: {}", stderr(&out));
    }
    assert!(stdout(&as_nobody(&["jobs", "list"])).contains("\"status\":\"ready\""));
    assert!(
        !dir.path().join("jobs.db-wal").exists(),
        "reading switched the file to WAL"
    );

    // `check` reads it too, and says that claims would fail: no write access for this user.
    let out = as_nobody(&["check", "--queue", "default", "--json"]);
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let privileges = report["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == "privileges"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(privileges["severity"], "error", "{report:#}");
    assert!(
        privileges["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("write access to {}", file.display()))),
        "{report:#}"
    );

    let out = as_nobody(&["enqueue", "{}"]);
    assert!(!out.status.success(), "enqueue into a read-only file");
    let err = stderr(&out);
    assert!(err.contains("read-only for this user"), "{err}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert_eq!(
        err.matches("attempt to write").count(),
        1,
        "said once: {err}"
    );
}
