//! The handler behind `rowclaim work` (whose flags are in `cmd/work.rs`): it runs the COMMAND
//! once per row, and [`summary`] says what the run did.
//!
//! Claiming, heartbeats, time limits, outages and shutdown are the library runtime's; this file
//! only starts the command, feeds it the row, and stops it when asked: SIGTERM to its process
//! group, then SIGKILL after `--kill-after`.

use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use rowclaim::{Handler, Task, TaskFuture, TaskResult, WorkerReport};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;

use crate::spawn;

/// How much of the end of a failed command's stderr is kept with its row (a job's `last_error`).
pub const STDERR_TAIL: usize = 2048;

/// The exit status by which a command asks to run again later (sysexits' EX_TEMPFAIL).
pub const SNOOZE_STATUS: i32 = 75;

/// Runs one command per row: the row (or a managed job's payload) as one JSON line on stdin,
/// its id and token (and a job's kind, attempt and queue) in the environment.
pub struct RunCommand {
    pub command: Vec<String>,
    /// How long a stopped command gets between SIGTERM and SIGKILL.
    pub kill_after: Duration,
    /// How long a command that exits with [`SNOOZE_STATUS`] waits before it runs again.
    pub snooze_for: Duration,
    /// Most bytes of a command's stdout kept as its output (0: none, and stdout is not piped).
    pub output_limit: usize,
}

impl Handler for RunCommand {
    fn run(&self, task: Task) -> TaskFuture {
        let command = self.command.clone();
        let (kill_after, snooze_for, output_limit) =
            (self.kill_after, self.snooze_for, self.output_limit);
        Box::pin(async move {
            match run_command(&command, kill_after, output_limit, task).await {
                Ran::Result(r) => r,
                Ran::Snooze => TaskResult::Snooze(snooze_for),
            }
        })
    }

    fn stop_grace(&self) -> Duration {
        // SIGTERM, the wait, SIGKILL, and reaping.
        self.kill_after + Duration::from_secs(5)
    }
}

/// The process group of a running command. Every command leads a group of its own, so that a
/// terminal's Ctrl-C reaches rowclaim alone (which then lets the command finish) and a stop
/// reaches the command's children too. If the future running the command is dropped while the
/// command runs, the group is killed.
struct Group {
    leader: Option<Pid>,
}

impl Group {
    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.leader {
            // ESRCH: the group is gone already, which is what we want.
            let _ = killpg(pid, signal);
        }
    }

    /// The leader was reaped: its pid may be reused, so never signal it again.
    fn reaped(&mut self) {
        self.leader = None;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

/// How a command's run ended.
enum Ran {
    Result(TaskResult),
    /// It exited with [`SNOOZE_STATUS`].
    Snooze,
}

impl From<TaskResult> for Ran {
    fn from(r: TaskResult) -> Ran {
        Ran::Result(r)
    }
}

async fn run_command(
    command: &[String],
    kill_after: Duration,
    output_limit: usize,
    task: Task,
) -> Ran {
    let Some((program, args)) = command.split_first() else {
        return TaskResult::Abort("no COMMAND given after --".into()).into();
    };
    let input = match task.job() {
        Some(job) => job.payload.to_string(),
        None => task.row().data.to_string(),
    };
    let row_id = task.id().to_string();
    let token = task.token().to_string();
    let attempt;
    let mut env = vec![
        ("ROWCLAIM_ID", row_id.as_str()),
        ("ROWCLAIM_TOKEN", token.as_str()),
    ];
    if let Some(job) = task.job() {
        attempt = job.attempt.to_string();
        env.extend([
            ("ROWCLAIM_KIND", job.kind.as_str()),
            ("ROWCLAIM_QUEUE", job.queue.as_str()),
            ("ROWCLAIM_ATTEMPT", attempt.as_str()),
        ]);
    }
    // In a process group of its own; killed when dropped; on Linux told to stop (SIGTERM) if
    // rowclaim dies without stopping it (SIGKILL). See `spawn/`.
    let mut line = input.into_bytes();
    line.push(b'\n');
    let mut child = match spawn::spawn(program, args, &env, line, output_limit > 0) {
        Ok(child) => child,
        // A command that does not exist or may not run never will: stop the worker.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            return TaskResult::Abort(format!("cannot run {program:?}: {e}")).into()
        }
        // Out of processes, files or memory: this row fails, and runs again later.
        Err(e) => return TaskResult::Failed(format!("cannot start {program:?} now: {e}")).into(),
    };
    let mut group = Group {
        leader: child.id().map(|id| Pid::from_raw(id as i32)),
    };
    let tail = Arc::new(Mutex::new(Vec::new()));
    let tee = child
        .stderr
        .take()
        .map(|from| tokio::spawn(tee_stderr(from, tail.clone())));
    let head = Arc::new(Mutex::new(Vec::new()));
    let out_tee = child
        .stdout
        .take()
        .map(|from| tokio::spawn(tee_stdout(from, head.clone(), output_limit)));
    let stopped = task.stopped();
    let id = task.id().clone();
    let status = tokio::select! {
        status = child.wait() => status,
        reason = stopped => {
            group.signal(Signal::SIGTERM);
            if tokio::time::timeout(kill_after, child.wait()).await.is_err() {
                group.signal(Signal::SIGKILL);
            }
            let _ = child.wait().await;
            // Whatever else of the group survived the leader (a child ignoring SIGTERM) goes
            // too: the row is given back, and nothing of this run may go on. The group id stays
            // reserved while any member lives, so this reaches no other process.
            group.signal(Signal::SIGKILL);
            group.reaped();
            // The runtime records the stop itself; this text only says what happened.
            let failure = format!("{program} was stopped: {reason}");
            return failed_with_tail(failure, tee, &tail).await.into();
        }
    };
    group.reaped();
    let failure = match status {
        Ok(status) if status.success() => {
            return match output(out_tee, &head, output_limit).await {
                Some(out) => TaskResult::Output(out),
                None => TaskResult::Done,
            }
            .into();
        }
        Ok(status) if status.code() == Some(SNOOZE_STATUS) => return Ran::Snooze,
        Ok(status) => format!("{program} exited with {}", status_text(status)),
        Err(e) => format!("waiting for {program}: {e}"),
    };
    eprintln!("rowclaim: row {id}: {failure}");
    failed_with_tail(failure, tee, &tail).await.into()
}

/// What a command that succeeded printed, as its output: a JSON document as JSON, other text
/// (or a document cut at `limit`) as a string; `None` when it printed nothing.
async fn output(
    tee: Option<tokio::task::JoinHandle<bool>>,
    head: &Mutex<Vec<u8>>,
    limit: usize,
) -> Option<serde_json::Value> {
    let tee = tee?;
    // A child the command left running may hold the pipe open: do not wait for it long.
    let cut = matches!(
        tokio::time::timeout(Duration::from_millis(200), tee).await,
        Ok(Ok(true))
    );
    let head = head.lock().map(|h| h.clone()).unwrap_or_default();
    let text = String::from_utf8_lossy(&head[..head.len().min(limit)]);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if !cut {
        if let Ok(doc) = serde_json::from_str::<serde_json::Value>(text) {
            return Some(doc);
        }
    }
    let shown = if cut {
        format!("{text}…")
    } else {
        text.to_owned()
    };
    Some(serde_json::Value::String(shown))
}

/// Copies the command's stdout to ours as it comes, keeping its first `limit` bytes; returns
/// whether there was more than that.
async fn tee_stdout(from: pipe::Receiver, head: Arc<Mutex<Vec<u8>>>, limit: usize) -> bool {
    let mut to = tokio::io::stdout();
    let mut buf = Vec::new();
    let mut cut = false;
    loop {
        let n = read_some(&from, &mut buf).await;
        if n == 0 {
            break;
        }
        // Our own stdout closed is no reason to stop keeping the output.
        let _ = to.write_all(&buf[..n]).await;
        if let Ok(mut h) = head.lock() {
            let room = limit.saturating_sub(h.len());
            h.extend_from_slice(&buf[..n.min(room)]);
            cut |= n > room;
        }
    }
    let _ = to.flush().await;
    cut
}

/// The row failed with `failure` and, after it, the end of the command's stderr (the terminal
/// saw all of it already; the row keeps its end, a job in `last_error`).
async fn failed_with_tail(
    failure: String,
    tee: Option<tokio::task::JoinHandle<()>>,
    tail: &Mutex<Vec<u8>>,
) -> TaskResult {
    if let Some(tee) = tee {
        // A child the command left running may hold the pipe open: do not wait for it long.
        let _ = tokio::time::timeout(Duration::from_millis(200), tee).await;
    }
    let tail = tail.lock().map(|t| tail_text(&t)).unwrap_or_default();
    if tail.is_empty() {
        TaskResult::Failed(failure)
    } else {
        TaskResult::Failed(format!("{failure}: {tail}"))
    }
}

/// "status 7", or "signal 9 (SIGKILL)".
fn status_text(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(name) => format!("signal {sig} ({name})"),
            Err(_) => format!("signal {sig}"),
        },
        (None, None) => status.to_string(),
    }
}

/// Copies the command's stderr to ours as it comes, keeping its last [`STDERR_TAIL`] bytes.
async fn tee_stderr(from: pipe::Receiver, tail: Arc<Mutex<Vec<u8>>>) {
    let mut to = tokio::io::stderr();
    let mut buf = Vec::new();
    loop {
        let n = read_some(&from, &mut buf).await;
        if n == 0 {
            return;
        }
        // Our own stderr closed is no reason to stop keeping the tail.
        let _ = to.write_all(&buf[..n]).await;
        if let Ok(mut t) = tail.lock() {
            t.extend_from_slice(&buf[..n]);
            let over = t.len().saturating_sub(STDERR_TAIL);
            t.drain(..over);
        }
    }
}

/// Reads what `from` has into `buf` (cleared first); 0 at its end or on an error. Most
/// commands print nothing, so the first read takes at most 64 bytes (what `Vec`'s `BufMut`
/// reserves when it has no room: a read of 0 is the end, never a full buffer), which is enough
/// to see the end; only once something came does it read a full buffer's worth at a time. A
/// buffer of 8 KiB per pipe per command cost the worker more than the read itself.
async fn read_some(from: &pipe::Receiver, buf: &mut Vec<u8>) -> usize {
    let printed = buf.capacity() > 0;
    buf.clear();
    if printed {
        buf.reserve(READ_BUFFER);
    }
    loop {
        if from.readable().await.is_err() {
            return 0;
        }
        match from.try_read_buf(buf) {
            Ok(n) => return n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return 0,
        }
    }
}

/// The most one read of a command's output takes, once it printed something.
const READ_BUFFER: usize = 8192;

/// The kept tail as text: whole characters only (the cut may fall inside one), trimmed, and
/// marked "…" where its start was cut off.
fn tail_text(tail: &[u8]) -> String {
    let cut = tail.len() >= STDERR_TAIL;
    let start = tail
        .iter()
        .take(4)
        .take_while(|b| (**b & 0xC0) == 0x80)
        .count();
    let text = String::from_utf8_lossy(&tail[start..]);
    let text = text.trim();
    if cut && !text.is_empty() {
        format!("…{text}")
    } else {
        text.to_owned()
    }
}

/// The summary for `work --json`: the same counts as [`summary`], by name.
pub fn summary_json(r: &WorkerReport) -> serde_json::Value {
    serde_json::json!({
        "done": r.completed,
        "failed": r.failed + r.dead,
        "retried": r.retried,
        "released": r.released,
        "snoozed": r.snoozed,
        "lost": r.lost.saturating_sub(r.cancelled),
        "cancelled": r.cancelled,
        "given_up": r.given_up,
        "finished_later": r.finished_later,
        "unconfirmed": r.unconfirmed,
        "outages": r.outages,
        "interrupted": r.interrupted,
    })
}

/// The summary `work` prints when it stops.
pub fn summary(r: &WorkerReport) -> String {
    let mut line = format!(
        "{} done, {} failed, {} to retry, {} released, {} lost to another worker",
        r.completed,
        r.failed + r.dead,
        r.retried,
        r.released,
        r.lost.saturating_sub(r.cancelled)
    );
    if r.cancelled > 0 {
        line.push_str(&format!(", {} cancelled", r.cancelled));
    }
    if r.snoozed > 0 {
        line.push_str(&format!(", {} snoozed (to run again later)", r.snoozed));
    }
    if r.given_up > 0 {
        line.push_str(&format!(
            ", {} given up (their lease could not be kept; they come back when it ends)",
            r.given_up
        ));
    }
    if r.finished_later > 0 {
        line.push_str(&format!(
            ", {} of those lost or given up finished later",
            r.finished_later
        ));
    }
    if r.unconfirmed > 0 {
        line.push_str(&format!(
            ", {} result(s) unconfirmed (most likely recorded)",
            r.unconfirmed
        ));
    }
    if r.outages > 0 {
        line.push_str(&format!(
            "; the database was unreachable {} time(s)",
            r.outages
        ));
    }
    line
}
