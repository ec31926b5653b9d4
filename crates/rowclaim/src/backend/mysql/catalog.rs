//! The catalog role on MySQL/MariaDB: the server, a table's columns and key, the lease and counter
//! tables.

use super::*;
use crate::backend::run::Run;

impl My {
    /// The server, asked through `r` the first time and remembered by every clone of this
    /// driver. A transaction asks through its own connection: through the pool, the connection
    /// it had just used may not be back yet, and the pool would open a second session for a
    /// one-shot command (`rowclaim enqueue`).
    pub(crate) async fn server_via<R: Run<Sql = Sql>>(&self, r: &R) -> Result<ServerInfo> {
        let info = self
            .server
            .get_or_try_init(|| async {
                let stmt = |sql: &str| Stmt::new(sql.to_owned(), Binder::new());
                let (v,): (String,) = r.fetch_one(stmt("SELECT CAST(VERSION() AS CHAR)")).await?;
                // `10.11.6-MariaDB-0+deb12u1` or `8.0.36`.
                let kind = if v.contains("MariaDB") {
                    ServerKind::MariaDb
                } else {
                    ServerKind::MySql
                };
                let info = ServerInfo::new(kind, &v);
                // Galera (MariaDB's multi-writer cluster) says so in `wsrep_on`; MySQL 8 has no
                // such variable, and a MariaDB built with wsrep but not in a cluster says OFF.
                let wsrep: Option<(String, String)> = r
                    .fetch_optional(stmt("SHOW VARIABLES LIKE 'wsrep_on'"))
                    .await?;
                Ok::<_, Error>(match wsrep {
                    Some((_, on)) if on.eq_ignore_ascii_case("ON") => info.galera_node(),
                    _ => info,
                })
            })
            .await?;
        Ok(info.clone())
    }
}

#[async_trait::async_trait]
impl Catalog for My {
    fn naming(&self) -> crate::mapping::Naming {
        once::naming(self)
    }

    async fn probe_filter(&self, m: &Mapping) -> Result<()> {
        once::probe_filter(self, m).await
    }

    async fn server(&self) -> Result<ServerInfo> {
        self.server_via(self).await
    }

    async fn columns(&self, table: &TableName) -> Result<Vec<Column>> {
        // MariaDB returns some information_schema columns as binary strings: cast them to text.
        let rows = sqlx::query(
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR), CAST(DATA_TYPE AS CHAR),
                    CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED)
             FROM information_schema.COLUMNS
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?
             ORDER BY ORDINAL_POSITION",
        )
        .bind(table.schema.clone())
        .bind(table.name.clone())
        .fetch_all(&self.pool)
        .await
        .map_err(error)?;
        rows.iter()
            .map(|r| {
                let data_type: String = r.try_get(2).map_err(error)?;
                let len: Option<i64> = r.try_get(3).map_err(error)?;
                let ty = match data_type.to_ascii_lowercase().as_str() {
                    "tinyint" | "smallint" | "mediumint" | "int" | "bigint" => ColType::Int,
                    "char" | "varchar" | "text" | "tinytext" | "mediumtext" | "longtext" => {
                        ColType::Text {
                            max_len: len.and_then(|l| u32::try_from(l).ok()),
                        }
                    }
                    "datetime" | "timestamp" => ColType::Timestamp,
                    _ => ColType::Other,
                };
                Ok(Column {
                    name: r.try_get(0).map_err(error)?,
                    sql_type: r.try_get(1).map_err(error)?,
                    ty,
                })
            })
            .collect()
    }

    async fn table_key(&self, table: &TableName) -> Result<String> {
        let key: Option<String> = sqlx::query_scalar(
            "SELECT CAST(CONCAT(TABLE_SCHEMA, '.', TABLE_NAME) AS CHAR) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
        )
        .bind(table.schema.clone())
        .bind(table.name.clone())
        .fetch_optional(&self.pool)
        .await.map_err(error)?;
        key.ok_or_else(|| Error::MissingTable {
            table: table.display.clone(),
        })
    }

    async fn id_unique(&self, table: &TableName, column: &str) -> Result<bool> {
        // A unique index of one column: NON_UNIQUE = 0, and no second column in it.
        let found: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.STATISTICS s \
             WHERE s.TABLE_SCHEMA = COALESCE(?, DATABASE()) AND s.TABLE_NAME = ? \
               AND s.NON_UNIQUE = 0 AND s.COLUMN_NAME = ? AND s.SEQ_IN_INDEX = 1 \
               AND NOT EXISTS (SELECT 1 FROM information_schema.STATISTICS o \
                 WHERE o.TABLE_SCHEMA = s.TABLE_SCHEMA AND o.TABLE_NAME = s.TABLE_NAME \
                   AND o.INDEX_NAME = s.INDEX_NAME AND o.SEQ_IN_INDEX > 1)",
        )
        .bind(table.schema.clone())
        .bind(table.name.clone())
        .bind(column.to_owned())
        .fetch_one(&self.pool)
        .await
        .map_err(error)?;
        Ok(found > 0)
    }

    async fn ensure_lease_table(&self) -> Result<()> {
        // On a Galera cluster DDL from several nodes at once can abort one another (1213).
        crate::backend::retry_transient!(self.create_lease_table().await)
    }

    async fn ensure_registry(&self) -> Result<()> {
        self.create_if_missing(CREATE_SOURCES, "rowclaim_sources")
            .await
    }

    async fn counter_next(&self, name: &str) -> Result<i64> {
        // `LAST_INSERT_ID(expr)` makes the statement report the new value as its insert id, for
        // a new counter and an existing one alike: no second round trip to read it.
        let next = || {
            sqlx::query(
                "INSERT INTO rowclaim_counters (name, value) VALUES (?, LAST_INSERT_ID(1)) \
                 ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1)",
            )
            .bind(name.to_owned())
        };
        let done = match next().execute(&self.pool).await {
            Err(e) if error_kind(&e) == Some(DbKind::MissingTable) => {
                if let Err(e) = sqlx::query(CREATE_COUNTERS).execute(&self.pool).await {
                    // A Galera node's DDL aborted by another node's (1213): the caller tries the
                    // whole call again. Otherwise another process made it first, and it is there.
                    if error_kind(&e) == Some(DbKind::Transient) {
                        return Err(error(e));
                    }
                    tracing::debug!(error = %e, "creating rowclaim_counters raced");
                }
                next().execute(&self.pool).await.map_err(error)?
            }
            other => other.map_err(error)?,
        };
        i64::try_from(done.last_insert_id())
            .map_err(|_| Error::InvalidInput(format!("counter {name} is out of range")))
    }
}

impl My {
    /// Creates the lease table unless it exists.
    async fn create_lease_table(&self) -> Result<()> {
        self.create_if_missing(CREATE_LEASES, "rowclaim_leases")
            .await
    }

    /// Runs `create` (a `CREATE TABLE IF NOT EXISTS` of `table`).
    async fn create_if_missing(&self, create: &'static str, table: &str) -> Result<()> {
        if let Err(e) = sqlx::query(create).execute(&self.pool).await {
            // Two processes creating it at once: one of them may fail, and the table is there
            // all the same.
            let exists: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
            )
            .bind(table)
            .fetch_one(&self.pool)
            .await
            .map_err(error)?;
            if exists == 0 {
                return Err(error(e));
            }
        }
        Ok(())
    }
}
