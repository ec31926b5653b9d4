//! The schedules' store, written once over a driver's [`Run`]: every statement is built by a
//! pure function over the database's [`Dialect`] (the snapshots beside this file show each),
//! and a database gives only how a tick in epoch milliseconds becomes the time type its
//! columns hold and back ([`Dialect::at_ms`], [`Dialect::epoch_ms`]): `timestamptz` on
//! PostgreSQL, a UTC `DATETIME(6)` by calendar arithmetic on MySQL (no session time zone is
//! involved), integer milliseconds on SQLite. Ticks are whole seconds, so each comes back
//! exactly and the compare-and-set compares exactly.

use crate::backend::run::{Col, Finish, Run, Transact};
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::error::Result;
use crate::queue::store::EnqueueOne;
use crate::queue::{Enqueued, NewJob};
use crate::value::Value;

/// A definition as the store binds it.
pub(crate) struct Definition<'a> {
    pub name: &'a str,
    pub queue: &'a str,
    pub kind: &'a str,
    pub expression: &'a str,
    pub zone: Option<&'a str>,
    pub catch_up: &'a str,
    pub fingerprint: &'a str,
}

/// A row of `rowclaim_schedules`, times in epoch milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stored {
    pub name: String,
    pub queue: String,
    pub kind: String,
    pub expression: String,
    pub zone: Option<String>,
    pub catch_up: String,
    pub fingerprint: String,
    pub next_tick: i64,
    pub last_tick: Option<i64>,
    pub last_job: Option<i64>,
}

/// One tick's advance of a schedule: from the next tick a scheduler read to the one after now,
/// with the jobs of the ticks it enqueues (oldest first, each with its tick).
pub(crate) struct Firing<'a> {
    pub name: &'a str,
    pub fingerprint: &'a str,
    pub seen_next: i64,
    pub next: i64,
    pub jobs: Vec<(i64, NewJob)>,
}

/// The schedule store role, the same on every database.
#[async_trait::async_trait]
pub(crate) trait Schedules: Send + Sync {
    /// The database's now, in epoch milliseconds.
    async fn schedule_now(&self) -> Result<i64>;
    /// Every stored schedule, by name.
    async fn schedule_rows(&self) -> Result<Vec<Stored>>;
    /// Stores a schedule unless one of its name is stored already.
    async fn insert_schedule(&self, def: &Definition<'_>, next_ms: i64) -> Result<()>;
    /// Replaces a stored schedule's definition, and its next tick when given.
    async fn redefine_schedule(&self, def: &Definition<'_>, next_ms: Option<i64>) -> Result<()>;
    /// In one transaction: advances the schedule from `seen_next` to `next` if it is still at
    /// `seen_next` with this fingerprint, and then enqueues the jobs. `None` when another
    /// scheduler advanced it first (nothing was enqueued).
    async fn fire(&self, f: &Firing<'_>) -> Result<Option<Vec<Enqueued>>>;
    /// Removes a stored schedule; returns whether there was one.
    async fn forget_schedule(&self, name: &str) -> Result<bool>;
}

/// Implements [`Schedules`] for a driver. (One impl for every `Transact` would be shorter, but
/// its futures could not be shown to be `Send`: `Run`'s are only known to be for a named
/// driver.)
macro_rules! schedules_for {
    ($driver:ty) => {
        #[async_trait::async_trait]
        impl Schedules for $driver {
            async fn schedule_now(&self) -> Result<i64> {
                self.count(now_stmt()).await
            }
            async fn schedule_rows(&self) -> Result<Vec<Stored>> {
                rows(self).await
            }
            async fn insert_schedule(&self, def: &Definition<'_>, next_ms: i64) -> Result<()> {
                self.execute(insert_stmt(def, next_ms)).await.map(drop)
            }
            async fn redefine_schedule(
                &self,
                def: &Definition<'_>,
                next_ms: Option<i64>,
            ) -> Result<()> {
                self.execute(redefine_stmt(def, next_ms)).await.map(drop)
            }
            async fn fire(&self, f: &Firing<'_>) -> Result<Option<Vec<Enqueued>>> {
                fire(self, f).await
            }
            async fn forget_schedule(&self, name: &str) -> Result<bool> {
                Ok(self.execute(forget_stmt(name)).await? > 0)
            }
        }
    };
}

#[cfg(feature = "postgres")]
schedules_for!(crate::backend::postgres::Pg);
#[cfg(feature = "mysql")]
schedules_for!(crate::backend::mysql::My);
#[cfg(feature = "sqlite")]
schedules_for!(crate::backend::sqlite::Lite);

/// In one transaction: the compare-and-set that advances the schedule, then the tick's jobs
/// and the last one's id. Of schedulers racing for a tick, the first update takes the row's
/// lock and matches (SQLite: the write lock, from the transaction's start); the others wait
/// for it, then read the row as committed (READ COMMITTED), find it moved on and match nothing.
/// (MySQL counts matched rows, not changed ones: sqlx connects with `CLIENT_FOUND_ROWS`.)
pub(super) async fn fire<R>(r: &R, f: &Firing<'_>) -> Result<Option<Vec<Enqueued>>>
where
    R: Transact,
    for<'t> R::Tx<'t>: EnqueueOne,
{
    let tx = r.transaction(true).await?;
    if tx.execute(advance_stmt(f)).await? != 1 {
        tx.rollback().await?;
        return Ok(None);
    }
    let mut out = Vec::with_capacity(f.jobs.len());
    for (_, job) in &f.jobs {
        out.push(tx.enqueue_one(&job.parts()).await?);
    }
    if let Some(e) = out.last() {
        tx.execute(last_job_stmt(f.name, e.id)).await?;
    }
    tx.commit_as(|| format!("the tick of schedule {}", f.name))
        .await?;
    Ok(Some(out))
}

/// The columns of [`Stored`], read by kind (the same code reads every database's rows).
const COLUMNS: [Col; 10] = [
    Col::Text,
    Col::Text,
    Col::Text,
    Col::Text,
    Col::OptText,
    Col::Text,
    Col::Text,
    Col::Int,
    Col::OptInt,
    Col::OptInt,
];

async fn rows<R: Run>(r: &R) -> Result<Vec<Stored>> {
    let rows = r.values(rows_stmt(), &COLUMNS).await?;
    Ok(rows.into_iter().map(stored).collect())
}

/// A row read by [`COLUMNS`], in their order.
fn stored(row: Vec<Value>) -> Stored {
    let mut v = row.into_iter();
    let mut text = || v.next().and_then(Value::text);
    let [name, queue, kind, expression, zone, catch_up, fingerprint] = [(); 7].map(|()| text());
    let mut int = || v.next().and_then(Value::int);
    Stored {
        name: name.unwrap_or_default(),
        queue: queue.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
        expression: expression.unwrap_or_default(),
        zone,
        catch_up: catch_up.unwrap_or_default(),
        fingerprint: fingerprint.unwrap_or_default(),
        next_tick: int().unwrap_or(0),
        last_tick: int(),
        last_job: int(),
    }
}

/// The database's now, in epoch milliseconds.
pub(super) fn now_stmt<D: Dialect>() -> Stmt<D> {
    Stmt::new(format!("SELECT {}", D::epoch_ms(D::NOW)), Binder::new())
}

/// Every stored schedule, by name, times in epoch milliseconds.
pub(super) fn rows_stmt<D: Dialect>() -> Stmt<D> {
    let text = |c: &str| format!("CAST({c} AS {})", D::TEXT);
    let columns = ["name", "queue", "kind", "expression", "zone", "catch_up"].map(text);
    let sql = format!(
        "SELECT {}, {}, {}, {}, last_job FROM rowclaim_schedules ORDER BY name",
        columns.join(", "),
        text("fingerprint"),
        D::epoch_ms("next_tick"),
        D::epoch_ms("last_tick"),
    );
    Stmt::new(sql, Binder::new())
}

/// Stores a schedule unless one of its name is stored already (which stays as it is).
pub(super) fn insert_stmt<D: Dialect>(d: &Definition<'_>, next_ms: i64) -> Stmt<D> {
    let mut b = Binder::new();
    let values = [
        b.bind(d.name.to_owned()),
        b.bind(d.queue.to_owned()),
        b.bind(d.kind.to_owned()),
        b.bind(d.expression.to_owned()),
        b.bind(d.zone.map(str::to_owned)),
        b.bind(d.catch_up.to_owned()),
        b.bind(d.fingerprint.to_owned()),
        D::at_ms(&b.bind(next_ms)),
        D::NOW.to_owned(),
    ];
    let sql = format!(
        "INSERT INTO rowclaim_schedules \
         (name, queue, kind, expression, zone, catch_up, fingerprint, next_tick, updated_at) \
         VALUES ({}) {}",
        values.join(", "),
        D::keep_existing("name")
    );
    Stmt::new(sql, b)
}

/// Replaces a stored schedule's definition, and its next tick when given.
pub(super) fn redefine_stmt<D: Dialect>(d: &Definition<'_>, next_ms: Option<i64>) -> Stmt<D> {
    let mut b = Binder::new();
    let set = [
        format!("queue = {}", b.bind(d.queue.to_owned())),
        format!("kind = {}", b.bind(d.kind.to_owned())),
        format!("expression = {}", b.bind(d.expression.to_owned())),
        format!("zone = {}", b.bind(d.zone.map(str::to_owned))),
        format!("catch_up = {}", b.bind(d.catch_up.to_owned())),
        format!("fingerprint = {}", b.bind(d.fingerprint.to_owned())),
        format!(
            "next_tick = COALESCE({}, next_tick)",
            D::at_ms(&b.bind(next_ms))
        ),
        format!("updated_at = {}", D::NOW),
    ];
    let sql = format!(
        "UPDATE rowclaim_schedules SET {} WHERE name = {}",
        set.join(", "),
        b.bind(d.name.to_owned())
    );
    Stmt::new(sql, b)
}

/// The compare-and-set of a tick: the schedule moves from the next tick the scheduler read to
/// the one after now, only if it is still there, under this definition.
pub(super) fn advance_stmt<D: Dialect>(f: &Firing<'_>) -> Stmt<D> {
    let mut b = Binder::new();
    let last = f.jobs.last().map(|(t, _)| *t);
    let next = D::at_ms(&b.bind(f.next));
    let last = D::at_ms(&b.bind(last));
    let sql = format!(
        "UPDATE rowclaim_schedules SET next_tick = {next}, \
         last_tick = COALESCE({last}, last_tick), updated_at = {} \
         WHERE name = {} AND next_tick = {} AND fingerprint = {}",
        D::NOW,
        b.bind(f.name.to_owned()),
        D::at_ms(&b.bind(f.seen_next)),
        b.bind(f.fingerprint.to_owned())
    );
    Stmt::new(sql, b)
}

/// Records the job of a schedule's latest tick.
pub(super) fn last_job_stmt<D: Dialect>(name: &str, job: i64) -> Stmt<D> {
    let mut b = Binder::new();
    let sql = format!(
        "UPDATE rowclaim_schedules SET last_job = {} WHERE name = {}",
        b.bind(job),
        b.bind(name.to_owned())
    );
    Stmt::new(sql, b)
}

/// Removes a stored schedule.
pub(super) fn forget_stmt<D: Dialect>(name: &str) -> Stmt<D> {
    let mut b = Binder::new();
    let sql = format!(
        "DELETE FROM rowclaim_schedules WHERE name = {}",
        b.bind(name.to_owned())
    );
    Stmt::new(sql, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_read_in_the_order_its_statement_selects() {
        let text = |s: &str| Value::Text(s.to_owned());
        let row = vec![
            text("nightly"),
            text("reports"),
            text("sales"),
            text("0 0 * * *"),
            Value::OptText(None),
            text("all"),
            text("0123456789abcdef"),
            Value::Int(1_767_225_600_000),
            Value::OptInt(None),
            Value::OptInt(Some(7)),
        ];
        assert_eq!(
            stored(row),
            Stored {
                name: "nightly".into(),
                queue: "reports".into(),
                kind: "sales".into(),
                expression: "0 0 * * *".into(),
                zone: None,
                catch_up: "all".into(),
                fingerprint: "0123456789abcdef".into(),
                next_tick: 1_767_225_600_000,
                last_tick: None,
                last_job: Some(7),
            }
        );
    }
}
