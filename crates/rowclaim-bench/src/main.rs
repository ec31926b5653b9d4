//! The `rowclaim-bench` binary: `rowclaim bench` without the rest of the command. Its tests run
//! it; users normally run `rowclaim bench …`, which takes the same arguments after `bench`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rowclaim_bench::{BenchCommand, Setting};

/// The exit codes, the same as `rowclaim bench`'s.
const AFTER_HELP: &str = "\
Exit codes:
  0  the run passed its own check
  2  bad input: a flag, or a strategy this server or table cannot do
  4  failure: a database error, or the run FAILED its own check

The database comes from --database, else $DATABASE_URL, else sqlite://rowclaim.db here.";

/// rowclaim's measurements, each checking its own work. Use a scratch database: the bench drops
/// and recreates its tables (rowclaim_bench, rowclaim_plain) and deletes the jobs of the queue
/// "bench".
#[derive(Parser, Debug)]
#[command(name = "rowclaim-bench", version, after_help = AFTER_HELP, max_term_width = 100)]
struct Cli {
    /// Database URL: postgres://user@host/db, mysql://user@host/db (also MariaDB),
    /// sqlite://path/to/file.db.
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        default_value = "sqlite://rowclaim.db",
        hide_env_values = true
    )]
    database: String,
    /// The rowclaim binary that `worker -- COMMAND` runs as `rowclaim work` [default: the
    /// rowclaim beside this binary, else rowclaim on the PATH].
    #[arg(long, global = true, value_name = "PATH", env = "ROWCLAIM_BIN")]
    rowclaim: Option<PathBuf>,
    /// Log more on stderr (-v: what rowclaim decides, -vv: every retry).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    scenario: BenchCommand,
}

const BAD_INPUT: u8 = 2;
const FAILURE: u8 = 4;

fn main() -> ExitCode {
    let cli = Cli::parse();
    rowclaim_bench::init_logging(cli.verbose);
    let setting = Setting {
        url: cli.database,
        rowclaim: cli.rowclaim.unwrap_or_else(rowclaim_beside_me),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rowclaim-bench: cannot start: {e}");
            return ExitCode::from(FAILURE);
        }
    };
    let result = runtime.block_on(rowclaim_bench::run(&setting, cli.scenario));
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The message is complete on its own (see BenchError): no causes to add.
            eprintln!("rowclaim-bench: {e}");
            ExitCode::from(if e.is_bad_input() { BAD_INPUT } else { FAILURE })
        }
    }
}

/// `rowclaim` in the directory of this binary (cargo builds both into the same target
/// directory, and an install puts them side by side), else plain `rowclaim`, looked up on the
/// PATH when it is run.
fn rowclaim_beside_me() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|me| Some(me.parent()?.join("rowclaim")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("rowclaim"))
}
