//! Starting a command for `work` (see `run_command.rs`): in a process group of its own, with its
//! stdin and stderr (and stdout, when kept) piped to us, and, on Linux, with the kernel's
//! parent-death signal (SIGTERM) set, so that a worker killed without cleaning up (SIGKILL) still
//! stops its commands.
//!
//! Rust's `Command` can only set that signal in a `pre_exec` hook, and a hook makes it fork the
//! whole worker per command instead of spawning with vfork semantics: a command per job ran at
//! half the rate of spawning alone. So on Linux this module starts the command itself the way
//! glibc's `posix_spawn` does: `clone(CLONE_VM | CLONE_VFORK)` onto a stack of its own, where the
//! child, sharing our memory while we wait, makes only async-signal-safe system calls on data
//! prepared beforehand (argv, the environment, the candidate paths of a PATH search), then
//! execs. Its exit is awaited through a pidfd. Where pidfds are missing (Linux before 5.3, or a
//! sandbox that forbids them) and off Linux, tokio's `Command` starts it, as before.
//!
//! The parent-death signal is sent when the *thread* that started the child ends. Commands are
//! started from the handler's future, which tokio's worker threads poll; they live as long as
//! the runtime (rowclaim never calls `block_in_place`, which would retire one early).

use std::io;
use std::process::ExitStatus;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;

/// A started command: its output pipes (taken by the caller) and its exit. Its input was given
/// to [`spawn`].
pub struct Child {
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    process: Process,
}

enum Process {
    /// Started by tokio's `Command`, with `kill_on_drop`.
    Tokio(tokio::process::Child),
    /// Started by [`clone::spawn`]; killed and reaped when dropped before its exit was seen.
    #[cfg(target_os = "linux")]
    Cloned(clone::Process),
}

impl Child {
    /// The process id, until its exit was seen.
    pub fn id(&self) -> Option<u32> {
        match &self.process {
            Process::Tokio(child) => child.id(),
            #[cfg(target_os = "linux")]
            Process::Cloned(p) => p.id(),
        }
    }

    /// Waits for the command to exit (cancel-safe: calling it again goes on waiting).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        match &mut self.process {
            Process::Tokio(child) => child.wait().await,
            #[cfg(target_os = "linux")]
            Process::Cloned(p) => p.wait().await,
        }
    }
}

/// Starts `program` with `args`, our environment plus `env`, `input` on its stdin (then the
/// end of it), stderr piped, stdout piped if `pipe_stdout` (else ours), as the leader of a new
/// process group.
///
/// The error of a program that is missing or may not run has the kind `NotFound` or
/// `PermissionDenied`, as with `std::process::Command`.
pub fn spawn(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    input: Vec<u8>,
    pipe_stdout: bool,
) -> io::Result<Child> {
    #[cfg(target_os = "linux")]
    if clone::available() {
        return clone::spawn(program, args, env, input, pipe_stdout);
    }
    spawn_tokio(program, args, env, input, pipe_stdout)
}

/// Writes `input` from byte `from` on into the command's stdin, in a task of its own, then
/// closes it. A command that does not read its input closes the pipe early; that is fine.
fn feed(mut stdin: pipe::Sender, input: Vec<u8>, from: usize) {
    tokio::spawn(async move {
        let _ = stdin.write_all(input.get(from..).unwrap_or_default()).await;
    });
}

fn spawn_tokio(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    input: Vec<u8>,
    pipe_stdout: bool,
) -> io::Result<Child> {
    use std::process::Stdio;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(if pipe_stdout {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    #[cfg(target_os = "linux")]
    {
        use nix::sys::signal::Signal;
        // SAFETY: the closure runs in the forked child before exec and only makes one
        // async-signal-safe system call (prctl).
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(io::Error::from)
            });
        }
    }
    let mut child = cmd.spawn()?;
    let stdin = child.stdin.take().map(|s| s.into_owned_fd());
    let stdout = child.stdout.take().map(|s| s.into_owned_fd());
    let stderr = child.stderr.take().map(|s| s.into_owned_fd());
    if let Some(stdin) = stdin.transpose()? {
        feed(pipe::Sender::from_owned_fd(stdin)?, input, 0);
    }
    Ok(Child {
        stdout: stdout
            .transpose()?
            .map(pipe::Receiver::from_owned_fd)
            .transpose()?,
        stderr: stderr
            .transpose()?
            .map(pipe::Receiver::from_owned_fd)
            .transpose()?,
        process: Process::Tokio(child),
    })
}

#[cfg(target_os = "linux")]
mod clone;
