//! A finished job's result on its way to the database. It goes straight to the settler, with no
//! task or channel of its own: most results are recorded by their first flush, and the settler
//! counts them. Only a result that was not (the database failed, no answer came, the row was
//! lost) gets a [`Recorder`](super::settle::Recorder) task that looks at why and tries again.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::settle::{Flushed, Reply, Settling};
use super::{Finished, Shared};

/// The results this worker has sent and not yet seen recorded, refused or given up.
#[derive(Default)]
pub(super) struct Results {
    open: AtomicUsize,
    /// Results through since the worker started (see [`Results::so_far`]).
    so_far: AtomicU64,
    /// Told each time a result is through.
    through: Notify,
    /// Results whose first try was not recorded, each with a recorder trying again.
    again: Mutex<JoinSet<()>>,
}

impl Results {
    /// Results still on their way: they count against the rows the worker holds.
    pub(super) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// How many results went through so far: a claim notes it when it starts, and learns from
    /// it whether results written while it ran may have freed room it did not see.
    pub(super) fn so_far(&self) -> u64 {
        self.so_far.load(Ordering::SeqCst)
    }

    /// Resolves when a result went through since the last call (or one may have).
    pub(super) async fn one_through(&self) {
        self.through.notified().await;
    }

    /// Resolves once no result is on its way.
    pub(super) async fn all_through(&self) {
        while self.open() > 0 {
            self.through.notified().await;
        }
    }

    /// Stops the recorders still trying: their rows come back through their leases.
    pub(super) fn abandon(&self) {
        self.again
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .abort_all();
    }

    fn through(&self) {
        self.so_far.fetch_add(1, Ordering::SeqCst);
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.through.notify_one();
    }
}

/// Sends a finished row's result to the settler, unless its lease has ended (then it is given
/// up, see [`Recorder::worth_sending`](super::settle::Recorder::worth_sending)).
pub(super) fn record(sh: &Arc<Shared>, finished: Finished) {
    let Finished {
        held,
        id,
        outcome,
        counter,
        series,
    } = finished;
    if !sh.recorder().worth_sending(&held, &id) {
        return;
    }
    sh.results.open.fetch_add(1, Ordering::SeqCst);
    let then = {
        let (sh, held, id, outcome) = (sh.clone(), held.clone(), id.clone(), outcome.clone());
        move |first: Flushed| {
            let count = sh.tally.of(counter, &series);
            if let Flushed::Recorded = first {
                sh.recorder().recorded(&count);
                return sh.results.through();
            }
            let again = sh.clone();
            let retry = async move {
                let count = again.tally.of(counter, &series);
                let recorder = again.recorder();
                recorder
                    .record_after(&held, &id, outcome, &count, first)
                    .await;
                again.results.through();
            };
            let mut recorders = sh.results.again.lock().unwrap_or_else(|p| p.into_inner());
            // A JoinSet keeps each ended task until it is joined: let go of those first.
            while recorders.try_join_next().is_some() {}
            recorders.spawn(retry);
        }
    };
    let settling = Settling {
        target: held,
        id,
        outcome,
        reply: Reply::Then(Box::new(then)),
    };
    if sh.settles.send(settling).is_err() {
        // The settler is gone: the worker is over.
        sh.results.through();
    }
}
