//! The `rowclaim` command: a thin layer of clap commands over the `rowclaim` library.
//!
//! - `cmd/`: the command line (`cmd/mod.rs`) and one file per command, each with its flags and
//!   what it does; `cmd/source_args.rs` holds the table flags several commands share.
//! - `error.rs`: [`CliError`], every way a command can fail, and the exit code each means.
//! - `exit.rs`: the exit codes, written down once (for `--help`, the README and the errors).
//! - `run_command.rs`: the worker handler behind `work`, which runs a COMMAND per row.
//! - `spawn/`: how it starts a command (on Linux without forking the worker, and with the
//!   parent-death signal set).
//! - `signals.rs`: how `work` stops on SIGINT, SIGTERM and SIGHUP.
//! - `env_file.rs`: the `.env` file read before the flags.
//! - `log.rs`: the log on stderr (the library's events too), in the same `rowclaim: …` voice.
//! - `say.rs`: informational lines on stderr, which `--quiet` silences.
//! - `secret.rs`: tokens read from files and checked in constant time (the dashboard's, and
//!   `work --metrics-token-file`'s bearer token).
//!
//! `rowclaim bench` is the `rowclaim-bench` crate; `cmd/bench.rs` only hands it over.

mod cmd;
mod env_file;
mod error;
mod exit;
mod log;
#[cfg(feature = "otel")]
mod otel;
mod prometheus;
mod run_command;
mod say;
mod secret;
mod signals;
mod spawn;

use std::process::ExitCode;
use std::time::Duration;

use clap::FromArgMatches;

pub use error::CliError;

fn main() -> ExitCode {
    // Before the flags are read, so that DATABASE_URL and the like may come from it. Only the
    // current directory's: a .env further up belongs to some other project.
    if let Err(e) = env_file::load() {
        eprintln!("rowclaim: {e}");
        return exit::BAD_INPUT.into();
    }
    let matches = cmd::help::command().get_matches();
    let mut cli = cmd::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Only a --database typed on this command line, not DATABASE_URL from the environment
    // (`demo` has a hidden --database of its own, so that the global one is not in its help).
    let typed = |m: &clap::ArgMatches| {
        m.value_source("database") == Some(clap::parser::ValueSource::CommandLine)
    };
    cli.database_given = typed(&matches) || matches.subcommand_matches("demo").is_some_and(typed);
    say::set_quiet(cli.quiet);
    #[cfg(feature = "otel")]
    let (export, flush) = match otel::layer() {
        Ok(Some((layer, flush))) => (Some(layer), Some(flush)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("rowclaim: {}", e.explain());
            return e.exit_code().into();
        }
    };
    #[cfg(not(feature = "otel"))]
    let export = None;
    log::init(cli.verbose, cli.quiet, export);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rowclaim: cannot start: {e}");
            return exit::FAILURE.into();
        }
    };
    let result = runtime.block_on(cmd::run(cli));
    // Do not wait for tasks still parked on the runtime (a released signal handler, say).
    runtime.shutdown_timeout(Duration::from_millis(100));
    #[cfg(feature = "otel")]
    if let Some(flush) = flush {
        flush.now();
    }
    match result {
        Ok(()) => exit::OK.into(),
        Err(e) => {
            eprintln!("rowclaim: {}", e.explain());
            e.exit_code().into()
        }
    }
}
