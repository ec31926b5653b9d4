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

#[cfg(test)]
mod tests {
    use super::*;

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
