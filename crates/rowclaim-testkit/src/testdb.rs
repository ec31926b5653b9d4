//! Test databases: a fresh database (PostgreSQL, MariaDB/MySQL) or file (SQLite) per test,
//! dropped afterwards, even when the test panics.
//!
//! Servers come from `ROWCLAIM_TEST_POSTGRES` and `ROWCLAIM_TEST_MYSQL` (admin URLs; `scripts/test`
//! sets them and starts the servers when they are missing). Each test creates a database with a
//! unique name on them, so tests run in parallel and a failed one leaves nothing others could see.
//!
//! A new backend proves itself by a driver in the library, a [`Backend`] variant here (with how
//! [`TestDb::new`] makes a database on it), and one `contract_suite!` invocation in
//! `crates/rowclaim/tests/contract.rs` (see [`crate::contract`]).

use std::future::Future;
use std::sync::Arc;

use sqlx::{MySqlPool, PgPool, Row, SqlitePool};

/// The database a test runs on. Tests match on it only for SQL dialect (how to write a
/// timestamp, concatenate text, qualify a table name); what a server *can do* is asked of the
/// server ([`TestDb::server`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL, on the server `ROWCLAIM_TEST_POSTGRES` names.
    Postgres,
    /// MariaDB or MySQL, on the server `ROWCLAIM_TEST_MYSQL` names.
    MySql,
    /// SQLite, a file in a temp dir of the test's own.
    Sqlite,
}

/// How the library reaches a test's database (the test's own raw SQL always goes direct).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Straight to the server.
    Direct,
    /// PostgreSQL only: through a PgBouncer of the test's own in transaction pooling mode
    /// ([`crate::pgbouncer`]), with `pgbouncer=true` in [`TestDb::url`].
    PgBouncer,
}

/// One test's own database. Tests reach it two ways: through the library ([`TestDb::db`]), as a
/// process of the user's would, and by raw SQL ([`TestDb::exec`], [`TestDb::count`], …) to set
/// up tables and check what the library wrote, behind its back.
pub struct TestDb {
    /// Which kind of server the database is on.
    pub backend: Backend,
    /// URL of this test's own database.
    pub url: String,
    /// The test database's name (PostgreSQL, MySQL).
    pub name: String,
    /// Admin URL of the server, to drop the database afterwards (None for SQLite).
    admin: Option<String>,
    /// SQLite's temp dir; removed when the TestDb is dropped.
    _dir: Option<tempfile::TempDir>,
    /// A pool of the test's own for raw SQL, apart from any pool the library opens.
    raw: Raw,
    /// The PgBouncer [`TestDb::url`] goes through ([`Via::PgBouncer`]); stopped when dropped.
    pub pooler: Option<crate::pgbouncer::PgBouncer>,
}

enum Raw {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

fn pg_admin() -> String {
    std::env::var("ROWCLAIM_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn my_admin() -> String {
    std::env::var("ROWCLAIM_TEST_MYSQL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// `scheme://auth@host:port/db?query` with `db` replaced.
fn with_database(admin: &str, db: &str) -> String {
    let (base, query) = match admin.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (admin, String::new()),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let root = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    format!("{root}/{db}{query}")
}

impl TestDb {
    /// A fresh database on the machine's shared server of `backend` (a file for SQLite).
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Postgres => TestDb::on(backend, &pg_admin()).await,
            Backend::MySql => TestDb::on(backend, &my_admin()).await,
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("test.db").display());
                let db = rowclaim::Db::connect(&url).await.expect("create sqlite db");
                drop(db);
                let raw = Raw::Lite(SqlitePool::connect(&url).await.expect("open sqlite db"));
                TestDb {
                    backend,
                    url,
                    name: String::new(),
                    admin: None,
                    _dir: Some(dir),
                    raw,
                    pooler: None,
                }
            }
        }
    }

    /// A fresh database on the PostgreSQL or MariaDB/MySQL server that `admin` (a URL of a user
    /// allowed to create databases) reaches: the shared one, or a test's private server.
    pub async fn on(backend: Backend, admin: &str) -> TestDb {
        let name = format!("rowclaim_t_{}", uuid::Uuid::now_v7().simple());
        let create = sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"));
        let url = with_database(admin, &name);
        let raw = match backend {
            Backend::Postgres => {
                let a = PgPool::connect(admin)
                    .await
                    .expect("connect to PostgreSQL (see scripts/test)");
                sqlx::query(create)
                    .execute(&a)
                    .await
                    .expect("create test database");
                // A database that cannot be reached is dropped before the test fails: no
                // TestDb exists yet to drop it.
                let pool = PgPool::connect(&url).await;
                if pool.is_err() {
                    let _ = sqlx::query(drop_sql(backend, &name)).execute(&a).await;
                }
                a.close().await;
                Raw::Pg(pool.expect("connect test db"))
            }
            Backend::MySql => {
                let a = MySqlPool::connect(admin)
                    .await
                    .expect("connect to MariaDB/MySQL (see scripts/test)");
                sqlx::query(create)
                    .execute(&a)
                    .await
                    .expect("create test database");
                let pool = MySqlPool::connect(&url).await;
                if pool.is_err() {
                    let _ = sqlx::query(drop_sql(backend, &name)).execute(&a).await;
                }
                a.close().await;
                Raw::My(pool.expect("connect test db"))
            }
            Backend::Sqlite => panic!("SQLite databases are files: use TestDb::new"),
        };
        TestDb {
            backend,
            url,
            name,
            admin: Some(admin.to_owned()),
            _dir: None,
            raw,
            pooler: None,
        }
    }

    /// A fresh database of `backend`, reached by the library `via` a route (see [`Via`]).
    pub async fn new_via(backend: Backend, via: Via) -> TestDb {
        // The pooler first: a test that fails to start it (PgBouncer missing) leaves no
        // database behind.
        let bouncer = match via {
            Via::PgBouncer => {
                assert_eq!(backend, Backend::Postgres, "PgBouncer is for PostgreSQL");
                let opts: sqlx::postgres::PgConnectOptions = pg_admin()
                    .parse()
                    .unwrap_or_else(|e| panic!("ROWCLAIM_TEST_POSTGRES: {e}"));
                Some(crate::pgbouncer::PgBouncer::start(opts.get_host(), opts.get_port()).await)
            }
            Via::Direct => None,
        };
        let mut t = TestDb::new(backend).await;
        if let Some(bouncer) = bouncer {
            t.url = bouncer.url(&t.name);
            t.pooler = Some(bouncer);
        }
        t
    }

    /// The URL of this database straight on its server, whatever [`TestDb::url`] goes through.
    pub fn direct_url(&self) -> String {
        match &self.admin {
            Some(admin) => with_database(admin, &self.name),
            None => self.url.clone(),
        }
    }

    /// A new pool of its own (separate connections), as another process would have.
    pub async fn db(&self) -> rowclaim::Db {
        let opts = rowclaim::ConnectOptions::default().max_connections(3);
        rowclaim::Db::connect_with(&self.url, opts)
            .await
            .expect("connect")
    }

    /// What the server can do, as the library sees it: ask this ([`rowclaim::ServerInfo::supports`])
    /// rather than matching on [`TestDb::backend`] when a test depends on a capability.
    pub async fn server(&self) -> rowclaim::ServerInfo {
        self.db()
            .await
            .server()
            .await
            .unwrap_or_else(|e| panic!("ask the {:?} server what it is: {e}", self.backend))
    }

    /// Runs raw SQL (test setup only).
    pub async fn exec(&self, sql: &str) {
        let q = sqlx::AssertSqlSafe(sql.to_owned());
        match &self.raw {
            Raw::Pg(p) => sqlx::raw_sql(q).execute(p).await.map(|_| ()),
            Raw::My(p) => sqlx::raw_sql(q).execute(p).await.map(|_| ()),
            Raw::Lite(p) => sqlx::raw_sql(q).execute(p).await.map(|_| ()),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Runs raw SQL on one connection; on an error, rolls back what the SQL left open on it
    /// (a `BEGIN` its failing statement never reached the end of) and answers the error's text.
    pub async fn try_exec(&self, sql: &str) -> Result<(), String> {
        async fn on<DB: sqlx::Database>(p: &sqlx::Pool<DB>, sql: &str) -> Result<(), String>
        where
            for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
        {
            let mut c = p.acquire().await.map_err(|e| e.to_string())?;
            let q = sqlx::AssertSqlSafe(sql.to_owned());
            let r = sqlx::raw_sql(q).execute(&mut *c).await.map(|_| ());
            if let Err(e) = r {
                let _ = sqlx::raw_sql(sqlx::AssertSqlSafe("ROLLBACK".to_owned()))
                    .execute(&mut *c)
                    .await;
                return Err(e.to_string());
            }
            Ok(())
        }
        match &self.raw {
            Raw::Pg(p) => on(p, sql).await,
            Raw::My(p) => on(p, sql).await,
            Raw::Lite(p) => on(p, sql).await,
        }
    }

    /// The first column of every row, as text (cast it in the SQL where needed).
    pub async fn strings(&self, sql: &str) -> Vec<Option<String>> {
        let q = sqlx::AssertSqlSafe(sql.to_owned());
        let r: Result<Vec<Option<String>>, sqlx::Error> = match &self.raw {
            Raw::Pg(p) => sqlx::query(q)
                .fetch_all(p)
                .await
                .and_then(|rows| rows.iter().map(|r| r.try_get(0)).collect()),
            Raw::My(p) => sqlx::query(q)
                .fetch_all(p)
                .await
                .and_then(|rows| rows.iter().map(|r| r.try_get(0)).collect()),
            Raw::Lite(p) => sqlx::query(q)
                .fetch_all(p)
                .await
                .and_then(|rows| rows.iter().map(|r| r.try_get(0)).collect()),
        };
        r.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The single integer `sql` returns (a `COUNT(*)` and the like).
    pub async fn count(&self, sql: &str) -> i64 {
        self.try_count_err(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// [`TestDb::count`], or None when the server cannot answer (during a fault).
    pub async fn try_count(&self, sql: &str) -> Option<i64> {
        self.try_count_err(sql).await.ok()
    }

    async fn try_count_err(&self, sql: &str) -> Result<i64, sqlx::Error> {
        let q = sqlx::AssertSqlSafe(sql.to_owned());
        match &self.raw {
            Raw::Pg(p) => sqlx::query_scalar::<_, i64>(q).fetch_one(p).await,
            Raw::My(p) => sqlx::query_scalar::<_, i64>(q).fetch_one(p).await,
            Raw::Lite(p) => sqlx::query_scalar::<_, i64>(q).fetch_one(p).await,
        }
    }

    /// The SQL type of a lease column on this backend.
    pub fn lease_type(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "timestamptz",
            Backend::MySql => "DATETIME(6)",
            Backend::Sqlite => "INTEGER",
        }
    }

    /// Creates `jobs` with every optional column and `n` ready rows (id 1..=n).
    pub async fn jobs(&self, n: i64) {
        self.jobs_table("jobs", n).await;
    }

    /// Creates a table like [`TestDb::jobs`] under another name.
    pub async fn jobs_table(&self, table: &str, n: i64) {
        self.exec(&format!(
            "CREATE TABLE {table} (
                id BIGINT PRIMARY KEY,
                status VARCHAR(20) NOT NULL,
                owner VARCHAR(64) NULL,
                lease_until {} NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                priority INTEGER NOT NULL DEFAULT 0,
                payload TEXT NULL)",
            self.lease_type()
        ))
        .await;
        self.exec(&format!("CREATE INDEX {table}_status ON {table} (status)"))
            .await;
        self.insert_rows(table, 1, n).await;
    }

    /// Adds ready rows `from..=to` to `jobs`, made as [`TestDb::jobs`] makes them.
    pub async fn insert_jobs(&self, from: i64, to: i64) {
        self.insert_rows("jobs", from, to).await;
    }

    /// Inserts in chunks of 500: one statement per row is slow, and one for a big table too long a statement.
    /// Priorities are scattered (`i * 7919 % 13`) so that ordering by priority is a real test.
    async fn insert_rows(&self, table: &str, from: i64, to: i64) {
        let mut id = from;
        while id <= to {
            let end = (id + 499).min(to);
            let values: Vec<String> = (id..=end)
                .map(|i| format!("({i}, 'ready', {}, 'job {i}')", (i * 7919) % 13))
                .collect();
            self.exec(&format!(
                "INSERT INTO {table} (id, status, priority, payload) VALUES {}",
                values.join(", ")
            ))
            .await;
            id = end + 1;
        }
    }

    /// Closes the raw pool and drops the database (SQLite's file goes with the temp dir). Not
    /// `Drop`: dropping a database is async, and a failure is only reported, never a panic,
    /// so that it cannot hide the test's own outcome.
    async fn cleanup(&self) {
        match &self.raw {
            Raw::Pg(p) => p.close().await,
            Raw::My(p) => p.close().await,
            Raw::Lite(p) => p.close().await,
        }
        let Some(admin) = &self.admin else { return };
        let sql = drop_sql(self.backend, &self.name);
        let result = match self.backend {
            Backend::Postgres => match PgPool::connect(admin).await {
                Ok(a) => sqlx::query(sql).execute(&a).await.map(|_| ()),
                Err(e) => Err(e),
            },
            _ => match MySqlPool::connect(admin).await {
                Ok(a) => sqlx::query(sql).execute(&a).await.map(|_| ()),
                Err(e) => Err(e),
            },
        };
        if let Err(e) = result {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

/// Drops the test database `name` (on PostgreSQL also while connections are still open).
fn drop_sql(backend: Backend, name: &str) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(match backend {
        Backend::Postgres => format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        _ => format!("DROP DATABASE IF EXISTS {name}"),
    })
}

/// Runs `test` on a fresh database of `backend`, then drops the database (also after a panic).
///
/// The test runs as a task of its own so that its panic is caught here, the database dropped,
/// and the panic then resumed: the test fails with its own message and leaves nothing behind.
pub async fn with_db<F, Fut>(backend: Backend, test: F)
where
    F: FnOnce(Arc<TestDb>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    with_db_via(backend, Via::Direct, test).await
}

/// [`with_db`], the library reaching the database `via` a route (see [`Via`]).
pub async fn with_db_via<F, Fut>(backend: Backend, via: Via, test: F)
where
    F: FnOnce(Arc<TestDb>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let t = Arc::new(TestDb::new_via(backend, via).await);
    let outcome = tokio::spawn(test(t.clone())).await;
    t.cleanup().await;
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(p) => std::panic::resume_unwind(p),
            Err(e) => panic!("test task failed: {e}"),
        }
    }
}
