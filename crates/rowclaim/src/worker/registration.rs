//! A worker's own entry in the worker registry (`registry.rs`): written beside its first
//! claims, renewed by heartbeats every third of its lease, marked stopped at its end; every
//! write bounded, and its failure said (a refusal once), never returned.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::registry::{host_name, roster, Entry, CREATE, KEEP, PRUNE_MOST, TABLE, WRITE_MOST};
use crate::backend::dispatch;
use crate::claim::{Claimer, Token};
use crate::db::Db;
use crate::error::{DbKind, ErrorKind};
use crate::journal::create_table;

/// The registry's work beside a running worker ([`Registration::list`]), finished by
/// [`Listing::end`]. Dropped before that (a worker's future dropped mid-run), it stops: no
/// heartbeat keeps listing as alive a worker that no longer runs.
pub(crate) struct Listing {
    registration: Arc<Registration>,
    registering: Option<JoinHandle<()>>,
    beating: JoinHandle<()>,
    pruning: Option<JoinHandle<()>>,
}

impl Listing {
    /// Ends the heartbeats and marks the worker stopped once its entry was written, beside the
    /// prune (a worker that ended at once still prunes). Each write is bounded
    /// ([`Registration::bounded`]): a registry that does not answer holds the end up 10 s at
    /// most, 5 s once the entry was written.
    pub(crate) async fn end(mut self) {
        self.beating.abort();
        if let Some(registering) = self.registering.take() {
            let _ = registering.await;
        }
        let pruning = self.pruning.take();
        let pruned = async {
            if let Some(p) = pruning {
                let _ = p.await;
            }
        };
        tokio::join!(pruned, self.registration.stop());
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        self.beating.abort();
        for task in [&self.registering, &self.pruning].into_iter().flatten() {
            task.abort();
        }
    }
}

/// A worker's registration: its entry, renewed by [`Registration::beat`] and marked stopped by
/// [`Registration::stop`]. Every write's failure is logged, never returned.
pub(crate) struct Registration {
    db: Db,
    entry: Entry,
    /// The registry could not be written for good (no privilege): said once, not tried again.
    off: AtomicBool,
    /// Jobs running now, kept by the runtime.
    pub(crate) running: Arc<AtomicUsize>,
}

impl Registration {
    /// Tags `claimer`'s tokens with a fresh worker id. Returns the tagged claimer and the
    /// registration, not yet written: [`Registration::register`] writes it, beside the worker's
    /// first claims.
    pub(crate) fn new(
        claimer: Claimer,
        queues: Vec<String>,
        concurrency: usize,
        lease: Duration,
    ) -> (Claimer, Arc<Registration>) {
        let tag = fresh_tag();
        let claimer = claimer.tagged(tag);
        let entry = Entry {
            id: Token::tagged(tag).to_string(),
            host: host_name(),
            pid: i64::from(std::process::id()),
            queues,
            source: claimer.source_name().to_owned(),
            concurrency: i64::try_from(concurrency).unwrap_or(i64::MAX),
            lease,
        };
        let reg = Arc::new(Registration {
            db: claimer.db().clone(),
            entry,
            off: AtomicBool::new(false),
            running: Arc::new(AtomicUsize::new(0)),
        });
        (claimer, reg)
    }

    /// Writes the worker's entry (making the table the first time), given up after
    /// [`WRITE_MOST`]. Run beside the worker's first claims, not before them: the tokens carry
    /// the worker's id already, and the first job should not wait for a listing (on a new
    /// database the table's creation took 8 ms of a first job's 30).
    async fn register(&self) {
        self.bounded("registering the worker", self.write_entry())
            .await;
    }

    /// Starts the registry's work beside the running worker: its entry, then its heartbeats,
    /// and the prune of old entries.
    pub(crate) fn list(self: &Arc<Self>) -> Listing {
        let (registered, beats) = tokio::sync::oneshot::channel::<()>();
        let me = self.clone();
        let registering = tokio::spawn(async move {
            me.register().await;
            let _ = registered.send(());
        });
        let me = self.clone();
        let beating = tokio::spawn(async move {
            // The heartbeats renew the entry, so they wait for it.
            let _ = beats.await;
            me.beat_forever().await;
        });
        let me = self.clone();
        let pruning = tokio::spawn(async move { me.prune().await });
        Listing {
            registration: self.clone(),
            registering: Some(registering),
            beating,
            pruning: Some(pruning),
        }
    }

    /// Prunes entries stopped or gone for a day. Run beside the worker's first claims, not
    /// before them: it is housekeeping, and the first job should not wait for it.
    async fn prune(&self) {
        if self.off.load(Ordering::Relaxed) {
            return;
        }
        let prune = async {
            if let Err(e) = roster(&self.db).prune(KEEP, PRUNE_MOST).await {
                tracing::debug!("pruning {TABLE}: {e}");
            }
        };
        self.bounded("pruning old workers", prune).await;
    }

    /// The worker's id.
    fn id(&self) -> &str {
        &self.entry.id
    }

    /// Runs one write of the registry, given up after [`WRITE_MOST`]: a registry that does not
    /// answer (an outage) holds the worker up for at most that long, at its start or its end.
    async fn bounded(&self, doing: &str, write: impl std::future::Future<Output = ()>) {
        if tokio::time::timeout(WRITE_MOST, write).await.is_err() {
            tracing::debug!("{doing}: no answer within {WRITE_MOST:?}");
        }
    }

    /// Writes the entry, making the table the first time.
    async fn write_entry(&self) {
        let r = roster(&self.db);
        let result = match r.insert(&self.entry, false).await {
            Err(e) if e.db_kind() == Some(DbKind::MissingTable) => {
                match dispatch!(&self.db.backend, d => create_table(d, CREATE).await) {
                    Ok(()) => {
                        self.db.announce_created(
                            TABLE,
                            "which lists the workers and their heartbeats",
                        );
                        r.insert(&self.entry, false).await
                    }
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        match result {
            Ok(()) => tracing::debug!(worker = self.id(), "registered"),
            Err(e) => self.failed("registering the worker", &e),
        }
    }

    /// Renews the heartbeat with the jobs running now; registers again when the entry is
    /// missing (pruned while this worker was cut off, or the table dropped).
    async fn beat(&self) {
        if self.off.load(Ordering::Relaxed) {
            return;
        }
        let running = i64::try_from(self.running.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        match roster(&self.db).beat(&self.entry.id, running).await {
            Ok(0) => self.write_entry().await,
            Ok(_) => {}
            Err(e) => self.failed("renewing the worker's heartbeat", &e),
        }
    }

    /// Beats every third of the lease, for as long as it is polled.
    async fn beat_forever(self: Arc<Self>) {
        let every = (self.entry.lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            self.bounded("renewing the worker's heartbeat", self.beat())
                .await;
        }
    }

    /// Marks the worker stopped (a clean shutdown). Where there was no entry to mark, it writes
    /// one stopped: the entry's own write may have been given up unanswered (a registry slower
    /// than [`WRITE_MOST`]) and land after this, and then, never renewed, it would read "gone"
    /// for a day. Written first, the stopped entry makes that late write fail (its id is
    /// taken); landed first, the late one is marked stopped by the second try.
    pub(crate) async fn stop(&self) {
        if self.off.load(Ordering::Relaxed) {
            return;
        }
        let stop = async {
            let r = roster(&self.db);
            let id = &self.entry.id;
            let result = match r.stop(id).await {
                Ok(0) => match r.insert(&self.entry, true).await {
                    // Its id is taken: the entry landed meanwhile, and is marked now.
                    Err(e) if e.db_kind() != Some(DbKind::MissingTable) => {
                        r.stop(id).await.map(drop)
                    }
                    other => other,
                },
                other => other.map(drop),
            };
            if let Err(e) = result {
                self.failed("marking the worker stopped", &e);
            }
        };
        self.bounded("marking the worker stopped", stop).await;
    }

    /// A write that failed: a refusal is said once and ends the registration; anything else
    /// (an outage, which the worker reports itself) is tried again at the next heartbeat.
    fn failed(&self, doing: &str, e: &crate::error::Error) {
        if e.kind() == ErrorKind::PermissionDenied {
            if !self.off.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "{doing}: {e}; the worker runs on, but `rowclaim workers` will not list it \
                     (grant it INSERT and UPDATE on {TABLE}, or CREATE for the first worker)"
                );
            }
        } else {
            tracing::debug!("{doing}: {e}");
        }
    }
}

#[cfg(test)]
mod tests;

/// A fresh 48-bit worker tag, never 0: the random end of a UUID v7 (which the uuid crate keeps
/// apart within a process too), mixed with the process id.
fn fresh_tag() -> u64 {
    let bytes = uuid::Uuid::now_v7().into_bytes();
    let random = bytes[10..]
        .iter()
        .fold(0u64, |tag, b| (tag << 8) | u64::from(*b));
    let tag = (random ^ (u64::from(std::process::id()) << 16)) & 0xffff_ffff_ffff;
    tag.max(1)
}
