//! `rowclaim complete`, `fail` and `release`: settle rows a claim token holds. `extend` (in
//! `extend.rs`) takes the same flags and goes the same way.

use clap::Args;
use rowclaim::{Claimer, RowId, Token};

use super::source_args::SourceArgs;
use crate::error::CliError;

#[derive(Args, Debug)]
pub struct TokenArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The claim's token, as `claim` printed it.
    #[arg(long, value_name = "T")]
    pub token: String,
    /// Only these rows (repeat the flag, or separate with commas); default: all rows of the token.
    /// Named rows change all together or not at all.
    #[arg(long = "id", value_name = "ID", value_delimiter = ',')]
    pub ids: Vec<String>,
    /// Also print the result as one JSON object on stdout: {"action":…,"rows":N,"token":…}.
    #[arg(long)]
    pub json: bool,
}

/// `rowclaim complete`: the rows are done.
pub async fn complete(url: &str, a: TokenArgs) -> Result<(), CliError> {
    settle(url, &a, "completed", |c, t, ids| async move {
        c.complete(&t, &ids).await
    })
    .await
}

/// `rowclaim fail`: the rows failed.
pub async fn fail(url: &str, a: TokenArgs) -> Result<(), CliError> {
    settle(url, &a, "failed", |c, t, ids| async move {
        c.fail(&t, &ids).await
    })
    .await
}

/// `rowclaim release`: the rows are ready to be claimed again.
pub async fn release(url: &str, a: TokenArgs) -> Result<(), CliError> {
    settle(url, &a, "released", |c, t, ids| async move {
        c.release(&t, &ids).await
    })
    .await
}

/// Connects, parses the token and the ids against the table, runs `op` and says how many rows
/// it changed (`rowclaim: completed 3 row(s)`; with --json also on stdout). A token that no longer holds the rows is the
/// library's `LeaseLost`, which exits 3.
pub async fn settle<F, Fut>(url: &str, a: &TokenArgs, verb: &str, op: F) -> Result<(), CliError>
where
    F: FnOnce(Claimer, Token, Vec<RowId>) -> Fut,
    Fut: std::future::Future<Output = rowclaim::Result<u64>>,
{
    // Hidden from these commands' help (see `help.rs`): they pick no rows to claim.
    if a.source.order_by.is_some() || a.source.filter.is_some() {
        return Err(CliError::BadInput(format!(
            "--order-by and --where choose the rows a claim takes; {verb} changes the rows the \
             token holds: drop them"
        )));
    }
    let claimer = super::claimer(url, &a.source, 2).await?;
    let token: Token = a.token.parse()?;
    let ids = a
        .ids
        .iter()
        .map(|id| claimer.parse_id(id))
        .collect::<rowclaim::Result<Vec<_>>>()?;
    let n = op(claimer, token, ids).await?;
    crate::say::say!("{verb} {n} row(s)");
    if a.json {
        super::print_json_line(&serde_json::json!({
            "action": verb,
            "rows": n,
            "token": token.to_string(),
        }))?;
    }
    Ok(())
}
