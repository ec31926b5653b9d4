//! A claim's lease as this worker knows it, by its own monotonic clock: no database in here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A claim's lease as this worker knows it, by its own monotonic clock (see the module docs of
/// the runtime): no database in here.
#[derive(Debug)]
pub(super) struct Lease {
    length: Duration,
    /// When the database last confirmed the lease.
    confirmed: Mutex<Instant>,
    /// The worker gave the whole claim up (its lease could not be renewed in time, or its held
    /// transaction was left in an unknown state).
    abandoned: AtomicBool,
}

impl Lease {
    pub(super) fn new(length: Duration, confirmed: Instant) -> Lease {
        Lease {
            length,
            confirmed: Mutex::new(confirmed),
            abandoned: AtomicBool::new(false),
        }
    }

    pub(super) fn length(&self) -> Duration {
        self.length
    }

    /// When the database last confirmed the lease.
    pub(super) fn confirmed(&self) -> Instant {
        *self.confirmed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the lease ends at the earliest, as far as this worker knows.
    pub(super) fn end(&self) -> Instant {
        self.confirmed() + self.length
    }

    /// The database renewed the lease with a statement sent at `sent`.
    pub(super) fn confirm(&self, sent: Instant) {
        let mut c = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        *c = (*c).max(sent);
    }

    /// Whether a waiting row may start: its lease is known to last a while yet. The margin (a
    /// quarter of the lease) leaves the heartbeat, which renews every third, time to act.
    pub(super) fn may_start(&self, renews: bool) -> bool {
        !renews || Instant::now() + self.length / 4 < self.end()
    }

    pub(super) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    pub(super) fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_row_starts_only_while_a_quarter_of_its_lease_is_left() {
        let lease = Lease::new(Duration::from_secs(40), Instant::now());
        assert!(lease.may_start(true));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(lease.may_start(true), "11 s of 40 left");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!lease.may_start(true), "10 s of 40 left: no margin");
        assert!(lease.may_start(false), "a claim that never expires");
        // A renewal sent now moves the end on; an older confirmation does not move it back.
        lease.confirm(Instant::now());
        assert!(lease.may_start(true));
        lease.confirm(Instant::now() - Duration::from_secs(35));
        assert!(lease.may_start(true));
        assert_eq!(lease.end(), Instant::now() + Duration::from_secs(40));
    }
}
