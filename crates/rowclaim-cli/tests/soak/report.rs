//! What the soak checks and writes: the runs read back from the log, the invariants (nothing
//! lost, re-runs only where a fault overlapped the earlier run, no worker gone, RSS and
//! connections flat), and the summary, the CSV and the SVG plot of throughput per minute.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

use crate::rig::FaultKind;

/// One run of a job, from the run log.
#[derive(Clone, Debug)]
pub struct Run {
    pub worker: String,
    pub attempt: String,
    pub start: u64,
    /// None: the run never ended (its worker was killed, or it was stopped).
    pub end: Option<u64>,
}

/// One fault the soak did.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: FaultKind,
    pub start: u64,
    pub end: u64,
    /// The worker it was done to (worker faults).
    pub worker: Option<String>,
    pub detail: String,
}

impl Fault {
    pub fn describe(&self, t0: u64) -> String {
        let mut s = format!(
            "{} at {:.0} s",
            self.kind.label(),
            (self.start.saturating_sub(t0)) as f64 / 1e6
        );
        if let Some(w) = &self.worker {
            write!(s, " ({w})").unwrap();
        }
        if !self.detail.is_empty() {
            write!(s, " [{}]", self.detail).unwrap();
        }
        s
    }
}

/// Whether a fault can explain why `run` had to run again: it was done to the run's worker (or
/// to the servers or the network), and the run was going on during it, or ended at most
/// [`SLACK`] before it began (its result may still have been on its way), or began at most
/// [`SLACK`] after it ended (a broken connection found on first use afterwards).
pub fn overlaps(run: &Run, fault: &Fault) -> bool {
    if let Some(w) = &fault.worker {
        if *w != run.worker {
            return false;
        }
    }
    let slack = SLACK.as_micros() as u64;
    run.start <= fault.end + slack && run.end.is_none_or(|e| e + slack >= fault.start)
}

/// Results are sent at once (settle delay zero) and recorded within milliseconds when nothing
/// is wrong: three seconds leave room for a loaded machine, and no more.
pub const SLACK: Duration = Duration::from_secs(3);

/// Runs per job id from a log of `S|E <id> <µs> <worker> <attempt>` lines.
pub fn read_runs(log: &Path) -> HashMap<i64, Vec<Run>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut open: HashMap<(i64, String, String), Run> = HashMap::new();
    let mut runs: HashMap<i64, Vec<Run>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [what, id, at, worker, attempt] = f[..] else {
            continue;
        };
        let (Ok(id), Ok(at)) = (id.parse::<i64>(), at.parse::<u64>()) else {
            continue;
        };
        let key = (id, worker.to_owned(), attempt.to_owned());
        match what {
            "S" => {
                let run = Run {
                    worker: worker.to_owned(),
                    attempt: attempt.to_owned(),
                    start: at,
                    end: None,
                };
                // A start without an end before it: that run never ended.
                if let Some(old) = open.insert(key, run) {
                    runs.entry(id).or_default().push(old);
                }
            }
            "E" => {
                if let Some(mut run) = open.remove(&key) {
                    run.end = Some(at);
                    runs.entry(id).or_default().push(run);
                }
            }
            _ => {}
        }
    }
    for ((id, _, _), run) in open {
        runs.entry(id).or_default().push(run);
    }
    for list in runs.values_mut() {
        list.sort_by_key(|r| r.start);
    }
    runs
}

/// A worker as the report sees it.
pub struct WorkerFigures {
    pub name: String,
    pub kind: String,
    pub killed: bool,
    pub exited: Option<String>,
    /// RSS in KiB after warm-up and at the end.
    pub rss: Option<(u64, u64)>,
    pub exit_code: Option<Option<i32>>,
}

/// Everything one soak run produced.
pub struct Soak {
    pub backend: String,
    pub seed: u64,
    pub secs: u64,
    pub lease: Duration,
    pub t0: u64,
    pub warm_up: Duration,
    pub faults: Vec<Fault>,
    pub runs: HashMap<i64, Vec<Run>>,
    /// (id, status, unique key) of every job in the queue.
    pub jobs: Vec<(i64, String, String)>,
    /// Jobs the enqueuer had confirmed (seq 0..enqueued).
    pub enqueued: u64,
    /// Batches whose enqueue failed or went unanswered and were sent again.
    pub unconfirmed_batches: u64,
    /// (µs, jobs) of each confirmed enqueue batch.
    pub enqueue_times: Vec<(u64, u64)>,
    /// (µs, sessions) samples.
    pub connections: Vec<(u64, i64)>,
    /// Index in `connections` of the sample taken at the end of warm-up.
    pub baseline_sample: usize,
    pub workers: Vec<WorkerFigures>,
    pub unfinished_at_end: i64,
}

/// The verdict: failures (empty when the soak passed) and the summary text.
pub struct Verdict {
    pub failures: Vec<String>,
    pub summary: String,
}

pub const RSS_GROWTH: f64 = 0.20;

impl Soak {
    pub fn check(&self) -> Verdict {
        let mut failures = Vec::new();
        let mut s = String::new();
        let t0 = self.t0;
        let rel = |us: u64| us.saturating_sub(t0) as f64 / 1e6;
        writeln!(s, "# Soak: {}", self.backend).unwrap();
        writeln!(
            s,
            "\n{} s of enqueueing, lease {} s, seed {}, warm-up {} s.\n",
            self.secs,
            self.lease.as_secs(),
            self.seed,
            self.warm_up.as_secs()
        )
        .unwrap();

        // Jobs: each confirmed seq is in the queue, each job there completed and ran.
        let mut by_seq: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
        for (id, _, key) in &self.jobs {
            if let Some(seq) = key.strip_prefix("seq-").and_then(|n| n.parse().ok()) {
                by_seq.entry(seq).or_default().push(*id);
            }
        }
        let missing: Vec<u64> = (0..self.enqueued)
            .filter(|n| !by_seq.contains_key(n))
            .collect();
        let not_done: Vec<(i64, &str)> = self
            .jobs
            .iter()
            .filter(|(_, status, _)| status != "completed")
            .map(|(id, status, _)| (*id, status.as_str()))
            .collect();
        let never_ran: Vec<i64> = self
            .jobs
            .iter()
            .filter(|(id, _, _)| !self.runs.contains_key(id))
            .map(|(id, _, _)| *id)
            .collect();
        let twice_enqueued: Vec<(&u64, &Vec<i64>)> =
            by_seq.iter().filter(|(_, ids)| ids.len() > 1).collect();
        let lost = missing.len() + not_done.len() + never_ran.len();
        let total_runs: usize = self.runs.values().map(Vec::len).sum();
        writeln!(s, "## Jobs\n").unwrap();
        writeln!(s, "- enqueued (confirmed): {}", self.enqueued).unwrap();
        writeln!(s, "- jobs in the queue: {}", self.jobs.len()).unwrap();
        writeln!(
            s,
            "- enqueue batches sent again after an error or no answer: {}",
            self.unconfirmed_batches
        )
        .unwrap();
        writeln!(
            s,
            "- enqueued twice (an unanswered enqueue sent again after its job had run): {}",
            twice_enqueued.len()
        )
        .unwrap();
        writeln!(s, "- runs: {total_runs}").unwrap();
        writeln!(
            s,
            "- lost: {lost} (not in the queue {}, not completed {}, never ran {})",
            missing.len(),
            not_done.len(),
            never_ran.len()
        )
        .unwrap();
        if lost > 0 {
            failures.push(format!(
                "{lost} job(s) lost: missing seqs {}, not completed {}, never ran {}",
                first(&missing),
                first(&not_done),
                first(&never_ran)
            ));
        }

        // Re-runs: every run before a job's last overlaps a fault.
        let mut reruns: Vec<String> = Vec::new();
        let mut outside: Vec<String> = Vec::new();
        let mut ids: Vec<&i64> = self.runs.keys().collect();
        ids.sort();
        for id in ids {
            let list = &self.runs[id];
            for (i, earlier) in list[..list.len() - 1].iter().enumerate() {
                // A run that never ended was over by the time the next run began.
                let bounded = Run {
                    end: earlier.end.or(Some(list[i + 1].start)),
                    ..earlier.clone()
                };
                let hit: Vec<String> = self
                    .faults
                    .iter()
                    .filter(|f| overlaps(&bounded, f))
                    .map(|f| f.describe(t0))
                    .collect();
                let run = format!(
                    "job {id}: run on {} (attempt {}) {:.1}–{} s",
                    earlier.worker,
                    earlier.attempt,
                    rel(earlier.start),
                    earlier
                        .end
                        .map_or("(never ended)".to_owned(), |e| format!("{:.1}", rel(e)))
                );
                if hit.is_empty() {
                    outside.push(format!("{run}, runs: {list:?}"));
                } else {
                    reruns.push(format!("{run} — {}", hit.join("; ")));
                }
            }
        }
        writeln!(s, "\n## Faults\n").unwrap();
        let mut by_kind: BTreeMap<FaultKind, usize> = BTreeMap::new();
        for f in &self.faults {
            *by_kind.entry(f.kind).or_default() += 1;
        }
        writeln!(s, "{} faults:", self.faults.len()).unwrap();
        for (k, n) in &by_kind {
            writeln!(s, "- {}: {n}", k.label()).unwrap();
        }
        writeln!(s).unwrap();
        for f in &self.faults {
            writeln!(
                s,
                "- {:.0}–{:.0} s: {}",
                rel(f.start),
                rel(f.end),
                f.describe(t0)
            )
            .unwrap();
        }
        writeln!(
            s,
            "\n## Re-runs\n\n{} re-run(s), each where a fault overlapped the earlier run; {} outside any fault.\n",
            reruns.len(),
            outside.len()
        )
        .unwrap();
        for r in &reruns {
            writeln!(s, "- {r}").unwrap();
        }
        for r in &outside {
            writeln!(s, "- OUTSIDE ANY FAULT: {r}").unwrap();
        }
        if !outside.is_empty() {
            failures.push(format!(
                "{} run(s) again with no fault overlapping the earlier run:\n{}",
                outside.len(),
                outside.join("\n")
            ));
        }

        // Workers: none gone by itself; RSS.
        writeln!(s, "\n## Workers\n").unwrap();
        writeln!(
            s,
            "| worker | kind | RSS after warm-up | RSS at the end | change | end |"
        )
        .unwrap();
        writeln!(s, "|---|---|---|---|---|---|").unwrap();
        for w in &self.workers {
            let (a, b, change) = match w.rss {
                Some((a, b)) => (
                    format!("{:.1} MiB", a as f64 / 1024.0),
                    format!("{:.1} MiB", b as f64 / 1024.0),
                    format!("{:+.1} %", (b as f64 / a as f64 - 1.0) * 100.0),
                ),
                None => ("-".into(), "-".into(), "(too young)".into()),
            };
            let end = if w.killed {
                "SIGKILLed by the soak".to_owned()
            } else if w.exited.is_some() {
                "EXITED BY ITSELF".to_owned()
            } else {
                match w.exit_code {
                    Some(Some(c)) => format!("exit {c} on SIGTERM"),
                    Some(None) => "no exit on SIGTERM".into(),
                    None => "-".into(),
                }
            };
            writeln!(
                s,
                "| {} | {} | {a} | {b} | {change} | {end} |",
                w.name, w.kind
            )
            .unwrap();
            if let Some(why) = &w.exited {
                failures.push(format!("worker {} exited by itself: {why}", w.name));
            }
            if let Some(Some(code)) = w.exit_code {
                if code != 0 && !w.killed && w.exited.is_none() {
                    failures.push(format!("worker {} exited {code} on SIGTERM", w.name));
                }
            }
            if let Some((a, b)) = w.rss {
                if b as f64 > a as f64 * (1.0 + RSS_GROWTH) {
                    failures.push(format!(
                        "worker {}'s RSS grew from {a} KiB after warm-up to {b} KiB",
                        w.name
                    ));
                }
            }
        }

        // Connections: flat.
        writeln!(s, "\n## Server connections\n").unwrap();
        let samples: Vec<String> = self
            .connections
            .iter()
            .map(|(at, n)| format!("{:.0} s: {n}", rel(*at)))
            .collect();
        writeln!(s, "Sessions on the soak's database: {}", samples.join(", ")).unwrap();
        if let (Some(base), Some(last)) = (
            self.connections.get(self.baseline_sample),
            self.connections.last(),
        ) {
            let allowed = connections_allowed(base.1);
            writeln!(
                s,
                "\nAfter warm-up {}, at the end {} (allowed: {allowed}).",
                base.1, last.1
            )
            .unwrap();
            if last.1 > allowed {
                failures.push(format!(
                    "server connections grew: {} after warm-up, {} at the end",
                    base.1, last.1
                ));
            }
        }
        if self.unfinished_at_end > 0 {
            failures.push(format!(
                "{} job(s) not completed when the drain gave up",
                self.unfinished_at_end
            ));
        }

        writeln!(s, "\n## Throughput per minute\n").unwrap();
        writeln!(
            s,
            "| minute | enqueued | completed | runs started | faults |"
        )
        .unwrap();
        writeln!(s, "|---|---|---|---|---|").unwrap();
        for m in self.minutes() {
            writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                m.minute,
                m.enqueued,
                m.completed,
                m.started,
                m.faults.join("; ")
            )
            .unwrap();
        }
        writeln!(
            s,
            "\n## Verdict\n\n{}",
            if failures.is_empty() {
                "PASS".to_owned()
            } else {
                format!("FAIL:\n- {}", failures.join("\n- "))
            }
        )
        .unwrap();
        Verdict {
            failures,
            summary: s,
        }
    }

    /// Per minute of the run: jobs enqueued, jobs completed (their last run ended), runs
    /// started, faults begun.
    pub fn minutes(&self) -> Vec<Minute> {
        let minute = |us: u64| (us.saturating_sub(self.t0) / 60_000_000) as usize;
        let mut out: Vec<Minute> = Vec::new();
        let mut at = |m: usize| -> usize {
            while out.len() <= m {
                out.push(Minute {
                    minute: out.len(),
                    ..Minute::default()
                });
            }
            m
        };
        let mut bump = Vec::new();
        for (t, n) in &self.enqueue_times {
            bump.push((minute(*t), 0, *n as usize, String::new()));
        }
        for list in self.runs.values() {
            for r in list {
                bump.push((minute(r.start), 2, 1, String::new()));
            }
            if let Some(end) = list.last().and_then(|r| r.end) {
                bump.push((minute(end), 1, 1, String::new()));
            }
        }
        for f in &self.faults {
            bump.push((minute(f.start), 3, 0, f.kind.label().to_owned()));
        }
        let mut idx = Vec::new();
        for (m, what, n, label) in bump {
            idx.push((at(m), what, n, label));
        }
        for (m, what, n, label) in idx {
            let row = &mut out[m];
            match what {
                0 => row.enqueued += n,
                1 => row.completed += n,
                2 => row.started += n,
                _ => row.faults.push(label),
            }
        }
        out
    }

    pub fn csv(&self) -> String {
        let mut s = String::from("minute,enqueued,completed,runs_started,faults\n");
        for m in self.minutes() {
            writeln!(
                s,
                "{},{},{},{},{}",
                m.minute,
                m.enqueued,
                m.completed,
                m.started,
                m.faults.join(";")
            )
            .unwrap();
        }
        s
    }
}

/// Sessions allowed at the end for `base` after warm-up: half as many again, and two more (a
/// pool may hold a connection more or less, depending on what was running when sampled).
pub fn connections_allowed(base: i64) -> i64 {
    base + base / 2 + 2
}

#[derive(Default)]
pub struct Minute {
    pub minute: usize,
    pub enqueued: usize,
    pub completed: usize,
    pub started: usize,
    pub faults: Vec<String>,
}

/// The first few of a list, for a failure message.
fn first<T: std::fmt::Debug>(list: &[T]) -> String {
    let shown: Vec<String> = list.iter().take(20).map(|t| format!("{t:?}")).collect();
    let more = list.len().saturating_sub(20);
    if more > 0 {
        format!("[{}, … {more} more]", shown.join(", "))
    } else {
        format!("[{}]", shown.join(", "))
    }
}
