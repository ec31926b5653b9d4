//! `rowclaim bench drain --plain`: the yardstick. The minimum SQL a hand-written queue runs to
//! claim rows and finish them, with sqlx directly and no rowclaim, so that the library's figures
//! can be read against what the server itself allows. All of it is in this file.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rowclaim::RowId;
use sqlx::pool::PoolConnection;
use sqlx::{Acquire, AssertSqlSafe};

use crate::error::{BenchError, Context, Result};
use crate::setup::{self, Raw, PLAIN_TABLE};
use crate::{lock, Outcome};

/// PostgreSQL: exactly /work/shared/bench-baseline/claim100_delete.sql (bound, prepared).
const PG_CLAIM: &str = "WITH c AS (SELECT id FROM rowclaim_plain WHERE status = 'ready' \
     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED), \
     u AS (UPDATE rowclaim_plain j SET status = 'running' FROM c WHERE j.id = c.id RETURNING j.id) \
     SELECT id FROM u";
const PG_DELETE: &str = "DELETE FROM rowclaim_plain WHERE id = ANY($1)";

/// MariaDB / MySQL: in one transaction, then the DELETE on its own.
const MY_SELECT: &str = "SELECT id FROM rowclaim_plain WHERE status = 'ready' \
     ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED";
const MY_UPDATE: &str = "UPDATE rowclaim_plain SET status = 'running' WHERE id IN";
const MY_DELETE: &str = "DELETE FROM rowclaim_plain WHERE id IN";

/// SQLite: one statement (SQLite has one writer at a time; nothing to skip).
const LITE_CLAIM: &str = "UPDATE rowclaim_plain SET status = 'running' WHERE id IN \
     (SELECT id FROM rowclaim_plain WHERE status = 'ready' ORDER BY id LIMIT ?) RETURNING id";
const LITE_DELETE: &str = "DELETE FROM rowclaim_plain WHERE id IN";

/// Creates `rowclaim_plain` with `rows` ready rows.
pub(crate) async fn create(
    url: &str,
    rows: u64,
    bar: &ProgressBar,
    stats: setup::Stats,
) -> Result<()> {
    let raw = Raw::setup(url).await?;
    setup::create_plain_table(&raw, rows, bar, stats).await?;
    raw.close().await;
    Ok(())
}

/// Rows still in `rowclaim_plain` (finished rows are deleted: none should be).
pub(crate) async fn left(url: &str) -> Result<u64> {
    let raw = Raw::connect(url, 1).await?;
    let n = raw
        .int(format!("SELECT COUNT(*) FROM {PLAIN_TABLE}"))
        .await?;
    raw.close().await;
    Ok(u64::try_from(n).unwrap_or(0))
}

#[derive(Default)]
struct Tally {
    seen: std::sync::Mutex<HashMap<RowId, u32>>,
    latencies: std::sync::Mutex<Vec<Duration>>,
}

impl Tally {
    fn record(&self, took: Duration, ids: &[i64]) {
        lock(&self.latencies).push(took);
        let mut seen = lock(&self.seen);
        for id in ids {
            *seen.entry(RowId::Int(*id)).or_default() += 1;
        }
    }
}

/// `loops` loops, each on a connection of its own, claim `batch` rows and delete them until a
/// claim comes back empty.
pub(crate) async fn drain(url: &str, loops: u32, batch: u32, bar: &ProgressBar) -> Result<Outcome> {
    let raw = Raw::connect(url, loops).await?;
    let tally = Arc::new(Tally::default());
    let n = i64::from(batch);
    // Open every connection before the clock starts.
    let mut tasks = Vec::new();
    macro_rules! spawn_loops {
        ($pool:expr, $body:ident) => {{
            let mut conns = Vec::new();
            for _ in 0..loops {
                conns.push($pool.acquire().await.context("opening a connection")?);
            }
            let started = Instant::now();
            for conn in conns {
                let (tally, bar) = (tally.clone(), bar.clone());
                tasks.push(tokio::spawn(
                    async move { $body(conn, n, &tally, &bar).await },
                ));
            }
            started
        }};
    }
    let started = match &raw {
        Raw::Pg(p) => spawn_loops!(p, pg_loop),
        Raw::My(p) => spawn_loops!(p, my_loop),
        Raw::Lite(p) => spawn_loops!(p, lite_loop),
    };
    for t in tasks {
        t.await.context("a plain-client loop panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    raw.close().await;
    let seen = std::mem::take(&mut *lock(&tally.seen));
    let latencies = std::mem::take(&mut *lock(&tally.latencies));
    Ok(Outcome {
        strategy: "minimum SQL".into(),
        seconds,
        latencies,
        seen,
    })
}

/// Runs `$op` (an expression that is evaluated anew each time) again after a deadlock, lock-wait
/// timeout, serialization failure or SQLite busy, as any hand-written queue must.
///
/// The plain client claims without rowclaim, but asks the library which errors are transient:
/// each of its drivers knows its server's codes (`$sort`: the driver's sorting of its errors).
macro_rules! retry {
    ($sort:path, $op:expr) => {{
        let mut tries = 0u32;
        loop {
            match $op.map_err(|e| rowclaim::Error::Database($sort(e))) {
                Ok(v) => break Ok::<_, BenchError>(v),
                Err(e) if tries < 20 && e.kind() == rowclaim::ErrorKind::Transient => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(u64::from(tries) * 2)).await;
                }
                Err(e) => break Err(e).context("plain client"),
            }
        }
    }};
}

async fn pg_loop(
    mut conn: PoolConnection<sqlx::Postgres>,
    n: i64,
    tally: &Tally,
    bar: &ProgressBar,
) -> Result<()> {
    loop {
        let t = Instant::now();
        let ids: Vec<i64> = retry!(
            rowclaim::DatabaseError::postgres,
            sqlx::query_scalar(PG_CLAIM)
                .bind(n)
                .fetch_all(&mut *conn)
                .await
        )?;
        let took = t.elapsed();
        if ids.is_empty() {
            return Ok(());
        }
        tally.record(took, &ids);
        retry!(
            rowclaim::DatabaseError::postgres,
            sqlx::query(PG_DELETE)
                .bind(&ids[..])
                .execute(&mut *conn)
                .await
        )?;
        bar.inc(ids.len() as u64);
    }
}

/// The MariaDB / MySQL claim: one transaction of the locking read and the UPDATE.
async fn my_claim(conn: &mut sqlx::MySqlConnection, n: i64) -> Result<Vec<i64>, sqlx::Error> {
    let mut tx = conn.begin().await?;
    let ids: Vec<i64> = sqlx::query_scalar(MY_SELECT)
        .bind(n)
        .fetch_all(&mut *tx)
        .await?;
    if !ids.is_empty() {
        bind_ids(MY_UPDATE, &ids).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(ids)
}

async fn my_loop(
    mut conn: PoolConnection<sqlx::MySql>,
    n: i64,
    tally: &Tally,
    bar: &ProgressBar,
) -> Result<()> {
    loop {
        let t = Instant::now();
        let ids = retry!(rowclaim::DatabaseError::mysql, my_claim(&mut conn, n).await)?;
        let took = t.elapsed();
        if ids.is_empty() {
            return Ok(());
        }
        tally.record(took, &ids);
        retry!(
            rowclaim::DatabaseError::mysql,
            bind_ids(MY_DELETE, &ids).execute(&mut *conn).await
        )?;
        bar.inc(ids.len() as u64);
    }
}

async fn lite_loop(
    mut conn: PoolConnection<sqlx::Sqlite>,
    n: i64,
    tally: &Tally,
    bar: &ProgressBar,
) -> Result<()> {
    loop {
        let t = Instant::now();
        let ids: Vec<i64> = retry!(
            rowclaim::DatabaseError::sqlite,
            sqlx::query_scalar(LITE_CLAIM)
                .bind(n)
                .fetch_all(&mut *conn)
                .await
        )?;
        let took = t.elapsed();
        if ids.is_empty() {
            return Ok(());
        }
        tally.record(took, &ids);
        retry!(
            rowclaim::DatabaseError::sqlite,
            bind_ids(LITE_DELETE, &ids).execute(&mut *conn).await
        )?;
        bar.inc(ids.len() as u64);
    }
}

/// `{prefix} (?, ?, …)` with the ids bound (one prepared statement per list length).
fn bind_ids<DB>(prefix: &str, ids: &[i64]) -> sqlx::query::Query<'static, DB, DB::Arguments>
where
    DB: sqlx::Database,
    i64: for<'a> sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let marks = vec!["?"; ids.len()].join(", ");
    let mut q = sqlx::query(AssertSqlSafe(format!("{prefix} ({marks})")));
    for id in ids {
        q = q.bind(*id);
    }
    q
}
