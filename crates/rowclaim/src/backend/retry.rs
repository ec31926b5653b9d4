//! Running a statement again when the database asks for it, beginning a transaction that a
//! cancelled caller cannot leave half-begun, and committing when the connection may break under
//! the commit.

use std::time::Duration;

use crate::error::{DbKind, Result};

/// Runs `$op` again while it fails with a transient error (deadlock, lock-wait timeout,
/// serialization failure, SQLite busy), with a short growing pause; gives up after a while.
/// With `if $again`, only while that holds too (checked after each failure: an error that is
/// transient by kind but final for the caller, such as one from the caller's own input).
macro_rules! retry_transient {
    ($op:expr) => {
        $crate::backend::retry_transient!($op, if true)
    };
    ($op:expr, if $again:expr) => {{
        let mut attempt: u32 = 0;
        loop {
            match $op {
                Err(e) if $again && attempt < $crate::backend::MAX_RETRIES && $crate::backend::is_transient(&e) => {
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
pub(crate) fn is_transient(e: &crate::error::Error) -> bool {
    e.db_kind() == Some(DbKind::Transient)
}

/// Starts a transaction with `begin` on a task of its own, so that a caller that stops waiting
/// (a statement's time limit, a worker stopping) cannot cancel it halfway: sqlx counts a
/// transaction only once its BEGIN has answered, and a BEGIN cancelled after the server ran it
/// would leave the pooled connection inside a transaction nobody knows of, which every later
/// statement on it joins and nobody commits (seen on MariaDB after a SIGSTOP). A transaction
/// begun for a caller who left is dropped by the task, which rolls it back.
pub(crate) async fn begin_whole<DB, F>(begin: F) -> sqlx::Result<sqlx::Transaction<'static, DB>>
where
    DB: sqlx::Database,
    F: std::future::Future<Output = sqlx::Result<sqlx::Transaction<'static, DB>>> + Send + 'static,
{
    tokio::spawn(begin)
        .await
        .unwrap_or(Err(sqlx::Error::WorkerCrashed))
}

/// Commits `tx`. When the connection breaks while the COMMIT is under way, nobody knows whether it
/// took effect: that is [`crate::Error::OutcomeUnknown`], naming `what` was being committed, never
/// a plain failure that a caller would simply repeat.
pub(crate) async fn commit<DB: sqlx::Database>(
    tx: sqlx::Transaction<'_, DB>,
    what: impl FnOnce() -> String,
    sort: fn(sqlx::Error) -> crate::error::DatabaseError,
) -> Result<()> {
    tx.commit().await.map_err(|e| {
        let e = sort(e);
        if e.connection_broke() {
            crate::error::Error::OutcomeUnknown {
                what: what(),
                source: e,
            }
        } else {
            crate::error::Error::Database(e)
        }
    })
}
