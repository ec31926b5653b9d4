//! The one error type of the library.

use crate::RowId;

/// Everything that can go wrong in rowclaim.
///
/// Match on the variants that call for different handling — [`Error::LeaseLost`] (another claimer
/// owns the row now: drop your result), [`Error::Locked`] (a `NOWAIT` read hit a locked row) — and
/// report the rest. Input errors ([`Error::InvalidIdentifier`], [`Error::MissingColumn`], …) are
/// raised before anything is written.
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
    /// claimer took them, or they were completed, failed or released already. Nothing was changed.
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

    /// An error from the database driver that rowclaim did not handle (after retrying transient
    /// ones: deadlocks, lock-wait timeouts, serialization failures, SQLite busy).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
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
