//! The handler behind `rowclaim work` (whose flags are in `cmd/work.rs`): it runs the COMMAND
//! once per row, and [`summary`] says what the run did.
//!
//! Claiming, heartbeats, time limits, outages and shutdown are the library runtime's; this file
//! only starts the command, feeds it the row, and stops it when asked: SIGTERM to its process
//! group, then SIGKILL after `--kill-after`.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use rowclaim::{Handler, Task, TaskFuture, TaskResult, WorkerReport};
use tokio::io::AsyncWriteExt;

/// Runs one command per row: the row (or a managed job's payload) as one JSON line on stdin,
/// its id and token (and a job's kind, attempt and queue) in the environment.
pub struct RunCommand {
    pub command: Vec<String>,
    /// How long a stopped command gets between SIGTERM and SIGKILL.
    pub kill_after: Duration,
}

impl Handler for RunCommand {
    fn run(&self, task: Task) -> TaskFuture {
        let command = self.command.clone();
        let kill_after = self.kill_after;
        Box::pin(async move { run_command(&command, kill_after, task).await })
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

async fn run_command(command: &[String], kill_after: Duration, task: Task) -> TaskResult {
    let Some((program, args)) = command.split_first() else {
        return TaskResult::Abort("no COMMAND given after --".into());
    };
    let input = match task.job() {
        Some(job) => job.payload.to_string(),
        None => task.row().data.to_string(),
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env("ROWCLAIM_ID", task.id().to_string())
        .env("ROWCLAIM_TOKEN", task.token().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(job) = task.job() {
        cmd.env("ROWCLAIM_KIND", &job.kind)
            .env("ROWCLAIM_QUEUE", &job.queue)
            .env("ROWCLAIM_ATTEMPT", job.attempt.to_string());
    }
    #[cfg(target_os = "linux")]
    {
        // If rowclaim dies without stopping it (SIGKILL), the command is told to stop too.
        // SAFETY: the closure runs in the forked child before exec and only makes one
        // async-signal-safe system call (prctl).
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)
            });
        }
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        // A command that does not exist or may not run never will: stop the worker.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            return TaskResult::Abort(format!("cannot run {program:?}: {e}"))
        }
        // Out of processes, files or memory: this row fails, and runs again later.
        Err(e) => return TaskResult::Failed(format!("cannot start {program:?} now: {e}")),
    };
    let mut group = Group {
        leader: child.id().map(|id| Pid::from_raw(id as i32)),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A command that does not read its input closes the pipe early; that is fine.
        tokio::spawn(async move {
            let mut line = input.into_bytes();
            line.push(b'\n');
            let _ = stdin.write_all(&line).await;
        });
    }
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
            return TaskResult::Failed(format!("{program} was stopped: {reason}"));
        }
    };
    group.reaped();
    let failure = match status {
        Ok(status) if status.success() => return TaskResult::Done,
        Ok(status) => format!("{program} exited with {status}"),
        Err(e) => format!("waiting for {program}: {e}"),
    };
    eprintln!("rowclaim: row {id}: {failure}");
    TaskResult::Failed(failure)
}

/// The summary `work` prints when it stops.
pub fn summary(r: &WorkerReport) -> String {
    let mut line = format!(
        "{} done, {} failed, {} to retry, {} released, {} lost to another worker",
        r.completed,
        r.failed + r.dead,
        r.retried,
        r.released,
        r.lost
    );
    if r.given_up > 0 {
        line.push_str(&format!(
            ", {} given up during an outage (they come back when their lease ends)",
            r.given_up
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
