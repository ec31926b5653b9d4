//! `rowclaim init`: create or migrate the managed job queue's table.

use rowclaim::Db;

use crate::error::CliError;

pub async fn run(url: &str) -> Result<(), CliError> {
    let db = Db::connect(url).await?;
    db.queue().init().await?;
    eprintln!(
        "rowclaim: the managed queue is ready on {}",
        db.server().await?.description
    );
    Ok(())
}
