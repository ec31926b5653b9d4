//! A claim's lease as this worker knows it, by its own monotonic clock, less any time the
//! machine spent suspended: no database in here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A moment by two clocks: the monotonic one (which stops while the machine or VM is
/// suspended, and tokio's timers with it) and, on Linux, `CLOCK_BOOTTIME` (which does not).
/// How far they drifted apart since is the time spent suspended: the database's clock went on
/// meanwhile, and the lease with it.
#[derive(Clone, Copy, Debug)]
struct Mark {
    mono: std::time::Instant,
    boot: Option<Duration>,
}

/// Drift below this is the two clocks read a moment apart, not a suspend.
const NOISE: Duration = Duration::from_millis(50);

impl Mark {
    fn now() -> Mark {
        // The monotonic clock first, the boot clock after: without a suspend, the boot clock's
        // span since then is never the longer of the two.
        let mono = std::time::Instant::now();
        Mark {
            mono,
            boot: boot_clock(),
        }
    }

    /// The time spent suspended since this mark.
    fn suspended_since(&self) -> Duration {
        let (Some(then), Some(now)) = (self.boot, boot_clock()) else {
            return Duration::ZERO;
        };
        let drift = now.saturating_sub(then).saturating_sub(self.mono.elapsed());
        if drift < NOISE {
            Duration::ZERO
        } else {
            drift
        }
    }
}

/// `CLOCK_BOOTTIME` where there is one.
#[cfg(target_os = "linux")]
fn boot_clock() -> Option<Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Some(Duration::new(
        u64::try_from(t.tv_sec).ok()?,
        u32::try_from(t.tv_nsec).ok()?,
    ))
}

#[cfg(not(target_os = "linux"))]
fn boot_clock() -> Option<Duration> {
    None
}

/// A claim's lease as this worker knows it, by its own monotonic clock (see the module docs of
/// the runtime): no database in here.
#[derive(Debug)]
pub(super) struct Lease {
    length: Duration,
    /// When the database last confirmed the lease, and that moment by both clocks.
    confirmed: Mutex<(Instant, Mark)>,
    /// The worker gave the whole claim up (its lease could not be renewed in time, or its held
    /// transaction was left in an unknown state).
    abandoned: AtomicBool,
}

impl Lease {
    pub(super) fn new(length: Duration, confirmed: Instant) -> Lease {
        Lease {
            length,
            confirmed: Mutex::new((confirmed, Mark::now() - confirmed.elapsed())),
            abandoned: AtomicBool::new(false),
        }
    }

    pub(super) fn length(&self) -> Duration {
        self.length
    }

    /// When the database last confirmed the lease.
    pub(super) fn confirmed(&self) -> Instant {
        self.confirmed.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    /// When the lease ends at the earliest, as far as this worker knows: a time spent suspended
    /// since it was confirmed counts against it, though the monotonic clock did not see it.
    pub(super) fn end(&self) -> Instant {
        let (confirmed, mark) = *self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        let end = confirmed + self.length;
        end.checked_sub(mark.suspended_since()).unwrap_or(confirmed)
    }

    /// The database renewed the lease with a statement sent at `sent`.
    pub(super) fn confirm(&self, sent: Instant) {
        let mut c = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        if sent > c.0 {
            *c = (sent, Mark::now() - sent.elapsed());
        }
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

    /// As if the machine had been suspended for `d` since the lease was confirmed.
    #[cfg(test)]
    fn suspend_for(&self, d: Duration) {
        let mut c = self.confirmed.lock().unwrap_or_else(|p| p.into_inner());
        c.1.boot = c.1.boot.map(|b| b.saturating_sub(d));
    }
}

impl std::ops::Sub<Duration> for Mark {
    type Output = Mark;

    /// The mark as it was `d` ago (by both clocks, no suspend between).
    fn sub(self, d: Duration) -> Mark {
        Mark {
            mono: self.mono.checked_sub(d).unwrap_or(self.mono),
            boot: self.boot.map(|b| b.saturating_sub(d)),
        }
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

    #[tokio::test(start_paused = true)]
    #[cfg(target_os = "linux")]
    async fn a_suspend_counts_against_the_lease() {
        let lease = Lease::new(Duration::from_secs(40), Instant::now());
        assert_eq!(lease.end(), Instant::now() + Duration::from_secs(40));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(lease.may_start(true));
        // 30 s asleep: the monotonic clock saw none of it, the database's lease did.
        lease.suspend_for(Duration::from_secs(30));
        assert!(!lease.may_start(true), "5 s awake + 30 s asleep of 40");
        let end = lease.end();
        assert!(
            end <= Instant::now() + Duration::from_millis(5_100),
            "{:?} left",
            end - Instant::now()
        );
        // A renewal after waking starts a new lease.
        lease.confirm(Instant::now());
        assert!(lease.may_start(true));
    }
}
