//! What the CLI's test binaries share: the binary, the harness table's flags, how to start it.
#![allow(dead_code)]

pub mod dashboard;
pub mod scrape;

use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const BIN: &str = env!("CARGO_BIN_EXE_rowclaim");

/// The own-table flags for the harness's `jobs` table (`TestDb::jobs`).
pub const TABLE: [&str; 8] = [
    "--table",
    "jobs",
    "--owner-column",
    "owner",
    "--lease-column",
    "lease_until",
    "--attempts-column",
    "attempts",
];

/// `rowclaim --database URL ARGS…`, with nothing from the environment that would change it,
/// no stdin, and killed if the test drops it.
pub fn rowclaim(url: &str, args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(BIN);
    c.arg("--database").arg(url).args(args);
    c.env_remove("DATABASE_URL")
        .env_remove("ROWCLAIM_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

/// Microseconds since the epoch: the clock bash's `$EPOCHREALTIME` reads too.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Runs `rowclaim ARGS…` against `url` to its end (at most 2 minutes), with `stdin` fed in.
pub async fn run_fed(url: &str, args: &[&str], stdin: &str) -> Output {
    let mut c = rowclaim(url, args);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start rowclaim");
    let mut input = child.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut input, stdin.as_bytes())
        .await
        .expect("feed rowclaim");
    drop(input);
    tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("rowclaim ends within 2 minutes")
        .expect("wait for rowclaim")
}

/// Waits (at most 5 minutes) for a rowclaim process to exit by itself: its exit code and stderr.
pub async fn finish(child: tokio::process::Child) -> (Option<i32>, String) {
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("rowclaim exits within 5 minutes")
        .expect("wait for rowclaim");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `rowclaim ARGS…` with `stdin` fed in, asserts it succeeded, and returns its stdout.
pub async fn run_ok(url: &str, args: &[&str], stdin: &str) -> String {
    let out = run_fed(url, args, stdin).await;
    assert!(out.status.success(), "rowclaim {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `sql` (at most 3 minutes: the suite runs on a loaded machine) until it counts `want`;
/// fails the test, saying the last count, if it never does.
pub async fn until_count(t: &rowclaim_testkit::TestDb, sql: &str, want: i64) {
    let mut last = -1;
    for _ in 0..1800 {
        last = t.count(sql).await;
        if last == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{sql}: {last}, never {want}");
}

/// Kills worker processes and waits for them.
pub async fn stop(workers: Vec<tokio::process::Child>) {
    for mut w in workers {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }
}

/// A command's stderr, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A SQLite file in a directory of its own, for tests of rules the CLI keeps alike on every
/// database; commands run in that directory.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub url: String,
}

impl Scratch {
    /// A new directory holding (once a command opens it) the database file `file`.
    pub fn new(file: &str) -> Scratch {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join(file).display());
        Scratch { dir, url }
    }

    /// Runs `rowclaim ARGS…` on the scratch database, in its directory, to its end.
    pub async fn run(&self, args: &[&str]) -> Output {
        rowclaim(&self.url, args)
            .current_dir(self.dir.path())
            .output()
            .await
            .expect("run rowclaim")
    }
}
