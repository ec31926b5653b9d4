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
