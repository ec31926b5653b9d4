//! The catalog role on SQLite: the server, a table's columns and key, the lease and counter tables.

use super::*;

#[async_trait::async_trait]
impl Catalog for Lite {
    fn one_writer(&self) -> bool {
        true
    }

    fn naming(&self) -> crate::mapping::Naming {
        once::naming(self)
    }

    async fn probe_filter(&self, m: &Mapping) -> Result<()> {
        once::probe_filter(self, m).await
    }

    async fn server(&self) -> Result<ServerInfo> {
        let v: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&self.pool)
            .await
            .map_err(error)?;
        Ok(ServerInfo::new(ServerKind::Sqlite, &v))
    }

    async fn columns(&self, table: &TableName) -> Result<Vec<Column>> {
        let rows = sqlx::query("SELECT name, type FROM pragma_table_info(?, ?)")
            .bind(table.name.clone())
            .bind(table.schema.clone().unwrap_or_else(|| "main".into()))
            .fetch_all(&self.pool)
            .await
            .map_err(error)?;
        rows.iter()
            .map(|r| {
                let sql_type: String = r.try_get(1).map_err(error)?;
                // SQLite's type affinity rules.
                let upper = sql_type.to_ascii_uppercase();
                let ty = if upper.contains("INT") {
                    ColType::Int
                } else if ["CHAR", "CLOB", "TEXT"].iter().any(|t| upper.contains(t)) {
                    ColType::Text { max_len: None }
                } else {
                    ColType::Other
                };
                Ok(Column {
                    name: r.try_get(0).map_err(error)?,
                    sql_type,
                    ty,
                })
            })
            .collect()
    }

    async fn table_key(&self, table: &TableName) -> Result<String> {
        let schema = table.schema.clone().unwrap_or_else(|| "main".into());
        let key: Option<String> = sqlx::query_scalar(
            "SELECT schema || '.' || name FROM pragma_table_list \
             WHERE schema = ? COLLATE NOCASE AND name = ? COLLATE NOCASE",
        )
        .bind(schema)
        .bind(table.name.clone())
        .fetch_optional(&self.pool)
        .await
        .map_err(error)?;
        key.ok_or_else(|| Error::MissingTable {
            table: table.display.clone(),
        })
    }

    async fn id_unique(&self, table: &TableName, column: &str) -> Result<bool> {
        // A primary key of this column alone (an INTEGER PRIMARY KEY is the rowid and has no
        // index to list), or a unique, whole-table index of it alone.
        let schema = table.schema.clone().unwrap_or_else(|| "main".into());
        let found: i64 = sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) = 1 AND SUM(name = ?3 COLLATE NOCASE) = 1 \
                     FROM pragma_table_info(?1, ?2) WHERE pk > 0) \
                 OR EXISTS (SELECT 1 FROM pragma_index_list(?1, ?2) l \
                     WHERE l.\"unique\" AND NOT l.partial \
                       AND (SELECT COUNT(*) FROM pragma_index_info(l.name, ?2)) = 1 \
                       AND (SELECT name FROM pragma_index_info(l.name, ?2)) = ?3 COLLATE NOCASE)",
        )
        .bind(table.name.clone())
        .bind(schema)
        .bind(column.to_owned())
        .fetch_one(&self.pool)
        .await
        .map_err(error)?;
        Ok(found != 0)
    }

    async fn ensure_lease_table(&self) -> Result<()> {
        for sql in [CREATE_LEASES, CREATE_LEASES_TOKEN] {
            sqlx::query(sql).execute(&self.pool).await.map_err(error)?;
        }
        Ok(())
    }

    async fn ensure_registry(&self) -> Result<()> {
        sqlx::query(CREATE_SOURCES)
            .execute(&self.pool)
            .await
            .map_err(error)?;
        Ok(())
    }

    async fn counter_next(&self, name: &str) -> Result<i64> {
        let next = || {
            sqlx::query_scalar(
                "INSERT INTO rowclaim_counters (name, value) VALUES (?, 1) \
                 ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value",
            )
            .bind(name.to_owned())
        };
        match next().fetch_one(&self.pool).await {
            Err(e) if error_kind(&e) == Some(DbKind::MissingTable) => {
                sqlx::query(CREATE_COUNTERS)
                    .execute(&self.pool)
                    .await
                    .map_err(error)?;
                Ok(next().fetch_one(&self.pool).await.map_err(error)?)
            }
            other => Ok(other.map_err(error)?),
        }
    }
}
