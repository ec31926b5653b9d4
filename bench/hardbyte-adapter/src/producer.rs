//! The producer: enqueues jobs with `Queue::enqueue_many` (rowclaim's documented bulk insert,
//! COPY on PostgreSQL), at the rate the harness offers.
//!
//! Offered load is a count of jobs owed (`Offer`), credited on real wall-clock time: by the
//! harness's `ENQUEUE <n>` tokens on stdin (PRODUCER_PACING=harness, its default) or by a local
//! ticker. The producer inserts what is owed in batches of at most PRODUCER_BATCH_MAX, up to
//! PRODUCER_INFLIGHT of them at once while it is behind. A batch that fails (PostgreSQL
//! restarting, the session killed) stays owed and is tried again after a short pause, so an
//! outage delays offered jobs instead of dropping them.

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowclaim::{NewJob, Queue};
use serde_json::json;
use tokio::sync::{watch, Notify};
use tokio::task::{self, JoinSet};

use crate::config::Config;
use crate::window::epoch_ms;
use crate::Counters;

/// Jobs owed to the queue, and a wake-up for the producer when more are.
#[derive(Default)]
pub struct Offer {
    owed: AtomicU64,
    more: Notify,
}

impl Offer {
    fn credit(&self, n: u64) {
        if n > 0 {
            self.owed.fetch_add(n, Ordering::Relaxed);
            self.more.notify_one();
        }
    }
}

/// Reads the harness's pacing tokens from stdin on a thread of its own (stdin is always read,
/// so that the harness never blocks on a full pipe). With harness pacing in fixed mode each
/// token is credited, scaled by the control file's rate over the base rate (the harness's
/// high-load phase writes 1.5× the base there; its pacer keeps sending the base rate).
pub fn read_tokens(cfg: Arc<Config>, offer: Arc<Offer>) {
    std::thread::spawn(move || {
        let use_tokens = cfg.harness_paced();
        let mut scale = Scale::new(&cfg);
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            let Some(n) = line.trim().strip_prefix("ENQUEUE ") else {
                continue;
            };
            if let (true, Ok(n)) = (use_tokens, n.parse::<u64>()) {
                offer.credit(scale.apply(&cfg, n));
            }
        }
    });
}

/// Credits the offered rate on real elapsed time, for PRODUCER_PACING=adapter.
pub async fn tick_locally(cfg: Arc<Config>, offer: Arc<Offer>, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_millis(cfg.batch_ms);
    let mut last = Instant::now();
    let mut credit = 0.0_f64;
    while !*stop.borrow() {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
        let now = Instant::now();
        credit += cfg.current_rate() * now.duration_since(last).as_secs_f64();
        last = now;
        let whole = credit.floor();
        credit -= whole;
        offer.credit(whole as u64);
    }
}

/// The control file's rate over the base rate, re-read twice a second at most.
struct Scale {
    factor: f64,
    read_at: Instant,
    credit: f64,
}

impl Scale {
    fn new(cfg: &Config) -> Scale {
        Scale {
            factor: cfg.current_rate() / cfg.rate.max(1) as f64,
            read_at: Instant::now(),
            credit: 0.0,
        }
    }

    fn apply(&mut self, cfg: &Config, n: u64) -> u64 {
        if self.read_at.elapsed() > Duration::from_millis(500) {
            self.factor = cfg.current_rate() / cfg.rate.max(1) as f64;
            self.read_at = Instant::now();
        }
        self.credit += n as f64 * self.factor;
        let whole = self.credit.floor();
        self.credit -= whole;
        whole as u64
    }
}

/// Inserts what is owed (fixed mode) or what keeps the queue at TARGET_DEPTH (depth-target
/// mode) until `stop`, with up to PRODUCER_INFLIGHT batches in flight at once.
///
/// A batch smaller than PRODUCER_BATCH_MAX starts only when none is in flight (so at a rate
/// one batch keeps up with, jobs owed during a call gather into the next batch, as with one
/// producer); more batches run at once only while at least a full batch is owed. What is in
/// flight is counted as reserved so that no job is inserted twice. A failed batch is no
/// longer reserved, so what it carried is owed again; no batch starts until its pause
/// (100 ms, doubling to 2 s, one step per failure seen after the last pause ended) is over.
pub async fn run(
    queue: Queue,
    cfg: Arc<Config>,
    offer: Arc<Offer>,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
) {
    let padding = "x".repeat(cfg.payload_bytes.saturating_sub(64).max(1));
    let mut seq: u64 = 0;
    let mut backoff = Backoff::default();
    let mut flights: JoinSet<Flight> = JoinSet::new();
    // Jobs of each batch in flight, by task (a task that panicked returns no Flight).
    let mut sizes: HashMap<task::Id, u64> = HashMap::new();
    while !*stop.borrow() {
        while backoff.ready() && flights.len() < cfg.inflight {
            let reserved: u64 = sizes.values().sum();
            let want = if cfg.depth_target() {
                let depth = counters.depth.load(Ordering::Relaxed);
                cfg.target_depth.saturating_sub(depth + reserved)
            } else {
                offer.owed.load(Ordering::Relaxed).saturating_sub(reserved)
            };
            if want == 0 || (want < cfg.batch_max && !flights.is_empty()) {
                break;
            }
            let n = want.min(cfg.batch_max);
            let jobs = batch(n, &mut seq, &padding);
            let queue = queue.clone();
            let handle = flights.spawn(async move {
                let started = Instant::now();
                let result = queue.enqueue_many(&jobs).await.map(|_| ());
                Flight {
                    n,
                    took: started.elapsed(),
                    result,
                }
            });
            sizes.insert(handle.id(), n);
        }
        let wait = backoff.left().min(Duration::from_millis(50));
        tokio::select! {
            Some(done) = flights.join_next_with_id(), if !flights.is_empty() => {
                let id = match &done {
                    Ok((id, _)) => *id,
                    Err(e) => e.id(),
                };
                sizes.remove(&id);
                match done.map(|(_, flight)| flight) {
                    Ok(Flight { n, took, result: Ok(()) }) => {
                        counters.enqueued.fetch_add(n, Ordering::Relaxed);
                        counters.producer_call.record(took.as_secs_f64() * 1000.0);
                        if cfg.depth_target() {
                            // Depth is polled every 100 ms; count what was just added until then.
                            counters.depth.fetch_add(n, Ordering::Relaxed);
                        } else {
                            offer.owed.fetch_sub(n, Ordering::Relaxed);
                        }
                        backoff.succeeded();
                    }
                    Ok(Flight { n, result: Err(e), .. }) => {
                        counters.producer_errors.fetch_add(1, Ordering::Relaxed);
                        backoff.failed(format_args!("enqueue of {n} jobs failed: {e}"));
                    }
                    Err(e) => {
                        counters.producer_errors.fetch_add(1, Ordering::Relaxed);
                        backoff.failed(format_args!("enqueue task failed: {e}"));
                    }
                }
            }
            _ = offer.more.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The pause after a failed batch: 100 ms, doubling to 2 s, back to 100 ms after a batch
/// goes in. Failures of batches that were in flight together count as one step.
struct Backoff {
    pause: Duration,
    until: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            pause: Duration::from_millis(100),
            until: None,
        }
    }
}

impl Backoff {
    /// Whether a batch may start now.
    fn ready(&mut self) -> bool {
        if self.until.is_some_and(|at| Instant::now() >= at) {
            self.until = None;
        }
        self.until.is_none()
    }

    /// How long until a batch may start.
    fn left(&self) -> Duration {
        self.until.map_or(Duration::MAX, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    fn succeeded(&mut self) {
        self.pause = Duration::from_millis(100);
    }

    fn failed(&mut self, why: std::fmt::Arguments<'_>) {
        if self.until.is_some() {
            eprintln!("[rowclaim-adapter] {why}; it is owed again");
            return;
        }
        eprintln!(
            "[rowclaim-adapter] {why}; owed again, retrying in {:?}",
            self.pause
        );
        self.until = Some(Instant::now() + self.pause);
        self.pause = (self.pause * 2).min(Duration::from_secs(2));
    }
}

/// One batch's outcome.
struct Flight {
    n: u64,
    took: Duration,
    result: Result<(), rowclaim::Error>,
}

fn batch(n: u64, seq: &mut u64, padding: &str) -> Vec<NewJob> {
    let now = epoch_ms();
    (0..n)
        .map(|_| {
            *seq += 1;
            NewJob::new(json!({ "seq": *seq, "produced_at_ms": now, "padding": padding }))
                .queue(crate::QUEUE)
                .kind(crate::KIND)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_while_paused_are_one_step_and_success_resets() {
        let mut b = Backoff::default();
        assert!(b.ready());
        b.failed(format_args!("first"));
        assert!(!b.ready(), "no batch starts during the pause");
        assert_eq!(b.pause, Duration::from_millis(200));
        // Batches that were in flight with the first fail too: the same pause, one step.
        b.failed(format_args!("second, in flight with the first"));
        assert_eq!(b.pause, Duration::from_millis(200));
        assert!(b.left() <= Duration::from_millis(100));
        std::thread::sleep(Duration::from_millis(110));
        assert!(b.ready(), "the pause is over");
        b.failed(format_args!("again after the pause"));
        assert_eq!(b.pause, Duration::from_millis(400));
        for _ in 0..10 {
            b.until = None;
            b.failed(format_args!("outage"));
        }
        assert_eq!(b.pause, Duration::from_secs(2), "the pause is capped");
        b.succeeded();
        assert_eq!(b.pause, Duration::from_millis(100));
    }
}
