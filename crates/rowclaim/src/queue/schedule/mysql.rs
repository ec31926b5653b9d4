//! Schedules on MySQL/MariaDB: the `schedules` schema component and every statement of the
//! scheduler. Ticks are `DATETIME(6)` holding UTC, handed over as epoch milliseconds and
//! converted by calendar arithmetic from the epoch (no session time zone is involved, and the
//! compare-and-set compares exactly).

use super::{Definition, Firing, Row, ScheduleStore};
use crate::backend::mysql::{My, Sql, NOW};
use crate::backend::sql::Dialect;
use crate::queue::Enqueued;
use crate::Result;

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

impl ScheduleStore for My {
    async fn init_schedules(&self) -> Result<()> {
        // On a Galera cluster the named lock is one node's only, and a step that collides with
        // another node's fails its certification (1213): every step is idempotent, so the whole
        // init runs again.
        crate::backend::retry_transient!(self.init_once("schedules", MIGRATIONS).await)
    }

    async fn schedule_now(&self) -> Result<i64> {
        let sql = format!("SELECT {}", Sql::epoch_ms(NOW));
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(crate::backend::mysql::error)?)
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
            Sql::epoch_ms("next_tick"),
            Sql::epoch_ms("last_tick"),
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(crate::backend::mysql::error)?)
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
            .await
            .map_err(crate::backend::mysql::error)?;
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
            .await
            .map_err(crate::backend::mysql::error)?;
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
            .await
            .map_err(crate::backend::mysql::error)?
            .rows_affected()
            == 1;
        if !won {
            tx.rollback().await.map_err(crate::backend::mysql::error)?;
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
                .await
                .map_err(crate::backend::mysql::error)?;
        }
        crate::backend::commit(
            tx,
            || format!("the tick of schedule {}", f.name),
            crate::backend::mysql::sorted,
        )
        .await?;
        Ok(Some(out))
    }

    async fn forget_schedule(&self, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM rowclaim_schedules WHERE name = ?")
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(crate::backend::mysql::error)?;
        Ok(done.rows_affected() > 0)
    }
}
