//! `rowclaim work`: claim rows and run a command once per row.
//!
//! Rows are claimed a batch at a time whenever a slot is free, and each row runs in its own
//! process, at most `concurrency` at once. Exit 0 completes the row; any other exit fails it.
//! While commands run, a heartbeat extends their claim's lease, so a long command does not lose
//! its row. On SIGINT/SIGTERM the worker stops claiming, lets running commands finish, and
//! releases the rows it claimed but had not started.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use rowclaim::{Claim, ClaimedRow, Claimer, Error, Job, JobFailure};
use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

pub struct WorkOptions {
    pub batch: u32,
    pub lease: Duration,
    pub concurrency: usize,
    pub until_empty: bool,
    pub poll: Duration,
    pub command: Vec<String>,
    /// Rows are jobs of the managed queue: the payload goes to stdin, and a failure is retried
    /// with backoff until the job's last attempt, then the job is dead.
    pub managed: bool,
}

/// What a worker did, printed when it stops.
#[derive(Default)]
pub struct Tally {
    pub done: AtomicU64,
    pub failed: AtomicU64,
    pub retried: AtomicU64,
    pub released: AtomicU64,
    pub lost: AtomicU64,
}

impl Tally {
    pub fn line(&self) -> String {
        format!(
            "{} done, {} failed, {} to retry, {} released, {} lost to another worker",
            self.done.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.retried.load(Ordering::Relaxed),
            self.released.load(Ordering::Relaxed),
            self.lost.load(Ordering::Relaxed)
        )
    }
}

struct Shared {
    opts: WorkOptions,
    tally: Arc<Tally>,
    slots: Semaphore,
    in_flight: std::sync::atomic::AtomicU32,
    stop: watch::Receiver<bool>,
    /// Set when the command cannot be started at all: the worker stops and reports it.
    fatal: std::sync::Mutex<Option<String>>,
    stop_now: watch::Sender<bool>,
}

/// Runs until `--until-empty` finds no work left, or until `stop` turns true (a signal).
pub async fn run(
    claimer: Claimer,
    mut wakeups: Option<rowclaim::Wakeups>,
    opts: WorkOptions,
    stop_tx: watch::Sender<bool>,
) -> anyhow::Result<Arc<Tally>> {
    let stop = stop_tx.subscribe();
    let shared = Arc::new(Shared {
        slots: Semaphore::new(opts.concurrency),
        in_flight: Default::default(),
        opts,
        tally: Arc::default(),
        stop: stop.clone(),
        fatal: std::sync::Mutex::new(None),
        stop_now: stop_tx,
    });
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut stop = stop;
    // Rows claimed and not yet settled: at most max(batch, concurrency), so that --batch above
    // --concurrency prefetches and the default (batch = concurrency) never holds rows idle.
    let most = shared.opts.batch.max(shared.opts.concurrency as u32);
    loop {
        if *stop.borrow() {
            break;
        }
        let in_flight = shared.in_flight.load(Ordering::SeqCst);
        // Claim only while a slot is free; otherwise wait for a row to finish.
        if in_flight >= shared.opts.concurrency as u32 {
            tokio::select! {
                _ = tasks.join_next() => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        let want = shared.opts.batch.min(most - in_flight).max(1);
        let claim = match claimer.claim(want, shared.opts.lease).await {
            Ok(c) => c,
            Err(e) => {
                let _ = shared.stop_now.send(true);
                while tasks.join_next().await.is_some() {}
                return Err(e).context("claiming rows");
            }
        };
        if claim.is_empty() {
            if shared.opts.until_empty {
                if !tasks.is_empty() {
                    // Rows in flight may still fail or be released; look again when one ends.
                    tokio::select! {
                        _ = tasks.join_next() => {}
                        _ = stop.changed() => {}
                    }
                    continue;
                }
                if !claimer
                    .backlog()
                    .await
                    .context("counting rows left")?
                    .has_work()
                {
                    break;
                }
            }
            // Nothing to claim: wait for the polling interval, a new job (LISTEN/NOTIFY on
            // PostgreSQL), a row that finishes, or a signal.
            let poll = shared.opts.poll;
            let nap = async {
                match wakeups.as_mut() {
                    Some(w) => {
                        w.wait(poll).await;
                    }
                    None => tokio::time::sleep(poll).await,
                }
            };
            tokio::select! {
                _ = nap => {}
                _ = stop.changed() => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
            continue;
        }
        let claim = Arc::new(claim);
        let (beating, lease) = (claim.clone(), shared.opts.lease);
        tasks.spawn(async move { beating.keep_alive(lease).await });
        for row in claim.rows() {
            shared.in_flight.fetch_add(1, Ordering::SeqCst);
            tasks.spawn(process(claim.clone(), row.clone(), shared.clone()));
        }
    }
    while tasks.join_next().await.is_some() {}
    if let Some(why) = shared.fatal.lock().map(|f| f.clone()).unwrap_or(None) {
        return Err(anyhow!(why));
    }
    Ok(shared.tally.clone())
}

/// Waits for a slot, runs the command for one row, and settles the row by its exit status.
async fn process(claim: Arc<Claim>, row: ClaimedRow, shared: Arc<Shared>) {
    settle_row(&claim, &row, &shared).await;
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
}

async fn settle_row(claim: &Claim, row: &ClaimedRow, shared: &Shared) {
    let mut stop = shared.stop.clone();
    let permit = tokio::select! {
        p = shared.slots.acquire() => p.ok(),
        _ = async { while !*stop.borrow_and_update() { if stop.changed().await.is_err() { break } } } => None,
    };
    let Some(_permit) = permit else {
        // Stopping before this row started: give it back.
        match claim.release(&row.id).await {
            Ok(()) => shared.tally.released.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                eprintln!("rowclaim: releasing row {}: {e}", row.id);
                0
            }
        };
        return;
    };
    let job = if shared.opts.managed {
        match Job::from_row(row) {
            Ok(job) => Some(job),
            Err(e) => {
                eprintln!("rowclaim: row {}: not a job ({e}); giving it back", row.id);
                let _ = claim.release(&row.id).await;
                return;
            }
        }
    } else {
        None
    };
    // A job whose lease ran out on its last attempt (its worker died) has no attempts left.
    if let Some(job) = job.as_ref().filter(|j| j.exhausted()) {
        let why = format!("no attempts left after {} runs", job.max_attempts);
        if claim.fail_with(&row.id, why).await.is_ok() {
            shared.tally.failed.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    let input = job.as_ref().map_or(&row.data, |j| &j.payload);
    let outcome = run_command(claim, row, input, &shared.opts.command).await;
    let settled = match (outcome, &job) {
        (Ok(None), _) => claim.complete(&row.id).await.map(|()| &shared.tally.done),
        (Ok(Some(error)), Some(job)) => claim.fail_job(job, error).await.map(|f| match f {
            JobFailure::Retried => &shared.tally.retried,
            _ => &shared.tally.failed,
        }),
        (Ok(Some(_)), None) => claim.fail(&row.id).await.map(|()| &shared.tally.failed),
        (Err(why), _) => {
            if let Ok(mut f) = shared.fatal.lock() {
                f.get_or_insert(why);
            }
            let _ = shared.stop_now.send(true);
            claim
                .release(&row.id)
                .await
                .map(|()| &shared.tally.released)
        }
    };
    match settled {
        Ok(counter) => {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Err(Error::LeaseLost { .. }) => {
            shared.tally.lost.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "rowclaim: row {}: lease lost (another worker took the row over); its result is discarded",
                row.id
            );
        }
        Err(e) => eprintln!("rowclaim: settling row {}: {e}", row.id),
    }
}

/// Runs the command with `input` as one JSON line on stdin. `Ok(None)` on exit status 0,
/// `Ok(Some(what went wrong))` otherwise; `Err` when the command could not be started at all.
async fn run_command(
    claim: &Claim,
    row: &ClaimedRow,
    input: &serde_json::Value,
    command: &[String],
) -> Result<Option<String>, String> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| "no COMMAND given after --".to_string())?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("ROWCLAIM_ID", row.id.to_string())
        .env("ROWCLAIM_TOKEN", claim.token().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot run {program:?}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let mut line = input.to_string();
        line.push('\n');
        // A command that does not read its input closes the pipe early; that is fine.
        let _ = stdin.write_all(line.as_bytes()).await;
    }
    let failure = match child.wait().await {
        Ok(status) if status.success() => return Ok(None),
        Ok(status) => format!("{program} exited with {status}"),
        Err(e) => format!("waiting for {program}: {e}"),
    };
    eprintln!("rowclaim: row {}: {failure}", row.id);
    Ok(Some(failure))
}
