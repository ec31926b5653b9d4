//! A database driver's error as rowclaim keeps it: the driver's own error, what it means to
//! rowclaim (sorted by the driver that raised it, which knows its server's codes) and its text in
//! one line.

/// An error the database driver reported, sorted by the driver that raised it: what it means to
/// rowclaim ([`Error::kind`](super::Error::kind)) and its text in one line, with the server's
/// own code.
#[derive(Debug)]
pub struct DatabaseError {
    source: sqlx::Error,
    kind: Option<DbKind>,
    text: String,
}

impl DatabaseError {
    /// `e` as a driver sorts it: `server` says what one of its server's errors means and how to
    /// word it (each driver knows its server's codes); the errors of a connection itself (a
    /// broken socket, a pool that ran dry) mean the same for every driver.
    pub(crate) fn sorted(
        e: sqlx::Error,
        server: impl Fn(&dyn sqlx::error::DatabaseError) -> (Option<DbKind>, Option<String>),
    ) -> DatabaseError {
        let (kind, text) = match &e {
            sqlx::Error::Database(db) => {
                let (kind, text) = server(db.as_ref());
                let text = text.unwrap_or_else(|| match db.code() {
                    Some(code) => format!("{} (code {code})", db.message()),
                    None => db.message().to_owned(),
                });
                (kind, text)
            }
            _ => (kind_of(&e, |_| None), describe(&e)),
        };
        DatabaseError {
            source: e,
            kind,
            text,
        }
    }

    /// What the driver reported.
    pub fn sqlx(&self) -> &sqlx::Error {
        &self.source
    }

    /// What it means to rowclaim, as its driver sorted it.
    pub(crate) fn db_kind(&self) -> Option<DbKind> {
        self.kind
    }

    /// Whether the connection broke or could not be had: the server is down or restarting, the
    /// network cut it, an administrator killed the session, or the pool ran dry.
    pub(crate) fn connection_broke(&self) -> bool {
        matches!(self.kind, Some(DbKind::ConnectionGone | DbKind::ReadOnly))
    }

    /// Whether a statement that failed so may nevertheless have been carried out: it was sent,
    /// and the connection broke before the answer came.
    pub(crate) fn may_have_happened(&self) -> bool {
        matches!(
            self.source,
            sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed
        )
    }
}

/// What `e` means to rowclaim: its server's errors as `server` (the driver's) sorts them, and
/// the errors of a connection itself alike for every driver.
pub(crate) fn kind_of(
    e: &sqlx::Error,
    server: impl Fn(&dyn sqlx::error::DatabaseError) -> Option<DbKind>,
) -> Option<DbKind> {
    match e {
        sqlx::Error::Database(db) => server(db.as_ref()),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Some(DbKind::ConnectionGone),
        _ => None,
    }
}

impl std::fmt::Display for DatabaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for DatabaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
/// What a server's error code means to rowclaim, as the driver that raised it sorts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DbKind {
    /// Deadlock, lock-wait timeout, serialization failure, SQLite busy: worth running again.
    Transient,
    /// A `NOWAIT` lock found the row locked.
    LockConflict,
    /// A statement waited for another transaction's lock until it gave up (SQLite busy after
    /// its busy timeout): the database answers, someone else holds the lock. Not an outage, and
    /// not worth running again at once: the wait was long already.
    LockWait,
    /// The statement named a table that does not exist.
    MissingTable,
    /// The statement named a column that does not exist (a table of an older schema).
    MissingColumn,
    /// The server or session went away (shutdown, killed session, idle timeout).
    ConnectionGone,
    /// The server takes no writes (a standby, or after a failover the old primary): like a lost
    /// connection, worth retrying once the writable server is reached.
    ReadOnly,
    /// The user lacks a privilege the statement needs (or, on SQLite, may not write the file).
    PermissionDenied,
}

/// A driver error that is not the server's in one line, without sqlx's prefixes (the server's
/// errors its driver words, [`DatabaseError::sorted`]).
pub(super) fn describe(e: &sqlx::Error) -> String {
    match e {
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

/// A driver error that comes before any driver (a URL sqlx could not read), in one line.
pub(crate) fn describe_plain(e: &sqlx::Error) -> String {
    describe(e)
}
