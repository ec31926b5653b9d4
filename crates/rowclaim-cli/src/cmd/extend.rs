//! `rowclaim extend`: push the lease of rows a token holds, so a slow script keeps them.

use std::time::Duration;

use clap::Args;

use super::settle::{settle, TokenArgs};
use crate::error::CliError;

#[derive(Args, Debug)]
pub struct ExtendArgs {
    #[command(flatten)]
    token: TokenArgs,
    /// The new lease, from now (at most 7d).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::values::lease, allow_hyphen_values = true)]
    lease: Duration,
}

pub async fn run(url: &str, a: ExtendArgs) -> Result<(), CliError> {
    let lease = a.lease;
    settle(url, &a.token, "extended", move |c, t, ids| async move {
        c.extend(&t, &ids, lease).await
    })
    .await
}
