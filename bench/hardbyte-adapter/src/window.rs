//! Pickup latency over a rolling window, in bounded memory: one HDR histogram (3 significant
//! figures, as the harness's contract asks) per second of the window, merged when sampled.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;

/// Latencies up to 10 minutes, in microseconds.
const HIGHEST_US: u64 = 600_000_000;

pub struct LatencyWindow {
    seconds: usize,
    slots: Mutex<Vec<(u64, Histogram<u64>)>>,
}

impl LatencyWindow {
    pub fn new(seconds: usize) -> anyhow::Result<Self> {
        let mut slots = Vec::with_capacity(seconds);
        for _ in 0..seconds {
            slots.push((0, Histogram::new_with_bounds(1, HIGHEST_US, 3)?));
        }
        Ok(LatencyWindow {
            seconds,
            slots: Mutex::new(slots),
        })
    }

    /// Records one latency, in milliseconds.
    pub fn record(&self, ms: f64) {
        let now = epoch_s();
        let us = ((ms * 1000.0).round() as u64).clamp(1, HIGHEST_US);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let (second, hist) = &mut slots[(now as usize) % self.seconds];
        if *second != now {
            hist.reset();
            *second = now;
        }
        // In bounds by the clamp above.
        let _ = hist.record(us);
    }

    /// p50, p95, p99 in milliseconds over the window, or None when nothing was recorded in it.
    pub fn percentiles(&self) -> Option<[f64; 3]> {
        let now = epoch_s();
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut merged: Option<Histogram<u64>> = None;
        for (second, hist) in slots.iter() {
            if *second + self.seconds as u64 <= now || hist.is_empty() {
                continue;
            }
            match &mut merged {
                Some(m) => {
                    let _ = m.add(hist);
                }
                None => merged = Some(hist.clone()),
            }
        }
        let m = merged?;
        Some([0.50, 0.95, 0.99].map(|q| m.value_at_quantile(q) as f64 / 1000.0))
    }
}

pub fn epoch_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
