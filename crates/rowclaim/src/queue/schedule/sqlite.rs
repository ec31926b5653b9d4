//! Schedules on SQLite: the `schedules` schema component and every statement of the scheduler.
//! Ticks are `INTEGER` epoch milliseconds, as every time rowclaim keeps here. SQLite has one
//! writer at a time, so the compare-and-set runs in a write transaction (`BEGIN IMMEDIATE`)
//! and racing schedulers take turns.

use super::{Definition, Firing, Row, ScheduleStore};
use crate::backend::sqlite::{Lite, NOW};
use crate::queue::Enqueued;
use crate::Result;

/// The schedules' schema, one list of statements per version. Append, never edit.
const MIGRATIONS: &[&[&str]] = &[&["CREATE TABLE IF NOT EXISTS rowclaim_schedules (
        name TEXT PRIMARY KEY,
        queue TEXT NOT NULL,
        kind TEXT NOT NULL,
        expression TEXT NOT NULL,
        zone TEXT,
        catch_up TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        next_tick INTEGER NOT NULL,
        last_tick INTEGER,
        last_job INTEGER,
        updated_at INTEGER NOT NULL)"]];

impl ScheduleStore for Lite {
    async fn init_schedules(&self) -> Result<()> {
        crate::queue::sqlite::migrate(self, "schedules", MIGRATIONS).await
    }

    async fn schedule_now(&self) -> Result<i64> {
        let sql = format!("SELECT {NOW}");
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(crate::backend::sqlite::error)?)
    }

    async fn schedule_rows(&self) -> Result<Vec<Row>> {
        Ok(sqlx::query_as(
            "SELECT name, queue, kind, expression, zone, catch_up, fingerprint, next_tick, \
             last_tick, last_job FROM rowclaim_schedules ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(crate::backend::sqlite::error)?)
    }

    async fn insert_schedule(&self, d: &Definition<'_>, next_ms: i64) -> Result<()> {
        let sql = format!(
            "INSERT INTO rowclaim_schedules \
             (name, queue, kind, expression, zone, catch_up, fingerprint, next_tick, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, {NOW}) ON CONFLICT (name) DO NOTHING"
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
            .map_err(crate::backend::sqlite::error)?;
        Ok(())
    }

    async fn redefine_schedule(&self, d: &Definition<'_>, next_ms: Option<i64>) -> Result<()> {
        let sql = format!(
            "UPDATE rowclaim_schedules SET queue = ?, kind = ?, expression = ?, zone = ?, \
             catch_up = ?, fingerprint = ?, next_tick = COALESCE(?, next_tick), \
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
            .map_err(crate::backend::sqlite::error)?;
        Ok(())
    }

    async fn fire(&self, f: &Firing<'_>) -> Result<Option<Vec<Enqueued>>> {
        let mut tx = self.write().await?;
        let last = f.jobs.last().map(|(t, _)| *t);
        let sql = format!(
            "UPDATE rowclaim_schedules SET next_tick = ?, last_tick = COALESCE(?, last_tick), \
             updated_at = {NOW} WHERE name = ? AND next_tick = ? AND fingerprint = ?"
        );
        let won = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(f.next)
            .bind(last)
            .bind(f.name)
            .bind(f.seen_next)
            .bind(f.fingerprint)
            .execute(&mut *tx)
            .await
            .map_err(crate::backend::sqlite::error)?
            .rows_affected()
            == 1;
        if !won {
            tx.rollback().await.map_err(crate::backend::sqlite::error)?;
            return Ok(None);
        }
        let mut out = Vec::with_capacity(f.jobs.len());
        for (_, job) in &f.jobs {
            out.push(crate::queue::sqlite::enqueue_one(&mut tx, &job.parts()).await?);
        }
        if let Some(e) = out.last() {
            sqlx::query("UPDATE rowclaim_schedules SET last_job = ? WHERE name = ?")
                .bind(e.id)
                .bind(f.name)
                .execute(&mut *tx)
                .await
                .map_err(crate::backend::sqlite::error)?;
        }
        crate::backend::commit(
            tx,
            || format!("the tick of schedule {}", f.name),
            crate::backend::sqlite::sorted,
        )
        .await?;
        Ok(Some(out))
    }

    async fn forget_schedule(&self, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM rowclaim_schedules WHERE name = ?")
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(crate::backend::sqlite::error)?;
        Ok(done.rows_affected() > 0)
    }
}
