//! How long to wait before trying the database again after a failure: one rule for everything
//! that waits out an outage (a worker's claims, heartbeats and results, a scheduler's passes).

use std::time::Duration;

/// The first pause after a failure; it doubles per failure up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two tries ("capped at a few seconds").
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(5);

/// How long to wait before try number `failures + 1`: 100 ms, 200 ms, … capped at 5 s, each
/// ±25% at random so that workers that lost the database together do not return together.
pub(crate) fn pause(failures: u32) -> Duration {
    let base = FIRST_PAUSE
        .saturating_mul(1 << failures.min(16))
        .min(MAX_PAUSE);
    let jitter = f64::from(uuid::Uuid::now_v7().as_bytes()[15]) / 255.0; // 0..=1
    base.mul_f64(0.75 + 0.5 * jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_and_are_capped() {
        let first = pause(0);
        assert!(first >= Duration::from_millis(75) && first <= Duration::from_millis(125));
        let third = pause(2);
        assert!(third >= Duration::from_millis(300) && third <= Duration::from_millis(500));
        for n in [10, 20, 1000] {
            assert!(pause(n) <= MAX_PAUSE.mul_f64(1.25), "{:?}", pause(n));
            assert!(pause(n) >= MAX_PAUSE.mul_f64(0.75));
        }
    }
}
