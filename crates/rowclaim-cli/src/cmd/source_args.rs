//! `<source>`: the table flags that `work`, `claim`, `complete`/`fail`/`release`, `extend`,
//! `stats` and `check` share: a table and its column mapping on the command line, a named source
//! from `rowclaim.toml`, or the managed queue (`--queue`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use rowclaim::{Source, Strategy};

use crate::error::CliError;

/// The config file when --config names none.
const DEFAULT_CONFIG: &str = "rowclaim.toml";

/// The table to work on and how its columns map. Either --table (with the column flags) or
/// --source NAME from the config file.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Source (the table and its columns)")]
pub struct SourceArgs {
    /// The table (optionally schema.table). Identifiers must be plain names: letters, digits, _.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["source", "queues"])]
    pub table: Option<String>,
    /// Use the managed job queue (see `rowclaim init`): jobs of queue Q. Repeat for several.
    #[arg(long = "queue", value_name = "Q", conflicts_with = "source")]
    pub queues: Vec<String>,
    /// Column holding each row's unique id (integer or text).
    #[arg(long, value_name = "C", default_value = "id")]
    pub id_column: String,
    /// Column holding each row's status (integer or text).
    #[arg(long, value_name = "C", default_value = "status")]
    pub status_column: String,
    /// Status value of rows waiting to be claimed.
    #[arg(long, value_name = "V", default_value = "ready")]
    pub ready: String,
    /// Status value of claimed rows.
    #[arg(long, value_name = "V", default_value = "claimed")]
    pub claimed: String,
    /// Status value of finished rows.
    #[arg(long, value_name = "V", default_value = "done")]
    pub done: String,
    /// Status value of failed rows.
    #[arg(long, value_name = "V", default_value = "failed")]
    pub failed: String,
    /// Text column (36+ characters) that holds the claim token of the row's owner.
    #[arg(long, value_name = "C")]
    pub owner_column: Option<String>,
    /// Column holding the lease end: timestamptz (PostgreSQL), DATETIME(6) UTC (MySQL/MariaDB),
    /// INTEGER epoch milliseconds (SQLite). With it, rows of a dead worker come back.
    #[arg(long, value_name = "C")]
    pub lease_column: Option<String>,
    /// Integer column counting claims of a row.
    #[arg(long, value_name = "C")]
    pub attempts_column: Option<String>,
    /// Claim order: "col [asc|desc], …" (default: the id column, ascending).
    #[arg(long, value_name = "ORDER")]
    pub order_by: Option<String>,
    /// Extra SQL condition rows must meet, e.g. "queue = 'mail'". TRUSTED INPUT: pasted into the
    /// SQL as written, so it must come from the operator, never from end users.
    #[arg(long = "where", value_name = "SQL")]
    pub filter: Option<String>,
    /// Use the source NAME from the config file ([source.NAME] in ./rowclaim.toml).
    #[arg(long, value_name = "NAME")]
    pub source: Option<String>,
    /// The config file (default: ./rowclaim.toml): its [source.NAME] for --source; with
    /// `work --queue`, its [schedule.NAME] of the queues served. A missing ./rowclaim.toml has
    /// none; a file named here must exist.
    #[arg(long, value_name = "PATH", value_hint = clap::ValueHint::FilePath)]
    pub config: Option<PathBuf>,
    /// How rows are claimed.
    #[arg(long, value_name = "S", default_value = "auto", value_parser = strategies())]
    pub strategy: Strategy,
}

/// The strategies by name, which completion scripts offer (not file names).
fn strategies() -> impl clap::builder::TypedValueParser<Value = Strategy> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Strategy::ALL.map(Strategy::name))
        .try_map(|s: String| s.parse::<Strategy>())
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    source: BTreeMap<String, Source>,
    /// Read by `schedule.rs`; only allowed here.
    #[serde(default, rename = "schedule")]
    _schedule: Option<toml::Value>,
}

/// What a command works on: a table (given or configured) or the managed queue.
pub enum Target {
    Table(Box<Source>),
    Queues(Vec<String>),
}

impl SourceArgs {
    /// Whether any of --table, --source, --queue was given.
    pub fn given(&self) -> bool {
        self.table.is_some() || self.source.is_some() || !self.queues.is_empty()
    }

    /// The config file: --config, else ./rowclaim.toml.
    pub fn config_file(&self) -> &Path {
        self.config.as_deref().unwrap_or(Path::new(DEFAULT_CONFIG))
    }

    /// What the flags name: the managed queue, a configured source, or a table and its columns.
    pub fn target(&self) -> Result<Target, CliError> {
        if !self.queues.is_empty() {
            if self.strategy != Strategy::Auto {
                let why = "the managed queue chooses its strategy itself: drop --strategy";
                return Err(CliError::BadInput(why.into()));
            }
            return Ok(Target::Queues(self.queues.clone()));
        }
        self.to_source().map(|s| Target::Table(Box::new(s)))
    }

    fn to_source(&self) -> Result<Source, CliError> {
        if let Some(name) = &self.source {
            let config = self.config_file();
            let path = config.display();
            let text = std::fs::read_to_string(config).map_err(|e| {
                CliError::BadInput(format!("--source {name}: cannot read {path}: {e}"))
            })?;
            let mut file: ConfigFile = toml::from_str(&text).map_err(|e| {
                CliError::BadInput(format!("{path} is not a valid rowclaim config: {e}"))
            })?;
            let Some(source) = file.source.remove(name) else {
                let known: Vec<&String> = file.source.keys().collect();
                let why = format!("{path} has no [source.{name}] (it has: {known:?})");
                return Err(CliError::BadInput(why));
            };
            return Ok(source);
        }
        let Some(table) = &self.table else {
            let why = "name the table with --table, a configured source with --source, or the \
                       managed queue with --queue";
            return Err(CliError::BadInput(why.into()));
        };
        let mut s = Source::new(table)
            .id_column(&self.id_column)
            .status_column(&self.status_column)
            .status_values(&self.ready, &self.claimed, &self.done, &self.failed);
        if let Some(c) = &self.owner_column {
            s = s.owner_column(c);
        }
        if let Some(c) = &self.lease_column {
            s = s.lease_column(c);
        }
        if let Some(c) = &self.attempts_column {
            s = s.attempts_column(c);
        }
        if let Some(o) = &self.order_by {
            s = s.order_by(o);
        }
        if let Some(w) = &self.filter {
            s = s.filter(w);
        }
        Ok(s)
    }
}
