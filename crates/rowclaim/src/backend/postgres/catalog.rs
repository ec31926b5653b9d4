//! The catalog role on PostgreSQL: the server, a table's columns and key, the lease and counter
//! tables.

use super::*;

#[async_trait::async_trait]
impl Catalog for Pg {
    fn naming(&self) -> crate::mapping::Naming {
        once::naming(self)
    }

    async fn probe_filter(&self, m: &Mapping) -> Result<()> {
        once::probe_filter(self, m).await
    }

    async fn server(&self) -> Result<ServerInfo> {
        let v: String = sqlx::query_scalar("SELECT current_setting('server_version')")
            .fetch_one(self.exec())
            .await
            .map_err(error)?;
        Ok(ServerInfo::new(ServerKind::Postgres, &v))
    }

    async fn columns(&self, table: &TableName) -> Result<Vec<Column>> {
        let rows = sqlx::query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), t.typname::text,
                    CASE WHEN a.atttypmod > 4 THEN a.atttypmod - 4 END
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum",
        )
        .bind(table.quoted(Sql::quote))
        .fetch_all(self.exec())
        .await
        .map_err(error)?;
        rows.iter()
            .map(|r| {
                let typname: String = r.try_get(2).map_err(error)?;
                let len: Option<i32> = r.try_get(3).map_err(error)?;
                let ty = match typname.as_str() {
                    "int2" | "int4" | "int8" => ColType::Int,
                    "text" | "name" | "citext" => ColType::Text { max_len: None },
                    "varchar" | "bpchar" => ColType::Text {
                        max_len: len.and_then(|l| u32::try_from(l).ok()),
                    },
                    "timestamptz" => ColType::Timestamp,
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
            "SELECT n.nspname || '.' || c.relname FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
        )
        .bind(table.quoted(Sql::quote))
        .fetch_optional(self.exec())
        .await
        .map_err(error)?;
        key.ok_or_else(|| Error::MissingTable {
            table: table.display.clone(),
        })
    }

    async fn id_unique(&self, table: &TableName, column: &str) -> Result<bool> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_index i \
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
               WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnkeyatts = 1 \
                 AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)",
        )
        .bind(table.quoted(Sql::quote))
        .bind(column.to_owned())
        .fetch_one(self.exec())
        .await
        .map_err(error)
    }

    async fn ensure_lease_table(&self) -> Result<()> {
        // CREATE … IF NOT EXISTS is not safe against a concurrent create (a duplicate key in the
        // catalog): take turns on an advisory lock, in one transaction.
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('rowclaim_leases'))")
            .execute(self.on(&mut tx))
            .await
            .map_err(error)?;
        for sql in [CREATE_LEASES, CREATE_LEASES_TOKEN] {
            sqlx::query(sql)
                .execute(self.on(&mut tx))
                .await
                .map_err(error)?;
        }
        tx.commit().await.map_err(error)?;
        Ok(())
    }

    async fn ensure_registry(&self) -> Result<()> {
        // As for the lease table: concurrent creates take turns.
        let mut tx = self.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('rowclaim_sources'))")
            .execute(self.on(&mut tx))
            .await
            .map_err(error)?;
        sqlx::query(CREATE_SOURCES)
            .execute(self.on(&mut tx))
            .await
            .map_err(error)?;
        tx.commit().await.map_err(error)?;
        Ok(())
    }

    async fn counter_next(&self, name: &str) -> Result<i64> {
        let next = || {
            sqlx::query_scalar(
                "INSERT INTO rowclaim_counters (name, value) VALUES ($1, 1) \
                 ON CONFLICT (name) DO UPDATE SET value = rowclaim_counters.value + 1 \
                 RETURNING value",
            )
            .bind(name.to_owned())
        };
        let first = if self.async_commit {
            // A number handed out must never be handed out again after a crash.
            let mut tx = self.durable().await?;
            let value = next().fetch_one(self.on(&mut tx)).await;
            if value.is_ok() {
                tx.commit().await.map_err(error)?;
            }
            value
        } else {
            next().fetch_one(self.exec()).await
        };
        match first {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
                // Create the table and take the first number in one durable transaction.
                let mut tx = self.durable().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext('rowclaim_counters'))")
                    .execute(self.on(&mut tx))
                    .await
                    .map_err(error)?;
                sqlx::query(CREATE_COUNTERS)
                    .execute(self.on(&mut tx))
                    .await
                    .map_err(error)?;
                let value = next().fetch_one(self.on(&mut tx)).await.map_err(error)?;
                tx.commit().await.map_err(error)?;
                Ok(value)
            }
            other => Ok(other.map_err(error)?),
        }
    }
}
