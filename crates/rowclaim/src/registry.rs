//! The source registry: one mapping per table, agreed by every claimer of it.
//!
//! Two claimers of one table that map it differently can take the same row: one that keeps its
//! claims in `rowclaim_leases` does not see a row another marked claimed in the table, and one
//! that reads another lease column re-claims a row whose real lease has not ended. So the first
//! claim on a table records in `rowclaim_sources` (in the same database) what exclusivity depends
//! on: the id, status, owner and lease columns, the ready and claimed values, and where claims are
//! kept. Every later claimer is checked against that record and refused, naming each difference,
//! when it disagrees; [`Db::record_source`] (`rowclaim source replace`) replaces the record once
//! no claimer uses the old mapping any more.
//!
//! What may differ between claimers of one table: the done and failed values, the attempts
//! column, the order and the `--where` condition (workers split a table by condition), and the
//! strategy within one place of keeping claims.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::backend::dispatch;
use crate::backend::run::Run;
use crate::backend::sql::{Binder, Dialect, Stmt};
use crate::db::Db;
use crate::error::{DbKind, Error, Result};
use crate::mapping::{Mapping, TableName};
use crate::source::Source;
use crate::strategy::Strategy;

/// The registry table's name.
pub(crate) const TABLE: &str = "rowclaim_sources";

/// Where a strategy keeps its claims, which every claimer of a table must share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ClaimsKept {
    /// In the table itself: the status (and owner and lease) columns, or row locks that every
    /// strategy of this kind waits for or skips. skip-locked, token, optimistic, transaction.
    InTable,
    /// In rowclaim's side table `rowclaim_leases`, which claimers of the other kind never read.
    /// lease-table.
    InLeaseTable,
}

impl ClaimsKept {
    /// Where `strategy` (resolved, not `auto`) keeps its claims.
    pub fn of(strategy: Strategy) -> ClaimsKept {
        match strategy {
            Strategy::LeaseTable => ClaimsKept::InLeaseTable,
            _ => ClaimsKept::InTable,
        }
    }
}

impl fmt::Display for ClaimsKept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimsKept::InTable => "in the table",
            ClaimsKept::InLeaseTable => "in rowclaim_leases",
        })
    }
}

/// The mapping of one table as the registry holds it: what every claimer of the table agrees on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RecordedSource {
    /// The table as the database's catalog names it (`public.emails`, `test.emails`, `emails`).
    pub table: String,
    /// The id column.
    pub id_column: String,
    /// The status column.
    pub status_column: String,
    /// The status value of rows ready to be claimed.
    pub ready: String,
    /// The status value of claimed rows.
    pub claimed: String,
    /// The owner column, if mapped.
    pub owner_column: Option<String>,
    /// The lease column, if mapped.
    pub lease_column: Option<String>,
    /// Where claims are kept.
    pub claims: ClaimsKept,
    /// The strategy of the claimer that recorded it (any strategy that keeps its claims in the
    /// same place agrees with it).
    pub strategy: Strategy,
    /// When it was recorded, by the database's clock (seconds since the Unix epoch). Kept in a
    /// column of its own, not in the stored JSON.
    #[serde(default)]
    pub recorded_at: i64,
}

impl RecordedSource {
    /// What `m` claimed with `strategy` would record (`recorded_at` is the database's to fill).
    pub(crate) fn of(m: &Mapping, strategy: Strategy) -> RecordedSource {
        RecordedSource {
            table: m.source_key.clone(),
            id_column: m.id_name.clone(),
            status_column: unquote(&m.status),
            ready: m.ready.to_string(),
            claimed: m.claimed.to_string(),
            owner_column: m.owner.as_deref().map(unquote),
            lease_column: m.lease.as_deref().map(unquote),
            claims: ClaimsKept::of(strategy),
            strategy,
            recorded_at: 0,
        }
    }

    /// A [`Source`] with this mapping, for looking at the table and giving held rows back
    /// ([`crate::Claimer::rows`], [`crate::Claimer::release_row`]) with a claimer made by
    /// [`Db::claimer`] with [`RecordedSource::strategy`]; making it records nothing. The done
    /// and failed values are not recorded: the source gets stand-ins that differ from the ready
    /// and claimed values, so set the real ones with [`Source::status_values`] before settling
    /// rows with it.
    pub fn source(&self) -> Source {
        let (done, failed) = stand_ins(&self.ready, &self.claimed);
        let mut s = Source::new(self.table.clone())
            .id_column(self.id_column.clone())
            .status_column(self.status_column.clone())
            .status_values(self.ready.clone(), self.claimed.clone(), done, failed);
        if let Some(c) = &self.owner_column {
            s = s.owner_column(c.clone());
        }
        if let Some(c) = &self.lease_column {
            s = s.lease_column(c.clone());
        }
        s
    }

    /// When it was recorded.
    pub fn recorded_time(&self) -> SystemTime {
        let secs = u64::try_from(self.recorded_at).unwrap_or(0);
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// How `self` (a claimer's mapping) differs from `recorded` in what exclusivity depends on,
    /// one line per difference, or none when they agree.
    pub(crate) fn differences(&self, recorded: &RecordedSource) -> Vec<String> {
        let mut out = Vec::new();
        let mut differ = |what: &str, here: Option<&str>, there: Option<&str>| {
            if here != there {
                let show =
                    |v: Option<&str>| v.map_or_else(|| "none".to_owned(), |v| format!("{v:?}"));
                out.push(format!(
                    "{what}: {} recorded, {} here",
                    show(there),
                    show(here)
                ));
            }
        };
        differ(
            "id column",
            Some(&self.id_column),
            Some(&recorded.id_column),
        );
        differ(
            "status column",
            Some(&self.status_column),
            Some(&recorded.status_column),
        );
        differ("ready value", Some(&self.ready), Some(&recorded.ready));
        differ(
            "claimed value",
            Some(&self.claimed),
            Some(&recorded.claimed),
        );
        differ(
            "owner column",
            self.owner_column.as_deref(),
            recorded.owner_column.as_deref(),
        );
        differ(
            "lease column",
            self.lease_column.as_deref(),
            recorded.lease_column.as_deref(),
        );
        if self.claims != recorded.claims {
            out.push(format!(
                "claims kept: {} recorded (strategy {}), {} here (strategy {})",
                recorded.claims, recorded.strategy, self.claims, self.strategy
            ));
        }
        out
    }
}

/// Done and failed values for a source made from a record, which keeps neither: integers when
/// the ready and claimed values are (so that an integer status column takes them), else short
/// texts (so that a narrow text column holds them); never one of the recorded two.
fn stand_ins(ready: &str, claimed: &str) -> (String, String) {
    let taken = |v: &String| v == ready || v == claimed;
    let ints = ready.parse::<i64>().is_ok() && claimed.parse::<i64>().is_ok();
    let candidates: Vec<String> = if ints {
        (1..=4).map(|n| (-n).to_string()).collect()
    } else {
        ["d", "f", "x", "y"].map(String::from).to_vec()
    };
    let mut free = candidates.into_iter().filter(|v| !taken(v));
    let done = free.next().unwrap_or_default();
    let failed = free.next().unwrap_or_default();
    (done, failed)
}

/// A quoted identifier (`"status"`, `` `status` ``) as the catalog spells it. Mapped names are
/// plain identifiers, so they hold no quote characters of their own.
fn unquote(quoted: &str) -> String {
    quoted.trim_matches(|c| c == '"' || c == '`').to_owned()
}

/// A record as the registry keeps it: the record as JSON (so that a later field needs no
/// migration), without its time, which the database's clock fills in a column of its own.
fn encode(r: &RecordedSource) -> Result<String> {
    let mut v = serde_json::to_value(r)
        .map_err(|e| Error::Internal(format!("a source record as JSON: {e}")))?;
    if let Some(fields) = v.as_object_mut() {
        fields.remove("recorded_at");
    }
    Ok(v.to_string())
}

/// A stored record and its time; `whose` names it when it cannot be read.
fn decode(text: Option<String>, recorded_at: i64, whose: &str) -> Result<RecordedSource> {
    let mut r: RecordedSource =
        serde_json::from_str(text.as_deref().unwrap_or("")).map_err(|e| {
            Error::InvalidInput(format!(
                "the record of {whose} in {TABLE} cannot be read ({e}); replace it with \
                 `rowclaim source replace` or remove it with `rowclaim source forget`"
            ))
        })?;
    r.recorded_at = recorded_at;
    Ok(r)
}

/// The registry role, written once for every database over its driver's [`Run`].
#[async_trait::async_trait]
trait Registry: Send + Sync {
    /// The record of `table` (its catalog key), if there is one.
    async fn lookup(&self, table: &str) -> Result<Option<RecordedSource>>;
    /// Records `record` unless its table has a record already; the record that holds now.
    async fn insert_absent(&self, record: &RecordedSource) -> Result<RecordedSource>;
    /// Removes the record of `table`; how many there were.
    async fn delete(&self, table: &str) -> Result<u64>;
    /// Every record, by table.
    async fn list(&self) -> Result<Vec<RecordedSource>>;
}

#[async_trait::async_trait]
impl<R: Run + Send + Sync> Registry for R {
    async fn lookup(&self, table: &str) -> Result<Option<RecordedSource>> {
        lookup(self, table).await
    }

    async fn insert_absent(&self, record: &RecordedSource) -> Result<RecordedSource> {
        insert_absent(self, record).await
    }

    async fn delete(&self, table: &str) -> Result<u64> {
        delete(self, table).await
    }

    async fn list(&self) -> Result<Vec<RecordedSource>> {
        list(self).await
    }
}

/// The registry role of `db`'s driver: the one door to it.
fn registry(db: &Db) -> &dyn Registry {
    dispatch!(&db.backend, d => d)
}

/// Records of the registry (`condition` binds what it needs), in table order; none when the
/// registry table does not exist yet.
async fn select<R: Run + ?Sized>(
    r: &R,
    b: Binder<R::Sql>,
    condition: &str,
    whose: &str,
) -> Result<Vec<RecordedSource>> {
    let sql = format!("SELECT mapping, recorded_at FROM {TABLE}{condition} ORDER BY source");
    match r.count_by(Stmt::new(sql, b)).await {
        Ok(rows) => rows
            .into_iter()
            .map(|(text, at)| decode(text, at, whose))
            .collect(),
        Err(e) if e.db_kind() == Some(DbKind::MissingTable) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The record of `table` (its catalog key), if there is one; `None` also when the registry table
/// does not exist yet.
async fn lookup<R: Run + ?Sized>(r: &R, table: &str) -> Result<Option<RecordedSource>> {
    let mut b = Binder::<R::Sql>::new();
    let key = b.bind(table.to_owned());
    let condition = format!(" WHERE source = {key}");
    Ok(select(r, b, &condition, table).await?.into_iter().next())
}

/// Records `record` unless `table` has a record already; returns the record that holds now.
async fn insert_absent<R: Run + ?Sized>(r: &R, record: &RecordedSource) -> Result<RecordedSource> {
    let mut b = Binder::<R::Sql>::new();
    let key = b.bind(record.table.clone());
    let mapping = b.bind(encode(record)?);
    let sql = format!(
        "INSERT INTO {TABLE} (source, mapping, recorded_at) VALUES ({key}, {mapping}, {}) {}",
        R::Sql::EPOCH_SECONDS,
        R::Sql::keep_existing("source"),
    );
    r.execute(Stmt::new(sql, b)).await?;
    lookup(r, &record.table).await?.ok_or_else(|| {
        Error::Internal(format!(
            "the record of {} vanished as it was written",
            record.table
        ))
    })
}

async fn delete<R: Run + ?Sized>(r: &R, table: &str) -> Result<u64> {
    let mut b = Binder::<R::Sql>::new();
    let key = b.bind(table.to_owned());
    let sql = format!("DELETE FROM {TABLE} WHERE source = {key}");
    match r.execute(Stmt::new(sql, b)).await {
        Err(e) if e.db_kind() == Some(DbKind::MissingTable) => Ok(0),
        other => other,
    }
}

async fn list<R: Run + ?Sized>(r: &R) -> Result<Vec<RecordedSource>> {
    select(r, Binder::new(), "", "a table").await
}

/// The strategy a claimer uses on a table with `recorded`: `auto` (`asked`) follows a record that
/// keeps claims in `rowclaim_leases`, even when owner and lease columns are mapped; otherwise
/// `chosen`, which the record may still refuse.
pub(crate) fn follow_record(
    chosen: Strategy,
    asked: Strategy,
    recorded: &RecordedSource,
) -> Strategy {
    if asked == Strategy::Auto && recorded.claims == ClaimsKept::InLeaseTable {
        Strategy::LeaseTable
    } else {
        chosen
    }
}

/// The error for a claimer that disagrees with the record.
fn disagreement(table_display: &str, recorded: &RecordedSource, differences: Vec<String>) -> Error {
    Error::MappingDisagrees {
        table: table_display.to_owned(),
        recorded_at: humantime::format_rfc3339_seconds(recorded.recorded_time()).to_string(),
        differences,
    }
}

/// `mine` against the record that holds: the record, or the claimer refused naming each
/// difference.
pub(crate) fn agree(
    table_display: &str,
    mine: &RecordedSource,
    holds: RecordedSource,
) -> Result<RecordedSource> {
    let differences = mine.differences(&holds);
    if differences.is_empty() {
        Ok(holds)
    } else {
        Err(disagreement(table_display, &holds, differences))
    }
}

impl Db {
    /// Refuses a claimer whose mapping disagrees with the table's record; a table without a
    /// record (or a database without the registry) passes. `auto` (`asked`) follows the record
    /// where the mapping allows: on a table whose claims are kept in `rowclaim_leases` it picks
    /// lease-table even when owner and lease columns are mapped. Returns the strategy to use, and
    /// whether the table has a record (that agrees): then the claimer's first claim need not
    /// record. Writes nothing.
    pub(crate) async fn check_recorded(
        &self,
        m: &Mapping,
        chosen: Strategy,
        asked: Strategy,
    ) -> Result<(Strategy, bool)> {
        let Some(recorded) = self.record_of(m).await? else {
            return Ok((chosen, false));
        };
        let chosen = follow_record(chosen, asked, &recorded);
        agree(&m.table_display, &RecordedSource::of(m, chosen), recorded)?;
        Ok((chosen, true))
    }

    /// The record of `m`'s table, if it has one. Writes nothing.
    pub(crate) async fn record_of(&self, m: &Mapping) -> Result<Option<RecordedSource>> {
        registry(self).lookup(&m.source_key).await
    }

    /// Records the mapping of a table's first claimer, or checks a later one against the record
    /// (which another claimer may have written since this one was checked).
    pub(crate) async fn record(&self, m: &Mapping, strategy: Strategy) -> Result<()> {
        let mine = RecordedSource::of(m, strategy);
        let holds = self.insert_absent(&mine).await?;
        agree(&m.table_display, &mine, holds).map(drop)
    }

    /// Records `mine` unless its table has a record, and returns the record that holds. The
    /// registry table is made the first time, when the insert finds it missing (as counters
    /// are): a claim on a database that has it costs no look at the catalog.
    async fn insert_absent(&self, mine: &RecordedSource) -> Result<RecordedSource> {
        let insert = || registry(self).insert_absent(mine);
        match crate::backend::retry_transient!(insert().await) {
            Err(e) if e.db_kind() == Some(DbKind::MissingTable) => {
                crate::backend::retry_transient!(self.backend.catalog().ensure_registry().await)?;
                self.announce_created(
                    TABLE,
                    "which records the mapping every claimer of a table must agree on",
                );
                crate::backend::retry_transient!(insert().await)
            }
            other => other,
        }
    }

    /// Says once that rowclaim created one of its own tables in the user's database: once per
    /// table and database in this process, however many claimers (a bench's workers, say) met
    /// it missing at the same time.
    pub(crate) fn announce_created(&self, table: &str, why: &str) {
        static SAID: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
        let key = (self.endpoint().to_owned(), table.to_owned());
        // A poisoned lock only held this list: say it again rather than not at all.
        let first = SAID
            .lock()
            .map(|mut said| {
                let new = !said.contains(&key);
                if new {
                    said.push(key);
                }
                new
            })
            .unwrap_or(true);
        if first {
            tracing::warn!(
                "rowclaim created table {table} in the database ({}), {why}",
                self.endpoint()
            );
        }
    }

    /// The mapping recorded for `table`, if any (see the [module docs](crate::registry)).
    pub async fn recorded_source(&self, table: &str) -> Result<Option<RecordedSource>> {
        let name = TableName::parse(table)?;
        let key = self.backend.catalog().table_key(&name).await?;
        registry(self).lookup(&key).await
    }

    /// Every recorded mapping, by table.
    pub async fn recorded_sources(&self) -> Result<Vec<RecordedSource>> {
        registry(self).list().await
    }

    /// Replaces the record of `source`'s table with `source` claimed by `strategy` (`auto`
    /// resolves as a claimer would), and returns the new record. For when every claimer of the
    /// table has moved to a new mapping: a claimer still running with the old one is refused at
    /// its next start, not stopped.
    pub async fn record_source(
        &self,
        source: Source,
        strategy: Strategy,
    ) -> Result<RecordedSource> {
        let (m, chosen, _) = self.checked_mapping(&source, strategy, None).await?;
        registry(self).delete(&m.source_key).await?;
        let mine = RecordedSource::of(&m, chosen);
        let holds = self.insert_absent(&mine).await?;
        agree(&m.table_display, &mine, holds)
    }

    /// Removes the record of `table`; the next claim records its mapping anew. Returns whether
    /// there was one.
    pub async fn forget_source(&self, table: &str) -> Result<bool> {
        let name = TableName::parse(table)?;
        let key = self.backend.catalog().table_key(&name).await?;
        Ok(registry(self).delete(&key).await? > 0)
    }
}
