//! The inspect role on PostgreSQL (`rowclaim check`): the plan of the statement that finds ready
//! rows, the settings that matter to claims, privileges and the clock. Nothing here writes.

use super::*;
use crate::backend::inspect::{
    expired_index_name, index_columns, index_name, mentions, unquoted, Judge, Need, Privileges,
    Reads,
};
use crate::backend::{Inspect, Lookup};
use crate::report::{Finding, Severity, Topic};

/// A claim's batch as `check` plans it: what a worker typically asks for.
const PLANNED_BATCH: i64 = 100;

/// A scan of the source table in a plan: its node type, index and index condition.
struct Scan {
    node: String,
    index: Option<String>,
    cond: Option<String>,
    filter: Option<String>,
}

/// Collects the scans of `relation` in a plan node and below, and whether a sort takes their
/// rows; returns whether the node reads `relation`.
fn walk(
    node: &serde_json::Value,
    relation: &str,
    scans: &mut Vec<Scan>,
    sorted: &mut bool,
) -> bool {
    let text = |key: &str| node.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let mut reads = false;
    if text("Relation Name").as_deref() == Some(relation) {
        let node_type = text("Node Type").unwrap_or_default();
        // A bitmap heap scan's index is named by the bitmap index scan under it.
        let bitmap = node
            .get("Plans")
            .and_then(|p| p.as_array())
            .and_then(|p| p.iter().find(|c| c.get("Index Name").is_some()));
        let of_index = |key: &str| {
            text(key).or_else(|| {
                bitmap
                    .and_then(|b| b.get(key))
                    .and_then(|v| v.as_str())
                    .map(str::to_owned)
            })
        };
        scans.push(Scan {
            node: node_type,
            index: of_index("Index Name"),
            cond: of_index("Index Cond"),
            filter: text("Filter"),
        });
        reads = true;
    }
    for child in node
        .get("Plans")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
    {
        reads |= walk(child, relation, scans, sorted);
    }
    if reads && text("Node Type").as_deref() == Some("Sort") {
        *sorted = true;
    }
    reads
}

impl Pg {
    /// The predicate of the partial index `index` of `m`'s table (None for a full index).
    async fn index_predicate(&self, m: &Mapping, index: &str) -> Result<Option<String>> {
        let predicate: Option<Option<String>> = sqlx::query_scalar(
            "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             WHERE i.indrelid = to_regclass($1) AND c.relname = $2",
        )
        .bind(m.table.clone())
        .bind(index.to_owned())
        .fetch_optional(self.exec())
        .await
        .map_err(error)?;
        Ok(predicate.flatten())
    }
}

impl Pg {
    /// How `sql` reads `m`'s table, from its plan. With `sorts_priced_out`, sorts are priced out
    /// too: a claim's lookup of ready rows must find them in order through its index, while the
    /// expired arm may sort the few claimed rows it finds.
    async fn explain(
        &self,
        m: &Mapping,
        sql: String,
        b: B,
        sorts_priced_out: bool,
    ) -> Result<Lookup> {
        let plan = self.plan(sql, b, sorts_priced_out).await?;
        let relation = unquoted(m.table.rsplit('.').next().unwrap_or(&m.table));
        let (mut scans, mut sorted) = (Vec::new(), false);
        for root in plan.as_array().into_iter().flatten() {
            if let Some(node) = root.get("Plan") {
                walk(node, &relation, &mut scans, &mut sorted);
            }
        }
        let mut judge = Judge::default();
        for scan in scans {
            self.judge_scan(m, scan, &mut judge).await?;
        }
        if sorted {
            judge.step("Sort");
            judge.sorts();
        }
        Ok(judge.lookup())
    }

    /// The plan of `sql` (not run), as JSON.
    async fn plan(&self, sql: String, b: B, sorts_priced_out: bool) -> Result<serde_json::Value> {
        let mut tx = self.begin().await?;
        // Whether an index *can* serve the statement, whatever the table's size and statistics:
        // with sequential scans and sorts priced out, the planner takes an index that yields the
        // rows in order wherever there is one, so a scan or a sort left in the plan means there is
        // none. (On a small table it would rightly prefer a scan, and say nothing about growth.)
        let sort = if sorts_priced_out { "off" } else { "on" };
        for setting in [
            "SET LOCAL enable_seqscan = off".to_owned(),
            format!("SET LOCAL enable_sort = {sort}"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(setting))
                .execute(self.on(&mut tx))
                .await
                .map_err(error)?;
        }
        let explained: Result<sqlx::types::Json<serde_json::Value>> = async {
            b.scalar(format!("EXPLAIN (FORMAT JSON) {sql}"))?
                .fetch_one(self.on(&mut tx))
                .await
                .map_err(error)
        }
        .await;
        // Nothing ran, but the settings must not outlive the look.
        tx.rollback().await.map_err(error)?;
        Ok(explained?.0)
    }

    /// Adds one scan of `m`'s table to `judge`: the step as the plan says it, and what it reads.
    async fn judge_scan(&self, m: &Mapping, scan: Scan, judge: &mut Judge) -> Result<()> {
        let mut step = match &scan.index {
            Some(i) => format!("{} using {i}", scan.node),
            None => scan.node.clone(),
        };
        for (what, cond) in [("Index Cond", &scan.cond), ("Filter", &scan.filter)] {
            if let Some(c) = cond {
                step.push_str(&format!(", {what}: {c}"));
            }
        }
        judge.step(step);
        match (scan.node.as_str(), scan.index) {
            ("Seq Scan", _) => judge.reads(Reads::Everything),
            (_, Some(index)) => {
                // The index serves the claim when it is searched by status, or holds only rows
                // of the status the claim looks for (a partial index).
                let status = unquoted(&m.status);
                let searched = scan.cond.as_deref().is_some_and(|c| mentions(c, &status));
                let partial = if searched {
                    None
                } else {
                    self.index_predicate(m, &index).await?
                };
                if let Some(p) = &partial {
                    judge.step(format!("{index} is partial: WHERE {p}"));
                }
                if searched || partial.is_some_and(|p| mentions(&p, &status)) {
                    judge.reads(Reads::Index(index));
                } else {
                    judge.reads(Reads::Walks(index));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Inspect for Pg {
    async fn explain_lookup(
        &self,
        m: &Mapping,
        strategy: Resolved,
        leases: bool,
    ) -> Result<Lookup> {
        let (sql, b) = claim::lookup(m, strategy, PLANNED_BATCH, leases);
        self.explain(m, sql, b, true).await
    }

    async fn explain_expired(&self, m: &Mapping) -> Result<Option<Lookup>> {
        let mut b = B::new();
        match sql::expired_lookup(m, &mut b, PLANNED_BATCH) {
            Some(sql) => Ok(Some(self.explain(m, sql, b, false).await?)),
            None => Ok(None),
        }
    }

    fn expired_index(&self, m: &Mapping) -> String {
        let lease = m.lease.as_deref().unwrap_or("lease_until");
        format!(
            "CREATE INDEX CONCURRENTLY {} ON {} ({lease}) WHERE {} = {}{};",
            Sql::quote(&expired_index_name(m)),
            m.table,
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
        // CONCURRENTLY: a table in use keeps taking writes while the index is built.
        format!(
            "CREATE INDEX CONCURRENTLY {} ON {} ({}) WHERE {rows}{};",
            Sql::quote(&index_name(m, strategy)),
            m.table,
            index_columns(m, None),
            m.filter
        )
    }

    async fn settings(
        &self,
        m: &Mapping,
        _strategy: Strategy,
        _columns: &[Column],
    ) -> Result<Vec<Finding>> {
        let (standby, read_only, isolation, role): (bool, String, String, String) = sqlx::query_as(
            "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only'), \
                 current_setting('default_transaction_isolation'), quote_ident(current_user)",
        )
        .fetch_one(self.exec())
        .await
        .map_err(error)?;
        let mut found = vec![
            writable_finding(standby, &read_only, &role),
            isolation_finding(&isolation, &role),
        ];
        if self.route().pooled() {
            // A layer above (the managed queue) listens for wake-ups.
            let listens = m.lifecycle.is_some();
            found.push(pooler_finding(
                listens && self.route().listen_pool().is_none(),
            ));
        }
        Ok(found)
    }

    async fn missing_privileges(&self, needs: &[Need]) -> Result<Privileges> {
        let role: String = sqlx::query_scalar("SELECT quote_ident(current_user)")
            .fetch_one(self.exec())
            .await
            .map_err(error)?;
        let mut lacks = Privileges::default();
        for need in needs {
            if need.exists {
                let table: Vec<String> = need.table.split('.').map(Sql::quote).collect();
                let table = table.join(".");
                for privilege in need.privileges {
                    let has: bool = sqlx::query_scalar("SELECT has_table_privilege($1, $2)")
                        .bind(table.clone())
                        .bind(*privilege)
                        .fetch_one(self.exec())
                        .await
                        .map_err(error)?;
                    if !has {
                        lacks.missing.push((
                            format!("{privilege} on {}", need.table),
                            Some(format!("GRANT {privilege} ON {table} TO {role};")),
                        ));
                    }
                }
            } else {
                // rowclaim's tables are made unqualified: in the first schema of the search path.
                let (can, schema): (bool, Option<String>) = sqlx::query_as(
                    "SELECT COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false), \
                     quote_ident(current_schema())",
                )
                .fetch_one(self.exec())
                .await
                .map_err(error)?;
                if !can {
                    lacks.missing.push(match schema {
                        Some(schema) => (
                            format!("CREATE on schema {schema} (to make {})", need.table),
                            Some(format!("GRANT CREATE ON SCHEMA {schema} TO {role};")),
                        ),
                        None => (
                            format!("a schema in the search path (to make {})", need.table),
                            None,
                        ),
                    });
                }
            }
        }
        Ok(lacks)
    }

    async fn clock_ms(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8")
                .fetch_one(self.exec())
                .await
                .map_err(error)?,
        )
    }
}

/// Whether the server takes writes: not a standby, not read-only for this session's role.
fn writable_finding(standby: bool, read_only: &str, role: &str) -> Finding {
    if standby {
        Finding::new(
            Topic::Writable,
            Severity::Error,
            "the server is a standby (in recovery): it takes no writes, so every claim fails",
        )
        .fix(
            "connect to the primary; list every host in the URL \
             (postgres://u@db1:5432,db2:5432/app) to follow a failover",
        )
    } else if read_only == "on" {
        Finding::new(
            Topic::Writable,
            Severity::Error,
            "default_transaction_read_only is on for this session: every claim fails",
        )
        .fix(format!(
            "ALTER ROLE {role} SET default_transaction_read_only = off;"
        ))
    } else {
        Finding::ok(Topic::Writable, "the server takes writes (a primary)")
    }
}

/// The default isolation: anything above read committed makes claims fail and retry.
fn isolation_finding(isolation: &str, role: &str) -> Finding {
    if isolation == "read committed" {
        return Finding::ok(
            Topic::Isolation,
            "transactions run at read committed by default: a claim that meets a row \
             another claimer just took moves on to the next",
        );
    }
    Finding::new(
        Topic::Isolation,
        Severity::Warning,
        format!(
            "transactions run at {isolation} by default: a claim that meets a row another \
             claimer changed since it began fails with a serialization error (40001) and \
             is tried again, so claims slow down as claimers are added"
        ),
    )
    .fix(format!(
        "ALTER ROLE {role} SET default_transaction_isolation = 'read committed';"
    ))
}

/// A transaction-mode pooler in between: fine for claims; wake-ups cannot pass it (`polls`:
/// a layer above would listen, and has no direct URL for it).
fn pooler_finding(polls: bool) -> Finding {
    if polls {
        return Finding::new(
            Topic::Pooler,
            Severity::Advice,
            "through a transaction-mode pooler (pgbouncer=true): LISTEN cannot pass \
             it, so idle workers of the managed queue poll for new jobs",
        )
        .fix(
            "give workers a direct URL for wake-ups: rowclaim work --listen-database \
             postgres://… (ConnectOptions::listen_database)",
        );
    }
    Finding::ok(
        Topic::Pooler,
        "through a transaction-mode pooler (pgbouncer=true): each claim is one \
         statement or one transaction, which the pooler keeps on one server \
         connection",
    )
}
