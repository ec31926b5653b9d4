//! The SQL the bench writes itself, per backend, all in one place: its tables, bulk fills with
//! set-based SQL (no row-by-row inserts), and statistics for the planner afterwards.
//!
//! Numbers formatted into this SQL are integers the bench computed; no text from outside is.

use std::str::FromStr;
use std::time::Duration;

use indicatif::ProgressBar;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions};

use crate::error::{Context, Result};

/// The table `drain`, `scale` and `contention` claim from through the library.
pub(crate) const BENCH_TABLE: &str = "rowclaim_bench";
/// The table of `drain --plain`.
pub(crate) const PLAIN_TABLE: &str = "rowclaim_plain";

/// Rows per INSERT of a bulk fill (the progress bar moves by this much).
const CHUNK: u64 = 200_000;

/// The planner's statistics when a drain starts (`--stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stats {
    /// Gathered after the fill (PostgreSQL: VACUUM ANALYZE, then a CHECKPOINT).
    #[default]
    Fresh,
    /// Whatever the table had before the fill (PostgreSQL: only a CHECKPOINT after it).
    Stale,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Postgres,
    MySql,
    Sqlite,
}

/// The backend a URL points at.
pub(crate) fn kind(url: &str) -> Result<Kind> {
    match url.split(':').next().unwrap_or_default() {
        "postgres" | "postgresql" => Ok(Kind::Postgres),
        "mysql" | "mariadb" => Ok(Kind::MySql),
        "sqlite" => Ok(Kind::Sqlite),
        _ => Err(crate::error::bad(format!(
            "--database {:?}: unknown scheme; use postgres://, mysql:// (or mariadb://) or \
             sqlite://",
            rowclaim::redacted_url(url)
        ))),
    }
}

/// A plain sqlx pool, for what the library does not do (and for the plain client).
pub(crate) enum Raw {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

impl Raw {
    /// A pool of at most `max` connections. SQLite opens as the library does: created if missing,
    /// WAL, synchronous NORMAL, a 10 s busy timeout.
    pub(crate) async fn connect(url: &str, max: u32) -> Result<Raw> {
        Raw::open(url, max, false).await
    }

    /// Two connections for making tables and bulk fills, without sqlx's slow-statement warnings
    /// (a fill of 200,000 rows is slow by design).
    ///
    /// SQLite gets one: a connection that sat idle while another dropped and remade a table parses
    /// `CREATE INDEX` against its cached schema and fails with "index … already exists" (SQLite
    /// checks the schema's version only when a statement runs, not while it is parsed).
    pub(crate) async fn setup(url: &str) -> Result<Raw> {
        let max = if kind(url)? == Kind::Sqlite { 1 } else { 2 };
        Raw::open(url, max, true).await
    }

    async fn open(url: &str, max: u32, quiet: bool) -> Result<Raw> {
        fn hush<O: ConnectOptions>(o: O, quiet: bool) -> O {
            if quiet {
                o.disable_statement_logging()
            } else {
                o
            }
        }
        let raw = match kind(url)? {
            Kind::Postgres => {
                // Through a transaction-mode pooler (pgbouncer=true, which is rowclaim's and not
                // sqlx's), the raw connection sends only simple queries (`exec`, `int`), and no
                // startup parameter PgBouncer would refuse.
                let (url, pooled) = without_pgbouncer(url);
                let mut options = PgConnectOptions::from_str(&url)?;
                if pooled {
                    options = options.extra_float_digits(None);
                }
                Raw::Pg(
                    PgPoolOptions::new()
                        .max_connections(max)
                        .connect_with(hush(options, quiet))
                        .await?,
                )
            }
            Kind::MySql => {
                let url = url.replacen("mariadb:", "mysql:", 1);
                Raw::My(
                    MySqlPoolOptions::new()
                        .max_connections(max)
                        .connect_with(hush(MySqlConnectOptions::from_str(&url)?, quiet))
                        .await?,
                )
            }
            Kind::Sqlite => {
                let options = SqliteConnectOptions::from_str(url)?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
                    .busy_timeout(Duration::from_secs(10));
                Raw::Lite(
                    SqlitePoolOptions::new()
                        .max_connections(max)
                        .connect_with(hush(options, quiet))
                        .await?,
                )
            }
        };
        Ok(raw)
    }

    pub(crate) fn kind(&self) -> Kind {
        match self {
            Raw::Pg(_) => Kind::Postgres,
            Raw::My(_) => Kind::MySql,
            Raw::Lite(_) => Kind::Sqlite,
        }
    }

    /// Runs SQL (several statements allowed, except around PostgreSQL's VACUUM).
    pub(crate) async fn exec(&self, sql: impl Into<String>) -> Result<()> {
        let sql: String = sql.into();
        let q = sqlx::raw_sql(AssertSqlSafe(sql.clone()));
        match self {
            Raw::Pg(p) => q.execute(p).await.map(|_| ()),
            Raw::My(p) => q.execute(p).await.map(|_| ()),
            Raw::Lite(p) => q.execute(p).await.map(|_| ()),
        }
        .with_context(|| format!("running {}", first_line(&sql)))
    }

    /// Removes `table`'s record from rowclaim's source registry: the bench makes the table anew
    /// and claims it with each strategy in turn, which a record of the last run would refuse.
    pub(crate) async fn forget_mapping(&self, table: &str) {
        let sql = format!(
            "DELETE FROM rowclaim_sources WHERE source = '{table}' OR source LIKE '%.{table}'"
        );
        // Fails only where no claim has made the registry yet: then there is nothing to forget.
        if let Err(e) = self.exec(sql).await {
            tracing::debug!("no source record to forget for {table}: {e:#}");
        }
    }

    /// The single integer `sql` returns.
    pub(crate) async fn int(&self, sql: impl Into<String>) -> Result<i64> {
        let sql: String = sql.into();
        let q = AssertSqlSafe(sql.clone());
        match self {
            // A simple query: it passes a transaction-mode pooler.
            Raw::Pg(p) => sqlx::raw_sql(q)
                .fetch_one(p)
                .await
                .and_then(|row| sqlx::Row::try_get::<i64, _>(&row, 0)),
            Raw::My(p) => sqlx::query_scalar::<_, i64>(q).fetch_one(p).await,
            Raw::Lite(p) => sqlx::query_scalar::<_, i64>(q).fetch_one(p).await,
        }
        .with_context(|| format!("running {}", first_line(&sql)))
    }

    pub(crate) async fn close(self) {
        match self {
            Raw::Pg(p) => p.close().await,
            Raw::My(p) => p.close().await,
            Raw::Lite(p) => p.close().await,
        }
    }

    /// Statistics for the planner after a bulk fill (PostgreSQL also vacuums, so that index-only
    /// scans see an all-visible table).
    /// PostgreSQL then checkpoints (when the role may), as the yardstick script does: otherwise a
    /// checkpoint falls inside the run and every page the run touches first writes a full image of
    /// itself to the WAL.
    pub(crate) async fn analyze(&self, table: &str) -> Result<()> {
        self.settle(table, Stats::Fresh).await
    }

    /// After a bulk fill: [`Raw::analyze`] for [`Stats::Fresh`]; for [`Stats::Stale`] only
    /// PostgreSQL's checkpoint, so that the planner runs on whatever statistics the table had
    /// (none, for a table just made), as right after an application's own enqueue.
    pub(crate) async fn settle(&self, table: &str, stats: Stats) -> Result<()> {
        if stats == Stats::Stale {
            if self.kind() == Kind::Postgres && self.exec("CHECKPOINT".to_owned()).await.is_err() {
                tracing::debug!("CHECKPOINT not allowed for this role; the run may include one");
            }
            return Ok(());
        }
        self.exec(match self.kind() {
            Kind::Postgres => format!("VACUUM ANALYZE {table}"),
            Kind::MySql => format!("ANALYZE TABLE {table}"),
            Kind::Sqlite => format!("ANALYZE {table}"),
        })
        .await?;
        if self.kind() == Kind::Postgres && self.exec("CHECKPOINT".to_owned()).await.is_err() {
            tracing::debug!("CHECKPOINT not allowed for this role; the run may include one");
        }
        Ok(())
    }

    /// A subquery `n` of one column `i`: the integers `from..=to`. `seq`: MariaDB's sequence
    /// engine is there.
    fn numbers(&self, from: u64, to: u64, seq: bool) -> String {
        match self.kind() {
            Kind::Postgres => format!("generate_series({from}::bigint, {to}::bigint) AS n(i)"),
            Kind::Sqlite => format!(
                "(WITH RECURSIVE r(i) AS (SELECT {from} UNION ALL SELECT i + 1 FROM r WHERE i < {to}) \
                 SELECT i FROM r) AS n"
            ),
            Kind::MySql if seq => format!("(SELECT seq AS i FROM seq_{from}_to_{to}) AS n"),
            Kind::MySql => {
                // MySQL: ten digits cross-joined once per decimal place (no recursion limit).
                let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL \
                     SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL \
                     SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                let (mut joins, mut terms, mut place) = (Vec::new(), Vec::new(), 1u64);
                while place <= to - from {
                    let k = joins.len();
                    joins.push(format!("{digits} AS d{k}"));
                    terms.push(format!("{place} * d{k}.d"));
                    place *= 10;
                }
                if joins.is_empty() {
                    return format!("(SELECT {from} AS i) AS n");
                }
                format!(
                    "(SELECT i FROM (SELECT {from} + {} AS i FROM {}) AS x WHERE i <= {to}) AS n",
                    terms.join(" + "),
                    joins.join(" CROSS JOIN ")
                )
            }
        }
    }

    /// A subquery `n` of one column `i`: the integers `from..=to` (MariaDB's sequence engine
    /// when it is there).
    pub(crate) async fn numbers_of(&self, from: u64, to: u64) -> String {
        let seq =
            self.kind() == Kind::MySql && self.int("SELECT COUNT(*) FROM seq_1_to_1").await.is_ok();
        self.numbers(from, to, seq)
    }

    /// Runs `insert(numbers)` for the numbers 1..=rows, a chunk at a time, moving `bar`.
    async fn fill_by_chunks(
        &self,
        rows: u64,
        bar: &ProgressBar,
        insert: impl Fn(&str) -> String,
    ) -> Result<()> {
        let seq =
            self.kind() == Kind::MySql && self.int("SELECT COUNT(*) FROM seq_1_to_1").await.is_ok();
        let mut from = 1;
        while from <= rows {
            let to = (from + CHUNK - 1).min(rows);
            self.exec(insert(&self.numbers(from, to, seq))).await?;
            bar.inc(to - from + 1);
            from = to + 1;
        }
        Ok(())
    }
}

/// `url` without rowclaim's `pgbouncer=true`, and whether it had it.
fn without_pgbouncer(url: &str) -> (String, bool) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), false);
    };
    let (ours, rest): (Vec<&str>, Vec<&str>) =
        query.split('&').partition(|p| p.starts_with("pgbouncer="));
    let pooled = ours.contains(&"pgbouncer=true");
    if rest.is_empty() {
        (base.to_owned(), pooled)
    } else {
        (format!("{base}?{}", rest.join("&")), pooled)
    }
}

fn first_line(sql: &str) -> String {
    let line = sql.trim().lines().next().unwrap_or_default();
    let mut s: String = line.chars().take(100).collect();
    if s.len() < sql.trim().len() {
        s.push('…');
    }
    s
}

/// (Re)creates `rowclaim_bench`: owner, lease and attempts columns (every strategy can run on it),
/// `rows` rows with ids 1..=rows, the first `done` of them done and the rest ready. The indexes a
/// real queue would have are built after the fill, then the planner gets statistics.
///
/// Indexes: PostgreSQL partial ones on the ready ids and on the owner of claimed rows; MariaDB /
/// MySQL (status, id) and (owner); SQLite (status, id) and (owner).
pub(crate) async fn create_bench_table(
    raw: &Raw,
    rows: u64,
    done: u64,
    bar: &ProgressBar,
    stats: Stats,
) -> Result<()> {
    let t = BENCH_TABLE;
    let (create, indexes) = match raw.kind() {
        Kind::Postgres => (
            format!(
                "CREATE TABLE {t} (id bigint PRIMARY KEY, status text NOT NULL, owner text, \
                 lease_until timestamptz, attempts int NOT NULL DEFAULT 0, \
                 payload jsonb NOT NULL DEFAULT '{{}}')"
            ),
            format!(
                "CREATE INDEX {t}_ready ON {t} (id) WHERE status = 'ready';
                 CREATE INDEX {t}_owner ON {t} (owner) WHERE status = 'claimed'"
            ),
        ),
        Kind::MySql => (
            format!(
                "CREATE TABLE {t} (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, \
                 owner VARCHAR(36), lease_until DATETIME(6), attempts INT NOT NULL DEFAULT 0, \
                 payload TEXT) ENGINE=InnoDB"
            ),
            format!("ALTER TABLE {t} ADD KEY {t}_ready (status, id), ADD KEY {t}_owner (owner)"),
        ),
        Kind::Sqlite => (
            format!(
                "CREATE TABLE {t} (id INTEGER PRIMARY KEY, status TEXT NOT NULL, owner TEXT, \
                 lease_until INTEGER, attempts INTEGER NOT NULL DEFAULT 0, payload TEXT)"
            ),
            format!(
                "CREATE INDEX {t}_ready ON {t} (status, id);
                 CREATE INDEX {t}_owner ON {t} (owner)"
            ),
        ),
    };
    raw.forget_mapping(t).await;
    raw.exec(format!("DROP TABLE IF EXISTS {t}")).await?;
    forget_leases(raw).await?;
    raw.exec(create).await?;
    raw.fill_by_chunks(rows, bar, |n| {
        format!(
            "INSERT INTO {t} (id, status) \
             SELECT n.i, CASE WHEN n.i <= {done} THEN 'done' ELSE 'ready' END FROM {n}"
        )
    })
    .await?;
    raw.exec(indexes).await?;
    raw.settle(t, stats).await
}

/// Deletes the lease-table strategy's leases on `rowclaim_bench` rows, if `rowclaim_leases`
/// exists. The table is made anew with the same ids, and a lease left from an earlier run (on
/// MariaDB/MySQL a lease won on a row that was finished meanwhile stays until it expires) would
/// keep a new ready row from being claimed.
async fn forget_leases(raw: &Raw) -> Result<()> {
    let exists = match raw.kind() {
        Kind::Postgres => {
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = current_schema() AND table_name = 'rowclaim_leases'"
        }
        Kind::MySql => {
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = 'rowclaim_leases'"
        }
        Kind::Sqlite => {
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'rowclaim_leases'"
        }
    };
    if raw.int(exists).await? > 0 {
        raw.exec(format!(
            "DELETE FROM rowclaim_leases WHERE source = '{BENCH_TABLE}' \
             OR source LIKE '%.{BENCH_TABLE}'"
        ))
        .await?;
    }
    Ok(())
}

/// (Re)creates `rowclaim_plain`, the table of a hand-written queue: id, status (default 'ready'),
/// payload, and an index over the ready rows (PostgreSQL and SQLite: partial on id; MariaDB /
/// MySQL: (status, id)). `rows` ready rows, ids 1..=rows.
pub(crate) async fn create_plain_table(
    raw: &Raw,
    rows: u64,
    bar: &ProgressBar,
    stats: Stats,
) -> Result<()> {
    let t = PLAIN_TABLE;
    let (create, index) = match raw.kind() {
        Kind::Postgres => (
            format!(
                "CREATE TABLE {t} (id bigint PRIMARY KEY, status text NOT NULL DEFAULT 'ready', \
                 payload jsonb NOT NULL DEFAULT '{{}}')"
            ),
            format!("CREATE INDEX {t}_ready ON {t} (id) WHERE status = 'ready'"),
        ),
        Kind::MySql => (
            format!(
                "CREATE TABLE {t} (id BIGINT PRIMARY KEY, \
                 status VARCHAR(16) NOT NULL DEFAULT 'ready', payload TEXT) ENGINE=InnoDB"
            ),
            format!("ALTER TABLE {t} ADD KEY {t}_ready (status, id)"),
        ),
        Kind::Sqlite => (
            format!(
                "CREATE TABLE {t} (id INTEGER PRIMARY KEY, \
                 status TEXT NOT NULL DEFAULT 'ready', payload TEXT NOT NULL DEFAULT '{{}}')"
            ),
            format!("CREATE INDEX {t}_ready ON {t} (id) WHERE status = 'ready'"),
        ),
    };
    raw.forget_mapping(t).await;
    raw.exec(format!("DROP TABLE IF EXISTS {t}")).await?;
    raw.exec(create).await?;
    raw.fill_by_chunks(rows, bar, |n| {
        format!("INSERT INTO {t} (id) SELECT n.i FROM {n}")
    })
    .await?;
    raw.exec(index).await?;
    raw.settle(t, stats).await
}

/// Deletes the jobs of the queue `bench`, then adds `rows` jobs to it with plain SQL (not the
/// library's enqueue: fast at millions): the first `done` completed an hour ago, the rest ready
/// since an hour ago. Ids ascend in that order, so the completed jobs come before the ready ones,
/// as in a queue that has been running for a while. The managed queue must exist (init).
pub(crate) async fn fill_queue(
    raw: &Raw,
    rows: u64,
    done: u64,
    bar: &ProgressBar,
    stats: Stats,
) -> Result<()> {
    let q = super::QUEUE;
    clear_queue(raw).await?;
    let kind = raw.kind();
    raw.fill_by_chunks(rows, bar, |n| {
        let is_done = format!("n.i <= {done}");
        match kind {
            Kind::Postgres => format!(
                "INSERT INTO rowclaim_jobs (queue, payload, status, run_at, attempts, finished_at) \
                 SELECT '{q}', '{{}}'::jsonb, CASE WHEN {is_done} THEN 'completed' ELSE 'ready' END, \
                 now() - interval '1 hour', CASE WHEN {is_done} THEN 1 ELSE 0 END, \
                 CASE WHEN {is_done} THEN now() - interval '1 hour' END \
                 FROM {n} ORDER BY n.i"
            ),
            Kind::MySql => format!(
                "INSERT INTO rowclaim_jobs \
                 (queue, payload, status, run_at, attempts, created_at, finished_at) \
                 SELECT '{q}', '{{}}', IF({is_done}, 'completed', 'ready'), \
                 UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, IF({is_done}, 1, 0), \
                 UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, \
                 IF({is_done}, UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, NULL) \
                 FROM {n} ORDER BY n.i"
            ),
            Kind::Sqlite => format!(
                "INSERT INTO rowclaim_jobs \
                 (queue, payload, status, run_at, attempts, created_at, finished_at) \
                 SELECT '{q}', '{{}}', CASE WHEN {is_done} THEN 'completed' ELSE 'ready' END, \
                 CAST(unixepoch('subsec') * 1000 AS INTEGER) - 3600000, \
                 CASE WHEN {is_done} THEN 1 ELSE 0 END, \
                 CAST(unixepoch('subsec') * 1000 AS INTEGER) - 3600000, \
                 CASE WHEN {is_done} THEN CAST(unixepoch('subsec') * 1000 AS INTEGER) - 3600000 END \
                 FROM {n} ORDER BY n.i"
            ),
        }
    })
    .await?;
    raw.settle("rowclaim_jobs", stats).await
}

/// Deletes the jobs of the queue `bench`.
pub(crate) async fn clear_queue(raw: &Raw) -> Result<()> {
    raw.exec(format!(
        "DELETE FROM rowclaim_jobs WHERE queue = '{}'",
        super::QUEUE
    ))
    .await
}

/// A transaction at REPEATABLE READ with its snapshot taken, held open until dropped: what a long
/// report beside the queue does. PostgreSQL cannot vacuum the rows deleted or updated after it
/// began, InnoDB cannot purge them, SQLite cannot reset its WAL.
#[allow(dead_code)] // the connection is held, never read
pub(crate) enum Snapshot {
    Pg(sqlx::PgConnection),
    My(sqlx::MySqlConnection),
    Lite(sqlx::SqliteConnection),
}

impl Snapshot {
    pub(crate) async fn take(url: &str) -> Result<Snapshot> {
        use sqlx::Connection;
        let held = match kind(url)? {
            Kind::Postgres => {
                let mut c = sqlx::PgConnection::connect(url).await?;
                sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
                    .execute(&mut c)
                    .await?;
                Snapshot::Pg(c)
            }
            Kind::MySql => {
                let url = url.replacen("mariadb:", "mysql:", 1);
                let mut c = sqlx::MySqlConnection::connect(&url).await?;
                sqlx::raw_sql(
                    "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
                     START TRANSACTION WITH CONSISTENT SNAPSHOT",
                )
                .execute(&mut c)
                .await?;
                Snapshot::My(c)
            }
            Kind::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(url).await?;
                sqlx::raw_sql("BEGIN; SELECT count(*) FROM sqlite_master")
                    .execute(&mut c)
                    .await?;
                Snapshot::Lite(c)
            }
        };
        Ok(held)
    }
}
