//! Help as a new user meets it (issue 24, item 11): examples under the top level and the main
//! commands; the exit codes once, under the top level's `--help`; global flags under a heading of
//! their own; no flag listed where it does not apply; completions that offer strategy names;
//! `enqueue` from stdin prints the ids; the README's completions line works where the folder
//! is missing.

mod support;

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(support::BIN)
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .expect("run rowclaim")
}

fn help(args: &[&str]) -> String {
    let out = run(args);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last line of the exit table.
const EXIT_TABLE: &str = "130  interrupted";

const MAIN: [&str; 12] = [
    "work", "claim", "complete", "fail", "release", "extend", "stats", "check", "enqueue", "jobs",
    "queue", "schedule",
];

#[test]
fn examples_everywhere_exit_codes_once() {
    let long = help(&["--help"]);
    assert!(
        long.contains("Examples:") && long.contains(EXIT_TABLE),
        "{long}"
    );
    let short = help(&["-h"]);
    assert!(short.contains("Examples:"), "{short}");
    assert!(!short.contains(EXIT_TABLE), "{short}");
    assert!(short.contains("rowclaim --help"), "{short}");
    for name in MAIN {
        for flag in ["-h", "--help"] {
            let text = help(&[name, flag]);
            assert!(
                text.contains("Examples:\n  rowclaim "),
                "{name} {flag}: {text}"
            );
            assert!(!text.contains(EXIT_TABLE), "{name} {flag}: {text}");
        }
    }
    let work = help(&["work", "-h"]).lines().count();
    assert!(work < 130, "work -h is {work} lines");
}

#[test]
fn global_flags_have_a_heading_of_their_own() {
    for args in [
        &["jobs", "list", "-h"][..],
        &["queue", "pause", "-h"],
        &["work", "-h"],
    ] {
        let text = help(args);
        let heading = text
            .find("\nGlobal options:\n")
            .unwrap_or_else(|| panic!("{args:?}: {text}"));
        let database = text.find("--database <").expect("--database is listed");
        let quiet = text.find("--quiet").expect("--quiet is listed");
        assert!(database > heading && quiet > heading, "{args:?}: {text}");
    }
}

#[test]
fn no_flag_where_it_does_not_apply() {
    for name in ["complete", "fail", "release", "extend"] {
        let text = help(&[name, "--help"]);
        for flag in ["--where", "--order-by"] {
            assert!(!text.contains(flag), "{name} lists {flag}: {text}");
        }
        let out = run(&[
            name,
            "--table",
            "t",
            "--token",
            "x",
            "--where",
            "a = 1",
            "--database",
            "sqlite::memory:",
        ]);
        assert_eq!(out.status.code(), Some(2), "{name}: {out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("--where"), "{name}: {said}");
    }
    for name in ["demo", "completions"] {
        let text = help(&[name, "--help"]);
        assert!(
            !text.contains("--database <"),
            "{name} lists --database: {text}"
        );
    }
    let out = run(&["demo", "--database", "sqlite://x.db"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn completions_offer_strategy_names_not_files() {
    let script = help(&["completions", "bash"]);
    let mut cases = 0;
    for case in script.split("--strategy)").skip(1) {
        let body = case.split(";;").next().unwrap_or_default();
        assert!(
            !body.contains("compgen -f"),
            "files offered for --strategy: {body}"
        );
        assert!(
            body.contains("skip-locked") || body.contains("lease-table"),
            "{body}"
        );
        cases += 1;
    }
    assert!(cases > 5, "{cases} --strategy cases");
}

#[tokio::test]
async fn enqueue_from_stdin_prints_each_id() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("ids.db").display());
    support::run_ok(&url, &["init"], "").await;
    support::run_ok(&url, &["enqueue", "{\"n\":0}"], "").await;
    let out = support::run_ok(&url, &["enqueue"], "{\"n\":1}\n\n{\"n\":2}\n{\"n\":3}\n").await;
    let ids: Vec<i64> = out
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
            assert_eq!(v["existing"], false, "{l}");
            v["id"].as_i64().expect("an id")
        })
        .collect();
    assert_eq!(ids.len(), 3, "{out}");
    for (n, id) in ids.iter().enumerate() {
        let job = support::run_ok(&url, &["jobs", "show", &id.to_string()], "").await;
        let job: serde_json::Value = serde_json::from_str(&job).expect("JSON");
        assert_eq!(
            job["payload"]["n"],
            n + 1,
            "ids in the order of the input: {job}"
        );
    }
}

/// The README's completions line works where the folder is missing: run as written, with
/// HOME a fresh directory (and this `rowclaim` first on PATH).
#[test]
fn readme_completions_line_makes_its_folder() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let line = readme
        .lines()
        .find(|l| l.contains("rowclaim completions bash >"))
        .expect("the README's completions line");
    let home = tempfile::tempdir().expect("temp dir");
    let bin = std::path::Path::new(support::BIN)
        .parent()
        .expect("its folder");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .args(["-c", line])
        .env("HOME", home.path())
        .env("PATH", path)
        .output()
        .expect("run sh");
    assert!(out.status.success(), "{line}: {out:?}");
    let script = home
        .path()
        .join(".local/share/bash-completion/completions/rowclaim");
    let text = std::fs::read_to_string(&script).expect("the script was written");
    assert!(text.contains("complete -F _rowclaim"), "{text}");
}
