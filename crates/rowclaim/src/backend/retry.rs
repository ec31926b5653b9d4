//! Running a statement again when the database asks for it, and committing when the connection
//! may break under the commit.

use std::time::Duration;

use crate::error::{DbKind, Result};

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
pub(crate) fn is_transient(e: &crate::error::Error) -> bool {
    e.db_kind() == Some(DbKind::Transient)
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
