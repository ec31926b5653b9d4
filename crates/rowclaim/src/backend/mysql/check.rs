//! The inspect role on MySQL/MariaDB (`rowclaim check`): the plan of the statement that finds
//! ready rows, the binary log, isolation, Galera, privileges and the clock. Nothing here writes.

use std::collections::BTreeMap;

use super::*;
use crate::backend::inspect::{
    expired_index_name, index_columns, index_name, unquoted, Judge, Need, Privileges, Reads,
};
use crate::backend::{Inspect, Lookup};
use crate::report::{Finding, Severity, Topic};

/// A claim's batch as `check` plans it: what a worker typically asks for.
const PLANNED_BATCH: i64 = 100;

/// Collects what a plan (MySQL's or MariaDB's `EXPLAIN FORMAT=JSON`, which differ in shape but
/// name their steps alike) says about the table `names` and whether rows are sorted.
fn walk(v: &serde_json::Value, names: &[String], status: &str, judge: &mut Judge) {
    match v {
        serde_json::Value::Object(o) => {
            if let Some(t) = o.get("table").filter(|t| {
                t.get("table_name")
                    .and_then(|n| n.as_str())
                    .is_some_and(|n| names.iter().any(|x| x.eq_ignore_ascii_case(n)))
            }) {
                let text = |k: &str| t.get(k).and_then(|x| x.as_str()).unwrap_or_default();
                let access = text("access_type");
                let key = text("key").to_owned();
                let parts: Vec<&str> = t
                    .get("used_key_parts")
                    .and_then(|p| p.as_array())
                    .map(|p| p.iter().filter_map(|x| x.as_str()).collect())
                    .unwrap_or_default();
                judge.step(if key.is_empty() {
                    format!("access_type {access}")
                } else {
                    format!("access_type {access} on {key} ({})", parts.join(", "))
                });
                match access {
                    "ALL" => judge.reads(Reads::Everything),
                    // The whole index, in its order.
                    "index" => judge.reads(Reads::Walks(key)),
                    _ if parts
                        .first()
                        .is_some_and(|p| p.eq_ignore_ascii_case(status)) =>
                    {
                        judge.reads(Reads::Index(key))
                    }
                    _ if !key.is_empty() => judge.reads(Reads::Walks(key)),
                    _ => {}
                }
            }
            let sorts = o.contains_key("filesort")
                || o.get("using_filesort").and_then(|f| f.as_bool()) == Some(true);
            if sorts {
                judge.step("filesort");
                judge.sorts();
            }
            for (k, child) in o {
                if k != "table" {
                    walk(child, names, status, judge);
                } else if let Some(t) = child.as_object() {
                    // Subqueries attached to the table (the lease table's NOT EXISTS).
                    for (tk, tv) in t {
                        if tk != "table_name" {
                            walk(tv, names, status, judge);
                        }
                    }
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, names, status, judge)),
        _ => {}
    }
}

impl My {
    /// Server variables by name (those this server has of `names`).
    async fn variables(&self, names: &[&str]) -> Result<BTreeMap<String, String>> {
        let list = vec!["?"; names.len()].join(", ");
        let sql = format!("SHOW VARIABLES WHERE Variable_name IN ({list})");
        let mut q = sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(sql));
        for n in names {
            q = q.bind(*n);
        }
        Ok(q.fetch_all(&self.pool)
            .await
            .map_err(error)?
            .into_iter()
            .collect())
    }

    /// Server status values by name.
    async fn status(&self, names: &[&str]) -> Result<BTreeMap<String, String>> {
        let list = vec!["?"; names.len()].join(", ");
        let sql = format!("SHOW STATUS WHERE Variable_name IN ({list})");
        let mut q = sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(sql));
        for n in names {
            q = q.bind(*n);
        }
        Ok(q.fetch_all(&self.pool)
            .await
            .map_err(error)?
            .into_iter()
            .collect())
    }

    /// The binary log's format against what claims of `strategy` write.
    fn binlog_finding(vars: &BTreeMap<String, String>, strategy: Strategy) -> Finding {
        let on = vars
            .get("log_bin")
            .is_some_and(|v| v.eq_ignore_ascii_case("ON"));
        let format = vars
            .get("binlog_format")
            .map(|f| f.to_ascii_uppercase())
            .unwrap_or_default();
        if !on {
            return Finding::ok(
                Topic::Binlog,
                format!("the binary log is off (binlog_format {format}): nothing is replicated from this server"),
            );
        }
        if format != "STATEMENT" {
            return Finding::ok(
                Topic::Binlog,
                format!(
                    "the binary log is on with binlog_format {format}: claims replicate as the \
                     rows they change{}",
                    if format == "MIXED" {
                        " (MIXED logs every statement unsafe for statement-based replication, \
                         SKIP LOCKED and LIMIT among them, as rows)"
                    } else {
                        ""
                    }
                ),
            );
        }
        let how = match strategy {
            Strategy::Token => {
                "the token strategy's UPDATE picks its rows with ORDER BY … LIMIT and waits for \
                 other claimers' locks, which statement-based replication cannot repeat: a \
                 replica may mark other rows claimed than the primary did (the server notes \
                 1592, unsafe statement); and a settle of several rows runs in a READ COMMITTED \
                 transaction, which InnoDB refuses to log as a statement (error 1665)"
            }
            Strategy::Optimistic => {
                "a settle of several rows runs in a READ COMMITTED transaction, which InnoDB \
                 refuses to log as a statement (error 1665)"
            }
            _ => {
                "rowclaim takes claims in READ COMMITTED transactions, which InnoDB refuses to \
                 log as statements: every claim fails with error 1665; and SKIP LOCKED is unsafe \
                 for statement-based replication"
            }
        };
        Finding::new(
            Topic::Binlog,
            Severity::Error,
            format!(
                "the binary log is on with binlog_format STATEMENT: {how}. No strategy works \
                 fully with statement-based logging"
            ),
        )
        .fix(
            "SET GLOBAL binlog_format = 'ROW'; and binlog_format = ROW under [mysqld] in the \
             server's configuration (MIXED works too)",
        )
    }
}

impl My {
    /// How `sql` reads `m`'s table, from its plan.
    async fn explain(&self, m: &Mapping, sql: String, b: B) -> Result<Lookup> {
        // EXPLAIN runs nothing: no row is read or locked.
        let text: String = b
            .scalar(format!("EXPLAIN FORMAT=JSON {sql}"))?
            .fetch_one(&self.pool)
            .await
            .map_err(error)?;
        let plan: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            Error::Internal(format!("EXPLAIN FORMAT=JSON gave no JSON ({e}): {text}"))
        })?;
        let name = unquoted(m.table.rsplit('.').next().unwrap_or(&m.table));
        // The lookups alias the table `t`, except the token and optimistic candidates.
        let names = [name, "t".to_owned()];
        let mut judge = Judge::default();
        walk(&plan, &names, &unquoted(&m.status), &mut judge);
        Ok(judge.lookup())
    }
}

#[async_trait::async_trait]
impl Inspect for My {
    async fn explain_expired(&self, m: &Mapping) -> Result<Option<Lookup>> {
        let mut b = B::new();
        match sql::expired_lookup(m, &mut b, PLANNED_BATCH) {
            Some(sql) => Ok(Some(self.explain(m, sql, b).await?)),
            None => Ok(None),
        }
    }

    fn expired_index(&self, m: &Mapping) -> String {
        // No partial indexes: the status leads, so claimed rows are one run of it, by lease.
        // (An index of the ready rows, status first, is searched by status for these too.)
        let lease = m.lease.as_deref().unwrap_or("lease_until");
        format!(
            "CREATE INDEX {} ON {} ({}, {lease});",
            Sql::quote(&expired_index_name(m)),
            m.table,
            m.status
        )
    }

    async fn explain_lookup(
        &self,
        m: &Mapping,
        strategy: Resolved,
        leases: bool,
    ) -> Result<Lookup> {
        let (sql, b) = claim::lookup(m, strategy, PLANNED_BATCH, leases);
        let mut lookup = self.explain(m, sql, b).await?;
        let locks = matches!(strategy, Resolved::SkipLocked | Resolved::Transaction);
        let sorts = matches!(lookup.reads, Reads::Sorted(_))
            || (lookup.reads == Reads::Everything && lookup.plan.contains("filesort"));
        if locks && sorts {
            lookup.note = Some(
                "and a locking read that sorts locks every row it sorts until the claim commits, \
                 so claims that run at the same time skip them and come back short"
                    .into(),
            );
        }
        // Ready and claimed rows in one order: an index on (status, …) gives each status its
        // own run of the order, and MySQL sorts the two together. Nothing serves it better.
        if strategy == Resolved::LeaseTable && matches!(lookup.reads, Reads::Sorted(Some(_))) {
            lookup.best_possible = true;
            lookup.note = Some(
                "the lease-table strategy looks for ready and claimed rows together, which no \
                 MySQL/MariaDB index gives in one order; owner and lease columns and the \
                 skip-locked or token strategy avoid the sort"
                    .into(),
            );
        }
        Ok(lookup)
    }

    fn lookup_index(&self, m: &Mapping, strategy: Resolved) -> String {
        // No partial indexes here: the status leads, so that ready rows are one run of the index
        // in the claim's order.
        format!(
            "CREATE INDEX {} ON {} ({});",
            Sql::quote(&index_name(m, strategy)),
            m.table,
            index_columns(m, Some(&m.status))
        )
    }

    async fn settings(
        &self,
        m: &Mapping,
        strategy: Strategy,
        columns: &[Column],
    ) -> Result<Vec<Finding>> {
        let vars = self
            .variables(&[
                "log_bin",
                "binlog_format",
                "read_only",
                "super_read_only",
                "transaction_isolation",
                "tx_isolation",
                "time_zone",
                "system_time_zone",
            ])
            .await?;
        let mut found = vec![
            writable_finding(&vars),
            isolation_finding(&vars),
            My::binlog_finding(&vars, strategy),
            self.galera_finding().await?,
        ];
        if let Some(lease) = &m.lease {
            found.push(lease_finding(m, lease, columns, &vars));
        }
        Ok(found)
    }

    async fn missing_privileges(&self, needs: &[Need]) -> Result<Privileges> {
        let (user, database): (String, Option<String>) =
            sqlx::query_as("SELECT CAST(CURRENT_USER() AS CHAR), CAST(DATABASE() AS CHAR)")
                .fetch_one(&self.pool)
                .await
                .map_err(error)?;
        // information_schema names a grantee 'user'@'host'; CURRENT_USER() says user@host.
        let grantee = match user.rsplit_once('@') {
            Some((u, h)) => format!("'{u}'@'{h}'"),
            None => format!("'{user}'"),
        };
        let mut lacks = Privileges::default();
        for need in needs {
            let (schema, table) = match need.table.split_once('.') {
                Some((s, t)) => (s.to_owned(), t.to_owned()),
                None => (database.clone().unwrap_or_default(), need.table.clone()),
            };
            // Global, database (whose names may be LIKE patterns) and table grants.
            let held: Vec<String> = sqlx::query_scalar(
                "SELECT CAST(PRIVILEGE_TYPE AS CHAR) FROM information_schema.USER_PRIVILEGES \
                 WHERE GRANTEE = ? \
                 UNION SELECT CAST(PRIVILEGE_TYPE AS CHAR) FROM information_schema.SCHEMA_PRIVILEGES \
                 WHERE GRANTEE = ? AND ? LIKE TABLE_SCHEMA \
                 UNION SELECT CAST(PRIVILEGE_TYPE AS CHAR) FROM information_schema.TABLE_PRIVILEGES \
                 WHERE GRANTEE = ? AND TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            )
            .bind(&grantee)
            .bind(&grantee)
            .bind(&schema)
            .bind(&grantee)
            .bind(&schema)
            .bind(&table)
            .fetch_all(&self.pool)
            .await.map_err(error)?;
            let has = |p: &str| held.iter().any(|h| h.eq_ignore_ascii_case(p));
            let (s, t) = (Sql::quote(&schema), Sql::quote(&table));
            if need.exists {
                for p in need.privileges {
                    if !has(p) {
                        lacks.missing.push((
                            format!("{p} on {schema}.{table}"),
                            Some(format!("GRANT {p} ON {s}.{t} TO {grantee};")),
                        ));
                    }
                }
            } else if !has("CREATE") {
                lacks.missing.push((
                    format!("CREATE on {schema}.* (to make {})", need.table),
                    Some(format!("GRANT CREATE ON {s}.* TO {grantee};")),
                ));
            }
        }
        if !lacks.missing.is_empty() {
            lacks.caveat = Some(
                "as the grant tables show them to this user; privileges held through a role are \
                 not seen there",
            );
        }
        Ok(lacks)
    }

    async fn clock_ms(&self) -> Result<i64> {
        // The clock leases are computed with, in UTC whatever the session's time zone.
        Ok(sqlx::query_scalar(
            "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED)",
        )
        .fetch_one(&self.pool)
        .await.map_err(error)?)
    }
}

/// Whether the server takes writes (`read_only`).
fn writable_finding(vars: &BTreeMap<String, String>) -> Finding {
    let on = |name: &str| vars.get(name).is_some_and(|v| v.eq_ignore_ascii_case("ON"));
    if on("read_only") || on("super_read_only") {
        Finding::new(
            Topic::Writable,
            Severity::Error,
            "the server is read-only (read_only is ON): a replica? Claims written here are \
             refused, or, by an administrator, written where no other claimer sees them",
        )
        .fix("connect to the primary")
    } else {
        Finding::ok(
            Topic::Writable,
            "the server takes writes (read_only is OFF)",
        )
    }
}

/// The default isolation, against the READ COMMITTED rowclaim runs its own transactions at.
fn isolation_finding(vars: &BTreeMap<String, String>) -> Finding {
    // MySQL 8 and MariaDB 11.1+ say transaction_isolation, older MariaDB tx_isolation.
    let isolation = vars
        .get("transaction_isolation")
        .or_else(|| vars.get("tx_isolation"))
        .cloned()
        .unwrap_or_default();
    match isolation.as_str() {
        "REPEATABLE-READ" | "READ-COMMITTED" => Finding::ok(
            Topic::Isolation,
            format!(
                "{isolation} by default; rowclaim runs its own transactions at READ \
                 COMMITTED, so a locking read keeps locks on the rows it returns only"
            ),
        ),
        other => Finding::new(
            Topic::Isolation,
            Severity::Advice,
            format!(
                "{other} by default; rowclaim runs its own transactions at READ COMMITTED, \
                 but its single statements (the token and optimistic claims) run at {other}"
            ),
        ),
    }
}

impl My {
    /// Whether the server is a node of a Galera cluster, and how synced it is.
    async fn galera_finding(&self) -> Result<Finding> {
        let server = self.server().await?;
        if server.supports(crate::backend::Capability::RowLocksSeenByAllWriters) {
            return Ok(Finding::ok(
                Topic::Galera,
                "not a node of a Galera cluster (wsrep_on is off)",
            ));
        }
        let status = self
            .status(&["wsrep_cluster_size", "wsrep_local_state_comment"])
            .await?;
        let size = status.get("wsrep_cluster_size").map_or("?", String::as_str);
        let state = status
            .get("wsrep_local_state_comment")
            .map_or("unknown", String::as_str);
        let said = format!(
            "a node of a {size}-node Galera cluster ({state}): a row lock holds off this \
             node's claimers only, so a claim counts once its commit is known (claims that \
             meet on two nodes conflict at commit and are tried again) and the transaction \
             strategy is refused; see DEPLOYING.md"
        );
        Ok(if state.eq_ignore_ascii_case("Synced") {
            Finding::new(Topic::Galera, Severity::Advice, said)
        } else {
            Finding::new(Topic::Galera, Severity::Warning, said)
                .fix("claim on a node that is Synced with its cluster")
        })
    }
}

/// The lease column's type: a TIMESTAMP moves with each session's time zone, a DATETIME holds
/// whole seconds, a DATETIME(6) is as it should be.
fn lease_finding(
    m: &Mapping,
    lease: &str,
    columns: &[Column],
    vars: &BTreeMap<String, String>,
) -> Finding {
    let name = unquoted(lease);
    let column = columns.iter().find(|c| c.name.eq_ignore_ascii_case(&name));
    let ty = column
        .map(|c| c.sql_type.to_ascii_lowercase())
        .unwrap_or_default();
    let zone = vars.get("time_zone").map_or("?", String::as_str);
    if ty.starts_with("timestamp") {
        Finding::new(
            Topic::LeaseColumn,
            Severity::Warning,
            format!(
                "{}.{name} is {ty}: a TIMESTAMP is converted from and to each session's \
                 time zone, so sessions whose time_zone differs (rowclaim's own use \
                 {zone}, yours may not) read leases hours early or late, and may take \
                 rows whose lease has not ended",
                m.table_display
            ),
        )
        .fix(format!(
            "ALTER TABLE {} MODIFY {lease} DATETIME(6) NULL; (rowclaim writes UTC into it)",
            m.table
        ))
    } else if ty == "datetime" {
        Finding::new(
            Topic::LeaseColumn,
            Severity::Advice,
            format!(
                "{}.{name} is DATETIME: it holds whole seconds, so leases end up to a \
                 second off; it holds UTC, whatever the time zone",
                m.table_display
            ),
        )
        .fix(format!(
            "ALTER TABLE {} MODIFY {lease} DATETIME(6) NULL;",
            m.table
        ))
    } else {
        Finding::ok(
            Topic::LeaseColumn,
            format!(
                "{}.{name} is {ty} holding UTC (rowclaim writes UTC_TIMESTAMP(6)), \
                 whatever a session's time zone",
                m.table_display
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::inspect::mentions;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn statement_logging_breaks_every_strategy_and_row_or_mixed_none() {
        for s in [Strategy::SkipLocked, Strategy::Token, Strategy::LeaseTable] {
            let f = My::binlog_finding(
                &vars(&[("log_bin", "ON"), ("binlog_format", "STATEMENT")]),
                s,
            );
            assert_eq!(f.severity, Severity::Error, "{s}: {f:?}");
            assert!(f.fix.as_deref().is_some_and(|x| x.contains("ROW")), "{f:?}");
        }
        for format in ["ROW", "MIXED"] {
            let f = My::binlog_finding(
                &vars(&[("log_bin", "ON"), ("binlog_format", format)]),
                Strategy::SkipLocked,
            );
            assert_eq!(f.severity, Severity::Ok, "{format}");
        }
        let off = My::binlog_finding(
            &vars(&[("log_bin", "OFF"), ("binlog_format", "STATEMENT")]),
            Strategy::SkipLocked,
        );
        assert_eq!(off.severity, Severity::Ok);
    }

    #[test]
    fn plans_of_both_servers_are_read() {
        let names = ["jobs".to_owned(), "t".to_owned()];
        // MariaDB: an index walk; MySQL 8: a full scan and a filesort.
        let maria = serde_json::json!({"query_block": {"select_id": 1, "nested_loop": [{"table": {
            "table_name": "t", "access_type": "index", "key": "PRIMARY",
            "used_key_parts": ["id"], "attached_condition": "t.`status` = 'ready'"}}]}});
        let mut j = Judge::default();
        walk(&maria, &names, "status", &mut j);
        assert_eq!(j.lookup().reads, Reads::Walks("PRIMARY".into()));
        let mysql = serde_json::json!({"query_block": {"ordering_operation": {
            "using_filesort": true, "table": {"table_name": "jobs", "access_type": "ALL"}}}});
        let mut j = Judge::default();
        walk(&mysql, &names, "status", &mut j);
        assert_eq!(j.lookup().reads, Reads::Everything);
        let served = serde_json::json!({"query_block": {"table": {"table_name": "t",
            "access_type": "ref", "key": "jobs_ready", "used_key_parts": ["status"]}}});
        let mut j = Judge::default();
        walk(&served, &names, "status", &mut j);
        assert_eq!(j.lookup().reads, Reads::Index("jobs_ready".into()));
        assert!(mentions("t.`status` = 'ready'", "status"));
    }
}
