//! Typed jobs: a job type, enqueued and run. `cargo run -p rowclaim --example typed_jobs` (on
//! `$DATABASE_URL`, else a SQLite file `rowclaim.db` here) enqueues a welcome for Ada and runs
//! the mail queue until it is empty.
//!
//! The part between the README markers is README.md's typed example, word for word: a test
//! (`tests/typed.rs`) checks that they are alike and runs it on every database.

// README begin
use rowclaim::{Db, JobArgs, JobContext, Worker, WorkerReport};
use serde::{Deserialize, Serialize};

/// The job: its fields are the payload, its type names the kind.
#[derive(Serialize, Deserialize)]
struct Welcome {
    to: String,
    name: String,
}

impl JobArgs for Welcome {
    const KIND: &'static str = "welcome";
    const QUEUE: &'static str = "mail"; // also PRIORITY, MAX_ATTEMPTS, TIMEOUT
    const MAX_ATTEMPTS: i32 = 5;

    fn unique_key(&self) -> Option<String> {
        Some(format!("welcome:{}", self.to)) // one pending welcome per address
    }
}

/// What the handler returns is kept as the job's output (any serde type; `()` keeps none).
#[derive(Serialize)]
struct Sent {
    message_id: String,
}

async fn send_welcome(email: Welcome, job: JobContext) -> Result<Sent, std::io::Error> {
    // Also job.id, job.queue, and job.stopped() for work it hands to another task.
    println!(
        "welcome, {} <{}>: attempt {}",
        email.name, email.to, job.attempt
    );
    Ok(Sent {
        message_id: format!("<welcome-{}@example.com>", job.id),
    }) // an Err is retried with backoff, then the job is dead
}

pub async fn welcome_ada(db: &Db) -> rowclaim::Result<WorkerReport> {
    let ada = Welcome {
        to: "ada@example.com".into(),
        name: "Ada".into(),
    };
    db.queue().enqueue(&ada).await?; // kind "welcome", queue "mail", 5 attempts
    Worker::new(db)
        .queue(Welcome::QUEUE)
        .register(send_welcome) // Welcome's kind, handled by a function of a Welcome
        .concurrency(8)
        .until_empty(true) // returns once the queue is empty
        .run(std::future::pending()) // or runs until this ends: a Ctrl-C, a shutdown signal
        .await
}
// README end

#[tokio::main]
async fn main() -> rowclaim::Result<()> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://rowclaim.db".into());
    let db = Db::connect(&url).await?;
    db.queue().init().await?;
    let report = welcome_ada(&db).await?;
    println!(
        "{} completed, {} retried, {} dead",
        report.completed, report.retried, report.dead
    );
    Ok(())
}
