//! One rule for every count and duration a flag takes, so that `--batch 0`, `--lease -5s` and
//! `--concurrency 0` are all refused the same way, naming the flag (clap puts the flag's name in
//! front of these messages), instead of being turned into something else or mistaken for a flag.
//!
//! The flags that take them set `allow_hyphen_values`, so that a negative value reaches these
//! parsers rather than being read as an unknown flag.

use std::time::Duration;

/// A count: a whole number, at least 1.
pub fn count(s: &str) -> Result<u32, String> {
    at_least(s, 1)
}

/// A count that may be 0 (where 0 means "the default", as for --prefetch).
pub fn count_or_zero(s: &str) -> Result<u32, String> {
    at_least(s, 0)
}

fn at_least(s: &str, min: i64) -> Result<u32, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| "not a whole number".to_owned())?;
    if n < min {
        return Err(format!("must be at least {min}, not {n}"));
    }
    u32::try_from(n).map_err(|_| format!("{n} is more than {}", u32::MAX))
}

/// A duration longer than zero, e.g. 30s, 5m, 1h 30m.
pub fn duration(s: &str) -> Result<Duration, String> {
    let d = duration_or_zero(s)?;
    if d.is_zero() {
        return Err("must be positive (longer than zero)".into());
    }
    Ok(d)
}

/// A duration that may be zero (where zero means "at once"), never negative.
pub fn duration_or_zero(s: &str) -> Result<Duration, String> {
    if s.trim_start().starts_with('-') {
        return Err("must be positive; a duration cannot be negative".into());
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 30s, 5m, 1h 30m)"))
}

/// The longest lease a flag takes: a worker that dies holds its rows this long at most.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// A lease: longer than zero, at most [`MAX_LEASE`] (7 days). A job that runs longer keeps its
/// rows by renewing a shorter lease (`work` does, `extend` by hand).
pub fn lease(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d > MAX_LEASE {
        return Err(
            "at most 7d: a lease is how long the rows of a worker that dies wait before \
                    another may claim them; a longer job keeps a shorter lease renewed (`work` \
                    does it by itself, `extend` by hand)"
                .into(),
        );
    }
    Ok(d)
}

/// A time to run at, as given: RFC 3339 with `Z` or an offset; one without (`2026-12-01 08:00`)
/// is read as UTC, and `naive` says so, for the command to say which time it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAt {
    pub at: std::time::SystemTime,
    pub naive: bool,
}

/// A time for --run-at: `2026-12-01T08:00:00Z`, `2026-12-01T09:00:00+01:00`, or without an
/// offset (UTC).
pub fn run_at(s: &str) -> Result<RunAt, String> {
    let text = s.trim();
    if let Ok(t) = text.parse::<jiff::Timestamp>() {
        return Ok(RunAt {
            at: std::time::SystemTime::from(t),
            naive: false,
        });
    }
    let civil: jiff::civil::DateTime = text.parse().map_err(|_| {
        "not a time: write 2026-12-01T08:00:00Z, or with an offset (2026-12-01T09:00:00+01:00); \
         a time without one is read as UTC"
            .to_owned()
    })?;
    let t = civil
        .to_zoned(jiff::tz::TimeZone::UTC)
        .map_err(|e| e.to_string())?
        .timestamp();
    Ok(RunAt {
        at: std::time::SystemTime::from(t),
        naive: true,
    })
}

/// A rate: so many jobs per period, e.g. 100/1m, 5/1s, 10/s (a bare unit is one of it).
pub fn rate(s: &str) -> Result<rowclaim::Rate, String> {
    let (n, per) = s
        .split_once('/')
        .ok_or_else(|| "write it as JOBS/PERIOD, e.g. 100/1m or 5/s".to_owned())?;
    let n = count(n)?;
    let per = per.trim();
    let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
        duration(per)?
    } else {
        duration(&format!("1{per}"))?
    };
    if per > rowclaim::MAX_RATE_PERIOD {
        return Err("the period must be at most 7 days".into());
    }
    Ok(rowclaim::Rate::new(n, per))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_capped() {
        assert_eq!(lease("7d"), Ok(MAX_LEASE));
        assert!(lease("100000d").unwrap_err().contains("at most 7d"));
        assert!(lease("0s").is_err());
    }

    #[test]
    fn run_at_takes_offsets_and_reads_naive_times_as_utc() {
        let utc = run_at("2026-12-01T08:00:00Z").unwrap();
        assert!(!utc.naive);
        assert_eq!(run_at("2026-12-01T09:00:00+01:00").unwrap().at, utc.at);
        let naive = run_at("2026-12-01 08:00:00").unwrap();
        assert!(naive.naive);
        assert_eq!(naive.at, utc.at);
        assert_eq!(run_at("2026-12-01T08:00").unwrap().at, utc.at);
        assert!(run_at("tomorrow").unwrap_err().contains("read as UTC"));
    }

    #[test]
    fn rates() {
        let r = rate("100/1m").unwrap();
        assert_eq!((r.jobs, r.per), (100, Duration::from_secs(60)));
        let r = rate("5/s").unwrap();
        assert_eq!((r.jobs, r.per), (5, Duration::from_secs(1)));
        assert!(rate("5").unwrap_err().contains("JOBS/PERIOD"));
        assert!(rate("0/1s").unwrap_err().contains("at least 1"));
        assert!(rate("3/0s").unwrap_err().contains("must be positive"));
        assert!(rate("3/8days").unwrap_err().contains("7 days"));
    }

    #[test]
    fn counts_and_durations() {
        assert_eq!(count("3"), Ok(3));
        assert!(count("0").unwrap_err().contains("at least 1"));
        assert!(count("-2").unwrap_err().contains("at least 1"));
        assert!(count("x").is_err());
        assert_eq!(count_or_zero("0"), Ok(0));
        assert_eq!(duration("1m"), Ok(Duration::from_secs(60)));
        assert!(duration("0s").unwrap_err().contains("must be positive"));
        assert!(duration("-5s").unwrap_err().contains("must be positive"));
        assert_eq!(duration_or_zero("0s"), Ok(Duration::ZERO));
        assert!(duration_or_zero("-1s").is_err());
    }
}
