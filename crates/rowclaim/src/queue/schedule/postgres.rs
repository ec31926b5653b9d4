//! Schedules on PostgreSQL: the `schedules` schema component and every statement of the
//! scheduler. Ticks are `timestamptz`, handed over as epoch milliseconds (whole seconds, so
//! `to_timestamp` of them is exact and the compare-and-set compares exactly).

use super::{Definition, Firing, Row, ScheduleStore};
use crate::backend::postgres::Pg;
use crate::queue::Enqueued;
use crate::Result;

/// The schedules' schema, one list of statements per version. Append, never edit.
const MIGRATIONS: &[&[&str]] = &[&["CREATE TABLE IF NOT EXISTS rowclaim_schedules (
        name text PRIMARY KEY,
        queue text NOT NULL,
        kind text NOT NULL,
        expression text NOT NULL,
        zone text,
        catch_up text NOT NULL,
        fingerprint text NOT NULL,
        next_tick timestamptz NOT NULL,
        last_tick timestamptz,
        last_job bigint,
        updated_at timestamptz NOT NULL DEFAULT now())"]];

/// The columns of [`Row`], times as epoch milliseconds.
const ROW: &str = "name, queue, kind, expression, zone, catch_up, fingerprint, \
    round(extract(epoch FROM next_tick) * 1000)::int8, \
    round(extract(epoch FROM last_tick) * 1000)::int8, last_job";

impl ScheduleStore for Pg {
    async fn init_schedules(&self) -> Result<()> {
        // Under the jobs' init lock: concurrent inits take turns.
        crate::queue::postgres::migrate(self, "schedules", MIGRATIONS).await
    }

    async fn schedule_now(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT floor(extract(epoch FROM now()) * 1000)::int8")
                .fetch_one(self.exec())
                .await
                .map_err(crate::backend::postgres::error)?,
        )
    }

    async fn schedule_rows(&self) -> Result<Vec<Row>> {
        let sql = format!("SELECT {ROW} FROM rowclaim_schedules ORDER BY name");
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .fetch_all(self.exec())
            .await
            .map_err(crate::backend::postgres::error)?)
    }

    async fn insert_schedule(&self, d: &Definition<'_>, next_ms: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO rowclaim_schedules \
             (name, queue, kind, expression, zone, catch_up, fingerprint, next_tick) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, to_timestamp($8::float8 / 1000)) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(d.name)
        .bind(d.queue)
        .bind(d.kind)
        .bind(d.expression)
        .bind(d.zone)
        .bind(d.catch_up)
        .bind(d.fingerprint)
        .bind(next_ms)
        .execute(self.exec())
        .await
        .map_err(crate::backend::postgres::error)?;
        Ok(())
    }

    async fn redefine_schedule(&self, d: &Definition<'_>, next_ms: Option<i64>) -> Result<()> {
        sqlx::query(
            "UPDATE rowclaim_schedules SET queue = $2, kind = $3, expression = $4, zone = $5, \
             catch_up = $6, fingerprint = $7, \
             next_tick = COALESCE(to_timestamp($8::float8 / 1000), next_tick), updated_at = now() \
             WHERE name = $1",
        )
        .bind(d.name)
        .bind(d.queue)
        .bind(d.kind)
        .bind(d.expression)
        .bind(d.zone)
        .bind(d.catch_up)
        .bind(d.fingerprint)
        .bind(next_ms)
        .execute(self.exec())
        .await
        .map_err(crate::backend::postgres::error)?;
        Ok(())
    }

    async fn fire(&self, f: &Firing<'_>) -> Result<Option<Vec<Enqueued>>> {
        let mut tx = self.durable().await?;
        // The compare-and-set: of schedulers racing for this tick, the first update takes the
        // row's lock and matches; the others wait for it, then find the row moved on (READ
        // COMMITTED re-reads the row they waited for) and match nothing.
        let last = f.jobs.last().map(|(t, _)| *t);
        let won = sqlx::query(
            "UPDATE rowclaim_schedules SET next_tick = to_timestamp($1::float8 / 1000), \
             last_tick = COALESCE(to_timestamp($2::float8 / 1000), last_tick), updated_at = now() \
             WHERE name = $3 AND next_tick = to_timestamp($4::float8 / 1000) AND fingerprint = $5",
        )
        .bind(f.next)
        .bind(last)
        .bind(f.name)
        .bind(f.seen_next)
        .bind(f.fingerprint)
        .execute(self.on(&mut tx))
        .await
        .map_err(crate::backend::postgres::error)?
        .rows_affected()
            == 1;
        if !won {
            tx.rollback()
                .await
                .map_err(crate::backend::postgres::error)?;
            return Ok(None);
        }
        let keep = !self.route().pooled();
        let mut out = Vec::with_capacity(f.jobs.len());
        for (_, job) in &f.jobs {
            out.push(crate::queue::postgres::enqueue_one(&mut tx, &job.parts(), keep).await?);
        }
        if let Some(e) = out.last() {
            sqlx::query("UPDATE rowclaim_schedules SET last_job = $1 WHERE name = $2")
                .bind(e.id)
                .bind(f.name)
                .execute(self.on(&mut tx))
                .await
                .map_err(crate::backend::postgres::error)?;
        }
        crate::backend::commit(
            tx,
            || format!("the tick of schedule {}", f.name),
            crate::backend::postgres::sorted,
        )
        .await?;
        Ok(Some(out))
    }

    async fn forget_schedule(&self, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM rowclaim_schedules WHERE name = $1")
            .bind(name)
            .execute(self.exec())
            .await
            .map_err(crate::backend::postgres::error)?;
        Ok(done.rows_affected() > 0)
    }
}
