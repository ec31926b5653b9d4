//! The soak's workers: `rowclaim work -- bash …` processes of the built CLI, and library
//! `rowclaim::Worker`s in processes of their own (this test binary run again as
//! `worker_process`), with the RSS each one had over time.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::support;

/// The queue every job of the soak goes to.
pub const QUEUE: &str = "soak";

/// Jobs each worker runs at once.
const CONCURRENCY: &str = "4";

/// Which kind of worker a process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `rowclaim work --queue soak -- bash -c …`
    Cli,
    /// A `rowclaim::Worker` in a process of its own.
    Library,
}

/// One worker process and what was seen of it.
pub struct Proc {
    pub name: String,
    pub kind: Kind,
    /// The URL it was given (a replacement gets the same).
    pub url: String,
    pub child: Child,
    pub pid: u32,
    pub started: Instant,
    /// SIGKILLed by the soak (its exit is expected).
    pub killed: bool,
    /// How it ended when it ended by itself (a failure of the soak).
    pub exited: Option<String>,
    /// (seconds since the soak began, VmRSS in KiB).
    pub rss: Vec<(f64, u64)>,
    /// Its stderr, kept in a file for when something goes wrong.
    pub stderr: PathBuf,
}

/// A bash command that logs `S|E <job id> <µs> <worker> <attempt>` around a short sleep
/// (0–0.4 s), so that faults find jobs running.
fn logged(log: &Path) -> String {
    let log = log.display();
    format!(
        "echo \"S $ROWCLAIM_ID ${{EPOCHREALTIME/./}} $SOAK_WORKER $ROWCLAIM_ATTEMPT\" >> {log}; \
         sleep 0.$((RANDOM % 5)); \
         echo \"E $ROWCLAIM_ID ${{EPOCHREALTIME/./}} $SOAK_WORKER $ROWCLAIM_ATTEMPT\" >> {log}"
    )
}

/// Starts worker `name` of `kind` on `url`, logging its runs to `log` and its stderr under `dir`.
pub fn spawn(kind: Kind, name: &str, url: &str, log: &Path, dir: &Path, lease: Duration) -> Proc {
    let stderr = dir.join(format!("{name}.stderr"));
    let err = std::fs::File::create(&stderr)
        .unwrap_or_else(|e| panic!("create {}: {e}", stderr.display()));
    let lease_arg = format!("{}s", lease.as_secs());
    let mut cmd = match kind {
        Kind::Cli => {
            let script = logged(log);
            support::rowclaim(
                url,
                &[
                    "work",
                    "--queue",
                    QUEUE,
                    "--lease",
                    &lease_arg,
                    "--concurrency",
                    CONCURRENCY,
                    "--poll",
                    "500ms",
                    "--",
                    "bash",
                    "-c",
                    &script,
                ],
            )
        }
        Kind::Library => {
            let exe = std::env::current_exe().expect("the test binary's path");
            let mut c = Command::new(exe);
            c.args([
                "--exact",
                "worker_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SOAK_URL", url)
            .env("SOAK_LOG", log)
            .env("SOAK_LEASE_SECS", lease.as_secs().to_string())
            .stdin(Stdio::null())
            .kill_on_drop(true);
            c
        }
    };
    cmd.env("SOAK_WORKER", name)
        .stdout(Stdio::null())
        .stderr(Stdio::from(err));
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("start worker {name}: {e}"));
    let pid = child.id().expect("a new worker has a pid");
    Proc {
        name: name.to_owned(),
        kind,
        url: url.to_owned(),
        child,
        pid,
        started: Instant::now(),
        killed: false,
        exited: None,
        rss: Vec::new(),
        stderr,
    }
}

impl Proc {
    /// Notes (once) that it ended without being killed.
    pub fn check_alive(&mut self) {
        if self.killed || self.exited.is_some() {
            return;
        }
        if let Ok(Some(status)) = self.child.try_wait() {
            let tail = support_tail(&self.stderr);
            self.exited = Some(format!("{status}; stderr tail:\n{tail}"));
        }
    }

    /// Records its RSS now (`at`: seconds since the soak began).
    pub fn sample_rss(&mut self, at: f64) {
        if self.killed || self.exited.is_some() {
            return;
        }
        if let Some(kb) = vm_rss(self.pid) {
            self.rss.push((at, kb));
        }
    }

    pub fn signal(&self, sig: &str) {
        let _ = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.pid.to_string()])
            .status();
    }

    /// Its RSS after warm-up (the first sample at least `warm_up` after it started) and at the
    /// end (the last sample); None when it did not live past its warm-up.
    pub fn rss_span(&self, soak_start: Instant, warm_up: Duration) -> Option<(u64, u64)> {
        let born = self.started.duration_since(soak_start).as_secs_f64();
        let after = born + warm_up.as_secs_f64();
        let first = self.rss.iter().find(|(at, _)| *at >= after)?;
        let last = self.rss.last()?;
        (last.0 > first.0).then_some((first.1, last.1))
    }
}

/// VmRSS of `pid` in KiB, from /proc.
fn vm_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn support_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Stops every live worker with SIGTERM and waits for it: (name, exit code) of each. A worker
/// asked to stop drains and exits 0.
pub async fn stop_all(procs: &mut [Proc]) -> Vec<(String, Option<i32>)> {
    for p in procs.iter().filter(|p| !p.killed && p.exited.is_none()) {
        p.signal("TERM");
    }
    let mut codes = Vec::new();
    for p in procs.iter_mut().filter(|p| !p.killed && p.exited.is_none()) {
        let code = match tokio::time::timeout(Duration::from_secs(120), p.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = p.child.start_kill();
                None
            }
        };
        codes.push((p.name.clone(), code));
    }
    codes
}

// ----------------------------------------------------------------- the library worker process

/// Appends one line to the run log (one `write` with O_APPEND: lines of several processes do
/// not interleave).
fn log_line(log: &Path, what: char, id: i64, worker: &str, attempt: i64) {
    use std::io::Write;
    let line = format!("{what} {id} {} {worker} {attempt}\n", support::now_us());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
    f.write_all(line.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", log.display()));
}

/// The body of `worker_process` when the soak started it (SOAK_URL set): a `rowclaim::Worker` on
/// the queue until SIGTERM, then a drain; panics (exit 101) if the worker stops by itself.
pub fn library_worker(url: String) {
    let log = PathBuf::from(std::env::var("SOAK_LOG").expect("SOAK_LOG"));
    let name = std::env::var("SOAK_WORKER").expect("SOAK_WORKER");
    let lease: u64 = std::env::var("SOAK_LEASE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        // An application retries its first connection; a replacement may start mid-fault.
        let db = loop {
            match rowclaim::Db::connect(&url).await {
                Ok(db) => break db,
                Err(e) => {
                    eprintln!("{name}: connect: {e}; again in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        let who = name.clone();
        let report = rowclaim::Worker::new(&db)
            .queue(QUEUE)
            .handle_any(move |job| {
                let (log, who) = (log.clone(), who.clone());
                async move {
                    log_line(&log, 'S', job.id, &who, job.attempt);
                    // 50–500 ms, spread by id: no random source needed.
                    let ms = 50 + (job.id.unsigned_abs() * 7919) % 450;
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    log_line(&log, 'E', job.id, &who, job.attempt);
                    Ok::<_, String>(())
                }
            })
            .concurrency(CONCURRENCY.parse().expect("a number"))
            .lease(Duration::from_secs(lease))
            .poll(Duration::from_millis(500))
            .run(async move {
                term.recv().await;
            })
            .await;
        match report {
            Ok(r) => eprintln!("{name}: stopped: {r:?}"),
            Err(e) => panic!("{name}: the worker stopped by itself: {e}"),
        }
    });
}
