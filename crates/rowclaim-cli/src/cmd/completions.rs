//! `rowclaim completions SHELL`: a shell's completion script, made by clap from the command line.

use std::io::Write;

use clap::Args;
use clap_complete::Shell;

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: Shell,
    /// Not taken: a completion script needs no database (hidden; it keeps the global
    /// --database out of this command's help).
    #[arg(long, hide = true)]
    database: Option<String>,
}

pub fn run(a: CompletionsArgs) -> Result<(), CliError> {
    let mut command = super::help::command();
    // Into a buffer first: clap_complete panics on a write error (a closed pipe, say).
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut command, "rowclaim", &mut script);
    std::io::stdout()
        .write_all(&script)
        .map_err(CliError::io("writing the completion script"))
}
