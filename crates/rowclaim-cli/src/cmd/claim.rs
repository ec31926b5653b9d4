//! `rowclaim claim`: claim rows and print them as JSON lines with their token, for a script to
//! settle later with `complete`, `fail` or `release`.

use std::io::Write;
use std::time::Duration;

use clap::Args;

use super::source_args::SourceArgs;
use crate::error::CliError;

#[derive(Args, Debug)]
pub struct ClaimArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Rows to claim at most.
    #[arg(long, value_name = "N", default_value = "1", value_parser = super::values::count, allow_hyphen_values = true)]
    batch: u32,
    /// How long the claim holds the rows, e.g. 30s, 5m (at most 7d).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::values::lease, allow_hyphen_values = true)]
    lease: Duration,
}

pub async fn run(url: &str, a: ClaimArgs) -> Result<(), CliError> {
    if a.source.strategy == rowclaim::Strategy::Transaction {
        let why = "the transaction strategy holds rows only while the claiming process runs, \
                   and claim exits at once; use it with `rowclaim work`";
        return Err(CliError::BadInput(why.into()));
    }
    let claimer = super::claimer(url, &a.source, 2).await?;
    super::say_strategy(&claimer, a.source.strategy);
    let claim = claimer.claim(a.batch, a.lease).await?;
    if claim.is_empty() {
        let what = format!("nothing to claim in {}", claimer.table_name());
        return Err(CliError::NothingClaimed(what));
    }
    let mut out = std::io::stdout().lock();
    let queue = !a.source.queues.is_empty();
    for row in claim.rows() {
        let mut data = row.data.clone();
        // A job's payload arrives as its JSON text: show it as the JSON it is.
        if let Some(p) = data.get_mut("payload").filter(|_| queue) {
            if let Some(parsed) = p.as_str().and_then(|s| serde_json::from_str(s).ok()) {
                *p = parsed;
            }
        }
        let line = serde_json::json!({
            "token": claim.token().to_string(),
            "id": row.id,
            "row": data,
        });
        writeln!(out, "{line}").map_err(CliError::io("writing to stdout"))?;
    }
    Ok(())
}
