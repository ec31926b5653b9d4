//! How `work` stops: the first SIGINT, SIGTERM or SIGHUP drains the worker (no new claims,
//! running commands may finish within `--grace`), the second stops running commands now, the
//! third exits at once.

use std::time::Duration;

use crate::error::CliError;
use crate::exit;
use crate::say::say;

/// The signals that stop `work`: SIGINT (Ctrl-C), SIGTERM, and SIGHUP (the terminal went
/// away). Listened for before the first claim, so that no early signal kills rowclaim outright.
pub struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub fn listen() -> Result<StopSignals, CliError> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind| signal(kind).map_err(CliError::io("listening for signals"));
        Ok(StopSignals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The first of these signals (what stops `schedule run`).
    pub async fn first(&mut self) {
        self.next().await;
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }

    /// The next signal at least a second after `since`: one within a second is the same event
    /// delivered twice (`timeout(1)` signals rowclaim and then its whole process group).
    async fn next_after(&mut self, since: tokio::time::Instant) {
        loop {
            self.next().await;
            if since.elapsed() >= Duration::from_secs(1) {
                return;
            }
        }
    }
}

/// First signal: drain (stop claiming, let running commands finish within the grace period).
/// Second: stop them now. Third: exit at once.
pub async fn stop_on_signal(mut signals: StopSignals, stop: rowclaim::Shutdown) {
    signals.next().await;
    say!(
        "stopping: no new claims, rows not started go back, running commands may finish \
         (signal again to stop them now)"
    );
    stop.drain();
    signals.next_after(tokio::time::Instant::now()).await;
    say!("second signal: stopping running commands now and giving their rows back");
    stop.now();
    signals.next_after(tokio::time::Instant::now()).await;
    say!("third signal: exiting at once; unfinished rows come back when their lease ends");
    std::process::exit(i32::from(exit::INTERRUPTED.code));
}
