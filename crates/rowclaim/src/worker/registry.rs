//! The worker registry: each running [`Worker`](super::Worker) keeps a row in `rowclaim_workers`
//! (its id, host, pid, version, what it works on, when it started, its last heartbeat by the
//! database's clock, the jobs it runs now), renewed by one small UPDATE every third of its lease
//! and marked stopped when it shuts down cleanly. A worker whose heartbeat is older than its
//! lease is *gone* (killed, hung, cut off): that is decided when the registry is read, by the
//! database's clock, so a dead worker needs nobody to mark it.
//!
//! The table is made the first time a worker registers (as the source registry is: a worker of
//! an own table runs without `rowclaim init`). Registering never stops a worker that works: a
//! registry that cannot be written (no privilege) is said once, and the worker goes on unlisted.
//! Entries stopped or gone for a day are pruned by the workers as they start (beside their first
//! claims), a bounded number at a time.
//!
//! A worker's id ends in the tag its claims' tokens end in ([`crate::Token::tag`]), so a row's
//! owner names the worker that holds it ([`WorkerEntry::holds`]). A worker's own entry, its
//! writes and heartbeats, is `registration.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::backend::dispatch;
use crate::backend::run::{Col, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::claim::Token;
use crate::db::Db;
use crate::error::{DbKind, Result};
use crate::journal::{from_millis, millis};
use crate::value::Value;

/// The registry table's name.
pub(super) const TABLE: &str = "rowclaim_workers";

/// The table, in SQL every database takes alike (times are epoch milliseconds by the database's
/// clock; `queues` a JSON array).
pub(super) const CREATE: &str = "CREATE TABLE IF NOT EXISTS rowclaim_workers (
    id VARCHAR(40) NOT NULL PRIMARY KEY,
    host VARCHAR(255) NOT NULL,
    pid BIGINT NOT NULL,
    version VARCHAR(40) NOT NULL,
    queues TEXT NOT NULL,
    source VARCHAR(255) NOT NULL,
    concurrency BIGINT NOT NULL,
    lease_ms BIGINT NOT NULL,
    running BIGINT NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    stopped_at BIGINT NULL)";

/// How long a stopped or gone worker stays listed.
pub(super) const KEEP: Duration = Duration::from_secs(24 * 3600);

/// The longest one write of the registry may take before it is given up (the next heartbeat
/// tries again; a worker stopping or starting goes on without it).
pub(super) const WRITE_MOST: Duration = Duration::from_secs(5);

/// The most entries one worker prunes as it starts.
pub(super) const PRUNE_MOST: usize = 100;

/// What a listed worker is doing, as the registry is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum WorkerState {
    /// Heartbeating: its last heartbeat is within its lease.
    Active,
    /// Shut down cleanly.
    Stopped,
    /// No heartbeat for longer than its lease: killed, hung, or cut off from the database.
    Gone,
}

impl WorkerState {
    /// Every state, in the order they are listed.
    pub const ALL: [WorkerState; 3] =
        [WorkerState::Active, WorkerState::Stopped, WorkerState::Gone];

    /// The state's name: `active`, `stopped`, `gone`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Active => "active",
            WorkerState::Stopped => "stopped",
            WorkerState::Gone => "gone",
        }
    }
}

impl fmt::Display for WorkerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One worker as the registry lists it ([`Db::workers`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WorkerEntry {
    /// The worker's id (a UUID whose last 12 hex digits its claims' tokens end in).
    pub id: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: i64,
    /// The rowclaim version it runs.
    pub version: String,
    /// The managed queues it takes jobs from; empty: every queue (or an own table).
    pub queues: Vec<String>,
    /// The table it claims rows of (`rowclaim_jobs` for the managed queue).
    pub source: String,
    /// Jobs it runs at once, at most.
    pub concurrency: i64,
    /// Jobs it ran at its last heartbeat.
    pub running: i64,
    /// Its lease: with no heartbeat for this long it is gone.
    #[serde(with = "secs")]
    pub lease: Duration,
    /// When it started, by the database's clock.
    #[serde(with = "rfc3339")]
    pub started_at: SystemTime,
    /// Its last heartbeat, by the database's clock.
    #[serde(with = "rfc3339")]
    pub heartbeat_at: SystemTime,
    /// What it is doing, as read now by the database's clock.
    pub state: WorkerState,
}

impl WorkerEntry {
    /// Whether a claim's token (a row's owner, as text) is one of this worker's.
    pub fn holds(&self, token: &str) -> bool {
        match (token.parse::<Token>(), self.id.parse::<Token>()) {
            (Ok(t), Ok(mine)) => t.tag() == mine.tag(),
            _ => false,
        }
    }
}

mod rfc3339 {
    pub fn serialize<S: serde::Serializer>(
        t: &std::time::SystemTime,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_rfc3339_millis(*t))
    }
}

mod secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// What a worker registers.
pub(crate) struct Entry {
    pub id: String,
    pub host: String,
    pub pid: i64,
    pub queues: Vec<String>,
    pub source: String,
    pub concurrency: i64,
    pub lease: Duration,
}

/// The registry role, written once for every database over its driver's [`Run`].
#[async_trait::async_trait]
pub(super) trait Roster: Send + Sync {
    /// Writes `e`'s entry, as stopped already when `stopped`.
    async fn insert(&self, e: &Entry, stopped: bool) -> Result<()>;
    async fn beat(&self, id: &str, running: i64) -> Result<u64>;
    async fn stop(&self, id: &str) -> Result<u64>;
    async fn list(&self) -> Result<Vec<WorkerEntry>>;
    async fn prune(&self, older: Duration, most: usize) -> Result<u64>;
}

#[async_trait::async_trait]
impl<R: Run + Send + Sync> Roster for R {
    async fn insert(&self, e: &Entry, stopped: bool) -> Result<()> {
        let queues = serde_json::Value::from(e.queues.clone()).to_string();
        let mut b = Binder::<R::Sql>::new();
        let values = [
            b.bind(e.id.clone()),
            b.bind(e.host.clone()),
            b.bind(e.pid),
            b.bind(env!("CARGO_PKG_VERSION").to_owned()),
            b.bind(queues),
            b.bind(e.source.clone()),
            b.bind(e.concurrency),
            b.bind(millis(e.lease)),
        ]
        .join(", ");
        let now = R::Sql::epoch_ms(R::Sql::NOW);
        let stopped_at = if stopped { now.as_str() } else { "NULL" };
        let sql = format!(
            "INSERT INTO {TABLE} (id, host, pid, version, queues, source, concurrency, lease_ms, \
             running, started_at, heartbeat_at, stopped_at) \
             VALUES ({values}, 0, {now}, {now}, {stopped_at})"
        );
        self.execute(Stmt::new(sql, b)).await.map(drop)
    }

    async fn beat(&self, id: &str, running: i64) -> Result<u64> {
        let mut b = Binder::<R::Sql>::new();
        let n = b.bind(running);
        let id = b.bind(id.to_owned());
        let now = R::Sql::epoch_ms(R::Sql::NOW);
        let sql = format!(
            "UPDATE {TABLE} SET heartbeat_at = {now}, running = {n} \
             WHERE id = {id} AND stopped_at IS NULL"
        );
        self.execute(Stmt::new(sql, b)).await
    }

    async fn stop(&self, id: &str) -> Result<u64> {
        let mut b = Binder::<R::Sql>::new();
        let id = b.bind(id.to_owned());
        let now = R::Sql::epoch_ms(R::Sql::NOW);
        let sql = format!(
            "UPDATE {TABLE} SET stopped_at = {now}, heartbeat_at = {now}, running = 0 \
             WHERE id = {id}"
        );
        self.execute(Stmt::new(sql, b)).await
    }

    async fn list(&self) -> Result<Vec<WorkerEntry>> {
        let now = R::Sql::epoch_ms(R::Sql::NOW);
        let sql = format!(
            "SELECT id, host, pid, version, queues, source, concurrency, lease_ms, running, \
             started_at, heartbeat_at, stopped_at, {now} FROM {TABLE} ORDER BY started_at, id"
        );
        use Col::{Int, OptInt, Text};
        let cols = [
            Text, Text, Int, Text, Text, Text, Int, Int, Int, Int, Int, OptInt, Int,
        ];
        match self.values(Stmt::new(sql, Binder::new()), &cols).await {
            Ok(rows) => Ok(rows.into_iter().map(entry).collect()),
            Err(e) if e.db_kind() == Some(DbKind::MissingTable) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    async fn prune(&self, older: Duration, most: usize) -> Result<u64> {
        // Read the ids, then delete them: MySQL and MariaDB take no LIMIT in an IN subquery.
        let mut b = Binder::<R::Sql>::new();
        let keep = b.bind(millis(older));
        let keep_too = b.bind(millis(older));
        let now = R::Sql::epoch_ms(R::Sql::NOW);
        let sql = format!(
            "SELECT id FROM {TABLE} WHERE stopped_at < {now} - {keep} \
             OR (stopped_at IS NULL AND heartbeat_at + lease_ms < {now} - {keep_too}) \
             ORDER BY heartbeat_at LIMIT {}",
            most.max(1)
        );
        let ids = self.texts(Stmt::new(sql, b)).await?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut b = Binder::<R::Sql>::new();
        let list = ids
            .into_iter()
            .map(|id| b.bind(id))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!("DELETE FROM {TABLE} WHERE id IN ({list})");
        self.execute(Stmt::new(sql, b)).await
    }
}

/// A listed worker from its row (the last column: the database's time now).
fn entry(row: Vec<Value>) -> WorkerEntry {
    let mut r = row.into_iter();
    let mut text = || r.next().and_then(Value::text).unwrap_or_default();
    let (id, host) = (text(), text());
    let pid = r.next().and_then(Value::int).unwrap_or(0);
    let version = r.next().and_then(Value::text).unwrap_or_default();
    let queues = r.next().and_then(Value::text).unwrap_or_default();
    let source = r.next().and_then(Value::text).unwrap_or_default();
    let mut int = || r.next().and_then(Value::int).unwrap_or(0);
    let (concurrency, lease_ms, running, started, beat) = (int(), int(), int(), int(), int());
    let stopped = r.next().and_then(Value::int);
    let now = r.next().and_then(Value::int).unwrap_or(0);
    let state = match stopped {
        Some(_) => WorkerState::Stopped,
        None if now > beat.saturating_add(lease_ms) => WorkerState::Gone,
        None => WorkerState::Active,
    };
    WorkerEntry {
        id,
        host,
        pid,
        version,
        queues: serde_json::from_str(&queues).unwrap_or_default(),
        source,
        concurrency,
        running: if state == WorkerState::Active {
            running
        } else {
            0
        },
        lease: Duration::from_millis(u64::try_from(lease_ms).unwrap_or(0)),
        started_at: from_millis(started),
        heartbeat_at: from_millis(beat),
        state,
    }
}

/// The registry of `db`'s driver: the one door to it.
pub(super) fn roster(db: &Db) -> &dyn Roster {
    dispatch!(&db.backend, d => d)
}

impl Db {
    /// Every worker the registry lists, stopped and gone ones too (for a day), oldest first.
    /// None when no worker ever registered.
    pub async fn workers(&self) -> Result<Vec<WorkerEntry>> {
        roster(self).list().await
    }

    /// How many listed workers are in each state (every state present, maybe 0): for a gauge.
    pub async fn worker_counts(&self) -> Result<BTreeMap<WorkerState, u64>> {
        let mut counts: BTreeMap<WorkerState, u64> =
            WorkerState::ALL.iter().map(|s| (*s, 0)).collect();
        for w in self.workers().await? {
            *counts.entry(w.state).or_default() += 1;
        }
        Ok(counts)
    }
}

/// This machine's name: the kernel's on Linux, else `HOSTNAME` or `COMPUTERNAME`, else
/// `unknown`.
pub(crate) fn host_name() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    kernel
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row as the registry's SELECT reads it: beat at 10,000 ms, lease 3,000 ms, now `now`.
    fn row(stopped: Option<i64>, now: i64) -> Vec<Value> {
        let id = Token::tagged(0xabc).to_string();
        vec![
            Value::Text(id),
            Value::Text("h".into()),
            Value::Int(7),
            Value::Text("0.1.0".into()),
            Value::Text("[\"mail\"]".into()),
            Value::Text("rowclaim_jobs".into()),
            Value::Int(2),
            Value::Int(3000),
            Value::Int(1),
            Value::Int(9000),
            Value::Int(10_000),
            Value::OptInt(stopped),
            Value::Int(now),
        ]
    }

    /// Gone is decided by the database's now against the heartbeat and the lease; stopped wins.
    #[test]
    fn state_by_the_database_clock() {
        let active = entry(row(None, 13_000));
        assert_eq!(active.state, WorkerState::Active);
        assert_eq!(active.running, 1);
        assert_eq!(active.queues, vec!["mail".to_owned()]);
        let gone = entry(row(None, 13_001));
        assert_eq!(gone.state, WorkerState::Gone);
        assert_eq!(
            gone.running, 0,
            "a gone worker runs nothing it can vouch for"
        );
        assert_eq!(entry(row(Some(10_000), 99_999)).state, WorkerState::Stopped);
    }

    /// A worker's id and its tokens share their tag; another worker's do not.
    #[test]
    fn a_worker_holds_its_own_tokens_only() {
        let w = entry(row(None, 0));
        assert!(w.holds(&Token::tagged(0xabc).to_string()));
        assert!(!w.holds(&Token::tagged(0xabd).to_string()));
        assert!(!w.holds("not a token"));
    }
}
