//! `rowclaim init`: create or migrate the managed job queue's table.

use clap::Args;
use rowclaim::Db;

use crate::error::CliError;

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Also print the result as one JSON object on stdout: {"ready":true,"server":…}.
    #[arg(long)]
    json: bool,
}

pub async fn run(url: &str, a: InitArgs) -> Result<(), CliError> {
    let db = Db::connect(url).await?;
    db.queue().init().await?;
    let server = db.server().await?.description;
    crate::say::say!("the managed queue is ready on {server}");
    if a.json {
        super::print_json_line(&serde_json::json!({"ready": true, "server": server}))?;
    }
    Ok(())
}
