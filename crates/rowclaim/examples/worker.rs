//! A minimal worker: `cargo run -p rowclaim --example worker`, then in another shell
//! `rowclaim enqueue --queue mail --kind welcome '{"to":"ada@example.com"}'`.

use rowclaim::{Db, Worker};

#[tokio::main]
async fn main() -> rowclaim::Result<()> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://rowclaim.db".into());
    let db = Db::connect(&url).await?;
    db.queue().init().await?;
    let report = Worker::new(&db)
        .queue("mail")
        .handle("welcome", |job| async move {
            eprintln!("sending a welcome to {}", job.payload["to"]);
            Ok::<_, String>(())
        })
        .concurrency(8)
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    eprintln!("{report:?}");
    Ok(())
}
