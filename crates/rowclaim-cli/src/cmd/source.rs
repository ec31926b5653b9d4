//! `rowclaim source`: the source registry, where the first claim on a table records the mapping
//! every later claimer of it must agree on (see the library's `registry` module): list the
//! records, replace one when every claimer moves to a new mapping, forget one.

use clap::{Args, Subcommand};
use rowclaim::registry::RecordedSource;
use rowclaim::Db;

use super::source_args::{SourceArgs, Target};
use crate::error::CliError;

#[derive(Subcommand, Debug)]
pub enum SourceCommand {
    /// Show every table's recorded mapping: the columns and values its claimers agree on and
    /// where they keep their claims.
    List(ListArgs),
    /// Replace a table's record with the mapping given by the table flags (and --strategy). For
    /// when every claimer of the table moves to the new mapping: a claimer still running with
    /// the old one keeps running until it restarts, and is refused then.
    Replace(Box<ReplaceArgs>),
    /// Remove a table's record; the next claim on the table records its mapping anew. Exits 1
    /// when there was no record.
    Forget(ForgetArgs),
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// One JSON array instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ReplaceArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Print the new record as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ForgetArgs {
    /// The table (optionally schema.table).
    #[arg(value_name = "TABLE")]
    table: String,
}

pub async fn run(url: &str, cmd: SourceCommand) -> Result<(), CliError> {
    let db = Db::connect(url).await?;
    match cmd {
        SourceCommand::List(a) => {
            let records = db.recorded_sources().await?;
            if a.json {
                return print_json(&records);
            }
            if records.is_empty() {
                println!(
                    "no table has a recorded mapping yet (the first claim on a table records it)"
                );
            }
            for r in &records {
                println!("{}", describe(r));
            }
            Ok(())
        }
        SourceCommand::Replace(a) => {
            let source =
                match a.source.target()? {
                    Target::Table(source) => *source,
                    Target::Queues(_) => return Err(CliError::BadInput(
                        "source replace: the managed queue's mapping is rowclaim's own and has no \
                         record; give --table or --source"
                            .into(),
                    )),
                };
            let record = db.record_source(source, a.source.strategy).await?;
            if a.json {
                return print_json(&record);
            }
            println!("recorded: {}", describe(&record));
            Ok(())
        }
        SourceCommand::Forget(a) => {
            if db.forget_source(&a.table).await? {
                println!("forgot the recorded mapping of {}", a.table);
                Ok(())
            } else {
                Err(CliError::NothingClaimed(format!(
                    "{} has no recorded mapping",
                    a.table
                )))
            }
        }
    }
}

/// One record as a line of text.
fn describe(r: &RecordedSource) -> String {
    let column = |c: &Option<String>| c.clone().unwrap_or_else(|| "none".into());
    format!(
        "{}: id {}, status {} (ready {:?}, claimed {:?}), owner {}, lease {}; claims kept {}; \
         recorded {} by strategy {}",
        r.table,
        r.id_column,
        r.status_column,
        r.ready,
        r.claimed,
        column(&r.owner_column),
        column(&r.lease_column),
        r.claims,
        humantime::format_rfc3339_seconds(r.recorded_time()),
        r.strategy
    )
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::io("writing the records")(e.into()))?;
    println!("{text}");
    Ok(())
}
