//! When a schedule ticks, as pure arithmetic on epoch milliseconds (no database, no clock of its
//! own): the next tick after an instant, the ticks due at an instant, and which of them a
//! catch-up policy enqueues. The scheduler feeds it the database's now.

use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

use super::CatchUp;

/// How late a tick may be and still count as on time: a tick due less than this long ago is
/// enqueued whatever the catch-up policy (a busy machine or a short outage delays it, never
/// drops it). Older ticks are missed, and the policy decides.
pub const LATE_WINDOW: Duration = Duration::from_secs(60);

/// The most missed ticks [`CatchUp::All`] enqueues after one downtime: the most recent ones.
pub const MAX_CATCH_UP: usize = 1000;

/// When a schedule ticks.
#[derive(Clone, Debug)]
pub(crate) enum Timing {
    /// A cron expression read in a time zone.
    Cron {
        cron: Box<croner::Cron>,
        zone: TimeZone,
    },
    /// Every `ms` milliseconds (whole seconds), counted from the Unix epoch.
    Every { ms: i64 },
}

/// The ticks of one pass: those to enqueue (oldest first), how many missed ones were skipped,
/// and the tick after `now`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Due {
    pub ticks: Vec<i64>,
    pub skipped: u64,
    pub next: i64,
}

/// Why a tick could not be computed: the expression never matches (again), or the time is out
/// of the calendar's range.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NoTick(pub String);

impl Timing {
    /// The first tick strictly after `ms`.
    pub fn next_after(&self, ms: i64) -> Result<i64, NoTick> {
        match self {
            Timing::Every { ms: every } => ms
                .div_euclid(*every)
                .checked_add(1)
                .and_then(|n| n.checked_mul(*every))
                .ok_or_else(|| NoTick("past the end of time".into())),
            Timing::Cron { cron, zone } => {
                // Ticks are whole seconds: from the second `ms` falls in, the next one is after it.
                let start = zoned(ms.div_euclid(1000) * 1000, zone)?;
                let next = cron
                    .find_next_occurrence(&start, false)
                    .map_err(|e| NoTick(format!("no time matches after {start}: {e}")))?;
                Ok(next.timestamp().as_millisecond())
            }
        }
    }

    /// The last tick at or before `ms`, if there is one in the calendar.
    pub fn at_or_before(&self, ms: i64) -> Option<i64> {
        match self {
            Timing::Every { ms: every } => ms.div_euclid(*every).checked_mul(*every),
            Timing::Cron { cron, zone } => {
                let start = zoned(ms.div_euclid(1000) * 1000, zone).ok()?;
                let prev = cron.find_previous_occurrence(&start, true).ok()?;
                Some(prev.timestamp().as_millisecond())
            }
        }
    }

    /// The ticks due at `now` when the stored next tick is `next`, as `policy` has them: every
    /// tick less than [`LATE_WINDOW`] old, and of the older (missed) ones the most recent one
    /// when nothing later is due ([`CatchUp::Latest`]), up to [`MAX_CATCH_UP`] of the most
    /// recent ([`CatchUp::All`]), or none ([`CatchUp::None`]).
    pub fn due(&self, next: i64, now: i64, policy: CatchUp) -> Result<Due, NoTick> {
        let following = self.next_after(now)?;
        if now < next {
            return Ok(Due {
                ticks: vec![],
                skipped: 0,
                next,
            });
        }
        let late = i64::try_from(LATE_WINDOW.as_millis()).unwrap_or(i64::MAX);
        let mut ticks = Vec::new();
        let mut skipped = 0u64;
        // Walk back from now, so that a long downtime costs no more than the ticks enqueued.
        let mut at = self.at_or_before(now);
        while let Some(t) = at.filter(|t| *t >= next) {
            let on_time = now - t <= late;
            let take = on_time
                || match policy {
                    CatchUp::Latest => ticks.is_empty(),
                    CatchUp::All => ticks.len() < MAX_CATCH_UP,
                    CatchUp::None => false,
                };
            if take {
                ticks.push(t);
            } else {
                // The ticks left are all older: count them without walking every one, where
                // that is arithmetic.
                skipped += match self {
                    Timing::Every { ms } => ((t - next) / ms + 1) as u64,
                    Timing::Cron { .. } => count_cron(self, next, t),
                };
                break;
            }
            at = t
                .checked_sub(1)
                .and_then(|before| self.at_or_before(before));
        }
        ticks.reverse();
        Ok(Due {
            ticks,
            skipped,
            next: following,
        })
    }
}

/// How many ticks of a cron timing fall in `from..=to` (capped: it is only said in a log line).
fn count_cron(timing: &Timing, from: i64, to: i64) -> u64 {
    let mut n = 0;
    let mut at = Some(to);
    while let Some(t) = at.filter(|t| *t >= from) {
        n += 1;
        if n >= 100_000 {
            break;
        }
        at = t.checked_sub(1).and_then(|b| timing.at_or_before(b));
    }
    n
}

fn zoned(ms: i64, zone: &TimeZone) -> Result<Zoned, NoTick> {
    let ts = Timestamp::from_millisecond(ms).map_err(|e| NoTick(e.to_string()))?;
    Ok(ts.to_zoned(zone.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(expr: &str, zone: &str) -> Timing {
        Timing::Cron {
            cron: Box::new(expr.parse().unwrap()),
            zone: TimeZone::get(zone).unwrap(),
        }
    }

    fn ms(rfc3339: &str) -> i64 {
        rfc3339.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn at(ms: i64) -> String {
        Timestamp::from_millisecond(ms).unwrap().to_string()
    }

    /// The ticks after `from`, as UTC instants.
    fn ticks(t: &Timing, from: &str, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut now = ms(from);
        for _ in 0..n {
            now = t.next_after(now).unwrap();
            out.push(at(now));
        }
        out
    }

    #[test]
    fn a_daily_time_follows_its_zone_across_daylight_saving() {
        // 09:00 in New York is 13:00 UTC in summer (EDT) and 14:00 UTC in winter (EST); the
        // clocks went back on 2026-11-01.
        let t = cron("0 9 * * *", "America/New_York");
        assert_eq!(
            ticks(&t, "2026-10-30T12:00:00Z", 3),
            [
                "2026-10-30T13:00:00Z",
                "2026-10-31T13:00:00Z",
                "2026-11-01T14:00:00Z"
            ]
        );
    }

    #[test]
    fn a_time_in_the_spring_gap_runs_once_just_after_it() {
        // Berlin skips 02:00-03:00 on 2026-03-29: 02:30 does not exist that day, and the job
        // runs at 03:00 CEST (01:00 UTC) instead, once; the next day at 02:30 CEST again.
        let t = cron("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            ticks(&t, "2026-03-28T00:00:00Z", 3),
            [
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z"
            ]
        );
    }

    #[test]
    fn a_fixed_time_in_the_autumn_overlap_runs_once() {
        // Berlin has 02:00-03:00 twice on 2026-10-25: 02:30 runs at its first pass (CEST,
        // 00:30 UTC) only.
        let t = cron("30 2 * * *", "Europe/Berlin");
        assert_eq!(
            ticks(&t, "2026-10-24T12:00:00Z", 2),
            ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
        );
    }

    #[test]
    fn an_interval_pattern_runs_in_both_passes_of_the_overlap() {
        // Every 30 minutes: 02:00 and 02:30 come twice in Berlin's night of 2026-10-25, and
        // each real half hour gets its tick, none twice.
        let t = cron("*/30 * * * *", "Europe/Berlin");
        assert_eq!(
            ticks(&t, "2026-10-24T23:45:00Z", 5),
            [
                "2026-10-25T00:00:00Z",
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:00:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:00:00Z"
            ]
        );
    }

    #[test]
    fn seconds_and_nicknames() {
        let t = cron("*/20 * * * * *", "UTC");
        assert_eq!(
            ticks(&t, "2026-01-01T00:00:10.500Z", 2),
            ["2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z"]
        );
        let t = cron("@daily", "Asia/Tokyo");
        assert_eq!(
            ticks(&t, "2026-01-01T00:00:00Z", 1),
            ["2026-01-01T15:00:00Z"]
        );
    }

    #[test]
    fn intervals_count_from_the_epoch() {
        let t = Timing::Every { ms: 15 * 60_000 };
        assert_eq!(
            ticks(&t, "2026-01-01T10:07:00Z", 2),
            ["2026-01-01T10:15:00Z", "2026-01-01T10:30:00Z"]
        );
        // An instant on a tick is not after it.
        assert_eq!(
            at(t.next_after(ms("2026-01-01T10:15:00Z")).unwrap()),
            "2026-01-01T10:30:00Z"
        );
        assert_eq!(
            t.at_or_before(ms("2026-01-01T10:15:00Z")),
            Some(ms("2026-01-01T10:15:00Z"))
        );
    }

    #[test]
    fn late_ticks_always_run_and_missed_ones_follow_the_policy() {
        let t = Timing::Every { ms: 10_000 };
        let now = ms("2026-01-01T12:00:05Z");
        // Stored next tick an hour ago: 360 missed ticks, and 6 within the last minute.
        let next = ms("2026-01-01T11:00:10Z");
        let late: Vec<i64> = (0..6)
            .map(|i| ms("2026-01-01T11:59:10Z") + i * 10_000)
            .collect();
        for policy in [CatchUp::Latest, CatchUp::None] {
            let due = t.due(next, now, policy).unwrap();
            assert_eq!(due.ticks, late, "{policy:?}");
            assert_eq!(due.skipped, 354, "{policy:?}");
            assert_eq!(due.next, ms("2026-01-01T12:00:10Z"));
        }
        let all = t.due(next, now, CatchUp::All).unwrap();
        assert_eq!(all.ticks.len(), 360);
        assert_eq!((all.ticks[0], all.skipped), (next, 0));

        // An hourly job down for five hours: latest runs the most recent missed tick once, all
        // runs each, none runs none.
        let t = cron("30 * * * *", "UTC");
        let now = ms("2026-01-01T12:00:00Z");
        let next = ms("2026-01-01T07:30:00Z");
        let latest = t.due(next, now, CatchUp::Latest).unwrap();
        assert_eq!(
            (latest.ticks, latest.skipped),
            (vec![ms("2026-01-01T11:30:00Z")], 4)
        );
        let all = t.due(next, now, CatchUp::All).unwrap();
        assert_eq!(all.ticks.len(), 5);
        let none = t.due(next, now, CatchUp::None).unwrap();
        assert_eq!((none.ticks.len(), none.skipped), (0, 5));
        assert_eq!(none.next, ms("2026-01-01T12:30:00Z"));

        // Nothing due yet.
        let early = t
            .due(ms("2026-01-01T12:30:00Z"), now, CatchUp::All)
            .unwrap();
        assert!(early.ticks.is_empty());
        assert_eq!(early.next, ms("2026-01-01T12:30:00Z"));
    }

    #[test]
    fn catching_up_all_is_bounded() {
        let t = Timing::Every { ms: 1000 };
        let now = ms("2026-01-02T00:00:00Z");
        let due = t
            .due(ms("2026-01-01T00:00:00Z"), now, CatchUp::All)
            .unwrap();
        assert_eq!(due.ticks.len(), MAX_CATCH_UP);
        assert_eq!(*due.ticks.last().unwrap(), now);
        assert_eq!(due.skipped, 86_401 - MAX_CATCH_UP as u64);
    }

    #[test]
    fn a_pattern_that_never_matches_has_no_next_tick() {
        let t = cron("0 0 30 2 *", "UTC");
        assert!(t.next_after(ms("2026-01-01T00:00:00Z")).is_err());
    }
}
