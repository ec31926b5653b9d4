//! What the three databases' SQL has in common: the [`Dialect`] each driver describes its SQL
//! with, the [`Binder`] that keeps values out of SQL text, the [`Stmt`] every statement is, and
//! (in the submodules) the pieces every driver's statements are made of: the conditions and SET
//! lists of claims and settles (`claims`), the statements of a look at a source's rows and of a
//! release by hand (`looks`), and the fragments a layer above hands down (`fragment`).
//!
//! A driver's claim reads top to bottom in its own `claim.rs`; what it takes from here are these
//! few named pieces, each the same meaning on every database.

mod claims;
pub(crate) mod fragment;
mod looks;

pub(crate) use claims::*;
pub(crate) use fragment::and_each;
pub(crate) use looks::*;

use std::time::Duration;

use crate::error::Result;
use crate::mapping::{ColType, Mapping};
use crate::value::IdList;
pub(crate) use crate::value::Value;

/// How many failed attempts a job keeps (its `errors`, oldest dropped first): enough to see a
/// pattern, bounded so that a job failing for weeks does not grow without end.
pub(crate) const ATTEMPTS_KEPT: usize = 20;

/// How many characters of an attempt's error its entry keeps (the last error stays whole in
/// `last_error`).
pub(crate) const ATTEMPT_ERROR_CHARS: usize = 2000;

/// On a node that applies other nodes' writes late (a Galera node, `applies_others_late`), the
/// prefix that makes a read wait until the node has applied what the cluster committed before
/// it (`wsrep_sync_wait` 1); empty elsewhere.
pub(crate) fn read_after_applied(wait: bool) -> &'static str {
    if wait {
        "SET STATEMENT wsrep_sync_wait = 1 FOR "
    } else {
        ""
    }
}

/// [`read_after_applied`] for an UPDATE or DELETE (`wsrep_sync_wait` 2).
pub(crate) fn write_after_applied(wait: bool) -> &'static str {
    if wait {
        "SET STATEMENT wsrep_sync_wait = 2 FOR "
    } else {
        ""
    }
}

/// How one database writes the pieces of SQL that differ between databases. Implemented by a
/// zero-sized type per driver (`postgres::Sql`, `mysql::Sql`, `sqlite::Sql`).
pub(crate) trait Dialect: Sized + Send + Sync + 'static {
    /// The sqlx database whose arguments a [`Binder`] fills.
    type DB: sqlx::Database;
    /// The server's clock, as the type lease columns hold.
    const NOW: &'static str;
    /// The server's clock in whole seconds since the Unix epoch.
    const EPOCH_SECONDS: &'static str;
    /// The type to `CAST(… AS …)` a value to text.
    const TEXT: &'static str;
    /// Only one writer writes at a time (SQLite): a change takes the write lock up front, in a
    /// transaction, instead of meeting another writer halfway.
    const ONE_WRITER: bool = false;
    /// How a locking read asks not to wait (` NOWAIT`); `None` where there are no row locks
    /// (SQLite: a write transaction locks the whole database).
    const NOWAIT: Option<&'static str> = Some(" NOWAIT");
    /// Whether a limited claim may find the first job of each key's line key by key, a
    /// recursive query that reads the limit index one key at a time. That needs an index range
    /// bounded by the step before's value (MySQL and MariaDB read such a range from its start
    /// in a correlated subquery) and an index of live jobs only (SQLite's limit index holds
    /// finished jobs too, which each step would read past).
    const SKIP_SCAN: bool = true;
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
    /// How a row of [`Dialect::claimed_select`] is read.
    type Claimed: IntoRow
        + for<'r> sqlx::FromRow<'r, <Self::DB as sqlx::Database>::Row>
        + Send
        + Unpin;
    /// A claimed row of alias `t`, as the statement that reads it selects it (read as
    /// [`Dialect::Claimed`]): by default [`Dialect::row_json`] as text.
    fn claimed_select(m: &Mapping) -> String {
        format!("CAST({} AS {})", Self::row_json(m), Self::TEXT)
    }
    /// A time column (or expression) as epoch milliseconds, whatever the session's time zone.
    fn epoch_ms(expr: &str) -> String;
    /// A time column (or expression) as epoch microseconds (an integer).
    fn micros_of(expr: &str) -> String;
    /// The time `us` epoch microseconds, bound, as the time type of the dialect's time columns.
    fn at_micros(b: &mut Binder<Self>, us: i64) -> String;
    /// Epoch milliseconds `ms` (an expression: a placeholder, a column) as the type time
    /// columns hold, whatever the session's time zone; NULL stays NULL. The counterpart of
    /// [`Dialect::epoch_ms`]: a whole number of milliseconds comes back exactly.
    fn at_ms(ms: &str) -> String;
    /// JSON `text`, bound, as a JSON column takes it (PostgreSQL casts it to `jsonb`; the
    /// others keep JSON as text).
    fn json(b: &mut Binder<Self>, text: String) -> String {
        b.bind(text)
    }
    /// The JSON list `list` (NULL: empty) with `entry` appended, keeping only the last
    /// [`ATTEMPTS_KEPT`]: a job's failed attempts. `entry` is the object's fields, each a name
    /// and an SQL expression (numbers or text).
    fn appended(list: &str, entry: &[(&str, String)]) -> String;
    /// The bound values as the driver's arguments.
    fn arguments(values: Vec<Value>) -> Result<<Self::DB as sqlx::Database>::Arguments>;
}

/// How dialect `D` names things, for checking a source against its catalog.
pub(crate) fn naming<D: Dialect>() -> crate::mapping::Naming {
    crate::mapping::Naming {
        quote: D::quote,
        lease_column: D::LEASE_COLUMN,
        lease_type: D::LEASE_TYPE,
    }
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
    pub(crate) fn value(&mut self, v: &crate::id::RowId) -> String {
        match v {
            crate::id::RowId::Int(i) => self.bind(*i),
            crate::id::RowId::Text(s) => self.bind(s.clone()),
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
        .map_err(|e| crate::error::Error::Internal(format!("a value could not be bound: {e}")))
}

/// A token cannot name its rows when there is no owner column to find them by.
pub(crate) fn no_owner(m: &Mapping) -> crate::error::Error {
    crate::error::Error::Unsupported(format!(
        "{} has no owner column, so a token does not say which rows it holds: name the rows \
         (--id), or map an owner column",
        m.table_display
    ))
}

/// Converts a lease to whole milliseconds (at least 1).
pub(crate) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// A claimed row as a driver reads it ([`Dialect::Claimed`]), made the JSON object every claim
/// hands on.
pub(crate) trait IntoRow {
    fn into_row(self) -> Result<serde_json::Value>;
}

/// A claimed row read as JSON text ([`Dialect::row_json`] cast to text).
pub(crate) struct JsonText(String);

impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for JsonText
where
    usize: sqlx::ColumnIndex<R>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(r: &'r R) -> sqlx::Result<JsonText> {
        r.try_get(0).map(JsonText)
    }
}

impl IntoRow for JsonText {
    fn into_row(self) -> Result<serde_json::Value> {
        parse_row(&self.0)
    }
}

/// Parses a row's JSON text (MySQL and SQLite build it with `JSON_OBJECT`).
pub(crate) fn parse_row(text: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| {
        crate::error::Error::Internal(format!("a row came back as invalid JSON ({e}): {text}"))
    })
}
