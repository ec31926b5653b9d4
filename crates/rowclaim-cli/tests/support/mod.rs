//! What the CLI's test binaries share: the binary, the harness table's flags, how to start it.
#![allow(dead_code)]

use std::process::Stdio;

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
