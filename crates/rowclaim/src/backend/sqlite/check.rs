//! The inspect role on SQLite (`rowclaim check`): the query plan of the statement that finds ready
//! rows, whether the file can be written, and the clock. Nothing here writes.

use super::*;
use crate::backend::inspect::{
    expired_index_name, index_columns, index_name, mentions, unquoted, Judge, Need, Privileges,
    Reads,
};
use crate::backend::{Inspect, Lookup};
use crate::report::Finding;

/// A claim's batch as `check` plans it: what a worker typically asks for.
const PLANNED_BATCH: i64 = 100;

/// One `SCAN`/`SEARCH` step of `EXPLAIN QUERY PLAN`: the table (or alias) it reads, the index it
/// uses and what the index is searched by (`status=?`).
struct Step<'a> {
    table: &'a str,
    index: Option<&'a str>,
    by: Option<&'a str>,
    search: bool,
}

fn step(detail: &str) -> Option<Step<'_>> {
    let (search, rest) = if let Some(r) = detail.strip_prefix("SEARCH ") {
        (true, r)
    } else {
        (false, detail.strip_prefix("SCAN ")?)
    };
    let table = rest.split(' ').next()?;
    let (index, by) = match rest
        .split_once(" USING COVERING INDEX ")
        .or_else(|| rest.split_once(" USING INDEX "))
    {
        Some((_, used)) => {
            let index = used.split(' ').next();
            let by = used.split_once('(').map(|(_, b)| b.trim_end_matches(')'));
            (index, by)
        }
        None => (None, None),
    };
    Some(Step {
        table,
        index,
        by,
        search,
    })
}

impl Lite {
    /// Whether `index` is partial with a condition on `column` (it holds only rows of one status).
    async fn partial_on(&self, schema: &str, index: &str, column: &str) -> Result<bool> {
        let sql = format!(
            "SELECT sql FROM {}.sqlite_master WHERE type = 'index' AND name = ?",
            Sql::quote(schema)
        );
        let text: Option<Option<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(index.to_owned())
            .fetch_optional(&self.pool)
            .await
            .map_err(error)?;
        let text = text.flatten().unwrap_or_default();
        let upper = text.to_ascii_uppercase();
        Ok(upper
            .rfind(" WHERE ")
            .is_some_and(|at| mentions(&text[at..], column)))
    }

    /// The database file, unless the database is in memory.
    fn file(&self) -> Option<std::path::PathBuf> {
        let options = self.pool.connect_options();
        let path = options.get_filename();
        let name = path.to_string_lossy();
        (!name.is_empty() && !name.contains(":memory:")).then(|| path.to_owned())
    }
}

impl Lite {
    /// How `sql` reads `m`'s table, from its query plan.
    async fn explain(&self, m: &Mapping, sql: String, b: B) -> Result<Lookup> {
        let rows: Vec<(i64, i64, i64, String)> = b
            .query_as(format!("EXPLAIN QUERY PLAN {sql}"))?
            .fetch_all(&self.pool)
            .await
            .map_err(error)?;
        let (schema, name) = match m.table.split_once('.') {
            Some((s, t)) => (unquoted(s), unquoted(t)),
            None => ("main".to_owned(), unquoted(&m.table)),
        };
        let status = unquoted(&m.status);
        let mut judge = Judge::default();
        for (_, _, _, detail) in &rows {
            if detail.starts_with("USE TEMP B-TREE FOR") && detail.contains("ORDER BY") {
                judge.step(detail.clone());
                judge.sorts();
                continue;
            }
            let Some(s) = step(detail) else { continue };
            // The lookups alias the table `t`, except the token and optimistic candidates.
            if !(s.table.eq_ignore_ascii_case(&name) || s.table == "t") {
                continue;
            }
            judge.step(detail.clone());
            match s.index {
                None if s.search => judge.reads(Reads::Walks("the rowid".into())),
                None => judge.reads(Reads::Everything),
                Some(index) => {
                    let searched = s.search && s.by.is_some_and(|b| mentions(b, &status));
                    if searched || self.partial_on(&schema, index, &status).await? {
                        judge.reads(Reads::Index(index.to_owned()));
                    } else {
                        judge.reads(Reads::Walks(index.to_owned()));
                    }
                }
            }
        }
        Ok(judge.lookup())
    }
}

#[async_trait::async_trait]
impl Inspect for Lite {
    async fn explain_lookup(
        &self,
        m: &Mapping,
        strategy: Resolved,
        leases: bool,
    ) -> Result<Lookup> {
        let (sql, b) = claim::lookup(m, strategy, PLANNED_BATCH, leases);
        self.explain(m, sql, b).await
    }

    async fn explain_expired(&self, m: &Mapping) -> Result<Option<Lookup>> {
        let mut b = B::new();
        match sql::expired_lookup(m, &mut b, PLANNED_BATCH) {
            Some(sql) => Ok(Some(self.explain(m, sql, b).await?)),
            None => Ok(None),
        }
    }

    fn expired_index(&self, m: &Mapping) -> String {
        // In the claim's order, like the ready rows' index: without statistics SQLite would
        // rather walk the table in that order than sort what an index by lease finds.
        let index = Sql::quote(&expired_index_name(m));
        let (index, table) = match m.table.split_once('.') {
            Some((schema, table)) => (format!("{schema}.{index}"), table.to_owned()),
            None => (index, m.table.clone()),
        };
        format!(
            "CREATE INDEX {index} ON {table} ({}) WHERE {} = {}{};",
            index_columns(m, None),
            m.status,
            status_literal(&m.claimed),
            m.filter
        )
    }

    fn lookup_index(&self, m: &Mapping, strategy: Resolved) -> String {
        let (st, ready) = (&m.status, status_literal(&m.ready));
        let rows = match strategy {
            Resolved::LeaseTable => {
                format!("({st} = {ready} OR {st} = {})", status_literal(&m.claimed))
            }
            _ => format!("{st} = {ready}"),
        };
        // SQLite names an index's schema on the index, not on its table.
        let index = Sql::quote(&index_name(m, strategy));
        let (index, table) = match m.table.split_once('.') {
            Some((schema, table)) => (format!("{schema}.{index}"), table.to_owned()),
            None => (index, m.table.clone()),
        };
        format!(
            "CREATE INDEX {index} ON {table} ({}) WHERE {rows}{};",
            index_columns(m, None),
            m.filter
        )
    }

    async fn settings(
        &self,
        _m: &Mapping,
        _strategy: Strategy,
        _columns: &[Column],
    ) -> Result<Vec<Finding>> {
        // One writer at a time and no server: nothing of a server's to report.
        Ok(Vec::new())
    }

    async fn missing_privileges(&self, _needs: &[Need]) -> Result<Privileges> {
        // SQLite has no privileges: whoever may write the file and its directory (where the
        // WAL and its index live) may claim. Opening the file for writing changes nothing.
        let Some(file) = self.file() else {
            return Ok(Privileges::default());
        };
        let mut lacks = Privileges::default();
        if let Err(e) = std::fs::OpenOptions::new().write(true).open(&file) {
            lacks
                .missing
                .push((format!("write access to {} ({e})", file.display()), None));
        }
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        if std::fs::metadata(dir).is_ok_and(|d| d.permissions().readonly()) {
            lacks.missing.push((
                format!(
                    "write access to the directory {} (for the file's WAL)",
                    dir.display()
                ),
                None,
            ));
        }
        Ok(lacks)
    }

    async fn clock_ms(&self) -> Result<i64> {
        let sql = format!("SELECT {NOW}");
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(error)?)
    }
}

#[cfg(test)]
mod tests {
    use super::step;

    #[test]
    fn plan_steps_are_read() {
        let s = step("SEARCH jobs USING INDEX jobs_status (status=?)").unwrap();
        assert_eq!(
            (s.table, s.index, s.by),
            ("jobs", Some("jobs_status"), Some("status=?"))
        );
        assert!(s.search);
        let s = step("SCAN t USING COVERING INDEX jobs_ready").unwrap();
        assert_eq!(
            (s.table, s.index, s.by, s.search),
            ("t", Some("jobs_ready"), None, false)
        );
        let s = step("SCAN jobs").unwrap();
        assert_eq!((s.index, s.search), (None, false));
        assert!(step("USE TEMP B-TREE FOR ORDER BY").is_none());
    }
}
