//! `rowclaim bench`: the `rowclaim-bench` crate's scenarios, run from this command. The bench
//! lives in its own crate; this file gives it the database and this binary (for
//! `bench worker -- COMMAND`, which measures `rowclaim work` as a child process).

use std::path::PathBuf;

use rowclaim_bench::{BenchCommand, Setting};

use crate::error::CliError;

pub async fn run(url: &str, scenario: BenchCommand) -> Result<(), CliError> {
    let setting = Setting {
        url: url.to_owned(),
        // This very binary is the `rowclaim` to run; should the OS not say where it is, the
        // `rowclaim` on the PATH is the best guess.
        rowclaim: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("rowclaim")),
    };
    Ok(rowclaim_bench::run(&setting, scenario).await?)
}
