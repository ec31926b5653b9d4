//! One module per database, each holding all of that database's SQL, behind the small [`Driver`]
//! trait. Everything above this layer is database-agnostic.
//!
//! A new database (SQL Server's `UPDATE TOP (n) … WITH (ROWLOCK, UPDLOCK, READPAST)` would be the
//! next) is a new module implementing [`Driver`] plus a [`Backend`] variant; the contract suite in
//! `tests/` then proves it.

use std::time::Duration;

use crate::queue::{Admin, Enqueued, NewJob, QueueStats};
use crate::source::status_literal;
use crate::source::{Mapping, TableName};
use crate::value::IdList;
use crate::{LockMode, LockWait, Result, Stats, Strategy};

pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod sqlite;

/// The SQL dialect, for quoting identifiers and for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

impl Dialect {
    /// Quotes an identifier that was validated as plain (so it holds no quote characters).
    pub(crate) fn quote(self, ident: &str) -> String {
        match self {
            Dialect::MySql => format!("`{ident}`"),
            Dialect::Postgres | Dialect::Sqlite => format!("\"{ident}\""),
        }
    }

    pub(crate) fn lease_type(self) -> &'static str {
        match self {
            Dialect::Postgres => "timestamptz",
            Dialect::MySql => "DATETIME(6) (holding UTC)",
            Dialect::Sqlite => "INTEGER (unix epoch milliseconds)",
        }
    }
}

/// What a column can be used for, from its declared type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ColType {
    Int,
    Text {
        max_len: Option<u32>,
    },
    /// A point in time the dialect's lease arithmetic works with (PostgreSQL `timestamptz`,
    /// MySQL `DATETIME`/`TIMESTAMP`).
    Timestamp,
    Other,
}

#[derive(Clone, Debug)]
pub(crate) struct Column {
    pub name: String,
    pub sql_type: String,
    pub ty: ColType,
}

/// The server behind a connection and what it can do.
#[derive(Clone, Debug)]
pub struct ServerInfo {
    /// `PostgreSQL 15.4`, `MariaDB 10.11.6`, `MySQL 8.0.36`, `SQLite 3.46.0`.
    pub description: String,
    pub(crate) kind: ServerKind,
    pub(crate) version: (u32, u32, u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServerKind {
    Postgres,
    MySql,
    MariaDb,
    Sqlite,
}

impl ServerInfo {
    pub(crate) fn new(kind: ServerKind, version_text: &str) -> ServerInfo {
        // "15.4 (Debian 15.4-1)", "10.11.6-MariaDB-0+deb12u1", "8.0.36": the first word counts.
        let first = version_text.split_whitespace().next().unwrap_or_default();
        let mut nums = first
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap_or(0));
        let version = (
            nums.next().unwrap_or(0),
            nums.next().unwrap_or(0),
            nums.next().unwrap_or(0),
        );
        let name = match kind {
            ServerKind::Postgres => "PostgreSQL",
            ServerKind::MySql => "MySQL",
            ServerKind::MariaDb => "MariaDB",
            ServerKind::Sqlite => "SQLite",
        };
        let v = version;
        ServerInfo {
            description: format!("{name} {}.{}.{}", v.0, v.1, v.2),
            kind,
            version,
        }
    }

    /// Whether `SKIP LOCKED` exists here; the error says which version would have it.
    pub(crate) fn skip_locked(&self) -> std::result::Result<(), String> {
        let need = match self.kind {
            ServerKind::Postgres => (9, 5, 0),
            ServerKind::MySql => (8, 0, 1),
            ServerKind::MariaDb => (10, 6, 0),
            ServerKind::Sqlite => {
                return Err("SQLite has no SKIP LOCKED (it has one writer at a time)".into())
            }
        };
        if self.version >= need {
            Ok(())
        } else {
            Err(format!(
                "SKIP LOCKED needs {} {}.{}.{} or later, and the server is {}",
                self.description.split(' ').next().unwrap_or_default(),
                need.0,
                need.1,
                need.2,
                self.description
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_skip_locked() {
        let pg = ServerInfo::new(ServerKind::Postgres, "15.20 (Debian 15.20-0+deb12u1)");
        assert_eq!(pg.description, "PostgreSQL 15.20.0");
        assert!(pg.skip_locked().is_ok());
        let old = ServerInfo::new(ServerKind::MariaDb, "10.5.23-MariaDB-0+deb11u1");
        let why = old.skip_locked().unwrap_err();
        assert!(why.contains("MariaDB 10.6.0 or later"), "{why}");
        assert!(why.contains("10.5.23"), "{why}");
        assert!(ServerInfo::new(ServerKind::MariaDb, "10.11.6-MariaDB")
            .skip_locked()
            .is_ok());
        assert!(ServerInfo::new(ServerKind::MySql, "8.0.0")
            .skip_locked()
            .is_err());
        assert!(ServerInfo::new(ServerKind::MySql, "8.0.36")
            .skip_locked()
            .is_ok());
        assert!(ServerInfo::new(ServerKind::Sqlite, "3.51.3")
            .skip_locked()
            .is_err());
    }
}

/// A claim's request to a driver.
pub(crate) struct ClaimArgs<'a> {
    pub m: &'a Mapping,
    pub strategy: Strategy,
    pub batch: u32,
    pub lease: Duration,
    pub token: &'a str,
    /// Also look for rows whose lease expired (the claimer does now and then, not every time).
    pub expired: bool,
    /// Managed queue: resume the walk of ready rows after this place in the queue's order
    /// (drivers that cannot ignore it and return no position).
    pub after: Option<Position>,
}

/// A place in the managed queue's claim order (priority descending, then run-at, then id): where
/// a claim ended. The next claim resumes after it instead of walking again, from the start of
/// the ready index, past the entries of every job claimed since the last vacuum; PostgreSQL
/// keeps those entries until vacuum removes them (for as long as any snapshot may still see the
/// rows), and every claim from the start would step over all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Position {
    pub priority: i64,
    /// Microseconds since the Unix epoch: exact, unlike a float of seconds.
    pub run_at_us: i64,
    pub id: i64,
}

impl Position {
    /// Later in the claim order sorts greater.
    fn key(&self) -> (std::cmp::Reverse<i64>, i64, i64) {
        (std::cmp::Reverse(self.priority), self.run_at_us, self.id)
    }

    /// The later of two places in the claim order.
    pub(crate) fn later(self, other: Position) -> Position {
        if other.key() > self.key() {
            other
        } else {
            self
        }
    }
}

/// What a driver's claim returns.
pub(crate) struct Claimed {
    /// Each claimed row as a JSON object of its columns.
    pub rows: Vec<serde_json::Value>,
    /// For the transaction strategy: the open transaction holding the rows' locks.
    pub held: Option<Held>,
    /// Whether candidates were seen but all were taken by others first (optimistic, lease-table):
    /// the caller tries again instead of reporting "nothing to claim".
    pub lost_race: bool,
    /// Where in the managed queue's order this claim ended, when the driver resumes claims.
    pub position: Option<Position>,
}

/// The state a settled row moves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done,
    /// Failed for good (the managed queue's `dead`), with the error if there is a column for it.
    Failed(Option<String>),
    /// Given back, ready at once.
    Ready,
    /// Given back, ready again after a delay (needs a run-at column), keeping the error.
    Retry {
        after: Duration,
        error: Option<String>,
    },
}

impl Outcome {
    /// Whether settling this way deletes the row instead of changing its status: a completed job
    /// of a managed queue that keeps no completed jobs.
    pub(crate) fn deletes(&self, m: &Mapping) -> bool {
        *self == Outcome::Done && m.delete_done
    }

    pub(crate) fn status<'m>(&self, m: &'m Mapping) -> &'m crate::RowId {
        match self {
            Outcome::Done => &m.done,
            Outcome::Failed(_) => &m.failed,
            Outcome::Ready | Outcome::Retry { .. } => &m.ready,
        }
    }
}

/// Rows a claim may take: ready (and due, for a scheduled source), or claimed with an expired
/// lease; within the managed queue's queues. `now` is the dialect's clock expression. This is the
/// recheck a statement applies to rows it already named; to *find* rows use [`candidates`] (or the
/// two arms), because one OR across both kinds can use neither kind's index.
pub(crate) fn claimable<DB: sqlx::Database>(m: &Mapping, b: &mut Binder<DB>, now: &str) -> String
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let ready = ready_cond(m, now);
    let mut cond = match expired_cond(m, now) {
        Some(expired) => format!("(({ready}) OR ({expired}))"),
        None => format!("({ready})"),
    };
    cond.push_str(&queue_condition(m, b));
    cond
}

/// Ready, and due for a scheduled source. (Status values are literals: nothing to bind.)
fn ready_cond(m: &Mapping, now: &str) -> String {
    let mut cond = format!("{} = {}", m.status, status_literal(&m.ready));
    if let Some(r) = &m.run_at {
        cond.push_str(&format!(" AND {r} <= {now}"));
    }
    cond
}

/// Claimed with an expired lease; None without a lease column.
fn expired_cond(m: &Mapping, now: &str) -> Option<String> {
    let le = m.lease.as_ref()?;
    Some(format!(
        "{} = {} AND {le} < {now}",
        m.status,
        status_literal(&m.claimed)
    ))
}

/// The first arm of a claim: ready rows (and due, for a scheduled source) within the managed
/// queue's queues. An equality on status, so a partial index over ready rows (or one on
/// `(status, …)`) serves it in the source's order, however many finished rows the table keeps.
pub(crate) fn ready_arm<DB: sqlx::Database>(m: &Mapping, b: &mut Binder<DB>, now: &str) -> String
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    ready_cond(m, now) + &queue_condition(m, b)
}

/// The second arm: claimed rows whose lease has expired (None without a lease column). Few rows
/// are claimed at any time, so an index over claimed rows keeps this cheap.
pub(crate) fn expired_arm<DB: sqlx::Database>(
    m: &Mapping,
    b: &mut Binder<DB>,
    now: &str,
) -> Option<String>
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    Some(expired_cond(m, now)? + &queue_condition(m, b))
}

/// A query for up to `limit` rows a claim may take, without locking them: rows with an expired
/// lease first, then ready rows in the source's order. Each arm is its own sub-select so each
/// walks its own index. `select` is the column list of each arm (alias anything cast, so that
/// ORDER BY still means the column).
pub(crate) fn candidates<DB: sqlx::Database>(
    m: &Mapping,
    b: &mut Binder<DB>,
    now: &str,
    select: &str,
    limit: i64,
    expired: bool,
) -> String
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let (t, order, filter) = (&m.table, &m.order_by, &m.filter);
    let arm = |b: &mut Binder<DB>, cond: String| {
        format!(
            "SELECT {select} FROM {t} WHERE {cond}{filter} ORDER BY {order} LIMIT {}",
            b.bind(limit)
        )
    };
    match expired.then(|| expired_arm(m, b, now)).flatten() {
        None => {
            let ready = ready_arm(m, b, now);
            arm(b, ready)
        }
        Some(expired) => {
            let e = arm(b, expired);
            let ready = ready_arm(m, b, now);
            let r = arm(b, ready);
            format!(
                "SELECT * FROM ({e}) AS rowclaim_e UNION ALL SELECT * FROM ({r}) AS rowclaim_r \
                 LIMIT {}",
                b.bind(limit)
            )
        }
    }
}

/// The SET list that marks rows claimed by `token`: status, owner, lease end (`later` is the
/// dialect's "now + lease"), one more attempt.
pub(crate) fn claim_set<DB: sqlx::Database>(
    m: &Mapping,
    b: &mut Binder<DB>,
    token: &str,
    lease: Duration,
    later: fn(&mut Binder<DB>, Duration) -> String,
) -> String
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let mut set = vec![format!("{} = {}", m.status, status_literal(&m.claimed))];
    if let Some(ow) = &m.owner {
        set.push(format!("{ow} = {}", b.bind(token.to_owned())));
    }
    if let Some(le) = &m.lease {
        set.push(format!("{le} = {}", later(b, lease)));
    }
    if let Some(at) = &m.attempts {
        set.push(format!("{at} = COALESCE({at}, 0) + 1"));
    }
    set.join(", ")
}

/// The fencing condition "`token` holds this row" for strategies that mark rows in the table:
/// claimed, by this owner, and (for [`Target::Ids`]) one of the named rows, written by the
/// dialect's `id_in(binder, column, ids)`. Without an owner column only named rows can be meant.
///
/// With named rows the status test is written `(status = claimed) IS TRUE`: the same test, but
/// one a planner cannot match to a partial index over claimed rows (the managed queue's lease
/// index), so the rows are found through their key. Otherwise PostgreSQL, when statistics say
/// few rows are claimed, walks that index instead, and until vacuum it also holds an entry for
/// every row claimed since; with a transaction open elsewhere for minutes, hundreds of
/// thousands, each looked up in the table.
pub(crate) fn held_by<DB: sqlx::Database>(
    m: &Mapping,
    b: &mut Binder<DB>,
    token: &str,
    target: &Target<'_>,
    id_in: fn(&mut Binder<DB>, &str, &IdList) -> String,
) -> Result<String>
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let claimed = format!("{} = {}", m.status, status_literal(&m.claimed));
    let mut cond = match target {
        Target::Ids(..) => format!("({claimed}) IS TRUE"),
        Target::All => claimed,
    };
    match &m.owner {
        Some(ow) => cond.push_str(&format!(" AND {ow} = {}", b.bind(token.to_owned()))),
        None if matches!(target, Target::All) => return Err(no_owner(m)),
        None => {}
    }
    if let Target::Ids(list, _) = target {
        cond.push_str(&format!(" AND {}", id_in(b, &m.id, list)));
    }
    Ok(cond)
}

/// The statement that changes the rows `cond` picks: `UPDATE … SET set`, or `DELETE` when there
/// is no `set` (a settle whose outcome deletes, see [`Outcome::deletes`]).
pub(crate) fn change_sql(m: &Mapping, set: Option<&str>, cond: &str) -> String {
    match set {
        Some(set) => format!("UPDATE {} SET {set} WHERE {cond}", m.table),
        None => format!("DELETE FROM {} WHERE {cond}", m.table),
    }
}

/// The SET list that settles rows. A row given back loses its owner and lease; a retried row
/// runs again `after` from now; errors and finishing times go where the mapping has columns.
/// `now` and `later` are the dialect's clock expressions.
pub(crate) fn outcome_set<DB: sqlx::Database>(
    m: &Mapping,
    b: &mut Binder<DB>,
    outcome: &Outcome,
    now: &str,
    later: fn(&mut Binder<DB>, Duration) -> String,
) -> String
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let mut set = vec![format!(
        "{} = {}",
        m.status,
        status_literal(outcome.status(m))
    )];
    if matches!(outcome, Outcome::Ready | Outcome::Retry { .. }) {
        set.extend(m.owner.iter().map(|ow| format!("{ow} = NULL")));
        set.extend(m.lease.iter().map(|le| format!("{le} = NULL")));
    }
    if let (Outcome::Retry { after, .. }, Some(run_at)) = (outcome, &m.run_at) {
        set.push(format!("{run_at} = {}", later(b, *after)));
    }
    if let (Outcome::Failed(Some(e)) | Outcome::Retry { error: Some(e), .. }, Some(col)) =
        (outcome, &m.error_column)
    {
        set.push(format!("{col} = {}", b.bind(e.clone())));
    }
    if let (Outcome::Done | Outcome::Failed(_), Some(col)) = (outcome, &m.finished_column) {
        set.push(format!("{col} = {now}"));
    }
    set.join(", ")
}

/// The two counts of [`Driver::backlog`]: ready rows that are due or await a retry (a row
/// scheduled for later that never ran is not work yet), and claimed rows; both within the
/// source's queues and filter.
pub(crate) fn backlog_sql<DB: sqlx::Database>(
    m: &Mapping,
    claimed: bool,
    b: &mut Binder<DB>,
    now: &str,
) -> String
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let cond = if claimed {
        format!("{} = {}", m.status, status_literal(&m.claimed))
    } else {
        let due = match (&m.run_at, &m.attempts) {
            (Some(r), Some(a)) => format!(" AND ({r} <= {now} OR {a} > 0)"),
            (Some(r), None) => format!(" AND {r} <= {now}"),
            _ => String::new(),
        };
        format!("{} = {}{due}", m.status, status_literal(&m.ready))
    };
    let queues = queue_condition(m, b);
    format!(
        "SELECT COUNT(*) FROM {} WHERE {cond}{queues}{}",
        m.table, m.filter
    )
}

/// The three queries of [`Driver::stats`], each with its bound values: rows per status, claimed
/// rows per owner (token), expired leases (none without a lease column or lease table). `now` is
/// the dialect's clock, `text` its name for a text type in `CAST(… AS text)`.
pub(crate) struct StatsQueries<DB: sqlx::Database> {
    pub by_status: (String, Binder<DB>),
    pub by_owner: (String, Binder<DB>),
    pub expired: Option<(String, Binder<DB>)>,
}

pub(crate) fn stats_queries<DB: sqlx::Database>(
    m: &Mapping,
    strategy: Strategy,
    now: &str,
    text: &str,
) -> StatsQueries<DB>
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let (t, st, filter) = (&m.table, &m.status, &m.filter);
    let by_status = (
        format!("SELECT CAST({st} AS {text}), COUNT(*) FROM {t} WHERE 1 = 1{filter} GROUP BY 1"),
        Binder::new(),
    );
    let mut b = Binder::new();
    let owners = if strategy == Strategy::LeaseTable {
        let s = b.bind(m.source_key.clone());
        format!(
            "SELECT CAST(token AS {text}), COUNT(*) FROM rowclaim_leases \
             WHERE source = {s} AND lease_until >= {now} GROUP BY 1"
        )
    } else {
        let owner = m.owner.as_deref().unwrap_or("NULL");
        let c = status_literal(&m.claimed);
        format!(
            "SELECT CAST({owner} AS {text}), COUNT(*) FROM {t} WHERE {st} = {c}{filter} GROUP BY 1"
        )
    };
    let by_owner = (owners, b);
    let mut b = Binder::new();
    let expired = if strategy == Strategy::LeaseTable {
        let s = b.bind(m.source_key.clone());
        Some(format!(
            "SELECT COUNT(*) FROM rowclaim_leases WHERE source = {s} AND lease_until < {now}"
        ))
    } else {
        m.lease.as_ref().map(|le| {
            let c = status_literal(&m.claimed);
            format!("SELECT COUNT(*) FROM {t} WHERE {st} = {c} AND {le} < {now}{filter}")
        })
    };
    StatsQueries {
        by_status,
        by_owner,
        expired: expired.map(|sql| (sql, b)),
    }
}

/// Puts the answers of [`stats_queries`] together.
pub(crate) fn stats_from(
    by_status: Vec<(Option<String>, i64)>,
    by_owner: Vec<(Option<String>, i64)>,
    expired: i64,
) -> Stats {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Stats {
        by_status: by_status
            .into_iter()
            .map(|(s, n)| (s.unwrap_or_else(|| "(null)".into()), count(n)))
            .collect(),
        claimed_by_owner: by_owner
            .into_iter()
            .map(|(o, n)| (o.unwrap_or_else(|| "(no owner)".into()), count(n)))
            .collect(),
        expired_leases: count(expired),
    }
}

/// The SQL of [`Driver::list_rows`], with the dialect's row-to-JSON expression over alias `t`.
pub(crate) fn list_sql<DB: sqlx::Database>(
    m: &Mapping,
    b: &mut Binder<DB>,
    json: &str,
    id: Option<i64>,
    status: Option<&str>,
    limit: u32,
) -> String
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    let mut cond = String::from("1 = 1");
    if let Some(id) = id {
        cond.push_str(&format!(" AND t.{} = {}", m.id, b.bind(id)));
    }
    if let Some(st) = status {
        cond.push_str(&format!(" AND t.{} = {}", m.status, b.bind(st.to_owned())));
    }
    let queues = queue_condition(m, b);
    let limit = b.bind(i64::from(limit));
    format!(
        "SELECT {json} FROM {} AS t WHERE {cond}{queues} ORDER BY t.{} DESC LIMIT {limit}",
        m.table, m.id
    )
}

/// For the managed queue: ` AND queue IN (…)` with the queue names bound; empty otherwise.
pub(crate) fn queue_condition<DB: sqlx::Database>(m: &Mapping, b: &mut Binder<DB>) -> String
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    match &m.queues {
        Some((col, names)) if !names.is_empty() => {
            let list: Vec<String> = names.iter().map(|n| b.bind(n.clone())).collect();
            format!(" AND {col} IN ({})", list.join(", "))
        }
        _ => String::new(),
    }
}

/// Which rows of a token an operation applies to.
pub(crate) enum Target<'a> {
    /// All rows the token holds.
    All,
    /// These rows; all or nothing.
    Ids(&'a IdList, usize),
}

/// An open transaction held by a claim of the transaction strategy, or by locked rows.
pub(crate) enum Held {
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
    /// SQLite cannot time a lease out on its own, so the deadline (database clock, ms) is checked
    /// before each write.
    Sqlite {
        tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        deadline_ms: i64,
    },
}

impl Held {
    pub(crate) async fn commit(self) -> Result<()> {
        match self {
            Held::Postgres(tx) => tx.commit().await?,
            Held::MySql(tx) => tx.commit().await?,
            Held::Sqlite { tx, .. } => tx.commit().await?,
        }
        Ok(())
    }

    pub(crate) async fn rollback(self) -> Result<()> {
        match self {
            Held::Postgres(tx) => tx.rollback().await?,
            Held::MySql(tx) => tx.rollback().await?,
            Held::Sqlite { tx, .. } => tx.rollback().await?,
        }
        Ok(())
    }
}

/// What each database implements. All SQL of a database lives in its module.
pub(crate) trait Driver {
    /// The server and its version.
    async fn server(&self) -> Result<ServerInfo>;
    /// The table's columns; empty when the table does not exist.
    async fn columns(&self, table: &TableName) -> Result<Vec<Column>>;
    /// The table's name as the catalog resolves it (`schema.table`), so that every spelling of one
    /// table (`jobs`, `public.jobs`, `JOBS`) keys the same leases.
    async fn table_key(&self, table: &TableName) -> Result<String>;
    /// Creates `rowclaim_leases` if it is missing (lease-table strategy).
    async fn ensure_lease_table(&self) -> Result<()>;
    /// Takes up to `batch` rows.
    async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed>;
    /// Moves rows a token holds to `outcome`; returns how many changed. With [`Target::Ids`] it
    /// changes all of them or none.
    async fn settle(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        outcome: Outcome,
    ) -> Result<u64>;
    /// Moves each of the named rows that `token` still holds to `outcome`, on its own rather
    /// than all or nothing, in one statement; returns the rows it moved. `None` when the dialect
    /// or strategy cannot tell which in one statement: the caller then settles all or nothing
    /// and narrows down.
    async fn settle_each(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<crate::RowId>>>;
    /// Pushes the lease of rows a token holds to now + `lease`; returns how many it pushed.
    async fn extend(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        target: Target<'_>,
        lease: Duration,
    ) -> Result<u64>;
    /// Which of `ids` the token still holds (for naming the lost ones in `LeaseLost`).
    async fn still_held(
        &self,
        m: &Mapping,
        strategy: Strategy,
        token: &str,
        ids: &IdList,
    ) -> Result<Vec<crate::RowId>>;
    /// Within a held transaction: moves `ids` to `outcome` (not yet committed).
    async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<()>;
    /// Within a held transaction: pushes its lease (idle timeout or deadline) to now + `lease`.
    async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()>;
    /// Opens a transaction and takes row locks (seed 001's locking reads).
    async fn lock_rows(
        &self,
        m: &Mapping,
        ids: Option<&IdList>,
        limit: Option<u32>,
        mode: LockMode,
        wait: LockWait,
    ) -> Result<(Held, Vec<serde_json::Value>)>;
    /// Increments a named counter atomically and returns its new value (1 the first time).
    async fn counter_next(&self, name: &str) -> Result<i64>;
    /// Counts by status, claims by owner, expired leases.
    async fn stats(&self, m: &Mapping, strategy: Strategy) -> Result<Stats>;

    /// Rows that still need a worker: (ready and due or awaiting a retry, claimed).
    async fn backlog(&self, m: &Mapping) -> Result<(u64, u64)>;
    /// Rows of the source, newest id first: one by id, or up to `limit` with a given status.
    async fn list_rows(
        &self,
        m: &Mapping,
        id: Option<i64>,
        status: Option<&str>,
        limit: u32,
    ) -> Result<Vec<serde_json::Value>>;
    /// Creates or migrates the managed queue's tables (versioned; concurrent runs take turns).
    async fn queue_init(&self) -> Result<()>;
    /// Enqueues jobs in one transaction, all or none.
    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>>;
    /// Cancels, retries or prunes jobs; returns how many changed.
    async fn queue_admin(&self, op: Admin) -> Result<u64>;
    /// Jobs per queue and status, oldest due ready job, recent throughput.
    async fn queue_stats(&self, queue: Option<&str>) -> Result<QueueStats>;
}

/// One of the three databases.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    Postgres(postgres::Pg),
    MySql(mysql::My),
    Sqlite(sqlite::Lite),
}

/// Calls the same method on whichever driver this is.
macro_rules! dispatch {
    ($self:expr, $d:ident => $call:expr) => {
        match $self {
            Backend::Postgres($d) => $call,
            Backend::MySql($d) => $call,
            Backend::Sqlite($d) => $call,
        }
    };
}

impl Backend {
    /// The PostgreSQL pool, for LISTEN.
    pub(crate) fn postgres_pool(&self) -> Option<&sqlx::PgPool> {
        match self {
            Backend::Postgres(pg) => Some(pg.pool()),
            _ => None,
        }
    }

    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            Backend::Postgres(_) => Dialect::Postgres,
            Backend::MySql(_) => Dialect::MySql,
            Backend::Sqlite(_) => Dialect::Sqlite,
        }
    }

    pub(crate) async fn server(&self) -> Result<ServerInfo> {
        dispatch!(self, d => d.server().await)
    }
    pub(crate) async fn columns(&self, t: &TableName) -> Result<Vec<Column>> {
        dispatch!(self, d => d.columns(t).await)
    }
    pub(crate) async fn table_key(&self, t: &TableName) -> Result<String> {
        dispatch!(self, d => d.table_key(t).await)
    }
    pub(crate) async fn ensure_lease_table(&self) -> Result<()> {
        dispatch!(self, d => d.ensure_lease_table().await)
    }
    pub(crate) async fn claim(&self, a: &ClaimArgs<'_>) -> Result<Claimed> {
        dispatch!(self, d => d.claim(a).await)
    }
    pub(crate) async fn settle(
        &self,
        m: &Mapping,
        s: Strategy,
        token: &str,
        target: Target<'_>,
        outcome: Outcome,
    ) -> Result<u64> {
        dispatch!(self, d => d.settle(m, s, token, target, outcome).await)
    }
    pub(crate) async fn settle_each(
        &self,
        m: &Mapping,
        s: Strategy,
        token: &str,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<Option<Vec<crate::RowId>>> {
        dispatch!(self, d => d.settle_each(m, s, token, ids, outcome).await)
    }
    pub(crate) async fn extend(
        &self,
        m: &Mapping,
        s: Strategy,
        token: &str,
        target: Target<'_>,
        lease: Duration,
    ) -> Result<u64> {
        dispatch!(self, d => d.extend(m, s, token, target, lease).await)
    }
    pub(crate) async fn still_held(
        &self,
        m: &Mapping,
        s: Strategy,
        token: &str,
        ids: &IdList,
    ) -> Result<Vec<crate::RowId>> {
        dispatch!(self, d => d.still_held(m, s, token, ids).await)
    }
    pub(crate) async fn held_settle(
        &self,
        held: &mut Held,
        m: &Mapping,
        ids: &IdList,
        outcome: Outcome,
    ) -> Result<()> {
        dispatch!(self, d => d.held_settle(held, m, ids, outcome).await)
    }
    pub(crate) async fn held_extend(&self, held: &mut Held, lease: Duration) -> Result<()> {
        dispatch!(self, d => d.held_extend(held, lease).await)
    }
    pub(crate) async fn lock_rows(
        &self,
        m: &Mapping,
        ids: Option<&IdList>,
        limit: Option<u32>,
        mode: LockMode,
        wait: LockWait,
    ) -> Result<(Held, Vec<serde_json::Value>)> {
        dispatch!(self, d => d.lock_rows(m, ids, limit, mode, wait).await)
    }
    pub(crate) async fn counter_next(&self, name: &str) -> Result<i64> {
        dispatch!(self, d => d.counter_next(name).await)
    }
    pub(crate) async fn stats(&self, m: &Mapping, s: Strategy) -> Result<Stats> {
        dispatch!(self, d => d.stats(m, s).await)
    }
    pub(crate) async fn backlog(&self, m: &Mapping) -> Result<(u64, u64)> {
        dispatch!(self, d => d.backlog(m).await)
    }
    pub(crate) async fn list_rows(
        &self,
        m: &Mapping,
        id: Option<i64>,
        status: Option<&str>,
        limit: u32,
    ) -> Result<Vec<serde_json::Value>> {
        dispatch!(self, d => d.list_rows(m, id, status, limit).await)
    }
    pub(crate) async fn queue_init(&self) -> Result<()> {
        dispatch!(self, d => d.queue_init().await)
    }
    pub(crate) async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>> {
        dispatch!(self, d => d.enqueue(jobs).await)
    }
    pub(crate) async fn queue_admin(&self, op: Admin) -> Result<u64> {
        dispatch!(self, d => d.queue_admin(op).await)
    }
    pub(crate) async fn queue_stats(&self, queue: Option<&str>) -> Result<QueueStats> {
        dispatch!(self, d => d.queue_stats(queue).await)
    }
}

/// Runs `$op` again while it fails with a transient error (deadlock, lock-wait timeout,
/// serialization failure, SQLite busy), with a short growing pause; gives up after a while.
macro_rules! retry_transient {
    ($op:expr) => {{
        let mut attempt: u32 = 0;
        loop {
            match $op {
                Err(e) if attempt < $crate::backend::MAX_RETRIES && $crate::backend::is_transient(&e) => {
                    attempt += 1;
                    ::tracing::debug!(error = %e, attempt, "transient error, retrying");
                    $crate::backend::pause(attempt).await;
                }
                other => break other,
            }
        }
    }};
}
pub(crate) use retry_transient;

pub(crate) const MAX_RETRIES: u32 = 30;

pub(crate) async fn pause(attempt: u32) {
    // 1, 2, 4 … ms capped at 100 ms, with jitter so that colliding claimers spread out.
    let base = 1u64 << attempt.min(7);
    let jitter = u64::from(uuid::Uuid::now_v7().as_bytes()[15]) % (base + 1);
    tokio::time::sleep(Duration::from_millis((base + jitter).min(100))).await;
}

/// Deadlock, lock-wait timeout, serialization failure, SQLite busy: worth running again.
pub(crate) fn is_transient(e: &crate::Error) -> bool {
    let crate::Error::Database(sqlx::Error::Database(db)) = e else {
        return false;
    };
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        // 1213 deadlock (also a Galera certification failure), 1205 lock wait timeout.
        return matches!(my.number(), 1213 | 1205);
    }
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return matches!(pg.code(), "40001" | "40P01");
    }
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their extended codes.
        let code: i64 = db.code().and_then(|c| c.parse().ok()).unwrap_or(0);
        return matches!(code & 0xff, 5 | 6);
    }
    false
}

/// Whether a query error means the lock was taken by another transaction (NOWAIT).
pub(crate) fn is_lock_conflict(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        // MySQL 3572 ER_LOCK_NOWAIT; MariaDB reports NOWAIT as 1205.
        return matches!(my.number(), 3572 | 1205);
    }
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return pg.code() == "55P03";
    }
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        let code: i64 = db.code().and_then(|c| c.parse().ok()).unwrap_or(0);
        return matches!(code & 0xff, 5 | 6);
    }
    false
}

/// Commits `tx`. When the connection breaks while the COMMIT is under way, nobody knows whether it
/// took effect: that is [`crate::Error::OutcomeUnknown`], naming `what` was being committed, never
/// a plain failure that a caller would simply repeat.
pub(crate) async fn commit<DB: sqlx::Database>(
    tx: sqlx::Transaction<'_, DB>,
    what: impl FnOnce() -> String,
) -> Result<()> {
    tx.commit().await.map_err(|e| {
        if crate::error::connection_broke(&e) {
            crate::Error::OutcomeUnknown {
                what: what(),
                source: e,
            }
        } else {
            crate::Error::Database(e)
        }
    })
}

/// What an enqueue commits, for [`commit`]'s message.
pub(crate) fn enqueue_what(jobs: usize) -> String {
    match jobs {
        1 => "the enqueue of 1 job".to_owned(),
        n => format!("the enqueue of {n} jobs"),
    }
}

/// A token cannot name its rows when there is no owner column to find them by.
pub(crate) fn no_owner(m: &Mapping) -> crate::Error {
    crate::Error::Unsupported(format!(
        "{} has no owner column, so a token does not say which rows it holds: name the rows \
         (--id), or map an owner column",
        m.table_display
    ))
}

/// Converts a lease to whole milliseconds (at least 1).
pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Parses a row's JSON text (MySQL and SQLite build it with `JSON_OBJECT`).
pub(crate) fn parse_row(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text)
        .map_err(|e| crate::Error::InvalidInput(format!("row is not valid JSON ({e}): {text}")))
}

/// Collects bound values for one statement and hands out their placeholders (`$n` on
/// PostgreSQL, `?` elsewhere) in the order the SQL text uses them. Nothing but placeholders and
/// validated, quoted identifiers ever goes into SQL text.
pub(crate) struct Binder<DB: sqlx::Database> {
    args: DB::Arguments,
    error: Option<sqlx::error::BoxDynError>,
}

impl<DB: sqlx::Database> Binder<DB>
where
    i64: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    String: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    pub(crate) fn new() -> Self {
        Binder {
            args: Default::default(),
            error: None,
        }
    }

    /// Binds a value; returns its placeholder.
    pub(crate) fn bind<T>(&mut self, value: T) -> String
    where
        T: for<'t> sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        use sqlx::Arguments;
        if let Err(e) = self.args.add(value) {
            self.error.get_or_insert(e);
        }
        let mut placeholder = String::new();
        // Writing to a String cannot fail.
        let _ = self.args.format_placeholder(&mut placeholder);
        placeholder
    }

    /// Binds a status value or id as the integer or text it is.
    pub(crate) fn value(&mut self, v: &crate::RowId) -> String {
        match v {
            crate::RowId::Int(i) => self.bind(*i),
            crate::RowId::Text(s) => self.bind(s.clone()),
        }
    }

    /// A comma-separated placeholder list for `IN (…)`.
    pub(crate) fn list(&mut self, ids: &IdList) -> String {
        let parts: Vec<String> = match ids {
            IdList::Int(v) => v.iter().map(|i| self.bind(*i)).collect(),
            IdList::Text(v) => v.iter().map(|s| self.bind(s.clone())).collect(),
        };
        parts.join(", ")
    }

    pub(crate) fn query<'q>(
        self,
        sql: String,
    ) -> Result<sqlx::query::Query<'q, DB, DB::Arguments>> {
        Ok(sqlx::query_with(sqlx::AssertSqlSafe(sql), self.finish()?))
    }

    pub(crate) fn query_as<'q, O>(
        self,
        sql: String,
    ) -> Result<sqlx::query::QueryAs<'q, DB, O, DB::Arguments>>
    where
        O: for<'r> sqlx::FromRow<'r, DB::Row>,
    {
        Ok(sqlx::query_as_with(
            sqlx::AssertSqlSafe(sql),
            self.finish()?,
        ))
    }

    pub(crate) fn scalar<'q, O>(
        self,
        sql: String,
    ) -> Result<sqlx::query::QueryScalar<'q, DB, O, DB::Arguments>>
    where
        (O,): for<'r> sqlx::FromRow<'r, DB::Row>,
    {
        Ok(sqlx::query_scalar_with(
            sqlx::AssertSqlSafe(sql),
            self.finish()?,
        ))
    }

    fn finish(self) -> Result<DB::Arguments> {
        match self.error {
            Some(e) => Err(crate::Error::Database(sqlx::Error::Encode(e))),
            None => Ok(self.args),
        }
    }
}
