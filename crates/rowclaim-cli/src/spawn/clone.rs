//! The Linux spawn without a fork of the worker: `clone(CLONE_VM | CLONE_VFORK)` onto a stack
//! of its own, the parent-death signal set in the child, the exit awaited through a pidfd (see
//! the parent module for why).

use nix::libc;
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr, OsString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::unix::pipe;

use super::Child;

/// The child's stack. Its code is a few calls deep (no allocation, no formatting), and the
/// binary binds its symbols at load time, so no lazy binding runs on it either; glibc gives
/// its own `posix_spawn` child 32 KiB plus the argv.
const STACK: usize = 64 * 1024;

thread_local! {
    /// This thread's child stack, kept from one spawn to the next. The thread waits while its
    /// child runs on it (CLONE_VFORK), so no two children share one. A stack allocated per
    /// command made malloc sort its free lists on every spawn (a large request), which cost
    /// the worker more than the rest of its side of a spawn.
    static STACKS: Cell<Option<Box<[MaybeUninit<u8>]>>> = const { Cell::new(None) };
}

/// The shell that runs a file the kernel cannot exec (ENOEXEC: a script with no `#!` line),
/// as `execvp` does.
const SHELL: &CStr = c"/bin/sh";

/// Whether this kernel gives pidfds (Linux 5.3), asked once.
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| pidfd_open(std::process::id() as libc::pid_t).is_ok())
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // pidfd_open takes a pid and flags and returns a new file descriptor or -1.
    let flags: libc::c_uint = 0;
    // SAFETY: as above.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pipe: (read end, write end), both close-on-exec, and both at 3 or above (dup2 onto
/// 0, 1 or 2 must never find its source already there).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned these descriptors, and nothing else owns them.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// `fd`, or a close-on-exec copy of it at 3 or above when it is 0, 1 or 2 (when rowclaim's
/// own stdin, stdout or stderr was closed).
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor or -1; `fd` stays valid meanwhile.
    let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// Makes our end of a pipe from [`pipe`] non-blocking. pipe2 set no status flag on it
/// (O_CLOEXEC is a descriptor flag, and F_SETFL ignores the access mode), so the flags need
/// not be read first.
fn nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; the flags are a plain int.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes as much of `input` into the empty pipe `fd` (non-blocking) as it takes at once;
/// returns how much that was (what an error left is handed to the writer task, which tries
/// again and gives up).
fn prefill(fd: &OwnedFd, input: &[u8]) -> usize {
    let mut done = 0;
    while done < input.len() {
        let rest = &input[done..];
        // SAFETY: write reads `rest.len()` bytes from `rest`, which lives meanwhile.
        let n = unsafe { libc::write(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        match usize::try_from(n) {
            Ok(n) if n > 0 => done += n,
            _ => break,
        }
    }
    done
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

/// Everything the child needs, made before it starts: it only reads this (and writes
/// `error`, and the one slot of `sh_argv`), while the thread that made it waits.
struct Prepared {
    /// The paths to exec, in order: the program itself when it names a path, else each
    /// directory of PATH joined with it.
    candidates: Arc<[CString]>,
    /// Null-terminated; pointers into `_strings`.
    argv: Vec<*const c_char>,
    /// `/bin/sh`, the candidate (set by the child), argv[1..], null.
    sh_argv: Vec<Cell<*const c_char>>,
    /// Null-terminated; pointers into `_strings`.
    envp: Vec<*const c_char>,
    stdin: RawFd,
    /// -1: inherit ours.
    stdout: RawFd,
    stderr: RawFd,
    /// Our pid: the child checks that its parent is still us once the parent-death signal
    /// is set (if we died before, it would never come).
    parent: libc::pid_t,
    /// The highest signal number (SIGRTMAX).
    last_signal: c_int,
    /// Why the child could not exec (an errno), or 0.
    error: AtomicI32,
    /// The strings the pointers above point into.
    _strings: Vec<CString>,
}

/// The child: reset what it inherited, take the pipes, set the parent-death signal, exec.
/// Returns only on failure, with the errno.
///
/// # Safety
///
/// Runs in a child that shares the parent's memory (CLONE_VM) while the parent's thread is
/// suspended (CLONE_VFORK), with every signal blocked. It must not allocate, lock, unwind,
/// or touch thread-locals beyond errno: only system calls on `p`'s data.
unsafe fn child(p: &Prepared) -> c_int {
    let errno = || {
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // Handlers of ours must not run in the child: back to the default, and SIGPIPE too
    // (Rust ignores it; the command should not). Other ignored signals stay ignored, as
    // with `Command`. Signals are blocked meanwhile.
    let mut default: libc::sigaction = std::mem::zeroed();
    default.sa_sigaction = libc::SIG_DFL;
    libc::sigemptyset(&mut default.sa_mask);
    for sig in 1..=p.last_signal {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let mut old: libc::sigaction = std::mem::zeroed();
        // glibc's own signals (32, 33) answer EINVAL, and keep theirs: fine.
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            continue;
        }
        let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
        if handled || sig == libc::SIGPIPE {
            libc::sigaction(sig, &default, std::ptr::null_mut());
        }
    }
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    if libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
        return errno();
    }
    if libc::setpgid(0, 0) != 0 {
        return errno();
    }
    // The sources are all at 3 or above (`above_stdio`) and close on exec.
    for (from, to) in [(p.stdin, 0), (p.stdout, 1), (p.stderr, 2)] {
        if from >= 0 && libc::dup2(from, to) < 0 {
            return errno();
        }
    }
    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
        return errno();
    }
    if libc::getppid() != p.parent {
        // We died before the signal was set: nobody is left to run this for.
        libc::_exit(127);
    }
    // execvp's search: a missing candidate moves on; one that may not run is remembered
    // (EACCES wins over a later ENOENT); other errors end it.
    let mut denied = false;
    let mut last = libc::ENOENT;
    for path in p.candidates.iter() {
        libc::execve(path.as_ptr(), p.argv.as_ptr(), p.envp.as_ptr());
        last = errno();
        if last == libc::ENOEXEC {
            if let Some(slot) = p.sh_argv.get(1) {
                slot.set(path.as_ptr());
            }
            libc::execve(
                SHELL.as_ptr(),
                p.sh_argv.as_ptr().cast::<*const c_char>(),
                p.envp.as_ptr(),
            );
            return errno();
        }
        match last {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return last,
        }
    }
    if denied {
        libc::EACCES
    } else {
        last
    }
}

extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Prepared` that `spawn` passed to clone; it outlives the child's
    // use of it, because clone (CLONE_VFORK) returns only after the child exec'd or exited.
    let p = unsafe { &*arg.cast::<Prepared>() };
    // SAFETY: this is that child, in the state `child` requires.
    let error = unsafe { child(p) };
    p.error.store(error, Ordering::SeqCst);
    // SAFETY: _exit ends only this process (the child is a process of its own), running
    // nothing of ours.
    unsafe { libc::_exit(127) }
}

/// What the parent prepares: argv, the environment (ours, with `env` set over it) and the
/// candidate paths of `program`.
fn prepare(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    stdio: [RawFd; 3],
) -> io::Result<Prepared> {
    let mut strings = Vec::with_capacity(args.len() + 48);
    let program_c = cstring(program.as_bytes())?;
    let mut argv = vec![program_c.as_ptr()];
    let mut sh_argv = vec![Cell::new(SHELL.as_ptr()), Cell::new(std::ptr::null())];
    strings.push(program_c);
    for arg in args {
        let arg = cstring(arg.as_bytes())?;
        argv.push(arg.as_ptr());
        sh_argv.push(Cell::new(arg.as_ptr()));
        strings.push(arg);
    }
    argv.push(std::ptr::null());
    sh_argv.push(Cell::new(std::ptr::null()));

    let ours = inherited();
    let mut envp = Vec::with_capacity(ours.vars.len() + env.len() + 1);
    for (key, pair) in &ours.vars {
        if !env.iter().any(|(k, _)| OsStr::new(k) == key) {
            envp.push(pair.as_ptr());
        }
    }
    for (key, value) in env {
        let pair = cstring(format!("{key}={value}").as_bytes())?;
        envp.push(pair.as_ptr());
        strings.push(pair);
    }
    envp.push(std::ptr::null());

    Ok(Prepared {
        candidates: ours.candidates(program)?,
        argv,
        sh_argv,
        envp,
        stdin: stdio[0],
        stdout: stdio[1],
        stderr: stdio[2],
        parent: std::process::id() as libc::pid_t,
        last_signal: libc::SIGRTMAX(),
        error: AtomicI32::new(0),
        _strings: strings,
    })
}

/// Our environment as each command gets it (with its own variables set over it), read once:
/// rowclaim never changes its environment once it runs, and reading it for every command cost
/// a few allocations per variable per command.
struct Inherited {
    /// Each variable's name, and `NAME=value`.
    vars: Vec<(OsString, CString)>,
    path: Option<OsString>,
    /// The last program looked up, and where execvp would look for it (`work` runs one).
    last: Mutex<Option<(String, Arc<[CString]>)>>,
}

impl Inherited {
    fn candidates(&self, program: &str) -> io::Result<Arc<[CString]>> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((name, found)) = &*last {
            if name == program {
                return Ok(found.clone());
            }
        }
        let found: Arc<[CString]> = candidates(program, self.path.as_deref())?.into();
        *last = Some((program.to_owned(), found.clone()));
        Ok(found)
    }
}

fn inherited() -> &'static Inherited {
    static OURS: OnceLock<Inherited> = OnceLock::new();
    OURS.get_or_init(|| {
        let mut path = None;
        let vars = std::env::vars_os()
            .filter_map(|(key, value)| {
                if key == "PATH" {
                    path = Some(value.clone());
                }
                let mut pair = key.as_bytes().to_vec();
                pair.push(b'=');
                pair.extend_from_slice(value.as_bytes());
                // The environment holds no NUL bytes: none is skipped.
                Some((key, cstring(&pair).ok()?))
            })
            .collect();
        Inherited {
            vars,
            path,
            last: Mutex::new(None),
        }
    })
}

/// Where execvp would look for `program`: itself if it holds a `/`, else in each directory
/// of PATH (glibc's "/bin:/usr/bin" when unset; an empty entry is the current directory).
fn candidates(program: &str, path: Option<&OsStr>) -> io::Result<Vec<CString>> {
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if program.contains('/') {
        return Ok(vec![cstring(program.as_bytes())?]);
    }
    let path = path.map_or(&b"/bin:/usr/bin"[..], OsStr::as_bytes);
    path.split(|b| *b == b':')
        .map(|dir| {
            if dir.is_empty() {
                return cstring(program.as_bytes());
            }
            let mut full = dir.to_vec();
            if !dir.ends_with(b"/") {
                full.push(b'/');
            }
            full.extend_from_slice(program.as_bytes());
            cstring(&full)
        })
        .collect()
}

pub(super) fn spawn(
    program: &str,
    args: &[String],
    env: &[(&str, &str)],
    input: Vec<u8>,
    pipe_stdout: bool,
) -> io::Result<Child> {
    let (stdin_r, stdin_w) = pipe()?;
    // The input goes into the pipe before the child starts, where it fits (it nearly always
    // does: a pipe holds 64 KiB): no task and no registration with the runtime for it.
    nonblocking(&stdin_w)?;
    let fed = prefill(&stdin_w, &input);
    let stdout = if pipe_stdout { Some(pipe()?) } else { None };
    let (stderr_r, stderr_w) = pipe()?;
    let stdio = [
        stdin_r.as_raw_fd(),
        stdout.as_ref().map_or(-1, |(_, w)| w.as_raw_fd()),
        stderr_w.as_raw_fd(),
    ];
    let mut prepared = prepare(program, args, env, stdio)?;
    let mut stack = STACKS
        .try_with(Cell::take)
        .ok()
        .flatten()
        .unwrap_or_else(|| Box::new_uninit_slice(STACK));
    // The stack grows down from its end, 16-byte aligned.
    let top = stack.as_mut_ptr().cast::<u8>().wrapping_add(STACK);
    let top = top.wrapping_sub(top as usize % 16).cast::<c_void>();

    // Block every signal across the clone, so that no handler of ours runs in the child
    // (which shares our memory) before it resets them; restored right after.
    // SAFETY: sigfillset and pthread_sigmask fill and read sigset_t values we own.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: the child runs `child_main` on `stack`, which stays allocated until clone
    // returns, and with CLONE_VFORK clone returns only once the child exec'd (leaving our
    // memory) or exited; `prepared` likewise outlives it and is not touched by this thread
    // meanwhile. No CLONE_SIGHAND: the child resets its own copy of the signal handlers.
    // SIGCHLD: its exit is reported like any child's, so waitpid sees it.
    let pid = unsafe {
        libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of_mut!(prepared).cast::<c_void>(),
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    // (Kept unless the thread is ending, which cannot be while it spawns.)
    let _ = STACKS.try_with(|s| s.set(Some(stack)));
    if pid < 0 {
        return Err(clone_error);
    }
    // The child's ends are its own now (or it is gone).
    drop((stdin_r, stderr_w));
    let stdout = stdout.map(|(r, _w)| r);
    let error = prepared.error.load(Ordering::SeqCst);
    if error != 0 {
        // It exited: reap it now (it is a zombie already, so this does not block).
        reap(pid, 0)?;
        return Err(io::Error::from_raw_os_error(error));
    }
    let mut process = Process {
        pid,
        pidfd: None,
        status: None,
    };
    let pidfd = pidfd_open(pid)?;
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open, and is the same descriptor,
    // for as long as the AsyncFd lives.
    let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
        .map_err(io::Error::from)?;
    process.pidfd = Some(pidfd);
    if fed < input.len() {
        super::feed(pipe::Sender::from_owned_fd_unchecked(stdin_w)?, input, fed);
    }
    let stdout = match stdout {
        Some(r) => {
            nonblocking(&r)?;
            Some(pipe::Receiver::from_owned_fd_unchecked(r)?)
        }
        None => None,
    };
    let stderr = {
        nonblocking(&stderr_r)?;
        pipe::Receiver::from_owned_fd_unchecked(stderr_r)?
    };
    // (An error above drops `process`, which kills and reaps the child.)
    Ok(Child {
        stdout,
        stderr: Some(stderr),
        process: super::Process::Cloned(process),
    })
}

/// waitpid(pid, flags), through EINTR: the status once it exited, `None` if WNOHANG and it
/// has not yet.
fn reap(pid: libc::pid_t, flags: c_int) -> io::Result<Option<ExitStatus>> {
    loop {
        let mut status: c_int = 0;
        // SAFETY: waitpid writes the status into the int it is given.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        if r == pid {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A child of ours, not yet reaped until `status` is set. Dropped before that, it is
/// killed (SIGKILL) and reaped in the background.
pub(super) struct Process {
    pid: libc::pid_t,
    /// Readable once the child exited.
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl Process {
    pub(super) fn id(&self) -> Option<u32> {
        match self.status {
            None => u32::try_from(self.pid).ok(),
            Some(_) => None,
        }
    }

    pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let Some(pidfd) = &self.pidfd else {
                return Err(io::Error::other("the child's pidfd is missing"));
            };
            let reaped = {
                let mut ready = pidfd.readable().await?;
                let reaped = reap(self.pid, libc::WNOHANG)?;
                if reaped.is_none() {
                    ready.clear_ready();
                }
                reaped
            };
            if let Some(status) = reaped {
                self.status = Some(status);
                self.pidfd = None;
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        // SAFETY: kill takes a pid and a signal. The pid is still our unreaped child (a
        // zombie at worst), so it names no other process.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
        }
        if let Ok(Some(_)) = reap(self.pid, libc::WNOHANG) {
            return;
        }
        let (pid, pidfd) = (self.pid, self.pidfd.take());
        match (pidfd, tokio::runtime::Handle::try_current()) {
            (Some(pidfd), Ok(runtime)) => {
                runtime.spawn(async move {
                    while let Ok(mut ready) = pidfd.readable().await {
                        match reap(pid, libc::WNOHANG) {
                            Ok(None) => ready.clear_ready(),
                            Ok(Some(_)) | Err(_) => return,
                        }
                    }
                });
            }
            // No runtime to wait in: a thread waits (SIGKILLed, it exits soon).
            _ => {
                let _ = std::thread::Builder::new()
                    .name("rowclaim-reap".into())
                    .spawn(move || reap(pid, 0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_execvp() {
        let c = |program, path: Option<&str>| {
            candidates(program, path.map(OsStr::new))
                .unwrap()
                .into_iter()
                .map(|c| c.into_string().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(c("./x", Some("/bin")), ["./x"]);
        assert_eq!(c("/usr/bin/env", None), ["/usr/bin/env"]);
        assert_eq!(c("true", None), ["/bin/true", "/usr/bin/true"]);
        assert_eq!(c("true", Some("/a/::/b")), ["/a/true", "true", "/b/true"]);
        assert!(candidates("", None).is_err());
    }
}
