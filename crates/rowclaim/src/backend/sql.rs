//! What the three databases' SQL has in common: the [`Dialect`] each driver describes its SQL
//! with, the [`Binder`] that keeps values out of SQL text, and the conditions and SET lists every
//! driver's statements are made of ("ready", "expired", "held by this token", "mark claimed").
//!
//! A driver's claim reads top to bottom in its own `claim.rs`; what it takes from here are these
//! few named pieces, each the same meaning on every database.

use std::time::Duration;

use crate::mapping::{status_literal, ColType, Mapping};
use crate::value::IdList;
pub(crate) use crate::value::Value;
use crate::Result;

use super::{Outcome, Target};

/// How one database writes the pieces of SQL that differ between databases. Implemented by a
/// zero-sized type per driver (`postgres::Sql`, `mysql::Sql`, `sqlite::Sql`).
pub(crate) trait Dialect: Sized + 'static {
    /// The sqlx database whose arguments a [`Binder`] fills.
    type DB: sqlx::Database;
    /// The server's clock, as the type lease columns hold.
    const NOW: &'static str;
    /// The server's clock in whole seconds since the Unix epoch.
    const EPOCH_SECONDS: &'static str;
    /// The type to `CAST(… AS …)` a value to text.
    const TEXT: &'static str;
    /// What a lease column must be, for messages.
    const LEASE_TYPE: &'static str;
    /// The column type a lease column must have.
    const LEASE_COLUMN: ColType;
    /// Quotes an identifier validated as plain (so it holds no quote characters).
    fn quote(ident: &str) -> String;
    /// Ends an `INSERT` so that a row whose `key` exists already is kept as it is.
    fn keep_existing(key: &str) -> String;
    /// The placeholder of the `n`th bound value (1-based).
    fn placeholder(n: usize) -> String;
    /// "now + `after`" by the server's clock, binding `after`.
    fn later(b: &mut Binder<Self>, after: Duration) -> String;
    /// "`column` is one of `ids`".
    fn id_in(b: &mut Binder<Self>, column: &str, ids: &IdList) -> String;
    /// A claimed row of alias `t` as a JSON object (the managed queue's job: its own columns).
    fn row_json(m: &Mapping) -> String;
    /// A time column (or expression) as epoch milliseconds, whatever the session's time zone.
    fn epoch_ms(expr: &str) -> String;
    /// Epoch milliseconds `ms` (an expression: a placeholder, a column) as the type time
    /// columns hold, whatever the session's time zone; NULL stays NULL. The counterpart of
    /// [`Dialect::epoch_ms`]: a whole number of milliseconds comes back exactly.
    fn at_ms(ms: &str) -> String;
    /// JSON `text`, bound, as a JSON column takes it (PostgreSQL casts it to `jsonb`; the
    /// others keep JSON as text).
    fn json(b: &mut Binder<Self>, text: String) -> String {
        b.bind(text)
    }
    /// The bound values as the driver's arguments.
    fn arguments(values: Vec<Value>) -> Result<<Self::DB as sqlx::Database>::Arguments>;
}

/// Adds the scalar values to a driver's arguments in order; `array` adds an array value (only
/// PostgreSQL has array parameters; the others refuse them).
pub(crate) fn arguments<DB>(
    values: Vec<Value>,
    mut array: impl FnMut(&mut DB::Arguments, Value) -> Result<()>,
) -> Result<DB::Arguments>
where
    DB: sqlx::Database,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i32: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> f64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Option<f64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> Option<String>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let mut args = DB::Arguments::default();
    for v in values {
        match v {
            Value::Int(i) => add::<DB, _>(&mut args, i)?,
            Value::OptInt(i) => add::<DB, _>(&mut args, i)?,
            Value::I32(i) => add::<DB, _>(&mut args, i)?,
            Value::Float(x) => add::<DB, _>(&mut args, x)?,
            Value::Text(t) => add::<DB, _>(&mut args, t)?,
            Value::OptText(t) => add::<DB, _>(&mut args, t)?,
            Value::OptFloat(x) => add::<DB, _>(&mut args, x)?,
            arr => array(&mut args, arr)?,
        }
    }
    Ok(args)
}

/// Collects bound values for one statement and hands out their placeholders in the order the SQL
/// text uses them. Nothing but placeholders and validated, quoted identifiers ever goes into SQL
/// text.
pub(crate) struct Binder<D: Dialect> {
    values: Vec<Value>,
    _dialect: std::marker::PhantomData<D>,
}

impl<D: Dialect> Default for Binder<D> {
    fn default() -> Self {
        Binder::new()
    }
}

impl<D: Dialect> Binder<D> {
    pub(crate) fn new() -> Self {
        Binder {
            values: Vec::new(),
            _dialect: std::marker::PhantomData,
        }
    }

    /// Binds a value; returns its placeholder.
    pub(crate) fn bind(&mut self, value: impl Into<Value>) -> String {
        self.values.push(value.into());
        D::placeholder(self.values.len())
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

    /// The bound values, in order (for the SQL snapshots).
    #[cfg(test)]
    #[allow(dead_code)]
    pub(crate) fn values(&self) -> &[Value] {
        &self.values
    }

    pub(crate) fn finish(self) -> Result<<D::DB as sqlx::Database>::Arguments> {
        D::arguments(self.values)
    }
}

/// A statement and its bound values.
pub(crate) struct Stmt<D: Dialect> {
    pub sql: String,
    pub binder: Binder<D>,
}

impl<D: Dialect> Stmt<D> {
    pub(crate) fn new(sql: String, binder: Binder<D>) -> Stmt<D> {
        Stmt { sql, binder }
    }
}

/// For one driver (sqlx's execution functions need the concrete database): `query`, `scalar`
/// and `query_as` over a [`Binder`]; [`Run`](super::run::Run) for the driver (its statements go
/// to `&self.pool`, or to `self.exec()` when `exec` is given: PostgreSQL's route with its pooler
/// and failover rules), for its transactions and for a caller's connection; and
/// [`Transact`](super::run::Transact) through the driver's own `open_transaction`.
macro_rules! binder_queries {
    ($dialect:ty, $db:ty, $driver:ty) => {
        $crate::backend::sql::binder_queries!(@all $dialect, $db, $driver, pool, txpool);
    };
    ($dialect:ty, $db:ty, $driver:ty, exec) => {
        $crate::backend::sql::binder_queries!(@all $dialect, $db, $driver, exec, txexec);
    };
    // Binds the executor `$e` of one statement (and whether sqlx may keep it prepared, `$k`)
    // for a runner `$s` of each kind, then evaluates `$body`.
    (@with pool, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let ($e, $k) = (&$s.pool, true);
        $body
    }};
    (@with exec, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let ($e, $k) = ($s.exec(), true);
        $body
    }};
    (@with txpool, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let mut g = $s.tx.lock().await;
        let ($e, $k) = (&mut **g, true);
        $body
    }};
    (@with txexec, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let mut g = $s.tx.lock().await;
        let ($e, $k) = ($s.driver.on(&mut **g), true);
        $body
    }};
    (@with conn, $s:ident, |$e:ident, $k:ident| $body:expr) => {{
        let mut g = $s.conn.lock().await;
        let ($e, $k) = (&mut **g, $s.keep);
        $body
    }};
    (@run $dialect:ty, $db:ty, $target:ty, $how:ident) => {
        impl $crate::backend::run::Run for $target {
            type Sql = $dialect;

            async fn execute(
                &self,
                s: $crate::backend::sql::Stmt<$dialect>,
            ) -> $crate::Result<u64> {
                let q = s.binder.query(s.sql)?;
                $crate::backend::sql::binder_queries!(@with $how, self, |e, keep| {
                    Ok(q.persistent(keep).execute(e).await?.rows_affected())
                })
            }

            async fn fetch_all<T: $crate::backend::run::Fetch<$dialect>>(
                &self,
                s: $crate::backend::sql::Stmt<$dialect>,
            ) -> $crate::Result<Vec<T>> {
                let q = s.binder.query_as::<T>(s.sql)?;
                $crate::backend::sql::binder_queries!(@with $how, self, |e, keep| {
                    Ok(q.persistent(keep).fetch_all(e).await?)
                })
            }

            async fn fetch_optional<T: $crate::backend::run::Fetch<$dialect>>(
                &self,
                s: $crate::backend::sql::Stmt<$dialect>,
            ) -> $crate::Result<Option<T>> {
                let q = s.binder.query_as::<T>(s.sql)?;
                $crate::backend::sql::binder_queries!(@with $how, self, |e, keep| {
                    Ok(q.persistent(keep).fetch_optional(e).await?)
                })
            }

            async fn values(
                &self,
                s: $crate::backend::sql::Stmt<$dialect>,
                columns: &[$crate::backend::run::Col],
            ) -> $crate::Result<Vec<Vec<$crate::value::Value>>> {
                let q = s.binder.query(s.sql)?;
                let rows = $crate::backend::sql::binder_queries!(@with $how, self, |e, keep| {
                    q.persistent(keep).fetch_all(e).await?
                });
                $crate::backend::run::values(rows, columns)
            }
        }
    };
    (@all $dialect:ty, $db:ty, $driver:ty, $exec:ident, $tx:ident) => {
        impl $crate::backend::sql::Binder<$dialect> {
            pub(crate) fn query<'q>(
                self,
                sql: String,
            ) -> $crate::Result<
                sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments>,
            > {
                $crate::backend::sql::record(&sql);
                Ok(sqlx::query_with(sqlx::AssertSqlSafe(sql), self.finish()?))
            }

            pub(crate) fn query_as<'q, O>(
                self,
                sql: String,
            ) -> $crate::Result<
                sqlx::query::QueryAs<'q, $db, O, <$db as sqlx::Database>::Arguments>,
            >
            where
                O: for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
            {
                $crate::backend::sql::record(&sql);
                Ok(sqlx::query_as_with(sqlx::AssertSqlSafe(sql), self.finish()?))
            }

            pub(crate) fn scalar<'q, O>(
                self,
                sql: String,
            ) -> $crate::Result<
                sqlx::query::QueryScalar<'q, $db, O, <$db as sqlx::Database>::Arguments>,
            >
            where
                (O,): for<'r> sqlx::FromRow<'r, <$db as sqlx::Database>::Row>,
            {
                $crate::backend::sql::record(&sql);
                Ok(sqlx::query_scalar_with(sqlx::AssertSqlSafe(sql), self.finish()?))
            }
        }

        $crate::backend::sql::binder_queries!(@run $dialect, $db, $driver, $exec);
        $crate::backend::sql::binder_queries!(
            @run $dialect, $db, $crate::backend::run::InTx<'_, $driver, $db>, $tx
        );
        $crate::backend::sql::binder_queries!(
            @run $dialect, $db, $crate::backend::run::OnConn<'_, $db>, conn
        );

        impl $crate::backend::run::Transact for $driver {
            type Tx<'t> = $crate::backend::run::InTx<'t, $driver, $db>;

            async fn transaction(&self, durable: bool) -> $crate::Result<Self::Tx<'_>> {
                Ok($crate::backend::run::InTx::new(
                    self,
                    self.open_transaction(durable).await?,
                ))
            }
        }
    };
}
pub(crate) use binder_queries;

#[cfg(test)]
thread_local! {
    /// The statements built on this thread while a test records them (see `snapshots`).
    pub(crate) static RECORDED: std::cell::RefCell<Option<Vec<String>>> =
        const { std::cell::RefCell::new(None) };
}

/// Keeps `sql` for the SQL snapshots when a test asked for it; nothing otherwise.
#[inline]
pub(crate) fn record(_sql: &str) {
    #[cfg(test)]
    RECORDED.with(|r| {
        if let Some(log) = r.borrow_mut().as_mut() {
            log.push(_sql.to_owned());
        }
    });
}

/// Adds `v` to `args`, keeping the first encoding error.
pub(crate) fn add<'q, DB, T>(args: &mut DB::Arguments, v: T) -> Result<()>
where
    DB: sqlx::Database,
    T: sqlx::Encode<'q, DB> + sqlx::Type<DB> + 'q,
{
    use sqlx::Arguments;
    args.add(v)
        .map_err(|e| crate::Error::Database(sqlx::Error::Encode(e)))
}

/// Rows a claim may take: ready (and due, for a scheduled source), or claimed with an expired
/// lease; within the managed queue's queues. This is the recheck a statement applies to rows it
/// already named; to *find* rows use [`candidates`] (or the two arms), because one OR across both
/// kinds can use neither kind's index.
pub(crate) fn claimable<D: Dialect>(m: &Mapping, b: &mut Binder<D>) -> String {
    let ready = ready_cond::<D>(m);
    let mut cond = match expired_cond::<D>(m) {
        Some(expired) => format!("(({ready}) OR ({expired}))"),
        None => format!("({ready})"),
    };
    cond.push_str(&queue_condition(m, b));
    cond
}

/// Ready, and due for a scheduled source. (Status values are literals: nothing to bind.)
fn ready_cond<D: Dialect>(m: &Mapping) -> String {
    let mut cond = format!("{} = {}", m.status, status_literal(&m.ready));
    if let Some(r) = &m.run_at {
        cond.push_str(&format!(" AND {r} <= {}", D::NOW));
    }
    cond
}

/// Claimed with an expired lease; None without a lease column.
fn expired_cond<D: Dialect>(m: &Mapping) -> Option<String> {
    let le = m.lease.as_ref()?;
    Some(format!(
        "{} = {} AND {le} < {}",
        m.status,
        status_literal(&m.claimed),
        D::NOW
    ))
}

/// The first arm of a claim: ready rows (and due, for a scheduled source) within the managed
/// queue's queues. An equality on status, so a partial index over ready rows (or one on
/// `(status, …)`) serves it in the source's order, however many finished rows the table keeps.
pub(crate) fn ready_arm<D: Dialect>(m: &Mapping, b: &mut Binder<D>) -> String {
    ready_cond::<D>(m) + &queue_condition(m, b)
}

/// The second arm: claimed rows whose lease has expired (None without a lease column). Few rows
/// are claimed at any time, so an index over claimed rows keeps this cheap.
pub(crate) fn expired_arm<D: Dialect>(m: &Mapping, b: &mut Binder<D>) -> Option<String> {
    Some(expired_cond::<D>(m)? + &queue_condition(m, b))
}

/// A query for up to `limit` rows a claim may take, without locking them: rows with an expired
/// lease first (when `expired`), then ready rows in the source's order. Each arm is its own
/// sub-select so each walks its own index. `select` is the column list of each arm (alias
/// anything cast, so that ORDER BY still means the column).
pub(crate) fn candidates<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    select: &str,
    limit: i64,
    expired: bool,
) -> String {
    let (t, order, filter) = (&m.table, &m.order_by, &m.filter);
    let arm = |b: &mut Binder<D>, cond: String| {
        format!(
            "SELECT {select} FROM {t} WHERE {cond}{filter} ORDER BY {order} LIMIT {}",
            b.bind(limit)
        )
    };
    match expired.then(|| expired_arm(m, b)).flatten() {
        None => {
            let ready = ready_arm(m, b);
            arm(b, ready)
        }
        Some(expired) => {
            let e = arm(b, expired);
            let ready = ready_arm(m, b);
            let r = arm(b, ready);
            format!(
                "SELECT * FROM ({e}) AS rowclaim_e UNION ALL SELECT * FROM ({r}) AS rowclaim_r \
                 LIMIT {}",
                b.bind(limit)
            )
        }
    }
}

/// The SET list that marks rows claimed by `token`: status, owner, lease end (now + `lease` by
/// the server's clock), one more attempt.
pub(crate) fn claim_set<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    token: &str,
    lease: Duration,
) -> String {
    let mut set = vec![format!("{} = {}", m.status, status_literal(&m.claimed))];
    if let Some(ow) = &m.owner {
        set.push(format!("{ow} = {}", b.bind(token.to_owned())));
    }
    if let Some(le) = &m.lease {
        set.push(format!("{le} = {}", D::later(b, lease)));
    }
    if let Some(at) = &m.attempts {
        set.push(format!("{at} = COALESCE({at}, 0) + 1"));
    }
    if let Some(st) = &m.started_column {
        set.push(format!("{st} = {}", D::NOW));
    }
    set.join(", ")
}

/// The fencing condition "`token` holds this row" for strategies that mark rows in the table:
/// claimed, by this owner, and (for [`Target::Ids`]) one of the named rows. Without an owner
/// column only named rows can be meant.
///
/// With named rows the status test is written `(status = claimed) IS TRUE`: the same test, but
/// one a planner cannot match to a partial index over claimed rows (the managed queue's lease
/// index), so the rows are found through their key. Otherwise PostgreSQL, when statistics say
/// few rows are claimed, walks that index instead, and until vacuum it also holds an entry for
/// every row claimed since; with a transaction open elsewhere for minutes, hundreds of
/// thousands, each looked up in the table.
pub(crate) fn held_by<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    token: &str,
    target: &Target<'_>,
) -> Result<String> {
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
        cond.push_str(&format!(" AND {}", D::id_in(b, &m.id, list)));
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
pub(crate) fn outcome_set<D: Dialect>(m: &Mapping, b: &mut Binder<D>, outcome: &Outcome) -> String {
    let mut set = vec![format!(
        "{} = {}",
        m.status,
        status_literal(outcome.status(m))
    )];
    if matches!(
        outcome,
        Outcome::Ready | Outcome::Retry { .. } | Outcome::Snooze { .. } | Outcome::Unstarted
    ) {
        set.extend(m.owner.iter().map(|ow| format!("{ow} = NULL")));
        set.extend(m.lease.iter().map(|le| format!("{le} = NULL")));
    }
    if let (Outcome::Retry { after, .. } | Outcome::Snooze { after }, Some(run_at)) =
        (outcome, &m.run_at)
    {
        set.push(format!("{run_at} = {}", D::later(b, *after)));
    }
    // A snooze, or a row that never started, is no attempt: the claim's is taken back.
    if let (Outcome::Snooze { .. } | Outcome::Unstarted, Some(at)) = (outcome, &m.attempts) {
        set.push(format!(
            "{at} = CASE WHEN {at} > 0 THEN {at} - 1 ELSE 0 END"
        ));
    }
    if let (Outcome::Done(Some(out)), Some(col)) = (outcome, &m.output_column) {
        set.push(format!("{col} = {}", D::json(b, out.clone())));
    }
    if let (Outcome::Failed(Some(e)) | Outcome::Retry { error: Some(e), .. }, Some(col)) =
        (outcome, &m.error_column)
    {
        set.push(format!("{col} = {}", b.bind(e.clone())));
    }
    if let (Outcome::Done(_) | Outcome::Failed(_), Some(col)) = (outcome, &m.finished_column) {
        set.push(format!("{col} = {}", D::NOW));
    }
    set.join(", ")
}

/// For the managed queue: ` AND queue IN (…)` (and ` AND kind IN (…)`) with the names bound,
/// and not of a paused queue nor of a limited one (`rowclaim_queues`, see `queue/settings.rs`;
/// a limited queue's jobs are claimed by `queue/limits.rs`); empty otherwise. What an
/// ordinary claim may take.
pub(crate) fn queue_condition<D: Dialect>(m: &Mapping, b: &mut Binder<D>) -> String {
    let blocked = format!("paused_at IS NOT NULL OR {}", crate::queue::LIMITED);
    queue_cond(m, b, &blocked)
}

/// [`queue_condition`], letting limited queues' jobs through: the jobs that are work now,
/// whichever claim takes them.
pub(crate) fn queue_scope<D: Dialect>(m: &Mapping, b: &mut Binder<D>) -> String {
    queue_cond(m, b, "paused_at IS NOT NULL")
}

fn queue_cond<D: Dialect>(m: &Mapping, b: &mut Binder<D>, blocked: &str) -> String {
    let mut cond = String::new();
    for (col, names) in [&m.queues, &m.kinds].into_iter().flatten() {
        if !names.is_empty() {
            let list: Vec<String> = names.iter().map(|n| b.bind(n.clone())).collect();
            cond.push_str(&format!(" AND {col} IN ({})", list.join(", ")));
        }
    }
    if let Some((col, names)) = &m.queues {
        match names.as_slice() {
            // One queue: a test of that queue alone, which the planners evaluate once before
            // the scan and which then skips the scan of a paused queue's backlog altogether.
            [one] => cond.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM rowclaim_queues \
                 WHERE name = {} AND ({blocked}))",
                b.bind(one.clone())
            )),
            _ => cond.push_str(&format!(
                " AND {col} NOT IN (SELECT name FROM rowclaim_queues WHERE {blocked})"
            )),
        }
    }
    cond
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
    serde_json::from_str(text).map_err(|e| {
        crate::Error::Internal(format!("a row came back as invalid JSON ({e}): {text}"))
    })
}

/// What a look at a source's rows selects besides the row itself: its status as text, who holds
/// it and when that lease ends (`lease_ms` spells a time as epoch milliseconds in the dialect).
/// The lease table is read in sub-selects rather than joined, so that the operator's filter,
/// written for the table alone, cannot meet a column of the same name there.
pub(crate) fn holder_columns<D: Dialect>(
    m: &Mapping,
    strategy: crate::Strategy,
    b: &mut Binder<D>,
    lease_ms: fn(&str) -> String,
    null_ms: &str,
) -> String {
    let (st, text) = (&m.status, D::TEXT);
    let (owner, lease) = if strategy == crate::Strategy::LeaseTable {
        let lease_of = |b: &mut Binder<D>, what: &str| {
            format!(
                "(SELECT {what} FROM rowclaim_leases AS l WHERE l.source = {} \
                 AND l.row_id = CAST(t.{} AS {text}))",
                b.bind(m.source_key.clone()),
                m.id
            )
        };
        let owner = lease_of(b, "l.token");
        let lease = lease_of(b, &lease_ms("l.lease_until"));
        (owner, lease)
    } else {
        (
            m.owner.as_ref().map_or_else(
                || format!("CAST(NULL AS {text})"),
                |ow| format!("CAST(t.{ow} AS {text})"),
            ),
            m.lease
                .as_ref()
                .map_or_else(|| null_ms.to_owned(), |le| lease_ms(&format!("t.{le}"))),
        )
    };
    format!("CAST(t.{st} AS {text}), {owner}, {lease}")
}

/// `SELECT select FROM table AS t` for the rows `q` asks for, in id order.
pub(crate) fn rows_sql<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    select: &str,
    q: &super::RowQuery,
) -> String {
    let mut cond = String::from("1 = 1");
    if let Some(s) = &q.status {
        cond.push_str(&format!(" AND t.{} = {}", m.status, b.value(s)));
    }
    if let Some(id) = &q.id {
        cond.push_str(&format!(" AND t.{} = {}", m.id, b.value(id)));
    }
    if let Some(after) = &q.after {
        cond.push_str(&format!(" AND t.{} > {}", m.id, b.value(after)));
    }
    format!(
        "SELECT {select} FROM {} AS t WHERE {cond}{} ORDER BY t.{} LIMIT {}",
        m.table,
        m.filter,
        m.id,
        b.bind(q.limit)
    )
}

/// The statement that gives a claimed row back, for strategies that keep claims in the table:
/// ready, owner and lease cleared; only while `holder` owns it, when given (and the mapping has
/// an owner column). The holder's token no longer matches, so fencing refuses whatever it does
/// with the row later.
pub(crate) fn release_row_sql<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    id: &crate::RowId,
    holder: Option<&str>,
) -> String {
    let set = outcome_set(m, b, &Outcome::Ready);
    let mut cond = format!(
        "{} = {} AND {} = {}{}",
        m.id,
        b.value(id),
        m.status,
        status_literal(&m.claimed),
        m.filter
    );
    if let (Some(ow), Some(h)) = (&m.owner, holder) {
        cond.push_str(&format!(" AND {ow} = {}", b.bind(h.to_owned())));
    }
    change_sql(m, Some(&set), &cond)
}

/// The statement that removes row `id`'s lease from `rowclaim_leases` (only `holder`'s, when
/// given): a release of a source whose claims are kept there.
pub(crate) fn release_lease_sql<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    id: &crate::RowId,
    holder: Option<&str>,
) -> String {
    let mut delete = format!(
        "DELETE FROM rowclaim_leases WHERE source = {} AND row_id = {}",
        b.bind(m.source_key.clone()),
        b.bind(id.to_string())
    );
    if let Some(h) = holder {
        delete.push_str(&format!(" AND token = {}", b.bind(h.to_owned())));
    }
    delete
}

/// The locking read a release takes first, `wait_clause` being the dialect's NOWAIT: a row that
/// a `transaction` claimer holds in its open transaction fails at once instead of keeping the
/// releasing connection waiting for that transaction.
pub(crate) fn lock_row_sql<D: Dialect>(
    m: &Mapping,
    b: &mut Binder<D>,
    id: &crate::RowId,
    wait_clause: &str,
) -> String {
    format!(
        "SELECT 1 FROM {} WHERE {} = {} FOR UPDATE{wait_clause}",
        m.table,
        m.id,
        b.value(id)
    )
}

/// A row held by the transaction strategy is locked by its claimer's open transaction: an
/// UPDATE would wait for it, and the claimer's commit would still win.
pub(crate) fn release_refused(m: &Mapping) -> crate::Error {
    crate::Error::Unsupported(format!(
        "rows of {} are claimed with the transaction strategy: the claiming process's open \
         transaction holds them, and they come back when it ends",
        m.table_display
    ))
}
