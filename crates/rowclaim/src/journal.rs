//! The journal: small notes rowclaim's tools keep in the database they watch, so that a restart
//! loses none (the dashboard's chart samples and its log of actions). Each note is a kind, a
//! time by the database's clock, and a JSON body; readers ask for one kind's newest notes.
//!
//! The table `rowclaim_journal` is made the first time a note is written, as the source registry
//! is (a database watched by a dashboard need not have the managed queue). Its key begins with
//! the kind and the time, so a read of one kind's newest notes and a prune of its oldest read an
//! index range, not the table.

use std::time::{Duration, SystemTime};

use crate::backend::dispatch;
use crate::backend::run::{Col, Run};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::db::Db;
use crate::error::{DbKind, Error, Result};
use crate::value::Value;

/// The journal table's name.
const TABLE: &str = "rowclaim_journal";

/// The table, in SQL every database takes alike (times are epoch milliseconds by the database's
/// clock, bodies JSON text).
const CREATE: &str = "CREATE TABLE IF NOT EXISTS rowclaim_journal (
    kind VARCHAR(64) NOT NULL,
    at_ms BIGINT NOT NULL,
    id VARCHAR(40) NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (kind, at_ms, id))";

/// The most notes one prune removes: a prune is one short statement however far behind it is.
pub const PRUNE_MOST: usize = 500;

/// One note of the journal.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Note {
    /// When it was written, by the database's clock.
    pub at: SystemTime,
    /// What it says.
    pub body: serde_json::Value,
}

/// The journal role, written once for every database over its driver's [`Run`].
#[async_trait::async_trait]
trait Journal: Send + Sync {
    async fn write(&self, kind: &str, body: String) -> Result<()>;
    async fn newest(&self, kind: &str, within: Duration, most: usize) -> Result<Vec<Note>>;
    async fn prune(&self, kind: &str, older: Duration, most: usize) -> Result<u64>;
}

#[async_trait::async_trait]
impl<R: Run + Send + Sync> Journal for R {
    async fn write(&self, kind: &str, body: String) -> Result<()> {
        let insert = || {
            let mut b = Binder::<R::Sql>::new();
            let k = b.bind(kind.to_owned());
            let id = b.bind(uuid::Uuid::now_v7().to_string());
            let body = b.bind(body.clone());
            let now = R::Sql::epoch_ms(R::Sql::NOW);
            let sql = format!(
                "INSERT INTO {TABLE} (kind, at_ms, id, body) VALUES ({k}, {now}, {id}, {body})"
            );
            Stmt::new(sql, b)
        };
        match self.execute(insert()).await {
            Err(e) if e.db_kind() == Some(DbKind::MissingTable) => {
                create_table(self, CREATE).await?;
                self.execute(insert()).await.map(drop)
            }
            other => other.map(drop),
        }
    }

    async fn newest(&self, kind: &str, within: Duration, most: usize) -> Result<Vec<Note>> {
        let mut b = Binder::<R::Sql>::new();
        let k = b.bind(kind.to_owned());
        let since = b.bind(millis(within));
        let now = R::Sql::epoch_ms(R::Sql::NOW);
        let sql = format!(
            "SELECT at_ms, body FROM {TABLE} WHERE kind = {k} AND at_ms >= {now} - {since} \
             ORDER BY at_ms DESC, id DESC LIMIT {}",
            most.max(1)
        );
        let rows = match self.values(Stmt::new(sql, b), &[Col::Int, Col::Text]).await {
            Err(e) if e.db_kind() == Some(DbKind::MissingTable) => return Ok(Vec::new()),
            other => other?,
        };
        rows.into_iter().map(note).collect()
    }

    async fn prune(&self, kind: &str, older: Duration, most: usize) -> Result<u64> {
        // The oldest first, by key: MySQL and MariaDB take no LIMIT in an IN subquery, so the
        // keys are read, then deleted by their ids.
        let mut b = Binder::<R::Sql>::new();
        let k = b.bind(kind.to_owned());
        let keep = b.bind(millis(older));
        let now = R::Sql::epoch_ms(R::Sql::NOW);
        let sql = format!(
            "SELECT id FROM {TABLE} WHERE kind = {k} AND at_ms < {now} - {keep} \
             ORDER BY at_ms LIMIT {}",
            most.max(1)
        );
        let ids = match self.texts(Stmt::new(sql, b)).await {
            Err(e) if e.db_kind() == Some(DbKind::MissingTable) => return Ok(0),
            other => other?,
        };
        if ids.is_empty() {
            return Ok(0);
        }
        let mut b = Binder::<R::Sql>::new();
        let k = b.bind(kind.to_owned());
        let list = ids
            .into_iter()
            .map(|id| b.bind(id))
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!("DELETE FROM {TABLE} WHERE kind = {k} AND id IN ({list})");
        self.execute(Stmt::new(sql, b)).await
    }
}

/// A note from its row.
fn note(row: Vec<Value>) -> Result<Note> {
    let mut row = row.into_iter();
    let at = row.next().and_then(Value::int).unwrap_or(0);
    let text = row.next().and_then(Value::text).unwrap_or_default();
    let body = serde_json::from_str(&text)
        .map_err(|e| Error::Internal(format!("a note of {TABLE} is not JSON: {e}")))?;
    Ok(Note {
        at: from_millis(at),
        body,
    })
}

/// Epoch milliseconds (by the database's clock) as a time.
pub(crate) fn from_millis(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A duration in whole milliseconds, as a bound value.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Runs `create` (a `CREATE TABLE IF NOT EXISTS` in SQL every database takes). Two processes
/// that create it at once may see one of them fail though the table is there (PostgreSQL's
/// catalog, Galera): the caller's next statement then finds it, or says why not.
pub(crate) async fn create_table<R: Run + ?Sized>(r: &R, create: &str) -> Result<()> {
    match r.execute(Stmt::new(create.to_owned(), Binder::new())).await {
        Err(e) if e.kind() == crate::error::ErrorKind::PermissionDenied => Err(e),
        Err(e) => {
            tracing::debug!("creating a table of rowclaim's raced or failed: {e}");
            Ok(())
        }
        Ok(_) => Ok(()),
    }
}

/// The journal of `db`'s driver: the one door to it.
fn journal(db: &Db) -> &dyn Journal {
    dispatch!(&db.backend, d => d)
}

impl Db {
    /// Writes a note of `kind` (a short name of the writer's choosing) at the database's time.
    /// The journal's table is made the first time.
    pub async fn journal_write(&self, kind: &str, body: &serde_json::Value) -> Result<()> {
        journal(self).write(kind, body.to_string()).await
    }

    /// The newest notes of `kind` written within `within`, at most `most`, newest first. None
    /// when the journal does not exist yet.
    pub async fn journal_newest(
        &self,
        kind: &str,
        within: Duration,
        most: usize,
    ) -> Result<Vec<Note>> {
        journal(self).newest(kind, within, most).await
    }

    /// Removes notes of `kind` older than `older`, the oldest first, at most [`PRUNE_MOST`] in
    /// one call; returns how many.
    pub async fn journal_prune(&self, kind: &str, older: Duration) -> Result<u64> {
        journal(self).prune(kind, older, PRUNE_MOST).await
    }
}
