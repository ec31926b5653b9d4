//! The one error type of the library, and how database errors are sorted and described.

use std::time::Duration;

use crate::RowId;

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

    /// The strategy cannot run on this server or with this mapping.
    #[error("strategy {strategy} cannot be used here: {reason}")]
    UnsupportedStrategy {
        /// The strategy that was asked for.
        strategy: crate::Strategy,
        /// Why, and what would work instead.
        reason: String,
    },

    /// The operation is not available on this backend or with this mapping.
    #[error("{0}")]
    Unsupported(String),

    /// Any other bad input: a zero lease, a batch of 0, a malformed `ORDER BY`, a status value that
    /// does not fit the status column, …
    #[error("{0}")]
    InvalidInput(String),

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

    /// The database URL is not one rowclaim understands.
    #[error(
        "unsupported database URL {0:?}: use postgres://, mysql:// (also MariaDB) or sqlite://"
    )]
    InvalidUrl(String),

    /// The database could not be reached when connecting: the server is down, the address is
    /// wrong, or it refused the login.
    #[error("cannot connect to {endpoint}: {}", describe(.source))]
    Connect {
        /// What was dialled, e.g. `PostgreSQL at 127.0.0.1:5432` (never a password).
        endpoint: String,
        /// What the driver reported.
        source: sqlx::Error,
    },

    /// The connection broke while a commit was under way, so whether it took effect is unknown.
    /// Look before doing it again (for an enqueue: `rowclaim jobs list`), or rely on unique keys.
    #[error("the connection was lost while {what} was being committed: it may or may not have taken effect ({})", describe(.source))]
    OutcomeUnknown {
        /// What was being committed, e.g. `"the enqueue of 5000 jobs"`.
        what: String,
        /// What the driver reported.
        source: sqlx::Error,
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

    /// An error from the database driver that rowclaim did not handle (after retrying transient
    /// ones: deadlocks, lock-wait timeouts, serialization failures, SQLite busy).
    #[error("database error: {}", describe(.0))]
    Database(#[from] sqlx::Error),
}

impl Error {
    /// Whether this error means the database could not be reached or the connection broke (as
    /// opposed to the database refusing a statement). Such errors are worth retrying later: the
    /// worker runtime treats them as an outage and waits them out.
    pub fn is_connection(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::OutcomeUnknown { .. } | Error::GaveUp { .. } => true,
            Error::Database(e) => connection_broke(e),
            _ => false,
        }
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

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A driver error in one line, without sqlx's prefixes or PostgreSQL's source-file line
/// numbers, and with the database's own error code.
pub(crate) fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                let mut text = format!("{} (SQLSTATE {})", pg.message(), pg.code());
                if let Some(detail) = pg.detail() {
                    text.push_str(&format!("; {detail}"));
                }
                return text;
            }
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return format!("{} (error {})", my.message(), my.number());
            }
            match db.code() {
                Some(code) => format!("{} (code {code})", db.message()),
                None => db.message().to_owned(),
            }
        }
        sqlx::Error::Io(io) => io.to_string(),
        // sqlx ends these with where in its own source they were raised: "(sqlx_postgres::…:95)".
        sqlx::Error::Protocol(text) => match text.rfind(" (sqlx_") {
            Some(at) if text.ends_with(')') => text[..at].to_owned(),
            _ => text.clone(),
        },
        sqlx::Error::PoolTimedOut => "no connection could be opened or freed in time".into(),
        sqlx::Error::PoolClosed => "the connection pool was closed".into(),
        sqlx::Error::WorkerCrashed => "the connection's background worker stopped".into(),
        other => other.to_string(),
    }
}

/// Whether the connection broke or could not be had: the server is down or restarting, the
/// network cut it, an administrator killed the session, or the pool ran dry.
pub(crate) fn connection_broke(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                // 08xxx connection exceptions; 57P01 admin shutdown (also pg_terminate_backend),
                // 57P02 crash shutdown, 57P03 cannot connect now (starting up, shutting down),
                // 57P05 idle-session timeout, 25P03 idle-in-transaction timeout.
                let code = pg.code();
                return code.starts_with("08")
                    || matches!(code, "57P01" | "57P02" | "57P03" | "57P05" | "25P03");
            }
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                // 1053 server shutdown, 1927 connection killed, 2006/2013 server gone or lost,
                // 4031 disconnected for inactivity, 1040 too many connections.
                return matches!(my.number(), 1040 | 1053 | 1927 | 2006 | 2013 | 4031);
            }
            false
        }
        _ => false,
    }
}

/// Whether a statement that failed with `e` may nevertheless have been carried out: it was sent,
/// and the connection broke before the answer came.
pub(crate) fn may_have_happened(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_errors_are_told_apart() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(connection_broke(&refused));
        assert!(Error::Database(refused).is_connection());
        assert!(!Error::InvalidInput("x".into()).is_connection());
        let decode = sqlx::Error::RowNotFound;
        assert!(!connection_broke(&decode));
        assert!(!may_have_happened(&sqlx::Error::PoolTimedOut));
    }

    #[test]
    fn messages_say_it_once() {
        let e = Error::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        )));
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
    }
}
