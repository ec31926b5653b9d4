//! The one error type of the library, and how database errors are sorted and described.

use std::time::Duration;

use crate::id::RowId;

mod database;

pub use database::DatabaseError;
pub(crate) use database::{describe_plain, kind_of, DbKind};

/// Everything that can go wrong in rowclaim.
///
/// Match on the variants that call for different handling — [`Error::LeaseLost`] (another claimer
/// owns the row now: drop your result), [`Error::Locked`] (a `NOWAIT` read hit a locked row),
/// [`Error::OutcomeUnknown`] (the connection broke while a commit was under way: check before
/// doing it again) — and report the rest. Input errors ([`Error::InvalidIdentifier`],
/// [`Error::MissingColumn`], …) are raised before anything is written.
///
/// Each message is complete on its own: print an `Error` with `{}` and do not also print its
/// [`source`](std::error::Error::source), which is kept for programs that want to inspect it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A table or column name that is not a plain SQL identifier (`[A-Za-z_][A-Za-z0-9_]*`).
    #[error("{what} {value:?} is not a plain SQL identifier (letters, digits and _, not starting with a digit, at most 63 characters)")]
    InvalidIdentifier {
        /// Which setting held it, e.g. `"status column"`.
        what: &'static str,
        /// The offending text.
        value: String,
    },

    /// The database refused a claim for want of a privilege; says which, and the statement that
    /// grants it when the catalog tells.
    #[error("{what}{}", .grant.as_ref().map(|g| format!("; to grant it: {g}")).unwrap_or_default())]
    MissingPrivilege {
        /// What the user lacks, and what needs it.
        what: String,
        /// The statement (or statements) that grant it.
        grant: Option<String>,
        /// The database's refusal.
        #[source]
        source: Box<DatabaseError>,
    },

    /// The source table does not exist.
    #[error("table {table} does not exist")]
    MissingTable {
        /// The table as it was named.
        table: String,
    },

    /// A mapped column is not in the table.
    #[error("table {table} has no column {column} (given as the {what})")]
    MissingColumn {
        /// The table.
        table: String,
        /// The column that was asked for.
        column: String,
        /// Which setting named it, e.g. `"lease column"`.
        what: &'static str,
    },

    /// A mapped column has a type rowclaim cannot use for that role.
    #[error("column {table}.{column} has type {found}, but the {what} must be {expected}")]
    WrongColumnType {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// Its role, e.g. `"lease column"`.
        what: &'static str,
        /// What the role needs.
        expected: &'static str,
        /// The type the database reports.
        found: String,
    },

    /// The id column does not name one row: two rows may share an id, and every strategy takes
    /// and settles rows by id.
    #[error(
        "column {table}.{column} is not unique: it is not the table's primary key and has no \
         unique index of its own, so one id could name two rows and a claim take both; make it \
         unique ({fix}), or give a column that is with --id-column"
    )]
    IdNotUnique {
        /// The table, as it was named.
        table: String,
        /// The id column.
        column: String,
        /// The statement that makes it unique.
        fix: String,
    },

    /// The strategy cannot run on this server or with this mapping.
    #[error("strategy {strategy} cannot be used here: {reason}")]
    UnsupportedStrategy {
        /// The strategy that was asked for.
        strategy: crate::strategy::Strategy,
        /// Why, and what would work instead.
        reason: String,
    },

    /// The operation is not available on this backend or with this mapping.
    #[error("{0}")]
    Unsupported(String),

    /// The table's claimers must agree on its mapping (see [`crate::registry`]), and this one
    /// differs from the mapping recorded by the first claim on it. Nothing was claimed.
    #[error(
        "the mapping of {table} differs from the one recorded for it on {recorded_at}: {}. Every \
         claimer of a table must map it alike, or they can take the same row. Map it as recorded, \
         or, once no claimer uses the recorded mapping any more, replace the record: \
         `rowclaim source replace` with this mapping's table flags (Db::record_source)",
        .differences.join("; ")
    )]
    MappingDisagrees {
        /// The table as it was named.
        table: String,
        /// When the record was written (RFC 3339, UTC).
        recorded_at: String,
        /// One line per difference: what, recorded, here.
        differences: Vec<String>,
    },

    /// Any other bad input: a zero lease, a batch of 0, a malformed `ORDER BY`, a status value that
    /// does not fit the status column, …
    #[error("{0}")]
    InvalidInput(String),

    /// A schedule that cannot run: its name, cron expression, time zone, interval or job is
    /// not valid. `field` names which (`name`, `cron`, `zone`, `every`, `job`); the error of the
    /// parser that refused it, if any, is kept as the source.
    #[error("schedule {schedule}: {}", describe_field(field, value, problem))]
    InvalidSchedule {
        /// The schedule's name.
        schedule: String,
        /// Which part of it is wrong.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        problem: String,
        /// The cron parser's or time zone database's own error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// A job's payload is more than one statement may carry to this server (MySQL/MariaDB's
    /// `max_allowed_packet`). `job` is its place among the jobs given, from 1. Nothing was
    /// enqueued.
    #[error(
        "job {job}: its payload is {bytes} bytes, more than one statement may carry to this \
         server (max_allowed_packet is {limit} bytes); make it smaller, or raise the server's \
         max_allowed_packet"
    )]
    PayloadTooLarge {
        /// The job's place among those given, from 1.
        job: usize,
        /// The payload's size as JSON text.
        bytes: usize,
        /// The server's `max_allowed_packet`.
        limit: u64,
    },

    /// A value that does not fit the Rust type it is read into or written from: a job's payload
    /// and its [`JobArgs`](crate::JobArgs) type, a claimed row and the struct it is read as.
    /// `field` names where it did not fit (a column, a payload field, `.` for the whole value);
    /// serde's own error is kept as the source.
    #[error("{what}: {}{source}", describe_field_path(field))]
    Shape {
        /// What was read or written, and as what: `the payload of job 7 (kind "welcome") does
        /// not read as Welcome`, `row 3 of emails does not read as Email`.
        what: String,
        /// The path to what did not fit (`to`, `items[2].sku`), or `.` for the value itself.
        field: String,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },

    /// The claim token no longer holds (some of) these rows: their lease expired and another
    /// claimer took them, or they were completed, failed, released or cancelled already. Nothing
    /// was changed.
    #[error("lease lost: token {token} no longer holds {}", describe_ids(.ids))]
    LeaseLost {
        /// The token that was used.
        token: String,
        /// The rows it no longer holds (empty when the token held no rows at all).
        ids: Vec<RowId>,
    },

    /// A `NOWAIT` locking read found a row locked by another transaction.
    #[error("row is locked by another transaction (NOWAIT)")]
    Locked,

    /// The SQLite file is not there and this connection may not create it
    /// ([`ConnectOptions::sqlite_create_if_missing`](crate::ConnectOptions)), or it cannot be
    /// created because its directory does not exist.
    #[error("{}", describe_missing_file(.path, *.directory_missing))]
    NoSqliteFile {
        /// The file, as the URL named it.
        path: std::path::PathBuf,
        /// Whether the directory it would go in is missing too.
        directory_missing: bool,
    },

    /// The database URL is not one rowclaim understands.
    #[error(
        "unsupported database URL {0:?}: use postgres://, mysql:// (also MariaDB) or sqlite://"
    )]
    InvalidUrl(String),

    /// The database could not be reached when connecting: the server is down, the address is
    /// wrong, or it refused the login.
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        /// What was dialled, e.g. `PostgreSQL at 127.0.0.1:5432` (never a password).
        endpoint: String,
        /// What the driver reported.
        source: DatabaseError,
    },

    /// The connection broke while a commit was under way, so whether it took effect is unknown.
    /// Look before doing it again (for an enqueue: `rowclaim jobs list`), or rely on unique keys.
    #[error("the connection was lost while {what} was being committed: it may or may not have taken effect ({source})")]
    OutcomeUnknown {
        /// What was being committed, e.g. `"the enqueue of 5000 jobs"`.
        what: String,
        /// What the driver reported.
        source: DatabaseError,
    },

    /// rowclaim's own tables for `what` are not in this database yet, or are older than this
    /// rowclaim: `rowclaim init` ([`crate::Queue::init`]) creates or migrates them.
    #[error("{what} {}: run `rowclaim init` (it creates or migrates rowclaim's tables){}", if *.older { "is older than this rowclaim" } else { "is not set up in this database yet, or is older than this rowclaim" }, .source.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
    NotInitialised {
        /// What is missing: `the managed queue`, `the schedules`.
        what: &'static str,
        /// Its tables exist but lack a column of a later version.
        older: bool,
        /// The database's own error, when it said what is missing.
        source: Option<DatabaseError>,
    },

    /// A worker stopped because the database stayed unreachable for longer than its
    /// `give_up_after` setting.
    #[error("gave up: the database has been unreachable for {} (the last error: {last})", humantime::format_duration(*.lasted))]
    GaveUp {
        /// How long the outage had lasted.
        lasted: Duration,
        /// The last error seen, as text.
        last: String,
    },

    /// A worker's handler could not run at all (for `rowclaim work`: the command could not be
    /// started), so the worker stopped; the row it was given went back.
    #[error("{0}")]
    HandlerAborted(String),

    /// rowclaim broke one of its own rules (a bug): please report it with this message.
    #[error("internal error (a bug in rowclaim, please report it): {0}")]
    Internal(String),

    /// An error from the database driver that rowclaim did not handle (after retrying transient
    /// ones: deadlocks, lock-wait timeouts, serialization failures, SQLite busy).
    #[error("database error: {0}")]
    Database(#[source] DatabaseError),
}

/// What kind of failure an [`Error`] is: what a caller may do about it. Database errors are
/// sorted by the driver that raised them (each knows its server's codes); the retry of transient
/// errors, the worker's outage handling and the command's exit codes all go by this.
///
/// Exhaustive on purpose: a new kind is a breaking change, so that every `match` on it (the
/// `rowclaim` command's exit codes among them) decides what to do about it before it compiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Input to fix before running again: a name that is not an identifier, a missing column, a
    /// strategy the server cannot do, a bad URL, a zero lease, …
    BadInput,
    /// A table rowclaim needs does not exist: the source's table, or the managed queue's before
    /// `init`.
    MissingTable,
    /// The token no longer holds the rows; nothing was changed.
    LeaseLost,
    /// A `NOWAIT` locking read found a row locked by another transaction.
    LockConflict,
    /// Worth running again at once: a deadlock, a lock-wait timeout, a serialization failure,
    /// SQLite busy (rowclaim retries these itself before reporting one).
    Transient,
    /// The server could not be reached or the connection broke: worth retrying later.
    ConnectionGone,
    /// The connection broke while a commit was under way; look before doing it again.
    OutcomeUnknown,
    /// A worker stopped: it gave up on an outage, or its handler could not run.
    Stopped,
    /// rowclaim's own tables (the managed queue's, the schedules') are missing or older than
    /// this rowclaim: run `rowclaim init`.
    NotInitialised,
    /// The database refused a statement for want of a privilege: a configuration error, not an
    /// outage (workers stop rather than retry it; the `rowclaim` command exits 2).
    PermissionDenied,
    /// A bug in rowclaim.
    Internal,
    /// Any other database error.
    Other,
}

fn database_kind(e: &DatabaseError) -> ErrorKind {
    match e.db_kind() {
        Some(DbKind::Transient | DbKind::LockWait) => ErrorKind::Transient,
        Some(DbKind::LockConflict) => ErrorKind::LockConflict,
        Some(DbKind::MissingTable) => ErrorKind::MissingTable,
        Some(DbKind::ConnectionGone | DbKind::ReadOnly) => ErrorKind::ConnectionGone,
        Some(DbKind::PermissionDenied) => ErrorKind::PermissionDenied,
        Some(DbKind::MissingColumn) | None => ErrorKind::Other,
    }
}

impl Error {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidIdentifier { .. }
            | Error::MissingColumn { .. }
            | Error::WrongColumnType { .. }
            | Error::IdNotUnique { .. }
            | Error::UnsupportedStrategy { .. }
            | Error::Unsupported(_)
            | Error::InvalidInput(_)
            | Error::MappingDisagrees { .. }
            | Error::PayloadTooLarge { .. }
            | Error::Shape { .. }
            | Error::InvalidSchedule { .. }
            | Error::InvalidUrl(_)
            | Error::NoSqliteFile { .. } => ErrorKind::BadInput,
            Error::MissingTable { .. } => ErrorKind::MissingTable,
            Error::LeaseLost { .. } => ErrorKind::LeaseLost,
            Error::Locked => ErrorKind::LockConflict,
            Error::Connect { .. } => ErrorKind::ConnectionGone,
            Error::OutcomeUnknown { .. } => ErrorKind::OutcomeUnknown,
            Error::NotInitialised { .. } => ErrorKind::NotInitialised,
            Error::GaveUp { .. } | Error::HandlerAborted(_) => ErrorKind::Stopped,
            Error::Internal(_) => ErrorKind::Internal,
            Error::MissingPrivilege { .. } => ErrorKind::PermissionDenied,
            Error::Database(e) => database_kind(e),
        }
    }

    /// What the driver says a database error means, if this is one.
    pub(crate) fn db_kind(&self) -> Option<DbKind> {
        match self {
            Error::Database(e) => e.db_kind(),
            _ => None,
        }
    }

    /// Whether this error means the database could not be reached or the connection broke (as
    /// opposed to the database refusing a statement). Such errors are worth retrying later: the
    /// worker runtime treats them as an outage and waits them out.
    pub fn is_connection(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::OutcomeUnknown { .. } | Error::GaveUp { .. } => true,
            Error::Database(e) => e.connection_broke(),
            _ => false,
        }
    }
}

impl Error {
    /// Whether the server could not be reached at all (refused, no answer, the connection cut,
    /// the server starting up or shutting down): an outage, which may end, as opposed to a
    /// wrong URL, login or certificate, which will not.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Connect { source, .. } => match source.sqlx() {
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => true,
                sqlx::Error::Database(_) => source.connection_broke(),
                _ => false,
            },
            _ => false,
        }
    }
}

fn describe_field(field: &str, value: &str, problem: &str) -> String {
    if value.is_empty() {
        format!("{field}: {problem}")
    } else {
        format!("{field} {value:?} {problem}")
    }
}

/// `field: ` before serde's message, or nothing when what did not fit is the whole value (serde
/// then names the field itself: "missing field `to`").
fn describe_field_path(field: &str) -> String {
    if field.is_empty() || field == "." {
        String::new()
    } else {
        format!("{field}: ")
    }
}

fn describe_missing_file(path: &std::path::Path, directory_missing: bool) -> String {
    match path.parent().filter(|_| directory_missing) {
        Some(dir) => format!(
            "cannot create the SQLite database {}: its directory {} does not exist",
            path.display(),
            dir.display()
        ),
        None => format!("no SQLite database at {}", path.display()),
    }
}

fn describe_ids(ids: &[RowId]) -> String {
    if ids.is_empty() {
        return "any rows".to_owned();
    }
    let shown: Vec<String> = ids.iter().take(10).map(ToString::to_string).collect();
    let more = if ids.len() > 10 {
        format!(" and {} more", ids.len() - 10)
    } else {
        String::new()
    };
    format!("row(s) {}{more}", shown.join(", "))
}

impl From<crate::strategy::UnknownStrategy> for Error {
    fn from(e: crate::strategy::UnknownStrategy) -> Error {
        Error::InvalidInput(e.to_string())
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::database::describe;
    use super::*;

    /// Sorted as a driver that knows no server code of its own would sort it.
    fn plain(e: sqlx::Error) -> DatabaseError {
        DatabaseError::sorted(e, |_| (None, None))
    }

    #[test]
    fn connection_errors_are_told_apart() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(plain(refused).connection_broke());
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(Error::Database(plain(refused)).is_connection());
        assert!(!Error::InvalidInput("x".into()).is_connection());
        assert!(!plain(sqlx::Error::RowNotFound).connection_broke());
        assert!(!plain(sqlx::Error::PoolTimedOut).may_have_happened());
    }

    #[test]
    fn messages_say_it_once() {
        let e = Error::Database(plain(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        ))));
        assert_eq!(e.to_string(), "database error: connection reset by peer");
        let protocol = sqlx::Error::Protocol(
            "unexpected response from SSLRequest: 0x00 (sqlx_postgres::connection::tls:95)".into(),
        );
        assert_eq!(
            describe(&protocol),
            "unexpected response from SSLRequest: 0x00"
        );
        let gave_up = Error::GaveUp {
            lasted: Duration::from_secs(600),
            last: "refused".into(),
        };
        assert!(gave_up.to_string().contains("10m"), "{gave_up}");
        let missing = Error::NotInitialised {
            what: "the managed queue",
            older: false,
            source: None,
        };
        assert_eq!(missing.kind(), ErrorKind::NotInitialised);
        assert!(missing
            .to_string()
            .starts_with("the managed queue is not set up in this database yet"));
    }
}
