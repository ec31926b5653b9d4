//! Schedules on MySQL/MariaDB: the `schedules` schema component and every statement of the
//! scheduler. Ticks are `DATETIME(6)` holding UTC, handed over as epoch milliseconds and
//! converted by calendar arithmetic from the epoch (no session time zone is involved, and the
//! compare-and-set compares exactly).

use super::{Definition, Firing, Row, ScheduleStore};
use crate::backend::mysql::{My, NOW};
use crate::queue::Enqueued;
use crate::{Error, Result};

/// The named lock `rowclaim init` runs under (the jobs' migrations take it too).
const INIT_LOCK: &str = "rowclaim_init";

const INIT_LOCK_WAIT_SECS: i64 = 60;

/// The schedules' migrations: entry `i` brings the component from version `i` to `i + 1`. MySQL
/// commits DDL at once, so each must be safe to run again.
const MIGRATIONS: &[&str] = &["CREATE TABLE IF NOT EXISTS rowclaim_schedules (
    name VARCHAR(100) NOT NULL PRIMARY KEY,
    queue VARCHAR(255) NOT NULL,
    kind VARCHAR(255) NOT NULL,
    expression VARCHAR(255) NOT NULL,
    zone VARCHAR(64) NULL,
    catch_up VARCHAR(16) NOT NULL,
    fingerprint VARCHAR(32) NOT NULL,
    next_tick DATETIME(6) NOT NULL,
    last_tick DATETIME(6) NULL,
    last_job BIGINT NULL,
    updated_at DATETIME(6) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"];

/// Epoch milliseconds (a bound value) as a UTC `DATETIME(6)`.
const AT: &str = "TIMESTAMPADD(MICROSECOND, ? * 1000, TIMESTAMP '1970-01-01 00:00:00')";

/// A UTC `DATETIME(6)` as epoch milliseconds.
fn ms(expr: &str) -> String {
    format!(
        "CAST(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', {expr}) DIV 1000 \
         AS SIGNED)"
    )
}

impl ScheduleStore for My {
    async fn init_schedules(&self) -> Result<()> {
        // On a Galera cluster the named lock is one node's only, and a step that collides with
        // another node's fails its certification (1213): every step is idempotent, so the whole
        // init runs again.
        crate::backend::retry_transient!(self.init_schedules_once().await)
    }

    async fn schedule_now(&self) -> Result<i64> {
        let sql = format!("SELECT {}", ms(NOW));
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await?)
    }

    async fn schedule_rows(&self) -> Result<Vec<Row>> {
        let text = |c: &str| format!("CAST({c} AS CHAR)");
        let sql = format!(
            "SELECT {}, {}, {}, {}, {}, {}, {}, {}, {}, last_job FROM rowclaim_schedules \
             ORDER BY name",
            text("name"),
            text("queue"),
            text("kind"),
            text("expression"),
            text("zone"),
            text("catch_up"),
            text("fingerprint"),
            ms("next_tick"),
            ms("last_tick"),
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?)
    }

    async fn insert_schedule(&self, d: &Definition<'_>, next_ms: i64) -> Result<()> {
        // `name = name` changes nothing: a schedule of this name stored already stays as it is.
        let sql = format!(
            "INSERT INTO rowclaim_schedules \
             (name, queue, kind, expression, zone, catch_up, fingerprint, next_tick, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, {AT}, {NOW}) ON DUPLICATE KEY UPDATE name = name"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(d.name)
            .bind(d.queue)
            .bind(d.kind)
            .bind(d.expression)
            .bind(d.zone)
            .bind(d.catch_up)
            .bind(d.fingerprint)
            .bind(next_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn redefine_schedule(&self, d: &Definition<'_>, next_ms: Option<i64>) -> Result<()> {
        let sql = format!(
            "UPDATE rowclaim_schedules SET queue = ?, kind = ?, expression = ?, zone = ?, \
             catch_up = ?, fingerprint = ?, next_tick = COALESCE({AT}, next_tick), \
             updated_at = {NOW} WHERE name = ?"
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(d.queue)
            .bind(d.kind)
            .bind(d.expression)
            .bind(d.zone)
            .bind(d.catch_up)
            .bind(d.fingerprint)
            .bind(next_ms)
            .bind(d.name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn fire(&self, f: &Firing<'_>) -> Result<Option<Vec<Enqueued>>> {
        let mut tx = self.begin().await?;
        // The compare-and-set: the first of racing schedulers locks the row and matches; the
        // others wait for its lock, then read the row as committed (READ COMMITTED) and match
        // nothing. sqlx counts matched rows (CLIENT_FOUND_ROWS).
        let last = f.jobs.last().map(|(t, _)| *t);
        let sql = format!(
            "UPDATE rowclaim_schedules SET next_tick = {AT}, last_tick = COALESCE({AT}, last_tick), \
             updated_at = {NOW} WHERE name = ? AND next_tick = {AT} AND fingerprint = ?"
        );
        let won = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(f.next)
            .bind(last)
            .bind(f.name)
            .bind(f.seen_next)
            .bind(f.fingerprint)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        if !won {
            tx.rollback().await?;
            return Ok(None);
        }
        let mut out = Vec::with_capacity(f.jobs.len());
        for (_, job) in &f.jobs {
            out.push(crate::queue::mysql::enqueue_one(&mut tx, &job.parts()).await?);
        }
        if let Some(e) = out.last() {
            sqlx::query("UPDATE rowclaim_schedules SET last_job = ? WHERE name = ?")
                .bind(e.id)
                .bind(f.name)
                .execute(&mut *tx)
                .await?;
        }
        crate::backend::commit(tx, || format!("the tick of schedule {}", f.name)).await?;
        Ok(Some(out))
    }

    async fn forget_schedule(&self, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM rowclaim_schedules WHERE name = ?")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

impl My {
    /// One try of `init_schedules`: the migrations under the init lock, all on one connection
    /// (a named lock is its session's). Should this be dropped halfway, the connection is
    /// closed instead of going back to the pool holding the lock.
    async fn init_schedules_once(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        conn.close_on_drop();
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(INIT_LOCK)
            .bind(INIT_LOCK_WAIT_SECS)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(Error::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "could not take the lock {INIT_LOCK} within {INIT_LOCK_WAIT_SECS} s: \
                     another `rowclaim init` is still running"
                ),
            ))));
        }
        let migrated = migrate(&mut conn).await;
        if let Err(e) = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(INIT_LOCK)
            .execute(&mut *conn)
            .await
        {
            tracing::debug!(error = %e, "releasing {INIT_LOCK} failed");
        }
        migrated
    }
}

/// Runs the migrations above the recorded version, recording each as it is done.
async fn migrate(conn: &mut sqlx::MySqlConnection) -> Result<()> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS rowclaim_schema (
            component VARCHAR(64) PRIMARY KEY,
            version INT NOT NULL
        )",
    )
    .execute(&mut *conn)
    .await?;
    let version: Option<i32> =
        sqlx::query_scalar("SELECT version FROM rowclaim_schema WHERE component = 'schedules'")
            .fetch_optional(&mut *conn)
            .await?;
    let version = usize::try_from(version.unwrap_or(0)).unwrap_or(0);
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
        sqlx::query(*sql).execute(&mut *conn).await?;
        let to = i as i64 + 1;
        // Never backwards: a slower init must not undo a later one's record.
        sqlx::query(
            "INSERT INTO rowclaim_schema (component, version) VALUES ('schedules', ?) \
             ON DUPLICATE KEY UPDATE version = GREATEST(version, ?)",
        )
        .bind(to)
        .bind(to)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}
