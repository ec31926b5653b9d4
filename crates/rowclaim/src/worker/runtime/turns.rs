//! Turns at SQLite's one write lock among this worker's own writers: its claims and its
//! flushes. Two of them on different connections meet at the lock, and the one that finds it
//! taken waits in SQLite's busy handler, which sleeps 1 ms, then 2, 5, 10 … between looks: the
//! lock then stands idle while work waits. Waiting here instead, in order, each starts the
//! moment the last one is done. Databases with row locks take no turns (`None`).

use std::sync::Arc;

use tokio::sync::{Mutex, MutexGuard};

/// This worker's writers' turns at the write lock, where the database has one writer.
#[derive(Clone, Default)]
pub(super) struct WriteTurns(Option<Arc<Mutex<()>>>);

impl WriteTurns {
    pub(super) fn new(one_writer: bool) -> WriteTurns {
        WriteTurns(one_writer.then(|| Arc::new(Mutex::new(()))))
    }

    /// Waits for this writer's turn; held until dropped. At once where no turns are taken.
    pub(super) async fn take(&self) -> Option<MutexGuard<'_, ()>> {
        match &self.0 {
            Some(turn) => Some(turn.lock().await),
            None => None,
        }
    }

    /// Whether writes take turns (one writer at a time).
    pub(super) fn takes_turns(&self) -> bool {
        self.0.is_some()
    }
}
