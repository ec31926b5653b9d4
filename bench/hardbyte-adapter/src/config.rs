//! The harness's environment (CONTRIBUTING_ADAPTERS.md, "Env in"), read once at start.

use std::time::Duration;

pub struct Config {
    pub database_url: String,
    pub system: String,
    pub db_name: String,
    pub mode: String,
    pub pacing: String,
    pub rate: u64,
    pub rate_file: Option<String>,
    pub batch_max: u64,
    pub batch_ms: u64,
    /// PRODUCER_INFLIGHT: `enqueue_many` batches in flight at once, at most (default 4).
    pub inflight: usize,
    pub target_depth: u64,
    pub workers: usize,
    pub payload_bytes: usize,
    pub work: Duration,
    pub sample_every_s: u64,
    pub instance: u64,
    /// ROWCLAIM_RETENTION=keep keeps completed jobs; the default deletes them as they complete.
    pub keep_completed: bool,
}

impl Config {
    pub fn from_env() -> anyhow::Result<Config> {
        let database_url = std::env::var("DATABASE_URL")
            .map_err(|_| anyhow::anyhow!("DATABASE_URL is not set"))?;
        let db_name = database_url
            .rsplit('/')
            .next()
            .and_then(|s| s.split('?').next())
            .unwrap_or("rowclaim_bench")
            .to_string();
        Ok(Config {
            database_url,
            system: text("ROWCLAIM_BENCH_SYSTEM", "rowclaim"),
            db_name,
            mode: text("PRODUCER_MODE", "fixed"),
            pacing: text("PRODUCER_PACING", "adapter"),
            rate: number("PRODUCER_RATE", 800),
            rate_file: std::env::var("PRODUCER_RATE_CONTROL_FILE").ok(),
            batch_max: number("PRODUCER_BATCH_MAX", 128).max(1),
            batch_ms: number("PRODUCER_BATCH_MS", 25).max(1),
            inflight: number("PRODUCER_INFLIGHT", 4).clamp(1, 64) as usize,
            target_depth: number("TARGET_DEPTH", 1000),
            workers: number("WORKER_COUNT", 32).max(1) as usize,
            payload_bytes: number("JOB_PAYLOAD_BYTES", 256) as usize,
            work: Duration::from_millis(number("JOB_WORK_MS", 1)),
            sample_every_s: number("SAMPLE_EVERY_S", 5).max(1),
            instance: number("BENCH_INSTANCE_ID", 0),
            keep_completed: text("ROWCLAIM_RETENTION", "delete") == "keep",
        })
    }

    pub fn depth_target(&self) -> bool {
        self.mode == "depth-target"
    }

    pub fn harness_paced(&self) -> bool {
        self.pacing == "harness" && !self.depth_target()
    }

    /// The offered rate now: the control file's, which the harness rewrites for its high-load
    /// phase, or PRODUCER_RATE.
    pub fn current_rate(&self) -> f64 {
        self.rate_file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .unwrap_or(self.rate as f64)
    }
}

fn text(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v.max(0.0) as u64)
        .unwrap_or(default)
}
