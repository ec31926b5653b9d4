//! The SQL every driver runs, as snapshots (`insta`): for each database, strategy and mapping
//! shape, the statements of one claim of two rows, a complete of one of them and a release of
//! the other, recorded as they were sent to a real server. A change to any claim's SQL shows up
//! as a diff of `backend/snapshots/*.snap` in review; `cargo insta review` (or
//! `INSTA_UPDATE=always cargo test -p rowclaim --lib snapshots`) accepts it.
//!
//! PostgreSQL and MySQL/MariaDB come from `ROWCLAIM_TEST_POSTGRES` / `ROWCLAIM_TEST_MYSQL` (as for
//! the other tests; `scripts/test` sets them); each case makes and drops its own database.

use std::time::Duration;

use crate::backend::sql::RECORDED;
use crate::{Db, Source, Strategy};

/// What a case's table holds besides id and status.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// `id`, `status`: the least a source needs.
    StatusOnly,
    /// Owner, lease and attempts columns too.
    Full,
}

const STRATEGIES: [Strategy; 5] = [
    Strategy::SkipLocked,
    Strategy::Token,
    Strategy::Optimistic,
    Strategy::LeaseTable,
    Strategy::Transaction,
];

/// A database of its own for one case, dropped at the end.
struct Scratch {
    url: String,
    drop_sql: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

impl Scratch {
    async fn new(dialect: &str, case: &str) -> Scratch {
        let name = format!("rc_snap_{}_{}", case, std::process::id());
        match dialect {
            "sqlite" => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("t.db").display());
                Scratch {
                    url,
                    drop_sql: None,
                    _dir: Some(dir),
                }
            }
            "postgres" => {
                let admin = std::env::var("ROWCLAIM_TEST_POSTGRES")
                    .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
                Scratch::server(admin, name).await
            }
            _ => {
                let admin = std::env::var("ROWCLAIM_TEST_MYSQL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
                Scratch::server(admin, name).await
            }
        }
    }

    async fn server(admin: String, name: String) -> Scratch {
        let db = Db::connect(&admin).await.expect("admin connection");
        raw(&db, &format!("DROP DATABASE IF EXISTS {name}")).await;
        raw(&db, &format!("CREATE DATABASE {name}")).await;
        let (base, query) = match admin.split_once('?') {
            Some((b, q)) => (b.to_owned(), format!("?{q}")),
            None => (admin.clone(), String::new()),
        };
        let root = &base[..base.rfind('/').expect("URL with a database")];
        Scratch {
            url: format!("{root}/{name}{query}"),
            drop_sql: Some((admin, format!("DROP DATABASE IF EXISTS {name}"))),
            _dir: None,
        }
    }

    async fn drop(self) {
        if let Some((admin, sql)) = self.drop_sql {
            let db = Db::connect(&admin).await.expect("admin connection");
            raw(&db, &sql).await;
        }
    }
}

/// Runs setup SQL that takes no parameters.
async fn raw(db: &Db, sql: &str) {
    use crate::backend::Backend;
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    let done = match &db.backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres(d) => sqlx::raw_sql(sql).execute(d.exec()).await.map(|_| ()),
        #[cfg(feature = "mysql")]
        Backend::MySql(d) => sqlx::raw_sql(sql).execute(&d.pool).await.map(|_| ()),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite(d) => sqlx::raw_sql(sql).execute(&d.pool).await.map(|_| ()),
    };
    done.expect("setup statement");
}

fn table_sql(dialect: &str, shape: Shape) -> String {
    let (id, lease) = match dialect {
        "postgres" => ("bigserial PRIMARY KEY", "timestamptz"),
        "mysql" => ("BIGINT AUTO_INCREMENT PRIMARY KEY", "DATETIME(6)"),
        _ => ("INTEGER PRIMARY KEY", "INTEGER"),
    };
    let extra = match shape {
        Shape::StatusOnly => String::new(),
        Shape::Full => format!(", owner VARCHAR(64), lease_until {lease}, attempts INTEGER"),
    };
    format!("CREATE TABLE jobs (id {id}, status VARCHAR(20) NOT NULL{extra})")
}

/// The statements one claim, complete and release sent, or the error that refused them.
async fn record(dialect: &str, shape: Shape, strategy: Strategy) -> String {
    let case = format!("{dialect}_{shape:?}_{strategy}").replace('-', "_");
    let scratch = Scratch::new(dialect, &case.to_lowercase()).await;
    let db = Db::connect(&scratch.url).await.expect("connect");
    raw(&db, &table_sql(dialect, shape)).await;
    for _ in 0..3 {
        raw(&db, "INSERT INTO jobs (status) VALUES ('ready')").await;
    }
    let mut source = Source::new("jobs");
    if let Shape::Full = shape {
        source = source
            .owner_column("owner")
            .lease_column("lease_until")
            .attempts_column("attempts");
    }
    RECORDED.with(|r| *r.borrow_mut() = Some(Vec::new()));
    let outcome: crate::Result<()> = async {
        let claimer = db.claimer(source, strategy).await?;
        let claim = claimer.claim(2, Duration::from_secs(60)).await?;
        let ids: Vec<_> = claim.rows().iter().map(|r| r.id.clone()).collect();
        assert_eq!(ids.len(), 2, "{case}: two rows claimed");
        claim.complete(&ids[0]).await?;
        claim.release(&ids[1]).await?;
        Ok(())
    }
    .await;
    let statements = RECORDED.with(|r| r.borrow_mut().take()).unwrap_or_default();
    drop(db);
    scratch.drop().await;
    let mut text = statements.join(";\n\n");
    if let Err(e) = outcome {
        text.push_str(&format!("\n\n-- refused: {e}"));
    }
    text
}

async fn snapshot_dialect(dialect: &str) {
    for shape in [Shape::StatusOnly, Shape::Full] {
        for strategy in STRATEGIES {
            let text = record(dialect, shape, strategy).await;
            let name = format!("{dialect}__{shape:?}__{strategy}").to_lowercase();
            insta::assert_snapshot!(name, text);
        }
    }
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_sql() {
    snapshot_dialect("postgres").await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_sql() {
    snapshot_dialect("mysql").await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_sql() {
    snapshot_dialect("sqlite").await;
}
